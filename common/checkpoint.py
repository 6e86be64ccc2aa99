"""Checkpoints: one format, written atomically, kept until a newer one is whole.

A checkpoint is one ``.npz`` file holding every model variable, every
optimizer variable (slots, iterations, loss scale), each rank's random-number
state (dropout seed generators) and a JSON state record: the position
(epochs completed and steps into the next epoch), the optimizer step, and
free-form extras.  It is written to a temporary name in the same directory,
flushed to disk and renamed, so a kill during a save never leaves a broken
latest checkpoint; older ones are removed only after the new one is in place.

Names: ``ckpt-epoch-00003.npz`` after 3 whole epochs, and
``ckpt-epoch-00003-step-0000012.npz`` 12 steps into the 4th (preemption).
"""

from __future__ import annotations

import json
import os
import pathlib
import re

import numpy as np

from common.errors import UserInputError

CHECKPOINT_PATTERN = re.compile(r"^ckpt-epoch-(\d+)(?:-step-(\d+))?\.npz$")
STATE_KEY = "__state__"


def checkpoint_path(directory: str | pathlib.Path, epoch: int, step_in_epoch: int = 0) -> pathlib.Path:
    name = f"ckpt-epoch-{epoch:05d}" + (f"-step-{step_in_epoch:07d}" if step_in_epoch else "") + ".npz"
    return pathlib.Path(directory) / name


def list_checkpoints(directory: str | pathlib.Path) -> list[pathlib.Path]:
    """Complete checkpoints in ``directory``, oldest first (by position in training)."""
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        return []
    found = [((int(m.group(1)), int(m.group(2) or 0)), p)
             for p in directory.iterdir() if (m := CHECKPOINT_PATTERN.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(directory: str | pathlib.Path) -> pathlib.Path | None:
    found = list_checkpoints(directory)
    return found[-1] if found else None


def save_checkpoint(directory: str | pathlib.Path, epoch: int, model_variables, optimizer_variables,
                    state: dict, keep: int = 2, step_in_epoch: int = 0,
                    rng_states: list[list[np.ndarray]] | None = None) -> pathlib.Path:
    """Write the checkpoint atomically and prune to the newest ``keep``.

    ``rng_states[r]`` holds rank r's seed-generator states.
    """
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {f"model/{i:05d}": np.asarray(v.numpy()) for i, v in enumerate(model_variables)}
    arrays.update({f"optimizer/{i:05d}": np.asarray(v.numpy()) for i, v in enumerate(optimizer_variables)})
    for rank, states in enumerate(rng_states or []):
        arrays.update({f"rng/{rank:05d}/{i:05d}": np.asarray(s) for i, s in enumerate(states)})
    record = dict(state, epoch=epoch, step_in_epoch=step_in_epoch, ranks=len(rng_states or []),
                  model_paths=[v.path for v in model_variables],
                  optimizer_paths=[v.path for v in optimizer_variables])
    arrays[STATE_KEY] = np.frombuffer(json.dumps(record).encode(), dtype=np.uint8)
    final = checkpoint_path(directory, epoch, step_in_epoch)
    temporary = final.with_name(final.name + ".tmp")
    with open(temporary, "wb") as handle:
        np.savez(handle, **arrays)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, final)
    for old in list_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return final


def read_state(path: str | pathlib.Path) -> dict:
    with np.load(path) as data:
        return json.loads(bytes(data[STATE_KEY]).decode())


def restore_checkpoint(path: str | pathlib.Path, model_variables, optimizer_variables) -> tuple[dict, list]:
    """Assign saved values to the given variables (same model and optimizer).

    Returns the state record and the per-rank random-number states.
    """
    path = pathlib.Path(path)
    try:
        data = np.load(path)
    except (OSError, ValueError) as exc:
        raise UserInputError(f"{path}: not a readable checkpoint ({exc})") from None
    with data:
        state = json.loads(bytes(data[STATE_KEY]).decode())
        for prefix, variables in (("model", model_variables), ("optimizer", optimizer_variables)):
            saved = sorted(k for k in data.files if k.startswith(prefix + "/"))
            if len(saved) != len(variables):
                raise UserInputError(f"{path}: holds {len(saved)} {prefix} variables, this run has {len(variables)} "
                                     "(was it written by another model or optimizer config?)")
            for key, variable in zip(saved, variables):
                value = data[key]
                if tuple(value.shape) != tuple(variable.shape):
                    raise UserInputError(f"{path}: {prefix} variable {variable.path} has shape "
                                         f"{tuple(variable.shape)} here but {value.shape} in the checkpoint")
                variable.assign(value)
        rng = [[data[k] for k in sorted(k for k in data.files if k.startswith(f"rng/{rank:05d}/"))]
               for rank in range(state.get("ranks", 0))]
    return state, rng
