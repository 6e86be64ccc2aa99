"""Every command of the suite, declared once: what it reads and what it writes.  The table the contract test
(tests/test_contract.py) holds every command to, so that a new command gets the suite's promises from its
first commit: a module with a ``__main__`` that no declaration names fails that test.

    Command("cosmoflow.information", reads=(("--config", "config"), ("--fisher-matrix", "file")),
            writes=(Output("--json", "file"),))

An application declares its own commands beside the three every application has (``<app>.train``, and
``<app>.evaluate`` / ``<app>.predict`` where it declares an evaluation or a prediction: derived here, never
listed), in its :class:`~common.application.Application` (or :class:`~common.application.Tasks`) ``commands``;
the engine's tools are :data:`ENGINE` below.  (The research scripts in ``scripts/`` are not commands of the suite:
not installed, not declared; what they write goes through the same transaction.)

What a command reads (``reads``: option, what):

==========  ========================================================================================
samples     files or folders of samples, listed through the one listing (common/storage/sample_files.py)
run         a training run's folder (its config.yaml, model.keras)
config      a YAML config (the one strict loader)
file        a file of the suite's it reads back (a JSON result, a figure's earlier curves)
data        a data folder, through the application's readers
==========  ========================================================================================

How it writes (``writes``: :class:`Output`; every one through :mod:`common.storage.transaction`):

============  ======================================================================================
folder        a folder of the suite's of ``kind`` it owns (predictions, profile), claimed and committed whole
contribution  files added to a training's run folder (evaluate)
file          loose files (``--json``, ``--png``, a derived statistics file)
generated     a new folder filled whole and renamed into place (mock universes, synthetic data, a subset)
run           a training's run folder, claimed and committed as the run goes (each epoch's checkpoint)
============  ======================================================================================

Imports nothing of TensorFlow: a declaration's parser is built, and its module imported, only when asked for.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

from common import cli, registry

READS = ("samples", "run", "config", "file", "data")
SHAPES = ("folder", "contribution", "file", "generated", "run")


@dataclasses.dataclass(frozen=True)
class Output:
    """One option naming what a command writes (``option`` "" where the config names it: ``data.data_dir``,
    the derived folder), its shape (:data:`SHAPES`) and, for a folder, its kind."""

    option: str
    shape: str
    kind: str = ""

    def __post_init__(self):
        if self.shape not in SHAPES:
            raise ValueError(f"Output {self.option}: shape {self.shape!r}, expected one of {SHAPES}")


@dataclasses.dataclass(frozen=True)
class Command:
    """A module run as ``python -m <module>``: its command line (``parser``: a function returning its argparse
    parser, imported when called), what it reads and what it writes."""

    module: str
    parser: Callable | None   # None: the command line is another program's, passed through (horovodrun's)
    reads: tuple[tuple[str, str], ...] = ()
    writes: tuple[Output, ...] = ()
    summary: str = ""
    main: Callable | None = None   # argv -> exit code (default: the module's ``main``), imported when called

    def __post_init__(self):
        for option, what in self.reads:
            if what not in READS:
                raise ValueError(f"{self.module}: {option} reads {what!r}, expected one of {READS}")


def parser_of(module: str, function: str = "build_parser", *args) -> Callable:
    """The parser of ``module`` (its ``function(*args)``), built when called: the declaration imports nothing."""
    def build():
        made = getattr(importlib.import_module(module), function)(*args)
        return made[0] if isinstance(made, tuple) else made

    build.__qualname__ = f"{module}.{function}"
    return build


def entry_of(module: str, function: str = "main", *args) -> Callable:
    """``function(*args, argv)`` of ``module``, imported when called: a command's main, as run_command runs it."""
    def run(argv=None):
        return getattr(importlib.import_module(module), function)(*args, argv)

    run.__qualname__ = f"{module}.{function}"
    return run


def main_of(command: Command) -> Callable:
    """What runs ``command`` with its arguments: its declared ``main``, else its module's ``main``."""
    return command.main or entry_of(command.module)


def _train_parser(package: str):
    return cli.train_parser(registry.application(package))


def application_commands(package: str) -> tuple[Command, ...]:
    """The commands of the registered application ``package``: train, evaluate and predict as its declarations
    say, then those it declares itself."""
    declared = registry.declaration(package)
    applications = registry.applications(package)
    found = [Command(f"{package}.train", lambda: _train_parser(package), reads=(("--config", "config"),),
                     writes=(Output("--output-dir", "run", "run"),), summary="train",
                     main=entry_of("common.cli", "run_train", package))]
    if any(application.evaluation is not None for application in applications):
        found.append(Command(f"{package}.evaluate", parser_of("common.evaluate", "build_parser", package),
                             reads=(("--run-dir", "run"), ("--data-dir", "data")),
                             writes=(Output("--run-dir", "contribution", "run"),), summary="evaluate a run",
                             main=entry_of("common.evaluate", "run_evaluate", package)))
    if any(application.prediction is not None for application in applications):
        found.append(Command(f"{package}.predict", parser_of("common.predict", "build_parser", package),
                             reads=(("--run-dir", "run"), ("--input", "samples")),
                             writes=(Output("--out", "folder", "predictions"),), summary="predict on new files",
                             main=entry_of("common.predict", "run_predict", package)))
    return (*found, *declared.commands)


# The engine's tools (common/tools/).
ENGINE = (
    Command("common.tools.bench", parser_of("common.tools.bench"),
            reads=(("--config", "config"), ("--compare", "file")),
            writes=(Output("--json", "file"), Output("--profile", "folder", "profile")),
            summary="where a training step's time goes"),
    Command("common.tools.scaling", parser_of("common.tools.scaling"),
            reads=(("--config", "config"), ("--system", "file"), ("--rate-from", "file"), ("--input-rate-from", "file")),
            writes=(Output("--png", "file"),), summary="the alpha-beta scaling model"),
    Command("common.tools.sysbench", parser_of("common.tools.sysbench"), reads=(("--config", "config"),),
            writes=(Output("--out", "file"),), summary="a measured system file (a job of 2 nodes or more)"),
    Command("common.tools.check_data", parser_of("common.tools.check_data"),
            reads=(("--config", "config"),), summary="a data folder screened (reads only)"),
    Command("common.tools.slurm", parser_of("common.tools.slurm"), reads=(("--config", "config"),),
            summary="the SLURM scripts' helpers: the job's variables, staging (node-local copies)"),
    Command("common.tools.build_info", parser_of("common.tools.build_info"),
            summary="what TensorFlow and Horovod were built with (prints only)"),
    Command("common.tools.launch", None,
            summary="horovodrun without its per-launch build check (its command line is horovodrun's)",
            main=entry_of("common.tools.launch")),
)

def datatools_command(module: str, layout) -> Command:
    """The declaration of an application's data tools (``python -m <app>.data``: common/tools/datatools.py) over
    its files' ``layout`` (a :class:`common.tools.datatools.DatasetFiles`)."""
    return Command(module, parser_of("common.tools.datatools", "build_parser", f"python -m {module}"),
                   reads=(("--from", "data"), ("--manifest", "file")),
                   writes=(Output("--to", "generated"), Output("--out", "file")),
                   summary="subset, manifest, verify a dataset folder",
                   main=entry_of("common.tools.datatools", "run", layout, f"python -m {module}"))


def declared(module: str) -> Command:
    """The declaration of the command ``module`` (a KeyError naming it when none declares it)."""
    for command in every_command():
        if command.module == module:
            return command
    raise KeyError(f"{module}: no command of that name is declared (common/commands.py)")


def every_command() -> tuple[Command, ...]:
    """Every declared command: each registered application's, then the engine's."""
    found = [command for package in registry.names() for command in application_commands(package)]
    return (*found, *ENGINE)
