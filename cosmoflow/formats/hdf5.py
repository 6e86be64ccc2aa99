"""CosmoFlow's HDF5 files, both told by their datasets:

- raw universes (mlcommons/hpc ``cosmoflow/prepare.py``'s input): ``full`` int16 counts (N, N, N, C)
  channels last, ``unitPar`` (and ``namePar``, which gives the target order); each volume is cut into
  (N / crop)^3 crops of ``data.sample_shape``, in C order over the crop grid;
- split crops (``prepare.py`` without ``--write-tfrecord``): ``x`` (one crop) and ``y`` per file.
"""

from __future__ import annotations

import h5py
import numpy as np

from common.errors import DataError
from common.storage.data import reading
from cosmoflow.formats.layout import SampleLayout, file_targets

PATTERNS = ("*.h5", "*.hdf5")
RAW, SPLIT = "raw_hdf5", "split_hdf5"   # the two kinds' names (SampleLayout.kind)
FILE_FORMAT = {RAW: "raw HDF5 universes (full, unitPar), cut into crops",
         SPLIT: "split HDF5 crops (x, y; prepare.py)"}
TARGETS_DATASET = {RAW: "unitPar", SPLIT: "y"}


def file_layout(path: str, cfg) -> tuple[int, SampleLayout]:
    """(crops in the file, its layout) after checking its datasets: raw universes or split crops."""
    data = cfg.data
    crop = data.sample_shape
    try:
        with h5py.File(path, "r") as f:
            if "full" in f and "unitPar" in f:
                kind, x_key, y_key = RAW, "full", "unitPar"
            elif "x" in f and "y" in f:
                kind, x_key, y_key = SPLIT, "x", "y"
            else:
                raise DataError(f"{path}: expected datasets 'full' and 'unitPar' (raw universes) or 'x' and 'y' "
                                f"(split by prepare.py); found {sorted(f)[:6]}")
            shape, dtype, targets = f[x_key].shape, f[x_key].dtype, f[y_key].shape
            name_par = f["namePar"][()] if "namePar" in f else None
    except OSError as exc:
        raise DataError(f"{path}: not a readable HDF5 file ({exc})") from None
    if len(shape) != 4 or shape[3] != crop[3]:
        raise DataError(f"{path}: '{x_key}' has shape {shape}, expected (N, N, N, {crop[3]}) channels last")
    if kind == SPLIT and tuple(shape) != tuple(crop):
        raise DataError(f"{path}: 'x' has shape {shape}, expected data.sample_shape {tuple(crop)}")
    if any(s % c for s, c in zip(shape[:3], crop[:3])):
        raise DataError(f"{path}: 'full' shape {shape[:3]} is not a multiple of the crop {crop[:3]}")
    if len(targets) != 1:
        raise DataError(f"{path}: '{y_key}' has shape {targets}, expected one value per target")
    if not np.issubdtype(dtype, np.integer):
        raise DataError(f"{path}: '{x_key}' has dtype {dtype}, expected integer particle counts")
    names, source = file_targets(data, targets[0], path, name_par)
    crops = int(np.prod([s // c for s, c in zip(shape[:3], crop[:3])]))
    return crops, SampleLayout(kind, "int16", names, source, FILE_FORMAT[kind])


def read_crop(path, index, crop):
    """Crop number ``index`` (C order over the crop grid) of a raw file, or the one crop of a split file."""
    path = path.decode() if isinstance(path, bytes) else str(path)
    with reading(path, f"crop {int(index)}"), h5py.File(path, "r") as f:
        split = "x" in f and "full" not in f
        if split:
            x, y = f["x"][()], f["y"][:]
        else:
            full = f["full"]
            per_side = [s // c for s, c in zip(full.shape[:3], crop[:3])]
            i, j, k = np.unravel_index(int(index), per_side)
            x = full[i * crop[0]:(i + 1) * crop[0], j * crop[1]:(j + 1) * crop[1], k * crop[2]:(k + 1) * crop[2], :]
            y = f["unitPar"][:]
    if not np.all(np.isfinite(y)):
        raise DataError(f"{path}: '{'y' if split else 'unitPar'}' holds NaN or Inf")
    return np.asarray(x, np.int16), np.asarray(y, np.float32)


def read_targets(path: str, layout: SampleLayout) -> np.ndarray:
    """The targets, in file order, of a file of ``layout`` (float32; a raw universe's one set for all its crops)."""
    with h5py.File(path, "r") as f:
        return np.asarray(f[TARGETS_DATASET[layout.kind]][:], np.float32)
