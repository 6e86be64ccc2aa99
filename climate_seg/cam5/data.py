"""What both climate tasks' readers share: the splits, the file screening, where the statistics are, the
per-channel normalisation they give, and the preparation of synthetic data and statistics."""

from __future__ import annotations

# The data tools (subset, manifest, verify: common/tools/datatools.py): run before the readers load.
if __name__ == "__main__":
    from common.tools.datatools import command_main   # its layout: the application's declaration
    command_main("climate_seg.cam5.data")

import logging
import pathlib

import numpy as np

from climate_seg.cam5.stats import compute_stats, locate_stats, write_stats
from common.storage.data import list_files, screen_files
from common.storage.derived import derived_file, writable_derived
from common.distributed import Distributed
from common.errors import ConfigError
from common.storage.generated import generated_folder

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")


def screened_split(data, split: str, inspect, what: str, dist: Distributed | None,
                   problems: list[str] | None) -> tuple[list[str], dict]:
    """(good files of ``data_dir/split`` in name order, what ``inspect`` said of each); bad ones
    appended to ``problems`` (or raised, with ``data.on_bad_file: fail``)."""
    directory = pathlib.Path(data.data_dir) / split
    files = list_files(directory, ("*.h5",), f"{what} {split}", data.on_bad_file)
    good, info, bad = screen_files(files, inspect, dist or Distributed(), data.on_bad_file, str(directory))
    if problems is not None:
        problems.extend(bad)
    return good, info


def stats_path(cfg) -> pathlib.Path:
    """The dataset's statistics file: the suite's own in the derived folder (:func:`derived_dir`), else the
    one shipped with the data (DeepCAM's and this suite's at the root, SC18's in train/), else where the
    suite writes it (the derived folder, never the data folder)."""
    return derived_file(cfg.data, cfg.data.stats_file, locate_stats(cfg.data.data_dir, cfg.data.stats_file))


def normalizer(normalization: str, stats: dict, channels: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(offset, scale) per channel (``channels``: which of the file's, in the network's order):
    x -> (x - offset) / scale, for ``minmax`` or ``zscore``."""
    index = slice(None) if channels is None else channels
    if normalization == "zscore":
        offset, scale = stats["mean"][index], stats["std"][index]
    else:
        offset, scale = stats["min"][index], stats["max"][index] - stats["min"][index]
    return np.asarray(offset, np.float32), np.maximum(scale, 1e-12).astype(np.float32)


def prepare(cfg, generate, what: str, channels) -> None:
    """Generate synthetic data into an absent or empty ``data.data_dir`` when asked (its statistics with it,
    in the new folder), then the statistics when there are none (:func:`stats_path`: into the derived folder,
    never into the data's).  ``generate(folder)`` fills a new folder."""
    data = cfg.data
    root = pathlib.Path(data.data_dir)
    if data.synth.generate_if_missing and not any((root / "train").glob("*.h5")):
        if tuple(data.synth.grid) != tuple(data.grid):
            raise ConfigError(f"data.synth.grid {list(data.synth.grid)} must equal data.grid {list(data.grid)}")
        with generated_folder(root, "climate data (train/, validation/, test/ of *.h5 files)") as work:
            generate(work)
            (work / data.stats_file).parent.mkdir(parents=True, exist_ok=True)
            write_stats(work / data.stats_file, compute_stats(list_files(work / "train", ("*.h5",), f"{what} train")),
                        channels)
        log.info(f"generated synthetic {what} in {root}/{{{','.join(SPLITS)}}}")
    stats_file = stats_path(cfg)
    if (root / "train").is_dir() and not stats_file.is_file():
        write_stats(writable_derived(stats_file), compute_stats(list_files(root / "train", ("*.h5",), f"{what} train")),
                    channels)
        log.info(f"computed channel statistics into {stats_file} ({data.data_dir} is left as it is)")
