"""Mock universes for CosmoFlow, from physics, in the real file formats.

For each sample: draw (Omega_m, sigma_8, n_s, H0) uniformly in ranges around
Planck; get the linear matter power spectrum P(k) at z = 0 from colossus
(Eisenstein & Hu transfer function, normalised to sigma_8); draw a Gaussian
random field with that spectrum on a particle lattice; move the particles by
the Zel'dovich displacement scaled by the linear growth factor D(z)/D(0) at
each redshift (default z = 3, 1.5, 0.5, 0); count particles per voxel (int16,
one channel per redshift).  Targets are normalised to [-1, 1] over the ranges,
like ``unitPar`` in the MLPerf data.

    python -m cosmoflow.mock --config configs/cosmoflow/demo.yaml
    python -m cosmoflow.mock --out DIR --n-train 64 --n-validation 16 --size 64 [--format hdf5]

Output layout: ``DIR/train/`` and ``DIR/validation/``, one file per sample,
written by its family (``cosmoflow.formats``): a TFRecord (MLPerf layout: ``x``
int16 bytes, ``y`` float32[4]), or an HDF5 file with ``full`` (counts, channels
last) and ``unitPar``.  ``DIR`` must be absent or
empty (or a symbolic link to an empty folder, which is filled); it appears only
when complete (written to a new folder beside it and renamed,
:func:`common.storage.generated.generated_folder`), and whatever would stop that
(a link to nothing, a path under a file, a folder that cannot be written
beside) is a one-line error before any sample is computed.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import pathlib
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from common.cli import exit_process, non_negative_int_argument, positive_int_argument, run_command
from common.config import load_config
from common.storage.generated import generated_folder
from common.console.progress import Progress
from common.errors import ConfigError, UserInputError
from cosmoflow import formats, nbody
from cosmoflow.config import OMEGA_B, CosmoflowConfig, MockSection
from cosmoflow.summaries import spherical_average, wavenumbers

# Imported where used, not here: colossus (1.1 s to import; only for a power spectrum).  Each file family writes
# its own files (cosmoflow.formats: file_name, write_sample), importing TensorFlow or h5py at its first write.

log = logging.getLogger(__name__)



# -- physics ------------------------------------------------------------------

def draw_parameters(rng: np.random.Generator, mock: MockSection) -> np.ndarray:
    """(Omega_m, sigma_8, n_s, H0) drawn uniformly in the configured ranges."""
    ranges = parameter_ranges(mock)
    return np.array([rng.uniform(lo, hi) for lo, hi in ranges])


def parameter_ranges(mock: MockSection) -> list[tuple[float, float]]:
    """The (low, high) range of each target, in the MLPerf order (Omega_m, sigma_8, n_s, H0)."""
    return [tuple(mock.omega_m_range), tuple(mock.sigma_8_range), tuple(mock.n_s_range), tuple(mock.h0_range)]


def normalise_targets(params: np.ndarray, mock: MockSection) -> np.ndarray:
    """Physical parameters -> [-1, 1] over the configured ranges (``unitPar``)."""
    lo, hi = np.array(parameter_ranges(mock)).T
    return (2.0 * (params - lo) / (hi - lo) - 1.0).astype(np.float32)


def cosmology_for(params: np.ndarray):
    """A flat colossus cosmology for physical parameters (Omega_m, sigma_8, n_s, H0)."""
    # deferred: colossus only where a universe is drawn (not for --help or the HDF5 writer)
    from colossus.cosmology import cosmology

    omega_m, sigma_8, n_s, h0 = (float(p) for p in params)
    return cosmology.Cosmology(name="mock", flat=True, H0=h0, Om0=omega_m, Ob0=OMEGA_B, sigma8=sigma_8,
                               ns=n_s, persistence="", print_warnings=False)


def gaussian_random_field_k(n: int, box_size: float, power, rng: np.random.Generator) -> np.ndarray:
    """Fourier modes (numpy rfftn convention) of a Gaussian field with spectrum ``power(k)``.

    White noise w of unit variance has <|W_k|^2> = n^3; scaling by
    sqrt(P(k) / V_cell) gives <|delta_k|^2> = P(k) n^3 / V_cell, i.e.
    P(k) = V_box / n^6 <|delta_k|^2>.
    """
    white = rng.standard_normal((n, n, n))
    modes = np.fft.rfftn(white)
    k, _ = wavenumbers(n, box_size)
    cell_volume = (box_size / n) ** 3
    amplitude = np.zeros_like(k)
    nonzero = k > 0
    amplitude[nonzero] = np.sqrt(power(k[nonzero]) / cell_volume)
    return modes * amplitude


def measure_power_spectrum(delta: np.ndarray, box_size: float, n_bins: int = 16):
    """Spherically averaged P(k) of a real field (for checks): (k centres, P, modes per bin)."""
    n = delta.shape[0]
    modes = np.fft.rfftn(delta)
    k, _ = wavenumbers(n, box_size)
    power = np.abs(modes) ** 2 * box_size ** 3 / n ** 6
    return spherical_average(k, power, n, box_size, n_bins, np.pi * n / box_size)


def voxel_counts(positions: np.ndarray, box_size: float, grid: int) -> np.ndarray:
    """Particles per voxel of a grid^3 division of the periodic box (nearest grid point), as int16 (the files'
    type): a voxel holding more than int16 can is a one-line error, never a count clipped."""
    voxel = box_size / grid
    cells = np.floor((positions % box_size) / voxel).astype(np.int64) % grid
    flat = (cells[:, 0] * grid + cells[:, 1]) * grid + cells[:, 2]
    histogram = np.bincount(flat, minlength=grid ** 3)
    if histogram.max() > np.iinfo(np.int16).max:
        raise ConfigError(f"a voxel holds {histogram.max()} particles, more than the files' int16 counts hold "
                          f"({np.iinfo(np.int16).max}): fewer particles (data.mock.particles_per_voxel_side) or "
                          "smaller voxels")
    return histogram.astype(np.int16).reshape(grid, grid, grid)


def zeldovich_counts(delta_k: np.ndarray, lattice: int, box_size: float, grid: int,
                     growth: np.ndarray) -> np.ndarray:
    """Particle counts per voxel (grid^3 x len(growth)) after Zel'dovich displacement.

    One particle per lattice site (``lattice``^3 of them); displacement
    psi_k = i k / k^2 delta_k, positions q + D psi, periodic box, nearest-grid-point counts.
    """
    k, components = wavenumbers(lattice, box_size)
    k2 = k ** 2
    k2[0, 0, 0] = 1.0
    positions = nbody.lattice(lattice, box_size)
    displacement = np.empty_like(positions)
    for axis, k_axis in enumerate(components):
        displacement[:, axis] = np.fft.irfftn(1j * k_axis / k2 * delta_k, s=(lattice,) * 3, axes=(0, 1, 2)).ravel()
    counts = np.empty((grid, grid, grid, len(growth)), dtype=np.int16)
    for channel, d in enumerate(growth):
        counts[..., channel] = voxel_counts(positions + d * displacement, box_size, grid)
    return counts


def make_universe(params: np.ndarray, grid: int, mock: MockSection, rng: np.random.Generator,
                  box_size: float | None = None) -> np.ndarray:
    """One sample: int16 counts (grid, grid, grid, len(redshifts)), the particles moved by ``mock.dynamics``."""
    cosmo = cosmology_for(params)
    box = mock.box_size_mpc_h if box_size is None else box_size
    lattice = grid * mock.particles_per_voxel_side
    delta_k = gaussian_random_field_k(lattice, box, lambda k: cosmo.matterPowerSpectrum(k, z=0.0), rng)
    redshifts = np.asarray(mock.redshifts, dtype=float)
    if mock.dynamics == "zeldovich":
        growth = cosmo.growthFactor(redshifts) / cosmo.growthFactor(0.0)
        return zeldovich_counts(delta_k, lattice, box, grid, growth)
    snapshots = nbody.evolve(delta_k, lattice, box, float(params[0]), redshifts, mock.dynamics,
                             steps=mock.cola_steps, initial_redshift=mock.cola_initial_redshift,
                             mesh_factor=mock.cola_mesh_factor)
    return np.stack([voxel_counts(snapshot.positions, box, grid) for snapshot in snapshots], axis=-1).astype(np.int16)


def seeded_universe(task: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(counts, unitPar, physical parameters) of sample ``index`` of split ``split_id``: a function of
    (mock.seed, split_id, index) alone, so any worker computes the same sample."""
    split_id, index, side, box, mock = task
    rng = np.random.default_rng([mock.seed, split_id, index])
    params = draw_parameters(rng, mock)
    return make_universe(params, side, mock, rng, box_size=box), normalise_targets(params, mock), params


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity, as SLURM and cgroups set it), not the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def generate_dataset(out_dir, n_train: int, n_validation: int, grid: int, mock: MockSection,
                     file_format: str = "tfrecord", compression: str = "none", crops_per_side: int = 1,
                     progress: bool = True, workers: int | None = None) -> pathlib.Path:
    """Write ``out_dir/train`` and ``out_dir/validation``; atomic at the directory level.

    ``out_dir`` must be absent or empty.  Samples are computed by ``workers`` processes (default: one per
    available CPU) and written in order by this one, each a file named and written by the family ``file_format``
    (its ``file_name`` and ``write_sample``); the files are the same whatever the number of workers."""
    out_dir = pathlib.Path(out_dir)
    family = formats.family(file_format)
    # data.compression is an option of the families whose files have it; the others write theirs as they are.
    compression = compression if compression in family.COMPRESSIONS else "none"
    side = grid * crops_per_side
    box = mock.box_size_mpc_h * crops_per_side
    workers = max(1, min(workers or available_cpus(), n_train + n_validation))
    with generated_folder(out_dir, EXPECTED_LAYOUT) as work:
        # spawn, not fork: the caller may be a training rank with TensorFlow's and Horovod's threads running.
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) if workers > 1 else None
        try:
            for split_id, (split, count) in enumerate((("train", n_train), ("validation", n_validation))):
                split_dir = work / split
                split_dir.mkdir()
                tasks = [(split_id, index, side, box, mock) for index in range(count)]
                universes = pool.map(seeded_universe, tasks) if pool else map(seeded_universe, tasks)
                with Progress(count, f"mock {split}", "samples", enabled=progress) as bar:
                    for index, (counts, unit, params) in enumerate(universes):
                        path = split_dir / family.file_name(f"univ_{split}_{index:06d}", compression)
                        family.write_sample(path, counts, unit, params, compression)
                        bar.update()
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)
    return out_dir


EXPECTED_LAYOUT = "CosmoFlow data (train/ and validation/ folders of sample files)"


def dataset_present(data_dir) -> bool:
    """Whether ``data_dir`` holds train/ and validation/ with files in them."""
    data_dir = pathlib.Path(data_dir)
    return all((data_dir / split).is_dir() and any((data_dir / split).iterdir()) for split in ("train", "validation"))


def ensure_mock_data(cfg, progress: bool = True) -> bool:
    """Generate the configured mock dataset into an absent or empty ``data.data_dir``; True if it wrote one.

    A folder holding anything but train/ and validation/ with files is an error, never written into."""
    data = cfg.data
    if dataset_present(data.data_dir):
        return False
    grid = data.sample_shape[0]
    if len(set(data.sample_shape[:3])) != 1:
        raise ConfigError("mock volumes are cubes: data.sample_shape must have three equal spatial sizes")
    if data.sample_shape[3] != len(data.mock.redshifts):
        raise ConfigError(f"data.sample_shape has {data.sample_shape[3]} channels but data.mock.redshifts has "
                          f"{len(data.mock.redshifts)}")
    generate_dataset(data.data_dir, data.mock.n_train, data.mock.n_validation, grid, data.mock,
                     file_format=data.format, compression=data.compression, progress=progress)
    return True


def prepare_data(cfg) -> None:
    """The engine's data step (rank 0, before the datasets are built): mock universes when asked and absent."""
    if cfg.data.mock.generate_if_missing and ensure_mock_data(cfg):
        log.info(f"generated mock universes in {cfg.data.data_dir}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m cosmoflow.mock", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="take data_dir, shape, format and mock settings from this config")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--out", help="output directory (default: the config's data.data_dir)")
    parser.add_argument("--n-train", type=positive_int_argument, help="training samples (default: data.mock.n_train)")
    parser.add_argument("--n-validation", type=positive_int_argument,
                        help="validation samples (default: data.mock.n_validation)")
    parser.add_argument("--size", type=positive_int_argument,
                        help="voxels per side of one sample (default: data.sample_shape[0])")
    parser.add_argument("--format", choices=list(formats.FAMILIES))
    parser.add_argument("--gzip", action="store_true",
                        help=f"GZIP-compressed {families_that(lambda family: 'gzip' in family.COMPRESSIONS)[0]} files")
    parser.add_argument("--crops-per-side", type=positive_int_argument, default=1,
                        help=f"{families_that(lambda family: family.HOLDS_CROPS)[0]}: volumes of (size * this)^3, "
                             "cut into crops")
    parser.add_argument("--seed", type=non_negative_int_argument, help="default: data.mock.seed")
    parser.add_argument("--workers", type=positive_int_argument,
                        help="processes computing samples (default: one per CPU)")
    return parser


def check_renamed_options(argv: list[str]) -> None:
    """``--n-valid``, the old name of ``--n-validation`` (hep_cnn.synth and climate_seg.cam5.synth say so too), is
    read until 0.2.0 as argparse reads it, an abbreviation of the new one: with a warning, and refused beside the new
    name (argparse would take whichever came last)."""
    names = [arg.split("=")[0] for arg in argv]
    if "--n-valid" not in names:
        return
    if sum(len(name) > len("--n-va") and "--n-validation".startswith(name) for name in names) > 1:
        raise UserInputError("--n-valid is the old name of --n-validation: give only --n-validation")
    log.warning("--n-valid is deprecated (read until 0.2.0): call it --n-validation")


def families_that(declares) -> tuple[str, str]:
    """The families whose declarations satisfy ``declares``, for a refusal naming them: (their names in
    messages, their --format values), each joined by "or"."""
    chosen = [family for family in map(formats.family, formats.FAMILIES) if declares(family)]
    return " or ".join(family.WHAT for family in chosen), " or ".join(family.NAME for family in chosen)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    check_renamed_options(sys.argv[1:] if argv is None else list(argv))


    raw_defaults = {"data": {"data_dir": args.out or "data/cosmoflow-mock"}}
    cfg = load_config(CosmoflowConfig, args.config, args.set, defaults=raw_defaults)
    data = cfg.data
    out = pathlib.Path(args.out or data.data_dir)
    mock = data.mock.model_copy(update={"seed": args.seed} if args.seed is not None else {})
    file_format = args.format or data.format
    family = formats.family(file_format)
    if args.crops_per_side > 1 and not family.HOLDS_CROPS:
        what, names = families_that(lambda other: other.HOLDS_CROPS)
        raise UserInputError(f"--crops-per-side {args.crops_per_side}: only {what} files hold volumes cut into "
                             f"crops (--format {names}); a {file_format} file holds one sample")
    if args.gzip and "gzip" not in family.COMPRESSIONS:
        what, names = families_that(lambda other: "gzip" in other.COMPRESSIONS)
        raise UserInputError(f"--gzip: only {what} files are compressed (--format {names}), not {file_format}")
    if dataset_present(out):
        print(f"mock data already present in {out}; to regenerate, remove it or choose another --out")
        return 0
    grid = data.sample_shape[0] if args.size is None else args.size
    generate_dataset(out, mock.n_train if args.n_train is None else args.n_train,
                     mock.n_validation if args.n_validation is None else args.n_validation, grid, mock,
                     file_format=file_format,
                     compression="gzip" if args.gzip else data.compression,
                     crops_per_side=args.crops_per_side, workers=args.workers)
    print(f"wrote mock universes to {out}")
    return 0


if __name__ == "__main__":
    exit_process(run_command(main, name="cosmoflow.mock"))
