"""The information bound for CosmoFlow: Fisher pieces against hand counts, the MAE of a Gaussian measurement
against quadrature, and the P(k) regression end to end on mock files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cosmoflow.config import MockSection
from common.errors import ConfigError
from cosmoflow.information import (PENALTIES, build_parser, fiducial, fisher_from_summaries, learning_curve,
                                   linear_fisher, marginal_errors, mode_counts, one_point_features, parse_features,
                                   parse_sizes, posterior_mean_mae, spectrum_features, spectrum_regression,
                                   summary_fisher, box_posterior_mae)
from cosmoflow.summaries import PDF_EDGES
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



def test_box_posterior_mae_against_quadrature_and_the_one_parameter_formula():
    # Independent parameters: the box posterior factorises, each MAE is the one-parameter one.  Correlated ones
    # (n_s-like: tight but degenerate with a poorly measured parameter): a grid over truth and observation,
    # the posterior mean by summation.  The sampler's error: 10,000 truths give a standard error of about
    # 0.6 x MAE / 100 = 0.6 %, and 200 weighted draws a truth add under 0.5 % of bias: 3 % is 4 such errors.
    sigmas = np.array([0.05, 0.5, 3.0])
    np.testing.assert_allclose(box_posterior_mae(np.diag(sigmas ** 2)),
                               [posterior_mean_mae(sigma) for sigma in sigmas], rtol=0.03)
    s, rho = np.array([0.2, 0.8]), -0.9
    covariance = np.array([[s[0] ** 2, rho * s[0] * s[1]], [rho * s[0] * s[1], s[1] ** 2]])
    axis = np.linspace(-1, 1, 61)
    truth = np.stack(np.meshgrid(axis, axis, indexing="ij"), -1).reshape(-1, 2)
    observed = np.stack(np.meshgrid(np.linspace(-2, 2, 101), np.linspace(-5, 5, 141), indexing="ij"),
                        -1).reshape(-1, 2)
    precision, total, mass = np.linalg.inv(covariance), np.zeros(2), 0.0
    for chunk in np.array_split(observed, 20):
        offset = chunk[:, None, :] - truth[None, :, :]
        likelihood = np.exp(-0.5 * np.einsum("oti,ij,otj->ot", offset, precision, offset))
        mean = likelihood @ truth / likelihood.sum(axis=1)[:, None]
        total += np.einsum("ot,oti->i", likelihood, np.abs(mean[:, None, :] - truth[None, :, :]))
        mass += likelihood.sum()
    reference = total / mass
    np.testing.assert_allclose(box_posterior_mae(covariance), reference, rtol=0.03)
    # the second parameter's range tightens the first well below its range alone (0.143)
    assert reference[0] < 0.8 * posterior_mean_mae(s[0])
    # A narrow parameter given first, tied (rho 0.999) to one far wider than the box: against the posterior
    # mean by rejection (draws from N(observed, C) kept inside the box), 2,000 truths: 1.3 % standard
    # error each, 5 % is 3 of them combined (drawing the narrow one first biased it by 13 %).
    s, rho = np.array([0.01, 3.0]), 0.999
    covariance = np.array([[s[0] ** 2, rho * s[0] * s[1]], [rho * s[0] * s[1], s[1] ** 2]])
    rng = np.random.default_rng(5)
    root = np.linalg.cholesky(covariance)
    truth = rng.uniform(-1, 1, (2000, 2))
    observed = truth + rng.standard_normal((2000, 2)) @ root.T
    errors = []
    for t, x in zip(truth, observed):
        kept = np.zeros((0, 2))
        while len(kept) < 200:   # near a corner of the box most draws fall outside it
            draws = x + rng.standard_normal((20000, 2)) @ root.T
            kept = np.concatenate([kept, draws[np.all(np.abs(draws) <= 1, axis=1)]])
        errors.append(np.abs(kept.mean(axis=0) - t))
    np.testing.assert_allclose(box_posterior_mae(covariance), np.mean(errors, axis=0), rtol=0.05)

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


@pytest.mark.parametrize("option", ["--k-max", "--bins", "--repeats", "--fisher-mocks", "--train-sizes"])
@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_every_number_is_refused_by_argparse_naming_its_option(option, value, capsys):
    """0, a negative, nan or inf: argparse's one-line error naming the option, exit 2, before the config is read."""
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(["--config", "configs/cosmoflow/demo.yaml", option, value])
    assert refused.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"python -m cosmoflow.information: error: argument {option}: "), error


def test_numbers_in_their_domain_are_taken():
    args = build_parser().parse_args(["--config", "c.yaml", "--k-max", "0.5", "--bins", "1", "--repeats", "1",
                                      "--fisher-mocks", "2", "--train-sizes", "2,16"])
    assert (args.k_max, args.bins, args.repeats, args.fisher_mocks, args.train_sizes) == (0.5, 1, 1, 2, [2, 16])


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


def standardised_ridge_mae(fit_x, fit_y, score_x, score_y, penalty):
    """MAE per target of a ridge fitted in closed form on standardised features (numpy, not scikit-learn)."""
    centre, spread = fit_x.mean(axis=0), fit_x.std(axis=0)
    a = (fit_x - centre) / spread
    weights = np.linalg.solve(a.T @ a + penalty * np.eye(a.shape[1]), a.T @ (fit_y - fit_y.mean(axis=0)))
    prediction = (score_x - centre) / spread @ weights + fit_y.mean(axis=0)
    return np.abs(prediction - score_y).mean(axis=0)


def test_ridge_penalty_is_chosen_on_held_out_training_rows_only():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((200, 8))
    train_y = x[:100] @ rng.standard_normal((8, 2)) + 0.3 * rng.standard_normal((100, 2))
    train_x, valid_x = x[:100], x[100:]
    valid_y = rng.standard_normal((100, 2))   # unrelated to x: the validation-optimal penalty is the largest
    # The train-only choice, by hand: fit on the first 80 rows, score on the last 20, per target.
    held = np.array([standardised_ridge_mae(train_x[:80], train_y[:80], train_x[80:], train_y[80:], alpha)
                     for alpha in PENALTIES])
    train_choice = PENALTIES[np.argmin(held, axis=0)]
    leaked = np.array([standardised_ridge_mae(train_x, train_y, valid_x, valid_y, alpha) for alpha in PENALTIES])
    assert np.all(PENALTIES[np.argmin(leaked, axis=0)] != train_choice)   # so a leak would show
    rows = spectrum_regression(train_x, train_y, valid_x, valid_y, ["a", "b"])
    np.testing.assert_allclose([rows["a"]["penalty"], rows["b"]["penalty"]], train_choice)
    # Refitted on all 100 training rows at that penalty, scored on validation (closed form to round-off).
    expected = [standardised_ridge_mae(train_x, train_y, valid_x, valid_y, alpha)[j]
                for j, alpha in enumerate(train_choice)]
    np.testing.assert_allclose([rows["a"]["mae"], rows["b"]["mae"]], expected, rtol=1e-9)


def test_features_are_parts_joined_by_plus():
    assert parse_features("power") == ("power",)
    assert parse_features("power+pdf") == ("power", "one_point")
    assert parse_features("one_point+cross+power") == ("power", "cross", "one_point")
    assert parse_features("all") == ("power", "log_power", "cross", "one_point")
    for bad in ("", "power+power", "bispectrum", "power+"):
        with pytest.raises(ConfigError, match="--features"):
            parse_features(bad)


def test_fisher_from_summaries_of_a_toy_with_known_derivative_and_covariance():
    # Summaries s(theta) = A theta + B theta^2 (elementwise) + noise of covariance Sigma, the noise shared by the
    # +- mocks of one seed (as the phases are): the central difference is exact for a quadratic, so
    # D = A + 2 B theta0, and F = D Sigma^-1 D^T up to the covariance's sampling (Hartlap removes its bias).
    rng = np.random.default_rng(11)
    p, n = 6, 4000
    a, b = rng.standard_normal((4, p)), rng.standard_normal((4, p))
    theta0, steps = np.array([0.3, 0.8, 0.96, 70.0]), np.array([0.01, 0.02, 0.006, 1.0])
    mixing = rng.standard_normal((p, p)) * 0.3 + np.eye(p)
    sigma = mixing @ mixing.T
    noise = rng.standard_normal((n, p)) @ mixing.T

    def summaries(theta):
        return theta @ a + theta ** 2 @ b + noise

    plus = np.array([summaries(theta0 + steps[i] * np.eye(4)[i]) for i in range(4)])
    minus = np.array([summaries(theta0 - steps[i] * np.eye(4)[i]) for i in range(4)])
    fiducial_summaries = np.hstack([summaries(theta0), np.full((n, 1), 3.0)])   # plus a constant summary
    plus, minus = (np.concatenate([m, np.full((4, n, 1), 3.0)], axis=2) for m in (plus, minus))
    result = fisher_from_summaries(fiducial_summaries, plus, minus, steps)
    derivative = a + 2 * b * theta0[:, None]
    # theta^2 at theta = 70 is 4900: round-off of the difference of two such numbers, over 2 * step.
    np.testing.assert_allclose(result["derivatives"], derivative, rtol=0, atol=1e-9 * 4900 / steps.min())
    assert result["summaries_used"] == p and result["summaries_dropped"] == 1
    assert result["hartlap"] == pytest.approx((n - p - 2) / (n - 1))
    expected = derivative @ np.linalg.solve(sigma, derivative.T)
    # The inverse of a covariance from n = 4000 draws: each element within a few sqrt(2 / n) = 2 %.
    np.testing.assert_allclose(result["fisher"], expected, rtol=0.1, atol=0.1 * np.abs(expected).max() * 0.1)
    with pytest.raises(ConfigError, match="--fisher-mocks 7"):
        fisher_from_summaries(fiducial_summaries[:7], plus[:, :7], minus[:, :7], steps)


def test_summary_fisher_of_tiny_mocks_is_positive_definite(tmp_path):
    from common.config import load_config
    from cosmoflow.config import CosmoflowConfig

    cfg = load_config(CosmoflowConfig, "configs/cosmoflow/demo.yaml",
                      ["data.sample_shape=[16,16,16,4]", "data.mock.box_size_mpc_h=128", f"data.data_dir={tmp_path}"])
    result = summary_fisher(cfg, n_mocks=20, n_bins=3, parts=("power",), workers=1)
    assert result["summaries_used"] == 12 and result["hartlap"] == pytest.approx(6 / 19)
    assert np.all(np.linalg.eigvalsh(result["fisher"]) > 0)
    # The same seeds at +- a step: d log P / d sigma_8 is 2 / sigma_8 for a linear field; on the largest scales
    # of z = 1.5, 0.5 and 0 (channels 1-3) the counts are near that (shot noise and the Zel'dovich damping pull
    # it down by up to 10 % here).  Not at z = 3: displacements there are below the 2 Mpc/h from a lattice site
    # to a voxel face, so counts change by threshold crossings and the derivative is about twice that.
    sigma_8 = fiducial(cfg.data.mock)[1]
    by_channel = result["derivatives"][1].reshape(4, 3)
    np.testing.assert_allclose(by_channel[1:, 0], 2 / sigma_8, rtol=0.15)
    # Too few mocks for the summaries' covariance: one line, exit 2, before any mock is drawn.
    refused = run_python(["-m", "cosmoflow.information", "--config", "configs/cosmoflow/demo.yaml",
                          "--set", "data.sample_shape=[16,16,16,4]", "--set", f"data.data_dir={tmp_path}",
                          "--summary-fisher", "--features", "all", "--bins", "4", "--fisher-mocks", "40"], check=False)
    assert refused.returncode == 2 and "--fisher-mocks 40: the covariance of 130 summaries" in refused.stderr
    assert not any(tmp_path.iterdir())


def test_bad_json_and_fisher_mocks_are_refused_before_any_work(tmp_path):
    """--json, --fisher-mocks and --k-max are checked before the bounds are computed: one line, exit 2, nothing printed
    before it, a user's file as it was."""
    users = tmp_path / "user.json"
    users.write_text('{"mine": 1}\n')
    (tmp_path / "folder").mkdir()
    cases = [(["--fisher-only", "--json", str(users)], f"{users}: exists and was not written by this suite"),
             (["--fisher-only", "--json", str(tmp_path / "folder")], "--json names a folder"),
             (["--fisher-only", "--json", str(users / "x.json")], f"{users}: the folder of --json x.json cannot be "
                                                                    "created"),
             (["--summary-fisher", "--fisher-mocks", "1"], "--fisher-mocks: expected at least 2, got 1"),
             (["--fisher-only", "--k-max", "0.02"], "--k-max: 0.02 h/Mpc is below the box's fundamental mode")]
    for extra, expected in cases:
        result = run_python(["-m", "cosmoflow.information", "--config", "configs/cosmoflow/demo.yaml", *extra],
                            check=False)
        assert result.returncode == 2 and expected in result.stderr, (extra, result.stderr[-2000:])
        assert "linear Fisher bound" not in result.stdout, extra   # refused before the work
        assert [line for line in result.stderr.splitlines() if line.startswith("error:")] \
            == result.stderr.strip().splitlines()[-1:], result.stderr
    assert users.read_text() == '{"mine": 1}\n' and sorted(p.name for p in tmp_path.iterdir()) == ["folder", "user.json"]


def test_a_stored_summary_fisher_matrix_gives_its_bounds_again_and_a_foreign_one_is_refused(tmp_path):
    """--fisher-matrix: the bounds of an earlier --summary-fisher JSON from its matrix, no mocks; a file of other
    options or a broken matrix: one line naming the file and key, exit 2, nothing written."""
    base = ["-m", "cosmoflow.information", "--config", "configs/cosmoflow/demo.yaml", "--set",
            "data.sample_shape=[16,16,16,4]", "--set", "data.mock.box_size_mpc_h=128", "--set",
            f"data.data_dir={tmp_path / 'data'}", "--summary-fisher", "--features", "power", "--bins", "3",
            "--fisher-mocks", "20"]
    first, again = tmp_path / "first.json", tmp_path / "again.json"
    run_python([*base, "--json", str(first)])
    result = run_python([*base, "--fisher-matrix", str(first), "--json", str(again)])
    before, after = json.loads(first.read_text()), json.loads(again.read_text())
    assert f"the matrix of {first}" in result.stdout and after["summary_fisher"]["matrix_from"] == str(first)
    assert after["summary_fisher"]["matrix"] == before["summary_fisher"]["matrix"]
    for name, row in before["summary_fisher"]["parameters"].items():
        assert after["summary_fisher"]["parameters"][name] == pytest.approx(row)
    assert not (tmp_path / "data").exists()   # no mocks, no data
    assert after["summary_fisher"]["volumes"]["seed"] == 2026   # demo.yaml's; the mocks' settings, compared when read again
    edits = {"broken.json": lambda r: r["summary_fisher"]["matrix"][0].__setitem__(0, -1.0),
             "singular.json": lambda r: r["summary_fisher"].__setitem__("matrix", [[1.0, 1.0, 0, 0], [1.0, 1.0, 0, 0],
                                                                                   [0, 0, 1.0, 0], [0, 0, 0, 1.0]]),
             "strings.json": lambda r: r["summary_fisher"]["matrix"][1].__setitem__(1, "3.5"),
             "row.json": lambda r: r["summary_fisher"]["parameters"].__setitem__("n_s", 5),
             "old.json": lambda r: r["summary_fisher"].pop("volumes"),
             "huge.json": lambda r: r["summary_fisher"].__setitem__("hartlap", 10 ** 400),
             "tiny.json": lambda r: r["summary_fisher"].__setitem__(
                 "matrix", [[value * 1e-200 for value in row] for row in r["summary_fisher"]["matrix"]])}
    for name, edit in edits.items():
        record = json.loads(first.read_text())
        edit(record)
        (tmp_path / name).write_text(json.dumps(record))
    for extra, said in (([], "--fisher-matrix: expected with --summary-fisher"),
                        (["--bins", "4"], f"--fisher-matrix {first}: bins is 3, this command's 4"),
                        (["--fisher-mocks", "24"], "summary_fisher.mocks_per_point is 20, this command's 24"),
                        (["--set", "data.mock.seed=7"], "summary_fisher.volumes.seed is 2026, this config's 7"),
                        (["--set", "data.mock.omega_m_range=[0.25,0.35]"], "summary_fisher.volumes.ranges is"),
                        (["--known", "H0"], "known is [], this command's ['H0']"),
                        (["--json", str(first)], f"{first}: --json is also an input of this command"),
                        (["--fisher-matrix", ""], "--fisher-matrix: expected a file name, got ''"),
                        (["--fisher-matrix", str(tmp_path / "broken.json")],
                         "summary_fisher.matrix is not finite, or a parameter with no information"),
                        (["--fisher-matrix", str(tmp_path / "singular.json")],
                         "summary_fisher.matrix is singular to working precision"),
                        (["--fisher-matrix", str(tmp_path / "strings.json")], "is not a 4 x 4 matrix of finite numbers"),
                        (["--fisher-matrix", str(tmp_path / "row.json")],
                         "summary_fisher.parameters.n_s.sigma_half_seeds is None"),
                        (["--fisher-matrix", str(tmp_path / "old.json"), "--set", "data.mock.omega_m_range=[0.25,0.35]"],
                         "summary_fisher.steps is"),
                        (["--fisher-matrix", str(tmp_path / "huge.json")], "summary_fisher.hartlap is 1000"),
                        (["--fisher-matrix", str(tmp_path / "missing.json")], "missing.json: not found")):
        args = [a for a in base if a != "--summary-fisher"] if not extra else base
        refused = run_python([*args, "--fisher-matrix", str(first), *extra, "--json", str(tmp_path / "out.json")]
                             if "--json" not in extra else [*args, "--fisher-matrix", str(first), *extra], check=False)
        assert refused.returncode == 2 and said in refused.stderr and "Traceback" not in refused.stderr, \
            (extra, refused.stderr[-1500:])
        assert "linear Fisher bound" not in refused.stdout and not (tmp_path / "out.json").exists()
    # a matrix 1e-200 times smaller: no parameter measured over its range, the prior's MAE; every parameter
    # held fixed: no bound to give; neither a traceback
    run_python([*base, "--fisher-matrix", str(tmp_path / "tiny.json"), "--json", str(tmp_path / "tiny-out.json")])
    rows = json.loads((tmp_path / "tiny-out.json").read_text())["summary_fisher"]["parameters"]
    assert [row["best_mae"] for row in rows.values()] == [0.5] * 4
    every = [item for name in ("Omega_m", "sigma_8", "n_s", "H0") for item in ("--known", name)]
    assert "held fixed: Omega_m, sigma_8, n_s, H0" in run_python([*base, "--fisher-only", *every]).stdout
