"""Old module paths (common/_moved.py's table, served by one import finder): for one release each still imports,
giving the new module, and each old ``python -m`` command runs the new one with the same arguments and exit code;
both say where the module went with a warning Python shows by default.  ``--help`` on an old command still loads
no TensorFlow."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import pytest

from conftest import REPO, python_env
from test_docs import moved_modules

from common import _moved

SHIMS = moved_modules()
# Those run as commands: the new module has a __main__ block.
COMMANDS = sorted(old for old, new in SHIMS.items()
                  if 'if __name__ == "__main__":' in (REPO / (new.replace(".", "/") + ".py")).read_text())


def _run(args, cwd=REPO) -> subprocess.CompletedProcess:
    # Python's default warning filters: nothing asked of them from outside.
    env = {key: value for key, value in python_env().items() if key != "PYTHONWARNINGS"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _users_script(lines: list[str], folder) -> subprocess.CompletedProcess:
    """``lines`` run as a user's script in ``folder`` (as scripts are run: Python's default warning filters)."""
    script = folder / "users_script.py"
    script.write_text("\n".join(lines) + "\n")
    result = _run([str(script)], cwd=folder)
    assert result.returncode == 0, result.stderr
    return result


def test_the_old_paths_users_had_are_kept():
    # The ones the issue names, and every common/ module that moved into a subpackage (git log --diff-filter=R).
    named = {"common.bench", "common.scaling", "common.check_data", "common.optimizers"}
    moved_into_subpackages = {f"common.{name}" for name in (
        "batch_norm", "flops", "layers", "metrics", "optimizers", "precision", "schedules", "callbacks", "mlperf",
        "preemption", "reliability", "checkpoint", "data", "outputs", "plots", "tfrecord", "cpu", "logs",
        "progress", "quiet", "bench", "check_data", "scaling", "slurm")}
    assert named | moved_into_subpackages <= set(SHIMS)
    assert {"common.bench", "common.scaling", "common.check_data", "common.slurm"} <= set(COMMANDS)


def test_each_old_path_is_served_by_the_table_alone_and_each_new_path_is_a_module():
    # No file or folder left at an old path (the finder answers only where no file does: one would shadow the
    # table's line), and every new path a module of the suite.
    for old, new in SHIMS.items():
        old_path, new_path = REPO / old.replace(".", "/"), REPO / new.replace(".", "/")
        assert not old_path.with_suffix(".py").exists() and not old_path.is_dir(), old
        assert new_path.with_suffix(".py").is_file(), f"{old} -> {new}: no such module"


def test_removal_release_is_the_one_after_the_version():
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    major, minor = (int(part) for part in version.split(".")[:2])
    assert _moved.REMOVED_IN == f"{major}.{minor + 1}.0", (version, _moved.REMOVED_IN)
    assert f"removed in the release after {major}.{minor}.x, {_moved.REMOVED_IN}" in \
        " ".join((REPO / "docs" / "engine.md").read_text().split())


def test_old_imports_warn_once_and_give_the_new_module(tmp_path):
    # A user's script, run as scripts are: each old import warns once, by default, at the script's own line,
    # naming the new path; a second import of the same old path says nothing more; the old name is the new
    # module itself.
    lines = [f"from {old.rpartition('.')[0]} import {old.rpartition('.')[2]}" for old in SHIMS]
    lines += [f"import {old}" for old in SHIMS]
    lines += ["import sys",
              f"pairs = {sorted(SHIMS.items())!r}",
              "print(all(sys.modules[old] is sys.modules[new] for old, new in pairs))",
              "import common, common.nn.optimizers",
              "print(common.optimizers is common.nn.optimizers, common.optimizers.LARS is common.nn.optimizers.LARS)"]
    result = _users_script(lines, tmp_path)
    script = tmp_path / "users_script.py"
    assert result.stdout.split() == ["True", "True", "True"]
    warnings = [line for line in result.stderr.splitlines() if "FutureWarning" in line]
    expected = [f"{script}:{number}: FutureWarning: {old} moved to {new}; import it from there (the old path is "
                f"removed in {_moved.REMOVED_IN})" for number, (old, new) in enumerate(SHIMS.items(), start=1)]
    assert warnings == expected, result.stderr


def test_names_that_left_a_split_module_are_served_from_their_home_with_the_warning(tmp_path):
    """The storage hubs split along their concepts (0.1.x): every name that left a module that stays still reads
    from it (and so from its old path), the very object of its new home, with a warning naming both; any other
    missing name is the AttributeError Python gives."""
    lines = ["import importlib, warnings", "warnings.simplefilter('always')", "ok = []"]
    for module, names in _moved.MOVED_NAMES.items():
        for name, home in names.items():
            home, new_name = home if isinstance(home, tuple) else (home, name)
            lines.append(f"ok.append(getattr(importlib.import_module({module!r}), {name!r}) is "
                         f"getattr(importlib.import_module({home!r}), {new_name!r}))")
    lines += ["from common.data import stage_files", "from common.outputs import RunDirLock",
              "import common.storage.data",
              "try:\n    common.storage.data.no_such_name\nexcept AttributeError as error:\n    print(error)",
              "print(all(ok), len(ok))"]
    result = _users_script(lines, tmp_path)
    count = sum(len(names) for names in _moved.MOVED_NAMES.values())
    assert result.stdout.split("\n")[:2] == ["module 'common.storage.data' has no attribute 'no_such_name'",
                                             f"True {count}"], result.stdout
    assert ("FutureWarning: common.storage.data.stage_files moved to common.storage.staging.stage_files; import it "
            f"from there (the old name is removed in {_moved.REMOVED_IN})") in result.stderr
    assert "common.storage.data.expand_environment moved to common.storage.staging.expand_stage_dir" in result.stderr


@pytest.mark.parametrize("old", COMMANDS)
def test_old_command_help_answers_with_the_warning_and_no_tensorflow(old):
    new = SHIMS[old]
    # -X importtime: every module the process imports, on standard error.
    result = _run(["-X", "importtime", "-m", old, "--help"])
    assert result.returncode == 0, result.stderr
    assert f"usage: python -m {new}" in result.stdout
    assert f"FutureWarning: `python -m {old}` is now `python -m {new}`" in result.stderr
    imported = [line.rpartition("|")[2].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:")]
    assert "common._moved" in imported                                   # the check sees the imports
    assert not [name for name in imported if re.match(r"(tensorflow|keras)\b", name)]


def test_old_command_passes_its_arguments_and_exit_code():
    # A config that is not there: the new command's one-line error naming the path, and its exit 2
    # (through common.cli.exit_process, which leaves by os._exit).
    missing = "configs/no-such-config.yaml"
    old = _run(["-m", "common.check_data", "--config", missing])
    new = _run(["-m", "common.tools.check_data", "--config", missing])
    assert (old.returncode, new.returncode) == (2, 2)
    assert old.stdout == new.stdout
    warning, *old_error = old.stderr.splitlines()
    assert warning == (f"<python -m common.check_data>:1: FutureWarning: `python -m common.check_data` is now "
                       f"`python -m common.tools.check_data`; the old name is removed in {_moved.REMOVED_IN}")
    assert old_error == new.stderr.splitlines() == [f"error: {missing}: config file not found"]
    # An argument the command does not know: argparse's exit 2 through SystemExit.
    assert _run(["-m", "common.scaling", "--no-such-option"]).returncode == 2
