"""The sample files of a split, as every application reads them: listed (:func:`list_files`), screened once over
the ranks (:func:`screen_files`), checked all at once for a data checker (:func:`check_split_files`), read at a byte
offset (:func:`read_at`); a reader library's error named by its file (:func:`reading`).  A rank's share of them is
the engine's (:func:`common.loop.epochs.rank_share`); staging them to node-local storage is :mod:`common.storage.staging`."""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
from typing import Callable

import numpy as np

from common import _moved
from common.errors import DataError
from common.storage.sample_files import bad_entries_message, entry_problem

log = logging.getLogger(__name__)


def list_files(directory: str | pathlib.Path, patterns: tuple[str, ...], what: str,
               on_bad_file: str | None = None) -> list[str]:
    """Sorted files in ``directory`` matching any glob pattern; a clear error if none.

    An entry that matches but cannot be read as a file (:func:`common.storage.sample_files.entry_problem`: a
    dangling link, a folder, no read permission) is never dropped silently: it is a DataError naming the first
    and counting the others, unless ``on_bad_file`` (the config's ``data.on_bad_file``) is ``"skip"``: then it
    is listed with the files, for :func:`screen_files` (which every such caller runs next) to leave out and report.
    """
    directory = pathlib.Path(directory)
    try:
        os.stat(directory)
    except FileNotFoundError:
        raise DataError(f"{directory}: {what} directory not found") from None
    except OSError as exc:   # a parent folder that cannot be searched
        raise DataError(f"{directory}: {what} directory cannot be reached ({exc.strerror})") from None
    if not directory.is_dir():
        raise DataError(f"{directory}: {what} directory expected, found a file")
    if not os.access(directory, os.R_OK | os.X_OK):
        raise DataError(f"{directory}: {what} directory cannot be read (permission denied)")
    files = sorted({str(p) for pattern in patterns for p in directory.glob(pattern)})
    bad = [(f, problem) for f in files if (problem := entry_problem(f))]
    if bad and on_bad_file != "skip":
        raise DataError(bad_entries_message(bad, f"matching {' or '.join(patterns)}")
                        + (f" (data.on_bad_file: skip leaves {'it' if len(bad) == 1 else 'them'} out)"
                           if on_bad_file else ""))
    if not files:
        raise DataError(f"{directory}: no {what} files matching {' or '.join(patterns)}")
    return files


def screen_files(files: list[str], inspect: Callable[[str], int], dist, on_bad_file: str,
                 where: str) -> tuple[list[str], dict[str, int], list[str]]:
    """Inspect every file once, each rank a share, and agree on the verdicts over ranks.

    ``inspect(path)`` returns the file's sample count or raises
    :class:`DataError`; an entry that is no readable file (listed by
    :func:`list_files` with ``on_bad_file="skip"``) is bad without it.  With
    ``on_bad_file="fail"`` the first problem is raised (with the number of
    others); with ``"skip"`` bad files are left out and each is reported once
    by rank 0.  Returns (good files in order, their sample counts, the problems).  ``dist``: the ranks, a
    :class:`common.distributed.Distributed` (not imported here: distributed.py writes through storage).
    """
    def verdicts(paths):
        out = {}
        for path in paths:
            try:
                if problem := entry_problem(path):
                    raise DataError(f"{path}: {problem}")
                out[path] = (inspect(path), None)
            except DataError as exc:
                out[path] = (0, str(exc))
        return out

    merged: dict[str, tuple[int, str | None]] = {}
    for part in dist.allgather_object(verdicts(files[dist.rank::dist.size])):
        merged.update(part)
    # Files no rank reported (a stand-in Distributed that plays one rank of many) are inspected here.
    merged.update(verdicts([f for f in files if f not in merged]))
    problems = [merged[f][1] for f in files if merged[f][1]]
    if problems and on_bad_file == "fail":
        others = f" (and {len(problems) - 1} more bad files: python -m common.tools.check_data lists them, " \
                 "data.on_bad_file: skip leaves them out)" if len(problems) > 1 else ""
        raise DataError(problems[0] + others)
    if problems and dist.is_root:
        for problem in problems:
            log.warning(f"skipping bad file: {problem}")
    good = [f for f in files if not merged[f][1]]
    if not good:
        raise DataError(f"{where}: all {len(files)} files are bad; the first: {problems[0]}")
    return good, {f: merged[f][0] for f in good}, problems


def check_split_files(data_dir, splits: tuple[str, ...], patterns: tuple[str, ...], what: str,
                      check_file: Callable[[str], None]) -> tuple[int, list[str]]:
    """Run ``check_file`` (raises :class:`DataError`) on every file of ``data_dir/<split>``.

    Returns (files checked, every problem found): a data checker reports all
    the bad files at once instead of stopping at the first.
    """
    problems: list[str] = []
    checked = 0
    for split in splits:
        directory = pathlib.Path(data_dir) / split
        try:   # every entry listed: one that is no readable file is a problem of its own (check_quietly)
            files = list_files(directory, patterns, f"{what} {split}", on_bad_file="skip")
        except DataError as exc:
            problems.append(str(exc))
            continue
        for path in files:
            checked += 1
            problem = check_quietly(check_file, path)
            if problem:
                problems.append(problem)
    return checked, problems


def check_quietly(check_file: Callable[[str], object], path: str) -> str | None:
    """``check_file(path)``'s problem as one line, or None: a checker reports every file and never crashes
    (an error of any kind becomes the file's problem; an entry that is no readable file is named as such)."""
    if problem := entry_problem(path):
        return f"{path}: {problem}"
    try:
        check_file(path)
    except DataError as exc:
        return str(exc)
    except Exception as exc:   # noqa: BLE001  a reader library's error: report it against the file
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"{path}: cannot be read ({type(exc).__name__}{': ' + detail[:300] if detail else ''})"
    return None


@contextlib.contextmanager
def reading(path, where: str = ""):
    """Errors of a file library (h5py's OSError, a short dataset's ValueError) inside the block become a
    :class:`DataError` naming ``path`` (and ``where``: record, events, crop)."""
    try:
        yield
    except DataError:
        raise
    except (OSError, ValueError, KeyError, IndexError, TypeError, RuntimeError) as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{path}{': ' + where if where else ''}: cannot be read ({detail})") from None


def read_at(path: str, offset: int, dtype: str, shape: tuple[int, ...], what: str) -> np.ndarray:
    """``shape`` values of ``dtype`` stored at byte ``offset`` of ``path``, read straight into a new array
    (one copy from the page cache; ``readinto`` releases the GIL while it reads)."""
    out = np.empty(shape, np.dtype(dtype))
    view, done = memoryview(out).cast("B"), 0
    with reading(path, what), open(path, "rb", buffering=0) as handle:
        handle.seek(offset)
        while done < out.nbytes:
            n = handle.readinto(view[done:])
            if not n:
                raise DataError(f"{path}: truncated: {what} at byte offset {offset} needs {out.nbytes} bytes, "
                                f"the file holds {done} of them")
            done += n
    return out


def select_count(available: int, requested: int | None, key: str, where: str) -> int:
    """Samples to use: all present by default; asking for more than exists is an error."""
    if requested is None:
        return available
    if requested > available:
        raise DataError(f"{key}={requested} but only {available} samples are present in {where}")
    return requested


# Names that moved to the modules split from this one, served with a warning until 0.2.0 (common/_moved.py).
__getattr__ = _moved.forward_names(__name__)
