"""Evaluate a CosmoFlow run.

    python -m cosmoflow.evaluate --run-dir runs/demo [--split validation] [--data-dir D] [--symmetries 48]

Writes ``RUN/metrics.json``::

    {"mae": {"Omega_m": x, "sigma_8": x, ...}, "mae_overall": x,
     "baseline_mae": {...}, "baseline_mae_overall": x, "n_samples": N, "split": "validation",
     "parity": {"Omega_m": {"slope": x, "intercept": x, "pearson_r": x, "bins": [...]}, ...}}

MAEs are in the normalised target units ([-1, 1], as MLPerf reports them);
the baseline predicts the training-set mean of each target; ``parity`` is the
parity plot in numbers (see :func:`parity`).  Also writes ``predictions.npz``
(predictions, targets, names), ``pred_vs_true.png`` (one panel per parameter)
and ``training_curves.png``.

``--symmetries N`` (1, 2, 4, 8, 16 or 48; default 1: the network once per volume) also averages the network's
predictions over the first N of the cube's 48 rotations and reflections (:data:`CUBE_SYMMETRIES`, the group
``data.augment`` draws from; each of those counts is a subgroup), and adds ``test_time_average`` to
``metrics.json`` (its MAE and parity, beside the plain ones) and ``predictions_averaged`` to
``predictions.npz``.  N forward passes per volume.
"""

from __future__ import annotations

import itertools

import numpy as np

from common.application import Evaluator
from common.deferred import pyplot as plt   # at the first figure (Agg backend)
from common.deferred import tensorflow as tf   # at the first volume transformed
from common.errors import UserInputError
from common.cli import positive_int_argument
from common.evaluate import evaluate_run, main as evaluate_main
from cosmoflow.config import CosmoflowConfig

# The 48 symmetries of the cube, each (the spatial axes reversed, then the axis permutation), as
# cosmoflow.data.augment applies them.  Flips vary fastest, so the first 1, 2, 4, 8, 16 and 48 are each a group:
# z flipped, then y, then x; then the swap of y and z; then every permutation.
CUBE_PERMUTATIONS = ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))
CUBE_SYMMETRIES = tuple((tuple(axis for axis, flipped in zip((0, 1, 2), flips) if flipped), permutation)
                        for permutation in CUBE_PERMUTATIONS
                        for flips in itertools.product((False, True), repeat=3))
SYMMETRY_COUNTS = (1, 2, 4, 8, 16, 48)



def mean_absolute_errors(predictions: np.ndarray, targets: np.ndarray, names) -> dict[str, float]:
    return {name: float(np.mean(np.abs(predictions[:, i] - targets[:, i]))) for i, name in enumerate(names)}


def parity(predictions: np.ndarray, targets: np.ndarray, names, bins: int = 5) -> dict[str, dict]:
    """Per target: the least-squares line of predicted on true (slope 1, intercept 0 when unbiased; slope 0
    for the mean predictor), Pearson's r, and the mean and spread of the predictions in ``bins`` equal
    bins of the true value over [-1, 1]: the parity plot in numbers.  ``pearson_r`` is None where it is
    undefined (constant predictions)."""
    edges = np.linspace(-1.0, 1.0, bins + 1)
    out = {}
    for i, name in enumerate(names):
        true, predicted = targets[:, i].astype(np.float64), predictions[:, i].astype(np.float64)
        spread = true.std()
        slope = float(np.mean((true - true.mean()) * (predicted - predicted.mean())) / spread ** 2) if spread else 0.0
        r = float(np.corrcoef(true, predicted)[0, 1]) if spread and predicted.std() else None   # undefined
        which = np.clip(np.digitize(true, edges[1:-1]), 0, bins - 1)
        rows = []
        for b in range(bins):
            chosen = predicted[which == b]
            rows.append({"true_low": float(edges[b]), "true_high": float(edges[b + 1]), "count": int(chosen.size),
                         "predicted_mean": float(chosen.mean()) if chosen.size else None,
                         "predicted_std": float(chosen.std()) if chosen.size else None})
        out[name] = {"slope": slope, "intercept": float(predicted.mean() - slope * true.mean()), "pearson_r": r,
                     "bins": rows}
    return out


def plot_predictions(predictions, targets, names):
    """One panel per parameter: predicted on true (the figure)."""

    fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names), 3.6), squeeze=False)
    for i, (axis, name) in enumerate(zip(axes[0], names)):
        axis.scatter(targets[:, i], predictions[:, i], s=8, alpha=0.6)
        axis.plot([-1.2, 1.2], [-1.2, 1.2], color="k", lw=0.8)
        mae = np.mean(np.abs(predictions[:, i] - targets[:, i]))
        axis.set_title(f"{name} (MAE {mae:.3f})")
        axis.set_xlabel("true (normalised)")
        axis.set_ylabel("predicted")
        axis.set_xlim(-1.2, 1.2)
        axis.set_ylim(-1.2, 1.2)
        axis.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def transformed(volumes, symmetry):
    """A batch of volumes (batch, x, y, z, channels) under one of :data:`CUBE_SYMMETRIES`."""
    flipped, permutation = symmetry
    return tf.transpose(tf.reverse(volumes, [1 + axis for axis in flipped]),
                        [0, *(1 + axis for axis in permutation), 4])


def averaged_predictions(model, volumes, symmetries: int) -> np.ndarray:
    """The mean of the network's predictions (float64) over the first ``symmetries`` of :data:`CUBE_SYMMETRIES`
    applied to a batch of volumes."""
    total = np.zeros((), np.float64)
    for symmetry in CUBE_SYMMETRIES[:symmetries]:
        total = total + np.asarray(model(transformed(volumes, symmetry), training=False), np.float64)
    return total / symmetries


def check_symmetries(cfg: CosmoflowConfig, symmetries: int) -> None:
    """A one-line error unless ``symmetries`` is a count :func:`averaged_predictions` takes for these volumes
    (beyond the 8 flips, the axis permutations need a cube)."""
    if symmetries not in SYMMETRY_COUNTS:
        raise UserInputError(f"--symmetries {symmetries}: expected one of {', '.join(map(str, SYMMETRY_COUNTS))}")
    spatial = list(cfg.data.sample_shape[:3])
    if symmetries > 8 and len(set(spatial)) > 1:
        raise UserInputError(f"--symmetries {symmetries}: the run's volumes (data.sample_shape {spatial}) are no "
                             "cube, so only their 8 flips are symmetries: use --symmetries 8 or fewer")


def _evaluate(writer, cfg, model, split: str, symmetries: int = 1) -> dict:
    """MAE per parameter against the training-mean baseline, and the parity numbers, over every sample; with
    ``symmetries`` > 1 also those of the predictions averaged over that many symmetries of the cube."""
    # deferred: TensorFlow, loaded only after the arguments are parsed (--help answers without it)
    from cosmoflow.data import evaluation_dataset, read_targets

    check_symmetries(cfg, symmetries)
    names = list(cfg.data.target_names)
    dataset, count = evaluation_dataset(cfg, split)
    predictions, averaged, targets = [], [], []
    for x, y in dataset:
        predictions.append(np.asarray(model(x, training=False)))
        if symmetries > 1:
            averaged.append(averaged_predictions(model, x, symmetries))
        targets.append(y.numpy())
    predictions = np.concatenate(predictions)
    targets = np.concatenate(targets)

    train_mean = read_targets(cfg, "train").mean(axis=0)
    baseline = np.broadcast_to(train_mean, targets.shape)
    metrics = {
        "split": split,
        "n_samples": int(count),
        "mae": mean_absolute_errors(predictions, targets, names),
        "mae_overall": float(np.mean(np.abs(predictions - targets))),
        "baseline_mae": mean_absolute_errors(baseline, targets, names),
        "baseline_mae_overall": float(np.mean(np.abs(baseline - targets))),
        "parity": parity(predictions, targets, names),
        "units": "normalised targets in [-1, 1]",
    }
    extra_arrays = {}
    if symmetries > 1:
        averaged = np.concatenate(averaged)
        metrics["test_time_average"] = {
            "symmetries": symmetries,
            "mae": mean_absolute_errors(averaged, targets, names),
            "mae_overall": float(np.mean(np.abs(averaged - targets))),
            "parity": parity(averaged, targets, names),
        }
        extra_arrays["predictions_averaged"] = averaged
    writer.json("metrics.json", metrics)
    writer.npz("predictions.npz", predictions=predictions, targets=targets, names=np.array(names), **extra_arrays)
    writer.figure(plot_predictions(predictions, targets, names), "pred_vs_true.png")
    return metrics


def report(metrics: dict) -> list[str]:
    """The MAE table against the baseline, then the parity table."""
    width = max(len(n) for n in metrics["mae"])
    lines = [f"{metrics['split']} set, {metrics['n_samples']} samples; MAE in normalised units (model vs training mean):"]
    for name, value in metrics["mae"].items():
        lines.append(f"  {name:<{width}}  {value:.4f}   vs {metrics['baseline_mae'][name]:.4f}")
    lines.append(f"  {'overall':<{width}}  {metrics['mae_overall']:.4f}   vs {metrics['baseline_mae_overall']:.4f}")
    edges = [(row["true_low"], row["true_high"]) for row in next(iter(metrics["parity"].values()))["bins"]]
    lines.append("parity: mean prediction (std) in bins of the true value; slope and Pearson r of predicted on true")
    lines.append(f"  {'':<{width}}  " + "  ".join(f"[{low:+.1f},{high:+.1f}]" for low, high in edges) + "   slope     r")
    for name, fit in metrics["parity"].items():
        cells = [f"{row['predicted_mean']:+.2f}({row['predicted_std']:.2f})" if row["count"] else f"{'-':^11}"
                 for row in fit["bins"]]
        lines.append(f"  {name:<{width}}  " + "  ".join(cells) + f"  {fit['slope']:+.3f}  "
                     + (f"{fit['pearson_r']:+.3f}" if fit["pearson_r"] is not None else "  -"))
    if "test_time_average" in metrics:
        average = metrics["test_time_average"]
        lines.append(f"averaged over {average['symmetries']} symmetries of the cube: MAE (vs the network once)")
        for name, value in average["mae"].items():
            lines.append(f"  {name:<{width}}  {value:.4f}   vs {metrics['mae'][name]:.4f}")
        lines.append(f"  {'overall':<{width}}  {average['mae_overall']:.4f}   vs {metrics['mae_overall']:.4f}")
    return lines


# Part of CosmoFlow's declaration (cosmoflow/application.py).
def add_options(parser) -> None:
    parser.add_argument("--symmetries", type=positive_int_argument, default=1, metavar="N",
                        help=f"also average the predictions over the first N of the cube's 48 rotations and "
                             f"reflections, N one of {', '.join(map(str, SYMMETRY_COUNTS))} (default 1: the network "
                             "once per volume)")


EVALUATOR = Evaluator(
    tool="cosmoflow.evaluate", schema=CosmoflowConfig, evaluate=_evaluate, report=report,
    outputs=("metrics.json", "predictions.npz", "pred_vs_true.png"), splits=("validation", "train"),
    curves=lambda cfg: ("loss", "mae", *(f"mae_{name}" for name in cfg.data.target_names)), description="Evaluate a CosmoFlow run.",
    add_options=add_options, layers_module="cosmoflow.model")


def evaluate(run_dir, split: str = "validation", data_dir: str | None = None, force: bool = False,
             symmetries: int = 1) -> dict:
    """The metrics of the run in ``run_dir`` on ``split``, written to its ``metrics.json``; ``symmetries`` > 1
    adds those of the predictions averaged over that many symmetries of the cube."""
    return evaluate_run(EVALUATOR, run_dir, split, data_dir, force, {"symmetries": symmetries})


if __name__ == "__main__":
    evaluate_main("cosmoflow")
