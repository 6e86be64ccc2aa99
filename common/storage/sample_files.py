"""Which entries of a data folder can be read as sample files: the one check every listing makes (the readers
through :func:`common.storage.data.list_files`, the data tools' subset, manifest and verify), so that an entry
that looks like a sample but cannot be read as one (a dangling link, a folder with a sample's name, a file
without read permission) is named and counted, never skipped silently.

A symbolic link to a readable regular file is a sample like any other (datasets are often folders of links).
Read permission is ``os.access``'s answer: as root (the tests, many containers) the permission bits do not stop
a read, and ``os.access`` says so too; without root's file-permission capabilities it follows the bits.

Standard library only: the TensorFlow-free data tools use it.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import pathlib
import stat

from common.errors import UserInputError   # (standard library only, as this module)


def entry_problem(path) -> str | None:
    """Why ``path`` cannot be read as a sample file (a few words), or None when it can."""
    try:
        status = os.stat(path)   # through a link, to what it points at
    except FileNotFoundError:
        if os.path.islink(path):
            return f"a symbolic link to {os.readlink(path)}, which does not exist"
        return "vanished while the folder was listed"
    except OSError as exc:   # a link loop, a target folder that cannot be searched
        return f"cannot be reached ({exc.strerror})"
    if stat.S_ISDIR(status.st_mode):
        return "a folder, not a file"
    if not stat.S_ISREG(status.st_mode):
        return "not a regular file (a device, pipe or socket)"
    if not os.access(path, os.R_OK):
        return "cannot be read (permission denied)"
    return None


def bad_entries_message(bad: list[tuple[str, str]], matching: str = "") -> str:
    """One line for the ``(path, problem)`` pairs ``bad``: the first named, the others counted (``matching``:
    what they have in common, e.g. ``matching *.h5``)."""
    first, problem = bad[0]
    more = len(bad) - 1
    others = (f"; and {more} more entr{'y' if more == 1 else 'ies'}{' ' + matching if matching else ''} that "
              "cannot be read as files") if more else ""
    return f"{first}: {problem}{others}"


@dataclasses.dataclass(frozen=True)
class DatasetFiles:
    """Which files of a dataset folder hold samples: ``patterns`` but not ``exclude`` (fnmatch on the file
    name); with ``rows_per_file``, each such file is HDF5 holding many samples along the first axis of its
    datasets, counted by the first of ``count_datasets`` it has.  ``split_tags``: where the splits share one
    folder, the words in a file's name that tell its split (the first one found; files with none are a group of
    their own)."""

    name: str
    patterns: tuple[str, ...]
    exclude: tuple[str, ...] = ()
    rows_per_file: bool = False
    count_datasets: tuple[str, ...] = ()
    split_tags: tuple[str, ...] = ()

    def is_sample(self, path: pathlib.Path) -> bool:
        return any(fnmatch.fnmatch(path.name, pattern) for pattern in self.patterns) and \
            not any(fnmatch.fnmatch(path.name, pattern) for pattern in self.exclude)

    def split_of(self, path: pathlib.Path) -> str | None:
        return next((tag for tag in self.split_tags if tag in path.name), None)



def matching_entries(directory, patterns) -> list[str]:
    """The entries of ``directory`` matching any of the glob ``patterns``, sorted, whatever they are (files,
    links, folders): what a listing then checks with :func:`entry_problem`."""
    return sorted({str(path) for pattern in patterns for path in pathlib.Path(directory).glob(pattern)})


def list_inputs(paths, patterns, what: str, option: str) -> list[str]:
    """The sample files a command's ``option`` names: files as given, folders replaced by their entries matching
    ``patterns`` (name order).  The one listing's refusals, each a :class:`~common.errors.UserInputError` naming
    the path: a path that does not exist or is a link to nothing, a named entry that is no readable file, a folder
    with no matching entry or with one that cannot be read as a sample (a dangling link, a folder of a sample's
    name: named, never skipped), a file named twice (links followed, hard links too)."""
    found: list[str] = []
    for given in map(str, paths):
        if os.path.isdir(given):
            if not os.access(given, os.R_OK | os.X_OK):
                raise UserInputError(f"{given}: {option} folder cannot be read (permission denied)")
            entries = matching_entries(given, patterns)
            bad = [(entry, problem) for entry in entries if (problem := entry_problem(entry))]
            if bad:
                raise UserInputError(bad_entries_message(bad, f"matching {' or '.join(patterns)}")
                                     + f" ({option} {given}: every entry named like a {what} file must be one)")
            if not entries:
                raise UserInputError(f"{given}: no {what} files ({', '.join(patterns)}) in this {option} folder")
            found.extend(entries)
            continue
        if os.path.islink(given) and not os.path.exists(given):
            raise UserInputError(f"{given}: {option} is a link to {os.readlink(given)}, which does not exist")
        if not os.path.lexists(given):
            raise UserInputError(f"{given}: {option} not found")
        problem = entry_problem(given)
        if problem:
            raise UserInputError(f"{given}: {option} {problem}")
        found.append(given)
    seen: dict[tuple[int, int], str] = {}
    for path in found:
        status = os.stat(path)   # links followed, hard links too: the same file by its identity
        if (status.st_dev, status.st_ino) in seen:
            raise UserInputError(f"{path}: given twice as {option} (also as {seen[status.st_dev, status.st_ino]})")
        seen[status.st_dev, status.st_ino] = path
    return found
