"""The layer FLOP counter against TensorFlow's own profiler, and the MLPerf anchors."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from common.config import load_config
from common.nn.layers import DilatedConv2D
from common.nn.flops import forward_flops_per_sample, layer_multiply_adds
from conftest import REPO


def profiler_flops(model: keras.Model) -> int:
    """Float ops of one forward pass (batch 1) as counted by tf.compat.v1.profiler on the frozen graph."""
    spec = tf.TensorSpec((1, *model.input_shape[1:]), tf.float32)
    concrete = tf.function(lambda x: model(x, training=False)).get_concrete_function(spec)
    frozen = convert_variables_to_constants_v2(concrete)
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(frozen.graph.as_graph_def(), name="")
        options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
        options["output"] = "none"
        stats = tf.compat.v1.profiler.profile(graph=graph, run_meta=tf.compat.v1.RunMetadata(), cmd="op",
                                              options=options)
    return stats.total_float_ops


def bias_adds(model: keras.Model) -> int:
    """The profiler counts each bias add as 1 FLOP per output element; our convention does not."""
    total = 0
    for layer in model.layers:
        if getattr(layer, "use_bias", False) and layer.built:
            total += int(tf.reduce_prod(layer.output.shape[1:]))
    return total


CASES = {
    "conv3d": lambda: keras.Sequential([keras.Input((12, 10, 8, 3)), layers.Conv3D(8, 3, padding="same"),
                                        layers.MaxPooling3D(2), layers.Conv3D(5, 2, padding="valid"),
                                        layers.Flatten(), layers.Dense(7)]),
    "conv2d_strided": lambda: keras.Sequential([keras.Input((17, 13, 4)), layers.Conv2D(6, 5, strides=2, padding="same"),
                                                layers.Conv2D(3, (3, 1), padding="valid", use_bias=False)]),
    "conv1d": lambda: keras.Sequential([keras.Input((40, 5)), layers.Conv1D(9, 4, padding="same"),
                                        layers.Conv1D(2, 3, dilation_rate=2)]),
    "depthwise_separable": lambda: keras.Sequential([keras.Input((16, 16, 6)), layers.DepthwiseConv2D(3, depth_multiplier=2, padding="same"),
                                                     layers.SeparableConv2D(10, 3, padding="same")]),
    "transpose": lambda: keras.Sequential([keras.Input((8, 8, 6)), layers.Conv2DTranspose(4, 3, strides=2, padding="same"),
                                           layers.Conv2DTranspose(3, 2, strides=2, padding="valid")]),
    "dilated_native": lambda: keras.Sequential([keras.Input((20, 18, 4)),
                                                DilatedConv2D(6, 3, dilation_rate=3, padding="same"),
                                                DilatedConv2D(2, 3, dilation_rate=(2, 5), use_bias=False)]),
    "dense_sequence": lambda: keras.Sequential([keras.Input((5, 11)), layers.Dense(13), layers.Dense(2, use_bias=False)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_counter_matches_tf_profiler(name, monkeypatch):
    if name == "dilated_native":
        # The native dilated kernel's count, the maths the counter counts: that forward kernel exists with
        # either kernel set (Eigen lacks only its gradient, for which the layer takes Keras's
        # space-to-batch path, which also convolves the padding it adds).
        import common.nn.layers

        monkeypatch.setattr(common.nn.layers, "native_dilated_conv_trains", lambda dtype="float32": True)
    model = CASES[name]()
    ours = forward_flops_per_sample(model)
    profiled = profiler_flops(model)
    assert ours > 0
    # Exact once the profiler's bias adds (1 FLOP per output element) are taken out.
    assert ours == profiled - bias_adds(model), (ours, profiled, bias_adds(model))


def test_conv3d_transpose_by_hand():
    # The profiler does not register Conv3DBackpropInputV2; check the scatter form by hand:
    # each of the 4^3 x 3 input values meets a 2x2x2 x 5 kernel slice.
    layer = layers.Conv3DTranspose(5, 2, strides=2)
    model = keras.Sequential([keras.Input((4, 4, 4, 3)), layer])
    assert layer_multiply_adds(layer, (None, 4, 4, 4, 3), (None, 8, 8, 8, 5)) == 4 ** 3 * 3 * 8 * 5
    assert forward_flops_per_sample(model) == 2 * 4 ** 3 * 3 * 8 * 5


def test_mlperf_network_anchors():
    from cosmoflow.config import CosmoflowConfig
    from cosmoflow.model import build_model

    cfg = load_config(CosmoflowConfig, REPO / "configs/cosmoflow/mlperf.yaml")
    model = build_model(cfg)
    assert model.count_params() == 8_907_556
    assert round(forward_flops_per_sample(model) / 1e9, 2) == 68.86


@pytest.mark.parametrize("rank,size,kernel,stride,dilation", [
    (1, (11,), 5, 1, 1), (1, (11,), 3, 2, 1), (1, (10,), 3, 1, 4),
    (2, (9, 14), 3, 1, 12), (2, (8, 7), 4, 2, 1), (2, (24, 36), 3, 1, 36),
    (3, (6, 5, 7), 3, 1, 2), (3, (9, 8, 6), 3, 2, 1),
])
def test_inside_only_count_equals_a_convolution_of_ones(rank, size, kernel, stride, dilation):
    # Independent reference: convolving an all-ones 1-channel input with an all-ones kernel under "same"
    # padding gives, at each output, the number of taps that land inside the input.
    conv = {1: layers.Conv1D, 2: layers.Conv2D, 3: layers.Conv3D}[rank]
    layer = conv(1, kernel, strides=stride, dilation_rate=dilation, padding="same", use_bias=False,
                 kernel_initializer="ones")
    model = keras.Sequential([keras.Input((*size, 1)), layer])
    ones = np.ones((1, *size, 1), "float32")
    reference = int(round(float(np.sum(model(ones).numpy()))))
    assert forward_flops_per_sample(model, inside_only=True) == 2 * reference
    full = forward_flops_per_sample(model)
    assert full == 2 * int(np.prod(model.output_shape[1:])) * kernel ** rank
    assert reference <= full // 2


def test_inside_only_leaves_valid_convolutions_and_transposes_whole():
    model = CASES["transpose"]()
    assert forward_flops_per_sample(model, inside_only=True) == forward_flops_per_sample(model)
    valid = keras.Sequential([keras.Input((12, 12, 3)), layers.Conv2D(4, 3, dilation_rate=2)])
    assert forward_flops_per_sample(valid, inside_only=True) == forward_flops_per_sample(valid)
