"""The scaling model: alpha-beta costs against hand computation, the published points, the CLI contract."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml

from common.errors import ConfigError
from common.tools import scaling
from common.tools.scaling import (SYSTEMS_DIR, System, Workload, allreduce_time, communication_time, load_system,
                            project, published_points)
from tests.conftest import run_python


def test_allreduce_costs_by_hand():
    # 4 participants, 8 MB, alpha 1 us, 1 GB/s: bandwidth term 2 * 3/4 * 8e6 / 1e9 = 12 ms.
    assert allreduce_time(8e6, 4, 1e-6, 1e9, "ring") == pytest.approx(6e-6 + 0.012)
    assert allreduce_time(8e6, 4, 1e-6, 1e9, "tree") == pytest.approx(4e-6 + 0.012)
    # 1000 participants: the ring's 2(p-1) latencies dominate a small message; auto takes the tree.
    assert allreduce_time(1e3, 1000, 1e-6, 1e9, "ring") == pytest.approx(1998e-6 + 2 * 999 / 1000 * 1e-6)
    assert allreduce_time(1e3, 1000, 1e-6, 1e9, "auto") == pytest.approx(20e-6 + 2 * 999 / 1000 * 1e-6)
    assert allreduce_time(1e9, 1, 1e-6, 1e9) == 0.0


def system(**changes) -> System:
    network = dict(latency_s=1e-6, node_bandwidth_Bps=1e9, intra_node_latency_s=0.0, intra_node_bandwidth_Bps=1e10)
    storage = dict(node_local_read_Bps=1e9, pfs_per_node_read_Bps=1e8, pfs_aggregate_read_Bps=1e9)
    base = dict(name="toy", ranks_per_node=2, peak_tflops_per_rank={"fp32": 1.0}, sustained_fraction=0.5,
                network=network, storage=storage, step_jitter_fraction=0.0, overlap=0.0, algorithm="tree")
    return System(**{**base, **changes})


def test_hierarchical_fused_allreduce_and_step_by_hand():
    work = Workload(parameters=10_000_000, training_flops_per_sample=1e12, local_batch=1,
                    fusion_threshold_bytes=16e6, sample_bytes=1e6)
    toy = system()
    # 40 MB in 3 buffers of 13.33 MB; intra: 2 * 1/2 * n / 1e10; inter: tree over 8 nodes of n/2 at 0.5 GB/s.
    n = 40e6 / 3
    intra = n / 1e10
    inter = 2 * 3 * 1e-6 + 2 * 7 / 8 * (n / 2) / 0.5e9
    negotiation = 2 * 4 * 1e-6
    assert communication_time(work, toy, 8) == pytest.approx(3 * (intra + inter + negotiation))
    step = project(work, toy, 8)
    assert step["compute_s"] == pytest.approx(2.0)           # 1 TFLOP at 0.5 TF/s
    assert step["step_time_s"] == pytest.approx(2.0 + communication_time(work, toy, 8))
    # Full overlap hides it; gradient lag hides it even with overlap 0; stragglers grow with sqrt(2 ln N).
    assert project(work, system(overlap=1.0), 8)["exposed_allreduce_s"] == 0.0
    lagged = project(Workload(**{**work.__dict__, "gradient_lag": True}), toy, 8)
    assert lagged["exposed_allreduce_s"] == 0.0
    noisy = project(work, system(step_jitter_fraction=0.1), 8)
    assert noisy["stragglers_s"] == pytest.approx(0.1 * 2.0 * math.sqrt(2 * math.log(8)))
    # Reading from the PFS: the node's share of the aggregate bandwidth once nodes x per-node exceeds it.
    unstaged = Workload(**{**work.__dict__, "staged": False, "sample_bytes": 1e9})
    assert project(unstaged, toy, 100)["io_s"] == pytest.approx(2 * 1e9 / (1e9 / 100))


@pytest.mark.parametrize("point", published_points(), ids=lambda p: p["name"])
def test_published_efficiencies_within_five_points(point):
    assert abs(point["difference_points"]) <= 5.0, point


def test_every_system_file_loads_and_cites_its_figures():
    names = sorted(p.stem for p in SYSTEMS_DIR.glob("*.yaml"))
    assert {"cori-knl", "summit", "piz-daint", "perlmutter", "h200"} <= set(names)
    for name in names:
        loaded = load_system(name)
        raw = yaml.safe_load((SYSTEMS_DIR / f"{name}.yaml").read_text())
        for key in ("peak_tflops_per_rank", "node_bandwidth_Bps", "step_jitter_fraction", "sustained_fraction"):
            assert key in raw["sources"], (name, key)
        assert loaded.ranks_per_node >= 1 and loaded.network.node_bandwidth_Bps > 0


def test_cli_json_contract_and_png(tmp_path):
    png = tmp_path / "scaling.png"
    result = run_python(["-m", "common.tools.scaling", "--config", "configs/climate_seg/gordon_bell_tiramisu.yaml",
                         "--system", "summit", "--nodes", "1,2,16,128,1024", "--json", "--png", str(png)])
    rows = json.loads(result.stdout.strip().splitlines()[-1])
    assert [r["nodes"] for r in rows] == [1, 2, 16, 128, 1024]
    for r in rows:
        assert {"nodes", "step_time_s", "samples_per_second", "efficiency"} <= set(r)
        assert r["samples_per_second"] == pytest.approx(r["global_batch_size"] / r["step_time_s"])
    assert rows[0]["efficiency"] == pytest.approx(1.0)
    assert all(a["efficiency"] >= b["efficiency"] for a, b in zip(rows, rows[1:]))
    assert png.stat().st_size > 5000
    bad = run_python(["-m", "common.tools.scaling", "--config", "configs/cosmoflow/demo.yaml", "--system", "nowhere"],
                     check=False)
    assert bad.returncode == 2 and "nowhere: unknown; known systems: cori-knl" in bad.stderr


@pytest.mark.parametrize("edit, message", [
    (lambda raw: raw["network"].pop("latency_s"), "missing required key 'network.latency_s'"),
    (lambda raw: raw.update(sustained_fraction=1.5), "key 'sustained_fraction': Input should be less than or equal"),
    (lambda raw: raw["storage"].update(node_local_read_Bps="fast"), "key 'storage.node_local_read_Bps'"),
    (lambda raw: raw.update(algoritm="ring"), "unknown key 'algoritm'"),
    (lambda raw: raw["peak_tflops_per_rank"].update(fp64=1.0), "peak_tflops_per_rank.fp64"),
])
def test_a_bad_system_file_is_named_with_its_key(tmp_path, edit, message):
    raw = yaml.safe_load((SYSTEMS_DIR / "summit.yaml").read_text())
    edit(raw)
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=f"^{path}: .*" + message.replace("(", r"\(").replace(".", r"\.")):
        load_system(str(path))


def test_measured_allreduce_prices_and_the_fit_of_latency_and_bandwidth():
    """A system file's measured allreduce times are interpolated like numpy.interp inside their range, and
    sysbench's fit recovers the latency and bandwidth of times made by the alpha-beta formula by hand."""
    from common.tools.sysbench import fit_network

    table = {4096.0: 0.01, 32768.0: 0.02, 262144.0: 0.1, 1395472.0: 0.6}
    sizes, times = zip(*sorted(table.items()))
    for n in (5000.0, 100000.0, 1e6, 1395472.0):
        assert scaling.measured_allreduce(table, n) == pytest.approx(np.interp(n, sizes, times), rel=1e-12)
    assert scaling.measured_allreduce(table, 16) == 0.01                       # below: the smallest's time
    assert scaling.measured_allreduce(table, 2 * 1395472.0) == pytest.approx(0.6 + 0.5 * 1395472.0 / (1395472.0 - 262144.0))
    # By hand, one rank per node: 2(p-1) rounds (ring) or 2 ceil(log2 p) (tree), the cheaper, plus Horovod's
    # 2 ceil(log2 p) negotiation rounds; 2(p-1)/p n bytes over the bandwidth.
    latency, bandwidth = 3e-3, 2.5e6
    rows = []
    for p, rounds in ((2, 2 + 2), (3, 4 + 4), (4, 4 + 4)):
        for n in (4096, 65536, 1 << 20):
            rows.append({"ranks": p, "bytes": n, "seconds": rounds * latency + 2 * (p - 1) / p * n / bandwidth})
    fitted_latency, fitted_bandwidth, worst = fit_network(rows)
    assert fitted_latency == pytest.approx(latency, rel=1e-9) and fitted_bandwidth == pytest.approx(bandwidth, rel=1e-9)
    assert worst < 1e-9
    # The model's own alpha-beta price of one 16-byte collective plus a gradient buffer agrees with the rows.
    system = scaling.load_system("cori-knl").model_copy(update={"network": scaling.Network(
        latency_s=latency, node_bandwidth_Bps=bandwidth, intra_node_latency_s=0.0, intra_node_bandwidth_Bps=1e9)})
    work = scaling.Workload(parameters=(1 << 20) // 4, training_flops_per_sample=1.0, local_batch=1,
                            small_collectives_per_step=1)
    expected = rows[-4]["seconds"] + 8 * latency + 4 / 3 * 16 / bandwidth   # p = 3
    assert scaling.communication_time(work, system, 3) == pytest.approx(expected, rel=1e-12)


def test_measured_steps_without_gradients_stand_for_compute_small_collectives_and_stragglers():
    """Where a system file holds the step of an N-node job without its gradient allreduce, the model's step on N
    nodes is that step plus the gradients' measured allreduce (no step-signal collective, no straggler term: both
    are in the measurement); beyond the largest N measured, the stragglers grow from there by
    s t (sqrt(2 ln N) - sqrt(2 ln N_measured)); one node keeps its own rate (no Horovod there)."""
    gradient_bytes = 1 << 20
    table = {2: {4096.0: 0.01, float(gradient_bytes): 0.3}, 3: {4096.0: 0.02, float(gradient_bytes): 0.5}}
    system = scaling.load_system("cori-knl").model_copy(update={
        "ranks_per_node": 1, "step_jitter_fraction": 0.1, "overlap": 0.0,
        "network": scaling.Network(latency_s=1e-3, node_bandwidth_Bps=1e7, intra_node_latency_s=0.0,
                                   intra_node_bandwidth_Bps=1e9, allreduce_s=table)})
    work = Workload(parameters=gradient_bytes // 4, training_flops_per_sample=1.0, local_batch=4,
                    rank_samples_per_second=40.0, rank_samples_per_second_one_node=50.0, overlap=0.0,
                    lag_hides_step=False, small_collectives_per_step=1, step_without_gradients_s={2: 0.13, 3: 0.16})
    one, two, three = (project(work, system, n) for n in (1, 2, 3))
    assert one["step_time_s"] == pytest.approx(4 / 50.0, rel=1e-12)
    assert (two["compute_s"], two["allreduce_s"], two["stragglers_s"]) == (0.13, 0.3, 0.0)
    assert two["step_time_s"] == pytest.approx(0.43, rel=1e-12)
    assert three["step_time_s"] == pytest.approx(0.66, rel=1e-12)
    eight = project(work, system, 8)   # beyond the table: alpha-beta gradients, stragglers grown from N = 3
    assert eight["compute_s"] == 0.16
    growth = math.sqrt(2 * math.log(8)) - math.sqrt(2 * math.log(3))
    assert eight["stragglers_s"] == pytest.approx(0.1 * 0.16 * growth, rel=1e-12)
    ring = 2 * 7 * 1e-3 + 2 * 7 / 8 * gradient_bytes / 1e7 + 2 * 3 * 1e-3   # + negotiation: 2 ceil(log2 8) rounds
    tree = 2 * 3 * 1e-3 + 2 * 7 / 8 * gradient_bytes / 1e7 + 2 * 3 * 1e-3
    assert eight["allreduce_s"] == pytest.approx(min(ring, tree), rel=1e-12)


def test_sysbench_alone_times_one_process_and_refuses_ranks_of_a_job(tiny_cosmo_data):
    """`sysbench --alone`, what a sysbench job runs last on its first node for the one-node rate: the trainer as
    a run of one process, its figures as a JSON line; started with a launcher's world around it, it refuses.
    The job starts it with the launcher's variables removed (rank, size, PMI/PMIx, Horovod), the rest kept."""
    from common.distributed import single_process_environment
    from tests.conftest import last_json_line, tiny_cosmo_overrides

    launched = {"SLURM_PROCID": "0", "SLURM_NTASKS": "3", "SLURM_JOB_ID": "7", "OMPI_COMM_WORLD_SIZE": "3",
                "OMPI_COMM_WORLD_RANK": "0", "PMIX_RANK": "0", "PMI_SIZE": "3", "HOROVOD_SIZE": "3",
                "HOROVOD_RANK": "0", "OMPI_MCA_btl_tcp_eager_limit": "4194304", "PATH": "/usr/bin"}
    alone = single_process_environment(launched)
    assert alone == {"SLURM_NTASKS": "3", "SLURM_JOB_ID": "7", "OMPI_MCA_btl_tcp_eager_limit": "4194304",
                     "PATH": "/usr/bin"}
    command = ["-m", "common.tools.sysbench", "--config", "configs/cosmoflow/demo.yaml",
               *tiny_cosmo_overrides(tiny_cosmo_data), "--set", "train.throughput_warmup_steps=1",
               "--set", "train.intra_op_threads=1", "--set", "mlperf.enabled=false", "--alone"]
    refused = run_python(command, check=False, env={"OMPI_COMM_WORLD_SIZE": "3"})
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == ("error: common.tools.sysbench --alone: run it as one process, "
                                                        "not as ranks of a job")
    figures = last_json_line(run_python(command).stdout)
    # 32 training volumes in batches of 4, 2 epochs, less the one warm-up step.
    assert figures["steps"] == 7 and figures["batch_size"] == 4, figures
    assert figures["median_step_s"] > 0 and figures["gradient_bytes"] > 0 and figures["gradient_bytes"] % 4 == 0
