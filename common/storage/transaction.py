"""One way out: everything a command writes, written as one transaction.

Every command of the suite that writes files goes through an :class:`OutputTransaction`::

    txn = OutputTransaction(producer, force=args.force, inputs=paths_read)
    txn.into(out, kind="predictions", option="--out")   # a folder of the suite's (or none: loose files)
    txn.check(names)          # reading only, before any work: the folder, its kind and producer, every name
    with txn:                 # the claim: locked, checked again under the lock, missing parents created
        with txn.reading(path):                # what the next outputs are made from (named when a value is
            txn.json("a.json", payload)        #   not finite); each output written whole under a temporary
            txn.figure(figure, "a.png")        #   name, nothing in place yet
    # the commit: every output renamed into place, then the folder's marker (its index: who made it, every
    # file it holds) in one step; any exception or signal before that restores the folder as it was found

What holds, for every command that writes this way:

- **Claimed before any work.**  A folder of the suite's (``into``) has a kind (:data:`common.storage.run_dirs.
  RUN_KINDS`: a training run, predictions, a bench's profile, ...) and a producer (:class:`Producer`: the
  command, its application, the run and model it applied).  A folder of another kind, application or producer
  is refused before any work, ``--force`` or not; a rerun of the same producer replaces what it wrote before,
  and afterwards every file in the folder is one its marker lists (the earlier run's files the rerun did not
  write again go).  A folder holding files the suite did not write is refused.  Files written into a
  training's run folder by another command of its application (``evaluate``, ``--json`` of a tool) are that
  command's *contribution*, listed under its name in the run's marker.
- **Loose files** (``--json``, ``--png``, ``--out FILE`` into a folder that is not the suite's): each name is
  absent, a file the same command wrote (its own ``written_by`` mark), or ``--force`` replaces it.
- **Whole or not at all.**  Outputs are staged (a temporary name, flushed); nothing is in place until the
  commit.  The commit runs with SIGINT and SIGTERM held back (a signal arriving then is acted on once it is
  complete), and an error inside it (a failed rename) puts back what it had replaced.  Before the commit a
  failure, an exception or a signal (SIGTERM ends the block as Ctrl-C does) removes the staged files, the
  lock file and the parent folders the claim created: the folder tree is as it was found.  A process killed
  outright (SIGKILL, a lost node) leaves its staging folder, holding a journal when it died mid-commit: the
  next claim of the folder rolls it back and removes it.
- **No output is an input.**  An output's path may not be, by file identity (links followed), one the command
  reads (``inputs``).
- **Finite values.**  Numbers written (JSON, CSV, ``.npz``, HDF5 and netCDF datasets) are checked: a NaN or
  an infinity is :class:`common.errors.NonFiniteOutput` (exit 3) naming the input it came from, and nothing
  is written.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import fcntl
import json
import logging
import math
import os
import pathlib
import re
import shutil
import signal
import sys
import tempfile
import threading
from typing import Callable, Iterable

import numpy as np
import yaml

from common import _moved
from common.deferred import h5py
from common.errors import NonFiniteOutput, Terminated, UserInputError
from common.storage import outputs, run_dirs
from common.storage.scratch import remove_if_abandoned

log = logging.getLogger(__name__)

# -- who made a folder ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Producer:
    """Who writes a command's outputs: what a folder's marker records, and what a later command into the same
    folder must match to replace them.

    ``command`` is the module run (``cosmoflow.predict``); ``application`` the registered application whose
    science it is ("" for the engine's tools); ``run`` and ``model_sha256`` the trained run it applied, when it
    applies one; ``data`` the data folder or inputs it read (recorded, not compared: a rerun on other inputs
    replaces)."""

    command: str
    application: str | None = ""
    run: str | None = None
    model_sha256: str | None = None
    data: str | None = None

    IDENTITY = ("command", "application", "run", "model_sha256")

    def record(self) -> dict:
        return {**dataclasses.asdict(self), "argv": list(sys.argv)}

    def describe(self) -> str:
        """``cosmoflow.predict of the run R (model sha256 1a2b3c4d...)``."""
        said = self.command
        if self.run:
            said += f" of the run {self.run}"
        if self.model_sha256:
            said += f" (model sha256 {self.model_sha256[:12]}...)"
        return said

    @classmethod
    def of_record(cls, record: dict | None, marker: dict | None = None) -> "Producer | None":
        """The producer a marker records (a marker written before producers were recorded: its ``written_by``
        says the command; application, run and model unknown)."""
        if isinstance(record, dict) and isinstance(record.get("command"), str):
            return cls(**{key: record.get(key) for key in ("command", "application", "run", "model_sha256",
                                                           "data")})
        written = str((marker or {}).get(outputs.WRITTEN_BY, ""))
        if written.startswith(outputs.SUITE + " "):
            return cls(command=written[len(outputs.SUITE) + 1:].split()[0], application=None)
        return None

    def differs(self, other: "Producer", keys=IDENTITY) -> list[str]:
        """The identity fields in which ``other`` differs from this one (a field either side does not know, an
        older marker's run or model, is not counted)."""
        return [key for key in keys if getattr(self, key) is not None and getattr(other, key) is not None
                and getattr(self, key) != getattr(other, key)]


# -- staging and fault points ----------------------------------------------------------------------------------

STAGING_PREFIX = ".hpc-dl-suite-txn."
STAGING_LOCK = "lock"
JOURNAL = "journal.json"
# What a claimed folder may hold besides the files its marker lists.
SUITE_ENTRIES = (outputs.RUN_MARKER, outputs.RUN_LOCK)

# Fault injection for the contract test (tests/test_contract.py): called with the phase and what it concerns:
# "claimed"; "payload" (the values about to be written: a JSON payload, CSV rows, arrays), "written" (the
# temporary file just written, before its numbers are checked), "staged" and "commit" (an output's name).  A hook
# may raise, send this process a signal, or change the values.  None in production.
fault_hook: Callable[[str, object], None] | None = None


def fault(phase: str, what: object = "") -> None:
    """A fault point (:data:`fault_hook`)."""
    if fault_hook is not None:
        fault_hook(phase, what)


_fault = fault


# What the last transaction of this process did, for the one line a command prints when it is interrupted.
last_outcome = ""


def _staging_pattern() -> re.Pattern:
    return re.compile(re.escape(STAGING_PREFIX) + r"[0-9a-f]{8}_[0-9]+\.[A-Za-z0-9_]+")


@contextlib.contextmanager
def signals_held():
    """SIGINT and SIGTERM held back for the block: a signal arriving then is recorded, and acted on (its handler
    called) once the block has ended.  Python-level handlers, not the thread's signal mask: a process-directed
    signal may be delivered to any thread (TensorFlow's among them), but Python runs its handlers in the main
    thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {number: signal.signal(number, lambda signum, frame: pending.append(signum))
                for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if pending:
            handler = previous[pending[0]]
            if callable(handler):
                handler(pending[0], None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(pending[0])


@contextlib.contextmanager
def terminate_as_interrupt():
    """SIGTERM (``kill``, a batch system's cancel) ends the block as Ctrl-C does, by an exception
    (:class:`common.errors.Terminated`), so that what the block started is undone on the way out; only where
    SIGTERM would otherwise end the process at once (the default handler, the main thread)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def terminate(signum, frame):
        raise Terminated(signum)

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


# -- finite values ---------------------------------------------------------------------------------------------

def first_nonfinite(value, where: str = "") -> str | None:
    """Where the first NaN or infinity in a JSON-like ``value`` (dicts, lists, numbers, numpy arrays) sits, as
    a key path (``volumes[3].predicted.H0``); None when every number is finite."""
    if isinstance(value, (bool, str, type(None))):
        return None
    if isinstance(value, (float, int, np.floating, np.integer)):
        return None if math.isfinite(float(value)) else (where or "the value")
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "fc" and not np.all(np.isfinite(value)):
            index = tuple(int(i) for i in np.argwhere(~np.isfinite(value))[0])
            return f"{where}{list(index)}"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = first_nonfinite(item, f"{where}.{key}" if where else str(key))
            if found:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = first_nonfinite(item, f"{where}[{i}]")
            if found:
                return found
    return None


def nonfinite_in_file(path: pathlib.Path) -> str | None:
    """The first dataset of an HDF5 or netCDF-4 file (by its bytes, whatever its name) holding a NaN or an
    infinity, or None; other files: None."""
    try:
        if not h5py.is_hdf5(path):
            return None
    except OSError:
        return None
    found = []

    def visit(name, item):
        if found or not isinstance(item, h5py.Dataset) or item.dtype.kind not in "fc" or item.size == 0:
            return
        if not item.shape:
            if not np.all(np.isfinite(item[()])):
                found.append(name)
            return
        rows = max(1, (1 << 22) // max(1, item.size // item.shape[0]))   # about 4 M values a read
        for start in range(0, item.shape[0], rows):
            if not np.all(np.isfinite(item[start:start + rows])):
                found.append(name)
                return

    with h5py.File(path, "r") as handle:
        handle.visititems(visit)
    return found[0] if found else None


# -- the claim of a folder -------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Claim:
    """One folder a transaction writes into as the suite's: its kind, whether it owns the folder or adds its
    files to a training's (a contribution), the lock and what the claim created."""

    folder: pathlib.Path
    kind: str
    option: str
    contribution: bool = False
    incremental: bool = False   # a training's run folder: its files are committed as the run goes (each epoch)
    lock: run_dirs.RunDirLock | None = None
    created: list[pathlib.Path] = dataclasses.field(default_factory=list)   # lock file, then parents (innermost first)
    staging: pathlib.Path | None = None
    staging_fd: int | None = None
    marker_before: bytes | None = None
    marker_times: tuple[int, int] | None = None


class OutputTransaction:
    """The outputs of one command (module docstring).  ``producer``: who writes them; ``force``: a user's file
    at an output name may be replaced; ``inputs``: what the command reads (no output may be one of them)."""

    def __init__(self, producer: Producer, force: bool = False, inputs: Iterable = (), holder: str = "",
                 how: str = "pass --force to replace it"):
        self.producer = producer
        self.how = how   # what a refusal of a file at an output name says to do
        self.holder = holder or producer.command   # what the folder's lock file names as its holder
        self.force = force
        self.inputs = [pathlib.Path(p) for p in inputs]
        self.claims: dict[pathlib.Path, _Claim] = {}
        self.owned: _Claim | None = None   # the folder it owns (predictions, a profile), if any
        self.home: _Claim | None = None    # the folder ``into`` named: relative output names are in it
        self.staged: dict[pathlib.Path, pathlib.Path] = {}   # destination -> its staged temporary
        self.source: str | None = None   # the input the outputs being written come from
        self.made: list[pathlib.Path] = []   # folders made for loose files (removed again by a rollback)
        self.options: dict[pathlib.Path, str] = {}   # output -> the option that names it (for messages)
        self.state = "open"   # open -> claimed -> committed | rolled back
        self._sigterm = None

    # -- declaring where ----------------------------------------------------------------------------------

    def into(self, folder, kind: str, option: str, contribution: bool = False,
             incremental: bool = False) -> "OutputTransaction":
        """Write into ``folder`` as the suite's folder of ``kind`` (``option``: the command's option naming it,
        for messages), owning it, or (``contribution``) adding this command's files to a training's run
        folder.  ``incremental``: a training's run folder, claimed here (kind and producer, lock, what the claim
        created undone on a refusal) but written as the run goes, each file atomically and each epoch committed
        by its checkpoint (:class:`common.loop.run_folder.RunFolder` makes the run's own checks of what it
        holds)."""
        folder = outputs.normal_path(folder)
        claim = _Claim(folder, kind, option, contribution, incremental)
        self.claims[self._key(folder)] = claim
        self.home = claim
        if not contribution:
            self.owned = claim
        return self

    @staticmethod
    def _key(folder: pathlib.Path) -> pathlib.Path:
        return outputs.normal_path(folder)

    def destination(self, name) -> pathlib.Path:
        """An output's path: ``name`` inside the folder ``into`` named, or as given (a loose file); absolute, and
        with any ``..`` taken as the file system will once the folders exist (:func:`outputs.normal_path`)."""
        path = pathlib.Path(name)
        return outputs.normal_path(self.home.folder / path if self.home is not None and not path.is_absolute()
                                   else path)

    def _claim_of(self, path: pathlib.Path) -> _Claim | None:
        return self.claims.get(self._key(path.parent))

    # -- the checks -------------------------------------------------------------------------------------

    def check(self, names: Iterable = (), held: bool = False, options: dict | None = None) -> None:
        """Every check that only reads, before any work: each claimed folder (a folder, writable, not in use,
        of this kind and producer, nothing in it the suite did not write) and each output name (absent, the
        suite's and this producer's, or ``force``; not an input).  A one-line UserInputError otherwise.
        ``options``: {output: the option naming it} (``--json``), said in the messages."""
        for name, option in (options or {}).items():
            self.options[self.destination(name)] = option
        for claim in self.claims.values():
            self._check_folder(claim, held)
            if not claim.contribution:
                for source in self.inputs:
                    if _inside(source, claim.folder):
                        raise UserInputError(f"{source}: an input of this command inside its output folder "
                                             f"{claim.folder} ({claim.option}); name another {claim.option}")
                    if source.is_dir() and _inside(claim.folder, source):
                        raise UserInputError(f"{claim.folder}: {claim.option} inside {source}, a folder this command "
                                             f"reads; name a folder outside it")
        paths = [self.destination(name) for name in names]
        if paths and self.owned is not None:
            self._check_unlisted(self.owned, {path.name for path in paths if self._claim_of(path) is self.owned})
        for path in paths:
            if self._claim_of(path) is None and (found := run_dirs.run_kind(path.parent)) is not None:
                claim = _Claim(path.parent, found[0], "the folder", contribution=True)
                self.claims[self._key(path.parent)] = claim
                self._check_folder(claim, held)
        for path in paths:
            self._check_name(path)

    def _check_folder(self, claim: _Claim, held: bool) -> None:
        folder, option = claim.folder, claim.option
        if folder.is_symlink() and not folder.exists():
            raise UserInputError(f"{folder}: {option} is a link to {os.readlink(folder)}, which does not exist")
        if folder.exists() and not folder.is_dir():
            raise UserInputError(f"{folder}: {option} is a file, not a folder")
        outputs.check_writable_folder(folder, option)
        if not held:
            run_dirs.refuse_if_locked(folder, option=None if claim.contribution else option)
        if not claim.contribution and claim.kind != "instance":
            for above in folder.parents:
                if (above / outputs.RUN_MARKER).is_file():
                    found_above = run_dirs.run_kind(above)
                    what = run_dirs.RUN_KINDS.get(found_above[0], "the suite's outputs") if found_above else \
                        "the suite's outputs"
                    raise UserInputError(f"{folder}: {option} inside {above}, which holds {what}; name a folder "
                                         "outside it")
        found = run_dirs.run_kind(folder)
        if claim.contribution:
            self._check_contribution(claim, found)
            return
        if claim.incremental:
            recorded = Producer.of_record(found[1].get("producer"), found[1]) if found else None
            if recorded is not None and recorded.differs(self.producer, ("application",)):
                raise UserInputError(f"{folder}: holds a run of {recorded.application}; {self.producer.command} "
                                     f"would train beside it: choose another {option}")
            return
        if found is None:
            if folder.is_dir():
                foreign = [entry for entry in folder.iterdir() if not self._ours(entry, held)]
                if foreign:
                    raise UserInputError(f"{folder}: holds files this suite did not write "
                                         f"({outputs.folder_summary(folder)}); {option} names a new or empty "
                                         "folder, or one this command wrote")
            return
        run_dirs.check_run_kind(folder, claim.kind, resume=False)
        marker = found[1]
        recorded = Producer.of_record(marker.get("producer"), marker)
        if recorded is not None and recorded.differs(self.producer, ("command", "application")):
            raise UserInputError(f"{folder}: holds {run_dirs.RUN_KINDS.get(claim.kind, claim.kind)} written by "
                                 f"{recorded.command}; {self.producer.command} does not write into another "
                                 f"command's folder: choose another {option}")
        if recorded is not None and (changed := recorded.differs(self.producer)):
            theirs, mine = getattr(recorded, changed[0]), getattr(self.producer, changed[0])
            what = run_dirs.RUN_KINDS.get(claim.kind, claim.kind).split(" (")[0]
            raise UserInputError(f"{folder}: holds {what} of another {changed[0].replace('_', ' ')} ({theirs}; "
                                 f"this command's is {mine}); a command replaces only its own outputs: choose "
                                 f"another {option}")

    def _check_unlisted(self, claim: _Claim, names: set[str]) -> None:
        """In an owned folder of the suite's: every entry its marker does not list is one of this command's
        output names (which its own check then holds to ``--force``): anything else would stand beside the
        outputs unlisted."""
        marker = outputs.read_run_marker(claim.folder) if claim.folder.is_dir() else None
        if marker is None:
            return
        listed = set(marker.get("files", []))
        for entry in sorted(claim.folder.iterdir()):
            name = entry.name + ("/" if entry.is_dir() and not entry.is_symlink() else "")
            if entry.name in listed or name in listed or self._ours(entry) or entry.name in names:
                continue
            raise UserInputError(f"{entry}: in {claim.option} {claim.folder} but not written by this suite (its "
                                 "marker does not list it); move it out, or choose another folder")

    def _check_contribution(self, claim: _Claim, found) -> None:
        folder = claim.folder
        if found is None:
            raise UserInputError(f"{folder}: not a run folder of this suite (no {outputs.RUN_MARKER})")
        kind, marker = found
        owner = Producer.of_record(marker.get("producer"), marker)
        if kind not in ("run", "instance") and owner is not None and owner.command != self.producer.command:
            raise UserInputError(f"{folder}: holds {run_dirs.RUN_KINDS.get(kind, kind)}; "
                                 f"{self.producer.command} does not write into it: choose another path")
        if owner is not None and self.producer.application and owner.differs(self.producer, ("application",)):
            raise UserInputError(f"{folder}: a run of {owner.application}; {self.producer.command} writes only "
                                 f"into runs of {self.producer.application}")
        claim.kind = kind

    @staticmethod
    def _ours(entry: pathlib.Path, held: bool = False) -> bool:
        """An entry of a claimed folder that is the suite's machinery (its marker, its lock, a staging folder)."""
        return entry.name in SUITE_ENTRIES or bool(_staging_pattern().fullmatch(entry.name))

    def _check_name(self, path: pathlib.Path) -> None:
        option = self.options.get(path, "")
        said = f"{option} " if option else ""
        if path.name in (outputs.RUN_MARKER, outputs.RUN_LOCK) or _staging_pattern().fullmatch(path.name):
            raise UserInputError(f"{path}: {said}a name the suite keeps for itself; name another output")
        if path.is_dir() and not path.is_symlink() and self._claim_of(path) is None:
            raise UserInputError(f"{path}: {said}names a folder; name a file")
        for source in self.inputs:
            if _same_file(path, source):
                raise UserInputError(f"{path}: {said}is also an input of this command ({source}); name another "
                                     "output")
            if source.is_dir() and _inside(path, source):
                raise UserInputError(f"{path}: {said}inside {source}, a folder this command reads; name an output "
                                     "outside it")
        claim = self._claim_of(path)
        if claim is not None and claim.contribution:
            marker = outputs.read_run_marker(claim.folder) or {}
            writer = _writer_of(marker, path)
            if writer is not None and writer != self.producer.command:
                raise UserInputError(f"{path}: {said}a file of {writer} in this run's folder; {self.producer.command} "
                                     "never replaces another command's file: name another output")
        if not (path.exists() or path.is_symlink()):
            if claim is None:
                outputs.check_writable_folder(path.parent, f"the folder of {said}{path.name}")
            return
        if self.force:
            return
        if claim is not None:
            marker = outputs.read_run_marker(claim.folder) or {}
            if _marks_itself(path) and not _mark_of(path).startswith(outputs.SUITE):
                pass   # listed, but a file of a format that carries its mark and does not: a user's, put there since
            elif claim.contribution:
                mine = (marker.get("contributions", {}).get(self.producer.command) or {}).get("files", [])
                if path.name in mine or _dir_name(path) in mine:
                    return
            elif _listed(marker, path):
                return
            raise UserInputError(f"{path}: exists and was not written by this suite; not replaced ({self.how})")
        if path.is_symlink():
            raise UserInputError(f"{path}: a link; not replaced (name the file itself, or pass --force)")
        mark = _mark_of(path)
        if not mark.startswith(outputs.SUITE):
            raise UserInputError(f"{path}: exists and was not written by this suite; not replaced ({self.how})")
        if mark != outputs.provenance(self.producer.command):
            raise UserInputError(f"{path}: written by {mark[len(outputs.SUITE):].strip() or 'another command'}, "
                                 f"not {self.producer.command}; not replaced (name another file, or pass --force)")

    # -- the claim --------------------------------------------------------------------------------------------

    def __enter__(self) -> "OutputTransaction":
        self.claim()
        return self

    def __exit__(self, kind, exc, trace) -> None:
        if kind is None:
            self.commit()
        else:
            self.rollback()

    def claim(self) -> None:
        """Every claimed folder created (its missing parents recorded), locked, checked again under the lock;
        what a killed transaction left there rolled back.  From here until the commit, SIGTERM raises."""
        global last_outcome
        self._sigterm = terminate_as_interrupt()
        self._sigterm.__enter__()
        self.state = "claimed"
        try:
            for claim in self.claims.values():
                self._claim_folder(claim)
            self.check(self._planned, held=True)   # again, under the locks: what another did meanwhile
            _fault("claimed")
        except BaseException:
            self.rollback()
            raise
        last_outcome = ""

    _planned: tuple = ()

    def plan(self, names: Iterable) -> "OutputTransaction":
        """The output names known before the claim, checked again under the lock (and at the commit: all
        written)."""
        self._planned = tuple(names)
        return self

    def _claim_folder(self, claim: _Claim) -> None:
        folder = claim.folder
        missing = [parent for parent in (folder, *folder.parents) if not parent.exists()]
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserInputError(f"{folder}: {claim.option} cannot be created ({exc.strerror})") from None
        claim.created = ([] if (folder / outputs.RUN_LOCK).exists() else [folder / outputs.RUN_LOCK]) + missing
        try:
            claim.lock = run_dirs.RunDirLock(folder, self.holder,
                                             option=None if claim.contribution else claim.option).acquire()
        except BaseException:   # not ours to lock (in use, a lock file that is no file): the folders it made go
            for made in missing:
                try:
                    made.rmdir()   # only when empty: another command's lock file keeps the folder
                except OSError:
                    break
            raise
        if claim.lock.warning:
            print(f"warning: {claim.lock.warning}", file=sys.stderr, flush=True)
        for left in sweep_staging(folder):
            print(f"{self.producer.command}: rolled back {left.name}, left in {folder} by a command that was "
                  "killed", file=sys.stderr, flush=True)
        marker = folder / outputs.RUN_MARKER
        claim.marker_before = marker.read_bytes() if marker.is_file() else None
        claim.marker_times = (marker.stat().st_atime_ns, marker.stat().st_mtime_ns) if marker.is_file() else None

    def _staging(self, claim: _Claim) -> pathlib.Path:
        """This transaction's staging folder in ``claim``'s folder (made at its first output), locked for the
        process's life so that only a killed transaction's is ever swept."""
        if claim.staging is None:
            staging = pathlib.Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{outputs.writer_tag()}.",
                                                    dir=claim.folder))
            fd = os.open(staging / f"{STAGING_LOCK}.new", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                pass   # a file system without locks: the staging folder is swept only by its own process
            os.rename(staging / f"{STAGING_LOCK}.new", staging / STAGING_LOCK)
            (staging / "files").mkdir()
            (staging / "backup").mkdir()
            claim.staging, claim.staging_fd = staging, fd
        return claim.staging

    def follow(self, staging) -> None:
        """Another rank's side of a transaction that rank 0 claimed: its outputs staged into rank 0's staging
        folder (``staging``, the claim's :attr:`staging_folder`, broadcast), committed by rank 0 once every rank is
        done; a rollback removes this rank's own."""
        self.owned.staging = pathlib.Path(staging)
        self.state = "following"

    @property
    def staging_folder(self) -> str:
        """The owned folder's staging folder (made now if it is not yet): what the other ranks follow."""
        return str(self._staging(self.owned))

    # -- staging outputs ----------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def reading(self, source):
        """The outputs written in the block are made from ``source`` (what a non-finite value's error names)."""
        previous, self.source = self.source, str(source)
        try:
            yield
        finally:
            self.source = previous

    @contextlib.contextmanager
    def path(self, name, suffix: str = ""):
        """A temporary path to write the output ``name`` to (``suffix``: what a library needs the name to end
        in, ``.keras``, ``.png``); staged when the block ends without error, its numbers checked."""
        if self.state not in ("claimed", "following"):
            raise RuntimeError("an output transaction stages files only between its claim and its commit")
        destination = self.destination(name)
        claim = self._claim_of(destination)
        if claim is not None:   # staged under its own name (which ends as a library wants it)
            staging = self._staging(claim)
            temporary = staging / "files" / destination.name
            if temporary.exists():
                raise UserInputError(f"{destination}: written twice by one command")
            temporary.touch()
        else:
            self._make_folder(destination.parent)
            try:
                descriptor, name_ = tempfile.mkstemp(prefix=f".{destination.name}.{outputs.writer_tag()}_",
                                                     suffix=".partial" + suffix, dir=destination.parent)
            except OSError as exc:
                raise UserInputError(f"{destination}: cannot be written ({exc.strerror})") from None
            os.close(descriptor)
            temporary = pathlib.Path(name_)
        try:
            yield temporary
            outputs.settle(temporary)
            _fault("written", temporary)
            found = nonfinite_in_file(temporary)
            if found:
                self._nonfinite(destination, f"its dataset {found}")
            self.staged[destination] = temporary
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        _fault("staged", destination.name)

    @contextlib.contextmanager
    def directory(self, name):
        """A temporary folder to fill as the output folder ``name`` (staged whole)."""
        destination = self.destination(name)
        claim = self._claim_of(destination)
        if claim is None:
            raise RuntimeError("a folder output goes into a claimed folder")
        temporary = self._staging(claim) / "files" / destination.name
        temporary.mkdir()
        outputs.honour_umask(temporary, directory=True)
        try:
            yield temporary
            self.staged[destination] = temporary
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
        _fault("staged", destination.name)

    def _make_folder(self, folder: pathlib.Path) -> None:
        """A loose file's folder, made with its missing parents (recorded: a rollback removes them again)."""
        missing = [parent for parent in (folder, *folder.parents) if not parent.exists()]
        if not missing:
            return
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserInputError(f"{folder}: cannot be created ({exc.strerror})") from None
        self.made += missing   # innermost first

    def _nonfinite(self, destination: pathlib.Path, where: str) -> None:
        source = self.source or "the input"
        raise NonFiniteOutput(f"{source}: {destination.name} would hold a NaN or an infinity ({where}); nothing "
                              "was written")

    def json(self, name, payload: dict) -> None:
        """``payload`` with its ``written_by`` key (numbers checked)."""
        _fault("payload", payload)
        found = first_nonfinite(payload)
        if found:
            self._nonfinite(self.destination(name), found)
        with self.path(name) as temporary:
            temporary.write_text(json.dumps({**payload, outputs.WRITTEN_BY: outputs.provenance(self.producer.command)},
                                            indent=2, allow_nan=False) + "\n")

    def yaml(self, name, payload: dict) -> None:
        """``payload`` as YAML under a first-line ``written_by`` comment (numbers checked)."""
        _fault("payload", payload)
        found = first_nonfinite(payload)
        if found:
            self._nonfinite(self.destination(name), found)
        with self.path(name) as temporary:
            temporary.write_text(f"{outputs.YAML_MARK}{outputs.provenance(self.producer.command)}\n"
                                 + yaml.safe_dump(payload, sort_keys=False))

    def text(self, name, text: str) -> None:
        with self.path(name) as temporary:
            temporary.write_text(text)

    def csv(self, name, header: list[str], rows) -> None:
        """A CSV table (numbers checked; it carries no mark: its folder's marker lists it)."""
        rows = [list(row) for row in rows]
        _fault("payload", rows)
        for number, row in enumerate(rows, 1):
            for column, value in zip(header, row):
                if first_nonfinite(value):
                    self._nonfinite(self.destination(name), f"row {number}, column {column}")
        with self.path(name) as temporary, open(temporary, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(header)
            writer.writerows(rows)

    def npz(self, name, **arrays) -> None:
        """``numpy.savez`` with a ``written_by`` array beside the data (numbers checked)."""
        _fault("payload", arrays)
        found = first_nonfinite(arrays)
        if found:
            self._nonfinite(self.destination(name), found)
        with self.path(name, suffix=".npz") as temporary, open(temporary, "wb") as handle:
            np.savez(handle, **arrays, **{outputs.WRITTEN_BY: np.array(outputs.provenance(self.producer.command))})

    def figure(self, figure, name, dpi: int = 110) -> None:
        """A matplotlib figure as PNG carrying the suite's mark (closed once written)."""
        try:
            with self.path(name, suffix=".png") as temporary:
                figure.savefig(temporary, dpi=dpi, format="png",
                               metadata={outputs.WRITTEN_BY: outputs.provenance(self.producer.command)})
        finally:
            import matplotlib.pyplot as plt   # deferred: matplotlib, loaded already by whoever drew the figure

            plt.close(figure)

    # -- the commit ---------------------------------------------------------------------------------------------

    def commit(self) -> None:
        """Every staged output renamed into place, then each claimed folder's marker, then the clean-up; with
        SIGINT and SIGTERM held back for all of it (a signal then is acted on once the folder is complete).  An
        error inside puts everything back (then raises)."""
        global last_outcome
        if self.state == "following":   # rank 0 moves this rank's files into place
            self.staged.clear()
            self.state = "committed"
            return
        if self.state != "claimed":
            return
        for name in self._planned:   # the other ranks' outputs, staged in this transaction's staging folder
            destination = self.destination(name)
            claim = self._claim_of(destination)
            staged = claim.staging / "files" / destination.name if claim and claim.staging else None
            if destination not in self.staged and staged is not None and staged.exists():
                self.staged[destination] = staged
        missing = [name for name in self._planned if self.destination(name) not in self.staged]
        if missing:
            self.rollback()
            raise RuntimeError(f"{self.destination(missing[0])}: planned but never written ({len(missing)} "
                               "missing); nothing was written")
        done: list[tuple[pathlib.Path, pathlib.Path | None]] = []   # (destination, backup of what it replaced)
        retired: list[tuple[pathlib.Path, pathlib.Path]] = []   # earlier outputs not written again: (path, backup)
        try:
            with signals_held():
                try:
                    self._write_journals()
                    for destination, temporary in self.staged.items():
                        backup = self._backup_of(destination)
                        if backup is not None:
                            os.rename(destination, backup)
                        done.append((destination, backup))
                        os.rename(temporary, destination)
                        _fault("commit", destination.name)
                    for claim in self.claims.values():
                        retired += self._retire(claim)
                        self._write_marker(claim)
                    for claim in self.claims.values():   # the commit point: no journal, no way back
                        if claim.staging is not None:
                            (claim.staging / JOURNAL).unlink(missing_ok=True)
                except BaseException:
                    self._undo_commit(done, retired)
                    self._roll_back()
                    raise
                self.state = "committed"
                for _, backup in (*done, *retired):
                    if backup is not None:
                        _remove(backup)
                self._release(undo=False)
                last_outcome = "its outputs were complete before it"
        finally:
            self._end_sigterm()

    def _backup_of(self, destination: pathlib.Path) -> pathlib.Path | None:
        """Where what ``destination`` holds now waits during the commit (None: nothing there)."""
        if not (destination.exists() or destination.is_symlink()):
            return None
        claim = self._claim_of(destination)
        if claim is not None:
            return self._staging(claim) / "backup" / destination.name
        return destination.with_name(f".{destination.name}.{outputs.writer_tag()}_backup.partial")

    def _retire(self, claim: _Claim) -> list[tuple[pathlib.Path, pathlib.Path]]:
        """What this producer wrote in the folder before and did not write again, moved aside (removed with
        the commit): afterwards the folder holds only what the marker lists."""
        before = outputs.read_run_marker(claim.folder) or {}
        if claim.contribution:
            earlier = (before.get("contributions", {}).get(self.producer.command) or {}).get("files", [])
        elif "producer" in before or before.get("kind") in ("predictions", "profile"):
            earlier = [name for name in before.get("files", []) if name.rstrip("/") not in SUITE_ENTRIES]
        else:
            earlier = []
        written = {destination.name for destination in self.staged if self._claim_of(destination) is claim}
        moved = []
        for name in earlier:
            path = claim.folder / name.rstrip("/")
            if path.name in written or not (path.exists() or path.is_symlink()):
                continue
            backup = self._staging(claim) / "backup" / path.name
            os.rename(path, backup)
            moved.append((path, backup))
        return moved

    def _write_marker(self, claim: _Claim) -> None:
        record = outputs.read_run_marker(claim.folder)
        written = sorted(destination.name + ("/" if destination.is_dir() and not destination.is_symlink() else "")
                         for destination in self.staged if self._claim_of(destination) is claim)   # (in place now)
        if claim.contribution:
            record = dict(record or {})
            contributions = dict(record.get("contributions", {}))
            earlier = set((contributions.get(self.producer.command) or {}).get("files", []))
            contributions[self.producer.command] = {"producer": self.producer.record(), "files": written}
            record["contributions"] = contributions
            record["files"] = sorted((set(record.get("files", [])) - earlier) | set(written))
        else:
            record = {outputs.WRITTEN_BY: outputs.provenance(self.producer.command), "kind": claim.kind,
                      "producer": self.producer.record(), "files": sorted({outputs.RUN_LOCK, *written})}
        outputs.write_marker(claim.folder, record)

    def _write_journals(self) -> None:
        """The plan of the commit, in each claimed folder's staging folder, before anything moves: what the next
        claim needs to roll back a commit that was killed half way."""
        for claim in self.claims.values():
            entries = [{"name": destination.name, "replaces": destination.exists() or destination.is_symlink()}
                       for destination in self.staged if self._claim_of(destination) is claim]
            staging = self._staging(claim)
            journal = {"entries": entries, "marker": None if claim.marker_before is None
                       else claim.marker_before.decode("utf-8", "replace"), "marker_times": claim.marker_times}
            with open(staging / f"{JOURNAL}.new", "w") as handle:
                handle.write(json.dumps(journal))
                handle.flush()
                os.fsync(handle.fileno())
            os.rename(staging / f"{JOURNAL}.new", staging / JOURNAL)

    def _undo_commit(self, done, retired) -> None:
        for path, backup in reversed(retired):
            with contextlib.suppress(OSError):
                os.rename(backup, path)
        for destination, backup in reversed(done):
            with contextlib.suppress(OSError):
                _remove(destination)
                if backup is not None:
                    os.rename(backup, destination)
        for claim in self.claims.values():
            marker = claim.folder / outputs.RUN_MARKER
            with contextlib.suppress(OSError):
                if claim.marker_before is None:
                    marker.unlink(missing_ok=True)
                elif not marker.is_file() or marker.read_bytes() != claim.marker_before:
                    _replace_bytes(marker, claim.marker_before, claim.marker_times)

    # -- the way back -------------------------------------------------------------------------------------------

    def rollback(self) -> None:
        """Before the commit: the staged files, the staging folders, and what the claim created (lock file,
        parent folders) removed; the locks released.  The folders are as they were found.  SIGINT and SIGTERM
        wait until it is done."""
        if self.state in ("committed", "rolled back"):
            return
        try:
            with signals_held():
                self._roll_back()
        finally:
            self._end_sigterm()

    def _roll_back(self) -> None:
        global last_outcome
        if self.state in ("committed", "rolled back"):
            return
        for temporary in self.staged.values():
            _remove(temporary)
        self.staged.clear()
        for folder in self.made:
            try:
                folder.rmdir()   # only when empty
            except OSError:
                break
        self.made.clear()
        if self.state != "following":
            self._release(undo=True)
            places = ", ".join(str(claim.folder) for claim in self.claims.values()) or "every output"
            last_outcome = f"{places} left as found"
        self.state = "rolled back"

    def _release(self, undo: bool) -> None:
        for claim in self.claims.values():
            if claim.staging is not None:
                shutil.rmtree(claim.staging, ignore_errors=True)
                claim.staging = None
            if claim.staging_fd is not None:
                os.close(claim.staging_fd)
                claim.staging_fd = None
            if claim.lock is None:
                continue
            try:
                if undo:
                    if not any(path.name == outputs.RUN_LOCK for path in claim.created):
                        claim.lock.restore()
                    for path in claim.created:
                        try:
                            if path.name == outputs.RUN_LOCK:
                                path.unlink(missing_ok=True)
                            else:
                                path.rmdir()   # only when empty
                        except OSError:
                            break
            finally:
                claim.lock.release()
                claim.lock = None

    def release(self) -> None:
        """An incremental claim's end (a training run that started): the lock released, nothing undone."""
        if self.state == "claimed":
            with signals_held():
                self._release(undo=False)
                self.state = "committed"
        self._end_sigterm()

    def _end_sigterm(self) -> None:
        if self._sigterm is not None:
            sigterm, self._sigterm = self._sigterm, None
            sigterm.__exit__(None, None, None)


# The formats that carry the suite's mark in themselves (common.storage.outputs.embedded_mark).
MARKED_SUFFIXES = (".json", ".yaml", ".yml", ".png", ".npz", *outputs.HDF5_SUFFIXES)


def _marks_itself(path: pathlib.Path) -> bool:
    """A regular file of a format that carries the suite's mark (a folder, a CSV do not)."""
    return path.suffix.lower() in MARKED_SUFFIXES and path.is_file() and not path.is_symlink()


def _mark_of(path: pathlib.Path) -> str:
    """The ``written_by`` a file carries ('' when none, or when it cannot be read as its format)."""
    try:
        return outputs.embedded_mark(path)
    except Exception:   # noqa: BLE001  a file not readable as its format (any library's error) is not the suite's
        return ""


def _dir_name(path: pathlib.Path) -> str:
    return path.name + "/"


def _listed(marker: dict, path: pathlib.Path) -> bool:
    listed = set(marker.get("files", []))
    return path.name in listed or _dir_name(path) in listed


def _writer_of(marker: dict, path: pathlib.Path) -> str | None:
    """The command a run folder's marker says wrote ``path``: a contribution's, the run's own (its training), or
    None when the marker does not list it."""
    for command, contribution in (marker.get("contributions") or {}).items():
        if path.name in (contribution or {}).get("files", []) or _dir_name(path) in (contribution or {}).get("files", []):
            return command
    if not _listed(marker, path):
        return None
    owner = Producer.of_record(marker.get("producer"), marker)
    return owner.command if owner is not None else "the run"


def _inside(path: pathlib.Path, folder: pathlib.Path) -> bool:
    """Whether ``path`` lies in ``folder`` (links followed)."""
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):
        return False


def _same_file(output: pathlib.Path, source: pathlib.Path) -> bool:
    """Whether ``output`` is ``source`` (file identity where both exist, links followed; else the resolved
    paths)."""
    try:
        if output.exists() and source.exists():
            return os.path.samefile(output, source)
    except OSError:
        pass
    try:
        return output.resolve() == source.resolve()
    except (OSError, RuntimeError):
        return False


def _remove(path: pathlib.Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _replace_bytes(path: pathlib.Path, data: bytes, times=None) -> None:
    """``path`` holding ``data`` again (atomically), with its access and modification times ``times`` (ns)."""
    temporary = path.with_name(f".{path.name}.{outputs.writer_tag()}_restore.partial")
    temporary.write_bytes(data)
    outputs.honour_umask(temporary)
    if times:
        os.utime(temporary, ns=tuple(times))
    os.replace(temporary, path)


def sweep_staging(folder) -> list[pathlib.Path]:
    """The staging folders of transactions into ``folder`` whose process ended without removing them (killed
    outright): one that died mid-commit rolled back by its journal (the files it had moved into place removed,
    what they replaced and the marker put back), then each removed.  A running transaction's is never touched
    (it holds its lock).  Called by a claim, under the folder's lock."""
    folder = pathlib.Path(folder)
    pattern, swept = _staging_pattern(), []
    try:
        candidates = sorted(entry for entry in folder.iterdir() if pattern.fullmatch(entry.name))
    except OSError:
        return []
    for staging in candidates:
        journal = staging / JOURNAL
        if journal.is_file() and _abandoned(staging):
            _roll_back_journal(folder, staging)
        if remove_if_abandoned(staging, STAGING_LOCK):
            swept.append(staging)
    return swept


def _abandoned(staging: pathlib.Path) -> bool:
    try:
        fd = os.open(staging / STAGING_LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _roll_back_journal(folder: pathlib.Path, staging: pathlib.Path) -> None:
    try:
        journal = json.loads((staging / JOURNAL).read_text())
    except (OSError, ValueError):
        return
    for entry in reversed(journal.get("entries", [])):
        name = str(entry.get("name", ""))
        if not name or "/" in name or name in (".", ".."):
            continue
        destination, staged, backup = folder / name, staging / "files" / name, staging / "backup" / name
        if not (staged.exists() or staged.is_symlink()) and (destination.exists() or destination.is_symlink()):
            _remove(destination)   # it had been moved into place
        if backup.exists() or backup.is_symlink():
            os.rename(backup, destination)
    for backup in (staging / "backup").iterdir() if (staging / "backup").is_dir() else ():
        if not (folder / backup.name).exists():
            os.rename(backup, folder / backup.name)   # an earlier output retired by the commit
    marker, path = journal.get("marker"), folder / outputs.RUN_MARKER
    if marker is None:
        path.unlink(missing_ok=True)
    elif not path.is_file() or path.read_bytes() != marker.encode():
        _replace_bytes(path, marker.encode(), journal.get("marker_times"))


# -- one loose file ----------------------------------------------------------------------------------------------

def file_transaction(path, command: str, force: bool = False, inputs: Iterable = (), option: str = "",
                     how: str = "pass --force to replace it") -> OutputTransaction:
    """The transaction of one loose file ``path`` written by ``command`` (a derived statistics file, a manifest),
    checked now (before the work that computes it); ``option``: the option naming it, for messages; ``how``: what
    its refusal says to do."""
    path = pathlib.Path(path).absolute()
    transaction = OutputTransaction(Producer(command, ""), force, inputs, how=how)
    transaction.check([path], options={path: option} if option else None)
    return transaction


@contextlib.contextmanager
def written_file(path, command: str, force: bool = False, inputs: Iterable = (), source=None, suffix: str = "",
                 option: str = "", how: str = "pass --force to replace it"):
    """A temporary path to write the loose file ``path`` to; committed in place when the block ends (numbers
    checked, a non-finite one naming ``source``), nothing left otherwise."""
    path = pathlib.Path(path).absolute()
    transaction = file_transaction(path, command, force, inputs, option, how)
    with transaction, transaction.reading(source or path), transaction.path(path, suffix=suffix) as temporary:
        yield temporary


def write_json_file(path, payload: dict, command: str, force: bool = False, inputs: Iterable = (), source=None):
    """``payload`` (its numbers checked) as the loose JSON file ``path``, with its ``written_by`` key."""
    path = pathlib.Path(path).absolute()
    transaction = file_transaction(path, command, force, inputs)
    with transaction, transaction.reading(source or path):
        transaction.json(path, payload)


# Names that moved to the modules split from this one, served with a warning until 0.2.0 (common/_moved.py).
__getattr__ = _moved.forward_names(__name__)
