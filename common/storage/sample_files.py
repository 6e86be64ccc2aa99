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

import os
import stat


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
