"""The fast-path layers against the Keras layers they replace: same outputs, gradients, statistics, weights."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import kernel_tolerance, summation_tolerance
from common.nn.layers import (ByteDropout, DilatedConv2D, FusedBatchNormalization, native_dilated_conv_trains,
                           plain_keras)


@pytest.fixture
def policy(request):
    keras.mixed_precision.set_global_policy(request.param)
    yield request.param
    keras.mixed_precision.set_global_policy("float32")


def training_graph_ops(layer, spec) -> set:
    """Op types of a traced training step (forward + gradient of every weight) through ``layer``."""
    layer.build(spec.shape)

    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x, training=True) ** 2)
        return tape.gradient(loss, layer.trainable_weights)

    concrete = tf.function(step).get_concrete_function(spec)
    ops = {op.type for op in concrete.graph.get_operations()}
    for function in concrete.graph._functions.values():  # gradient functions
        ops |= {node.op for node in function.definition.node_def}
    return ops


def forward_and_gradients(layer, x, training=True):
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=training)
        y = tf.cast(y, tf.float32)
        probe = tf.cos(tf.reshape(tf.range(tf.size(y), dtype=tf.float32), tf.shape(y)))  # a fixed non-trivial dL/dy
        loss = tf.reduce_sum(y * probe)
    grads = tape.gradient(loss, [x] + layer.trainable_weights)
    return [np.asarray(tf.cast(t, tf.float32)) for t in [y] + grads]


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"], indirect=True)
@pytest.mark.parametrize("rate,padding", [(2, "same"), (5, "same"), (3, "valid"), ((2, 4), "same")])
def test_dilated_conv_equals_keras_conv(policy, rate, padding):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 9, 13, 3)).astype("float32")
    ours, theirs = (cls(4, 3, dilation_rate=rate, padding=padding) for cls in (DilatedConv2D, keras.layers.Conv2D))
    ours.build(x.shape)
    theirs.build(x.shape)
    theirs.set_weights(ours.get_weights())
    # The longest sum: a kernel gradient, one term per output position (2 x 9 x 13 at most).
    reduction = 2 * 9 * 13
    dtype = keras.mixed_precision.dtype_policy().compute_dtype
    for a, b in zip(forward_and_gradients(ours, x), forward_and_gradients(theirs, x)):
        np.testing.assert_allclose(a, b, rtol=0, atol=kernel_tolerance(reduction, np.abs(b).max(), dtype))


def test_dilated_conv_is_one_native_kernel_where_it_trains():
    spec = tf.TensorSpec((1, 24, 36, 8), tf.float32)
    ours = training_graph_ops(DilatedConv2D(4, 3, dilation_rate=12, padding="same"), spec)
    theirs = training_graph_ops(keras.layers.Conv2D(4, 3, dilation_rate=12, padding="same"), spec)
    assert "SpaceToBatchND" in theirs  # what Keras does on TensorFlow, and the reason for the layer
    if native_dilated_conv_trains():  # oneDNN (or a GPU)
        assert "SpaceToBatchND" not in ours and "BatchToSpaceND" not in ours
        assert "Conv2DBackpropFilter" in ours
    else:  # Eigen has no dilated-conv gradient: Keras's path, which trains
        assert ours == theirs


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"], indirect=True)
@pytest.mark.parametrize("shape", [(3, 7, 9, 5), (2, 3, 4, 5, 6)])
def test_fused_batch_norm_equals_keras_batch_norm(policy, shape):
    rng = np.random.default_rng(2)
    ours = FusedBatchNormalization(momentum=0.8)
    theirs = keras.layers.BatchNormalization(momentum=0.8)
    for layer in (ours, theirs):
        layer.build(shape)
        layer.gamma.assign(np.linspace(0.5, 2.0, shape[-1]))
        layer.beta.assign(np.linspace(-1.0, 1.0, shape[-1]))
    # Per-channel sums over every other axis (moments, and sum(dy), sum(dy * x_hat) in the gradient).
    reduction = int(np.prod(shape[:-1]))
    dtype = keras.mixed_precision.dtype_policy().compute_dtype
    for step in range(3):
        x = rng.normal(2.0, 3.0, size=shape).astype("float32")
        for a, b in zip(forward_and_gradients(ours, x), forward_and_gradients(theirs, x)):
            np.testing.assert_allclose(a, b, rtol=0, atol=kernel_tolerance(reduction, np.abs(b).max(), dtype))
    # Moving statistics after three updates.
    for moving in ("moving_mean", "moving_variance"):
        a, b = (getattr(layer, moving).numpy() for layer in (ours, theirs))
        np.testing.assert_allclose(a, b, rtol=0, atol=summation_tolerance(reduction, np.abs(b).max()), err_msg=moving)
    x = rng.normal(size=shape).astype("float32")
    inference = [forward_and_gradients(layer, x, training=False)[0] for layer in (ours, theirs)]
    np.testing.assert_allclose(*inference, rtol=0, atol=kernel_tolerance(reduction, np.abs(inference[1]).max(), dtype))


def test_fused_batch_norm_moving_statistics_against_numpy():
    rng = np.random.default_rng(3)
    layer = FusedBatchNormalization(momentum=0.5)
    x = rng.normal(1.0, 2.0, size=(4, 6, 5, 3)).astype("float32")
    layer(x, training=True)
    mean, variance = x.reshape(-1, 3).mean(0), x.reshape(-1, 3).var(0)  # biased, as Keras tracks it
    np.testing.assert_allclose(layer.moving_mean.numpy(), 0.5 * mean, rtol=1e-5)
    np.testing.assert_allclose(layer.moving_variance.numpy(), 0.5 + 0.5 * variance, rtol=1e-5)


def test_fused_batch_norm_runs_the_fused_kernel_and_falls_back_where_it_cannot():
    spec = tf.TensorSpec((2, 8, 8, 4), tf.float32)
    fused = training_graph_ops(FusedBatchNormalization(), spec)
    assert "FusedBatchNormV3" in fused and "FusedBatchNormGradV3" in fused
    tiny_epsilon = training_graph_ops(FusedBatchNormalization(epsilon=1e-6), spec)  # below the kernel's minimum
    assert "FusedBatchNormV3" not in tiny_epsilon


def test_models_with_the_layers_save_and_load(tmp_path):
    inputs = keras.Input((12, 12, 3))
    x = DilatedConv2D(5, 3, dilation_rate=2, padding="same", name="atrous")(inputs)
    x = FusedBatchNormalization(momentum=0.7, name="bn")(x)
    model = keras.Model(inputs, x)
    model(np.ones((2, 12, 12, 3), "float32"), training=True)
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    assert type(loaded.get_layer("atrous")) is DilatedConv2D
    assert type(loaded.get_layer("bn")) is FusedBatchNormalization
    assert loaded.get_layer("bn").momentum == 0.7
    probe = np.random.default_rng(4).normal(size=(1, 12, 12, 3)).astype("float32")
    np.testing.assert_array_equal(loaded(probe).numpy(), model(probe).numpy())


@pytest.mark.parametrize("rate", [0.5, 0.25, 0.2, 0.9])
def test_byte_dropout_is_inverted_dropout_at_the_rate(rate):
    layer = ByteDropout(rate, seed=11)
    x = tf.fill([1000, 1000], 3.0)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=True)
        loss = tf.reduce_sum(y)
    y, grad = y.numpy(), tape.gradient(loss, x).numpy()
    kept = y != 0
    # 10^6 Bernoulli draws: 5 standard deviations.
    assert abs(kept.mean() - (1 - rate)) < 5 * np.sqrt(rate * (1 - rate) / y.size)
    # Inverted scaling by 1 / (1 - rate), the rate quantised to 16 bits where 8 do not hold it exactly.
    rtol = 2.0 ** -17 / (1 - rate) + 1e-6
    np.testing.assert_allclose(np.unique(y[kept]), [3.0 / (1 - rate)], rtol=rtol)
    np.testing.assert_allclose(grad, np.where(kept, 1 / (1 - rate), 0.0), rtol=rtol)
    again = layer(x, training=True).numpy() != 0
    assert 0.5 * 2 * rate * (1 - rate) < (again != kept).mean()  # a new mask each call
    np.testing.assert_array_equal(layer(x, training=False).numpy(), x.numpy())
    twin = ByteDropout(rate, seed=11)
    np.testing.assert_array_equal(twin(x, training=True).numpy() != 0, kept)  # seeded like Keras's Dropout


def test_byte_dropout_draws_integers_not_floats():
    ops = training_graph_ops(ByteDropout(0.5), tf.TensorSpec((4, 8, 8, 3), tf.float32))
    assert "StatelessRandomUniformFullIntV2" in ops and "StatelessRandomUniformV2" not in ops


def test_plain_keras_swaps_in_the_keras_layers_with_the_same_weights():
    inputs = keras.Input((10, 10, 3))
    x = DilatedConv2D(4, 3, dilation_rate=2, padding="same")(inputs)
    x = FusedBatchNormalization()(x)
    x = ByteDropout(0.5)(x)
    model = keras.Model(inputs, keras.layers.Conv2D(2, 1)(x))
    model(np.ones((2, 10, 10, 3), "float32"), training=True)  # moving statistics away from their start
    plain = plain_keras(model)
    assert {type(layer).__module__.split(".")[0] for layer in plain.layers} == {"keras"}
    assert [type(layer).__name__ for layer in plain.layers][1:4] == ["Conv2D", "BatchNormalization", "Dropout"]
    probe = np.random.default_rng(5).normal(size=(2, 10, 10, 3)).astype("float32")
    np.testing.assert_allclose(plain(probe).numpy(), model(probe).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_the_training_wrapper_hands_the_network_its_inputs_as_they_are(policy):
    """Under mixed precision the trainer's wrapper passes a float32 input through unrounded: 257 is not a
    bfloat16 (it rounds to 256) and 2049 not a float16; the network's own layers cast what they compute in.
    (CosmoFlow's summaries network takes particle counts in float32; training saw them rounded until the
    wrapper stopped casting, while evaluation, which calls the network, saw them whole.)"""
    from common.distributed import Distributed
    from common.training_model import TrainingModel

    keras.mixed_precision.set_global_policy(policy)
    try:
        inputs = keras.Input((3,), dtype="float32")
        kept = keras.layers.Identity(dtype="float32")(inputs)
        network = keras.Model(inputs, kept)
        model = TrainingModel(network, Distributed())
        x = np.array([[257.0, 2049.0, 1.0]], np.float32)
        np.testing.assert_array_equal(np.asarray(model(x)), x)
        model.compile(loss="mse", jit_compile=False)
        np.testing.assert_array_equal(model.predict(x, verbose=0), x)
    finally:
        keras.mixed_precision.set_global_policy("float32")
