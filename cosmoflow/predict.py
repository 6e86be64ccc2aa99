"""The cosmological parameters of new volumes by a trained CosmoFlow run.

    python -m cosmoflow.predict --run-dir RUN --input FILE_OR_FOLDER [...] --out OUT [--force]

Inputs, in any layout the readers take, whatever format the run was trained on (told by each file's content,
:func:`cosmoflow.data.file_split`): the TFRecord variants (MLPerf, float list, SC18; GZIP too), ``prepare.py``'s
split HDF5 crops, and raw HDF5 universes, which may be whole boxes larger than the training volume: they are
cut into sub-volumes of ``data.sample_shape`` in C order over the crop grid, as MLPerf's ``prepare.py`` cuts
them.  Targets are not needed (an HDF5 file without ``unitPar`` / ``y`` is taken; the TFRecord variants hold
them by definition).  Another sample shape (a box that is not a multiple of the crop), another channel count or
a file of another application is a one-line error naming the file, before anything is written.

Each volume is read through the engine's ordered walk in batches of ``data.batch_size`` and normalised as
``python -m cosmoflow.evaluate`` does; its predictions are de-normalised with the run's ``data.target_offset``
and ``data.target_scale`` (``prediction * scale + offset``), in the order of ``data.target_names``.  A run on the
suite's mock universes (its config generates them, ``data.mock``, and sets no offset and scale) gets physical
values from the mock's ``unitPar`` and the ranges in ``data.mock`` (:func:`mock_physical`); any other run without
offset and scale keeps the files' own units (the [-1, 1] ``unitPar`` of MLPerf's files, whose ranges the files
do not hold).

Per input ``OUT/<stem>.parameters.csv`` (one row per volume: its origin in voxels within the file's box, the
predicted parameters and, where the file holds them, the stored ones beside them, ``stored_<name>``) and
``OUT/<stem>.parameters.json`` (the same, and for a box cut into several sub-volumes the mean and the sample
standard deviation of each parameter over them); for an input of more than one volume also
``OUT/<stem>.parameters.png`` (parity of predicted on stored values when they differ between volumes, else the
distribution of the sub-volumes' predictions with their mean, spread and the stored value).
"""

from __future__ import annotations

import pathlib

import numpy as np

from common.application import Predictor
from common.deferred import DeferredModule, h5py
from common.deferred import pyplot as plt   # at the first figure (Agg backend)
from common.deferred import tensorflow as tf
from common.loop.epochs import evaluation_walk
from common.errors import DataError
from common.predict import main as predict_main
from cosmoflow import formats
from cosmoflow.config import TARGET_NAMES, CosmoflowConfig

# At its first use (TensorFlow), so that the declaration and --help answer without it.
cosmoflow_data = DeferredModule("cosmoflow.data")
cosmoflow_mock = DeferredModule("cosmoflow.mock")   # h5py: only for a mock run's parameter ranges

TOOL = "cosmoflow.predict"
PATTERNS = formats.patterns()   # every file family's names (cosmoflow/formats/__init__.py's table)


def stem(path) -> str:
    """The file name without its format's suffixes (``a.tfrecord.gz`` -> ``a``)."""
    name = pathlib.Path(path).name
    for suffix in sorted((pattern[1:] for pattern in PATTERNS), key=len, reverse=True):
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return pathlib.Path(path).stem


def units(cfg: CosmoflowConfig, layout) -> tuple[np.ndarray, np.ndarray]:
    """(offset, scale) of each of ``data.target_names`` (float64): the run's normalisation, indexed in the
    order of the file's targets (a file without targets: the run's ``data.file_target_names``, else MLPerf's)."""
    data = cfg.data
    order = list(layout.targets or data.file_target_names or TARGET_NAMES)
    index = [order.index(name) for name in data.target_names]
    offset = np.asarray(data.target_offset if data.target_offset is not None else np.zeros(len(order)), np.float64)
    scale = np.asarray(data.target_scale if data.target_scale is not None else np.ones(len(order)), np.float64)
    return offset[index], scale[index]


def mock_physical(cfg: CosmoflowConfig) -> tuple[np.ndarray, np.ndarray] | None:
    """(half width, centre) of each of ``data.target_names``' ranges in ``data.mock``, which map the mock's
    ``unitPar`` in [-1, 1] to physical values (``unitPar * half width + centre``), for a run on the suite's mock
    universes: a run whose config generates its data (``data.mock.generate_if_missing``) and sets no
    ``data.target_offset`` / ``target_scale``.  None for any other run: its files' units are kept."""
    data = cfg.data
    if data.target_offset is not None or not data.mock.generate_if_missing:
        return None
    ranges = dict(zip(TARGET_NAMES, cosmoflow_mock.parameter_ranges(data.mock)))
    low, high = np.array([ranges[name] for name in data.target_names], np.float64).T
    return (high - low) / 2.0, (high + low) / 2.0


def stored_physical(path, names) -> np.ndarray | None:
    """The physical parameters a mock HDF5 universe stores beside its unitPar (``physPar``, named by its
    ``names`` attribute), in the order of ``names``; None for other files."""
    if not h5py.is_hdf5(path):
        return None
    with h5py.File(path, "r") as handle:
        if "physPar" not in handle:
            return None
        order = str(handle["physPar"].attrs.get("names", ",".join(TARGET_NAMES))).split(",")
        values = np.asarray(handle["physPar"][:], np.float64)
    if len(order) != len(values) or not set(names) <= set(order):
        return None
    return np.array([values[order.index(name)] for name in names])


def inspect(cfg: CosmoflowConfig, path) -> dict:
    """What prediction needs of one input (its samples, layout, the box it is cut from), after checking that
    the run's readers take it at the run's sample shape."""
    split, _ = cosmoflow_data.file_split(cfg, path)
    info = {"samples": split.count, "layout": split.layout, "labelled": bool(split.layout.targets),
            "box": None, "format": split.layout.file_format}
    if split.layout.kind == "raw_hdf5":
        with h5py.File(path, "r") as handle:
            info["box"] = list(handle["full"].shape)
    if info["samples"] < 1:
        raise DataError(f"{path}: holds no samples")
    return info


def outputs(cfg: CosmoflowConfig, item) -> tuple[str, ...]:
    names = (f"{stem(item.path)}.parameters.csv", f"{stem(item.path)}.parameters.json")
    return names + ((f"{stem(item.path)}.parameters.png",) if item.info["samples"] > 1 else ())


def origins(info: dict, crop) -> list[list[int]]:
    """Each volume's first voxel within its file's box (C order over the crop grid; zeros for whole samples)."""
    if info["box"] is None:
        return [[0, 0, 0]] * info["samples"]
    per_side = [side // size for side, size in zip(info["box"][:3], crop[:3])]
    return [[int(i) * size for i, size in zip(np.unravel_index(n, per_side), crop[:3])]
            for n in range(info["samples"])]


def predict_volumes(cfg: CosmoflowConfig, model, path) -> tuple[np.ndarray, np.ndarray]:
    """(predictions normalised as the network outputs them, stored targets in the file's units: (n, 0) without
    them) of every volume of ``path``, in its order: the engine's ordered walk in batches of ``data.batch_size``."""
    split, file_cfg = cosmoflow_data.file_split(cfg, path)
    batch_size = cfg.data.batch_size
    predictions, stored = [], []
    for x, y in evaluation_walk(split, batch_size, cosmoflow_data.prediction_inputs(file_cfg, split.layout), seed=cfg.train.seed):
        # A short batch is padded with empty volumes to the full batch: the kernels' sums for one volume depend on
        # the batch's shape (a batch of 1 differs from evaluate's batches of data.batch_size in the last bits),
        # never on the other volumes in it, so every volume comes out as evaluate's full batches compute it.
        count = int(x.shape[0])
        padded = tf.pad(x, [[0, batch_size - count]] + [[0, 0]] * (len(x.shape) - 1)) if count < batch_size else x
        predictions.append(np.asarray(model(padded, training=False))[:count])
        stored.append(y.numpy())
    return np.concatenate(predictions), np.concatenate(stored)


def predict(writer, cfg: CosmoflowConfig, model, item, options) -> dict:
    """The parameters of every volume of one input, written as CSV, JSON (and a figure); its row of the index."""
    info, names = item.info, list(cfg.data.target_names)
    normalised, stored = predict_volumes(cfg, model, item.path)
    offset, scale = units(cfg, info["layout"])
    predicted = normalised.astype(np.float64) * scale + offset
    stored = stored.astype(np.float64)
    labelled = stored.shape[1] > 0
    physical = mock_physical(cfg)
    if physical is not None:   # the mock's unitPar, predicted and stored alike, in the mock's physical ranges
        predicted = predicted * physical[0] + physical[1]
        stored = stored * physical[0] + physical[1] if labelled else stored
        recorded = stored_physical(item.path, names) if labelled else None
        if recorded is not None:   # the file's own physical values (a mock of other ranges maps otherwise)
            stored = np.repeat(recorded[None], len(stored), axis=0)
    corners = origins(info, cfg.data.sample_shape)
    header = ["volume", "origin_x", "origin_y", "origin_z", *names, *(f"stored_{n}" for n in names if labelled)]
    rows = [[n, *corners[n], *map(float, predicted[n]), *(map(float, stored[n]) if labelled else ())]
            for n in range(len(predicted))]
    out_names = outputs(cfg, item)
    writer.csv(out_names[0], header, rows)
    volumes = [{"volume": n, "origin": corners[n], "predicted": dict(zip(names, map(float, predicted[n]))),
                **({"stored": dict(zip(names, map(float, stored[n])))} if labelled else {})}
               for n in range(len(predicted))]
    summary = None
    if info["box"] is not None and len(predicted) > 1:
        summary = {"box": info["box"], "sub_volumes": len(predicted), "sub_volume_shape": list(cfg.data.sample_shape),
                   "mean": dict(zip(names, map(float, predicted.mean(axis=0)))),
                   "std": dict(zip(names, map(float, predicted.std(axis=0, ddof=1))))}
    if cfg.data.target_offset is not None:
        units_note = "physical: prediction * data.target_scale + data.target_offset"
    elif physical is not None:
        ranges = {n: [float(c - h), float(c + h)] for n, h, c in zip(names, *physical)}
        units_note = f"physical: the mock's unitPar in [-1, 1] mapped onto the run's data.mock ranges {ranges}"
    else:
        units_note = ("the files' own (unitPar in [-1, 1]): the run sets no data.target_offset / target_scale and "
                      "does not generate its data (data.mock), so the files' ranges are not known")
    writer.json(out_names[1], {"input": str(item.path), "format": info["format"], "target_names": names,
                               "units": units_note, "labelled": labelled, "volumes": volumes, "box": summary})
    if len(out_names) > 2:
        writer.figure(plot_volumes(predicted, stored if labelled else None, names, pathlib.Path(item.path).name,
                                   summary), out_names[2])
    row = {"input": str(item.path), "outputs": list(out_names), "volumes": len(predicted), "labelled": labelled,
           "format": info["format"], "box": summary}
    if labelled:
        row["mean_absolute_error"] = dict(zip(names, map(float, np.mean(np.abs(predicted - stored), axis=0))))
    return row


def plot_volumes(predicted, stored, names, title: str, summary):
    """One panel per parameter: predicted on stored where the stored values differ between volumes (parity),
    else the distribution of the volumes' predictions, their mean and spread, and the stored value."""
    fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names), 3.4), squeeze=False)
    for i, (axis, name) in enumerate(zip(axes[0], names)):
        if stored is not None and np.ptp(stored[:, i]) > 0:
            low = min(stored[:, i].min(), predicted[:, i].min())
            high = max(stored[:, i].max(), predicted[:, i].max())
            axis.scatter(stored[:, i], predicted[:, i], s=10, alpha=0.7)
            axis.plot([low, high], [low, high], color="k", lw=0.8)
            axis.set_xlabel(f"stored {name}")
            axis.set_ylabel(f"predicted {name}")
            axis.set_title(f"{name} (MAE {np.mean(np.abs(predicted[:, i] - stored[:, i])):.3g})")
        else:
            values = predicted[:, i]
            axis.hist(values, bins=max(5, min(30, len(values) // 2)), color="tab:blue", alpha=0.7)
            mean, spread = values.mean(), values.std(ddof=1)
            axis.axvline(mean, color="tab:blue", lw=1.5, label=f"mean {mean:.3g} +- {spread:.2g}")
            axis.axvspan(mean - spread, mean + spread, color="tab:blue", alpha=0.15)
            if stored is not None:
                axis.axvline(stored[0, i], color="k", ls="--", lw=1.2, label=f"stored {stored[0, i]:.3g}")
            axis.set_xlabel(f"predicted {name}")
            axis.set_ylabel("sub-volumes" if summary else "volumes")
            axis.legend(fontsize=7)
            axis.set_title(name)
        axis.grid(alpha=0.3)
    what = f"box {summary['box'][:3]} in {summary['sub_volumes']} sub-volumes" if summary else f"{len(predicted)} volumes"
    fig.suptitle(f"{title}: {what}", fontsize=9)
    fig.tight_layout()
    return fig


def report(index: dict) -> list[str]:
    """One line per input: its volumes, the box's mean +- spread, or the MAE against the stored values."""
    lines = []
    for row in index["inputs"]:
        line = f"{row['input']}: {row['volumes']} volume(s)"
        if row["box"]:
            line += " of a box " + "x".join(map(str, row["box"]["box"][:3])) + ": " + ", ".join(
                f"{name} {mean:.4g} +- {row['box']['std'][name]:.2g}" for name, mean in row["box"]["mean"].items())
        if row["labelled"]:
            line += "; MAE vs stored " + ", ".join(f"{n} {v:.3g}" for n, v in row["mean_absolute_error"].items())
        lines.append(line + f" -> {row['outputs'][0]}")
    return lines


# Part of CosmoFlow's declaration (cosmoflow/application.py).
PREDICTOR = Predictor(
    tool=TOOL, schema=CosmoflowConfig, what="CosmoFlow volume", patterns=PATTERNS,
    inspect=inspect, outputs=outputs, predict=predict, report=report,
    description="The cosmological parameters of new volumes (TFRecords, split or raw HDF5 universes, whole boxes "
                "cut into sub-volumes) by a trained CosmoFlow run.",
    layers_module="cosmoflow.model")


if __name__ == "__main__":
    predict_main("cosmoflow", description=__doc__.split("\n\n")[0])
