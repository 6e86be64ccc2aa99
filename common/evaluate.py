"""The one evaluation driver: load a finished run, run its application's evaluation, write through the
guarded atomic writer, print the report.

An application's ``evaluate`` module holds the science as an :class:`~common.application.Evaluator`, part of
the application's declaration (``evaluation``): its metrics (computed by ``evaluate(writer, cfg, model,
split)``, which writes ``metrics.json``, predictions and its own figures through ``writer``), the lines that
report them, and which ``history.csv`` columns the training curves show.  Everything else (the command line,
finding the run's application in the registry, loading ``config.yaml`` and ``model.keras``, checking every
output name before any work, the run folder's lock, the training curves, ``wrote ...``) is here.

    python -m <app>.evaluate --run-dir RUN [--split S] [--data-dir D] [--force]
"""

from __future__ import annotations

import argparse
import importlib
import os
import pathlib
import sys
import zipfile

from common import registry
from common.application import Evaluator
from common.cli import exit_on_user_error
from common.config import load_config
from common.deferred import pyplot as plt   # at the first figure (Agg backend)
from common.errors import UserInputError
from common.storage import outputs


def require_run(run_dir: pathlib.Path) -> None:
    """A one-line error unless ``run_dir`` is one finished training run (its ``config.yaml`` and ``model.keras``;
    a job of several instances is refused, naming its instance folders)."""
    found = outputs.run_kind(run_dir)
    if found is not None and found[0] == "instances":
        count = outputs.recorded_instances(found[1])
        raise UserInputError(f"{run_dir}: holds a job of {count or 'several'} instances, each a run of its own: "
                             f"evaluate one with --run-dir {run_dir / 'instance-0'} (up to instance-{(count or 2) - 1})")
    outputs.refuse_if_locked(run_dir, option=None)   # a training in progress: "in use", not "model.keras not found"
    for required in ("config.yaml", "model.keras"):
        if not (run_dir / required).is_file():
            raise UserInputError(f"{run_dir / required}: not found (is {run_dir} a finished training run?)")


def application_of(package: str, run_dir):
    """The application of ``package`` that trained ``run_dir``: the package's only one, or the task the run's
    ``config.yaml`` chose (the default task's when it has none: loading the run then says so)."""
    config = pathlib.Path(run_dir) / "config.yaml"
    return registry.application(package, config if config.is_file() else None)


def load_run(run_dir, schema, data_dir: str | None = None, layers_module: str = ""):
    """(resolved config, trained network) of a run; ``data_dir`` points it at other data; ``layers_module``
    registers the network's own Keras layers (the application's, imported first)."""
    import keras   # deferred: Keras, so TensorFlow; --help and argument errors answer without it

    run_dir = pathlib.Path(run_dir)
    require_run(run_dir)
    cfg = load_config(schema, run_dir / "config.yaml", [f"data.data_dir={data_dir}"] if data_dir else [])
    # The network is saved uncompiled and with plain Keras layers (trainer._atomic_save_model).
    path = run_dir / "model.keras"
    if not os.access(path, os.R_OK):
        raise UserInputError(f"{path}: cannot be read (no read permission)")
    if layers_module:
        importlib.import_module(layers_module)
    try:
        return cfg, keras.models.load_model(path, compile=False)
    except (ValueError, OSError, KeyError, TypeError, zipfile.BadZipFile) as exc:
        # Keras says "File not found" for a file that is there but not a Keras archive (empty, cut short,
        # another format): name what it is instead.
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise UserInputError(f"{path}: not a readable Keras model, or not one of this run's network "
                             f"({type(exc).__name__}: {first})") from None


class EvaluationWriter:
    """What an evaluation writes into a run directory, guarded: every name it will write is checked before
    any work (absent, or the suite's own by its mark or the run's marker, or ``force``), each file is
    written atomically and carries the suite's mark, and the run directory's lock is held meanwhile (an
    evaluation never interleaves with a training of the same folder).  Use as a context manager."""

    def __init__(self, run_dir, tool: str, names, force: bool = False):
        self.run_dir = pathlib.Path(run_dir)
        self.tool = tool
        self.force = force
        for name in names:
            outputs.check_replaceable(self.run_dir / name, force, "pass --force to replace it")
        self._lock = None
        if outputs.read_run_marker(self.run_dir) is not None:
            self._lock = outputs.RunDirLock(self.run_dir, tool, option=None).acquire()   # the run it evaluates
        self._swept = False

    def _sweep(self) -> None:
        """Before the first write (after every check): the temporaries of killed writes of the run removed."""
        if not self._swept and self._lock is not None:
            for killed in outputs.remove_killed_writes(self.run_dir):
                print(f"{self.tool}: removed {killed}, left by a write that was killed", file=sys.stderr, flush=True)
        self._swept = True

    def __enter__(self) -> "EvaluationWriter":
        return self

    def __exit__(self, *exc) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def json(self, name: str, payload: dict) -> None:
        self._sweep()
        outputs.write_json(self.run_dir / name, payload, self.tool, self.force)

    def npz(self, name: str, **arrays) -> None:
        self._sweep()
        outputs.save_npz(self.run_dir / name, self.tool, self.force, **arrays)

    def figure(self, figure, name: str, dpi: int = 110) -> None:
        try:
            self._sweep()
            outputs.save_figure(figure, self.run_dir / name, self.tool, self.force, dpi=dpi)
        finally:
            plt.close(figure)


def evaluate_run(evaluator: Evaluator, run_dir, split: str | None = None, data_dir: str | None = None,
                 force: bool = False, options: dict | None = None) -> dict:
    """Evaluate the run in ``run_dir`` on ``split`` (default: the evaluator's first); the metrics written.
    ``options``: the values of the evaluator's own options (its ``add_options``), passed to it by name."""
    split = split or evaluator.splits[0]
    if split not in evaluator.splits:
        raise UserInputError(f"--split {split}: {evaluator.tool} evaluates one of {', '.join(evaluator.splits)}")
    cfg, model = load_run(run_dir, evaluator.schema, data_dir, evaluator.layers_module)
    with EvaluationWriter(run_dir, evaluator.tool, evaluator.all_outputs, force) as writer:
        metrics = evaluator.evaluate(writer, cfg, model, split, **(options or {}))
        history = writer.run_dir / "history.csv"
        curves = evaluator.curves(cfg) if callable(evaluator.curves) else evaluator.curves
        if curves and history.is_file():
            # deferred: matplotlib (about 0.3 s) only where a figure is drawn
            from common.storage.plots import plot_training_curves

            writer.figure(plot_training_curves(history, metrics=curves), "training_curves.png")
    return metrics


def evaluator_of(package: str, run_dir) -> Evaluator:
    """The evaluation of the application of ``package`` that trained ``run_dir``: the package's only one, or the
    task the run's ``config.yaml`` chose (the default task's when it has none: loading the run then says so)."""
    application = application_of(package, run_dir)
    if application.evaluation is None:
        raise UserInputError(f"{run_dir}: {application.name} declares no evaluation")
    return application.evaluation


def run_evaluate(package: str, argv=None, description: str = "") -> int:
    """``python -m <package>.evaluate``: the run directory's application evaluated, the report printed."""
    with exit_on_user_error():
        evaluations = [application.evaluation for application in registry.applications(package)]
    known = evaluations[0] if len(evaluations) == 1 else None   # else the run's config chooses the task
    parser = argparse.ArgumentParser(prog=f"python -m {package}.evaluate",
                                     description=description or (known.description if known else ""))
    parser.add_argument("--run-dir", required=True, help="a training run directory (holds model.keras, config.yaml)")
    parser.add_argument("--split", help="the split to evaluate (default: "
                        + (f"{known.splits[0]}; one of {', '.join(known.splits)})" if known else "the task's)"))
    parser.add_argument("--data-dir", help="evaluate on another dataset of the same layout")
    parser.add_argument("--force", action="store_true",
                        help="replace files of the names it writes that this suite did not write"
                             + (f" ({', '.join(known.all_outputs)})" if known else ""))
    common_options = {action.dest for action in parser._actions}
    if known is not None and known.add_options is not None:
        known.add_options(parser)
    args = parser.parse_args(argv)
    options = {name: value for name, value in vars(args).items() if name not in common_options}
    with exit_on_user_error():
        evaluator = known or evaluator_of(package, args.run_dir)
        metrics = evaluate_run(evaluator, args.run_dir, args.split, args.data_dir, args.force, options)
    for line in evaluator.report(metrics):
        print(line)
    print(f"wrote {pathlib.Path(args.run_dir) / 'metrics.json'}", flush=True)
    return 0
