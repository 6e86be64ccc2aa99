"""The engine's epoch rules (common/loop/epochs.py), against lists written out by hand."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from common.distributed import Distributed
from common.loop import epochs


def values(dataset) -> list:
    return [np.asarray(x).tolist() for x in dataset.as_numpy_iterator()]


def test_an_epoch_is_cut_from_the_share_before_anything_else():
    # A share of 5 samples for an epoch of 2 steps x 4: the share once, then its first 3 again.
    share = tf.data.Dataset.range(5)
    assert values(epochs.epoch_samples(share, steps=2, batch_size=4)) == [0, 1, 2, 3, 4, 0, 1, 2]
    # A share longer than the epoch: its first steps x batch, none past them.
    assert values(epochs.epoch_samples(tf.data.Dataset.range(10), steps=1, batch_size=3)) == [0, 1, 2]
    # Cut first, a shuffle buffer larger than the epoch still gives each of the epoch's samples once.
    cut = epochs.epoch_samples(tf.data.Dataset.range(10), steps=2, batch_size=3).shuffle(100, seed=1)
    assert sorted(values(cut)) == [0, 1, 2, 3, 4, 5]


def test_the_epochs_go_back_to_back_and_a_resume_leaves_out_its_steps():
    def train_epoch(epoch):   # batches named by (epoch, step); more of them than an epoch takes
        return tf.data.Dataset.range(5).map(lambda step: tf.stack([tf.constant(epoch, tf.int64), step]))

    stream = epochs.epoch_stream(train_epoch, steps_per_epoch=3, first_epoch=1, end_epoch=3)
    assert values(stream) == [[1, 0], [1, 1], [1, 2], [2, 0], [2, 1], [2, 2]]
    resumed = epochs.epoch_stream(train_epoch, steps_per_epoch=3, first_epoch=1, end_epoch=2, skip_steps=2)
    assert values(resumed) == [[1, 2]]


@pytest.mark.parametrize("position, epochs_total, phases", [
    ((0, 0), 3, [(0, 3, 0)]),                # from scratch: one fit
    ((1, 0), 3, [(1, 3, 0)]),                # after a whole epoch
    ((1, 2), 3, [(1, 2, 2), (2, 3, 0)]),     # mid-epoch: the rest of epoch 1, then whole epochs
    ((2, 2), 3, [(2, 3, 2)]),                # mid-way through the last epoch
    ((3, 0), 3, []),                         # nothing left
    ((3, 1), 3, []),
])
def test_fit_phases(position, epochs_total, phases):
    assert list(epochs.fit_phases(position, epochs_total)) == phases


def test_the_global_batch_is_the_per_rank_batch_times_the_ranks():
    assert epochs.global_batch_size(4, 8) == 32


def rank(index: int, size: int) -> Distributed:
    """One rank of ``size`` played in this process (the share's arithmetic only; no collective is called)."""
    stand_in = Distributed()
    stand_in.rank, stand_in.size = index, size
    return stand_in


def read_share(share, samples_per_item: int = 1) -> list:
    """The samples a rank reads from its share: item ``name`` holds samples ``name:0``, ``name:1``..."""
    samples = share.items.flat_map(lambda name: tf.data.Dataset.from_tensor_slices(
        tf.strings.join([name, tf.strings.as_string(tf.range(samples_per_item))], ":")))
    return [s.decode() for s in share.samples(samples).as_numpy_iterator()]


def test_a_rank_share_is_every_size_th_item_or_sample_from_the_rank_on():
    items = (tf.constant(["a", "b", "c", "d", "e"]),)
    assert [read_share(epochs.rank_share(items, rank(r, 2), 7, shuffle=False)) for r in (0, 1)] == [
        ["a:0", "c:0", "e:0"], ["b:0", "d:0"]]
    # One item of 4 samples on 2 ranks: both read it, each keeps every other sample.
    one = (tf.constant(["a"]),)
    assert [read_share(epochs.rank_share(one, rank(r, 2), 7, shuffle=False), 4) for r in (0, 1)] == [
        ["a:0", "a:2"], ["a:1", "a:3"]]
    # A staged copy is this rank's already: every item, in its order, nothing sharded.
    assert read_share(epochs.rank_share(items, rank(1, 2), 7, shuffle=False, this_rank_only=True)) == [
        "a:0", "b:0", "c:0", "d:0", "e:0"]


@pytest.mark.parametrize("size", [2, 3])
def test_a_shuffled_share_is_one_permutation_cut_into_disjoint_shares(size):
    names = [f"f{i}" for i in range(11)]
    offsets = list(range(100, 111))
    columns = (tf.constant(names), tf.constant(offsets, tf.int64))
    shares = [[(n.decode(), int(o)) for n, o in epochs.rank_share(columns, rank(r, size), 42, shuffle=True)
               .items.as_numpy_iterator()] for r in range(size)]
    permutation = [pair for turn in range(len(shares[0])) for share in shares for pair in share[turn:turn + 1]]
    # The columns stay together, the shares interleave into the one permutation a single rank draws (the same
    # on every rank), disjoint and covering every item; another seed or another stream draws another one.
    whole = [(n.decode(), int(o)) for n, o in epochs.rank_share(columns, rank(0, 1), 42, shuffle=True)
             .items.as_numpy_iterator()]
    assert permutation == whole
    assert all(offset == 100 + int(name[1:]) for name, offset in permutation)
    assert sorted(permutation) == sorted(zip(names, offsets)) and [n for n, _ in permutation] != names
    again = [(n.decode(), int(o)) for n, o in epochs.rank_share(columns, rank(0, size), 42, shuffle=True)
             .items.as_numpy_iterator()]
    assert again == shares[0]
    for other in (dict(seed=43), dict(seed=42, stream=1)):
        seed = other.pop("seed")
        drawn = [n.decode() for n, _ in epochs.rank_share(columns, rank(0, 1), seed, shuffle=True, **other)
                 .items.as_numpy_iterator()]
        assert drawn != [n for n, _ in permutation] and sorted(drawn) == sorted(names)
