"""A measured system: the figures the scaling model needs, measured by a job on the machine it describes.

    srun -N 3 --ntasks-per-node=1 python -m common.tools.sysbench --config C [--set k=v] --out SYSTEM.yaml
                                  [--name NAME] [--description TEXT] [--repeats 9]
    python -m common.tools.sysbench --config C [--set k=v] --alone      # the one-rank step only, as JSON

One rank per node, on two nodes or more.  Four measurements, written (by rank 0) as a system file in the
schema of ``configs/systems/*.yaml`` (:class:`common.tools.scaling.System`), each figure with the
measurement as its source, for ``python -m common.tools.scaling --config C --system SYSTEM.yaml``:

1. compute: the trainer as a job of the first p nodes, p = 2..N, with every collective of its step but the
   gradient allreduce (``step_without_gradients_s``): a rank's compute as it runs in a job, where Horovod's
   loop polls (under a CPU quota it takes a large share), the step-signals allreduce holds the ranks in
   lock-step and every step waits for the slowest of them.  The median over ranks of the median step time of
   the steady epochs is kept; the N-node one gives ``measured_samples_per_second``, its ranks' relative
   standard deviation the ``step_jitter_fraction``.  Last, after Horovod has shut down on every node, the
   first node runs the trainer as a one-rank run in a fresh process, the other nodes idle: a one-node run as
   it trains (no Horovod, the cluster otherwise quiet), ``measured_samples_per_second_one_node``;
2. point to point, ranks 0 and 1 over TCP (the links themselves, no MPI): latency (half the median round
   trip of one byte) and bandwidth (4 MiB sent one way, timed to the receiver's acknowledgement);
3. allreduce: Horovod sum-allreduces of float32 buffers from 4 KiB to the config's gradient size over the
   first p ranks, p = 2..N (the median of the repeats on rank 0), kept as ``network.allreduce_s`` (the
   model interpolates in them for those rank counts); ``network.latency_s`` and
   ``network.node_bandwidth_Bps`` are fitted (least squares in relative error) so that the model's alpha-beta
   cost of one collective (:func:`common.tools.scaling.collective_terms`) matches them, for other rank
   counts: Horovod's negotiation and cycle, MPI and the TCP stack under the node's CPU quota are in them;
4. storage: rank 0 reads the files under ``data.data_dir`` once (the page cache as it is): the read rate.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from common.cli import exit_process, find_application, positive_int_argument, run_command
from common.config import load_config
from common.deferred import tensorflow as tf   # at first use: after the arguments are parsed
from common.errors import ConfigError
from common.storage.transaction import OutputTransaction, Producer
from common.tools.scaling import collective_terms

TOOL = "common.tools.sysbench"

# Imported where used, not here: TensorFlow, Horovod and the engine modules that import them (after the
# arguments are parsed, so that --help answers without them), and yaml (for the output).

P2P_BYTES = 4 * 2 ** 20
PING_REPEATS = 200
ALLREDUCE_REPEATS = 9


def measure_compute(application, cfg, dist=None) -> dict:
    """This rank's training step: the trainer itself (its loop, callbacks, input pipeline) as a run of one rank
    (or as a rank of the job ``dist``), in a folder of its own that is removed afterwards; the step times of its
    steady epochs."""
    # deferred: TensorFlow and the engine
    import keras
    from common.distributed import Distributed
    from common.trainer import train

    # Keras names layers (and Horovod the broadcasts of their variables) by a per-process count: every rank
    # starts each run from the same count, as a fresh process does, whichever runs it sat out before.
    keras.utils.clear_session()
    dist = dist or Distributed()
    run_dir = pathlib.Path(dist.broadcast_object(tempfile.mkdtemp(prefix="sysbench-run-") if dist.is_root else None))
    try:
        summary = train(application, cfg, dist, run_dir / "run")
    finally:
        dist.barrier()
        if dist.is_root:
            shutil.rmtree(run_dir, ignore_errors=True)   # made above, by this rank
    steps = summary["step_time_s"]
    if not steps:
        raise ConfigError("common.tools.sysbench: no training step was timed; give the config more steps per epoch "
                          "(train.throughput_warmup_steps, data) or epochs")
    return {"median_step_s": steps["median"], "mean_step_s": steps["mean"],
            "relative_std": steps["std"] / steps["mean"], "steps": steps["steps"],
            "gradient_bytes": 4 * int(summary["parameters"]), "batch_size": cfg.data.batch_size}


def measure_jobs_without_gradients(application, cfg, dist) -> dict[int, list[dict]]:
    """The trainer's step in a job of the first p ranks, p = 2..N, everything but the gradient allreduce: every
    rank's compute with Horovod's loop running, the step-signals allreduce that keeps the ranks in lock-step and
    the wait for the slowest of them (``{p: [each rank's measure_compute]}``, on every rank)."""
    out = {}
    for participants in range(2, dist.world_size + 1):
        job = dist.prefix_job(participants, reduce_gradients=False)
        mine = measure_compute(application, cfg, job) if job is not None else None
        out[participants] = [m for m in dist.world_allgather_object(mine) if m is not None]
    return out


def measure_one_node_run(args, environment: dict[str, str]) -> dict:
    """The trainer as a one-node run trains: a fresh process of one rank (``--alone``, with ``environment``: no
    launcher variables, so no Horovod), its figures (:func:`measure_compute`) read from its last line; its
    messages pass through to this process's."""
    command = [sys.executable, "-m", "common.tools.sysbench", "--config", args.config, "--alone",
               *[part for override in args.set for part in ("--set", override)],
               *(["--app", args.app] if args.app else [])]
    result = subprocess.run(command, env=environment, stdout=subprocess.PIPE, text=True, check=False)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise ConfigError(f"common.tools.sysbench: the one-node run (--config {args.config} --alone, a process of "
                          f"its own) failed with exit code {result.returncode}; its messages are above")
    return json.loads(lines[-1])


def _serve(listener: socket.socket) -> None:
    """Rank 1's side: echo each one-byte ping, then take the bulk transfer and acknowledge it."""
    connection, _ = listener.accept()
    with connection:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(PING_REPEATS):
            connection.sendall(connection.recv(1))
        received = 0
        while received < P2P_BYTES:
            chunk = connection.recv(1 << 20)
            if not chunk:
                raise ConnectionError("rank 0 closed the bulk transfer early")
            received += len(chunk)
        connection.sendall(b"k")


def measure_point_to_point(dist) -> dict | None:
    """Ranks 0 and 1 over TCP: one-byte ping-pong and a 4 MiB one-way transfer (rank 0's view)."""
    listener = None
    if dist.world_rank == 1:
        listener = socket.create_server(("0.0.0.0", 0))
        address = (socket.gethostbyname(socket.gethostname()), listener.getsockname()[1])
    else:
        address = None
    addresses = dist.world_allgather_object(address)
    result = None
    if dist.world_rank == 1:
        with listener:
            _serve(listener)
    elif dist.world_rank == 0:
        with socket.create_connection(addresses[1], timeout=120) as connection:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            trips = []
            for _ in range(PING_REPEATS):
                start = time.perf_counter()
                connection.sendall(b"p")
                connection.recv(1)
                trips.append(time.perf_counter() - start)
            payload = b"\0" * P2P_BYTES
            start = time.perf_counter()
            connection.sendall(payload)
            connection.recv(1)
            elapsed = time.perf_counter() - start
        result = {"latency_s": statistics.median(trips) / 2, "bandwidth_Bps": P2P_BYTES / elapsed,
                  "peer": f"{addresses[1][0]}"}
    dist.world_barrier()
    return result


def allreduce_sizes(gradient_bytes: int) -> list[int]:
    """4 KiB, then x8 steps up to the gradient size (which is measured too)."""
    sizes, size = [], 4096
    while size < gradient_bytes:
        sizes.append(size)
        size *= 8
    return sizes + [max(4096, gradient_bytes)]


def time_allreduce(dist, n_bytes: int, participants: int, repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` sum-allreduces of a float32 buffer of ``n_bytes`` over the first
    ``participants`` ranks (their own job: :meth:`~common.distributed.Distributed.prefix_job`), timed on this
    rank after one untimed; the ranks outside them return ``[]`` at once."""
    job = dist.prefix_job(participants)
    if job is None:
        return []
    buffer = tf.ones([max(1, n_bytes // 4)], tf.float32)
    job.allreduce(buffer, average=False, name=f"time_allreduce_{participants}_warm").numpy()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        job.allreduce(buffer, average=False, name=f"time_allreduce_{participants}").numpy()
        times.append(time.perf_counter() - start)
    return times


def measure_allreduce(dist, sizes: list[int], repeats: int = ALLREDUCE_REPEATS) -> list[dict]:
    """Median seconds of sum-allreduces of each size over the first p ranks, p = 2..N (rank 0's clock)."""
    rows = []
    for participants in range(2, dist.world_size + 1):
        for n_bytes in sizes:
            times = time_allreduce(dist, n_bytes, participants, repeats)
            if times:
                rows.append({"ranks": participants, "bytes": n_bytes, "seconds": float(np.median(times))})
        dist.world_barrier()
    return rows


def fit_network(rows: list[dict]) -> tuple[float, float, float]:
    """(latency_s, bandwidth_Bps, worst relative error) of the model's per-collective cost fitted to ``rows``:
    t = a(p) latency + b(p, n) / bandwidth, least squares in relative error, both figures kept positive."""
    terms = np.array([collective_terms(r["bytes"], r["ranks"]) for r in rows], dtype=float)
    seconds = np.array([r["seconds"] for r in rows])
    weighted = terms / seconds[:, None]
    (latency, inverse_bandwidth), *_ = np.linalg.lstsq(weighted, np.ones(len(rows)), rcond=None)
    if latency <= 0 or inverse_bandwidth <= 0:   # one term alone, refitted
        lat_only = float(np.sum(weighted[:, 0]) / np.sum(weighted[:, 0] ** 2))
        bw_only = float(np.sum(weighted[:, 1]) / np.sum(weighted[:, 1] ** 2))
        if inverse_bandwidth <= 0:
            latency, inverse_bandwidth = lat_only, 1e-12
        else:
            latency, inverse_bandwidth = 1e-9, bw_only
    predicted = terms @ np.array([latency, inverse_bandwidth])
    worst = float(np.max(np.abs(predicted / seconds - 1.0)))
    return float(latency), float(1.0 / inverse_bandwidth), worst


def measure_storage(files: list[str]) -> dict:
    """Rank 0 reads ``files`` once: bytes / seconds."""
    total, start = 0, time.perf_counter()
    for path in files:
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 22):
                total += len(chunk)
    elapsed = max(time.perf_counter() - start, 1e-9)
    return {"files": len(files), "bytes": total, "read_Bps": total / elapsed}


def algorithm_note() -> tuple[str, str]:
    """(the model's allreduce algorithm, why): ``ring`` when Open MPI was told to use its ring, else ``auto``."""
    if os.environ.get("OMPI_MCA_coll_tuned_use_dynamic_rules") == "1" and \
            os.environ.get("OMPI_MCA_coll_tuned_allreduce_algorithm") in ("4", "ring"):
        return "ring", "Open MPI's allreduce set to its ring (OMPI_MCA_coll_tuned_allreduce_algorithm=4) for this job"
    return "auto", "the MPI library's own choice (the model takes the cheaper of ring and tree)"


def system_document(name: str, description: str, nodes: int, in_jobs: dict[int, list[dict]], alone: dict,
                    p2p: dict, rows: list[dict], fit: tuple[float, float, float], storage: dict, cpu: dict,
                    config: str, algorithm: tuple[str, str] = ("auto", "")) -> dict:
    """The system file: figures, sources, and the raw measurement under ``measured``."""
    latency, bandwidth, worst = fit
    without_gradients = {p: statistics.median(c["median_step_s"] for c in jobs) for p, jobs in in_jobs.items()}
    compute = in_jobs[nodes]
    medians = [c["median_step_s"] for c in compute]
    step = without_gradients[nodes]
    alone_step = alone["median_step_s"]
    batch = compute[0]["batch_size"]
    jitter = statistics.median(c["relative_std"] for c in compute)
    sustained = 0.5   # unused when the measured rate is given; required by the schema
    isa = [k for k, v in cpu.get("isa", {}).items() if v]
    cpu_text = f"{cpu.get('cpu_model', '?')}, {cpu.get('cpus_available', '?')} CPUs, {'/'.join(isa) or 'no listed ISA'}"
    return {
        "name": name,
        "description": description,
        "ranks_per_node": 1,
        "peak_tflops_per_rank": {"fp32": 1.0},
        "sustained_fraction": sustained,
        "network": {"latency_s": latency, "node_bandwidth_Bps": bandwidth, "intra_node_latency_s": 0.0,
                    "intra_node_bandwidth_Bps": bandwidth,
                    "allreduce_s": {r: {row["bytes"]: row["seconds"] for row in rows if row["ranks"] == r}
                                    for r in sorted({row["ranks"] for row in rows})}},
        "storage": {"node_local_read_Bps": storage["read_Bps"], "pfs_per_node_read_Bps": storage["read_Bps"],
                    "pfs_aggregate_read_Bps": storage["read_Bps"] * nodes},
        "step_jitter_fraction": jitter,
        "algorithm": algorithm[0],
        "overlap": 0.0,
        "measured_samples_per_second": batch / step,
        "measured_samples_per_second_one_node": batch / alone_step,
        "step_without_gradients_s": without_gradients,
        "sources": {
            "step_without_gradients_s": f"common.tools.sysbench: {config} at batch {batch}, the trainer as a job "
                                        f"of the first p nodes (one rank each), p = 2..{nodes}, every collective of "
                                        f"its step but the gradient allreduce (the step-signals allreduce keeps "
                                        f"the ranks in lock-step): the median over ranks of the median step of "
                                        f"the steady epochs; {cpu_text}",
            "measured_samples_per_second": f"the local batch over that step on all {nodes} nodes, {step:.4f} s "
                                           f"(per-rank medians {', '.join(f'{m:.4f}' for m in medians)}, "
                                           f"{compute[0]['steps']} steps each)",
            "measured_samples_per_second_one_node": f"the trainer as a one-rank run (no Horovod) in a fresh "
                                                    f"process on the first node, the other nodes idle, after "
                                                    f"every other measurement: median step {alone_step:.4f} s "
                                                    f"({alone['steps']} steps)",
            "step_jitter_fraction": f"median over the {nodes} ranks of the relative standard deviation of their step "
                                    f"times in that job",
            "allreduce_s": "the allreduce times below, measured: the model interpolates in them for the rank "
                           "counts measured, and uses latency_s and node_bandwidth_Bps beyond",
            "algorithm": algorithm[1],
            "overlap": "this suite's step reduces all gradients in one grouped allreduce after the backward pass",
            "latency_s": f"fitted with node_bandwidth_Bps to {len(rows)} Horovod allreduce times (2..{nodes} ranks, "
                         f"{rows[0]['bytes']} B..{rows[-1]['bytes']} B; worst relative misfit {worst:.0%}); "
                         f"TCP point to point {p2p['latency_s'] * 1e6:.0f} us",
            "node_bandwidth_Bps": f"fitted with latency_s (above); TCP point to point "
                                  f"{p2p['bandwidth_Bps'] / 1e6:.2f} MB/s ({P2P_BYTES} B one way)",
            "storage": f"rank 0 read the {storage['files']} files of data.data_dir ({storage['bytes']} B) once, page cache as it was",
            "peak_tflops_per_rank": "not measured: projections from this file use measured_samples_per_second",
        },
        "measured": {"jobs_without_gradients": in_jobs,
                     "one_node_run": alone, "point_to_point": p2p, "allreduce": rows,
                     "storage": storage, "cpu": cpu},
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m common.tools.sysbench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the app config whose step the compute rate is of")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--app")
    parser.add_argument("--out", help="the system file to write (a new file, or one this suite wrote)")
    parser.add_argument("--force", action="store_true", help="replace an --out file this suite did not write")
    parser.add_argument("--name", default="measured")
    parser.add_argument("--description", default="")
    parser.add_argument("--repeats", type=positive_int_argument, default=ALLREDUCE_REPEATS,
                        help="allreduces timed per size")
    parser.add_argument("--alone", action="store_true",
                        help="only time the trainer as a run of this one process, and print its figures as JSON "
                             "(what the job does last, on its first node)")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.alone and not args.out:
        parser.error("--out is required (unless --alone)")
    transaction = OutputTransaction(Producer(TOOL, ""), args.force, inputs=[args.config])
    # deferred: TensorFlow and Horovod, after the arguments are parsed
    from common import distributed
    from common.console import cpu

    application = find_application(args.config, args.app)
    cfg = load_config(application.config_schema, args.config, args.set)
    if args.alone:
        if distributed.launched_world_size() > 1:
            raise ConfigError("common.tools.sysbench --alone: run it as one process, not as ranks of a job")
        distributed.configure_threads(cfg.train.intra_op_threads, cfg.train.inter_op_threads, 1)
        print(json.dumps(measure_compute(application, cfg)), flush=True)
        return 0
    if distributed.launched_world_size() < 2:
        raise ConfigError("common.tools.sysbench: run one rank per node on 2 nodes or more (srun -N N "
                          "--ntasks-per-node=1); this process was launched alone")
    transaction.check([args.out], options={args.out: "--out"})   # before the job measures anything
    dist = distributed.init(cfg.train.intra_op_threads, cfg.train.inter_op_threads, prefix_sets=True)
    if dist.local_size != 1:
        raise ConfigError(f"common.tools.sysbench: run one rank per node ({dist.local_size} ranks on this node)")
    # Compute as it runs in jobs of 2..N ranks without the gradient allreduce: under a CPU quota Horovod's
    # loop takes a large share (measured 1.7-2x at 50% of a core on the virtual cluster), so a rank alone
    # is no measure of its compute in a job.
    in_jobs = measure_jobs_without_gradients(application, cfg, dist)
    p2p = measure_point_to_point(dist)
    rows = measure_allreduce(dist, allreduce_sizes(in_jobs[2][0]["gradient_bytes"]), args.repeats)
    # Last, the one-node run, as one trains: Horovod stopped on every node (its loop polls), one fresh
    # process on the first node.  Measured first, before Horovod on every node at once, it ran 8-15 %
    # faster than the one-node trainings that followed (#27: what is measured first runs fastest here).
    dist.world_barrier()
    dist.shutdown()
    if dist.is_root:
        alone = measure_one_node_run(args, distributed.single_process_environment())
        files = sorted(str(f) for f in pathlib.Path(cfg.data.data_dir).rglob("*") if f.is_file())
        document = system_document(args.name, args.description, dist.world_size, in_jobs, alone, p2p, rows,
                                   fit_network(rows), measure_storage(files), cpu.describe(), args.config,
                                   algorithm_note())
        with transaction, transaction.reading(f"the measurements of {args.config}"):
            transaction.yaml(args.out, document)
        print(json.dumps({"system": args.out, "network": document["network"],
                          "measured_samples_per_second": document["measured_samples_per_second"],
                          "step_without_gradients_s": document["step_without_gradients_s"],
                          "measured_samples_per_second_one_node":
                              document["measured_samples_per_second_one_node"],
                          "step_jitter_fraction": document["step_jitter_fraction"],
                          "point_to_point": p2p, "allreduce": rows}), flush=True)
    return 0


if __name__ == "__main__":
    exit_process(run_command(main, name=TOOL))
