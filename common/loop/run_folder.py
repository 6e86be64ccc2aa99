"""The run folder of one training: claimed before any other work, started once every check has passed, and
undone when the run was refused before it started.

    folder = RunFolder(app, cfg, output_dir, resume, force)
    claim = folder.claim(dist)     # every rank: the checks and the lock (rank 0), the same verdict everywhere
    ...                            # data, network, checkpoint: each may still refuse (nothing written yet)
    folder.start(dist, history, position, optimizer_step, resumed_from, watchdog)
                                   # started; rank 0: the attempt recorded, marker, an earlier run's checkpoints
                                   # removed (--force), config, records brought into line with the checkpoint
    folder.attempt.end_with(exc)   # how this attempt ended (None: finished), in attempts.json
    folder.close(failed)           # a refused claim leaves no trace; the lock is released

Until :meth:`RunFolder.start`, the folder holds nothing of the run but its lock file (and the folders the claim
had to create): a refusal undoes those too, so bad input leaves the folder as it was.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib

from common.config import AppConfig, save_config
from common.errors import UserInputError
from common.deferred import DeferredModule
from common.loop import attempts
from common.storage import checkpoint, outputs, run_dirs
from common.storage.transaction import OutputTransaction, Producer

log = logging.getLogger(__name__)
# Keras (its callbacks) at the first start: the folder's checks run before TensorFlow loads (common.cli).
records = DeferredModule("common.loop.records")


@dataclasses.dataclass
class Claim:
    """What :meth:`RunFolder.claim` found: the newest checkpoint (a path on rank 0), whether it belongs to an
    earlier run that ``--force`` replaces, the names this run writes in the folder and its MLPerf log."""

    latest: pathlib.Path | None
    earlier_run: bool
    names: list[str]
    mlperf_path: pathlib.Path | None
    kind: str = "run"   # run_dirs.RUN_KINDS: a lone run, or one instance of a job


def run_file_names(app, cfg: AppConfig, output_dir: pathlib.Path) -> tuple[list[str], pathlib.Path | None]:
    """(the names a run writes in its folder, the MLPerf log's path or None)."""
    names = ["config.yaml", "history.csv", "summary.json", "model.keras", "checkpoints/", attempts.ATTEMPTS_JSON]
    if cfg.train.tensorboard:
        names.append("tensorboard/")
    mlperf_path = None
    if cfg.mlperf.enabled and app.mlperf is not None:
        mlperf_path = output_dir / cfg.mlperf.log_file
        if mlperf_path.parent.resolve() == output_dir.resolve():
            names.append(mlperf_path.name)
    return names, mlperf_path


class RunFolder:
    """``output_dir`` for one training of ``app`` (module docstring)."""

    def __init__(self, app, cfg: AppConfig, output_dir, resume: bool, force: bool):
        self.app, self.cfg, self.path = app, cfg, outputs.normal_path(output_dir)
        self.resume, self.force = resume, force
        self.started = False   # set by start(): from then on a failure leaves what the run wrote
        # This process's attempt at the run (attempts.json): nothing written before start().
        self.attempt = attempts.Attempt(self.path, f"{app.name}.train", force)
        # The claim of the folder: the one output transaction's (kind and producer, the lock, what it created),
        # in its incremental form (the run commits each epoch by its checkpoint, not all at the end).
        self.producer = Producer(command=f"{app.package}.train", application=app.package)
        self._transaction: OutputTransaction | None = None
        self._claim: Claim | None = None

    @property
    def checkpoints(self) -> pathlib.Path:
        return self.path / "checkpoints"

    def claim(self, dist) -> Claim:
        """Rank 0 checks the folder and takes its lock before any other work; every rank gets the verdict (a
        refusal is the same one-line error on every rank)."""
        verdict: Claim | str = ""
        if dist.is_root:
            try:
                verdict = self._claim_on_root("instance" if dist.instances > 1 else "run")
            except UserInputError as exc:
                verdict = str(exc)
        verdict = dist.broadcast_object(verdict)
        if isinstance(verdict, str):
            raise UserInputError(verdict)
        self._claim = verdict
        return verdict

    def check(self, kind: str = "run") -> pathlib.Path | None:
        """The claim's checks that only read (the newest checkpoint found, or None).  Every rank makes them
        before TensorFlow and Horovod load (``common.cli``), so that a refused folder answers in a second
        rather than after the start-up; the claim makes them again under the folder's lock, and its verdict is
        the one that counts."""
        path, resume, force = self.path, self.resume, self.force
        outputs.check_writable_folder(path, "--output-dir")
        run_dirs.check_run_dir(path, resume, force)
        run_dirs.check_run_kind(path, kind, resume)
        latest = checkpoint.latest_checkpoint(self.checkpoints)
        if latest is not None and not resume and not force:
            raise UserInputError(f"{path}: holds checkpoints of an earlier run ({latest.name}); pass --resume to "
                                 "continue it, --force to start afresh, or choose another --output-dir")
        if latest is not None and not outputs.written_by_suite(self.checkpoints):
            raise UserInputError(f"{self.checkpoints}: holds checkpoints this suite did not mark as its own "
                                 f"({latest.name}); not {'resumed' if resume else 'removed'}: choose another "
                                 "--output-dir")
        names, mlperf_path = run_file_names(self.app, self.cfg, path)
        run_dirs.check_run_files(path, names, force)
        if mlperf_path is not None and mlperf_path.name not in names:
            self._check_external_log(mlperf_path)
        return latest

    def _claim_on_root(self, kind: str) -> Claim:
        path = self.path
        self.check(kind)
        transaction = OutputTransaction(self.producer, self.force, holder=f"{self.app.name}.train",
                                        inputs=[pathlib.Path(self.cfg.data.data_dir)])
        transaction.into(path, kind, "--output-dir", incremental=True)
        transaction.check()
        transaction.claim()   # created, locked (held until close()), checked again under the lock
        self._transaction = transaction
        for stale in checkpoint.remove_stale_temporaries(self.checkpoints):
            log.warning(f"removed {stale.name}, left by a checkpoint write that was killed")
        latest = self.check(kind)   # again, under the lock: what another process did meanwhile counts
        for stale in outputs.remove_killed_writes(path):
            log.warning(f"removed {stale.name}, left by a write that was killed")
        names, mlperf_path = run_file_names(self.app, self.cfg, path)
        return Claim(latest, latest is not None and not self.resume, names, mlperf_path, kind)

    def _check_external_log(self, log_path: pathlib.Path) -> None:
        """An MLPerf log outside the run folder must be a new file, or (``--resume``) the one this folder's
        earlier attempt created (its marker lists it)."""
        record = outputs.read_run_marker(self.path) or {}
        ours = str(log_path.resolve()) in record.get("external", [])
        if log_path.exists() and not (self.resume and ours):
            raise UserInputError(f"{log_path}: mlperf.log_file exists and was not started by this run directory's "
                                 "training; the log is appended to, so name a new file (or a relative name, inside "
                                 "the run directory)")
        outputs.check_writable_folder(log_path.parent, "the folder of mlperf.log_file")

    def start(self, dist, history: list, position: tuple[int, int], optimizer_step: int, resumed_from: str | None,
              watchdog=None) -> None:
        """Every check has passed: from here on the run writes, and a failure leaves what it wrote
        (:attr:`started`, on every rank).  Rank 0: first the attempt (so that a crash from here on leaves its
        trace; the ``watchdog``'s expiry recorded as its end, ``hung``), then the marker (listing what this run
        writes), an earlier run's checkpoints and in-folder MLPerf log removed (``--force``), the resolved config
        (the ``cfg`` this folder was made with, which the run resolves in place), and the records brought into
        line with the checkpoint the run starts from (:func:`common.loop.records.reconcile`): ``history``, the
        committed epochs' rows, up to ``position`` (epochs, steps) and ``optimizer_step`` of ``resumed_from``
        (the checkpoint's name; None: from scratch)."""
        self.started = True
        if not dist.is_root:
            return
        self.attempt.begin(self.resume, dist.size, resumed_from)
        if watchdog is not None:
            watchdog.at_expiry(lambda message: self.attempt.end("hung", message))
        cfg, claim, path = self.cfg, self._claim, self.path
        run_dirs.mark_run_dir(path, self.app.name, claim.names, kind=claim.kind, producer=self.producer.record())
        if claim.mlperf_path is not None and claim.mlperf_path.name not in claim.names:
            run_dirs.record_external(path, claim.mlperf_path)
        if claim.earlier_run:   # --force over a run of this suite: its checkpoints and log would mix with this run's
            for old in checkpoint.list_checkpoints(self.checkpoints):
                old.unlink()
            if claim.mlperf_path is not None and claim.mlperf_path.name in claim.names:   # in the run folder: ours
                claim.mlperf_path.unlink(missing_ok=True)
        save_config(cfg, path / "config.yaml", force=self.force)
        records.reconcile(path, history, position[0], optimizer_step, resumed_from or "no checkpoint",
                          cfg.train.tensorboard)

    def close(self, failed: bool) -> None:
        """Release the lock; a run that failed before :meth:`start` first removes what its claim created (the
        lock file, the folders it made, innermost first, if empty), while the lock is still held (so no other
        run can take the old lock file meanwhile)."""
        transaction, self._transaction = self._transaction, None
        if transaction is None:
            return
        if failed and not self.started:
            transaction.rollback()
        else:
            transaction.release()
