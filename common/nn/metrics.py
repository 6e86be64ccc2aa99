"""Segmentation metrics from a confusion matrix that can be pooled over ranks.

IoU must be computed from the confusion matrix summed over every batch and
every rank, then divided once; averaging per-batch or per-rank IoUs (which one
SC18 reference did) weights small batches and empty classes wrongly.  The
metric keeps that matrix as its state; :class:`common.loop.callbacks.EpochEndSync`
sums it over ranks at the end of each epoch and writes the pooled numbers.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops


def iou_from_confusion(confusion: np.ndarray) -> dict:
    """Per-class IoU, mean IoU (over classes present in truth or prediction) and pixel accuracy.

    ``confusion[t, p]`` counts pixels of true class t predicted as p.  A class
    that never occurs in truth or prediction has IoU NaN and is left out of
    the mean.
    """
    confusion = np.asarray(confusion, np.float64)
    tp = np.diag(confusion)
    union = confusion.sum(axis=0) + confusion.sum(axis=1) - tp
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = np.where(union > 0, tp / union, np.nan)
    total = confusion.sum()
    return {"iou": iou, "mean_iou": float(np.nanmean(iou)) if np.any(union > 0) else float("nan"),
            "pixel_accuracy": float(tp.sum() / total) if total else float("nan")}


@keras.saving.register_keras_serializable(package="common")
class ConfusionMatrix(keras.metrics.Metric):
    """Pixel confusion matrix of argmax predictions; ``result()`` is this rank's mean IoU.

    Args:
        num_classes: number of classes.
        class_names: names used for the per-class log entries (``iou_<name>``).
    """

    def __init__(self, num_classes: int, class_names=None, name="mean_iou", **kwargs):
        super().__init__(name=name, **kwargs)
        self.num_classes = num_classes
        self.class_names = list(class_names or [str(i) for i in range(num_classes)])
        # float64: float32 counts stop being exact past 2**24 pixels (19 full-size samples).
        self.confusion = self.add_variable(shape=(num_classes, num_classes), initializer="zeros", dtype="float64",
                                           name="confusion")

    def update_state(self, y_true, y_pred, sample_weight=None):
        truth = ops.reshape(ops.cast(y_true, "int32"), (-1,))
        predicted = ops.reshape(ops.cast(ops.argmax(y_pred, axis=-1), "int32"), (-1,))
        counts = ops.bincount(truth * self.num_classes + predicted, minlength=self.num_classes ** 2)
        self.confusion.assign_add(ops.reshape(ops.cast(counts, "float64"), (self.num_classes, self.num_classes)))

    def result(self):
        confusion = self.confusion
        tp = ops.diagonal(confusion)
        union = ops.sum(confusion, axis=0) + ops.sum(confusion, axis=1) - tp
        present = ops.cast(union > 0, "float64")
        iou = tp / ops.maximum(union, 1.0)
        return ops.cast(ops.sum(iou * present) / ops.maximum(ops.sum(present), 1.0), "float32")

    def reset_state(self):
        self.confusion.assign(ops.zeros((self.num_classes, self.num_classes), "float64"))

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes, "class_names": self.class_names}
