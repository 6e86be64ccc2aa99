"""Evaluate a HEP CNN run on the held-out test split, against the cut-based selection.

    python -m hep_cnn.evaluate --run-dir runs/hep [--split test] [--data-dir D]

Writes ``RUN/metrics.json`` (``accuracy``, weighted ``auc``, ``cut_tpr``,
``cut_fpr``, ``tpr_at_cut_fpr``, ``tpr_ratio_to_cuts``), ``RUN/predictions.npz``
(``scores``, ``labels``, ``weights``, ``pass_sr``) and ``RUN/roc.png`` (the
weighted ROC with the cut-based point marked).  Weighted quantities use the
raw physics event weights.
"""

from __future__ import annotations

import numpy as np

from common.application import Evaluator
from common.deferred import pyplot as plt   # at the first figure (Agg backend)
from common.evaluate import evaluate_run, main as evaluate_main
from hep_cnn.config import HepConfig

# Imported where used, not here: hep_cnn.model (Keras) and
# hep_cnn.metrics (scikit-learn, about 2 s), so that --help, and the training's, which reads this module through
# the application's declaration, answer without them.


def plot_roc(fpr, tpr, metrics):
    """The weighted ROC with the cut-based point (the figure)."""

    fig, axis = plt.subplots(figsize=(5, 4.2))
    axis.plot(fpr, tpr, label=f"CNN (weighted AUC {metrics['auc']:.4f})")
    axis.plot([metrics["cut_fpr"]], [metrics["cut_tpr"]], "r*", ms=12,
              label=f"cut-based selection (TPR {metrics['cut_tpr']:.3f})")
    axis.axvline(metrics["cut_fpr"], color="r", lw=0.6, ls=":")
    axis.plot([metrics["cut_fpr"]], [metrics["tpr_at_cut_fpr"]], "ko", ms=5,
              label=f"CNN at the cuts' FPR (TPR {metrics['tpr_at_cut_fpr']:.3f})")
    axis.set_xscale("log")
    axis.set_xlim(max(1e-4, fpr[fpr > 0].min() if np.any(fpr > 0) else 1e-4), 1.0)
    axis.set_ylim(0, 1.02)
    axis.set_xlabel("background efficiency (FPR, weighted)")
    axis.set_ylabel("signal efficiency (TPR, weighted)")
    axis.grid(alpha=0.3, which="both")
    axis.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def _evaluate(writer, cfg, model, split: str) -> dict:
    """Scores of every event of ``split``; accuracy, weighted AUC and the comparison with the cuts."""
    # deferred: TensorFlow and scikit-learn, loaded only after the arguments are parsed (--help answers without them)
    from hep_cnn.data import evaluation_events
    from hep_cnn.metrics import physics_metrics, weighted_roc
    from hep_cnn.model import signal_scores

    scores, labels, weights, pass_sr = [], [], [], []
    for images, y, w, p in evaluation_events(cfg, split):
        scores.append(signal_scores(model(images, training=False)))
        labels.append(y.numpy())
        weights.append(w.numpy())
        pass_sr.append(p.numpy())
    scores, labels, weights, pass_sr = (np.concatenate(a) for a in (scores, labels, weights, pass_sr))
    writer.npz("predictions.npz", scores=scores, labels=labels, weights=weights, pass_sr=pass_sr)
    metrics = physics_metrics(scores, labels, weights, pass_sr)
    metrics.update(split=split, n_events=int(len(labels)), n_signal=int(labels.sum()))
    writer.json("metrics.json", metrics)
    fpr, tpr, _ = weighted_roc(scores, labels, weights)
    writer.figure(plot_roc(fpr, tpr, metrics), "roc.png")
    return metrics


def report(m: dict) -> list[str]:
    """Accuracy and AUC, the cuts' efficiencies, the CNN at the cuts' background efficiency."""
    ratio = m["tpr_ratio_to_cuts"]
    return [f"{m['split']} set, {m['n_events']} events ({m['n_signal']} signal); weighted where it says so:",
            f"  accuracy {m['accuracy']:.4f}, weighted ROC AUC {m['auc']:.4f}",
            f"  cut-based selection: TPR {m['cut_tpr']:.4f} at FPR {m['cut_fpr']:.4g}",
            f"  CNN at the same FPR: TPR {m['tpr_at_cut_fpr']:.4f}" + (f" ({ratio:.2f} x the cuts)" if ratio else "")]


# Part of the HEP CNN's declaration (hep_cnn/application.py).
EVALUATOR = Evaluator(
    tool="hep_cnn.evaluate", schema=HepConfig, evaluate=_evaluate, report=report,
    outputs=("metrics.json", "predictions.npz", "roc.png"), splits=("test", "validation", "train"),
    curves=("loss", "accuracy"), description="Evaluate a HEP CNN run.")


def evaluate(run_dir, split: str = "test", data_dir: str | None = None, force: bool = False) -> dict:
    """The metrics of the run in ``run_dir`` on ``split``, written to its ``metrics.json``."""
    return evaluate_run(EVALUATOR, run_dir, split, data_dir, force)


if __name__ == "__main__":
    evaluate_main("hep_cnn")
