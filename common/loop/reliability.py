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
  batch or epoch end) ``train.hang_timeout_s``; a checkpoint or the final
  model being written ``train.save_timeout_s``.  A rank that died
  mid-allreduce must not leave the others waiting forever, and a long save on
  rank 0 must not kill the ranks waiting for it.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time

import keras
import tensorflow as tf

from common.loop.callbacks import last_step
from common.errors import EXIT_HUNG, NonFiniteLoss, Preempted
from common.loop.preemption import StopRequest


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

    Phases: ``start-up`` until the first training step ends, ``training``, and ``saving`` (checkpoints,
    the final model).  :meth:`beat` records progress; :meth:`phase` enters a phase (and counts as
    progress).  A limit of 0 leaves that phase unguarded.
    """

    def __init__(self, timeout_s: float, rank: int, poll_s: float | None = None, startup_timeout_s: float = 0.0,
                 save_timeout_s: float = 0.0):
        self.rank = rank
        self.limits = {"start-up": (startup_timeout_s, "train.startup_timeout_s"),
                       "training": (timeout_s, "train.hang_timeout_s"),
                       "saving": (save_timeout_s, "train.save_timeout_s")}
        self.timeout_s = timeout_s
        self._phase = "start-up"
        self._what = "screening the data, building the model, the first step"
        self._last = time.monotonic()
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

    def phase(self, name: str, what: str = "") -> str:
        """Enter phase ``name`` ("start-up", "training", "saving"); returns the one it leaves."""
        previous = self._phase
        self._phase, self._what = name, what
        self.beat()
        return previous

    def stop(self):
        """Ends the watchdog thread; nothing is timed any more."""
        self._stopped.set()

    def _run(self):
        while not self._stopped.wait(self._poll_s):
            idle = time.monotonic() - self._last
            limit, key = self.limits[self._phase]
            if limit > 0 and idle > limit:
                what = f" ({self._what})" if self._what else ""
                print(f"error: rank {self.rank}: no progress for {idle:.0f} s in {self._phase}{what} ({key}="
                      f"{limit:g}); another rank has probably died or hung; exiting",
                      file=sys.stderr, flush=True)
                os._exit(EXIT_HUNG)


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
