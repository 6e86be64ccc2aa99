"""Run directories: the folders the suite claims for one command's outputs (a training run, a job of instances
and each of its instances, predictions, a benchmark's traces), what kind each holds as its marker says, the checks
a training makes of its folder before it writes, and the lock that lets one process at a time use a folder.

1. A folder holds one kind for its life (:data:`RUN_KINDS`, :func:`check_run_kind`): a training never trains
   beside another kind's files, a job of instances only resumes with its own count.
2. A run directory is used by one process at a time: :class:`RunDirLock`, an advisory ``flock`` that dies with
   its process; :func:`refuse_if_locked` answers the same refusal before a command's start-up.

The output transaction (:mod:`common.storage.transaction`) claims a folder with both: its kind and producer
checked, its lock held until the commit; a training's run folder (:mod:`common.loop.run_folder`) and a job's
folder (:mod:`common.instances`) make their own checks of what the folder holds (:func:`check_run_dir`,
:func:`check_run_files`) before TensorFlow loads, and mark it (:func:`mark_run_dir`) when the run starts.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import pathlib
import socket
import stat

from common.errors import UserInputError
from common.storage.outputs import (RUN_LOCK, RUN_MARKER, WRITTEN_BY, folder_summary, provenance, read_run_marker,
                                    record_in_run_dir, write_marker, written_by_suite)


# What a run directory holds, as its marker says: one training run, a job of several instances (its folder holds
# ``instance-<k>/`` and ``instances.json``), or one instance of such a job.  A folder holds one kind for its life.
RUN_KINDS = {"run": "a training run", "instances": "a job of several instances (distributed.instances)",
             "instance": "one instance of a job of several", "profile": "a benchmark's profiler traces",
             "predictions": "a trained model's predictions (python -m <app>.predict)"}


def run_kind(folder) -> tuple[str, dict] | None:
    """(the kind of run ``folder`` holds, its marker or its job's), or None for a folder no run has marked.

    Markers written before kinds were recorded tell by what they list (``instances.json``: a job); a folder
    that a job's marker lists as one of its instances is an instance even before its own run marked it."""
    folder = pathlib.Path(folder)
    parent = read_run_marker(folder.parent) if folder.name.startswith("instance-") else None
    if parent is not None and _recorded_kind(parent) == "instances" and f"{folder.name}/" in parent["files"]:
        return "instance", parent
    record = read_run_marker(folder)
    if record is None:
        return None
    return _recorded_kind(record), record


def _recorded_kind(record: dict) -> str:
    if record.get("kind") in RUN_KINDS:
        return record["kind"]
    return "instances" if "instances.json" in record.get("files", []) else "run"


def recorded_instances(record: dict) -> int | None:
    """How many instances a job's marker records (markers from before counts were recorded: the instance
    folders it lists); None for other markers."""
    if _recorded_kind(record) != "instances":
        return None
    return record.get("instances") or sum(1 for name in record.get("files", []) if name.startswith("instance-")) or None


def check_run_kind(folder, kind: str, resume: bool, instances: int | None = None) -> None:
    """Refuse (a one-line error, before anything is written) a run of ``kind`` in a folder that holds another
    kind, or a job of instances in the folder of a job of another count: its runs would train beside the
    folder's, or a resume would start some of them from scratch.  ``--force`` does not lift it."""
    folder = pathlib.Path(folder)
    found = run_kind(folder)
    if found is None:
        return
    found_kind, record = found
    recorded = recorded_instances(record)
    count = f" of {recorded} instances" if recorded else ""
    if found_kind == kind == "instances" and recorded and instances is not None and recorded != instances:
        raise UserInputError(
            f"{folder}: holds a job{count} (instance-0/ ... instance-{recorded - 1}/); "
            f"{'--resume' if resume else 'a new job'} with distributed.instances={instances} cannot continue every "
            f"one of them: set distributed.instances={recorded}, or choose another --output-dir")
    if found_kind == kind:
        return
    if found_kind == "instances":
        hint = (f"resume the job with --set distributed.instances={recorded}" if resume and recorded
                else "choose another --output-dir")
        raise UserInputError(f"{folder}: holds a job{count} (distributed.instances); {RUN_KINDS[kind]} would "
                             f"train beside its instance folders: {hint}")
    if found_kind == "instance":
        raise UserInputError(f"{folder}: is one instance of the job{count} in {folder.parent}; {RUN_KINDS[kind]} "
                             "here would mix with the job's: run or resume the whole job "
                             f"(--output-dir {folder.parent}), or choose another --output-dir")
    what = " (its own checkpoints and records)" if found_kind == "run" else ""
    raise UserInputError(f"{folder}: holds {RUN_KINDS[found_kind]}{what}; {RUN_KINDS[kind]} would "
                         f"{'write' if kind in ('profile', 'predictions') else 'train'} beside it: choose another folder")


def check_run_dir(output_dir, resume: bool, force: bool) -> None:
    """Refuse a run directory that holds files the suite did not write (unless ``force``)."""
    output_dir = pathlib.Path(output_dir)
    if not output_dir.exists():
        return
    if not output_dir.is_dir():
        raise UserInputError(f"{output_dir}: --output-dir is a file, not a folder")
    if (output_dir / RUN_MARKER).is_file() or force:
        return
    foreign = [p for p in sorted(output_dir.iterdir()) if not launch_log(p.name) and p.name != RUN_LOCK]
    if foreign:
        raise UserInputError(
            f"{output_dir}: holds files this suite did not write ({folder_summary(output_dir)}); choose another "
            "--output-dir, or pass --force to write into it" + (" (--resume continues only runs of this suite)"
                                                                 if resume else ""))


def launch_log(name: str) -> bool:
    """The SLURM scripts' own log in the run directory (slurm/launch.sh), written before the trainer starts."""
    return name.startswith("train.restart-") and name.endswith(".log")


def check_run_files(output_dir, names, force: bool) -> None:
    """Before a run writes anything: each of ``names`` in ``output_dir`` is absent, or the suite's (its
    marker lists it), or ``force`` lets the run replace it."""
    output_dir = pathlib.Path(output_dir)
    if force:
        return
    for name in names:
        path = output_dir / name.rstrip("/")
        if (path.exists() or path.is_symlink()) and not written_by_suite(path):
            raise UserInputError(f"{path}: exists and was not written by this suite; this run would write it "
                                 "(choose another --output-dir, or pass --force to replace it)")


def mark_run_dir(output_dir, app: str, files=(), kind: str = "run", instances: int | None = None,
                 tool: str | None = None, producer: dict | None = None) -> None:
    """Create the run directory's marker (or add ``files`` to it), recording the ``kind`` of run it holds
    (:data:`RUN_KINDS`) and, for a job of instances, how many; ``tool``: the writer (default ``<app>.train``);
    ``producer``: who made it (:class:`common.storage.transaction.Producer`'s record)."""
    output_dir = pathlib.Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    record = read_run_marker(output_dir)
    if record is None:
        record = {WRITTEN_BY: provenance(tool or f"{app}.train"), "files": sorted({RUN_LOCK, *files}), "kind": kind}
        if producer is not None:
            record["producer"] = producer
        if instances is not None:
            record["instances"] = instances
        write_marker(output_dir, record)
    elif record.get("kind") != kind and WRITTEN_BY in record:   # a marker from before kinds were recorded
        record.update(files=sorted({*record["files"], *files}), kind=kind,
                      **({"instances": instances} if instances is not None else {}))
        write_marker(output_dir, record)
    else:
        record_in_run_dir(output_dir, files)


def record_external(run_dir, path) -> None:
    """List in the run directory's marker a file this run created outside it (an MLPerf log elsewhere), so
    that a resume of this run may append to it."""
    run_dir = pathlib.Path(run_dir)
    record = read_run_marker(run_dir)
    if record is not None:
        record["external"] = sorted({*record.get("external", []), str(pathlib.Path(path).resolve())})
        write_marker(run_dir, record)


def in_use(run_dir, holder: bytes, option: str | None = "--output-dir") -> UserInputError:
    """The refusal of a folder whose lock another process holds; ``holder``: what its lock file says; ``option``:
    the command's option that names another folder (None: the folder is the one to work on, as evaluate's)."""
    try:
        who = json.loads(holder.decode(errors="replace").strip())
        who = f"{who['tool']} (pid {who['pid']} on {who['host']}, since {who['since']})"
    except (ValueError, KeyError, TypeError):
        who = "another process"
    return UserInputError(f"{run_dir}: in use by {who}; two runs in one folder would mix their files: wait for it "
                          "to end" + (f", or choose another {option}" if option else ""))


def refuse_if_locked(run_dir, option: str | None = "--output-dir") -> None:
    """The :class:`RunDirLock` refusal, read without taking the lock (Linux's /proc/locks lists who holds a
    flock), so that a command can answer before its start-up.  Silent where that cannot be known here (no
    /proc/locks, a file system that lists its locks under other device numbers than stat gives): the lock
    itself, taken later, is the check that counts."""
    path = pathlib.Path(run_dir) / RUN_LOCK
    try:
        status = path.lstat()   # not through a link: the lock refuses one (O_NOFOLLOW), in its own words
        with open("/proc/locks") as handle:
            table = handle.read()
    except OSError:
        return
    if not stat.S_ISREG(status.st_mode):
        return
    key = f"{os.major(status.st_dev):02x}:{os.minor(status.st_dev):02x}:{status.st_ino}"
    for line in table.splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == key:
            try:
                holder = path.read_bytes()[:4096]
            except OSError:
                holder = b""
            raise in_use(run_dir, holder, option)


class RunDirLock:
    """An exclusive advisory lock on a run directory (``flock`` on :data:`RUN_LOCK` inside it), held until
    :meth:`release` or the process ends (a killed process releases it: no stale locks).

    A second training, or an evaluation, of the same folder is refused with a one-line error naming the
    holder.  File systems without ``flock`` (some NFS mounts) get a warning and no lock.
    """

    def __init__(self, run_dir, tool: str, option: str | None = "--output-dir"):
        self.run_dir = pathlib.Path(run_dir)
        self.tool = tool
        self.option = option   # what its refusal advises to name another folder with (None: nothing)
        self._fd = None
        self.warning = None
        self.previous = b""
        self.previous_times: tuple[int, int] | None = None

    def acquire(self) -> "RunDirLock":
        """Takes the run directory's lock (an exclusive flock on its lock file); a UserInputError naming the run
        that holds it if another process does."""
        path = self.run_dir / RUN_LOCK
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o666)
        except OSError as exc:
            reason = "a link, not the lock file this suite writes" if exc.errno == errno.ELOOP else exc.strerror
            raise UserInputError(f"{path}: cannot open the run directory's lock file ({reason})") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):   # a FIFO or a device: the lock's record cannot be kept in it
            os.close(fd)
            raise UserInputError(f"{path}: the run directory's lock file is not a regular file; remove it, or "
                                 "choose another folder")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0)
            os.close(fd)
            raise in_use(self.run_dir, holder, self.option) from None
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                os.close(fd)
                raise
            self.warning = (f"{self.run_dir}: this file system has no file locks ({exc.strerror}); a second run "
                            "started on this folder would not be detected")
        self.previous = os.pread(fd, 4096, 0)
        status = os.fstat(fd)
        self.previous_times = (status.st_atime_ns, status.st_mtime_ns)
        os.ftruncate(fd, 0)
        since = datetime.datetime.now().isoformat(timespec="seconds")
        os.pwrite(fd, json.dumps({"tool": self.tool, "pid": os.getpid(), "host": socket.gethostname(),
                                  "since": since}).encode(), 0)
        self._fd = fd
        return self

    def restore(self) -> None:
        """Put back what the lock file said before this lock was taken (a refused run leaves no change)."""
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, self.previous, 0)
            if self.previous_times is not None:
                os.utime(self._fd, ns=self.previous_times)   # as it was found, its time too

    def release(self) -> None:
        """Releases the lock (the lock file stays: removing it would let two runs lock two different files)."""
        if self._fd is not None:
            os.close(self._fd)   # closing the descriptor releases the flock
            self._fd = None
