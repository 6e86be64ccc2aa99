"""Precise batch norm (common/nn/batch_norm.py): the re-estimated statistics against numpy."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import summation_tolerance
from common.nn.batch_norm import batch_norm_layers, reestimate
from common.distributed import Distributed
from common.nn.layers import FusedBatchNormalization


def network():
    keras.utils.set_random_seed(3)
    inputs = keras.Input((6, 6, 6, 2))
    x = keras.layers.Conv3D(3, 3, padding="same")(inputs)
    x = FusedBatchNormalization(momentum=0.9)(x)          # the fused kernel (5D, folded to 4D)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(5)(x)
    x = keras.layers.BatchNormalization(momentum=0.99)(x)  # Keras's own path (2D)
    return keras.Model(inputs, keras.layers.Dense(1)(x))


def batches(count, batch=8, seed=0):
    rng = np.random.default_rng(seed)
    x = (3.0 + 2.0 * rng.standard_normal((count * batch, 6, 6, 6, 2))).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, np.zeros((count * batch, 1), "float32"))).batch(batch)


def expected_statistics(model, dataset):
    """Per layer, the average over batches of the batch mean and biased batch variance of its input, the
    input computed by Keras in training mode (earlier batch norms normalising by their batch's statistics)."""
    out = []
    for layer in batch_norm_layers(model):
        probe = keras.Model(model.inputs, layer.input)
        means, variances, largest = [], [], 0.0
        for x, _ in dataset:
            values = np.asarray(probe(x, training=True), np.float64)
            values = values.reshape(-1, values.shape[-1])
            means.append(values.mean(axis=0))
            variances.append(values.var(axis=0))
            largest = max(largest, float(np.max(values ** 2)))
        out.append((np.mean(means, axis=0), np.mean(variances, axis=0), values.shape[0], largest))
    return out


def test_statistics_are_the_average_of_the_batch_statistics():
    model = network()
    data = batches(5)
    expected = expected_statistics(model, data)
    weights = [w.numpy().copy() for w in model.trainable_weights]
    assert reestimate(model, data, 5, Distributed()) == 5
    for layer, (mean, variance, n, largest) in zip(batch_norm_layers(model), expected):
        # float32 sums of n terms per batch (the kernel's and Keras's moments) against float64 ones
        tolerance = summation_tolerance(n, largest)
        np.testing.assert_allclose(layer.moving_mean.numpy(), mean, rtol=0, atol=tolerance, err_msg=layer.name)
        np.testing.assert_allclose(layer.moving_variance.numpy(), variance, rtol=0, atol=2 * tolerance,
                                   err_msg=layer.name)
    assert [layer.momentum for layer in batch_norm_layers(model)] == [0.9, 0.99]
    for before, after in zip(weights, model.trainable_weights):
        np.testing.assert_array_equal(before, after.numpy())


def test_uses_at_most_the_batches_there_are_and_skips_networks_without_batch_norm():
    model = network()
    assert reestimate(model, batches(3), 10, Distributed()) == 3
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    assert reestimate(plain, batches(1), 4, Distributed()) == 0


def test_an_empty_dataset_is_an_error_that_says_so():
    with pytest.raises(ValueError, match="no training batches"):
        reestimate(network(), batches(1).take(0), 4, Distributed())
