"""One contract, every command: the same hostile cases against every command the suite declares
(common/commands.py), so that a new command gets the promises from its first commit.

- Every module with a ``__main__`` is declared, and every declaration has a recipe here (a tiny working
  invocation) or a stated reason why its outputs are held elsewhere: an undeclared entry point fails.
- ``--help`` answers without TensorFlow, for every command, in one process (runpy, as ``python -m`` runs them).
- Every numeric option is one of common/cli.py's typed arguments: 0, a negative number and nan are refused
  exactly where the option's meaning excludes them (nan always), by argparse, before any work.
- What a command writes, by its declared shape (common/storage/transaction.py): an output folder of another
  kind, application or producer and a user's file at an output name are refused (exit 2, one line naming it,
  the folder tree as it was); a failure injected after some outputs are written, SIGINT and SIGTERM at
  start-up, mid-work and at the commit leave the tree as found (or, at the commit, complete), with one line and
  the shell's code; a NaN in any value written is exit 3 naming the input; a dangling link and a folder among
  the inputs are refused by the one listing.

The commands run in this process (``common.cli.run_command``, what every ``__main__`` calls), the process
boundary being what the console tests and each application's own tests hold; the faults come through the
transaction's fault points (``common.storage.transaction.fault_hook``).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import math
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import h5py
import numpy as np
import pytest

from common import registry
from common.cli import NUMBER_TYPES
from common.commands import every_command
from common.storage import outputs, run_dirs, transaction
from conftest import REPO, python_env, run_here, run_python, tiny_cosmo_overrides, tree_contents

COMMANDS = {command.module: command for command in every_command()}
DEMO = str(REPO / "configs/cosmoflow/demo.yaml")


# -- every entry point declared ------------------------------------------------------------------------------

def entry_points() -> set[str]:
    """The modules of the suite's packages (the engine's and every registered application's) that run as a
    command: a ``__main__`` block (the moved modules' old paths, common/_moved.py, run the new module: no block)."""
    found = set()
    for package in ("common", *registry.names()):
        for path in (REPO / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            if any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body):
                found.add(".".join(path.relative_to(REPO).with_suffix("").parts))
    return found


def test_every_entry_point_is_declared_and_has_a_recipe():
    declared = set(COMMANDS)
    assert entry_points() - declared == set(), "commands not declared in common/commands.py or an application"
    assert declared - entry_points() == set(), "declared commands without a __main__"
    covered = {key.split(" ")[0] for key in RECIPES} | set(HELD_ELSEWHERE)
    writers = {module for module, command in COMMANDS.items() if command.writes}
    assert writers - covered == set(), "a command that writes has no recipe here (nor a stated reason)"


# -- --help without TensorFlow ---------------------------------------------------------------------------------

def test_help_answers_without_tensorflow():
    """Each command's ``python -m <module> --help``, in one process: the usage printed, exit 0, and no
    TensorFlow (nor Keras, Horovod's TensorFlow half) imported by any of them."""
    code = ("import contextlib, io, runpy, sys\n"
            "import common.cli\n"
            "common.cli.exit_process = lambda code: (_ for _ in ()).throw(SystemExit(code))\n"
            f"for module in {sorted(COMMANDS)!r}:\n"
            "    sys.argv = [module, '--help']\n"
            "    out = io.StringIO()\n"
            "    try:\n"
            "        with contextlib.redirect_stdout(out):\n"
            "            runpy.run_module(module, run_name='__main__', alter_sys=True)\n"
            "    except SystemExit as exc:\n"
            "        assert exc.code in (0, None), (module, exc.code)\n"
            "    assert 'usage' in out.getvalue().lower(), (module, out.getvalue()[:300])\n"
            "    loaded = [m for m in ('tensorflow', 'keras', 'horovod.tensorflow') if m in sys.modules]\n"
            "    assert not loaded, (module, loaded)\n"
            "print('help ok')\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=python_env(), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("help ok"), result.stderr[-3000:]


# -- numbers on the command line --------------------------------------------------------------------------------

def parsers_of(parser: argparse.ArgumentParser):
    """The parser and each of its sub-commands' parsers."""
    yield parser, []
    for action in parser._actions:   # argparse keeps its sub-parsers there only
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield sub, [name]


def required_argv(parser: argparse.ArgumentParser, prefix: list[str], skip) -> list[str]:
    """Values for every required option and positional but ``skip`` (a name for each, or the first choice)."""
    argv = list(prefix)
    for action in parser._actions:
        if action is skip or isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        value = str(list(action.choices)[0]) if action.choices else "1"
        count = action.nargs if isinstance(action.nargs, int) else 1
        if not action.option_strings:
            argv += [value] * count
        elif action.required:
            argv += [action.option_strings[0], *[value] * count]
    return argv


def numeric_options():
    for module, command in sorted(COMMANDS.items()):
        if command.parser is None:
            continue
        for parser, prefix in parsers_of(command.parser()):
            for action in parser._actions:
                if action.type in (int, float):
                    yield module, prefix, action, parser
                elif action.type is not None and getattr(action.type, "admits", None) is not None:
                    yield module, prefix, action, parser


def test_every_numeric_option_is_typed_and_refuses_zero_negative_and_nan(capsys):
    checked = 0
    for module, prefix, action, parser in numeric_options():
        where = f"{module} {' '.join(prefix)} {action.option_strings or action.dest}"
        assert action.type in NUMBER_TYPES or action.type.__name__ == "fraction_argument", \
            f"{where}: a bare {getattr(action.type, '__name__', action.type)}; use a typed argument of common/cli.py"
        for text in ("0", "-1", "nan", "inf"):
            value = float(text)
            admitted = math.isfinite(value) and action.type.admits(value)
            name = action.option_strings[0] if action.option_strings else None
            given = [name, text] if name else [text]
            count = action.nargs if isinstance(action.nargs, int) else 1
            if count > 1:
                given = ([name] if name else []) + [text] * count
            argv = required_argv(parser, [], skip=action)
            argv = [*prefix, *(given if name else []), *argv, *([] if name else given)]
            top = COMMANDS[module].parser()
            try:
                top.parse_args(argv)
                refused = False
            except SystemExit as exc:
                refused = exc.code == 2
            message = capsys.readouterr().err
            assert refused != admitted, (where, text, argv, message[-300:])
            if refused:
                assert (name or action.dest) in message or (action.metavar or "") in message, (where, message)
        checked += 1
    assert checked >= 20   # the suite's count, a floor: the walk found the options


# -- what a command writes ---------------------------------------------------------------------------------------

@dataclasses.dataclass
class Recipe:
    """A tiny working invocation of a command: its arguments, the outputs a complete run leaves, the folder they
    go in (whose tree each case compares), and where the sample inputs are (for the bad-input case)."""

    argv: list[str]
    outputs: list[pathlib.Path]
    home: pathlib.Path
    samples: pathlib.Path | None = None   # a folder of samples given as an input: a dangling link put in it
    pattern: str = ""                      # ... named like its samples
    nonfinite: bool = True                 # writes numbers (a NaN among them must be refused)
    claims_folder: bool = False            # its outputs go into a folder of the suite's it claims
    write_once: bool = False               # its output is never replaced (a manifest): removed before a rerun
    shape: str = ""                        # how what it names is written, where its declaration has several


# Commands that write, whose outputs the recipes below do not run, and why.
HELD_ELSEWHERE = {
    "common.tools.sysbench": "a job of one rank per node on 2 nodes or more: tests/test_multinode.py runs it on the "
                             "virtual cluster (its --out is checked by the same transaction before it measures)",
}


class Env:
    """What the recipes run on, built at first use: tiny datasets and trained, evaluated runs."""

    def __init__(self, root: pathlib.Path, cosmo_data: pathlib.Path):
        self.root, self.cosmo_data = root, cosmo_data

    @functools.cached_property
    def cosmo_run(self) -> pathlib.Path:
        run = self.root / "cosmo-run"
        run_python(["-m", "cosmoflow.train", "--config", DEMO, *tiny_cosmo_overrides(self.cosmo_data, epochs=1),
                    "--output-dir", str(run)])
        run_python(["-m", "cosmoflow.evaluate", "--run-dir", str(run)])
        return run

    def hep_arguments(self, data) -> list[str]:
        pairs = {"data.data_dir": str(data), "data.derived_dir": str(self.root / "hep-derived"),
                 "data.image_size": "8", "data.batch_size": "16", "data.synth.generate_if_missing": "false",
                 "model.conv_units": "1", "model.filters": "2", "model.dense_units": "4", "train.epochs": "1",
                 "train.tensorboard": "false"}
        return ["--config", "configs/hep_cnn/demo.yaml",
                *[arg for key, value in pairs.items() for arg in ("--set", f"{key}={value}")]]

    def climate_arguments(self, data) -> list[str]:
        pairs = {"data.data_dir": str(data), "data.grid": "[16, 32]", "data.batch_size": "2",
                 "data.synth.generate_if_missing": "false", "model.name": "tiramisu",
                 "model.tiramisu.growth_rate": "2", "model.tiramisu.first_filters": "4",
                 "model.tiramisu.kernel_size": "3", "model.tiramisu.down_blocks": "[1, 1]",
                 "model.tiramisu.up_blocks": "[1, 1]", "train.epochs": "1", "train.tensorboard": "false"}
        return ["--config", "configs/climate_seg/demo_tiramisu.yaml",
                *[arg for key, value in pairs.items() for arg in ("--set", f"{key}={value}")]]

    @functools.cached_property
    def hep(self) -> tuple[pathlib.Path, pathlib.Path]:
        from hep_cnn.synth import generate_dataset

        data = generate_dataset(self.root / "hep-data", 32, 32, 32, 8, events_per_file=16, seed=5, progress=False)
        run = self.root / "hep-run"
        run_python(["-m", "hep_cnn.train", *self.hep_arguments(data), "--output-dir", str(run)])
        run_python(["-m", "hep_cnn.evaluate", "--run-dir", str(run)])
        return data, run

    @functools.cached_property
    def climate(self) -> tuple[pathlib.Path, pathlib.Path, list[pathlib.Path]]:
        from climate_seg.cam5.config import SynthSection
        from climate_seg.cam5.convert import convert
        from climate_seg.cam5.stats import compute_stats, write_stats
        from climate_seg.cam5.synth import generate_dataset

        data = self.root / "climate-data"
        synth = SynthSection(grid=(16, 32), n_train=2, n_validation=2, n_test=1, steps_per_file=2, seed=11)
        netcdf = generate_dataset(data / "netcdf", synth, progress=False)
        for split, paths in netcdf.items():
            convert([str(p) for p in paths], data / split)
        write_stats(data / "stats.h5", compute_stats(sorted(str(p) for p in (data / "train").glob("*.h5"))))
        run = self.root / "climate-run"
        run_python(["-m", "climate_seg.train", *self.climate_arguments(data), "--output-dir", str(run)])
        run_python(["-m", "climate_seg.evaluate", "--run-dir", str(run)])
        return data, run, sorted(netcdf["test"])


    @functools.cached_property
    def detection(self) -> tuple[pathlib.Path, pathlib.Path]:
        """A tiny 2D detection run (its synthetic ExtremeWeather-layout data generated by the training)."""
        data, run = self.root / "detection-data", self.root / "detection-run"
        pairs = {"data.data_dir": str(data), "data.grid": "[16, 32]", "data.synth.grid": "[16, 32]",
                 "data.synth.n_train": "8", "data.synth.n_validation": "4", "data.synth.n_test": "4",
                 "data.synth.samples_per_file": "4", "data.synth.unlabeled_every": "0", "data.batch_size": "4",
                 "data.labeled_per_batch": "2", "data.labeled_fraction": "0.5", "model.filters": "[2, 4]",
                 "train.epochs": "1", "train.tensorboard": "false"}
        run_python(["-m", "climate_seg.train", "--config", "configs/climate_seg/demo_detect.yaml", "--output-dir",
                    str(run), *[arg for key, value in pairs.items() for arg in ("--set", f"{key}={value}")]])
        return data, run


@pytest.fixture(scope="module")
def env(tmp_path_factory, tiny_cosmo_data) -> Env:
    return Env(tmp_path_factory.mktemp("contract"), tiny_cosmo_data)


def copied(run: pathlib.Path, tmp: pathlib.Path) -> pathlib.Path:
    """A copy of a shared run (a case may write into it)."""
    target = tmp / run.name
    shutil.copytree(run, target, symlinks=True)
    return target


def samples_folder(files, tmp: pathlib.Path, name: str = "inputs") -> pathlib.Path:
    folder = tmp / name
    folder.mkdir()
    for path in files:
        shutil.copy(path, folder / pathlib.Path(path).name)
    return folder


def cosmo_predict(env, tmp):
    run = copied(env.cosmo_run, tmp)
    inputs = samples_folder(sorted((env.cosmo_data / "validation").glob("*.tfrecord"))[:2], tmp)
    out = tmp / "nested" / "out"
    return Recipe(["--run-dir", str(run), "--input", str(inputs), "--out", str(out)],
                  [out / "predictions.json"], out, samples=inputs, pattern="x.tfrecord", claims_folder=True)


def hep_predict(env, tmp):
    data, run = env.hep
    run = copied(run, tmp)
    inputs = samples_folder(sorted(data.glob("test_*.h5"))[:1], tmp)
    out = tmp / "out"
    return Recipe(["--run-dir", str(run), "--input", str(inputs), "--out", str(out)],
                  [out / "predictions.json"], out, samples=inputs, pattern="x.h5", claims_folder=True)


def climate_predict(env, tmp):
    data, run, netcdf = env.climate
    run = copied(run, tmp)
    inputs = samples_folder(netcdf[:1], tmp)
    out = tmp / "out"
    return Recipe(["--run-dir", str(run), "--input", str(inputs), "--out", str(out)],
                  [out / "predictions.json"], out, samples=inputs, pattern="x.nc", claims_folder=True)


def detection_predict(env, tmp):
    data, run = env.detection
    run = copied(run, tmp)
    inputs = samples_folder(sorted((data / "test").glob("*.h5"))[:1], tmp)
    out = tmp / "out"
    return Recipe(["--run-dir", str(run), "--input", str(inputs), "--out", str(out)],
                  [out / "predictions.json"], out, samples=inputs, pattern="x.h5", claims_folder=True)


def evaluate_recipe(run_of, outputs_):
    def recipe(env, tmp):
        run = copied(run_of(env), tmp)
        return Recipe(["--run-dir", str(run)], [run / name for name in outputs_], run)
    return recipe


def train_recipe(package: str):
    def recipe(env, tmp):
        out = tmp / "runs" / "run"
        if package == "cosmoflow":
            argv = ["--config", DEMO, *tiny_cosmo_overrides(env.cosmo_data, epochs=1)]
        elif package == "hep_cnn":
            argv = env.hep_arguments(env.hep[0])
        else:
            argv = env.climate_arguments(env.climate[0])
        # (a NaN loss, gradient or weight is the training's own stop, exit 3: tests/test_faults.py)
        return Recipe([*argv, "--output-dir", str(out)], [out / "config.yaml"], out, claims_folder=True,
                      nonfinite=False)
    return recipe


def mock_recipe(env, tmp):
    out = tmp / "mock"
    return Recipe(["--config", DEMO, "--out", str(out), "--n-train", "2", "--n-validation", "1", "--size", "8",
                   "--workers", "1"], [out / "train", out / "validation"], out, nonfinite=False)


def hep_synth_recipe(env, tmp):
    out = tmp / "events"
    return Recipe(["--config", "configs/hep_cnn/demo.yaml", "--out", str(out), "--n-train", "4", "--n-validation",
                   "4", "--n-test", "4", "--image-size", "8"], [out], out, nonfinite=False)


def climate_synth_recipe(env, tmp):
    out = tmp / "fields"
    return Recipe(["--out", str(out), "--grid", "8", "16", "--n-train", "1", "--n-validation", "1", "--n-test", "1",
                   "--steps-per-file", "1"], [out / "train"], out, nonfinite=False)


def subset_recipe(data_of, n: str = "1"):
    def recipe(env, tmp):
        out = tmp / "subset"
        return Recipe(["subset", "--from", str(data_of(env)), "--to", str(out), "--n", n, "--seed", "0"], [out],
                      out, nonfinite=False)
    return recipe


def manifest_recipe(env, tmp):
    out = tmp / "lists" / "data.sha256"
    return Recipe(["manifest", "--from", str(env.cosmo_data), "--out", str(out), "--no-progress"], [out],
                  out.parent, nonfinite=False, write_once=True)


def information_recipe(env, tmp):
    out = tmp / "bounds.json"
    return Recipe(["--config", DEMO, "--set", f"data.data_dir={env.cosmo_data}", "--set",
                   "data.sample_shape=[16, 16, 16, 4]", "--set", "data.mock.box_size_mpc_h=128", "--fisher-only",
                   "--json", str(out)], [out], tmp)


def learning_curve_recipe(env, tmp):
    run = copied(env.cosmo_run, tmp)
    information = tmp / "information.json"
    curve = {"16": {name: {"ratio_mean": 0.9, "ratio_std": 0.05} for name in ("Omega_m", "sigma_8", "n_s", "H0")}}
    transaction.write_json_file(information, {"grid": 16, "box_size_mpc_h": 128.0,
                                              "data_dir": str(env.cosmo_data.resolve()),
                                              "learning_curve": {"power": curve}}, "cosmoflow.information")
    out = tmp / "figures" / "curve.png"
    return Recipe(["--information", str(information), "--series", "plain", str(run), "--out", str(out), "--json",
                   str(tmp / "figures" / "curve.json")], [out, tmp / "figures" / "curve.json"], tmp / "figures")


def convert_recipe(env, tmp):
    _, _, netcdf = env.climate
    inputs = samples_folder(netcdf[:1], tmp)
    out = tmp / "samples"
    return Recipe(["--input", str(inputs), "--out", str(out)], [out], out, samples=inputs, pattern="x.nc")


def stats_recipe(env, tmp):
    data, _, _ = env.climate
    inputs = samples_folder(sorted((data / "train").glob("*.h5")), tmp)
    out = tmp / "derived" / "stats.h5"
    return Recipe([str(inputs), "--out", str(out)], [out], out.parent, samples=inputs, pattern="x.h5")


def maxima_recipe(env, tmp):
    data, _ = env.hep
    derived = tmp / "derived"
    return Recipe(["--config", "configs/hep_cnn/demo.yaml", "--set", f"data.data_dir={data}", "--set",
                   f"data.derived_dir={derived}", "--set", "data.image_size=8"],
                  [derived / "channel_maxima.json"], derived)


def bench_recipe(env, tmp):
    out = tmp / "results" / "bench.json"
    return Recipe(["--config", DEMO, *tiny_cosmo_overrides(env.cosmo_data), "--steps", "1", "--json", str(out)],
                  [out], out.parent, shape="file")


def bench_profile_recipe(env, tmp):
    out = tmp / "trace"
    return Recipe(["--config", DEMO, *tiny_cosmo_overrides(env.cosmo_data), "--steps", "1", "--profile", str(out)],
                  [out / "rank0"], out, nonfinite=False, claims_folder=True)


def scaling_recipe(env, tmp):
    out = tmp / "figures" / "scaling.png"
    return Recipe(["--config", DEMO, "--system", "configs/systems/perlmutter.yaml", "--samples-per-second", "10",
                   "--nodes", "1,2", "--png", str(out)], [out], out.parent, nonfinite=False)


RECIPES = {
    "cosmoflow.train": train_recipe("cosmoflow"),
    "hep_cnn.train": train_recipe("hep_cnn"),
    "climate_seg.train": train_recipe("climate_seg"),
    "cosmoflow.evaluate": evaluate_recipe(lambda env: env.cosmo_run, ["metrics.json", "predictions.npz"]),
    "hep_cnn.evaluate": evaluate_recipe(lambda env: env.hep[1], ["metrics.json"]),
    "climate_seg.evaluate": evaluate_recipe(lambda env: env.climate[1], ["metrics.json"]),
    "cosmoflow.predict": cosmo_predict,
    "hep_cnn.predict": hep_predict,
    "climate_seg.predict": climate_predict,
    "climate_seg.predict detection": detection_predict,
    "cosmoflow.mock": mock_recipe,
    "hep_cnn.synth": hep_synth_recipe,
    "climate_seg.cam5.synth": climate_synth_recipe,
    "cosmoflow.data subset": subset_recipe(lambda env: env.cosmo_data),
    "cosmoflow.data manifest": manifest_recipe,
    "hep_cnn.data subset": subset_recipe(lambda env: env.hep[0], n="2"),
    "climate_seg.cam5.data subset": subset_recipe(lambda env: env.climate[0]),
    "cosmoflow.information": information_recipe,
    "cosmoflow.learning_curve": learning_curve_recipe,
    "climate_seg.cam5.convert": convert_recipe,
    "climate_seg.cam5.stats": stats_recipe,
    "hep_cnn.maxima": maxima_recipe,
    "common.tools.bench": bench_recipe,
    "common.tools.bench --profile": bench_profile_recipe,
    "common.tools.scaling": scaling_recipe,
}


def shape_of(key: str) -> str:
    """How the recipe's command writes what the recipe names: run, folder, contribution, file or generated."""
    module = key.split(" ")[0]
    if key.endswith("subset"):
        return "generated"
    if key.endswith("manifest"):
        return "file"
    if key.endswith(("--profile", "detection")):
        return "folder"
    shapes = [output.shape for output in COMMANDS[module].writes]
    return next(shape for shape in ("run", "folder", "contribution", "generated", "file") if shape in shapes)


class Refused(Exception):
    pass


def invoke(key: str, recipe: Recipe, capsys, extra=()) -> tuple[int, list[str], str]:
    """The command in this process, as its ``__main__`` runs it: (exit code, its one-line messages, stderr)."""
    module = key.split(" ")[0]
    result = run_here(["-m", module, *recipe.argv, *extra], capsys)
    said = [line for line in result.stderr.splitlines() if line.startswith(("error:", "interrupted", "terminated"))]
    return result.returncode, said, result.stderr


def one_line(code: int, expected: int, said: list[str], err: str, *words) -> str:
    """The exit code expected, and the last of the command's message lines holding every one of ``words``; for
    anything but a failure (1: its traceback, then the line), that one line and no traceback."""
    assert code == expected, (code, expected, err[-3000:])
    assert said, err[-3000:]
    if expected != 1:
        assert len(said) == 1 and "Traceback" not in err, err[-3000:]
    line = said[-1]
    assert all(word in line for word in words), (words, line)
    return line


def hook_at(phase: str, action, which: int = 1, acted: list | None = None):
    """A fault hook acting at the ``which``-th call of ``phase`` (the first that ``action`` acts on, for an action
    that says whether it did: :func:`poison`); ``acted`` records each act."""
    seen = []

    def hook(at, what):
        if at == phase and (acted is None or not acted):
            seen.append(what)
            if len(seen) >= which:
                done = action(what)
                if acted is not None and done:
                    acted.append(what)
    return hook


def raise_injected(what):
    raise RuntimeError("injected failure")


def send(signum):
    def action(what):
        os.kill(os.getpid(), signum)
    return action


def poison(what) -> bool:
    """A NaN into the first floating-point number of the values about to be written (a JSON payload, CSV rows,
    arrays), or of the first floating-point dataset of the HDF5 or netCDF file just written; whether there was
    one."""
    if isinstance(what, pathlib.Path):
        if not h5py.is_hdf5(what):
            return False
        with h5py.File(what, "r+") as handle:
            names = []
            handle.visititems(lambda name, item: names.append(name) if isinstance(item, h5py.Dataset)
                              and item.dtype.kind == "f" and item.size and item.shape else None)
            if not names:
                return False
            dataset = handle[names[0]]
            dataset[(0,) * dataset.ndim] = np.nan
            return True
    items = what.items() if isinstance(what, dict) else enumerate(what) if isinstance(what, list) else ()
    for key, value in list(items):
        if isinstance(value, float):
            what[key] = float("nan")
            return True
        if isinstance(value, np.ndarray) and value.dtype.kind == "f" and value.size:
            value.reshape(-1)[0] = np.nan
            return True
        if isinstance(value, (dict, list)) and poison(value):
            return True
    return False


@pytest.fixture()
def hook():
    def set_hook(function):
        transaction.fault_hook = function
    yield set_hook
    transaction.fault_hook = None


@pytest.mark.slow   # (4 tiny trainings for its recipes, then each command about 8 times)
@pytest.mark.parametrize("key", sorted(RECIPES))
def test_every_command_holds_the_output_contract(key, env, tmp_path, capsys, hook):
    recipe = RECIPES[key](env, tmp_path)
    shape = recipe.shape or shape_of(key)
    complete_code = 0

    # A failure injected after some outputs are written, SIGINT mid-work, a NaN: the tree as found.
    faults = [("staged", raise_injected, 1, ["injected failure"]),
              ("staged", send(signal.SIGINT), 130, ["interrupted (Ctrl-C)"])]
    if shape not in ("run", "generated"):
        faults.append(("commit", raise_injected, 1, ["injected failure"]))
    if shape == "run":
        faults = [("claimed", raise_injected, 1, ["injected failure"]),
                  ("claimed", send(signal.SIGINT), 130, ["interrupted (Ctrl-C)"])]
    if recipe.nonfinite and shape != "run":
        faults.append(("payload", poison, 3, ["NaN or an infinity", "nothing was written"]))
        faults.append(("written", poison, 3, ["NaN or an infinity"]))
    faults.append(("start", send(signal.SIGTERM), 143, ["terminated (SIGTERM)"]))
    poisoned = []
    for phase, action, expected, words in faults:
        before = tree_contents(tmp_path)
        acted = [] if action is poison else None
        hook(hook_at(phase, action, acted=acted))
        code, said, err = invoke(key, recipe, capsys)
        hook(None)
        if acted is not None and not acted:   # no value of that kind written (figures only, no HDF5 file)
            assert code == 0, err[-3000:]
            continue
        poisoned += acted or []
        one_line(code, expected, said, err, *words)
        assert tree_contents(tmp_path) == before, (key, phase, code, err[-2000:])
    assert poisoned or not recipe.nonfinite, f"{key}: writes numbers, but none could be made a NaN"

    # Complete, then a SIGTERM at the commit: held back until the outputs are complete.
    code, said, err = invoke(key, recipe, capsys)
    assert code == complete_code, err[-3000:]
    assert all(path.exists() for path in recipe.outputs), (key, recipe.outputs)
    if recipe.claims_folder and shape == "folder":
        marker = outputs.read_run_marker(recipe.home)
        listed = set(marker["files"])
        unlisted = [p.name for p in recipe.home.iterdir() if p.name not in listed and f"{p.name}/" not in listed
                    and p.name not in (outputs.RUN_MARKER, outputs.RUN_LOCK)]
        assert not unlisted, (key, unlisted)
    if shape in ("folder", "contribution", "file"):
        if recipe.write_once:
            for path in recipe.outputs:
                path.unlink()
        hook(hook_at("commit", send(signal.SIGTERM)))
        code, said, err = invoke(key, recipe, capsys)
        hook(None)
        one_line(code, 143, said, err, "terminated (SIGTERM)", "complete")
        assert all(path.exists() for path in recipe.outputs), key

    # A user's file where an output goes: refused, one line naming it, nothing changed.
    target = recipe.outputs[0]
    if shape == "generated":
        users = target if target.is_dir() else target.parent
        shutil.rmtree(recipe.home)
        recipe.home.mkdir(parents=True)
        (recipe.home / "notes.txt").write_text("mine")
        before = tree_contents(tmp_path)
        code, said, err = invoke(key, recipe, capsys)
        one_line(code, 2, said, err, str(recipe.home))
        assert tree_contents(tmp_path) == before, key
        del users
        return
    if shape == "run":
        out = recipe.home
        shutil.rmtree(out)
        out.mkdir(parents=True)
        (out / "config.yaml").write_text("mine")
        before = tree_contents(tmp_path)
        code, said, err = invoke(key, recipe, capsys)
        one_line(code, 2, said, err, str(out))
        assert tree_contents(tmp_path) == before
        # another kind (predictions) and another application's run
        shutil.rmtree(out)
        run_dirs.mark_run_dir(out, "x", kind="predictions", tool="cosmoflow.predict")
        before = tree_contents(tmp_path)
        code, said, err = invoke(key, recipe, capsys)
        one_line(code, 2, said, err, str(out), "predictions")
        assert tree_contents(tmp_path) == before
        shutil.rmtree(out)
        other = "hep_cnn" if not key.startswith("hep_cnn") else "cosmoflow"
        run_dirs.mark_run_dir(out, other, producer=transaction.Producer(f"{other}.train", other).record())
        before = tree_contents(tmp_path)
        code, said, err = invoke(key, recipe, capsys, extra=["--force"])
        one_line(code, 2, said, err, str(out), f"a run of {other}")
        assert tree_contents(tmp_path) == before
        return
    if target.is_dir():   # an output folder: a user's file beside it, in the folder of the suite's
        target = recipe.home / "notes.txt"
    else:
        target.unlink()
    target.write_text("mine")
    before = tree_contents(tmp_path)
    code, said, err = invoke(key, recipe, capsys)
    line = one_line(code, 2, said, err)
    assert str(target) in line or (str(target.parent) in line and target.name in line), (key, line)
    assert tree_contents(tmp_path) == before, key
    target.unlink()

    # A folder of another kind or producer where the outputs go.
    if shape == "folder":
        shutil.rmtree(recipe.home)
        run_dirs.mark_run_dir(recipe.home, "hep_cnn", producer=transaction.Producer("hep_cnn.train", "hep_cnn").record())
        before = tree_contents(tmp_path)
        code, said, err = invoke(key, recipe, capsys)
        one_line(code, 2, said, err, str(recipe.home))
        assert tree_contents(tmp_path) == before, key
    elif shape == "file" and target.suffix == ".json":
        transaction.write_json_file(target, {"other": 1}, "common.tools.bench" if "bench" not in key
                                    else "cosmoflow.information")
        before = tree_contents(tmp_path)
        code, said, err = invoke(key, recipe, capsys)
        one_line(code, 2, said, err, str(target), "written by")
        assert tree_contents(tmp_path) == before, key

    # A dangling link and a folder named like a sample among the inputs: the one listing refuses them.
    if recipe.samples is not None:
        for bad in ("link", "folder"):
            entry = recipe.samples / f"bad-{bad}-{recipe.pattern}"
            if bad == "link":
                entry.symlink_to(tmp_path / "nothing-here")
            else:
                entry.mkdir()
            before = tree_contents(tmp_path)
            code, said, err = invoke(key, recipe, capsys)
            one_line(code, 2, said, err, str(entry))
            assert tree_contents(tmp_path) == before, key
            entry.rmdir() if bad == "folder" else entry.unlink()


# -- at the process boundary ---------------------------------------------------------------------------------------

def test_predict_refuses_an_output_folder_before_tensorflow_loads(tmp_path):
    """Each predict's refusal of a bad --out (a user's folder) comes before TensorFlow is imported: the folder is
    checked before any input is read (here a run of the application's demo config, whose model is never
    opened)."""
    cases = []
    for package, config in (("cosmoflow", "configs/cosmoflow/demo.yaml"), ("hep_cnn", "configs/hep_cnn/demo.yaml"),
                            ("climate_seg", "configs/climate_seg/demo_tiramisu.yaml")):
        run = tmp_path / f"{package}-run"
        run.mkdir()
        shutil.copy(REPO / config, run / "config.yaml")
        (run / "model.keras").write_bytes(b"not opened")
        sample = tmp_path / f"{package}-input.h5"
        sample.write_bytes(b"not read")
        users = tmp_path / f"{package}-mine"
        users.mkdir()
        (users / "notes.txt").write_text("mine")
        cases.append((package, [f"--run-dir={run}", "--input", str(sample), "--out", str(users)], str(users)))
    code = ("import sys\n"
            "from common.cli import run_command\n"
            "from common.commands import declared, main_of\n"
            f"for package, argv, users in {cases!r}:\n"
            "    assert run_command(main_of(declared(f'{package}.predict')), argv) == 2, package\n"
            "    assert 'tensorflow' not in sys.modules, package\n"
            "print('refused before TensorFlow')\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=python_env(), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and "refused before TensorFlow" in result.stdout, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert [users in line and "holds files this suite did not write" in line for _, _, users in cases for line in
            lines if users in line] == [True, True, True], result.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_a_training_starts_is_one_line(tmp_path, tiny_cosmo_data, signum):
    """Ctrl-C or SIGTERM while ``python -m cosmoflow.train`` loads its modules and TensorFlow (sent as soon as the
    process has its scratch folder, which the engine's import makes): one line, the shell's code, no traceback,
    nothing written."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    out = tmp_path / "runs" / "run"
    process = subprocess.Popen([sys.executable, "-m", "cosmoflow.train", "--config", DEMO,
                                *tiny_cosmo_overrides(tiny_cosmo_data), "--output-dir", str(out)], cwd=REPO,
                               env=python_env({"TMPDIR": str(scratch)}), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        deadline = 120.0
        import time

        started = time.monotonic()
        while not any(scratch.glob(f"hpc-dl-suite-scratch-{process.pid}-*")) and process.poll() is None:
            assert time.monotonic() - started < deadline, "the training never made its scratch folder"
            time.sleep(0.01)
        process.send_signal(signum)
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
    said = [line for line in err.splitlines() if line.startswith(("interrupted", "terminated", "error", "preempted"))]
    assert "Traceback" not in err and len(said) == 1, err[-3000:]
    if signum == signal.SIGINT:
        assert process.returncode == 130 and said[0].startswith("interrupted (Ctrl-C)"), err[-3000:]
    else:   # before the trainer's preemption handler: terminated; after it, a preemption (75) at the first step
        assert process.returncode in (143, 75), err[-3000:]
    assert not (tmp_path / "runs").exists() or process.returncode == 75, list((tmp_path / "runs").rglob("*"))
