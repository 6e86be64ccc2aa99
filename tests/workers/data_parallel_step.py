"""Worker for tests/test_horovod.py: a few data-parallel steps of TrainingModel.

    python data_parallel_step.py OUT.npz [--dropout] [--float16]
    horovodrun -np 2 ... python data_parallel_step.py OUT_DIR/rank{rank}.npz [--dropout] [--float16]

Every rank trains on its own slice of one fixed global batch per step (the
whole batch when run as one process), then saves its weights.  With
--float16 the model runs under mixed_float16 with a LossScaleOptimizer, and
the second step's gradients are made infinite on rank 1 only: every rank
must skip that step together.
"""

import sys

import common  # noqa: F401  (before TensorFlow)
import keras
import numpy as np

from common import distributed
from common.nn import precision
from common.training_model import TrainingModel

GLOBAL_BATCH = 8
STEPS = 3

out, dropout, float16 = sys.argv[1], "--dropout" in sys.argv, "--float16" in sys.argv
dist = distributed.init()
precision.set_precision("mixed_float16" if float16 else "fp32")
keras.utils.set_random_seed(1234)   # same initial weights everywhere (rank 0's are broadcast anyway)
inputs = keras.Input((6,))
x = keras.layers.Dense(16, activation="tanh")(inputs)
if dropout:
    x = keras.layers.Dropout(0.5, seed=None)(x)
outputs = keras.layers.Dense(2, dtype="float32")(x)
network = keras.Model(inputs, outputs)
model = TrainingModel(network, dist)
optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
if float16:
    optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=2.0 ** 10)
model.compile(optimizer=optimizer, loss="mse", jit_compile=False)
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
    if float16 and step == 1 and dist.rank == dist.size - 1:
        xb[mine] = 1e30   # overflows float16 on this rank only
    model.train_on_batch(xb[mine], yb[mine])
final = {f"w{i}": np.asarray(w) for i, w in enumerate(network.weights)}
final.update({f"init{i}": w for i, w in enumerate(initial)})
if float16:
    final["loss_scale"] = np.asarray(model.optimizer.dynamic_scale)
    final["iterations"] = np.asarray(model.optimizer.iterations)
np.savez(out.format(rank=dist.rank), size=dist.size, **final)
