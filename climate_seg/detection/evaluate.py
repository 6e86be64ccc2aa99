"""Evaluate a detection run: per-class AP and mAP at IoU 0.1 and 0.5, and pictures.

Called by ``python -m climate_seg.evaluate --run-dir D`` when the run's
config has ``task: detection``.  Boxes come from p(object) x p(class) above
``evaluation.score_threshold``, then non-maximum suppression per class
(``evaluation.nms_iou``).  Every true box that no prediction matches is a
miss.  Classes absent from the split are left out of ``ap`` and the mean, and
listed under ``absent_classes``.
"""

from __future__ import annotations

import pathlib

import numpy as np

from climate_seg.detection.config import DetectConfig
from common.application import Evaluator
from common.deferred import pyplot as plt   # at the first figure (Agg backend)

# Imported where used, not here: climate_seg.detection.boxes (TensorFlow), so that --help answers without it.

IOU_THRESHOLDS = (0.1, 0.5)
PLOTTED_SAMPLES = 3
COLORS = ("tab:green", "tab:red", "tab:purple", "tab:orange")


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def image_detections(detect: np.ndarray, cell: int, score_threshold: float, nms_iou: float) -> list:
    """Detections of one box grid (gy, gx, 10)."""
    from climate_seg.detection.boxes import detections   # deferred: imports TensorFlow (--help answers without it)

    objectness = softmax(detect[..., 0:2])[..., 1]
    return detections(objectness, softmax(detect[..., 2:6]), detect[..., 6:8], detect[..., 8:10], cell,
                      score_threshold, nms_iou)


def average_precisions(predictions: list, truths: list) -> dict:
    """{"ap": {"iou_t": {class: AP}}, "map": {"iou_t": mAP}, "absent_classes": [...]}."""
    # deferred: imports TensorFlow (--help answers without it)
    from climate_seg.detection.boxes import DETECTION_CLASSES, average_precision

    out = {"ap": {}, "map": {}, "absent_classes": []}
    for threshold in IOU_THRESHOLDS:
        key = f"iou_{threshold}"
        values = {}
        for cls, name in enumerate(DETECTION_CLASSES):
            ap = average_precision(predictions, truths, cls, threshold)
            if ap is None:
                if name not in out["absent_classes"]:
                    out["absent_classes"].append(name)
                continue
            values[name] = ap
        out["ap"][key] = values
        out["map"][key] = float(np.mean(list(values.values()))) if values else None
    return out


def plot_boxes(images, truths, predictions, names, tmq_index: int):

    # deferred: imports TensorFlow (--help answers without it)
    from climate_seg.detection.boxes import DETECTION_CLASSES

    fig, axes = plt.subplots(len(images), 1, figsize=(7, 3.4 * len(images)), squeeze=False)
    for axis, image, truth, predicted, name in zip(axes[:, 0], images, truths, predictions, names):
        axis.imshow(image[..., tmq_index], origin="lower", cmap="Blues")
        for ymin, xmin, ymax, xmax, cls in truth:
            axis.add_patch(plt.Rectangle((xmin - 0.5, ymin - 0.5), xmax - xmin, ymax - ymin, fill=False, lw=1.6,
                                     ec=COLORS[int(cls)]))
        for box, score, cls in predicted:
            ymin, xmin, ymax, xmax = box
            axis.add_patch(plt.Rectangle((xmin - 0.5, ymin - 0.5), xmax - xmin, ymax - ymin, fill=False, lw=1.0,
                                     ls="--", ec=COLORS[cls]))
        axis.set_title(f"{name}: TMQ, true (solid) and predicted (dashed) boxes", fontsize=9)
        axis.set_xticks([])
        axis.set_yticks([])
    fig.legend(handles=[plt.matplotlib.patches.Patch(color=c, label=n.replace("_", " "))
                        for c, n in zip(COLORS, DETECTION_CLASSES)],
               loc="lower center", ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def plot_reconstruction(image, recon, channel_names):

    shown = [c for c in ("TMQ", "PSL", "U850") if c in channel_names]
    fig, axes = plt.subplots(len(shown), 2, figsize=(9, 2.6 * len(shown)), squeeze=False)
    for row, name in enumerate(shown):
        k = channel_names.index(name)
        low, high = np.percentile(image[..., k], [1, 99])
        for column, (field, title) in enumerate(((image, "input"), (recon, "reconstruction"))):
            axes[row, column].imshow(field[..., k], origin="lower", cmap="viridis", vmin=low, vmax=high)
            axes[row, column].set_title(f"{name} (normalised), {title}", fontsize=9)
            axes[row, column].set_xticks([])
            axes[row, column].set_yticks([])
    fig.tight_layout()
    return fig


def _evaluate(writer, cfg, model, split: str) -> dict:
    """AP per class and mAP of ``split``; metrics.json and the figures through ``writer``."""
    # deferred: TensorFlow, loaded only after the arguments are parsed (--help answers without it)
    from climate_seg.detection.data import evaluation_samples, true_boxes

    dataset, samples = evaluation_samples(cfg, split)
    cell = cfg.model.cell
    ev = cfg.evaluation
    predictions, truths, shown = [], [], []
    sample_iter = iter(samples)
    for images, _ in dataset:
        outputs = model(images, training=False)
        detect, recon = np.asarray(outputs["detect"]), np.asarray(outputs["recon"])
        for i in range(len(detect)):
            sample = next(sample_iter)
            steps_truth = true_boxes(cfg, sample)
            steps_detect = detect[i] if cfg.model.variant == "3d" else detect[i][None]
            for t, truth in enumerate(steps_truth):
                predictions.append(image_detections(steps_detect[t], cell, ev.score_threshold, ev.nms_iou))
                truths.append(truth)
            if len(shown) < PLOTTED_SAMPLES:
                image = np.asarray(images[i])
                first = (lambda a: a[0]) if cfg.model.variant == "3d" else (lambda a: a)
                shown.append((first(image), steps_truth[0], predictions[-len(steps_truth)],
                              pathlib.Path(sample.path).stem + f"[{sample.index}]", first(recon[i])))
    metrics = average_precisions(predictions, truths)
    metrics.update(split=split, n_images=len(truths), n_true_boxes=int(sum(len(t) for t in truths)),
                   n_predicted_boxes=int(sum(len(p) for p in predictions)),
                   score_threshold=ev.score_threshold, nms_iou=ev.nms_iou)
    writer.json("metrics.json", metrics)
    channels = list(cfg.data.channels)
    tmq = channels.index("TMQ") if "TMQ" in channels else 0
    writer.figure(plot_boxes([s[0] for s in shown], [s[1] for s in shown], [s[2] for s in shown],
                             [s[3] for s in shown], tmq), "boxes.png", dpi=100)
    writer.figure(plot_reconstruction(shown[0][0], shown[0][4], channels), "reconstruction.png", dpi=100)
    return metrics


def report(m: dict) -> list[str]:
    """The lines the evaluation command prints."""
    lines = [f"{m['split']} set, {m['n_images']} images, {m['n_true_boxes']} true and {m['n_predicted_boxes']} "
             f"predicted boxes: mAP@0.1 {m['map']['iou_0.1']:.4f}, mAP@0.5 {m['map']['iou_0.5']:.4f}"]
    lines += [f"  AP {key}: " + ", ".join(f"{name} {value:.4f}" for name, value in values.items())
              for key, values in m["ap"].items()]
    if m["absent_classes"]:
        lines.append(f"  absent from the {m['split']} set (left out): {', '.join(m['absent_classes'])}")
    return lines


# Part of the detection application's declaration (climate_seg/detection/application.py).
EVALUATOR = Evaluator(
    tool="climate_seg.evaluate", schema=DetectConfig, evaluate=_evaluate, report=report,
    outputs=("metrics.json", "boxes.png", "reconstruction.png"), splits=("test", "validation", "train"),
    curves=("loss", "detect_loss", "recon_loss"), description="Evaluate a climate detection run.")
