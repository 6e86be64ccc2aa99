"""The detection loss: the box terms on labeled samples and the reconstruction term on every sample
(Racah et al. 2017)."""

from __future__ import annotations

import keras
from keras import ops

from climate_seg.detection.config import DetectConfig


def build_loss(cfg: DetectConfig) -> dict:
    """Per output: the box terms on ``detect``, ``loss.lambda_ae`` x the reconstruction MSE on ``recon``."""
    loss = cfg.loss
    return {"detect": DetectionLoss(loss.coord_xy, loss.coord_wh, loss.no_object),
            "recon": ReconstructionLoss(loss.lambda_ae)}


def build_metrics(cfg: DetectConfig) -> list:
    """None during training: the box mAP needs decoding and matching (``climate_seg.detection.evaluate``)."""
    return []


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
