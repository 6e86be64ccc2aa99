"""CosmoFlow data: TFRecord and HDF5 readers and the tf.data pipeline.

Layout of ``data.data_dir``: ``train/`` and ``validation/`` subdirectories.

- TFRecord (MLPerf): one example per sample (``samples_per_file`` per file),
  feature ``x`` raw bytes of int16 counts of ``sample_shape``, ``y``
  float32[4] targets in [-1, 1] (Omega_m, sigma_8, n_s, H0); files may be
  GZIP-compressed (``compression: gzip``).
- HDF5 (raw): ``full`` int16 counts (N, N, N, C) channels last and ``unitPar``
  float32[4]; each volume is cut into (N / crop)^3 crops of ``sample_shape``.

Sample counts come from the files present: asking for more (``n_train``,
``n_valid``) is an error; fewer is allowed.
"""

from __future__ import annotations

import math
import pathlib

import h5py
import numpy as np
import tensorflow as tf

from common.data import (Datasets, check_split_files, epoch_seed, list_files, screen_files, select_count,
                         shards_files, shuffled_shards, stage_files, steps_for)
from common.distributed import Distributed
from common.errors import DataError
from common.precision import compute_dtype
from common.tfrecord import scan_tfrecord
from cosmoflow.config import TARGET_NAMES, CosmoflowConfig

TFRECORD_PATTERNS = ("*.tfrecord", "*.tfrecords", "*.tfrecord.gz", "*.tfrecords.gz")
HDF5_PATTERNS = ("*.h5", "*.hdf5")
AUTOTUNE = tf.data.AUTOTUNE


# -- TFRecord -------------------------------------------------------------------

def _compression(cfg_data) -> str:
    return "GZIP" if cfg_data.compression == "gzip" else ""


def parse_example(record, sample_shape):
    features = tf.io.parse_single_example(record, {
        "x": tf.io.FixedLenFeature([], tf.string),
        "y": tf.io.FixedLenFeature([len(TARGET_NAMES)], tf.float32),
    })
    x = tf.io.decode_raw(features["x"], tf.int16)
    x = tf.reshape(x, sample_shape)
    return x, features["y"]


# -- HDF5 -----------------------------------------------------------------------------

def hdf5_crops(path: str, crop: tuple[int, int, int, int]) -> int:
    """Number of crops of ``crop`` in one raw file, after checking its layout."""
    try:
        with h5py.File(path, "r") as f:
            if "full" not in f or "unitPar" not in f:
                raise DataError(f"{path}: expected datasets 'full' and 'unitPar'")
            shape = f["full"].shape
            dtype = f["full"].dtype
            targets = f["unitPar"].shape
    except OSError as exc:
        raise DataError(f"{path}: not a readable HDF5 file ({exc})") from None
    if len(shape) != 4 or shape[3] != crop[3]:
        raise DataError(f"{path}: 'full' has shape {shape}, expected (N, N, N, {crop[3]}) channels last")
    if any(s % c for s, c in zip(shape[:3], crop[:3])):
        raise DataError(f"{path}: 'full' shape {shape[:3]} is not a multiple of the crop {crop[:3]}")
    if targets != (len(TARGET_NAMES),):
        raise DataError(f"{path}: 'unitPar' has shape {targets}, expected ({len(TARGET_NAMES)},)")
    if not np.issubdtype(dtype, np.integer):
        raise DataError(f"{path}: 'full' has dtype {dtype}, expected integer particle counts")
    return int(np.prod([s // c for s, c in zip(shape[:3], crop[:3])]))


def read_hdf5_crop(path, index, crop):
    """Crop number ``index`` (C order over the crop grid) of a raw file."""
    path = path.decode() if isinstance(path, bytes) else str(path)
    with h5py.File(path, "r") as f:
        full = f["full"]
        per_side = [s // c for s, c in zip(full.shape[:3], crop[:3])]
        i, j, k = np.unravel_index(int(index), per_side)
        x = full[i * crop[0]:(i + 1) * crop[0], j * crop[1]:(j + 1) * crop[1], k * crop[2]:(k + 1) * crop[2], :]
        y = f["unitPar"][:]
    if not np.all(np.isfinite(y)):
        raise DataError(f"{path}: 'unitPar' holds NaN or Inf")
    return np.asarray(x, np.int16), np.asarray(y, np.float32)


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
    # Both move whole voxels: view a voxel's channels as one integer where the bytes allow (4 x int16 -> one
    # int64 here), which halves the time of the copies.
    voxel = {2: tf.int16, 4: tf.int32, 8: tf.int64}.get(shape[-1] * x.dtype.size) if shape[-1] > 1 else None
    y = tf.bitcast(x, voxel) if voxel is not None else x
    # One reverse over the chosen axes (one copy, not one per axis).
    y = tf.reverse(y, tf.boolean_mask(tf.range(3), flips))
    if cube:
        y = tf.transpose(y, perm if voxel is not None else tf.concat([perm, [3]], axis=0))
    y = tf.bitcast(y, x.dtype) if voxel is not None else y
    # A cube keeps its static shape under the permutation; Keras needs it for fast kernels.
    return tf.ensure_shape(y, shape)


# -- pipeline ---------------------------------------------------------------------------

def _check_first_record(path: str, cfg: CosmoflowConfig) -> None:
    """The first record has an ``x`` of ``sample_shape`` int16 values and a ``y`` of 4 floats."""
    record = next(iter(tf.data.TFRecordDataset(path, compression_type=_compression(cfg.data))))
    example = tf.train.Example.FromString(record.numpy())
    features = example.features.feature
    if "x" not in features or "y" not in features:
        raise DataError(f"{path}: records need features 'x' (int16 bytes) and 'y' (4 floats), "
                        f"found {sorted(features)}")
    expected = int(np.prod(cfg.data.sample_shape)) * 2
    size = len(features["x"].bytes_list.value[0]) if features["x"].bytes_list.value else 0
    if size != expected:
        raise DataError(f"{path}: 'x' holds {size} bytes, expected {expected} (int16 x data.sample_shape "
                        f"{list(cfg.data.sample_shape)})")
    if len(features["y"].float_list.value) != len(TARGET_NAMES):
        raise DataError(f"{path}: 'y' holds {len(features['y'].float_list.value)} floats, expected {len(TARGET_NAMES)}")


def _inspect_tfrecord(cfg: CosmoflowConfig):
    data = cfg.data

    def inspect(path: str) -> int:
        if data.compression == "gzip":
            # A full walk decompresses everything: left to common.check_data; here the header and size.
            with open(path, "rb") as handle:
                if handle.read(2) != b"\x1f\x8b":
                    raise DataError(f"{path}: not a GZIP file (data.compression is gzip)")
            return data.samples_per_file
        count = scan_tfrecord(path)
        if count != data.samples_per_file:
            raise DataError(f"{path}: holds {count} records but data.samples_per_file is {data.samples_per_file}")
        return count

    return inspect


def _split_samples(cfg: CosmoflowConfig, split: str, requested: int | None, key: str, dist: Distributed):
    """(files to read, samples used, HDF5 crop index or None, bad-file problems) for one split."""
    data = cfg.data
    directory = pathlib.Path(data.data_dir) / split
    if data.format == "tfrecord":
        files = list_files(directory, TFRECORD_PATTERNS, f"CosmoFlow {split} TFRecord")
        files, counts, problems = screen_files(files, _inspect_tfrecord(cfg), dist, data.on_bad_file, str(directory))
        _check_first_record(files[0], cfg)
        used = select_count(sum(counts.values()), requested, key, str(directory))
        chosen, total = [], 0
        for f in files:
            if total >= used:
                break
            chosen.append(f)
            total += counts[f]
        return chosen, used, None, problems
    files = list_files(directory, HDF5_PATTERNS, f"CosmoFlow {split} HDF5")
    files, crops, problems = screen_files(files, lambda f: hdf5_crops(f, data.sample_shape), dist,
                                          data.on_bad_file, str(directory))
    used = select_count(sum(crops.values()), requested, key, str(directory))
    index = [(f, c) for f in files for c in range(crops[f])][:used]
    return sorted({f for f, _ in index}), used, index, problems


def _records(cfg: CosmoflowConfig, files: list[str], index, dist: Distributed, seed, training: bool):
    """(x int16, y float32[4], file name) per sample for this rank, shuffled with ``seed`` when training.

    With staging, ``files`` are this rank's staged copies (a fixed share).
    """
    data = cfg.data
    shape = tuple(data.sample_shape)
    if data.format == "tfrecord":
        if data.stage_dir and training:
            names = tf.random.experimental.stateless_shuffle(tf.constant(files), seed=[seed, dist.rank])
            names = tf.data.Dataset.from_tensor_slices(names)
            record_sharding = False
        else:
            names = shuffled_shards(files, dist, seed, shuffle=training)
            record_sharding = not shards_files(len(files), dist)
        # A read buffer that holds a whole record (MLPerf files hold one 16 MiB sample each): 30% less CPU
        # than the 256 KiB default here.
        buffer_size = min(max(2 * math.prod(shape) + 1024, 256 << 10), 64 << 20)

        def read_file(name):
            records = tf.data.TFRecordDataset(name, compression_type=_compression(data), buffer_size=buffer_size)
            # With on_bad_file: skip, damage found while reading (past the start-up checks) drops the rest of that file.
            records = records.ignore_errors(log_warning=True) if data.on_bad_file == "skip" else records
            return records.map(lambda record: (record, name))   # the file name travels with its samples

        records = names.interleave(
            read_file,
            # Evaluation reads files one after another, so samples come in file order.
            cycle_length=min(8, len(files)) if training else 1, num_parallel_calls=AUTOTUNE, deterministic=True)
        if record_sharding:
            records = records.shard(dist.size, dist.rank)
        return records.map(lambda r, name: (*parse_example(r, shape), name), num_parallel_calls=AUTOTUNE)

    paths = tf.constant([p for p, _ in index])
    crops = tf.constant([c for _, c in index], dtype=tf.int64)
    if training:
        order = tf.random.experimental.stateless_shuffle(tf.range(len(index)), seed=[seed, 1])
        paths, crops = tf.gather(paths, order), tf.gather(crops, order)
    items = tf.data.Dataset.from_tensor_slices((paths, crops)).shard(dist.size, dist.rank)

    def read(path, crop_index):
        x, y = tf.numpy_function(lambda p, c: read_hdf5_crop(p, c, shape), [path, crop_index],
                                 [tf.int16, tf.float32], stateful=False)
        x.set_shape(shape)
        y.set_shape([len(TARGET_NAMES)])
        return x, y, path

    return items.map(read, num_parallel_calls=AUTOTUNE)


def check_batch(x, y, files):
    """A float32 zero the batch's targets are computed through: raises a DataError naming the first file
    whose sample holds negative particle counts or non-finite targets.  (It must feed the data: an op used
    only as a control dependency would be pruned by TensorFlow's graph optimiser.)"""
    def check(names, lowest, finite):
        for name, low, ok in zip(names, lowest, finite):
            if low < 0:
                raise DataError(f"{name.decode()}: 'x' holds negative particle counts (lowest {low})")
            if not ok:
                raise DataError(f"{name.decode()}: 'y' holds NaN or Inf")
        return np.float32(0)

    spatial = list(range(1, len(x.shape)))
    zero = tf.numpy_function(check, [files, tf.reduce_min(x, axis=spatial), tf.reduce_all(tf.math.is_finite(y), 1)],
                             tf.float32, stateful=False)
    return tf.ensure_shape(zero, [])


def _inputs_and_targets(cfg: CosmoflowConfig, dtype=tf.float32):
    """(x, y, files) batch -> (normalised x, selected targets), both checked (:func:`check_batch`)."""
    data = cfg.data
    target_index = [TARGET_NAMES.index(n) for n in data.target_names]

    def finish(x, y, files):
        zero = check_batch(x, y, files)
        return normalise(x, data.apply_log, dtype), tf.gather(y, target_index, axis=1) + zero

    return finish


def _pipeline(cfg: CosmoflowConfig, records: tf.data.Dataset, training: bool, seed) -> tf.data.Dataset:
    data = cfg.data

    # Shuffle, augment and batch the raw int16 counts; normalise whole batches last: flips and permutations
    # commute with the element-wise normalisation, 2-byte values halve the memory traffic and the shuffle
    # buffer, and one normalisation per batch saves the per-sample op overhead that dominates small volumes.
    dataset = records
    if training and data.shuffle_buffer:
        dataset = dataset.shuffle(data.shuffle_buffer, seed=seed)
    if training and data.augment:
        seeds = tf.data.Dataset.random(seed=seed + 1).batch(2)
        dataset = tf.data.Dataset.zip((dataset, seeds)).map(lambda xyf, s: (augment(xyf[0], s), *xyf[1:]),
                                                            num_parallel_calls=AUTOTUNE)
    if data.batch_size == 1:  # a batch of one is a reshape, not a 16 MiB copy
        dataset = dataset.map(lambda x, y, f: (x[tf.newaxis], y[tf.newaxis], f[tf.newaxis]))
    else:
        dataset = dataset.batch(data.batch_size, drop_remainder=True)
    return dataset.map(_inputs_and_targets(cfg, compute_dtype(cfg.train.precision)), num_parallel_calls=AUTOTUNE)


def build_datasets(cfg: CosmoflowConfig, dist: Distributed) -> Datasets:
    """Training (repeating) and validation pipelines for this rank."""
    data = cfg.data
    seed = cfg.train.seed
    train_files, n_train, train_index, train_bad = _split_samples(cfg, "train", data.n_train, "data.n_train", dist)
    valid_files, n_valid, valid_index, valid_bad = _split_samples(cfg, "validation", data.n_valid, "data.n_valid",
                                                                  dist)
    steps = steps_for(n_train, dist.size, data.batch_size, "data.batch_size", f"{data.data_dir}/train")
    valid_steps = steps_for(n_valid, dist.size, data.batch_size, "data.batch_size", f"{data.data_dir}/validation")

    if data.stage_dir and data.format == "tfrecord":
        train_files = stage_files(train_files, data.stage_dir, dist)

    def train_epoch(epoch):
        # A rank whose share is short of steps x batch (uneven files) reuses a few samples.
        seed_e = epoch_seed(seed, epoch)
        records = _records(cfg, train_files, train_index, dist, seed_e, training=True).repeat(2)
        return _pipeline(cfg, records, training=True, seed=seed_e)

    valid_records = _records(cfg, valid_files, valid_index, dist, seed, training=False).repeat(2)
    validation = _pipeline(cfg, valid_records, training=False, seed=seed).take(valid_steps).repeat()
    return Datasets(train_epoch=train_epoch, validation=validation, steps_per_epoch=steps,
                    validation_steps=valid_steps,
                    train_samples=steps * data.batch_size * dist.size,
                    validation_samples=valid_steps * data.batch_size * dist.size,
                    skipped_files=train_bad + valid_bad)


def evaluation_dataset(cfg: CosmoflowConfig, split: str = "validation") -> tuple[tf.data.Dataset, int]:
    """Every sample of a split, in file order, in batches (the last one may be short)."""
    files, used, index, _ = _split_samples(cfg, split, None, "data", Distributed(None))
    records = _records(cfg, files, index, Distributed(None), cfg.train.seed, training=False)
    dataset = records.batch(cfg.data.batch_size).map(_inputs_and_targets(cfg), num_parallel_calls=AUTOTUNE)
    return dataset.prefetch(AUTOTUNE), used


def read_targets(cfg: CosmoflowConfig, split: str) -> np.ndarray:
    """All normalised targets of a split (for baselines), selected as configured."""
    files, used, index, _ = _split_samples(cfg, split, None, "data", Distributed(None))
    target_index = [TARGET_NAMES.index(n) for n in cfg.data.target_names]
    if cfg.data.format == "hdf5":
        values = []
        for path in files:
            with h5py.File(path, "r") as f:
                values.append(np.asarray(f["unitPar"][:], np.float32))
        per_file = dict(zip(files, values))
        ys = np.stack([per_file[p] for p, _ in index])
    else:
        spec = {"y": tf.io.FixedLenFeature([len(TARGET_NAMES)], tf.float32)}
        raw = tf.data.TFRecordDataset(files, compression_type=_compression(cfg.data))
        ys = np.stack([tf.io.parse_single_example(r, spec)["y"].numpy() for r in raw])
    return ys[:, target_index]


def check_data(cfg: CosmoflowConfig) -> tuple[int, list[str]]:
    """Read every file of both splits completely; (files checked, every problem found)."""
    data = cfg.data

    def check_file(path):
        if data.format == "tfrecord":
            _check_tfrecord_fully(path, cfg)
            return
        for crop in range(hdf5_crops(path, data.sample_shape)):
            x, _ = read_hdf5_crop(path, crop, data.sample_shape)
            if x.min() < 0:
                raise DataError(f"{path}: negative particle counts in crop {crop}")

    return check_split_files(data.data_dir, ("train", "validation"),
                             TFRECORD_PATTERNS if data.format == "tfrecord" else HDF5_PATTERNS,
                             f"CosmoFlow {data.format}", check_file)


def _check_tfrecord_fully(path: str, cfg: CosmoflowConfig) -> None:
    data = cfg.data
    count = scan_tfrecord(path, data.compression, verify_data=True)
    if count != data.samples_per_file:
        raise DataError(f"{path}: holds {count} records but data.samples_per_file is {data.samples_per_file}")
    expected = int(np.prod(data.sample_shape)) * 2
    for i, record in enumerate(tf.data.TFRecordDataset(path, compression_type=_compression(data))):
        features = tf.train.Example.FromString(record.numpy()).features.feature
        x = features["x"].bytes_list.value[0] if "x" in features and features["x"].bytes_list.value else b""
        y = np.array(features["y"].float_list.value if "y" in features else [], np.float32)
        if len(x) != expected:
            raise DataError(f"{path}: record {i}: 'x' holds {len(x)} bytes, expected {expected}")
        if y.shape != (len(TARGET_NAMES),) or not np.all(np.isfinite(y)):
            raise DataError(f"{path}: record {i}: 'y' must be {len(TARGET_NAMES)} finite floats, got {y.tolist()}")
        if np.frombuffer(x, np.int16).min() < 0:
            raise DataError(f"{path}: record {i}: negative particle counts")
