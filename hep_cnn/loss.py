"""The HEP CNN loss: softmax (or sigmoid) cross-entropy on signal vs background, weighted by the
normalised event weights with ``loss.weighted: true``; and the (image, target[, weight]) examples it
is fed, which this decides (the data pipeline only reads events)."""

from __future__ import annotations

import keras
import tensorflow as tf

from hep_cnn.config import HepConfig


def build_loss(cfg: HepConfig) -> keras.losses.Loss:
    if cfg.model.output == "softmax":
        return keras.losses.SparseCategoricalCrossentropy()
    return keras.losses.BinaryCrossentropy()


def build_metrics(cfg: HepConfig) -> list:
    """Accuracy during training; the ROC, AUC and the cut-based comparison are ``hep_cnn.evaluate``'s."""
    return ["accuracy"]


def training_example(cfg: HepConfig):
    """(image, label, weight, pass_sr) -> what the loss takes: the label as a class index (softmax) or a
    float (sigmoid), and the event weight as the sample weight when the loss is weighted."""
    as_float = cfg.model.output == "sigmoid"

    def example(image, label, weight, _pass_sr):
        target = tf.cast(label, tf.float32)[None] if as_float else label
        if cfg.loss.weighted:
            return image, target, weight
        return image, target

    return example
