"""Evaluate a climate run, segmentation or detection (the run's config says which).

    python -m climate_seg.evaluate --run-dir runs/climate_seg-demo_tiramisu [--split test] [--data-dir D]

Segmentation: ``metrics.json`` with IoU per class, mean IoU and pixel accuracy, ``masks.png``,
``training_curves.png`` (:mod:`climate_seg.segmentation.evaluate`).  Detection: AP per class and mAP at
IoU 0.1 and 0.5, ``boxes.png``, ``reconstruction.png`` (:mod:`climate_seg.detection.evaluate`).
"""

from __future__ import annotations

from climate_seg.detection import evaluate as detection
from climate_seg.segmentation import evaluate as segmentation
from common.cli import exit_process
from common.evaluate import Evaluator, evaluate_run, main, run_config_key


def evaluator_for(run_dir) -> Evaluator:
    """The detection evaluator for a run whose config says ``task: detection``, else segmentation's."""
    return detection.EVALUATOR if run_config_key(run_dir, "task") == "detection" else segmentation.EVALUATOR


def evaluate(run_dir, split: str = "test", data_dir: str | None = None, force: bool = False) -> dict:
    """The task's evaluation of ``run_dir`` on ``split``; the metrics it wrote to ``metrics.json``."""
    return evaluate_run(evaluator_for(run_dir), run_dir, split, data_dir, force)


if __name__ == "__main__":
    exit_process(main(evaluator_for, prog="python -m climate_seg.evaluate", description=__doc__.split("\n\n")[0]))
