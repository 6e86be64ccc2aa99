"""Input-pipeline pieces every application uses: the datasets contract,
shared-seed file shuffling with rank sharding, and staging to local storage."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import tensorflow as tf

from common.distributed import Distributed
from common.errors import DataError


# Far more epochs than any run; the training stream is built lazily, epoch by epoch.
MAX_EPOCHS = 1 << 30


@dataclasses.dataclass
class Datasets:
    """What an application's ``build_datasets`` returns to the trainer.

    ``train_epoch(epoch)`` builds this rank's batches of one epoch, (x, y) or
    (x, y, sample_weight), from ``epoch`` (an int64 tensor) alone: its file
    order and shuffles are seeded by (train.seed, epoch), so epoch e is the
    same whether the run started at 0 or resumed at e.  It must hold at least
    ``steps_per_epoch`` batches.  ``validation`` yields the same
    ``validation_steps`` batches every epoch.  Every rank runs the same number
    of steps (Horovod allreduces would hang otherwise).
    """

    train_epoch: Callable[[tf.Tensor], tf.data.Dataset]
    validation: tf.data.Dataset | None
    steps_per_epoch: int
    validation_steps: int
    train_samples: int        # global samples used for training per epoch
    validation_samples: int   # global samples used for validation

    def train_stream(self, first_epoch: int = 0, skip_steps: int = 0) -> tf.data.Dataset:
        """Epochs ``first_epoch, first_epoch + 1, ...`` back to back, ``steps_per_epoch``
        batches each, the first ``skip_steps`` batches left out (mid-epoch resume)."""
        steps = self.steps_per_epoch
        stream = tf.data.Dataset.range(first_epoch, MAX_EPOCHS).flat_map(
            lambda epoch: self.train_epoch(epoch).take(steps))
        if skip_steps:
            stream = stream.skip(skip_steps)
        return stream.prefetch(tf.data.AUTOTUNE)

    @property
    def train(self) -> tf.data.Dataset:
        return self.train_stream()


def epoch_seed(base_seed: int, epoch, salt: int = 0):
    """A scalar int64 seed for one epoch's shuffles (same on every rank)."""
    return tf.cast(base_seed, tf.int64) * 1_000_003 + tf.cast(epoch, tf.int64) * 7919 + salt


def list_files(directory: str | pathlib.Path, patterns: tuple[str, ...], what: str) -> list[str]:
    """Sorted files in ``directory`` matching any glob pattern; a clear error if none."""
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        raise DataError(f"{directory}: {what} directory not found")
    files = sorted({str(p) for pattern in patterns for p in directory.glob(pattern) if p.is_file()})
    if not files:
        raise DataError(f"{directory}: no {what} files matching {' or '.join(patterns)}")
    return files


def select_count(available: int, requested: int | None, key: str, where: str) -> int:
    """Samples to use: all present by default; asking for more than exists is an error."""
    if requested is None:
        return available
    if requested > available:
        raise DataError(f"{key}={requested} but only {available} samples are present in {where}")
    return requested


def steps_for(samples: int, size: int, batch_size: int, key: str, where: str) -> int:
    """Full batches each rank can take from its share of ``samples``."""
    steps = samples // size // batch_size
    if steps < 1:
        raise DataError(f"{where}: {samples} samples cannot fill one batch of {batch_size} on each of "
                        f"{size} ranks (lower {key} or add data)")
    return steps


def shuffled_shards(files: list[str], dist: Distributed, seed, shuffle: bool = True) -> tf.data.Dataset:
    """File names permuted with ``seed`` (shared by all ranks), then sharded by rank.

    Every rank draws the same permutation and keeps every size-th file from
    its rank on, so ranks read disjoint files.  With fewer files than ranks
    the caller must shard records instead (see :func:`shards_files`).
    """
    names = tf.constant(files)
    if shuffle:
        names = tf.random.experimental.stateless_shuffle(names, seed=tf.stack([tf.cast(seed, tf.int64), 0]))
    dataset = tf.data.Dataset.from_tensor_slices(names)
    if shards_files(len(files), dist):
        dataset = dataset.shard(dist.size, dist.rank)
    return dataset


def shards_files(num_files: int, dist: Distributed) -> bool:
    """Shard at the file level when every rank gets at least one file."""
    return num_files >= dist.size


def stage_files(files: list[str], stage_dir: str, dist: Distributed) -> list[str]:
    """Copy this rank's share of ``files`` to ``stage_dir/rank-<r>`` (parallel copies).

    Staged files keep a fixed rank assignment (rank r takes files r, r+size,
    ...); files already staged with the same size are not copied again.
    """
    mine = files[dist.rank::dist.size]
    target = pathlib.Path(stage_dir) / f"rank-{dist.rank}"
    target.mkdir(parents=True, exist_ok=True)

    def copy(source: str) -> str:
        destination = target / pathlib.Path(source).name
        if not destination.exists() or destination.stat().st_size != os.path.getsize(source):
            temporary = destination.with_name(destination.name + ".staging")
            shutil.copyfile(source, temporary)
            temporary.replace(destination)
        return str(destination)

    with ThreadPoolExecutor(max_workers=min(16, max(1, len(mine)))) as pool:
        return list(pool.map(copy, mine))
