"""A scaling model: projected step time, samples/s and parallel efficiency per node count.

    python -m common.tools.scaling --config configs/cosmoflow/mlperf.yaml --system perlmutter --nodes 1,4,16,64,256
                                   [--samples-per-second R | --rate-from runs/x/summary.json] [--json] [--png F]
    python -m common.tools.scaling --published          # the SC18 points, model vs paper

One synchronous data-parallel step on N nodes of r ranks each takes

    t_step = max(t_compute + t_exposed_comm + t_stragglers, t_io)

- ``t_compute`` = local batch x training FLOPs per sample / sustained FLOP/s
  of one rank (measured samples/s when given, else the system's peak x its
  sustained fraction);
- ``t_comm``: the gradients (parameters x bytes per gradient) go out in
  ceil(bytes / fusion threshold) fused allreduces (Horovod tensor fusion);
  each is hierarchical when r > 1: reduce-scatter + all-gather inside the
  node over NVLink/PCIe, then an allreduce of 1/r of the buffer between nodes
  with the node's injection bandwidth shared by its r ranks.  An allreduce of
  n bytes over p participants costs, with latency alpha and bandwidth B,
  ``ring``: 2(p-1) alpha + 2(p-1)/p n/B, or ``tree`` (recursive halving and
  doubling, Rabenseifner): 2 ceil(log2 p) alpha + 2(p-1)/p n/B; ``auto``
  takes the cheaper, as MPI and NCCL do.  Horovod's negotiation adds one
  tree-latency round per fused buffer;
  A step of this suite's trainer also has one small allreduce (the loss and
  the stop signals, :mod:`common.training_model`): one more latency-bound
  collective per step;
- ``t_exposed_comm`` = t_comm - the part hidden behind back-propagation
  (``overlap`` x 2/3 of t_compute: gradients of the last layers are reduced
  while earlier layers still back-propagate); with gradient lag as SC18 ran
  it the whole step hides it.  This suite's trainer reduces every gradient in
  one grouped allreduce after the whole backward pass, and its gradient lag
  overlaps that allreduce with the optimizer update only, so for its configs
  nothing is hidden (overlap 0);
- ``t_stragglers``: every step waits for the slowest of N nodes; with step
  times of relative standard deviation s (``step_jitter_fraction``; noise
  from the OS and the network hits a node's ranks together), the expected
  maximum of N exceeds the mean by about s x t_compute x sqrt(2 ln N); with
  gradient lag a rank has one step of slack, which averages two steps' noise
  (s / sqrt 2);
- ``t_io``: reading the local batch from node-local storage (staged) or from
  the parallel file system (the node's share of its aggregate bandwidth);
  prefetching overlaps it with compute, so it only matters when it is longer.

A system file measured by :mod:`common.tools.sysbench` also holds allreduce
times by node count and size (``network.allreduce_s``): for those node counts
(one rank per node) the model interpolates in them instead of the alpha-beta
formula, and a one-node run's compute rate of its own (no Horovod there).
It also holds the step of a job of N nodes without its gradient allreduce
(``step_without_gradients_s``): for those N it stands for t_compute, the
small collectives and t_stragglers together (a rank computes more slowly in a
job than alone where Horovod's loop competes for its CPU, and lock-step waits
for the slowest), and the gradients' allreduce is added to it.

A measured rate (``--samples-per-second``, ``--rate-from``, ``--input-rate-from``) must be a positive finite
number, and one read from a file must have been measured for the workload projected: a bench JSON for the
config's application at the sample shape its network takes (:func:`common.tools.bench.read_result` and
:func:`~common.tools.bench.check_workload`), a run's summary.json for its application and network (the
forward FLOPs per sample); anything else is a one-line error naming the file.

Efficiency(N) = samples/s on N nodes / (N x samples/s on 1 node).  Staging
time (one-off, before training) = dataset bytes / min(N x per-node PFS
bandwidth, aggregate PFS bandwidth).  System figures live in
``configs/systems/<name>.yaml`` with their sources.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
from typing import Literal

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt

from common.cli import exit_process, find_application, positive_number_argument, run_command
from common.config import Section, load_config, read_yaml, validate
from common.deferred import pyplot as plt
from common.errors import ConfigError, DataError
from common.storage.transaction import OutputTransaction, Producer
from common.tools import bench

TOOL = "common.tools.scaling"

# Imported where used, not here: TensorFlow and the engine modules that import it, so that --help and argument or
# config errors answer without it; matplotlib, only for --png.

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
SYSTEMS_DIR = REPO_ROOT / "configs" / "systems"
PUBLISHED = REPO_ROOT / "configs" / "scaling" / "published.yaml"
BACKWARD_SHARE = 2.0 / 3.0   # of a training step (forward 1, backward 2, in the 3 x forward convention)


class Network(Section):
    latency_s: NonNegativeFloat = Field(description="MPI point-to-point latency between nodes")
    node_bandwidth_Bps: PositiveFloat = Field(description="achievable per-node injection bandwidth")
    intra_node_latency_s: NonNegativeFloat
    intra_node_bandwidth_Bps: PositiveFloat
    allreduce_s: dict[int, dict[float, PositiveFloat]] = Field(
        {}, description="measured allreduce seconds by nodes (one rank each) and bytes (common.tools.sysbench); the "
                        "model interpolates in them for those node counts instead of the alpha-beta formula")


class Storage(Section):
    node_local_read_Bps: PositiveFloat = Field(description="node-local read bandwidth (staged data)")
    pfs_per_node_read_Bps: PositiveFloat
    pfs_aggregate_read_Bps: PositiveFloat


class System(Section):
    """One ``configs/systems/<name>.yaml``: the machine figures the model needs, each with its source."""

    name: str
    description: str = ""
    ranks_per_node: PositiveInt
    peak_tflops_per_rank: dict[Literal["fp32", "mixed_float16", "mixed_bfloat16"], PositiveFloat]
    sustained_fraction: float = Field(gt=0.0, le=1.0, description="of peak, for projections without a measured rate")
    network: Network
    storage: Storage
    step_jitter_fraction: NonNegativeFloat
    overlap: float = Field(0.8, ge=0.0, le=1.0, description="share of back-propagation the allreduce can hide under")
    algorithm: Literal["auto", "ring", "tree"] = "auto"
    measured_samples_per_second: PositiveFloat | None = Field(
        None, description="a per-rank training rate measured on this system (common.tools.sysbench), for the "
                          "config it was measured with, Horovod running (a rank of a job of several)")
    measured_samples_per_second_one_node: PositiveFloat | None = Field(
        None, description="the same without Horovod (a one-node run of one rank starts none)")
    step_without_gradients_s: dict[int, PositiveFloat] = Field(
        {}, description="seconds of the measured config's step in a job of N nodes (one rank each) without its "
                        "gradient allreduce, by N (common.tools.sysbench): compute as a rank of a job, the "
                        "step-signals allreduce and the wait for the slowest rank")

    sources: dict[str, str] = {}
    measured: dict = Field({}, description="the raw measurement behind a measured system file")


def available_systems() -> list[str]:
    """The names of the systems in ``configs/systems/``."""
    return sorted(p.stem for p in SYSTEMS_DIR.glob("*.yaml"))


def load_system(name_or_path: str) -> System:
    """A system by name (``configs/systems/<name>.yaml``) or by path; a ConfigError listing the known ones."""
    path = pathlib.Path(name_or_path)
    if not path.is_file():
        path = SYSTEMS_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ConfigError(f"--system {name_or_path}: unknown; known systems: {', '.join(available_systems())} "
                          f"(or a YAML file)")
    return validate(System, read_yaml(path), str(path))


def allreduce_time(n_bytes: float, participants: int, latency_s: float, bandwidth_Bps: float,
                   algorithm: str = "auto") -> float:
    """Alpha-beta cost of one allreduce of ``n_bytes`` over ``participants``."""
    p = participants
    if p <= 1 or n_bytes <= 0:
        return 0.0
    bandwidth_term = 2.0 * (p - 1) / p * n_bytes / bandwidth_Bps
    ring = 2.0 * (p - 1) * latency_s + bandwidth_term
    tree = 2.0 * math.ceil(math.log2(p)) * latency_s + bandwidth_term
    return {"ring": ring, "tree": tree, "auto": min(ring, tree)}[algorithm]


def collective_terms(n_bytes: float, participants: int) -> tuple[float, float]:
    """(latency coefficient, bytes per unit of inverse bandwidth) of one collective of ``n_bytes`` over
    ``participants`` nodes of one rank (``algorithm: auto``), with Horovod's negotiation: the cost is
    ``a x latency_s + b / node_bandwidth_Bps`` (what :mod:`common.tools.sysbench` fits)."""
    if participants <= 1:
        return 0.0, 0.0
    latency_rounds = allreduce_time(1.0, participants, 1.0, math.inf, "auto") + negotiation_rounds(participants)
    return latency_rounds, allreduce_time(n_bytes, participants, 0.0, 1.0, "auto")


def negotiation_rounds(ranks: int) -> float:
    """Latency rounds of Horovod's negotiation of one collective over ``ranks`` (a tree each way)."""
    return 2.0 * math.ceil(math.log2(ranks))


@dataclasses.dataclass(frozen=True)
class Workload:
    """What one rank does per step."""

    parameters: int
    training_flops_per_sample: float
    local_batch: int
    gradient_bytes_per_parameter: int = 4
    sample_bytes: float = 0.0
    rank_samples_per_second: float | None = None   # measured; else from the system's peak
    precision: str = "fp32"
    gradient_lag: bool = False
    staged: bool = True
    fusion_threshold_bytes: float = 128 * 2 ** 20
    dataset_bytes: float = 0.0
    # The input pipeline's own rate (read, inflate, parse, normalise) with the cores a rank gives it, measured by
    # common.tools.bench --input-only; None: only the storage bandwidth bounds the input.
    input_samples_per_second_per_rank: float | None = None
    rank_samples_per_second_one_node: float | None = None   # measured without Horovod; else the rate above
    # Measured steps without the gradient allreduce in jobs of N nodes of one rank (System.step_without_gradients_s):
    # for those N they replace compute, the small collectives and the stragglers; beyond the largest N, that
    # step plus the stragglers' growth.
    step_without_gradients_s: dict[int, float] = dataclasses.field(default_factory=dict)
    # The software's share of back-propagation the allreduce hides under (None: the system's figure), whether
    # gradient lag hides it behind a whole step (SC18) or only behind the update, and the small latency-bound
    # collectives of each step besides the gradients.
    overlap: float | None = None
    lag_hides_step: bool = True
    small_collectives_per_step: int = 0
    # What a rate read from a file must have been measured for (workload_from_config sets them from the config).
    application: str = ""
    sample_shape: tuple[int, ...] = ()
    config: str = ""


def measured_allreduce(table: dict[float, float], n_bytes: float) -> float:
    """Seconds of an allreduce of ``n_bytes`` from measured (bytes, seconds): linear interpolation between
    the sizes measured, the nearest one's time below the smallest, the last two's slope beyond the largest."""
    sizes = sorted(table)
    if n_bytes <= sizes[0]:
        return table[sizes[0]]
    for low, high in zip(sizes, sizes[1:]):
        if n_bytes <= high:
            return table[low] + (table[high] - table[low]) * (n_bytes - low) / (high - low)
    if len(sizes) == 1:
        return table[sizes[0]] * n_bytes / sizes[0]
    low, high = sizes[-2], sizes[-1]
    return table[high] + (table[high] - table[low]) * (n_bytes - high) / (high - low)


def communication_time(work: Workload, system: System, nodes: int) -> float:
    """Allreduce time of one step's gradients (fused buffers, hierarchical inside a node)."""
    r = system.ranks_per_node
    total = work.parameters * work.gradient_bytes_per_parameter
    if total <= 0 or nodes * r <= 1:
        return 0.0
    buffers = max(1, math.ceil(total / work.fusion_threshold_bytes))
    per_buffer = total / buffers
    table = system.network.allreduce_s.get(nodes) if r == 1 else None
    if table:   # measured on this system for this many nodes: Horovod's negotiation is in the times
        return buffers * measured_allreduce(table, per_buffer) + \
            work.small_collectives_per_step * measured_allreduce(table, 16)
    net = system.network

    def collective(n_bytes: float) -> float:
        intra = allreduce_time(n_bytes, r, net.intra_node_latency_s, net.intra_node_bandwidth_Bps, "ring")
        inter = allreduce_time(n_bytes / r, nodes, net.latency_s, net.node_bandwidth_Bps / r, system.algorithm)
        return intra + inter + negotiation_rounds(nodes * r) * net.latency_s

    return buffers * collective(per_buffer) + work.small_collectives_per_step * collective(16)


def compute_time(work: Workload, system: System, nodes: int) -> float:
    """Seconds of compute per step on one rank: from a measured per-rank rate if given, else FLOPs over the
    system's sustained peak for the precision."""
    if nodes == 1 and system.ranks_per_node == 1 and work.rank_samples_per_second_one_node:
        return work.local_batch / work.rank_samples_per_second_one_node   # one rank alone: no Horovod
    if work.rank_samples_per_second:
        return work.local_batch / work.rank_samples_per_second
    peak = system.peak_tflops_per_rank.get(work.precision)
    if peak is None:
        raise ConfigError(f"system {system.name}: no peak for precision {work.precision}")
    return work.local_batch * work.training_flops_per_sample / (peak * 1e12 * system.sustained_fraction)


def project(work: Workload, system: System, nodes: int) -> dict:
    """The step of ``nodes`` nodes: times in seconds, samples/s."""
    ranks = nodes * system.ranks_per_node
    jitter = system.step_jitter_fraction / (math.sqrt(2.0) if work.gradient_lag else 1.0)
    measured = work.step_without_gradients_s if system.ranks_per_node == 1 and nodes > 1 else {}
    if measured:   # the step of a job without its gradient allreduce, measured on this system
        largest = max((k for k in measured if k <= nodes), default=min(measured))
        t_compute = measured[largest]
        t_comm = communication_time(dataclasses.replace(work, small_collectives_per_step=0), system, nodes)
        growth = math.sqrt(2.0 * math.log(nodes)) - math.sqrt(2.0 * math.log(largest))
        stragglers = jitter * t_compute * max(0.0, growth)
    else:
        t_compute = compute_time(work, system, nodes)
        t_comm = communication_time(work, system, nodes)
        stragglers = jitter * t_compute * math.sqrt(2.0 * math.log(nodes)) if nodes > 1 else 0.0
    overlap = system.overlap if work.overlap is None else work.overlap
    hidden = t_compute if work.gradient_lag and work.lag_hides_step else overlap * BACKWARD_SHARE * t_compute
    exposed = max(0.0, t_comm - hidden)
    if work.staged:
        read_Bps = system.storage.node_local_read_Bps
    else:
        read_Bps = min(system.storage.pfs_per_node_read_Bps, system.storage.pfs_aggregate_read_Bps / nodes)
    t_io = work.local_batch * system.ranks_per_node * work.sample_bytes / read_Bps
    if work.input_samples_per_second_per_rank:   # the pipeline's CPU work, when it is slower than the storage
        t_io = max(t_io, work.local_batch / work.input_samples_per_second_per_rank)
    step = max(t_compute + exposed + stragglers, t_io)
    out = {"nodes": nodes, "ranks": ranks, "global_batch_size": ranks * work.local_batch, "step_time_s": step,
           "compute_s": t_compute, "allreduce_s": t_comm, "exposed_allreduce_s": exposed,
           "stragglers_s": stragglers, "io_s": t_io, "samples_per_second": ranks * work.local_batch / step}
    if work.dataset_bytes:
        out["staging_time_s"] = work.dataset_bytes / min(nodes * system.storage.pfs_per_node_read_Bps,
                                                         system.storage.pfs_aggregate_read_Bps)
    return out


def scaling_table(work: Workload, system: System, node_counts: list[int]) -> list[dict]:
    """One projected row per node count, with the parallel efficiency against one node."""
    one = project(work, system, 1)["samples_per_second"]
    rows = []
    for nodes in node_counts:
        row = project(work, system, nodes)
        row["efficiency"] = row["samples_per_second"] / (nodes * one)
        rows.append(row)
    return rows


# -- inputs from an application config ----------------------------------------------------------

def workload_from_config(config: str, overrides: list[str], rank_samples_per_second: float | None,
                         dataset_bytes: float = 0.0, sample_bytes: float | None = None) -> Workload:
    """The per-rank workload a training config describes (batch, FLOPs per sample, gradient bytes, precision), from
    the model the config builds."""
    # deferred: imports TensorFlow; projections from a system file need none
    from common.nn.flops import TRAINING_FLOPS_FACTOR
    from common.trainer import describe_model

    app = find_application(config, None, app_option=False)
    cfg = load_config(app.config_schema, config, overrides)
    described = describe_model(app, cfg, 1)
    compressed = cfg.distributed.gradient_compression == "fp16"
    fusion = (cfg.distributed.fusion_threshold_mb or 128) * 2 ** 20
    return Workload(parameters=described["parameters"],
                    training_flops_per_sample=TRAINING_FLOPS_FACTOR * described["forward_flops_per_sample"],
                    local_batch=cfg.data.batch_size, gradient_bytes_per_parameter=2 if compressed else 4,
                    sample_bytes=sample_bytes or 4.0 * math.prod(described["input_shape"]),
                    rank_samples_per_second=rank_samples_per_second, precision=described["precision"],
                    gradient_lag=bool(getattr(cfg.train, "gradient_lag", 0)),
                    staged=bool(getattr(cfg.data, "stage_dir", None)), fusion_threshold_bytes=fusion,
                    dataset_bytes=dataset_bytes,
                    # This suite's step (common/training_model.py): one grouped allreduce after the backward pass,
                    # lag overlapping only the update, and the step-signals allreduce.
                    overlap=0.0, lag_hides_step=False, small_collectives_per_step=1,
                    application=app.name, sample_shape=tuple(described["input_shape"]), config=config)


def input_rate_from_json(path: str, work: Workload, staged: bool = False) -> float:
    """Samples/s per core of the input pipeline from a ``common.tools.bench --input-only`` JSON measured for
    ``work``'s application and sample shape (the staged, inflated copy's rate with ``staged``)."""
    result = bench.read_result(path, "input-only")
    bench.check_workload(result, path, work.application, work.sample_shape, f"the samples of {work.config}")
    if staged and "staged" not in result:
        raise DataError(f"{path}: no staged section; --input-staged needs a bench --input-only "
                        "--stage-decompressed result")
    return bench.recorded_rate(result, path, "staged" if staged else "input", "samples_per_second_per_core")


def rate_from_json(path: str, work: Workload) -> float:
    """Per-rank training samples/s from a run's summary.json or a bench JSON of the training measurements,
    measured for ``work``: the same application and network (forward FLOPs per sample), and for a bench JSON
    the same sample shape."""
    from common.nn.flops import TRAINING_FLOPS_FACTOR   # deferred: Keras (workload_from_config loaded it)

    data = bench.load_json(path)
    if bench.result_kind(data) is not None:   # a bench result: the compute rate, on one batch held in memory
        data = bench.read_result(path, "training")
        bench.check_workload(data, path, work.application, work.sample_shape, f"the samples of {work.config}")
        rate = bench.recorded_rate(data, path, "compute")
    elif "app" in data and "samples_per_second" in data:   # a run's summary.json
        if data["app"] != work.application:
            raise DataError(f"{path}: a {data['app']} run; expected a {work.application} one ({work.config})")
        rate = bench.positive_finite(data["samples_per_second"], f"{path}: samples_per_second")
    else:
        raise DataError(f"{path}: no samples_per_second; expected a run's summary.json or a common.tools.bench "
                        "JSON")
    forward = data.get("forward_flops_per_sample")
    expected = work.training_flops_per_sample / TRAINING_FLOPS_FACTOR
    if not (isinstance(forward, (int, float)) and math.isclose(forward, expected, rel_tol=1e-6)):
        raise DataError(f"{path}: measured a network of forward_flops_per_sample {json.dumps(forward)}; "
                        f"{work.config} builds one of {expected:.0f}: measure that config")
    return rate / bench.recorded_ranks(data, path)


# -- the published points ---------------------------------------------------------------------------

class PublishedWorkload(Section):
    parameters: PositiveFloat
    training_flops_per_sample: PositiveFloat
    local_batch: PositiveInt
    gradient_bytes: PositiveInt = 4
    sample_bytes: NonNegativeFloat
    rank_samples_per_second: PositiveFloat
    gradient_lag: bool = False
    staged: bool = True
    fusion_threshold_mb: PositiveFloat = 128.0


class PublishedPoint(Section):
    name: str
    system: str
    nodes: PositiveInt
    published_efficiency: float = Field(gt=0.0, le=1.0)
    workload: PublishedWorkload
    basis: str = Field(min_length=1, description="where each input comes from")


class PublishedPoints(Section):
    points: list[PublishedPoint]


def published_points() -> list[dict]:
    """Each published point with the model's efficiency for it (inputs in configs/scaling/published.yaml)."""
    out = []
    for point in validate(PublishedPoints, read_yaml(PUBLISHED), str(PUBLISHED)).points:
        system = load_system(point.system)
        w = point.workload
        work = Workload(parameters=int(w.parameters), training_flops_per_sample=w.training_flops_per_sample,
                        local_batch=w.local_batch, gradient_bytes_per_parameter=w.gradient_bytes,
                        sample_bytes=w.sample_bytes, rank_samples_per_second=w.rank_samples_per_second,
                        gradient_lag=w.gradient_lag, staged=w.staged,
                        fusion_threshold_bytes=w.fusion_threshold_mb * 2 ** 20)
        row = scaling_table(work, system, [point.nodes])[0]
        out.append({"name": point.name, "system": system.name, "nodes": point.nodes,
                    "published_efficiency": point.published_efficiency, "model_efficiency": row["efficiency"],
                    "difference_points": 100 * (row["efficiency"] - point.published_efficiency),
                    "step_time_s": row["step_time_s"], "exposed_allreduce_s": row["exposed_allreduce_s"],
                    "stragglers_s": row["stragglers_s"]})
    return out


def plot(rows: list[dict], title: str):
    """Samples/s and parallel efficiency against nodes: the figure."""
    nodes = [r["nodes"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    left.loglog(nodes, [r["samples_per_second"] for r in rows], "o-", label="model")
    left.loglog(nodes, [rows[0]["samples_per_second"] / rows[0]["nodes"] * n for n in nodes], "k:", label="ideal")
    left.set_xlabel("nodes")
    left.set_ylabel("samples/s")
    left.legend()
    right.semilogx(nodes, [100 * r["efficiency"] for r in rows], "o-")
    right.set_xlabel("nodes")
    right.set_ylabel("parallel efficiency (%)")
    right.set_ylim(0, 105)
    for axis in (left, right):
        axis.grid(alpha=0.3, which="both")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m common.tools.scaling", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="application config (model, local batch, precision, compression)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--system", help=f"one of {', '.join(available_systems())}, or a YAML file")
    parser.add_argument("--nodes", default="1,2,4,8,16,32,64,128,256,512,1024")
    measured = parser.add_mutually_exclusive_group()
    measured.add_argument("--samples-per-second", type=positive_number_argument,
                          help="measured training samples/s of one rank")
    measured.add_argument("--rate-from", help="summary.json of a run or a common.tools.bench JSON of this config: "
                                              "its per-rank rate")
    parser.add_argument("--dataset-bytes", type=positive_number_argument,
                        help="dataset size, for the staging time")
    parser.add_argument("--input-rate-from", metavar="BENCH.json",
                        help="a common.tools.bench --input-only JSON of this config's application and sample shape: "
                             "the input pipeline's per-core rate bounds the I/O term too")
    parser.add_argument("--input-staged", action="store_true",
                        help="with --input-rate-from: the rate of the staged inflated copies (its staged section)")
    parser.add_argument("--input-cores-per-rank", type=positive_number_argument, default=1.0,
                        help="with --input-rate-from: cores each rank gives its input pipeline (default 1)")
    parser.add_argument("--sample-bytes", type=positive_number_argument,
                        help="bytes read per sample (default: the model input in float32)")
    parser.add_argument("--alpha-beta", action="store_true",
                        help="price every allreduce with the alpha-beta formula, also where the system file holds "
                             "measured allreduce times (network.allreduce_s)")
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of the table")
    parser.add_argument("--png", help="plot samples/s and efficiency to this file (a new file, or one this suite wrote)")
    parser.add_argument("--force", action="store_true", help="replace a --png file this suite did not write")
    parser.add_argument("--published", action="store_true", help="the published SC18 points, model vs paper")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    # --png: one output, absent or an earlier scaling figure (or --force), checked before the model runs
    transaction = OutputTransaction(Producer(TOOL, ""), args.force,
                                    inputs=[p for p in (args.config, args.system, args.rate_from, args.input_rate_from)
                                            if p and pathlib.Path(p).exists()])
    if args.png:
        transaction.check([args.png], options={args.png: "--png"})
    if args.published:
        rows = published_points()
        if args.json:
            print(json.dumps(rows, indent=1))
        else:
            for r in rows:
                print(f"{r['name']:<42} {r['system']:<10} {r['nodes']:>6} nodes: paper "
                      f"{100 * r['published_efficiency']:.1f}%, model {100 * r['model_efficiency']:.1f}% "
                      f"({r['difference_points']:+.1f} points)")
        return 0
    if not args.config or not args.system:
        raise ConfigError("--config and --system are required (or --published)")
    try:
        node_counts = sorted({int(n) for n in args.nodes.split(",") if n.strip()})
    except ValueError:
        node_counts = []
    if not node_counts or node_counts[0] < 1:
        raise ConfigError(f"--nodes {args.nodes!r}: expected a comma-separated list of positive integers")
    system = load_system(args.system)
    if args.alpha_beta:
        system = system.model_copy(update={"network": system.network.model_copy(update={"allreduce_s": {}})})
    # The workload first: a rate read from a file is checked against it.
    work = workload_from_config(args.config, args.set, None, args.dataset_bytes or 0.0, args.sample_bytes)
    rate = args.samples_per_second or (rate_from_json(args.rate_from, work) if args.rate_from else None)
    rate_source = "measured"
    one_node_rate = None
    steps_without_gradients = {}
    if rate is None and system.measured_samples_per_second:
        rate = system.measured_samples_per_second
        one_node_rate = system.measured_samples_per_second_one_node
        steps_without_gradients = system.step_without_gradients_s
        rate_source = f"measured on {system.name} (its sources say for which config)"
    work = dataclasses.replace(work, rank_samples_per_second=rate, rank_samples_per_second_one_node=one_node_rate,
                               step_without_gradients_s=dict(steps_without_gradients))
    if args.input_rate_from:
        work = dataclasses.replace(work, input_samples_per_second_per_rank=args.input_cores_per_rank
                                   * input_rate_from_json(args.input_rate_from, work, args.input_staged))
    rows = scaling_table(work, system, node_counts)
    if args.png:
        with transaction, transaction.reading(args.config):
            transaction.figure(plot(rows, f"{pathlib.Path(args.config).stem} on {system.name}"), args.png)
    if args.json:
        print(json.dumps(rows))
        return 0
    source = rate_source if rate else f"{system.sustained_fraction:.0%} of the {work.precision} peak"
    print(f"{pathlib.Path(args.config).name} on {system.name}: {work.parameters:,} parameters "
          f"({work.parameters * work.gradient_bytes_per_parameter / 2 ** 20:.1f} MiB of gradients), local batch "
          f"{work.local_batch}, {system.ranks_per_node} rank(s)/node, compute rate {source}"
          + (f", input pipeline {work.input_samples_per_second_per_rank:.1f} samples/s per rank "
             f"({args.input_cores_per_rank:g} core(s), from {args.input_rate_from})" if args.input_rate_from else ""))
    print(f"{'nodes':>7} {'step s':>9} {'compute':>9} {'allreduce':>10} {'exposed':>9} {'straggle':>9} "
          f"{'io':>8} {'samples/s':>11} {'efficiency':>10}")
    for r in rows:
        print(f"{r['nodes']:>7} {r['step_time_s']:>9.4f} {r['compute_s']:>9.4f} {r['allreduce_s']:>10.4f} "
              f"{r['exposed_allreduce_s']:>9.4f} {r['stragglers_s']:>9.4f} {r['io_s']:>8.4f} "
              f"{r['samples_per_second']:>11.1f} {100 * r['efficiency']:>9.1f}%")
    if work.dataset_bytes:
        print("staging " + ", ".join(f"{r['nodes']} nodes {r['staging_time_s']:.0f} s" for r in rows)
              + f" ({work.dataset_bytes / 1e12:.2f} TB from the parallel file system)")
    return 0


if __name__ == "__main__":
    exit_process(run_command(main, name=TOOL))
