"""How well one volume can determine each parameter: the bound a CosmoFlow result is read against.

Three estimates, for a config's volumes:

- **Linear-theory Fisher bound** (:func:`linear_fisher`): the Gaussian initial
  field of the mock, P(k) from colossus at z = 0, every Fourier mode of the
  box up to ``k_max`` (default: the grid's Nyquist), shot noise of the
  particle lattice.  F_ij = sum_k N_k / 2 (dP/di)(dP/dj) / (P + noise)^2;
  the marginalised errors are sqrt(diag F^-1).  Errors are turned into the
  validation MAE of the best estimator in the normalised targets (the posterior
  mean under the uniform prior of every free parameter's configured range at
  once, the likelihood Gaussian with covariance F^-1: :func:`box_posterior_mae`;
  each range alone, the others unbounded: :func:`posterior_mean_mae`, JSON
  ``best_mae_alone``), comparable with a
  trained network's MAE and the training-mean baseline (0.5 for a uniform
  target).  ``--known Omega_m`` fixes a parameter (the four redshifts carry
  the growth factor, which depends on Omega_m alone in flat LCDM).  The
  Zel'dovich output at z = 0 is not Gaussian: its small scales carry more (the
  damping of P(k) by the displacement variance, an integral over the whole
  spectrum), so this is a guide for the initial field, not a ceiling on a
  network.
- **Regression on the summaries** (:func:`spectrum_regression`): the parts of
  :mod:`cosmoflow.summaries` (``--features`` joined by '+': power, log_power,
  cross, one_point, 'pdf' for one_point, or 'all') of every stored volume
  (mock or real, any layout the reader takes), one ridge regression on all
  chosen parts together, reported beside ``power`` and each part alone.  The
  penalty, per target, is chosen on train/ alone (:func:`held_out_penalty`:
  fitted on the first 80 % of the training files, scored on the last 20 %),
  then refitted on all of train/; validation/ only scores.  What hand-made
  statistics get from exactly the data the network sees: a network that does
  worse has not learned what the data holds.
- **Summary Fisher bound** (``--summary-fisher``, :func:`summary_fisher`): the
  Fisher matrix of the same summary vector on the config's mocks, F = D^T C^-1
  D: D the central difference of the mean summaries at the fiducial +- 5 % of
  each range (``--fisher-mocks`` seeds, the +- mocks of a seed sharing their
  phases), C the covariance over the fiducial mocks, one per seed (Hartlap
  factor on C^-1).  The bound for the baseline's own summaries, marginal
  errors and best MAE as the linear bound's.
- **Learning curves** (``--train-sizes 256,512,1024``): the regression on
  nested training sets, each size fitted on the first n files (the ones
  ``data.n_train=n`` gives the network) and on ``--repeats`` - 1 random draws
  more, scored on the whole validation split: mean and spread per size.

    python -m cosmoflow.information --config configs/cosmoflow/science.yaml [--json out.json]
    python -m cosmoflow.information --config configs/cosmoflow/science.yaml --bins 12 \
        --features power+pdf --train-sizes 256,512,1024,2048 --json curve.json
    python -m cosmoflow.information --config configs/cosmoflow/science.yaml --bins 12 --features all
    python -m cosmoflow.information --config configs/cosmoflow/science.yaml --bins 4 --features all \
        --summary-fisher --fisher-mocks 512
    python -m cosmoflow.information --config configs/cosmoflow/science.yaml --bins 4 --features all \
        --summary-fisher --fisher-mocks 512 --fisher-matrix earlier.json --json again.json   # its bounds, no mocks
    python -m cosmoflow.information --config configs/cosmoflow/demo.yaml --fisher-only --known Omega_m
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import pathlib
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from common.cli import exit_process, positive_int_argument, positive_number_argument, run_command
from common.config import load_config
from common.errors import ConfigError
from common.storage.transaction import OutputTransaction, Producer
from cosmoflow.config import CosmoflowConfig, TARGET_NAMES
from cosmoflow.mock import available_cpus, cosmology_for, ensure_mock_data, make_universe, parameter_ranges
from cosmoflow.summaries import (SUMMARY_PARTS, one_point, rfft_mode_weights, summary_length, summary_parts,
                                 summary_vector, wavenumbers)

TOOL = "cosmoflow.information"

# Imported where used, not here: scipy and scikit-learn (seconds to import, only for the estimate) and
# cosmoflow.data (TensorFlow), so that --help answers without them.

FISHER_STEPS = {"Omega_m": 0.005, "sigma_8": 0.005, "n_s": 0.005, "H0": 0.5}


def fiducial(mock) -> np.ndarray:
    """The centre of the configured parameter ranges (Omega_m, sigma_8, n_s, H0)."""
    return np.array([(lo + hi) / 2 for lo, hi in parameter_ranges(mock)])


def mode_counts(grid: int, box_size: float, k_max: float | None = None, n_bins: int = 64):
    """(k centres, number of Fourier modes) of an grid^3 box up to ``k_max``, counting k and -k apart."""
    k, _ = wavenumbers(grid, box_size)
    weight = rfft_mode_weights(k, grid)
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

    if sigma >= 1e4:   # the prior alone: MAE 0.5 + O(1 / sigma^2), where the sampling below loses precision
        return 0.5
    rng = np.random.default_rng(seed)
    truth = rng.uniform(-1.0, 1.0, samples)
    observed = truth + sigma * rng.standard_normal(samples)
    a, b = (-1.0 - observed) / sigma, (1.0 - observed) / sigma
    mass = np.maximum(norm.cdf(b) - norm.cdf(a), 1e-300)
    estimate = observed + sigma * (norm.pdf(a) - norm.pdf(b)) / mass   # mean of the truncated normal
    return float(np.mean(np.abs(estimate - truth)))


def box_posterior_mae(covariance: np.ndarray, truths: int = 10_000, draws: int = 200, seed: int = 0) -> np.ndarray:
    """Per parameter, the MAE of the posterior mean of t ~ U[-1, 1]^d (the box the training and validation
    volumes fill) observed as t + N(0, ``covariance``): the best validation MAE a Gaussian measurement with
    that covariance gives in the normalised targets, every parameter's range used at once.

    The range of a parameter that is measured poorly (H0) cuts the degenerate directions of the others: on
    n_s it can matter more than the parameter's own range, which :func:`posterior_mean_mae` alone uses.  Each
    posterior (the Gaussian around the observation, truncated to the box) is sampled by the
    Geweke-Hajivassiliou-Keane recursion: coordinate by coordinate along the Cholesky factor, each drawn
    within the box given the ones before, weighted by the product of those probabilities; every sample lies
    in the box, the widest parameter drawn first.  Monte Carlo error about 1 % (tests/test_information.py)."""
    from scipy.special import ndtr, ndtri   # deferred: scipy (about 0.3 s), as in posterior_mean_mae

    covariance = np.asarray(covariance, dtype=np.float64)
    d = covariance.shape[0]
    # Widest first: a narrow coordinate drawn before a wide one it is tied to leaves the wide one's box
    # probabilities to carry the weights (biased by 5-15 % at 200 draws); the other way round they are even.
    order = np.argsort(-np.diag(covariance), kind="stable")
    if np.any(order != np.arange(d)):
        return box_posterior_mae(covariance[np.ix_(order, order)], truths, draws, seed)[np.argsort(order)]
    root = np.linalg.cholesky(covariance)
    rng = np.random.default_rng(seed)
    errors = np.zeros(d)
    for start in range(0, truths, 1000):
        chunk = min(1000, truths - start)
        truth = rng.uniform(-1.0, 1.0, (chunk, d))
        observed = truth + rng.standard_normal((chunk, d)) @ root.T
        normal = np.zeros((chunk, draws, d))     # the standard normals, theta = observed + root @ normal
        log_weight = np.zeros((chunk, draws))
        for i in range(d):
            centre = observed[:, i, None] + normal[:, :, :i] @ root[i, :i]
            low, high = (-1.0 - centre) / root[i, i], (1.0 - centre) / root[i, i]
            upper = low > 0                      # both bounds in the upper tail: draw in the mirrored lower one
            a, b = np.where(upper, ndtr(-high), ndtr(low)), np.where(upper, ndtr(-low), ndtr(high))
            mass = b - a
            u = np.clip(a + rng.uniform(size=mass.shape) * mass, 1e-300, 1.0 - 1e-16)
            value = np.where(upper, -ndtri(u), ndtri(u))
            normal[:, :, i] = np.clip(value, low, high)
            log_weight += np.log(np.maximum(mass, 1e-300))
        weight = np.exp(log_weight - log_weight.max(axis=1, keepdims=True))
        points = observed[:, None, :] + normal @ root.T
        estimate = np.einsum("tn,tni->ti", weight, np.clip(points, -1.0, 1.0)) / weight.sum(axis=1)[:, None]
        errors += np.abs(estimate - truth).sum(axis=0)
    return errors / truths


def fisher_covariance(fisher: np.ndarray, known: tuple[str, ...], what: str) -> np.ndarray:
    """F^-1 over the parameters not ``known``; a :class:`ConfigError` naming ``what`` where it cannot be had to
    working precision (a parameter the data do not constrain, or round-off: condition over 1e12 once each
    parameter is in units of its own error)."""
    free = [i for i, name in enumerate(TARGET_NAMES) if name not in known]
    if not free:
        return np.zeros((0, 0))
    block = np.asarray(fisher, dtype=np.float64)[np.ix_(free, free)]
    diagonal = np.diag(block)
    problem = None
    if not np.all(np.isfinite(block)) or np.any(diagonal <= 0):
        problem = "not finite, or a parameter with no information"
    else:
        root = np.sqrt(diagonal)   # each parameter in units of its own error; no product of the diagonals
        with np.errstate(all="ignore"):
            unit = block / root[:, None] / root[None, :]
        if not np.all(np.isfinite(unit)):
            problem = "out of floating-point range"
        else:
            eigenvalues = np.linalg.eigvalsh(unit)
            if eigenvalues[0] <= eigenvalues[-1] * 1e-12:
                problem = (f"singular to working precision or not positive definite (eigenvalues {eigenvalues[0]:.2g} "
                           f"to {eigenvalues[-1]:.2g} with each parameter in units of its own error)")
    if problem is None:
        with np.errstate(all="ignore"):
            covariance = np.linalg.inv(unit) / root[:, None] / root[None, :]
        try:
            np.linalg.cholesky(covariance)
        except np.linalg.LinAlgError:
            problem = "not positive definite"
        if not np.all(np.isfinite(covariance)):
            problem = "not invertible in floating point"
    if problem:
        raise ConfigError(f"{what} is {problem}: some combination of {', '.join(TARGET_NAMES[i] for i in free)} "
                          "is not measured (hold one fixed with --known)")
    return covariance


def bound_rows(fisher: np.ndarray, mock, known: tuple[str, ...] = ()) -> dict:
    """Per free target: the marginal error of ``fisher`` (physical and normalised to the [-1, 1] targets), the
    best MAE it allows with every free parameter's range as the prior (:func:`box_posterior_mae`, ``best_mae``)
    and with the target's range alone, the others unbounded (:func:`posterior_mean_mae`, ``best_mae_alone``)."""
    covariance = fisher_covariance(fisher, known, "the Fisher matrix")
    if covariance.size == 0:   # every parameter held fixed
        return {}
    free = [i for i, name in enumerate(TARGET_NAMES) if name not in known]
    errors = dict(zip((TARGET_NAMES[i] for i in free), np.sqrt(np.diag(covariance)).tolist()))   # marginal
    ranges = np.array(parameter_ranges(mock), dtype=np.float64)[free]
    scale = 2.0 / (ranges[:, 1] - ranges[:, 0])
    normalised = covariance * np.outer(scale, scale)
    # a parameter whose error is 1e4 times its range: the likelihood is flat over the box, the prior alone
    # answers (MAE 0.5), and it tells the others nothing (the sampler would lose precision on it)
    flat = np.sqrt(np.diag(normalised)) >= 1e4
    best = np.full(len(free), 0.5)
    if not flat.all():
        best[~flat] = box_posterior_mae(normalised[np.ix_(~flat, ~flat)])
    out = {}
    for j, i in enumerate(free):
        name = TARGET_NAMES[i]
        normalised = errors[name] * scale[j]
        out[name] = {"sigma": errors[name], "sigma_normalised": normalised, "best_mae": float(best[j]),
                     "best_mae_alone": posterior_mean_mae(normalised)}
    return out


def smallest_wavenumber(cfg) -> float:
    """The box's fundamental mode in h/Mpc, as :func:`mode_counts` computes it (a --k-max below it keeps none)."""
    k, _ = wavenumbers(cfg.data.sample_shape[0], cfg.data.mock.box_size_mpc_h)
    return float(np.min(k[k > 0]))


def fisher_report(cfg, k_max: float | None = None, known: tuple[str, ...] = ()) -> dict:
    """Per target: the linear Fisher error (physical and normalised) and the MAE it allows."""
    return bound_rows(linear_fisher(cfg.data.mock, cfg.data.sample_shape[0], k_max), cfg.data.mock, known)


# -- the regression on measured summaries ----------------------------------------------------------

def spectrum_features(volume: np.ndarray, box_size: float, n_bins: int = 8) -> np.ndarray:
    """log P(k) of each channel's overdensity (counts / mean - 1) in ``n_bins`` linear k bins: the ``power``
    part of :func:`cosmoflow.summaries.summary_parts`."""
    return summary_parts(volume, box_size, n_bins, ("power",))["power"]


one_point_features = one_point   # the ``one_point`` part, under the name this module has always given it

FEATURE_ALIASES = {"pdf": "one_point"}   # --features power+pdf, as before the parts were named
PENALTIES = np.logspace(-3, 4, 15)       # ridge penalties tried, on standardised features
HELD_OUT_FRACTION = 0.2                  # the last 20 % of the training rows choose the penalty


def parse_features(text: str) -> tuple[str, ...]:
    """``--features``: parts of :data:`SUMMARY_PARTS` joined by '+' ('pdf' is ``one_point``), or 'all';
    returned in :data:`SUMMARY_PARTS` order."""
    if text.strip() == "all":
        return SUMMARY_PARTS
    parts = [FEATURE_ALIASES.get(part.strip(), part.strip()) for part in text.split("+")]
    if not parts or any(part not in SUMMARY_PARTS for part in parts) or len(set(parts)) != len(parts):
        raise ConfigError(f"--features: expected parts of {', '.join(SUMMARY_PARTS)} (pdf: one_point) joined by '+', "
                          f"or all; got {text!r}")
    return tuple(part for part in SUMMARY_PARTS if part in parts)


def feature_sets(parts: tuple[str, ...]) -> list[tuple[str, ...]]:
    """What the regression is fitted on: ``power`` (the reference row), each chosen part alone, and the
    chosen parts together."""
    alone = [(part,) for part in SUMMARY_PARTS if part == "power" or part in parts]
    return alone + ([parts] if len(parts) > 1 else [])


def split_features(cfg, split: str, n_bins: int, parts: tuple[str, ...]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """({part: summaries (samples, length)}, targets) of every sample of a split, in file order (read raw,
    not through the pipeline)."""
    # deferred: TensorFlow, loaded only after the arguments are parsed (--help answers without it)
    from cosmoflow.data import raw_samples

    rows, targets = [], []
    for volume, y in raw_samples(cfg, split):
        rows.append(summary_parts(volume, cfg.data.mock.box_size_mpc_h, n_bins, parts))
        targets.append(y)
    return {part: np.array([row[part] for row in rows]) for part in parts}, np.array(targets)


def _ridge(penalty):
    # deferred: scikit-learn (about 1 s) for the regression alone
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), Ridge(alpha=penalty))


def held_out_penalty(train_x, train_y, penalties=PENALTIES) -> np.ndarray:
    """Per target, the ridge penalty whose fit on the first 80 % of the training rows has the smallest MAE on
    the last 20 % (at least one row): chosen on train/ alone, never on what the regression is scored on."""
    held_out = max(1, int(round(len(train_y) * HELD_OUT_FRACTION)))
    fit = len(train_y) - held_out
    errors = [np.abs(_ridge(alpha).fit(train_x[:fit], train_y[:fit]).predict(train_x[fit:]) - train_y[fit:]).mean(axis=0)
              for alpha in penalties]
    return np.asarray(penalties)[np.argmin(np.array(errors), axis=0)]


def fit_ridge(train_x, train_y):
    """The baseline's regression of the targets on the features: standardised (scikit-learn's StandardScaler),
    the ridge penalty per target by :func:`held_out_penalty`, refitted on all the rows at that penalty.  The
    fitted pipeline and the penalties (``model.summary_residual`` starts the network from it)."""
    penalty = held_out_penalty(train_x, train_y)
    return _ridge(penalty).fit(train_x, train_y), penalty


def spectrum_regression(train_x, train_y, valid_x, valid_y, names) -> dict:
    """Ridge regression of the targets on the features, penalty per target by :func:`held_out_penalty`,
    refitted on all of train/ at that penalty: validation MAE per target, the training-mean baseline, the
    penalty."""
    model, penalty = fit_ridge(train_x, train_y)
    error = np.abs(model.predict(valid_x) - valid_y).mean(axis=0)
    baseline = np.abs(valid_y - train_y.mean(axis=0)).mean(axis=0)
    return {name: {"mae": float(e), "baseline_mae": float(b), "ratio": float(e / b), "penalty": float(a)}
            for name, e, b, a in zip(names, error, baseline, penalty)}


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


# -- the Fisher matrix of the summaries themselves ---------------------------------------------------

SUMMARY_STEP_FRACTION = 0.05   # derivative step: 5 % of each parameter's range (FISHER_STEPS where larger)
FISHER_SPLIT_ID = 2            # seeds (mock.seed, 2, i): not those of train/ (0) or validation/ (1)


def summary_steps(mock) -> np.ndarray:
    """The finite-difference step of each parameter for the summary Fisher matrix: :data:`FISHER_STEPS`
    (tuned for the smooth linear P(k)) is far below what counts in voxels resolve, so 5 % of the range."""
    return np.array([max(FISHER_STEPS[name], SUMMARY_STEP_FRACTION * (hi - lo))
                     for name, (lo, hi) in zip(TARGET_NAMES, parameter_ranges(mock))])


def summary_of_mock(task: tuple) -> np.ndarray:
    """The summary vector of one mock universe; ``task`` = (parameters, grid, mock, seed, bins, parts).  The
    rng is seeded by (mock.seed, :data:`FISHER_SPLIT_ID`, seed) alone, so mocks of one seed share their
    phases whatever their parameters (and whichever worker computes them)."""
    params, grid, mock, seed, n_bins, parts = task
    rng = np.random.default_rng([mock.seed, FISHER_SPLIT_ID, seed])
    volume = make_universe(np.asarray(params, float), grid, mock, rng)
    return summary_vector(volume, mock.box_size_mpc_h, n_bins, parts)


def fisher_from_summaries(fiducial_summaries: np.ndarray, plus: np.ndarray, minus: np.ndarray,
                          steps: np.ndarray) -> dict:
    """F = D^T C^-1 D from summaries (mocks, length) at the fiducial and (parameters, mocks, length) at
    fiducial +- ``steps``.  D: the central difference averaged over the seeds; C: the covariance over the
    fiducial mocks, its inverse scaled by Hartlap's (n - p - 2) / (n - 1).  Summaries constant over the
    fiducial mocks (a counts-in-cells bin never reached) are dropped.  Returns the matrix, D, the summaries
    used, the Hartlap factor, and F from the first half of the seeds' derivatives (its convergence)."""
    spread = fiducial_summaries.std(axis=0)
    used = spread > 0
    n, p = len(fiducial_summaries), int(used.sum())
    hartlap = (n - p - 2) / (n - 1)
    if hartlap <= 0:
        raise ConfigError(f"--fisher-mocks {n}: {n} fiducial mocks cannot estimate the covariance of {p} summaries "
                          f"(more than {p + 2} needed); use more mocks, fewer --bins or fewer --features parts")
    # In units of each summary's spread: the correlation matrix is far better conditioned than C.
    scale = spread[used]
    correlation = np.corrcoef(fiducial_summaries[:, used], rowvar=False)
    differences = (plus[..., used] - minus[..., used]) / (2 * steps[:, None, None]) / scale

    def fisher(derivatives):
        return hartlap * derivatives @ np.linalg.solve(correlation, derivatives.T)

    derivatives = differences.mean(axis=1)
    return {"fisher": fisher(derivatives), "derivatives": derivatives * scale, "summaries_used": p,
            "summaries_dropped": int((~used).sum()), "hartlap": hartlap,
            "fisher_half_seeds": fisher(differences[:, :max(1, n // 2)].mean(axis=1))}


def summary_fisher(cfg, n_mocks: int, n_bins: int, parts: tuple[str, ...], workers: int | None = None) -> dict:
    """The summary Fisher matrix of one volume of ``cfg``'s mocks (:func:`fisher_from_summaries`) from
    ``n_mocks`` seeds, each at the fiducial and at fiducial +- :func:`summary_steps` of every parameter
    (9 mocks a seed), computed by ``workers`` processes (default: one per available CPU)."""
    mock, grid = cfg.data.mock, cfg.data.sample_shape[0]
    length = summary_length(cfg.data.sample_shape[3], n_bins, parts)
    if n_mocks < length + 3:   # checked before any mock is drawn; fisher_from_summaries checks what is left
        raise ConfigError(f"--fisher-mocks {n_mocks}: the covariance of {length} summaries needs more than "
                          f"{length + 2} fiducial mocks; use more mocks, fewer --bins or fewer --features parts")
    theta, steps = fiducial(mock), summary_steps(mock)
    points = [theta] + [theta + sign * steps[i] * np.eye(4)[i] for i in range(4) for sign in (1, -1)]
    tasks = [(point, grid, mock, seed, n_bins, parts) for seed in range(n_mocks) for point in points]
    workers = max(1, min(workers or available_cpus(), len(tasks)))
    if workers > 1:
        # spawn, not fork, as cosmoflow.mock's generator: no threads of this process are copied
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            summaries = list(pool.map(summary_of_mock, tasks, chunksize=4))
    else:
        summaries = [summary_of_mock(task) for task in tasks]
    summaries = np.array(summaries).reshape(n_mocks, len(points), -1)
    plus = summaries[:, 1::2].transpose(1, 0, 2)
    minus = summaries[:, 2::2].transpose(1, 0, 2)
    result = fisher_from_summaries(summaries[:, 0], plus, minus, steps)
    result["steps"] = dict(zip(TARGET_NAMES, steps.tolist()))
    return result


def parse_sizes(text: str) -> list[int]:
    """``--train-sizes 256,512``: positive integers, increasing."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"--train-sizes: expected comma-separated sample counts such as 256,512,1024, got {text!r}") from None
    if not sizes or sizes != sorted(set(sizes)) or sizes[0] < 2:
        raise ConfigError(f"--train-sizes: expected increasing sample counts of at least 2, got {text!r}")
    return sizes


def train_sizes_argument(text: str) -> list[int]:
    """argparse type of ``--train-sizes``: :func:`parse_sizes`, its refusal argparse's one-line error naming the
    option, so that a bad list is refused before the Fisher bound and the mocks are made, not after."""
    try:
        return parse_sizes(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--train-sizes: ")) from None


PART_LABELS = {"power": "log P(k)", "log_power": "log P(k) of log(1 + counts/mean)",
               "cross": "cross-correlations and growth ratios", "one_point": "one-point statistics"}


def set_name(parts: tuple[str, ...]) -> str:
    return "+".join(parts)


def set_label(parts: tuple[str, ...]) -> str:
    if len(parts) > 2:   # the parts' names: a sentence of four labels would not fit on a line
        return f"the summaries {set_name(parts)}"
    return " and ".join(PART_LABELS[part] for part in parts)


def regression_report(cfg, args, parts: tuple[str, ...], report: dict) -> None:
    """The ridge regressions (and learning curves) of every :func:`feature_sets` entry, into ``report``."""
    if cfg.data.mock.generate_if_missing:
        ensure_mock_data(cfg)
    sizes = args.train_sizes or []
    computed = tuple(part for part in SUMMARY_PARTS if part == "power" or part in parts)
    train_parts, train_y = split_features(cfg, "train", args.bins, computed)
    valid_parts, valid_y = split_features(cfg, "validation", args.bins, computed)
    names = cfg.data.target_names
    report["regression_samples"] = {"train": len(train_y), "validation": len(valid_y)}
    report["features"], report["penalty_held_out_fraction"] = set_name(parts), HELD_OUT_FRACTION
    for chosen in feature_sets(parts):
        fit_x = np.hstack([train_parts[part] for part in chosen])
        score_x = np.hstack([valid_parts[part] for part in chosen])
        rows = spectrum_regression(fit_x, train_y, score_x, valid_y, names)
        report.setdefault("regressions", {})[set_name(chosen)] = rows
        # The keys docs/cosmoflow.md and cosmoflow.learning_curve have always read.
        legacy = {("power",): "power", ("power", "one_point"): "power+pdf"}.get(chosen)
        if legacy:
            report["regression" if legacy == "power" else "regression_power_pdf"] = rows
        print(f"ridge regression on {set_label(chosen)} ({fit_x.shape[1]} numbers, {args.bins} k bins x "
              f"{cfg.data.sample_shape[3]} redshifts), {len(train_y)} train / {len(valid_y)} validation volumes "
              f"of {cfg.data.data_dir}:")
        for name, row in rows.items():
            print(f"  {name:<8} MAE {row['mae']:.3f} vs {row['baseline_mae']:.3f} for the training mean "
                  f"({row['ratio']:.2f}x), penalty {row['penalty']:.3g}")
        if sizes:
            curve = learning_curve(fit_x, train_y, score_x, valid_y, names, sizes, args.repeats)
            report.setdefault("learning_curves", {})[set_name(chosen)] = curve
            if legacy:
                report.setdefault("learning_curve", {})[legacy] = curve
            print(f"  learning curve ({set_label(chosen)}), MAE / training-mean MAE, mean +- std over draws:")
            for n, by_target in curve.items():
                print(f"    {int(n):>6} volumes: " + ", ".join(
                    f"{name} {row['ratio_mean']:.3f} +- {row['ratio_std']:.3f}" for name, row in by_target.items()))


MAX_FISHER_JSON_BYTES = 16 << 20   # a --summary-fisher report is a few kB


def mock_record(cfg) -> dict:
    """What a summary Fisher matrix depends on besides its options: the volumes and the mocks' settings."""
    mock = cfg.data.mock
    return {"sample_shape": list(cfg.data.sample_shape), "box_size_mpc_h": float(mock.box_size_mpc_h),
            "particles_per_voxel_side": mock.particles_per_voxel_side, "seed": mock.seed,
            "redshifts": [float(z) for z in mock.redshifts],
            "ranges": [[float(lo), float(hi)] for lo, hi in parameter_ranges(mock)]}


def _is_number(value) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:   # an integer of hundreds of digits
        return False


def stored_summary_fisher(path, cfg, args, parts: tuple[str, ...]) -> dict:
    """The ``summary_fisher`` of an earlier ``--json`` of this tool (``--fisher-matrix``), checked to be of the
    same volumes, mocks, bins, summaries, held-fixed parameters and seeds; a :class:`ConfigError` naming the
    file and the key otherwise (its bounds are computed again from the matrix, not taken from the file)."""
    if not str(path).strip():
        raise ConfigError(f"--fisher-matrix: expected a file name, got {str(path)!r}")
    path = pathlib.Path(path)
    where = f"--fisher-matrix {path}"
    try:
        if not path.is_file():
            raise ConfigError(f"{where}: " + ("not a file" if path.exists() else "not found"))
        if path.stat().st_size > MAX_FISHER_JSON_BYTES:
            raise ConfigError(f"{where}: {path.stat().st_size} bytes; expected a --json of this tool (a few kB)")
        report = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ConfigError(f"{where}: not readable as JSON ({type(exc).__name__}: {str(exc)[:200]})") from None
    stored = report.get("summary_fisher") if isinstance(report, dict) else None
    if not isinstance(stored, dict):
        raise ConfigError(f"{where}: no summary_fisher; expected a --json of python -m cosmoflow.information "
                          "--summary-fisher")
    expected = {"grid": cfg.data.sample_shape[0], "box_size_mpc_h": cfg.data.mock.box_size_mpc_h, "bins": args.bins}
    for key, value in expected.items():
        if report.get(key) != value:
            raise ConfigError(f"{where}: {key} is {report.get(key)!r}, this command's {value!r}; expected the "
                              "matrix of the same volumes and options")
    known = report.get("known")
    if not isinstance(known, list) or sorted(map(str, known)) != sorted(args.known):
        raise ConfigError(f"{where}: known is {known!r}, this command's {sorted(args.known)!r}; expected the same "
                          "parameters held fixed")
    for key, value in (("features", set_name(parts)), ("mocks_per_point", args.fisher_mocks)):
        if stored.get(key) != value:
            raise ConfigError(f"{where}: summary_fisher.{key} is {stored.get(key)!r}, this command's {value!r}; "
                              "expected the matrix of the same summaries and mocks")
    volumes = stored.get("volumes")
    if volumes is not None:   # reports since --fisher-matrix record their mocks' settings
        mine = mock_record(cfg)
        for key, value in mine.items():
            if not isinstance(volumes, dict) or volumes.get(key) != value:
                got = volumes.get(key) if isinstance(volumes, dict) else volumes
                raise ConfigError(f"{where}: summary_fisher.volumes.{key} is {got!r}, this config's {value!r}; "
                                  "expected the matrix of the same mocks")
    steps = stored.get("steps")
    if not isinstance(steps, dict) or sorted(steps) != sorted(TARGET_NAMES) \
            or not all(_is_number(steps[name]) for name in TARGET_NAMES) \
            or not np.allclose([steps[name] for name in TARGET_NAMES], summary_steps(cfg.data.mock), rtol=1e-9):
        raise ConfigError(f"{where}: summary_fisher.steps is {steps!r}, this config's "
                          f"{dict(zip(TARGET_NAMES, summary_steps(cfg.data.mock).tolist()))}; expected the matrix "
                          "of the same parameter ranges")
    used, dropped = stored.get("summaries_used"), stored.get("summaries_dropped")
    length = summary_length(cfg.data.sample_shape[3], args.bins, parts)
    if type(used) is not int or type(dropped) is not int or used < 1 or dropped < 0 or used + dropped != length:
        raise ConfigError(f"{where}: summary_fisher.summaries_used {used!r} and summaries_dropped {dropped!r}; "
                          f"expected whole numbers adding up to this config's {length} summaries")
    hartlap = stored.get("hartlap")
    if not _is_number(hartlap) or not 0 < hartlap <= 1:
        raise ConfigError(f"{where}: summary_fisher.hartlap is {hartlap!r}; expected a number in (0, 1]")
    rows = stored.get("matrix")
    if not isinstance(rows, list) or len(rows) != 4 or not all(isinstance(row, list) and len(row) == 4
                                                               and all(map(_is_number, row)) for row in rows):
        raise ConfigError(f"{where}: summary_fisher.matrix is not a 4 x 4 matrix of finite numbers")
    matrix = np.array(rows, dtype=np.float64)
    if not np.allclose(matrix, matrix.T, rtol=1e-6, atol=0):
        raise ConfigError(f"{where}: summary_fisher.matrix is not symmetric")
    fisher_covariance(matrix, tuple(args.known), f"{where}: summary_fisher.matrix")
    parameters = stored.get("parameters")
    half = {}
    for name in TARGET_NAMES:
        if name not in args.known:
            row = parameters.get(name) if isinstance(parameters, dict) else None
            value = row.get("sigma_half_seeds") if isinstance(row, dict) else None
            if not _is_number(value) or value <= 0:
                raise ConfigError(f"{where}: summary_fisher.parameters.{name}.sigma_half_seeds is {value!r}; "
                                  "expected a finite number above 0")
            half[name] = float(value)
    return {"fisher": matrix, "half": half, "from": str(path), "steps": steps, "summaries_used": used,
            "summaries_dropped": dropped, "hartlap": float(hartlap), "volumes": volumes is not None}


def summary_fisher_report(cfg, args, parts: tuple[str, ...], report: dict, stored: dict | None = None) -> None:
    """The summary Fisher bound beside the linear one, into ``report`` (``main`` has checked --fisher-mocks);
    from the mocks, or from ``stored`` (:func:`stored_summary_fisher`)."""
    if stored is None:
        result = summary_fisher(cfg, args.fisher_mocks, args.bins, parts)
        half = marginal_errors(result["fisher_half_seeds"], tuple(args.known))
    else:
        result, half = stored, stored["half"]
    rows = bound_rows(result["fisher"], cfg.data.mock, tuple(args.known))
    for name, row in rows.items():
        row["sigma_half_seeds"] = half[name]
    report["summary_fisher"] = {
        "features": set_name(parts), "mocks_per_point": args.fisher_mocks, "steps": result["steps"],
        "covariance": "fiducial mocks, other seeds' phases", "summaries_used": result["summaries_used"],
        "summaries_dropped": result["summaries_dropped"], "hartlap": result["hartlap"],
        "matrix": result["fisher"].tolist(), "parameters": rows}
    if stored is None or stored["volumes"]:   # a matrix of a file that records none: nothing checked to record
        report["summary_fisher"]["volumes"] = mock_record(cfg)
    if stored is not None:
        report["summary_fisher"]["matrix_from"] = stored["from"]
        if not stored["volumes"]:
            print(f"{stored['from']} records no mock settings (written before they were): its grid, box, steps "
                  "(the parameter ranges) and summary count match this config; its mocks' seed, redshifts and "
                  "particles are taken as this config's")
    print(f"summary Fisher bound ({set_label(parts)}, {result['summaries_used']} numbers, {args.bins} k bins; "
          f"{args.fisher_mocks} seeds x 9 mocks, Hartlap factor {result['hartlap']:.2f}"
          + (f", {result['summaries_dropped']} constant summaries dropped" if result["summaries_dropped"] else "")
          + (f"; the matrix of {stored['from']}" if stored is not None else "") + "):")
    for name, row in rows.items():
        linear = report["fisher"][name]["best_mae"]
        print(f"  {name:<8} sigma {row['sigma']:.4g} ({row['sigma_normalised']:.3f} normalised; "
              f"{row['sigma_half_seeds']:.4g} from half the seeds): best MAE {row['best_mae']:.3f} "
              f"(linear Fisher: {linear:.3f})")


def build_parser() -> argparse.ArgumentParser:
    """The command line; every number is checked by its type (0, a negative, nan: argparse's one-line error
    naming the option, before any work)."""
    parser = argparse.ArgumentParser(prog="python -m cosmoflow.information", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--k-max", type=positive_number_argument,
                        help="Fisher: largest wavenumber used, h/Mpc (default: Nyquist)")
    parser.add_argument("--known", action="append", default=[], choices=TARGET_NAMES,
                        help="Fisher: hold this parameter fixed (repeatable)")
    parser.add_argument("--bins", type=positive_int_argument, default=8, help="summaries: k bins per redshift channel")
    parser.add_argument("--features", default="power",
                        help=f"summaries: parts of {', '.join(SUMMARY_PARTS)} joined by '+' (pdf: one_point), or all; "
                             "the regression reports power, each part alone and all of them together")
    parser.add_argument("--train-sizes", type=train_sizes_argument,
                        help="regression: learning curve on these training-set sizes, e.g. 256,512,1024")
    parser.add_argument("--repeats", type=positive_int_argument, default=3,
                        help="learning curve: fits per size (the first n, then random draws)")
    parser.add_argument("--fisher-only", action="store_true", help="skip the regression (needs no data)")
    parser.add_argument("--summary-fisher", action="store_true",
                        help="the Fisher bound of the --features summaries from mocks at the fiducial and +- a step "
                             "(skips the regression; needs no data)")
    parser.add_argument("--fisher-mocks", type=positive_int_argument, default=256,
                        help="summary Fisher: seeds (each 9 mocks); more than the summaries' count + 2")
    parser.add_argument("--fisher-matrix", metavar="JSON",
                        help="summary Fisher: the matrix of an earlier --json of --summary-fisher with the same "
                             "options, its bounds computed again (no mocks)")
    parser.add_argument("--json", help="also write the numbers to this file")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    cfg = load_config(CosmoflowConfig, args.config, args.set)
    parts = parse_features(args.features)
    fundamental = smallest_wavenumber(cfg)
    if args.k_max is not None and args.k_max < fundamental:
        raise ConfigError(f"--k-max: {args.k_max:g} h/Mpc is below the box's fundamental mode {fundamental:.4g} "
                          f"h/Mpc (2 pi / data.mock.box_size_mpc_h={cfg.data.mock.box_size_mpc_h:g}): the bound "
                          "would use no Fourier mode")
    if args.summary_fisher and args.fisher_mocks < 2:
        raise ConfigError(f"--fisher-mocks: expected at least 2, got {args.fisher_mocks}")
    if args.fisher_matrix is not None and not args.summary_fisher:
        raise ConfigError("--fisher-matrix: expected with --summary-fisher (it replaces that bound's mocks)")
    data_dir = str(pathlib.Path(cfg.data.data_dir).resolve())
    # The --json file, checked before the work, not after it: absent or this command's, in a folder it can
    # write, never the --fisher-matrix file it reads (file identity, links followed), never in a folder of
    # another kind (a run's, predictions)
    transaction = OutputTransaction(Producer(TOOL, "cosmoflow", data=data_dir), force=False, how="name another --json",
                                    inputs=[args.config, *([args.fisher_matrix] if args.fisher_matrix else [])])
    if args.json:
        transaction.check([args.json], options={args.json: "--json"})
    stored = None
    if args.fisher_matrix is not None:
        stored = stored_summary_fisher(args.fisher_matrix, cfg, args, parts)
    mock, grid = cfg.data.mock, cfg.data.sample_shape[0]
    report = {"grid": grid, "box_size_mpc_h": mock.box_size_mpc_h, "k_max": args.k_max,
              "data_dir": data_dir, "bins": args.bins,
              "fisher": fisher_report(cfg, args.k_max, tuple(args.known)), "known": args.known}
    print(f"linear Fisher bound, one {grid}^3 volume of {mock.box_size_mpc_h:g} Mpc/h"
          + (f", held fixed: {', '.join(args.known)}" if args.known else "") + ":")
    for name, row in report["fisher"].items():
        print(f"  {name:<8} sigma {row['sigma']:.4g} ({row['sigma_normalised']:.3f} normalised): "
              f"best MAE {row['best_mae']:.3f} (training mean: 0.5)")
    if args.summary_fisher:
        summary_fisher_report(cfg, args, parts, report, stored)
    elif not args.fisher_only:
        regression_report(cfg, args, parts, report)
    if args.json:
        with transaction, transaction.reading(f"the bounds of {args.config}"):
            transaction.json(args.json, report)
    return 0


if __name__ == "__main__":
    exit_process(run_command(main, name=TOOL))
