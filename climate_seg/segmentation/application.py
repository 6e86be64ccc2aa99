"""What climate segmentation gives the engine: its :class:`~common.application.Application`, one of the two
:data:`climate_seg.application.TASKS` (no TensorFlow imported here: :func:`parts` imports the TensorFlow half
at its first use)."""

from __future__ import annotations

import pathlib

from climate_seg.segmentation.config import ClimateConfig
from climate_seg.segmentation.evaluate import EVALUATOR
from climate_seg.segmentation.predict import PREDICTOR
from common.application import Application, MlperfSpec, Parts

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def parts() -> Parts:
    """The network (Tiramisu or DeepLabv3+), the input pipeline, the loss and the data hooks."""
    # deferred: TensorFlow; --help and the config checks answer without it
    from climate_seg.segmentation import data, loss, model

    return Parts(build_model=model.build_model, build_datasets=data.build_datasets, loss=loss.build_loss,
                 metrics=loss.build_metrics, prepare_data=data.prepare_data, check_data=data.check_data,
                 input_ceiling=data.input_ceiling)


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
    parts=parts,
    evaluation=EVALUATOR,
    prediction=PREDICTOR,
    default_config=REPO_ROOT / "configs" / "climate_seg" / "demo_tiramisu.yaml",
    mlperf=MlperfSpec(benchmark="deepcam", metric_key="eval_accuracy", logs_key="val_mean_iou", target=0.82,
                      higher_is_better=True, hyperparameters=_mlperf_hyperparameters),
)
