"""CosmoFlow's network with the summary statistics in its dense head (issue 49, ``model.summaries``).

The summaries the network computes from its input are the baseline's (:mod:`cosmoflow.summaries`, numpy in
float64) to float32 round-off, with the tolerance bounded here from the FFT's error (Higham, Accuracy and
Stability of Numerical Algorithms, 24.1) and from summation; their standardisation is the mean and deviation
of the training volumes' summaries read here with tf.train.Example and numpy; a run with them trains, saves a
network that evaluate and predict load, and the switch's refusals are one line naming the key."""

import json
import math
import pathlib
from itertools import combinations

import keras
import numpy as np
import pytest
import tensorflow as tf

from common.config import validate
from common.distributed import Distributed
from common.errors import ConfigError
from conftest import REPO, UNIT_ROUNDOFF, run_python, tiny_cosmo_overrides
from cosmoflow import summaries
from cosmoflow.config import CosmoflowConfig
from cosmoflow.data import normalise
from cosmoflow.model import VolumeSummaries, build_model, check_summaries, prepare_network

DEMO = REPO / "configs/cosmoflow/demo.yaml"
U = UNIT_ROUNDOFF["float32"]
BOX, BINS, GRID = 128.0, 5, 16


def clustered_counts(seed: int, n: int = GRID, channels: int = 4, mean: float = 8.0) -> np.ndarray:
    """Particle counts with structure: Poisson draws of a log-normal intensity of one Gaussian field (P ~ k^-2,
    the channels its growing powers, as the redshifts of one mock share their phases).  A mean of 8 counts makes
    counts / mean land exactly on the one-point bin edges (2 / 8 = 0.25, ...): ties that must fall alike."""
    rng = np.random.default_rng(seed)
    k = np.sqrt(sum(np.meshgrid(*[np.fft.fftfreq(n) ** 2] * 2, np.fft.rfftfreq(n) ** 2, indexing="ij")))
    modes = np.fft.rfftn(rng.standard_normal((n, n, n))) / np.maximum(k, 1.0 / n)
    gaussian = np.fft.irfftn(modes, s=(n, n, n))
    gaussian /= gaussian.std()
    volume = [rng.poisson(mean * np.exp(a * gaussian - a * a / 2)) for a in np.linspace(0.3, 0.9, channels)]
    return np.stack(volume, axis=-1).astype(np.float32)


def layer_summaries(volumes, parts=summaries.SUMMARY_PARTS) -> np.ndarray:
    layer = VolumeSummaries(parts, BINS, BOX)
    return np.asarray(layer(tf.constant(volumes)), np.float64)   # mean 0, scale 1: the summaries themselves


def fft_error(field: np.ndarray) -> float:
    """A bound on ||computed rfftn - exact rfftn||_2 of ``field`` formed in float32 (each value within one
    rounding, 2u, of its exact value) and transformed in float32: Cooley-Tukey's normwise bound
    log2(N) eta ||F|| with eta = 4 sqrt(2) u + u for a radix-2 FFT with accurate twiddle factors (Higham 24.1),
    plus the input's rounding carried through the transform (sqrt(N) times its norm)."""
    n = field.size
    norm = math.sqrt(n) * float(np.linalg.norm(field))   # Parseval: ||F||_2 of numpy's unnormalised FFT
    eta = 4 * math.sqrt(2) * U + U
    return norm * (math.log2(n) * eta / (1 - math.log2(n) * eta) + 2 * U)


def binned_sums(product: np.ndarray):
    inside, bins, weights, _ = summaries.k_binning(GRID, BOX, BINS)
    return np.bincount(bins, weights=weights * product.ravel()[inside], minlength=BINS)


def power_bound(modes: np.ndarray, error: float) -> np.ndarray:
    """Per k bin, a bound on |log P_float32 - log P_exact|: the bin's weighted sum S = sum w |F|^2 changes by at
    most 2 (2 sqrt(S) e + e^2) for an error e of the modes (Cauchy-Schwarz; w <= 2), and its segment sum in
    float32 by gamma_M S."""
    s = binned_sums(np.abs(modes) ** 2)
    relative = 2 * (2 * np.sqrt(s) * error + error ** 2) / s + GRID ** 3 * U
    return relative / (1 - relative) + 4 * U


def test_the_networks_summaries_are_the_baselines_to_float32_round_off():
    volumes = np.stack([clustered_counts(seed) for seed in range(3)])
    got = layer_summaries(volumes)
    length = summaries.summary_length(4, BINS)
    assert got.shape == (3, length)
    for volume, row in zip(volumes, got):
        want = summaries.summary_parts(volume.astype(np.float64), BOX, BINS)
        offsets = np.cumsum([0] + [len(part) for part in want.values()])
        part = {name: row[a:b] for name, a, b in zip(want, offsets[:-1], offsets[1:])}
        counts = [volume[..., c].astype(np.float64) for c in range(4)]
        deltas = [c / c.mean() - 1.0 for c in counts]
        modes = [np.fft.rfftn(d) for d in deltas]
        errors = [fft_error(d) for d in deltas]
        # power: one bound per channel and bin
        bound = np.concatenate([power_bound(m, e) for m, e in zip(modes, errors)])
        assert np.all(np.abs(part["power"] - want["power"]) <= bound), (part["power"] - want["power"], bound)
        # log_power: the same bound for log(1 + counts / mean) less its mean
        fields = [np.log1p(c / c.mean()) for c in counts]
        fields = [f - f.mean() for f in fields]
        bound = np.concatenate([power_bound(np.fft.rfftn(f), fft_error(f) + 4 * U * np.linalg.norm(f)
                                            * math.sqrt(f.size)) for f in fields])
        assert np.all(np.abs(part["log_power"] - want["log_power"]) <= bound)
        # cross: r_ij moves by the cross sum's error over sqrt(S_i S_j) plus r times half the autos' relative ones;
        # the growth ratio by the two totals' relative errors
        autos = [binned_sums(np.abs(m) ** 2) for m in modes]
        cursor = 0
        for i, j in combinations(range(4), 2):
            r_got, growth_got = part["cross"][cursor:cursor + BINS], part["cross"][cursor + BINS]
            r_want, growth_want = want["cross"][cursor:cursor + BINS], want["cross"][cursor + BINS]
            cursor += BINS + 1
            cross_error = 2 * (np.sqrt(autos[i]) * errors[j] + np.sqrt(autos[j]) * errors[i] + errors[i] * errors[j])
            relative = [2 * (2 * np.sqrt(a) * e + e * e) / a + GRID ** 3 * U for a, e in
                        ((autos[i], errors[i]), (autos[j], errors[j]))]
            bound = cross_error / np.sqrt(autos[i] * autos[j]) + np.abs(r_want) * (relative[0] + relative[1]) / 2
            assert np.all(np.abs(r_got - r_want) <= bound + 4 * U)
            totals = [float(np.sum(a)) for a in (autos[i], autos[j])]
            growth_bound = sum(2 * (2 * math.sqrt(t) * e + e * e) / t for t, e in zip(totals, (errors[i], errors[j])))
            assert abs(growth_got - growth_want) <= growth_bound + GRID ** 3 * U * 2
        # one_point: the fractions exact (the mean of integer counts is exact in float32, and so is counts / 8);
        # the moments within their sums' rounding, gamma_N of the sums of |terms|
        for c, channel in enumerate(counts):
            got_c, want_c = part["one_point"][17 * c:17 * c + 17], want["one_point"][17 * c:17 * c + 17]
            np.testing.assert_array_equal(got_c[:11], want_c[:11])
            for m, cell in enumerate(summaries.MOMENT_CELLS):
                size = GRID // cell
                summed = channel.reshape(size, cell, size, cell, size, cell).sum(axis=(1, 3, 5))
                d = summed / summed.mean() - 1.0
                variance = np.mean(d * d)
                gamma_n = summed.size * U / (1 - summed.size * U) + 8 * U
                skew, kurt = want_c[11 + 2 * m], want_c[12 + 2 * m]
                skew_bound = gamma_n * (np.mean(np.abs(d) ** 3) / variance ** 1.5 + 1.5 * abs(skew) * 2)
                kurt_bound = gamma_n * (np.mean(d ** 4) / variance ** 2 + 2 * (kurt + 3) * 2)
                assert abs(got_c[11 + 2 * m] - skew) <= skew_bound, (cell, got_c[11 + 2 * m], skew, skew_bound)
                assert abs(got_c[12 + 2 * m] - kurt) <= kurt_bound, (cell, got_c[12 + 2 * m], kurt, kurt_bound)


def test_each_part_alone_is_its_slice_of_the_whole_and_symmetries_leave_them_unchanged():
    volumes = clustered_counts(5)[np.newaxis]
    whole = layer_summaries(volumes)[0]
    offsets = np.cumsum([0] + [summaries.summary_length(4, BINS, (p,)) for p in summaries.SUMMARY_PARTS])
    for part, a, b in zip(summaries.SUMMARY_PARTS, offsets[:-1], offsets[1:]):
        np.testing.assert_array_equal(layer_summaries(volumes, (part,))[0], whole[a:b])
    # a reflection and an axis permutation of the cube, and a periodic shift by a multiple of the largest cell
    moved = np.roll(np.flip(volumes, axis=2).transpose(0, 3, 1, 2, 4), (4, 8, 12), axis=(1, 2, 3))
    np.testing.assert_allclose(layer_summaries(moved)[0], whole, rtol=1e-4, atol=1e-4)


def tiny_config(data_dir="unused", **model) -> CosmoflowConfig:
    raw = {"data": {"data_dir": str(data_dir), "sample_shape": [16, 16, 16, 4], "batch_size": 2,
                    "mock": {"box_size_mpc_h": BOX}},
           "model": {"conv_blocks": 2, "base_filters": 4, "dense_units": [8], "dropout": 0.0, "pooling": "average",
                     **model},
           "train": {"precision": "fp32"}}
    return validate(CosmoflowConfig, raw, "test")


def test_the_switch_off_is_the_network_of_the_papers_and_on_adds_the_summaries_to_the_head():
    keras.utils.set_random_seed(1)
    plain = build_model(tiny_config())
    keras.utils.set_random_seed(1)
    again = build_model(tiny_config(summaries=[]))
    assert [w.tolist() for w in plain.get_weights()] == [w.tolist() for w in again.get_weights()]
    assert "summaries" not in [layer.name for layer in plain.layers]
    with_summaries = build_model(tiny_config(summaries=["power", "cross"], summary_bins=BINS))
    assert with_summaries.input.dtype == "float32"
    conv_features = plain.get_layer("global_average").output.shape[-1]
    measured = summaries.summary_length(4, BINS, ("power", "cross"))
    assert with_summaries.get_layer("dense1").kernel.shape == (conv_features + measured, 8)
    # the counts go in; the first convolution sees the values the input pipeline hands the plain network
    # (TensorFlow's log1p, within an ulp of numpy's)
    counts = clustered_counts(2)[np.newaxis]
    first = keras.Model(with_summaries.input, with_summaries.get_layer("normalise").output)
    np.testing.assert_array_equal(np.asarray(first(counts)), np.asarray(normalise(tf.constant(counts), True)))
    np.testing.assert_allclose(np.asarray(first(counts)), np.log1p(counts), rtol=2 * U)
    by_mean = tiny_config(summaries=["power"], summary_bins=BINS)
    by_mean.data.apply_log = False
    network = build_model(by_mean)
    first = keras.Model(network.input, network.get_layer("normalise").output)
    np.testing.assert_array_equal(np.asarray(first(counts)), np.asarray(normalise(tf.constant(counts), False)))
    np.testing.assert_allclose(np.asarray(first(counts)), counts / counts.mean(), rtol=4 * U)


def test_the_switch_refuses_what_it_cannot_compute():
    with pytest.raises(ConfigError, match=r"model.summaries.*a part is named twice"):
        tiny_config(summaries=["power", "power"])
    with pytest.raises(ConfigError, match=r"model.summaries"):
        tiny_config(summaries=["bispectrum"])
    cfg = tiny_config(summaries=["power"], summary_bins=40)
    with pytest.raises(ConfigError, match=r"model.summary_bins=40: .* use at most \d+$") as refused:
        check_summaries(cfg)
    most = int(str(refused.value).rsplit(" ", 1)[-1])   # the advice is the largest that works
    check_summaries(tiny_config(summaries=["power"], summary_bins=most))
    with pytest.raises(ConfigError, match=rf"model.summary_bins={most + 1}: .* use at most {most}$"):
        check_summaries(tiny_config(summaries=["power"], summary_bins=most + 1))
    cfg = tiny_config(summaries=["power"])
    cfg.data.sample_shape = (16, 16, 8, 4)
    with pytest.raises(ConfigError, match=r"model.summaries: the summaries are of a cubic box"):
        check_summaries(cfg)


def stored_volumes(folder: pathlib.Path, shape) -> np.ndarray:
    """Every volume of ``folder``'s TFRecords in file order, read with tf.train.Example (not the suite's reader)."""
    volumes = []
    for path in sorted(folder.glob("*.tfrecord")):
        for record in tf.data.TFRecordDataset([str(path)]):
            feature = tf.train.Example.FromString(record.numpy()).features.feature
            volumes.append(np.frombuffer(feature["x"].bytes_list.value[0], "<i2").reshape(shape))
    return np.stack(volumes)


def test_the_standardisation_is_the_training_volumes_mean_and_deviation(tiny_cosmo_data):
    cfg = tiny_config(tiny_cosmo_data, summaries=["power", "one_point"], summary_bins=BINS)
    network = build_model(cfg)
    prepare_network(network, cfg, Distributed())
    rows = np.array([summaries.summary_vector(v.astype(np.float64), BOX, BINS, ("power", "one_point"))
                     for v in stored_volumes(tiny_cosmo_data / "train", (16, 16, 16, 4))])
    layer = network.get_layer("summaries")
    std = rows.std(axis=0)
    np.testing.assert_allclose(layer.mean.numpy(), rows.mean(axis=0), rtol=U, atol=U)
    varies = std > 1e-6 * np.maximum(np.abs(rows.mean(axis=0)), 1.0)
    assert not varies.all()   # the empty-voxel fraction of a 16^3 mock at 8 counts a voxel is 0 in every volume
    np.testing.assert_allclose(layer.scale.numpy(), np.where(varies, std, 1.0), rtol=2 * U)


def test_empty_training_volumes_are_warned_of_not_trained_on_silently(tiny_cosmo_data, tmp_path, caplog):
    """Volumes whose counts are all zero (a broken conversion) give every summary one value: a warning says so."""
    empty = tmp_path / "empty"
    for split in ("train", "validation"):
        (empty / split).mkdir(parents=True)
        for path in sorted((tiny_cosmo_data / split).glob("*.tfrecord")):
            with tf.io.TFRecordWriter(str(empty / split / path.name)) as writer:
                for record in tf.data.TFRecordDataset([str(path)]):
                    example = tf.train.Example.FromString(record.numpy())
                    x = example.features.feature["x"].bytes_list
                    x.value[0] = bytes(len(x.value[0]))
                    writer.write(example.SerializeToString())
    assert not stored_volumes(empty / "train", (16, 16, 16, 4)).any()
    for residual in (False, True):
        cfg = tiny_config(empty, summaries=["power", "one_point"], summary_bins=BINS, summary_residual=residual)
        caplog.clear()
        prepare_network(build_model(cfg), cfg, Distributed())
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warned) == 1 and "numbers is the same in all" in warned[0] and str(empty / "train") in warned[0]
    # the real mocks: some numbers are constant (no empty voxels), not all: no warning
    cfg = tiny_config(tiny_cosmo_data, summaries=["power", "one_point"], summary_bins=BINS)
    caplog.clear()
    prepare_network(build_model(cfg), cfg, Distributed())
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def stored_targets(folder: pathlib.Path) -> np.ndarray:
    """Every record's y of ``folder``'s TFRecords in file order, read with tf.train.Example (the mocks store the
    four parameters in the MLPerf order, the config's default target_names, without offset or scale)."""
    return np.array([tf.train.Example.FromString(record.numpy()).features.feature["y"].float_list.value
                     for path in sorted(folder.glob("*.tfrecord")) for record in tf.data.TFRecordDataset([str(path)])],
                    np.float64)


def closed_form_ridge(x: np.ndarray, y: np.ndarray, penalty: float):
    """Ridge on standardised features in closed form (numpy, not scikit-learn): centre, spread (1 where a
    feature does not vary), weights on the standardised features and intercept."""
    centre, spread = x.mean(axis=0), x.std(axis=0)
    spread = np.where(spread > 0, spread, 1.0)
    a = (x - centre) / spread
    normal = a.T @ a + penalty * np.eye(a.shape[1])
    weights = np.linalg.solve(normal, a.T @ (y - y.mean(axis=0)))
    return centre, spread, weights, y.mean(axis=0), np.linalg.cond(normal)


def baseline_ridge(rows: np.ndarray, targets: np.ndarray):
    """The baseline's ridge by hand: per target the penalty of :data:`cosmoflow.information.PENALTIES` whose fit on
    the first 80 % of the rows has the smallest MAE on the rest, refitted on all rows in closed form.  Centre,
    spread, weights (features x targets), intercepts and each target's tolerance on its weights: the two float64
    solves (scikit-learn solves the same system its own way) within a few cond x eps of the weights' size."""
    from cosmoflow.information import PENALTIES

    fit = len(rows) - round(0.2 * len(rows))
    held_out = []
    for penalty in PENALTIES:
        centre, spread, weights, intercept, _ = closed_form_ridge(rows[:fit], targets[:fit], penalty)
        held_out.append(np.abs((rows[fit:] - centre) / spread @ weights + intercept - targets[fit:]).mean(axis=0))
    chosen = PENALTIES[np.argmin(np.array(held_out), axis=0)]
    columns, tolerances = [], []
    for j, penalty in enumerate(chosen):
        centre, spread, weights, intercept, condition = closed_form_ridge(rows, targets, penalty)
        columns.append(weights[:, j])
        tolerances.append(16 * condition * np.finfo(np.float64).eps * np.abs(weights[:, j]).max())
    return centre, spread, np.stack(columns, axis=1), intercept, np.array(tolerances)


def assert_ridge_path(network: keras.Model, rows: np.ndarray, targets: np.ndarray) -> None:
    """The network's standardisation and fixed path are float32 copies (one rounding each) of the baseline's fit."""
    centre, spread, weights, intercept, tolerance = baseline_ridge(rows, targets)
    layer, path = network.get_layer("summaries"), network.get_layer("summary_ridge")
    np.testing.assert_allclose(layer.mean.numpy(), centre, rtol=2 * U, atol=1e-12)
    np.testing.assert_allclose(layer.scale.numpy(), spread, rtol=2 * U)
    for j in range(weights.shape[1]):
        np.testing.assert_allclose(path.kernel.numpy()[:, j], weights[:, j], rtol=U, atol=tolerance[j])
    np.testing.assert_allclose(path.bias.numpy(), intercept, rtol=2 * U)


def test_the_residual_network_starts_as_the_ridge_baseline_fitted_on_every_training_volume(tiny_cosmo_data):
    parts = ("power", "one_point")
    cfg = tiny_config(tiny_cosmo_data, summaries=list(parts), summary_bins=BINS, summary_residual=True)
    network = build_model(cfg)
    ridge_path = network.get_layer("summary_ridge")
    assert not ridge_path.trainable and all(w is not ridge_path.kernel for w in network.trainable_weights)
    assert not network.get_layer("targets").kernel.numpy().any()   # the head's last layer starts at zero
    prepare_network(network, cfg, Distributed())
    volumes = stored_volumes(tiny_cosmo_data / "train", (16, 16, 16, 4)).astype(np.float64)
    rows = np.array([summaries.summary_vector(v, BOX, BINS, parts) for v in volumes])
    assert len(rows) == 32
    assert_ridge_path(network, rows, stored_targets(tiny_cosmo_data / "train"))
    # At the start the network's outputs are the ridge's on its own float32 summaries: a float32 dot product of
    # the standardised summaries with the float32 kernel, within gamma_n of sum |w z| (Higham 3.5).
    standardised = keras.Model(network.input, network.get_layer("summaries").output)(volumes[:4].astype(np.float32))
    z = np.asarray(standardised, np.float64)
    kernel, bias = ridge_path.kernel.numpy().astype(np.float64), ridge_path.bias.numpy().astype(np.float64)
    expected = z @ kernel + bias
    n = z.shape[1] + 1
    bound = n * U / (1 - n * U) * (np.abs(z) @ np.abs(kernel) + np.abs(bias))
    got = np.asarray(network(volumes[:4].astype(np.float32)), np.float64)
    assert np.all(np.abs(got - expected) <= bound), np.abs(got - expected) / bound


def test_the_residual_network_fits_on_the_volumes_training_uses_and_refuses_too_few(tiny_cosmo_data):
    parts = ("power",)
    cfg = tiny_config(tiny_cosmo_data, summaries=list(parts), summary_bins=BINS, summary_residual=True)
    cfg.data.n_train = 12   # of the 32 in train/: the ridge and its standardisation see these 12 only
    network = build_model(cfg)
    prepare_network(network, cfg, Distributed())
    volumes = stored_volumes(tiny_cosmo_data / "train", (16, 16, 16, 4))[:12].astype(np.float64)
    rows = np.array([summaries.summary_vector(v, BOX, BINS, parts) for v in volumes])
    assert_ridge_path(network, rows, stored_targets(tiny_cosmo_data / "train")[:12])
    # the plain standardisation too: the first of the volumes training uses
    plain = tiny_config(tiny_cosmo_data, summaries=list(parts), summary_bins=BINS)
    plain.data.n_train = 12
    network = build_model(plain)
    prepare_network(network, plain, Distributed())
    np.testing.assert_allclose(network.get_layer("summaries").mean.numpy(), rows.mean(axis=0), rtol=U, atol=U)
    cfg.data.n_train = 9
    with pytest.raises(ConfigError, match=r"^model.summary_residual: .* at least 10 training volumes .* uses 9 "
                                          r"\(data.n_train, "):
        prepare_network(build_model(cfg), cfg, Distributed())


def test_the_residual_switch_needs_the_summaries():
    with pytest.raises(ConfigError, match=r"model.summary_residual needs model.summaries") as refused:
        tiny_config(summary_residual=True)
    assert "got {" not in str(refused.value)   # the key's own words, not a dump of the model section
    keras.utils.set_random_seed(1)
    plain = build_model(tiny_config(summaries=["power"], summary_bins=BINS))
    keras.utils.set_random_seed(1)
    residual = build_model(tiny_config(summaries=["power"], summary_bins=BINS, summary_residual=True))
    # the residual network is the summaries network with a zero last layer plus the fixed ridge path
    names = {layer.name for layer in plain.layers}
    assert {layer.name for layer in residual.layers} == names | {"summary_ridge", "ridge_plus_residual"}
    assert [w.shape for w in residual.trainable_weights] == [w.shape for w in plain.trainable_weights]
    assert not residual.get_layer("targets").kernel.numpy().any() and plain.get_layer("targets").kernel.numpy().any()


@pytest.fixture(scope="module")
def summaries_run(tiny_cosmo_data, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("summaries") / "run"
    result = run_python(["-m", "cosmoflow.train", "--config", str(DEMO), *tiny_cosmo_overrides(tiny_cosmo_data, epochs=2),
                "--set", "model.pooling=average", "--set", "model.summaries=[power, log_power, cross, one_point]",
                "--set", f"model.summary_bins={BINS}", "--set", f"data.mock.box_size_mpc_h={BOX}",
                "--set", "model.summary_residual=true", "--output-dir", str(run_dir)], ranks=2)
    assert "the network starts as the ridge baseline on the summaries of 32 training volumes" in (
        result.stdout + result.stderr)
    return run_dir


@pytest.mark.horovod
def test_a_run_with_summaries_and_the_residual_trains_saves_and_is_evaluated_and_predicted(summaries_run, tiny_cosmo_data, tmp_path):
    run_dir = summaries_run
    rows = (run_dir / "history.csv").read_text().splitlines()
    assert len(rows) == 3
    evaluated = run_python(["-m", "cosmoflow.evaluate", "--run-dir", str(run_dir), "--symmetries", "8"])
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert all(math.isfinite(v) for v in metrics["mae"].values()) and "averaged over 8" in evaluated.stdout
    # the saved network: its standardisation is rank 0's, from the training volumes
    network = keras.models.load_model(run_dir / "model.keras", compile=False)
    layer = network.get_layer("summaries")
    volumes = stored_volumes(tiny_cosmo_data / "train", (16, 16, 16, 4)).astype(np.float64)
    rows = np.array([summaries.summary_vector(v, BOX, BINS) for v in volumes])
    np.testing.assert_allclose(layer.mean.numpy(), rows.mean(axis=0), rtol=U, atol=U)
    # model.summary_residual: the two ranks' shares of the summaries, gathered in file order, gave rank 0 the
    # baseline's ridge, and training left that path as it was
    assert_ridge_path(network, rows, stored_targets(tiny_cosmo_data / "train"))
    # predict reads a file of the validation split with the network that takes counts
    validation = sorted((tiny_cosmo_data / "validation").glob("*.tfrecord"))[0]
    run_python(["-m", "cosmoflow.predict", "--run-dir", str(run_dir), "--input", str(validation), "--out",
                str(tmp_path / "predicted")])
    assert any((tmp_path / "predicted").iterdir())
    # a resume takes the path and the standardisation from its checkpoint: nothing is fitted again
    resumed = run_python(["-m", "cosmoflow.train", "--config", str(DEMO), *tiny_cosmo_overrides(tiny_cosmo_data, epochs=3),
                          "--set", "model.pooling=average", "--set", "model.summaries=[power, log_power, cross, one_point]",
                          "--set", f"model.summary_bins={BINS}", "--set", f"data.mock.box_size_mpc_h={BOX}",
                          "--set", "model.summary_residual=true", "--output-dir", str(run_dir), "--resume"])
    assert "training volumes" not in resumed.stdout + resumed.stderr
    assert len((run_dir / "history.csv").read_text().splitlines()) == 4
    assert_ridge_path(keras.models.load_model(run_dir / "model.keras", compile=False), rows,
                      stored_targets(tiny_cosmo_data / "train"))
