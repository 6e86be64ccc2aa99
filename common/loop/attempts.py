"""How each attempt of a run ended: ``attempts.json`` in the run directory.

A run can take several attempts: a job requeued after a preemption (exit 75) or a lost node, a user's
``--resume``.  Rank 0 records each attempt when the run directory is started (status ``running``, with the
host, the pid, SLURM's job id and restart count, the checkpoint it resumes) and again when the attempt ends:

====================  ==========================================================
``finished``          exit 0
``preempted``         exit 75: a checkpoint was saved at a step boundary
``non-finite``        exit 3: a NaN/Inf loss, gradient or weight
``hung``              exit 4: the watchdog saw no progress (a rank or node lost)
``bad-input``         exit 2: a data or config error met while training
``failed``            exit 1: an exception
``interrupted``       Ctrl-C or another interruption of the process
``vanished``          no end recorded: the process was killed (SIGKILL, the out-of-memory killer, a job
                      cancelled past its grace time) or its node was lost with it
====================  ==========================================================

An attempt that dies without a word leaves ``running`` behind; the next attempt calls it ``vanished``, says
when the run directory last saw it (its newest checkpoint, record or launch log), and says which of SLURM's
restarts of the job left no record at all (they ended before the run directory was started).  Each new attempt logs how the
previous one ended, and ``summary.json`` lists the attempts before the one that finished.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import pathlib
import socket
import time

from common.errors import (EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_HUNG, EXIT_INTERRUPTED, EXIT_NONFINITE, EXIT_PREEMPTED,
                           NonFiniteLoss, Preempted, UserInputError)
from common.storage import outputs

log = logging.getLogger(__name__)

ATTEMPTS_JSON = "attempts.json"
ENDINGS = {  # status: (exit code, what the next attempt says of it)
    "finished": (0, "finished"),
    "preempted": (EXIT_PREEMPTED, "was preempted and saved a checkpoint"),
    "non-finite": (EXIT_NONFINITE, "stopped on a NaN or Inf"),
    "hung": (EXIT_HUNG, "was ended by its watchdog"),
    "bad-input": (EXIT_BAD_INPUT, "stopped on bad input"),
    "failed": (EXIT_FAILURE, "failed"),
    "interrupted": (None, "was interrupted"),
}


def _iso(unix: float | None) -> str | None:
    return datetime.datetime.fromtimestamp(unix).isoformat(timespec="seconds") if unix is not None else None


def _slurm_restart_count() -> int | None:
    """SLURM's restart count of the job (SLURM sets it from the first requeue on: 0 before), None outside SLURM."""
    value = os.environ.get("SLURM_RESTART_COUNT", "").strip()
    if value.isdigit():
        return int(value)
    return 0 if os.environ.get("SLURM_JOB_ID") else None


def ending_of(exc: BaseException | None) -> str:
    """The status an attempt that ended with ``exc`` (None: returned normally) records."""
    if exc is None:
        return "finished"
    for kind, status in ((Preempted, "preempted"), (NonFiniteLoss, "non-finite"), (UserInputError, "bad-input"),
                         (Exception, "failed")):
        if isinstance(exc, kind):
            return status
    return "interrupted"


class Attempt:
    """This process's attempt at a run directory.  Nothing is written until :meth:`begin` (rank 0, once the
    run has passed its checks); :meth:`end` after that records how it ended (at most once)."""

    def __init__(self, run_dir, tool: str, force: bool = False):
        self.path = pathlib.Path(run_dir) / ATTEMPTS_JSON
        self.tool = tool
        self.force = force   # --force: a file of that name that is not the suite's is replaced (the claim said so)
        self.attempts: list[dict] | None = None   # the record, once begun

    @property
    def number(self) -> int | None:
        return len(self.attempts) if self.attempts else None

    @property
    def previous(self) -> list[dict]:
        """The attempts before this one, as recorded (a vanished one as such)."""
        return list(self.attempts[:-1]) if self.attempts else []

    def begin(self, resume: bool, ranks: int, resumed_from: str | None) -> None:
        """Record this attempt as running; with ``resume``, after the earlier attempts of the run (the last one
        called ``vanished`` when it recorded no end) and log how the last one ended."""
        attempts = self._read() if resume else []
        if attempts and attempts[-1].get("status") == "running":
            attempts[-1].update(status="vanished", exit_code=None, last_seen=_iso(self._last_seen(attempts[-1])))
        restart = _slurm_restart_count()
        job = os.environ.get("SLURM_JOB_ID")
        now = time.time()
        current = {"attempt": len(attempts) + 1, "status": "running", "exit_code": None, "reason": None,
                   "started": _iso(now), "started_unix": now, "ended": None, "ended_unix": None,
                   "host": socket.gethostname(), "pid": os.getpid(), "ranks": ranks, "slurm_job_id": job,
                   "slurm_restart_count": restart, "resumed_from": resumed_from}
        self._say(attempts, current)
        self.attempts = attempts + [current]
        self._write()

    def end_with(self, exc: BaseException | None) -> None:
        """Record the end of an attempt that ``exc`` ended (None: it finished)."""
        reason = None
        if exc is not None:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        # An interruption's code is the one the process ends with: Ctrl-C's 130, a SystemExit's own (SIGTERM's 143).
        code = EXIT_INTERRUPTED if isinstance(exc, KeyboardInterrupt) else (
            exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else None)
        self.end(ending_of(exc), reason, exit_code=code)

    def end(self, status: str, reason: str | None = None, exit_code: int | None = None) -> None:
        """Record how this attempt ended (a status of :data:`ENDINGS`, with its exit code unless ``exit_code``
        gives an interruption's); nothing before :meth:`begin` or after an earlier end."""
        if not self.attempts or self.attempts[-1]["status"] != "running":
            return
        now = time.time()
        code = ENDINGS[status][0] if ENDINGS[status][0] is not None else exit_code
        self.attempts[-1].update(status=status, exit_code=code, reason=reason and reason[:500],
                                 ended=_iso(now), ended_unix=now)
        self._write()

    def _read(self) -> list[dict]:
        if not self.path.is_file() or not outputs.written_by_suite(self.path):
            return []
        try:
            record = json.loads(self.path.read_text())
        except (OSError, ValueError):
            log.warning(f"{self.path}: not readable; the earlier attempts of this run are not known")
            return []
        attempts = record.get("attempts") if isinstance(record, dict) else None
        return [a for a in attempts if isinstance(a, dict)] if isinstance(attempts, list) else []

    def _write(self) -> None:
        outputs.write_json(self.path, {"attempts": self.attempts}, self.tool, force=self.force)

    def _last_seen(self, attempt: dict) -> float | None:
        """When the run directory last saw a vanished attempt: the newest of its checkpoints, records and
        launch log (slurm/launch.sh's, which holds its output)."""
        run_dir = self.path.parent
        written = [*(run_dir / "checkpoints").glob("ckpt-*"), run_dir / "history.csv",
                   *run_dir.glob("tensorboard/*/*tfevents*")]
        if attempt.get("slurm_restart_count") is not None:
            written.append(run_dir / f"train.restart-{attempt['slurm_restart_count']}.log")
        started = attempt.get("started_unix") or 0
        times = []
        for path in written:
            try:
                times.append(path.stat().st_mtime)
            except OSError:
                continue
        times = [t for t in times if t >= started]
        return max(times) if times else None

    def _say(self, attempts: list[dict], current: dict) -> None:
        """One line on how the previous attempt ended (and SLURM restarts that left no record)."""
        restart = current["slurm_restart_count"]
        this = f"attempt {current['attempt']} of this run" + (f" (SLURM restart {restart} of job "
                                                                f"{current['slurm_job_id']})" if restart else "")
        if not attempts:
            if restart:
                log.warning(f"{this}: {self.path} records no earlier attempt (SLURM restarted the job {restart} "
                            "time(s): the earlier ones ended before their run directory was started)")
            return
        last = attempts[-1]
        status = last.get("status")
        when = f"started {last.get('started')} on {last.get('host')}, pid {last.get('pid')}"
        if status == "vanished":
            seen = f"; last seen {last['last_seen']}" if last.get("last_seen") else ""
            line = (f"{this}: the previous attempt ({when}) vanished without recording its end: it was killed or "
                    f"its node was lost{seen}")
        else:
            told = ENDINGS.get(status, (None, status))[1]
            code = f" (exit {last.get('exit_code')})" if last.get("exit_code") is not None else ""
            reason = f": {last['reason']}" if last.get("reason") else ""
            line = f"{this}: the previous attempt ({when}) {told}{code} at {last.get('ended')}{reason}"
        before = last.get("slurm_restart_count")
        if restart is not None and before is not None and restart - before > 1 \
                and last.get("slurm_job_id") == current["slurm_job_id"]:
            line += (f"; SLURM restart(s) {_restarts_between(before, restart)} of the job left no record (they ended "
                     "before their run directory was started)")
        (log.info if status in ("finished", "preempted") else log.warning)(line)


def _restarts_between(before: int, now: int) -> str:
    first, last = before + 1, now - 1
    return str(first) if first == last else f"{first}-{last}"
