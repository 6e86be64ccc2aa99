"""The contract between an application and the engine, in one file that imports no TensorFlow.

An application (``<app>/application.py``) hands the engine an :class:`Application`:
its config schema and, by name, the functions that build its model, datasets, loss
and metrics.  ``build_datasets`` returns :class:`Datasets`.  Naming the functions
(``"cosmoflow.model:build_model"``) rather than importing them keeps this module and
every ``application.py`` free of TensorFlow, so ``--help``, config checks and the
SLURM tools answer before TensorFlow (seconds) is imported.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import pathlib
from typing import Any, Callable

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Ref:
    """A function named ``"package.module:function"``, imported at its first call."""

    target: str

    def resolve(self) -> Callable:
        """The function ``target`` names (``"module:function"``), imported now."""
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(module), name)

    def __call__(self, *args, **kwargs):
        return self.resolve()(*args, **kwargs)


def _ref(function):
    return Ref(function) if isinstance(function, str) else function


@dataclasses.dataclass(frozen=True)
class MlperfSpec:
    """How an application appears in an MLPerf HPC log."""

    benchmark: str                    # submission_benchmark value
    metric_key: str                   # e.g. "eval_error"
    logs_key: str                     # where the metric is in Keras logs, e.g. "val_mae"
    target: float                     # the quality target
    higher_is_better: bool = False
    # (cfg, the built WarmupDecay schedule) -> extra {key: value} events (override the common ones)
    hyperparameters: Callable[[Any, Any], dict] | str | None = None

    def __post_init__(self):
        object.__setattr__(self, "hyperparameters", _ref(self.hyperparameters))


@dataclasses.dataclass(frozen=True)
class Application:
    """What an application gives the engine.  Each function is a callable or a ``"module:function"`` name."""

    name: str
    config_schema: type                                   # a common.config.AppConfig subclass
    build_model: Callable[[Any], Any] | str               # cfg -> keras.Model
    build_datasets: Callable[[Any, Any], Datasets] | str  # (cfg, Distributed) -> Datasets
    loss: Callable[[Any], Any] | str                      # cfg -> a Keras loss
    metrics: Callable[[Any], list] | str                  # cfg -> Keras metrics
    default_config: pathlib.Path | None = None
    prepare_data: Callable[[Any], Any] | str | None = None   # rank 0, before the datasets are built
    check_data: Callable[[Any], tuple[int, list[str]]] | str | None = None  # cfg -> (files checked, problems)
    # (cfg, samples) -> {"samples_per_second", "bytes_per_sample", ...}: the simplest one-core loop doing what
    # the input pipeline does (common.tools.bench --input-only); None: no ceiling for this application yet
    input_ceiling: Callable[[Any, int], dict] | str | None = None
    mlperf: MlperfSpec | None = None

    @property
    def package(self) -> str:
        """The top-level package the application lives in (``climate_seg`` for both climate tasks)."""
        return self.config_schema.__module__.split(".")[0]

    def __post_init__(self):
        for field in ("build_model", "build_datasets", "loss", "metrics", "prepare_data", "check_data",
                      "input_ceiling"):
            object.__setattr__(self, field, _ref(getattr(self, field)))


@dataclasses.dataclass
class Datasets:
    """What an application's ``build_datasets`` returns to the trainer (tf.data pipelines of this rank).

    ``train_epoch(epoch)`` builds this rank's batches of one epoch, (x, y) or
    (x, y, sample_weight), from ``epoch`` (an int) alone: its file order and
    shuffles are seeded by (train.seed, epoch), so epoch e is the same whether
    the run started at 0 or resumed at e.  It must hold at least
    ``steps_per_epoch`` batches.  ``validation_batches`` is this rank's
    validation stream, at least ``validation_steps`` batches long (it may
    repeat); :attr:`validation` is its first ``validation_steps`` batches,
    repeated, so every epoch validates on the same batches (``cache_validation``
    keeps them in memory).  Every rank runs the same number of steps (Horovod
    allreduces would hang otherwise).
    """

    train_epoch: Callable[[int], Any]
    validation_batches: Any | None
    steps_per_epoch: int
    validation_steps: int
    global_batch_size: int    # samples per step, all ranks together
    cache_validation: bool = False
    skipped_files: list[str] = dataclasses.field(default_factory=list)  # data.on_bad_file: skip
    # After TensorFlow's reader failed without naming a file (a corrupt record, a broken GZIP stream):
    # re-read this rank's files to find it (the cost only on failure).  None: the reader names its files.
    find_bad_file: Callable[[], Exception | None] | None = None
    validation: Any | None = dataclasses.field(init=False, default=None)

    def __post_init__(self):
        if self.validation_batches is not None:
            batches = self.validation_batches.take(self.validation_steps)
            self.validation = (batches.cache() if self.cache_validation else batches).repeat()

    @property
    def train_samples(self) -> int:
        """Global samples used for training per epoch."""
        return self.steps_per_epoch * self.global_batch_size

    @property
    def validation_samples(self) -> int:
        """Global samples used for validation."""
        return self.validation_steps * self.global_batch_size

    def diagnose(self, exc: Exception) -> Exception | None:
        """The bad file behind a TensorFlow read error ``exc``, when it looks like one and can be found."""
        if self.find_bad_file is None:
            return None
        text = str(exc).lower()
        if type(exc).__name__ != "DataLossError" and not any(
                word in text for word in ("record", "inflate", "zlib", "gzip", "compress")):
            return None
        log.warning(f"a read failed ({type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}); "
                    "re-reading this rank's files to name the bad one")
        return self.find_bad_file()

    def train_stream(self, first_epoch: int, end_epoch: int, skip_steps: int = 0):
        """Epochs ``first_epoch .. end_epoch - 1`` back to back, ``steps_per_epoch``
        batches each, the first ``skip_steps`` batches left out (mid-epoch resume)."""
        epochs = [self.train_epoch(e).take(self.steps_per_epoch) for e in range(first_epoch, end_epoch)]
        stream = epochs[0]
        for epoch in epochs[1:]:
            stream = stream.concatenate(epoch)
        if skip_steps:
            stream = stream.skip(skip_steps)
        return stream.prefetch(-1)  # tf.data.AUTOTUNE
