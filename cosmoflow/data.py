"""CosmoFlow data: the tf.data pipeline over the formats of :mod:`cosmoflow.formats`, and the data checks.

Layout of ``data.data_dir``: ``train/`` and ``validation/`` subdirectories.
Within ``data.format`` (tfrecord or hdf5) the variant is told by the files'
content (a :class:`~cosmoflow.formats.layout.SampleLayout`), never by their
names; each variant is a module of ``cosmoflow/formats/`` (MLPerf, float-list
and SC18 TFRecords, raw and split HDF5, the raw staged copy), listed once in
``cosmoflow/formats/__init__.py``.  This module asks that registry, hands the
engine each split as an :class:`epochs.Split <common.loop.epochs.Split>`
(:func:`split`: the files selected and checked, this rank's samples read, the
training copies staged) and keeps the batches hook (:func:`_pipeline`: shuffle,
augment, batch, normalise); the engine (:mod:`common.loop.epochs`) owns the
epoch: steps, epoch seeds, the cut before the shuffle, validation, the
evaluation walk.

Targets are picked by name (``data.target_names``) from the file order
(``namePar``, else ``data.file_target_names``, else the MLPerf order) and
checked as read: finite, and within the network's output range.  Sample
counts come from the files present: asking for more (``n_train``,
``n_validation``) is an error; fewer is allowed.
"""

from __future__ import annotations

# The data tools (subset, manifest, verify: common/tools/datatools.py) need no TensorFlow: run before it loads.
if __name__ == "__main__":
    from common.tools.datatools import command_main   # its layout: the application's declaration
    command_main("cosmoflow.data")

import dataclasses
import functools
import logging
import math
import pathlib
import struct
import time
import zlib

import numpy as np
import tensorflow as tf

from common.application import Datasets
from common.loop import epochs
from common.distributed import Distributed
from common.errors import DataError
from common.nn.precision import compute_dtype
from common.storage.data import check_split_files, list_files, screen_files, select_count
from common.storage.staging import stage_files
from common.storage.tfrecord import first_bad_file, read_records, scan_tfrecord
from cosmoflow import formats
from cosmoflow.config import CosmoflowConfig
from cosmoflow.formats.layout import SampleLayout

log = logging.getLogger(__name__)

AUTOTUNE = tf.data.AUTOTUNE


# -- records of the format's variant ------------------------------------------------------

def parse_example(record, sample_shape, layout: SampleLayout):
    """(x as stored: int16 or float32, y float32, whether x and y had the layout's sizes) of one serialised
    example.  A record of other sizes gives zeros and False (never an exception without the file's name)."""
    return formats.tfrecord_variant(layout).parse(record, sample_shape, layout)


def check_record(payload: bytes, path: str, index: int, cfg: CosmoflowConfig, layout: SampleLayout) -> None:
    """Raise a :class:`DataError` naming file and record unless the serialised example holds the layout's
    features at its sizes (what :func:`parse_example` would read)."""
    data = cfg.data
    try:
        features = tf.train.Example.FromString(payload).features.feature
    except Exception:   # noqa: BLE001  protobuf's DecodeError
        raise DataError(f"{path}: record {index} is not a tf.train.Example") from None
    variant = formats.tfrecord_variant(layout)
    sizes, expected = variant.record_sizes(features, layout, math.prod(data.sample_shape))
    if sizes != expected:
        raise DataError(f"{path}: record {index}: holds x of {sizes[0]} and y of {sizes[1]} {variant.SIZE_UNIT}, "
                        f"expected {expected[0]} and {expected[1]} as in the split's first file "
                        f"({layout.file_format}; data.sample_shape {list(data.sample_shape)})")


# -- transformations --------------------------------------------------------------------

def normalise(x, apply_log: bool, dtype=tf.float32):
    """A batch of volumes: log1p (or division by each sample's mean) in float32, handed on in ``dtype``: the
    network's compute dtype, the same rounding its first layer would apply, at half the bytes under a 16-bit
    policy.  One op for the whole batch."""
    x = tf.cast(x, tf.float32)
    if apply_log:
        x = tf.math.log1p(x)
    else:
        x = x / tf.maximum(tf.reduce_mean(x, axis=list(range(1, len(x.shape))), keepdims=True), 1e-6)
    return tf.cast(x, dtype)


def augment(x, seed):
    """Random flips of the three spatial axes and, for cubes, a random axis permutation (isotropy)."""
    shape = x.shape
    flips = tf.random.stateless_uniform([3], seed=seed) < 0.5
    cube = len(set(shape[:3])) == 1
    if cube:
        permutations = tf.constant([[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]])
        perm = permutations[tf.random.stateless_uniform([], seed=seed + 1, maxval=6, dtype=tf.int32)]
    # Both move whole voxels: view a voxel's channels as one 8-byte word where the bytes allow (4 x int16 here),
    # which halves the time of the copies.  The word is float64, not int64: the moves are the same bitwise
    # copies (no arithmetic touches the word: NaN and subnormal patterns come back unchanged, tested), but
    # oneDNN's int64 check prints a false "oneDNN supports DT_INT64 only on platforms with AVX-512" line
    # on every rank (same kernel, same speed: 13.8 ms either way for a 128^3 x 4 cube on the Intel Xeon).
    voxel = {2: tf.int16, 4: tf.int32, 8: tf.float64}.get(shape[-1] * x.dtype.size) if shape[-1] > 1 else None
    y = tf.bitcast(x, voxel) if voxel is not None else x
    # One reverse over the chosen axes (one copy, not one per axis).
    y = tf.reverse(y, tf.boolean_mask(tf.range(3), flips))
    if cube:
        y = tf.transpose(y, perm if voxel is not None else tf.concat([perm, [3]], axis=0))
    y = tf.bitcast(y, x.dtype) if voxel is not None else y
    # A cube keeps its static shape under the permutation; Keras needs it for fast kernels.
    return tf.ensure_shape(y, shape)


def random_shift_offsets(seed, spatial_shape):
    """The periodic shift :func:`random_shift` draws for a sample's ``seed``: one offset per spatial axis,
    in voxels, uniform over 0 .. size - 1.  Its own streams, apart from :func:`augment`'s ``seed`` and
    ``seed + 1``."""
    axis_seeds = tf.random.experimental.stateless_split(seed + 2, num=3)
    return tf.stack([tf.random.stateless_uniform([], seed=axis_seeds[axis], maxval=size, dtype=tf.int32)
                     for axis, size in enumerate(spatial_shape)])


def random_shift(x, seed):
    """``x`` (x, y, z, channels) rolled periodically along its three spatial axes by
    :func:`random_shift_offsets`: the mocks are periodic boxes, so a shifted box is the same universe seen
    from another origin (``np.roll(x, offsets, axis=(0, 1, 2))``)."""
    return tf.ensure_shape(tf.roll(x, random_shift_offsets(seed, x.shape[:3]), axis=[0, 1, 2]), x.shape)


def _training_transform(data):
    """sample, seed -> the sample under the random symmetries ``data`` asks for (flips and permutations,
    periodic shift)."""
    if not data.random_shift:
        return augment
    if not data.augment:
        return random_shift
    return lambda x, seed: random_shift(augment(x, seed), seed)


# -- pipeline ---------------------------------------------------------------------------

def _inspect_tfrecord(cfg: CosmoflowConfig):
    data = cfg.data

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
        count = scan_tfrecord(path, lengths=lengths)
        if count != data.samples_per_file:
            raise DataError(f"{path}: holds {count} records but data.samples_per_file is {data.samples_per_file}")
        return count, frozenset(lengths)

    return inspect


def _check_record_sizes(cfg: CosmoflowConfig, files: list[str], found: dict, layout: SampleLayout) -> dict[str, str]:
    """Files whose records are not all as long as the split's first record are read and their records
    checked (:func:`check_record`): a sample of another shape in a later file is named at start-up for
    the price of the header walk.  Returns {bad file: problem} (raised with ``data.on_bad_file: fail``)."""
    if found[files[0]][1] is None:   # GZIP: no lengths without decompressing; the reader checks as it reads
        return {}
    reference = frozenset([next(iter(read_records(files[0])), b"").__len__()])
    problems = {}
    for path in files:
        if found[path][1] == reference:
            continue
        try:
            for index, payload in enumerate(read_records(path)):
                check_record(payload, path, index, cfg, layout)
        except DataError as exc:
            if cfg.data.on_bad_file == "fail":
                raise
            problems[path] = str(exc)
    return problems


def _split_samples(cfg: CosmoflowConfig, split: str, requested: int | None, key: str, dist: Distributed):
    """(files to read, samples used, HDF5 crop index or None, bad-file problems, layout) for one split."""
    data = cfg.data
    directory = pathlib.Path(data.data_dir) / split
    if data.format == "tfrecord":
        files = list_files(directory, formats.FILE_PATTERNS["tfrecord"], f"CosmoFlow {split} TFRecord",
                           data.on_bad_file)
        files, found, problems = screen_files(files, _inspect_tfrecord(cfg), dist, data.on_bad_file, str(directory))
        layout = formats.record_layout(files[0], cfg)
        resized = _check_record_sizes(cfg, files, found, layout)
        if dist.is_root:
            for problem in resized.values():
                log.warning(f"skipping bad file: {problem}")
        files = [f for f in files if f not in resized]
        problems = problems + list(resized.values())
        counts = {f: found[f][0] for f in files}
        used = select_count(sum(counts.values()), requested, key, str(directory))
        chosen, total = [], 0
        for f in files:
            if total >= used:
                break
            chosen.append(f)
            total += counts[f]
        return chosen, used, None, problems, layout
    files = list_files(directory, formats.FILE_PATTERNS["hdf5"], f"CosmoFlow {split} HDF5", data.on_bad_file)
    files, found, problems = screen_files(files, lambda f: formats.hdf5.file_layout(f, cfg), dist, data.on_bad_file,
                                          str(directory))
    layouts = {layout for _, layout in found.values()}
    if len(layouts) > 1:
        raise DataError(f"{directory}: files of different layouts or target orders: "
                        + "; ".join(sorted(layout.describe() for layout in layouts)))
    used = select_count(sum(n for n, _ in found.values()), requested, key, str(directory))
    index = [(f, c) for f in files for c in range(found[f][0])][:used]
    return sorted({f for f, _ in index}), used, index, problems, layouts.pop()


def _records(cfg: CosmoflowConfig, files: list[str], index, dist: Distributed, seed, training: bool,
             layout: SampleLayout, compression: str | None = None, staged: bool = False):
    """(x as stored, y float32 in file order, file name) per sample for this rank, shuffled with ``seed``
    when training.

    ``staged``: ``files`` are this rank's staged copies (a fixed share), permuted by a seed stream of the rank's own.
    """
    data = cfg.data
    shape = tuple(data.sample_shape)
    if data.format == "tfrecord":
        share = epochs.rank_share((tf.constant(files),), dist, seed, shuffle=training,
                                  stream=dist.rank if staged else 0, this_rank_only=staged)
        # A read buffer that holds a whole record (MLPerf files hold one 16 MiB sample each): 30% less CPU
        # than the 256 KiB default here.
        buffer_size = min(max(2 * math.prod(shape) + 1024, 256 << 10), 64 << 20)
        compression_type = formats.tfrecord.compression_type(data) if compression is None else compression

        def read_file(name):
            records = tf.data.TFRecordDataset(name, compression_type=compression_type, buffer_size=buffer_size)
            # With on_bad_file: skip, damage found while reading (past the start-up checks) drops the rest of that file.
            records = records.ignore_errors(log_warning=True) if data.on_bad_file == "skip" else records
            return records.map(lambda record: (record, name))   # the file name travels with its samples

        records = share.samples(share.items.interleave(
            read_file,
            # Evaluation reads files one after another, so samples come in file order.
            cycle_length=min(8, len(files)) if training else 1, num_parallel_calls=AUTOTUNE, deterministic=True))
        return records.map(lambda r, name: _with_name(parse_example(r, shape, layout), name),
                           num_parallel_calls=AUTOTUNE)

    share = epochs.rank_share((tf.constant([p for p, _ in index]), tf.constant([c for _, c in index], dtype=tf.int64)),
                              dist, seed, shuffle=training, stream=1)

    def read(path, crop_index):
        x, y = tf.numpy_function(lambda p, c: formats.hdf5.read_crop(p, c, shape), [path, crop_index],
                                 [tf.int16, tf.float32], stateful=False)
        x.set_shape(shape)
        y.set_shape([len(layout.targets)])
        return x, y, path, tf.constant(True)   # HDF5 shapes are checked per file at start-up

    return share.samples(share.items.map(read, num_parallel_calls=AUTOTUNE))


def _with_name(parsed, name):
    x, y, sized = parsed
    return x, y, name, sized


def check_batch(x, y, files, sized, bound: float, expected: str):
    """A float32 zero the batch's targets are computed through: raises a DataError naming the first file
    whose sample had other sizes than the layout's (``sized`` False; ``expected`` says what was expected),
    NaN/Inf or negative particle counts, non-finite targets or targets beyond ``bound`` (the network's
    output range).  (It must feed the data: an op used only as a control dependency would be pruned by
    TensorFlow's graph optimiser.)"""
    def check(names, right_size, finite_x, lowest, finite, largest):
        for name, size_ok, ok_x, low, ok, top in zip(names, right_size, finite_x, lowest, finite, largest):
            if not size_ok:
                raise DataError(f"{name.decode()}: a record holds x or y of another size than expected ({expected})")
            if not ok_x:
                raise DataError(f"{name.decode()}: 'x' holds NaN or Inf")
            if low < 0:
                raise DataError(f"{name.decode()}: 'x' holds negative particle counts (lowest {low})")
            if not ok:
                raise DataError(f"{name.decode()}: 'y' holds NaN or Inf")
            if top > bound:
                raise DataError(f"{name.decode()}: a target of {top:.4g} (normalised) is beyond the network's "
                                f"output range +-{bound:g} (model.output_scale); MLPerf unitPar are in [-1, 1]: "
                                "check data.target_offset / target_scale or data.file_target_names")
        return np.float32(0)

    spatial = list(range(1, len(x.shape)))
    # Integer counts cannot be NaN: the check costs a pass over the volume only for float layouts.
    finite_x = tf.reduce_all(tf.math.is_finite(x), axis=spatial) if x.dtype.is_floating else tf.ones_like(sized)
    zero = tf.numpy_function(check, [files, sized, finite_x, tf.reduce_min(x, axis=spatial),
                                     tf.reduce_all(tf.math.is_finite(y), 1), tf.reduce_max(tf.abs(y), 1)],
                             tf.float32, stateful=False)
    return tf.ensure_shape(zero, [])


def targets_transform(cfg: CosmoflowConfig, layout: SampleLayout):
    """y in file order -> the normalised targets of ``data.target_names``."""
    data = cfg.data
    index = [layout.targets.index(n) for n in data.target_names]
    offset = np.asarray(data.target_offset or np.zeros(len(layout.targets)), np.float32)[index]
    scale = np.asarray(data.target_scale or np.ones(len(layout.targets)), np.float32)[index]
    return lambda y: (tf.gather(y, index, axis=-1) - offset) / scale


def network_input(x, cfg: CosmoflowConfig, dtype=tf.float32):
    """A batch of stored volumes as the network takes them: :func:`normalise`d in ``dtype``, or with
    ``model.summaries`` the counts in float32 (that network normalises them itself, :mod:`cosmoflow.model`)."""
    if cfg.model.summaries:
        return tf.cast(x, tf.float32)
    return normalise(x, cfg.data.apply_log, dtype)


def _inputs_and_targets(cfg: CosmoflowConfig, layout: SampleLayout, dtype=tf.float32):
    """(x, y, files, sized) batch -> (normalised x, selected targets), both checked (:func:`check_batch`)."""
    data = cfg.data
    targets = targets_transform(cfg, layout)
    expected = f"{layout.file_format}, data.sample_shape {list(data.sample_shape)}, " \
               f"{len(layout.targets)} targets"

    def finish(x, y, files, sized):
        y = targets(y)
        zero = check_batch(x, y, files, sized, cfg.model.output_scale, expected)
        return network_input(x, cfg, dtype), y + zero

    return finish


def _pipeline(cfg: CosmoflowConfig, records: tf.data.Dataset, training: bool, seed, batch_size: int,
              layout: SampleLayout) -> tf.data.Dataset:
    data = cfg.data

    # Shuffle, augment and batch the raw int16 counts; normalise whole batches last: flips and permutations
    # commute with the element-wise normalisation, 2-byte values halve the memory traffic and the shuffle
    # buffer, and one normalisation per batch saves the per-sample op overhead that dominates small volumes.
    dataset = records
    if training and data.shuffle_buffer:
        dataset = dataset.shuffle(data.shuffle_buffer, seed=seed)
    if training and (data.augment or data.random_shift):
        seeds = tf.data.Dataset.random(seed=seed + 1).batch(2)
        transform = _training_transform(data)
        dataset = tf.data.Dataset.zip((dataset, seeds)).map(lambda xyf, s: (transform(xyf[0], s), *xyf[1:]),
                                                            num_parallel_calls=AUTOTUNE)
    if batch_size == 1:  # a batch of one is a reshape, not a 16 MiB copy
        dataset = dataset.map(lambda *sample: tuple(t[tf.newaxis] for t in sample))
    else:
        dataset = dataset.batch(batch_size, drop_remainder=True)
    return dataset.map(_inputs_and_targets(cfg, layout, compute_dtype(cfg.train.precision)),
                       num_parallel_calls=AUTOTUNE)


@dataclasses.dataclass
class CosmoflowSplit(epochs.Split):
    """A split as the engine takes it, with the layout its files hold (what its batches are finished by)."""

    layout: SampleLayout | None = None


def split(cfg: CosmoflowConfig, name: str, dist: Distributed, selected: bool = False) -> CosmoflowSplit:
    """The ``name`` subfolder of ``data.data_dir`` as the engine takes it: its files listed and checked, every
    sample or, ``selected``, the first ``data.n_train`` / ``data.n_validation`` (what training uses), read in file
    order or shuffled (:func:`_records`).  ``items``: the files, or (file, crop) pairs for HDF5."""
    data = cfg.data
    requested, key = data.requested(name) if selected else (None, None)
    files, used, index, problems, layout = _split_samples(cfg, name, requested, key, dist)

    def read(dist: Distributed, seed, training: bool):
        return _records(cfg, files, index, dist, seed, training, layout)

    def find_bad_file():   # after a TF read error: re-read the files, checksums and all
        return first_bad_file(files, data.compression)

    return CosmoflowSplit(name=name, where=f"{data.data_dir}/{name}", count=used, read=read,
                          items=files if index is None else index, skipped=problems,
                          find_bad_file=find_bad_file if data.format == "tfrecord" else None, layout=layout)


def staged(cfg: CosmoflowConfig, train: CosmoflowSplit, dist: Distributed) -> CosmoflowSplit:
    """``train`` (TFRecords) read from this rank's copies in ``data.stage_dir`` (a fixed share, shuffled per
    epoch), staged now: inflated TFRecords, or with ``data.stage_decompress`` the variant's own staged copy
    (``cosmoflow/formats/``) where it has one."""
    data = cfg.data
    layout = train.layout
    staged_copy = formats.STAGED_AS.get(layout.kind) if data.stage_decompress else None
    raw = staged_copy.staged_format(cfg, layout) if staged_copy else None
    files = stage_files(list(train.items), data.stage_dir, dist, decompress=data.stage_decompress,
                        staged_format=raw, data_dir=data.data_dir)
    if raw:
        table = staged_copy.sample_table(cfg, files, dist, layout)
        # raw staged copies name their file themselves, and are no TFRecords: no finder
        return dataclasses.replace(train, items=files, find_bad_file=None, read=lambda dist, seed, training:
                                   staged_copy.read_samples(cfg, table, dist, seed, layout))
    compression = "none" if data.stage_decompress else data.compression

    def read(dist: Distributed, seed, training: bool):
        return _records(cfg, files, None, dist, seed, training, layout,
                        compression="GZIP" if compression == "gzip" else "", staged=True)

    return dataclasses.replace(train, items=files, read=read,
                               find_bad_file=lambda: first_bad_file(files, compression))


def build_datasets(cfg: CosmoflowConfig, dist: Distributed) -> Datasets:
    """Training epochs and validation batches for this rank: the engine's (:func:`epochs.training_datasets
    <common.loop.epochs.training_datasets>`) over :func:`split` s, batched by :func:`_pipeline`."""
    data = cfg.data
    train = split(cfg, "train", dist, selected=True)
    validation = split(cfg, "validation", dist, selected=True)
    layout = train.layout
    if validation.layout != layout:
        raise DataError(f"{data.data_dir}: train/ holds {layout.describe()}, validation/ {validation.layout.describe()}")
    for each in (train, validation):   # before staging copies anything: a batch the splits cannot fill is named
        epochs.steps(each, dist.size, data.batch_size)
    log.info(f"cosmoflow data: {data.data_dir}: {layout.describe()}; predicting {data.target_names}")
    if data.stage_dir and data.format == "tfrecord":
        train = staged(cfg, train, dist)
    return epochs.training_datasets(train, validation, dist, cfg.train.seed, data.batch_size,
                                    functools.partial(_pipeline, cfg, layout=layout))


def evaluation_dataset(cfg: CosmoflowConfig, name: str = "validation") -> tuple[tf.data.Dataset, int]:
    """Every sample of a split, in file order, in batches (the last one may be short), and their count: the
    engine's :func:`evaluation walk <common.loop.epochs.evaluation_walk>`."""
    samples = split(cfg, name, Distributed())
    return epochs.evaluation_walk(samples, cfg.data.batch_size, _inputs_and_targets(cfg, samples.layout),
                                  seed=cfg.train.seed), samples.count


def raw_samples(cfg: CosmoflowConfig, name: str = "validation", selected: bool = False):
    """Every sample of a split as stored (the volume before normalisation, its selected targets), in file
    order, as numpy arrays (for analyses outside the network: ``cosmoflow.information``); ``selected``: the first
    ``data.n_train`` / ``data.n_validation`` only, what training uses."""
    samples = split(cfg, name, Distributed(), selected)
    layout = samples.layout
    targets = targets_transform(cfg, layout)
    for x, y, file, sized in samples.read(Distributed(), cfg.train.seed, False).take(samples.count):
        if not sized:
            raise DataError(f"{file.numpy().decode()}: a record holds x or y of another size than "
                            f"{layout.file_format} with data.sample_shape {list(cfg.data.sample_shape)}")
        yield x.numpy(), targets(y).numpy()


def read_targets(cfg: CosmoflowConfig, name: str) -> np.ndarray:
    """All normalised targets of a split (for baselines), selected as configured."""
    samples = split(cfg, name, Distributed())
    layout = samples.layout
    if cfg.data.format == "hdf5":
        per_file = {path: formats.hdf5.read_targets(path, layout) for path in dict.fromkeys(p for p, _ in samples.items)}
        ys = np.stack([per_file[p] for p, _ in samples.items])
    else:
        raw = tf.data.TFRecordDataset(list(samples.items), compression_type=formats.tfrecord.compression_type(cfg.data))
        shape = tuple(cfg.data.sample_shape)
        parsed = [parse_example(r, shape, layout) for r in raw]
        if not all(bool(sized) for _, _, sized in parsed):
            raise DataError(f"{cfg.data.data_dir}/{name}: a record holds x or y of another size than the layout's "
                            "(python -m common.tools.check_data names it)")
        ys = np.stack([y.numpy() for _, y, _ in parsed])[:samples.count]
    return targets_transform(cfg, layout)(ys).numpy()


def check_data(cfg: CosmoflowConfig) -> tuple[int, list[str]]:
    """Read every file of both splits completely; (files checked, every problem found)."""
    data = cfg.data
    layouts: dict = {}

    def check_file(path):
        if data.format == "tfrecord":
            _check_tfrecord_fully(path, cfg, layouts)
            return
        crops, layout = formats.hdf5.file_layout(path, cfg)
        targets = targets_transform(cfg, layout)
        for crop in range(crops):
            x, y = formats.hdf5.read_crop(path, crop, data.sample_shape)
            _check_values(path, f"crop {crop}", x, targets(y).numpy(), cfg.model.output_scale)

    return check_split_files(data.data_dir, ("train", "validation"),
                             formats.FILE_PATTERNS[data.format],
                             f"CosmoFlow {data.format}", check_file)


def _check_values(path, where: str, x, y, bound: float) -> None:
    if not np.all(np.isfinite(x)):
        raise DataError(f"{path}: {where}: 'x' holds NaN or Inf")
    if np.min(x) < 0:
        raise DataError(f"{path}: {where}: negative particle counts")
    if not np.all(np.isfinite(y)) or np.max(np.abs(y)) > bound:
        raise DataError(f"{path}: {where}: targets {np.round(y, 4).tolist()} (normalised) not finite or beyond "
                        f"the network's output range +-{bound:g}")


def _check_tfrecord_fully(path: str, cfg: CosmoflowConfig, layouts: dict) -> None:
    """Every record's checksums, then its values, in the layout of its split's first whole file."""
    data = cfg.data
    count = scan_tfrecord(path, data.compression, verify_data=True)
    if count != data.samples_per_file:
        raise DataError(f"{path}: holds {count} records but data.samples_per_file is {data.samples_per_file}")
    split = pathlib.Path(path).parent.name
    if split not in layouts:
        layouts[split] = formats.record_layout(path, cfg)
    layout = layouts[split]
    shape = tuple(data.sample_shape)
    targets = targets_transform(cfg, layout)
    for i, record in enumerate(tf.data.TFRecordDataset(path, compression_type=formats.tfrecord.compression_type(data))):
        check_record(record.numpy(), path, i, cfg, layout)
        x, y, _ = parse_example(record, shape, layout)
        _check_values(path, f"record {i}", x.numpy(), targets(y).numpy(), cfg.model.output_scale)


def input_ceiling(cfg: CosmoflowConfig, samples: int) -> dict:
    """The simplest loop that does what the input pipeline does for one training sample, in numpy on one core:
    read the file, inflate it (GZIP), walk the TFRecord framing, parse the Example, int16 -> float32 and the
    normalisation (log1p, or division by the mean).  ``samples`` of them (the training files cycled); what
    ``common.tools.bench --input-only`` compares the pipeline with.  MLPerf's layout (``x`` as int16 bytes)."""
    data = cfg.data
    if data.format != "tfrecord":
        return {"samples_per_second": None, "why_none": "the ceiling loop reads TFRecords (data.format: hdf5)"}
    files = list_files(pathlib.Path(data.data_dir) / "train", formats.tfrecord.PATTERNS, "CosmoFlow train TFRecord")
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


# -- prediction: one file of any layout the readers take ---------------------------------

def file_split(cfg: CosmoflowConfig, path) -> tuple[CosmoflowSplit, CosmoflowConfig]:
    """One file as the engine takes it, whatever ``data.format`` the run trained on, and the config its samples
    are read by (the run's, with the file's format).  The format is told by the file's content: HDF5 (split
    crops, or a raw universe cut into crops of ``data.sample_shape`` in C order over the crop grid, as
    prepare.py cuts them; without ``unitPar`` / ``y`` too) or a TFRecord variant (GZIP when it starts as
    GZIP does).  Every sample, in file order.  A DataError naming the file when the readers cannot take it."""
    path = str(path)
    if formats.hdf5.is_hdf5(path):
        file_format, compression = "hdf5", "none"
    else:
        with open(path, "rb") as handle:
            compression = "gzip" if handle.read(2) == b"\x1f\x8b" else "none"
        file_format = "tfrecord"
    cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"format": file_format,
                                                                     "compression": compression})})
    if file_format == "hdf5":
        crops, layout = formats.hdf5.file_layout(path, cfg, require_targets=False)
        count, index = crops, [(path, crop) for crop in range(crops)]
    else:
        count, index = scan_tfrecord(path, compression), None
        layout = formats.record_layout(path, cfg)

    def read(dist: Distributed, seed, training: bool):
        return _records(cfg, [path], index, dist, seed, training, layout)

    return CosmoflowSplit(name="predict", where=path, count=count, read=read, items=[path] if index is None else index,
                          layout=layout), cfg


def prediction_inputs(cfg: CosmoflowConfig, layout: SampleLayout):
    """(x, y, files, sized) batch -> (x normalised as :func:`evaluation_dataset` hands it to the network, the
    stored targets of ``data.target_names`` in the file's units: none for a file without targets), checked as
    evaluation checks them (:func:`check_batch`) except the targets' range, which prediction does not use."""
    data = cfg.data
    index = tf.constant([layout.targets.index(n) for n in data.target_names] if layout.targets else [], tf.int32)
    expected = f"{layout.file_format}, data.sample_shape {list(data.sample_shape)}, {len(layout.targets)} targets"

    def finish(x, y, files, sized):
        stored = tf.gather(y, index, axis=-1)
        zero = check_batch(x, stored, files, sized, math.inf, expected)
        return network_input(x, cfg), stored + zero

    return finish
