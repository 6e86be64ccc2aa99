"""Semi-supervised extreme-weather detection (Racah et al., NIPS 2017; Kurth et al., SC17).

2D (default): an encoder of ``len(filters)`` convs (k x k, stride 2,
LeakyReLU 0.1, He init; batch norm on the bottleneck) turns an H x W x C
snapshot into a grid of cells of 2 ** len(filters) pixels (768 x 1152 with
six layers: 12 x 18 cells of 64 px).  The decoder mirrors it with transposed
convs back to H x W x C: the reconstruction every sample, labeled or not,
learns from.  The head, on the bottleneck, predicts one box per cell: 3x3
convs to objectness logits (2), class logits (4) and the box (x, y offsets in
the cell through a sigmoid; w, h as log2(size / cell), linear so boxes
smaller than a cell are possible).  ``model.head_level: L`` moves the head to
encoder level L (cells of 2 ** L px): the bottleneck upsampled and
concatenated with that level's features, for objects smaller than the
bottleneck's cells.

3D: the same over ``time_steps`` consecutive snapshots with Conv3D
(time_kernel x k x k, stride 1 x 2 x 2): a box grid per time step.

Outputs (float32 under any precision): ``detect`` (..., gy, gx, 10) =
[objectness logits 2, class logits 4, x, y, log2 w, log2 h] and ``recon``
(..., H, W, C).
"""

from __future__ import annotations

import keras
from keras import layers

from climate_seg.detection.boxes import DETECTION_CLASSES
from climate_seg.detection.config import DetectConfig
from common.nn.layers import FusedBatchNormalization


def build_detector(cfg: DetectConfig) -> keras.Model:
    m, data = cfg.model, cfg.data
    h, w = data.grid
    if h % m.cell or w % m.cell:
        raise ValueError(f"detector: the {h} x {w} grid must divide by the cell size {m.cell} "
                         f"(2 ** model.head_level, else 2 ** len(model.filters))")
    channels = len(data.channels)
    three_d = m.variant == "3d"
    shape = (m.time_steps, h, w, channels) if three_d else (h, w, channels)
    regularizer = keras.regularizers.L2(m.weight_decay) if m.weight_decay > 0 else None
    kernel = (m.time_kernel_size, m.kernel_size, m.kernel_size) if three_d else m.kernel_size
    strides = (1, 2, 2) if three_d else 2
    conv = layers.Conv3D if three_d else layers.Conv2D
    deconv = layers.Conv3DTranspose if three_d else layers.Conv2DTranspose
    common = dict(padding="same", kernel_initializer="he_normal", kernel_regularizer=regularizer)

    inputs = keras.Input(shape=shape, name="snapshots" if three_d else "snapshot")
    x = inputs
    levels = []
    for i, filters in enumerate(m.filters):
        x = conv(filters, kernel, strides=strides, name=f"encoder{i + 1}", **common)(x)
        if i == len(m.filters) - 1 and m.bottleneck_batch_norm:
            x = FusedBatchNormalization(name="bottleneck_bn")(x)
        x = layers.LeakyReLU(negative_slope=m.leaky_relu_slope, name=f"encoder{i + 1}_act")(x)
        levels.append(x)
    bottleneck = x

    y = bottleneck
    for i in reversed(range(len(m.filters))):
        last = i == 0
        y = deconv(channels if last else m.filters[i - 1], kernel, strides=strides, name=f"decoder{i + 1}",
                   dtype="float32" if last else None, **common)(y)
        if not last:
            y = layers.LeakyReLU(negative_slope=m.leaky_relu_slope, name=f"decoder{i + 1}_act")(y)
    recon = layers.Identity(dtype="float32", name="recon")(y)

    head_kernel = (1, m.head_kernel_size, m.head_kernel_size) if three_d else m.head_kernel_size
    head = bottleneck
    if m.head_level is not None and m.head_level < len(m.filters):
        # A finer head: the bottleneck's context brought up to level head_level, beside that level's features.
        factor = 2 ** (len(m.filters) - m.head_level)
        up = (layers.UpSampling3D((1, factor, factor), name="head_upsample") if three_d
              else layers.UpSampling2D(factor, name="head_upsample"))(bottleneck)
        head = layers.Concatenate(name="head_features")([levels[m.head_level - 1], up])
    head = conv(m.filters[-1] // 2, head_kernel, name="head_conv", **common)(head)
    head = layers.LeakyReLU(negative_slope=m.leaky_relu_slope, name="head_act")(head)
    objectness = conv(2, head_kernel, padding="same", dtype="float32", name="objectness")(head)
    classes = conv(len(DETECTION_CLASSES), head_kernel, padding="same", dtype="float32", name="classes")(head)
    xy = conv(2, head_kernel, padding="same", activation="sigmoid", dtype="float32", name="box_xy")(head)
    log_wh = conv(2, head_kernel, padding="same", dtype="float32", name="box_log_wh")(head)
    detect = layers.Concatenate(dtype="float32", name="detect")([objectness, classes, xy, log_wh])
    return keras.Model(inputs, {"detect": detect, "recon": recon}, name=f"detector_{m.variant}")
