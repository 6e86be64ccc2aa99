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

``configs/cosmoflow/mlperf.yaml`` gives the reference network at 128^3 x 4:
8,907,556 parameters, 68.86 GFLOP forward per sample.  The SC18 variant
(16 filters, kernel 2, valid padding, batch norm, 64^3 x 1, 3 targets) is a
matter of config.
"""

from __future__ import annotations

import keras
from keras import layers

from common.errors import ConfigError
from common.nn.layers import ByteDropout, FusedBatchNormalization
from common.nn.precision import compute_dtype
from cosmoflow.config import CosmoflowConfig


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
    m = cfg.model
    n_targets = len(cfg.data.target_names)
    # The input pipeline hands volumes over in the compute dtype (see cosmoflow.data.normalise).
    inputs = keras.Input(shape=tuple(cfg.data.sample_shape), name="volume", dtype=compute_dtype(cfg.train.precision))
    x = inputs
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
    regularizer = keras.regularizers.L2(m.l2) if m.l2 > 0 else None
    for j, units in enumerate(m.dense_units):
        x = layers.Dense(units, kernel_regularizer=regularizer, name=f"dense{j + 1}")(x)
        x = layers.LeakyReLU(negative_slope=m.leaky_relu_slope, name=f"dense{j + 1}_act")(x)
        if m.dropout > 0:
            x = ByteDropout(m.dropout, name=f"dropout{j + 1}")(x)
    # Outputs in float32 whatever the precision policy.
    x = layers.Dense(n_targets, activation="tanh", kernel_regularizer=regularizer, dtype="float32", name="targets")(x)
    outputs = layers.Rescaling(m.output_scale, dtype="float32", name="output_scale")(x)
    return keras.Model(inputs, outputs, name=m.name)
