"""Generated data (mock universes, synthetic climate fields and events, a dataset's subset) fills a folder whole.

It only ever fills a folder that is absent or empty (:func:`require_fillable`): it is written into a new work
folder beside it, created by the same call, which is renamed into place when complete (:func:`generated_folder`).
A folder that holds anything is an error naming what was expected and what was found.  The work folder of a
killed generation is removed by the next generation of the same folder (its lock, held for the generation's life,
is free).  One file or a command's set of files is written by the output transaction instead
(:mod:`common.storage.transaction`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import pathlib
import re
import shutil
import tempfile

from common.errors import DataError
from common.storage.outputs import folder_summary, honour_umask
from common.storage.scratch import remove_if_abandoned
from common.storage.transaction import fault, terminate_as_interrupt

log = logging.getLogger(__name__)

# The lock file of a work folder of :func:`generated_folder`: flocked by the generating process for its life.
WORK_LOCK = ".hpc-dl-suite-work.lock"
# The work folders this process is filling: a generation asked to fill one of them (a generator called inside
# another's block) fills it in place, the outer generation's rename making the whole appear at once.
_working_in: set[pathlib.Path] = set()


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


@contextlib.contextmanager
def generated_folder(target, expected: str):
    """Yield a new folder to fill; when the block completes it becomes ``target``.

    ``target`` must be absent or empty (:func:`require_fillable`).  The work
    folder is created here, beside ``target``, and removed here if the block
    fails (SIGTERM included, where nothing else handles it).  It holds a lock
    file, flocked for the generation's life, so that the work folder of a
    process killed outright (SIGKILL, a lost node) is removed by the next
    generation of the same ``target`` (:func:`sweep_work_folders`), while a
    running generation's is never touched: the only folders this ever removes.
    A ``target`` that is a symbolic
    link to an empty folder is written through: the work folder is made beside
    the folder it points to and renamed onto it, and the link is left as it is.
    Whatever would stop the final rename that can be known before the work (a
    folder that cannot be created or written beside, a mount point, which no
    rename can replace) is refused here, before any work, with one line.
    """
    target = pathlib.Path(target)
    if target.resolve() in _working_in:   # a generation inside this process's own (a dataset and its statistics)
        yield target
        return
    require_fillable(target, expected)
    destination = pathlib.Path(os.path.realpath(target)) if target.is_symlink() else target
    through = f" (the folder {target} links to)" if destination != target else ""
    if os.path.ismount(destination):
        raise DataError(f"{destination}{through}: a mount point; the generated {expected} is renamed into place "
                        "when complete, which a mount point cannot take: name a new folder inside it; "
                        "nothing was written")
    existing = destination.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise DataError(f"{destination}{through}: cannot be created: {existing} is a file, not a folder; "
                        "nothing was written")
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        sweep_work_folders(destination)
        work, lock_fd = _claim_work_folder(destination)
    except OSError as exc:
        raise DataError(f"{destination}{through}: cannot create a work folder in {destination.parent} "
                        f"({exc.strerror}), where the generated data is written before it is renamed into place; "
                        "nothing was written") from None
    honour_umask(work, directory=True)
    _working_in.add(work.resolve())
    try:
        with terminate_as_interrupt():
            yield work
            fault("staged", destination.name)
        try:
            if lock_fd is not None:   # held until the rename: a folder without its lock file is never swept
                os.unlink(work / WORK_LOCK)
            os.rename(work, destination)   # onto an absent or empty folder only; atomic
        except OSError as exc:
            require_fillable(destination, expected)   # something appeared there meanwhile: say what
            raise DataError(f"{destination}{through}: the generated {expected} could not be renamed into place "
                            f"({exc.strerror}); nothing was written") from None
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    finally:
        _working_in.discard(work.resolve())
        if lock_fd is not None:
            os.close(lock_fd)


def _work_folder_pattern(destination: pathlib.Path) -> re.Pattern:
    """The names of ``destination``'s work folders (``.<name>.<mkdtemp's random part>.partial``) and no others."""
    return re.compile(re.escape(f".{destination.name}.") + r"[A-Za-z0-9_]+\.partial")


def _claim_work_folder(destination: pathlib.Path) -> tuple[pathlib.Path, int | None]:
    """A new work folder beside ``destination`` and the descriptor of its flocked lock file (None on a file
    system without locks: then it has no lock file, and no sweep ever takes it)."""
    work = pathlib.Path(tempfile.mkdtemp(prefix=f".{destination.name}.", suffix=".partial", dir=destination.parent))
    try:
        # Locked before it gets its name: a process sweeping at the same instant never sees it free.
        fd = os.open(work / f"{WORK_LOCK}.new", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            os.unlink(work / f"{WORK_LOCK}.new")
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
            return work, None
        os.rename(work / f"{WORK_LOCK}.new", work / WORK_LOCK)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return work, fd


def sweep_work_folders(destination) -> list[pathlib.Path]:
    """Remove the work folders of earlier generations of ``destination`` that ended without removing theirs (a
    SIGKILL, a lost node): folders beside it named as :func:`generated_folder` names them, holding its lock
    file, whose lock no process holds.  A generation still running holds its lock: its folder is left alone."""
    destination = pathlib.Path(destination)
    pattern = _work_folder_pattern(destination)
    try:
        candidates = [entry for entry in destination.parent.iterdir() if pattern.fullmatch(entry.name)]
    except OSError:
        return []
    removed = [folder for folder in candidates if remove_if_abandoned(folder, WORK_LOCK)]   # a running one holds it
    if removed:
        log.warning(f"{destination.parent}: removed {len(removed)} work folder(s) of an earlier generation of "
                    f"{destination.name} that ended before it finished ({', '.join(f.name for f in removed)})")
    return removed
