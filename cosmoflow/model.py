"""The CosmoFlow network (MLPerf HPC reference architecture, with knobs).

Input (x, y, z, redshifts) channels-last ->
``conv_blocks`` x [Conv3D(base_filters * multiplier**i, or ``first_filters`` in block 1 if set, kernel,
same, bias) ->
LeakyReLU -> MaxPool3D (computed as MaxPool3D -> LeakyReLU, the same function)] -> Flatten (or, with
``pooling: average``, the mean over positions of each filter) -> [Dense -> LeakyReLU -> Dropout] per
``dense_units`` -> Dense(n_targets, tanh) x ``output_scale``.

With ``periodic_padding`` each convolution sees the box as the periodic volume it is (the mocks are
periodic N-body boxes): its input is wrapped around by (kernel - 1) // 2 voxels before and kernel // 2 after
on each spatial axis (the split of ``same`` padding), and the convolution is then ``valid``.  Pooling by a
size that divides the map keeps a periodic field periodic, so every block does it; with ``pooling: average``
the network is then invariant under a periodic shift of its input by a multiple of pool_size**conv_blocks.
The wrap is built of plain Keras layers (two crops and a concatenation per axis): the saved network loads
with Keras alone, and the FLOP count of the convolutions is that of ``same`` padding.

With ``summaries`` (issue 49: Min et al. 2024 give a network the measured statistics and let it learn what is
left) the network takes the particle counts in float32 and normalises them itself (:class:`NormaliseCounts`,
what the input pipeline does otherwise: the same values into the first convolution); :class:`VolumeSummaries`
computes the summary statistics of :mod:`cosmoflow.summaries` from the same counts (the ridge baseline's
numbers, to float32 round-off), standardised by the mean and standard deviation of the training volumes'
(:func:`prepare_network`), and they join the convolutional features before the dense layers.  Those two layers
are the package's own: a saved network loads with Keras once ``cosmoflow.model`` is imported.  With
``summary_residual`` as well, the network learns the baseline's residual: a fixed linear path from the
standardised summaries (the ridge of ``cosmoflow.information`` fitted at the start on the volumes training uses) is added to
the head's output, whose last layer starts at zero, so that training starts from the baseline's predictions.

``configs/cosmoflow/mlperf.yaml`` gives the reference network at 128^3 x 4:
8,907,556 parameters, 68.86 GFLOP forward per sample.  The SC18 variant
(16 filters, kernel 2, valid padding, batch norm, 64^3 x 1, 3 targets) is a
matter of config.
"""

from __future__ import annotations

import logging
from itertools import combinations

import keras
import numpy as np
from keras import layers, ops

from common.deferred import DeferredModule
from common.errors import ConfigError
from common.nn.layers import ByteDropout, FusedBatchNormalization
from common.nn.precision import compute_dtype
from cosmoflow import summaries as summary_statistics
from cosmoflow.config import CosmoflowConfig

# The input pipeline's module imports TensorFlow: read at the first standardisation, so that the network also
# builds under Keras' JAX backend without TensorFlow.
cosmoflow_data = DeferredModule("cosmoflow.data")
# The ridge baseline (scikit-learn) that ``model.summary_residual`` starts from: read when it is fitted.
cosmoflow_information = DeferredModule("cosmoflow.information")

log = logging.getLogger(__name__)

# Training volumes the summary standardisation is measured on (the first of those training uses, in file order).
STANDARDISATION_SAMPLES = 256
# The fewest training volumes model.summary_residual fits its ridge on: the penalty is chosen on the last 20 %.
RIDGE_MIN_VOLUMES = 10


def input_dtype(cfg: CosmoflowConfig) -> str:
    """What the network takes: the normalised volume in the compute dtype, or with ``model.summaries`` the
    counts in float32 (its summaries need them whole; it normalises them itself)."""
    return "float32" if cfg.model.summaries else compute_dtype(cfg.train.precision)


def check_summaries(cfg: CosmoflowConfig) -> None:
    """A :class:`ConfigError` naming the key unless ``model.summaries`` can be computed on these volumes."""
    m, shape = cfg.model, list(cfg.data.sample_shape)
    if not m.summaries:
        return
    if len(set(shape[:3])) != 1:
        raise ConfigError(f"model.summaries: the summaries are of a cubic box, but data.sample_shape is {shape}")
    if not _bins_fit(shape[0], float(cfg.data.mock.box_size_mpc_h), m.summary_bins):
        most = max((b for b in range(1, m.summary_bins) if _bins_fit(shape[0], cfg.data.mock.box_size_mpc_h, b)),
                   default=None)
        raise ConfigError(f"model.summary_bins={m.summary_bins}: a k bin of the {shape[0]}^3 volumes holds no "
                          f"Fourier mode; " + (f"use at most {most}" if most else "the volumes are too small"))


def _bins_fit(grid: int, box_size: float, n_bins: int) -> bool:
    """Whether every one of ``n_bins`` k bins of a ``grid``^3 volume holds a Fourier mode."""
    try:
        summary_statistics.k_binning(grid, float(box_size), n_bins)
    except ConfigError:
        return False
    return True


@keras.saving.register_keras_serializable(package="cosmoflow")
class NormaliseCounts(layers.Layer):
    """Particle counts -> log(1 + counts), or counts / their mean per sample and channel-wide (``data.apply_log``
    false), in float32: :func:`cosmoflow.data.normalise` inside the network."""

    def __init__(self, apply_log: bool = True, **kwargs):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        self.apply_log = apply_log

    def call(self, counts):
        if self.apply_log:
            return ops.log1p(counts)
        return counts / ops.maximum(ops.mean(counts, axis=(1, 2, 3, 4), keepdims=True), 1e-6)

    def get_config(self):
        return {**super().get_config(), "apply_log": self.apply_log}


@keras.saving.register_keras_serializable(package="cosmoflow")
class VolumeSummaries(layers.Layer):
    """The summary vector of :func:`cosmoflow.summaries.summary_vector` of each volume of counts (batch, n, n, n,
    channels), in float32, standardised: ``(summary - mean) / scale`` with the non-trainable ``mean`` and
    ``scale`` that :func:`prepare_network` sets from the training volumes (0 and 1 until then).

    The 3-D real FFT is a real FFT along z and a 2-D FFT over x and y (numpy's rfftn layout); the k bins, their
    mode weights and the one-point definitions are :mod:`cosmoflow.summaries`' own."""

    def __init__(self, parts=summary_statistics.SUMMARY_PARTS, n_bins: int = 12, box_size: float = 256.0, **kwargs):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        self.parts = tuple(part for part in summary_statistics.SUMMARY_PARTS if part in parts)
        self.n_bins, self.box_size = int(n_bins), float(box_size)

    def build(self, input_shape):
        grid, channels = int(input_shape[1]), int(input_shape[-1])
        self.grid, self.channels = grid, channels
        inside, bins, weights, modes = summary_statistics.k_binning(grid, self.box_size, self.n_bins)
        self._inside, self._bins = np.asarray(inside, np.int32), np.asarray(bins, np.int32)
        self._weights = np.asarray(weights, np.float32)
        self._modes = np.asarray(modes, np.float32)
        length = summary_statistics.summary_length(channels, self.n_bins, self.parts)
        self.mean = self.add_weight(shape=(length,), initializer="zeros", trainable=False, name="mean")
        self.scale = self.add_weight(shape=(length,), initializer="ones", trainable=False, name="scale")

    def compute_output_shape(self, input_shape):
        return (input_shape[0], summary_statistics.summary_length(int(input_shape[-1]), self.n_bins, self.parts))

    def _spectrum(self, field):
        """(real, imaginary) parts of the rfftn of ``field`` (batch, n, n, n), flattened in C order over the
        (x, y, kz) grid and taken at the positions inside the k bins: (batch, modes)."""
        real, imag = ops.rfft(field)                                         # along z
        real, imag = ops.transpose(real, (0, 3, 1, 2)), ops.transpose(imag, (0, 3, 1, 2))
        real, imag = ops.fft2((real, imag))                                  # over x and y
        flat = (self.grid * self.grid * (self.grid // 2 + 1),)

        def take(part):
            part = ops.reshape(ops.transpose(part, (0, 2, 3, 1)), (-1, *flat))
            return ops.take(part, self._inside, axis=1)

        return take(real), take(imag)

    def _binned(self, product):
        """Mode-weighted mean of ``product`` (batch, modes) in each k bin: (batch, bins)."""
        summed = ops.segment_sum(ops.transpose(product * self._weights), self._bins, num_segments=self.n_bins)
        return ops.transpose(summed) / self._modes

    @staticmethod
    def _log(x):
        return ops.log(ops.maximum(x, summary_statistics.LOG_FLOOR))

    def call(self, counts):
        counts = ops.cast(counts, "float32")
        norm = self.box_size ** 3 / self.grid ** 6
        channels = [counts[..., c] for c in range(self.channels)]
        means = [ops.maximum(ops.mean(c, axis=(1, 2, 3), keepdims=True), summary_statistics.MEAN_FLOOR)
                 for c in channels]
        out = {part: [] for part in self.parts}   # concatenated in SUMMARY_PARTS order, as summary_vector
        if "power" in self.parts or "cross" in self.parts:
            spectra = [self._spectrum(c / m - 1.0) for c, m in zip(channels, means)]
            squared = [re * re + im * im for re, im in spectra]
            auto = [self._binned(s * norm) for s in squared]
            if "power" in self.parts:
                out["power"].extend(self._log(p) for p in auto)
            if "cross" in self.parts:
                total = [ops.sum(s * self._weights, axis=1, keepdims=True) for s in squared]
                for i, j in combinations(range(self.channels), 2):
                    (re_i, im_i), (re_j, im_j) = spectra[i], spectra[j]
                    p_ij = self._binned((re_i * re_j + im_i * im_j) * norm)
                    product = auto[i] * auto[j]
                    out["cross"].append(ops.where(product > 0, p_ij / ops.sqrt(ops.maximum(product, 1e-37)), 0.0))
                    out["cross"].append(ops.log(ops.maximum(total[i], summary_statistics.LOG_FLOOR)
                                       / ops.maximum(total[j], summary_statistics.LOG_FLOOR)))
        if "log_power" in self.parts:
            for c, m in zip(channels, means):
                field = ops.log1p(c / m)
                re, im = self._spectrum(field - ops.mean(field, axis=(1, 2, 3), keepdims=True))
                out["log_power"].append(self._log(self._binned((re * re + im * im) * norm)))
        if "one_point" in self.parts:
            for c, m in zip(channels, means):
                out["one_point"].append(self._one_point(c, m))
        vector = ops.concatenate([piece for part in self.parts for piece in out[part]], axis=1)
        return (vector - self.mean) / self.scale

    def _one_point(self, counts, mean):
        """:func:`cosmoflow.summaries.one_point` of one channel (batch, n, n, n): (batch, 17)."""
        edges = summary_statistics.PDF_EDGES
        ratio = counts / mean
        features = [ops.mean(ops.cast((ratio >= low) & (ratio < high), "float32"), axis=(1, 2, 3))
                    for low, high in zip(edges[:-1], edges[1:])]
        n = self.grid
        for cell in summary_statistics.MOMENT_CELLS:
            m = n // cell
            summed = counts[:, :m * cell, :m * cell, :m * cell]
            if cell > 1:
                summed = ops.sum(ops.reshape(summed, (-1, m, cell, m, cell, m, cell)), axis=(2, 4, 6))
            delta = summed / ops.maximum(ops.mean(summed, axis=(1, 2, 3), keepdims=True),
                                         summary_statistics.MEAN_FLOOR) - 1.0
            square = delta * delta
            variance = ops.maximum(ops.mean(square, axis=(1, 2, 3)), summary_statistics.LOG_FLOOR)
            features.append(ops.mean(square * delta, axis=(1, 2, 3)) / variance ** 1.5)
            features.append(ops.mean(square * square, axis=(1, 2, 3)) / variance ** 2 - 3.0)
        return ops.stack(features, axis=1)

    def get_config(self):
        return {**super().get_config(), "parts": list(self.parts), "n_bins": self.n_bins, "box_size": self.box_size}


def prepare_network(network: keras.Model, cfg: CosmoflowConfig, dist) -> None:
    """With ``model.summaries``, rank 0 sets the summary layer's standardisation: the mean and standard
    deviation of each summary over the first :data:`STANDARDISATION_SAMPLES` training volumes, computed by
    :mod:`cosmoflow.summaries` in float64 from the stored counts (the baseline's own numbers); a summary that
    does not vary keeps scale 1.  With ``model.summary_residual`` the summaries of every training volume are
    computed (each rank a share, in file order) and rank 0 fits :func:`cosmoflow.information.fit_ridge` on them,
    the baseline's regression: the layer takes its standardisation and the fixed ``summary_ridge`` path its
    coefficients, so the network starts as the baseline.  The other ranks get rank 0's values with the weights
    at the start; the trainer calls this on a fresh start only (a resume takes its checkpoint's)."""
    m = cfg.model
    if not m.summaries:
        return
    layer = network.get_layer("summaries")
    if m.summary_residual:
        rows, targets = _every_training_summary(cfg, dist)
        if len(rows) < RIDGE_MIN_VOLUMES:   # every rank holds every row: all refuse alike
            raise ConfigError(f"model.summary_residual: the ridge it starts from needs at least {RIDGE_MIN_VOLUMES} "
                              f"training volumes (its penalty is chosen on the last 20 %), and training uses "
                              f"{len(rows)} (data.n_train, {cfg.data.data_dir}/train)")
        if not dist.is_root:
            return
        _warn_constant(rows, cfg)
        pipeline, penalty = cosmoflow_information.fit_ridge(rows, targets)
        log.info(f"cosmoflow: the network starts as the ridge baseline on the summaries of {len(rows)} training "
                 f"volumes (penalty per target {', '.join(f'{p:.3g}' for p in penalty)}, chosen on the last 20 %)")
        scaler, ridge = pipeline[0], pipeline[-1]
        layer.mean.assign(scaler.mean_.astype(np.float32))
        layer.scale.assign(scaler.scale_.astype(np.float32))
        path = network.get_layer("summary_ridge")
        path.kernel.assign(np.asarray(ridge.coef_, np.float64).reshape(len(targets[0]), -1).T.astype(np.float32))
        path.bias.assign(np.broadcast_to(ridge.intercept_, (len(targets[0]),)).astype(np.float32))
        return
    if not dist.is_root:
        return
    rows = []
    for volume, _ in cosmoflow_data.raw_samples(cfg, "train", selected=True):
        rows.append(summary_statistics.summary_vector(volume, cfg.data.mock.box_size_mpc_h, m.summary_bins,
                                                      m.summaries))
        if len(rows) == STANDARDISATION_SAMPLES:
            break
    rows = np.array(rows)
    log.info(f"cosmoflow: the summaries standardised by the first {len(rows)} training volumes'")
    _warn_constant(rows, cfg)
    mean, std = rows.mean(axis=0), rows.std(axis=0)
    layer.mean.assign(mean.astype(np.float32))
    layer.scale.assign(np.where(std > 1e-6 * np.maximum(np.abs(mean), 1.0), std, 1.0).astype(np.float32))


def _warn_constant(rows: np.ndarray, cfg: CosmoflowConfig) -> None:
    """A warning when every summary is the same in all the training volumes read (empty or constant volumes):
    then the summaries tell the network nothing.  (A few constant ones are normal: the empty-voxel fraction of
    dense volumes is 0 in all of them.)"""
    if len(rows) > 1 and np.all(np.ptp(rows, axis=0) <= 1e-12 * np.maximum(np.abs(rows).max(axis=0), 1e-300)):
        log.warning(f"cosmoflow: every one of the {rows.shape[1]} model.summaries numbers is the same in all "
                    f"{len(rows)} training volumes read from {cfg.data.data_dir}/train (empty or constant volumes?): "
                    "they carry nothing")


def _every_training_summary(cfg: CosmoflowConfig, dist) -> tuple[np.ndarray, np.ndarray]:
    """The summary vector and normalised targets of every volume training uses (the first ``data.n_train`` of
    train/) in file order, on every rank: rank r computes those of volumes r, r + size, ... and the ranks gather
    them."""
    share = []
    for i, (volume, y) in enumerate(cosmoflow_data.raw_samples(cfg, "train", selected=True)):
        if i % dist.size == dist.rank:
            share.append((i, summary_statistics.summary_vector(volume, cfg.data.mock.box_size_mpc_h,
                                                               cfg.model.summary_bins, cfg.model.summaries), y))
    rows = sorted((row for part in dist.allgather_object(share) for row in part), key=lambda row: row[0])
    return np.array([row[1] for row in rows]), np.array([row[2] for row in rows], np.float64)


def check_blocks_fit(cfg: CosmoflowConfig) -> None:
    """A :class:`ConfigError` naming the keys unless every conv block has a volume left to work on."""
    m = cfg.model
    size = list(cfg.data.sample_shape[:3])
    for i in range(m.conv_blocks):
        if m.periodic_padding and any(s % m.pool_size or s < m.kernel_size // 2 for s in size):
            raise ConfigError(f"model.periodic_padding: block {i + 1} sees a volume of {size} voxels, which "
                              f"model.pool_size={m.pool_size} does not divide or model.kernel_size={m.kernel_size} "
                              f"cannot wrap around (a periodic field stays periodic only when pooling divides "
                              f"it): use data.sample_shape divisible by "
                              f"{m.pool_size ** m.conv_blocks} or fewer blocks")
        if m.padding == "valid":
            size = [s - m.kernel_size + 1 for s in size]
        size = [s // m.pool_size for s in size]
        if min(size) < 1:
            raise ConfigError(f"model.conv_blocks={m.conv_blocks}: block {i + 1} has nothing left of data.sample_shape "
                              f"{list(cfg.data.sample_shape)} (each block pools by model.pool_size={m.pool_size}"
                              f"{', after a valid convolution of kernel ' + str(m.kernel_size) if m.padding == 'valid' else ''}); "
                              f"use at most {i} blocks or larger samples")


def periodic_pad(x, before: int, after: int, name: str):
    """``x`` (batch, x, y, z, channels) wrapped around each spatial axis: the last ``before`` voxels put in
    front and the first ``after`` behind (numpy's ``np.pad(mode="wrap")``), of plain Keras layers."""
    for axis in range(3):
        size = x.shape[1 + axis]
        pieces = []
        if before:
            pieces.append(layers.Cropping3D(_crop(axis, size - before, 0), name=f"{name}_wrap{axis}_before")(x))
        pieces.append(x)
        if after:
            pieces.append(layers.Cropping3D(_crop(axis, 0, size - after), name=f"{name}_wrap{axis}_after")(x))
        if len(pieces) > 1:
            x = layers.Concatenate(axis=1 + axis, name=f"{name}_wrap{axis}")(pieces)
    return x


def _crop(axis: int, front: int, back: int) -> tuple:
    """Cropping3D's argument that cuts ``front`` and ``back`` voxels off spatial ``axis`` only."""
    return tuple((front, back) if a == axis else (0, 0) for a in range(3))


def build_model(cfg: CosmoflowConfig) -> keras.Model:
    check_blocks_fit(cfg)
    check_summaries(cfg)
    m = cfg.model
    n_targets = len(cfg.data.target_names)
    # The input pipeline hands volumes over in the compute dtype (see cosmoflow.data.normalise), or the counts in
    # float32 to a network that computes their summaries.
    inputs = keras.Input(shape=tuple(cfg.data.sample_shape), name="volume", dtype=input_dtype(cfg))
    x = inputs
    if m.summaries:
        x = NormaliseCounts(cfg.data.apply_log, name="normalise")(inputs)
    for i in range(m.conv_blocks):
        filters = m.first_filters if i == 0 and m.first_filters is not None else m.base_filters * m.filter_multiplier ** i
        padding = m.padding
        if m.periodic_padding:
            x = periodic_pad(x, (m.kernel_size - 1) // 2, m.kernel_size // 2, name=f"conv{i + 1}")
            padding = "valid"
        x = layers.Conv3D(filters, m.kernel_size, padding=padding, use_bias=True, name=f"conv{i + 1}")(x)
        if m.batch_norm:
            x = FusedBatchNormalization(momentum=m.batch_norm_momentum, name=f"batch_normalization{i + 1}")(x)
        # Pool, then activate: LeakyReLU with a slope >= 0 (the config's bound) is non-decreasing, so it
        # commutes with max pooling; the same values, with the activation and its gradient on 1/8 of the
        # elements (6% of a 128^3 bf16 training step here).
        x = layers.MaxPooling3D(m.pool_size, name=f"pool{i + 1}")(x)
        x = layers.LeakyReLU(negative_slope=m.leaky_relu_slope, name=f"conv{i + 1}_act")(x)
    if m.pooling == "average":
        x = layers.GlobalAveragePooling3D(name="global_average")(x)
    else:
        x = layers.Flatten(name="flatten")(x)
    if m.summaries:
        measured = VolumeSummaries(m.summaries, m.summary_bins, cfg.data.mock.box_size_mpc_h, name="summaries")(inputs)
        x = layers.Concatenate(name="features_and_summaries")([x, measured])
    regularizer = keras.regularizers.L2(m.l2) if m.l2 > 0 else None
    for j, units in enumerate(m.dense_units):
        x = layers.Dense(units, kernel_regularizer=regularizer, name=f"dense{j + 1}")(x)
        x = layers.LeakyReLU(negative_slope=m.leaky_relu_slope, name=f"dense{j + 1}_act")(x)
        if m.dropout > 0:
            x = ByteDropout(m.dropout, name=f"dropout{j + 1}")(x)
    # Outputs in float32 whatever the precision policy.
    # With summary_residual the head's last layer starts at zero: the network starts as the ridge path below.
    x = layers.Dense(n_targets, activation="tanh", kernel_regularizer=regularizer, dtype="float32", name="targets",
                     kernel_initializer="zeros" if m.summary_residual else "glorot_uniform")(x)
    outputs = layers.Rescaling(m.output_scale, dtype="float32", name="output_scale")(x)
    if m.summary_residual:
        # The baseline: a linear map of the standardised summaries, fitted by prepare_network and never trained.
        ridge = layers.Dense(n_targets, trainable=False, dtype="float32", name="summary_ridge")(measured)
        outputs = layers.Add(dtype="float32", name="ridge_plus_residual")([ridge, outputs])
    return keras.Model(inputs, outputs, name=m.name)
