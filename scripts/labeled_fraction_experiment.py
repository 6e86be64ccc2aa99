"""Does unlabeled data pay?  Supervised vs semi-supervised detection over the fraction of labeled snapshots.

    python scripts/labeled_fraction_experiment.py [--fractions 0.05,0.1,0.25] [--seeds 0,1,2] [--out runs/labeled-fractions]

For each fraction f and seed, trains the detection demo twice on 2 Horovod
ranks (``configs/climate_seg/demo_detect_supervised.yaml``: the labeled
snapshots only; ``demo_detect.yaml``: the same plus the unlabeled ones through
the reconstruction loss), with ``data.labeled_fraction=f`` and the same
labeled samples per step (``data.labeled_per_batch``, 2 in both configs).
An epoch is one pass over the labeled samples, so the epochs are scaled by
0.25 / f: every run takes as many steps as the demo (30 epochs at 0.25).
Each run is evaluated on the test split.  Writes ``OUT/<mode>-f<f>-s<seed>/``
(the runs; finished ones are kept and reused on a rerun), ``OUT/results.json``
and ``OUT/labeled_fractions.png`` (mAP@0.1 and @0.5, mean and spread over
seeds), and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from common.cli import exit_process, positive_int_argument, run_command  # noqa: E402
from common.deferred import pyplot as plt  # noqa: E402
from common.storage.transaction import OutputTransaction, Producer  # noqa: E402

TOOL = "scripts.labeled_fraction_experiment"

CONFIGS = {"supervised": "configs/climate_seg/demo_detect_supervised.yaml",
           "semi-supervised": "configs/climate_seg/demo_detect.yaml"}
REFERENCE_FRACTION, REFERENCE_EPOCHS = 0.25, 30


def run_one(out: pathlib.Path, mode: str, fraction: float, seed: int, ranks: int) -> dict:
    run_dir = out / f"{mode}-f{fraction:g}-s{seed}"
    metrics_path = run_dir / "metrics.json"
    if not metrics_path.is_file():
        epochs = max(1, round(REFERENCE_EPOCHS * REFERENCE_FRACTION / fraction))
        python = sys.executable
        env = {**os.environ, "PATH": f"{pathlib.Path(python).parent}:{os.environ.get('PATH', '')}"}
        subprocess.run(["horovodrun", "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo", python, "-m",
                        "climate_seg.train", "--config", CONFIGS[mode], "--output-dir", str(run_dir), "--force",
                        "--set", f"train.seed={seed}", "--set", f"data.labeled_fraction={fraction}",
                        "--set", f"train.epochs={epochs}", "--set", "train.tensorboard=false"],
                       cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)
        subprocess.run([python, "-m", "climate_seg.evaluate", "--run-dir", str(run_dir)], cwd=REPO, env=env,
                       check=True, stdout=subprocess.DEVNULL)
    metrics = json.loads(metrics_path.read_text())
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    return {"mode": mode, "fraction": fraction, "seed": seed, "map_0.1": metrics["map"]["iou_0.1"],
            "map_0.5": metrics["map"]["iou_0.5"], "ap_0.1": metrics["ap"]["iou_0.1"],
            "train_seconds": summary.get("wall_time_s")}


def summarise(rows: list[dict]) -> list[dict]:
    out = []
    for fraction in sorted({r["fraction"] for r in rows}):
        for mode in CONFIGS:
            picked = [r for r in rows if r["fraction"] == fraction and r["mode"] == mode]
            for key in ("map_0.1", "map_0.5"):
                values = np.array([r[key] for r in picked])
                out.append({"fraction": fraction, "mode": mode, "metric": key, "mean": float(values.mean()),
                            "std": float(values.std(ddof=1)) if len(values) > 1 else 0.0,
                            "values": values.tolist()})
    return out


def plot(summary: list[dict], path: pathlib.Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for axis, metric in zip(axes, ("map_0.1", "map_0.5")):
        for mode, colour in zip(CONFIGS, ("tab:blue", "tab:red")):
            rows = [s for s in summary if s["mode"] == mode and s["metric"] == metric]
            axis.errorbar([r["fraction"] for r in rows], [r["mean"] for r in rows], [r["std"] for r in rows],
                          marker="o", capsize=3, color=colour, label=mode)
        axis.set_xscale("log")
        axis.set_xlabel("fraction of training snapshots labeled")
        axis.set_ylabel(f"test mAP@{metric.split('_')[1]}")
        axis.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=8)
    fig.suptitle("Detection demo: mean and spread (1 std) over seeds", fontsize=10)
    fig.tight_layout()
    return fig


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fractions", default="0.05,0.1,0.25")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", default="runs/labeled-fractions")
    parser.add_argument("--np", type=positive_int_argument, default=2, help="Horovod ranks per run")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    fractions = [float(f) for f in args.fractions.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    out = pathlib.Path(args.out).absolute()
    # The study's own outputs (the runs are trainings of their own, each its run folder): checked before the
    # hours of training, written together at the end, each absent or this script's
    results = OutputTransaction(Producer(TOOL, "climate_seg"))
    results.check([out / "results.json", out / "labeled_fractions.png"])
    rows = [run_one(out, mode, f, s, args.np) for f in fractions for s in seeds for mode in CONFIGS]
    summary = summarise(rows)
    with results, results.reading(out):
        results.json(out / "results.json", {"runs": rows, "summary": summary})
        results.figure(plot(summary), out / "labeled_fractions.png")
    print("fraction  mode              mAP@0.1 (mean +- std; per seed)          mAP@0.5")
    for fraction in fractions:
        for mode in CONFIGS:
            a, b = (next(s for s in summary if s["fraction"] == fraction and s["mode"] == mode and s["metric"] == m)
                    for m in ("map_0.1", "map_0.5"))
            per_seed = " / ".join(f"{v:.3f}" for v in a["values"])
            print(f"{fraction:<9g} {mode:<17} {a['mean']:.3f} +- {a['std']:.3f} ({per_seed})   "
                  f"{b['mean']:.3f} +- {b['std']:.3f}")
    print(f"wrote {out / 'results.json'} and {out / 'labeled_fractions.png'}")
    return 0


if __name__ == "__main__":
    exit_process(run_command(main, name=TOOL))
