"""The CosmoFlow loss and metrics: mean squared error on the normalised targets (the MLPerf HPC
reference's loss), and mean absolute error overall and per target."""

from __future__ import annotations

import keras

from cosmoflow.config import CosmoflowConfig


def build_loss(cfg: CosmoflowConfig) -> str:
    return "mse"


def build_metrics(cfg: CosmoflowConfig) -> list:
    """``mae`` over all targets (MLPerf's figure) and ``mae_<target>`` for each, in the normalised units
    ``cosmoflow.evaluate`` reports: the history then shows which parameter validation is learning."""
    return ["mae"] + [_target_mae(i, name) for i, name in enumerate(cfg.data.target_names)]


def _target_mae(index: int, name: str) -> keras.metrics.Metric:
    def absolute_error(y_true, y_pred):
        return keras.ops.abs(keras.ops.cast(y_true[:, index], "float32") - keras.ops.cast(y_pred[:, index], "float32"))

    return keras.metrics.MeanMetricWrapper(absolute_error, name=f"mae_{name}")
