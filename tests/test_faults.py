"""Trust under faults, as a hostile user would try it: NaN data and weights, changed settings on resume,
two runs in one folder, killed and corrupted checkpoints, files that are not the suite's, and bad files of
every kind named in one line.  Real processes, real files in the published formats, real concurrency."""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf

from common.storage import checkpoint
from common.errors import DataError, NonFiniteLoss
from conftest import REPO, STARTUP_S, python_env, run_here, run_python, tiny_cosmo_overrides

DEMO = str(REPO / "configs/cosmoflow/demo.yaml")
SHAPE = (16, 16, 16, 4)


def train_args(data_dir, run_dir, *extra, epochs=1, batch_size=4):
    return ["-m", "cosmoflow.train", "--config", DEMO, *tiny_cosmo_overrides(data_dir, epochs=epochs,
                                                                             batch_size=batch_size),
            "--output-dir", str(run_dir), *extra]


def one_error(result, code=2):
    """The one ``error:`` line of a run that had to exit with ``code``."""
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == code, result.stderr[-3000:]
    assert len(errors) == 1, result.stderr[-3000:]
    return errors[0]


def snapshot(root) -> dict:
    """Every file under ``root`` with its bytes: what a refused command must leave as it was."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def copy_dataset(source, target):
    shutil.copytree(source, target)
    return target


def records_of(path, compression=None):
    return [r.numpy() for r in tf.data.TFRecordDataset(str(path), compression_type=compression or "")]


def rewrite(path, payloads, compression=None):
    options = tf.io.TFRecordOptions(compression_type=compression) if compression else None
    with tf.io.TFRecordWriter(str(path), options) as writer:
        for payload in payloads:
            writer.write(payload)


def example(x, y, float_list=False) -> bytes:
    feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=x.astype(np.float32).ravel()))
               if float_list else tf.train.Feature(bytes_list=tf.train.BytesList(value=[x.astype("<i2").tobytes()])),
               "y": tf.train.Feature(float_list=tf.train.FloatList(value=y))}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def float_list_dataset(root, nan_in=None):
    """8 training and 4 validation samples, x as a float list (cosmoflow-benchmark before 2020); ``nan_in``:
    the training file whose volume gets one NaN voxel."""
    rng = np.random.default_rng(3)
    for split, count in (("train", 8), ("validation", 4)):
        (root / split).mkdir(parents=True)
        for i in range(count):
            x = rng.integers(0, 20, SHAPE).astype(np.float32)
            if split == "train" and i == nan_in:
                x[3, 4, 5, 1] = np.nan
            rewrite(root / split / f"univ_{i:03d}.tfrecord",
                    [example(x, rng.uniform(-0.9, 0.9, 4).astype(np.float32), float_list=True)])
    return root


# -- silent corruption: never exit 0 with a NaN model ------------------------------------------------

def test_nan_voxels_are_named_by_the_reader_fresh_resumed_and_by_check_data(tmp_path, capsys):
    bad = float_list_dataset(tmp_path / "bad", nan_in=5)
    victim = bad / "train" / "univ_005.tfrecord"
    # (each run in this process: what is tested is the reader's and the checkpoint's, not a process boundary)
    fresh = one_error(run_here(train_args(bad, tmp_path / "fresh", "--set", "data.batch_size=2"), capsys))
    assert fresh == f"error: {victim}: 'x' holds NaN or Inf"
    assert not (tmp_path / "fresh" / "model.keras").exists()
    checked = run_here(["-m", "common.tools.check_data", "--config", DEMO, "--set", f"data.data_dir={bad}",
                        "--set", "data.sample_shape=[16, 16, 16, 4]"], capsys)
    assert checked.returncode == 2 and f"problem: {victim}: record 0: 'x' holds NaN or Inf" in checked.stdout
    # A good run resumed onto the same data: stopped by the reader, the checkpoint untouched, no model.
    good = float_list_dataset(tmp_path / "good")
    run_dir = tmp_path / "run"
    assert run_here(train_args(good, run_dir, "--set", "data.batch_size=2"), capsys).returncode == 0
    (run_dir / "model.keras").unlink()
    kept = {p.name: p.read_bytes() for p in (run_dir / "checkpoints").iterdir()}
    resumed = run_here(train_args(bad, run_dir, "--resume", "--set", "data.batch_size=2", epochs=2), capsys)
    assert one_error(resumed) == f"error: {victim}: 'x' holds NaN or Inf"
    assert {p.name: p.read_bytes() for p in (run_dir / "checkpoints").iterdir()} == kept
    assert not (run_dir / "model.keras").exists()


def test_a_nan_loss_on_a_fresh_run_says_that_no_checkpoint_exists(tiny_cosmo_data, tmp_path):
    run_dir = tmp_path / "run"
    result = run_python(train_args(tiny_cosmo_data, run_dir, "--set", "optimizer.learning_rate=1e30"), check=False)
    message = one_error(result, code=3)
    assert "no checkpoint was written" in message and "last good checkpoint" not in message
    assert not any((run_dir / "checkpoints").glob("*.npz")) and not (run_dir / "model.keras").exists()


def variables(*values):
    return [keras.Variable(np.asarray(v, np.float32), name=f"w{i}") for i, v in enumerate(values)]


def test_a_nonfinite_weight_is_never_written_to_a_checkpoint(tmp_path):
    good, bad = variables([1.0, 2.0]), variables([1.0, np.inf])
    checkpoint.save_checkpoint(tmp_path, 1, good, [], {"step": 1})
    before = snapshot(tmp_path)
    with pytest.raises(NonFiniteLoss, match="1 weight array"):
        checkpoint.save_checkpoint(tmp_path, 2, good, bad, {"step": 2})
    assert snapshot(tmp_path) == before   # no new checkpoint, no temporary file


def test_nonfinite_gradients_stop_the_step_guard_even_with_a_finite_loss():
    from common.loop.preemption import StopRequest
    from common.loop.reliability import StepGuard, StepSignals

    signals = StepSignals()
    signals.global_loss.assign(0.5)
    signals.gradients_finite.assign(0.0)
    guard = StepGuard(signals, StopRequest(signals=()), None, None, loss_scaled=False, max_nonfinite_steps=3)
    guard.on_epoch_begin(0)
    with pytest.raises(NonFiniteLoss, match="the gradients hold NaN or Inf .* at epoch 1, step 1"):
        guard.on_train_batch_end(0)
    # Under loss scaling such steps are skipped by the optimizer; N in a row stop the run.
    scaled = StepGuard(signals, StopRequest(signals=()), None, None, loss_scaled=True, max_nonfinite_steps=3)
    scaled.on_epoch_begin(0)
    scaled.on_train_batch_end(0)
    scaled.on_train_batch_end(1)
    with pytest.raises(NonFiniteLoss, match="3 non-finite steps in a row"):
        scaled.on_train_batch_end(2)


# -- resume: compatibility decided before anything is written -----------------------------------------

def test_a_changed_batch_or_model_is_refused_before_anything_is_written(tiny_cosmo_data, tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_python(train_args(tiny_cosmo_data, run_dir))
    before = snapshot(run_dir)
    batch = one_error(run_here(train_args(tiny_cosmo_data, run_dir, "--resume", epochs=2, batch_size=2), capsys))
    assert "ckpt-epoch-00001.npz: written with global_batch_size 4, this run has 2" in batch
    model = one_error(run_here(train_args(tiny_cosmo_data, run_dir, "--resume", "--set", "model.base_filters=8",
                                          epochs=2), capsys))
    assert "ckpt-epoch-00001.npz: written with model.base_filters 4, this run has 8" in model
    assert "not resumed" in model
    # a change that leaves every weight's shape as it was is refused too, by its name (it was resumed silently)
    same_shapes = one_error(run_here(train_args(tiny_cosmo_data, run_dir, "--resume", "--set", "model.l2=0.001",
                                                epochs=2), capsys))
    assert "ckpt-epoch-00001.npz: written with model.l2 0.0, this run has 0.001" in same_shapes
    # data keys that decide what the weights mean: the input transform, the box the summaries' k bins are in
    transform = one_error(run_here(train_args(tiny_cosmo_data, run_dir, "--resume", "--set", "data.apply_log=false",
                                              epochs=2), capsys))
    assert "ckpt-epoch-00001.npz: written with data.apply_log True, this run has False" in transform
    box = one_error(run_here(train_args(tiny_cosmo_data, run_dir, "--resume", "--set",
                                        "data.mock.box_size_mpc_h=512", epochs=2), capsys))
    assert "written with data.mock.box_size_mpc_h" in box and "this run has 512.0" in box
    order = one_error(run_here(train_args(tiny_cosmo_data, run_dir, "--resume", "--set",
                                          "data.file_target_names=[sigma_8, Omega_m, n_s, H0]", epochs=2), capsys))
    assert "written with data.file_target_names None, this run has ['sigma_8', 'Omega_m', 'n_s', 'H0']" in order
    optimizer = one_error(run_here(train_args(tiny_cosmo_data, run_dir, "--resume", "--set", "optimizer.name=adam",
                                              epochs=2), capsys))
    assert "ckpt-epoch-00001.npz" in optimizer
    assert snapshot(run_dir) == before   # config.yaml, the marker, history: as they were


@pytest.mark.horovod
def test_a_resume_on_another_number_of_ranks_keeps_the_global_batch(tiny_cosmo_data, tmp_path):
    """A run checkpointed on 2 ranks x 2 resumes on 1 rank x 4 (the global batch, and with it the position
    and the schedule, kept); a global batch the new ranks cannot share is refused before anything is written."""
    run_dir = tmp_path / "run"
    run_python(train_args(tiny_cosmo_data, run_dir, batch_size=2), ranks=2)
    resumed = run_python(train_args(tiny_cosmo_data, run_dir, "--resume", epochs=2, batch_size=2))
    assert "data.batch_size 2 -> 4 per rank keeps the global batch 4" in resumed.stderr + resumed.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["ranks"] == 1 and summary["global_batch_size"] == 4 and summary["first_epoch_this_run"] == 2
    assert summary["epochs_completed"] == 2
    odd = tmp_path / "odd"
    run_python(train_args(tiny_cosmo_data, odd, batch_size=3))
    before = snapshot(odd)
    refused = run_python(train_args(tiny_cosmo_data, odd, "--resume", epochs=2, batch_size=3), ranks=2, check=False)
    # Each rank exits 2 with the one line (horovodrun itself then exits 1, naming the first rank's code).
    assert refused.returncode != 0 and "Exit code: 2" in refused.stdout + refused.stderr, refused.stderr[-3000:]
    assert f"error: {odd}/checkpoints: the checkpoint was written by 1 rank(s) with global batch 3, which 2 " \
           "rank(s) cannot share evenly; not resumed" in refused.stderr
    assert snapshot(odd) == before


# -- one run per folder; checkpoints that are killed or damaged ----------------------------------------

def test_a_second_training_on_the_same_folder_is_refused_and_ctrl_c_ends_the_first_in_one_line(
        tiny_cosmo_data, tmp_path, capsys):
    """While a training runs, a second one (resumed or forced) and an evaluation of its folder are refused by its
    claim; Ctrl-C then ends it with one line and the shell's code.  (Its SIGTERM, exit 75, is
    tests/test_reliability.py's mid-epoch checkpoint.)"""
    run_dir = tmp_path / "run"
    args = [sys.executable, *train_args(tiny_cosmo_data, run_dir, epochs=500, batch_size=1)]
    # SIGINT at its default in the child, as in a terminal: a job started in the background by a
    # non-interactive shell (CI's) inherits it ignored, and Python then never raises KeyboardInterrupt
    first = subprocess.Popen(args, cwd=REPO, env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + STARTUP_S
    while not (run_dir / "checkpoints" / "ckpt-epoch-00001.npz").exists():
        assert first.poll() is None and time.time() < deadline, first.communicate()
        time.sleep(0.05)
    # (refused in this process: what is tested is the other process's claim, not this one's boundary)
    second = run_here(train_args(tiny_cosmo_data, run_dir, "--resume", epochs=500, batch_size=1), capsys)
    forced = run_here(train_args(tiny_cosmo_data, run_dir, "--force", epochs=500, batch_size=1), capsys)
    evaluated = run_here(["-m", "cosmoflow.evaluate", "--run-dir", str(run_dir)], capsys)
    assert first.poll() is None, "the first run ended before the second was tried"
    first.send_signal(signal.SIGINT)
    out, err = first.communicate(timeout=300)
    for refused in (second, forced, evaluated):   # evaluate: in use, not "model.keras not found"
        assert f"{run_dir}: in use by cosmoflow.train (pid {first.pid}" in one_error(refused)
    assert first.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    said = [line for line in err.splitlines() if line.startswith("interrupted")]
    assert said == [f"interrupted (Ctrl-C); {run_dir}: a rerun with --resume continues from the newest checkpoint "
                    "there, if the run had written one (exit 130)"]
    attempts = json.loads((run_dir / "attempts.json").read_text())
    assert (attempts["attempts"][-1]["status"], attempts["attempts"][-1]["exit_code"]) == ("interrupted", 130), attempts
    latest = checkpoint.latest_checkpoint(run_dir / "checkpoints")
    assert latest is not None   # what the line says is there
    header, *rows = (run_dir / "history.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in rows] == [str(e) for e in range(checkpoint.read_state(latest)["epoch"])]


@pytest.mark.parametrize("absorb, code", [(False, -signal.SIGUSR1), (True, 0)])
def test_a_stop_signal_after_the_stop_is_absorbed_while_the_process_ends(absorb, code):
    """A rank that stopped on another rank's signal may get its own after its handlers closed: ending on a stop
    request (exit 75), it ignores it instead of dying of SIGUSR1's default action (138, which is not requeued)."""
    script = ("import os, signal\nfrom common.loop.preemption import StopRequest\nrequest = StopRequest()\n"
              f"request.close(absorb={absorb})\nos.kill(os.getpid(), signal.SIGUSR1)\nprint('still here')\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=python_env(), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == code, result.stderr
    assert ("still here" in result.stdout) == absorb


def test_concurrent_writers_of_one_checkpoint_and_a_failed_write(tmp_path, monkeypatch):
    weights = variables(np.arange(20000.0), [3.0])
    errors = []

    def writer():
        try:
            for _ in range(5):
                checkpoint.save_checkpoint(tmp_path, 1, weights, [], {"step": 1})
        except Exception as exc:   # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    state, arrays = checkpoint.load_checkpoint(tmp_path / "ckpt-epoch-00001.npz")   # every CRC checked
    np.testing.assert_array_equal(arrays["model/00000"], np.arange(20000.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-epoch-00001.npz"]

    def failing_savez(handle, **arrays):
        handle.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.np, "savez", failing_savez)
    with pytest.raises(OSError):
        checkpoint.save_checkpoint(tmp_path, 2, weights, [], {"step": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-epoch-00001.npz"]


def flip_middle(path):
    payload = bytearray(path.read_bytes())
    for i in range(len(payload) // 2, len(payload) // 2 + 64):
        payload[i] ^= 0xFF
    path.write_bytes(bytes(payload))


def test_a_killed_save_and_a_corrupt_newest_checkpoint(tiny_cosmo_data, tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_python(train_args(tiny_cosmo_data, run_dir, epochs=2))
    checkpoints = run_dir / "checkpoints"
    stale = checkpoints / ".ckpt-epoch-00003.npz.k1ll3d.tmp"   # what a writer killed mid-save leaves
    stale.write_bytes(b"\0" * 4096)
    flip_middle(checkpoints / "ckpt-epoch-00002.npz")
    resumed = run_python(train_args(tiny_cosmo_data, run_dir, "--resume", epochs=3))
    assert f"{checkpoints / 'ckpt-epoch-00002.npz'}: not a readable checkpoint" in resumed.stdout
    assert f"resuming from {checkpoints / 'ckpt-epoch-00001.npz'}" in resumed.stdout
    assert f"removed {stale.name}" in resumed.stdout and not stale.exists()
    assert json.loads((run_dir / "summary.json").read_text())["epochs_completed"] == 3
    for path in checkpoint.list_checkpoints(checkpoints):
        flip_middle(path)
    message = one_error(run_here(train_args(tiny_cosmo_data, run_dir, "--resume", epochs=4), capsys))
    assert f"{checkpoints}: no readable checkpoint (ckpt-epoch-00003.npz, ckpt-epoch-00002.npz are corrupt)" in message


# -- files that are not the suite's ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def finished_run(tiny_cosmo_data, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    run_python(train_args(tiny_cosmo_data, run_dir))
    return run_dir


def test_evaluate_keeps_a_users_files_unless_forced(finished_run, tmp_path, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    for name in ("config.yaml", "model.keras"):
        shutil.copy(finished_run / name, folder / name)
    (folder / "metrics.json").write_text('{"my": "results"}\n')
    (folder / "predictions.npz").write_bytes(b"my predictions")
    before = snapshot(folder)
    message = one_error(run_here(["-m", "cosmoflow.evaluate", "--run-dir", str(folder)], capsys))
    assert message == f"error: {folder / 'metrics.json'}: exists and was not written by this suite; not replaced " \
                      "(pass --force to replace it)"
    assert snapshot(folder) == before
    run_python(["-m", "cosmoflow.evaluate", "--run-dir", str(folder), "--force"])
    assert json.loads((folder / "metrics.json").read_text())["written_by"] == "hpc-dl-suite cosmoflow.evaluate"
    # What it wrote carries the suite's mark: a second evaluation replaces it without --force.
    run_python(["-m", "cosmoflow.evaluate", "--run-dir", str(folder)])


def test_force_does_not_make_a_users_folder_the_suites(tiny_cosmo_data, tmp_path, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "metrics.json").write_text('{"my": "results"}\n')
    (folder / "notes.txt").write_text("my notes\n")
    run_python(train_args(tiny_cosmo_data, folder, "--force"))
    marker = json.loads((folder / ".hpc-dl-suite-run").read_text())
    assert "metrics.json" not in marker["files"] and "notes.txt" not in marker["files"]
    assert {"config.yaml", "model.keras", "checkpoints/", "summary.json"} <= set(marker["files"])
    message = one_error(run_here(["-m", "cosmoflow.evaluate", "--run-dir", str(folder)], capsys))
    assert f"{folder / 'metrics.json'}: exists and was not written by this suite" in message
    assert (folder / "metrics.json").read_text() == '{"my": "results"}\n'
    assert (folder / "notes.txt").read_text() == "my notes\n"


def test_an_mlperf_log_outside_the_run_folder_must_be_a_new_file(tiny_cosmo_data, tmp_path, capsys):
    users = tmp_path / "their.log"
    users.write_text("a user's log\n")
    mlperf = ["--set", "mlperf.enabled=true"]
    message = one_error(run_here(train_args(tiny_cosmo_data, tmp_path / "a", *mlperf, "--set",
                                            f"mlperf.log_file={users}"), capsys))
    assert f"{users}: mlperf.log_file exists and was not started by this run directory's training" in message
    assert users.read_text() == "a user's log\n" and not (tmp_path / "a" / "config.yaml").exists()
    log = tmp_path / "logs" / "run.log"
    log.parent.mkdir()
    run_python(train_args(tiny_cosmo_data, tmp_path / "b", *mlperf, "--set", f"mlperf.log_file={log}"))
    first = log.read_text()
    assert ":::MLLOG" in first
    # The same run resumed appends to the log its first attempt started; another run may not.
    run_python(train_args(tiny_cosmo_data, tmp_path / "b", "--resume", *mlperf, "--set", f"mlperf.log_file={log}",
                          epochs=2))
    assert log.read_text().startswith(first) and len(log.read_text()) > len(first)
    other = one_error(run_here(train_args(tiny_cosmo_data, tmp_path / "c", *mlperf, "--set",
                                          f"mlperf.log_file={log}"), capsys))
    assert f"{log}: mlperf.log_file exists" in other


def test_bench_and_scaling_outputs_never_replace_a_users_file(tiny_cosmo_data, tmp_path, capsys):
    users_json, users_png = tmp_path / "numbers.json", tmp_path / "plot.png"
    users_json.write_text('{"mine": true}\n')
    users_png.write_bytes(b"\x89PNG not the suite's")
    bench = one_error(run_here(["-m", "common.tools.bench", "--config", DEMO, *tiny_cosmo_overrides(tiny_cosmo_data),
                                "--steps", "2", "--json", str(users_json)], capsys))
    assert f"{users_json}: exists and was not written by this suite" in bench
    scaling = one_error(run_here(["-m", "common.tools.scaling", "--config", DEMO, "--system", "perlmutter",
                                  "--nodes", "1,2", "--png", str(users_png)], capsys))
    assert f"{users_png}: exists and was not written by this suite" in scaling
    assert users_json.read_text() == '{"mine": true}\n' and users_png.read_bytes() == b"\x89PNG not the suite's"
    # A figure the suite wrote carries its mark and is replaced without --force.
    ours = tmp_path / "ours.png"
    for _ in range(2):
        run_python(["-m", "common.tools.scaling", "--config", DEMO, "--system", "perlmutter", "--nodes", "1,2",
                    "--png", str(ours)])
    from PIL import Image
    assert Image.open(ours).text["written_by"] == "hpc-dl-suite common.tools.scaling"


def test_modes_follow_the_umask(tiny_cosmo_data, tmp_path):
    """Generated data and run folders come out as plain open()/mkdir() would make them (0664/0775 under
    umask 002), readable by the group on a shared file system, not mkstemp's 0600."""
    command = [sys.executable, "-m", "cosmoflow.mock", "--config", DEMO, "--out", str(tmp_path / "data"),
               "--n-train", "2", "--n-validation", "1", "--size", "8", "--workers", "1"]
    result = subprocess.run(command, cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=300,
                            preexec_fn=lambda: os.umask(0o002))
    assert result.returncode == 0, result.stderr[-2000:]
    run_dir = tmp_path / "run"
    result = subprocess.run([sys.executable, *train_args(tiny_cosmo_data, run_dir)], cwd=REPO, env=python_env(),
                            capture_output=True, text=True, timeout=300, preexec_fn=lambda: os.umask(0o002))
    assert result.returncode == 0, result.stderr[-2000:]
    folders = [tmp_path / "data", tmp_path / "data" / "train", run_dir / "checkpoints"]
    files = [*(tmp_path / "data" / "train").iterdir(), run_dir / "model.keras", run_dir / "config.yaml",
             run_dir / "summary.json", *(run_dir / "checkpoints").iterdir()]
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in folders} == {oct(0o775)}
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {oct(0o664)}


def test_staging_recopies_a_source_that_changed(tmp_path):
    from common.storage.staging import stage_files
    from common.distributed import Distributed

    first = tmp_path / "first"
    first.mkdir()
    for name in ("a.tfrecord", "b.tfrecord"):
        (first / name).write_bytes(name.encode() * 100)
    stage = tmp_path / "stage"
    staged = stage_files([str(first / "a.tfrecord"), str(first / "b.tfrecord")], str(stage), Distributed())
    copy_b = stage / "rank-0" / "b.tfrecord"
    stamp = copy_b.stat().st_mtime_ns
    # Same names and sizes in another data_dir: copied again, not trained from the stale copies.
    second = tmp_path / "second"
    second.mkdir()
    for name in ("a.tfrecord", "b.tfrecord"):
        (second / name).write_bytes(name.upper().encode() * 100)
    staged = stage_files([str(second / "a.tfrecord"), str(second / "b.tfrecord")], str(stage), Distributed())
    assert [open(p, "rb").read() for p in staged] == [b"A.TFRECORD" * 100, b"B.TFRECORD" * 100]
    # A source rewritten in place (same path and size) too; an unchanged one is reused.
    time.sleep(0.01)
    (second / "a.tfrecord").write_bytes(b"x" * 1000)
    stamp = copy_b.stat().st_mtime_ns
    staged = stage_files([str(second / "a.tfrecord"), str(second / "b.tfrecord")], str(stage), Distributed())
    assert open(staged[0], "rb").read() == b"x" * 1000 and copy_b.stat().st_mtime_ns == stamp
    manifest = json.loads((stage / "rank-0" / ".hpc-dl-suite-staged.json").read_text())["files"]
    import google_crc32c
    assert manifest["a.tfrecord"]["crc32c"] == google_crc32c.value(b"x" * 1000)


# -- bad input: exit 2, one line naming the file and what was expected -----------------------------------

def test_a_flipped_byte_in_a_record_is_named(tiny_cosmo_data, tmp_path, capsys):
    """TensorFlow's reader finds the bad data checksum but names no file; the run names it."""
    data = copy_dataset(tiny_cosmo_data, tmp_path / "data")
    victim = sorted((data / "train").iterdir())[6]
    payload = bytearray(victim.read_bytes())
    payload[len(payload) // 2] ^= 0x01
    victim.write_bytes(bytes(payload))
    message = one_error(run_here(train_args(data, tmp_path / "run"), capsys))
    assert message == f"error: {victim}: corrupt TFRecord file (bad data checksum of record 0)"


def resized_sample(path, compression=None):
    """Rewrite the file's one record with a volume of 8^3 x 4 instead of 16^3 x 4."""
    features = tf.train.Example.FromString(records_of(path, compression)[0]).features.feature
    y = np.asarray(features["y"].float_list.value, np.float32)
    rewrite(path, [example(np.ones((8, 8, 8, 4), np.int16), y)], compression)


def test_a_sample_of_another_shape_in_a_later_file_is_named(tiny_cosmo_data, tmp_path, capsys):
    data = copy_dataset(tiny_cosmo_data, tmp_path / "data")
    victim = sorted((data / "train").iterdir())[20]
    resized_sample(victim)
    message = one_error(run_here(train_args(data, tmp_path / "run"), capsys))
    assert message.startswith(f"error: {victim}: record 0: holds x of 4096 and y of 4 values, expected 32768 and 4")
    assert not (tmp_path / "run").exists()   # found at start-up: nothing written
    # GZIP files cannot be walked without decompressing them: the reader names the file as it meets it.
    gz = tmp_path / "gz"
    for split in ("train", "validation"):
        (gz / split).mkdir(parents=True)
        for path in sorted((tiny_cosmo_data / split).iterdir()):
            rewrite(gz / split / path.name, records_of(path), "GZIP")
    victim = gz / "train" / victim.name
    resized_sample(victim, "GZIP")
    message = one_error(run_here(train_args(gz, tmp_path / "run-gz", "--set", "data.compression=gzip"), capsys))
    assert message.startswith(f"error: {victim}: a record holds x or y of another size than expected")
    # A truncated GZIP member: named after TensorFlow's reader stops on it.
    rewrite(victim, records_of(tiny_cosmo_data / "train" / victim.name), "GZIP")
    victim.write_bytes(victim.read_bytes()[:-40])
    message = one_error(run_here(train_args(gz, tmp_path / "run-gz2", "--set", "data.compression=gzip"), capsys))
    assert message.startswith(f"error: {victim}: not a readable GZIP TFRecord file")


def test_hep_short_weights_and_a_corrupt_chunk_are_named(tmp_path, capsys):
    from hep_cnn.synth import generate_dataset

    data = generate_dataset(tmp_path / "hep", 64, 32, 32, image_size=16, events_per_file=32, progress=False)
    args = ["-m", "hep_cnn.train", "--set", f"data.data_dir={data}", "--set", "data.image_size=16",
            "--set", "data.batch_size=8", "--set", "train.epochs=1", "--set", "model.conv_units=2",
            "--set", "model.filters=4", "--output-dir", str(tmp_path / "run")]
    victim = data / "train_0001.h5"
    with h5py.File(victim, "r+") as f:
        weights = f["all_events/weight"][()]
        del f["all_events/weight"]
        f["all_events/weight"] = weights[:-1]
    message = one_error(run_here(args, capsys))
    assert message == f"error: {victim}: all_events/weight has shape (31,), expected (32,): one value per event " \
                      "of all_events/y"
    # A damaged compressed chunk: h5py cannot inflate it.
    with h5py.File(victim, "r+") as f:
        hist = f["all_events/hist"][()]
        del f["all_events/weight"], f["all_events/hist"]
        f["all_events/weight"] = weights
        f.create_dataset("all_events/hist", data=hist, chunks=(8, 16, 16), compression="gzip")
        offset = f["all_events/hist"].id.get_chunk_info(1).byte_offset
    with open(victim, "r+b") as handle:
        handle.seek(offset + 20)
        handle.write(b"\xff" * 64)
    message = one_error(run_here(args, capsys))
    assert message.startswith(f"error: {victim}: events ") and "cannot be read" in message
    checked = run_python(["-m", "common.tools.check_data", "--config", "configs/hep_cnn/demo.yaml",
                          "--set", f"data.data_dir={data}", "--set", "data.image_size=16"], check=False)
    assert checked.returncode == 2 and "Traceback" not in checked.stderr, checked.stderr[-2000:]
    assert f"problem: {victim}: events " in checked.stdout


def test_a_detection_split_without_snapshots_is_named(tmp_path):
    from climate_seg.detection.config import DetectConfig
    from climate_seg.detection.data import split_samples
    from climate_seg.cam5.config import EXTREMEWEATHER_CHANNELS

    (tmp_path / "train").mkdir()
    with h5py.File(tmp_path / "train" / "climo_1979.h5", "w") as f:
        f["images"] = np.zeros((0, len(EXTREMEWEATHER_CHANNELS), 32, 48), np.float32)
        f["boxes"] = np.zeros((0, 15, 5), np.int32)
    cfg = DetectConfig.model_validate({"task": "detection", "data": {"data_dir": str(tmp_path), "grid": [32, 48]}})
    with pytest.raises(DataError, match=r"/train: its 1 file\(s\) hold no snapshot; expected images"):
        split_samples(cfg, "train")


def test_a_model_that_does_not_fit_the_samples_is_refused_before_the_run_folder(tiny_cosmo_data, tmp_path, capsys):
    message = one_error(run_here(train_args(tiny_cosmo_data, tmp_path / "run", "--set", "model.conv_blocks=5"), capsys))
    assert "model.conv_blocks=5: block 5 has nothing left of data.sample_shape [16, 16, 16, 4]" in message
    assert not (tmp_path / "run").exists()


def test_a_config_that_is_not_utf8_and_a_boolean_for_a_number(tiny_cosmo_data, tmp_path, capsys):
    config = tmp_path / "latin1.yaml"
    config.write_bytes("# r\xe9solution\ndata: {data_dir: /d}\n".encode("latin-1"))
    message = one_error(run_here(["-m", "cosmoflow.train", "--config", str(config)], capsys))
    assert message.startswith(f"error: {config}: not a UTF-8 text file")
    message = one_error(run_here(train_args(tiny_cosmo_data, tmp_path / "run", "--set", "data.batch_size=true"), capsys))
    assert "key 'data.batch_size': expected a number, not a boolean" in message


def without_file_permission_overrides(args, **kwargs):
    """Run as root but without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH: file modes apply, as for a user."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        pytest.skip("needs root and setpriv (util-linux) to drop the file-permission capabilities")
    command = [setpriv, "--bounding-set", "-dac_override,-dac_read_search", sys.executable, *args]
    return subprocess.run(command, cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=300, **kwargs)


def test_unreadable_data_and_unwritable_or_impossible_output_folders(tiny_cosmo_data, tmp_path, capsys):
    data = copy_dataset(tiny_cosmo_data, tmp_path / "data")
    os.chmod(data / "train", 0)
    try:
        message = one_error(without_file_permission_overrides(train_args(data, tmp_path / "run")))
        assert message == f"error: {data / 'train'}: CosmoFlow train TFRecord directory cannot be read (permission denied)"
    finally:
        os.chmod(data / "train", 0o755)
    readonly = tmp_path / "readonly"
    readonly.mkdir(mode=0o555)
    message = one_error(without_file_permission_overrides(train_args(data, readonly / "run")))
    assert message == f"error: {readonly / 'run'}: --output-dir is not writable (no write permission on {readonly})"
    (tmp_path / "a_file").write_text("")
    message = one_error(run_here(train_args(data, tmp_path / "a_file" / "run"), capsys))
    assert message == f"error: {tmp_path / 'a_file' / 'run'}: --output-dir cannot be created: " \
                      f"{tmp_path / 'a_file'} is a file, not a folder"


WATCHDOG = """
import sys, time
from common.loop.reliability import Watchdog
dog = Watchdog(timeout_s=0.6, rank=0, poll_s=0.05, startup_timeout_s=float(sys.argv[1]), save_timeout_s=3.0)
for step in sys.argv[2:]:
    phase, seconds = step.split(":")
    if phase != "-":
        dog.phase(phase)
    time.sleep(float(seconds))
    print("alive after", step, flush=True)
"""


@pytest.mark.parametrize("startup, steps, survives, phase", [
    ("1.0", ["-:2.5"], 0, "start-up"),                           # a hang before the first step is bounded
    ("5.0", ["-:1.5", "training:0.3"], 2, None),                 # a slow start within its own limit
    ("5.0", ["training:0.2", "saving:1.5", "training:0.3"], 3, None),   # a long save: waiting ranks live on
    ("5.0", ["training:0.2", "saving:1.5", "training:1.5"], 2, "training"),
])
def test_the_watchdog_covers_start_up_and_long_saves(startup, steps, survives, phase):
    result = subprocess.run([sys.executable, "-c", WATCHDOG, startup, *steps], cwd=REPO, env=python_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.stdout.count("alive after") == survives, (result.stdout, result.stderr)
    if phase is None:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode == 4 and f"s in {phase}" in result.stderr, result.stderr


WAITING_FOR_A_WRITE = """
import os, pathlib, sys, time
from common.loop.reliability import Watchdog
path = pathlib.Path(sys.argv[1])
path.write_bytes(b"an older checkpoint of the same name")   # a corrupt newest one, say, that a resume skipped
dog = Watchdog(timeout_s=0.6, rank=1, poll_s=0.05, startup_timeout_s=5.0, save_timeout_s=3.0)
dog.at_expiry(lambda message: print("last words:", message, flush=True))
watch = dog.watch_replacement(path)
dog.phase("saving", "waiting for rank 0", until=watch, then=f"{path.name} written")
time.sleep(1.5)   # rank 0's write: longer than hang_timeout, within save_timeout
print("alive while rank 0 writes", flush=True)
(path.parent / "new").write_bytes(b"the new checkpoint")
os.replace(path.parent / "new", path)
time.sleep(float(sys.argv[2]))   # the meeting after the write
print("alive after the meeting", flush=True)
"""


@pytest.mark.parametrize("meeting_s, survives", [(0.2, True), (2.0, False)])
def test_a_rank_waiting_for_rank_0s_write_gets_hang_timeout_once_it_is_written(tmp_path, meeting_s, survives):
    """A rank waiting for rank 0's checkpoint has train.save_timeout_s while the file is being written; once it
    sees the file replaced, train.hang_timeout_s for the rest (a rank lost meanwhile ends it that much later)."""
    result = subprocess.run([sys.executable, "-c", WAITING_FOR_A_WRITE, str(tmp_path / "ckpt-epoch-00002.npz"),
                             str(meeting_s)], cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=60)
    assert "alive while rank 0 writes" in result.stdout, (result.stdout, result.stderr)
    assert ("alive after the meeting" in result.stdout) == survives, (result.stdout, result.stderr)
    if not survives:
        assert result.returncode == 4, result.stderr
        assert "s in synchronising (ckpt-epoch-00002.npz written) (train.hang_timeout_s=0.6)" in result.stderr
        assert "last words: rank 1: no progress for" in result.stdout
