"""The GPU build's recipe and checks, as far as a machine without a GPU can hold them: the pieces of the recipe
agree (versions, compute capabilities, the switches), the pinned build line is what the installed build says,
scripts/gpu_check.sh refuses a machine without a GPU in its default mode and runs end to end on the CPU in its
small mode, filing the figures as the CPU's. The build itself (`make
check-gpu-build`, 3 GB of downloads) is not part of the suite; docs/clusters.md gives its measured run."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
RECIPE_FILES = ["Makefile", "README.md", "scripts/build_horovod.sh", "scripts/setup_cluster.sh",
                "scripts/gpu_check.sh", ".ci/run", *[f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")]]
BUILD_LINE = re.compile(r"^gpu-build: horovod (\S+) nccl_built=(True|False) mpi=(True|False) "
                        r"tensorflow (\S+) cuda_build=(True|False)$")


def _make_variable(name: str) -> str:
    match = re.search(rf"^{name}\s*[:?]?=\s*(\S+)", (REPO / "Makefile").read_text(), re.M)
    assert match, f"Makefile has no {name}"
    return match.group(1)


def _script_default(name: str) -> str:
    match = re.search(rf"\b{name}=\$\{{{name}:-([^}}]+)\}}", (REPO / "scripts/build_horovod.sh").read_text())
    assert match, f"scripts/build_horovod.sh has no default for {name}"
    return match.group(1)


def _texts():
    return {name: (REPO / name).read_text() for name in RECIPE_FILES if (REPO / name).is_file()}


def test_one_tensorflow_version_everywhere():
    version = _make_variable("TF_VERSION")
    pins = {(name, found) for name, text in _texts().items()
            for found in re.findall(r"tensorflow(?:-cpu|\[and-cuda\])?==([0-9][0-9.]*[0-9])", text)}
    assert pins, "no pinned TensorFlow found in the recipe files"
    assert {found for _, found in pins} == {version}, sorted(pins)
    # and the one installed here is that version (the suite runs in the environment `make setup` made)
    import tensorflow as tf
    assert tf.__version__ == version


def test_one_horovod_version_and_compiler_everywhere():
    horovod = _script_default("HOROVOD_VERSION")
    mentions = {(name, found) for name, text in _texts().items()
                for found in re.findall(r"[Hh]orovod[ =v]*(?:==)?(\d+\.\d+\.\d+)", text)}
    assert {found for _, found in mentions} == {horovod}, sorted(mentions)
    compiler = _script_default("CUDA_COMPILER_VERSION")
    clusters = (REPO / "docs/clusters.md").read_text()
    assert f"CUDA {compiler}" in clusters, f"docs/clusters.md does not name the CUDA {compiler} compiler wheels"
    # The compute capabilities: the Makefile's default is the script's.
    assert _make_variable("CUDA_CC_LIST") == _script_default("HOROVOD_BUILD_CUDA_CC_LIST")


def test_the_gpu_switch_never_reaches_horovods_cmake():
    # Horovod's CMake reads HOROVOD_GPU as CUDA or ROCM; our HOROVOD_GPU=1 must be consumed before the build.
    script = (REPO / "scripts/build_horovod.sh").read_text()
    unset = script.index("unset HOROVOD_GPU")
    assert unset < script.index("-m pip wheel") and unset < script.index("prepare_gpu_build \"$src\"")
    assert "HOROVOD_GPU=CUDA" in script


@pytest.mark.slow
def test_build_line_says_what_the_installed_build_is():
    result = subprocess.run([sys.executable, "-m", "common.tools.build_info"], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip().splitlines()[-1]
    match = BUILD_LINE.match(line)
    assert match, line
    # The same facts read independently, through Horovod's and TensorFlow's own calls.
    probe = ("import json, horovod, horovod.tensorflow as h, tensorflow as tf; print(json.dumps([horovod.__version__,"
             " bool(h.nccl_built()), h.mpi_built(), tf.__version__, tf.test.is_built_with_cuda()]))")
    facts = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                      timeout=300).stdout.strip().splitlines()[-1])
    assert list(match.groups()) == [facts[0], str(facts[1]), str(facts[2]), facts[3], str(facts[4])]
    required = subprocess.run([sys.executable, "-m", "common.tools.build_info", "--require-gpu-build"], cwd=REPO,
                              capture_output=True, text=True, timeout=300)
    assert required.returncode == (0 if facts[1] and facts[4] else 1), required.stdout


@pytest.mark.slow
def test_gpu_check_runs_on_the_cpu_in_its_small_mode(tmp_path):
    jax_python = REPO / ".venv-jax" / "bin" / "python"
    env = {**os.environ, "GPU_CHECK_TINY": "1", "STEPS": "2", "TF_PYTHON": sys.executable,
           "JAX_PYTHON": str(jax_python) if jax_python.exists() else "python-without-jax",
           "PATH": f"{pathlib.Path(sys.executable).parent}:/usr/bin:/bin"}   # no nvidia-smi here
    out = tmp_path / "check"
    result = subprocess.run(["bash", "scripts/gpu_check.sh", str(out)], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == json.loads((out / "gpu_check.json").read_text())
    assert report["on_cpu"] is True and report["gpus"] == []
    assert any(line.startswith("nvidia-smi:") for line in report["skipped"])
    assert BUILD_LINE.match((out / "build_line.txt").read_text().strip())
    # The figures are the CPU's, and named so: no part and no key says GPU.
    bench = json.loads((out / "bench-1.json").read_text())
    assert bench["gpus_visible"] == 0
    assert not {"tensorflow_1gpu", "tensorflow_2gpus_nccl", "jax"} & set(report)
    assert not [key for part in (report["tensorflow_cpu"], report["jax_cpu"] or {}) for key in part if "gpu" in key]
    assert report["tensorflow_cpu"]["samples_per_second_per_process"] == bench["compute"]["samples_per_second"] > 0
    assert report["tensorflow_cpu"]["ratio_to_peak"] == bench["compute"]["ratio_to_peak"]
    if jax_python.exists():
        rows = json.loads((out / "jax.json").read_text())["results"]
        assert report["jax_cpu"]["samples_per_second_per_process"] == rows[0]["samples_per_second"] > 0
    else:
        assert report["jax_cpu"] is None and any(line.startswith("jax:") for line in report["skipped"])
    # A second run into the same, now full, folder is refused before anything is written.
    again = subprocess.run(["bash", "scripts/gpu_check.sh", str(out)], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=60)
    assert again.returncode == 2 and "not empty" in again.stderr


@pytest.mark.parametrize("driver", ["absent", "failing"])
def test_gpu_check_without_a_gpu_says_so_and_runs_nothing(tmp_path, driver):
    """Its default mode measures MLPerf-size CosmoFlow on a GPU: without one it used to run that on the CPU and
    exit 0 with the CPU's figures filed under per-GPU names. Now: one line saying there is no GPU, exit 1,
    nothing run or written. ``failing``: an nvidia-smi that cannot reach a driver, as on a node without one
    loaded."""
    tools = tmp_path / "bin"
    tools.mkdir()
    if driver == "failing":   # what nvidia-smi prints when the kernel module is not loaded (its status 9)
        (tools / "nvidia-smi").write_text("#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate "
                                          "with the NVIDIA driver.\"\nexit 9\n")
        (tools / "nvidia-smi").chmod(0o755)
    out = tmp_path / "check"
    env = {**os.environ, "TF_PYTHON": sys.executable, "PATH": f"{tools}:/usr/bin:/bin"}
    env.pop("GPU_CHECK_TINY", None)
    result = subprocess.run(["bash", "scripts/gpu_check.sh", str(out)], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1 and result.stdout == "", result.stdout[-2000:] + result.stderr[-2000:]
    line, = result.stderr.strip().splitlines()
    said = "not on PATH" if driver == "absent" else "failed: NVIDIA-SMI has failed because it couldn't communicate"
    assert line.startswith(f"gpu_check: no GPU here: nvidia-smi {said}") and "nothing was measured" in line
    assert not out.exists()
