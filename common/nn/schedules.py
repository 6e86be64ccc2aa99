"""Learning-rate schedule: linear warmup, then step, polynomial or cosine decay.

One place decides the learning rate: :class:`WarmupDecay`, evaluated by the
optimizer at every step from its ``iterations`` counter (so resuming from a
checkpoint that restores ``iterations`` resumes the schedule too).
"""

from __future__ import annotations

import math

import keras
from keras import ops

from common.config import ScheduleSection


@keras.saving.register_keras_serializable(package="common")
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Learning rate as a function of the global step (0-based).

    Args:
        peak_learning_rate: LR reached at the end of warmup.
        steps_per_epoch: optimizer steps in one epoch (for epoch boundaries).
        warmup_steps: length of the linear warmup; ``lr(s) = start + (peak -
            start) * s / warmup_steps`` for ``s < warmup_steps``.
        warmup_start_learning_rate: LR at step 0 of the warmup.
        decay: ``none``, ``step``, ``polynomial`` or ``cosine``.
        decay_boundaries: step decay, ``{epoch: factor}``: from that epoch on
            the LR is ``peak * factor`` (the factor of the largest boundary
            passed applies).
        decay_steps: polynomial/cosine, steps after warmup to reach the end LR.
        end_factor: polynomial/cosine, end LR as a fraction of the peak.
        power: polynomial exponent.
    """

    def __init__(self, peak_learning_rate, steps_per_epoch, warmup_steps=0, warmup_start_learning_rate=0.0,
                 decay="none", decay_boundaries=None, decay_steps=None, end_factor=0.0, power=1.0):
        if decay not in ("none", "step", "polynomial", "cosine"):
            raise ValueError(f"decay must be none, step, polynomial or cosine, got {decay!r}")
        if decay in ("polynomial", "cosine") and not decay_steps:
            raise ValueError(f"{decay} decay needs decay_steps > 0")
        self.peak_learning_rate = float(peak_learning_rate)
        self.steps_per_epoch = int(steps_per_epoch)
        self.warmup_steps = int(warmup_steps)
        self.warmup_start_learning_rate = float(warmup_start_learning_rate)
        self.decay = decay
        self.decay_boundaries = {int(k): float(v) for k, v in (decay_boundaries or {}).items()}
        self.decay_steps = int(decay_steps) if decay_steps else None
        self.end_factor = float(end_factor)
        self.power = float(power)

    def __call__(self, step):
        step = ops.cast(step, "float32")
        peak = self.peak_learning_rate
        lr = ops.ones_like(step) * peak
        if self.decay == "step":
            epoch = ops.floor(step / self.steps_per_epoch)
            factor = ops.ones_like(step)
            for boundary in sorted(self.decay_boundaries):
                factor = ops.where(epoch >= boundary, self.decay_boundaries[boundary], factor)
            lr = peak * factor
        elif self.decay in ("polynomial", "cosine"):
            end = peak * self.end_factor
            progress = ops.clip((step - self.warmup_steps) / self.decay_steps, 0.0, 1.0)
            if self.decay == "polynomial":
                lr = end + (peak - end) * ops.power(1.0 - progress, self.power)
            else:
                lr = end + (peak - end) * 0.5 * (1.0 + ops.cos(math.pi * progress))
        if self.warmup_steps > 0:
            start = self.warmup_start_learning_rate
            warm = start + (peak - start) * step / self.warmup_steps
            lr = ops.where(step < self.warmup_steps, warm, lr)
        return lr

    def get_config(self):
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "steps_per_epoch": self.steps_per_epoch,
            "warmup_steps": self.warmup_steps,
            "warmup_start_learning_rate": self.warmup_start_learning_rate,
            "decay": self.decay,
            "decay_boundaries": self.decay_boundaries,
            "decay_steps": self.decay_steps,
            "end_factor": self.end_factor,
            "power": self.power,
        }


def build_schedule(cfg: ScheduleSection, base_learning_rate: float, peak_learning_rate: float,
                   steps_per_epoch: int, epochs: int) -> WarmupDecay:
    """The schedule the config describes, in steps."""
    if cfg.warmup_epochs > 0:
        warmup_steps = int(round(cfg.warmup_epochs * steps_per_epoch))
    else:
        warmup_steps = cfg.warmup_steps
    decay_steps = None
    if cfg.decay in ("polynomial", "cosine"):
        if cfg.decay_epochs is not None:
            decay_steps = int(round(cfg.decay_epochs * steps_per_epoch))
        else:
            decay_steps = epochs * steps_per_epoch - warmup_steps
        decay_steps = max(1, decay_steps)
    start = base_learning_rate if cfg.warmup_start == "base" else 0.0
    return WarmupDecay(peak_learning_rate, steps_per_epoch, warmup_steps=warmup_steps,
                       warmup_start_learning_rate=start, decay=cfg.decay,
                       decay_boundaries=cfg.decay_boundaries, decay_steps=decay_steps,
                       end_factor=cfg.end_factor, power=cfg.power)
