"""The CosmoFlow network as built against the reference layer order (conv -> [BN] -> LeakyReLU -> pool)."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers

from common.config import load_config
from conftest import REPO
from cosmoflow.config import CosmoflowConfig
from cosmoflow.model import build_model


def reference_order(cfg: CosmoflowConfig) -> keras.Model:
    """The MLPerf reference's block order with plain Keras layers (activation before pooling)."""
    m = cfg.model
    inputs = keras.Input(tuple(cfg.data.sample_shape))
    x = inputs
    for i in range(m.conv_blocks):
        x = layers.Conv3D(m.base_filters * m.filter_multiplier ** i, m.kernel_size, padding=m.padding)(x)
        if m.batch_norm:
            x = layers.BatchNormalization(momentum=m.batch_norm_momentum)(x)
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
    # Float32 round-off only; a conv bias ahead of batch norm has a gradient of exactly 0 up to that round-off,
    # so the absolute tolerance is scaled by the largest value of the whole set.
    scale = max(float(np.abs(np.asarray(b)).max()) for b in results[1])
    for a, b in zip(*results):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5 * scale)
