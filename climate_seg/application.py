"""The two climate applications, chosen by a config's ``task`` key (default ``segmentation``):
:mod:`climate_seg.segmentation` and :mod:`climate_seg.detection`."""

from __future__ import annotations


def application_for(config_path):
    """The segmentation or the detection application, from the config's ``task`` key."""
    from common.config import read_yaml

    if config_path and read_yaml(config_path).get("task", "segmentation") == "detection":
        from climate_seg.detection.application import APPLICATION
    else:
        from climate_seg.segmentation.application import APPLICATION
    return APPLICATION
