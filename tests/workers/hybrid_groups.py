"""Worker for tests/test_hybrid.py: 4 ranks in 2 synchronous groups, exchanging weights every 4 steps.

    horovodrun -np 4 ... python hybrid_groups.py OUT_DIR

Each rank fits a linear regression on its own data and records its kernel after every step.  The
two groups' data follow different true weights (truth and truth + OFFSET): left alone they would
drift OFFSET apart; the exchanges hold them together near the middle.
"""

import sys

import common  # noqa: F401  (before TensorFlow)
import keras
import numpy as np
import tensorflow as tf

from common import distributed
from common.hybrid import GroupExchange
from common.training_model import TrainingModel

STEPS, EVERY = 40, 4
out = sys.argv[1]
dist = distributed.init(groups=2)
keras.utils.set_random_seed(0)
inputs = keras.Input((8,))
network = keras.Model(inputs, keras.layers.Dense(1, dtype="float32")(inputs))
model = TrainingModel(network, dist)
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", jit_compile=False)
model.optimizer.build(model.trainable_variables)
dist.broadcast_variables(model.weights + model.optimizer.variables)

OFFSET = np.full((8, 1), 0.5, np.float32)
truth = np.linspace(-1, 1, 8).astype(np.float32)[:, None] + dist.group_index * OFFSET
rng = np.random.default_rng(100 + dist.rank)          # every rank its own data
x = rng.standard_normal((STEPS * 4, 8)).astype(np.float32)
y = x @ truth + 0.05 * rng.standard_normal((STEPS * 4, 1)).astype(np.float32)
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)


class Record(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.kernels = []

    def on_train_batch_end(self, batch, logs=None):
        self.kernels.append(np.asarray(network.weights[0]).ravel().copy())


exchange = GroupExchange(dist, model.step_signals, EVERY)
before, record = Record(), Record()   # kernels before and after the exchange callback
if dist.rank == 2:
    # Group 1 is the slow one: its exchange results arrive late, the staleness bound holds them.
    class Slow(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            import time
            time.sleep(0.02)
    extra = [Slow()]
else:
    extra = []
model.fit(data, epochs=1, steps_per_epoch=STEPS, verbose=0, callbacks=[before, exchange, record, *extra])
np.savez(f"{out}/rank{dist.rank}.npz", kernels=np.stack(record.kernels), before=np.stack(before.kernels), applied=np.array(exchange.applied_at),
         final=np.asarray(network.weights[0]).ravel(), offset=OFFSET.ravel(),
         middle=(np.linspace(-1, 1, 8) + 0.5 * OFFSET.ravel()))
