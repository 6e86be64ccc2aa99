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
import zipfile

from common import registry
from common.application import Evaluator
from common.cli import exit_process, run_command
from common.config import load_config
from common.errors import UserInputError
from common.storage import run_dirs
from common.storage.outputs import sha256_of
from common.storage.transaction import OutputTransaction, Producer


def require_run(run_dir: pathlib.Path) -> None:
    """A one-line error unless ``run_dir`` is one finished training run (its ``config.yaml`` and ``model.keras``;
    a job of several instances is refused, naming its instance folders)."""
    found = run_dirs.run_kind(run_dir)
    if found is not None and found[0] == "instances":
        count = run_dirs.recorded_instances(found[1])
        raise UserInputError(f"{run_dir}: holds a job of {count or 'several'} instances, each a run of its own: "
                             f"evaluate one with --run-dir {run_dir / 'instance-0'} (up to instance-{(count or 2) - 1})")
    run_dirs.refuse_if_locked(run_dir, option=None)   # a training in progress: "in use", not "model.keras not found"
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
    """What an evaluation writes into the run folder it evaluates: its outputs staged in the command's output
    transaction (its contribution to the run's folder, committed together at the end, the folder locked
    meanwhile), each carrying the suite's mark, its numbers checked."""

    def __init__(self, transaction: OutputTransaction, run_dir: pathlib.Path, evaluated: dict):
        self.transaction = transaction
        self.run_dir = run_dir.absolute()
        self.evaluated = evaluated   # what was evaluated (split, data folder, model): recorded in every JSON

    def json(self, name: str, payload: dict) -> None:
        self.transaction.json(self.run_dir / name, {**payload, "evaluated": self.evaluated})

    def npz(self, name: str, **arrays) -> None:
        self.transaction.npz(self.run_dir / name, **arrays)

    def figure(self, figure, name: str, dpi: int = 110) -> None:
        self.transaction.figure(figure, self.run_dir / name, dpi=dpi)


def evaluate_run(evaluator: Evaluator, run_dir, split: str | None = None, data_dir: str | None = None,
                 force: bool = False, options: dict | None = None) -> dict:
    """Evaluate the run in ``run_dir`` on ``split`` (default: the evaluator's first); the metrics written.
    ``options``: the values of the evaluator's own options (its ``add_options``), passed to it by name.

    The run folder and every output name are checked before the network loads (its lock free, each name absent,
    this command's, or ``--force``); the outputs are one transaction, committed at the end: a failure or a
    signal leaves the folder as it was.  ``metrics.json`` records the split and the data folder evaluated (a
    figure of the run's own points, ``cosmoflow.learning_curve``, tells another folder's evaluation by it)."""
    split = split or evaluator.splits[0]
    if split not in evaluator.splits:
        raise UserInputError(f"--split {split}: {evaluator.tool} evaluates one of {', '.join(evaluator.splits)}")
    run_dir = pathlib.Path(run_dir)
    require_run(run_dir)
    cfg = load_config(evaluator.schema, run_dir / "config.yaml", [f"data.data_dir={data_dir}"] if data_dir else [])
    evaluated = str(pathlib.Path(cfg.data.data_dir).resolve())
    producer = Producer(command=evaluator.tool, application=evaluator.tool.split(".")[0], run=str(run_dir.resolve()),
                        model_sha256=sha256_of(run_dir / "model.keras"), data=evaluated)
    transaction = OutputTransaction(producer, force, inputs=[run_dir / "model.keras", run_dir / "config.yaml",
                                                             run_dir / "history.csv"])
    if run_dirs.run_kind(run_dir) is not None:   # a run of the suite's: its files a contribution to the folder
        transaction.into(run_dir, "run", "--run-dir", contribution=True)
    # (else a run folder the suite did not mark, a model and config copied in: each output a loose file there)
    transaction.check([run_dir.absolute() / name for name in evaluator.all_outputs])   # before the network loads
    cfg, model = load_run(run_dir, evaluator.schema, data_dir, evaluator.layers_module)
    with transaction:
        writer = EvaluationWriter(transaction, run_dir, {"split": split, "data_dir": evaluated,
                                                         "model_sha256": producer.model_sha256})
        with transaction.reading(f"the {split} split of {evaluated}"):
            metrics = evaluator.evaluate(writer, cfg, model, split, **(options or {}))
        history = run_dir / "history.csv"
        curves = evaluator.curves(cfg) if callable(evaluator.curves) else evaluator.curves
        if curves and history.is_file():
            # deferred: matplotlib (about 0.3 s) only where a figure is drawn
            from common.storage.plots import plot_training_curves

            with transaction.reading(history):
                writer.figure(plot_training_curves(history, metrics=curves), "training_curves.png")
    return metrics


def evaluator_of(package: str, run_dir) -> Evaluator:
    """The evaluation of the application of ``package`` that trained ``run_dir``: the package's only one, or the
    task the run's ``config.yaml`` chose (the default task's when it has none: loading the run then says so)."""
    application = application_of(package, run_dir)
    if application.evaluation is None:
        raise UserInputError(f"{run_dir}: {application.name} declares no evaluation")
    return application.evaluation


def build_parser(package: str, description: str = "") -> tuple[argparse.ArgumentParser, set[str]]:
    """``python -m <package>.evaluate``'s command line, and the names of its common options (the others are the
    evaluator's own, given to it by name)."""
    evaluations = [application.evaluation for application in registry.applications(package)]
    known = evaluations[0] if len(evaluations) == 1 else None   # else the run's config chooses the task
    parser = argparse.ArgumentParser(prog=f"python -m {package}.evaluate",
                                     description=description or (known.description if known else ""))
    common_options = {parser.add_argument("--run-dir", required=True,
                                          help="a training run directory (holds model.keras, config.yaml)").dest,
                      parser.add_argument("--split", help="the split to evaluate (default: " + (
                          f"{known.splits[0]}; one of {', '.join(known.splits)})" if known else "the task's)")).dest,
                      parser.add_argument("--data-dir", help="evaluate on another dataset of the same layout").dest,
                      parser.add_argument("--force", action="store_true",
                                          help="replace files of the names it writes that this suite did not write"
                                               + (f" ({', '.join(known.all_outputs)})" if known else "")).dest,
                      "help"}
    if known is not None and known.add_options is not None:
        known.add_options(parser)
    return parser, common_options


def run_evaluate(package: str, argv=None, description: str = "") -> int:
    """``python -m <package>.evaluate``: the run directory's application evaluated, the report printed."""
    parser, common_options = build_parser(package, description)
    args = parser.parse_args(argv)
    options = {name: value for name, value in vars(args).items() if name not in common_options}
    evaluator = evaluator_of(package, args.run_dir)
    metrics = evaluate_run(evaluator, args.run_dir, args.split, args.data_dir, args.force, options)
    for line in evaluator.report(metrics):
        print(line)
    print(f"wrote {pathlib.Path(args.run_dir) / 'metrics.json'}", flush=True)
    return 0


def main(package: str, description: str = ""):
    """The ``__main__`` of ``<package>.evaluate``: :func:`run_evaluate` through the one way in."""
    exit_process(run_command(lambda argv: run_evaluate(package, argv, description), name=f"{package}.evaluate"))
