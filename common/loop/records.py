"""An epoch's records, and how they agree with its checkpoint after a crash at any instant.

The checkpoint commits an epoch.  :class:`~common.loop.callbacks.SaveCheckpoint` puts the epoch's row
(:func:`epoch_row`: the logs every rank agreed on, the epoch's end time) into the checkpoint's state record,
beside the rows of every earlier epoch, and writes the file atomically.  The records come after, from what
was committed:

- ``history.csv`` is rewritten whole, atomically, from the committed rows (:class:`HistoryCsv`);
- TensorBoard's event files and the MLPerf log are appended to by their callbacks.

A crash can fall between a checkpoint and its records (the epoch committed, its row not yet written), and a
newest checkpoint can turn out unreadable after its records were written (rows of epochs that a resume
will train again).  So every run, before its first step, brings the records into line with the checkpoint it
starts from (:func:`reconcile`; the MLPerf log: :meth:`common.loop.mlperf.MlperfLog.reconcile`):
``history.csv`` becomes exactly the rows of the committed epochs (those missing restored from the
checkpoint, later ones dropped; no checkpoint: no rows), and the TensorBoard event files lose the points
written beyond the checkpoint and get back the ``epoch_*`` points of committed epochs that a crash kept out.
(Keras' ``evaluation_*_vs_iterations`` points, rank 0's own validation numbers at each optimizer step, are
written before the checkpoint but are not in it: those a killed process had not flushed stay missing.)  A
mid-epoch (preemption) checkpoint adds no row: its epoch is not complete.
"""

from __future__ import annotations

import csv
import io
import logging
import os
import pathlib
import socket
import time

import keras
import numpy as np

from common.deferred import tensorflow as tf   # at first use: the history functions need none
from common.storage import outputs

log = logging.getLogger(__name__)

HISTORY_CSV = "history.csv"
MISSING = "NA"   # a metric an epoch did not log (Keras' CSVLogger wrote the same)
NO_STEP = 2 ** 62   # beyond every epoch


def epoch_row(epoch: int, logs: dict, optimizer) -> dict:
    """The record of a completed epoch (0-based ``epoch``) that its checkpoint commits: the numeric logs
    (after the synchronisation over ranks), when it ended, and the learning rate the optimizer reports now
    (what Keras' TensorBoard callback logs for the epoch, beside history.csv's last-step rate)."""
    numeric = {k: float(v) for k, v in (logs or {}).items() if isinstance(v, (int, float, np.floating, np.integer))}
    inner = getattr(optimizer, "inner_optimizer", optimizer)   # under loss scaling, as Keras' TensorBoard reads it
    return {"epoch": int(epoch), "logs": numeric, "time_unix": time.time(),
            "optimizer_learning_rate": float(np.asarray(inner.learning_rate))}


def history_text(rows: list[dict]) -> str:
    """``history.csv`` for ``rows``: a column per metric (sorted, after ``epoch``), one line per epoch."""
    keys = sorted({key for row in rows for key in row["logs"]})
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["epoch", *keys])
    for row in rows:
        writer.writerow([row["epoch"], *(row["logs"].get(key, MISSING) for key in keys)])
    return buffer.getvalue()


def write_history(path: pathlib.Path, rows: list[dict]) -> None:
    """``history.csv`` rewritten whole, atomically (a crash leaves the previous version or this one)."""
    with outputs.atomic_path(path) as temporary:   # the run's own file (its marker lists it)
        temporary.write_text(history_text(rows), newline="")


def rows_from_csv(path: pathlib.Path, epochs_completed: int) -> list[dict]:
    """The rows of epochs before ``epochs_completed`` in an existing ``history.csv`` (for a checkpoint written
    before checkpoints carried their history); values that do not read as numbers are left out."""
    try:
        with open(path, newline="") as handle:
            table = list(csv.DictReader(handle))
    except (OSError, csv.Error, UnicodeDecodeError):
        return []
    rows = {}
    for line in table:
        try:
            epoch = int(line.pop("epoch"))
        except (KeyError, TypeError, ValueError):
            continue
        if 0 <= epoch < epochs_completed:
            logs = {}
            for key, value in line.items():
                try:
                    logs[key] = float(value)
                except (TypeError, ValueError):
                    pass
            rows[epoch] = {"epoch": epoch, "logs": logs, "time_unix": None, "optimizer_learning_rate": None}
    return [rows[epoch] for epoch in sorted(rows)]


class HistoryCsv(keras.callbacks.Callback):
    """``history.csv`` after every epoch-end checkpoint, from the rows it committed (rank 0).  Placed after
    :class:`~common.loop.callbacks.SaveCheckpoint`, whose ``history`` it writes."""

    def __init__(self, path, saver):
        super().__init__()
        self.path = pathlib.Path(path)
        self.saver = saver

    def on_epoch_end(self, epoch, logs=None):
        write_history(self.path, self.saver.history)


def _epochs(numbers) -> str:
    numbers = sorted(numbers)
    if len(numbers) > 2 and numbers[-1] - numbers[0] == len(numbers) - 1:
        return f"{numbers[0]}-{numbers[-1]}"
    return ", ".join(str(n) for n in numbers)


def reconcile(output_dir: pathlib.Path, history: list[dict], epochs_completed: int, optimizer_step: int,
              source: str, tensorboard: bool) -> None:
    """Rank 0, before a run's first step: its records made to agree with the checkpoint it starts from
    (``source``, for the messages; ``history``: that checkpoint's rows, ``optimizer_step`` its step; no rows
    and step 0 when the run starts afresh)."""
    _reconcile_history_csv(output_dir / HISTORY_CSV, history, source)
    board = output_dir / "tensorboard"
    if board.is_dir() and outputs.written_by_suite(board):   # the marker lists it: this run's (a link never is)
        _reconcile_tensorboard(board, history, epochs_completed, optimizer_step, source, restore=tensorboard)


def _reconcile_history_csv(path: pathlib.Path, history: list[dict], source: str) -> None:
    present = path.is_file() and not path.is_symlink()
    text = path.read_text(errors="replace") if present else ""
    if present and text.replace("\r\n", "\n") == history_text(history).replace("\r\n", "\n"):
        return
    found = {row["epoch"] for row in rows_from_csv(path, NO_STEP)} if present else set()
    kept = {row["epoch"] for row in history}
    restored, dropped = kept - found, found - kept
    if history:
        write_history(path, history)
    elif present:
        path.unlink()   # the run's own file (the claim checked it): no epoch of it is committed
    said = []
    if restored:
        said.append(f"restored the row(s) of epoch(s) {_epochs(e + 1 for e in restored)} from {source}")
    if dropped:
        said.append(f"dropped the row(s) of epoch(s) {_epochs(e + 1 for e in dropped)}, written after a checkpoint "
                    f"this run does not continue")
    if said:
        log.warning(f"{path}: " + "; ".join(said))


def _stale(tag: str, step: int, epochs_completed: int, optimizer_step: int) -> bool:
    """Whether a TensorBoard point lies beyond the checkpoint: Keras' TensorBoard callback writes ``epoch_*``
    at the epoch's index and ``evaluation_*_vs_iterations`` at the optimizer's step."""
    if tag.startswith("epoch_"):
        return step >= epochs_completed
    if tag.endswith("_vs_iterations"):
        return step > optimizer_step
    return False


def _reconcile_tensorboard(board: pathlib.Path, history: list[dict], epochs_completed: int, optimizer_step: int,
                           source: str, restore: bool) -> None:
    """The TensorBoard event files (``train/``, ``validation/``) made to agree with the checkpoint: points an
    earlier attempt wrote beyond it are taken out of its files (each rewritten atomically; a file left with
    no point is removed), and the ``epoch_*`` points of committed epochs that a crash kept out (written after
    the checkpoint, or still in a killed writer's buffer) are written from the checkpoint into a file of
    their own."""
    dropped, restored = 0, set()
    for folder, validation in (("train", False), ("validation", True)):
        present = set()
        for path in sorted((board / folder).glob("*tfevents*")):
            if not path.is_file() or path.is_symlink():
                continue
            events, whole = [], True
            try:
                for record in tf.data.TFRecordDataset(str(path)):
                    events.append(tf.compat.v1.Event.FromString(record.numpy()))
            except (tf.errors.DataLossError, tf.errors.OutOfRangeError):
                whole = False   # its last event cut short by a crash: the rest is kept
            kept, points, changed = [], 0, not whole
            for event in events:
                if event.HasField("summary"):
                    values = [v for v in event.summary.value
                              if not _stale(v.tag, event.step, epochs_completed, optimizer_step)]
                    if len(values) != len(event.summary.value):
                        dropped += len(event.summary.value) - len(values)
                        changed = True
                        if not values:
                            continue
                        del event.summary.value[:]
                        event.summary.value.extend(values)
                    present |= {(v.tag, event.step) for v in values}
                    points += len(values)
                kept.append(event)
            if not changed:
                continue
            if not points:
                path.unlink()
                continue
            with outputs.atomic_path(path) as temporary:
                with tf.io.TFRecordWriter(str(temporary)) as writer:
                    for event in kept:
                        writer.write(event.SerializeToString())
        missing = []   # (step, {tag: value}) of committed epochs whose points the files lack
        for row in history if restore else []:
            values = {f"epoch_{k[4:] if validation else k}": v for k, v in row["logs"].items()
                      if k.startswith("val_") == validation}
            if not validation and row.get("optimizer_learning_rate") is not None:
                values["epoch_learning_rate"] = row["optimizer_learning_rate"]
            values = {tag: value for tag, value in values.items() if (tag, row["epoch"]) not in present}
            if values:
                missing.append((row["epoch"], values))
        if missing:
            now = time.time()
            name = f"events.out.tfevents.{int(now):010d}.{socket.gethostname()}.{os.getpid()}.0.restored"
            (board / folder).mkdir(exist_ok=True)
            with outputs.atomic_path(board / folder / name) as temporary:
                with tf.io.TFRecordWriter(str(temporary)) as writer:
                    writer.write(tf.compat.v1.Event(wall_time=now, file_version="brain.Event:2").SerializeToString())
                    for step, values in missing:
                        summary = tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(tag=tag, simple_value=value)
                                                              for tag, value in sorted(values.items())])
                        writer.write(tf.compat.v1.Event(wall_time=now, step=step, summary=summary).SerializeToString())
            restored.update(step + 1 for step, _ in missing)
    said = []
    if dropped:
        said.append(f"took out {dropped} point(s) written beyond {source}")
    if restored:
        said.append(f"restored the points of epoch(s) {_epochs(restored)} from {source}")
    if said:
        log.warning(f"{board}: " + "; ".join(said))
