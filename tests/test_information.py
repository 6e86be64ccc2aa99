"""The information bound for CosmoFlow: Fisher pieces against hand counts, the MAE of a Gaussian measurement
against quadrature, and the P(k) regression end to end on mock files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cosmoflow.config import MockSection
from cosmoflow.information import (fiducial, linear_fisher, marginal_errors, mode_counts, posterior_mean_mae,
                                   spectrum_features)
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


def test_regression_on_mock_spectra_end_to_end(tmp_path):
    from cosmoflow.mock import generate_dataset

    data = generate_dataset(tmp_path / "data", 96, 32, 16, MockSection(box_size_mpc_h=128.0, seed=5), progress=False)
    out = tmp_path / "information.json"
    result = run_python(["-m", "cosmoflow.information", "--config", "configs/cosmoflow/demo.yaml",
                         "--set", f"data.data_dir={data}", "--set", "data.sample_shape=[16,16,16,4]",
                         "--set", "data.mock.box_size_mpc_h=128", "--bins", "4", "--json", str(out)])
    report = json.loads(out.read_text())
    assert report["regression_samples"] == {"train": 96, "validation": 32}
    assert set(report["regression"]) == set(report["fisher"]) == {"Omega_m", "sigma_8", "n_s", "H0"}
    # sigma_8 sets the amplitude of every spectrum: even 96 volumes of 16^3 pin it down.
    assert report["regression"]["sigma_8"]["ratio"] < 0.5
    assert "ridge regression on log P(k)" in result.stdout and "linear Fisher bound" in result.stdout
    for row in report["regression"].values():
        assert row["ratio"] == pytest.approx(row["mae"] / row["baseline_mae"])
