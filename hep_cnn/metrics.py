"""Weighted ROC, AUC (scikit-learn's) and the comparison with the cut-based selection."""

from __future__ import annotations

import numpy as np
from sklearn import metrics as sklearn_metrics


def weighted_roc(scores, labels, weights=None):
    """(fpr, tpr, thresholds) over every distinct score, from (0, 0) at threshold +inf, event-weighted."""
    labels = np.asarray(labels).astype(int)
    weights = None if weights is None else np.asarray(weights, np.float64)
    signal = np.sum(labels if weights is None else weights * labels)
    background = np.sum((1 - labels) if weights is None else weights * (1 - labels))
    if signal <= 0 or background <= 0:
        raise ValueError("the ROC needs both signal and background events with positive weight")
    return sklearn_metrics.roc_curve(labels, np.asarray(scores, np.float64), sample_weight=weights,
                                     drop_intermediate=False)


def auc(fpr, tpr) -> float:
    """The area under a ROC curve given as points (trapezoids)."""
    return float(sklearn_metrics.auc(fpr, tpr))


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
