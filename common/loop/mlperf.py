"""MLPerf HPC logging (``mlperf-logging``), rank 0 only, behind ``mlperf.enabled``.

The log follows the HPC rules (ruleset 3.0.0): submission and system events,
``cache_clear``, ``init_start``/``init_stop``, hyper-parameters,
``run_start``, ``epoch_start``/``epoch_stop`` and ``eval_start``/``eval_stop``
with the application's quality metric every epoch, and ``run_stop`` with
status ``success`` once the target was reached (``aborted`` otherwise).
Check a log with::

    python -m mlperf_logging.compliance_checker --usage hpc --ruleset 3.0.0 RUN/mlperf.log
"""

from __future__ import annotations

import logging
import time

import keras
from mlperf_logging.mllog import constants
from mlperf_logging.mllog.mllog import MLLogger


class MlperfLog:
    """A thin wrapper that does nothing when disabled or not on rank 0."""

    def __init__(self, path=None, enabled: bool = False):
        self.enabled = bool(enabled and path)
        self._logger = None
        if self.enabled:
            logger = logging.getLogger(f"hpc_dl_suite.mlperf.{path}")
            logger.setLevel(logging.INFO)
            logger.propagate = False
            handler = logging.FileHandler(str(path), mode="a")
            handler.setFormatter(logging.Formatter("%(message)s"))
            logger.addHandler(handler)
            self._logger = MLLogger(logger=logger, default_stack_offset=2)

    def event(self, key, value=None, metadata=None):
        if self.enabled:
            self._logger.event(key=key, value=value, metadata=metadata)

    def start(self, key, value=None, metadata=None, time_ms=None):
        if self.enabled:
            self._logger.start(key=key, value=value, metadata=metadata, time_ms=time_ms)

    def end(self, key, value=None, metadata=None):
        if self.enabled:
            self._logger.end(key=key, value=value, metadata=metadata)

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
            hit = value >= self.target if self.higher_is_better else value <= self.target
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
