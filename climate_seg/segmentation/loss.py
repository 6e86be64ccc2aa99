"""The segmentation loss: per-pixel softmax cross-entropy weighted by each pixel's true class, with the
class weights from the configuration or from the training labels' class frequencies."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from climate_seg.cam5.config import CLASS_NAMES
from climate_seg.cam5.stats import load_class_frequencies, load_stats
from climate_seg.segmentation.config import ClimateConfig
from common.errors import DataError
from common.nn.metrics import ConfusionMatrix


def build_loss(cfg: ClimateConfig) -> keras.losses.Loss:
    return WeightedPixelCrossEntropy(class_weights(cfg))


def class_weights(cfg: ClimateConfig, stats: dict | None = None) -> np.ndarray:
    """Per-class loss weights: given in YAML, or from the class frequencies in stats.h5.

    ``inverse_frequency``: (1 / f_c) normalised to sum 1 (the SC18 references);
    ``power``: f_c ** -p (DeepCAM: p = 0.125); ``none``: ones.
    """
    # Read here, not at import: the loss itself runs on any Keras backend, without TensorFlow.
    # deferred: reads the statistics path, not at import: the loss runs on any Keras backend
    from climate_seg.cam5.data import stats_path

    spec = cfg.loss.class_weights
    if isinstance(spec, list):
        return np.asarray(spec, np.float64)
    if spec == "none":
        return np.ones(len(CLASS_NAMES))
    stats = stats if stats is not None else load_stats(stats_path(cfg))
    frequencies = load_class_frequencies(stats, stats_path(cfg), cfg.data)
    if np.any(frequencies <= 0):
        absent = [n for n, f in zip(CLASS_NAMES, frequencies) if f <= 0]
        raise DataError(f"{stats_path(cfg)}: class(es) {absent} never occur in the training labels; "
                        "give loss.class_weights as three numbers")
    if spec == "inverse_frequency":
        inverse = 1.0 / frequencies
        return inverse / inverse.sum()
    return frequencies ** -cfg.loss.weight_power


@keras.saving.register_keras_serializable(package="climate_seg")
class WeightedPixelCrossEntropy(keras.losses.Loss):
    """Softmax cross-entropy per pixel, each pixel weighted by its true class.

    ``y_true`` (batch, H, W) class indices, ``y_pred`` (batch, H, W, classes)
    logits.  The result is the mean over pixels of w[y] x CE (the SC18
    references' ``sparse_softmax_cross_entropy(weights=w[y])``).
    """

    def __init__(self, class_weights, name="weighted_pixel_cross_entropy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.class_weights = [float(w) for w in np.asarray(class_weights).reshape(-1)]

    def call(self, y_true, y_pred):
        labels = ops.cast(y_true, "int32")
        cross_entropy = ops.sparse_categorical_crossentropy(labels, ops.cast(y_pred, "float32"), from_logits=True)
        return cross_entropy * ops.take(ops.convert_to_tensor(self.class_weights, "float32"), labels)

    def get_config(self):
        return {**super().get_config(), "class_weights": self.class_weights}


def build_metrics(cfg: ClimateConfig) -> list:
    """The mean IoU over the classes (DeepCAM's quality metric), from a confusion matrix summed over ranks."""
    return [ConfusionMatrix(len(CLASS_NAMES), CLASS_NAMES, name="mean_iou")]
