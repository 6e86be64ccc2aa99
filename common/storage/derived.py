"""Where the suite keeps what it computes from a dataset: channel statistics, class counts, maxima.

Never in the dataset's folder, which may be a user's or read-only project storage: in ``data.derived_dir``,
else a folder per dataset in the user's cache.  Files published with the data (DeepCAM's ``stats.h5``) are read
where they are.
"""

from __future__ import annotations

import hashlib
import os
import pathlib

from common.errors import DataError

DERIVED_ENV = "HPCDL_DERIVED_DIR"


def derived_dir(data) -> pathlib.Path:
    """The folder for what the suite computes from a dataset (statistics, class counts, maxima): never the
    dataset's own folder, which may be a user's or read-only.  ``data.derived_dir`` when set, else one folder per
    dataset under ``$HPCDL_DERIVED_DIR`` (default ``$XDG_CACHE_HOME/hpc-dl-suite/derived``, ``~/.cache``),
    named after the data folder and a hash of its absolute path."""
    if getattr(data, "derived_dir", None):
        return pathlib.Path(data.derived_dir).expanduser()
    root = os.environ.get(DERIVED_ENV) or pathlib.Path(
        os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "hpc-dl-suite" / "derived"
    folder = pathlib.Path(data.data_dir).expanduser().resolve()
    return pathlib.Path(root) / f"{folder.name}-{hashlib.sha256(str(folder).encode()).hexdigest()[:12]}"


def derived_file(data, name: str, shipped: pathlib.Path | None = None) -> pathlib.Path:
    """Where a file computed from the dataset is read: the suite's own in :func:`derived_dir` when there is one,
    else ``shipped`` (default ``data_dir/name``: published with the data, or written by an earlier version)
    when that exists, else the path in :func:`derived_dir` to write it to."""
    own = derived_dir(data) / name
    shipped = pathlib.Path(data.data_dir) / name if shipped is None else shipped
    return shipped if not own.is_file() and shipped.is_file() else own


def writable_derived(path: pathlib.Path) -> pathlib.Path:
    """``path`` (a file in :func:`derived_dir`), checked to be one its folder can take (made by the write's
    transaction, which removes it again if the write fails); a one-line error naming the folder and
    ``data.derived_dir`` when it cannot be."""
    existing = path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise DataError(f"{path.parent}: cannot be created to hold {path.name} ({existing} is not a writable "
                        "folder); set data.derived_dir to a writable folder")
    return path
