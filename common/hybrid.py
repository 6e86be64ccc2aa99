"""Hybrid data parallelism (SC17): synchronous groups, asynchronous across groups.

With ``distributed.groups: G`` the ranks form G groups of contiguous ranks.
Inside a group, gradients are averaged every step (the normal synchronous
step, over the group's Horovod process set), so a group's ranks hold
identical weights.  Across groups, every ``distributed.exchange_every`` (K)
steps each group leader snapshots its weights and starts averaging the
snapshot with the other leaders in a background thread; its group keeps
training.  When the exchange has completed (at the latest K - 1 steps later:
bounded staleness), the leader applies it at a step boundary, keeping its own
progress since the snapshot,

    w <- mean_over_groups(snapshot) + (w - snapshot),

and broadcasts the result to its group.  A slow group therefore delays the
others only when it is more than K - 1 steps behind.  At the end of training
the weights are averaged over all ranks, so the saved model is the consensus.

When to use it: many nodes where stragglers or a slow interconnect make every
step wait for the slowest rank.  Groups of a few nodes keep most of the
synchronous convergence; K trades staleness for communication.  G = 1 is the
fully synchronous mode.  Epoch ends (metric and batch-norm averaging,
checkpoints) remain global synchronisation points.
"""

from __future__ import annotations

import keras
import numpy as np

from common.loop.callbacks import state_variables
from common.distributed import Distributed
from common.loop.reliability import StepSignals


class GroupExchange(keras.callbacks.Callback):
    """Periodic, non-blocking weight averaging across groups (see the module docstring)."""

    def __init__(self, dist: Distributed, signals: StepSignals, exchange_every: int):
        super().__init__()
        self.dist = dist
        self.signals = signals
        self.every = exchange_every
        self.step = 0
        self.round = 0
        self.future = None
        self.snapshot = None
        self.snapshot_step = 0
        self.applied_at: list[int] = []

    def _variables(self):
        return [v for v in state_variables(self.model) if "float" in str(v.dtype)]

    def on_train_batch_begin(self, batch, logs=None):
        if not (self.dist.is_group_leader and self.future is not None):
            return
        last_chance = self.step - self.snapshot_step >= self.every - 1
        if self.future.done() or last_chance:
            self.future.result()   # blocks only at the staleness bound
            self.signals.exchange_ready.assign(1.0)

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        if float(self.signals.group_exchange_ready.numpy()) > 0:
            self._apply()
        if self.step % self.every == 0 and self.dist.is_group_leader and self.future is None:
            self.snapshot = [np.asarray(v).copy() for v in self._variables()]
            self.snapshot_step = self.step
            self.future = self.dist.start_leader_average(self.snapshot, name=f"group_exchange_{self.round}")
            self.round += 1

    def _apply(self):
        variables = self._variables()
        if self.dist.is_group_leader and self.future is not None:
            averaged = self.future.result()
            for variable, mean, snapshot in zip(variables, averaged, self.snapshot):
                variable.assign(mean + (np.asarray(variable) - snapshot))
            self.signals.exchange_ready.assign(0.0)
            self.future = None
        self.signals.group_exchange_ready.assign(0.0)
        self.dist.broadcast_in_group(variables)
        self.applied_at.append(self.step)

    def on_train_end(self, logs=None):
        # Finish the exchange in flight (every leader has one of the same round, or none), then
        # average over all ranks: the saved model is the consensus.
        if self.dist.is_group_leader and self.future is not None:
            self.future.result()
            self.signals.exchange_ready.assign(1.0)
        pending = self.dist.allreduce(np.float32(self.future is not None), average=False, name="exchange_pending")
        if float(pending) > 0:
            self._apply()
        for variable in self._variables():
            variable.assign(self.dist.allreduce(variable.value, average=True,
                                                name=f"consensus_{variable.path.replace('/', '_')}"))
