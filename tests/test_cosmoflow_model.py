"""The CosmoFlow network as built against the reference layer order (conv -> [BN] -> LeakyReLU -> pool)."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers

from common.config import load_config
from common.nn.layers import FusedBatchNormalization
from conftest import REPO, summation_tolerance
from cosmoflow.config import CosmoflowConfig
from cosmoflow.model import build_model


def reference_order(cfg: CosmoflowConfig) -> keras.Model:
    """The MLPerf reference's block order (activation before pooling).

    With the network's own batch norm layer, which tests/test_layers.py checks against Keras's: this
    test is about the order, whose two versions are the same function in floating point (max pooling
    commutes with a non-decreasing, correctly rounded activation)."""
    m = cfg.model
    inputs = keras.Input(tuple(cfg.data.sample_shape))
    x = inputs
    for i in range(m.conv_blocks):
        x = layers.Conv3D(m.base_filters * m.filter_multiplier ** i, m.kernel_size, padding=m.padding)(x)
        if m.batch_norm:
            x = FusedBatchNormalization(momentum=m.batch_norm_momentum)(x)
        x = layers.LeakyReLU(negative_slope=m.leaky_relu_slope)(x)
        x = layers.MaxPooling3D(m.pool_size)(x)
    x = layers.Flatten()(x)
    for units in m.dense_units:
        x = layers.LeakyReLU(negative_slope=m.leaky_relu_slope)(layers.Dense(units)(x))
    x = layers.Dense(len(cfg.data.target_names), activation="tanh")(x)
    return keras.Model(inputs, layers.Rescaling(m.output_scale)(x))


@pytest.mark.parametrize("batch_norm", [False, True])
def test_network_equals_the_reference_layer_order(batch_norm):
    keras.config.set_dtype_policy("float32")  # whatever an earlier test in this process left
    cfg = load_config(CosmoflowConfig, REPO / "configs/cosmoflow/demo.yaml",
                      ["data.sample_shape=[16,16,16,4]", f"model.batch_norm={str(batch_norm).lower()}",
                       "model.dropout=0", "model.conv_blocks=3", "train.precision=fp32"])
    ours, theirs = build_model(cfg), reference_order(cfg)
    theirs.set_weights(ours.get_weights())
    x = tf.constant(np.random.default_rng(0).normal(size=(3, 16, 16, 16, 4)).astype("float32"))
    results = []
    for model in (ours, theirs):
        with tf.GradientTape() as tape:
            y = model(x, training=True)
            loss = tf.reduce_sum(y * tf.constant([[1.0, -2.0, 0.5, 3.0]]))
        results.append([y] + tape.gradient(loss, model.trainable_weights))
    # Equal but for the order of the kernels' own sums (threaded weight-gradient reductions may add
    # their shards in any order): the longest is a first-layer weight gradient, batch x 16^3 terms.
    reduction = x.shape[0] * 16 ** 3
    for weight, a, b in zip(["output"] + [w.path for w in theirs.trainable_weights], *results):
        a, b = np.asarray(a), np.asarray(b)
        np.testing.assert_allclose(a, b, rtol=0, atol=summation_tolerance(reduction, np.abs(b).max()), err_msg=weight)


def test_average_pooling_hands_the_dense_layers_one_mean_per_filter():
    keras.config.set_dtype_policy("float32")
    overrides = ["data.sample_shape=[16,16,16,4]", "model.conv_blocks=2", "model.base_filters=4",
                 "model.dense_units=[8]", "model.dropout=0", "train.precision=fp32"]
    flat = build_model(load_config(CosmoflowConfig, REPO / "configs/cosmoflow/demo.yaml", overrides))
    model = build_model(load_config(CosmoflowConfig, REPO / "configs/cosmoflow/demo.yaml",
                                    overrides + ["model.pooling=average"]))
    # 8 filters after two blocks: the dense layer sees 8 numbers instead of 4^3 x 8.
    assert model.get_layer("dense1").kernel.shape == (8, 8) and flat.get_layer("dense1").kernel.shape == (512, 8)
    assert flat.count_params() - model.count_params() == (512 - 8) * 8
    x = tf.constant(np.random.default_rng(2).normal(size=(2, 16, 16, 16, 4)).astype("float32"))
    probe = keras.Model(model.inputs, [model.get_layer("conv2_act").output, model.get_layer("global_average").output])
    volume, pooled = (np.asarray(t, np.float64) for t in probe(x))
    # A float32 mean of 4^3 values is within gamma_64 max|value| of the exact one (Higham 4.2), plus the
    # division's half unit: below summation_tolerance(64, max|value|) = 2 gamma_64 sqrt(64) max|value|.
    np.testing.assert_allclose(pooled, volume.mean(axis=(1, 2, 3)), rtol=0,
                               atol=summation_tolerance(64, np.abs(volume).max()))


@pytest.mark.parametrize("batch_norm", [False, True])
def test_a_wider_first_block_changes_only_the_first_two_convolutions(batch_norm):
    keras.config.set_dtype_policy("float32")
    overrides = ["data.sample_shape=[16,16,16,4]", "model.conv_blocks=3", "model.base_filters=4",
                 "model.dense_units=[8]", "model.dropout=0", "train.precision=fp32",
                 f"model.batch_norm={str(batch_norm).lower()}"]
    narrow = build_model(load_config(CosmoflowConfig, REPO / "configs/cosmoflow/demo.yaml", overrides))
    wide = build_model(load_config(CosmoflowConfig, REPO / "configs/cosmoflow/demo.yaml",
                                   overrides + ["model.first_filters=12"]))
    # Block 1: 4 redshifts -> 12 filters (instead of 4); block 2 reads 12 channels into its 8; block 3 as before.
    assert wide.get_layer("conv1").kernel.shape == (3, 3, 3, 4, 12)
    assert wide.get_layer("conv2").kernel.shape == (3, 3, 3, 12, 8)
    for name in ("conv3", "dense1", "targets"):
        assert wide.get_layer(name).kernel.shape == narrow.get_layer(name).kernel.shape, name
    # 8 more first-block filters: each 27 x 4 weights and a bias (and a scale, offset and two statistics
    # under batch norm), and 8 more input channels for each of block 2's 8 filters of 27 weights.
    extra = 8 * (27 * 4 + 1 + (4 if batch_norm else 0)) + 8 * 27 * 8
    assert wide.count_params() - narrow.count_params() == extra
