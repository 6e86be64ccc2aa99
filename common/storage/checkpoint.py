"""Checkpoints: one format, written atomically, never holding a NaN, kept until a newer one is whole.

A checkpoint is one ``.npz`` file holding every model variable, every
optimizer variable (slots, iterations, loss scale), each rank's random-number
state (dropout seed generators) and a JSON state record: the position
(epochs completed and steps into the next epoch), the optimizer step, what a
resume must match (global batch, steps per epoch, precision, optimizer) and
free-form extras.

Writing: the arrays are checked finite first (a non-finite weight is
:class:`~common.errors.NonFiniteLoss`, nothing written); then a temporary file
of a name unique to this writer in the same folder, flushed to disk, renamed;
older ones are removed only after the new one is in place.  A failed write
removes its temporary file; one left by a killed writer (``.ckpt-*.tmp``) is
removed by the next run that holds the run directory's lock
(:func:`remove_stale_temporaries`).  The state record carries the rows of the
epochs completed (``history``): the checkpoint is what commits an epoch's
records (:mod:`common.loop.records`).

Reading: :func:`load_checkpoint` reads every array (so a bad CRC or a
truncated file is found before anything is assigned) and names the file when
it cannot; :func:`newest_readable` falls back to the previous checkpoint, with
a warning naming the bad one.

Names: ``ckpt-epoch-00003.npz`` after 3 whole epochs, and
``ckpt-epoch-00003-step-0000012.npz`` 12 steps into the 4th (preemption).
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import re
import signal
import tempfile
import time
import zipfile

import numpy as np

from common.errors import NonFiniteLoss, UserInputError
from common.storage.outputs import honour_umask

log = logging.getLogger(__name__)

CHECKPOINT_PATTERN = re.compile(r"^ckpt-epoch-(\d+)(?:-step-(\d+))?\.npz$")
TEMPORARY_PATTERN = re.compile(r"^\.ckpt-epoch-\d+(?:-step-\d+)?\.npz\..+\.tmp$")
STATE_KEY = "__state__"
TEST_HOOK = "HPCDL_TEST_CHECKPOINT_HOOK"   # tests only: see _test_hook
# State-record keys a resume must match (written since they were introduced; older checkpoints lack them).
RESUME_KEYS = ("global_batch_size", "steps_per_epoch", "precision", "optimizer", "model")


class CorruptCheckpoint(UserInputError):
    """A checkpoint file that cannot be read back whole."""


def checkpoint_path(directory: str | pathlib.Path, epoch: int, step_in_epoch: int = 0) -> pathlib.Path:
    """The file name of the checkpoint after ``epoch`` epochs (and ``step_in_epoch`` steps into the next)."""
    name = f"ckpt-epoch-{epoch:05d}" + (f"-step-{step_in_epoch:07d}" if step_in_epoch else "") + ".npz"
    return pathlib.Path(directory) / name


def list_checkpoints(directory: str | pathlib.Path) -> list[pathlib.Path]:
    """Checkpoints in ``directory``, oldest first (by position in training)."""
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        return []
    found = [((int(m.group(1)), int(m.group(2) or 0)), p)
             for p in directory.iterdir() if (m := CHECKPOINT_PATTERN.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(directory: str | pathlib.Path) -> pathlib.Path | None:
    """The newest checkpoint in ``directory`` by epoch and step, or None; unread
    (:func:`newest_readable` reads them whole)."""
    found = list_checkpoints(directory)
    return found[-1] if found else None


def nonfinite_arrays(arrays) -> list[int]:
    """Indices of the float arrays among ``arrays`` that hold a NaN or Inf."""
    out = []
    for i, array in enumerate(arrays):
        array = np.asarray(array)
        if array.dtype.kind == "f" or array.dtype.name == "bfloat16":
            if not np.all(np.isfinite(array.astype(np.float32, copy=False))):
                out.append(i)
    return out


def save_checkpoint(directory: str | pathlib.Path, epoch: int, model_variables, optimizer_variables,
                    state: dict, keep: int = 2, step_in_epoch: int = 0,
                    rng_states: list[list[np.ndarray]] | None = None) -> pathlib.Path:
    """Write the checkpoint atomically and prune to the newest ``keep``.

    ``rng_states[r]`` holds rank r's seed-generator states.  Raises :class:`NonFiniteLoss` (nothing
    written) when a model or optimizer array holds NaN/Inf.
    """
    directory = pathlib.Path(directory)
    model_arrays = [np.asarray(v.numpy()) for v in model_variables]
    optimizer_arrays = [np.asarray(v.numpy()) for v in optimizer_variables]
    bad = [model_variables[i].path for i in nonfinite_arrays(model_arrays)] + \
          [optimizer_variables[i].path for i in nonfinite_arrays(optimizer_arrays)]
    if bad:
        raise NonFiniteLoss(f"{len(bad)} weight array(s) hold NaN or Inf at epoch {epoch + (1 if step_in_epoch else 0)}"
                            f" (first: {bad[0]}); checkpoint not written")
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {f"model/{i:05d}": a for i, a in enumerate(model_arrays)}
    arrays.update({f"optimizer/{i:05d}": a for i, a in enumerate(optimizer_arrays)})
    for rank, states in enumerate(rng_states or []):
        arrays.update({f"rng/{rank:05d}/{i:05d}": np.asarray(s) for i, s in enumerate(states)})
    record = dict(state, epoch=epoch, step_in_epoch=step_in_epoch, ranks=len(rng_states or []),
                  model_paths=[v.path for v in model_variables],
                  optimizer_paths=[v.path for v in optimizer_variables])
    arrays[STATE_KEY] = np.frombuffer(json.dumps(record).encode(), dtype=np.uint8)
    final = checkpoint_path(directory, epoch, step_in_epoch)
    descriptor, name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=directory)
    temporary = pathlib.Path(name)
    try:
        _test_hook("writing", epoch, step_in_epoch)
        with os.fdopen(descriptor, "wb") as handle:
            np.savez(handle, **arrays)
            handle.flush()
            os.fsync(handle.fileno())
        honour_umask(temporary)
        os.replace(temporary, final)
    finally:
        temporary.unlink(missing_ok=True)   # this writer's own; gone already after the rename
    _test_hook("written", epoch, step_in_epoch)
    for old in list_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return final


def _test_hook(point: str, epoch: int, step_in_epoch: int) -> None:
    """For the crash tests only (tests/test_crash_consistency.py); nothing happens unless the environment sets
    :data:`TEST_HOOK`: ``<point>:<epoch>:<action>`` stops the writer of the epoch-end checkpoint after
    ``<epoch>`` epochs at ``<point>`` (``writing``: its temporary file created, nothing in it yet;
    ``written``: renamed into place, before anything else) and either kills the process there (``kill``:
    SIGKILL, a crash at that very instant) or sleeps ``<action>`` seconds (a slow file system)."""
    hook = os.environ.get(TEST_HOOK)
    if not hook or step_in_epoch:
        return
    at, at_epoch, action = hook.split(":")
    if at != point or int(at_epoch) != epoch:
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(float(action))


def remove_stale_temporaries(directory: str | pathlib.Path) -> list[pathlib.Path]:
    """Remove the temporary files of checkpoint writers that were killed mid-save.

    Call only while holding the run directory's lock: then no writer of this run directory is alive.
    """
    directory = pathlib.Path(directory)
    removed = []
    if directory.is_dir():
        for path in directory.iterdir():
            if TEMPORARY_PATTERN.match(path.name) and path.is_file() and not path.is_symlink():
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


def load_checkpoint(path: str | pathlib.Path) -> tuple[dict, dict[str, np.ndarray]]:
    """(state record, every array) of a checkpoint, read completely: every member's CRC is checked.

    Raises :class:`CorruptCheckpoint` naming the file when it is truncated, fails a CRC or lacks its
    state record.
    """
    path = pathlib.Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
        state = json.loads(bytes(arrays.pop(STATE_KEY)).decode())
        if not isinstance(state, dict) or "epoch" not in state:
            raise ValueError("no position in its state record")
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zipfile.LargeZipFile) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CorruptCheckpoint(f"{path}: not a readable checkpoint ({reason})") from None
    return state, arrays


def read_state(path: str | pathlib.Path) -> dict | None:
    """The state record of a checkpoint alone (its other members unread), or None when it cannot be read;
    :func:`load_checkpoint` checks the whole file before a resume assigns it."""
    try:
        with np.load(path, allow_pickle=False) as data:
            state = json.loads(bytes(data[STATE_KEY]).decode())
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zipfile.LargeZipFile):
        return None
    return state if isinstance(state, dict) else None


def newest_readable(directory: str | pathlib.Path) -> tuple[pathlib.Path, dict, dict] | None:
    """(path, state, arrays) of the newest checkpoint that reads back whole; older ones are tried when the
    newest is corrupt (each skipped one named in a warning).  None when there is none; a
    :class:`CorruptCheckpoint` naming them all when none reads."""
    candidates = list_checkpoints(directory)
    bad = []
    for path in reversed(candidates):
        try:
            state, arrays = load_checkpoint(path)
        except CorruptCheckpoint as exc:
            log.warning(f"{exc}; trying the previous checkpoint")
            bad.append(path.name)
            continue
        return path, state, arrays
    if bad:
        raise CorruptCheckpoint(f"{directory}: no readable checkpoint ({', '.join(bad)} are corrupt); start afresh "
                                "with --force, or restore a checkpoint from a copy")
    return None


def check_compatible(path, state: dict, arrays: dict, model_variables, optimizer_variables,
                     expected: dict) -> None:
    """Raise :class:`UserInputError` naming ``path`` unless the checkpoint fits this run: the same number
    and shapes of model and optimizer variables, and each of :data:`RESUME_KEYS` the checkpoint records
    equal to ``expected``."""
    explain = {
        "global_batch_size": "ranks x data.batch_size; the checkpoint's position and learning-rate schedule "
                             "count steps of its global batch",
        "steps_per_epoch": "the training set or data.n_train changed; the position counts the checkpoint's steps",
        "precision": "train.precision",
        "optimizer": "optimizer.name / optimizer.larc.enabled",
        "model": "the model section",
    }
    for key in RESUME_KEYS:
        if key == "model" and isinstance(state.get(key), dict) and isinstance(expected.get(key), dict):
            # keys both know (a later version's new keys leave an older checkpoint resumable)
            changed = [k for k in sorted(set(state[key]) & set(expected[key])) if state[key][k] != expected[key][k]]
            if changed:
                # a model section key is bare (base_filters); a field marked as meaning is dotted (data.mock.h0_range)
                said = "; ".join(f"{k if '.' in k else 'model.' + k} {state[key][k]!r}, this run has "
                                 f"{expected[key][k]!r}" for k in changed[:3])
                said += f" (and {len(changed) - 3} more)" if len(changed) > 3 else ""
                raise UserInputError(f"{path}: written with {said} (the network its weights belong to); not "
                                     "resumed: restore the setting, or start afresh with --force or another "
                                     "--output-dir")
            continue
        if key in state and key in expected and state[key] != expected[key]:
            raise UserInputError(f"{path}: written with {key} {state[key]}, this run has {expected[key]} "
                                 f"({explain[key]}); not resumed: restore the setting, or start afresh with --force "
                                 "or another --output-dir")
    for prefix, variables in (("model", model_variables), ("optimizer", optimizer_variables)):
        saved = sorted(k for k in arrays if k.startswith(prefix + "/"))
        if len(saved) != len(variables):
            raise UserInputError(f"{path}: holds {len(saved)} {prefix} variables, this run has {len(variables)} "
                                 "(was it written by another model or optimizer config?); not resumed")
        for key, variable in zip(saved, variables):
            if tuple(arrays[key].shape) != tuple(variable.shape):
                raise UserInputError(f"{path}: {prefix} variable {variable.path} has shape {tuple(variable.shape)} "
                                     f"here but {arrays[key].shape} in the checkpoint (another model config?); "
                                     "not resumed")


def assign_checkpoint(state: dict, arrays: dict, model_variables, optimizer_variables) -> list:
    """Assign the loaded arrays (checked by :func:`check_compatible`) to the variables; the per-rank
    random-number states."""
    for prefix, variables in (("model", model_variables), ("optimizer", optimizer_variables)):
        for key, variable in zip(sorted(k for k in arrays if k.startswith(prefix + "/")), variables):
            variable.assign(arrays[key])
    return [[arrays[k] for k in sorted(k for k in arrays if k.startswith(f"rng/{rank:05d}/"))]
            for rank in range(state.get("ranks", 0))]
