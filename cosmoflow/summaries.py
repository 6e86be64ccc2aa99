"""Hand-made summary statistics of one CosmoFlow volume: the strongest non-learned baseline's inputs.

A volume is particle counts (x, y, z, channels), one channel per redshift, all channels moved from the same
initial field.  Four parts, each a 1-D float64 array (:func:`summary_parts`), concatenated in
:data:`SUMMARY_PARTS` order by :func:`summary_vector`:

- ``power``: log P(k) of each channel's overdensity ``counts / mean - 1`` in ``n_bins`` linear k bins from half
  the fundamental to the Nyquist wavenumber (P in (Mpc/h)^3, k in h/Mpc).  ``n_bins`` per channel.
- ``log_power``: log P(k) of each channel's ``log(1 + counts / mean)`` with its mean subtracted, in the same
  bins: the logarithm Gaussianises the field (Neyrinck, Szapudi & Szalay 2009), so its spectrum holds part of
  what the overdensity's higher moments hold.  ``n_bins`` per channel.
- ``cross``: for every pair of channels i < j, the cross-correlation coefficient
  r_ij(k) = P_ij / sqrt(P_ii P_jj) in each k bin, then one number, log(sum_k P_ii / sum_k P_jj) over the modes
  of all the bins: the growth between the two redshifts squared.  The channels share their initial phases, so
  these carry little cosmic variance.  The ratio is one number per pair, not one per bin, because per bin it
  would be exactly the difference of two ``power`` entries (a singular covariance for the summary Fisher
  matrix).  ``n_bins + 1`` per pair.
- ``one_point``: per channel, the fraction of voxels in each :data:`PDF_EDGES` bin of counts / mean, and the
  skewness and excess kurtosis of the overdensity in cells of :data:`MOMENT_CELLS` voxels per side.
  17 per channel.

Logs are guarded (an empty channel or bin gives log(1e-30), not -inf), so the vector is finite.  Each field
costs one rfftn; the k-bin index of a (grid, box, bins) is computed once and cached.  The vector is invariant
under the cube's 48 symmetries; under periodic shifts the Fourier parts are, the one-point moments of cells
larger than a voxel only for shifts by multiples of the cell.  numpy only (no TensorFlow, nothing of the suite
but its errors): the network that computes them (``model.summaries``) also builds under Keras' JAX backend.
"""

from __future__ import annotations

import functools
from itertools import combinations

import numpy as np

from common.errors import ConfigError

SUMMARY_PARTS = ("power", "log_power", "cross", "one_point")

# Counts-in-cells bins, in units of the mean count per cell: empty cells, then voids to clusters.
PDF_EDGES = (0.0, 1e-9, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, np.inf)
MOMENT_CELLS = (1, 2, 4)   # cell sizes, in voxels per side, for the skewness and kurtosis

LOG_FLOOR = 1e-30          # what log() sees instead of zero power
MEAN_FLOOR = 1e-12         # what an empty channel's mean count is taken as


def wavenumbers(n: int, box_size: float):
    """|k| in h/Mpc on the rfftn grid of an n^3 box of side ``box_size`` Mpc/h, and its components."""
    kx = 2.0 * np.pi * np.fft.fftfreq(n, d=box_size / n)
    kz = 2.0 * np.pi * np.fft.rfftfreq(n, d=box_size / n)
    kx3, ky3, kz3 = np.meshgrid(kx, kx, kz, indexing="ij", sparse=True)
    k = np.sqrt(kx3 ** 2 + ky3 ** 2 + kz3 ** 2)
    return k, (kx3, ky3, kz3)


def rfft_mode_weights(k: np.ndarray, n: int) -> np.ndarray:
    """How many Fourier modes each entry of an n^3 rfftn grid (``k`` its |k|) stands for: 2, itself and the
    conjugate rfftn drops, but 1 on the planes it keeps whole (the first, and the last for even n)."""
    weight = np.full(k.shape, 2.0)
    weight[..., 0] = 1.0
    if n % 2 == 0:
        weight[..., -1] = 1.0
    return weight


def spherical_average(k: np.ndarray, values: np.ndarray, n: int, box_size: float, n_bins: int, k_max: float):
    """``values`` on an n^3 rfftn grid (``k`` its |k|) averaged over the modes in ``n_bins`` linear shells from
    half the fundamental wavenumber to ``k_max``, each mode counted as :func:`rfft_mode_weights` says:
    (k centres, averages, modes per shell)."""
    weight = rfft_mode_weights(k, n)
    edges = np.linspace(np.pi / box_size, k_max, n_bins + 1)
    index = np.digitize(k.ravel(), edges) - 1
    valid = (index >= 0) & (index < n_bins)
    modes = np.bincount(index[valid], weights=weight.ravel()[valid], minlength=n_bins)
    sums = np.bincount(index[valid], weights=(weight * values).ravel()[valid], minlength=n_bins)
    k_sums = np.bincount(index[valid], weights=(weight * k).ravel()[valid], minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        return k_sums / modes, sums / modes, modes


@functools.lru_cache(maxsize=16)
def k_binning(grid: int, box_size: float, n_bins: int):
    """(positions in the flattened rfftn grid that fall in a bin, their bin, their weight, modes per bin).

    Bins are linear from half the fundamental wavenumber to the Nyquist one, as
    :func:`cosmoflow.mock.measure_power_spectrum`; the weight counts a mode whose conjugate rfftn drops twice."""
    k, _ = wavenumbers(grid, box_size)
    weight = rfft_mode_weights(k, grid)
    edges = np.linspace(np.pi / box_size, np.pi * grid / box_size, n_bins + 1)
    index = np.digitize(k.ravel(), edges) - 1
    inside = np.flatnonzero((index >= 0) & (index < n_bins))
    bins, weights = index[inside], weight.ravel()[inside]
    modes = np.bincount(bins, weights=weights, minlength=n_bins)
    if np.any(modes == 0):
        raise ConfigError(f"--bins {n_bins}: k bin {int(np.argmin(modes))} of a {grid}^3 grid holds no Fourier "
                          f"mode; expected at most about {grid // 3} bins for this grid")
    for array in (inside, bins, weights, modes):
        array.flags.writeable = False
    return inside, bins, weights, modes


def _binned(product: np.ndarray, binning) -> np.ndarray:
    """Mode-weighted mean of ``product`` (a real array on the rfftn grid) in each k bin."""
    inside, bins, weights, modes = binning
    return np.bincount(bins, weights=weights * product.ravel()[inside], minlength=len(modes)) / modes


def _log(x) -> np.ndarray:
    return np.log(np.maximum(x, LOG_FLOOR))


def _overdensity(counts: np.ndarray) -> np.ndarray:
    return counts / max(counts.mean(), MEAN_FLOOR) - 1.0


def _log_field(counts: np.ndarray) -> np.ndarray:
    field = np.log1p(counts / max(counts.mean(), MEAN_FLOOR))
    return field - field.mean()


def one_point(volume: np.ndarray) -> np.ndarray:
    """Per channel: the fraction of voxels in each :data:`PDF_EDGES` bin of counts / mean, and the skewness
    and excess kurtosis of the overdensity in cells of 1, 2 and 4 voxels per side (sums of counts): what a
    Gaussian field's two-point function does not fix."""
    edges = np.asarray(PDF_EDGES)
    features = []
    for channel in range(volume.shape[-1]):
        counts = np.asarray(volume[..., channel], np.float64)
        mean = max(counts.mean(), MEAN_FLOOR)
        # Bins [low, high), as np.histogram's but 5x faster on a 64^3 volume.
        which = np.searchsorted(edges, (counts / mean).ravel(), side="right") - 1
        features.extend(np.bincount(which, minlength=len(edges) - 1)[:len(edges) - 1] / counts.size)
        n = counts.shape[0]
        for cell in MOMENT_CELLS:
            m = n // cell
            summed = counts[:m * cell, :m * cell, :m * cell]
            if cell > 1:
                summed = summed.reshape(m, cell, m, cell, m, cell).sum(axis=(1, 3, 5))
            delta = summed / max(summed.mean(), MEAN_FLOOR) - 1.0
            square = delta * delta   # products, not powers: ** 3 and ** 4 take 10x longer
            variance = max(square.mean(), LOG_FLOOR)
            features.append(np.mean(square * delta) / variance ** 1.5)
            features.append(np.mean(square * square) / variance ** 2 - 3.0)
    return np.array(features, dtype=np.float64)


def _check_parts(parts) -> tuple[str, ...]:
    unknown = [part for part in parts if part not in SUMMARY_PARTS]
    if unknown or not parts:
        raise ConfigError(f"summary parts {list(parts)}: expected one or more of {', '.join(SUMMARY_PARTS)}")
    return tuple(part for part in SUMMARY_PARTS if part in parts)


def summary_parts(volume: np.ndarray, box_size: float, n_bins: int = 12,
                  parts=SUMMARY_PARTS) -> dict[str, np.ndarray]:
    """The chosen :data:`SUMMARY_PARTS` of one volume of counts (x, y, z, channels), box side ``box_size``
    Mpc/h: name -> 1-D float64 array (see the module docstring for each)."""
    parts = _check_parts(parts)
    volume = np.asarray(volume)
    grid, channels = volume.shape[0], volume.shape[-1]
    norm = box_size ** 3 / grid ** 6   # P = V_box / N^6 |F|^2 for numpy's unnormalised FFT
    binning = k_binning(grid, float(box_size), n_bins)
    out = {}
    if "power" in parts or "cross" in parts:
        modes = [np.fft.rfftn(_overdensity(np.asarray(volume[..., c], np.float64))) for c in range(channels)]
        auto = [_binned(np.abs(m) ** 2 * norm, binning) for m in modes]
        if "power" in parts:
            out["power"] = np.concatenate([_log(p) for p in auto])
        if "cross" in parts:
            inside, _, weights, _ = binning
            total = [np.sum(weights * (np.abs(m) ** 2).ravel()[inside]) for m in modes]
            cross = []
            for i, j in combinations(range(channels), 2):
                p_ij = _binned((modes[i] * modes[j].conj()).real * norm, binning)
                with np.errstate(invalid="ignore", divide="ignore"):
                    r = p_ij / np.sqrt(auto[i] * auto[j])
                cross.append(np.where(np.isfinite(r), r, 0.0))   # an empty channel correlates with nothing
                cross.append([np.log(max(total[i], LOG_FLOOR) / max(total[j], LOG_FLOOR))])
            out["cross"] = np.concatenate(cross) if cross else np.zeros(0)
    if "log_power" in parts:
        out["log_power"] = np.concatenate([
            _log(_binned(np.abs(np.fft.rfftn(_log_field(np.asarray(volume[..., c], np.float64)))) ** 2 * norm,
                         binning)) for c in range(channels)])
    if "one_point" in parts:
        out["one_point"] = one_point(volume)
    return {part: np.asarray(out[part], np.float64) for part in parts}


def summary_vector(volume: np.ndarray, box_size: float, n_bins: int = 12, parts=SUMMARY_PARTS) -> np.ndarray:
    """The chosen parts of :func:`summary_parts` concatenated in :data:`SUMMARY_PARTS` order (float64)."""
    return np.concatenate(list(summary_parts(volume, box_size, n_bins, parts).values()))


def summary_length(channels: int, n_bins: int = 12, parts=SUMMARY_PARTS) -> int:
    """Length of :func:`summary_vector` for a volume of ``channels`` redshifts."""
    per_part = {"power": channels * n_bins, "log_power": channels * n_bins,
                "cross": channels * (channels - 1) // 2 * (n_bins + 1),
                "one_point": channels * (len(PDF_EDGES) - 1 + 2 * len(MOMENT_CELLS))}
    return sum(per_part[part] for part in _check_parts(parts))
