"""Train a climate segmentation network (Tiramisu or DeepLabv3+).

    python -m climate_seg.train --config configs/climate_seg/demo_tiramisu.yaml [--set k=v] [--output-dir D]
                                [--resume] [--dry-run]
    horovodrun -np 2 -H localhost:2 --gloo python -m climate_seg.train --config ...
"""

from __future__ import annotations

import pathlib

from climate_seg.config import CLASS_NAMES, ClimateConfig
from climate_seg.convert import convert
from climate_seg.data import SPLITS, build_datasets, check_data, class_weights, stats_path
from climate_seg.model import WeightedPixelCrossEntropy, build_model
from climate_seg.stats import compute_stats, write_stats
from climate_seg.synth import generate_dataset
from common.cli import exit_process, run_train
from common.data import list_files
from common.metrics import ConfusionMatrix
from common.trainer import Application, MlperfSpec

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def _prepare_data(cfg: ClimateConfig) -> None:
    """Synthetic netCDF -> converted HDF5 samples -> stats.h5, for whatever is missing."""
    data = cfg.data
    root = pathlib.Path(data.data_dir)
    if data.synth.generate_if_missing and not any((root / "train").glob("*.h5")):
        if tuple(data.synth.grid) != tuple(data.grid):
            from common.errors import ConfigError
            raise ConfigError(f"data.synth.grid {list(data.synth.grid)} must equal data.grid {list(data.grid)}")
        netcdf = generate_dataset(root / "netcdf", data.synth, progress=False)
        for split in SPLITS:
            convert([str(p) for p in netcdf[split]], root / split)
        print(f"generated synthetic CAM5 fields in {root / 'netcdf'} and converted them into {root}/"
              f"{{{','.join(SPLITS)}}}", flush=True)
    if (root / "train").is_dir() and not stats_path(cfg).is_file():
        stats = compute_stats(list_files(root / "train", ("*.h5",), "climate train sample"))
        write_stats(stats_path(cfg), stats)
        print(f"computed channel statistics and class frequencies into {stats_path(cfg)}", flush=True)


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


def main(argv=None) -> int:
    return run_train(APPLICATION, argv)


if __name__ == "__main__":
    exit_process(main())
