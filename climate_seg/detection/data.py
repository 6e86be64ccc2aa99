"""Detection data: ExtremeWeather-layout HDF5 files, labeled and unlabeled samples, tf.data.

Files in ``data_dir/{train,validation,test}/*.h5`` hold ``images`` (N, C, H,
W) channels-first, ``boxes`` (N, 15, 5) padded with -1 and optionally
``labeled`` (N,).  Channels are selected and ordered by name
(``data.file_channels`` says what the file holds, ``data.channels`` what the
network gets), never by position alone; box columns by ``data.box_columns``
(default: the ExtremeWeather writer's [row min, row max, column min, column
max, class]) and class numbers 0-3 or 1-4 by ``data.box_classes``.  Every box
is checked as the files are screened: min <= max, inside the image, a class
of the numbering; a bad one is a one-line error naming file, sample and row.

A training sample is unlabeled when the file says so, when it is listed in
``data.unlabeled_samples``, or when it falls in the (seeded) 1 -
``data.labeled_fraction`` hidden on purpose.  Each batch takes
``data.labeled_per_batch`` labeled samples and fills the rest with
unlabeled ones (which only feed the reconstruction loss); with
``data.use_unlabeled: false`` unlabeled samples are dropped.  An epoch is one
pass over the labeled samples.  3D: samples are windows of
``model.time_steps`` consecutive snapshots of one file.
"""

from __future__ import annotations

import dataclasses
import logging

import h5py
import numpy as np
import tensorflow as tf

from climate_seg.detection.boxes import TARGET_CHANNELS, encode
from climate_seg.detection.config import BOX_COLUMNS, DetectConfig
from climate_seg.cam5.stats import load_stats
from climate_seg.cam5.data import SPLITS, normalizer, prepare, screened_split, stats_path
from climate_seg.cam5.synth import generate_detection_dataset
from common.application import Datasets
from common.loop import epochs
from common.storage.data import check_split_files, reading
from common.distributed import Distributed
from common.errors import DataError

log = logging.getLogger(__name__)

AUTOTUNE = tf.data.AUTOTUNE


@dataclasses.dataclass(frozen=True)
class Sample:
    path: str
    index: int          # first snapshot in the file
    labeled: bool
    class_offset: int = 0   # 1 for files numbering the classes 1-4


def check_boxes(path: str, boxes: np.ndarray, cfg: DetectConfig) -> set:
    """Raise for a box outside the image, with min > max, or of no class; the classes seen (file numbers)."""
    data = cfg.data
    order = [list(data.box_columns).index(name) for name in BOX_COLUMNS]
    height, width = data.grid
    top = 4 if data.box_classes == "1-4" else (3 if data.box_classes == "0-3" else 4)
    seen: set = set()
    for i, rows in enumerate(np.asarray(boxes, np.float64)):
        for j, row in enumerate(rows):
            ymin, xmin, ymax, xmax, cls = row[order]
            if cls < 0:
                continue   # padding
            problem = None
            if not np.all(np.isfinite(row)):
                problem = "non-finite values"
            elif cls != round(cls) or cls > top or (data.box_classes == "1-4" and cls < 1):
                problem = f"class {cls:g} outside {data.box_classes if data.box_classes != 'auto' else '0-4'}"
            elif ymin > ymax or xmin > xmax:
                problem = "a minimum above its maximum"
            elif ymin < 0 or xmin < 0 or ymax > height or xmax > width:
                problem = f"outside the {height} x {width} image"
            if problem:
                raise DataError(f"{path}: boxes[{i}] row {j} {row.tolist()} (columns {list(data.box_columns)}): "
                                f"{problem}")
            seen.add(int(cls))
    return seen


def class_offset(cfg: DetectConfig, classes: set, where: str) -> int:
    """0 for classes numbered 0-3, 1 for 1-4: as configured, or told by the classes of the training boxes."""
    setting = cfg.data.box_classes
    if setting != "auto":
        return 0 if setting == "0-3" else 1
    if 0 in classes and 4 in classes:
        raise DataError(f"{where}: boxes hold classes 0 and 4: neither 0-3 nor 1-4 numbering")
    if 4 in classes:
        return 1
    if 0 in classes:
        return 0
    raise DataError(f"{where}: the boxes hold classes {sorted(classes)} only, which cannot tell 0-3 (hur-detect "
                    "keras-tf) from 1-4 (its master branch); set data.box_classes")


def inspect_file(path: str, cfg: DetectConfig) -> dict:
    """Check the layout and every box; return the file's snapshot count, labeled flags and classes seen."""
    data = cfg.data
    try:
        with h5py.File(path, "r") as f:
            if "images" not in f or "boxes" not in f:
                raise DataError(f"{path}: expected datasets images (N, C, H, W) and boxes (N, 15, 5)")
            shape, boxes = f["images"].shape, f["boxes"].shape
            expected = (len(data.file_channels), *data.grid)
            if len(shape) != 4 or tuple(shape[1:]) != expected:
                raise DataError(f"{path}: images has shape {shape}, expected (N, {', '.join(map(str, expected))}) "
                                "(data.file_channels, data.grid)")
            if len(boxes) != 3 or boxes[0] != shape[0] or boxes[-1] != 5:
                raise DataError(f"{path}: boxes has shape {boxes}, expected ({shape[0]}, max_boxes, 5)")
            labeled = np.asarray(f["labeled"][()], bool) if "labeled" in f else np.ones(shape[0], bool)
            classes = check_boxes(path, f["boxes"][()], cfg)
    except OSError as exc:
        raise DataError(f"{path}: not a readable HDF5 file ({exc})") from None
    return {"count": int(shape[0]), "labeled": labeled.tolist(), "classes": sorted(classes)}


def split_samples(cfg: DetectConfig, split: str, dist: Distributed | None = None,
                  problems: list[str] | None = None, offset: int | None = None) -> list[Sample]:
    """The samples of a split; class numbers as the training boxes tell them unless ``offset`` is given."""
    good, info = screened_split(cfg.data, split, lambda f: inspect_file(f, cfg), "detection", dist, problems)
    window = cfg.model.time_steps if cfg.model.variant == "3d" else 1
    if not any(info[path]["count"] >= window for path in good):
        raise DataError(f"{cfg.data.data_dir}/{split}: its {len(good)} file(s) hold no snapshot"
                        + (f" window of model.time_steps={window}" if window > 1 else "")
                        + "; expected images (N >= 1, C, H, W)")
    if offset is None:
        offset = training_class_offset(cfg, dist) if split != "train" else \
            class_offset(cfg, {c for path in good for c in info[path]["classes"]}, f"{cfg.data.data_dir}/train")
    top = 3 + offset
    for path in good:
        if any(c < offset or c > top for c in info[path]["classes"]):
            raise DataError(f"{path}: boxes hold classes {info[path]['classes']}, but the training boxes number "
                            f"them {offset}-{top}")
    samples = []
    for path in good:
        flags = info[path]["labeled"]
        for start in range(0, info[path]["count"] - window + 1, window):
            samples.append(Sample(path, start, bool(all(flags[start:start + window])), offset))
    if split == "train":
        samples = _hide_labels(cfg, samples)
    return samples


def training_class_offset(cfg: DetectConfig, dist: Distributed | None = None) -> int:
    """How the training files number their box classes (0- or 1-based): ``data.box_classes``, or read from
    the files when it is ``auto``."""
    if cfg.data.box_classes != "auto":
        return class_offset(cfg, set(), "")
    return split_samples(cfg, "train", dist)[0].class_offset


def _hide_labels(cfg: DetectConfig, samples: list[Sample]) -> list[Sample]:
    data = cfg.data
    listed = set(data.unlabeled_samples)
    if listed and max(listed) >= len(samples):
        raise DataError(f"data.unlabeled_samples lists sample {max(listed)}, but the training split holds "
                        f"{len(samples)}")
    samples = [dataclasses.replace(s, labeled=False) if i in listed else s for i, s in enumerate(samples)]
    if data.labeled_fraction < 1.0:
        labeled = [i for i, s in enumerate(samples) if s.labeled]
        rng = np.random.default_rng(cfg.train.seed + 12345)
        hidden = rng.choice(labeled, size=len(labeled) - int(round(data.labeled_fraction * len(labeled))),
                            replace=False)
        for i in hidden:
            samples[i] = dataclasses.replace(samples[i], labeled=False)
    return samples


# -- reading ----------------------------------------------------------------------------------

def read_boxes(boxes: np.ndarray, columns: list[str], class_offset: int = 0) -> np.ndarray:
    """(n, 5) [ymin, xmin, ymax, xmax, class 0-3] from the file's column order; padding rows dropped."""
    order = [list(columns).index(name) for name in BOX_COLUMNS]
    boxes = np.asarray(boxes, np.float64)[:, order]
    boxes = boxes[boxes[:, 4] >= 0]
    boxes[:, 4] -= class_offset
    return boxes


def read_sample(cfg: DetectConfig, path: str, index: int, labeled: bool, offset, scale, class_offset: int = 0):
    """(snapshot(s) channels-last, normalised; targets (..., gy, gx, 7)) of one sample."""
    data, m = cfg.data, cfg.model
    window = m.time_steps if m.variant == "3d" else 1
    channel_index = [data.file_channels.index(c) for c in data.channels]
    with reading(path, f"images[{index}]"), h5py.File(path, "r") as f:
        images = f["images"][index:index + window]
        boxes = f["boxes"][index:index + window]
    images = network_input(images[:, channel_index], path, index, offset, scale)
    grid = (data.grid[0] // m.cell, data.grid[1] // m.cell)
    targets = np.zeros((window, *grid, TARGET_CHANNELS + 1), np.float32)
    for t in range(window):
        step_boxes = read_boxes(boxes[t], data.box_columns, class_offset)
        if len(step_boxes) and not np.all(np.isin(step_boxes[:, 4], (0, 1, 2, 3))):
            raise DataError(f"{path}: boxes[{index + t}] hold classes outside {class_offset}-{3 + class_offset}")
        targets[t, ..., :TARGET_CHANNELS] = encode(step_boxes, grid, m.cell)
        targets[t, ..., TARGET_CHANNELS] = float(labeled)
    if m.variant == "2d":
        return images[0], targets[0]
    return images, targets


# -- tf.data --------------------------------------------------------------------------------------

def _dataset(cfg: DetectConfig, samples: list[Sample], stats: dict, dist: Distributed, seed: int,
             training: bool) -> tf.data.Dataset:
    data, m = cfg.data, cfg.model
    offset, scale = normalizer(data.normalization, stats, [data.file_channels.index(c) for c in data.channels])
    grid = (data.grid[0] // m.cell, data.grid[1] // m.cell)
    image_shape = (*data.grid, len(data.channels))
    target_shape = (*grid, TARGET_CHANNELS + 1)
    if m.variant == "3d":
        image_shape, target_shape = (m.time_steps, *image_shape), (m.time_steps, *target_shape)
    numbering = samples[0].class_offset
    share = epochs.rank_share((tf.constant([s.path for s in samples]), tf.constant([s.index for s in samples], tf.int64),
                               tf.constant([s.labeled for s in samples])), dist, seed, shuffle=training)

    def read(path, index, labeled):
        images, targets = tf.numpy_function(
            lambda p, i, l: read_sample(cfg, p.decode(), int(i), bool(l), offset, scale, numbering),
            [path, index, labeled], [tf.float32, tf.float32], stateful=False)
        images, targets = tf.ensure_shape(images, image_shape), tf.ensure_shape(targets, target_shape)
        return images, {"detect": targets, "recon": images}

    return share.samples(share.items.map(read, num_parallel_calls=AUTOTUNE, deterministic=True))


def batch_mix(cfg: DetectConfig) -> tuple[int, int]:
    """(labeled, unlabeled) samples per batch."""
    data = cfg.data
    if not data.use_unlabeled:
        return data.batch_size, 0
    labeled = data.labeled_per_batch if data.labeled_per_batch is not None else max(1, data.batch_size // 2)
    return labeled, data.batch_size - labeled


def _concat(a, b):
    return tf.nest.map_structure(lambda x, y: tf.concat([x, y], axis=0), a, b)


def split(cfg: DetectConfig, name: str, dist: Distributed, offset: int | None = None) -> epochs.Split:
    """The labeled samples of ``data_dir/name`` as the engine reads them, in file order (class numbers as the
    training boxes tell them unless ``offset`` is given); the bad files (``data.on_bad_file: skip``) in its
    ``skipped``."""
    skipped: list[str] = []
    samples = [s for s in split_samples(cfg, name, dist, skipped, offset) if s.labeled]
    return samples_split(cfg, name, samples, skipped)


def samples_split(cfg: DetectConfig, name: str, samples: list[Sample], skipped: list[str]) -> epochs.Split:
    """A :class:`~common.loop.epochs.Split` of ``samples`` (of ``data_dir/name``)."""
    stats = load_stats(stats_path(cfg))
    return epochs.Split(name=name, where=f"{cfg.data.data_dir}/{name}", count=len(samples), items=samples,
                        skipped=skipped,
                        read=lambda dist, seed, training: _dataset(cfg, samples, stats, dist, seed, training))


def build_datasets(cfg: DetectConfig, dist: Distributed) -> Datasets:
    """Training batches of ``data.labeled_per_batch`` labeled samples (the epoch: one pass over them) filled
    with unlabeled ones; validation on the labeled validation samples."""
    data = cfg.data
    skipped: list[str] = []
    samples = split_samples(cfg, "train", dist, skipped)
    numbering = samples[0].class_offset
    labeled = samples_split(cfg, "train", [s for s in samples if s.labeled], skipped)
    unlabeled = samples_split(cfg, "train", [s for s in samples if not s.labeled], [])
    validation = split(cfg, "validation", dist, offset=numbering)
    n_labeled, n_unlabeled = batch_mix(cfg)
    if n_unlabeled and not unlabeled.count:
        raise DataError(f"{data.data_dir}/train: no unlabeled samples for data.labeled_per_batch="
                        f"{n_labeled} of data.batch_size={data.batch_size} (set data.use_unlabeled: false, or "
                        "hide labels with data.labeled_fraction)")
    if n_labeled == 0 or not labeled.count:
        raise DataError(f"{data.data_dir}/train: training needs labeled samples in every batch "
                        f"({labeled.count} labeled, data.labeled_per_batch={n_labeled})")
    log.info(f"detection data: {data.data_dir}: ExtremeWeather layout, box columns {list(data.box_columns)}, "
             f"classes numbered {numbering}-{3 + numbering}; {labeled.count} labeled and {unlabeled.count} "
             f"unlabeled training samples, batches of {n_labeled} labeled + {n_unlabeled} unlabeled")

    def batches(samples, training: bool, seed: int, batch_size: int):
        if not training:
            return samples.batch(batch_size, drop_remainder=True)
        stream = samples.batch(n_labeled, drop_remainder=True)
        if n_unlabeled:   # the unlabeled samples cycle beside the epoch's labeled ones, shuffled by their own seed
            # Fewer unlabeled samples than ranks: every rank mixes in all of them (a share would leave one none).
            mixer = dist if unlabeled.count >= dist.size else Distributed()
            extra = unlabeled.read(mixer, seed + 1, True).repeat().batch(n_unlabeled, drop_remainder=True)
            stream = tf.data.Dataset.zip((stream, extra)).map(_concat)
        return stream

    return epochs.training_datasets(labeled, validation, dist, cfg.train.seed, data.batch_size, batches,
                                    train_take=n_labeled, train_key="data.labeled_per_batch", cache_validation=True)


def evaluation_samples(cfg: DetectConfig, name: str = "test"):
    """(batched dataset of (images, {"detect": targets, "recon": images}), samples) of a split, in order."""
    samples = split(cfg, name, Distributed())
    if not samples.count:
        raise DataError(f"{samples.where}: no labeled samples to evaluate")
    return epochs.evaluation_walk(samples, cfg.data.batch_size, seed=cfg.train.seed), list(samples.items)


def true_boxes(cfg: DetectConfig, sample: Sample) -> list[np.ndarray]:
    """The sample's true boxes per time step, (n, 5) in network pixels."""
    window = cfg.model.time_steps if cfg.model.variant == "3d" else 1
    with h5py.File(sample.path, "r") as f:
        raw = f["boxes"][sample.index:sample.index + window]
    return [read_boxes(b, cfg.data.box_columns, sample.class_offset) for b in raw]


def check_data(cfg: DetectConfig) -> tuple[int, list[str]]:
    """The files checked and the problems found (one line each) over every split, for
    ``python -m common.tools.check_data``."""
    problems: list[str] = []
    try:
        numbering = training_class_offset(cfg)
    except DataError as exc:
        problems.append(str(exc))
        numbering = 0

    def check_file(path):
        info = inspect_file(path, cfg)
        offset, scale = np.zeros(len(cfg.data.channels), np.float32), np.ones(len(cfg.data.channels), np.float32)
        window = cfg.model.time_steps if cfg.model.variant == "3d" else 1
        for index in range(0, info["count"] - window + 1, window):
            read_sample(cfg, path, index, True, offset, scale, numbering)

    checked, found = check_split_files(cfg.data.data_dir, SPLITS, ("*.h5",), "detection", check_file)
    problems += found
    try:
        load_stats(stats_path(cfg))
    except DataError as exc:
        problems.append(str(exc))
    return checked, problems


def prepare_data(cfg: DetectConfig) -> None:
    """Synthetic snapshots into an absent or empty data folder when asked; the channel statistics when missing."""
    prepare(cfg, lambda root: generate_detection_dataset(root, cfg.data.synth, progress=False),
            "detection snapshots", cfg.data.file_channels)


# -- prediction on new files (climate_seg/detection/predict.py) -------------------------------------

def network_input(images: np.ndarray, path: str, index: int, offset, scale) -> np.ndarray:
    """Snapshots (window, C, H, W) in the network's channel order -> channels-last float32 normalised with
    the run's ``offset`` and ``scale``: what training, evaluation and prediction feed the network alike."""
    with np.errstate(over="ignore", invalid="ignore"):   # said below in one line, not as numpy's warning
        images = np.transpose(images, (0, 2, 3, 1)).astype(np.float32)
        if not np.all(np.isfinite(images)):
            raise DataError(f"{path}: images[{index}] hold NaN or Inf")
        normalised = (images - offset) / scale
    if not np.all(np.isfinite(normalised)):
        raise DataError(f"{path}: images[{index}] hold values beyond float32's range once normalised with the "
                        "run's channel statistics")
    return normalised


def read_images(cfg: DetectConfig, path: str, index: int, window: int, offset, scale) -> np.ndarray:
    """Snapshots ``index`` .. ``index + window`` of an ExtremeWeather-layout file as the network takes them
    (the file needs no boxes)."""
    channel_index = [cfg.data.file_channels.index(c) for c in cfg.data.channels]
    with reading(path, f"images[{index}]"), h5py.File(path, "r") as f:
        images = f["images"][index:index + window]
    return network_input(images[:, channel_index], path, index, offset, scale)
