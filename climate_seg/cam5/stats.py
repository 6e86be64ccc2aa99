"""Per-channel statistics and class frequencies of a directory of training samples.

    python -m climate_seg.cam5.stats DIR [--out DIR/../stats.h5]      # segmentation samples or ExtremeWeather files
    horovodrun -np N python -m climate_seg.cam5.stats DIR      # each rank reads a share

Reads, by content, the three statistics files in use (:func:`load_stats`):
this suite's (root ``mean``, ``std``, ``min``, ``max``, ``class_frequencies``),
DeepCAM's (``climate/minval``, ``maxval``, ``mean``, ``sqmean``, ``count``,
at the data root) and SC18 ClimDeepLearn's (``climate/stats`` (16, 4) of
[mean, max, min, std], in each split folder).  Neither published file holds
class frequencies; :func:`write_class_counts` counts them into a file of
their own in the derived folder (never the data folder).

One streaming pass: each file adds its count, mean and sum of squared
deviations (merged with Chan et al.'s pairwise formula in float64, so no
second pass and no precision loss over millions of pixels), its minimum and
maximum per channel, and its label counts.  Ranks merge their partial results
in file order.  Writes ``stats.h5``: ``mean``, ``std``, ``min``, ``max`` (16
each, channel order in the ``channels`` attribute), ``count`` (pixels),
``class_counts`` and ``class_frequencies`` (background, cyclone, river).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib

import h5py
import numpy as np

from climate_seg.cam5.config import CHANNELS, CLASS_NAMES
from common.cli import exit_process, run_command
from common.console import logs
from common.errors import DataError
from common.storage.derived import derived_file
from common.storage.outputs import mark_hdf5
from common.storage.transaction import file_transaction, write_json_file, written_file

TOOL = "climate_seg.cam5.stats"
HOW = "pass --force to replace it, or --out to write elsewhere"

# Imported where used, not here: common.distributed and common.storage.data (TensorFlow), only in the command: the
# readers here stay TensorFlow-free.

N_CHANNELS = len(CHANNELS)


@dataclasses.dataclass
class RunningStats:
    """Mergeable per-channel moments (float64) and label counts."""

    count: int = 0
    mean: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(N_CHANNELS))
    m2: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(N_CHANNELS))
    minimum: np.ndarray = dataclasses.field(default_factory=lambda: np.full(N_CHANNELS, np.inf))
    maximum: np.ndarray = dataclasses.field(default_factory=lambda: np.full(N_CHANNELS, -np.inf))
    class_counts: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(len(CLASS_NAMES), np.int64))

    @classmethod
    def of(cls, data: np.ndarray, labels: np.ndarray | None = None) -> "RunningStats":
        """Statistics of ``data`` (..., channels); class counts from pixel ``labels`` when there are any."""
        pixels = data.reshape(-1, data.shape[-1]).astype(np.float64)
        mean = pixels.mean(axis=0)
        counts = np.zeros(len(CLASS_NAMES), np.int64) if labels is None else \
            np.bincount(labels.reshape(-1), minlength=len(CLASS_NAMES)).astype(np.int64)
        return cls(count=len(pixels), mean=mean, m2=((pixels - mean) ** 2).sum(axis=0),
                   minimum=pixels.min(axis=0), maximum=pixels.max(axis=0), class_counts=counts)

    def merge(self, other: "RunningStats") -> "RunningStats":
        """The statistics of both sets of samples together (Chan et al.'s pairwise update of mean and M2)."""
        if other.count == 0:
            return self
        if self.count == 0:
            return other
        total = self.count + other.count
        delta = other.mean - self.mean
        return RunningStats(count=total, mean=self.mean + delta * other.count / total,
                            m2=self.m2 + other.m2 + delta ** 2 * self.count * other.count / total,
                            minimum=np.minimum(self.minimum, other.minimum),
                            maximum=np.maximum(self.maximum, other.maximum),
                            class_counts=self.class_counts + other.class_counts)

    @property
    def std(self) -> np.ndarray:
        """The population standard deviation per channel."""
        return np.sqrt(self.m2 / max(self.count, 1))


LABEL_KEYS = ("climate/labels_0", "climate/labels")   # DeepCAM, SC18


def sample_layout(handle, path: str, grid: tuple[int, int] | None = None) -> tuple[bool, str] | None:
    """(channels first?, label dataset) of an open sample file; None for a statistics file (SC18 keeps
    ``stats.h5`` among the samples); a DataError for anything else."""
    if "climate/data" not in handle:
        if is_statistics(handle):
            return None
        raise DataError(f"{path}: expected datasets climate/data and climate/labels_0 (DeepCAM) or "
                        f"climate/labels (SC18); found {sorted(handle)[:6]}")
    label_key = next((key for key in LABEL_KEYS if key in handle), None)
    if label_key is None:
        raise DataError(f"{path}: expected a label dataset climate/labels_0 (DeepCAM) or climate/labels (SC18) "
                        "beside climate/data")
    shape, labels = handle["climate/data"].shape, handle[label_key].shape
    if len(shape) != 3 or N_CHANNELS not in (shape[0], shape[-1]):
        raise DataError(f"{path}: climate/data has shape {shape}; expected (H, W, {N_CHANNELS}) or ({N_CHANNELS}, H, W)")
    # Channels first (SC18) when the first axis holds the channels and the labels match the other two.
    channels_first = shape[0] == N_CHANNELS and labels == shape[1:] and not (shape[-1] == N_CHANNELS
                                                                              and labels == shape[:2])
    spatial = shape[1:] if channels_first else shape[:2]
    if grid is not None and tuple(spatial) != tuple(grid):
        raise DataError(f"{path}: climate/data has shape {shape}, expected {(*grid, N_CHANNELS)} or "
                        f"{(N_CHANNELS, *grid)} (data.grid={list(grid)})")
    if labels != tuple(spatial):
        raise DataError(f"{path}: {label_key} has shape {labels}, expected {tuple(spatial)}")
    return channels_first, label_key


def read_sample(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(data H x W x 16, labels H x W) of one training file, either layout, with its layout checked."""
    try:
        with h5py.File(path, "r") as f:
            layout = sample_layout(f, path)
            if layout is None:
                raise DataError(f"{path}: a statistics file, not a sample")
            channels_first, label_key = layout
            data, labels = f["climate/data"][()], f[label_key][()]
    except OSError as exc:
        raise DataError(f"{path}: not a readable HDF5 file ({exc})") from None
    if channels_first:
        data = np.transpose(data, (1, 2, 0))
    if not np.all(np.isfinite(labels)) or np.any(labels != np.round(labels)):
        raise DataError(f"{path}: {label_key} holds values that are not whole class numbers")
    return data, labels.astype(np.int64)


def file_stats(path: str) -> RunningStats:
    """One file's statistics: a segmentation sample (``climate/data``) or an ExtremeWeather file
    (``images`` (N, C, H, W), read 16 snapshots at a time; no pixel labels, so no class counts)."""
    try:
        with h5py.File(path, "r") as f:
            if "images" in f:
                images = f["images"]
                if images.ndim != 4:
                    raise DataError(f"{path}: images has shape {images.shape}, expected (N, C, H, W)")
                total = RunningStats()
                for start in range(0, images.shape[0], 16):
                    block = np.transpose(images[start:start + 16], (0, 2, 3, 1))
                    if not np.all(np.isfinite(block)):
                        raise DataError(f"{path}: images[{start}:{start + 16}] hold NaN or Inf")
                    total = total.merge(RunningStats.of(block))
                return total
            if "climate/data" not in f and is_statistics(f):
                return RunningStats()   # SC18 keeps its stats.h5 among the samples: not a sample
    except OSError as exc:
        raise DataError(f"{path}: not a readable HDF5 file ({exc})") from None
    data, labels = read_sample(path)
    if not np.all(np.isfinite(data)):
        raise DataError(f"{path}: climate/data holds NaN or Inf")
    if labels.min() < 0 or labels.max() >= len(CLASS_NAMES):
        raise DataError(f"{path}: labels hold values outside 0-{len(CLASS_NAMES) - 1} ({', '.join(CLASS_NAMES)})")
    return RunningStats.of(data, labels)


def is_extremeweather(path: str) -> bool:
    """Whether an HDF5 file has the ExtremeWeather layout (an ``images`` dataset) rather than the CAM5 one."""
    try:
        with h5py.File(path, "r") as f:
            return "images" in f
    except OSError:
        return False


def compute_stats(files: list[str], dist=None) -> RunningStats:
    """Statistics over ``files``; with ``dist``, each rank reads a share and all get the total."""
    rank, size = (dist.rank, dist.size) if dist is not None else (0, 1)
    partial = RunningStats()
    for path in files[rank::size]:
        partial = partial.merge(file_stats(path))
    parts = dist.allgather_object(partial) if dist is not None and size > 1 else [partial]
    total = RunningStats()
    for part in parts:
        total = total.merge(part)
    return total


def write_stats(path, stats: RunningStats, channels=CHANNELS, force: bool = False) -> None:
    """``stats.h5``, as one output transaction; a file there that this command did not write is kept (an error)
    unless ``force``."""
    with written_file(path, TOOL, force, source="the statistics of the training samples", how=HOW) as temporary, \
            h5py.File(temporary, "w") as f:
        mark_hdf5(f, TOOL)
        f["mean"], f["std"] = stats.mean, stats.std
        f["min"], f["max"] = stats.minimum, stats.maximum
        f["count"] = stats.count
        f["class_counts"] = stats.class_counts
        f["class_frequencies"] = stats.class_counts / max(stats.class_counts.sum(), 1)
        f.attrs["channels"] = ",".join(channels)
        f.attrs["classes"] = ",".join(CLASS_NAMES)


def is_statistics(handle) -> bool:
    """Whether an open HDF5 file is a statistics file of one of the three formats."""
    return ("climate/stats" in handle or "climate/minval" in handle
            or all(key in handle for key in ("mean", "std", "min", "max")))


def locate_stats(data_dir, stats_file: str = "stats.h5") -> pathlib.Path:
    """The statistics file of a dataset: ``data_dir/stats_file`` (this suite, DeepCAM), else SC18's
    ``data_dir/train/stats.h5``; the first path when neither exists."""
    preferred = pathlib.Path(data_dir) / stats_file
    sc18 = pathlib.Path(data_dir) / "train" / "stats.h5"
    if not preferred.is_file() and sc18.is_file():
        try:
            with h5py.File(sc18, "r") as f:
                if "climate/stats" in f:
                    return sc18
        except OSError:
            pass
    return preferred


def load_stats(path) -> dict:
    """Per-channel ``mean``, ``std``, ``min``, ``max`` (float64), ``format``, and ``class_frequencies``
    when the file has them, from any of the three formats; a one-line error naming the file otherwise."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise DataError(f"{path}: channel statistics not found; run python -m climate_seg.cam5.stats <train dir> "
                        f"--out {path}")
    try:
        with h5py.File(path, "r") as f:
            if "climate/stats" in f:
                table = np.asarray(f["climate/stats"][()], np.float64)
                if table.shape != (N_CHANNELS, 4):
                    raise DataError(f"{path}: climate/stats has shape {table.shape}, expected ({N_CHANNELS}, 4): "
                                    "[mean, max, min, std] per channel (SC18)")
                out = {"mean": table[:, 0], "max": table[:, 1], "min": table[:, 2], "std": table[:, 3],
                       "format": "SC18 climate/stats [mean, max, min, std]"}
            elif "climate/minval" in f:
                missing = [k for k in ("minval", "maxval", "mean", "sqmean") if f"climate/{k}" not in f]
                if missing:
                    raise DataError(f"{path}: DeepCAM statistics without climate/{', climate/'.join(missing)}")
                mean = np.asarray(f["climate/mean"][()], np.float64)
                variance = np.asarray(f["climate/sqmean"][()], np.float64) - mean ** 2
                out = {"mean": mean, "std": np.sqrt(np.maximum(variance, 0.0)),
                       "min": np.asarray(f["climate/minval"][()], np.float64),
                       "max": np.asarray(f["climate/maxval"][()], np.float64),
                       "format": "DeepCAM climate/{minval,maxval,mean,sqmean}"}
            else:
                out = {key: np.asarray(f[key][()], np.float64) for key in ("mean", "std", "min", "max")}
                out["format"] = "hpc-dl-suite mean/std/min/max"
                if "class_frequencies" in f:
                    out["class_frequencies"] = np.asarray(f["class_frequencies"][()], np.float64)
    except (OSError, KeyError) as exc:
        raise DataError(f"{path}: expected DeepCAM (climate/minval, climate/maxval, ...), SC18 (climate/stats) or "
                        f"this suite's statistics (mean, std, min, max) ({exc})") from None
    for key in ("mean", "std", "min", "max"):
        if out[key].shape != (N_CHANNELS,) or not np.all(np.isfinite(out[key])):
            raise DataError(f"{path}: {key} must hold {N_CHANNELS} finite values, one per channel "
                            f"({out['format']})")
    if np.any(out["max"] < out["min"]):
        raise DataError(f"{path}: a channel's maximum is below its minimum ({out['format']})")
    return out


CLASS_COUNTS_FILE = "class_counts.json"


def class_counts_path(data, stats_path) -> pathlib.Path:
    """Where the class counts of a dataset whose statistics lack them are kept: the derived folder
    (:func:`common.storage.derived.derived_dir`); one beside the statistics file (where versions before
    2026-12-04 wrote it) is read when the derived folder has none."""
    return derived_file(data, CLASS_COUNTS_FILE, pathlib.Path(stats_path).with_name(CLASS_COUNTS_FILE))


def write_class_counts(path, files: list[str]) -> np.ndarray:
    """Label counts over ``files`` into a JSON file of this suite's (never over another's); the frequencies."""
    counts = np.zeros(len(CLASS_NAMES), np.int64)
    for sample in files:
        _, labels = read_sample(sample)
        if labels.min() < 0 or labels.max() >= len(CLASS_NAMES):
            raise DataError(f"{sample}: labels hold values outside 0-{len(CLASS_NAMES) - 1}")
        counts += np.bincount(labels.reshape(-1), minlength=len(CLASS_NAMES))
    write_json_file(path, {"classes": list(CLASS_NAMES), "counts": counts.tolist(), "files": len(files)}, TOOL,
                    source=f"the labels of {len(files)} training samples")
    return counts / max(counts.sum(), 1)


def load_class_frequencies(stats: dict, stats_path, data) -> np.ndarray:
    """The class frequencies: from the statistics file, else from the class-counts file
    (:func:`class_counts_path`)."""
    if "class_frequencies" in stats:
        return stats["class_frequencies"]
    path = class_counts_path(data, stats_path)
    if not path.is_file():
        raise DataError(f"{stats_path}: holds no class frequencies ({stats['format']}) and {path} is missing; "
                        "training counts them there first (on several nodes, set data.derived_dir to a folder "
                        "they all see), or give loss.class_weights as three numbers")
    counts = np.asarray(json.loads(path.read_text())["counts"], np.float64)
    return counts / max(counts.sum(), 1)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m climate_seg.cam5.stats", description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="directory of training samples (*.h5)")
    parser.add_argument("--out", help="output file (default: stats.h5 beside the directory)")
    parser.add_argument("--force", action="store_true", help="replace an existing file this suite did not write")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from common import distributed   # deferred: imports TensorFlow and Horovod, after the arguments are parsed
    from common.storage.data import list_files

    files = list_files(args.directory, ("*.h5",), "climate sample")
    out = pathlib.Path(args.out) if args.out else pathlib.Path(args.directory).resolve().parent / "stats.h5"
    # checked before the pass: never one of the samples, nor in their folder
    file_transaction(out, TOOL, args.force, inputs=[*files, args.directory], option="--out", how=HOW)
    dist = distributed.init()
    logs.configure(dist.rank, dist.size, ("common", "climate_seg"))
    stats = compute_stats(files, dist)
    if dist.is_root:
        # ExtremeWeather files keep their channels in alphabetical order.
        write_stats(out, stats, sorted(CHANNELS) if is_extremeweather(files[0]) else CHANNELS, args.force)
        frequencies = stats.class_counts / max(stats.class_counts.sum(), 1)
        print(f"{len(files)} files, {stats.count} pixels over {dist.size} rank(s) -> {out}; class frequencies "
              + ", ".join(f"{n} {f:.4%}" for n, f in zip(CLASS_NAMES, frequencies)), flush=True)
    return 0


if __name__ == "__main__":
    exit_process(run_command(main, name=TOOL))
