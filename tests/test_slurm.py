"""The SLURM scripts with stub srun/scontrol/sbatch on PATH and SLURM_* variables set: what a one-node
cluster cannot show (the arithmetic of ranks, CPUs and threads over several nodes, site defaults).
The same scripts run for real under SLURM in tests/test_slurm_cluster.py."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO

SCRIPTS = sorted(str(p.relative_to(REPO)) for p in (REPO / "slurm").glob("*.sbatch"))

# srun stub: records its arguments; the training srun (the one running <app>.train) then exits with
# $STUB_TRAIN_EXIT, or, with STUB_WAIT_FOR_SIGNAL=1, waits for USR1 and exits 75 like a preempted trainer.
SRUN = """#!/bin/bash
echo "srun $*" >> "$STUB_LOG"
case "$*" in
  *".train "*)
    if [ "${STUB_WAIT_FOR_SIGNAL:-0}" = 1 ]; then
      trap 'echo "srun got USR1" >> "$STUB_LOG"; exit 75' USR1
      touch "$STUB_LOG.ready"
      for _ in $(seq 600); do sleep 0.1; done
      exit 1
    fi
    exit "${STUB_TRAIN_EXIT:-0}";;
esac
exit 0
"""
RECORDER = """#!/bin/bash
echo "$(basename "$0") $*" >> "$STUB_LOG"
"""


@pytest.fixture
def stub_env(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(SRUN)
    for name in ("scontrol", "sbatch"):
        (bin_dir / name).write_text(RECORDER)
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    env = dict(os.environ)
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", STUB_LOG=str(tmp_path / "calls.log"),
               SLURM_JOB_ID="4242", SLURM_JOB_NUM_NODES="3", SLURM_NNODES="3", SLURM_SUBMIT_DIR=str(REPO),
               SLURM_RESTART_COUNT="0", PYTHON=sys.executable, RUN_DIR=str(tmp_path / "run"),
               PYTHONPATH=str(REPO))
    return env, tmp_path / "calls.log"


def run_script(script, env, *args):
    return subprocess.run(["bash", script, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def calls(log):
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.skipif(shutil.which("shellcheck") is None and os.environ.get("CI") != "true",
                    reason="shellcheck not installed (make setup installs it where apt-get works)")
def test_shellcheck_clean():
    files = [*SCRIPTS, "slurm/launch.sh", *[f"scripts/{p.name}" for p in (REPO / "scripts").glob("*.sh")], ".ci/run"]
    result = subprocess.run(["shellcheck", "-x", *files], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("script, ranks_per_node, cpus, binding", [
    ("slurm/knl.sbatch", 1, 272, ["--cpu-bind=cores"]),
    ("slurm/gpu4.sbatch", 4, 32, ["--gpus-per-task=1", "--gpu-bind=none"]),
    ("slurm/gpu6.sbatch", 6, 7, ["--gpus-per-task=1", "--gpu-bind=closest"]),
])
def test_launch_command_lines(stub_env, script, ranks_per_node, cpus, binding):
    env, log = stub_env
    result = run_script(script, env, "cosmoflow", "configs/cosmoflow/demo.yaml", "--set", "train.epochs=7",
                        "--set", "distributed.cycle_time_ms=3.5")
    assert result.returncode == 0, result.stderr
    lines = calls(log)
    assert len(lines) == 1, lines   # no staging in the demo config; no requeue after success
    srun = lines[0].split()
    expected = ["--nodes", "3", "--ntasks", str(3 * ranks_per_node), "--ntasks-per-node", str(ranks_per_node),
                "--cpus-per-task", str(cpus)]
    assert srun[1:1 + len(expected)] == expected
    for flag in binding:
        assert flag in srun
    tail = " ".join(srun)
    assert f"-m cosmoflow.train --config configs/cosmoflow/demo.yaml --output-dir {env['RUN_DIR']} --resume" in tail
    # The user's overrides come last, after the machine's thread settings, so they win.
    assert tail.endswith("--set train.epochs=7 --set distributed.cycle_time_ms=3.5")
    assert "train.intra_op_threads=" in tail


def test_environment_and_staging(stub_env, tmp_path):
    env, log = stub_env
    probe = tmp_path / "bin" / "srun"
    probe.write_text(SRUN.replace('echo "srun $*" >> "$STUB_LOG"',
                                  'echo "srun $* HDF5=$HDF5_USE_FILE_LOCKING CYCLE=${HOROVOD_CYCLE_TIME:-} '
                                  'HIER=${HOROVOD_HIERARCHICAL_ALLREDUCE:-} OMP=${OMP_NUM_THREADS:-}" >> "$STUB_LOG"'))
    env["RANKS_PER_NODE"] = "2"
    result = run_script("slurm/knl.sbatch", env, "cosmoflow", "configs/cosmoflow/knl.yaml",
                        "--set", "distributed.cycle_time_ms=2", "--set", "distributed.hierarchical_allreduce=true")
    assert result.returncode == 0, result.stderr
    stage, train = calls(log)
    assert "-m common.tools.slurm stage --app cosmoflow --config configs/cosmoflow/knl.yaml" in stage
    assert "--ntasks 6 --ntasks-per-node 2 --cpus-per-task 136" in train
    assert "train.intra_op_threads=32 --set train.inter_op_threads=2" in train
    assert "HDF5=FALSE CYCLE=2 HIER=1 OMP=32" in train


def test_failure_is_passed_on_without_requeue(stub_env):
    env, log = stub_env
    env["STUB_TRAIN_EXIT"] = "2"
    result = run_script("slurm/gpu4.sbatch", env, "hep_cnn", "configs/hep_cnn/demo.yaml")
    assert result.returncode == 2
    assert not any(l.startswith("scontrol") for l in calls(log))


def test_warning_signal_checkpoints_then_requeues(stub_env):
    env, log = stub_env
    env["STUB_WAIT_FOR_SIGNAL"] = "1"
    process = subprocess.Popen(["bash", "slurm/gpu4.sbatch", "cosmoflow", "configs/cosmoflow/demo.yaml"], cwd=REPO,
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not os.path.exists(str(log) + ".ready"):
        assert time.time() < deadline and process.poll() is None, process.communicate()
        time.sleep(0.05)
    process.send_signal(signal.SIGUSR1)     # what --signal=B:USR1@300 delivers to the batch shell
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    lines = calls(log)
    assert "srun got USR1" in lines and lines[-1] == "scontrol requeue 4242"
    assert "--resume" in lines[0] and "requeueing job 4242" in out


def test_usage_error(stub_env):
    env, _ = stub_env
    result = run_script("slurm/knl.sbatch", env, "cosmoflow")
    assert result.returncode == 2 and "usage: sbatch -N <nodes> slurm/knl.sbatch" in result.stderr


def test_a_bad_config_stops_the_job_before_any_srun(stub_env, tmp_path):
    """`eval "$(python -m common.tools.slurm env ...)"` would go on under set -e; the launcher must stop there."""
    env, log = stub_env
    result = run_script("slurm/knl.sbatch", env, "cosmoflow", "configs/cosmoflow/demo.yaml",
                        "--set", "data.batch_size=many")
    assert result.returncode == 2, result.stderr
    assert "key 'data.batch_size'" in result.stderr and "not starting" in result.stderr
    assert not any(line.startswith("srun") for line in calls(log))


def test_local_slurm_refuses_a_folder_others_can_write(tmp_path):
    """The cluster script runs as root: a folder another user can write to (where a link could be planted
    for root to write through) is refused before anything is written; `down` with no cluster does nothing."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    env = {**os.environ, "LOCAL_SLURM_DIR": str(shared)}
    result = subprocess.run(["bash", "scripts/local_slurm.sh", "up"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and "writable by others" in result.stderr, result.stderr
    assert list(shared.iterdir()) == []
    link = tmp_path / "link"
    link.symlink_to(shared)
    result = subprocess.run(["bash", "scripts/local_slurm.sh", "up"], cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, "LOCAL_SLURM_DIR": str(link)}, timeout=60)
    assert result.returncode == 2 and "symbolic link" in result.stderr
    state = tmp_path / "state"
    result = subprocess.run(["bash", "scripts/local_slurm.sh", "down"], cwd=REPO, capture_output=True, text=True,
                            env={**{k: v for k, v in os.environ.items() if k != "LOCAL_SLURM_DIR"},
                                 "LOCAL_SLURM_STATE": str(state)}, timeout=60)
    assert result.returncode == 0 and not state.exists()
