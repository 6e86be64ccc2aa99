"""The contract between an application and the engine, in one file that imports no TensorFlow.

An application (``<app>/application.py``) declares itself once, as an :class:`Application`, and registers that
declaration once, in ``pyproject.toml`` (:mod:`common.registry`).  The declaration holds everything the engine
needs, in two halves:

===========================  ==========================================================================
what                         where in the declaration
===========================  ==========================================================================
name, config schema,         plain fields, read by ``--help``, the config checks and the SLURM tools,
default config, MLPerf spec  which answer before TensorFlow (seconds) is imported
evaluation                   :class:`Evaluator` (its metrics, report lines, outputs, splits; TensorFlow
                             and matplotlib load inside its functions)
published reference numbers  :class:`PublishedRate` (what ``common.tools.bench`` compares against)
model, datasets, loss,       :class:`Parts`, returned by the declaration's ``parts`` function, which
metrics, data hooks          imports the TensorFlow half at the first read of any of them
===========================  ==========================================================================

``build_datasets`` returns a :class:`common.loop.epochs.Datasets`, built from :class:`common.loop.epochs.Split`
(the epoch module defines both; they are imported here too, as the contract's types).  A package holding several
applications chosen by a config key (climate_seg: segmentation and detection) registers :class:`Tasks`, the one
place that choice is made.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
from typing import Any, Callable

from common.errors import ConfigError
from common.loop.epochs import Datasets, Split   # noqa: F401  (part of the contract: apps build them)


@dataclasses.dataclass(frozen=True)
class MlperfSpec:
    """How an application appears in an MLPerf HPC log."""

    benchmark: str                    # submission_benchmark value
    metric_key: str                   # e.g. "eval_error"
    logs_key: str                     # where the metric is in Keras logs, e.g. "val_mae"
    target: float                     # the quality target
    higher_is_better: bool = False
    # (cfg, the built WarmupDecay schedule) -> extra {key: value} events (override the common ones)
    hyperparameters: Callable[[Any, Any], dict] | None = None


@dataclasses.dataclass(frozen=True)
class PublishedRate:
    """A published per-accelerator training rate the input pipeline must feed: ``common.tools.bench`` projects
    the cores of input pipeline one accelerator needs (rate / per-core rate).  It holds for the sample shape it
    was measured at only: a per-core rate at 16^3 says nothing of 128^3 volumes (512x the voxels)."""

    samples_per_second: float         # per accelerator
    accelerator: str                  # e.g. "H100"
    sample_shape: tuple[int, ...]     # the shape of one sample it was measured at
    source: str                       # where the number is published

    def as_dict(self) -> dict:
        """The fields as JSON writes them (the shape a list)."""
        return {**dataclasses.asdict(self), "sample_shape": list(self.sample_shape)}


@dataclasses.dataclass(frozen=True)
class Evaluator:
    """What one application's evaluation is (``python -m <app>.evaluate``; the driver is :mod:`common.evaluate`)."""

    tool: str                                   # "<app>.evaluate": the mark its files carry
    schema: type                                # the application's config schema
    evaluate: Callable[..., dict]               # (writer, cfg, model, split) -> metrics
    report: Callable[[dict], list[str]]         # metrics -> the lines printed
    outputs: tuple[str, ...]                    # every file it may write (checked before any work)
    splits: tuple[str, ...]                     # the first is the default
    curves: tuple[str, ...] | Callable[..., tuple] = ()   # history.csv metrics in training_curves.png (or cfg -> them)
    description: str = ""
    add_options: Callable[[Any], None] | None = None   # argparse parser -> its own options, given to evaluate by name
    layers_module: str = ""                     # registers the network's own Keras layers: imported before it loads

    @property
    def all_outputs(self) -> tuple[str, ...]:
        """Every file the evaluation writes into the run directory, the training-curve figure included when it has
        one."""
        return self.outputs + (("training_curves.png",) if self.curves else ())


@dataclasses.dataclass(frozen=True)
class Predictor:
    """What one application's prediction on new files is (``python -m <app>.predict``; the driver is
    :mod:`common.predict`, which owns the inputs, the ranks, the output folder and the index)."""

    tool: str                                   # "<app>.predict": the mark its files carry
    schema: type                                # the application's config schema
    what: str                                   # what its inputs are, for messages ("CosmoFlow volume")
    patterns: tuple[str, ...]                   # the files taken from a folder given as --input
    inspect: Callable[[Any, Any], Any]          # (cfg, path) -> what predict needs of it; a DataError naming it
    outputs: Callable[[Any, Any], tuple]        # (cfg, common.predict.Input) -> the names written for it
    predict: Callable[..., dict]                # (writer, cfg, model, Input, options) -> its row of the index
    report: Callable[[dict], list[str]]         # the index -> the lines printed
    add_options: Callable[[Any], None] | None = None   # argparse parser -> its own options
    # (cfg, model, options): what every input shares, before the output folder is claimed (a refusal there
    # leaves it as it was)
    prepare: Callable[[Any, Any, Any], None] | None = None
    description: str = ""
    layers_module: str = ""                     # registers the network's own Keras layers: imported before it loads

    @property
    def application(self) -> str:
        """The package whose run it applies (the first part of ``tool``)."""
        return self.tool.split(".")[0]


@dataclasses.dataclass(frozen=True)
class Parts:
    """The TensorFlow half of an application: what its ``parts`` function imports and returns."""

    build_model: Callable[[Any], Any]               # cfg -> keras.Model
    build_datasets: Callable[[Any, Any], Datasets]  # (cfg, Distributed) -> Datasets
    loss: Callable[[Any], Any]                      # cfg -> a Keras loss
    metrics: Callable[[Any], list]                  # cfg -> Keras metrics
    prepare_data: Callable[[Any], Any] | None = None   # rank 0, before the datasets are built
    check_data: Callable[[Any], tuple[int, list[str]]] | None = None  # cfg -> (files checked, problems)
    # (cfg, samples) -> {"samples_per_second", "bytes_per_sample", ...}: the simplest one-core loop doing what
    # the input pipeline does (common.tools.bench --input-only); None: no ceiling for this application yet
    input_ceiling: Callable[[Any, int], dict] | None = None
    # (network, cfg, Distributed): what the built network takes from the training data (e.g. a standardisation),
    # set by the trainer on a fresh start only (a resume takes the checkpoint's values; the benchmark times the
    # network as built); rank 0's values reach the others with the weights
    prepare_network: Callable[[Any, Any, Any], None] | None = None


class _Part:
    """An :class:`Application` attribute that is its :class:`Parts`' one of the same name (imported at first read)."""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, application, owner=None):
        return self if application is None else getattr(application.loaded_parts, self.name)


@dataclasses.dataclass(frozen=True)
class Application:
    """What an application gives the engine (see the module docstring)."""

    name: str
    config_schema: type                                   # a common.config.AppConfig subclass
    parts: Callable[[], Parts]                            # imports the TensorFlow half, returns it
    evaluation: Evaluator | None = None
    prediction: Predictor | None = None
    default_config: pathlib.Path | None = None
    mlperf: MlperfSpec | None = None
    published_rate: PublishedRate | None = None
    # its commands beside train, evaluate and predict (common.commands.Command): generators, data tools, ...
    commands: tuple = ()

    build_model = _Part()
    build_datasets = _Part()
    loss = _Part()
    metrics = _Part()
    prepare_data = _Part()
    check_data = _Part()
    input_ceiling = _Part()
    prepare_network = _Part()

    @functools.cached_property
    def loaded_parts(self) -> Parts:
        """The TensorFlow half, imported at the first read (of this or of ``build_model``, ``loss``, ...)."""
        return self.parts()

    @property
    def package(self) -> str:
        """The top-level package the application lives in (the one its registration is named after)."""
        return self.config_schema.__module__.split(".")[0]


@dataclasses.dataclass(frozen=True)
class Tasks:
    """Several applications of one package, chosen by a top-level key of the config: the one place a package
    with several tasks decides which one a config (a training's, or a finished run's) is for."""

    key: str                               # the config key naming the task, e.g. "task"
    choices: dict[str, Application]        # its values -> the applications
    default: str                           # the task of a config without the key
    commands: tuple = ()                   # the package's commands beside train, evaluate, predict

    def choose(self, config: dict, source=None) -> Application:
        """The application the config mapping ``config`` (read from ``source``) is for."""
        task = config.get(self.key, self.default)
        if not isinstance(task, str) or task not in self.choices:
            where = f"{source}: " if source else ""
            raise ConfigError(f"{where}{self.key}: expected one of {', '.join(map(repr, self.choices))}, "
                              f"got {task!r}")
        return self.choices[task]
