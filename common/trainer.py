"""The one training loop every application uses.

An application hands the trainer an :class:`~common.application.Application`: its config schema,
``build_model(cfg)``, ``build_datasets(cfg, dist)``, loss and metrics.  The
trainer does the rest: precision policy, optimizer and schedule, the
Horovod-allreduced ``train_step``, broadcast of the initial state, resume,
rank-averaged metrics, throughput, checkpoints, CSV/TensorBoard/MLPerf logs,
the final ``model.keras`` and ``summary.json``.

Read top to bottom: :func:`train`, then :class:`Training` (the one object its phases share), then the phases in
the order they run (:func:`_set_up`, :func:`_start`, :func:`_fit_epochs`, :func:`_finish`), then what they call,
in the same order; the benchmark's and the dry run's entry points (:func:`prepare_data`, :func:`prepare_run`,
:func:`describe_model`) are among those.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import pathlib
import socket
import sys
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from common.application import Application, Datasets
from common.config import AppConfig, network_data_record
from common.console import cpu
from common.distributed import Distributed
from common.errors import NonFiniteLoss, Preempted, UserInputError, data_error_from_pipeline
from common.hybrid import GroupExchange
from common.loop.callbacks import (EpochEndSync, EpochReport, LearningRateLog, RootWrite, SaveCheckpoint, Throughput,
                                  confusion_metrics, rng_variables, state_variables)
from common.loop import epochs, records
from common.loop.run_folder import Claim, RunFolder
from common.loop.mlperf import MlperfCallback, MlperfLog
from common.loop.reliability import StepGuard, StopRequest, Watchdog
from common.nn import batch_norm, precision
from common.nn.flops import FLOP_CONVENTION, TRAINING_FLOPS_FACTOR, forward_flops_per_sample, measure_matmul_flops
from common.nn.layers import plain_keras
from common.nn.optimizers import build_optimizer, peak_learning_rate
from common.nn.schedules import build_schedule
from common.storage import checkpoint, outputs
from common.training_model import TrainingModel

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------------------
# The run, top to bottom
# ---------------------------------------------------------------------------------------------------------------

def train(app: Application, cfg: AppConfig, dist: Distributed, output_dir: str | pathlib.Path,
          resume: bool = False, measure_peak: bool = False, force: bool = False,
          stop_request: StopRequest | None = None, gate=None) -> dict:
    """Train ``app`` as configured; write the run directory; return the summary.

    ``cfg`` is not changed: the run resolves its own copy (the precision ``auto`` chose, a resume's per-rank
    batch on another number of ranks), and ``config.yaml`` records that copy.

    ``gate(refusal, final)``: a job of several instances (:func:`common.instances.run_instances`) is told, on
    every rank, that this instance's claim and then its checks passed (None) or why they did not, before
    anything is written; it raises when any instance was refused, so no instance writes.

    ``force``: start afresh in a run directory of an earlier run (its checkpoints are removed) or write
    into one that holds files the suite did not write (the run's own file names replace theirs).

    Order: the run folder's checks and lock, the data's screening, the model, the checkpoint's compatibility
    (:func:`_set_up`); only then is anything of the run written (:func:`_start`: marker, config, logs).  A
    :class:`NonFiniteLoss` leaving here carries ``kept``: the newest checkpoint left (rank 0; None when there
    is none)."""
    started_unix = time.time()
    cfg = cfg.model_copy(deep=True)
    folder = RunFolder(app, cfg, output_dir, resume, force)
    t = Training(app, cfg, dist, folder, measure_peak, stop_request or StopRequest(),
                 Watchdog.for_run(cfg.train, dist.rank), gate, started_unix)
    failed, preempted = True, False
    try:
        _set_up(t)
        _start(t)
        _fit_epochs(t)
        summary = _finish(t)
        failed = False
        folder.attempt.end_with(None)
        return summary
    except NonFiniteLoss as exc:
        exc.kept = checkpoint.latest_checkpoint(folder.checkpoints) if dist.is_root else None
        folder.attempt.end_with(exc)
        raise
    except BaseException as exc:
        preempted = isinstance(exc, Preempted)
        folder.attempt.end_with(exc)
        raise
    finally:
        # ending on a stop request (exit 75): a rank that stopped on another rank's signal may get its own late
        t.stop_request.close(absorb=preempted)
        if t.watchdog is not None:
            t.watchdog.stop()
        folder.close(failed)   # a run refused before it started leaves no trace of its claim


@dataclasses.dataclass
class Training:
    """One training as its phases share it (``t`` in them): what :func:`train` was given, then what each phase
    made, under that phase's name below.  The phases pass nothing else between them."""

    app: Application
    cfg: AppConfig   # the run's own copy, resolved by the set-up (precision, a resume's per-rank batch)
    dist: Distributed
    folder: RunFolder   # its attempt (attempts.json) included
    measure_peak: bool
    stop_request: StopRequest   # the entry point's, installed before TensorFlow loaded, or one of the run's own
    watchdog: Watchdog | None
    gate: Any = None   # a job's (common.instances), told each instance's verdict (see train)
    started_unix: float = 0.0   # when train was called (summary.json, the MLPerf log's init_start)
    # _set_up
    claim: Claim | None = None
    run: Run | None = None
    resumed: Resumed | None = None
    # _start
    mlperf_log: MlperfLog | None = None
    peak_flops_total: float | None = None   # FLOP/s summed over ranks, None when unknown
    # _fit_epochs
    history: dict[str, list] = dataclasses.field(default_factory=dict)   # Keras' per-epoch values, this run's
    throughput: Throughput | None = None
    mlperf_callback: MlperfCallback | None = None


def _set_up(t: Training) -> None:
    """Every check before anything of the run is written: the folder's claim, the data, the network, the
    checkpoint.  With a job's ``gate``, each instance's checks are gathered over the job twice: after the claims
    (before :func:`prepare_data`, whose data preparation is a collective of the job), then before the start."""
    refusal = None
    try:
        t.claim = t.folder.claim(t.dist)
        if t.folder.resume:
            _keep_global_batch(t)
    except UserInputError as exc:
        if t.gate is None:
            raise
        refusal = str(exc)
    if t.gate is not None:
        t.gate(refusal, final=False)   # raises on every rank of the job when any instance was refused
    try:
        configure_determinism(t.cfg, t.dist)
        t.run = prepare_run(t.app, t.cfg, t.dist)
        t.resumed = _load_resume_state(t)
        if t.resumed.checkpoint is None and t.app.prepare_network is not None:
            # a fresh start: values the network takes from the data (a resume has them in its checkpoint)
            t.app.prepare_network(t.run.network, t.cfg, t.dist)
    except UserInputError as exc:
        if t.gate is None:
            raise
        refusal = str(exc)
    if t.gate is not None:
        t.gate(refusal, final=True)


def _start(t: Training) -> None:
    """Every check has passed: the run folder started (its attempt recorded first), the MLPerf log opened
    (brought into line with the checkpoint), the initial state broadcast, each rank's RNG state given back,
    the peak FLOP/s known and the MLPerf hyperparameters logged."""
    app, cfg, dist, resumed = t.app, t.cfg, t.dist, t.resumed
    position = resumed.position
    if dist.is_root and resumed.checkpoint is not None and position[0] >= cfg.train.epochs:
        log.warning(f"{resumed.checkpoint} has completed {position[0]} epoch(s) and train.epochs is "
                    f"{cfg.train.epochs}: nothing is left to train; model.keras gets the checkpoint's weights "
                    "(raise train.epochs to train on)")
    t.folder.start(dist, resumed.history, position, resumed.optimizer_step, resumed.checkpoint, t.watchdog)
    t.mlperf_log = MlperfLog(t.claim.mlperf_path, enabled=t.claim.mlperf_path is not None and dist.is_root)
    if t.mlperf_log.enabled and resumed.checkpoint is not None:
        t.mlperf_log.reconcile(resumed.history, resumed.checkpoint, *position, app.mlperf.metric_key,
                               app.mlperf.logs_key)
    if t.mlperf_log.enabled:
        t.mlperf_log.start("init_start", time_ms=int(t.started_unix * 1000))
        t.mlperf_log.submission(cfg.mlperf, app.mlperf.benchmark, dist.num_nodes)
    dist.broadcast_variables(state_variables(t.run.model) + t.run.optimizer.variables)
    _restore_rng(t.run.model, resumed.rng_states, dist)
    if t.measure_peak:
        t.peak_flops_total = measure_peak_flops(cfg, dist)
    elif cfg.train.peak_tflops:
        t.peak_flops_total = cfg.train.peak_tflops * 1e12 * dist.size
    if t.mlperf_log.enabled:
        _log_mlperf_hyperparameters(t)


def _fit_epochs(t: Training) -> None:
    """The epochs from the resumed position to ``train.epochs``, into ``t.history``."""
    cfg, dist, run = t.cfg, t.dist, t.run
    datasets, network, model = run.datasets, run.network, run.model
    callbacks, saver = _epoch_callbacks(t)
    over = f" over {dist.controller}" if dist.controller else ""
    log.info(f"{t.app.name}: {dist.size} rank(s) [{dist.backend}]{over}, global batch {run.global_batch_size}, "
             f"{datasets.steps_per_epoch} steps/epoch, {datasets.train_samples} training and "
             f"{datasets.validation_samples} validation samples/epoch, {network.count_params():,} parameters, "
             f"{run.forward_flops / 1e9:.3f} GFLOP forward/sample, precision {cfg.train.precision}, "
             f"peak LR {run.peak_learning_rate:.4g}")
    log.info(f"cpu: {cpu.one_line()}")
    try:
        for start_epoch, end_epoch, skip_steps in epochs.fit_phases(t.resumed.position, cfg.train.epochs):
            guard = StepGuard(model.step_signals, t.stop_request, saver.save, t.watchdog,
                              loss_scaled=precision.needs_loss_scaling(cfg.train.precision),
                              max_nonfinite_steps=cfg.train.max_nonfinite_steps, first_step_offset=skip_steps)
            fit_history = model.fit(
                datasets.train_stream(start_epoch, end_epoch, skip_steps), epochs=end_epoch, initial_epoch=start_epoch,
                steps_per_epoch=datasets.steps_per_epoch - skip_steps, validation_data=datasets.validation,
                validation_steps=datasets.validation_steps if datasets.validation is not None else None,
                callbacks=callbacks + [guard], verbose=_verbosity(dist), shuffle=False)
            for key, values in fit_history.history.items():
                t.history.setdefault(key, []).extend(values)
    except (Preempted, NonFiniteLoss):
        _finish_mlperf(t.mlperf_callback, aborted=True)
        raise
    except tf.errors.OpError as exc:
        # A reader's DataError raised inside tf.data arrives wrapped in a TF error: unwrap it (exit 2); a
        # corrupt record or a broken GZIP stream is looked for in this rank's files, to name the file.
        _finish_mlperf(t.mlperf_callback, aborted=True)
        data_error = data_error_from_pipeline(exc) or datasets.diagnose(exc)
        if data_error is not None:
            raise data_error from None
        raise
    _finish_mlperf(t.mlperf_callback)
    if datasets.skipped_files and dist.is_root:   # the same list on every rank
        log.warning(f"skipped {len(datasets.skipped_files)} bad file(s) (data.on_bad_file: skip); see above")


def _finish(t: Training) -> dict:
    """Precise batch norm (when asked), the final weights checked finite, then rank 0 writes ``model.keras``
    and ``summary.json`` (which the other ranks watch for: :class:`RootWrite`'s limits); the summary."""
    folder, watchdog, network = t.folder, t.watchdog, t.run.network
    precise_bn = None
    if t.cfg.train.precise_bn_batches and t.history.get("loss"):
        if watchdog is not None:
            watchdog.phase("saving", "precise batch norm")
        precise_bn = _precise_batch_norm(t)
    if watchdog is not None:
        watchdog.phase("training", "the final weights and summary")
    with RootWrite(t.dist, watchdog, folder.path / "summary.json") as final_write:
        _check_final_weights(network, t.dist)
        summary = _summary(t, precise_bn)

        def write_model_and_summary():
            _atomic_save_model(network, folder.path / "model.keras", force=folder.force)
            outputs.write_json(folder.path / "summary.json", summary, f"{t.app.name}.train", force=folder.force)

        final_write.run(write_model_and_summary, "writing model.keras and summary.json")
    return summary


# ---------------------------------------------------------------------------------------------------------------
# Set-up: every check, nothing written
# ---------------------------------------------------------------------------------------------------------------

def _keep_global_batch(t: Training) -> None:
    """A resume on another number of ranks (a job requeued without its lost node, or resubmitted on more)
    keeps the checkpoint's global batch: ``data.batch_size`` becomes its global batch over this run's ranks,
    so the position and the learning-rate schedule, which count steps of that batch, go on where they
    stopped.  A global batch the ranks cannot share is a one-line refusal (exit 2) saying what to set."""
    cfg, dist, latest = t.cfg, t.dist, t.claim.latest
    verdict: int | str | None = None
    if dist.is_root and latest is not None:
        newest = (checkpoint.read_state(path) for path in reversed(checkpoint.list_checkpoints(latest.parent)))
        state = next((found for found in newest if found is not None), None)   # the newest readable record only
        saved, ranks_then = (state or {}).get("global_batch_size"), (state or {}).get("ranks")
        if saved and ranks_then and ranks_then != dist.size and saved != epochs.global_batch_size(cfg.data.batch_size, dist.size):
            if saved % dist.size:
                verdict = (f"{latest.parent}: the checkpoint was written by {ranks_then} rank(s) with global "
                           f"batch {saved}, which {dist.size} rank(s) cannot share evenly; not resumed: run on a "
                           f"number of ranks that divides {saved}, or start afresh (--force, or another "
                           "--output-dir) with a data.batch_size for these ranks")
            else:
                verdict = saved // dist.size
                log.warning(f"resuming on {dist.size} rank(s) a run checkpointed on {ranks_then}: data.batch_size "
                            f"{cfg.data.batch_size} -> {verdict} per rank keeps the global batch {saved} (and with "
                            "it the position and the learning-rate schedule)")
    verdict = dist.broadcast_object(verdict)
    if isinstance(verdict, str):
        raise UserInputError(verdict)
    if verdict is not None:
        cfg.data.batch_size = verdict


def configure_determinism(cfg: AppConfig, dist: Distributed) -> None:
    """Seeds (per rank, so dropout differs) and, when asked, TF op determinism."""
    keras.utils.set_random_seed(cfg.train.seed + dist.rank)
    if cfg.train.deterministic:
        tf.config.experimental.enable_op_determinism()


def prepare_data(app: Application, cfg: AppConfig, dist: Distributed, check_device: bool = True) -> Datasets:
    """The precision decided once (rank 0's answer for ``auto``) and set; the application's data prepared
    (generated, summarised: rank 0, while the others wait) and its datasets built on every rank.
    ``check_device``: refuse a precision this device cannot train in (False for the input-only bench, which
    builds no network: its pipeline runs on the CPU whatever the precision)."""
    cfg.train.precision = dist.broadcast_object(precision.resolve(cfg.train.precision))
    if check_device:
        precision.check_device_support(cfg.train.precision)
    precision.set_precision(cfg.train.precision)
    if app.prepare_data is not None and dist.instances > 1:
        # Instances may share a data folder: each folder is prepared once, by the first instance reading it.
        folder = str(pathlib.Path(cfg.data.data_dir).resolve()) if dist.is_root else None
        folders = dist.world_allgather_object(folder)
        refused = None
        if dist.is_root and folder not in folders[:dist.world_rank]:
            try:
                app.prepare_data(cfg)
            except UserInputError as exc:   # after the job's barrier, which every rank must reach
                refused = exc
        dist.world_barrier()
        if refused is not None:
            raise refused
    elif app.prepare_data is not None:
        if dist.is_root:
            app.prepare_data(cfg)
        dist.barrier()
    return app.build_datasets(cfg, dist)


@dataclasses.dataclass
class Run:
    """A run set up by :func:`prepare_run`: its data, network and compiled training model."""

    datasets: Datasets
    network: keras.Model
    model: TrainingModel
    optimizer: keras.optimizers.Optimizer
    schedule: Any
    forward_flops: int
    global_batch_size: int
    peak_learning_rate: float


def prepare_run(app: Application, cfg: AppConfig, dist: Distributed, datasets: Datasets | None = None) -> Run:
    """The one set-up of the trainer and the benchmark: data (:func:`prepare_data`, unless given), network,
    schedule, optimizer and the compiled :class:`TrainingModel`.  Nothing broadcast yet: a run restores its
    checkpoint first."""
    datasets = datasets if datasets is not None else prepare_data(app, cfg, dist)
    try:
        network = app.build_model(cfg)
    except ValueError as exc:   # Keras' shape errors: a model config that does not fit the data
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserInputError(f"{app.name}: the model section cannot be built for this data ({first}); check "
                             "model.* against data.sample_shape / data.image_size / data.grid") from None
    for output in network.outputs:
        if output.dtype != "float32":
            raise TypeError(f"{app.name} model output {output.name} is {output.dtype}; build the last layer "
                            "with dtype='float32'")
    global_batch_size = datasets.global_batch_size
    opt = cfg.optimizer
    peak_lr = peak_learning_rate(opt.learning_rate, opt.schedule, global_batch_size)
    schedule = build_schedule(opt.schedule, opt.learning_rate, peak_lr, datasets.steps_per_epoch, cfg.train.epochs)
    optimizer = build_optimizer(opt, schedule, loss_scaling=precision.needs_loss_scaling(cfg.train.precision))
    model = TrainingModel(network, dist, gradient_compression=cfg.distributed.gradient_compression,
                          gradient_lag=cfg.train.gradient_lag)
    model.compile(optimizer=optimizer, loss=app.loss(cfg), metrics=app.metrics(cfg),
                  steps_per_execution=cfg.train.steps_per_execution, jit_compile=False)
    optimizer.build(model.trainable_variables)
    return Run(datasets, network, model, optimizer, schedule, forward_flops_per_sample(network), global_batch_size,
               peak_lr)


@dataclasses.dataclass
class Resumed:
    """Where a run starts: (epochs completed, steps into the next), each rank's RNG states, the rows of the
    committed epochs (:mod:`common.loop.records`), the checkpoint's name (None: from scratch) and its
    optimizer step."""

    position: tuple[int, int] = (0, 0)
    rng_states: list = dataclasses.field(default_factory=list)
    history: list = dataclasses.field(default_factory=list)
    checkpoint: str | None = None
    optimizer_step: int = 0


def _load_resume_state(t: Training) -> Resumed:
    """Rank 0 reads the newest checkpoint that reads back whole (falling back past corrupt ones, each named)
    and checks that it fits this run, then assigns it; every rank gets the :class:`Resumed` state, or the same
    one-line refusal.  Before anything of the run is written."""
    dist, run, latest = t.dist, t.run, t.claim.latest
    resume = t.folder.resume
    verdict: Resumed | str = Resumed()
    if dist.is_root and resume and latest is not None:
        try:
            found = checkpoint.newest_readable(latest.parent)
            if found is not None:
                path, state, arrays = found
                checkpoint.check_compatible(path, state, arrays, state_variables(run.model), run.optimizer.variables,
                                            _resume_record(t))
                rng_states = checkpoint.assign_checkpoint(state, arrays, state_variables(run.model),
                                                          run.optimizer.variables)
                position = (int(state["epoch"]), int(state.get("step_in_epoch", 0)))
                log.info(f"resuming from {path} (epoch {position[0] + 1}, step {position[1]} of it; "
                         f"optimizer step {state.get('step')})")
                history = state.get("history")
                if history is None:   # written before checkpoints carried their epochs' rows
                    history = records.rows_from_csv(path.parent.parent / records.HISTORY_CSV, position[0])
                history = [row for row in history if row["epoch"] < position[0]]
                verdict = Resumed(position, rng_states, history, path.name, int(state.get("step", 0)))
        except UserInputError as exc:
            verdict = str(exc)
    elif dist.is_root and resume:
        log.info("--resume: no checkpoint in the run directory; starting from scratch")
    verdict = dist.broadcast_object(verdict)
    if isinstance(verdict, str):
        raise UserInputError(verdict)
    return verdict


def _resume_record(t: Training) -> dict:
    """What a checkpoint records for a resume to match (:data:`common.storage.checkpoint.RESUME_KEYS`)."""
    cfg, opt = t.cfg, t.cfg.optimizer
    return {"global_batch_size": t.run.global_batch_size, "steps_per_epoch": t.run.datasets.steps_per_epoch,
            "precision": cfg.train.precision, "optimizer": opt.name + ("+larc" if opt.larc.enabled else ""),
            "model": {**cfg.model.model_dump(mode="json"), **network_data_record(cfg)}}


# ---------------------------------------------------------------------------------------------------------------
# Start: the state every rank begins from
# ---------------------------------------------------------------------------------------------------------------

def _restore_rng(model, rng_states: list, dist: Distributed) -> None:
    """Give each rank back its own dropout RNG state from the checkpoint."""
    if not rng_states:
        return
    variables = rng_variables(model)
    if len(rng_states) != dist.size or len(rng_states[dist.rank]) != len(variables):
        if dist.is_root:
            log.warning(f"the checkpoint holds RNG states of {len(rng_states)} rank(s); this run has "
                        f"{dist.size}: dropout streams start afresh")
        return
    for variable, value in zip(variables, rng_states[dist.rank]):
        variable.assign(value)


def measure_peak_flops(cfg: AppConfig, dist: Distributed) -> float:
    """Matmul FLOP/s of every rank's device at the run's compute dtype, summed over ranks."""
    dtype = precision.compute_dtype(cfg.train.precision)
    per_rank = measure_matmul_flops(dtype)
    total = float(dist.sum_array(np.array([per_rank]))[0])
    log.info(f"measured peak: {per_rank / 1e12:.3f} TFLOP/s per rank ({dtype} matmul), "
             f"{total / 1e12:.3f} TFLOP/s over {dist.size} ranks")
    return total


def _log_mlperf_hyperparameters(t: Training) -> None:
    cfg, run = t.cfg, t.run
    opt = cfg.optimizer
    schedule = opt.schedule
    warmup_epochs = schedule.warmup_epochs or (schedule.warmup_steps / run.datasets.steps_per_epoch)
    events = {
        "global_batch_size": run.global_batch_size,
        "train_samples": run.datasets.train_samples,
        "eval_samples": run.datasets.validation_samples,
        "gradient_accumulation_steps": 1,
        "opt_name": opt.name,
        "opt_base_learning_rate": opt.learning_rate,
        "opt_learning_rate_warmup_epochs": warmup_epochs,
        "opt_learning_rate_warmup_factor": run.peak_learning_rate / opt.learning_rate,
        "opt_learning_rate_decay_boundary_epochs": sorted(schedule.decay_boundaries),
        "opt_learning_rate_decay_factor": [schedule.decay_boundaries[k] for k in sorted(schedule.decay_boundaries)],
        "opt_weight_decay": opt.weight_decay,
    }
    if t.app.mlperf.hyperparameters is not None:
        events.update(t.app.mlperf.hyperparameters(cfg, run.schedule))
    for key, value in events.items():
        t.mlperf_log.event(key, value)


# ---------------------------------------------------------------------------------------------------------------
# The epochs
# ---------------------------------------------------------------------------------------------------------------

def _epoch_callbacks(t: Training) -> tuple[list[keras.callbacks.Callback], SaveCheckpoint]:
    """The callbacks of every epoch, in the order :func:`check_callback_order` holds them to, and the
    checkpoint saver among them (a stop saves through it); ``t.throughput`` and ``t.mlperf_callback`` set."""
    cfg, dist, run, folder = t.cfg, t.dist, t.run, t.folder
    t.throughput = Throughput(run.global_batch_size, run.forward_flops, t.peak_flops_total,
                              cfg.train.throughput_warmup_steps)
    saver = SaveCheckpoint(folder.checkpoints, dist, keep=cfg.train.keep_checkpoints, watchdog=t.watchdog,
                           resume_record=_resume_record(t), history=t.resumed.history)
    # Keras calls callbacks in list order: what measures, then the one synchronisation over ranks, then
    # what writes: first the checkpoint, which commits the epoch (every rank takes part), then the records,
    # rank 0's (common/loop/records.py: a resume reconciles them with the checkpoint).
    callbacks: list[keras.callbacks.Callback] = [t.throughput, LearningRateLog()]
    if dist.groups > 1:
        callbacks.append(GroupExchange(dist, run.model.step_signals, cfg.distributed.exchange_every))
    callbacks += [EpochEndSync(dist), saver]
    if dist.is_root:
        callbacks.append(records.HistoryCsv(folder.path / records.HISTORY_CSV, saver))
        if cfg.train.tensorboard:
            callbacks.append(keras.callbacks.TensorBoard(str(folder.path / "tensorboard"), write_graph=False,
                                                         profile_batch=0))
        if t.mlperf_log.enabled:
            mlperf = t.app.mlperf
            t.mlperf_callback = MlperfCallback(t.mlperf_log, mlperf.metric_key, mlperf.logs_key, mlperf.target,
                                               mlperf.higher_is_better)
            t.mlperf_callback.restore(t.resumed.history)
            callbacks.append(t.mlperf_callback)
        callbacks.append(EpochReport(cfg.train.epochs))
    check_callback_order(callbacks)
    return callbacks, saver


def check_callback_order(callbacks: list) -> None:
    """Keras calls callbacks in list order: the epoch's measurements (throughput, learning rate, the group
    exchange) must come before the one synchronisation over ranks (:class:`EpochEndSync`), and everything that
    writes the epoch (checkpoint, CSV, TensorBoard, MLPerf, the report) after it, or ranks write different
    numbers."""
    kinds = [type(c) for c in callbacks]
    if kinds.count(EpochEndSync) != 1:
        raise RuntimeError(f"exactly one EpochEndSync expected among the callbacks, got {kinds.count(EpochEndSync)}")
    sync = kinds.index(EpochEndSync)
    measuring = (Throughput, LearningRateLog, GroupExchange)
    late = [k.__name__ for k in kinds[sync + 1:] if issubclass(k, measuring)]
    early = [k.__name__ for k in kinds[:sync] if not issubclass(k, measuring)]
    if late or early:
        raise RuntimeError(f"callback order: {late} must come before EpochEndSync, {early} after it")
    if records.HistoryCsv in kinds and (SaveCheckpoint not in kinds
                                        or kinds.index(records.HistoryCsv) < kinds.index(SaveCheckpoint)):
        raise RuntimeError("callback order: HistoryCsv writes what SaveCheckpoint committed: it comes after it")


def _verbosity(dist: Distributed) -> int:
    return (1 if sys.stdout.isatty() else 0) if dist.is_root else 0


def _finish_mlperf(mlperf_callback, aborted: bool = False) -> None:
    if mlperf_callback is not None:
        mlperf_callback.finish(aborted=aborted)


# ---------------------------------------------------------------------------------------------------------------
# The finish: model.keras and summary.json
# ---------------------------------------------------------------------------------------------------------------

def _precise_batch_norm(t: Training) -> dict | None:
    """Batch-norm statistics re-estimated with the final weights (``train.precise_bn_batches``), then the
    validation rerun: both validations (the last epoch's, with the moving averages, and this one) for the
    summary.  The checkpoints keep the moving averages (a resumed run continues them); ``model.keras`` gets
    the re-estimated statistics."""
    cfg, dist, model, datasets = t.cfg, t.dist, t.run.model, t.run.datasets
    started = time.time()
    if not batch_norm.batch_norm_layers(model.network):   # the same answer on every rank
        log.warning("train.precise_bn_batches: the network has no batch-norm layer; nothing re-estimated")
        return None
    used = batch_norm.reestimate(model.network, datasets.train_epoch(cfg.train.epochs),
                                 cfg.train.precise_bn_batches, dist)
    before = {k: float(v[-1]) for k, v in t.history.items() if k.startswith("val_") and v}
    after = {}
    if datasets.validation is not None:
        results = model.evaluate(datasets.validation, steps=datasets.validation_steps, return_dict=True, verbose=0)
        after = {f"val_{k}": float(v) for k, v in results.items() if np.ndim(v) == 0}
        EpochEndSync(dist).write_pooled_validation(after, confusion_metrics(model))
        after = dist.average_scalars(after)
    shown = ", ".join(f"{k} {before[k]:.4g} -> {after[k]:.4g}" for k in sorted(after) if k in before)
    log.info(f"precise batch norm: statistics over {used} training batches/rank with the final weights "
             f"({time.time() - started:.0f} s): {shown}")
    return {"batches_per_rank": used, "samples": used * datasets.global_batch_size,
            "validation_moving_averages": before, "validation_precise": after}


def _check_final_weights(network: keras.Model, dist: Distributed) -> None:
    """Every rank: the trained network's weights are finite (summed over ranks), or :class:`NonFiniteLoss`
    before ``model.keras`` is written."""
    bad = checkpoint.nonfinite_arrays([np.asarray(v) for v in network.weights])
    if int(dist.sum_array(np.array([len(bad)], np.int64))[0]):
        first = network.weights[bad[0]].path if bad else "on another rank"
        raise NonFiniteLoss(f"the trained network's weights hold NaN or Inf ({len(bad)} array(s) here, first: "
                            f"{first}); model.keras not written")


def _summary(t: Training, precise_bn: dict | None) -> dict:
    """summary.json: what ran, how fast, the last epoch's metrics, and this attempt."""
    cfg, dist, run, history, peak_flops_total = t.cfg, t.dist, t.run, t.history, t.peak_flops_total
    datasets, forward_flops = run.datasets, run.forward_flops
    initial_epoch = t.resumed.position[0]
    last = {k: float(v[-1]) for k, v in history.items() if v}
    rates = history.get("samples_per_second", [])
    # The first epoch of a run includes graph tracing; report the later ones when there are any.
    steady = rates[1:] if len(rates) > 1 else rates
    samples_per_second = float(np.mean(steady)) if steady else None
    tflops = samples_per_second * TRAINING_FLOPS_FACTOR * forward_flops / 1e12 if samples_per_second else None
    summary = {
        "app": t.app.name,
        "ranks": dist.size,
        "backend": dist.backend,
        "controller": dist.controller,
        "global_batch_size": run.global_batch_size,
        "precision": cfg.train.precision,
        "cpu": cpu.describe(),
        "epochs_completed": initial_epoch + len(history.get("loss", [])),
        "first_epoch_this_run": initial_epoch + 1,
        "train_samples_per_epoch": datasets.train_samples,
        "validation_samples": datasets.validation_samples,
        "parameters": int(run.network.count_params()),
        "forward_flops_per_sample": int(forward_flops),
        "flop_convention": FLOP_CONVENTION,
        "samples_per_second": samples_per_second,
        "tflops_per_second": tflops,
        "peak_tflops": peak_flops_total / 1e12 if peak_flops_total else None,
        "ratio_to_peak": tflops * 1e12 / peak_flops_total if tflops and peak_flops_total else None,
        "wall_time_s": time.time() - t.started_unix,
        "skipped_files": datasets.skipped_files,
        "final": last,
    }
    # Where each rank ran, and a fingerprint of each rank's final weights: in synchronous data-parallel
    # training they are equal on every rank (hybrid mode ends on the groups' consensus).
    summary["groups"] = dist.groups
    summary["horovod_environment"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith("HOROVOD_")}
    summary["hosts"] = dist.allgather_object(socket.gethostname())
    summary["nodes"] = len(set(summary["hosts"]))
    fingerprint = hashlib.sha256()
    for weight in run.network.weights:
        fingerprint.update(np.ascontiguousarray(np.asarray(weight)).tobytes())
    summary["weights_sha256"] = dist.allgather_object(fingerprint.hexdigest()[:16])
    if len(set(summary["weights_sha256"])) > 1 and dist.is_root:
        log.warning(f"the ranks ended with different weights (sha256 prefixes {summary['weights_sha256']})")
    if t.mlperf_callback is not None:
        summary["mlperf_target_reached"] = t.mlperf_callback.reached
        summary["mlperf_time_to_target_s"] = t.mlperf_callback.reached_after_s   # this run's run_start; None: not reached
    summary["started_unix"] = t.started_unix
    summary["step_time_s"] = step_time_summary(t.throughput.step_times)
    if precise_bn is not None:
        summary["precise_bn"] = precise_bn
    attempt = t.folder.attempt
    if attempt.number is not None:   # rank 0
        summary["attempt"] = attempt.number
        summary["previous_attempts"] = attempt.previous
    return summary


def step_time_summary(step_times: list[list[float]]) -> dict | None:
    """Median and 10th/90th percentiles of the timed step durations of the epochs after the first (tracing,
    pipeline start) when there are several, else of all; None when no step was timed."""
    steady = [seconds for epoch in (step_times[1:] if len(step_times) > 1 else step_times) for seconds in epoch]
    if not steady:
        return None
    p10, median, p90 = np.percentile(steady, [10, 50, 90])
    return {"median": float(median), "p10": float(p10), "p90": float(p90), "mean": float(np.mean(steady)),
            "std": float(np.std(steady)), "steps": len(steady)}


def _atomic_save_model(network: keras.Model, path: pathlib.Path, force: bool = False) -> None:
    with outputs.atomic_path(path, force=force, suffix=".keras") as temporary:
        plain_keras(network).save(temporary)  # loads with Keras alone


# ---------------------------------------------------------------------------------------------------------------
# The dry run (``--dry-run``): the network without data
# ---------------------------------------------------------------------------------------------------------------

def describe_model(app: Application, cfg: AppConfig, ranks: int) -> dict:
    """What ``--dry-run`` prints: the model built from the config, without data.  ``cfg`` and Keras' global
    dtype policy are left as they were (the model is built from a copy with the precision resolved)."""
    cfg = cfg.model_copy(deep=True)
    cfg.train.precision = precision.resolve(cfg.train.precision)
    previous_policy = keras.config.dtype_policy()
    precision.set_precision(cfg.train.precision)
    try:
        network = app.build_model(cfg)
    finally:
        keras.config.set_dtype_policy(previous_policy)
    flops = forward_flops_per_sample(network)
    return {
        "app": app.name,
        "model": network.name,
        "parameters": int(network.count_params()),
        "forward_flops_per_sample": int(flops),
        "forward_gflops_per_sample": round(flops / 1e9, 2),
        "training_flops_per_sample": int(TRAINING_FLOPS_FACTOR * flops),
        "flop_convention": FLOP_CONVENTION,
        "global_batch_size": epochs.global_batch_size(cfg.data.batch_size, ranks),
        "ranks": ranks,
        "precision": cfg.train.precision,
        "input_shape": list(network.input_shape[1:]),
    }
