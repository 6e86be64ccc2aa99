"""MLPerf HPC logging (``mlperf-logging``), rank 0 only, behind ``mlperf.enabled``.

The log follows the HPC rules (ruleset 3.0.0): submission and system events,
``cache_clear``, ``init_start``/``init_stop``, hyper-parameters,
``run_start``, ``epoch_start``/``epoch_stop`` and ``eval_start``/``eval_stop``
with the application's quality metric every epoch, and ``run_stop`` with
status ``success`` once the target was reached (``aborted`` otherwise).
A resumed run first brings the log into line with its checkpoint
(:meth:`MlperfLog.reconcile`): it appends the events of committed epochs that
a crash kept out of the log, and names the epochs logged beyond the
checkpoint (a resumed log is a record of the run, not a compliant result).
Check a log with::

    python -m mlperf_logging.compliance_checker --usage hpc --ruleset 3.0.0 RUN/mlperf.log
"""

from __future__ import annotations

import json
import logging
import pathlib
import time

import keras
from mlperf_logging.mllog import constants
from mlperf_logging.mllog.mllog import MLLogger

log = logging.getLogger(__name__)


class MlperfLog:
    """A thin wrapper that does nothing when disabled or not on rank 0."""

    def __init__(self, path=None, enabled: bool = False):
        self.enabled = bool(enabled and path)
        self.path = pathlib.Path(path) if path else None
        self._logger = None
        if self.enabled:
            logger = logging.getLogger(f"hpc_dl_suite.mlperf.{path}")
            logger.setLevel(logging.INFO)
            logger.propagate = False
            for earlier in list(logger.handlers):   # an earlier MlperfLog of this file in this process
                logger.removeHandler(earlier)
                earlier.close()
            handler = logging.FileHandler(str(path), mode="a")
            handler.setFormatter(logging.Formatter("%(message)s"))
            logger.addHandler(handler)
            self._logger = MLLogger(logger=logger, default_stack_offset=2)

    def event(self, key, value=None, metadata=None, time_ms=None):
        if self.enabled:
            self._logger.event(key=key, value=value, metadata=metadata, time_ms=time_ms)

    def start(self, key, value=None, metadata=None, time_ms=None):
        if self.enabled:
            self._logger.start(key=key, value=value, metadata=metadata, time_ms=time_ms)

    def end(self, key, value=None, metadata=None, time_ms=None):
        if self.enabled:
            self._logger.end(key=key, value=value, metadata=metadata, time_ms=time_ms)

    def reconcile(self, history: list[dict], source: str, epochs_completed: int, step_in_epoch: int,
                  metric_key: str, logs_key: str) -> None:
        """Before a resumed run's first event: the log made to agree with the checkpoint it resumes
        (``source``; ``history``: its committed rows).  An epoch it committed whose ``epoch_stop`` (and
        evaluation) the log lacks (a crash between the checkpoint and the log) gets them now, with the time the
        epoch ended and ``restored_from`` in their metadata; then a ``resumed_from_checkpoint`` event names the
        checkpoint and the epochs the log holds beyond it (``superseded_epochs``: logged after a checkpoint
        that was lost; they are trained and logged again)."""
        if not self.enabled:
            return
        stopped, evaluated = self._logged_epochs()
        restored = []
        for row in history:
            number = row["epoch"] + 1
            if number in stopped:
                continue
            when = int(row["time_unix"] * 1000) if row.get("time_unix") else None
            metadata = {"epoch_num": number, "restored_from": source}
            self.end(constants.EPOCH_STOP, metadata=metadata, time_ms=when)
            if logs_key in row["logs"] and number not in evaluated:
                self.start(constants.EVAL_START, metadata=metadata, time_ms=when)
                self.event(metric_key, row["logs"][logs_key], metadata=metadata, time_ms=when)
                self.end(constants.EVAL_STOP, metadata=metadata, time_ms=when)
            restored.append(number)
        superseded = sorted(n for n in stopped if n > epochs_completed)
        self.event("resumed_from_checkpoint", source, metadata={
            "epochs_completed": epochs_completed, "step_in_epoch": step_in_epoch, "restored_epochs": restored,
            "superseded_epochs": superseded})
        if restored or superseded:
            said = [f"restored epoch(s) {restored} from {source}"] if restored else []
            if superseded:
                said.append(f"epoch(s) {superseded} were logged after a checkpoint this run does not continue: they "
                            "are logged again (resumed_from_checkpoint says so)")
            log.warning(f"{self.path}: " + "; ".join(said))

    def _logged_epochs(self) -> tuple[set[int], set[int]]:
        """(epochs with an epoch_stop, epochs with an eval_stop) in the log so far, less those an earlier
        ``resumed_from_checkpoint`` superseded; a last line cut short by a crash is ended, so that the next
        event starts a line of its own."""
        stopped, evaluated = set(), set()
        try:
            text = self.path.read_bytes().decode(errors="replace")
        except FileNotFoundError:
            return stopped, evaluated
        if text and not text.endswith("\n"):
            with open(self.path, "a") as handle:
                handle.write("\n")
        for line in text.splitlines():
            if not line.startswith(":::MLLOG "):
                continue
            try:
                record = json.loads(line[len(":::MLLOG "):])
                key, metadata = record.get("key"), record.get("metadata") or {}
                if key == "resumed_from_checkpoint":
                    committed = int(metadata["epochs_completed"])
                    stopped = {n for n in stopped if n <= committed}
                    evaluated = {n for n in evaluated if n <= committed}
                elif key in (constants.EPOCH_STOP, constants.EVAL_STOP):
                    (stopped if key == constants.EPOCH_STOP else evaluated).add(int(metadata["epoch_num"]))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
        return stopped, evaluated

    def submission(self, cfg_mlperf, benchmark: str, num_nodes: int) -> None:
        self.event(constants.SUBMISSION_BENCHMARK, benchmark)
        self.event(constants.SUBMISSION_ORG, cfg_mlperf.submission_org)
        self.event(constants.SUBMISSION_DIVISION, cfg_mlperf.submission_division)
        self.event(constants.SUBMISSION_STATUS, cfg_mlperf.submission_status)
        self.event(constants.SUBMISSION_PLATFORM, cfg_mlperf.submission_platform)
        self.event("number_of_nodes", num_nodes)
        self.event("accelerators_per_node", cfg_mlperf.accelerators_per_node)
        self.event(constants.CACHE_CLEAR, True)


class MlperfCallback(keras.callbacks.Callback):
    """Epoch, evaluation and run events from inside ``fit``.

    Args:
        log: the :class:`MlperfLog`.
        metric_key: the log key of the quality metric (``eval_error``...).
        logs_key: where it is in Keras' epoch logs (``val_mae``...).
        target: the quality target; reached when ``value <= target``
            (or ``>=`` with ``higher_is_better``).
    """

    def __init__(self, log: MlperfLog, metric_key: str, logs_key: str, target: float,
                 higher_is_better: bool = False):
        super().__init__()
        self.log = log
        self.metric_key = metric_key
        self.logs_key = logs_key
        self.target = target
        self.higher_is_better = higher_is_better
        self.reached = False
        self.run_start_unix: float | None = None
        self.reached_after_s: float | None = None   # run_start to the end of the first evaluation on target
        self._started = False
        self._finished = False

    def restore(self, history: list[dict]) -> None:
        """A resumed run: whether an epoch its checkpoint committed reached the target (``reached_after_s``
        stays None: it counts from this attempt's run_start)."""
        values = [row["logs"][self.logs_key] for row in history if self.logs_key in row["logs"]]
        self.reached = any(self._hit(value) for value in values)

    def _hit(self, value: float) -> bool:
        return value >= self.target if self.higher_is_better else value <= self.target

    def on_train_begin(self, logs=None):
        # A run may take several fit calls (mid-epoch resume): the run starts once.
        if not self._started:
            self.log.end(constants.INIT_STOP)
            self.log.start(constants.RUN_START)
            self.run_start_unix = time.time()
            self._started = True

    def on_epoch_begin(self, epoch, logs=None):
        self.log.start(constants.EPOCH_START, metadata={"epoch_num": epoch + 1})

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        self.log.end(constants.EPOCH_STOP, metadata={"epoch_num": epoch + 1})
        if self.logs_key in logs:
            value = float(logs[self.logs_key])
            self.log.start(constants.EVAL_START, metadata={"epoch_num": epoch + 1})
            self.log.event(self.metric_key, value, metadata={"epoch_num": epoch + 1})
            self.log.end(constants.EVAL_STOP, metadata={"epoch_num": epoch + 1})
            hit = self._hit(value)
            if hit and not self.reached:
                self.reached_after_s = time.time() - self.run_start_unix
            self.reached = self.reached or hit

    def finish(self, aborted: bool = False):
        """``run_stop``, once, when the trainer is done (not at the end of each fit)."""
        if self._finished or not self._started:
            return
        status = "success" if self.reached and not aborted else "aborted"
        self.log.end(constants.RUN_STOP, metadata={"status": status})
        self._finished = True
