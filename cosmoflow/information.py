"""How well one volume can determine each parameter: the bound a CosmoFlow result is read against.

Two estimates, for a config's volumes:

- **Linear-theory Fisher bound** (:func:`linear_fisher`): the Gaussian initial
  field of the mock, P(k) from colossus at z = 0, every Fourier mode of the
  box up to ``k_max`` (default: the grid's Nyquist), shot noise of the
  particle lattice.  F_ij = sum_k N_k / 2 (dP/di)(dP/dj) / (P + noise)^2;
  the marginalised errors are sqrt(diag F^-1).  Errors are turned into the
  validation MAE of the best estimator in the normalised targets (uniform prior
  over the configured range, :func:`posterior_mean_mae`), comparable with a
  trained network's MAE and the training-mean baseline (0.5 for a uniform
  target).  ``--known Omega_m`` fixes a parameter (the four redshifts carry
  the growth factor, which depends on Omega_m alone in flat LCDM).  The
  Zel'dovich output at z = 0 is not Gaussian: its small scales carry more (the
  damping of P(k) by the displacement variance, an integral over the whole
  spectrum), so this is a guide for the initial field, not a ceiling on a
  network.
- **Regression on binned P(k)** (:func:`spectrum_regression`): log P(k) of
  every redshift channel of the stored volumes (mock or real, any layout the
  reader takes), ridge regression fitted on train/ and scored on
  validation/.  What a two-point statistic gets from exactly the data the
  network sees: a network that does worse has not learned what the data
  holds.  ``--features power+pdf`` adds one-point statistics (the
  counts-in-cells distribution and the skewness and kurtosis of the density
  at three cell sizes, :func:`one_point_features`): if the same regression
  does better with them, the volumes hold information beyond P(k).
- **Learning curves** (``--train-sizes 256,512,1024``): the regression on
  nested training sets, each size fitted on the first n files (the ones
  ``data.n_train=n`` gives the network) and on ``--repeats`` - 1 random draws
  more, scored on the whole validation split: mean and spread per size.

    python -m cosmoflow.information --config configs/cosmoflow/science.yaml [--json out.json]
    python -m cosmoflow.information --config configs/cosmoflow/science.yaml --bins 12 \
        --features power+pdf --train-sizes 256,512,1024,2048 --json curve.json
    python -m cosmoflow.information --config configs/cosmoflow/demo.yaml --fisher-only --known Omega_m
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

from common.cli import exit_on_user_error
from common.config import load_config
from common.errors import ConfigError
from common.storage.outputs import write_json
from cosmoflow.config import CosmoflowConfig, TARGET_NAMES
from cosmoflow.mock import cosmology_for, ensure_mock_data, measure_power_spectrum, parameter_ranges, wavenumbers

# Imported where used, not here: scipy and scikit-learn (seconds to import, only for the estimate) and
# cosmoflow.data (TensorFlow), so that --help answers without them.

FISHER_STEPS = {"Omega_m": 0.005, "sigma_8": 0.005, "n_s": 0.005, "H0": 0.5}


def fiducial(mock) -> np.ndarray:
    """The centre of the configured parameter ranges (Omega_m, sigma_8, n_s, H0)."""
    return np.array([(lo + hi) / 2 for lo, hi in parameter_ranges(mock)])


def mode_counts(grid: int, box_size: float, k_max: float | None = None, n_bins: int = 64):
    """(k centres, number of Fourier modes) of an grid^3 box up to ``k_max``, counting k and -k apart."""
    k, _ = wavenumbers(grid, box_size)
    weight = np.full(k.shape, 2.0)   # rfft keeps one of each +-k pair, except on its first and last planes
    weight[..., 0] = 1.0
    if grid % 2 == 0:
        weight[..., -1] = 1.0
    k_max = np.pi * grid / box_size if k_max is None else k_max
    keep = (k > 0) & (k <= k_max)
    k, weight = k[keep], weight[keep]
    edges = np.linspace(k.min() * (1 - 1e-9), k.max() * (1 + 1e-9), n_bins + 1)
    index = np.digitize(k, edges) - 1
    counts = np.bincount(index, weights=weight, minlength=n_bins)
    centres = np.bincount(index, weights=weight * k, minlength=n_bins) / np.maximum(counts, 1)
    used = counts > 0
    return centres[used], counts[used]


def linear_fisher(mock, grid: int, k_max: float | None = None, theta=None) -> np.ndarray:
    """4x4 Fisher matrix of (Omega_m, sigma_8, n_s, H0) from one grid^3 volume of the mock's initial field."""
    theta = fiducial(mock) if theta is None else np.asarray(theta, float)
    box = mock.box_size_mpc_h
    k, n_modes = mode_counts(grid, box, k_max)
    noise = (box / (grid * mock.particles_per_voxel_side)) ** 3   # Poisson: one particle per lattice site

    def spectrum(t):
        return cosmology_for(t).matterPowerSpectrum(k, z=0.0)

    power = spectrum(theta)
    derivatives = []
    for i, name in enumerate(TARGET_NAMES):
        step = np.zeros(4)
        step[i] = FISHER_STEPS[name]
        derivatives.append((spectrum(theta + step) - spectrum(theta - step)) / (2 * step[i]))
    derivatives = np.array(derivatives)
    return np.einsum("ik,jk,k->ij", derivatives, derivatives, n_modes / 2 / (power + noise) ** 2)


def marginal_errors(fisher: np.ndarray, known: tuple[str, ...] = ()) -> dict[str, float]:
    """sqrt(diag F^-1) over the parameters not ``known`` (those are held fixed)."""
    free = [i for i, name in enumerate(TARGET_NAMES) if name not in known]
    covariance = np.linalg.inv(fisher[np.ix_(free, free)])
    return {TARGET_NAMES[i]: float(np.sqrt(covariance[j, j])) for j, i in enumerate(free)}


def posterior_mean_mae(sigma: float, samples: int = 200_000, seed: int = 0) -> float:
    """MAE of the posterior mean of t ~ U[-1, 1] observed as t + N(0, sigma^2): the best validation MAE
    a Gaussian measurement of that error gives in the normalised targets (-> 0.5 as sigma grows)."""
    from scipy.stats import norm   # deferred: scipy (about 0.3 s) for this one function

    rng = np.random.default_rng(seed)
    truth = rng.uniform(-1.0, 1.0, samples)
    observed = truth + sigma * rng.standard_normal(samples)
    a, b = (-1.0 - observed) / sigma, (1.0 - observed) / sigma
    mass = np.maximum(norm.cdf(b) - norm.cdf(a), 1e-300)
    estimate = observed + sigma * (norm.pdf(a) - norm.pdf(b)) / mass   # mean of the truncated normal
    return float(np.mean(np.abs(estimate - truth)))


def fisher_report(cfg, k_max: float | None = None, known: tuple[str, ...] = ()) -> dict:
    """Per target: the Fisher error (physical and normalised) and the MAE it allows."""
    mock, grid = cfg.data.mock, cfg.data.sample_shape[0]
    errors = marginal_errors(linear_fisher(mock, grid, k_max), known)
    out = {}
    for name, (lo, hi) in zip(TARGET_NAMES, parameter_ranges(mock)):
        if name in errors:
            normalised = 2.0 * errors[name] / (hi - lo)
            out[name] = {"sigma": errors[name], "sigma_normalised": normalised,
                         "best_mae": posterior_mean_mae(normalised)}
    return out


# -- the regression on measured spectra ------------------------------------------------------------

def spectrum_features(volume: np.ndarray, box_size: float, n_bins: int = 8) -> np.ndarray:
    """log P(k) of each channel's overdensity (counts / mean - 1) in ``n_bins`` linear k bins."""
    features = []
    for channel in range(volume.shape[-1]):
        counts = np.asarray(volume[..., channel], np.float64)
        _, power, _ = measure_power_spectrum(counts / max(counts.mean(), 1e-12) - 1.0, box_size, n_bins)
        features.append(np.log(np.maximum(power, 1e-30)))
    return np.concatenate(features)


# Counts-in-cells bins, in units of the mean count per cell: empty cells, then voids to clusters.
PDF_EDGES = (0.0, 1e-9, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, np.inf)
MOMENT_CELLS = (1, 2, 4)   # cell sizes, in voxels per side, for the skewness and kurtosis


def one_point_features(volume: np.ndarray) -> np.ndarray:
    """Per channel: the fraction of voxels in each :data:`PDF_EDGES` bin of counts / mean, and the skewness
    and excess kurtosis of the overdensity in cells of 1, 2 and 4 voxels per side (sums of counts): what a
    Gaussian field's two-point function does not fix."""
    edges = np.asarray(PDF_EDGES)
    features = []
    for channel in range(volume.shape[-1]):
        counts = np.asarray(volume[..., channel], np.float64)
        mean = max(counts.mean(), 1e-12)
        # Bins [low, high), as np.histogram's but 5x faster on a 64^3 volume.
        which = np.searchsorted(edges, (counts / mean).ravel(), side="right") - 1
        features.extend(np.bincount(which, minlength=len(edges) - 1)[:len(edges) - 1] / counts.size)
        n = counts.shape[0]
        for cell in MOMENT_CELLS:
            m = n // cell
            summed = counts[:m * cell, :m * cell, :m * cell]
            if cell > 1:
                summed = summed.reshape(m, cell, m, cell, m, cell).sum(axis=(1, 3, 5))
            delta = summed / max(summed.mean(), 1e-12) - 1.0
            square = delta * delta   # products, not powers: ** 3 and ** 4 take 10x longer
            variance = max(square.mean(), 1e-30)
            features.append(np.mean(square * delta) / variance ** 1.5)
            features.append(np.mean(square * square) / variance ** 2 - 3.0)
    return np.array(features)


FEATURE_SETS = ("power", "power+pdf")


def split_features(cfg, split: str, n_bins: int, one_point: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(power-spectrum features, targets, one-point features or None) of every sample of a split, in file
    order (read raw, not through the pipeline)."""
    # deferred: TensorFlow, loaded only after the arguments are parsed (--help answers without it)
    from cosmoflow.data import raw_samples

    features, targets, extra = [], [], []
    for volume, y in raw_samples(cfg, split):
        features.append(spectrum_features(volume, cfg.data.mock.box_size_mpc_h, n_bins))
        targets.append(y)
        if one_point:
            extra.append(one_point_features(volume))
    return np.array(features), np.array(targets), (np.array(extra) if one_point else None)


def spectrum_regression(train_x, train_y, valid_x, valid_y, names) -> dict:
    """Ridge regression (penalty by cross-validation) of the targets on the features: validation MAE
    per target and the training-mean baseline."""
    from sklearn.linear_model import RidgeCV   # deferred: scikit-learn (about 1 s) for the regression alone
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    model = make_pipeline(StandardScaler(), RidgeCV(alphas=np.logspace(-3, 4, 15))).fit(train_x, train_y)
    error = np.abs(model.predict(valid_x) - valid_y).mean(axis=0)
    baseline = np.abs(valid_y - train_y.mean(axis=0)).mean(axis=0)
    return {name: {"mae": float(e), "baseline_mae": float(b), "ratio": float(e / b)}
            for name, e, b in zip(names, error, baseline)}


def learning_curve(train_x, train_y, valid_x, valid_y, names, sizes, repeats: int, seed: int = 0) -> dict:
    """:func:`spectrum_regression` on training sets of each size: the first n samples (what
    ``data.n_train=n`` gives the network), then ``repeats`` - 1 random draws of n without replacement (one
    fit when n is the whole set), all scored on the whole validation set.  Per size and target: mean and
    standard deviation over the draws of the MAE and of its ratio to the training-mean baseline."""
    rng = np.random.default_rng(seed)
    curve = {}
    for n in sizes:
        if not 2 <= n <= len(train_y):
            raise ConfigError(f"--train-sizes: {n} is not between 2 and the {len(train_y)} training samples present")
        draws = [np.arange(n)] + ([] if n == len(train_y) else
                                  [rng.choice(len(train_y), n, replace=False) for _ in range(repeats - 1)])
        fits = [spectrum_regression(train_x[d], train_y[d], valid_x, valid_y, names) for d in draws]
        curve[str(n)] = {name: {"mae_mean": float(np.mean([f[name]["mae"] for f in fits])),
                                "mae_std": float(np.std([f[name]["mae"] for f in fits])),
                                "ratio_mean": float(np.mean([f[name]["ratio"] for f in fits])),
                                "ratio_std": float(np.std([f[name]["ratio"] for f in fits])),
                                "draws": len(fits)} for name in names}
    return curve


def parse_sizes(text: str) -> list[int]:
    """``--train-sizes 256,512``: positive integers, increasing."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"--train-sizes: expected comma-separated sample counts such as 256,512,1024, got {text!r}") from None
    if not sizes or sizes != sorted(set(sizes)) or sizes[0] < 2:
        raise ConfigError(f"--train-sizes: expected increasing sample counts of at least 2, got {text!r}")
    return sizes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cosmoflow.information", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--k-max", type=float, help="Fisher: largest wavenumber used, h/Mpc (default: Nyquist)")
    parser.add_argument("--known", action="append", default=[], choices=TARGET_NAMES,
                        help="Fisher: hold this parameter fixed (repeatable)")
    parser.add_argument("--bins", type=int, default=8, help="regression: k bins per redshift channel")
    parser.add_argument("--features", choices=FEATURE_SETS, default="power",
                        help="regression: log P(k) alone, or with one-point statistics (both are reported)")
    parser.add_argument("--train-sizes", help="regression: learning curve on these training-set sizes, e.g. 256,512,1024")
    parser.add_argument("--repeats", type=int, default=3, help="learning curve: fits per size (the first n, then random draws)")
    parser.add_argument("--fisher-only", action="store_true", help="skip the regression (needs no data)")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args(argv)

    with exit_on_user_error():
        cfg = load_config(CosmoflowConfig, args.config, args.set)
        mock, grid = cfg.data.mock, cfg.data.sample_shape[0]
        report = {"grid": grid, "box_size_mpc_h": mock.box_size_mpc_h, "k_max": args.k_max,
                  "data_dir": str(pathlib.Path(cfg.data.data_dir).resolve()), "bins": args.bins,
                  "fisher": fisher_report(cfg, args.k_max, tuple(args.known)), "known": args.known}
        print(f"linear Fisher bound, one {grid}^3 volume of {mock.box_size_mpc_h:g} Mpc/h"
              + (f", held fixed: {', '.join(args.known)}" if args.known else "") + ":")
        for name, row in report["fisher"].items():
            print(f"  {name:<8} sigma {row['sigma']:.4g} ({row['sigma_normalised']:.3f} normalised): "
                  f"best MAE {row['best_mae']:.3f} (training mean: 0.5)")
        if not args.fisher_only:
            if cfg.data.mock.generate_if_missing:
                ensure_mock_data(cfg)
            sizes = parse_sizes(args.train_sizes) if args.train_sizes else []
            if args.repeats < 1:
                raise ConfigError(f"--repeats: expected at least 1, got {args.repeats}")
            one_point = args.features == "power+pdf"
            train_x, train_y, train_extra = split_features(cfg, "train", args.bins, one_point)
            valid_x, valid_y, valid_extra = split_features(cfg, "validation", args.bins, one_point)
            names = cfg.data.target_names
            feature_sets = {"power": (train_x, valid_x)}
            if one_point:
                feature_sets["power+pdf"] = (np.hstack([train_x, train_extra]), np.hstack([valid_x, valid_extra]))
            report["regression_samples"] = {"train": len(train_y), "validation": len(valid_y)}
            for features, (fit_x, score_x) in feature_sets.items():
                key = "regression" if features == "power" else "regression_power_pdf"
                report[key] = spectrum_regression(fit_x, train_y, score_x, valid_y, names)
                label = "log P(k)" if features == "power" else "log P(k) and one-point statistics"
                print(f"ridge regression on {label} ({args.bins} k bins x {cfg.data.sample_shape[3]} redshifts), "
                      f"{len(train_y)} train / {len(valid_y)} validation volumes of {cfg.data.data_dir}:")
                for name, row in report[key].items():
                    print(f"  {name:<8} MAE {row['mae']:.3f} vs {row['baseline_mae']:.3f} for the training mean "
                          f"({row['ratio']:.2f}x)")
                if sizes:
                    curve = learning_curve(fit_x, train_y, score_x, valid_y, names, sizes, args.repeats)
                    report.setdefault("learning_curve", {})[features] = curve
                    print(f"  learning curve ({label}), MAE / training-mean MAE, mean +- std over draws:")
                    for n, rows in curve.items():
                        print(f"    {int(n):>6} volumes: " + ", ".join(
                            f"{name} {row['ratio_mean']:.3f} +- {row['ratio_std']:.3f}" for name, row in rows.items()))
        if args.json:
            write_json(args.json, report, "cosmoflow.information")
    return 0


if __name__ == "__main__":
    sys.exit(main())
