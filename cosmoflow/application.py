"""What CosmoFlow gives the engine: its :class:`~common.trainer.Application`."""

from __future__ import annotations

import logging
import pathlib

from common.trainer import Application, MlperfSpec
from cosmoflow.config import CosmoflowConfig
from cosmoflow.data import build_datasets, check_data
from cosmoflow.loss import build_loss, build_metrics
from cosmoflow.mock import ensure_mock_data
from cosmoflow.model import build_model

log = logging.getLogger(__name__)

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def _prepare_data(cfg: CosmoflowConfig) -> None:
    if cfg.data.mock.generate_if_missing and ensure_mock_data(cfg):
        log.info(f"generated mock universes in {cfg.data.data_dir}")


def _mlperf_hyperparameters(cfg: CosmoflowConfig, schedule) -> dict:
    return {"dropout": cfg.model.dropout}


APPLICATION = Application(
    name="cosmoflow",
    config_schema=CosmoflowConfig,
    build_model=build_model,
    build_datasets=build_datasets,
    loss=build_loss,
    metrics=build_metrics,
    default_config=REPO_ROOT / "configs" / "cosmoflow" / "demo.yaml",
    prepare_data=_prepare_data,
    check_data=check_data,
    mlperf=MlperfSpec(benchmark="cosmoflow", metric_key="eval_error", logs_key="val_mae",
                      target=lambda cfg: 0.124, hyperparameters=_mlperf_hyperparameters),
)
