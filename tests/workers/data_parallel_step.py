"""Worker for tests/test_horovod.py: a few data-parallel steps of TrainingModel.

    python data_parallel_step.py OUT.npz [--dropout]
    horovodrun -np 2 ... python data_parallel_step.py OUT_DIR/rank{rank}.npz [--dropout]

Every rank trains on its own slice of one fixed global batch per step (the
whole batch when run as one process), then saves its weights.
"""

import sys

import keras
import numpy as np

import common  # noqa: F401
from common import distributed
from common.trainer import TrainingModel

GLOBAL_BATCH = 8
STEPS = 3

out, dropout = sys.argv[1], "--dropout" in sys.argv
dist = distributed.init()
keras.utils.set_random_seed(1234)   # same initial weights everywhere (rank 0's are broadcast anyway)
inputs = keras.Input((6,))
x = keras.layers.Dense(16, activation="tanh")(inputs)
if dropout:
    x = keras.layers.Dropout(0.5, seed=None)(x)
outputs = keras.layers.Dense(2, dtype="float32")(x)
network = keras.Model(inputs, outputs)
model = TrainingModel(network, dist)
model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse", jit_compile=False)
model.optimizer.build(model.trainable_variables)
dist.broadcast_variables(model.weights + model.optimizer.variables)
keras.utils.set_random_seed(99 + dist.rank)   # dropout masks differ per rank

rng = np.random.default_rng(7)
per_rank = GLOBAL_BATCH // dist.size
initial = [np.asarray(w).copy() for w in network.weights]
for step in range(STEPS):
    xb = rng.standard_normal((GLOBAL_BATCH, 6)).astype(np.float32)
    yb = rng.standard_normal((GLOBAL_BATCH, 2)).astype(np.float32)
    mine = slice(dist.rank * per_rank, (dist.rank + 1) * per_rank)
    model.train_on_batch(xb[mine], yb[mine])
final = {f"w{i}": np.asarray(w) for i, w in enumerate(network.weights)}
final.update({f"init{i}": w for i, w in enumerate(initial)})
np.savez(out.format(rank=dist.rank), size=dist.size, **final)
