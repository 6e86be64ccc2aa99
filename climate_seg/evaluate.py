"""Evaluate a climate run, segmentation or detection (the run's config says which).

    python -m climate_seg.evaluate --run-dir runs/climate_seg-demo_tiramisu [--split test] [--data-dir D]

Segmentation: ``metrics.json`` with IoU per class, mean IoU and pixel accuracy, ``masks.png``,
``training_curves.png`` (:mod:`climate_seg.segmentation.evaluate`).  Detection: AP per class and mAP at
IoU 0.1 and 0.5, ``boxes.png``, ``reconstruction.png`` (:mod:`climate_seg.detection.evaluate`).  The task is
chosen where the training's is, by :data:`climate_seg.application.TASKS`.
"""

from __future__ import annotations

from common.evaluate import evaluate_run, evaluator_of, main as evaluate_main


def evaluate(run_dir, split: str = "test", data_dir: str | None = None, force: bool = False) -> dict:
    """The task's evaluation of ``run_dir`` on ``split``; the metrics it wrote to ``metrics.json``."""
    return evaluate_run(evaluator_of("climate_seg", run_dir), run_dir, split, data_dir, force)


if __name__ == "__main__":
    evaluate_main("climate_seg", description=__doc__.split("\n\n")[0])
