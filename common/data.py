"""Input-pipeline pieces every application uses: the datasets contract,
shared-seed file shuffling with rank sharding, and staging to local storage."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
from concurrent.futures import ThreadPoolExecutor

import tensorflow as tf

from common.distributed import Distributed
from common.errors import DataError


@dataclasses.dataclass
class Datasets:
    """What an application's ``build_datasets`` returns to the trainer.

    ``train`` repeats forever and yields (x, y) or (x, y, sample_weight)
    batches of the per-rank batch size; ``validation`` yields
    ``validation_steps`` batches per epoch.  Every rank runs the same number
    of steps (Horovod allreduces would hang otherwise).
    """

    train: tf.data.Dataset
    validation: tf.data.Dataset | None
    steps_per_epoch: int
    validation_steps: int
    train_samples: int        # global samples used for training per epoch
    validation_samples: int   # global samples used for validation


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


def shuffled_shards(files: list[str], dist: Distributed, seed: int, shuffle: bool = True) -> tf.data.Dataset:
    """File names, reshuffled every epoch with a seed shared by all ranks, then sharded by rank.

    Every rank draws the same permutation each epoch and keeps every size-th
    file from its rank on, so ranks read disjoint files.  With fewer files than
    ranks the caller must shard records instead (see :func:`shards_files`).
    """
    dataset = tf.data.Dataset.from_tensor_slices(files)
    if shuffle:
        dataset = dataset.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
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
