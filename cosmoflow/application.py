"""What CosmoFlow gives the engine: its :class:`~common.application.Application`, registered in pyproject.toml
(no TensorFlow imported here: :func:`parts` imports the TensorFlow half at its first use)."""

from __future__ import annotations

import pathlib

from common.application import Application, MlperfSpec, Parts, PublishedRate
from common.commands import Command, Output, datatools_command, parser_of
from common.storage.sample_files import DatasetFiles
from cosmoflow import formats
from cosmoflow.config import CosmoflowConfig
from cosmoflow.evaluate import EVALUATOR
from cosmoflow.predict import PREDICTOR

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def parts() -> Parts:
    """The model, the input pipeline, the loss and the data hooks."""
    # deferred: TensorFlow; --help and the config checks answer without it
    from cosmoflow import data, loss, mock, model

    return Parts(build_model=model.build_model, build_datasets=data.build_datasets, loss=loss.build_loss,
                 metrics=loss.build_metrics, prepare_data=mock.prepare_data, check_data=data.check_data,
                 input_ceiling=data.input_ceiling, prepare_network=model.prepare_network)


def _mlperf_hyperparameters(cfg: CosmoflowConfig, schedule) -> dict:
    return {"dropout": cfg.model.dropout}


APPLICATION = Application(
    name="cosmoflow",
    config_schema=CosmoflowConfig,
    parts=parts,
    evaluation=EVALUATOR,
    prediction=PREDICTOR,
    default_config=REPO_ROOT / "configs" / "cosmoflow" / "demo.yaml",
    mlperf=MlperfSpec(benchmark="cosmoflow", metric_key="eval_error", logs_key="val_mae", target=0.124,
                      hyperparameters=_mlperf_hyperparameters),
    published_rate=PublishedRate(samples_per_second=200.0, accelerator="H100", sample_shape=(128, 128, 128, 4),
                                 source="MLPerf HPC v3.0 CosmoFlow closed-division records, about 200 samples/s "
                                        "per H100"),
    commands=(
        Command("cosmoflow.mock", parser_of("cosmoflow.mock"), reads=(("--config", "config"),),
                writes=(Output("--out", "generated"),), summary="mock universes (the config's data.data_dir)"),
        Command("cosmoflow.mock_bench", parser_of("cosmoflow.mock_bench"), reads=(("--config", "config"),),
                summary="benchmark of the mocks' dynamics (COLA steps, volumes per second); prints only"),
        datatools_command("cosmoflow.data", DatasetFiles("CosmoFlow", formats.patterns())),
        Command("cosmoflow.information", parser_of("cosmoflow.information"),
                reads=(("--config", "config"), ("--fisher-matrix", "file")), writes=(Output("--json", "file"),),
                summary="Fisher bounds and the summary statistics' regression"),
        Command("cosmoflow.learning_curve", parser_of("cosmoflow.learning_curve"),
                reads=(("--information", "file"), ("--bound", "file"), ("--earlier", "file"), ("--series", "run"),
                       ("--extend", "run")),
                writes=(Output("--out", "file"), Output("--json", "file")),
                summary="the learning-curve figure of evaluated runs, regressions and bounds"),
    ),
)
