"""CosmoFlow data: the tf.data pipeline over the formats of :mod:`cosmoflow.formats`, and the data checks.

Layout of ``data.data_dir``: ``train/`` and ``validation/`` subdirectories.
``data.format`` names a file family of ``cosmoflow/formats/`` (its table
``FAMILIES``); within its files the variant is told by their content (a
:class:`~cosmoflow.formats.layout.SampleLayout`), never by their names.  This
module calls the family's protocol only (no branch on the format), hands the
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

import numpy as np
import tensorflow as tf

from common.application import Datasets
from common.loop import epochs
from common.distributed import Distributed
from common.errors import DataError
from common.nn.precision import compute_dtype
from common.storage.data import check_split_files
from cosmoflow import formats
from cosmoflow.config import CosmoflowConfig
from cosmoflow.formats.layout import SampleLayout, Selection

log = logging.getLogger(__name__)

AUTOTUNE = tf.data.AUTOTUNE


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
    """A split as the engine takes it, with the layout its files hold (what its batches are finished by) and
    what its family selected (what staging copies)."""

    layout: SampleLayout | None = None
    selection: Selection | None = None


def _split_of(cfg: CosmoflowConfig, name: str, where: str, family, selection: Selection) -> CosmoflowSplit:
    """The engine's split of what ``family`` selected: its samples read by the family (:mod:`cosmoflow.formats`)."""
    return CosmoflowSplit(name=name, where=where, count=selection.count, items=selection.items,
                          skipped=list(selection.problems), find_bad_file=family.bad_file_finder(cfg, selection),
                          layout=selection.layout, selection=selection,
                          read=lambda dist, seed, training: family.read(cfg, selection, dist, seed, training))


def split(cfg: CosmoflowConfig, name: str, dist: Distributed, selected: bool = False) -> CosmoflowSplit:
    """The ``name`` subfolder of ``data.data_dir`` as the engine takes it: its files listed and checked by the
    family of ``data.format``, every sample or, ``selected``, the first ``data.n_train`` / ``data.n_validation``
    (what training uses), read in file order or shuffled.  ``items``: the files, or (file, crop) pairs for HDF5."""
    data = cfg.data
    family = formats.family(data.format)
    requested, key = data.requested(name) if selected else (None, None)
    selection = family.select(cfg, pathlib.Path(data.data_dir) / name, requested, key, dist)
    return _split_of(cfg, name, f"{data.data_dir}/{name}", family, selection)


def staged(cfg: CosmoflowConfig, train: CosmoflowSplit, dist: Distributed) -> CosmoflowSplit:
    """``train`` read from this rank's copies in ``data.stage_dir`` (a fixed share, shuffled per epoch), staged
    now by its family (:func:`cosmoflow.formats.tfrecord.stage`)."""
    family, copies = formats.family(cfg.data.format).stage(cfg, train.selection, dist)
    return _split_of(cfg, train.name, train.where, family, copies)


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
    if data.stage_dir and hasattr(formats.family(data.format), "stage"):
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
    data = cfg.data
    family = formats.family(data.format)
    selection = family.select(cfg, pathlib.Path(data.data_dir) / name, None, None, Distributed())
    ys = np.stack(family.read_targets(cfg, selection, f"{data.data_dir}/{name}"))
    return targets_transform(cfg, selection.layout)(ys).numpy()


def check_data(cfg: CosmoflowConfig) -> tuple[int, list[str]]:
    """Read every file of both splits completely; (files checked, every problem found)."""
    data = cfg.data
    family = formats.family(data.format)
    layouts: dict = {}

    def check_file(path):
        for where, x, y, layout in family.file_samples(cfg, path, layouts):
            _check_values(path, where, x, targets_transform(cfg, layout)(y).numpy(), cfg.model.output_scale)

    return check_split_files(data.data_dir, ("train", "validation"), family.PATTERNS, f"CosmoFlow {data.format}",
                             check_file)


def _check_values(path, where: str, x, y, bound: float) -> None:
    if not np.all(np.isfinite(x)):
        raise DataError(f"{path}: {where}: 'x' holds NaN or Inf")
    if np.min(x) < 0:
        raise DataError(f"{path}: {where}: negative particle counts")
    if not np.all(np.isfinite(y)) or np.max(np.abs(y)) > bound:
        raise DataError(f"{path}: {where}: targets {np.round(y, 4).tolist()} (normalised) not finite or beyond "
                        f"the network's output range +-{bound:g}")


def input_ceiling(cfg: CosmoflowConfig, samples: int) -> dict:
    """The simplest loop that does what the input pipeline does for ``samples`` training samples, in numpy on one
    core, where the family of ``data.format`` has one (what ``common.tools.bench --input-only`` compares with)."""
    family = formats.family(cfg.data.format)
    if not hasattr(family, "input_ceiling"):
        return {"samples_per_second": None,
                "why_none": f"the ceiling loop reads TFRecords (data.format: {cfg.data.format})"}
    return family.input_ceiling(cfg, samples)


# -- prediction: one file of any layout the readers take ---------------------------------

def file_split(cfg: CosmoflowConfig, path) -> tuple[CosmoflowSplit, CosmoflowConfig]:
    """One file as the engine takes it, whatever ``data.format`` the run trained on, and the config its samples
    are read by (the run's, with the file's format).  The family is told by the file's content
    (:func:`cosmoflow.formats.family_of_file`): HDF5 (split crops, or a raw universe cut into crops of
    ``data.sample_shape`` in C order over the crop grid, as prepare.py cuts them; without ``unitPar`` / ``y``
    too) or a TFRecord variant (GZIP when it starts as GZIP does).  Every sample, in file order.  A DataError
    naming the file when the readers cannot take it."""
    path = str(path)
    family = formats.family_of_file(path)
    selection = family.file_selection(cfg, path)
    cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"format": family.NAME,
                                                                     "compression": selection.compression})})
    return dataclasses.replace(_split_of(cfg, "predict", path, family, selection), find_bad_file=None), cfg


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
