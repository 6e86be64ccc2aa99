"""FLOP accounting from a Keras model's layers, and a matmul peak probe.

Convention (stated in every report): one multiply-add = 2 FLOP; bias adds,
activations, pooling and normalisation are not counted; one training step is
3 x the forward FLOPs (the backward pass is about twice the forward).  The
first layer has no input gradient, so 3 x slightly overstates its work; the
convention is kept because it is the one published figures use.

The counter is cross-checked against TensorFlow's profiler in the tests
(the profiler also counts bias adds, 1 FLOP per output element).

``inside_only=True`` counts, for "same"-padded convolutions, only the kernel
taps that land inside the input: the work a kernel that skips zero padding
(oneDNN's do) must do.  The two differ little for ordinary convolutions and a
lot for atrous ones whose rate nears the feature-map size (DeepLab's ASPP
rates 24 and 36 on a 24x36 map: most taps are padding).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time

import keras
import numpy as np

from common.deferred import tensorflow as tf   # imported at first use: absent on Keras' JAX backend

FLOP_CONVENTION = "2 FLOP per multiply-add; bias, activation, pooling not counted; training step = 3 x forward"
TRAINING_FLOPS_FACTOR = 3


def _spatial(shape, data_format: str):
    """Spatial dims and channels of a per-sample shape (batch dim dropped)."""
    shape = tuple(shape)[1:]
    if data_format == "channels_first":
        return shape[1:], shape[0]
    return shape[:-1], shape[-1]


def _shape_of(tensor):
    return tuple(tensor.shape)


_COUNTED = {"Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose",
            "DepthwiseConv1D", "DepthwiseConv2D", "SeparableConv1D", "SeparableConv2D", "Dense"}


def _taps_inside(in_size: int, out_size: int, kernel: int, stride: int, dilation: int) -> int:
    """Sum over the outputs of one "same"-padded axis of the kernel taps that read inside the input."""
    pad_before = max((out_size - 1) * stride + (kernel - 1) * dilation + 1 - in_size, 0) // 2
    return sum(1 for o in range(out_size) for j in range(kernel)
               if 0 <= o * stride - pad_before + j * dilation < in_size)


def _positions_times_taps(layer, input_shape, output_shape, data_format: str, inside_only: bool) -> int:
    """Output positions x kernel taps of a (depthwise/separable) convolution, all taps or only those inside."""
    out_spatial, _ = _spatial(output_shape, data_format)
    in_spatial, _ = _spatial(input_shape, data_format)
    if not inside_only or getattr(layer, "padding", "valid") != "same" or None in in_spatial:
        return math.prod(out_spatial) * math.prod(layer.kernel_size)
    dilations = getattr(layer, "dilation_rate", (1,) * len(out_spatial))
    return math.prod(_taps_inside(n_in, n_out, k, s, d) for n_in, n_out, k, s, d in
                     zip(in_spatial, out_spatial, layer.kernel_size, layer.strides, dilations))


def layer_multiply_adds(layer, input_shape, output_shape, inside_only: bool = False) -> int:
    """Multiply-adds of one call of ``layer`` per sample (0 for layers we do not count).

    ``inside_only``: count only the kernel taps of "same" padding that land inside the input."""
    # A subclass (e.g. common.nn.layers.DilatedConv2D) counts as the Keras layer it extends.
    kind = next((cls.__name__ for cls in type(layer).__mro__ if cls.__name__ in _COUNTED), type(layer).__name__)
    data_format = getattr(layer, "data_format", "channels_last")
    if kind in ("Conv1D", "Conv2D", "Conv3D"):
        out_spatial, out_channels = _spatial(output_shape, data_format)
        _, in_channels = _spatial(input_shape, data_format)
        groups = getattr(layer, "groups", 1) or 1
        taps = _positions_times_taps(layer, input_shape, output_shape, data_format, inside_only)
        return taps * out_channels * (in_channels // groups)
    if kind in ("Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose"):
        in_spatial, in_channels = _spatial(input_shape, data_format)
        _, out_channels = _spatial(output_shape, data_format)
        return math.prod(in_spatial) * in_channels * math.prod(layer.kernel_size) * out_channels
    if kind in ("DepthwiseConv1D", "DepthwiseConv2D"):
        _, out_channels = _spatial(output_shape, data_format)
        return _positions_times_taps(layer, input_shape, output_shape, data_format, inside_only) * out_channels
    if kind in ("SeparableConv1D", "SeparableConv2D"):
        out_spatial, out_channels = _spatial(output_shape, data_format)
        _, in_channels = _spatial(input_shape, data_format)
        depthwise_channels = in_channels * layer.depth_multiplier
        taps = _positions_times_taps(layer, input_shape, output_shape, data_format, inside_only)
        return taps * depthwise_channels + math.prod(out_spatial) * depthwise_channels * out_channels
    if kind == "Dense":
        in_features = input_shape[-1]
        return math.prod(tuple(output_shape)[1:-1]) * in_features * layer.units
    return 0


def _iter_calls(model):
    """(layer, input_shape, output_shape) for every layer call in a functional model, nested models included."""
    for layer in model.layers:
        if isinstance(layer, keras.Model) and hasattr(layer, "layers") and layer.layers:
            yield from _iter_calls(layer)
            continue
        for node in getattr(layer, "_inbound_nodes", []):
            inputs = node.input_tensors
            outputs = node.outputs
            if not inputs or not outputs:
                continue
            yield layer, _shape_of(inputs[0]), _shape_of(outputs[0])


def forward_flops_per_sample(model, inside_only: bool = False) -> int:
    """Forward FLOPs for one sample of a built functional model (2 x multiply-adds).

    ``inside_only``: leave out the taps of "same" padding that read zeros (see the module doc)."""
    return 2 * sum(layer_multiply_adds(layer, i, o, inside_only) for layer, i, o in _iter_calls(model))


@dataclasses.dataclass(frozen=True)
class MatmulPeak:
    """A square matmul's achieved rate on this process's device: the best of several warm repetitions at each
    of several sizes (a single short timing on a shared machine reads low by up to a third)."""

    flops: float                 # the peak: the best repetition at any size (FLOP/s, 2 n^3 per product)
    size: int                    # the matrix size of that repetition
    rates: tuple[float, ...]     # every timed repetition at that size (FLOP/s)
    sizes: tuple[int, ...]       # the sizes tried

    @property
    def spread(self) -> float:
        """(best - worst) / best over the repetitions at the peak's size: how steady the machine was."""
        return (max(self.rates) - min(self.rates)) / max(self.rates)

    def as_dict(self) -> dict:
        return {"flops": self.flops, "size": self.size, "rates": list(self.rates), "sizes": list(self.sizes),
                "spread": self.spread}


@functools.cache
def matmul_peak(dtype: str = "float32", sizes: tuple[int, ...] | None = None, repetitions: int = 5,
                seconds: float = 0.25) -> MatmulPeak:
    """The measured peak of ``dtype`` matmuls here, once per process (cached): at each size one warm-up
    product, then ``repetitions`` timings of at least ``seconds`` each; the best timing is the peak.  Sizes
    by default where the rate has reached its plateau: 1024 and 2048 on a CPU, 4096 and 8192 on a GPU."""
    if sizes is None:
        sizes = (4096, 8192) if tf.config.list_physical_devices("GPU") else (1024, 2048)

    @tf.function
    def product(x, y):
        return tf.reduce_sum(tf.cast(tf.matmul(x, y)[:1, :1], tf.float32))

    rng = np.random.default_rng(0)
    per_size = {}
    for size in sizes:
        a = tf.constant(rng.standard_normal((size, size)), dtype=dtype)
        b = tf.constant(rng.standard_normal((size, size)), dtype=dtype)
        product(a, b).numpy()   # trace and warm up
        rates = []
        for _ in range(repetitions):
            count, start = 0, time.perf_counter()
            while True:
                product(a, b).numpy()
                count += 1
                elapsed = time.perf_counter() - start
                if elapsed >= seconds:
                    break
            rates.append(2.0 * size ** 3 * count / elapsed)
        per_size[size] = tuple(rates)
    best_size = max(per_size, key=lambda n: max(per_size[n]))
    return MatmulPeak(max(per_size[best_size]), best_size, per_size[best_size], tuple(sizes))


def measure_matmul_flops(dtype: str = "float32") -> float:
    """The peak FLOP/s of ``dtype`` matmuls on this process's device (:func:`matmul_peak`)."""
    return matmul_peak(dtype).flops
