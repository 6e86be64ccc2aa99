"""The raw staged copy (``cosmoflow-raw-v1``): what ``data.stage_decompress`` stages MLPerf's GZIP
TFRecords as.  Each sample is its ``x`` bytes as stored (int16) then its ``y`` as little-endian float32,
one sample after another, read at an offset straight into one buffer: no TFRecord read, checksum,
Example parse and decode copy per sample (2.2-2.7x the GZIP rate per core as inflated TFRecords;
docs/performance.md)."""

from __future__ import annotations

import math
import pathlib

import google_crc32c
import numpy as np

from common.deferred import tensorflow as tf   # imported at first use: the formats' table is read without it
from common.distributed import Distributed
from common.errors import DataError
from common.loop import epochs
from common.storage.data import read_at
from common.storage.staging import StagedFormat
from common.storage.tfrecord import read_records
from cosmoflow.formats.layout import SampleLayout, Selection

NAME = "cosmoflow-raw-v1"   # the staging manifest's format name of these copies


def write_raw_samples(source: str, destination, voxels: int, n_targets: int, gzipped: bool) -> int:
    """MLPerf TFRecords (``x`` int16 bytes, ``y`` floats) rewritten as raw samples, each ``x`` as stored then
    ``y`` as little-endian float32, one after another; the CRC-32C of the bytes written.  Every record's
    checksums (:func:`read_records`) and sizes are checked: a bad one is a DataError naming the file and record."""
    crc = 0
    with open(destination, "wb") as out:
        for index, payload in enumerate(read_records(source, "gzip" if gzipped else "none")):
            feature = tf.train.Example.FromString(payload).features.feature
            x = feature["x"].bytes_list.value[0] if "x" in feature and feature["x"].bytes_list.value else b""
            y = list(feature["y"].float_list.value) if "y" in feature else []
            if len(x) != 2 * voxels or len(y) != n_targets:
                raise DataError(f"{source}: record {index}: x of {len(x)} bytes and {len(y)} targets, expected "
                                f"{2 * voxels} bytes (int16) and {n_targets} (MLPerf layout, data.sample_shape)")
            sample = x + np.asarray(y, "<f4").tobytes()
            out.write(sample)
            crc = google_crc32c.extend(crc, sample)
    return crc


def staged_format(cfg, layout: SampleLayout) -> StagedFormat:
    """How staging writes the copies of a dataset of ``layout`` (MLPerf's) with ``cfg``'s sample shape."""
    voxels, n = math.prod(cfg.data.sample_shape), len(layout.targets)
    gzipped = cfg.data.compression == "gzip"
    return StagedFormat(NAME, ".raw", lambda source, destination: write_raw_samples(
        source, destination, voxels, n, gzipped))


def staged_selection(cfg, files: list[str], dist: Distributed, selection: Selection) -> Selection:
    """This rank's raw staged copies of ``selection`` as the family reads them: (file, byte offset) of every
    sample, once per run (the sizes checked)."""
    layout = selection.layout
    sample_bytes = 2 * math.prod(cfg.data.sample_shape) + 4 * len(layout.targets)
    paths, offsets = [], []
    for path in files:
        size = pathlib.Path(path).stat().st_size
        if size % sample_bytes:
            raise DataError(f"{path}: {size} bytes is not a whole number of staged samples of {sample_bytes} bytes; "
                            "empty data.stage_dir to stage it again")
        paths += [path] * (size // sample_bytes)
        offsets += range(0, size, sample_bytes)
    if not paths:
        raise DataError(f"{cfg.data.stage_dir}: rank {dist.rank} has no staged training samples (fewer training "
                        f"files than the {dist.size} ranks?): stage more files or run fewer ranks")
    return Selection((tf.constant(paths), tf.constant(offsets, tf.int64)), selection.count, layout,
                     selection.problems, compression="none", staged=True)


def read(cfg, selection: Selection, dist: Distributed, seed, training: bool) -> tf.data.Dataset:
    """(x int16, y float32, file name, True) per sample of :func:`staged_selection`, shuffled with ``seed`` (a
    training split's copy: always)."""
    shape = tuple(cfg.data.sample_shape)
    voxels, n = math.prod(shape), len(selection.layout.targets)
    sample_bytes = 2 * voxels + 4 * n
    # This rank's own copies, permuted by a seed stream of the rank's own.
    samples = epochs.rank_share(selection.items, dist, seed, shuffle=True, stream=dist.rank, this_rank_only=True).items

    def load(path, offset):
        sample = read_at(path.decode(), int(offset), "u1", (sample_bytes,), "a staged sample")
        return sample[:2 * voxels].view("<i2"), sample[2 * voxels:].view("<f4")

    def parsed(path, offset):
        x, y = tf.numpy_function(load, [path, offset], [tf.int16, tf.float32], stateful=False)
        return tf.reshape(x, shape), tf.ensure_shape(y, [n]), path, tf.constant(True)

    return samples.map(parsed, num_parallel_calls=epochs.AUTOTUNE)


def bad_file_finder(cfg, selection: Selection):
    """None: a raw staged copy names its file itself, and is no TFRecord."""
    return None
