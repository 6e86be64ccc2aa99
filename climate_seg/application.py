"""The two climate applications, chosen by a config's ``task`` key (default ``segmentation``):
:mod:`climate_seg.segmentation` and :mod:`climate_seg.detection` (neither imports TensorFlow here)."""

from __future__ import annotations

from climate_seg.detection.application import APPLICATION as DETECTION
from climate_seg.segmentation.application import APPLICATION as SEGMENTATION
from common.config import read_yaml


def application_for(config_path):
    """The segmentation or the detection application, from the config's ``task`` key."""
    if config_path and read_yaml(config_path).get("task", "segmentation") == "detection":
        return DETECTION
    return SEGMENTATION
