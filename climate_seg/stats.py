"""Per-channel statistics and class frequencies of a directory of training samples.

    python -m climate_seg.stats DIR [--out DIR/../stats.h5]      # segmentation samples or ExtremeWeather files
    horovodrun -np N python -m climate_seg.stats DIR      # each rank reads a share

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
import pathlib

import h5py
import numpy as np

from climate_seg.config import CHANNELS, CLASS_NAMES
from common.cli import exit_on_user_error, exit_process
from common.errors import DataError
from common.outputs import atomic_path, check_replaceable, mark_hdf5

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
        return np.sqrt(self.m2 / max(self.count, 1))


def read_sample(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(data H x W x 16, labels H x W) of one training file, with its layout checked."""
    try:
        with h5py.File(path, "r") as f:
            if "climate/data" not in f or "climate/labels_0" not in f:
                raise DataError(f"{path}: expected datasets climate/data and climate/labels_0")
            data, labels = f["climate/data"][()], f["climate/labels_0"][()]
    except OSError as exc:
        raise DataError(f"{path}: not a readable HDF5 file ({exc})") from None
    if data.ndim != 3 or data.shape[-1] != N_CHANNELS or labels.shape != data.shape[:2]:
        raise DataError(f"{path}: climate/data {data.shape} and climate/labels_0 {labels.shape}; expected "
                        f"(H, W, {N_CHANNELS}) and (H, W)")
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
    except OSError as exc:
        raise DataError(f"{path}: not a readable HDF5 file ({exc})") from None
    data, labels = read_sample(path)
    if not np.all(np.isfinite(data)):
        raise DataError(f"{path}: climate/data holds NaN or Inf")
    return RunningStats.of(data, labels)


def is_extremeweather(path: str) -> bool:
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
    """``stats.h5``, atomically; a file there that this suite did not write is kept (an error) unless ``force``."""
    with atomic_path(pathlib.Path(path), force, "pass --force to replace it, or --out to write elsewhere") \
            as temporary, h5py.File(temporary, "w") as f:
        mark_hdf5(f, "climate_seg.stats")
        f["mean"], f["std"] = stats.mean, stats.std
        f["min"], f["max"] = stats.minimum, stats.maximum
        f["count"] = stats.count
        f["class_counts"] = stats.class_counts
        f["class_frequencies"] = stats.class_counts / max(stats.class_counts.sum(), 1)
        f.attrs["channels"] = ",".join(channels)
        f.attrs["classes"] = ",".join(CLASS_NAMES)


def load_stats(path) -> dict[str, np.ndarray]:
    """The arrays of a ``stats.h5``, checked; a one-line error naming the file otherwise."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise DataError(f"{path}: channel statistics not found; run python -m climate_seg.stats <train dir> "
                        f"--out {path}")
    try:
        with h5py.File(path, "r") as f:
            out = {key: np.asarray(f[key][()], np.float64) for key in ("mean", "std", "min", "max")}
            out["class_frequencies"] = np.asarray(f["class_frequencies"][()], np.float64)
    except (OSError, KeyError) as exc:
        raise DataError(f"{path}: expected datasets mean, std, min, max, class_frequencies ({exc})") from None
    if any(out[key].shape != (N_CHANNELS,) for key in ("mean", "std", "min", "max")):
        raise DataError(f"{path}: mean/std/min/max must hold {N_CHANNELS} values, one per channel")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m climate_seg.stats", description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="directory of training samples (*.h5)")
    parser.add_argument("--out", help="output file (default: stats.h5 beside the directory)")
    parser.add_argument("--force", action="store_true", help="replace an existing file this suite did not write")
    args = parser.parse_args(argv)
    with exit_on_user_error():
        from common import distributed
        from common.data import list_files

        files = list_files(args.directory, ("*.h5",), "climate sample")
        out = pathlib.Path(args.out) if args.out else pathlib.Path(args.directory).resolve().parent / "stats.h5"
        check_replaceable(out, args.force, "pass --force to replace it, or --out to write elsewhere")  # before the pass
        dist = distributed.init()
        stats = compute_stats(files, dist)
        if dist.is_root:
            # ExtremeWeather files keep their channels in alphabetical order.
            write_stats(out, stats, sorted(CHANNELS) if is_extremeweather(files[0]) else CHANNELS, args.force)
            frequencies = stats.class_counts / max(stats.class_counts.sum(), 1)
            print(f"{len(files)} files, {stats.count} pixels over {dist.size} rank(s) -> {out}; class frequencies "
                  + ", ".join(f"{n} {f:.4%}" for n, f in zip(CLASS_NAMES, frequencies)), flush=True)
    return 0


if __name__ == "__main__":
    exit_process(main())
