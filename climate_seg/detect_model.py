"""Semi-supervised extreme-weather detection (Racah et al., NIPS 2017; Kurth et al., SC17).

2D (default): an encoder of ``len(filters)`` convs (k x k, stride 2,
LeakyReLU 0.1, He init; batch norm on the bottleneck) turns an H x W x C
snapshot into a grid of cells of 2 ** len(filters) pixels (768 x 1152 with
six layers: 12 x 18 cells of 64 px).  The decoder mirrors it with transposed
convs back to H x W x C: the reconstruction every sample, labeled or not,
learns from.  The head, on the bottleneck, predicts one box per cell: 3x3
convs to objectness logits (2), class logits (4) and the box (x, y offsets in
the cell through a sigmoid; w, h as log2(size / cell), linear so boxes
smaller than a cell are possible).

3D: the same over ``time_steps`` consecutive snapshots with Conv3D
(time_kernel x k x k, stride 1 x 2 x 2): a box grid per time step.

Outputs (float32 under any precision): ``detect`` (..., gy, gx, 10) =
[objectness logits 2, class logits 4, x, y, log2 w, log2 h] and ``recon``
(..., H, W, C).
"""

from __future__ import annotations

import keras
from keras import layers, ops

from climate_seg.boxes import DETECTION_CLASSES
from climate_seg.config import DetectConfig
from common.layers import FusedBatchNormalization

HEAD_CHANNELS = 2 + len(DETECTION_CLASSES) + 4


def build_detector(cfg: DetectConfig) -> keras.Model:
    m, data = cfg.model, cfg.data
    h, w = data.grid
    if h % m.cell or w % m.cell:
        raise ValueError(f"detector: the {h} x {w} grid must divide by the cell size {m.cell} "
                         f"(2 ** len(model.filters))")
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
    for i, filters in enumerate(m.filters):
        x = conv(filters, kernel, strides=strides, name=f"encoder{i + 1}", **common)(x)
        if i == len(m.filters) - 1 and m.bottleneck_batch_norm:
            x = FusedBatchNormalization(name="bottleneck_bn")(x)
        x = layers.LeakyReLU(negative_slope=m.leaky_relu_slope, name=f"encoder{i + 1}_act")(x)
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
    head = conv(m.filters[-1] // 2, head_kernel, name="head_conv", **common)(bottleneck)
    head = layers.LeakyReLU(negative_slope=m.leaky_relu_slope, name="head_act")(head)
    objectness = conv(2, head_kernel, padding="same", dtype="float32", name="objectness")(head)
    classes = conv(len(DETECTION_CLASSES), head_kernel, padding="same", dtype="float32", name="classes")(head)
    xy = conv(2, head_kernel, padding="same", activation="sigmoid", dtype="float32", name="box_xy")(head)
    log_wh = conv(2, head_kernel, padding="same", dtype="float32", name="box_log_wh")(head)
    detect = layers.Concatenate(dtype="float32", name="detect")([objectness, classes, xy, log_wh])
    return keras.Model(inputs, {"detect": detect, "recon": recon}, name=f"detector_{m.variant}")


def smooth_l1(x):
    absolute = ops.abs(x)
    return ops.where(absolute < 1.0, 0.5 * x * x, absolute - 0.5)


@keras.saving.register_keras_serializable(package="climate_seg")
class DetectionLoss(keras.losses.Loss):
    """YOLO-style supervised loss per sample, summed over cells (and time steps).

    ``y_true`` (..., gy, gx, 7) = [object, class, x, y, log2 w, log2 h,
    labeled]; ``y_pred`` (..., gy, gx, 10) as the detector's ``detect``.  On
    labeled samples: coord_xy x smooth-L1 on x, y and coord_wh x smooth-L1 on
    w, h, -log p(object) and class cross-entropy on cells holding a box centre,
    no_object x -log p(no object) on the others.  Unlabeled samples add 0, and
    the batch mean runs over the labeled samples (Racah et al.: / batch).
    """

    def __init__(self, coord_xy=5.0, coord_wh=7.0, no_object=0.5, name="detection_loss", **kwargs):
        super().__init__(name=name, **kwargs)
        self.coord_xy, self.coord_wh, self.no_object = float(coord_xy), float(coord_wh), float(no_object)

    def call(self, y_true, y_pred):
        y_true = ops.cast(y_true, "float32")
        y_pred = ops.cast(y_pred, "float32")
        has_object, labeled = y_true[..., 0], y_true[..., 6]
        log_p = ops.log_softmax(y_pred[..., 0:2], axis=-1)
        class_ce = ops.sparse_categorical_crossentropy(ops.cast(y_true[..., 1], "int32"), y_pred[..., 2:6],
                                                       from_logits=True)
        xy = ops.sum(smooth_l1(y_pred[..., 6:8] - y_true[..., 2:4]), axis=-1)
        wh = ops.sum(smooth_l1(y_pred[..., 8:10] - y_true[..., 4:6]), axis=-1)
        per_cell = (has_object * (self.coord_xy * xy + self.coord_wh * wh - log_p[..., 1] + class_ce)
                    - self.no_object * (1.0 - has_object) * log_p[..., 0]) * labeled
        per_sample = ops.sum(ops.reshape(per_cell, (ops.shape(per_cell)[0], -1)), axis=-1)
        # Keras averages over the batch; rescale so the average runs over the labeled samples only
        # (a batch of 2 labeled + 6 unlabeled gets the same supervised weight as 2 labeled alone).
        labeled_samples = ops.max(ops.reshape(labeled, (ops.shape(labeled)[0], -1)), axis=-1)
        batch = ops.cast(ops.shape(labeled_samples)[0], "float32")
        return per_sample * batch / ops.maximum(ops.sum(labeled_samples), 1.0)

    def get_config(self):
        return {**super().get_config(), "coord_xy": self.coord_xy, "coord_wh": self.coord_wh,
                "no_object": self.no_object}


@keras.saving.register_keras_serializable(package="climate_seg")
class ReconstructionLoss(keras.losses.Loss):
    """``weight`` x mean squared reconstruction error per sample (lambda_ae; 0: supervised baseline)."""

    def __init__(self, weight=10.0, name="reconstruction_loss", **kwargs):
        super().__init__(name=name, **kwargs)
        self.weight = float(weight)

    def call(self, y_true, y_pred):
        error = ops.square(ops.cast(y_pred, "float32") - ops.cast(y_true, "float32"))
        return self.weight * ops.mean(ops.reshape(error, (ops.shape(error)[0], -1)), axis=-1)

    def get_config(self):
        return {**super().get_config(), "weight": self.weight}
