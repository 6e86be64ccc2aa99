"""Exact resume, preemption, dead ranks, NaN losses and bad input, on real processes and files."""

import csv
import hashlib
import json
import signal
import subprocess
import sys
import time

import h5py
import keras
import numpy as np
import psutil
import pytest

from common.storage import checkpoint
from conftest import REPO, STARTUP_S, launcher, python_env, run_here, run_python, tiny_cosmo_overrides

DEMO = str(REPO / "configs/cosmoflow/demo.yaml")
# Everything random at work: dropout, augmentation, a sample shuffle buffer; 32 steps per epoch.
DETERMINISTIC = ["--set", "train.deterministic=true", "--set", "model.dropout=0.3", "--set", "data.augment=true",
                 "--set", "data.shuffle_buffer=8", "--set", "optimizer.name=adam",
                 "--set", "optimizer.schedule.decay=cosine", "--set", "optimizer.schedule.warmup_steps=5"]


def command(data_dir, run_dir, *extra, epochs=3, batch_size=1, ranks=1):
    args = [sys.executable, "-m", "cosmoflow.train", "--config", DEMO,
            *tiny_cosmo_overrides(data_dir, epochs=epochs, batch_size=batch_size), *DETERMINISTIC,
            "--output-dir", str(run_dir), *extra]
    if ranks > 1:
        args = [*launcher(ranks), *args]
    return args


def start(args):
    return subprocess.Popen(args, cwd=REPO, env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def wait_for(predicate, process, timeout=STARTUP_S):
    deadline = time.time() + timeout
    while not predicate():
        if process.poll() is not None:
            out, err = process.communicate()
            raise AssertionError(f"process ended early ({process.returncode})\n{out[-3000:]}\n{(err or '')[-3000:]}")
        if time.time() > deadline:
            process.kill()
            raise AssertionError("timed out")
        time.sleep(0.02)


def finish(args, check=True):
    result = subprocess.run(args, cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=600)
    if check:
        assert result.returncode == 0, result.stderr[-4000:]
    return result


def final_weights(run_dir):
    return [np.asarray(v) for v in keras.models.load_model(run_dir / "model.keras").weights]


def assert_bitwise_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


@pytest.fixture(scope="module")
def reference_run(tiny_cosmo_data, tmp_path_factory):
    """An uninterrupted run of ``command``: what an interrupted and resumed one must end as."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    finish(command(tiny_cosmo_data, run_dir))
    return run_dir


@pytest.fixture(scope="module")
def uninterrupted(reference_run):
    return final_weights(reference_run)


def test_resume_after_a_kill_is_bitwise_equal(tiny_cosmo_data, tmp_path, uninterrupted):
    run_dir = tmp_path / "run"
    process = start(command(tiny_cosmo_data, run_dir))
    wait_for(lambda: (run_dir / "checkpoints" / "ckpt-epoch-00001.npz").exists(), process)
    process.send_signal(signal.SIGKILL)
    process.communicate()
    assert not any(p.name.endswith(".tmp") for p in (run_dir / "checkpoints").iterdir()) or \
        checkpoint.latest_checkpoint(run_dir / "checkpoints") is not None
    assert checkpoint.read_state(checkpoint.latest_checkpoint(run_dir / "checkpoints"))["epoch"] in (1, 2)
    resumed = finish(command(tiny_cosmo_data, run_dir, "--resume"))
    assert "resuming from" in resumed.stdout
    assert_bitwise_equal(final_weights(run_dir), uninterrupted)


def test_signal_mid_epoch_saves_and_resume_is_bitwise_equal(tiny_cosmo_data, tmp_path, uninterrupted):
    run_dir = tmp_path / "run"
    process = start(command(tiny_cosmo_data, run_dir))
    wait_for(lambda: (run_dir / "checkpoints" / "ckpt-epoch-00001.npz").exists(), process)
    process.send_signal(signal.SIGUSR1)   # during epoch 2 or its validation
    out, err = process.communicate(timeout=120)
    assert process.returncode == 75, err[-3000:]
    assert "preempted" in err and "--resume" in err
    state = checkpoint.read_state(checkpoint.latest_checkpoint(run_dir / "checkpoints"))
    assert state["epoch"] >= 1
    resumed = finish(command(tiny_cosmo_data, run_dir, "--resume"))
    assert "resuming from" in resumed.stdout
    assert_bitwise_equal(final_weights(run_dir), uninterrupted)
    with open(run_dir / "history.csv") as handle:
        epochs = [line.split(",")[0] for line in handle.read().splitlines()[1:]]
    assert epochs == ["0", "1", "2"]
    # The requeued attempt says how the first one ended, and records it.
    assert "the previous attempt (" in resumed.stdout and "was preempted and saved a checkpoint (exit 75)" in \
        resumed.stdout
    assert [(a["status"], a["exit_code"]) for a in attempts_of(run_dir)] == [("preempted", 75), ("finished", 0)]


# -- a crash at any instant: the records of an epoch agree with its checkpoint ------------------------

def attempts_of(run_dir) -> list[dict]:
    return json.loads((run_dir / "attempts.json").read_text())["attempts"]


def history_rows(run_dir) -> list[dict]:
    with open(run_dir / "history.csv", newline="") as handle:
        return list(csv.DictReader(handle))


TIMINGS = ("epoch_time_s", "samples_per_second", "tflops_per_second")


def assert_same_history(run_dir, reference_dir):
    """One row per epoch, numbered as the reference's, with its values to the last digit (timings aside)."""
    rows, expected = history_rows(run_dir), history_rows(reference_dir)
    assert [r["epoch"] for r in rows] == [r["epoch"] for r in expected]
    for row, reference in zip(rows, expected):
        assert {k: v for k, v in row.items() if k not in TIMINGS} == \
            {k: v for k, v in reference.items() if k not in TIMINGS}, row["epoch"]


def mlperf_events(run_dir) -> list[dict]:
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in (run_dir / "mlperf.log").read_text().splitlines()]


def tensorboard_points(run_dir, folder, tag) -> list[tuple[int, float]]:
    """(step, value) of a tag as TensorBoard loads it."""
    import tensorflow as tf
    from tensorboard.backend.event_processing import plugin_event_accumulator

    accumulator = plugin_event_accumulator.EventAccumulator(str(run_dir / "tensorboard" / folder))
    accumulator.Reload()
    return [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in accumulator.Tensors(tag)]


def test_a_kill_between_a_checkpoint_and_its_records_and_a_lost_newest_checkpoint(tiny_cosmo_data, tmp_path,
                                                                                 reference_run, uninterrupted):
    """Killed (SIGKILL) at the instant the checkpoint of epoch 2 is in place and none of its records are
    written, then requeued (SLURM_RESTART_COUNT=1): history.csv, the MLPerf log and TensorBoard hold every epoch
    once, with the values of an uninterrupted run, and the second attempt records that the first vanished.
    Then the opposite order: records of epoch 3 written, its checkpoint lost (corrupt): epoch 3 is trained
    again and counted once."""
    run_dir = tmp_path / "run"
    args = command(tiny_cosmo_data, run_dir, "--set", "train.tensorboard=true")
    killed = subprocess.run(args, cwd=REPO, env=python_env({checkpoint.TEST_HOOK: "written:2:kill",
                                                            "SLURM_JOB_ID": "4242"}),
                            capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert checkpoint.read_state(run_dir / "checkpoints" / "ckpt-epoch-00002.npz")["epoch"] == 2
    assert [r["epoch"] for r in history_rows(run_dir)] == ["0"]   # the crash window: epoch 2 committed, unrecorded
    assert [a["status"] for a in attempts_of(run_dir)] == ["running"]

    requeued = subprocess.run([*args, "--resume"], cwd=REPO, timeout=600, capture_output=True, text=True,
                              env=python_env({"SLURM_RESTART_COUNT": "1", "SLURM_JOB_ID": "4242"}))
    assert requeued.returncode == 0, requeued.stderr[-3000:]
    said = requeued.stdout + requeued.stderr
    assert "attempt 2 of this run (SLURM restart 1 of job 4242): the previous attempt (" in said
    assert "vanished without recording its end" in said
    assert "history.csv: restored the row(s) of epoch(s) 2 from ckpt-epoch-00002.npz" in said
    assert_same_history(run_dir, reference_run)
    assert_bitwise_equal(final_weights(run_dir), uninterrupted)
    first, second = attempts_of(run_dir)
    assert first["status"] == "vanished" and first["exit_code"] is None and first["last_seen"] >= first["started"]
    assert first["slurm_restart_count"] == 0 and "left no record" not in said
    assert (second["status"], second["slurm_restart_count"], second["slurm_job_id"], second["resumed_from"]) == \
        ("finished", 1, "4242", "ckpt-epoch-00002.npz")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["attempt"] == 2 and [a["status"] for a in summary["previous_attempts"]] == ["vanished"]
    events = mlperf_events(run_dir)
    evaluations = [e for e in events if e["key"] == "eval_error"]
    assert [e["metadata"]["epoch_num"] for e in evaluations] == [1, 2, 3]
    assert evaluations[1]["metadata"]["restored_from"] == "ckpt-epoch-00002.npz"
    assert [e["metadata"]["epoch_num"] for e in events if e["key"] == "epoch_stop"] == [1, 2, 3]
    rows = history_rows(run_dir)
    for folder, column in (("train", "loss"), ("validation", "val_loss")):
        assert tensorboard_points(run_dir, folder, "epoch_loss") == \
            [(e, float(np.float32(r[column]))) for e, r in enumerate(rows)]

    flip_middle(run_dir / "checkpoints" / "ckpt-epoch-00003.npz")   # epoch 3 recorded, its checkpoint lost
    again = finish([*args, "--resume"])
    said = again.stdout + again.stderr
    assert "resuming from" in said and "ckpt-epoch-00002.npz" in said
    assert "history.csv: dropped the row(s) of epoch(s) 3" in said
    assert_same_history(run_dir, reference_run)
    assert_bitwise_equal(final_weights(run_dir), uninterrupted)
    for folder in ("train", "validation"):
        assert [step for step, _ in tensorboard_points(run_dir, folder, "epoch_loss")] == [0, 1, 2]
    assert [s for s, _ in tensorboard_points(run_dir, "validation", "evaluation_loss_vs_iterations")] == [32, 64, 96]
    resumed_events = [e for e in mlperf_events(run_dir) if e["key"] == "resumed_from_checkpoint"]
    assert resumed_events[-1]["metadata"]["superseded_epochs"] == [3]
    assert [a["status"] for a in attempts_of(run_dir)] == ["vanished", "finished", "finished"]


def test_a_checkpoint_without_rows_takes_them_from_history_csv(tmp_path):
    """Checkpoints written before they carried their epochs' rows: a resume takes the rows of the epochs they
    committed from history.csv, exactly, and drops the later ones."""
    from common.loop import records
    from common.storage import run_dirs

    rows = [{"epoch": e, "logs": {"loss": 1.0 / (e + 3), "val_loss": 0.1 * e}, "time_unix": None,
             "optimizer_learning_rate": None} for e in range(3)]
    rows[1]["logs"]["ratio_to_peak"] = 0.25   # a metric not every epoch has: NA in the others
    run_dirs.mark_run_dir(tmp_path, "cosmoflow", ["history.csv"])
    records.write_history(tmp_path / "history.csv", rows)
    text = (tmp_path / "history.csv").read_text()
    assert text.splitlines()[0] == "epoch,loss,ratio_to_peak,val_loss" and ",NA," in text
    assert records.rows_from_csv(tmp_path / "history.csv", 2) == \
        [{**row, "logs": dict(row["logs"])} for row in rows[:2]]
    records.reconcile(tmp_path, records.rows_from_csv(tmp_path / "history.csv", 2), 2, 0, "an old checkpoint",
                      tensorboard=False)
    assert [r["epoch"] for r in history_rows(tmp_path)] == ["0", "1"]
    assert history_rows(tmp_path)[1]["loss"] == repr(1.0 / 4)


def test_the_mlperf_log_is_reconciled_with_the_checkpoint_of_each_resume(tmp_path):
    """Epochs 1-3 logged, the checkpoint of epoch 3 lost: the resume from epoch 2 names epoch 3 superseded.
    That attempt is killed once its own checkpoint of epoch 3 is in place, before the log (and mid-line): the
    next resume restores epoch 3 from that checkpoint, not from the superseded events."""
    from common.loop.mlperf import MlperfLog

    path = tmp_path / "mlperf.log"
    first = MlperfLog(path, enabled=True)
    for number in (1, 2, 3):
        first.end("epoch_stop", metadata={"epoch_num": number})
        first.start("eval_start", metadata={"epoch_num": number})
        first.event("eval_error", 0.9, metadata={"epoch_num": number})
        first.end("eval_stop", metadata={"epoch_num": number})
    rows = [{"epoch": e, "logs": {"val_mae": 0.5 - e / 10}, "time_unix": 1000.0 + e} for e in range(3)]
    MlperfLog(path, enabled=True).reconcile(rows[:2], "ckpt-epoch-00002.npz", 2, 0, "eval_error", "val_mae")
    with open(path, "a") as handle:
        handle.write(':::MLLOG {"namespace": "", "time_ms": 17')   # cut short by the kill
    MlperfLog(path, enabled=True).reconcile(rows, "ckpt-epoch-00003.npz", 3, 0, "eval_error", "val_mae")
    lines = path.read_text().splitlines()
    assert lines[-6].endswith('"time_ms": 17')   # the cut line ended: the 5 events after it on lines of their own
    events = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in lines if line != lines[-6]]
    resumes = [e["metadata"] for e in events if e["key"] == "resumed_from_checkpoint"]
    assert [(r["superseded_epochs"], r["restored_epochs"]) for r in resumes] == [([3], []), ([], [3])]
    assert events[-2]["key"] == "eval_stop" and events[-3]["value"] == pytest.approx(0.3)
    assert events[-3]["metadata"] == {**events[-3]["metadata"], "epoch_num": 3, "restored_from": "ckpt-epoch-00003.npz"}
    assert events[-3]["time_ms"] == 1002000


def test_each_attempt_says_how_the_previous_one_ended(tmp_path, monkeypatch, caplog):
    """attempts.json across a preemption, a SLURM restart that never started the run, a vanished attempt."""
    from common.errors import Preempted
    from common.loop.attempts import Attempt

    monkeypatch.setenv("SLURM_JOB_ID", "9")
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)   # SLURM sets it from the first requeue on
    Attempt(tmp_path, "cosmoflow.train").end_with(RuntimeError("refused before the run directory started"))
    assert not (tmp_path / "attempts.json").exists()   # nothing recorded before begin
    first = Attempt(tmp_path, "cosmoflow.train")
    first.begin(resume=False, ranks=2, resumed_from=None)
    first.end_with(Preempted("stop requested (SIGUSR1)"))
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    with caplog.at_level("INFO"):
        Attempt(tmp_path, "cosmoflow.train").begin(resume=True, ranks=2, resumed_from="ckpt-epoch-00001.npz")
    said = caplog.text
    assert "attempt 2 of this run (SLURM restart 2 of job 9): the previous attempt (" in said
    assert "was preempted and saved a checkpoint (exit 75)" in said and "stop requested (SIGUSR1)" in said
    assert "SLURM restart(s) 1 of the job left no record" in said
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    caplog.clear()
    third = Attempt(tmp_path, "cosmoflow.train")
    third.begin(resume=True, ranks=1, resumed_from="ckpt-epoch-00001.npz")   # the second never ended: killed
    assert "vanished without recording its end" in caplog.text and "left no record" not in caplog.text
    assert [(a["status"], a["exit_code"], a["slurm_restart_count"]) for a in attempts_of(tmp_path)] == \
        [("preempted", 75, 0), ("vanished", None, 2), ("running", None, 3)]
    assert third.number == 3 and [a["attempt"] for a in third.previous] == [1, 2]


def flip_middle(path):
    payload = bytearray(path.read_bytes())
    for i in range(len(payload) // 2, len(payload) // 2 + 64):
        payload[i] ^= 0xFF
    path.write_bytes(bytes(payload))


@pytest.mark.horovod
@pytest.mark.parametrize("lost, hook", [
    (1, "writing:2:8"),   # rank 1 lost while rank 0 writes (8 s): rank 0 ends 8 s + hang_timeout_s later
    (0, "written:2:8"),   # rank 0 lost once it has written: rank 1, waiting for it, ends hang_timeout_s later
])
def test_a_node_lost_around_a_save_ends_the_others_within_the_write_plus_hang_timeout(tiny_cosmo_data, tmp_path,
                                                                                      lost, hook):
    """A rank frozen (SIGSTOP: like a lost node, its connections stay open and silent) during a checkpoint
    save: the survivor ends within the rest of the write plus train.hang_timeout_s (10 s), not
    train.save_timeout_s (300 s)."""
    run_dir, hang_timeout, write_s = tmp_path / "run", 10, 8
    args = command(tiny_cosmo_data, run_dir, "--set", f"train.hang_timeout_s={hang_timeout}",
                   "--set", "train.save_timeout_s=300", epochs=3, batch_size=2, ranks=2)
    process = subprocess.Popen(args, cwd=REPO, env=python_env({checkpoint.TEST_HOOK: hook}), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    checkpoints = run_dir / "checkpoints"
    if lost == 1:   # rank 0 is inside its (slowed) write of the second checkpoint: its temporary file exists
        wait_for(lambda: checkpoints.is_dir() and any(p.name.startswith(".ckpt-epoch-00002.npz.")
                                                      for p in checkpoints.iterdir()), process)
    else:           # rank 0 has put the second checkpoint in place, and is held before the meeting after it
        wait_for(lambda: (checkpoints / "ckpt-epoch-00002.npz").exists(), process)
    victim, survivor = rank_process(process, lost), rank_process(process, 1 - lost)
    victim.suspend()
    frozen = time.time()
    try:
        survivor.wait(timeout=120)
        elapsed = time.time() - frozen
    finally:   # killed while still frozen: a lost node never runs again (resumed first, rank 0 could record the end)
        victim.kill()
        out, _ = process.communicate(timeout=120)
    budget = hang_timeout + (write_s if lost == 1 else 0) + 5   # + the watchdog's and the file watch's polls
    assert elapsed < budget, (elapsed, out[-3000:])
    assert f"error: rank {1 - lost}: no progress for" in out and "s in synchronising (ckpt-epoch-00002.npz written" \
        in out and f"(train.hang_timeout_s={hang_timeout})" in out, out[-3000:]
    # Rank 0 records how the attempt ended when its watchdog ends it; a lost rank 0 records nothing (the next
    # attempt calls it vanished).
    attempt = attempts_of(run_dir)[-1]
    assert (attempt["status"], attempt["exit_code"]) == (("hung", 4) if lost == 1 else ("running", None))
    assert checkpoint.load_checkpoint(checkpoints / "ckpt-epoch-00002.npz")[0]["epoch"] == 2   # whole


def test_mid_epoch_checkpoint_position(tiny_cosmo_data, tmp_path):
    """A stop inside an epoch writes ckpt-epoch-E-step-S with that position and resumes from it."""
    run_dir = tmp_path / "run"
    process = start(command(tiny_cosmo_data, run_dir, epochs=2, batch_size=1, ranks=1))
    wait_for(lambda: (run_dir / "checkpoints" / "ckpt-epoch-00001.npz").exists(), process)
    process.send_signal(signal.SIGTERM)   # lands within epoch 2 (32 steps)
    process.communicate(timeout=120)
    assert process.returncode == 75
    latest = checkpoint.latest_checkpoint(run_dir / "checkpoints")
    state = checkpoint.read_state(latest)
    if state["step_in_epoch"]:
        assert "-step-" in latest.name and state["epoch"] == 1
        assert state["step"] == 32 + state["step_in_epoch"]
    resumed = finish(command(tiny_cosmo_data, run_dir, "--resume", epochs=2, batch_size=1))
    final = checkpoint.read_state(checkpoint.latest_checkpoint(run_dir / "checkpoints"))
    assert final["epoch"] == 2 and final["step"] == 64 and final["step_in_epoch"] == 0
    assert "epoch 2/2:" in resumed.stdout


def rank_process(parent: subprocess.Popen, rank: int) -> psutil.Process:
    for child in psutil.Process(parent.pid).children(recursive=True):
        try:
            if "cosmoflow.train" in " ".join(child.cmdline()) and child.environ().get("HOROVOD_RANK") == str(rank):
                return child
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    raise AssertionError(f"rank {rank} not found")


@pytest.mark.horovod
def test_signal_to_one_rank_stops_both_at_the_same_step(tiny_cosmo_data, tmp_path):
    run_dir = tmp_path / "run"
    # 200 epochs: still training when the signal comes, however fast the machine (3 took 2 s on a quiet one)
    process = start(command(tiny_cosmo_data, run_dir, epochs=200, batch_size=1, ranks=2))
    wait_for(lambda: (run_dir / "checkpoints" / "ckpt-epoch-00001.npz").exists(), process)
    rank_process(process, 1).send_signal(signal.SIGUSR1)
    out, err = process.communicate(timeout=180)
    assert process.returncode != 0 and "preempted" in err
    state = checkpoint.read_state(checkpoint.latest_checkpoint(run_dir / "checkpoints"))
    assert state["ranks"] == 2 and 1 <= state["epoch"] < 200
    end = state["epoch"] + 2
    resumed = finish(command(tiny_cosmo_data, run_dir, "--resume", epochs=end, batch_size=1, ranks=2))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs_completed"] == end and "resuming from" in resumed.stdout


@pytest.mark.horovod
def test_a_killed_rank_ends_the_job_within_the_timeout(tiny_cosmo_data, tmp_path):
    run_dir = tmp_path / "run"
    process = start(command(tiny_cosmo_data, run_dir, "--set", "train.hang_timeout_s=20", epochs=50,
                            batch_size=1, ranks=2))
    wait_for(lambda: (run_dir / "checkpoints" / "ckpt-epoch-00001.npz").exists(), process)
    victim = rank_process(process, 1)
    killed_at = time.time()
    victim.kill()
    out, err = process.communicate(timeout=120)
    elapsed = time.time() - killed_at
    assert process.returncode != 0
    assert elapsed < 20 + 30, elapsed
    for child in psutil.Process().children(recursive=True):
        try:
            command_line = " ".join(child.cmdline())
        except psutil.NoSuchProcess:   # ended (or a zombie: ended, not yet reaped) since the walk: not alive
            continue
        assert "cosmoflow.train" not in command_line, "a rank survived"


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tiny_cosmo_data, tmp_path, capsys):
    run_dir = tmp_path / "run"
    # (both runs in this process: what is tested is the guard and the checkpoint, not a process boundary)
    first = run_here(command(tiny_cosmo_data, run_dir, epochs=1)[1:], capsys)
    assert first.returncode == 0, first.stderr[-4000:]
    good = checkpoint.latest_checkpoint(run_dir / "checkpoints")
    digest = hashlib.sha256(good.read_bytes()).hexdigest()
    # A learning rate of 1e30 sends the weights, then the loss, to Inf/NaN within a few steps.
    result = run_here(command(tiny_cosmo_data, run_dir, "--resume", "--set", "optimizer.learning_rate=1e30",
                              epochs=2)[1:], capsys)
    assert result.returncode == 3, result.stderr[-3000:]
    message = [l for l in result.stderr.splitlines() if l.startswith("error:")][-1]
    assert "loss is" in message and "epoch 2, step" in message
    assert f"the last good checkpoint is {good}" in message   # named, and it exists
    assert checkpoint.latest_checkpoint(run_dir / "checkpoints") == good
    assert hashlib.sha256(good.read_bytes()).hexdigest() == digest
    assert [(a["status"], a["exit_code"]) for a in attempts_of(run_dir)] == [("finished", 0), ("non-finite", 3)]
    assert "loss is" in attempts_of(run_dir)[-1]["reason"]


# -- bad input: exit 2, one line naming the file or key, nothing overwritten ---------------------

def copy_dataset(source, target):
    import shutil
    shutil.copytree(source, target)
    return target


@pytest.fixture
def run_bad(capsys):
    """A command that must refuse (exit 2, one ``error:`` line: returned), run in this process: what is tested is
    the refusal, not a process boundary (``conftest.run_here``)."""
    return lambda args: _refusal(run_here(args, capsys))


def _refusal(result):
    errors = [l for l in result.stderr.splitlines() if l.startswith("error:")]
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(errors) == 1, result.stderr[-3000:]
    return errors[0]


def train_args(data_dir, run_dir, *extra):
    return ["-m", "cosmoflow.train", "--config", DEMO, *tiny_cosmo_overrides(data_dir, epochs=1),
            "--output-dir", str(run_dir), *extra]


def test_truncated_tfrecord(tiny_cosmo_data, tmp_path, run_bad):
    data = copy_dataset(tiny_cosmo_data, tmp_path / "data")
    victim = sorted((data / "train").iterdir())[3]
    victim.write_bytes(victim.read_bytes()[:-100])
    error = run_bad(train_args(data, tmp_path / "run"))
    assert str(victim) in error and "truncated TFRecord" in error
    assert not (tmp_path / "run" / "config.yaml").exists()
    # With on_bad_file: skip the file is left out, reported, and training runs.
    result = run_python(train_args(data, tmp_path / "run2", "--set", "data.on_bad_file=skip"))
    assert f"skipping bad file: {victim}" in result.stdout and "skipped 1 bad file" in result.stdout
    assert json.loads((tmp_path / "run2" / "summary.json").read_text())["skipped_files"] == [error[7:]]


def test_wrong_sample_shape(tiny_cosmo_data, tmp_path, run_bad):
    error = run_bad(train_args(tiny_cosmo_data, tmp_path / "run", "--set", "data.sample_shape=[8, 8, 8, 4]"))
    assert "expected 4096 (int16 x data.sample_shape [8, 8, 8, 4])" in error


def test_corrupt_hdf5_and_nan_targets(tmp_path, run_bad):
    from cosmoflow.config import MockSection
    from cosmoflow.mock import generate_dataset
    data = generate_dataset(tmp_path / "h5", 4, 2, 8, MockSection(box_size_mpc_h=64.0), file_format="hdf5",
                            progress=False)
    overrides = ["--set", "data.format=hdf5", "--set", "data.sample_shape=[8, 8, 8, 4]", "--set", "data.batch_size=2"]
    victim = sorted((data / "train").iterdir())[1]
    victim.write_bytes(victim.read_bytes()[:300])
    error = run_bad(train_args(data, tmp_path / "run", *overrides)[:-2] + ["--output-dir", str(tmp_path / "run")]
                    + overrides)
    assert str(victim) in error and "not a readable HDF5 file" in error
    victim.unlink()
    with h5py.File(sorted((data / "validation").iterdir())[0], "r+") as f:
        f["unitPar"][0] = np.nan
    error = run_bad(train_args(data, tmp_path / "run", *overrides))
    assert "'unitPar' holds NaN or Inf" in error


def test_existing_run_and_config_errors_overwrite_nothing(tiny_cosmo_data, tmp_path, run_bad):
    run_dir = tmp_path / "run"
    run_python(train_args(tiny_cosmo_data, run_dir))
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and "tensorboard" not in str(p)}
    error = run_bad(train_args(tiny_cosmo_data, run_dir))
    assert "pass --resume" in error
    for bad, key in ((["--set", "data.batch_size=-1"], "data.batch_size"),
                     (["--set", "model.name=resnet"], "model.name"),
                     (["--set", "optimizer.name=rmsprop"], "optimizer.name"),
                     (["--set", "train.epochs=two"], "train.epochs"),
                     (["--set", "data.n_train=100000"], "data.n_train=100000")):
        assert key in run_bad(train_args(tiny_cosmo_data, run_dir, "--resume", *bad))
    after = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and "tensorboard" not in str(p)}
    assert after == before


def test_hep_bad_labels_and_nan_images(tmp_path, run_bad):
    from hep_cnn.synth import generate_dataset
    data = generate_dataset(tmp_path / "hep", 64, 32, 32, image_size=16, events_per_file=32, progress=False)
    args = ["-m", "hep_cnn.train", "--set", f"data.data_dir={data}", "--set", "data.image_size=16",
            "--set", "data.batch_size=8", "--set", "train.epochs=1", "--set", "model.conv_units=2",
            "--set", "model.filters=4", "--output-dir", str(tmp_path / "run")]
    with h5py.File(data / "train_0001.h5", "r+") as f:
        f["all_events/y"][5] = 7
    error = run_bad(args)
    assert "train_0001.h5 events" in error and "labels outside {0, 1}" in error
    with h5py.File(data / "train_0001.h5", "r+") as f:
        f["all_events/y"][5] = 1
        f["all_events/hist"][3, 2, 2] = np.inf
    error = run_bad(args)
    assert "images hold NaN or Inf" in error


def test_check_data_reports_every_problem(tiny_cosmo_data, tmp_path):
    data = copy_dataset(tiny_cosmo_data, tmp_path / "data")
    files = sorted((data / "train").iterdir())
    files[0].write_bytes(files[0].read_bytes()[:-7])                      # truncated
    payload = bytearray(files[5].read_bytes())
    payload[100] ^= 0xFF                                                  # one flipped byte: data checksum
    files[5].write_bytes(bytes(payload))
    result = run_python(["-m", "common.tools.check_data", "--config", DEMO, "--set", f"data.data_dir={data}",
                         "--set", "data.sample_shape=[16, 16, 16, 4]"], check=False)
    problems = [l for l in result.stdout.splitlines() if l.startswith("problem:")]
    assert result.returncode == 2 and len(problems) == 2, result.stdout
    assert str(files[0]) in problems[0] and "truncated" in problems[0]
    assert str(files[5]) in problems[1] and "bad data checksum" in problems[1]
    assert "checked 48 files" in result.stdout
