"""The engine's epoch rules (common/loop/epochs.py), against lists written out by hand."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

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
