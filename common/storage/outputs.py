"""What the suite writes, and the marks that keep it off a user's files.

1. A file is replaced only when the suite wrote it, as the file itself says:
   HDF5 and netCDF-4 files carry a ``written_by`` attribute, JSON files a
   ``written_by`` key, PNG figures a ``written_by`` text chunk, ``.npz`` files a
   ``written_by`` array; a run directory's marker (:data:`RUN_MARKER`) lists by
   name what the suite wrote there (files, and folders such as ``checkpoints/``),
   and a staging folder has a manifest.  Anything else is the user's: replaced
   only when the user says so (``--force``), and even then it never becomes
   the suite's.
2. Every write is atomic: a temporary file of a unique name in the same
   folder, flushed, then renamed over the destination (:func:`atomic_path`),
   so a kill never leaves a half-written file under the real name, and a
   file the user happens to keep beside it is never touched.  Files and
   folders get the modes the umask gives (not mkstemp's 0600 / mkdtemp's 0700),
   so a dataset written on a shared file system is readable by the user's group.

A command's outputs as one whole are :mod:`common.storage.transaction`'s; a generated dataset's folder is
:mod:`common.storage.generated`'s; what a run directory holds (its kind) and who uses it now (its lock) are
:mod:`common.storage.run_dirs`'.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import re
import socket
import tempfile

import numpy as np

from common import _moved
from common.deferred import h5py   # at first use: only for an HDF5 file (the module serves --help paths)
from common.errors import UserInputError

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


# Names that moved to the modules split from this one, served with a warning until 0.2.0 (common/_moved.py).
__getattr__ = _moved.forward_names(__name__)
