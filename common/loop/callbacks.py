"""Callbacks of the one training loop: the epoch-end synchronisation over
ranks, throughput, learning rate, checkpoints (and rank 0's writes that the
others wait for) and the per-epoch report."""

from __future__ import annotations

import logging
import pathlib
import time

import keras
import numpy as np

from common.distributed import SEED_STATE_MARKER, Distributed
from common.loop.records import epoch_row
from common.storage import checkpoint
from common.errors import NonFiniteLoss
from common.nn.flops import TRAINING_FLOPS_FACTOR
from common.nn.metrics import ConfusionMatrix, iou_from_confusion

log = logging.getLogger(__name__)


def last_step(callback: keras.callbacks.Callback, batch: int) -> bool:
    """Whether ``batch`` is the last training step of the epoch ``fit`` is running."""
    steps = (callback.params or {}).get("steps")
    return steps is not None and batch == steps - 1


def confusion_metrics(model) -> list[ConfusionMatrix]:
    """The :class:`ConfusionMatrix` metrics compiled into ``model`` (found through Keras' containers)."""
    found, pending = [], list(model.metrics)
    while pending:
        metric = pending.pop(0)
        if isinstance(metric, ConfusionMatrix):
            found.append(metric)
        pending.extend(getattr(metric, "metrics", []) or [])
    return found


class EpochEndSync(keras.callbacks.Callback):
    """Every rank agrees on the model and on the numbers of an epoch, in this order:

    1. after the epoch's last training step: batch-norm moving statistics (float
       non-trainable variables) averaged over ranks, so every rank validates and
       rank 0 saves the same model; the training confusion matrices summed over
       ranks (read before validation refills them);
    2. at the end of the epoch: IoU, per-class IoU and pixel accuracy from the
       pooled confusion matrices (training, and validation just run) written into
       the logs (averaging the ranks' own IoUs would be wrong), then every numeric
       log averaged over ranks.

    The trainer puts it after the callbacks that measure and before the ones
    that write (checkpoint, CSV, TensorBoard, MLPerf, the epoch report).
    """

    def __init__(self, dist: Distributed):
        super().__init__()
        self.dist = dist
        self._train: dict[str, dict] = {}

    def on_train_batch_end(self, batch, logs=None):
        if not last_step(self, batch):
            return
        for variable in self.model.non_trainable_weights:
            if SEED_STATE_MARKER in variable.path or not str(variable.dtype).startswith(("float", "bfloat")):
                continue
            variable.assign(self.dist.allreduce(variable.value, average=True,
                                                name=f"average_{variable.path.replace('/', '_')}"))
        self._train = {m.name: self._pooled(m) for m in confusion_metrics(self.model)}

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        metrics = confusion_metrics(self.model)
        for metric in metrics:
            if metric.name in self._train:
                self._write(logs, "", metric, self._train[metric.name])
        if "val_loss" in logs:
            self.write_pooled_validation(logs, metrics)
        numeric = {k: float(v) for k, v in logs.items() if isinstance(v, (int, float, np.floating, np.integer))}
        logs.update(self.dist.average_scalars(numeric))

    def write_pooled_validation(self, logs: dict, metrics: list[ConfusionMatrix]) -> None:
        """IoU and pixel accuracy of the validation just run, from the confusion pooled over ranks, into logs."""
        for metric in metrics:
            self._write(logs, "val_", metric, self._pooled(metric))

    def _pooled(self, metric: ConfusionMatrix) -> dict:
        return iou_from_confusion(self.dist.sum_array(np.asarray(metric.confusion, np.float64)))

    @staticmethod
    def _write(logs: dict, prefix: str, metric: ConfusionMatrix, pooled: dict) -> None:
        logs[f"{prefix}{metric.name}"] = pooled["mean_iou"]
        logs[f"{prefix}pixel_accuracy"] = pooled["pixel_accuracy"]
        for name, value in zip(metric.class_names, pooled["iou"]):
            logs[f"{prefix}iou_{name}"] = float(value)


class Throughput(keras.callbacks.Callback):
    """Global samples/s and achieved TFLOP/s per epoch, after warm-up steps.

    Time runs from the end of step ``warmup_steps`` of each epoch to the end of
    its last step, so the first step (tracing, pipeline start) is left out.
    Adds ``samples_per_second``, ``tflops_per_second`` (training = 3 x
    forward) and, when a peak is known, ``ratio_to_peak`` to the epoch logs.
    ``step_times``: the timed steps' durations of each epoch (seconds, one
    list per epoch), for median step times (summary.json, the scaling model).

    Args:
        global_batch_size: samples per step over all ranks.
        forward_flops_per_sample: the model's forward FLOPs for one sample.
        peak_flops_total: peak FLOP/s of all ranks' devices together, or None.
        warmup_steps: steps at the start of each epoch not timed.
    """

    def __init__(self, global_batch_size: int, forward_flops_per_sample: float,
                 peak_flops_total: float | None, warmup_steps: int = 2):
        super().__init__()
        self.global_batch_size = global_batch_size
        self.training_flops_per_sample = TRAINING_FLOPS_FACTOR * forward_flops_per_sample
        self.peak_flops_total = peak_flops_total
        self.warmup_steps = warmup_steps
        self.step_times: list[list[float]] = []

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = time.perf_counter()
        self.step_times.append([])
        self._timer_start = None
        self._timed_steps = 0
        self._steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self._steps += 1
        now = time.perf_counter()
        if self._timer_start is None:
            if self._steps >= max(1, self.warmup_steps):
                self._timer_start = self._timer_end = now
        else:
            self._timed_steps += 1
            self.step_times[-1].append(now - self._timer_end)
            self._timer_end = now

    def on_epoch_end(self, epoch, logs=None):
        logs = logs if logs is not None else {}
        logs["epoch_time_s"] = time.perf_counter() - self._epoch_start
        if self._timed_steps == 0:
            return  # too few steps in this epoch to time after warm-up
        elapsed = self._timer_end - self._timer_start
        samples_per_second = self._timed_steps * self.global_batch_size / elapsed
        logs["samples_per_second"] = samples_per_second
        logs["tflops_per_second"] = samples_per_second * self.training_flops_per_sample / 1e12
        if self.peak_flops_total:
            logs["ratio_to_peak"] = logs["tflops_per_second"] * 1e12 / self.peak_flops_total


class LearningRateLog(keras.callbacks.Callback):
    """Puts the learning rate used by the epoch's last step into the logs.

    Read just before that step: after it, the optimizer's step counter already
    points at the next epoch (and possibly past a decay boundary).
    """

    def on_train_batch_begin(self, batch, logs=None):
        if last_step(self, batch) or (self.params or {}).get("steps") is None:
            self._last_step_learning_rate = float(np.asarray(self.model.optimizer.learning_rate))

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and hasattr(self, "_last_step_learning_rate"):
            logs["learning_rate"] = self._last_step_learning_rate


def state_variables(model) -> list:
    """The model variables a checkpoint and the initial broadcast carry (not the RNG states)."""
    return [v for v in model.variables if SEED_STATE_MARKER not in v.path]


def rng_variables(model) -> list:
    """Seed-generator states (dropout and friends): different on each rank."""
    return [v for v in model.variables if SEED_STATE_MARKER in v.path]


class RootWrite:
    """A file rank 0 writes while the other ranks wait for it; then every rank meets, so nobody leaves (a
    preemption exit, a launcher ending the job) before the file is in place.

    The watchdog times each rank by what it does.  Rank 0's write has ``train.save_timeout_s`` (a long write
    to a slow file system is not a hang); so has a rank waiting for it, until it sees the file replaced
    (:class:`~common.loop.reliability.FileReplacement`, started here, before the collectives that precede
    the write); the meeting after the write (``synchronising``) has ``train.hang_timeout_s``, on every rank.
    So when a rank other than 0 is lost around a save, the others end within the write plus
    ``hang_timeout_s``; only when rank 0 is lost in the middle of its write do they wait ``save_timeout_s``:
    nothing tells a lost writer from a slow file system.  Use as a context manager around the collectives
    that precede the write and :meth:`run`.
    """

    def __init__(self, dist: Distributed, watchdog, path):
        self.dist = dist
        self.watchdog = watchdog
        self.path = pathlib.Path(path)
        self._watch = None
        self._previous = None

    def __enter__(self) -> "RootWrite":
        if self.watchdog is not None:
            self._previous = self.watchdog.current_phase
            self.watchdog.beat()
            if not self.dist.is_root:
                self._watch = self.watchdog.watch_replacement(self.path)
        return self

    def run(self, write, what: str) -> None:
        """``write()`` on rank 0 (it ends by putting :attr:`path` in place), then the meeting of every rank."""
        written = f"{self.path.name} written; waiting for every rank to get past it"
        if self.dist.is_root:
            if self.watchdog is not None:
                self.watchdog.phase("saving", what)
            write()
            if self.watchdog is not None:
                self.watchdog.phase("synchronising", written)
        elif self.watchdog is not None:
            self.watchdog.phase("saving", f"waiting for rank 0: {what}", until=self._watch, then=written)
        self.dist.barrier()

    def __exit__(self, *exc_info) -> None:
        if self._watch is not None:
            self._watch.stop()
        if self.watchdog is not None and self._previous is not None:
            self.watchdog.phase(self._previous)


class SaveCheckpoint(keras.callbacks.Callback):
    """A checkpoint after every epoch, and on demand mid-epoch (preemption): the commit point of an epoch.

    Runs on every rank: every rank first counts the non-finite arrays of its model and optimizer state
    and the counts are summed over ranks, so a NaN weight stops every rank with
    :class:`~common.errors.NonFiniteLoss` before anything is written (the previous checkpoint stays the
    newest); then each rank's random-number state is gathered to rank 0, which writes the file (model,
    optimizer, position, RNG states, ``resume_record``: what a resume must match, and ``history``: the row
    of every completed epoch, this one's included (:func:`common.loop.records.epoch_row`), from which the
    records are written and, on a resume, reconciled).  The write and the meeting of the ranks after it are
    timed as :class:`RootWrite` says.  ``history``: the rows the checkpoint this run resumed committed.
    """

    def __init__(self, directory, dist: Distributed, keep: int = 2, watchdog=None, resume_record: dict | None = None,
                 history: list[dict] | None = None):
        super().__init__()
        self.directory = directory
        self.dist = dist
        self.keep = keep
        self.watchdog = watchdog
        self.resume_record = dict(resume_record or {})
        self.history = list(history or [])

    def save(self, epochs_completed: int, step_in_epoch: int = 0, row: dict | None = None):
        """A checkpoint of the model and optimizer after ``epochs_completed`` epochs (and ``step_in_epoch`` steps into
        the next), committing ``row`` (the epoch just completed), written by rank 0 only if every rank's variables
        are finite; otherwise NonFiniteLoss."""
        path = checkpoint.checkpoint_path(self.directory, epochs_completed, step_in_epoch)
        with RootWrite(self.dist, self.watchdog, path) as write:
            optimizer = self.model.optimizer
            variables = state_variables(self.model) + list(optimizer.variables)
            bad = checkpoint.nonfinite_arrays([np.asarray(v) for v in variables])
            total_bad = int(self.dist.sum_array(np.array([len(bad)], np.int64))[0])
            if total_bad:
                first = variables[bad[0]].path if bad else "on another rank"
                where = f"epoch {epochs_completed + 1}, step {step_in_epoch}" if step_in_epoch else \
                    f"the end of epoch {epochs_completed}"
                raise NonFiniteLoss(f"weights hold NaN or Inf at {where} ({len(bad)} array(s) here, first: {first}); "
                                    "checkpoint not written")
            gathered = self.dist.allgather_object([np.asarray(v) for v in rng_variables(self.model)])
            history = self.history + ([row] if row is not None else [])

            def write_checkpoint():
                state = {"step": int(np.asarray(optimizer.iterations)), **self.resume_record, "history": history}
                checkpoint.save_checkpoint(self.directory, epochs_completed, state_variables(self.model),
                                           optimizer.variables, state, keep=self.keep, step_in_epoch=step_in_epoch,
                                           rng_states=gathered)

            write.run(write_checkpoint, f"writing {path.name}")
        self.history = history

    def on_epoch_end(self, epoch, logs=None):
        self.save(epoch + 1, row=epoch_row(epoch, logs, self.model.optimizer))


class EpochReport(keras.callbacks.Callback):
    """One line per epoch on rank 0: losses, metrics, samples/s and TFLOP/s."""

    SHOWN_FIRST = ("loss", "val_loss")
    THROUGHPUT = ("samples_per_second", "tflops_per_second", "ratio_to_peak", "epoch_time_s", "learning_rate")

    def __init__(self, epochs: int):
        super().__init__()
        self.epochs = epochs

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        metrics = [k for k in self.SHOWN_FIRST if k in logs]
        metrics += sorted(k for k in logs if k not in self.SHOWN_FIRST and k not in self.THROUGHPUT)
        parts = [f"{k} {logs[k]:.4g}" for k in metrics]
        line = f"epoch {epoch + 1}/{self.epochs}: " + ", ".join(parts)
        if "samples_per_second" in logs:
            line += f" | {logs['samples_per_second']:.2f} samples/s, {logs['tflops_per_second']:.4f} TFLOP/s"
            if "ratio_to_peak" in logs:
                line += f" ({100 * logs['ratio_to_peak']:.1f}% of peak)"
        line += f" | lr {logs.get('learning_rate', float('nan')):.3g}, {logs.get('epoch_time_s', 0):.1f} s"
        log.info(line)
