"""What the HEP CNN gives the engine: its :class:`~common.application.Application` (no TensorFlow imported here)."""

from __future__ import annotations

import pathlib

from common.application import Application
from hep_cnn.config import HepConfig

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

APPLICATION = Application(
    name="hep_cnn",
    config_schema=HepConfig,
    build_model="hep_cnn.model:build_model",
    build_datasets="hep_cnn.data:build_datasets",
    loss="hep_cnn.loss:build_loss",
    metrics="hep_cnn.loss:build_metrics",
    default_config=REPO_ROOT / "configs" / "hep_cnn" / "demo.yaml",
    prepare_data="hep_cnn.data:prepare_data",
    check_data="hep_cnn.data:check_data",
    input_ceiling="hep_cnn.data:input_ceiling",
)
