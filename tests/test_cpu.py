"""The kernel set TensorFlow runs: oneDNN asked for before TensorFlow loads, the user's choice wins,
and the fast layers train with either set."""

import json
import pathlib
import subprocess
import sys

import pytest

from common.commands import every_command
from conftest import REPO, python_env

# Every module a user runs with ``python -m``: the declared commands (common/commands.py; tests/test_contract.py
# holds every __main__ to a declaration).
ENTRY_POINTS = sorted(command.module for command in every_command())

# Records TF_ENABLE_ONEDNN_OPTS at the moment TensorFlow (or Keras, which loads it) is first imported.
# With "stop", that import is cut short there (the test needs no more, and it saves TensorFlow's start-up).
PROBE = """
import importlib, json, os, sys
module, stop = sys.argv[1], sys.argv[2] == "stop"
seen = {"at_import": "never imported"}
class Stop(Exception):
    pass
class Probe:
    def find_spec(self, name, path=None, target=None):
        if name in ("tensorflow", "keras") and seen["at_import"] == "never imported":
            seen["at_import"] = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
            if stop:
                raise Stop
sys.meta_path.insert(0, Probe())
try:
    importlib.import_module(module)
except Stop:
    pass
seen["after_import"] = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
if not stop:
    from common.console.cpu import describe
    seen.update(describe())
print(json.dumps(seen))
"""


def probe(module: str, stop: bool = False, **variables) -> dict:
    env = python_env()
    env.pop("TF_ENABLE_ONEDNN_OPTS", None)
    env.pop("HPC_DL_SUITE_SET_ONEDNN", None)
    env.update(variables)
    result = subprocess.run([sys.executable, "-c", PROBE, module, "stop" if stop else "run"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_entry_points_are_all_found():
    assert {"cosmoflow.train", "cosmoflow.mock", "climate_seg.cam5.stats", "climate_seg.cam5.convert", "common.tools.bench",
            "common.tools.check_data", "common.tools.slurm", "hep_cnn.evaluate"} <= set(ENTRY_POINTS)


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_entry_points_ask_for_onednn_before_tensorflow_loads(module):
    facts = probe(module, stop=True)
    # Set before TensorFlow loads (it reads the variable then), or, for a module that does not load it
    # on import, set by the time it could.
    assert facts["at_import"] in ("1", "never imported") and facts["after_import"] == "1"


def test_the_suite_turns_onednn_on():
    facts = probe("cosmoflow.train")
    assert facts["onednn"] is True and facts["onednn_setting"] == "suite: TF_ENABLE_ONEDNN_OPTS=1"


@pytest.mark.parametrize("value,on", [("0", False), ("1", True)])
def test_the_users_setting_wins(value, on):
    facts = probe("cosmoflow.train", TF_ENABLE_ONEDNN_OPTS=value)
    assert facts["at_import"] == value
    assert facts["onednn"] is on and facts["onednn_setting"] == f"user: TF_ENABLE_ONEDNN_OPTS={value}"


def test_cpu_facts_match_lscpu():
    facts = probe("common.console.cpu")
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next(line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name"))
    flags = set(next(line.split(":", 1)[1].split() for line in lscpu.splitlines() if line.startswith("Flags")))
    assert facts["cpu_model"] == model
    assert facts["isa"] == {flag: flag in flags for flag in facts["isa"]}


@pytest.mark.parametrize("onednn", ["0", "1"])
def test_the_layer_tests_pass_with_either_kernel_set(onednn):
    """tests/test_layers.py again, in a process whose TensorFlow runs Eigen's kernels (0) or oneDNN's (1)."""
    env = python_env({"TF_ENABLE_ONEDNN_OPTS": onednn})
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             str(pathlib.Path("tests") / "test_layers.py")], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:]
