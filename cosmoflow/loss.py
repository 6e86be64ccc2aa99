"""The CosmoFlow loss: mean squared error on the normalised targets (the MLPerf HPC reference's)."""

from __future__ import annotations

from cosmoflow.config import CosmoflowConfig


def build_loss(cfg: CosmoflowConfig) -> str:
    return "mse"
