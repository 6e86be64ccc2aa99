"""HEP CNN: models, both readers on files written here, scaling and weights,
metrics against scikit-learn, synthetic events, and a tiny train + evaluate."""

import json

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf

from common.config import load_config, validate
from common.distributed import Distributed
from common.errors import ConfigError, DataError
from common.nn.flops import forward_flops_per_sample
from conftest import REPO, run_python
from hep_cnn.config import HepConfig
from hep_cnn.application import APPLICATION
from hep_cnn.data import build_datasets, compute_maxima, evaluation_events, input_ceiling, split_chunks
from hep_cnn.metrics import auc, physics_metrics, selection_rates, tpr_at_fpr, weighted_roc
from hep_cnn.model import build_model

SIZE = 16


def test_published_network_sizes():
    big = build_model(load_config(HepConfig, REPO / "configs/hep_cnn/benchmark_224.yaml"))
    assert big.count_params() == 594_178
    assert round(forward_flops_per_sample(big) / 1e9, 2) == 5.26
    small = build_model(load_config(HepConfig, REPO / "configs/hep_cnn/rpv_64.yaml"))
    assert small.count_params() == 4_494_594   # 3 conv units, Dense 512, Dense 2


def make_events(n, seed):
    """Events with images (N, 3, eta, phi)."""
    rng = np.random.default_rng(seed)
    images = rng.exponential(1.0, (n, 3, SIZE, SIZE)).astype(np.float32) * [[[1.0]], [[0.5]], [[3.0]]]
    labels = rng.integers(0, 2, n)
    weights = rng.uniform(0.5, 4.0, n).astype(np.float32)
    pass_sr = rng.integers(0, 2, n)
    return images.astype(np.float32), labels, weights, pass_sr


def write_layout(path, layout, images, labels, weights, pass_sr):
    """Written with h5py directly in each published layout: all_events (N, eta, phi) per channel, the
    benchmark's data (N, 3, phi, eta) (histogram2d(phi, eta) in hep_cnn_benchmark)."""
    with h5py.File(path, "w") as f:
        if layout == "all_events":
            g = f.create_group("all_events")
            g["hist"], g["histEM"], g["histtrack"] = images[:, 0], images[:, 1], images[:, 2]
            g["y"], g["weight"], g["passSR"] = labels, weights, pass_sr
        else:
            f["data"], f["label"], f["weight"], f["psr"] = np.transpose(images, (0, 1, 3, 2)), labels, weights, pass_sr
            f["normweight"] = weights / weights.max()


def config(data_dir, **data):
    raw = {"data": {"data_dir": str(data_dir), "image_size": SIZE, "batch_size": 4, "chunk_size": 5,
                    "shuffle_buffer": 0, **data},
           "model": {"conv_units": 2, "filters": 4, "dense_units": 8, "dropout": 0.0}}
    return validate(HepConfig, raw, "test")


@pytest.fixture(params=["all_events", "benchmark"])
def layout_data(request, tmp_path):
    events = {split: make_events(n, seed) for split, n, seed in (("train", 24, 0), ("val", 12, 1), ("test", 12, 2))}
    for split, arrays in events.items():
        write_layout(tmp_path / f"{split}_0000.h5", request.param, *arrays)
    return request.param, tmp_path, events


def write_maxima(cfg):
    path = tmp = cfg.data.data_dir + "/" + cfg.data.maxima_file
    with open(tmp, "w") as handle:
        json.dump(compute_maxima(cfg), handle)
    return path


def test_readers_scale_by_training_maxima(layout_data):
    layout, directory, events = layout_data
    cfg = config(directory, weight_normalization="max")   # layout: auto, told by the files
    assert {c.layout for c in split_chunks(cfg, "train")} == {layout}
    maxima = compute_maxima(cfg)
    train_images, _, train_weights, _ = events["train"]
    np.testing.assert_allclose(maxima["channel_max"], train_images.max(axis=(0, 2, 3)), rtol=1e-6)
    assert maxima["weight_max"] == pytest.approx(float(train_weights.max()))
    write_maxima(cfg)

    # Test split in file order, raw weights: channels-last (eta, phi) images divided by the maxima, either layout.
    images, labels, weights, pass_sr = (np.concatenate(a) for a in zip(*[
        tuple(t.numpy() for t in batch) for batch in evaluation_events(cfg, "test")]))
    test_images, test_labels, test_weights, test_pass = events["test"]
    expected = np.transpose(test_images, (0, 2, 3, 1)) / np.array(maxima["channel_max"], np.float32)
    np.testing.assert_allclose(images, expected, rtol=1e-6)
    np.testing.assert_array_equal(labels, test_labels)
    np.testing.assert_allclose(weights, test_weights)
    np.testing.assert_array_equal(pass_sr, test_pass)

    # Training batches carry weights normalised by the maximum when the loss is weighted.
    cfg_weighted = config(directory, layout=layout, weight_normalization="max")
    cfg_weighted.loss.weighted = True
    datasets = build_datasets(cfg_weighted, Distributed())
    assert datasets.steps_per_epoch == 6 and datasets.validation_steps == 3
    x, y, w = next(iter(datasets.validation))
    np.testing.assert_allclose(w.numpy(), events["val"][2][:4] / maxima["weight_max"], rtol=1e-6)
    assert x.shape == (4, SIZE, SIZE, 3) and y.dtype == tf.int32


def test_input_ceiling_reads_scales_and_augments_like_the_pipeline(layout_data):
    """The one-core numpy loop ``bench --input-only`` measures the pipeline against: 30 events of the 24
    training events (chunks of 5, cycled), either layout, divided by the channel maxima (``value_sum``
    against numpy in float64), weights normalised, flipped and rolled."""
    layout, directory, events = layout_data
    cfg = config(directory, layout=layout, weight_normalization="log1p", augment=True)
    write_maxima(cfg)
    train = events["train"][0].astype(np.float64) / np.array(compute_maxima(cfg)["channel_max"])[:, None, None]
    ceiling = input_ceiling(cfg, 30)
    assert ceiling["samples"] == 30 and ceiling["samples_per_second"] == pytest.approx(30 / ceiling["seconds"])
    # One float32 division per value (half an ulp), all values >= 0: the sum within 1 ulp relative.
    assert ceiling["value_sum"] == pytest.approx(train.sum() + train[:6].sum(), rel=2.0 ** -23)
    assert ceiling["bytes_per_sample"] == 3 * SIZE * SIZE * 4
    assert APPLICATION.input_ceiling(cfg, 5)["samples"] == 5   # what bench --input-only calls


def test_a_shuffle_buffer_larger_than_the_epoch_shuffles_within_the_epoch(layout_data):
    """data.shuffle_buffer (2048 by default) above a rank's epoch: the epoch is still each training event
    once and ends there (before, the buffer also filled from the next pass and drew the epoch from both)."""
    layout, directory, events = layout_data
    cfg = config(directory, layout=layout, shuffle_buffer=1000, weight_normalization="none")
    cfg.loss.weighted = True
    write_maxima(cfg)
    datasets = build_datasets(cfg, Distributed())
    batches = list(datasets.train_epoch(0))
    assert len(batches) == datasets.steps_per_epoch == 6
    np.testing.assert_array_equal(np.sort(np.concatenate([w.numpy() for _, _, w in batches])),
                                  np.sort(events["train"][2]))


def test_one_channel_log1p_weights_and_sigmoid_targets(layout_data):
    layout, directory, events = layout_data
    cfg = config(directory, layout=layout, channels=1, weight_normalization="log1p")
    cfg.loss.weighted = True
    cfg.model.output = "sigmoid"
    write_maxima(cfg)
    x, y, w = next(iter(build_datasets(cfg, Distributed()).validation))
    assert x.shape == (4, SIZE, SIZE, 1) and y.shape == (4, 1) and y.dtype == tf.float32
    np.testing.assert_allclose(w.numpy(), np.log1p(events["val"][2][:4]), rtol=1e-6)


def test_fraction_split_covers_every_event_once(tmp_path):
    for i in range(2):
        write_layout(tmp_path / f"events_{i}.h5", "all_events", *make_events(20, i))
    cfg = config(tmp_path, split="fractions", fractions=(0.5, 0.25, 0.25))
    counts = {s: sum(c.stop - c.start for c in split_chunks(cfg, s)) for s in ("train", "validation", "test")}
    assert counts == {"train": 20, "validation": 10, "test": 10}
    spans = sorted((c.path, c.start, c.stop) for s in counts for c in split_chunks(cfg, s))
    assert sum(b - a for _, a, b in spans) == 40


def test_augmentation_keeps_the_event_energy():
    from hep_cnn.data import augment
    image = tf.random.uniform((SIZE, SIZE, 3))
    for seed in range(4):
        out = augment(image, tf.constant([seed, 1], tf.int64))
        np.testing.assert_allclose(tf.reduce_sum(out, axis=(0, 1)), tf.reduce_sum(image, axis=(0, 1)), rtol=1e-5)


@pytest.mark.parametrize("layout", ["all_events", "benchmark"])
def test_augmentation_rolls_phi_and_flips_eta_in_either_layout(tmp_path, layout):
    """Every augmented image is the event with eta maybe reversed and phi cyclically shifted, never the
    non-periodic eta rolled: checked against numpy on images read from each layout."""
    from hep_cnn.data import augment

    images, labels, weights, pass_sr = make_events(12, 5)
    for split in ("train", "val", "test"):
        write_layout(tmp_path / f"{split}_0000.h5", layout, images, labels, weights, pass_sr)
    cfg = config(tmp_path, scale_by_maxima=False)
    write_maxima(cfg)
    x = next(iter(evaluation_events(cfg, "test")))[0].numpy()[0]                # (eta, phi, 3)
    np.testing.assert_array_equal(x, np.transpose(images[0], (1, 2, 0)))
    seen = set()
    for seed in range(24):
        out = augment(tf.constant(x), tf.constant([seed, 3], tf.int64)).numpy()
        matches = [(flip, shift) for flip in (False, True) for shift in range(SIZE)
                   if np.array_equal(out, np.roll(x[::-1] if flip else x, shift, axis=1))]
        assert matches, "not an eta flip and phi roll of the event"
        seen.add(matches[0])
    assert {flip for flip, _ in seen} == {False, True} and len({shift for _, shift in seen}) > 4


@pytest.mark.parametrize("case, pattern", [
    ("missing_split", "no files with test in their name"),
    ("bad_layout", r"train_0.h5: neither HEP layout: expected group all_events/"),
    ("wrong_layout", r"train_0.h5: holds the benchmark layout, but data.layout is all_events"),
    ("bad_shape", r"has shape \(6, 8, 8\), expected \(6, 16, 16\)"),
    ("no_maxima", "training-set maxima not found"),
])
def test_bad_input(tmp_path, case, pattern):
    images, labels, weights, pass_sr = make_events(6, 0)
    if case == "bad_shape":
        images = images[:, :, :8, :8]
    if case == "bad_layout":
        with h5py.File(tmp_path / "train_0.h5", "w") as f:
            f["data"] = images
    else:
        write_layout(tmp_path / "train_0.h5", "benchmark" if case == "wrong_layout" else "all_events", images,
                     labels, weights, pass_sr)
    write_layout(tmp_path / "val_0.h5", "all_events", *make_events(6, 1))
    cfg = config(tmp_path, **({"layout": "all_events"} if case == "wrong_layout" else {}))
    with pytest.raises(DataError, match=pattern):
        if case == "missing_split":
            split_chunks(cfg, "test")
        else:
            build_datasets(cfg, Distributed())


# -- metrics against brute force -----------------------------------------------------------

def brute_force_auc(scores, labels, weights):
    """P(a signal event outscores a background one), ties counting half, each pair weighted by both events."""
    scores, weights = np.asarray(scores, np.float64), np.asarray(weights, np.float64)
    signal, background = labels == 1, labels == 0
    wins = (scores[signal][:, None] > scores[background][None, :]) + 0.5 * (
        scores[signal][:, None] == scores[background][None, :])
    pair_weights = weights[signal][:, None] * weights[background][None, :]
    return float(np.sum(wins * pair_weights) / np.sum(pair_weights))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weighted_roc_and_auc_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, 500)
    scores = np.round(rng.normal(labels * 0.8, 1.0), 2)   # rounding makes ties
    weights = rng.lognormal(0.0, 1.0, 500)
    fpr, tpr, thresholds = weighted_roc(scores, labels, weights)
    assert auc(fpr, tpr) == pytest.approx(brute_force_auc(scores, labels, weights), rel=1e-10)
    # Each ROC point: the weighted fractions of signal and background scoring at least its threshold.
    for f, t, threshold in zip(fpr[1:], tpr[1:], thresholds[1:]):
        above = scores >= threshold
        assert t == pytest.approx(np.sum(weights * above * labels) / np.sum(weights * labels), abs=1e-12)
        assert f == pytest.approx(np.sum(weights * above * (1 - labels)) / np.sum(weights * (1 - labels)), abs=1e-12)
    assert len(thresholds) == len(np.unique(scores)) + 1 and fpr[0] == tpr[0] == 0.0


def test_selection_rates_and_tpr_at_fpr():
    labels = np.array([1, 1, 1, 0, 0, 0, 0])
    weights = np.array([1.0, 2.0, 1.0, 1.0, 1.0, 2.0, 4.0])
    passed = np.array([1, 1, 0, 1, 0, 0, 0])
    assert selection_rates(passed, labels, weights) == pytest.approx((0.75, 0.125))
    fpr, tpr = np.array([0.0, 0.1, 0.3, 1.0]), np.array([0.0, 0.5, 0.9, 1.0])
    assert tpr_at_fpr(fpr, tpr, 0.2) == pytest.approx(0.7)
    scores = np.array([0.9, 0.8, 0.2, 0.7, 0.3, 0.1, 0.05])
    metrics = physics_metrics(scores, labels, weights, passed)
    assert metrics["accuracy"] == pytest.approx(5 / 7)
    assert metrics["auc"] == pytest.approx(brute_force_auc(scores, labels, weights))
    assert metrics["tpr_ratio_to_cuts"] == pytest.approx(metrics["tpr_at_cut_fpr"] / 0.75)


# -- synthetic events -------------------------------------------------------------------

def test_synthetic_events_are_physical(tmp_path):
    from hep_cnn.synth import generate_dataset

    out = generate_dataset(tmp_path / "synth", 60, 20, 20, image_size=SIZE * 2, events_per_file=40, seed=3,
                           progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["test_0000.h5", "train_0000.h5", "train_0001.h5", "val_0000.h5"]
    with h5py.File(out / "train_0000.h5") as f:
        g = f["all_events"]
        hist, em, tracks = g["hist"][:], g["histEM"][:], g["histtrack"][:]
        y, w, p = g["y"][:], g["weight"][:], g["passSR"][:]
    assert hist.shape == (40, 32, 32) and np.all(hist >= 0) and np.all(em <= hist + 1e-3)
    np.testing.assert_array_equal(tracks, np.round(tracks))
    assert 0 < y.mean() < 1 and np.all(w > 0)
    # Signal has more, harder jets: more energy and a higher pass rate of the cuts.
    assert hist[y == 1].sum(axis=(1, 2)).mean() > hist[y == 0].sum(axis=(1, 2)).mean() * 0.8
    assert p[y == 1].mean() >= p[y == 0].mean()


# -- end to end ---------------------------------------------------------------------------

def hep_overrides(data_dir, epochs=2):
    pairs = {"data.data_dir": data_dir, "data.image_size": 16, "data.batch_size": 16, "data.synth.n_train": 256,
             "data.synth.n_validation": 64, "data.synth.n_test": 128, "data.synth.events_per_file": 64,
             "model.conv_units": 2, "model.filters": 8, "model.dense_units": 16, "train.epochs": epochs,
             "train.tensorboard": "false", "loss.weighted": "true"}
    return [arg for k, v in pairs.items() for arg in ("--set", f"{k}={v}")]


def test_tiny_train_and_evaluate(tmp_path):
    run_dir = tmp_path / "run"
    run_python(["-m", "hep_cnn.train", *hep_overrides(tmp_path / "data"), "--output-dir", str(run_dir)])
    result = run_python(["-m", "hep_cnn.evaluate", "--run-dir", str(run_dir)])
    metrics = json.loads((run_dir / "metrics.json").read_text())
    for key in ("auc", "accuracy", "cut_tpr", "cut_fpr", "tpr_at_cut_fpr"):
        assert 0.0 <= metrics[key] <= 1.0, key
    predictions = np.load(run_dir / "predictions.npz")
    assert sorted(predictions.files) == ["labels", "pass_sr", "scores", "weights", "written_by"]   # the mark
    assert len(predictions["scores"]) == metrics["n_events"] == 128
    # The recorded metrics follow from the recorded predictions (the pairwise definition as the reference).
    assert metrics["auc"] == pytest.approx(brute_force_auc(predictions["scores"], predictions["labels"],
                                                           predictions["weights"]), rel=1e-9)
    assert (run_dir / "roc.png").stat().st_size > 1000 and "cut-based selection" in result.stdout
    assert keras.models.load_model(run_dir / "model.keras").output_shape == (None, 2)


@pytest.mark.horovod
def test_two_rank_training(tmp_path):
    run_dir = tmp_path / "run"
    result = run_python(["-m", "hep_cnn.train", *hep_overrides(tmp_path / "data"), "--output-dir", str(run_dir)],
                        ranks=2)
    assert "2 rank(s) [horovod]" in result.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["ranks"] == 2 and summary["global_batch_size"] == 32 and summary["epochs_completed"] == 2
    assert np.isfinite(summary["final"]["val_loss"])


def test_old_weight_normalisation_spelling_is_read_with_a_warning(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="hep_cnn.config"):
        cfg = config(tmp_path, weight_normalisation="log1p")
    assert cfg.data.weight_normalization == "log1p"
    assert "data.weight_normalisation is deprecated" in caplog.text
    with pytest.raises(ConfigError, match="give only data.weight_normalization"):
        config(tmp_path, weight_normalisation="log1p", weight_normalization="max")
