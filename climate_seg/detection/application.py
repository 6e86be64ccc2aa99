"""What semi-supervised detection gives the engine: its :class:`~common.application.Application` (no TensorFlow
imported here)."""

from __future__ import annotations

import pathlib

from climate_seg.detection.config import DetectConfig
from common.application import Application

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]

APPLICATION = Application(
    name="climate_detection",
    config_schema=DetectConfig,
    build_model="climate_seg.detection.model:build_detector",
    build_datasets="climate_seg.detection.data:build_datasets",
    loss="climate_seg.detection.loss:build_loss",
    metrics="climate_seg.detection.loss:build_metrics",
    default_config=REPO_ROOT / "configs" / "climate_seg" / "demo_detect.yaml",
    prepare_data="climate_seg.detection.data:prepare_data",
    check_data="climate_seg.detection.data:check_data",
)
