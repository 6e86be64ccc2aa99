"""The engine owns the epoch, the application owns the samples.

An application hands the engine its data as :class:`Split` s: what a split holds (its count, where it was read
from, the files left out) and how one rank reads its samples (``read``).  This module does the rest, the same
for every application, and is the only place these rules are written:

==========================================  ===================================================================
what                                        where
==========================================  ===================================================================
samples per rank and step, global batch     :func:`global_batch_size`, :func:`steps`
this rank's items and samples               :func:`rank_share` -> :class:`RankShare`
an epoch's seed (same on every rank)        :func:`epoch_seed`
an epoch: cut before the shuffle            :func:`epoch_samples`
training and validation streams             :func:`training_datasets` -> :class:`Datasets` (validation cached)
epochs back to back, a resume's position    :func:`epoch_stream`, :func:`fit_phases`
every sample of a split, in order, batched  :func:`evaluation_walk` (evaluate, and predict on new files)
==========================================  ===================================================================

The application keeps two hooks: ``batches(samples, training, seed, batch_size)`` (its shuffle, augmentation,
batching by the per-rank ``batch_size`` it is handed, and per-batch normalisation: CosmoFlow's int16 batches
normalised whole, HEP's per-event scaling) and, where a training batch is not one split's samples, ``train_take`` with a ``batches`` that mixes in more (detection's
labeled + unlabeled batches).

The rules:

- a rank's share: the split's items (files, chunks, (file, crop) pairs) permuted with the epoch's seed, the same
  permutation on every rank; every size-th item from the rank's index on when there are at least as many items
  as ranks, else every rank reads every item and keeps every size-th sample (:func:`rank_share`);
- the global batch is the per-rank batch times the ranks (:func:`global_batch_size`);
- an epoch is ``steps x batch`` samples of this rank's share, cut *before* the shuffle
  (:func:`epoch_samples`): a shuffle buffer as large as the epoch would otherwise fill from past the epoch's
  end, reading samples it then discards and mixing them into it;
- the epochs of a run go back to back, a mid-epoch resume leaving out the steps already trained
  (:func:`epoch_stream`), in at most two ``fit`` calls (:func:`fit_phases`: Keras runs the same number of
  steps in every epoch of one call).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from common.deferred import tensorflow as tf   # imported at first use: the epoch's rules need none
from common.distributed import Distributed
from common.errors import DataError

log = logging.getLogger(__name__)
AUTOTUNE = -1   # tf.data.AUTOTUNE, without importing TensorFlow here


@dataclasses.dataclass
class Split:
    """One split of an application's samples, as the application hands it to the engine.

    ``read(dist, seed, training)`` returns a tf.data dataset of this rank's samples (``dist``'s share; the whole
    split for a one-process ``Distributed()``): in the split's own order when not ``training``, shuffled with
    ``seed`` (the same permutation on every rank) when ``training``.  A sample is whatever the application's
    ``batches`` hook and models take: (x, y), (x, y, name, ...).
    """

    name: str                                    # "train", "validation", "test"
    where: str                                   # the folder or files it comes from (what messages name)
    count: int                                   # samples selected
    read: Callable[[Distributed, int, bool], Any]
    items: Sequence = ()                         # the application's units: files, (file, crop) pairs, chunks
    skipped: list[str] = dataclasses.field(default_factory=list)   # files left out (data.on_bad_file: skip)
    # After TensorFlow's reader failed without naming a file: re-read this split's files to find it.
    find_bad_file: Callable[[], Exception | None] | None = None


@dataclasses.dataclass(frozen=True)
class RankShare:
    """One rank's share of a split (:func:`rank_share`): :attr:`items`, the items this rank reads (a tf.data
    dataset of tuples, one value of each column), and :meth:`samples`, this rank's samples of what it reads."""

    items: Any
    items_sharded: bool   # False: every rank reads every item; the samples are sharded instead
    ranks: int
    rank: int

    def samples(self, samples):
        """This rank's samples of ``samples``, the stream read from :attr:`items`: all of them when the items
        were this rank's, else every ``ranks``-th from the rank's index on."""
        return samples if self.items_sharded else samples.shard(self.ranks, self.rank)


def rank_share(columns: Sequence, dist: Distributed, seed, *, shuffle: bool, stream=0,
               this_rank_only: bool = False) -> RankShare:
    """This rank's share of a split's items, each item one value of each of ``columns`` (equally long tensors:
    paths, offsets, crop numbers...).

    With ``shuffle`` the items are permuted with the seed ``[seed, stream]``: the same permutation on every rank,
    so that the shares are disjoint (``stream`` keeps apart the permutations a run draws from one seed: CosmoFlow's
    HDF5 crops use 1).  Items are sharded, every size-th from the rank's index on, when there are at least as
    many items as ranks; with fewer, every rank reads every item and :meth:`RankShare.samples` shards the samples.
    ``this_rank_only``: the items are already this rank's (a staged copy): permuted, never sharded (the rank's own
    ``stream`` then draws a permutation of its own where the application wants one).
    """
    columns = tuple(columns)
    if shuffle:
        order = tf.random.experimental.stateless_shuffle(tf.range(tf.shape(columns[0])[0]), seed=[seed, stream])
        columns = tuple(tf.gather(column, order) for column in columns)
    items = tf.data.Dataset.from_tensor_slices(columns)
    if this_rank_only:
        return RankShare(items, True, dist.size, dist.rank)
    items_sharded = int(columns[0].shape[0]) >= dist.size
    if items_sharded:
        items = items.shard(dist.size, dist.rank)
    return RankShare(items, items_sharded, dist.size, dist.rank)


def epoch_seed(base_seed: int, epoch: int, salt: int = 0) -> int:
    """The seed of one epoch's shuffles (the same on every rank), within int64."""
    return (base_seed * 1_000_003 + epoch * 7919 + salt) % (1 << 62)


def steps_for(samples: int, size: int, batch_size: int, key: str, where: str) -> int:
    """Full batches each rank can take from its share of ``samples``."""
    steps = samples // size // batch_size
    if steps < 1:
        raise DataError(f"{where}: {samples} samples cannot fill one batch of {batch_size} on each of "
                        f"{size} ranks (lower {key} or add data)")
    return steps


def steps(split: Split, ranks: int, batch_size: int, key: str = "data.batch_size") -> int:
    """Full batches of ``batch_size`` each of ``ranks`` ranks can take from its share of ``split``."""
    return steps_for(split.count, ranks, batch_size, key, split.where)


def global_batch_size(batch_size: int, ranks: int) -> int:
    """Samples per step, all ranks together: ``data.batch_size`` is per rank."""
    return batch_size * ranks


def epoch_samples(samples, steps: int, batch_size: int):
    """This rank's samples of one training epoch: the first ``steps x batch_size`` of ``samples`` (a tf.data
    dataset of this rank's share in the epoch's order), repeated where the share is short of that (a rank
    with a file fewer than another), to be shuffled and batched by the application after the cut."""
    return samples.repeat().take(steps * batch_size)


def epoch_stream(train_epoch: Callable[[int], object], steps_per_epoch: int, first_epoch: int, end_epoch: int,
                 skip_steps: int = 0):
    """Epochs ``first_epoch .. end_epoch - 1`` back to back, ``steps_per_epoch`` batches of
    ``train_epoch(epoch)`` each, the first ``skip_steps`` batches left out (a mid-epoch resume)."""
    epochs = [train_epoch(e).take(steps_per_epoch) for e in range(first_epoch, end_epoch)]
    stream = epochs[0]
    for epoch in epochs[1:]:
        stream = stream.concatenate(epoch)
    if skip_steps:
        stream = stream.skip(skip_steps)
    return stream.prefetch(AUTOTUNE)


def fit_phases(position: tuple[int, int], epochs: int) -> Iterator[tuple[int, int, int]]:
    """(start epoch, end epoch, steps to skip) of each ``fit`` call from ``position`` (epochs completed, steps
    into the next) to ``epochs``: resuming mid-epoch takes two, the rest of the interrupted epoch (fewer
    steps), then whole epochs."""
    epoch, step = position
    if step and epoch < epochs:
        yield epoch, epoch + 1, step
        epoch += 1
    if epoch < epochs:
        yield epoch, epochs, 0


@dataclasses.dataclass
class Datasets:
    """What an application's ``build_datasets`` returns to the trainer (tf.data pipelines of this rank);
    :func:`training_datasets` builds it from two :class:`Split` s.

    ``train_epoch(epoch)`` builds this rank's batches of one epoch, (x, y) or
    (x, y, sample_weight), from ``epoch`` (an int) alone: its file order and
    shuffles are seeded by (train.seed, epoch), so epoch e is the same whether
    the run started at 0 or resumed at e.  It must hold at least
    ``steps_per_epoch`` batches.  ``validation_batches`` is this rank's
    validation stream, at least ``validation_steps`` batches long (it may
    repeat); :attr:`validation` is its first ``validation_steps`` batches,
    repeated, so every epoch validates on the same batches (``cache_validation``
    keeps them in memory).  Every rank runs the same number of steps (Horovod
    allreduces would hang otherwise).
    """

    train_epoch: Callable[[int], Any]
    validation_batches: Any | None
    steps_per_epoch: int
    validation_steps: int
    global_batch_size: int    # samples per step, all ranks together
    cache_validation: bool = False
    skipped_files: list[str] = dataclasses.field(default_factory=list)  # data.on_bad_file: skip
    # After TensorFlow's reader failed without naming a file (a corrupt record, a broken GZIP stream):
    # re-read this rank's files to find it (the cost only on failure).  None: the reader names its files.
    find_bad_file: Callable[[], Exception | None] | None = None
    validation: Any | None = dataclasses.field(init=False, default=None)

    def __post_init__(self):
        if self.validation_batches is not None:
            batches = self.validation_batches.take(self.validation_steps)
            self.validation = (batches.cache() if self.cache_validation else batches).repeat()

    @property
    def train_samples(self) -> int:
        """Global samples used for training per epoch."""
        return self.steps_per_epoch * self.global_batch_size

    @property
    def validation_samples(self) -> int:
        """Global samples used for validation."""
        return self.validation_steps * self.global_batch_size

    def diagnose(self, exc: Exception) -> Exception | None:
        """The bad file behind a TensorFlow read error ``exc``, when it looks like one and can be found."""
        if self.find_bad_file is None:
            return None
        text = str(exc).lower()
        if type(exc).__name__ != "DataLossError" and not any(
                word in text for word in ("record", "inflate", "zlib", "gzip", "compress")):
            return None
        log.warning(f"a read failed ({type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}); "
                    "re-reading this rank's files to name the bad one")
        return self.find_bad_file()

    def train_stream(self, first_epoch: int, end_epoch: int, skip_steps: int = 0):
        """Epochs ``first_epoch .. end_epoch - 1`` back to back, ``steps_per_epoch`` batches each, the first
        ``skip_steps`` batches left out (mid-epoch resume): :func:`epoch_stream`."""
        return epoch_stream(self.train_epoch, self.steps_per_epoch, first_epoch, end_epoch, skip_steps)


def training_datasets(train: Split, validation: Split, dist: Distributed, seed: int, batch_size: int,
                      batches: Callable[[Any, bool, int, int], Any], *, train_take: int | None = None,
                      cache_validation: bool = False, key: str = "data.batch_size",
                      train_key: str | None = None) -> Datasets:
    """This rank's training epochs and validation batches of two splits.

    Epoch ``e`` is ``batches(epoch_samples(train.read(dist, s, True)), True, s, batch_size)`` with ``s`` the epoch's seed
    (:func:`epoch_seed`); validation is ``batches`` of the validation split in its order, repeated (a rank
    whose share is short of the steps wraps around).  ``batch_size`` is the per-rank batch; ``train_take`` the
    training split's samples in it when the ``batches`` hook adds others (detection's unlabeled samples), its
    steps then checked under ``train_key``.
    """
    take = train_take or batch_size
    train_steps = steps(train, dist.size, take, train_key or key)
    validation_steps = steps(validation, dist.size, batch_size, key)

    def train_epoch(epoch: int):
        seed_e = epoch_seed(seed, epoch)
        return batches(epoch_samples(train.read(dist, seed_e, True), train_steps, take), True, seed_e, batch_size)

    finders = [f for f in (train.find_bad_file, validation.find_bad_file) if f is not None]

    def find_bad_file():
        for finder in finders:
            found = finder()
            if found is not None:
                return found
        return None

    return Datasets(train_epoch=train_epoch,
                    validation_batches=batches(validation.read(dist, seed, False).repeat(), False, seed, batch_size),
                    steps_per_epoch=train_steps, validation_steps=validation_steps,
                    global_batch_size=global_batch_size(batch_size, dist.size), cache_validation=cache_validation,
                    skipped_files=train.skipped + validation.skipped,
                    find_bad_file=find_bad_file if finders else None)


def evaluation_walk(split: Split, batch_size: int, finish: Callable | None = None, seed: int = 0,
                    dist: Distributed | None = None):
    """Every sample of ``split`` once, in its order, in batches of ``batch_size`` (the last one may be short),
    ``finish`` mapped over each batch: what ``evaluate`` scores and ``predict`` writes.  With ``dist``, this
    rank's share only (``read`` decides the share)."""
    batched = split.read(dist or Distributed(), seed, False).batch(batch_size)
    if finish is not None:
        batched = batched.map(finish, num_parallel_calls=AUTOTUNE)
    return batched.prefetch(AUTOTUNE)
