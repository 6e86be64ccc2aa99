"""Several nodes, for real: a virtual cluster of 3 nodes on this machine (scripts/local_slurm.sh up --nodes 3:
each node a network namespace with its own hostname, address, /dev/shm and node-local scratch folder, joined
by a bridge, with its own slurmd), the shipped slurm/*.sbatch scripts run across them with srun --mpi=pmix and
Open MPI over TCP between the namespaces, and a node lost in the middle of a job.

One cluster for the whole test run (the ``virtual_cluster`` fixture, torn down at the end with nothing left).
The nodes share this machine's 2 cores: each advertises 2 CPUs (config_overrides); jobs use the tiny demo
shapes and one thread per rank.
"""

from __future__ import annotations

import csv
import json
import math
import os
import pathlib
import shlex
import subprocess
import sys
import time

import numpy as np
import pytest

from common.storage import checkpoint
from conftest import (REPO, STARTUP_S, final_weights, finished, job, job_and_log, live_processes, python_env, read,
                      submit, tiny_cosmo_overrides, wait_for)

pytestmark = [pytest.mark.multinode, pytest.mark.slurm]

SCRIPT = str(REPO / "scripts" / "local_slurm.sh")


def local_slurm(cluster, *args, timeout=120, check=True) -> subprocess.CompletedProcess:
    result = subprocess.run(["bash", SCRIPT, *args], env={**os.environ, **cluster}, capture_output=True, text=True,
                            timeout=timeout)
    if check:
        assert result.returncode == 0, f"local_slurm.sh {' '.join(args)}: {result.returncode}\n{result.stderr}"
    return result


def on_node(cluster, node, *command, **kwargs) -> str:
    return local_slurm(cluster, "exec", node, *command, **kwargs).stdout


def scratch_of(cluster, node):
    """Node ``node``'s scratch folder as this (root) namespace sees it."""
    return pathlib.Path(cluster["CLUSTER_DIR"], "nodes", node, "scratch")


def cpu_job(cluster, script, run_dir, data, nodes, ranks_per_node, *extra, sbatch=(), env=None, **overrides):
    """``script`` on ``nodes`` nodes x ``ranks_per_node`` single-threaded ranks, the tiny CosmoFlow run."""
    variables = {"RANKS_PER_NODE": str(ranks_per_node), "CORES_PER_NODE": str(ranks_per_node),
                 "THREADS_PER_CORE": "1", "SRUN_MPI": "pmix", **(env or {})}
    return submit(cluster, script, run_dir, "cosmoflow", "configs/cosmoflow/demo.yaml",
                  *tiny_cosmo_overrides(data, **overrides), *extra, sbatch=("-N", str(nodes), *sbatch), env=variables)


def partition(cluster, state, check=True) -> None:
    """The virtual cluster's one partition (debug) set UP or DOWN (DOWN: jobs queue, none is allocated)."""
    subprocess.run(["scontrol", "update", "PartitionName=debug", f"State={state}"], env={**os.environ, **cluster},
                   check=check, capture_output=True, timeout=60)


def completed(cluster, job_id, run_dir, timeout=600) -> dict:
    info = finished(cluster, job_id, timeout=timeout)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, read(f"{run_dir}.out"),
                                                                         read(run_dir / "train.restart-0.log")[-3000:])
    return json.loads((run_dir / "summary.json").read_text())


def test_the_nodes_are_separate_machines(virtual_cluster):
    """Own hostname and address per node, TCP between nodes over the bridge, a scratch folder and /dev/shm
    that no other node sees."""
    cluster, subnet = virtual_cluster, virtual_cluster["CLUSTER_SUBNET"]
    status = local_slurm(cluster, "status").stdout
    for k in (1, 2, 3):
        assert f"node{k}: {subnet}.{k} up" in status, status
        assert on_node(cluster, f"node{k}", "hostname").strip() == f"node{k}"
        assert f"inet {subnet}.{k}/24" in on_node(cluster, f"node{k}", "ip", "-4", "-o", "addr", "show", "hpcdl0")
    # A server on node3 sees a connection from node1's address.
    server = subprocess.Popen(["bash", SCRIPT, "exec", "node3", sys.executable, "-c",
                               "import socket; s = socket.create_server(('0.0.0.0', 23456)); c, a = s.accept(); "
                               "print(a[0], c.recv(16).decode())"],
                              env={**os.environ, **cluster}, stdout=subprocess.PIPE, text=True)
    client = ("import socket, time\nfor _ in range(100):\n    try:\n"
              f"        socket.create_connection(('{subnet}.3', 23456), timeout=5).sendall(b'hello'); break\n"
              "    except OSError: time.sleep(0.1)")
    on_node(cluster, "node1", sys.executable, "-c", client)
    assert server.communicate(timeout=60)[0].split() == [f"{subnet}.1", "hello"]
    # Node-local folders: what node1 writes, node2 does not see (nor the folders behind the others' scratch).
    scratch = cluster["CLUSTER_SCRATCH"]
    on_node(cluster, "node1", "sh", "-c", f"echo one > {scratch}/probe-node1 && echo one > /dev/shm/probe-node1")
    try:
        assert (scratch_of(cluster, "node1") / "probe-node1").read_text() == "one\n"
        assert "probe-node1" not in on_node(cluster, "node2", "ls", "-a", scratch, "/dev/shm")
        assert on_node(cluster, "node2", "ls", "-A", f"{cluster['CLUSTER_DIR']}/nodes").strip() == ""
        assert not os.path.exists("/dev/shm/probe-node1")
    finally:
        on_node(cluster, "node1", "rm", "-f", f"{scratch}/probe-node1", "/dev/shm/probe-node1")


def test_knl_script_across_three_nodes(virtual_cluster, tiny_cosmo_data, tmp_path):
    """sbatch -N 3 slurm/knl.sbatch: one rank per node, each node staging its rank's share to its own scratch;
    the ranks end with identical weights."""
    run = tmp_path / "run"
    stage = f"{virtual_cluster['CLUSTER_SCRATCH']}/stage-{tmp_path.name}"
    job_id = cpu_job(virtual_cluster, "slurm/knl.sbatch", run, tiny_cosmo_data, 3, 1, "--set", f"data.stage_dir={stage}")
    summary = completed(virtual_cluster, job_id, run)
    assert summary["ranks"] == 3 and summary["controller"] == "mpi" and summary["epochs_completed"] == 2
    assert summary["hosts"] == ["node1", "node2", "node3"] and summary["nodes"] == 3
    assert len(set(summary["weights_sha256"])) == 1, summary["weights_sha256"]
    shares = []
    for rank, node in enumerate(("node1", "node2", "node3")):
        local = scratch_of(virtual_cluster, node) / f"stage-{tmp_path.name}"
        assert sorted(p.name for p in local.iterdir()) == [f"rank-{rank}"], (node, list(local.iterdir()))
        shares.append({p.name for p in (local / f"rank-{rank}").glob("*.tfrecord")})
    everything = {p.name for p in (tiny_cosmo_data / "train").glob("*.tfrecord")}
    assert sum(len(s) for s in shares) == len(everything) == 32 and set().union(*shares) == everything, shares


def test_hierarchical_allreduce_across_two_nodes(virtual_cluster, tiny_cosmo_data, tmp_path):
    """2 nodes x 2 ranks, deterministic: distributed.hierarchical_allreduce on gives the weights of off,
    bitwise (Horovod's CPU build has no hierarchical allreduce: on MPI it changes the allgather only)."""
    weights, summaries = {}, {}
    for mode in ("false", "true"):
        run = tmp_path / f"hierarchical-{mode}"
        job_id = cpu_job(virtual_cluster, "slurm/knl.sbatch", run, tiny_cosmo_data, 2, 2, "--set",
                         f"distributed.hierarchical_allreduce={mode}", "--set", "train.deterministic=true",
                         batch_size=2)
        summaries[mode] = completed(virtual_cluster, job_id, run)
        weights[mode] = final_weights(run)
    for summary in summaries.values():
        hosts = summary["hosts"]
        assert len(hosts) == 4 and hosts[0] == hosts[1] != hosts[2] == hosts[3], hosts
        assert len(set(summary["weights_sha256"])) == 1
    assert summaries["true"]["horovod_environment"].get("HOROVOD_HIERARCHICAL_ALLREDUCE") == "1"
    assert "HOROVOD_HIERARCHICAL_ALLREDUCE" not in summaries["false"]["horovod_environment"]
    for on, off in zip(weights["true"], weights["false"]):
        np.testing.assert_array_equal(on, off)


def test_hybrid_groups_across_two_nodes(virtual_cluster, tiny_cosmo_data, tmp_path):
    """distributed.groups=2 on 2 nodes x 2 ranks: a synchronous group per node, asynchronous exchanges
    between the nodes, and every rank ends on the consensus."""
    run = tmp_path / "run"
    job_id = cpu_job(virtual_cluster, "slurm/knl.sbatch", run, tiny_cosmo_data, 2, 2, "--set", "distributed.groups=2",
                     "--set", "distributed.exchange_every=2", batch_size=2, epochs=3)
    summary = completed(virtual_cluster, job_id, run)
    hosts = summary["hosts"]
    assert summary["ranks"] == 4 and hosts[0] == hosts[1] != hosts[2] == hosts[3], hosts
    assert summary["groups"] == 2 and len(set(summary["weights_sha256"])) == 1, summary["weights_sha256"]


@pytest.mark.parametrize("script", ["slurm/gpu4.sbatch", "slurm/gpu6.sbatch"])
def test_gpu_scripts_launch_on_two_nodes(virtual_cluster, tiny_cosmo_data, tmp_path, script):
    """The GPU scripts' launch lines on 2 nodes, their GPU requests off (GPUS_PER_TASK=0, --gpus-per-node=0)."""
    run = tmp_path / "run"
    job_id = submit(virtual_cluster, script, run, "cosmoflow", "configs/cosmoflow/demo.yaml",
                    *tiny_cosmo_overrides(tiny_cosmo_data, epochs=1),
                    sbatch=("-N", "2", "--gpus-per-node=0", "--ntasks-per-node=1"),
                    env={"GPUS_PER_TASK": "0", "RANKS_PER_NODE": "1", "CPUS_PER_TASK": "1", "SRUN_MPI": "pmix"})
    summary = completed(virtual_cluster, job_id, run)
    assert summary["ranks"] == 2 and summary["nodes"] == 2 and summary["controller"] == "mpi"
    assert "launch: gpu" in read(f"{run}.out") and "2 node(s) x 1 rank(s)" in read(f"{run}.out")


def node_processes(cluster, node) -> list[str]:
    """The command names of the processes in node ``node``'s network namespace (the name the cluster
    recorded)."""
    made = pathlib.Path(cluster["CLUSTER_DIR"], "run", "made").read_text().split("\n")
    netns = next(line.split()[1] for line in made if line.startswith("netns ") and line.endswith(f"-{node}"))
    pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, check=True).stdout.split()
    names = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as handle:
                status = handle.read()
        except OSError:
            continue
        if "\nState:\tZ" not in status:
            names.append(status.split("\n", 1)[0].split("\t", 1)[1])
    return names


def job_processes(run_dir) -> list[int]:
    return [pid for pid, argv in live_processes() if b"cosmoflow.train" in argv and str(run_dir).encode() in argv
            and os.path.basename(argv[0]).startswith(b"python")]


def test_a_node_lost_mid_run_resumes_on_the_nodes_left(virtual_cluster, tiny_cosmo_data, tmp_path):
    """A 3-node job (one rank per node, -N 2-3) loses node2 in its second epoch: the surviving ranks exit 4
    within train.hang_timeout_s plus a margin, nothing of the job is left on any node, the last checkpoint
    is whole, and the job is requeued without node2 and resumes on 2 nodes from that checkpoint with the
    global batch kept (per-rank batch 4 -> 6): the learning-rate schedule and the step count go on where
    they stopped."""
    cluster, run = virtual_cluster, tmp_path / "run"
    hang_timeout, margin, epochs, steps = 20, 45, 24, 2
    stage = f"{cluster['CLUSTER_SCRATCH']}/stage-{tmp_path.name}"
    job_id = cpu_job(cluster, "slurm/knl.sbatch", run, tiny_cosmo_data, 3, 1, "--set", f"data.stage_dir={stage}",
                     "--set", f"train.hang_timeout_s={hang_timeout}", "--set", "optimizer.schedule.decay=cosine",
                     "--set", "optimizer.schedule.end_factor=0.05",
                     sbatch=("--nodes=2-3",), epochs=epochs)
    first_log = run / "train.restart-0.log"
    try:
        wait_for(lambda: "epoch 2/" in read(first_log), STARTUP_S, "the job's second epoch",
                 about=lambda: job_and_log(cluster, job_id, first_log))
        assert job(cluster, job_id)["NodeList"] == "node[1-3]"
        killed = time.time()
        local_slurm(cluster, "kill", "node2")
        # The partition takes no new allocations until the state between the two attempts has been checked:
        # the requeued job waits PENDING (Reason PartitionDown) instead of starting again between two polls,
        # as it once did when it left COMPLETING after its cred_expire wait had already passed (seen in CI:
        # COMPLETING at 31 s, RUNNING at 57 s, never PENDING).  The running job is not touched by it.
        partition(cluster, "DOWN")
        # The survivors see no progress, exit 4; the script finds node2 silent and requeues the job.
        left_running = wait_for(lambda: job(cluster, job_id).get("JobState") != "RUNNING" and time.time(), 180,
                                "the job to stop running")
        assert left_running - killed < hang_timeout + margin, left_running - killed
        log = read(first_log)
        assert "rank 0: no progress for" in log and "rank 2: no progress for" in log, log[-3000:]
        assert "(train.hang_timeout_s=20)" in log and "Exited with exit code 4" in log
        seen = []   # (s after the kill, state, restarts, reason) at each change, for the message

        def requeued():
            info = job(cluster, job_id)
            state = (info.get("JobState"), info.get("Restarts"), info.get("Reason"))
            if not seen or seen[-1][1:] != state:
                seen.append((round(time.time() - killed), *state))
            return (info.get("JobState") == "PENDING" and info.get("Restarts") == "1"
                    or info.get("JobState") in ("FAILED", "CANCELLED", "TIMEOUT", "COMPLETED")) and info

        # The requeued job completes (and then waits, PENDING) only once SLURM has cleared it from node2,
        # that is once node2 is DOWN (about 20 s after the requeue here).
        try:
            pending = wait_for(requeued, 300, "the job to be requeued", seen)
            assert pending["JobState"] == "PENDING", seen
        except AssertionError as error:   # with what the batch script said
            raise AssertionError(f"{error}\n{read(f'{run}.out')}") from None
        # Requeued by the script or, when SLURM marked node2 DOWN first, by SLURM (NODE_FAIL); either way node2
        # is down or not responding ("*"), so SLURM will not place the job there.
        node2 = subprocess.run(["sinfo", "-h", "-N", "-n", "node2", "-o", "%T"], env={**os.environ, **cluster},
                               capture_output=True, text=True).stdout.strip()
        assert node2.startswith("down") or node2.endswith("*"), (pending, node2)
        out = read(f"{run}.out")
        assert "no longer respond; requeued job" in out or "SLURM found node(s) node2 down and requeued" in out, out
        assert not job_processes(run), "ranks of the first attempt left running"
        for node in ("node1", "node2", "node3"):   # nothing of the job on any node: their slurmd at most
            assert set(node_processes(cluster, node)) <= {"slurmd", "sleep", "unshare"}, node_processes(cluster, node)
        newest = checkpoint.latest_checkpoint(run / "checkpoints")
        state, _ = checkpoint.load_checkpoint(newest)   # whole: every member's CRC
        stopped_at = state["epoch"]
        assert stopped_at >= 1 and state["ranks"] == 3 and state["global_batch_size"] == 12, state
        # Requeued jobs wait cred_expire + 1 s (11 s here); release it now.
        partition(cluster, "UP")
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env={**os.environ, **cluster},
                       check=True)
        summary = completed(cluster, job_id, run)
    finally:
        partition(cluster, "UP", check=False)   # whatever failed above, the other tests need it up
        local_slurm(cluster, "up", "--nodes", "3", timeout=300)   # node2 back for the other tests
    second = read(run / "train.restart-1.log")
    assert f"ckpt-epoch-{stopped_at:05d}" in second and "data.batch_size 4 -> 6 per rank keeps the global batch 12" \
        in second, second[-3000:]
    assert summary["ranks"] == 2 and summary["hosts"] == ["node1", "node3"] and summary["global_batch_size"] == 12
    assert summary["first_epoch_this_run"] == stopped_at + 1 and summary["epochs_completed"] == epochs
    assert len(set(summary["weights_sha256"])) == 1
    final_state, _ = checkpoint.load_checkpoint(checkpoint.latest_checkpoint(run / "checkpoints"))
    assert final_state["step"] == epochs * steps, final_state   # 24 samples x 24 epochs / global batch 12
    # history.csv: every epoch once, and the learning rate of each epoch's last step on one cosine curve from
    # the configured 0.01 (no batch scaling) to 5 % of it over all epochs x steps; a restarted schedule, or a
    # peak scaled by another global batch, would leave it.
    with open(run / "history.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["epoch"]) for r in rows] == list(range(epochs)), [r["epoch"] for r in rows]
    rates = np.array([float(r["learning_rate"]) for r in rows])
    last_steps = np.arange(1, epochs + 1) * steps - 1
    curve = 0.5 * (1 + np.cos(math.pi * last_steps / (epochs * steps)))
    np.testing.assert_allclose(rates, 0.01 * (0.05 + 0.95 * curve), rtol=1e-5)   # float32 arithmetic
    assert {p.name for p in (scratch_of(cluster, "node2") / f"stage-{tmp_path.name}").iterdir()} == {"rank-1"}



# --- The scaling model against measurement (#27): the system measured, then a prediction tested against runs ---

# Open MPI for a slow TCP link: its ring allreduce (its fixed rules picked an algorithm that took 2.05x the
# 2-rank time at 3 ranks on these links), and messages up to 4 MiB sent eagerly (with the default 64 KiB
# limit the rendezvous handshake of one direction waits behind the other direction's data on the one TCP
# connection of a pair, which serialised a 2-rank exchange: 1.19 s instead of 0.59 s at 20 Mbit/s).
MPI_FOR_SLOW_LINKS = {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1", "OMPI_MCA_coll_tuned_allreduce_algorithm": "4",
                      "OMPI_MCA_btl_tcp_eager_limit": "4194304", "OMPI_MCA_btl_tcp_rndv_eager_limit": "4194304",
                      "OMPI_MCA_btl_tcp_max_send_size": "4194304"}


def batch_job(cluster, nodes, out, *job, timeout=420) -> None:
    """``sbatch JOB`` (a script, or ``--wrap LINE``) on ``nodes`` nodes, one task each, with the Open MPI settings
    above; it must complete."""
    result = subprocess.run(["sbatch", "--parsable", f"--output={out}", "-N", str(nodes), "--ntasks-per-node=1",
                             f"--chdir={REPO}", *job],
                            env={**os.environ, **cluster, **MPI_FOR_SLOW_LINKS}, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    info = finished(cluster, int(result.stdout.strip().split(";")[0]), timeout=timeout)
    assert info["JobState"] == "COMPLETED", (info, read(out)[-3000:])


def wrapped_job(cluster, nodes, out, *command, timeout=420) -> None:
    """``srun --mpi=pmix COMMAND`` on ``nodes`` nodes, one rank each, as a batch job; it must complete."""
    line = " ".join(shlex.quote(part) for part in ["srun", "--mpi=pmix", *command])
    batch_job(cluster, nodes, out, "--wrap", line, timeout=timeout)


def test_sysbench_measures_shaped_links_under_a_cpu_quota(virtual_cluster, tiny_cosmo_data, tmp_path):
    """`local_slurm.sh limit` shapes every node's link (tc htb on both ends) and sets its CPU quota;
    common.tools.sysbench, run as a job on the 3 nodes, measures them and writes a system file the scaling
    model reads, whose allreduce prices are the measured ones."""
    from common.tools import scaling   # deferred: pydantic models, only here

    cluster = virtual_cluster
    overrides = tiny_cosmo_overrides(tiny_cosmo_data, epochs=2) + [
        "--set", "train.throughput_warmup_steps=1", "--set", "train.intra_op_threads=1",
        "--set", "train.inter_op_threads=1", "--set", "mlperf.enabled=false"]
    rate_Bps = 20e6 / 8
    local_slurm(cluster, "limit", "--cpu-percent", "50", "--link-rate", "20mbit")
    try:
        assert "limits: cpu per node 50% of one core, link rate per node 20mbit" in local_slurm(cluster, "status").stdout
        for k in (1, 2, 3):
            assert "htb" in on_node(cluster, f"node{k}", "tc", "qdisc", "show", "dev", "hpcdl0")
        system_file = tmp_path / "virtual.yaml"
        wrapped_job(cluster, 3, tmp_path / "sysbench.out", sys.executable, "-m", "common.tools.sysbench",
                    "--config", "configs/cosmoflow/demo.yaml", *overrides, "--out", str(system_file),
                    "--name", "virtual-20mbit", "--repeats", "3")
    finally:
        local_slurm(cluster, "limit", "--cpu-percent", "off", "--link-rate", "off")
    for k in (1, 2, 3):
        assert "htb" not in on_node(cluster, f"node{k}", "tc", "qdisc", "show", "dev", "hpcdl0")
    system = scaling.load_system(str(system_file))
    measured = system.measured
    # The shaped link: TCP gets at most the token rate (burst 4 KB), and more than half of it.
    p2p = measured["point_to_point"]
    assert 0.5 * rate_Bps < p2p["bandwidth_Bps"] <= 1.02 * rate_Bps, p2p
    # A 3-rank ring allreduce of n bytes sends 4/3 n from every node: no faster than the link allows.
    gradient_bytes = measured["jobs_without_gradients"][2][0]["gradient_bytes"]
    three = system.network.allreduce_s[3]
    assert sorted(system.network.allreduce_s) == [2, 3] and max(three) == gradient_bytes
    assert three[gradient_bytes] >= 4 / 3 * gradient_bytes / rate_Bps * 0.95, three
    # Every rank timed its steps as a rank of jobs of the first 2 and 3 nodes without the gradient allreduce (the
    # data shared out: fewer steps each); last, the first node a one-rank run (7 steps: 2 epochs of the tiny
    # data, less the warm-up) whose one-node rate the system file gives.
    alone = measured["one_node_run"]
    assert alone["steps"] == 7 and alone["gradient_bytes"] == gradient_bytes, alone
    assert system.measured_samples_per_second_one_node == pytest.approx(4 / alone["median_step_s"], rel=1e-12)
    jobs = measured["jobs_without_gradients"]
    assert sorted(jobs) == [2, 3] and [len(jobs[p]) for p in (2, 3)] == [2, 3]
    for p in (2, 3):
        assert len({c["steps"] for c in jobs[p]}) == 1 and all(c["median_step_s"] > 0 for c in jobs[p]), jobs[p]
    assert sorted(system.step_without_gradients_s) == [2, 3]
    assert system.measured_samples_per_second == pytest.approx(4 / system.step_without_gradients_s[3], rel=1e-12)
    # The model prices a 3-node step as that measured step plus the gradients' measured allreduce (one fused
    # buffer); the step signals and the wait for the slowest rank are in the measured step.
    work = scaling.Workload(parameters=gradient_bytes // 4, training_flops_per_sample=1.0, local_batch=4,
                            rank_samples_per_second=system.measured_samples_per_second, small_collectives_per_step=1,
                            overlap=0.0, lag_hides_step=False,
                            step_without_gradients_s=dict(system.step_without_gradients_s))
    row = scaling.project(work, system, 3)
    assert row["allreduce_s"] == pytest.approx(three[gradient_bytes], rel=1e-12)
    assert row["compute_s"] == system.step_without_gradients_s[3] and row["stragglers_s"] == 0.0


# The trainings the scaling test times: one rank per node, one thread each, the CosmoFlow demo network at 16^3
# with 32 base filters (124,852 parameters: 0.5 MiB of gradients, 0.4 s of a 10 Mbit/s link for a 2-rank ring).
SCALING_NETWORK = ["--set", "model.base_filters=32", "--set", "train.throughput_warmup_steps=1",
                   "--set", "train.intra_op_threads=1", "--set", "train.inter_op_threads=1",
                   "--set", "mlperf.enabled=false"]


@pytest.mark.skipif(os.environ.get("HPCDL_SCALING_TEST") != "1",
                    reason="opt in with HPCDL_SCALING_TEST=1 (4-7 min): it passed its last runs, but its 2-node point "
                           "leans +7 to +14 % (docs/clusters.md, #27): a margin that would fail some CI runs by chance")
def test_scaling_model_predicts_the_virtual_cluster(virtual_cluster, tmp_path):
    """#27, the scaling model as a model: measure the inputs, predict, then run.  On the 3 nodes at 50 % of a
    core each and 10 Mbit/s links (communication most of a step), common.tools.sysbench measures the system
    as a job, common.tools.scaling predicts the step of 1, 2 and 3 nodes from that file alone, and only then
    do the trainings run, on 1, 2 and 3 nodes, in one allocation.  The medians of their
    steady steps agree with the predictions within 15 % at every node count."""
    from cosmoflow.config import MockSection   # deferred: the generator, only here
    from cosmoflow.mock import generate_dataset

    cluster = virtual_cluster
    data = tmp_path / "data"   # 96 volumes: 24 steps of 4 per epoch on one node, 8 on three
    generate_dataset(data, 96, 16, 16, MockSection(box_size_mpc_h=128.0, seed=7), progress=False)
    settings = tiny_cosmo_overrides(data, epochs=3) + SCALING_NETWORK
    config = "configs/cosmoflow/demo.yaml"
    system_file = tmp_path / "virtual.yaml"
    local_slurm(cluster, "limit", "--cpu-percent", "50", "--link-rate", "10mbit")
    try:
        wrapped_job(cluster, 3, tmp_path / "sysbench.out", sys.executable, "-m", "common.tools.sysbench",
                    "--config", config, *settings, "--out", str(system_file), "--repeats", "15")
        predicted = subprocess.run([sys.executable, "-m", "common.tools.scaling", "--config", config, *settings,
                                    "--system", str(system_file), "--nodes", "1,2,3", "--json"],
                                   cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=300)
        assert predicted.returncode == 0, predicted.stderr
        rows = {row["nodes"]: row for row in json.loads(predicted.stdout)}
        prediction = {n: row["step_time_s"] for n, row in rows.items()}
        # The regime the test is about: on 2 and 3 nodes the gradients' allreduce is most of the step.
        assert all(rows[n]["exposed_allreduce_s"] > rows[n]["compute_s"] for n in (2, 3)), rows
        runs = {n: tmp_path / f"run-{n}" for n in (1, 2, 3)}

        def train(n, nodes):
            command = ["srun", f"-N{n}", f"-n{n}", f"--nodelist={nodes}", "--mpi=pmix", sys.executable, "-m",
                       "cosmoflow.train", "--config", config, *settings, "--output-dir", str(runs[n])]
            return " ".join(shlex.quote(part) for part in command)

        script = tmp_path / "trainings.sh"
        # One after the other, each run alone on its nodes, as the prediction assumes.
        script.write_text("#!/bin/bash\nset -e\n" + "".join(f"{train(n, f'node[1-{n}]')}\n" for n in (1, 2, 3)))
        batch_job(cluster, 3, tmp_path / "trainings.out", str(script), timeout=900)
    finally:
        local_slurm(cluster, "limit", "--cpu-percent", "off", "--link-rate", "off")
    points = []
    for n in (1, 2, 3):
        summary = json.loads((runs[n] / "summary.json").read_text())
        assert summary["ranks"] == n and summary["parameters"] == 124852 and summary["step_time_s"]["steps"] >= 14
        points.append({"nodes": n, "predicted_step_s": round(prediction[n], 4),
                       "measured_step_s": round(summary["step_time_s"]["median"], 4)})
    print(json.dumps({"points": points}))
    for point in points:
        assert abs(point["predicted_step_s"] / point["measured_step_s"] - 1) <= 0.15, points
