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


class EvaluationWriter:
    """What an evaluation writes into a run directory, guarded: every name it will write is checked before
    any work (absent, or the suite's own by its mark or the run's marker, or ``force``), each file is
    written atomically and carries the suite's mark, and the run directory's lock is held meanwhile (an
    evaluation never interleaves with a training of the same folder).  Use as a context manager."""

    def __init__(self, run_dir, tool: str, names, force: bool = False):
        from common import outputs

        self.run_dir = pathlib.Path(run_dir)
        self.tool = tool
        self.force = force
        for name in names:
            outputs.check_replaceable(self.run_dir / name, force, "pass --force to replace it")
        self._lock = None
        if outputs.read_run_marker(self.run_dir) is not None:
            self._lock = outputs.RunDirLock(self.run_dir, tool).acquire()

    def __enter__(self) -> "EvaluationWriter":
        return self

    def __exit__(self, *exc) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def json(self, name: str, payload: dict) -> None:
        from common.outputs import write_json

        write_json(self.run_dir / name, payload, self.tool, self.force)

    def npz(self, name: str, **arrays) -> None:
        from common.outputs import save_npz

        save_npz(self.run_dir / name, self.tool, self.force, **arrays)

    def figure(self, figure, name: str, dpi: int = 110) -> None:
        import matplotlib.pyplot as plt

        from common.outputs import save_figure

        try:
            save_figure(figure, self.run_dir / name, self.tool, self.force, dpi=dpi)
        finally:
            plt.close(figure)


def evaluate_run(run_dir, schema, tool: str, names, evaluate, data_dir: str | None = None, force: bool = False,
                 **kwargs) -> dict:
    """Load a run, then ``evaluate(writer, cfg, model, **kwargs)`` with an :class:`EvaluationWriter` of
    its folder (``names``: every file the evaluation may write, checked before any work)."""
    cfg, model = load_run(run_dir, schema, data_dir)
    with EvaluationWriter(run_dir, tool, names, force) as writer:
        return evaluate(writer, cfg, model, **kwargs)
