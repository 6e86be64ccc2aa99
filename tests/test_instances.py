"""Several models in one job (distributed.instances): each instance is the run it would be alone, one
instance's failure leaves the others alone, preemption and --resume cover every instance; the config, the
report and the exit code defined; real Horovod ranks (4 on this machine, 2 instances of 2)."""

from __future__ import annotations

import fcntl
import json
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import psutil
import pytest

from common.config import instance_configs, load_config
from common.errors import ConfigError
from common.instances import job_exit_code, summarize, table, weak_scaling
from conftest import REPO, STARTUP_S, last_json_line, launcher, python_env, run_here, run_python, tiny_cosmo_overrides
from cosmoflow.config import CosmoflowConfig

DEMO = str(REPO / "configs/cosmoflow/demo.yaml")


def train_args(data_dir, run_dir, *extra, epochs=2, batch_size=4):
    return ["-m", "cosmoflow.train", "--config", DEMO, *tiny_cosmo_overrides(data_dir, epochs=epochs,
                                                                             batch_size=batch_size),
            "--set", "train.deterministic=true", "--output-dir", str(run_dir), *extra]


def weights(run_dir):
    return [np.asarray(w) for w in keras.saving.load_model(run_dir / "model.keras", compile=False).get_weights()]


def assert_bitwise_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def rank_exit_codes(stderr: str) -> str:
    """horovodrun ends with 1 whatever its ranks said; its last lines name the first rank's exit code."""
    return stderr[-1500:]


# -- the config: each instance's, checked before any rank starts ---------------------------------------------

def test_instance_configs_take_seed_plus_k_then_their_overrides():
    cfg = load_config(CosmoflowConfig, DEMO, ["train.seed=5", "distributed.instances=3",
                                              "distributed.instance_overrides=[{}, {optimizer.learning_rate: 0.02},"
                                              " {train.seed: 100, model.dropout: 0.25}]"])
    configs = instance_configs(CosmoflowConfig, cfg)
    assert [c.train.seed for c in configs] == [5, 6, 100]
    assert [c.optimizer.learning_rate for c in configs] == [cfg.optimizer.learning_rate, 0.02, cfg.optimizer.learning_rate]
    assert [c.model.dropout for c in configs] == [cfg.model.dropout, cfg.model.dropout, 0.25]
    assert all(c.data == cfg.data for c in configs)


@pytest.mark.parametrize("overrides, expected", [
    (["distributed.instances=3", "distributed.instance_overrides=[{}, {}]"], "2 entries for distributed.instances=3"),
    (["distributed.instances=2", "distributed.groups=2"], "cannot be combined"),
    (["distributed.instances=2", "distributed.instance_overrides=[{distributed.groups: 2}, {}]"],
     "cannot change the distributed section"),
])
def test_bad_instance_settings_name_the_key(overrides, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(CosmoflowConfig, DEMO, overrides)


def test_an_unknown_key_in_an_override_names_the_instance():
    with pytest.raises(ConfigError, match=r"instance 1 \(distributed.instance_overrides\[1\]\): unknown key "
                                          r"'optimizer.learning_rat'"):
        load_config(CosmoflowConfig, DEMO, ["distributed.instances=2",
                                            "distributed.instance_overrides=[{}, {optimizer.learning_rat: 0.1}]"])
    with pytest.raises(ConfigError, match=r"instance_overrides is for a job of several instances"):
        load_config(CosmoflowConfig, DEMO, ["distributed.instance_overrides=[{optimizer.learning_rate: 0.1}]"])


# -- the report and the exit code ----------------------------------------------------------------------------

def test_report_weak_scaling_and_exit_code(tmp_path):
    cfg = load_config(CosmoflowConfig, DEMO, ["distributed.instances=2", "mlperf.enabled=true"])
    summary = {"epochs_completed": 4, "final": {"val_mae": 0.2}, "samples_per_second": 10.0,
               "mlperf_target_reached": True, "mlperf_time_to_target_s": 50.0}
    records = [{"instance": 0, "rank": 0, "exit_code": 0, "reason": None,
                "summary": {**summary, "started_unix": 1000.0, "wall_time_s": 60.0}},
               {"instance": 0, "rank": 1, "exit_code": 0, "reason": None, "summary": None},
               {"instance": 1, "rank": 0, "exit_code": 0, "reason": None,
                "summary": {**summary, "started_unix": 1010.0, "wall_time_s": 110.0}},
               {"instance": 1, "rank": 1, "exit_code": 0, "reason": None, "summary": None}]
    report = summarize(cfg, records, tmp_path)
    assert report["ranks_per_instance"] == 2 and [r["outcome"] for r in report["instances"]] == ["finished"] * 2
    # 2 models between the first start (1000) and the last end (1010 + 110): 120 s, so 1 model per minute.
    assert report["weak_scaling"]["span_s"] == 120.0 and report["weak_scaling"]["models_per_minute"] == 1.0
    assert "instance 1 [train.seed=1]: finished" in table(report) and "1.000 models/min" in table(report)
    rows = report["instances"]
    rows[1].update(outcome="non-finite", mlperf_target_reached=None, started_unix=None, wall_time_s=None)
    assert weak_scaling(rows, mlperf=True) == {"models": 1, "span_s": 60.0, "models_per_minute": 1.0,
                                               "counted": "instances that reached the MLPerf target"}
    assert job_exit_code([0, 0]) == 0 and job_exit_code([0, 3]) == 3 and job_exit_code([3, 75]) == 75


# -- real ranks ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def two_instances(tiny_cosmo_data, tmp_path_factory):
    """4 ranks, 2 instances, 2 epochs, deterministic: the job's folder."""
    run_dir = tmp_path_factory.mktemp("instances") / "job"
    result = run_python(train_args(tiny_cosmo_data, run_dir, "--set", "distributed.instances=2"), ranks=4)
    return run_dir, result


@pytest.mark.horovod
@pytest.mark.parametrize("k", [0, 1])
def test_each_instance_equals_a_separate_run_with_seed_plus_k(two_instances, tiny_cosmo_data, tmp_path, k):
    run_dir, result = two_instances
    alone = tmp_path / "alone"
    run_python(train_args(tiny_cosmo_data, alone, "--set", f"train.seed={k}"), ranks=2)
    assert_bitwise_equal(weights(run_dir / f"instance-{k}"), weights(alone))
    summary = json.loads((run_dir / f"instance-{k}" / "summary.json").read_text())
    assert summary["ranks"] == 2 and summary["epochs_completed"] == 2
    assert (run_dir / f"instance-{k}" / "mlperf.log").is_file()   # its own MLPerf log
    report = json.loads((run_dir / "instances.json").read_text())
    row = report["instances"][k]
    assert row["outcome"] == "finished" and row["overrides"] == {"train.seed": k} and row["ranks"] == 2
    assert row["final"] == summary["final"]
    assert f"[instance {k} 0/2] epoch 2/2:" in result.stdout   # each instance's rank 0 reports, tagged
    assert f"instance {k} [train.seed={k}]: finished" in result.stdout


def tree_snapshot(root):
    """Every path under ``root`` with its bytes (folders as None)."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def refused_with(result, expected: str) -> str:
    """The one-line error of a refused command (exit 2: in horovodrun's tail for several ranks)."""
    assert result.returncode != 0, result.stdout[-2000:]
    errors = [line for line in result.stderr.splitlines() if "error: " in line]
    assert errors and any(expected in line for line in errors), result.stderr[-3000:]
    return errors[0]


@pytest.mark.horovod
def test_a_job_folder_and_a_lone_runs_folder_are_never_mixed(two_instances, tiny_cosmo_data, tmp_path, capsys):
    """A folder holds one kind of run: a lone run (fresh, --resume or --force) is refused in a job's folder and in
    an instance's, a job resumed with another count of instances is refused, and a job is refused in a lone run's
    folder; each before anything is written."""
    job, _ = two_instances
    before = tree_snapshot(job)
    assert (job / ".hpc-dl-suite-run.lock").is_file()   # the job's lock file exists (held while the job ran)
    for extra, expected in [((), "holds a job of 2 instances"),
                            (("--resume",), "resume the job with --set distributed.instances=2"),
                            (("--force",), "holds a job of 2 instances")]:
        result = run_here(train_args(tiny_cosmo_data, job, *extra), capsys)   # (one process: in this one)
        assert result.returncode == 2
        refused_with(result, expected)
    result = run_here(train_args(tiny_cosmo_data, job / "instance-0", "--resume"), capsys)
    assert result.returncode == 2
    refused_with(result, f"is one instance of the job of 2 instances in {job}")
    result = run_python(train_args(tiny_cosmo_data, job, "--resume", "--set", "distributed.instances=3", batch_size=2),
                        ranks=3, check=False)
    refused_with(result, "--resume with distributed.instances=3 cannot continue every one of them")
    assert tree_snapshot(job) == before
    evaluated = run_here(["-m", "cosmoflow.evaluate", "--run-dir", str(job)], capsys)
    assert evaluated.returncode == 2 and "holds a job of 2 instances" in evaluated.stderr

    lone, tmp = tmp_path / "lone", tmp_path / "tmp"
    tmp.mkdir()
    run_python(train_args(tiny_cosmo_data, lone, epochs=1), env={"TMPDIR": str(tmp)})
    assert not list(tmp.iterdir())   # AutoGraph's generated files went with the process's own temporary folder
    before = tree_snapshot(lone)
    result = run_python(train_args(tiny_cosmo_data, lone, "--resume", "--set", "distributed.instances=2", epochs=1),
                        ranks=2, check=False)
    refused_with(result, "holds a training run (its own checkpoints and records); a job of several instances")
    assert tree_snapshot(lone) == before


@pytest.mark.horovod
def test_an_instance_that_cannot_start_stops_the_job_before_any_instance_writes(tiny_cosmo_data, tmp_path, capsys):
    """Instance 1's override gives a network that does not fit the samples: every instance hears it before any
    writes (no job folder left behind), and --dry-run builds every instance's network, so it refuses it too."""
    bad = ["--set", "distributed.instances=2", "--set",
           "distributed.instance_overrides=[{}, {model.conv_blocks: 40}]"]
    result = run_python(train_args(tiny_cosmo_data, tmp_path / "job", *bad, epochs=1), ranks=2, check=False)
    assert "Exit code: 2" in rank_exit_codes(result.stderr), result.stderr[-3000:]
    refused_with(result, "instance 1 of 2: model.conv_blocks=40")
    assert not (tmp_path / "job").exists()
    dry = run_here(train_args(tiny_cosmo_data, tmp_path / "job", *bad, "--dry-run"), capsys)
    assert dry.returncode == 2 and "instance 1 (distributed.instance_overrides[1]): model.conv_blocks=40" in dry.stderr
    fine = run_here(train_args(tiny_cosmo_data, tmp_path / "job", "--set", "distributed.instances=2", "--dry-run"), capsys)
    assert fine.returncode == 0, fine.stderr[-3000:]
    assert len(last_json_line(fine.stdout)["instances"]) == 2


@pytest.mark.horovod
def test_a_nonfinite_instance_does_not_stop_the_other(two_instances, tiny_cosmo_data, tmp_path):
    run_dir = tmp_path / "job"
    result = run_python(train_args(tiny_cosmo_data, run_dir, "--set", "distributed.instances=2", "--set",
                                   "distributed.instance_overrides=[{}, {optimizer.learning_rate: 1.0e+30}]"),
                        ranks=4, check=False)
    assert result.returncode != 0 and "Exit code: 3" in rank_exit_codes(result.stderr), result.stderr[-3000:]
    report = json.loads((run_dir / "instances.json").read_text())
    first, second = report["instances"]
    assert first["outcome"] == "finished" and second["outcome"] == "non-finite"
    assert "loss is nan" in second["reason"] or "not finite" in second["reason"]
    # Instance 0 trained to the end exactly as in the job without the failing instance.
    assert_bitwise_equal(weights(run_dir / "instance-0"), weights(two_instances[0] / "instance-0"))
    assert not (run_dir / "instance-1" / "model.keras").exists()


def _rank_processes(parent: subprocess.Popen) -> list[psutil.Process]:
    ranks = []
    for child in psutil.Process(parent.pid).children(recursive=True):
        try:
            if "cosmoflow.train" in " ".join(child.cmdline()) and "HOROVOD_RANK" in child.environ():
                ranks.append(child)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return ranks


@pytest.mark.horovod
def test_preemption_stops_every_instance_and_resume_continues_each(tiny_cosmo_data, tmp_path):
    run_dir = tmp_path / "job"
    args = train_args(tiny_cosmo_data, run_dir, "--set", "distributed.instances=2", epochs=6, batch_size=1)
    process = subprocess.Popen([*launcher(4), sys.executable, *args],
                               cwd=REPO, env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = [run_dir / f"instance-{k}" / "checkpoints" / "ckpt-epoch-00001.npz" for k in (0, 1)]
    deadline = time.time() + STARTUP_S
    while not any(p.exists() for p in first):   # then neither instance is near its sixth epoch
        assert process.poll() is None and time.time() < deadline, "the job ended before its first checkpoint"
        time.sleep(0.2)
    # The job's folder is locked for the job's life: a second job or a lone run on it is refused while it trains.
    with open(run_dir / ".hpc-dl-suite-run.lock", "rb") as handle, pytest.raises(BlockingIOError):
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    for rank in _rank_processes(process):   # SLURM signals every task of the job
        rank.send_signal(signal.SIGUSR1)
    out, err = process.communicate(timeout=300)
    assert process.returncode != 0 and "Exit code: 75" in rank_exit_codes(err), err[-3000:]
    report = json.loads((run_dir / "instances.json").read_text())
    assert [row["outcome"] for row in report["instances"]] == ["preempted", "preempted"]
    resumed = run_python(args + ["--resume"], ranks=4)
    for k in (0, 1):
        assert f"[instance {k} 0/2] resuming from" in resumed.stdout
        assert json.loads((run_dir / f"instance-{k}" / "summary.json").read_text())["epochs_completed"] == 6
    report = json.loads((run_dir / "instances.json").read_text())
    assert [row["outcome"] for row in report["instances"]] == ["finished", "finished"]


@pytest.mark.horovod
def test_instances_that_do_not_divide_the_ranks_are_refused(tiny_cosmo_data, tmp_path):
    result = run_python(train_args(tiny_cosmo_data, tmp_path / "job", "--set", "distributed.instances=3"),
                        ranks=4, check=False)
    assert result.returncode != 0
    assert "distributed.instances=3 does not divide the 4 ranks" in result.stderr
    assert not (tmp_path / "job").exists()


@pytest.mark.horovod
def test_missing_mock_data_is_generated_once_for_all_instances(tmp_path):
    data = tmp_path / "data"
    args = train_args(data, tmp_path / "job", "--set", "distributed.instances=2", "--set",
                      "data.mock.generate_if_missing=true", "--set", "data.mock.n_train=8", "--set",
                      "data.mock.n_validation=4", "--set", "data.mock.box_size_mpc_h=64", epochs=1, batch_size=2)
    result = run_python(args, ranks=2)   # two instances of one rank: both read the same folder
    assert result.stdout.count("generated mock universes in") == 1, result.stdout[-3000:]
    report = json.loads((tmp_path / "job" / "instances.json").read_text())
    assert [row["outcome"] for row in report["instances"]] == ["finished", "finished"]
    assert report["ranks_per_instance"] == 1 and len(list((data / "train").iterdir())) == 8
