"""What the suite writes, and the rules that keep it off a user's files.

1. Generated data (mock universes, synthetic climate fields and events) only
   ever fills a folder that is absent or empty: it is written into a new
   temporary folder beside it, created by the same call, which is renamed
   into place when complete (:func:`generated_folder`).  A folder that holds
   anything is an error naming what was expected and what was found.
2. A file is replaced only when the suite wrote it: HDF5 and netCDF-4 files
   carry a ``written_by`` attribute, JSON files a ``written_by`` key, a run
   directory a marker file (:data:`RUN_MARKER`: what it holds is the suite's),
   a staging folder a manifest.
   Anything else is replaced only when the user says so (``--force``).
3. Every write is atomic: a temporary file of a unique name in the same
   folder, flushed, then renamed over the destination (:func:`atomic_path`),
   so a kill never leaves a half-written file under the real name, and a
   file the user happens to keep beside it is never touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import tempfile

from common.errors import DataError, UserInputError

SUITE = "hpc-dl-suite"
WRITTEN_BY = "written_by"
RUN_MARKER = ".hpc-dl-suite-run"
HDF5_SUFFIXES = (".h5", ".hdf5", ".nc", ".nc4")


def provenance(tool: str) -> str:
    """The ``written_by`` value of a file written by ``tool`` (a module name)."""
    return f"{SUITE} {tool}"


def mark_hdf5(handle, tool: str) -> None:
    """Record on an open h5py.File (or netCDF4.Dataset) that the suite wrote it."""
    if hasattr(handle, "setncattr"):
        handle.setncattr(WRITTEN_BY, provenance(tool))
    else:
        handle.attrs[WRITTEN_BY] = provenance(tool)


def written_by_suite(path) -> bool:
    """Whether the suite wrote ``path`` (by its own mark; a file without one is the user's).

    What a run directory of the suite holds (``model.keras``, ``summary.json``, plots) counts as the suite's.
    """
    path = pathlib.Path(path)
    try:
        if path.is_dir():
            return (path / RUN_MARKER).is_file()
        if (path.parent / RUN_MARKER).is_file():
            return True
        if path.suffix in HDF5_SUFFIXES:
            import h5py

            if not h5py.is_hdf5(path):
                return False
            with h5py.File(path, "r") as f:
                value = f.attrs.get(WRITTEN_BY, "")
            value = value.decode() if isinstance(value, bytes) else str(value)
            return value.startswith(SUITE)
        if path.suffix == ".json":
            value = json.loads(path.read_text())
            return isinstance(value, dict) and str(value.get(WRITTEN_BY, "")).startswith(SUITE)
    except (OSError, ValueError):
        return False
    return False


def check_replaceable(path, force: bool = False, how: str = "pass --force to replace it") -> None:
    """A one-line error unless ``path`` is absent, was written by the suite, or ``force``."""
    path = pathlib.Path(path)
    if path.exists() and not force and not written_by_suite(path):
        raise UserInputError(f"{path}: exists and was not written by this suite; not replaced ({how})")


@contextlib.contextmanager
def atomic_path(path, force: bool = False, how: str = "pass --force to replace it", suffix: str = ".partial"):
    """Yield a temporary path beside ``path`` to write; on success it replaces ``path``.

    ``suffix`` ends the temporary name (Keras wants ``.keras``).
    Refused before anything is written when ``path`` holds a file the suite did
    not write (unless ``force``); checked again just before the rename.
    """
    path = pathlib.Path(path)
    check_replaceable(path, force, how)
    descriptor, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(descriptor)
    temporary = pathlib.Path(name)
    try:
        yield temporary
        with open(temporary, "rb+") as handle:
            os.fsync(handle.fileno())
        check_replaceable(path, force, how)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)   # created by this call; gone already after a successful replace


def write_json(path, payload: dict, tool: str, force: bool = False) -> None:
    """``payload`` plus its ``written_by`` key, atomically."""
    with atomic_path(path, force) as temporary:
        temporary.write_text(json.dumps({**payload, WRITTEN_BY: provenance(tool)}, indent=2) + "\n")


def folder_summary(path, limit: int = 4) -> str:
    """``3 entries: a.tfrecord, notes/, x.h5`` (the first few names)."""
    entries = sorted(pathlib.Path(path).iterdir())
    names = [entry.name + ("/" if entry.is_dir() else "") for entry in entries[:limit]]
    more = f", ... ({len(entries) - limit} more)" if len(entries) > limit else ""
    return f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}: {', '.join(names)}{more}"


def is_empty_folder(path) -> bool:
    path = pathlib.Path(path)
    return path.is_dir() and not any(path.iterdir())


def require_fillable(target, expected: str) -> None:
    """Raise unless ``target`` is absent or an empty folder (the only places generation writes)."""
    target = pathlib.Path(target)
    if not target.exists() or is_empty_folder(target):
        return
    found = "a file" if not target.is_dir() else folder_summary(target)
    raise DataError(f"{target}: expected {expected}, or an absent or empty folder to generate it into; "
                    f"found {found}; nothing was written")


@contextlib.contextmanager
def generated_folder(target, expected: str):
    """Yield a new folder to fill; when the block completes it becomes ``target``.

    ``target`` must be absent or empty (:func:`require_fillable`).  The work
    folder is created here, beside ``target``, and removed here if the block
    fails: the only folder this ever removes.
    """
    target = pathlib.Path(target)
    require_fillable(target, expected)
    target.parent.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))
    try:
        yield work
        try:
            os.rename(work, target)   # onto an absent or empty folder only; atomic
        except OSError:
            require_fillable(target, expected)   # something appeared there meanwhile: say what
            raise
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


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
    foreign = [p for p in sorted(output_dir.iterdir()) if not launch_log(p.name)]
    if foreign:
        raise UserInputError(
            f"{output_dir}: holds files this suite did not write ({folder_summary(output_dir)}); choose another "
            "--output-dir, or pass --force to write into it" + (" (--resume continues only runs of this suite)"
                                                                 if resume else ""))


def mark_run_dir(output_dir, app: str) -> None:
    output_dir = pathlib.Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    marker = output_dir / RUN_MARKER
    if not marker.exists():
        marker.write_text(json.dumps({WRITTEN_BY: provenance(f"{app}.train")}) + "\n")
