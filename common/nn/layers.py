"""Keras layers with a faster path on one backend, same maths and weights everywhere.

``FusedBatchNormalization`` is ``keras.layers.BatchNormalization``.  Keras 3
trains batch norm as separate ops (cast to float32, moments, normalise, and
their gradients: Mean, SquaredDifference, Tile, Sum, Mul...); on TensorFlow
this layer runs one FusedBatchNormV3 kernel forward and one backward, with the
same statistics (the moving variance gets the same biased batch variance Keras
uses); the README's Performance section has the measured difference.  5D
inputs are folded to 4D (the statistics are per channel over all other axes either way).
Masks, renorm, synchronized statistics and other backends take Keras's path.

``DilatedConv2D`` is ``keras.layers.Conv2D``.  On TensorFlow, Keras calls
``tf.nn.convolution``, which runs a dilated convolution as SpaceToBatchND +
dense convolution + BatchToSpaceND; oneDNN (CPU) and cuDNN (GPU) have native
dilated kernels that ``tf.nn.conv2d`` reaches directly (measured in the
README's Performance section).  Other backends, strided
convolutions (which TensorFlow cannot dilate) and CPUs running TensorFlow's
Eigen kernels (oneDNN off: ``TF_ENABLE_ONEDNN_OPTS=0``, a build without
oneDNN, aarch64), which have no gradient for a dilated ``tf.nn.conv2d``
("Current CPU implementations do not yet support dilation rates larger than
1"), take Keras's own path: the same convolution, slower.  So do dtypes that
oneDNN leaves to Eigen on this CPU (bfloat16 without bf16 support: AVX2).
"""

from __future__ import annotations

import functools

import keras

from common.console.cpu import onednn_enabled
from common.deferred import tensorflow as tf   # imported at first use: absent on Keras' JAX backend


@keras.saving.register_keras_serializable(package="common")
class DilatedConv2D(keras.layers.Conv2D):
    """``keras.layers.Conv2D`` whose dilated convolution is one native kernel on TensorFlow."""

    def convolution_op(self, inputs, kernel):
        native = (max(self.dilation_rate) > 1 and max(self.strides) == 1 and self.groups == 1
                  and self.data_format == "channels_last"
                  and native_dilated_conv_trains(keras.backend.standardize_dtype(inputs.dtype)))
        if not native:
            return super().convolution_op(inputs, kernel)
        return tf.nn.conv2d(inputs, kernel, strides=1, padding=self.padding.upper(),
                            dilations=list(self.dilation_rate))


@functools.cache
def native_dilated_conv_trains(dtype: str = "float32") -> bool:
    """Whether a dilated ``tf.nn.conv2d`` in ``dtype`` has gradient kernels here: cuDNN on a GPU, oneDNN on
    the CPU for the dtypes it runs itself.  oneDNN hands a dtype it has no kernels for on this CPU to Eigen
    (bfloat16 on a CPU without bf16 support, such as an AVX2 one), and Eigen has no dilated gradient, so the
    answer is found by trying a tiny one, once per dtype (outside any graph being traced)."""
    if keras.backend.backend() != "tensorflow":
        return False
    if not (onednn_enabled() or tf.config.list_physical_devices("GPU")):
        return False
    # The two kernels a dilated convolution's gradient runs, called directly (init_scope pauses gradient tapes).
    with tf.init_scope():
        x, kernel = tf.ones((1, 5, 5, 1), dtype), tf.ones((3, 3, 1, 1), dtype)
        setting = {"strides": [1, 1, 1, 1], "padding": "SAME", "dilations": [1, 2, 2, 1]}
        try:
            tf.raw_ops.Conv2DBackpropInput(input_sizes=[1, 5, 5, 1], filter=kernel, out_backprop=x, **setting)
            tf.raw_ops.Conv2DBackpropFilter(input=x, filter_sizes=[3, 3, 1, 1], out_backprop=x, **setting)
        except tf.errors.OpError:
            return False
    return True


# FusedBatchNormV3 clamps epsilon below this.
_FUSED_MIN_EPSILON = 1.001e-5


@keras.saving.register_keras_serializable(package="common")
class FusedBatchNormalization(keras.layers.BatchNormalization):
    """``keras.layers.BatchNormalization`` trained with TensorFlow's fused kernel where it applies."""

    def _fused_applies(self, inputs, training, mask) -> bool:
        rank = len(inputs.shape)
        return (keras.backend.backend() == "tensorflow" and bool(training) and self.trainable and mask is None
                and not self.renorm and not self.synchronized and rank in (4, 5)
                and self.axis in (-1, rank - 1) and self.epsilon >= _FUSED_MIN_EPSILON)

    def call(self, inputs, training=None, mask=None):
        if not self._fused_applies(inputs, training, mask):
            return super().call(inputs, training=training, mask=mask)
        channels = inputs.shape[-1]
        shape = tf.shape(inputs)
        x = inputs if inputs.dtype in (tf.float32, tf.bfloat16, tf.float16) else tf.cast(inputs, tf.float32)
        if len(inputs.shape) == 5:  # (N, D, H, W, C) -> (N, D*H, W, C): same per-channel statistics
            x = tf.reshape(x, tf.stack([shape[0], shape[1] * shape[2], shape[3], channels]))
        gamma = tf.cast(self.gamma, tf.float32) if self.scale else tf.ones([channels], tf.float32)
        beta = tf.cast(self.beta, tf.float32) if self.center else tf.zeros([channels], tf.float32)
        y, mean, variance, *_ = tf.raw_ops.FusedBatchNormV3(
            x=x, scale=gamma, offset=beta, mean=tf.zeros([0], tf.float32), variance=tf.zeros([0], tf.float32),
            epsilon=self.epsilon, data_format="NHWC", is_training=True)
        # The kernel returns the unbiased (n / (n - 1)) variance; Keras tracks the biased one.
        count = tf.cast(tf.size(x) // channels, tf.float32)
        variance = variance * tf.maximum(count - 1.0, 0.0) / tf.maximum(count, 1.0)
        self.moving_mean.assign(self.moving_mean * self.momentum + mean * (1.0 - self.momentum))
        self.moving_variance.assign(self.moving_variance * self.momentum + variance * (1.0 - self.momentum))
        if len(inputs.shape) == 5:
            y = tf.reshape(y, shape)
        return tf.cast(y, self.compute_dtype)


@keras.saving.register_keras_serializable(package="common")
class ByteDropout(keras.layers.Dropout):
    """``keras.layers.Dropout`` with masks drawn as bytes (or 16-bit words) on TensorFlow."""

    def call(self, inputs, training=False):
        if not (training and 0 < self.rate < 1 and self.noise_shape is None
                and keras.backend.backend() == "tensorflow"):
            return super().call(inputs, training=training)
        levels = 256 if float(self.rate * 256).is_integer() else 65536
        threshold = int(round(self.rate * levels))  # keep when the draw is >= threshold
        word = tf.uint8 if levels == 256 else tf.uint16
        per_draw = 4 if levels == 256 else 2
        count = tf.size(inputs)
        seed = self.seed_generator.next()
        seed = tf.cast(tf.math.floormod(seed, tf.int32.max - 1), tf.int32)
        draws = tf.random.stateless_uniform([(count + per_draw - 1) // per_draw], seed=seed, minval=None,
                                            maxval=None, dtype=tf.uint32)
        values = tf.reshape(tf.bitcast(draws, word), [-1])[:count]
        keep = tf.reshape(values >= tf.constant(threshold, word), tf.shape(inputs))
        scale = tf.constant(levels / (levels - threshold), inputs.dtype)
        return tf.where(keep, inputs * scale, tf.zeros_like(inputs))


_PLAIN = {DilatedConv2D: keras.layers.Conv2D, FusedBatchNormalization: keras.layers.BatchNormalization,
          ByteDropout: keras.layers.Dropout}


def plain_keras(model: keras.Model) -> keras.Model:
    """``model`` rebuilt with this module's layers replaced by the Keras layers they extend, same weights."""
    if not any(type(layer) in _PLAIN for layer in all_layers(model)):
        return model

    def clone(layer):
        return _PLAIN.get(type(layer), type(layer)).from_config(layer.get_config())

    plain = keras.models.clone_model(model, clone_function=clone, recursive=True)
    plain.set_weights(model.get_weights())
    return plain


def all_layers(model):
    """Every layer of ``model`` and of the models nested in it, in order."""
    for layer in model.layers:
        yield layer
        if isinstance(layer, keras.Model):
            yield from all_layers(layer)
