"""What the HEP CNN gives the engine: its :class:`~common.application.Application`, registered in pyproject.toml
(no TensorFlow imported here: :func:`parts` imports the TensorFlow half at its first use)."""

from __future__ import annotations

import pathlib

from common.application import Application, Parts
from common.commands import Command, Output, datatools_command, parser_of
from common.storage.sample_files import DatasetFiles
from hep_cnn.config import SPLIT_NAMES, HepConfig
from hep_cnn.evaluate import EVALUATOR
from hep_cnn.predict import PREDICTOR

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def parts() -> Parts:
    """The model, the input pipeline, the loss and the data hooks."""
    # deferred: TensorFlow; --help and the config checks answer without it
    from hep_cnn import data, loss, model

    return Parts(build_model=model.build_model, build_datasets=data.build_datasets, loss=loss.build_loss,
                 metrics=loss.build_metrics, prepare_data=data.prepare_data, check_data=data.check_data,
                 input_ceiling=data.input_ceiling)


APPLICATION = Application(
    name="hep_cnn",
    config_schema=HepConfig,
    parts=parts,
    evaluation=EVALUATOR,
    prediction=PREDICTOR,
    default_config=REPO_ROOT / "configs" / "hep_cnn" / "demo.yaml",
    commands=(
        Command("hep_cnn.synth", parser_of("hep_cnn.synth"), reads=(("--config", "config"),),
                writes=(Output("--out", "generated"),), summary="synthetic calorimeter events"),
        # The splits share one folder: a subset draws its events from each split.
        datatools_command("hep_cnn.data", DatasetFiles(
            "HEP", ("*.h5", "*.hdf5"), rows_per_file=True, count_datasets=("label", "all_events/y", "y"),
            split_tags=tuple(tag for tags in SPLIT_NAMES.values() for tag in tags))),
        Command("hep_cnn.maxima", parser_of("hep_cnn.maxima"), reads=(("--config", "config"),),
                writes=(Output("", "file"),), summary="the training split's channel maxima (the derived folder)"),
    ),
)
