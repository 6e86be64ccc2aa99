"""The HEP CNN of the SC17 paper, with knobs.

224 benchmark: 4 x [Conv2D 3x3/128 same, He init, bias -> ReLU -> MaxPool 2 ->
Dropout], Conv2D 3x3/128 -> ReLU -> global average pool -> Dense 2
(594,178 parameters, 5.26 GFLOP forward per image).
64 variant: 3 units -> Flatten -> Dense 512 ReLU -> Dropout -> Dense 2
(4,494,146 parameters).
"""

from __future__ import annotations

import keras
from keras import layers

from common.nn.layers import ByteDropout
from hep_cnn.config import HepConfig


def build_model(cfg: HepConfig) -> keras.Model:
    m = cfg.model
    size = cfg.data.image_size
    inputs = keras.Input(shape=(size, size, cfg.data.channels), name="calorimeter")
    x = inputs
    for i in range(m.conv_units):
        x = layers.Conv2D(m.filters, m.kernel_size, padding="same", kernel_initializer="he_normal",
                          activation="relu", name=f"conv{i + 1}")(x)
        x = layers.MaxPooling2D(2, name=f"pool{i + 1}")(x)
        if m.dropout > 0:
            x = ByteDropout(m.dropout, name=f"dropout{i + 1}")(x)
    if m.final_conv:
        x = layers.Conv2D(m.filters, m.kernel_size, padding="same", kernel_initializer="he_normal",
                          activation="relu", name=f"conv{m.conv_units + 1}")(x)
    if m.head == "global_average":
        x = layers.GlobalAveragePooling2D(name="global_average")(x)
    else:
        x = layers.Flatten(name="flatten")(x)
        x = layers.Dense(m.dense_units, activation="relu", kernel_initializer="he_normal", name="dense")(x)
        if m.dropout > 0:
            x = ByteDropout(m.dropout, name="dense_dropout")(x)
    if m.output == "softmax":
        outputs = layers.Dense(2, activation="softmax", dtype="float32", name="class_probabilities")(x)
    else:
        outputs = layers.Dense(1, activation="sigmoid", dtype="float32", name="signal_probability")(x)
    return keras.Model(inputs, outputs, name=m.name)


def signal_scores(predictions):
    """P(signal) from the model output (softmax column 1 or the sigmoid)."""
    predictions = keras.ops.convert_to_numpy(predictions)
    return predictions[:, 1] if predictions.shape[-1] == 2 else predictions[:, 0]
