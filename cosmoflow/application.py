"""What CosmoFlow gives the engine: its :class:`~common.application.Application` (no TensorFlow imported here)."""

from __future__ import annotations

import pathlib

from common.application import Application, MlperfSpec
from cosmoflow.config import CosmoflowConfig

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def _mlperf_hyperparameters(cfg: CosmoflowConfig, schedule) -> dict:
    return {"dropout": cfg.model.dropout}


APPLICATION = Application(
    name="cosmoflow",
    config_schema=CosmoflowConfig,
    build_model="cosmoflow.model:build_model",
    build_datasets="cosmoflow.data:build_datasets",
    loss="cosmoflow.loss:build_loss",
    metrics="cosmoflow.loss:build_metrics",
    default_config=REPO_ROOT / "configs" / "cosmoflow" / "demo.yaml",
    prepare_data="cosmoflow.mock:prepare_data",
    check_data="cosmoflow.data:check_data",
    input_ceiling="cosmoflow.data:input_ceiling",
    mlperf=MlperfSpec(benchmark="cosmoflow", metric_key="eval_error", logs_key="val_mae", target=0.124,
                      hyperparameters=_mlperf_hyperparameters),
)
