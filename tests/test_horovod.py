"""Real Horovod ranks (horovodrun --gloo, 2 processes on this machine)."""

import json

import keras
import numpy as np
import pytest

from conftest import REPO, run_python, tiny_cosmo_overrides

pytestmark = pytest.mark.horovod
WORKER = str(REPO / "tests" / "workers" / "data_parallel_step.py")


def load(path):
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def test_ranks_end_with_identical_weights(tmp_path):
    run_python([WORKER, str(tmp_path / "rank{rank}.npz"), "--dropout"], ranks=2)
    rank0, rank1 = load(tmp_path / "rank0.npz"), load(tmp_path / "rank1.npz")
    assert rank0["size"] == rank1["size"] == 2
    for key in (k for k in rank0 if k.startswith("w")):
        np.testing.assert_array_equal(rank0[key], rank1[key], err_msg=key)
    assert not np.allclose(rank0["w0"], rank0["init0"])   # it did train


def test_split_global_batch_equals_whole_batch_on_one_rank(tmp_path):
    run_python([WORKER, str(tmp_path / "single.npz")])                 # one process, whole batch
    run_python([WORKER, str(tmp_path / "rank{rank}.npz")], ranks=2)     # two ranks, half each
    single, split = load(tmp_path / "single.npz"), load(tmp_path / "rank0.npz")
    assert single["size"] == 1 and split["size"] == 2
    for key in (k for k in single if k.startswith("init")):
        np.testing.assert_array_equal(single[key], split[key])
    for key in (k for k in single if k.startswith("w")):
        np.testing.assert_allclose(split[key], single[key], rtol=1e-5, atol=1e-6, err_msg=key)


def test_loss_scaling_skips_a_step_on_every_rank_together(tmp_path):
    run_python([WORKER, str(tmp_path / "rank{rank}.npz"), "--float16"], ranks=2)
    rank0, rank1 = load(tmp_path / "rank0.npz"), load(tmp_path / "rank1.npz")
    for key in (k for k in rank0 if k.startswith("w")):
        np.testing.assert_array_equal(rank0[key], rank1[key], err_msg=key)
        assert np.all(np.isfinite(rank0[key]))
    # Step 2 overflowed on rank 1 only; the allreduced gradients are non-finite on both ranks,
    # so both skipped it (2 of 3 steps applied) and halved the loss scale.
    assert int(rank0["iterations"]) == int(rank1["iterations"]) == 2
    assert float(rank0["loss_scale"]) == float(rank1["loss_scale"]) == 2.0 ** 9


def test_cosmoflow_two_ranks_end_to_end(tiny_cosmo_data, tmp_path):
    run_dir = tmp_path / "run"
    result = run_python(["-m", "cosmoflow.train", "--config", str(REPO / "configs/cosmoflow/demo.yaml"),
                         *tiny_cosmo_overrides(tiny_cosmo_data, epochs=2), "--set", "model.batch_norm=true",
                         "--output-dir", str(run_dir)], ranks=2)
    assert "2 rank(s) [horovod]" in result.stdout
    epoch_lines = [l for l in result.stdout.splitlines() if "epoch 2/2:" in l]
    assert len(epoch_lines) == 1, "only rank 0 reports"
    assert "samples/s" in epoch_lines[0] and "TFLOP/s" in epoch_lines[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["ranks"] == 2 and summary["global_batch_size"] == 8 and summary["epochs_completed"] == 2
    assert summary["samples_per_second"] > 0 and summary["tflops_per_second"] > 0

    # Validation metrics are averaged over ranks: with 16 validation samples split 8/8, the logged
    # val_mae of the last epoch must equal the MAE over all 16 computed independently here.  With
    # batch norm this also needs the moving statistics averaged over ranks before validation.
    run_python(["-m", "cosmoflow.evaluate", "--run-dir", str(run_dir)])
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["n_samples"] == 16
    assert summary["final"]["val_mae"] == pytest.approx(metrics["mae_overall"], rel=1e-4)
    for name, value in metrics["mae"].items():   # the per-target metrics of the history, same check
        assert summary["final"][f"val_mae_{name}"] == pytest.approx(value, rel=1e-4), name
    model = keras.models.load_model(run_dir / "model.keras")
    assert model.output_shape == (None, 4)


def test_precise_batch_norm_over_two_real_ranks(tiny_cosmo_data, tmp_path):
    run_dir = tmp_path / "run"
    run_python(["-m", "cosmoflow.train", "--config", str(REPO / "configs/cosmoflow/demo.yaml"),
                *tiny_cosmo_overrides(tiny_cosmo_data, epochs=1), "--set", "model.batch_norm=true",
                "--set", "train.precise_bn_batches=3", "--output-dir", str(run_dir)], ranks=2)
    summary = json.loads((run_dir / "summary.json").read_text())
    precise = summary["precise_bn"]
    assert precise["batches_per_rank"] == 3 and precise["samples"] == 3 * 4 * 2
    assert precise["validation_moving_averages"]["val_mae"] == summary["final"]["val_mae"]
    # model.keras holds the re-estimated statistics, the same on both ranks (averaged over them): the
    # rank-averaged validation rerun after re-estimation equals the MAE over all 16 validation samples
    # that cosmoflow.evaluate computes from model.keras.
    run_python(["-m", "cosmoflow.evaluate", "--run-dir", str(run_dir)])
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert precise["validation_precise"]["val_mae"] == pytest.approx(metrics["mae_overall"], rel=1e-4)
    for name, value in metrics["mae"].items():
        assert precise["validation_precise"][f"val_mae_{name}"] == pytest.approx(value, rel=1e-4), name
    assert precise["validation_precise"]["val_mae"] != precise["validation_moving_averages"]["val_mae"]
