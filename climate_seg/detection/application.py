"""What semi-supervised detection gives the engine: its :class:`~common.application.Application`, one of the
two :data:`climate_seg.application.TASKS` (no TensorFlow imported here: :func:`parts` imports the TensorFlow half
at its first use)."""

from __future__ import annotations

import pathlib

from climate_seg.detection.config import DetectConfig
from climate_seg.detection.evaluate import EVALUATOR
from climate_seg.detection.predict import PREDICTOR
from common.application import Application, Parts

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def parts() -> Parts:
    """The detector, the labeled + unlabeled input pipeline, the loss and the data hooks."""
    # deferred: TensorFlow; --help and the config checks answer without it
    from climate_seg.detection import data, loss, model

    return Parts(build_model=model.build_detector, build_datasets=data.build_datasets, loss=loss.build_loss,
                 metrics=loss.build_metrics, prepare_data=data.prepare_data, check_data=data.check_data)


APPLICATION = Application(
    name="climate_detection",
    config_schema=DetectConfig,
    parts=parts,
    evaluation=EVALUATOR,
    prediction=PREDICTOR,
    default_config=REPO_ROOT / "configs" / "climate_seg" / "demo_detect.yaml",
)
