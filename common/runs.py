"""Reading a finished run directory back (for the evaluation entry points)."""

from __future__ import annotations

import pathlib

from common.config import load_config
from common.errors import UserInputError


def load_run(run_dir, schema, data_dir: str | None = None):
    """(resolved config, trained network) of a run; ``data_dir`` points it at other data."""
    import keras

    run_dir = pathlib.Path(run_dir)
    for required in ("config.yaml", "model.keras"):
        if not (run_dir / required).is_file():
            raise UserInputError(f"{run_dir / required}: not found (is {run_dir} a finished training run?)")
    cfg = load_config(schema, run_dir / "config.yaml", [f"data.data_dir={data_dir}"] if data_dir else [])
    # The network is saved uncompiled and with plain Keras layers (trainer._atomic_save_model).
    return cfg, keras.models.load_model(run_dir / "model.keras", compile=False)
