"""What the suite writes, and the rules that keep it off a user's files.

1. Generated data (mock universes, synthetic climate fields and events) only
   ever fills a folder that is absent or empty: it is written into a new
   temporary folder beside it, created by the same call, which is renamed
   into place when complete (:func:`generated_folder`).  A folder that holds
   anything is an error naming what was expected and what was found.  The
   work folder of a killed generation is removed by the next generation of
   the same folder (its lock, held for the generation's life, is free).
2. A file is replaced only when the suite wrote it, as the file itself says:
   HDF5 and netCDF-4 files carry a ``written_by`` attribute, JSON files a
   ``written_by`` key, PNG figures a ``written_by`` text chunk, ``.npz`` files a
   ``written_by`` array; a run directory's marker (:data:`RUN_MARKER`) lists by
   name what the suite wrote there (files, and folders such as ``checkpoints/``),
   and a staging folder has a manifest.  Anything else is the user's: replaced
   only when the user says so (``--force``), and even then it never becomes
   the suite's.
3. Every write is atomic: a temporary file of a unique name in the same
   folder, flushed, then renamed over the destination (:func:`atomic_path`),
   so a kill never leaves a half-written file under the real name, and a
   file the user happens to keep beside it is never touched.  Files and
   folders get the modes the umask gives (not mkstemp's 0600 / mkdtemp's 0700),
   so a dataset written on a shared file system is readable by the user's group.
4. A run directory is used by one process at a time: :class:`RunDirLock`, an
   advisory ``flock`` that dies with its process.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import hashlib
import json
import logging
import os
import pathlib
import re
import socket
import stat
import tempfile

import numpy as np

from common.deferred import h5py   # at first use: only for an HDF5 file (the module serves --help paths)
from common.errors import DataError, UserInputError

log = logging.getLogger(__name__)

# Imported where used, not here: Pillow, only to read a PNG's mark: the TensorFlow-free command line (--help,
# config checks) imports this module.

SUITE = "hpc-dl-suite"
WRITTEN_BY = "written_by"
YAML_MARK = f"# {WRITTEN_BY}: "
RUN_MARKER = ".hpc-dl-suite-run"
RUN_LOCK = ".hpc-dl-suite-run.lock"
HDF5_SUFFIXES = (".h5", ".hdf5", ".nc", ".nc4")
# What a run directory marked before markers listed their files held (the names the suite's tools wrote).
LEGACY_RUN_FILES = frozenset({
    "config.yaml", "history.csv", "summary.json", "model.keras", "checkpoints/", "tensorboard/", "mlperf.log",
    "metrics.json", "predictions.npz", "pred_vs_true.png", "training_curves.png", "masks.png", "roc.png",
    "boxes.png", "reconstruction.png"})


def current_umask() -> int:
    """This process's umask (read without changing it where /proc says it)."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)   # the portable way: set and restore
    os.umask(mask)
    return mask


def honour_umask(path, directory: bool = False) -> None:
    """Give ``path`` (made by mkstemp/mkdtemp: 0600/0700) the mode a plain open()/mkdir() would have."""
    os.chmod(path, (0o777 if directory else 0o666) & ~current_umask())


def sha256_of(path) -> str:
    """The SHA-256 of a file's bytes (hex): what a producer records of the model it applied."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def normal_path(path) -> pathlib.Path:
    """``path`` absolute, with ``..`` taken as the file system will: a ``..`` after a folder that does not exist yet
    (``new/../x``) names what it will once that folder is made, and one after a link goes up from the link's
    target.  The final name is kept as given (a link there is the link, not what it points to)."""
    path = pathlib.Path(os.path.abspath(path)) if ".." not in pathlib.Path(path).parts else pathlib.Path(path)
    if ".." not in path.parts:
        return path
    if path.name in ("..", ""):
        return pathlib.Path(os.path.realpath(path))
    return pathlib.Path(os.path.realpath(path.parent)) / path.name


def settle(temporary) -> None:
    """A temporary file just written: on the disk (fsync), with the mode the umask gives (mkstemp's is 0600)."""
    with open(temporary, "rb+") as handle:
        os.fsync(handle.fileno())
    honour_umask(temporary)


def provenance(tool: str) -> str:
    """The ``written_by`` value of a file written by ``tool`` (a module name)."""
    return f"{SUITE} {tool}"


def mark_hdf5(handle, tool: str) -> None:
    """Record on an open h5py.File (or netCDF4.Dataset) that the suite wrote it."""
    if hasattr(handle, "setncattr"):
        handle.setncattr(WRITTEN_BY, provenance(tool))
    else:
        handle.attrs[WRITTEN_BY] = provenance(tool)


def read_run_marker(run_dir) -> dict | None:
    """The run directory's marker (None when there is none); ``files`` lists what the suite wrote there."""
    marker = pathlib.Path(run_dir) / RUN_MARKER
    if not marker.is_file():
        return None
    try:
        record = json.loads(marker.read_text())
    except (OSError, ValueError):
        record = None
    if not isinstance(record, dict) or not str(record.get(WRITTEN_BY, "")).startswith(SUITE):
        return {"files": []}   # a marker we cannot read lists nothing as ours
    if not isinstance(record.get("files"), list):
        record["files"] = sorted(LEGACY_RUN_FILES)
    return record


def _listed_in_run_dir(path: pathlib.Path) -> bool:
    """Whether the nearest run-directory marker above ``path`` lists it (or the folder of the run that holds it)."""
    for depth, folder in enumerate(path.parents):
        if depth > 1:
            return False
        record = read_run_marker(folder)
        if record is None:
            continue
        relative = path.relative_to(folder).parts
        listed = set(record["files"])
        if len(relative) == 1:
            return relative[0] in listed or (path.is_dir() and f"{relative[0]}/" in listed)
        return f"{relative[0]}/" in listed
    return False


def embedded_mark(path: pathlib.Path) -> str:
    """The ``written_by`` a file carries in itself ('' when none)."""
    suffix = path.suffix.lower()
    if suffix in HDF5_SUFFIXES:
        if not h5py.is_hdf5(path):
            return ""
        with h5py.File(path, "r") as f:
            value = f.attrs.get(WRITTEN_BY, "")
        return value.decode() if isinstance(value, bytes) else str(value)
    if suffix == ".json":
        value = json.loads(path.read_text())
        return str(value.get(WRITTEN_BY, "")) if isinstance(value, dict) else ""
    if suffix in (".yaml", ".yml"):
        with open(path, encoding="utf-8", errors="replace") as handle:
            first = handle.readline()
        return first[len(YAML_MARK):].strip() if first.startswith(YAML_MARK) else ""
    if suffix == ".png":
        from PIL import Image   # deferred: Pillow (matplotlib's) only for a PNG file

        with Image.open(path) as image:
            return str(getattr(image, "text", {}).get(WRITTEN_BY, ""))
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            return str(data[WRITTEN_BY]) if WRITTEN_BY in data.files else ""
    return ""


def written_by_suite(path) -> bool:
    """Whether the suite wrote ``path``: a run directory (its marker), a file its run directory's marker
    lists, or a file that carries the suite's mark in itself.  Anything else is the user's."""
    path = pathlib.Path(path)
    try:
        if path.is_dir() and (path / RUN_MARKER).is_file():
            return read_run_marker(path) is not None
        if path.is_symlink():
            return False   # never replace a link, whatever it points at
        if path.name in (RUN_MARKER, RUN_LOCK) and read_run_marker(path.parent) is not None:
            return True
        if _listed_in_run_dir(path):
            return True
        if path.is_file():
            return embedded_mark(path).startswith(SUITE)
    except (OSError, ValueError, KeyError, ImportError):
        return False
    except Exception:   # noqa: BLE001  an unreadable file of any format (PIL, zipfile) is not ours
        return False
    return False


def record_in_run_dir(run_dir, names) -> None:
    """Add ``names`` (files, or folders ending in ``/``) to the run directory's marker, when it has one."""
    run_dir = pathlib.Path(run_dir)
    record = read_run_marker(run_dir)
    if record is None:
        return
    files = set(record["files"])
    if set(names) <= files:
        return
    record["files"] = sorted(files | set(names))
    write_marker(run_dir, record)


def write_marker(run_dir: pathlib.Path, record: dict) -> None:
    descriptor, name = tempfile.mkstemp(prefix=f"{RUN_MARKER}.", suffix=".partial", dir=run_dir)
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(json.dumps(record, indent=1) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        honour_umask(name)
        os.replace(name, run_dir / RUN_MARKER)
    finally:
        pathlib.Path(name).unlink(missing_ok=True)


def check_replaceable(path, force: bool = False, how: str = "pass --force to replace it") -> None:
    """A one-line error unless ``path`` is absent, was written by the suite, or ``force``."""
    path = pathlib.Path(path)
    if path.is_symlink() and not path.exists() and not force:   # a rename would replace the link itself
        raise UserInputError(f"{path}: a link to nothing (or a loop of links); not replaced ({how})")
    if path.exists() and not force and not written_by_suite(path):
        raise UserInputError(f"{path}: exists and was not written by this suite; not replaced ({how})")


@contextlib.contextmanager
def atomic_path(path, force: bool = False, how: str = "pass --force to replace it", suffix: str = ".partial"):
    """Yield a temporary path beside ``path`` to write; on success it replaces ``path``.

    ``suffix`` ends the temporary name (Keras wants ``.keras``).
    Refused before anything is written when ``path`` holds a file the suite did
    not write (unless ``force``); checked again just before the rename.  The
    file gets the umask's mode; in a run directory its name joins the marker's
    list.  The temporary file is removed whatever happens (it is this call's).
    """
    path = pathlib.Path(path)
    check_replaceable(path, force, how)
    if not path.parent.is_dir():
        raise UserInputError(f"{path.parent}: folder not found (to write {path.name} into)")
    try:
        descriptor, name = tempfile.mkstemp(prefix=f".{path.name}.{writer_tag()}_", suffix=suffix, dir=path.parent)
    except OSError as exc:
        raise UserInputError(f"{path}: cannot be written ({exc.strerror})") from None
    os.close(descriptor)
    temporary = pathlib.Path(name)
    try:
        yield temporary
        settle(temporary)
        check_replaceable(path, force, how)
        record_in_run_dir(path.parent, [path.name])
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)   # created by this call; gone already after a successful replace


# The name atomic_path gives its temporary file: "." + the destination's name + "." + the writer's host (8 hex
# digits of a hash of its name) and process id + "_" + mkstemp's 8 random characters + the suffix one of the
# suite's writers asks for.
KILLED_WRITE = re.compile(r"\.(?P<name>.+)\.(?P<host>[0-9a-f]{8})_(?P<pid>[0-9]+)_[a-z0-9_]{8}"
                          r"(?:\.partial(?:\.nc)?|\.keras|\.png|\.npz|\.sha256)")


def host_tag() -> str:
    """8 hex digits naming this host in a temporary file's name."""
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def writer_tag() -> str:
    """``<host>_<pid>``: who writes a temporary file (:data:`KILLED_WRITE`)."""
    return f"{host_tag()}_{os.getpid()}"


def process_alive(pid: int) -> bool:
    """Whether a process of that id runs on this host (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def remove_killed_writes(folder) -> list[pathlib.Path]:
    """Remove the temporary files :func:`atomic_path` left in ``folder`` when its process was killed mid-write
    (a rename never came): those of a name the folder's marker lists as the suite's (or of the marker itself),
    written on this host by a process that no longer runs; regular files only.  A writer on another host, or
    one whose process id is in use again, is left alone: it may be alive."""
    folder = pathlib.Path(folder)
    record = read_run_marker(folder)
    if record is None:
        return []
    ours, here = {RUN_MARKER.lstrip("."), *map(str, record["files"])}, host_tag()
    removed = []
    for path in sorted(folder.iterdir()):
        match = KILLED_WRITE.fullmatch(path.name)
        if match and match["name"] in ours and match["host"] == here and not process_alive(int(match["pid"])) \
                and path.is_file() and not path.is_symlink():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def write_json(path, payload: dict, tool: str, force: bool = False) -> None:
    """``payload`` plus its ``written_by`` key, atomically."""
    with atomic_path(path, force) as temporary:
        temporary.write_text(json.dumps({**payload, WRITTEN_BY: provenance(tool)}, indent=2) + "\n")


def write_text(path, text: str, force: bool = False) -> None:
    """A text file atomically (in a run directory: listed by its marker)."""
    with atomic_path(path, force) as temporary:
        temporary.write_text(text)


def folder_summary(path, limit: int = 4) -> str:
    """``3 entries: a.tfrecord, notes/, x.h5`` (the first few names)."""
    entries = sorted(pathlib.Path(path).iterdir())
    names = [entry.name + ("/" if entry.is_dir() else "") for entry in entries[:limit]]
    more = f", ... ({len(entries) - limit} more)" if len(entries) > limit else ""
    return f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}: {', '.join(names)}{more}"


def is_empty_folder(path) -> bool:
    """Whether ``path`` is an existing folder with nothing in it."""
    path = pathlib.Path(path)
    return path.is_dir() and not any(path.iterdir())


def require_fillable(target, expected: str) -> None:
    """Raise unless ``target`` is absent or an empty folder (the only places generation writes); a symbolic
    link counts as the folder it points to, and a link to nothing is refused (there is no folder to fill)."""
    target = pathlib.Path(target)
    if target.is_symlink() and not target.exists():
        raise DataError(f"{target}: a symbolic link to {os.readlink(target)}, which does not exist; expected "
                        f"{expected}, or an absent or empty folder to generate it into (create the folder it "
                        "points to, or name another); nothing was written")
    if not target.exists() or is_empty_folder(target):
        return
    found = "a file" if not target.is_dir() else folder_summary(target)
    raise DataError(f"{target}: expected {expected}, or an absent or empty folder to generate it into; "
                    f"found {found}; nothing was written")


# -- run directories ----------------------------------------------------------------------

def launch_log(name: str) -> bool:
    """The SLURM scripts' own log in the run directory (slurm/launch.sh), written before the trainer starts."""
    return name.startswith("train.restart-") and name.endswith(".log")


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


def check_writable_folder(folder, what: str) -> None:
    """A folder that can be created or written, checked before any work (a one-line error otherwise)."""
    folder = pathlib.Path(folder)
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UserInputError(f"{folder}: {what} cannot be created: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserInputError(f"{folder}: {what} is not writable "
                             + (f"(no write permission on {existing})" if existing != folder else "(no write permission)"))


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
