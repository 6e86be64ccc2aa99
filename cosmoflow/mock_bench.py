"""Benchmark of the mock universes' dynamics (``data.mock.dynamics``, :mod:`cosmoflow.nbody`).

    python -m cosmoflow.mock_bench [--config configs/cosmoflow/science_cola.yaml] [--set data.mock.cola_mesh_factor=3]

Prices one volume by phase on one core (initial field, 2LPT, the PM's linear response, each COLA step, the
counts), then volumes per second with one process per CPU, as :mod:`cosmoflow.mock` makes them, and what a
dataset of the config's size would take.  Prints; writes nothing.
"""

from __future__ import annotations

import argparse
import multiprocessing
import pathlib
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from common.cli import exit_process, positive_int_argument, run_command
from common.config import load_config
from cosmoflow import mock, nbody
from cosmoflow.config import CosmoflowConfig


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m cosmoflow.mock_bench",
        description="Benchmark of the mock universes' dynamics: the cost of one volume by phase and of each "
                    "COLA step on one core, then volumes per second with one process per CPU (what "
                    "python -m cosmoflow.mock does).  Prints; writes nothing.")
    parser.add_argument("--config", help="take data.mock (dynamics, steps, mesh, box, redshifts) from this config "
                                         "(default: configs/cosmoflow/science_cola.yaml)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--size", type=positive_int_argument,
                        help="voxels per side of one sample (default: data.sample_shape[0])")
    parser.add_argument("--volumes", type=positive_int_argument, default=None,
                        help="volumes in the throughput run (default: two per worker)")
    parser.add_argument("--workers", type=positive_int_argument,
                        help="processes in the throughput run (default: one per available CPU)")
    parser.add_argument("--total", type=positive_int_argument, default=None,
                        help="a dataset size to price (default: the config's n_train + n_validation)")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    config = args.config or str(pathlib.Path(__file__).resolve().parent.parent / "configs" / "cosmoflow" /
                                "science_cola.yaml")
    cfg = load_config(CosmoflowConfig, config, args.set)
    settings = cfg.data.mock
    grid = args.size or cfg.data.sample_shape[0]
    lattice_side = grid * settings.particles_per_voxel_side
    workers = args.workers or mock.available_cpus()
    volumes = args.volumes or 2 * workers
    total = args.total or settings.n_train + settings.n_validation
    print(f"{settings.dynamics}: {lattice_side}^3 particles in {settings.box_size_mpc_h:g} Mpc/h, counted in {grid}^3 "
          f"voxels at z = {', '.join(f'{z:g}' for z in settings.redshifts)}" +
          (f"; {settings.cola_steps} steps from z = {settings.cola_initial_redshift:g} on a "
           f"{lattice_side * settings.cola_mesh_factor}^3 mesh" if settings.dynamics == "cola" else ""))

    # one volume on one core, by phase
    rng = np.random.default_rng([settings.seed, 0, 0])
    params = mock.draw_parameters(rng, settings)
    clock = time.perf_counter()
    cosmo = mock.cosmology_for(params)
    delta_k = mock.gaussian_random_field_k(lattice_side, settings.box_size_mpc_h,
                                           lambda k: cosmo.matterPowerSpectrum(k, z=0.0), rng)
    field = time.perf_counter() - clock
    timings: dict = {}
    clock = time.perf_counter()
    if settings.dynamics == "zeldovich":
        mock.make_universe(params, grid, settings, np.random.default_rng([settings.seed, 0, 0]))
        print(f"one volume, one core: {time.perf_counter() - clock:.2f} s")
    else:
        snapshots = nbody.evolve(delta_k, lattice_side, settings.box_size_mpc_h, float(params[0]), settings.redshifts,
                           settings.dynamics, steps=settings.cola_steps,
                           initial_redshift=settings.cola_initial_redshift, mesh_factor=settings.cola_mesh_factor,
                           timings=timings)
        dynamics = time.perf_counter() - clock
        clock = time.perf_counter()
        for snapshot in snapshots:
            mock.voxel_counts(snapshot.positions, settings.box_size_mpc_h, grid)
        counting = time.perf_counter() - clock
        steps = timings.get("steps", [])
        print(f"one volume, one core: {field + dynamics + counting:.2f} s = initial field {field:.2f} + "
              f"2LPT {timings['lpt']:.2f}" +
              (f" + PM linear response {timings['linear_response']:.2f} + {len(steps)} steps "
               f"{sum(steps):.2f} ({1e3 * np.median(steps):.0f} ms a step, median)" if steps else "") +
              f" + counts {counting:.2f}")

    # throughput: one process per worker, as the generator runs
    tasks = [(0, index, grid, settings.box_size_mpc_h, settings) for index in range(volumes)]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(mock.seeded_universe, tasks[:workers]))   # start-up and imports, not timed
        clock = time.perf_counter()
        list(pool.map(mock.seeded_universe, tasks))
        wall = time.perf_counter() - clock
    rate = volumes / wall
    print(f"{volumes} volumes on {workers} process(es): {wall:.1f} s, {rate:.3f} volumes/s; "
          f"{total} volumes: {total / rate / 60:.1f} min")
    return 0


if __name__ == "__main__":
    exit_process(run_command(main, name="cosmoflow.mock_bench"))
