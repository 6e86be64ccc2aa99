"""Worker for tests/test_climate.py: validation IoU pooled over real Horovod ranks.

    horovodrun -np 2 ... python pooled_iou.py OUT.json

Each rank evaluates an identity "model" on its own, differently sized, labels
and predictions (so per-rank IoUs differ), then runs the trainer's
EpochEndSync at epoch end.  Rank 0 gathers every rank's data and
logs into OUT.json for the test to check against scikit-learn.
"""

import json
import sys

import common  # noqa: F401  (before TensorFlow)
import keras
import numpy as np

from common import distributed
from common.loop.callbacks import EpochEndSync
from common.nn.metrics import ConfusionMatrix

dist = distributed.init()
rng = np.random.default_rng(100 + dist.rank)
n = 3 + 5 * dist.rank                     # unequal shares: pooling is not the mean of rank means
truth = rng.integers(0, 3, size=(n, 6, 8))
# Rank 1 predicts much better than rank 0.
predicted = np.where(rng.random(truth.shape) < 0.3 + 0.6 * dist.rank, truth, rng.integers(0, 3, truth.shape))

inputs = keras.Input((6, 8, 3))
model = keras.Model(inputs, keras.layers.Identity()(inputs))
model.compile(loss="sparse_categorical_crossentropy", metrics=[ConfusionMatrix(3, ["background", "cyclone", "river"])])
logs = model.evaluate(np.eye(3, dtype=np.float32)[predicted], truth, batch_size=2, verbose=0, return_dict=True)
local = float(logs["mean_iou"])
epoch_logs = {"val_loss": logs["loss"]}
callback = EpochEndSync(dist)
callback.set_model(model)
callback.on_epoch_end(0, epoch_logs)
gathered = dist.allgather_object({"truth": truth.tolist(), "pred": predicted.tolist(), "logs": epoch_logs,
                                  "local_mean_iou": local})
if dist.is_root:
    with open(sys.argv[1], "w") as handle:
        json.dump({"ranks": gathered}, handle)
