"""The hand-made summaries of a CosmoFlow volume against spectra computed another way (the full complex fftn,
bins chosen by a boolean mask per shell), fields of known correlation, and the cube's symmetries."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from common.errors import ConfigError
from cosmoflow.summaries import SUMMARY_PARTS, summary_length, summary_parts, summary_vector

BOX = 160.0   # Mpc/h

# Round-off: the summaries are logs of power averaged over >= 7 modes, correlation coefficients and fractions,
# all O(1); a float64 FFT of 16^3 points errs by about eps * log2(16^3) = 3e-15 of the field's norm, so a
# reordering of the same sums moves them by ~1e-13 at most.  1e-9 leaves room and still catches a wrong bin.
ROUND_OFF = 1e-9


def direct_power(field: np.ndarray, box: float, n_bins: int) -> np.ndarray:
    """P(k) of a real field in the summaries' bins, from every mode of the complex fftn (no rfft weights):
    the mean of |F|^2 V / N^2 over the modes of each shell, one boolean mask per shell."""
    return direct_cross(field, field, box, n_bins)


def direct_cross(a: np.ndarray, b: np.ndarray, box: float, n_bins: int) -> np.ndarray:
    n = a.shape[0]
    fa, fb = np.fft.fftn(a), np.fft.fftn(b)
    k1 = 2 * np.pi * np.fft.fftfreq(n, d=box / n)
    k = np.sqrt(k1[:, None, None] ** 2 + k1[None, :, None] ** 2 + k1[None, None, :] ** 2)
    edges = np.linspace(np.pi / box, np.pi * n / box, n_bins + 1)   # half the fundamental to Nyquist
    out = []
    for low, high in zip(edges[:-1], edges[1:]):
        shell = (k >= low) & (k < high)
        out.append(np.mean((fa[shell] * np.conj(fb[shell])).real) * box ** 3 / n ** 6)
    return np.array(out)


def poisson_volume(seed: int, grid: int = 16, channels: int = 2, mean: float = 6.0) -> np.ndarray:
    return np.random.default_rng(seed).poisson(mean, (grid, grid, grid, channels)).astype(np.int16)


def test_power_in_each_bin_against_the_full_fftn():
    volume = poisson_volume(0, channels=2)
    power = summary_parts(volume, BOX, n_bins=5)["power"].reshape(2, 5)
    for channel in range(2):
        counts = volume[..., channel].astype(np.float64)
        expected = direct_power(counts / counts.mean() - 1.0, BOX, 5)
        np.testing.assert_allclose(power[channel], np.log(expected), rtol=0, atol=ROUND_OFF)


def test_power_and_one_point_are_the_numbers_information_computed_before():
    from cosmoflow.information import one_point_features, spectrum_features

    volume = poisson_volume(1, channels=3)
    parts = summary_parts(volume, BOX, n_bins=4)
    assert np.array_equal(parts["power"], spectrum_features(volume, BOX, n_bins=4))
    assert np.array_equal(parts["one_point"], one_point_features(volume))


def test_cross_of_identical_scaled_and_independent_channels():
    rng = np.random.default_rng(2)
    delta = rng.standard_normal((16, 16, 16))
    delta -= delta.mean()
    a, mean = 0.5, 40.0
    volume = np.stack([mean * (1 + delta),           # channel 0
                       mean * (1 + delta),           # 1: identical to 0
                       3 * mean * (1 + a * delta),   # 2: the overdensity scaled by a (and a larger mean)
                       mean * (1 + rng.standard_normal((16, 16, 16)))], axis=-1)   # 3: independent phases
    n_bins = 4
    cross = summary_parts(volume, BOX, n_bins, parts=("cross",))["cross"].reshape(6, n_bins + 1)
    pairs = list(itertools.combinations(range(4), 2))
    by_pair = dict(zip(pairs, cross))
    np.testing.assert_allclose(by_pair[0, 1], [1.0] * n_bins + [0.0], atol=ROUND_OFF)
    # P_22 = a^2 P_00 in every bin, so r = 1 and log(P_00 / P_22) = -2 log a.
    np.testing.assert_allclose(by_pair[0, 2], [1.0] * n_bins + [-2 * np.log(a)], atol=ROUND_OFF)
    np.testing.assert_allclose(by_pair[1, 2], [1.0] * n_bins + [-2 * np.log(a)], atol=ROUND_OFF)
    # Independent channels: r_03 per bin from the full fftn, and near 0 (the bins hold >= 7 modes each).
    d3 = volume[..., 3] / volume[..., 3].mean() - 1
    expected = direct_cross(delta, d3, BOX, n_bins) / np.sqrt(direct_power(delta, BOX, n_bins)
                                                              * direct_power(d3, BOX, n_bins))
    np.testing.assert_allclose(by_pair[0, 3][:n_bins], expected, atol=ROUND_OFF)
    assert np.all(np.abs(expected) < 0.6)


def test_log_power_of_a_field_whose_logarithm_is_gaussian():
    # counts = M (exp(g + c) - 1) with c such that mean(exp(g + c)) = 2: then mean(counts) = M and
    # log(1 + counts / mean) = g + c exactly, so log_power is the spectrum of g - mean(g).
    rng = np.random.default_rng(3)
    sigma = 0.3
    g = sigma * rng.standard_normal((16, 16, 16))
    c = np.log(2.0) - np.log(np.mean(np.exp(g)))
    counts = 7.0 * (np.exp(g + c) - 1.0)
    log_power = summary_parts(counts[..., None], BOX, n_bins=4, parts=("log_power",))["log_power"]
    np.testing.assert_allclose(log_power, np.log(direct_power(g - g.mean(), BOX, 4)), atol=ROUND_OFF)
    # White noise of variance sigma^2: P = sigma^2 V_cell in every bin (sampling spread: bins of >= 7 modes).
    np.testing.assert_allclose(np.exp(log_power), sigma ** 2 * (BOX / 16) ** 3, rtol=0.6)


def cube_symmetries():
    """The 48 symmetries of the cube on the spatial axes: 6 permutations x 8 reflections."""
    for order in itertools.permutations(range(3)):
        for flips in itertools.product((False, True), repeat=3):
            yield order, [axis for axis, flip in enumerate(flips) if flip]


def test_vector_is_invariant_under_the_48_cube_symmetries_and_periodic_shifts():
    volume = poisson_volume(4, channels=3, mean=3.0)
    reference = summary_vector(volume, BOX, n_bins=4)
    symmetries = list(cube_symmetries())
    assert len({(order, tuple(flips)) for order, flips in symmetries}) == 48
    for order, flips in symmetries:
        moved = np.flip(np.transpose(volume, (*order, 3)), axis=flips) if flips else np.transpose(volume, (*order, 3))
        np.testing.assert_allclose(summary_vector(moved, BOX, n_bins=4), reference, rtol=0, atol=ROUND_OFF)
    # Shifts by whole cells of the largest moment cell (4 voxels) keep every part; any shift keeps the Fourier ones.
    np.testing.assert_allclose(summary_vector(np.roll(volume, (4, -8, 12), axis=(0, 1, 2)), BOX, n_bins=4),
                               reference, atol=ROUND_OFF)
    fourier = ("power", "log_power", "cross")
    np.testing.assert_allclose(summary_vector(np.roll(volume, (3, -5, 7), axis=(0, 1, 2)), BOX, 4, fourier),
                               summary_vector(volume, BOX, 4, fourier), atol=ROUND_OFF)


def test_lengths_order_and_an_empty_channel():
    volume = poisson_volume(5, channels=3)
    volume[..., 1] = 0   # an empty channel: guarded logs, no NaN
    for parts in (SUMMARY_PARTS, ("power",), ("cross", "power"), ("one_point", "log_power")):
        vector = summary_vector(volume, BOX, n_bins=4, parts=parts)
        assert vector.dtype == np.float64 and np.all(np.isfinite(vector))
        assert len(vector) == summary_length(3, 4, parts)
    parts = summary_parts(volume, BOX, n_bins=4)
    assert list(parts) == list(SUMMARY_PARTS)
    assert np.array_equal(summary_vector(volume, BOX, 4), np.concatenate([parts[p] for p in SUMMARY_PARTS]))
    assert summary_length(4, 12) == 4 * 12 + 4 * 12 + 6 * 13 + 4 * 17
    with pytest.raises(ConfigError, match="--bins 40: k bin 0 of a 16\\^3 grid holds no Fourier mode"):
        summary_vector(volume, BOX, n_bins=40)
    with pytest.raises(ConfigError, match="expected one or more of"):
        summary_vector(volume, BOX, parts=("bispectrum",))
