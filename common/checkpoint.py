"""Checkpoints: one format, written atomically, kept until a newer one is whole.

A checkpoint is one ``.npz`` file holding every model variable, every
optimizer variable (slots, iterations, loss scale) and a JSON state record
(epochs completed, optimizer step, free-form extras).  It is written to a
temporary name in the same directory, flushed to disk and renamed, so a kill
during a save never leaves a broken latest checkpoint; older ones are removed
only after the new one is in place.
"""

from __future__ import annotations

import json
import os
import pathlib
import re

import numpy as np

from common.errors import UserInputError

CHECKPOINT_PATTERN = re.compile(r"^ckpt-epoch-(\d+)\.npz$")
STATE_KEY = "__state__"


def checkpoint_path(directory: str | pathlib.Path, epoch: int) -> pathlib.Path:
    return pathlib.Path(directory) / f"ckpt-epoch-{epoch:05d}.npz"


def list_checkpoints(directory: str | pathlib.Path) -> list[pathlib.Path]:
    """Complete checkpoints in ``directory``, oldest first."""
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := CHECKPOINT_PATTERN.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(directory: str | pathlib.Path) -> pathlib.Path | None:
    found = list_checkpoints(directory)
    return found[-1] if found else None


def _variable_arrays(prefix: str, variables) -> dict[str, np.ndarray]:
    return {f"{prefix}/{i:05d}": np.asarray(v.numpy()) for i, v in enumerate(variables)}


def save_checkpoint(directory: str | pathlib.Path, epoch: int, model_variables, optimizer_variables,
                    state: dict, keep: int = 2) -> pathlib.Path:
    """Write ``ckpt-epoch-<epoch>.npz`` atomically and prune to the newest ``keep``."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    arrays = _variable_arrays("model", model_variables)
    arrays.update(_variable_arrays("optimizer", optimizer_variables))
    record = dict(state, epoch=epoch,
                  model_paths=[v.path for v in model_variables],
                  optimizer_paths=[v.path for v in optimizer_variables])
    arrays[STATE_KEY] = np.frombuffer(json.dumps(record).encode(), dtype=np.uint8)
    final = checkpoint_path(directory, epoch)
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


def restore_checkpoint(path: str | pathlib.Path, model_variables, optimizer_variables) -> dict:
    """Assign saved values to the given variables (same model and optimizer); return the state."""
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
    return state
