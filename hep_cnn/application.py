"""What the HEP CNN gives the engine: its :class:`~common.trainer.Application`."""

from __future__ import annotations

import logging
import pathlib

from common.trainer import Application
from hep_cnn.config import HepConfig
from hep_cnn.data import build_datasets, check_data, maxima_path
from hep_cnn.loss import build_loss
from hep_cnn.maxima import write_maxima
from hep_cnn.model import build_model
from hep_cnn.synth import dataset_present, generate_dataset

log = logging.getLogger(__name__)

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def _prepare_data(cfg: HepConfig) -> None:
    data = cfg.data
    directory = pathlib.Path(data.data_dir)
    if data.synth.generate_if_missing and not dataset_present(directory):
        s = data.synth
        generate_dataset(directory, s.n_train, s.n_validation, s.n_test, data.image_size, s.signal_fraction,
                         s.events_per_file, s.seed, "all_events" if data.layout == "auto" else data.layout)
        log.info(f"generated synthetic events in {directory}")
    if not maxima_path(cfg).is_file():
        maxima = write_maxima(cfg)
        log.info(f"computed training-set maxima {maxima['channel_max']} into {maxima_path(cfg)}")


APPLICATION = Application(
    name="hep_cnn",
    config_schema=HepConfig,
    build_model=build_model,
    build_datasets=build_datasets,
    loss=build_loss,
    metrics=lambda cfg: ["accuracy"],
    default_config=REPO_ROOT / "configs" / "hep_cnn" / "demo.yaml",
    prepare_data=_prepare_data,
    check_data=check_data,
)
