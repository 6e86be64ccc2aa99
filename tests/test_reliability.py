"""Exact resume, preemption, dead ranks, NaN losses and bad input, on real processes and files."""

import hashlib
import json
import os
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
from conftest import REPO, python_env, run_python, tiny_cosmo_overrides

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
        args = [str(os.path.join(os.path.dirname(sys.executable), "horovodrun")), "-np", str(ranks),
                "-H", f"localhost:{ranks}", "--gloo", *args]
    return args


def start(args):
    return subprocess.Popen(args, cwd=REPO, env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def wait_for(predicate, process, timeout=300):
    deadline = time.time() + timeout
    while not predicate():
        if process.poll() is not None:
            out, err = process.communicate()
            raise AssertionError(f"process ended early ({process.returncode})\n{out[-2000:]}\n{err[-3000:]}")
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
def uninterrupted(tiny_cosmo_data, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    finish(command(tiny_cosmo_data, run_dir))
    return final_weights(run_dir)


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
    assert epochs[-1] == "2"


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
    process = start(command(tiny_cosmo_data, run_dir, epochs=3, batch_size=1, ranks=2))
    wait_for(lambda: (run_dir / "checkpoints" / "ckpt-epoch-00001.npz").exists(), process)
    rank_process(process, 1).send_signal(signal.SIGUSR1)
    out, err = process.communicate(timeout=180)
    assert process.returncode != 0 and "preempted" in err
    state = checkpoint.read_state(checkpoint.latest_checkpoint(run_dir / "checkpoints"))
    assert state["ranks"] == 2 and state["epoch"] >= 1
    resumed = finish(command(tiny_cosmo_data, run_dir, "--resume", epochs=3, batch_size=1, ranks=2))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs_completed"] == 3 and "resuming from" in resumed.stdout


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


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tiny_cosmo_data, tmp_path):
    run_dir = tmp_path / "run"
    finish(command(tiny_cosmo_data, run_dir, epochs=1))
    good = checkpoint.latest_checkpoint(run_dir / "checkpoints")
    digest = hashlib.sha256(good.read_bytes()).hexdigest()
    # A learning rate of 1e30 sends the weights, then the loss, to Inf/NaN within a few steps.
    result = finish(command(tiny_cosmo_data, run_dir, "--resume", "--set", "optimizer.learning_rate=1e30",
                            epochs=2), check=False)
    assert result.returncode == 3, result.stderr[-3000:]
    message = [l for l in result.stderr.splitlines() if l.startswith("error:")][-1]
    assert "loss is" in message and "epoch 2, step" in message
    assert f"the last good checkpoint is {good}" in message   # named, and it exists
    assert checkpoint.latest_checkpoint(run_dir / "checkpoints") == good
    assert hashlib.sha256(good.read_bytes()).hexdigest() == digest


# -- bad input: exit 2, one line naming the file or key, nothing overwritten ---------------------

def copy_dataset(source, target):
    import shutil
    shutil.copytree(source, target)
    return target


def run_bad(args, run_dir=None):
    result = run_python(args, check=False)
    errors = [l for l in result.stderr.splitlines() if l.startswith("error:")]
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(errors) == 1, result.stderr[-3000:]
    return errors[0]


def train_args(data_dir, run_dir, *extra):
    return ["-m", "cosmoflow.train", "--config", DEMO, *tiny_cosmo_overrides(data_dir, epochs=1),
            "--output-dir", str(run_dir), *extra]


def test_truncated_tfrecord(tiny_cosmo_data, tmp_path):
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


def test_wrong_sample_shape(tiny_cosmo_data, tmp_path):
    error = run_bad(train_args(tiny_cosmo_data, tmp_path / "run", "--set", "data.sample_shape=[8, 8, 8, 4]"))
    assert "expected 4096 (int16 x data.sample_shape [8, 8, 8, 4])" in error


def test_corrupt_hdf5_and_nan_targets(tmp_path):
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


def test_existing_run_and_config_errors_overwrite_nothing(tiny_cosmo_data, tmp_path):
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


def test_hep_bad_labels_and_nan_images(tmp_path):
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
