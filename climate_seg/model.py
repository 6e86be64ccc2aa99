"""The segmentation networks by name, and the class-weighted pixel loss."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from climate_seg.config import CLASS_NAMES, ClimateConfig
from climate_seg.deeplab import build_deeplab
from climate_seg.tiramisu import build_tiramisu


def build_model(cfg: ClimateConfig) -> keras.Model:
    """``model.name``: tiramisu or deeplab, for the configured input size."""
    m = cfg.model
    shape = cfg.data.input_shape
    if m.name == "tiramisu":
        return build_tiramisu(m.tiramisu, shape, len(CLASS_NAMES), m.weight_decay)
    return build_deeplab(m.deeplab, shape, len(CLASS_NAMES), m.weight_decay)


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
