"""Command-line entry point shared by every application's ``train`` module.

    python -m <app>.train [--config FILE] [--set key=value ...] [--output-dir D]
                          [--resume] [--dry-run] [--measure-peak]

Exit codes: 0 success, 2 bad input or config (a one-line message naming the
file or key), other non-zero for failures during training.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import pathlib
import sys
import traceback
from typing import Any, Callable

from common import distributed, registry
from common.console import logs, signals
from common.config import instance_configs, load_config, read_yaml
from common.deferred import DeferredModule
from common.errors import (EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_NONFINITE, EXIT_PREEMPTED,
                           EXIT_TERMINATED, ConfigError, NonFiniteLoss, NonFiniteOutput, Preempted, Terminated,
                           UserInputError)
from common.instances import JobFolder, run_instances
from common.loop.preemption import StopRequest
from common.loop.run_folder import RunFolder
from common.storage import outputs, run_dirs, scratch, transaction

# TensorFlow and Horovod load only once the arguments and the config are checked: --help and config errors answer
# without them (common.distributed imports Horovod in init() and TensorFlow at first use).
trainer = DeferredModule("common.trainer")


def exit_process(code: int) -> None:
    """End an entry point: flush the output, then leave without interpreter teardown.

    Tearing down live tf.data iterators can deadlock (an iterator's destructor
    waits for a reader thread that needs the GIL its caller holds), which would
    turn an error or a preemption into a hang.  Everything the run writes is
    closed or flushed before this point.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    scratch.remove()   # the atexit handlers that os._exit skips would have: nothing left in /tmp
    os._exit(code)


@contextlib.contextmanager
def exit_on_user_error():
    """Turn :class:`UserInputError` into its one-line message and exit code 2."""
    try:
        yield
    except UserInputError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        exit_process(EXIT_BAD_INPUT)


def run_command(main: Callable[[Any], int], argv=None, name: str = "") -> int:
    """Every entry point's one way in: ``main(argv)``, and what ends it turned into one line and an exit code
    (:mod:`common.errors`): bad input 2, a non-finite output 3, Ctrl-C 130, SIGTERM 143 (the outputs' state
    said: :data:`common.storage.transaction.last_outcome`), a failure its traceback and 1.  argparse's own
    refusals (exit 2) and ``--help`` (0) pass through.  The caller ends the process with the code
    (``exit_process(run_command(main))``); tests call it in-process."""
    transaction.last_outcome = ""
    signals.loading_window_over()
    try:
        with transaction.terminate_as_interrupt():
            transaction.fault("start")
            code = main(argv)
    except UserInputError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    except NonFiniteOutput as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_NONFINITE
    except KeyboardInterrupt:
        print(f"interrupted (Ctrl-C){_outcome()}", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except Terminated:
        print(f"terminated (SIGTERM){_outcome()}", file=sys.stderr, flush=True)
        return EXIT_TERMINATED
    except SystemExit as exc:   # argparse: --help (0), a refused argument (2)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_BAD_INPUT)
    except Exception as exc:   # noqa: BLE001  a failure: its traceback, then one line naming it
        traceback.print_exc()
        print(f"error: {name + ' ' if name else ''}failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return EXIT_FAILURE
    return 0 if code is None else int(code)


def _outcome() -> str:
    return f"; {transaction.last_outcome}" if transaction.last_outcome else "; nothing was written"


# -- numbers on the command line --------------------------------------------------------------------------------
# Every numeric option of every command is one of these types (tests/test_contract.py checks each declared
# command's parser): each refuses nan and inf, and says by its ``admits`` what else it takes, so that 0 and
# negative values are refused exactly where the option's meaning excludes them.

def number_argument(kind: type, what: str, admits: Callable[[float], bool], name: str):
    """An argparse type for a number of ``kind`` (int: a whole number) that ``admits`` (``what``: said when it
    does not); nan, inf and text are refused as argparse's one-line error naming the option."""
    def parse(text: str):
        try:
            value = float(text)
            if kind is int:
                value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {what}") from None
        if not (math.isfinite(value) and admits(value)):
            raise argparse.ArgumentTypeError(f"{text!r}: expected {what}")
        return value

    parse.__name__ = parse.__qualname__ = name
    parse.admits = admits
    parse.what = what
    return parse


positive_int_argument = number_argument(
    int, "a whole number of at least 1", lambda v: v >= 1, "positive_int_argument")
positive_int_argument.__doc__ = """argparse type of a count or a size (``--steps``, ``--n-train``, ``--workers``):
0, a negative or a fractional value is argparse's one-line error naming the option, exit 2."""
non_negative_int_argument = number_argument(
    int, "a whole number of at least 0", lambda v: v >= 0, "non_negative_int_argument")
non_negative_int_argument.__doc__ = "argparse type of a whole number that may be 0 (``--seed``: NumPy's seeds are)."
positive_number_argument = number_argument(
    float, "a positive finite number", lambda v: v > 0, "positive_number_argument")
positive_number_argument.__doc__ = "argparse type of a rate or a size: a positive finite number (not 0, nan or inf)."
finite_number_argument = number_argument(float, "a finite number", lambda v: True, "finite_number_argument")
finite_number_argument.__doc__ = "argparse type of any finite number (a score threshold): nan and inf refused."
NUMBER_TYPES = (positive_int_argument, non_negative_int_argument, positive_number_argument, finite_number_argument)


def fraction_argument(low_open: bool = True, high_open: bool = False):
    """argparse type of a fraction in (0, 1] (or as the bounds say): an efficiency, a share."""
    def admits(v):
        return (v > 0 if low_open else v >= 0) and (v < 1 if high_open else v <= 1)
    low, high = "(" if low_open else "[", ")" if high_open else "]"
    return number_argument(float, f"a number in {low}0, 1{high}", admits, "fraction_argument")


def nonfinite_outcome(exc: Exception, output_dir) -> str:
    """What a run stopped by NaN/Inf kept, as true as the run directory says (``exc.kept``: the newest
    checkpoint left, set by the trainer on rank 0)."""
    kept = getattr(exc, "kept", None)
    if kept is not None and pathlib.Path(kept).is_file():
        return f"nothing non-finite was saved; the last good checkpoint is {kept} (--resume continues from it)"
    return f"nothing non-finite was saved; no checkpoint was written before it (nothing in {output_dir} to resume)"


def train_parser(app) -> argparse.ArgumentParser:
    """The ``python -m <app>.train`` command line: --config, --set, --output-dir, --resume, --force, --dry-run,
    --measure-peak."""
    parser = argparse.ArgumentParser(prog=f"python -m {app.name}.train", description=f"Train {app.name}.")
    default = str(app.default_config) if app.default_config else None
    parser.add_argument("--config", default=default, help=f"YAML config (default: {default})")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set optimizer.learning_rate=0.01 (repeatable)")
    parser.add_argument("--output-dir", help="run directory (default: train.output_dir or runs/<app>-<config>)")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --output-dir")
    parser.add_argument("--force", action="store_true",
                        help="start afresh over an earlier run in --output-dir (its checkpoints are removed), "
                             "or write into a folder holding files this suite did not write")
    parser.add_argument("--dry-run", action="store_true",
                        help="build the model without data; print parameters and FLOPs as JSON")
    parser.add_argument("--measure-peak", action="store_true",
                        help="time a matmul on each rank's device to report the ratio to peak")
    return parser


def default_output_dir(app, cfg, config_path) -> pathlib.Path:
    """``train.output_dir`` if set, else ``runs/<app>-<config file stem>`` (relative to the working directory)."""
    if cfg.train.output_dir:
        return pathlib.Path(cfg.train.output_dir)
    stem = pathlib.Path(config_path).stem if config_path else "default"
    return pathlib.Path("runs") / f"{app.name}-{stem}"


def find_application(config_path: str, app_name: str | None = None, app_option: bool = True):
    """The application a config is for: the registered application ``app_name``, else the config's
    ``model.name``, else its folder (``configs/<app>/...``), the first of them registered (:mod:`common.registry`),
    with its task where the package has several.  ``app_option``: the calling tool has an ``--app`` option to
    suggest."""
    if app_name is not None:   # asked for by name: that one, or a one-line refusal naming the registered ones
        return registry.application(app_name, config_path)
    candidates = []
    raw = read_yaml(config_path)
    if isinstance(raw.get("model"), dict) and raw["model"].get("name"):
        candidates.append(raw["model"]["name"])
    candidates.append(pathlib.Path(config_path).resolve().parent.name)
    for name in candidates:
        if name in registry.names():
            return registry.application(name, config_path)
    hint = "pass --app NAME, or " if app_option else ""
    raise ConfigError(f"{config_path}: cannot tell which application it configures; {hint}keep it in "
                      f"configs/<app>/ (app: one of {', '.join(registry.names())})")


def train_main(package: str) -> None:
    """The ``__main__`` of ``<package>.train``: :func:`run_train` through the one way in."""
    exit_process(run_command(lambda argv: run_train(package, argv), name=f"{package}.train"))


def run_train(package: str, argv=None) -> int:
    """``python -m <package>.train``: the application of ``package`` trained as the command line says."""
    # First, before TensorFlow loads: a preemption signal during start-up is a stop request honoured at
    # the first step (checkpoint, exit 75, requeue), not SIGUSR1's default action, which ends the rank.
    stop_request = StopRequest()
    # The default application's parser reads --config; then the config picks the application.
    config = train_parser(registry.application(package)).parse_known_args(argv)[0].config
    app = registry.application(package, config)
    args = train_parser(app).parse_args(argv)
    cfg = load_config(app.config_schema, args.config, args.set)
    # TensorFlow and Horovod load only from here: arguments and config are checked without them.
    if args.dry_run:
        ranks = max(1, distributed.launched_world_size() // cfg.distributed.instances)   # one instance's ranks
        description = trainer.describe_model(app, cfg, ranks)
        if cfg.distributed.instances > 1:   # every instance's network is built: an override may not fit
            description["instances"] = []
            for k, instance_cfg in enumerate(instance_configs(app.config_schema, cfg, source=args.config)):
                try:
                    network = trainer.describe_model(app, instance_cfg, ranks)
                except UserInputError as exc:
                    raise UserInputError(f"instance {k} (distributed.instance_overrides[{k}]): {exc}") from None
                description["instances"].append({key: network[key] for key in (
                    "parameters", "forward_flops_per_sample", "forward_gflops_per_sample", "precision")})
        print(json.dumps(description), flush=True)
        return 0

    output_dir = outputs.normal_path(args.output_dir if args.output_dir else default_output_dir(app, cfg, args.config))
    # The folder's checks that only read, on every rank before the start-up: a refusal in a second (the
    # claim repeats them under the folder's lock).
    run_dirs.refuse_if_locked(output_dir)
    if cfg.distributed.instances > 1:
        JobFolder(app, output_dir, cfg.distributed.instances, args.resume, args.force).check()
    else:
        RunFolder(app, cfg, output_dir, args.resume, args.force).check()
    dist = distributed.init(cfg.train.intra_op_threads, cfg.train.inter_op_threads,
                            groups=cfg.distributed.groups, instances=cfg.distributed.instances)

    def train_one(app, cfg, dist, run_dir, gate=None):
        return _train_and_report(app, cfg, dist, run_dir, args, stop_request, gate)

    if cfg.distributed.instances > 1:
        return run_instances(app, cfg, dist, output_dir, train_one, resume=args.resume, force=args.force)
    logs.configure(dist.rank, dist.size, ("common", app.package))
    return train_one(app, cfg, dist, output_dir)[0]


def _train_and_report(app, cfg, dist, output_dir, args, stop_request, gate=None) -> tuple[int, dict | None, str | None]:
    """One run (or one instance's, with the job's ``gate``: :func:`common.instances.run_instances`): (exit code,
    the summary on success, the reason it stopped otherwise)."""
    try:
        summary = trainer.train(app, cfg, dist, output_dir, resume=args.resume, measure_peak=args.measure_peak,
                        force=args.force, stop_request=stop_request, gate=gate)
    except Preempted as exc:
        if dist.is_root:
            print(f"preempted: {exc}; rerun with --resume (exit {EXIT_PREEMPTED})", file=sys.stderr, flush=True)
        return EXIT_PREEMPTED, None, f"preempted: {exc}"
    except NonFiniteLoss as exc:
        outcome = nonfinite_outcome(exc, output_dir) if dist.is_root else None
        if dist.is_root:
            print(f"error: {exc}; {outcome} (check the data with python -m common.tools.check_data, or lower the "
                  "learning rate)", file=sys.stderr, flush=True)
        else:
            print(f"error: rank {dist.rank}: {exc}", file=sys.stderr, flush=True)
        return EXIT_NONFINITE, None, f"{exc}; {outcome}" if outcome else str(exc)
    except UserInputError:
        raise
    except KeyboardInterrupt:
        # Ctrl-C: the attempt is recorded as interrupted and a refused claim undone (trainer.train); one line
        # instead of the traceback of wherever the signal landed, and the shell's code for SIGINT
        if dist.is_root:
            print(f"interrupted (Ctrl-C); {output_dir}: a rerun with --resume continues from the newest checkpoint "
                  "there, if the run had written one (exit 130)", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED, None, "interrupted (Ctrl-C)"
    except Exception as exc:
        traceback.print_exc()
        print(f"error: rank {dist.rank} of {dist.size} failed: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)
        return EXIT_FAILURE, None, f"{type(exc).__name__}: {exc}"
    return 0, summary, None
