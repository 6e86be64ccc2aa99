"""CosmoFlow's TFRecord family (``data.format: tfrecord``): its file names, the files of a split screened by
their headers, the variant told by a split's first record (:data:`VARIANTS`), this rank's records read and
parsed, the targets, the full check, one file to predict, and the staged copy of a training split.

A variant is a module ``tfrecord_<name>.py`` (``NAME``, ``FEATURES``, ``SIZE_UNIT``, ``matches``, ``layout``,
``parse``, ``record_sizes``) and its line in :data:`VARIANTS`.
"""

from __future__ import annotations

import logging
import math
import pathlib
import struct
import sys
import time
import zlib

import numpy as np

from common.deferred import DeferredModule
from common.deferred import tensorflow as tf   # imported at first use: the formats' table is read without it
from common.distributed import Distributed
from common.errors import DataError
from common.loop import epochs
from common.storage.data import list_files, screen_files, select_count
from cosmoflow.formats import tfrecord_float_list, tfrecord_mlperf, tfrecord_sc18
from cosmoflow.formats.layout import SampleLayout, Selection

# Imported at first use: the file names (PATTERNS) are read where google-crc32c is absent (Keras on JAX).
staging = DeferredModule("common.storage.staging")
record_files = DeferredModule("common.storage.tfrecord")
raw_staged = DeferredModule("cosmoflow.formats.raw_staged")

log = logging.getLogger(__name__)

NAME = "tfrecord"
WHAT = "TFRecord"   # the family in messages
PATTERNS = ("*.tfrecord", "*.tfrecords", "*.tfrecord.gz", "*.tfrecords.gz")
# The variants, tried in this order against the first record of a split; the first that matches is the split's.
VARIANTS = (tfrecord_mlperf, tfrecord_float_list, tfrecord_sc18)
# The staged copy data.stage_decompress writes of a variant (its staged_format, staged_selection and read);
# the others are staged as inflated TFRecords.
STAGED_AS = {tfrecord_mlperf.NAME: raw_staged}
# The data.compression values its files are written in (cosmoflow.mock) and read in.
COMPRESSIONS = ("none", "gzip")
# A file holds whole samples, never a volume to cut into crops (cosmoflow.mock --crops-per-side is refused).
HOLDS_CROPS = False


def compression_type(compression: str) -> str:
    """TensorFlow's name for a ``data.compression`` value."""
    return "GZIP" if compression == "gzip" else ""


def first_record_features(path: str, compression: str):
    """The features of the first record of ``path`` (a ``tf.train.Example``'s feature map)."""
    try:
        record = next(iter(tf.data.TFRecordDataset(path, compression_type=compression_type(compression))))
    except (tf.errors.OpError, StopIteration) as exc:
        raise DataError(f"{path}: no readable first record ({type(exc).__name__})") from None
    return tf.train.Example.FromString(record.numpy()).features.feature


def record_layout(path: str, data, compression: str | None = None) -> SampleLayout:
    """The layout of a TFRecord dataset, from the first record of one of its files."""
    features = first_record_features(path, compression or data.compression)
    for variant in VARIANTS:
        if variant.matches(features):
            return variant.layout(features, path, data)
    needs = " or ".join(dict.fromkeys(variant.FEATURES for variant in VARIANTS))
    raise DataError(f"{path}: records need features {needs}, found {sorted(features)}")


def variant_of(layout: SampleLayout):
    """The module of the variant ``layout`` describes."""
    return next(variant for variant in VARIANTS if variant.NAME == layout.kind)


def check_record(payload: bytes, path: str, index: int, data, layout: SampleLayout) -> None:
    """Raise a :class:`DataError` naming file and record unless the serialised example holds the layout's
    features at its sizes (what the variant's ``parse`` would read)."""
    try:
        features = tf.train.Example.FromString(payload).features.feature
    except Exception:   # noqa: BLE001  protobuf's DecodeError
        raise DataError(f"{path}: record {index} is not a tf.train.Example") from None
    variant = variant_of(layout)
    sizes, expected = variant.record_sizes(features, layout, math.prod(data.sample_shape))
    if sizes != expected:
        raise DataError(f"{path}: record {index}: holds x of {sizes[0]} and y of {sizes[1]} {variant.SIZE_UNIT}, "
                        f"expected {expected[0]} and {expected[1]} as in the split's first file "
                        f"({layout.file_format}; data.sample_shape {list(data.sample_shape)})")


# -- a split's files ----------------------------------------------------------------------------------------

def _inspect(data):
    def inspect(path: str) -> tuple[int, frozenset | None]:
        """(records, their lengths: None for GZIP files, whose walk would decompress everything)."""
        if data.compression == "gzip":
            # A full walk decompresses everything: left to the reader (which names a broken file) and
            # common.tools.check_data; here the header.
            with open(path, "rb") as handle:
                if handle.read(2) != b"\x1f\x8b":
                    raise DataError(f"{path}: not a GZIP file (data.compression is gzip)")
            return data.samples_per_file, None
        lengths: list[int] = []
        count = record_files.scan_tfrecord(path, lengths=lengths)
        if count != data.samples_per_file:
            raise DataError(f"{path}: holds {count} records but data.samples_per_file is {data.samples_per_file}")
        return count, frozenset(lengths)

    return inspect


def _check_record_sizes(data, files: list[str], found: dict, layout: SampleLayout) -> dict[str, str]:
    """Files whose records are not all as long as the split's first record are read and their records
    checked (:func:`check_record`): a sample of another shape in a later file is named at start-up for
    the price of the header walk.  Returns {bad file: problem} (raised with ``data.on_bad_file: fail``)."""
    if found[files[0]][1] is None:   # GZIP: no lengths without decompressing; the reader checks as it reads
        return {}
    reference = frozenset([next(iter(record_files.read_records(files[0])), b"").__len__()])
    problems = {}
    for path in files:
        if found[path][1] == reference:
            continue
        try:
            for index, payload in enumerate(record_files.read_records(path)):
                check_record(payload, path, index, data, layout)
        except DataError as exc:
            if data.on_bad_file == "fail":
                raise
            problems[path] = str(exc)
    return problems


def select(cfg, directory: pathlib.Path, requested: int | None, key: str | None, dist: Distributed) -> Selection:
    """The files of ``directory`` listed and screened (headers walked, records of another size named), the
    layout of the first, and the first files holding the samples used."""
    data = cfg.data
    files = list_files(directory, PATTERNS, f"CosmoFlow {directory.name} {WHAT}", data.on_bad_file)
    files, found, problems = screen_files(files, _inspect(data), dist, data.on_bad_file, str(directory))
    layout = record_layout(files[0], data)
    resized = _check_record_sizes(data, files, found, layout)
    if dist.is_root:
        for problem in resized.values():
            log.warning(f"skipping bad file: {problem}")
    files = [f for f in files if f not in resized]
    counts = {f: found[f][0] for f in files}
    used = select_count(sum(counts.values()), requested, key, str(directory))
    chosen, total = [], 0
    for f in files:
        if total >= used:
            break
        chosen.append(f)
        total += counts[f]
    return Selection(chosen, used, layout, tuple(problems + list(resized.values())))


def read(cfg, selection: Selection, dist: Distributed, seed, training: bool):
    """(x as stored, y float32 in file order, file name, whether the sizes were the layout's) per sample for
    this rank, shuffled with ``seed`` when training; a staged copy (this rank's files) by a seed stream of the
    rank's own."""
    data, files, layout = cfg.data, selection.items, selection.layout
    shape = tuple(data.sample_shape)
    share = epochs.rank_share((tf.constant(files),), dist, seed, shuffle=training,
                              stream=dist.rank if selection.staged else 0, this_rank_only=selection.staged)
    # A read buffer that holds a whole record (MLPerf files hold one 16 MiB sample each): 30% less CPU
    # than the 256 KiB default here.
    buffer_size = min(max(2 * math.prod(shape) + 1024, 256 << 10), 64 << 20)
    compression = compression_type(selection.compression or data.compression)
    parse = variant_of(layout).parse

    def read_file(name):
        records = tf.data.TFRecordDataset(name, compression_type=compression, buffer_size=buffer_size)
        # With on_bad_file: skip, damage found while reading (past the start-up checks) drops the rest of that file.
        records = records.ignore_errors(log_warning=True) if data.on_bad_file == "skip" else records
        return records.map(lambda record: (record, name))   # the file name travels with its samples

    records = share.samples(share.items.interleave(
        read_file,
        # Evaluation reads files one after another, so samples come in file order.
        cycle_length=min(8, len(files)) if training else 1, num_parallel_calls=epochs.AUTOTUNE, deterministic=True))

    def parsed(record, name):
        x, y, right_size = parse(record, shape, layout)
        return x, y, name, right_size

    return records.map(parsed, num_parallel_calls=epochs.AUTOTUNE)


def bad_file_finder(cfg, selection: Selection):
    """After a TensorFlow read error: re-read the files, checksums and all, to name the bad one."""
    return lambda: record_files.first_bad_file(selection.items, selection.compression or cfg.data.compression)


def read_targets(cfg, selection: Selection, where: str):
    """The targets, in file order, of the samples selected (float32; ``where``: the split, for messages)."""
    shape = tuple(cfg.data.sample_shape)
    raw = tf.data.TFRecordDataset(list(selection.items), compression_type=compression_type(cfg.data.compression))
    parsed = [variant_of(selection.layout).parse(r, shape, selection.layout) for r in raw]
    if not all(bool(right_size) for _, _, right_size in parsed):
        raise DataError(f"{where}: a record holds x or y of another size than the layout's "
                        "(python -m common.tools.check_data names it)")
    return [y.numpy() for _, y, _ in parsed][:selection.count]


def file_samples(cfg, path: str, layouts: dict):
    """(where, x, y in file order, layout) of every record of ``path`` after its checksums and sizes are checked,
    in the layout of its split's first whole file (``layouts``, by split): what the data checker checks."""
    data = cfg.data
    count = record_files.scan_tfrecord(path, data.compression, verify_data=True)
    if count != data.samples_per_file:
        raise DataError(f"{path}: holds {count} records but data.samples_per_file is {data.samples_per_file}")
    split = pathlib.Path(path).parent.name
    if split not in layouts:
        layouts[split] = record_layout(path, data)
    layout = layouts[split]
    shape = tuple(data.sample_shape)
    for i, record in enumerate(tf.data.TFRecordDataset(path, compression_type=compression_type(data.compression))):
        check_record(record.numpy(), path, i, data, layout)
        x, y, _ = variant_of(layout).parse(record, shape, layout)
        yield f"record {i}", x.numpy(), y.numpy(), layout


def file_selection(cfg, path: str) -> Selection:
    """Every record of one file (GZIP when it starts as GZIP does), for prediction."""
    with open(path, "rb") as handle:
        compression = "gzip" if handle.read(2) == b"\x1f\x8b" else "none"
    return Selection([path], record_files.scan_tfrecord(path, compression), record_layout(path, cfg.data, compression),
                     compression=compression)


def stage(cfg, selection: Selection, dist: Distributed):
    """(the family that reads them, the selection of this rank's copies in ``data.stage_dir``), staged now:
    inflated TFRecords, or with ``data.stage_decompress`` the variant's own staged copy where it has one."""
    data, layout = cfg.data, selection.layout
    staged_copy = STAGED_AS.get(layout.kind) if data.stage_decompress else None
    raw = staged_copy.staged_format(cfg, layout) if staged_copy else None
    files = staging.stage_files(list(selection.items), data.stage_dir, dist, decompress=data.stage_decompress,
                        staged_format=raw, data_dir=data.data_dir)
    if raw:
        return staged_copy, staged_copy.staged_selection(cfg, files, dist, selection)
    compression = "none" if data.stage_decompress else data.compression
    return sys.modules[__name__], Selection(files, selection.count, layout, selection.problems,
                                            compression=compression, staged=True)


def input_ceiling(cfg, samples: int) -> dict:
    """The simplest loop that does what the input pipeline does for one training sample, in numpy on one core:
    read the file, inflate it (GZIP), walk the TFRecord framing, parse the Example, int16 -> float32 and the
    normalisation (log1p, or division by the mean).  ``samples`` of them (the training files cycled); what
    ``common.tools.bench --input-only`` compares the pipeline with.  MLPerf's layout (``x`` as int16 bytes)."""
    data = cfg.data
    files = list_files(pathlib.Path(data.data_dir) / "train", PATTERNS, f"CosmoFlow train {WHAT}")
    done, checksum, start = 0, 0.0, time.perf_counter()
    while done < samples:
        for path in files:
            with open(path, "rb") as handle:
                raw = handle.read()
            if data.compression == "gzip":
                raw = zlib.decompress(raw, wbits=31)   # 31: a GZIP stream
            position = 0
            while position < len(raw) and done < samples:
                (length,) = struct.unpack_from("<Q", raw, position)
                payload = raw[position + 12: position + 12 + length]   # after the length and its CRC
                position += 16 + length                                    # and the payload's CRC
                feature = tf.train.Example.FromString(payload).features.feature
                if "x" not in feature or not feature["x"].bytes_list.value:
                    return {"samples_per_second": None, "why_none": f"{path}: not MLPerf's layout (x as bytes)"}
                x = np.frombuffer(feature["x"].bytes_list.value[0], "<i2").astype(np.float32)
                x = np.log1p(x) if data.apply_log else x / max(float(x.mean()), 1e-6)
                checksum += float(x[0])
                done += 1
            if done >= samples:
                break
    seconds = time.perf_counter() - start
    return {"samples_per_second": done / seconds, "samples": done, "seconds": seconds,
            "bytes_per_sample": math.prod(data.sample_shape) * 2}


# -- writing: cosmoflow.mock's files ---------------------------------------------------------------------------

def file_name(stem: str, compression: str) -> str:
    """The name of a file of this family holding the sample ``stem``, as ``compression`` writes it."""
    return f"{stem}.tfrecord" + (".gz" if compression == "gzip" else "")


def write_sample(path, x: np.ndarray, y: np.ndarray, physical: np.ndarray, compression: str) -> None:
    """One mock universe (``x`` int16 counts, ``y`` its targets in [-1, 1]) as a file of one MLPerf record:
    that layout has no place for the ``physical`` parameters."""
    write_tfrecord(path, [(x, y)], compression)


def write_tfrecord(path, samples, compression: str = "none") -> None:
    """Samples [(x int16 array, y float32[4])] as TFRecord examples (MLPerf layout)."""
    options = tf.io.TFRecordOptions(compression_type=compression_type(compression))
    with tf.io.TFRecordWriter(str(path), options) as writer:
        for x, y in samples:
            example = tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(bytes_list=tf.train.BytesList(value=[np.asarray(x, np.int16).tobytes()])),
                "y": tf.train.Feature(float_list=tf.train.FloatList(value=np.asarray(y, np.float32).tolist())),
            }))
            # deterministic: the features map in key order; otherwise its order, hence the bytes, varied from run
            # to run (the same Example, another file: a fingerprint of the files could not repeat)
            writer.write(example.SerializeToString(deterministic=True))
