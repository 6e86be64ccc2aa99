"""Evaluate a climate run, segmentation or detection (the run's config says which).

    python -m climate_seg.evaluate --run-dir runs/climate_seg-demo_tiramisu [--split test] [--data-dir D]

Segmentation: ``metrics.json`` with IoU per class, mean IoU and pixel accuracy, ``masks.png``,
``training_curves.png`` (:mod:`climate_seg.segmentation.evaluate`).  Detection: AP per class and mAP at
IoU 0.1 and 0.5, ``boxes.png``, ``reconstruction.png`` (:mod:`climate_seg.detection.evaluate`).
"""

from __future__ import annotations

import argparse
import pathlib

from common.cli import exit_on_user_error, exit_process


def evaluate(run_dir, split: str = "test", data_dir: str | None = None, force: bool = False) -> dict:
    """The task's evaluation of ``run_dir`` on ``split``; the metrics it wrote to ``metrics.json``."""
    from common.config import read_yaml
    from common.runs import evaluate_run

    run_dir = pathlib.Path(run_dir)
    config = run_dir / "config.yaml"
    if config.is_file() and read_yaml(config).get("task") == "detection":
        from climate_seg.detection import evaluate as task
        from climate_seg.detection.config import DetectConfig as schema

        run = task.evaluate_detection
    else:
        from climate_seg.segmentation import evaluate as task
        from climate_seg.segmentation.config import ClimateConfig as schema

        run = task.evaluate
    return evaluate_run(run_dir, schema, "climate_seg.evaluate", task.OUTPUTS, run, data_dir, force, split=split)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m climate_seg.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--split", default="test", choices=["test", "validation", "train"])
    parser.add_argument("--data-dir", help="evaluate on this data directory instead of the run's")
    parser.add_argument("--force", action="store_true", help="replace files this suite did not write (metrics.json, "
                                                             "the figures)")
    args = parser.parse_args(argv)
    with exit_on_user_error():
        metrics = evaluate(args.run_dir, args.split, args.data_dir, args.force)
    if "map" in metrics:
        from climate_seg.detection.evaluate import report
    else:
        from climate_seg.segmentation.evaluate import report
    for line in report(metrics):
        print(line)
    print(f"wrote {pathlib.Path(args.run_dir) / 'metrics.json'}")
    return 0


if __name__ == "__main__":
    exit_process(main())
