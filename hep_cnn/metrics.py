"""Weighted ROC, AUC and the comparison with the cut-based selection.

The ROC is built by sorting events by score (descending), grouping tied
scores, and accumulating signal and background weights; AUC is the
trapezoid area under it.  Tested against scikit-learn.
"""

from __future__ import annotations

import numpy as np


def weighted_roc(scores, labels, weights=None):
    """(fpr, tpr, thresholds), starting at (0, 0) with threshold +inf."""
    scores = np.asarray(scores, np.float64)
    labels = np.asarray(labels).astype(bool)
    weights = np.ones_like(scores) if weights is None else np.asarray(weights, np.float64)
    order = np.argsort(-scores, kind="mergesort")
    scores, labels, weights = scores[order], labels[order], weights[order]
    signal = np.cumsum(weights * labels)
    background = np.cumsum(weights * ~labels)
    last_of_group = np.r_[np.flatnonzero(np.diff(scores)), len(scores) - 1]
    total_signal, total_background = signal[-1], background[-1]
    if total_signal <= 0 or total_background <= 0:
        raise ValueError("the ROC needs both signal and background events with positive weight")
    tpr = np.r_[0.0, signal[last_of_group] / total_signal]
    fpr = np.r_[0.0, background[last_of_group] / total_background]
    thresholds = np.r_[np.inf, scores[last_of_group]]
    return fpr, tpr, thresholds


def auc(fpr, tpr) -> float:
    return float(np.trapezoid(tpr, fpr))


def selection_rates(passed, labels, weights=None):
    """(TPR, FPR) of a boolean selection, weighted."""
    passed = np.asarray(passed).astype(bool)
    labels = np.asarray(labels).astype(bool)
    weights = np.ones(len(labels)) if weights is None else np.asarray(weights, np.float64)
    tpr = float(np.sum(weights * (passed & labels)) / np.sum(weights * labels))
    fpr = float(np.sum(weights * (passed & ~labels)) / np.sum(weights * ~labels))
    return tpr, fpr


def tpr_at_fpr(fpr, tpr, target_fpr: float) -> float:
    """TPR on the ROC at a given FPR (linear interpolation between ROC points)."""
    return float(np.interp(target_fpr, fpr, tpr))


def physics_metrics(scores, labels, weights, pass_sr) -> dict:
    """What ``metrics.json`` holds: accuracy, weighted AUC, the cuts and the network at the cuts' FPR."""
    labels = np.asarray(labels).astype(int)
    fpr, tpr, _ = weighted_roc(scores, labels, weights)
    cut_tpr, cut_fpr = selection_rates(pass_sr, labels, weights)
    at_cut = tpr_at_fpr(fpr, tpr, cut_fpr)
    return {
        "accuracy": float(np.mean((np.asarray(scores) > 0.5) == labels)),
        "auc": auc(fpr, tpr),
        "cut_tpr": cut_tpr,
        "cut_fpr": cut_fpr,
        "tpr_at_cut_fpr": at_cut,
        "tpr_ratio_to_cuts": at_cut / cut_tpr if cut_tpr > 0 else None,
    }
