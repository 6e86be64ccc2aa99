"""The epoch rules every application's data follows, in one place.

An application builds this rank's samples of an epoch from the epoch's seed alone
(:class:`common.application.Datasets`); the rules below, the same for every application, say what an epoch
is made of and how epochs follow one another:

- the global batch is the per-rank batch times the ranks (:func:`global_batch_size`);
- an epoch is ``steps x batch`` samples of this rank's share, cut *before* the shuffle
  (:func:`epoch_samples`): a shuffle buffer as large as the epoch would otherwise fill from past the epoch's
  end, reading samples it then discards and mixing them into it;
- the epochs of a run go back to back, a mid-epoch resume leaving out the steps already trained
  (:func:`epoch_stream`), in at most two ``fit`` calls (:func:`fit_phases`: Keras runs the same number of
  steps in every epoch of one call).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator


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
    return stream.prefetch(-1)  # tf.data.AUTOTUNE


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
