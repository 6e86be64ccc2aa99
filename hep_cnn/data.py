"""HEP CNN data: readers for both published HDF5 layouts and the tf.data pipeline.

- ``all_events`` (ATLAS-style RPV files): group ``all_events/`` with ``hist``,
  ``histEM``, ``histtrack`` (N, H, W), ``y`` (1 signal, 0 background),
  ``weight``, ``passSR``.
- ``benchmark`` (SC17 benchmark files, ``hep_{training,validation,test}_chunkN.hdf5``):
  root ``data`` (N, 3, phi, eta), ``label``, ``normweight``, ``weight``, ``psr``.

The layout is told by each file's datasets (``data.layout: auto``) or given.
Images come out channels-last (H = eta, W = phi) whatever the layout: the
benchmark's (phi, eta) images are transposed, so the augmentation flips eta
(the detector is symmetric in it) and rolls phi (periodic), never the other
way round.  1 or 3 channels, divided by
the training-set maximum of each channel (``python -m hep_cnn.maxima``, stored
beside the data).  Event weights are normalised as configured (none, w / max,
log1p).  Splits: files named ``*train*``, ``*val*``, ``*test*``, or all files'
events in order cut by ``data.fractions``; each is handed to the engine as an
:class:`epochs.Split <common.loop.epochs.Split>` of chunks (:func:`split`), which
owns the epoch (steps, epoch seeds, the cut before the shuffle, validation, the
evaluation walk); this module keeps the batches hook (:func:`_batches`).
"""

from __future__ import annotations

# The data tools (subset, manifest, verify: common/tools/datatools.py) need no TensorFlow: run before it loads.
# The splits share one folder: a subset draws its events from each split.
if __name__ == "__main__":
    from common.tools.datatools import command_main   # its layout: the application's declaration
    command_main("hep_cnn.data")

import dataclasses
import functools
import json
import logging
import pathlib
import time

import h5py
import numpy as np
import tensorflow as tf

from common.application import Datasets
from hep_cnn.config import SPLIT_NAMES
from common.loop import epochs
from common.storage.data import check_quietly, list_files, reading, screen_files, select_count
from common.storage.derived import derived_dir, derived_file, writable_derived
from common.storage.transaction import file_transaction, write_json_file
from common.distributed import Distributed
from common.errors import DataError
from hep_cnn.config import HepConfig
from hep_cnn.loss import training_example
from hep_cnn.synth import dataset_present, generate_dataset

MAXIMA_TOOL = "hep_cnn.maxima"   # what the maxima file says wrote it

log = logging.getLogger(__name__)

AUTOTUNE = tf.data.AUTOTUNE
LAYOUT_KEYS = {
    "all_events": {"images": ("all_events/hist", "all_events/histEM", "all_events/histtrack"),
                   "label": "all_events/y", "weight": "all_events/weight", "pass_sr": "all_events/passSR"},
    "benchmark": {"images": ("data",), "label": "label", "weight": "weight", "pass_sr": "psr"},
}


@dataclasses.dataclass(frozen=True)
class Chunk:
    path: str
    start: int
    stop: int
    layout: str = "all_events"


def detect_layout(handle, path: str) -> str:
    """``all_events`` or ``benchmark``, from what an open file holds."""
    if "all_events" in handle:
        return "all_events"
    if "data" in handle and "label" in handle:
        return "benchmark"
    raise DataError(f"{path}: neither HEP layout: expected group all_events/ (hist, histEM, histtrack, y, weight, "
                    f"passSR) or root datasets data (N, 3, phi, eta) and label; found {sorted(handle)[:6]}")


# -- files and splits ---------------------------------------------------------------

def _check_layout(path: str, layout: str, image_size: int) -> tuple[int, str]:
    """(events, layout) of one file, after checking its datasets and shapes (``layout`` auto: detected)."""
    try:
        with h5py.File(path, "r") as f:
            found = detect_layout(f, path)
            if layout != "auto" and found != layout:
                raise DataError(f"{path}: holds the {found} layout, but data.layout is {layout} "
                                "(set data.layout: auto to read each file as it is)")
            keys = LAYOUT_KEYS[found]
            missing = [k for k in (*keys["images"], keys["label"], keys["weight"], keys["pass_sr"]) if k not in f]
            if missing:
                raise DataError(f"{path}: missing datasets {missing} for the {found} layout")
            shapes = {k: f[k].shape for k in (*keys["images"], keys["label"], keys["weight"], keys["pass_sr"])}
    except OSError as exc:
        raise DataError(f"{path}: not a readable HDF5 file ({exc})") from None
    n = shapes[keys["label"]][0] if shapes[keys["label"]] else 0
    for key in (keys["weight"], keys["pass_sr"]):
        if len(shapes[key]) != 1 or shapes[key][0] != n:
            raise DataError(f"{path}: {key} has shape {shapes[key]}, expected ({n},): one value per event of "
                            f"{keys['label']}")
    for key in keys["images"]:
        expected = (n, 3, image_size, image_size) if found == "benchmark" else (n, image_size, image_size)
        if shapes[key] != expected:
            raise DataError(f"{path}: {key} has shape {shapes[key]}, expected {expected} "
                            f"(data.image_size={image_size}, {n} events)")
    return n, found


def split_chunks(cfg: HepConfig, split: str, dist: Distributed | None = None,
                 problems: list[str] | None = None) -> list[Chunk]:
    """The chunks of events (file, start, stop) that make up one split (bad files appended to ``problems``)."""
    data = cfg.data
    dist = dist or Distributed()
    files = list_files(data.data_dir, ("*.h5", "*.hdf5"), "HEP event", data.on_bad_file)
    if data.split == "by_name":
        files = [f for f in files if any(tag in pathlib.Path(f).name for tag in SPLIT_NAMES[split])]
        if not files:
            raise DataError(f"{data.data_dir}: no files with {' or '.join(SPLIT_NAMES[split])} in their name "
                            f"for the {split} split (or set data.split: fractions)")
    files, found, bad = screen_files(files, lambda f: _check_layout(f, data.layout, data.image_size), dist,
                                     data.on_bad_file, data.data_dir)
    counts = {f: n for f, (n, _) in found.items()}
    layouts = {f: layout for f, (_, layout) in found.items()}
    if problems is not None:
        problems.extend(bad)
    if data.split == "by_name":
        ranges = [(f, 0, counts[f]) for f in files]
    else:
        sizes = [(f, counts[f]) for f in files]
        total = sum(n for _, n in sizes)
        bounds = np.cumsum([0.0, *data.fractions]) * total
        index = ("train", "validation", "test").index(split)
        lo, hi = int(round(bounds[index])), int(round(bounds[index + 1]))
        ranges, offset = [], 0
        for f, n in sizes:
            start, stop = max(lo, offset) - offset, min(hi, offset + n) - offset
            if stop > start:
                ranges.append((f, start, stop))
            offset += n
    size = data.chunk_size
    return [Chunk(f, s, min(s + size, stop), layouts[f]) for f, start, stop in ranges
            for s in range(start, stop, size)]


def limit_chunks(chunks: list[Chunk], requested: int | None, key: str, where: str) -> tuple[list[Chunk], int]:
    """The chunks cut to the first ``requested`` events (all if None; an error naming ``key`` if there are
    fewer in ``where``), and the count used."""
    available = sum(c.stop - c.start for c in chunks)
    used = select_count(available, requested, key, where)
    out, remaining = [], used
    for c in chunks:
        if remaining <= 0:
            break
        take = min(remaining, c.stop - c.start)
        out.append(dataclasses.replace(c, stop=c.start + take))
        remaining -= take
    return out, used


# -- reading ----------------------------------------------------------------------------

# Stored image axes -> (N, eta, phi, C): the benchmark layout stores (N, C, phi, eta); the all_events layout's
# per-channel (N, eta, phi) datasets are stacked on axis 1 as (N, C, eta, phi).
TO_EVENT_AXES = {"benchmark": (0, 3, 2, 1), "all_events": (0, 2, 3, 1)}


def read_chunk_stored(path: str, start: int, stop: int, layout: str, channels: int):
    """(images N x C x . x . float32 with the channel axis first, as stored, labels int32, weights float32,
    pass_sr int32), unscaled and checked; ``TO_EVENT_AXES[layout]`` puts the images in (N, eta, phi, C).
    The input pipeline transposes in TensorFlow (several times faster than numpy's strided copy)."""
    keys = LAYOUT_KEYS[layout]
    with reading(path, f"events {start}-{stop}"), h5py.File(path, "r") as f:
        if layout == "benchmark":
            images = f["data"][start:stop, :channels]
        else:
            images = np.stack([f[k][start:stop] for k in keys["images"][:channels]], axis=1)
        labels = f[keys["label"]][start:stop]
        weights = f[keys["weight"]][start:stop]
        pass_sr = f[keys["pass_sr"]][start:stop]
    where = f"{path} events {start}-{stop}"
    if not np.all(np.isfinite(images)):
        raise DataError(f"{where}: images hold NaN or Inf")
    if not np.all(np.isin(labels, (0, 1))):
        raise DataError(f"{where}: labels outside {{0, 1}}: {sorted(set(np.unique(labels)) - {0, 1})[:5]}")
    if not np.all(np.isfinite(weights)) or np.any(weights < 0):
        raise DataError(f"{where}: event weights must be finite and >= 0")
    return (np.asarray(images, np.float32), np.asarray(labels, np.int32).reshape(-1),
            np.asarray(weights, np.float32).reshape(-1), np.asarray(pass_sr, np.int32).reshape(-1))


def read_chunk(path: str, start: int, stop: int, layout: str, channels: int):
    """(images N x eta x phi x C float32, labels int32, weights float32, pass_sr int32), unscaled."""
    images, labels, weights, pass_sr = read_chunk_stored(path, start, stop, layout, channels)
    return np.transpose(images, TO_EVENT_AXES[layout]), labels, weights, pass_sr


def input_ceiling(cfg: HepConfig, samples: int) -> dict:
    """The simplest loop that does what the training input pipeline does for ``samples`` events, in numpy on
    one core: read each training chunk's images, labels and weights with h5py (the benchmark's (phi, eta)
    images transposed to (eta, phi)), check them (finite, labels 0/1, weights >= 0), divide by the channel
    maxima, normalise the weights, and the augmentation (random eta flip, phi roll) when configured.  The
    chunks are cycled in split order; what ``common.tools.bench --input-only`` compares the pipeline with.
    ``value_sum``: the sum of every scaled image value (the flip and the roll keep it)."""
    data = cfg.data
    chunks = split_chunks(cfg, "train")
    maxima = load_maxima(cfg)
    scale = np.maximum(np.array(maxima["channel_max"][:data.channels], np.float32), 1e-12)
    rng = np.random.default_rng(cfg.train.seed)
    done, value_sum, image_bytes, start = 0, 0.0, 0, time.perf_counter()
    while done < samples:
        for chunk in chunks:
            stop, keys = min(chunk.stop, chunk.start + samples - done), LAYOUT_KEYS[chunk.layout]
            with h5py.File(chunk.path, "r") as f:
                if chunk.layout == "benchmark":
                    stored = f["data"][chunk.start:stop, :data.channels]
                    images = stored.transpose(0, 3, 2, 1)
                else:
                    stored = np.stack([f[k][chunk.start:stop] for k in keys["images"][:data.channels]], axis=-1)
                    images = stored
                labels, weights = f[keys["label"]][chunk.start:stop], f[keys["weight"]][chunk.start:stop]
            image_bytes = stored[0].nbytes
            if not np.isfinite(images).all() or not np.isin(labels, (0, 1)).all() or (weights < 0).any():
                raise DataError(f"{chunk.path} events {chunk.start}-{stop}: NaN/Inf images, labels outside "
                                "{0, 1} or negative weights")
            images = images.astype(np.float32)
            if data.scale_by_maxima:
                images = images / scale
            value_sum += float(images.sum(dtype=np.float64))
            weights = weights.astype(np.float32)
            weights = (weights / maxima["weight_max"] if data.weight_normalization == "max"
                       else np.log1p(weights) if data.weight_normalization == "log1p" else weights)
            if data.augment:
                for i in range(len(images)):
                    image = images[i, ::-1] if rng.random() < 0.5 else images[i]
                    images[i] = np.roll(image, rng.integers(image.shape[1]), axis=1)
            done += len(images)
            if done >= samples:
                break
    seconds = time.perf_counter() - start
    return {"samples_per_second": done / seconds, "samples": done, "seconds": seconds, "value_sum": value_sum,
            "bytes_per_sample": image_bytes}


def compute_maxima(cfg: HepConfig) -> dict:
    """Per-channel image maxima and the weight maximum over the training split."""
    channel_max = np.zeros(3, np.float64)
    weight_max = 0.0
    for chunk in split_chunks(cfg, "train"):
        images, _, weights, _ = read_chunk(chunk.path, chunk.start, chunk.stop, chunk.layout, 3)
        channel_max = np.maximum(channel_max, images.reshape(-1, 3).max(axis=0))
        weight_max = max(weight_max, float(weights.max()))
    return {"channel_max": channel_max.tolist(), "weight_max": weight_max,
            "layout": cfg.data.layout, "image_size": cfg.data.image_size}


def write_maxima(cfg: HepConfig, force: bool = False, path=None) -> dict:
    """Compute and write the maxima into ``path`` (default: the derived folder, never the data folder); a file
    there that this suite did not write is kept (an error) unless ``force``."""
    data = pathlib.Path(cfg.data.data_dir)
    # the derived folder: never inside the data folder it reads; a ``path`` given: a folder the suite generated
    inputs = [data] if path is None else []
    path = writable_derived(derived_dir(cfg.data) / cfg.data.maxima_file) if path is None else path
    file_transaction(path, MAXIMA_TOOL, force, inputs=inputs)   # checked before the pass over the training split
    maxima = compute_maxima(cfg)
    write_json_file(path, maxima, MAXIMA_TOOL, force, inputs=inputs, source=f"the training split of {data}")
    return maxima


def maxima_path(cfg: HepConfig) -> pathlib.Path:
    """The training-set maxima: the suite's in the derived folder (:func:`common.storage.derived.derived_dir`),
    else a file beside the data (shipped with it, or written there by versions before 2026-12-04), else where
    ``hep_cnn.maxima`` writes them (the derived folder, never the data folder)."""
    return derived_file(cfg.data, cfg.data.maxima_file)


def load_maxima(cfg: HepConfig) -> dict:
    """The training-set maxima (per channel, and of the event weights) that normalise every split."""
    path = maxima_path(cfg)
    if not path.is_file():
        raise DataError(f"{path}: training-set maxima not found; run python -m hep_cnn.maxima --config <config> "
                        "(on several nodes, with data.derived_dir a folder they all see)")
    try:
        maxima = json.loads(path.read_text())
        valid = len(maxima["channel_max"]) == 3 and maxima["weight_max"] > 0
    except (ValueError, KeyError, TypeError):
        valid = False
    if not valid:
        raise DataError(f"{path}: expected JSON with channel_max (3 numbers) and weight_max > 0")
    return maxima


def normalise_weights(weights, mode: str, weight_max: float):
    """Event weights for the loss: divided by the training maximum (``max``), ``log1p``, or as they are."""
    if mode == "max":
        return weights / weight_max
    if mode == "log1p":
        return tf.math.log1p(weights)
    return weights


# -- tf.data ------------------------------------------------------------------------------

def _events(cfg: HepConfig, chunks: list[Chunk], maxima: dict, dist: Distributed, seed, training: bool,
            reader=None):
    """Per-event (image, label, weight, pass_sr) for this rank; chunks shuffled with ``seed`` when training.
    ``reader``: what reads a chunk (default :func:`read_chunk_stored`; new events: :func:`read_chunk_unlabelled`)."""
    reader = reader or read_chunk_stored
    data = cfg.data
    shape = (data.image_size, data.image_size, data.channels)
    scale = np.array(maxima["channel_max"][:data.channels], np.float32) if data.scale_by_maxima else None
    share = epochs.rank_share((tf.constant([c.path for c in chunks]), tf.constant([c.start for c in chunks], tf.int64),
                               tf.constant([c.stop for c in chunks], tf.int64), tf.constant([c.layout for c in chunks])),
                              dist, seed, shuffle=training)

    def read(path, start, stop, layout):
        images, labels, weights, pass_sr = tf.numpy_function(
            lambda p, a, b, lay: reader(p.decode(), int(a), int(b), lay.decode(), data.channels),
            [path, start, stop, layout], [tf.float32, tf.int32, tf.float32, tf.int32], stateful=False)
        images.set_shape((None, data.channels, None, None))
        for t in (labels, weights, pass_sr):
            t.set_shape((None,))
        if scale is not None:   # on the channel axis, before the transpose: the same values, and a smaller copy
            images = images / np.maximum(scale, 1e-12)[:, None, None]
        axes = tf.where(tf.equal(layout, "benchmark"), TO_EVENT_AXES["benchmark"], TO_EVENT_AXES["all_events"])
        images = tf.ensure_shape(tf.transpose(images, axes), (None, *shape))
        weights = normalise_weights(weights, data.weight_normalization, maxima["weight_max"])
        return tf.data.Dataset.from_tensor_slices((images, labels, weights, pass_sr))

    return share.samples(share.items.interleave(read, cycle_length=4 if training else 1, num_parallel_calls=AUTOTUNE,
                                                deterministic=True))


def augment(image, seed):
    """Random eta flip (axis 0) and phi roll (axis 1, periodic): the detector is symmetric in both."""
    flip = tf.random.stateless_uniform([], seed=seed) < 0.5
    image = tf.cond(flip, lambda: tf.reverse(image, [0]), lambda: image)
    shift = tf.random.stateless_uniform([], seed=seed + 1, maxval=tf.shape(image)[1], dtype=tf.int32)
    return tf.roll(image, shift, axis=1)


def _batches(cfg: HepConfig, events: tf.data.Dataset, training: bool, seed, batch_size: int) -> tf.data.Dataset:
    data = cfg.data
    if training and data.shuffle_buffer:
        events = events.shuffle(data.shuffle_buffer, seed=seed)
    if training and data.augment:
        seeds = tf.data.Dataset.random(seed=seed + 1).batch(2)
        events = tf.data.Dataset.zip((events, seeds)).map(
            lambda e, s: (augment(e[0], s), *e[1:]), num_parallel_calls=AUTOTUNE)
    return events.map(training_example(cfg), num_parallel_calls=AUTOTUNE).batch(batch_size, drop_remainder=True)


def split(cfg: HepConfig, name: str, dist: Distributed, selected: bool = False) -> epochs.Split:
    """One split's events as the engine takes them: its chunks (:func:`split_chunks`; ``items``), every event
    or, ``selected``, the first ``data.n_train`` / ``data.n_validation`` (what training uses), read in file
    order or chunks shuffled (:func:`_events`), scaled by the training-set maxima."""
    data = cfg.data
    bad: list[str] = []
    chunks = split_chunks(cfg, name, dist, bad)
    if selected:
        chunks, count = limit_chunks(chunks, *data.requested(name), data.data_dir)
    else:
        count = sum(c.stop - c.start for c in chunks)
    maxima = load_maxima(cfg)
    return epochs.Split(name=name, where=f"{data.data_dir} ({name})", count=count, items=chunks, skipped=bad,
                        read=lambda dist, seed, training: _events(cfg, chunks, maxima, dist, seed, training))


def build_datasets(cfg: HepConfig, dist: Distributed) -> Datasets:
    """Training epochs and validation batches for this rank: the engine's (:func:`epochs.training_datasets
    <common.loop.epochs.training_datasets>`) over :func:`split` s, batched by :func:`_batches`."""
    train, validation = split(cfg, "train", dist, selected=True), split(cfg, "validation", dist, selected=True)
    return epochs.training_datasets(train, validation, dist, cfg.train.seed, cfg.data.batch_size,
                                    functools.partial(_batches, cfg))


def evaluation_events(cfg: HepConfig, name: str = "test"):
    """Every event of a split in file order: batches of (images, labels, raw weights, pass_sr), the engine's
    :func:`evaluation walk <common.loop.epochs.evaluation_walk>`."""
    raw = cfg.model_copy(deep=True)
    raw.data.weight_normalization = "none"
    return epochs.evaluation_walk(split(raw, name, Distributed()), cfg.data.batch_size, seed=cfg.train.seed)


def check_data(cfg: HepConfig) -> tuple[int, list[str]]:
    """Read every event of every file; (files checked, every problem found)."""
    data = cfg.data
    problems: list[str] = []
    try:   # every entry listed: one that is no readable file is a problem of its own (check_quietly)
        files = list_files(data.data_dir, ("*.h5", "*.hdf5"), "HEP event", on_bad_file="skip")
    except DataError as exc:
        return 0, [str(exc)]
    def check_file(path):
        n, layout = _check_layout(path, data.layout, data.image_size)
        for start in range(0, n, data.chunk_size):
            read_chunk(path, start, min(n, start + data.chunk_size), layout, 3)

    for path in files:
        problem = check_quietly(check_file, path)
        if problem:
            problems.append(problem)
    for split in ("train", "validation", "test"):
        skip = cfg.model_copy(update={"data": data.model_copy(update={"on_bad_file": "skip"})})
        try:
            if not split_chunks(skip, split):
                problems.append(f"{data.data_dir}: the {split} split is empty")
        except DataError as exc:
            if str(exc) not in problems:
                problems.append(str(exc))
    if not maxima_path(cfg).is_file():
        problems.append(f"{maxima_path(cfg)}: training-set maxima not found; run python -m hep_cnn.maxima")
    return len(files), problems


def prepare_data(cfg: HepConfig) -> None:
    """The engine's data step (rank 0, before the datasets are built): synthetic events when asked and absent,
    and the training-set channel maxima when missing."""
    data = cfg.data
    directory = pathlib.Path(data.data_dir)
    generated = data.synth.generate_if_missing and not dataset_present(directory)
    if generated:
        s = data.synth
        generate_dataset(directory, s.n_train, s.n_validation, s.n_test, data.image_size, s.signal_fraction,
                         s.events_per_file, s.seed, "all_events" if data.layout == "auto" else data.layout)
        log.info(f"generated synthetic events in {directory}")
    if not maxima_path(cfg).is_file():
        # Into the folder this call generated (the suite's own), else the derived folder: never a user's data folder.
        maxima = write_maxima(cfg, path=directory / data.maxima_file if generated else None)
        log.info(f"computed training-set maxima {maxima['channel_max']} into {maxima_path(cfg)}")


# -- new events (python -m hep_cnn.predict) ---------------------------------------------

# What a file of new events may lack: only its images are needed.  A column it lacks comes out of
# read_chunk_unlabelled as this value.
ABSENT = {"label": -1, "weight": np.nan, "pass_sr": -1}


def read_chunk_unlabelled(path: str, start: int, stop: int, layout: str, channels: int):
    """:func:`read_chunk_stored` for new events, whose labels, weights and passSR may be absent: one that is
    absent comes out as :data:`ABSENT`'s value; the images and what is present are checked as for training."""
    keys = LAYOUT_KEYS[layout]
    with reading(path, f"events {start}-{stop}"), h5py.File(path, "r") as f:
        labelled = all(keys[name] in f for name in ABSENT)
    if labelled:   # what evaluate reads, read the same way
        return read_chunk_stored(path, start, stop, layout, channels)
    with reading(path, f"events {start}-{stop}"), h5py.File(path, "r") as f:
        if layout == "benchmark":
            images = f["data"][start:stop, :channels]
        else:
            images = np.stack([f[k][start:stop] for k in keys["images"][:channels]], axis=1)
        present = {name for name in ABSENT if keys[name] in f}
        columns = {name: f[keys[name]][start:stop] if name in present else np.full(stop - start, value)
                   for name, value in ABSENT.items()}
    where = f"{path} events {start}-{stop}"
    if not np.all(np.isfinite(images)):
        raise DataError(f"{where}: images hold NaN or Inf")
    if "label" in present and not np.all(np.isin(columns["label"], (0, 1))):
        raise DataError(f"{where}: labels outside {{0, 1}}")
    if "weight" in present and (not np.all(np.isfinite(columns["weight"])) or np.any(columns["weight"] < 0)):
        raise DataError(f"{where}: event weights must be finite and >= 0")
    return (np.asarray(images, np.float32), np.asarray(columns["label"], np.int32).reshape(-1),
            np.asarray(columns["weight"], np.float32).reshape(-1), np.asarray(columns["pass_sr"], np.int32).reshape(-1))


def file_split(cfg: HepConfig, path: str, layout: str, events: int) -> epochs.Split:
    """Every event of one file of new events (:func:`read_chunk_unlabelled`), in file order, as the engine takes
    it: scaled by the run's training-set maxima (:func:`load_maxima` of ``cfg``, never the file's), the event
    weights as stored (as evaluate reads them)."""
    raw = cfg.model_copy(deep=True)
    raw.data.weight_normalization = "none"
    size = cfg.data.chunk_size
    chunks = [Chunk(str(path), start, min(start + size, events), layout) for start in range(0, events, size)]
    maxima = load_maxima(cfg)
    return epochs.Split(name="predict", where=str(path), count=events, items=chunks,
                        read=lambda dist, seed, training: _events(raw, chunks, maxima, dist, seed, training,
                                                                  reader=read_chunk_unlabelled))
