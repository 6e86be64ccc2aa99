"""What semi-supervised detection gives the engine: its :class:`~common.trainer.Application`."""

from __future__ import annotations

import pathlib

from climate_seg.cam5.data import prepare, stats_path
from climate_seg.cam5.synth import generate_detection_dataset
from climate_seg.detection.config import DetectConfig
from climate_seg.detection.data import build_datasets, check_data
from climate_seg.detection.loss import build_loss
from climate_seg.detection.model import build_detector
from common.trainer import Application

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def _prepare_data(cfg: DetectConfig) -> None:
    """Synthetic snapshots into an absent or empty data folder when asked; the channel statistics when missing."""
    prepare(cfg, lambda root: generate_detection_dataset(root, cfg.data.synth, progress=False),
            "detection snapshots", stats_path(cfg), cfg.data.file_channels)


APPLICATION = Application(
    name="climate_detection",
    config_schema=DetectConfig,
    build_model=build_detector,
    build_datasets=build_datasets,
    loss=build_loss,
    metrics=lambda cfg: [],
    default_config=REPO_ROOT / "configs" / "climate_seg" / "demo_detect.yaml",
    prepare_data=_prepare_data,
    check_data=check_data,
)
