"""What climate segmentation gives the engine: its :class:`~common.trainer.Application`."""

from __future__ import annotations

import logging
import pathlib

from climate_seg.cam5.config import CHANNELS, CLASS_NAMES
from climate_seg.cam5.convert import convert
from climate_seg.cam5.data import SPLITS, prepare, stats_path
from climate_seg.cam5.stats import class_counts_path, load_stats, write_class_counts
from climate_seg.cam5.synth import generate_dataset
from climate_seg.segmentation.config import ClimateConfig
from climate_seg.segmentation.data import build_datasets, check_data, split_files
from climate_seg.segmentation.loss import build_loss
from climate_seg.segmentation.model import build_model
from common.metrics import ConfusionMatrix
from common.trainer import Application, MlperfSpec

log = logging.getLogger(__name__)

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def _prepare_data(cfg: ClimateConfig) -> None:
    """Synthetic netCDF -> converted HDF5 samples -> stats.h5, for whatever is missing; and the class
    counts a published statistics file lacks, when the loss weights need them (a file of their own)."""
    def generate(root):
        netcdf = generate_dataset(root / "netcdf", cfg.data.synth, progress=False)
        for split in SPLITS:
            convert([str(p) for p in netcdf[split]], root / split)

    stats_file = stats_path(cfg)
    prepare(cfg, generate, "CAM5 fields (netCDF, converted)", stats_file, CHANNELS)
    counts_file = class_counts_path(stats_file)
    if isinstance(cfg.loss.class_weights, str) and cfg.loss.class_weights != "none" and stats_file.is_file() \
            and "class_frequencies" not in load_stats(stats_file) and not counts_file.is_file():
        files = [f.path for f in split_files(cfg, "train")]
        frequencies = write_class_counts(counts_file, files)
        log.info(f"{stats_file} holds no class frequencies; counted them over {len(files)} training samples into "
                 f"{counts_file}: " + ", ".join(f"{n} {f:.4%}" for n, f in zip(CLASS_NAMES, frequencies)))


def _metrics(cfg: ClimateConfig):
    return [ConfusionMatrix(len(CLASS_NAMES), CLASS_NAMES, name="mean_iou")]


def _mlperf_hyperparameters(cfg: ClimateConfig, schedule) -> dict:
    """The DeepCAM events of the MLPerf HPC rules, described from the config and the built schedule."""
    opt = cfg.optimizer
    events = {
        "seed": cfg.train.seed,
        "batchnorm_group_size": 1,
        "gradient_accumulation_frequency": 1,
        "opt_name": {"adam": "Adam", "sgd": "SGD", "lars": "LARS"}[opt.name] + ("+LARC" if opt.larc.enabled else ""),
        "opt_lr": schedule.peak_learning_rate,
        "opt_betas": [opt.beta_1, opt.beta_2],
        "opt_eps": opt.epsilon,
        "opt_weight_decay": cfg.model.weight_decay,
        "scheduler_lr_warmup_steps": schedule.warmup_steps,
        "scheduler_lr_warmup_factor": schedule.peak_learning_rate / opt.learning_rate,
    }
    if schedule.decay == "cosine":
        events.update(scheduler_type="cosine_annealing", scheduler_t_max=schedule.decay_steps,
                      scheduler_eta_min=schedule.end_factor * schedule.peak_learning_rate)
    elif schedule.decay in ("step", "none"):
        boundaries = sorted(schedule.decay_boundaries)
        events.update(scheduler_type="multistep",
                      scheduler_milestones=[b * schedule.steps_per_epoch for b in boundaries],
                      scheduler_decay_rate=schedule.decay_boundaries[boundaries[0]] if boundaries else 1.0)
    else:
        events.update(scheduler_type=schedule.decay)
    return events


APPLICATION = Application(
    name="climate_seg",
    config_schema=ClimateConfig,
    build_model=build_model,
    build_datasets=build_datasets,
    loss=build_loss,
    metrics=_metrics,
    default_config=REPO_ROOT / "configs" / "climate_seg" / "demo_tiramisu.yaml",
    prepare_data=_prepare_data,
    check_data=check_data,
    mlperf=MlperfSpec(benchmark="deepcam", metric_key="eval_accuracy", logs_key="val_mean_iou",
                      target=lambda cfg: 0.82, higher_is_better=True, hyperparameters=_mlperf_hyperparameters),
)
