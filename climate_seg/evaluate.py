"""Evaluate a climate segmentation run on held-out samples (detection runs: climate_seg.detect_evaluate).

    python -m climate_seg.evaluate --run-dir runs/climate_seg-demo_tiramisu [--split test] [--data-dir D]

Writes ``RUN/metrics.json``: ``{"iou": {"background": x, "cyclone": x,
"river": x}, "mean_iou": x, "pixel_accuracy": x}`` from the confusion matrix
summed over every pixel of the split (plus ``confusion_matrix``, the
``all_background_mean_iou`` of a model that predicts background everywhere,
``split`` and ``n_samples``); ``RUN/masks.png``: TMQ of the first samples with
the true and predicted cyclone and river outlines; ``RUN/training_curves.png``.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np

from common.cli import exit_on_user_error, exit_process

PLOTTED_SAMPLES = 3


def plot_masks(fields, truth, predicted, names, out_png, tmq_channel: int = 0) -> None:
    """TMQ with true (left) and predicted (right) cyclone and river regions outlined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

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
    handles = [Line2D([], [], color="red", label="tropical cyclone"), Line2D([], [], color="orange",
                                                                               label="atmospheric river")]
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=9)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(out_png, dpi=100)
    plt.close(fig)


def evaluate(run_dir, split: str = "test", data_dir: str | None = None) -> dict:
    from climate_seg.config import CLASS_NAMES, ClimateConfig, DetectConfig
    from common.config import read_yaml
    from climate_seg.data import evaluation_dataset
    from common.metrics import iou_from_confusion
    from common.plots import plot_training_curves
    from common.runs import load_run

    import climate_seg.model  # noqa: F401  (registers the loss for loading)

    import climate_seg.detect_model  # noqa: F401  (registers the detection losses for loading)

    run_dir = pathlib.Path(run_dir)
    config = run_dir / "config.yaml"
    if config.is_file() and read_yaml(config).get("task") == "detection":
        from climate_seg.detect_evaluate import evaluate_detection

        cfg, model = load_run(run_dir, DetectConfig, data_dir)
        return evaluate_detection(run_dir, cfg, model, split)
    cfg, model = load_run(run_dir, ClimateConfig, data_dir)
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
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    plot_masks(*shown, names, run_dir / "masks.png")
    if (run_dir / "history.csv").is_file():
        plot_training_curves(run_dir / "history.csv", run_dir / "training_curves.png", metrics=("loss", "mean_iou"))
    return metrics


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m climate_seg.evaluate",
                                     description="Evaluate a climate segmentation run.")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--split", default="test", choices=["test", "validation", "train"])
    parser.add_argument("--data-dir", help="evaluate on this data directory instead of the run's")
    args = parser.parse_args(argv)
    with exit_on_user_error():
        m = evaluate(args.run_dir, args.split, args.data_dir)
    if "map" in m:
        print(f"{m['split']} set, {m['n_images']} images, {m['n_true_boxes']} true and {m['n_predicted_boxes']} "
              f"predicted boxes: mAP@0.1 {m['map']['iou_0.1']:.4f}, mAP@0.5 {m['map']['iou_0.5']:.4f}")
        for key, values in m["ap"].items():
            print(f"  AP {key}: " + ", ".join(f"{name} {value:.4f}" for name, value in values.items()))
        if m["absent_classes"]:
            print(f"  absent from the {m['split']} set (left out): {', '.join(m['absent_classes'])}")
        print(f"wrote {pathlib.Path(args.run_dir) / 'metrics.json'}")
        return 0
    print(f"{m['split']} set, {m['n_samples']} samples: mean IoU {m['mean_iou']:.4f} "
          f"(all-background prediction: {m['all_background_mean_iou']:.4f}), pixel accuracy {m['pixel_accuracy']:.4f}")
    print("  IoU " + ", ".join(f"{name} {value:.4f}" for name, value in m["iou"].items()))
    print(f"wrote {pathlib.Path(args.run_dir) / 'metrics.json'}")
    return 0


if __name__ == "__main__":
    exit_process(main())
