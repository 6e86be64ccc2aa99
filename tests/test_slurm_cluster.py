"""The shipped slurm/*.sbatch scripts, run for real: sbatch on a one-node SLURM cluster that the tests
start themselves (scripts/local_slurm.sh), ranks started by ``srun --mpi=pmix`` over Open MPI.

Every job's final state is read with ``scontrol show job``, not only ``sbatch --wait``'s exit code.
Several nodes: tests/test_multinode.py; what needs real GPUs is in tests/test_slurm.py with stub commands.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import numpy as np
import pytest

from conftest import (STARTUP_S, final_weights, finished, job, job_and_log, live_processes, read, submit,
                      tiny_cosmo_overrides, wait_for)

pytestmark = pytest.mark.slurm


def knl(cluster, run_dir, data, *extra, sbatch=(), **overrides):
    """slurm/knl.sbatch with 2 ranks on the one node (2 cores, 1 thread each)."""
    env = {"RANKS_PER_NODE": "2", "CORES_PER_NODE": "2", "THREADS_PER_CORE": "1", "SRUN_MPI": "pmix"}
    sets = tiny_cosmo_overrides(data, **overrides)
    return submit(cluster, "slurm/knl.sbatch", run_dir, "cosmoflow", "configs/cosmoflow/demo.yaml", *sets, *extra,
                  sbatch=("-N", "1", *sbatch), env=env)


def test_knl_script_trains_on_two_mpi_ranks_with_staging(slurm_cluster, tiny_cosmo_data, tmp_path):
    run, stage = tmp_path / "run", tmp_path / "stage"
    job_id = knl(slurm_cluster, run, tiny_cosmo_data, "--set", f"data.stage_dir={stage}")
    info = finished(slurm_cluster, job_id)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", info
    summary = json.loads((run / "summary.json").read_text())
    assert summary["ranks"] == 2 and summary["backend"] == "horovod" and summary["controller"] == "mpi"
    assert (run / "model.keras").is_file() and summary["epochs_completed"] == 2
    # The staging step ran through srun, one share per rank, before training read the copies.
    log = (run / "train.restart-0.log").read_text()
    assert "staged the training files of 2 rank(s)" in log
    staged = [sorted(p.name for p in (stage / f"rank-{r}").glob("*.tfrecord")) for r in (0, 1)]
    assert len(staged[0]) == len(staged[1]) == 16 and not set(staged[0]) & set(staged[1])
    assert "launch: trainer exited with 0" in read(f"{run}.out")


def test_knl_script_trains_two_instances_unchanged(slurm_cluster, tiny_cosmo_data, tmp_path):
    """distributed.instances through the shipped script, nothing else changed: 2 MPI ranks, 2 models, each
    instance's ranks staging their own shares."""
    run, stage = tmp_path / "run", tmp_path / "stage"
    job_id = knl(slurm_cluster, run, tiny_cosmo_data, "--set", f"data.stage_dir={stage}",
                 "--set", "distributed.instances=2")
    info = finished(slurm_cluster, job_id)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", info
    report = json.loads((run / "instances.json").read_text())
    assert [row["outcome"] for row in report["instances"]] == ["finished", "finished"]
    for k in (0, 1):
        summary = json.loads((run / f"instance-{k}" / "summary.json").read_text())
        assert summary["ranks"] == 1 and summary["controller"] == "mpi" and summary["epochs_completed"] == 2
        assert len(list((stage / f"instance-{k}-rank-0").glob("*.tfrecord"))) == 32
    assert "staged the training files of 2 rank(s) in 2 instances" in (run / "train.restart-0.log").read_text()


def test_preemption_requeue_and_exact_resume(slurm_cluster, tiny_cosmo_data, tmp_path):
    """The scripts ask for USR1 300 s before the time limit (``--signal=B:USR1@300``: to the batch shell).  The
    test sends that same signal to the batch shell (``scancel --batch --signal=USR1``) once training runs, rather
    than waiting for SLURM's timer, which fires anywhere from 8 to 32 s into a 1-minute job and so needed a run
    long enough to outlast it, twice.  The trainer checkpoints at a step and the script requeues the job;
    released, it resumes and ends with the weights of an uninterrupted run, bitwise."""
    settings = dict(epochs=24, batch_size=1)
    deterministic = ("--set", "train.deterministic=true")
    run = tmp_path / "run"
    # The scripts ask for whole nodes (--exclusive): jobs on the one node run one after another, so the
    # uninterrupted reference runs while the requeued job waits.
    preempted = knl(slurm_cluster, run, tiny_cosmo_data, *deterministic, sbatch=("--time=15",), **settings)
    wait_for(lambda: "epoch 2/24:" in read(run / "train.restart-0.log"), STARTUP_S, "training to start",
             about=lambda: job_and_log(slurm_cluster, preempted, run / "train.restart-0.log"))
    subprocess.run(["scancel", "--batch", "--signal=USR1", str(preempted)], env={**os.environ, **slurm_cluster},
                   check=True)
    # The trainer checkpoints and exits 75, the script requeues: the job waits (BeginTime) to run again.
    requeued = wait_for(lambda: (info := job(slurm_cluster, preempted)).get("Restarts") == "1"
                        and info.get("JobState") == "PENDING" and info, 300, "the requeued job to wait again")
    reference = knl(slurm_cluster, tmp_path / "reference", tiny_cosmo_data, *deterministic, sbatch=("--time=15",),
                    **settings)
    assert "requeueing job" in read(f"{run}.out"), read(f"{run}.out")
    subprocess.run(["scontrol", "update", f"JobId={preempted}", "StartTime=now"],
                   env={**os.environ, **slurm_cluster}, check=True)
    info = finished(slurm_cluster, preempted)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1" and info["ExitCode"] == "0:0", (requeued, info)
    first = (run / "train.restart-0.log").read_text()
    second = (run / "train.restart-1.log").read_text()
    assert "preempted: stop requested (SIGUSR1); checkpoint saved at epoch" in first, first[-2000:]
    assert "resuming from" in second and "ckpt-epoch-" in second, second[-2000:]
    assert json.loads((run / "summary.json").read_text())["epochs_completed"] == 24
    info = finished(slurm_cluster, reference)
    assert info["JobState"] == "COMPLETED", info
    for ours, theirs in zip(final_weights(run), final_weights(tmp_path / "reference")):
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("script", ["slurm/gpu4.sbatch", "slurm/gpu6.sbatch"])
def test_gpu_scripts_launch_on_a_cpu_partition(slurm_cluster, tiny_cosmo_data, tmp_path, script):
    """The GPU scripts' launch lines, for real, with their GPU requests off (GPUS_PER_TASK=0, sbatch
    --gpus-per-node=0)."""
    run = tmp_path / "run"
    job_id = submit(slurm_cluster, script, run, "cosmoflow", "configs/cosmoflow/demo.yaml",
                    *tiny_cosmo_overrides(tiny_cosmo_data, epochs=1),
                    sbatch=("-N", "1", "--gpus-per-node=0", "--ntasks-per-node=2"),
                    env={"GPUS_PER_TASK": "0", "RANKS_PER_NODE": "2", "CPUS_PER_TASK": "1", "SRUN_MPI": "pmix"})
    info = finished(slurm_cluster, job_id)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, read(f"{run}.out"))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["ranks"] == 2 and summary["controller"] == "mpi"


def rank_pids(run_dir) -> list[int]:
    """Live processes training into ``run_dir``: its ranks (not the srun that started them)."""
    return [pid for pid, argv in live_processes() if os.path.basename(argv[0]).startswith(b"python")
            and b"cosmoflow.train" in argv and str(run_dir).encode() in argv]


def test_a_killed_rank_ends_the_job_promptly(slurm_cluster, tiny_cosmo_data, tmp_path):
    run = tmp_path / "run"
    job_id = knl(slurm_cluster, run, tiny_cosmo_data, epochs=200, batch_size=1)
    log = run / "train.restart-0.log"
    wait_for(lambda: "epoch 2/200:" in read(log), STARTUP_S, "training to start",
             about=lambda: job_and_log(slurm_cluster, job_id, log))
    ranks = wait_for(lambda: len(pids := rank_pids(run)) == 2 and pids, 30, "two ranks")
    killed = time.time()
    os.kill(ranks[1], 9)
    info = finished(slurm_cluster, job_id, timeout=120)
    assert time.time() - killed < 60, "the job outlived its rank by a minute"
    assert info["JobState"] == "FAILED" and info["ExitCode"] != "0:0", info
    wait_for(lambda: not rank_pids(run), 20, "every rank to be gone")
