"""What climate segmentation and detection gives the engine: its :class:`~common.trainer.Application` declaration(s)."""

from __future__ import annotations

import logging

import pathlib

from climate_seg.config import CHANNELS, CLASS_NAMES, ClimateConfig, DetectConfig
from climate_seg.convert import convert
from climate_seg.data import SPLITS, build_datasets, check_data, class_weights, split_files, stats_path
from climate_seg.model import WeightedPixelCrossEntropy, build_model
from climate_seg.stats import class_counts_path, compute_stats, load_stats, write_class_counts, write_stats
from climate_seg.synth import generate_dataset
from common.data import list_files
from common.errors import ConfigError
from common.outputs import generated_folder
from common.metrics import ConfusionMatrix
from common.trainer import Application, MlperfSpec

log = logging.getLogger(__name__)

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def _prepare(cfg, generate, what: str, stats_of, stats_file: pathlib.Path, channels) -> None:
    """Generate synthetic data into an absent or empty ``data.data_dir`` when asked, then the statistics
    when missing (a new file beside the data, never over one)."""
    data = cfg.data
    root = pathlib.Path(data.data_dir)
    stats_name = stats_file.relative_to(root) if stats_file.is_relative_to(root) else None
    if data.synth.generate_if_missing and not any((root / "train").glob("*.h5")):
        if tuple(data.synth.grid) != tuple(data.grid):
            raise ConfigError(f"data.synth.grid {list(data.synth.grid)} must equal data.grid {list(data.grid)}")
        with generated_folder(root, "climate data (train/, validation/, test/ of *.h5 files)") as work:
            generate(work)
            if stats_name is not None:
                write_stats(work / stats_name, stats_of(list_files(work / "train", ("*.h5",), f"{what} train")),
                            channels)
        log.info(f"generated synthetic {what} in {root}/{{{','.join(SPLITS)}}}")
    if (root / "train").is_dir() and not stats_file.is_file():
        write_stats(stats_file, stats_of(list_files(root / "train", ("*.h5",), f"{what} train")), channels)
        log.info(f"computed channel statistics into {stats_file}")


def _prepare_data(cfg: ClimateConfig) -> None:
    """Synthetic netCDF -> converted HDF5 samples -> stats.h5, for whatever is missing; and the class
    counts a published statistics file lacks, when the loss weights need them (a file of their own)."""
    def generate(root):
        netcdf = generate_dataset(root / "netcdf", cfg.data.synth, progress=False)
        for split in SPLITS:
            convert([str(p) for p in netcdf[split]], root / split)

    stats_file = stats_path(cfg)
    _prepare(cfg, generate, "CAM5 fields (netCDF, converted)", compute_stats, stats_file, CHANNELS)
    counts_file = class_counts_path(stats_file)
    if isinstance(cfg.loss.class_weights, str) and cfg.loss.class_weights != "none" and stats_file.is_file() \
            and "class_frequencies" not in load_stats(stats_file) and not counts_file.is_file():
        files = [f.path for f in split_files(cfg, "train")]
        frequencies = write_class_counts(counts_file, files)
        log.info(f"{stats_file} holds no class frequencies; counted them over {len(files)} training samples into "
                 f"{counts_file}: " + ", ".join(f"{n} {f:.4%}" for n, f in zip(CLASS_NAMES, frequencies)))


def _loss(cfg: ClimateConfig):
    return WeightedPixelCrossEntropy(class_weights(cfg))


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
    loss=_loss,
    metrics=_metrics,
    default_config=REPO_ROOT / "configs" / "climate_seg" / "demo_tiramisu.yaml",
    prepare_data=_prepare_data,
    check_data=check_data,
    mlperf=MlperfSpec(benchmark="deepcam", metric_key="eval_accuracy", logs_key="val_mean_iou",
                      target=lambda cfg: 0.82, higher_is_better=True, hyperparameters=_mlperf_hyperparameters),
)


def _prepare_detection_data(cfg: DetectConfig) -> None:
    from climate_seg.detect_data import stats_path as detection_stats_path
    from climate_seg.synth import generate_detection_dataset

    _prepare(cfg, lambda root: generate_detection_dataset(root, cfg.data.synth, progress=False),
             "detection snapshots", compute_stats, detection_stats_path(cfg), cfg.data.file_channels)


def _build_detector(cfg: DetectConfig):
    from climate_seg.detect_model import build_detector

    return build_detector(cfg)


def _detection_datasets(cfg: DetectConfig, dist):
    from climate_seg.detect_data import build_datasets as build_detection_datasets

    return build_detection_datasets(cfg, dist)


def _detection_loss(cfg: DetectConfig):
    from climate_seg.detect_model import DetectionLoss, ReconstructionLoss

    loss = cfg.loss
    return {"detect": DetectionLoss(loss.coord_xy, loss.coord_wh, loss.no_object),
            "recon": ReconstructionLoss(loss.lambda_ae)}


def _check_detection_data(cfg: DetectConfig):
    from climate_seg.detect_data import check_data as check_detection_data

    return check_detection_data(cfg)


DETECTION = Application(
    name="climate_seg",
    config_schema=DetectConfig,
    build_model=_build_detector,
    build_datasets=_detection_datasets,
    loss=_detection_loss,
    metrics=lambda cfg: [],
    default_config=REPO_ROOT / "configs" / "climate_seg" / "demo_detect.yaml",
    prepare_data=_prepare_detection_data,
    check_data=_check_detection_data,
)


def application_for(config_path) -> Application:
    """The segmentation or the detection application, from the config's ``task`` key."""
    from common.config import read_yaml

    if config_path and read_yaml(config_path).get("task", "segmentation") == "detection":
        return DETECTION
    return APPLICATION
