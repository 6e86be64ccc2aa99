"""CosmoFlow's HDF5 files, both told by their datasets:

- raw universes (mlcommons/hpc ``cosmoflow/prepare.py``'s input): ``full`` int16 counts (N, N, N, C)
  channels last, ``unitPar`` (and ``namePar``, which gives the target order); each volume is cut into
  (N / crop)^3 crops of ``data.sample_shape``, in C order over the crop grid;
- split crops (``prepare.py`` without ``--write-tfrecord``): ``x`` (one crop) and ``y`` per file.
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np

from common.deferred import h5py   # imported at first use: the formats' table is read without it
from common.deferred import DeferredModule
from common.deferred import tensorflow as tf
from common.distributed import Distributed
from common.errors import DataError
from common.loop import epochs
from common.storage.data import list_files, reading, screen_files, select_count
from common.storage.outputs import mark_hdf5
from cosmoflow.config import TARGET_NAMES
from cosmoflow.formats.layout import SampleLayout, Selection, file_targets

staging = DeferredModule("common.storage.staging")   # at a stage: its CRC-32C library is not in every environment

NAME = "hdf5"
WHAT = "HDF5"   # the family in messages
PATTERNS = ("*.h5", "*.hdf5")
RAW, SPLIT = "raw_hdf5", "split_hdf5"   # the two kinds' names (SampleLayout.kind)
FILE_FORMAT = {RAW: "raw HDF5 universes (full, unitPar), cut into crops",
         SPLIT: "split HDF5 crops (x, y; prepare.py)"}
TARGETS_DATASET = {RAW: "unitPar", SPLIT: "y"}
# The data.compression values its files are written in (cosmoflow.mock) and read in: HDF5 files as they are.
COMPRESSIONS = ("none",)
# A raw universe is a volume cut into crops of data.sample_shape (cosmoflow.mock --crops-per-side).
HOLDS_CROPS = True


def recognises(path) -> bool:
    """Whether ``path`` is an HDF5 file (by its signature, whatever its name)."""
    return h5py.is_hdf5(path)


def file_layout(path: str, cfg, require_targets: bool = True) -> tuple[int, SampleLayout]:
    """(crops in the file, its layout) after checking its datasets: raw universes or split crops.  Without
    ``require_targets`` (prediction) a file without ``unitPar`` / ``y`` is taken too: its layout names no targets."""
    data = cfg.data
    crop = data.sample_shape
    try:
        with h5py.File(path, "r") as f:
            if "full" in f and ("unitPar" in f or not require_targets):
                kind, x_key, y_key = RAW, "full", "unitPar"
            elif "x" in f and ("y" in f or not require_targets):
                kind, x_key, y_key = SPLIT, "x", "y"
            else:
                raise DataError(f"{path}: expected datasets 'full' and 'unitPar' (raw universes) or 'x' and 'y' "
                                f"(split by prepare.py); found {sorted(f)[:6]}")
            shape, dtype = f[x_key].shape, f[x_key].dtype
            targets = f[y_key].shape if y_key in f else None
            name_par = f["namePar"][()] if "namePar" in f else None
    except OSError as exc:
        raise DataError(f"{path}: not a readable HDF5 file ({exc})") from None
    if len(shape) != 4 or shape[3] != crop[3]:
        raise DataError(f"{path}: '{x_key}' has shape {shape}, expected (N, N, N, {crop[3]}) channels last")
    if kind == SPLIT and tuple(shape) != tuple(crop):
        raise DataError(f"{path}: 'x' has shape {shape}, expected data.sample_shape {tuple(crop)}")
    if any(s % c for s, c in zip(shape[:3], crop[:3])):
        raise DataError(f"{path}: 'full' shape {shape[:3]} is not a multiple of the crop {crop[:3]}")
    if targets is not None and len(targets) != 1:
        raise DataError(f"{path}: '{y_key}' has shape {targets}, expected one value per target")
    if not np.issubdtype(dtype, np.integer):
        raise DataError(f"{path}: '{x_key}' has dtype {dtype}, expected integer particle counts")
    names, source = file_targets(data, targets[0], path, name_par) if targets is not None else \
        ((), f"none: the file has no '{y_key}'")
    crops = int(np.prod([s // c for s, c in zip(shape[:3], crop[:3])]))
    return crops, SampleLayout(kind, "int16", names, source, FILE_FORMAT[kind])


def read_crop(path, index, crop):
    """Crop number ``index`` (C order over the crop grid) of a raw file, or the one crop of a split file."""
    path = path.decode() if isinstance(path, bytes) else str(path)
    with reading(path, f"crop {int(index)}"), h5py.File(path, "r") as f:
        split = "x" in f and "full" not in f
        if split:
            x, y = f["x"][()], f["y"][:] if "y" in f else np.zeros(0)   # a file without targets: prediction
        else:
            full = f["full"]
            per_side = [s // c for s, c in zip(full.shape[:3], crop[:3])]
            i, j, k = np.unravel_index(int(index), per_side)
            x = full[i * crop[0]:(i + 1) * crop[0], j * crop[1]:(j + 1) * crop[1], k * crop[2]:(k + 1) * crop[2], :]
            y = f["unitPar"][:] if "unitPar" in f else np.zeros(0)
    x_key, y_key = ("x", "y") if split else ("full", "unitPar")
    if not np.all(np.isfinite(y)):
        raise DataError(f"{path}: '{y_key}' holds NaN or Inf")
    if y.size and np.max(np.abs(y)) > np.finfo(np.float32).max:   # finite here, infinite as the network's float32
        raise DataError(f"{path}: '{y_key}' holds {float(np.max(np.abs(y))):.3g}, beyond float32's range")
    if x.dtype != np.int16 and x.size and (x.min() < np.iinfo(np.int16).min or x.max() > np.iinfo(np.int16).max):
        # counts are read as int16 (the published files' type): a wider one must fit, never wrap around
        bad = x.max() if x.max() > np.iinfo(np.int16).max else x.min()
        raise DataError(f"{path}: '{x_key}' (crop {int(index)}) holds the count {int(bad)}, beyond int16's "
                        f"{np.iinfo(np.int16).min}..{np.iinfo(np.int16).max} (the published files' type)")
    return np.asarray(x, np.int16), np.asarray(y, np.float32)


def file_targets_of(path: str, layout: SampleLayout) -> np.ndarray:
    """The targets, in file order, of a file of ``layout`` (float32; a raw universe's one set for all its crops)."""
    with h5py.File(path, "r") as f:
        return np.asarray(f[TARGETS_DATASET[layout.kind]][:], np.float32)


# -- the family's protocol (cosmoflow/formats/__init__.py) ---------------------------------------------------

def select(cfg, directory: pathlib.Path, requested: int | None, key: str | None, dist: Distributed) -> Selection:
    """The files of ``directory`` listed and screened (datasets and shapes checked, one layout for all), and the
    first (file, crop) pairs the samples used are."""
    data = cfg.data
    files = list_files(directory, PATTERNS, f"CosmoFlow {directory.name} {WHAT}", data.on_bad_file)
    files, found, problems = screen_files(files, lambda f: file_layout(f, cfg), dist, data.on_bad_file,
                                          str(directory))
    layouts = {layout for _, layout in found.values()}
    if len(layouts) > 1:
        raise DataError(f"{directory}: files of different layouts or target orders: "
                        + "; ".join(sorted(layout.describe() for layout in layouts)))
    used = select_count(sum(n for n, _ in found.values()), requested, key, str(directory))
    return Selection([(f, c) for f in files for c in range(found[f][0])][:used], used, layouts.pop(),
                     tuple(problems))


def read(cfg, selection: Selection, dist: Distributed, seed, training: bool):
    """(x int16, y float32 in file order, file name, True) per crop for this rank, shuffled with ``seed`` when
    training (a seed stream of its own: 1)."""
    shape, layout = tuple(cfg.data.sample_shape), selection.layout
    share = epochs.rank_share((tf.constant([p for p, _ in selection.items]),
                               tf.constant([c for _, c in selection.items], dtype=tf.int64)),
                              dist, seed, shuffle=training, stream=dist.rank if selection.staged else 1,
                              this_rank_only=selection.staged)

    def load(path, crop_index):
        x, y = tf.numpy_function(lambda p, c: read_crop(p, c, shape), [path, crop_index],
                                 [tf.int16, tf.float32], stateful=False)
        x.set_shape(shape)
        y.set_shape([len(layout.targets)])
        return x, y, path, tf.constant(True)   # HDF5 shapes are checked per file at start-up

    return share.samples(share.items.map(load, num_parallel_calls=epochs.AUTOTUNE))


def stage(cfg, selection: Selection, dist: Distributed):
    """(this family, the selection of this rank's copies in ``data.stage_dir``), staged now: whole files, each
    with every crop it holds, copied to the rank that takes the file (a fixed share, as TFRecords are)."""
    sources = list(dict.fromkeys(path for path, _ in selection.items))
    copies = staging.stage_files(sources, cfg.data.stage_dir, dist, data_dir=cfg.data.data_dir)
    copy_of = dict(zip(sources[dist.rank::dist.size], copies))
    items = [(copy_of[path], crop) for path, crop in selection.items if path in copy_of]
    return sys.modules[__name__], Selection(items, selection.count, selection.layout, selection.problems,
                                            compression="none", staged=True)


def bad_file_finder(cfg, selection: Selection):
    """None: the HDF5 reader names its file itself."""
    return None


def read_targets(cfg, selection: Selection, where: str):
    """The targets, in file order, of the crops selected (float32; a raw universe's one set for all its crops)."""
    per_file = {path: file_targets_of(path, selection.layout) for path in dict.fromkeys(p for p, _ in selection.items)}
    return [per_file[p] for p, _ in selection.items]


def file_samples(cfg, path: str, layouts: dict):
    """(where, x, y in file order, layout) of every crop of ``path`` after its datasets are checked: what the
    data checker checks."""
    crops, layout = file_layout(path, cfg)
    for crop in range(crops):
        x, y = read_crop(path, crop, cfg.data.sample_shape)
        yield f"crop {crop}", x, y, layout


def file_selection(cfg, path: str) -> Selection:
    """Every crop of one file (without ``unitPar`` / ``y`` too: its layout then names no targets), for prediction."""
    crops, layout = file_layout(path, cfg, require_targets=False)
    return Selection([(path, crop) for crop in range(crops)], crops, layout, compression="none")


# -- writing: cosmoflow.mock's files ---------------------------------------------------------------------------

def file_name(stem: str, compression: str) -> str:
    """The name of a file of this family holding the sample ``stem`` (``compression`` is one of
    :data:`COMPRESSIONS`: always "none")."""
    return f"{stem}.h5"


def write_sample(path, x: np.ndarray, y: np.ndarray, physical: np.ndarray, compression: str) -> None:
    """One mock universe as a raw-format file: ``x`` (int16 counts) as ``full``, ``y`` as ``unitPar``, the
    ``physical`` parameters as ``physPar`` (``compression``: always "none", :data:`COMPRESSIONS`)."""
    write_hdf5(path, x, y, physical)


def write_hdf5(path, full: np.ndarray, unit_par: np.ndarray, physical: np.ndarray | None = None) -> None:
    """A raw-format file: ``full`` (counts, channels last) and ``unitPar`` (targets in [-1, 1])."""
    with h5py.File(path, "w") as f:
        mark_hdf5(f, "cosmoflow.mock")
        f.create_dataset("full", data=np.asarray(full, np.int16), chunks=True)
        f.create_dataset("unitPar", data=np.asarray(unit_par, np.float32))
        f.create_dataset("namePar", data=np.array(TARGET_NAMES, dtype="S"))   # as the real files name them
        if physical is not None:
            f.create_dataset("physPar", data=np.asarray(physical, np.float64))
            f["physPar"].attrs["names"] = ",".join(TARGET_NAMES)
