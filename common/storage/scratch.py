"""Each process's temporary files in a folder of its own, removed when it ends: nothing left in ``/tmp``.

TensorFlow's AutoGraph writes every function it converts to ``/tmp/__autograph_generated_file*.py`` and
removes them in an ``atexit`` handler, which the entry points' ``os._exit`` (``common.cli.exit_process``)
skips: about 12 files a training process, thousands a day on a compute node's small ``/tmp``.  So every
process of the suite points Python's ``tempfile`` at a new folder of its own,
``$TMPDIR/hpc-dl-suite-scratch-<pid>-<random>/``, holds an advisory lock on it for its life, and removes it
on the way out (``exit_process`` and ``atexit``).  A process killed outright (SIGKILL, a lost node) cannot:
the next process of the suite on the machine removes every such folder whose lock no process holds.  Only
folders of that name holding the suite's lock file are ever removed.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import pathlib
import shutil
import tempfile

PREFIX = "hpc-dl-suite-scratch-"
LOCK = ".lock"

_folder: pathlib.Path | None = None
_lock_fd: int | None = None


def install() -> pathlib.Path | None:
    """Give this process its own temporary folder (once), after removing those of ended processes; None when
    the temporary folder cannot be written (then ``tempfile`` is left as it is)."""
    global _folder, _lock_fd
    if _folder is not None:
        return _folder
    base = pathlib.Path(tempfile.gettempdir())
    try:
        sweep(base)
        folder = pathlib.Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=base))
        # Locked before it gets its name: a process sweeping at the same instant never sees it free.
        fd = os.open(folder / f"{LOCK}.new", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(folder / f"{LOCK}.new", folder / LOCK)
    except OSError:
        return None
    _folder, _lock_fd = folder, fd
    tempfile.tempdir = str(folder)
    atexit.register(remove)   # registered before TensorFlow's handlers, so it runs after them
    return folder


def current() -> pathlib.Path | None:
    """This process's folder (None when it has none)."""
    return _folder


def remove() -> None:
    """Remove this process's folder (what it holds was written by this process's libraries)."""
    global _folder, _lock_fd
    if _folder is None:
        return
    folder, _folder = _folder, None
    if tempfile.tempdir == str(folder):
        tempfile.tempdir = None
    shutil.rmtree(folder, ignore_errors=True)
    if _lock_fd is not None:
        os.close(_lock_fd)
        _lock_fd = None


def sweep(base: pathlib.Path) -> list[pathlib.Path]:
    """Remove the folders of this kind under ``base`` whose process has ended (their lock is free); the list."""
    return [folder for folder in base.glob(f"{PREFIX}*") if remove_if_abandoned(folder, LOCK)]


def remove_if_abandoned(folder: pathlib.Path, lock_name: str) -> bool:
    """Remove ``folder`` when it holds the lock file ``lock_name`` and no process holds that lock (the process
    that made it ended without removing it); the lock is held meanwhile.  A link, a folder without the lock
    file or one whose lock is held is left alone.  Whether it was removed."""
    lock = folder / lock_name
    if folder.is_symlink() or not folder.is_dir() or lock.is_symlink() or not lock.is_file():
        return False
    try:
        fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False   # held: its process is alive
        shutil.rmtree(folder, ignore_errors=True)
        return True
    finally:
        os.close(fd)
