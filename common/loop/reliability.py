"""Surviving long runs: preemption signals, NaN/Inf losses and dead ranks.

- :class:`common.loop.preemption.StopRequest` turns SIGTERM/SIGUSR1 (SLURM's warning signal) into a
  flag.  The flag travels in the allreduce of every training step
  (``TrainingModel.train_step``), so all ranks learn of a stop requested on
  any of them within one step, and stop at the same step boundary.
- :class:`StepGuard` (a callback on every rank) reads, after each step, the
  rank-averaged loss, whether the allreduced gradients were all finite, and the
  stop flag: it saves a mid-epoch checkpoint and raises :class:`Preempted` on a
  stop, and raises :class:`NonFiniteLoss` on a NaN/Inf loss or gradient (at
  once without loss scaling, after N in a row with it, since the loss-scale
  optimizer skips those steps itself).  Every rank sees the same values, so
  every rank stops at the same step.
- :class:`Watchdog` exits the process (code 4) when a phase makes no progress
  for its time limit: start-up (screening, building, broadcasting, the first
  step's trace) ``train.startup_timeout_s``; training (no step, validation
  batch or epoch end) ``train.hang_timeout_s``; rank 0 writing a checkpoint or
  the final model, and the other ranks waiting for that write,
  ``train.save_timeout_s``; once the file is written (rank 0 knows, the others
  see it replaced: :class:`FileReplacement`), the meeting after it
  (``synchronising``) ``train.hang_timeout_s`` again.  A rank that died
  mid-allreduce must not leave the others waiting forever, a long save on
  rank 0 must not kill the ranks waiting for it, and a node lost while the
  others wait after a save must not hold them for the whole save limit.
"""

from __future__ import annotations

import math
import os
import pathlib
import sys
import threading
import time

import keras
import tensorflow as tf

from common.loop.callbacks import last_step
from common.errors import EXIT_HUNG, NonFiniteLoss, Preempted
from common.loop.preemption import StopRequest
from common.storage import scratch


class StepSignals:
    """Per-step values the training step writes for the callbacks to read.

    Plain tf.Variables held outside the Keras model, so they are neither
    trained, checkpointed nor broadcast.
    """

    def __init__(self):
        self.stop_requested = tf.Variable(0.0, trainable=False, name="stop_requested")
        self.global_stop = tf.Variable(0.0, trainable=False, name="global_stop")
        self.global_loss = tf.Variable(0.0, trainable=False, name="global_loss")
        # 1 when every allreduced gradient of the step was finite (the same on every rank of a group).
        self.gradients_finite = tf.Variable(1.0, trainable=False, name="gradients_finite")
        self.exchange_ready = tf.Variable(0.0, trainable=False, name="exchange_ready")
        self.group_exchange_ready = tf.Variable(0.0, trainable=False, name="group_exchange_ready")


class Watchdog:
    """Kills this process (exit code 4) when the current phase has made no progress for its time limit.

    Phases: ``start-up`` until the first training step ends, ``training``, ``saving`` (rank 0 writing a
    checkpoint or the final model; the other ranks waiting for that write) and ``synchronising`` (the ranks
    meeting once it is written).  :meth:`beat` records progress; :meth:`phase` enters a phase (and counts as
    progress).  A limit of 0 leaves that phase unguarded.  Before it ends the process, the watchdog runs what
    :meth:`at_expiry` registered (each for at most :data:`LAST_WORDS_S` seconds: a stalled file system must
    not keep a hung process alive).
    """

    LAST_WORDS_S = 10.0

    def __init__(self, timeout_s: float, rank: int, poll_s: float | None = None, startup_timeout_s: float = 0.0,
                 save_timeout_s: float = 0.0):
        self.rank = rank
        self.limits = {"start-up": (startup_timeout_s, "train.startup_timeout_s"),
                       "training": (timeout_s, "train.hang_timeout_s"),
                       "saving": (save_timeout_s, "train.save_timeout_s"),
                       "synchronising": (timeout_s, "train.hang_timeout_s")}
        self.timeout_s = timeout_s
        self._phase = "start-up"
        self._what = "screening the data, building the model, the first step"
        self._last = time.monotonic()
        self._lock = threading.Lock()
        self._entered = 0   # counts phase changes: a file watch moves on only the phase it was given for
        self._at_expiry: list = []
        self._stopped = threading.Event()
        shortest = min([t for t, _ in self.limits.values() if t > 0] or [10.0])
        self._poll_s = poll_s or max(0.2, min(10.0, shortest / 10))
        self._thread = threading.Thread(target=self._run, name="training-watchdog", daemon=True)
        self._thread.start()

    @classmethod
    def for_run(cls, train_cfg, rank: int) -> "Watchdog | None":
        """The watchdog a run's ``train`` section asks for (None when every limit is 0)."""
        limits = (train_cfg.hang_timeout_s, train_cfg.startup_timeout_s, train_cfg.save_timeout_s)
        if not any(limits):
            return None
        return cls(train_cfg.hang_timeout_s, rank, startup_timeout_s=train_cfg.startup_timeout_s,
                   save_timeout_s=train_cfg.save_timeout_s)

    @property
    def current_phase(self) -> str:
        """The phase the watchdog times now (start-up, training, saving...)."""
        return self._phase

    def beat(self):
        """A sign of progress: the current phase's timer starts again."""
        self._last = time.monotonic()

    def phase(self, name: str, what: str = "", until: "FileReplacement | None" = None, then: str = "") -> str:
        """Enter phase ``name`` ("start-up", "training", "saving", "synchronising"); returns the one it leaves.

        ``until``: the phase lasts until that file is replaced (another rank's write, which this rank waits
        for), then ``synchronising`` (``then`` says what it waits for) follows, timed from that moment."""
        with self._lock:
            previous = self._phase
            self._entered += 1
            entered = self._entered
            self._phase, self._what = name, what
            self.beat()
        if until is not None:
            until.when_replaced(lambda: self._move_on(entered, "synchronising", then))
        return previous

    def _move_on(self, entered: int, name: str, what: str) -> None:
        with self._lock:
            if self._entered == entered:   # still the phase the watch was given for
                self._entered += 1
                self._phase, self._what = name, what
                self.beat()

    def watch_replacement(self, path) -> "FileReplacement | None":
        """A :class:`FileReplacement` of ``path``, to start before the write it waits for can begin (None when
        ``synchronising`` is unguarded: nothing to move on to)."""
        if self.limits["synchronising"][0] <= 0:
            return None
        return FileReplacement(path, poll_s=max(0.2, min(5.0, self.limits["synchronising"][0] / 20)))

    def at_expiry(self, last_words) -> None:
        """Run ``last_words(message)`` before the watchdog ends the process (rank 0 records the attempt's end)."""
        self._at_expiry.append(last_words)

    def stop(self):
        """Ends the watchdog thread; nothing is timed any more."""
        self._stopped.set()

    def _run(self):
        while not self._stopped.wait(self._poll_s):
            idle = time.monotonic() - self._last
            limit, key = self.limits[self._phase]
            if limit > 0 and idle > limit:
                what = f" ({self._what})" if self._what else ""
                message = (f"rank {self.rank}: no progress for {idle:.0f} s in {self._phase}{what} ({key}="
                           f"{limit:g}); another rank has probably died or hung")
                print(f"error: {message}; exiting", file=sys.stderr, flush=True)
                for last_words in self._at_expiry:
                    worker = threading.Thread(target=_quietly, args=(last_words, message), daemon=True)
                    worker.start()
                    worker.join(self.LAST_WORDS_S)
                scratch.remove()   # what the atexit handlers that os._exit skips would remove
                os._exit(EXIT_HUNG)


def _quietly(function, *args) -> None:
    try:
        function(*args)
    except Exception as exc:   # noqa: BLE001  the process is ending with its own error line
        print(f"warning: {exc}", file=sys.stderr, flush=True)


class FileReplacement:
    """Whether the file at ``path`` has been replaced (created, or renamed over) since this watch began:
    how a rank waiting for rank 0's write learns that it is done.  A thread of its own polls the file's
    identity (device, inode, size, modification time), so a stalled file system stalls the watch, never the
    watchdog.  Start it before the write can begin (before the last collective that precedes it)."""

    def __init__(self, path, poll_s: float = 1.0):
        self.path = pathlib.Path(path)
        self.poll_s = poll_s
        self.replaced = threading.Event()
        self._lock = threading.Lock()
        self._listeners: list = []
        self._stopped = threading.Event()
        threading.Thread(target=self._run, name="file-replacement-watch", daemon=True).start()

    def when_replaced(self, listener) -> None:
        """Call ``listener()`` once the file is replaced (now, if it already is)."""
        with self._lock:
            if not self.replaced.is_set():
                self._listeners.append(listener)
                return
        listener()

    def stop(self) -> None:
        self._stopped.set()

    def _identity(self):
        try:
            found = os.stat(self.path)
        except FileNotFoundError:
            return None
        except OSError:
            return "unknown"
        return found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns

    def _run(self):
        before = self._identity()
        while not self._stopped.wait(self.poll_s):
            now = self._identity()
            if before == "unknown":   # no baseline yet: a late one may miss the write (then save_timeout_s holds)
                before = now
                continue
            if now != before and now not in (None, "unknown"):
                with self._lock:
                    self.replaced.set()
                    listeners, self._listeners = self._listeners, []
                for listener in listeners:
                    listener()
                return


class StepGuard(keras.callbacks.Callback):
    """Stop requests and non-finite losses, checked after every training step on every rank.

    Args:
        signals: the :class:`StepSignals` the train step fills.
        stop_request: the :class:`StopRequest` of this process.
        save_checkpoint: ``f(epoch, step_in_epoch)``, collective, for the mid-epoch save.
        watchdog: fed after every step, validation batch and epoch.
        loss_scaled: True under a LossScaleOptimizer.
        max_nonfinite_steps: with loss scaling, stop after this many non-finite losses in a row.
        first_step_offset: steps already done in the first epoch of this fit (mid-epoch resume).
    """

    def __init__(self, signals: StepSignals, stop_request: StopRequest, save_checkpoint, watchdog: Watchdog | None,
                 loss_scaled: bool, max_nonfinite_steps: int, first_step_offset: int = 0):
        super().__init__()
        self.signals = signals
        self.stop_request = stop_request
        self.save_checkpoint = save_checkpoint
        self.watchdog = watchdog
        self.loss_scaled = loss_scaled
        self.max_nonfinite_steps = max_nonfinite_steps
        self.first_step_offset = first_step_offset
        self.nonfinite_in_a_row = 0
        self._epoch = 0
        self._first_epoch = None
        self._pending = False   # a stop requested on an epoch's last step, honoured after its checkpoint

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        if self._first_epoch is None:
            self._first_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.stop_request.requested and float(self.signals.stop_requested.numpy()) == 0.0:
            self.signals.stop_requested.assign(1.0)

    def on_train_batch_end(self, batch, logs=None):
        if self.watchdog is not None:
            if self.watchdog.current_phase == "start-up":
                self.watchdog.phase("training")
            self.watchdog.beat()
        offset = self.first_step_offset if self._epoch == self._first_epoch else 0
        step_in_epoch = offset + batch + 1
        loss = float(self.signals.global_loss.numpy())
        gradients_finite = float(self.signals.gradients_finite.numpy()) > 0
        if not math.isfinite(loss) or not gradients_finite:
            self.nonfinite_in_a_row += 1
            if not self.loss_scaled or self.nonfinite_in_a_row >= self.max_nonfinite_steps:
                what = f"loss is {loss}" if not math.isfinite(loss) else \
                    f"the gradients hold NaN or Inf (loss {loss:.4g})"
                raise NonFiniteLoss(f"{what} at epoch {self._epoch + 1}, step {step_in_epoch}"
                                    + (f" ({self.nonfinite_in_a_row} non-finite steps in a row)"
                                       if self.loss_scaled else ""))
        else:
            self.nonfinite_in_a_row = 0
        if float(self.signals.global_stop.numpy()) > 0:
            if last_step(self, batch):
                step_in_epoch = 0   # the epoch is complete: its epoch-end checkpoint follows
                self._pending = True
                return
            self.save_checkpoint(self._epoch, step_in_epoch)
            raise Preempted(f"stop requested ({self.stop_request.signal_name or 'signal on another rank'}); "
                            f"checkpoint saved at epoch {self._epoch + 1}, step {step_in_epoch}")

    def on_test_batch_end(self, batch, logs=None):
        if self.watchdog is not None:
            self.watchdog.beat()

    def on_epoch_end(self, epoch, logs=None):
        if self.watchdog is not None:
            self.watchdog.beat()
        if self._pending:
            # Runs after the epoch-end checkpoint (callbacks are ordered so).
            raise Preempted(f"stop requested ({self.stop_request.signal_name or 'signal on another rank'}); "
                            f"checkpoint saved at the end of epoch {epoch + 1}")
