"""Apply a trained HEP CNN run to new events: per event the network's signal score and the selection at a
working point.

    python -m hep_cnn.predict --run-dir RUN --input F.h5 [F2.h5 FOLDER ...] --out OUT
                              [--background-efficiency X | --threshold T]

Inputs: event files in either published layout (:mod:`hep_cnn.data`): ``all_events/`` with ``hist``, ``histEM``,
``histtrack`` (N, eta, phi), or the benchmark's root ``data`` (N, 3, phi, eta); only the images are needed (the
run's ``data.channels`` of them, ``data.image_size`` square).  Labels, weights and passSR (``all_events/y``,
``weight``, ``passSR``; ``label``, ``weight``, ``psr``) are copied to the outputs where a file holds them.  The
images are divided by the run's own training-set channel maxima (the derived maxima file of its config,
``data.derived_dir`` / ``data.maxima_file``), never by the new events', and scored in batches of
``data.batch_size`` in file order: :func:`common.loop.epochs.evaluation_walk`, as ``hep_cnn.evaluate`` does.

Each input ``<stem>.<ext>`` becomes

- ``OUT/<stem>.scores.h5``: ``score`` (N,) float32, P(signal); ``selected`` (N,) uint8, 1 where
  ``score >= threshold``; ``label``, ``weight``, ``pass_sr`` where the input holds them; attributes: the working
  point (``threshold``, ``working_point``, ``target_background_efficiency``, the validation split's numbers), the
  model's sha256, the config, the suite's version, ``source``;
- ``OUT/<stem>.scores.csv``: the same per event (``event``, ``score``, ``selected``, ...), one row each;
- ``OUT/<stem>.scores.png``: the score histogram (signal and background apart where the file has labels), the
  threshold marked.

The working point, the same for every input (``predictions.json`` records it for each):

- default, ``cuts``: the background efficiency of the physicists' cut-based selection (passSR) on the run's own
  labelled validation split, the network's threshold where its weighted background efficiency there equals it;
- ``--background-efficiency X``: the threshold where the network's weighted background efficiency on the
  validation split is X;
- ``--threshold T``: the score threshold T (the validation split is not read).

"Equals" on a finite sample: the loosest threshold whose weighted background efficiency on the validation split
does not exceed the target (a point of the weighted ROC, :func:`hep_cnn.metrics.weighted_roc`, the one
``hep_cnn.evaluate`` draws); the efficiencies reached there are recorded beside it.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib

import numpy as np

from common.application import Predictor
from common.deferred import DeferredModule, h5py
from common.deferred import pyplot as plt   # at the first figure (Agg backend)
from common.errors import DataError
from common.loop.epochs import evaluation_walk
from common.predict import main as predict_main
from common.storage.outputs import mark_hdf5
from common.cli import finite_number_argument, fraction_argument
from hep_cnn.config import HepConfig

# At their first use, after the arguments are checked: the readers (TensorFlow), the model (Keras), the metrics
# (scikit-learn).
hep_data = DeferredModule("hep_cnn.data")
hep_metrics = DeferredModule("hep_cnn.metrics")
hep_model = DeferredModule("hep_cnn.model")

TOOL = "hep_cnn.predict"
COLUMNS = ("label", "weight", "pass_sr")   # what an input may hold beside its images, copied to the outputs


@dataclasses.dataclass(frozen=True)
class Events:
    """What inspecting one input found: its layout, its number of events, which of :data:`COLUMNS` it holds."""

    layout: str
    count: int
    columns: tuple[str, ...]


# -- checking the inputs (before any output is written) ---------------------------------------------------

def inspect(cfg: HepConfig, path) -> Events:
    """What ``path`` holds, checked against the run: a one-line DataError naming the file otherwise."""
    run_maxima(cfg)   # the run's, never the new events': missing, nothing is predicted
    return events_of(cfg, str(path))


def run_maxima(cfg: HepConfig) -> dict:
    """The training-set channel maxima the run was trained with (its config's derived maxima file)."""
    path = hep_data.maxima_path(cfg)
    if not path.is_file():
        raise DataError(f"{path}: the run's channel maxima are not there (data.maxima_file={cfg.data.maxima_file} "
                        f"of the run's data, data.data_dir={cfg.data.data_dir}, data.derived_dir="
                        f"{cfg.data.derived_dir} in its config.yaml); predict scales the images by the maxima the "
                        "run was trained with, never the new events'")
    return hep_data.load_maxima(cfg)


def events_of(cfg: HepConfig, path: str) -> Events:
    """The layout, event count and extra columns of one event file, its images checked against the run's
    ``data.image_size`` and ``data.channels``."""
    size, channels = cfg.data.image_size, cfg.data.channels
    try:
        with h5py.File(path, "r") as f:
            written_by = str(f.attrs.get("written_by", ""))
            if "all_events" in f:
                layout = "all_events"
            elif isinstance(f.get("data"), h5py.Dataset):
                layout = "benchmark"
            else:
                found = " ".join(written_by.split()[1:2]) or "a file"
                raise DataError(f"{path}: not HEP events ({found} holding {sorted(f)[:6]}); expected group "
                                "all_events/ (hist, histEM, histtrack) or the benchmark's root dataset data "
                                "(N, 3, phi, eta)")
            keys = hep_data.LAYOUT_KEYS[layout]
            images = keys["images"][:channels] if layout == "all_events" else keys["images"]
            missing = [key for key in images if key not in f]
            if missing:
                raise DataError(f"{path}: missing {', '.join(missing)}: the run was trained on {channels} "
                                f"channel(s) (data.channels) of the {layout} layout")
            groups = [key for key in (*images, *(keys[name] for name in COLUMNS)) if key in f
                      and not isinstance(f[key], h5py.Dataset)]
            if groups:
                raise DataError(f"{path}: {groups[0]} is a group, expected a dataset of the {layout} layout")
            shapes = {key: f[key].shape for key in images}
            columns = {name: f[keys[name]].shape for name in COLUMNS if keys[name] in f}
    except OSError as exc:
        raise DataError(f"{path}: not a readable HDF5 file ({exc})") from None
    count = shapes[images[0]][0] if shapes[images[0]] else 0
    for key, shape in shapes.items():
        if layout == "benchmark":
            allowed = [(count, c, size, size) for c in sorted({3, channels})]
        else:
            allowed = [(count, size, size)]
        if shape not in allowed:
            raise DataError(f"{path}: {key} has shape {shape}, expected {' or '.join(map(str, allowed))}: the run "
                            f"was trained on {size} x {size} images (data.image_size) of {channels} channel(s) "
                            "(data.channels)")
    if count == 0:
        raise DataError(f"{path}: holds no events")
    for name, shape in columns.items():
        if shape != (count,):
            raise DataError(f"{path}: {hep_data.LAYOUT_KEYS[layout][name]} has shape {shape}, expected ({count},): one "
                            "value per event")
    return Events(layout, count, tuple(name for name in COLUMNS if name in columns))


def outputs(cfg: HepConfig, item) -> tuple[str, str, str]:
    stem = pathlib.Path(item.path).stem
    return f"{stem}.scores.h5", f"{stem}.scores.csv", f"{stem}.scores.png"


# -- the working point -------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class WorkingPoint:
    """The score threshold (an event is selected where ``score >= threshold``) and how it was chosen."""

    threshold: float
    chosen_by: str                                  # cuts, background_efficiency or threshold
    target_background_efficiency: float | None = None
    validation: dict = dataclasses.field(default_factory=dict)   # the validation split's numbers at it

    def record(self) -> dict:
        """What the outputs carry of it (HDF5 attributes, the index)."""
        record = {"threshold": self.threshold, "working_point": self.chosen_by}
        if self.target_background_efficiency is not None:
            record["target_background_efficiency"] = self.target_background_efficiency
        record.update({f"validation_{key}": value for key, value in self.validation.items()})
        return record


def scores_and_columns(model, batches):
    """The network's signal scores over ``batches`` of (images, labels, weights, pass_sr), and those columns;
    each batch through the model as ``hep_cnn.evaluate`` scores it."""
    scores, labels, weights, pass_sr = [], [], [], []
    for images, y, w, p in batches:
        scores.append(hep_model.signal_scores(model(images, training=False)))
        labels.append(y.numpy())
        weights.append(w.numpy())
        pass_sr.append(p.numpy())
    return tuple(np.concatenate(a) for a in (scores, labels, weights, pass_sr))


def threshold_at(scores, labels, weights, target: float) -> tuple[float, float, float]:
    """(threshold, background efficiency, signal efficiency) at the loosest point of the weighted ROC whose
    background efficiency does not exceed ``target``."""
    fpr, tpr, thresholds = hep_metrics.weighted_roc(scores, labels, weights)
    index = int(np.searchsorted(fpr, target, side="right")) - 1
    threshold = float(thresholds[index])
    if not math.isfinite(threshold):   # the ROC's (0, 0): nothing selected, just above the highest score
        threshold = float(np.nextafter(np.float32(np.max(scores)), np.float32(np.inf)))
    return threshold, float(fpr[index]), float(tpr[index])


def check_both_classes(cfg: HepConfig, labels, weights, needs: str) -> None:
    """A working point read off the validation split's weighted ROC needs signal and background there, each of
    positive total weight (the efficiencies are ratios to those weights): a one-line DataError naming the split's
    folder and files, and --threshold, otherwise."""
    for value, name in ((0, "background"), (1, "signal")):
        chosen = labels == value
        if np.any(chosen) and np.sum(weights[chosen]) > 0:
            continue
        files = sorted({pathlib.Path(chunk.path).name for chunk in hep_data.split_chunks(cfg, "validation")})
        listed = ", ".join(files[:4]) + (f" and {len(files) - 4} more" if len(files) > 4 else "")
        held = f"holds no {name} events" if not np.any(chosen) else f"holds {name} events of total weight 0"
        raise DataError(f"{cfg.data.data_dir} (the run's validation split: {listed}): {held} (label {value}): "
                        f"{needs} needs both classes there; pass --threshold T to predict without it")


# One working point per model in a process: every input of a rank shares it (the validation split read once).
_WORKING_POINTS: dict[int, tuple[object, WorkingPoint]] = {}


def working_point(cfg: HepConfig, model, options) -> WorkingPoint:
    """The working point the options ask for (default: the cuts' background efficiency), from the run's
    validation split where it needs one."""
    given = getattr(options, "threshold", None)
    if given is not None:
        return WorkingPoint(float(given), "threshold")
    cached = _WORKING_POINTS.get(id(model))
    if cached is not None and cached[0] is model:
        return cached[1]
    try:
        scores, labels, weights, pass_sr = scores_and_columns(model, hep_data.evaluation_events(cfg, "validation"))
    except DataError as exc:
        raise DataError(f"{exc} (the working point is chosen on the run's labelled validation split; give "
                        "--threshold T to predict without it)") from None
    target = getattr(options, "background_efficiency", None)
    check_both_classes(cfg, labels, weights, "the default working point" if target is None else
                       "--background-efficiency")
    cut_tpr, cut_fpr = hep_metrics.selection_rates(pass_sr, labels, weights)
    chosen_by = "cuts" if target is None else "background_efficiency"
    target = cut_fpr if target is None else float(target)
    threshold, fpr, tpr = threshold_at(scores, labels, weights, target)
    point = WorkingPoint(threshold, chosen_by, target, {
        "events": int(len(labels)), "background_efficiency": fpr, "signal_efficiency": tpr,
        "cut_background_efficiency": cut_fpr, "cut_signal_efficiency": cut_tpr})
    _WORKING_POINTS[id(model)] = (model, point)
    return point


# -- writing -----------------------------------------------------------------------------------------------

def write_hdf5(target, path: str, table: dict, attributes: dict) -> None:
    """The per-event scores and selection of one input, with the working point and provenance as attributes."""
    descriptions = {"score": "P(signal), the network's output", "selected": "1 where score >= threshold",
                    "label": "1 signal, 0 background (copied from the input)",
                    "weight": "event weight (copied from the input)",
                    "pass_sr": "1 where the cut-based selection passes (copied from the input)"}
    with h5py.File(target, "w") as f:
        mark_hdf5(f, TOOL)
        f.attrs.update({key: value for key, value in attributes.items() if value is not None})
        f.attrs["source"] = str(pathlib.Path(path).resolve())
        for name, values in table.items():
            if name != "event":
                f.create_dataset(name, data=values).attrs["description"] = descriptions[name]


def plot_scores(table: dict, point: WorkingPoint, title: str):
    """The score histogram (signal and background apart where labels exist), the working point marked."""
    fig, axis = plt.subplots(figsize=(6, 4.2))
    bins = np.linspace(0.0, 1.0, 41)
    if "label" in table:
        for value, name, color in ((0, "background", "tab:blue"), (1, "signal", "tab:red")):
            axis.hist(table["score"][table["label"] == value], bins=bins, histtype="step", lw=1.5, color=color,
                      label=f"{name} ({int(np.sum(table['label'] == value))} events)")
    else:
        axis.hist(table["score"], bins=bins, histtype="step", lw=1.5, color="k",
                  label=f"all events ({len(table['score'])}, unlabelled)")
    how = {"cuts": "the cuts' background efficiency", "background_efficiency": "background efficiency",
           "threshold": "given"}[point.chosen_by]
    if point.target_background_efficiency is not None:
        how += f" {point.target_background_efficiency:.3g}"
    axis.axvline(min(point.threshold, 1.0), color="k", ls="--", lw=1,
                 label=f"threshold {point.threshold:.4f} ({how}): {int(table['selected'].sum())} selected")
    axis.set_yscale("log")
    axis.set_xlim(0, 1)
    axis.set_xlabel("network score, P(signal)")
    axis.set_ylabel("events")
    axis.set_title(title, fontsize=9)
    axis.legend(fontsize=8, loc="upper center")
    fig.tight_layout()
    return fig


def predict(writer, cfg: HepConfig, model, item, options) -> dict:
    """One input's scores and selection into ``<stem>.scores.h5`` and ``.csv``, its histogram into
    ``<stem>.scores.png``; its row of the index."""
    path, events = str(item.path), item.info
    point = working_point(cfg, model, options)
    split = hep_data.file_split(cfg, path, events.layout, events.count)
    scores, labels, weights, pass_sr = scores_and_columns(
        model, evaluation_walk(split, cfg.data.batch_size, seed=cfg.train.seed))
    table = {"event": np.arange(len(scores)), "score": scores,
             "selected": (scores >= np.float32(point.threshold)).astype(np.uint8)}
    table.update((name, values) for name, values in zip(COLUMNS, (labels, weights, pass_sr))
                 if name in events.columns)
    hdf5_name, csv_name, figure_name = outputs(cfg, item)
    with writer.path(hdf5_name) as temporary:
        write_hdf5(temporary, path, table, {**writer.provenance(),
                                            **point.record()})
    writer.csv(csv_name, list(table), zip(*(values.tolist() for values in table.values())))
    figure = plot_scores(table, point, f"{pathlib.Path(path).name}: {events.count} events ({events.layout})")
    writer.figure(figure, figure_name)
    row = {"input": path, "outputs": [hdf5_name, csv_name, figure_name], "layout": events.layout,
           "events": events.count, "selected": int(table["selected"].sum()), **point.record()}
    if "label" in table and 0 < table["label"].sum() < len(table["label"]):
        row["signal_efficiency"], row["background_efficiency"] = hep_metrics.selection_rates(
            table["selected"], table["label"], table.get("weight"))
    return row


def report(index: dict) -> list[str]:
    """The working point, then one line per input."""
    rows = index["inputs"]
    if not rows:
        return []
    first = rows[0]
    how = {"cuts": "the cut-based selection's background efficiency on the validation split",
           "background_efficiency": "the background efficiency given, on the validation split",
           "threshold": "given"}[first["working_point"]]
    lines = [f"working point: score >= {first['threshold']:.6g} ({how}"
             + (f": {first['target_background_efficiency']:.4g}; the network's there: background "
                f"{first['validation_background_efficiency']:.4g}, signal {first['validation_signal_efficiency']:.4f}"
                if "validation_background_efficiency" in first else "") + ")"]
    for row in rows:
        rates = (f" (signal efficiency {row['signal_efficiency']:.4f}, background {row['background_efficiency']:.4g})"
                 if "signal_efficiency" in row else "")
        lines.append(f"{pathlib.Path(row['input']).name}: {row['events']} events ({row['layout']}), "
                     f"{row['selected']} selected{rates} -> {row['outputs'][0]}")
    return lines


background_efficiency = fraction_argument()   # (0, 1]


def add_options(parser) -> None:
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--background-efficiency", type=background_efficiency, metavar="X",
                        help="select at the network's weighted background efficiency X (0 < X <= 1) on the run's "
                             "validation split (default: the cut-based selection's there)")
    chosen.add_argument("--threshold", type=finite_number_argument, metavar="T", help="select events with score >= T")


# Part of the HEP CNN's declaration (hep_cnn/application.py).
PREDICTOR = Predictor(
    tool=TOOL, schema=HepConfig, what="HEP event", patterns=("*.h5", "*.hdf5"), inspect=inspect,
    outputs=outputs, predict=predict, report=report, add_options=add_options, prepare=working_point,
    description="Score new events with a trained HEP CNN run and select them at a working point.")


if __name__ == "__main__":
    predict_main("hep_cnn")
