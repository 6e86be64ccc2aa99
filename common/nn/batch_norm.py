"""Batch-norm statistics re-estimated with the final weights ("precise BN").

During training each batch is normalised by its own statistics, and the moving
averages kept for inference are an exponential average over the last
``1 / (1 - momentum)`` steps, taken while the weights moved: noisy (a few
dozen samples each) and stale.  Where an output hangs on a small shift of the
features (CosmoFlow's n_s), that noise alone moves validation error from one
epoch to the next.  :func:`reestimate` replaces them by the plain average of
the per-batch statistics over ``batches`` training batches run forward (in
training mode, no update) with the weights as they are, averaged over ranks:
the estimate Wu & Johnson recommend in "Rethinking 'Batch' in BatchNorm"
(2021), and what detectron2's ``PreciseBN`` hook computes.  The mean is the
average of batch means, the variance the average of the (biased) batch
variances, which is what the moving average tracks, without its lag.
"""

from __future__ import annotations

import keras
import numpy as np

from common.nn.layers import all_layers


def batch_norm_layers(model: keras.Model) -> list[keras.layers.BatchNormalization]:
    """Every batch-norm layer of ``model`` and of the models nested in it, in order."""
    return [layer for layer in all_layers(model) if isinstance(layer, keras.layers.BatchNormalization)]


def reestimate(network: keras.Model, batches, num_batches: int, dist) -> int:
    """Set every batch-norm layer's moving mean and variance of ``network`` to the average of its batch
    statistics over ``num_batches`` batches of ``batches`` (``(x, ...)`` tuples, this rank's), then
    average them over the ranks of ``dist``.  Weights and optimizer are untouched.  Returns the number of
    batches this rank used (fewer when ``batches`` ends first); ranks may differ, each batch counts once."""
    layers = batch_norm_layers(network)
    if not layers or num_batches <= 0:
        return 0
    momenta = [layer.momentum for layer in layers]
    sums = [[np.zeros(layer.moving_mean.shape, np.float64), np.zeros(layer.moving_variance.shape, np.float64)]
            for layer in layers]
    used = 0
    try:
        for layer in layers:
            layer.momentum = 0.0   # the moving statistics become this batch's own
        for batch in batches.take(num_batches):
            x = batch[0] if isinstance(batch, (tuple, list)) else batch
            network(x, training=True)
            for (mean, variance), layer in zip(sums, layers):
                mean += np.asarray(layer.moving_mean.numpy(), np.float64)
                variance += np.asarray(layer.moving_variance.numpy(), np.float64)
            used += 1
    finally:
        for layer, momentum in zip(layers, momenta):
            layer.momentum = momentum
    # One allreduce of every sum and of the batch count: the average over all ranks' batches.
    flat = np.concatenate([np.concatenate([m.ravel(), v.ravel()]) for m, v in sums] + [np.array([used], np.float64)])
    flat = np.asarray(dist.sum_array(flat), np.float64)
    total = flat[-1]
    if total == 0:
        raise ValueError("no training batches to re-estimate the batch-norm statistics from")
    offset = 0
    for (mean, variance), layer in zip(sums, layers):
        for target, size in ((layer.moving_mean, mean.size), (layer.moving_variance, variance.size)):
            target.assign((flat[offset:offset + size] / total).reshape(target.shape).astype(np.float32))
            offset += size
    return used
