"""The segmentation networks by name (Tiramisu, DeepLabv3+)."""

from __future__ import annotations

import keras

from climate_seg.cam5.config import CLASS_NAMES
from climate_seg.segmentation.config import ClimateConfig
from climate_seg.segmentation.deeplab import build_deeplab
from climate_seg.segmentation.tiramisu import build_tiramisu


def build_model(cfg: ClimateConfig) -> keras.Model:
    """``model.name``: tiramisu or deeplab, for the configured input size."""
    m = cfg.model
    shape = cfg.data.input_shape
    if m.name == "tiramisu":
        return build_tiramisu(m.tiramisu, shape, len(CLASS_NAMES), m.weight_decay)
    return build_deeplab(m.deeplab, shape, len(CLASS_NAMES), m.weight_decay)
