"""Evaluate a climate segmentation run on held-out samples (detection runs: climate_seg.detection.evaluate).

    python -m climate_seg.evaluate --run-dir runs/climate_seg-demo_tiramisu [--split test] [--data-dir D]

Writes ``RUN/metrics.json``: ``{"iou": {"background": x, "cyclone": x,
"river": x}, "mean_iou": x, "pixel_accuracy": x}`` from the confusion matrix
summed over every pixel of the split (plus ``confusion_matrix``, the
``all_background_mean_iou`` of a model that predicts background everywhere,
``split`` and ``n_samples``); ``RUN/masks.png``: TMQ of the first samples with
the true and predicted cyclone and river outlines; ``RUN/training_curves.png``.
"""

from __future__ import annotations

import pathlib

import numpy as np

from climate_seg.cam5.config import CLASS_NAMES
from climate_seg.segmentation.config import ClimateConfig
from common.application import Evaluator
from common.deferred import pyplot as plt   # at the first figure (Agg backend)

# Imported where used, not here: common.nn.metrics (Keras), so
# that --help answers without them.

PLOTTED_SAMPLES = 3


def plot_masks(fields, truth, predicted, names, tmq_channel: int = 0):
    """TMQ with true (left) and predicted (right) cyclone and river regions outlined."""

    rows = len(fields)
    fig, axes = plt.subplots(rows, 2, figsize=(11, 3.1 * rows), squeeze=False)
    for row in range(rows):
        for column, (mask, title) in enumerate(((truth[row], "true"), (predicted[row], "predicted"))):
            axis = axes[row, column]
            axis.imshow(fields[row][..., tmq_channel], origin="lower", cmap="Blues")
            for value, color in ((1, "red"), (2, "orange")):
                if np.any(mask == value):
                    axis.contour(mask == value, levels=[0.5], colors=color, linewidths=1.2)
            axis.set_title(f"{pathlib.Path(names[row]).stem}: TMQ, {title} masks", fontsize=9)
            axis.set_xticks([])
            axis.set_yticks([])
    handles = [plt.Line2D([], [], color="red", label="tropical cyclone"), plt.Line2D([], [], color="orange",
                                                                               label="atmospheric river")]
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=9)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig


def _evaluate(writer, cfg, model, split: str) -> dict:
    """IoU over every pixel of ``split``; writes metrics.json and masks.png through ``writer``."""
    # deferred: TensorFlow, loaded only after the arguments are parsed (--help answers without it)
    from climate_seg.segmentation.data import evaluation_dataset
    # deferred: imports Keras, so TensorFlow (--help answers without it)
    from common.nn.metrics import iou_from_confusion

    n = len(CLASS_NAMES)
    confusion = np.zeros((n, n), np.int64)
    background = np.zeros((n, n), np.int64)
    dataset, names = evaluation_dataset(cfg, split)
    shown = ([], [], [])
    for fields, labels in dataset:
        truth = labels.numpy().reshape(-1)
        predicted = np.argmax(np.asarray(model(fields, training=False)), axis=-1)
        confusion += np.bincount(truth * n + predicted.reshape(-1), minlength=n * n).reshape(n, n)
        background += np.bincount(truth * n, minlength=n * n).reshape(n, n)
        for i in range(min(len(predicted), PLOTTED_SAMPLES - len(shown[0]))):
            shown[0].append(fields[i].numpy())
            shown[1].append(labels[i].numpy())
            shown[2].append(predicted[i])
    pooled = iou_from_confusion(confusion)
    metrics = {
        "iou": {name: float(value) for name, value in zip(CLASS_NAMES, pooled["iou"])},
        "mean_iou": pooled["mean_iou"],
        "pixel_accuracy": pooled["pixel_accuracy"],
        "all_background_mean_iou": iou_from_confusion(background)["mean_iou"],
        "confusion_matrix": confusion.tolist(),
        "split": split,
        "n_samples": len(names),
    }
    writer.json("metrics.json", metrics)
    writer.figure(plot_masks(*shown, names), "masks.png", dpi=100)
    return metrics


def report(m: dict) -> list[str]:
    """The lines the evaluation command prints."""
    return [f"{m['split']} set, {m['n_samples']} samples: mean IoU {m['mean_iou']:.4f} "
            f"(all-background prediction: {m['all_background_mean_iou']:.4f}), pixel accuracy {m['pixel_accuracy']:.4f}",
            "  IoU " + ", ".join(f"{name} {value:.4f}" for name, value in m["iou"].items())]


# Part of the segmentation application's declaration (climate_seg/segmentation/application.py).
EVALUATOR = Evaluator(
    tool="climate_seg.evaluate", schema=ClimateConfig, evaluate=_evaluate, report=report,
    outputs=("metrics.json", "masks.png"), splits=("test", "validation", "train"), curves=("loss", "mean_iou"),
    description="Evaluate a climate segmentation run.")
