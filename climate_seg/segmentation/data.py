"""Climate segmentation data: the HDF5 sample files and the tf.data pipeline.

Layout: ``data_dir/{train,validation,test}/*.h5``, one sample per file with
``climate/data`` float32 (H, W, 16) and ``climate/labels_0`` (H, W) in
{0, 1, 2} (DeepCAM), or ``climate/data`` (16, H, W) and ``climate/labels``
(SC18), told apart by their shapes; statistics from DeepCAM's
``data_dir/stats.h5``, SC18's ``data_dir/train/stats.h5`` (which is skipped as
a sample) or ``python -m climate_seg.cam5.stats`` (:func:`climate_seg.cam5.stats.load_stats`).

Reading without the GIL: at start-up every file is screened once (each rank a
share) and the byte offsets of its two datasets are recorded.  When every file
stores them contiguously and uncompressed (what ``climate_seg.cam5.convert``
writes, and HDF5's default), each array is read at its offset straight into
its buffer (``readinto``, which releases the GIL while it reads, so reads run
in parallel on the tf.data thread pool).  Chunked or compressed files fall
back to h5py inside ``tf.numpy_function`` (correct, but serialised on the
GIL); the run says so.

Per sample: normalise per channel (min-max or z-score from stats.h5),
average-pool the fields and take every n-th label (``data.downsample``),
random crop and longitude roll when training (centre crop otherwise).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time

import h5py
import numpy as np
import tensorflow as tf

from climate_seg.cam5.config import CHANNELS, CLASS_NAMES
from climate_seg.segmentation.config import ClimateConfig
from climate_seg.cam5.convert import convert
from climate_seg.cam5.data import SPLITS, normalizer, prepare, screened_split, stats_path
from climate_seg.cam5.stats import class_counts_path, load_stats, read_sample, sample_layout, write_class_counts
from climate_seg.cam5.synth import generate_dataset
from common.application import Datasets
from common.loop import epochs
from common.storage.data import check_split_files, read_at, select_count
from common.storage.staging import stage_files
from common.storage.derived import writable_derived
from common.distributed import Distributed
from common.errors import DataError

log = logging.getLogger(__name__)

AUTOTUNE = tf.data.AUTOTUNE
N_CHANNELS = len(CHANNELS)
# dtypes the raw reader decodes (little-endian, as HDF5 writes on every machine we run on).
RAW_LABEL_DTYPES = {"<i4": tf.int32, "<i8": tf.int64, "|u1": tf.uint8, "|i1": tf.int8, "<i2": tf.int16,
                    "<u2": tf.uint16, "<f4": tf.float32, "<f8": tf.float64}


@dataclasses.dataclass(frozen=True)
class SampleFile:
    """Where a sample's arrays sit in its file (offsets None: not readable raw)."""

    path: str
    data_offset: int | None
    label_offset: int | None
    label_dtype: str
    channels_first: bool = False   # SC18: climate/data (16, H, W)


def inspect_file(path: str, grid: tuple[int, int]) -> SampleFile | None:
    """Check one sample file's datasets and shapes; record their byte offsets (None: a statistics file)."""
    try:
        with h5py.File(path, "r") as f:
            layout = sample_layout(f, path, grid)
            if layout is None:
                return None
            channels_first, label_key = layout
            data, labels = f["climate/data"], f[label_key]
            raw = data.dtype.str == "<f4" and labels.dtype.str in RAW_LABEL_DTYPES
            offsets = [d.id.get_offset() if raw and d.chunks is None and d.compression is None else None
                       for d in (data, labels)]
            return SampleFile(path, offsets[0], offsets[1], labels.dtype.str, channels_first)
    except OSError as exc:
        raise DataError(f"{path}: not a readable HDF5 file ({exc})") from None


def split_files(cfg: ClimateConfig, split: str, dist: Distributed | None = None,
                problems: list[str] | None = None) -> list[SampleFile]:
    """The screened sample files of one split, in name order (statistics files among them left out)."""
    good, layouts = screened_split(cfg.data, split, lambda f: inspect_file(f, cfg.data.grid), "climate sample",
                                   dist, problems)
    return [layouts[f] for f in good if layouts[f] is not None]


def raw_readable(files: list[SampleFile]) -> bool:
    """Whether every file can be read by offset without h5py (contiguous data and labels, one label dtype,
    one layout)."""
    return all(f.data_offset is not None and f.label_offset is not None for f in files) and \
        len({f.label_dtype for f in files}) == 1 and len({f.channels_first for f in files}) == 1


# -- reading ------------------------------------------------------------------------------

def _read_raw(cfg: ClimateConfig, label_dtype: str, channels_first: bool):
    h, w = cfg.data.grid
    shape = (N_CHANNELS, h, w) if channels_first else (h, w, N_CHANNELS)
    label_type = RAW_LABEL_DTYPES[label_dtype]

    def load(path, data_offset, label_offset):
        path = path.decode()
        return (read_at(path, int(data_offset), "<f4", shape, "climate/data"),
                read_at(path, int(label_offset), label_dtype, (h, w), "labels"))

    def read(path, data_offset, label_offset):
        # One read per array into its own buffer: tf.io.read_file + substr + decode_raw made three copies of
        # each 57 MB DeepCAM sample (profile in docs/performance.md), twice the time of this.
        data, labels = tf.numpy_function(load, [path, data_offset, label_offset], [tf.float32, label_type],
                                         stateful=False)
        data = tf.ensure_shape(data, shape)
        if channels_first:   # SC18: (16, H, W)
            data = tf.transpose(data, (1, 2, 0))
        return data, tf.cast(tf.ensure_shape(labels, (h, w)), tf.int32)

    return read


def _read_h5py(cfg: ClimateConfig):
    h, w = cfg.data.grid

    def load(path):
        data, labels = read_sample(path.decode())
        return data.astype(np.float32), labels.astype(np.int32)

    def read(path, _data_offset, _label_offset):
        data, labels = tf.numpy_function(load, [path], [tf.float32, tf.int32], stateful=False)
        return tf.ensure_shape(data, (h, w, N_CHANNELS)), tf.ensure_shape(labels, (h, w))

    return read


def _check(path, data, labels):
    """A float32 zero that the sample's values must be computed through: raises a DataError naming the file
    for NaN/Inf fields or labels outside 0-2.  (An op used only as a control dependency would be pruned
    by TensorFlow's graph optimiser: the check must feed the data.)"""
    def check(p, finite, low, high):
        if not finite:
            raise DataError(f"{p.decode()}: climate/data holds NaN or Inf")
        if low < 0 or high >= len(CLASS_NAMES):
            raise DataError(f"{p.decode()}: climate/labels_0 holds values {low if low < 0 else high} outside "
                            f"0-{len(CLASS_NAMES) - 1} ({', '.join(CLASS_NAMES)})")
        return np.float32(0)

    zero = tf.numpy_function(check, [path, tf.reduce_all(tf.math.is_finite(data)), tf.reduce_min(labels),
                                     tf.reduce_max(labels)], tf.float32, stateful=False)
    return tf.ensure_shape(zero, [])


# -- per-sample transforms ------------------------------------------------------------------

def downsample(data, labels, factor: int):
    """Average-pool the fields; sample the labels at the centre of each block (no class mixing)."""
    if factor == 1:
        return data, labels
    data = tf.nn.avg_pool2d(data[None], factor, factor, "VALID")[0]
    return data, labels[factor // 2::factor, factor // 2::factor]


def crop(data, labels, size, seed=None):
    """A (h, w) window: random with ``seed`` (stateless), centred without."""
    h, w = size
    height, width = tf.shape(labels)[0], tf.shape(labels)[1]
    if seed is None:
        top, left = (height - h) // 2, (width - w) // 2
    else:
        top = tf.random.stateless_uniform([], seed=seed, maxval=height - h + 1, dtype=tf.int32)
        left = tf.random.stateless_uniform([], seed=seed + 1, maxval=width - w + 1, dtype=tf.int32)
    return data[top:top + h, left:left + w], labels[top:top + h, left:left + w]


def _samples(cfg: ClimateConfig, files: list[SampleFile], stats: dict, dist: Distributed, seed: int,
             training: bool, staged: bool = False) -> tf.data.Dataset:
    """This rank's (normalised field, labels) samples (``staged``: ``files`` are already this rank's share)."""
    data = cfg.data
    offset, scale = normalizer(cfg.data.normalization, stats)
    raw = raw_readable(files)
    read = _read_raw(cfg, files[0].label_dtype, files[0].channels_first) if raw else _read_h5py(cfg)
    share = epochs.rank_share((tf.constant([f.path for f in files]),
                               tf.constant([f.data_offset or 0 for f in files], tf.int64),
                               tf.constant([f.label_offset or 0 for f in files], tf.int64)),
                              dist, seed, shuffle=training, this_rank_only=staged)

    def load(path, data_offset, label_offset):
        fields, labels = read(path, data_offset, label_offset)
        zero = _check(path, fields, labels)   # folded into the normalisation (exact: x - (o + 0) = x - o)
        return downsample((fields - (offset + zero)) / scale, labels + tf.cast(zero, tf.int32), data.downsample)

    samples = share.samples(share.items.map(load, num_parallel_calls=data.read_parallelism, deterministic=True))
    if training:
        seeds = tf.data.Dataset.random(seed=seed + 1).batch(2)
        samples = tf.data.Dataset.zip((samples, seeds)).map(
            lambda sample, s: _augment(cfg, *sample, s), num_parallel_calls=AUTOTUNE, deterministic=True)
    elif data.crop:
        samples = samples.map(lambda x, y: crop(x, y, data.crop), num_parallel_calls=AUTOTUNE)
    return samples


def input_ceiling(cfg: ClimateConfig, samples: int) -> dict:
    """The simplest loop that does what the training input pipeline does for one sample, in numpy on one core:
    read the fields and labels at their byte offsets (h5py for files not stored contiguously),
    check them (finite fields, labels 0-2), normalise per channel, average-pool by ``data.downsample``, and the
    training augmentation (random crop, longitude roll).  ``samples`` of them (the training files cycled in
    name order); what ``common.tools.bench --input-only`` compares the pipeline with.  ``value_sum``: the sum
    of every normalised, pooled field value before the crop (the roll keeps it), for checking the work."""
    data = cfg.data
    files = split_files(cfg, "train")
    offset, scale = normalizer(data.normalization, load_stats(stats_path(cfg)))
    (h, w), k = data.grid, data.downsample
    rng = np.random.default_rng(cfg.train.seed)
    done, value_sum, start = 0, 0.0, time.perf_counter()
    while done < samples:
        for f in files[:samples - done]:
            if f.data_offset is not None and f.label_offset is not None:
                fields = read_at(f.path, f.data_offset, "<f4", (h * w * N_CHANNELS,), "climate/data")
                fields = (fields.reshape(N_CHANNELS, h, w).transpose(1, 2, 0) if f.channels_first
                          else fields.reshape(h, w, N_CHANNELS))
                labels = read_at(f.path, f.label_offset, f.label_dtype, (h, w), "labels")
            else:
                fields, labels = read_sample(f.path)
            if not np.isfinite(fields).all() or labels.min() < 0 or labels.max() >= len(CLASS_NAMES):
                raise DataError(f"{f.path}: climate/data holds NaN or Inf, or labels outside 0-{len(CLASS_NAMES) - 1}")
            x = (fields - offset) / scale
            if k > 1:
                x = x.reshape(h // k, k, w // k, k, N_CHANNELS).mean(axis=(1, 3), dtype=np.float32)
                labels = labels[k // 2::k, k // 2::k]
            value_sum += float(x.sum(dtype=np.float64))
            if data.crop:
                top, left = rng.integers(x.shape[0] - data.crop[0] + 1), rng.integers(x.shape[1] - data.crop[1] + 1)
                x = x[top:top + data.crop[0], left:left + data.crop[1]]
                labels = labels[top:top + data.crop[0], left:left + data.crop[1]]
            if data.augment:
                shift = rng.integers(x.shape[1])
                x, labels = np.roll(x, shift, axis=1), np.roll(labels, shift, axis=1)
            labels = labels.astype(np.int32)
            done += 1
    seconds = time.perf_counter() - start
    return {"samples_per_second": done / seconds, "samples": done, "seconds": seconds, "value_sum": value_sum,
            "bytes_per_sample": h * w * (N_CHANNELS * 4 + np.dtype(files[0].label_dtype).itemsize)}


def _augment(cfg: ClimateConfig, fields, labels, seed):
    data = cfg.data
    if data.crop:
        fields, labels = crop(fields, labels, data.crop, seed)
    if data.augment:
        shift = tf.random.stateless_uniform([], seed=seed + 2, maxval=tf.shape(labels)[1], dtype=tf.int32)
        fields, labels = tf.roll(fields, shift, axis=1), tf.roll(labels, shift, axis=1)
    return fields, labels


def _batches(cfg: ClimateConfig, samples: tf.data.Dataset, training: bool, seed: int,
             batch_size: int) -> tf.data.Dataset:
    shape = cfg.data.input_shape
    samples = samples.map(lambda x, y: (tf.ensure_shape(x, shape), tf.ensure_shape(y, shape[:2])))
    if training and cfg.data.shuffle_buffer:
        samples = samples.shuffle(cfg.data.shuffle_buffer, seed=seed)
    return samples.batch(batch_size, drop_remainder=True)


def split(cfg: ClimateConfig, name: str, dist: Distributed, selected: bool = False) -> epochs.Split:
    """The samples of ``data_dir/name`` as the engine reads them: the screened files in name order (``selected``:
    the first ``data.n_train`` / ``data.n_validation`` of them, what training uses), the bad ones (with
    ``data.on_bad_file: skip``) in its ``skipped``."""
    skipped: list[str] = []
    files = split_files(cfg, name, dist, skipped)
    where = f"{cfg.data.data_dir}/{name}"
    if selected:
        files = files[:select_count(len(files), *cfg.data.requested(name), where)]
    return _split_of(cfg, name, where, files, len(files), skipped)


def _split_of(cfg: ClimateConfig, name: str, where: str, files: list[SampleFile], count: int, skipped: list[str],
              staged: bool = False) -> epochs.Split:
    stats = load_stats(stats_path(cfg))
    return epochs.Split(name=name, where=where, count=count, items=files, skipped=skipped,
                        read=lambda dist, seed, training: _samples(cfg, files, stats, dist, seed, training, staged))


def staged(cfg: ClimateConfig, train: epochs.Split, dist: Distributed) -> epochs.Split:
    """``train`` read from this rank's copies in ``data.stage_dir`` (rank r takes files r, r + size, ...)."""
    files = list(train.items)
    copies = stage_files([f.path for f in files], cfg.data.stage_dir, dist, data_dir=cfg.data.data_dir)
    mine = [dataclasses.replace(f, path=c) for f, c in zip(files[dist.rank::dist.size], copies)]
    return _split_of(cfg, train.name, train.where, mine, train.count, train.skipped, staged=True)


def build_datasets(cfg: ClimateConfig, dist: Distributed) -> Datasets:
    data = cfg.data
    train = split(cfg, "train", dist, selected=True)
    validation = split(cfg, "validation", dist, selected=True)
    layout = "SC18 (climate/data 16 x H x W, climate/labels)" if train.items[0].channels_first else \
        "DeepCAM (climate/data H x W x 16, climate/labels_0)"
    stats = load_stats(stats_path(cfg))
    log.info(f"climate data: {data.data_dir}: {layout} samples; statistics {stats_path(cfg)} ({stats['format']}), "
             f"{data.normalization} normalisation")
    if not raw_readable([*train.items, *validation.items]):
        log.info(f"note: {data.data_dir} holds chunked or compressed samples; reading them with h5py "
                 "(serialised on the GIL; climate_seg.cam5.convert writes contiguous files)")
    if data.stage_dir:   # the counts checked before the copy: a batch the data cannot fill fails first
        for checked in (train, validation):
            epochs.steps(checked, dist.size, data.batch_size)
        train = staged(cfg, train, dist)
    return epochs.training_datasets(train, validation, dist, cfg.train.seed, data.batch_size,
                                    functools.partial(_batches, cfg),
                                    cache_validation=True)


def evaluation_dataset(cfg: ClimateConfig, name: str = "test") -> tuple[tf.data.Dataset, list[str]]:
    """Every sample of a split in name order, batched: (fields, labels); and the file names."""
    samples = split(cfg, name, Distributed())
    shape = cfg.data.input_shape

    def shaped(x, y):
        return tf.ensure_shape(x, (None, *shape)), tf.ensure_shape(y, (None, *shape[:2]))

    return (epochs.evaluation_walk(samples, cfg.data.batch_size, shaped, seed=cfg.train.seed),
            [f.path for f in samples.items])


def check_data(cfg: ClimateConfig) -> tuple[int, list[str]]:
    """Read every sample of every split; (files checked, every problem found)."""
    def check_file(path):
        if inspect_file(path, cfg.data.grid) is None:
            return   # a statistics file among the samples (SC18)
        fields, labels = read_sample(path)
        if not np.all(np.isfinite(fields)):
            raise DataError(f"{path}: climate/data holds NaN or Inf")
        if labels.min() < 0 or labels.max() >= len(CLASS_NAMES):
            raise DataError(f"{path}: climate/labels_0 holds values outside 0-{len(CLASS_NAMES) - 1}")

    checked, problems = check_split_files(cfg.data.data_dir, SPLITS, ("*.h5",), "climate sample", check_file)
    try:
        load_stats(stats_path(cfg))
    except DataError as exc:
        problems.append(str(exc))
    return checked, problems


def prepare_data(cfg: ClimateConfig) -> None:
    """Synthetic netCDF -> converted HDF5 samples -> stats.h5, for whatever is missing; and the class
    counts a published statistics file lacks, when the loss weights need them (a file of their own in the
    derived folder)."""
    def generate(root):
        netcdf = generate_dataset(root / "netcdf", cfg.data.synth, progress=False)
        for split in SPLITS:
            convert([str(p) for p in netcdf[split]], root / split)

    prepare(cfg, generate, "CAM5 fields (netCDF, converted)", CHANNELS)
    stats_file = stats_path(cfg)
    counts_file = class_counts_path(cfg.data, stats_file)
    if isinstance(cfg.loss.class_weights, str) and cfg.loss.class_weights != "none" and stats_file.is_file() \
            and "class_frequencies" not in load_stats(stats_file) and not counts_file.is_file():
        files = [f.path for f in split_files(cfg, "train")]
        frequencies = write_class_counts(writable_derived(counts_file), files)
        log.info(f"{stats_file} holds no class frequencies; counted them over {len(files)} training samples into "
                 f"{counts_file}: " + ", ".join(f"{n} {f:.4%}" for n, f in zip(CLASS_NAMES, frequencies)))
