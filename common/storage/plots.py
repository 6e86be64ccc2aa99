"""Plots every application shares: training curves from ``history.csv``."""

from __future__ import annotations

import csv
import pathlib

from common.deferred import pyplot as plt


def read_history(path: str | pathlib.Path) -> dict[str, list[float]]:
    """Columns of a ``history.csv`` (one row per epoch, as Keras' CSVLogger writes them) as float lists (missing
    values as NaN)."""
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    columns: dict[str, list[float]] = {}
    for row in rows:
        for key, value in row.items():
            try:
                number = float(value)
            except (TypeError, ValueError):
                number = float("nan")
            columns.setdefault(key, []).append(number)
    return columns


def plot_training_curves(history_csv: str | pathlib.Path, metrics: tuple[str, ...] = ("loss",)):
    """Loss and metrics (train and validation) and samples/s per epoch: the figure (saved by the caller)."""
    history = read_history(history_csv)
    epochs = [e + 1 for e in history.get("epoch", [])]
    panels = [m for m in metrics if m in history] + (["samples_per_second"] if "samples_per_second" in history else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False)
    for axis, name in zip(axes[0], panels):
        axis.plot(epochs, history[name], marker="o", ms=3, label="train" if name != "samples_per_second" else name)
        if f"val_{name}" in history:
            axis.plot(epochs, history[f"val_{name}"], marker="o", ms=3, label="validation")
        axis.set_xlabel("epoch")
        axis.set_title(name.replace("_", " "))
        axis.grid(alpha=0.3)
        axis.legend()
    fig.tight_layout()
    return fig
