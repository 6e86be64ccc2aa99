"""The information bound for CosmoFlow: Fisher pieces against hand counts, the MAE of a Gaussian measurement
against quadrature, and the P(k) regression end to end on mock files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cosmoflow.config import MockSection
from common.errors import ConfigError
from cosmoflow.information import (PDF_EDGES, fiducial, learning_curve, linear_fisher, marginal_errors, mode_counts,
                                   one_point_features, parse_sizes, posterior_mean_mae, spectrum_features,
                                   spectrum_regression)
from tests.conftest import run_python


def test_mode_counts_cover_every_mode_once():
    grid, box = 12, 100.0
    _, counts = mode_counts(grid, box, k_max=1e9)
    assert counts.sum() == grid ** 3 - 1    # every mode of the full grid but k = 0
    # Up to k_max: the modes of the full fftn grid inside the sphere, counted directly.
    k1 = 2 * np.pi * np.fft.fftfreq(grid, d=box / grid)
    kx, ky, kz = np.meshgrid(k1, k1, k1, indexing="ij")
    k = np.sqrt(kx ** 2 + ky ** 2 + kz ** 2)
    _, inside = mode_counts(grid, box, k_max=0.2)
    assert inside.sum() == np.count_nonzero((k > 0) & (k <= 0.2))


def test_sigma_8_information_is_two_over_sigma_8_per_half_mode():
    # P is proportional to sigma_8^2, so dlnP/dsigma_8 = 2 / sigma_8 at every k (the central difference of a
    # square is exact); with the shot noise made negligible, F = N_modes / 2 * 4 / sigma_8^2.
    mock = MockSection(box_size_mpc_h=200.0, particles_per_voxel_side=64)
    fisher = linear_fisher(mock, 16)
    _, counts = mode_counts(16, 200.0)
    sigma_8 = fiducial(mock)[1]
    # The shot noise left, (200 / 1024)^3, lowers each term by (P / (P + noise))^2: at most 2 noise / P(k_Nyquist).
    from cosmoflow.mock import cosmology_for

    smallest = cosmology_for(fiducial(mock)).matterPowerSpectrum(np.pi * 16 / 200.0, z=0.0)
    assert fisher[1, 1] == pytest.approx(counts.sum() / 2 * 4 / sigma_8 ** 2, rel=2 * (200 / 1024) ** 3 / smallest)
    assert np.all(np.linalg.eigvalsh(fisher) > 0)
    # Holding a parameter fixed never loosens the others; a bigger box always tightens them.
    free, known = marginal_errors(fisher), marginal_errors(fisher, ("Omega_m",))
    assert "Omega_m" not in known and all(known[name] <= free[name] * (1 + 1e-9) for name in known)
    bigger = marginal_errors(linear_fisher(MockSection(box_size_mpc_h=400.0, particles_per_voxel_side=64), 32))
    assert all(bigger[name] < free[name] for name in free)


@pytest.mark.parametrize("sigma", [0.1, 0.5, 2.0])
def test_posterior_mean_mae_against_quadrature(sigma):
    # The same expectation by brute force: a grid over truth and observation, the posterior mean by summation.
    truth = np.linspace(-1, 1, 801)
    observed = np.linspace(-1 - 6 * sigma, 1 + 6 * sigma, 1601)
    likelihood = np.exp(-0.5 * ((observed[:, None] - truth[None, :]) / sigma) ** 2)
    posterior_mean = (likelihood * truth).sum(axis=1) / likelihood.sum(axis=1)
    joint = likelihood / likelihood.sum()
    reference = np.sum(joint * np.abs(posterior_mean[:, None] - truth[None, :]))
    # Monte Carlo with 2e5 samples: a few 1e-3 of spread.
    assert posterior_mean_mae(sigma) == pytest.approx(reference, abs=5e-3)
    assert posterior_mean_mae(1e-3) == pytest.approx(1e-3 * np.sqrt(2 / np.pi), rel=0.02)
    assert posterior_mean_mae(100.0) == pytest.approx(0.5, abs=5e-3)


def test_spectrum_features_read_the_power_of_each_channel():
    rng = np.random.default_rng(0)
    volume = rng.poisson(20.0, (16, 16, 16, 2)).astype(np.int16)
    volume[..., 1] = rng.poisson(80.0, (16, 16, 16))
    features = spectrum_features(volume, 160.0, n_bins=4).reshape(2, 4)
    # Poisson counts: white noise of power V_cell / mean count in every bin.
    np.testing.assert_allclose(np.exp(features), [[10.0 ** 3 / 20] * 4, [10.0 ** 3 / 80] * 4], rtol=0.35)


def test_one_point_features_against_scipy_and_poisson_counts():
    import scipy.stats

    rng = np.random.default_rng(1)
    grid, mean = 32, 4.0
    volume = rng.poisson(mean, (grid, grid, grid, 2)).astype(np.int16)
    volume[..., 1] = rng.poisson(0.5, (grid, grid, grid))
    features = one_point_features(volume).reshape(2, -1)
    bins = len(PDF_EDGES) - 1
    for channel in range(2):
        counts = volume[..., channel].astype(np.float64)
        ratio = counts / counts.mean()
        # The counts-in-cells fractions, bin by bin, counted directly.
        expected = [np.mean((ratio >= lo) & (ratio < hi)) for lo, hi in zip(PDF_EDGES[:-1], PDF_EDGES[1:])]
        np.testing.assert_allclose(features[channel, :bins], expected, atol=1e-12)
        assert features[channel, :bins].sum() == pytest.approx(1.0)
        for j, cell in enumerate((1, 2, 4)):
            # Cells of cell^3 voxels summed by slicing (not the reshape the code uses), then scipy's moments.
            summed = sum(counts[a::cell, b::cell, c::cell] for a in range(cell) for b in range(cell) for c in range(cell))
            skew, kurtosis = features[channel, bins + 2 * j: bins + 2 * j + 2]
            assert skew == pytest.approx(scipy.stats.skew(summed.ravel()), rel=1e-9)
            assert kurtosis == pytest.approx(scipy.stats.kurtosis(summed.ravel()), rel=1e-9)
    # Poisson counts of mean 4 in single voxels: skewness 1/sqrt(4), excess kurtosis 1/4; the sample
    # statistics of 32^3 voxels spread by about sqrt(6 / N) = 0.014 and sqrt(24 / N) = 0.027 (4 sigma allowed).
    assert features[0, bins] == pytest.approx(0.5, abs=4 * np.sqrt(6 / grid ** 3))
    assert features[0, bins + 1] == pytest.approx(0.25, abs=4 * np.sqrt(24 / grid ** 3))


def test_learning_curve_fits_the_first_n_then_random_draws():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((400, 6))
    y = np.tanh(x[:, :2] @ np.array([[0.5, -0.2], [0.3, 0.4]])) + 0.05 * rng.standard_normal((400, 2))
    train_x, train_y, valid_x, valid_y = x[:300], y[:300], x[300:], y[300:]
    curve = learning_curve(train_x, train_y, valid_x, valid_y, ["a", "b"], [10, 50, 300], repeats=3)
    assert list(curve) == ["10", "50", "300"]
    assert [curve[n]["a"]["draws"] for n in curve] == [3, 3, 1]
    # The whole set: one fit, the same as the regression on everything.
    whole = spectrum_regression(train_x, train_y, valid_x, valid_y, ["a", "b"])
    assert curve["300"]["a"]["ratio_mean"] == pytest.approx(whole["a"]["ratio"]) and curve["300"]["a"]["ratio_std"] == 0
    # One draw is the first n samples: with repeats=1 the size-50 point is exactly that fit.
    first = learning_curve(train_x, train_y, valid_x, valid_y, ["a", "b"], [50], repeats=1)["50"]
    assert first["b"]["mae_mean"] == pytest.approx(spectrum_regression(train_x[:50], train_y[:50], valid_x, valid_y,
                                                                       ["a", "b"])["b"]["mae"])
    # More data helps a regression with 6 features: 10 samples are few, 300 are plenty.
    assert curve["10"]["a"]["ratio_mean"] > curve["300"]["a"]["ratio_mean"]
    with pytest.raises(ConfigError, match="between 2 and the 300"):
        learning_curve(train_x, train_y, valid_x, valid_y, ["a", "b"], [301], repeats=2)


def test_train_sizes_are_parsed_or_refused_in_one_line():
    assert parse_sizes("256,512, 1024") == [256, 512, 1024]
    for bad in ("512,256", "a,b", "", "1,2", "256,256"):
        with pytest.raises(ConfigError, match="--train-sizes"):
            parse_sizes(bad)


def test_regression_on_mock_spectra_end_to_end(tmp_path):
    from cosmoflow.mock import generate_dataset

    data = generate_dataset(tmp_path / "data", 96, 32, 16, MockSection(box_size_mpc_h=128.0, seed=5), progress=False)
    out = tmp_path / "information.json"
    result = run_python(["-m", "cosmoflow.information", "--config", "configs/cosmoflow/demo.yaml",
                         "--set", f"data.data_dir={data}", "--set", "data.sample_shape=[16,16,16,4]",
                         "--set", "data.mock.box_size_mpc_h=128", "--bins", "4", "--json", str(out),
                         "--features", "power+pdf", "--train-sizes", "32,96", "--repeats", "2"])
    report = json.loads(out.read_text())
    assert report["regression_samples"] == {"train": 96, "validation": 32}
    assert report["data_dir"] == str(data.resolve())
    assert set(report["regression"]) == set(report["fisher"]) == {"Omega_m", "sigma_8", "n_s", "H0"}
    assert set(report["regression_power_pdf"]) == set(report["regression"])
    curve = report["learning_curve"]
    assert set(curve) == {"power", "power+pdf"} and list(curve["power"]) == ["32", "96"]
    assert curve["power"]["32"]["n_s"]["draws"] == 2 and curve["power"]["96"]["n_s"]["draws"] == 1
    assert curve["power"]["96"]["sigma_8"]["ratio_mean"] == pytest.approx(report["regression"]["sigma_8"]["ratio"])
    assert "learning curve (log P(k) and one-point statistics)" in result.stdout
    refused = run_python(["-m", "cosmoflow.information", "--config", "configs/cosmoflow/demo.yaml",
                          "--set", f"data.data_dir={data}", "--set", "data.sample_shape=[16,16,16,4]",
                          "--bins", "4", "--train-sizes", "64,128"], check=False)
    assert refused.returncode == 2 and "--train-sizes: 128 is not between 2 and the 96" in refused.stderr
    # sigma_8 sets the amplitude of every spectrum: even 96 volumes of 16^3 pin it down.
    assert report["regression"]["sigma_8"]["ratio"] < 0.5
    assert "ridge regression on log P(k)" in result.stdout and "linear Fisher bound" in result.stdout
    for row in report["regression"].values():
        assert row["ratio"] == pytest.approx(row["mae"] / row["baseline_mae"])
