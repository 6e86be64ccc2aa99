"""The data-parallel training step: an application's network wrapped with Horovod's allreduce.

The step every application trains with (Keras 3's ``train_step`` pattern): forward
and loss under a GradientTape, gradients averaged over ranks, the finiteness and
stop signals shared in one small allreduce.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from common.distributed import Distributed
from common.loop.reliability import StepSignals


class TrainingModel(keras.Model):
    """Wraps an application's network with the data-parallel training step.

    ``train_step``: forward and loss under a GradientTape, loss scaled for
    mixed_float16, gradients averaged over ranks with one grouped allreduce,
    then ``optimizer.apply`` (whose loss-scale finite check therefore sees the
    same gradients, and takes the same decision, on every rank).
    """

    def __init__(self, network: keras.Model, dist: Distributed, gradient_compression: str = "none",
                 gradient_lag: int = 0, **kwargs):
        # autocast off: a Keras model casts its floating inputs to its compute dtype, and under mixed precision
        # this wrapper would hand the network bfloat16/float16 copies of inputs it declares float32 (CosmoFlow's
        # particle counts for its summaries: 257 arrived as 256); the network's own layers cast what they need.
        kwargs.setdefault("autocast", False)
        super().__init__(name=kwargs.pop("name", f"train_{network.name}"), **kwargs)
        self.network = network
        self._dist = dist
        self._gradient_compression = gradient_compression
        self.step_signals = StepSignals()
        self._lagged_gradients = []
        if gradient_lag:
            # Model state (checkpointed, broadcast): resuming mid-run applies the pending gradients.
            self._lagged_gradients = [
                self.add_weight(shape=v.shape, dtype=v.dtype, initializer="zeros", trainable=False,
                                name=f"lagged_gradient_{i}") for i, v in enumerate(network.trainable_variables)]
            self._lag_filled = self.add_weight(shape=(), dtype="float32", initializer="zeros", trainable=False,
                                               name="lagged_gradient_filled")
        self.built = True

    def call(self, inputs, training=None):
        return self.network(inputs, training=training)

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
            self._loss_tracker.update_state(loss, sample_weight=tf.shape(tf.nest.flatten(x)[0])[0])
            scaled_loss = self.optimizer.scale_loss(loss)
        variables = self.trainable_variables
        gradients = tape.gradient(scaled_loss, variables)
        if self._lagged_gradients:
            # Gradient lag (SC18): update with the previous step's allreduced gradients; this step's
            # allreduce has no consumer until the next step, so it runs alongside the update.
            self._apply_lagged(variables)
        gradients = self._dist.allreduce_gradients(gradients, compression=self._gradient_compression)
        # The same on every rank (the gradients are allreduced): a NaN/Inf gradient stops every rank at this
        # step (StepGuard), before a NaN weight can reach a checkpoint or model.keras.
        self.step_signals.gradients_finite.assign(tf.cast(all_finite(gradients), tf.float32))
        if self._lagged_gradients:
            for buffer, gradient in zip(self._lagged_gradients, gradients):
                buffer.assign(gradient)
            self._lag_filled.assign(1.0)
        else:
            self.optimizer.apply(gradients, variables)
        # The rank-averaged loss, "has any rank been asked to stop?" and "is the group leader's
        # cross-group exchange done?" ride one small allreduce (over the group in hybrid mode).
        signals = self.step_signals
        shared = self._dist.allreduce(
            tf.stack([tf.cast(loss, tf.float32), signals.stop_requested, signals.exchange_ready]),
            average=True, name="step_signals", group_only=True)
        signals.global_loss.assign(shared[0])
        signals.global_stop.assign(shared[1])
        signals.group_exchange_ready.assign(shared[2])
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def _apply_lagged(self, variables):
        previous = [buffer.value for buffer in self._lagged_gradients]

        def apply():
            self.optimizer.apply(previous, variables)
            return tf.constant(True)

        # The first step has nothing to apply yet.
        tf.cond(self._lag_filled > 0, apply, lambda: tf.constant(False))


def all_finite(tensors) -> tf.Tensor:
    """Whether every element of ``tensors`` (None and IndexedSlices allowed) is finite: one boolean."""
    checks = [tf.reduce_all(tf.math.is_finite(t.values if isinstance(t, tf.IndexedSlices) else t))
              for t in tensors if t is not None]
    return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)
