"""CAM5-like synthetic climate fields with planted tropical cyclones and atmospheric rivers.

    python -m climate_seg.cam5.synth --out DIR [--grid 192 288] [--n-train 96] [--seed 2018]

Writes netCDF files ``DIR/{train,validation,test}/cam5-synth-<split>-NNNN.nc``
in the layout of CAM5 output (dims ``time, lat, lon``; the 16 variables of
:data:`climate_seg.cam5.config.CHANNELS` in CAM5 units; a CF ``time`` axis, 3-hourly,
``noleap`` calendar) with a ``LABELS`` variable (0 background, 1 tropical
cyclone, 2 atmospheric river) taken from the planted features, so the netCDF
-> HDF5 converter runs on them exactly as on real output.

The background climate has the right zonal structure (warm moist tropics,
mid-latitude jets, subtropical highs) plus smooth random weather.  Features:

- tropical cyclone: a warm-core low (Gaussian pressure drop of 20-60 hPa),
  a cyclonic vortex in the winds (counter-clockwise north of the equator),
  moisture and precipitation peaks; labelled within its pressure radius;
- atmospheric river: a long (50-80 deg) narrow (2-3 deg) moisture filament
  running poleward-east from the subtropics, with along-stream wind;
  labelled where its moisture excess exceeds a quarter of its peak (as the
  TMQ-threshold detectors do).

Class frequencies with the defaults: about 97% background, 1% cyclone, 2%
river (real data: 98.6 / 0.05 / 1.3; the cyclones are made larger so a
small demo can learn them).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import h5py
import netCDF4
import numpy as np

from climate_seg.cam5.config import CHANNELS, SynthSection
from climate_seg.detection.config import BOX_COLUMNS, FILE_BOX_COLUMNS
from common.cli import exit_process, non_negative_int_argument, positive_int_argument, run_command
from common.config import validate
from common.console.progress import Progress
from common.storage.outputs import atomic_path, mark_hdf5
from common.storage.generated import generated_folder

UNITS = {"TMQ": "kg/m2", "U850": "m/s", "V850": "m/s", "UBOT": "m/s", "VBOT": "m/s", "QREFHT": "kg/kg",
         "PS": "Pa", "PSL": "Pa", "T200": "K", "T500": "K", "PRECT": "m/s", "TS": "K", "TREFHT": "K",
         "Z1000": "m", "Z200": "m", "ZBOT": "m"}
LABELS_VAR = "LABELS"
TIME_UNITS = "hours since 2106-01-01 00:00:00"
# Each split starts at its own date so converted file names never collide.
SPLIT_START_DAYS = {"train": 0, "validation": 200, "test": 300}


def grid_coordinates(nlat: int, nlon: int) -> tuple[np.ndarray, np.ndarray]:
    """Cell-centre latitudes (south to north) and longitudes (0 to 360), degrees."""
    dlat = 180.0 / nlat
    lat = np.linspace(-90 + dlat / 2, 90 - dlat / 2, nlat)
    lon = np.arange(nlon) * 360.0 / nlon
    return lat, lon


def smooth_noise(rng: np.random.Generator, shape: tuple[int, int], scale_deg: float) -> np.ndarray:
    """Unit-variance random field smoothed over about ``scale_deg`` (periodic in longitude)."""
    nlat, nlon = shape
    white = rng.standard_normal(shape)
    ky = np.fft.fftfreq(nlat, d=180.0 / nlat)[:, None]
    kx = np.fft.rfftfreq(nlon, d=360.0 / nlon)[None, :]
    field = np.fft.irfft2(np.fft.rfft2(white) * np.exp(-2 * (np.pi * scale_deg) ** 2 * (kx ** 2 + ky ** 2)),
                          s=shape)
    return field / max(field.std(), 1e-12)


def background(rng: np.random.Generator, lat: np.ndarray, lon: np.ndarray) -> dict[str, np.ndarray]:
    """A zonally structured climate with smooth random weather on top."""
    shape = (len(lat), len(lon))
    la = np.broadcast_to(lat[:, None], shape)
    s2 = np.sin(np.radians(la)) ** 2
    n = [smooth_noise(rng, shape, scale) for scale in (6.0, 10.0, 15.0, 8.0)]
    ts = 300.0 - 45.0 * s2 + 2.0 * n[0]
    psl = (101300.0 + 700.0 * np.exp(-((np.abs(la) - 30) / 10) ** 2) - 1200.0 * np.exp(-((np.abs(la) - 60) / 10) ** 2)
           + 600.0 * n[2])
    tmq = 6.0 + 42.0 * np.exp(-(la / 28.0) ** 2) + 4.0 * n[1]
    u850 = 14.0 * np.exp(-((np.abs(la) - 45) / 12) ** 2) - 6.0 * np.exp(-(la / 12) ** 2) + 3.0 * n[3]
    v850 = 3.0 * smooth_noise(rng, shape, 8.0)
    fields = {
        "TMQ": np.maximum(tmq, 0.5),
        "U850": u850,
        "V850": v850,
        "UBOT": 0.7 * u850 + 0.5 * n[0],
        "VBOT": 0.7 * v850,
        "QREFHT": np.maximum(0.002 + 0.016 * np.exp(-(la / 30.0) ** 2) + 0.001 * n[1], 1e-4),
        "PS": psl - 250.0 - 400.0 * np.abs(n[2]) * (np.abs(la) < 70),
        "PSL": psl,
        "T200": 218.0 + 6.0 * s2 + 1.0 * n[3],
        "T500": 268.0 - 25.0 * s2 + 1.5 * n[0],
        "PRECT": 2e-8 * np.log1p(np.exp(0.15 * (tmq - 30.0))) * (1.0 + 0.3 * n[1] ** 2),
        "TS": ts,
        "TREFHT": ts - 1.5 + 0.5 * n[3],
        "Z1000": 0.08 * (psl - 100000.0),
        "Z200": 11800.0 - 1200.0 * s2 + 40.0 * n[3],
        "ZBOT": 60.0 + 0.5 * (ts - 290.0),
    }
    return fields


def _offsets(lat: np.ndarray, lon: np.ndarray, lat0: float, lon0: float) -> tuple[np.ndarray, np.ndarray]:
    """(east, north) offsets in degrees of latitude from (lat0, lon0), periodic in longitude."""
    dlon = (lon[None, :] - lon0 + 180.0) % 360.0 - 180.0
    east = dlon * np.cos(np.radians(lat0))
    north = lat[:, None] - lat0
    return np.broadcast_to(east, (len(lat), len(lon))), np.broadcast_to(north, (len(lat), len(lon)))


def plant_cyclone(rng: np.random.Generator, fields: dict, labels: np.ndarray, lat: np.ndarray,
                  lon: np.ndarray) -> np.ndarray:
    """A tropical cyclone (label 1); returns its mask."""
    hemisphere = rng.choice((-1.0, 1.0))
    lat0, lon0 = hemisphere * rng.uniform(8.0, 25.0), rng.uniform(0.0, 360.0)
    radius = rng.uniform(4.0, 6.5)                 # degrees: the pressure e-folding radius
    depth = rng.uniform(2000.0, 6000.0)            # Pa
    vmax = 25.0 + 30.0 * (depth - 2000.0) / 4000.0  # m/s, stronger lows spin faster
    mask = vortex(fields, lat, lon, lat0, lon0, radius, depth, vmax, hemisphere, warm_core=True)
    labels[mask] = 1
    return mask


def vortex(fields: dict, lat: np.ndarray, lon: np.ndarray, lat0: float, lon0: float, radius: float, depth: float,
           vmax: float, hemisphere: float, warm_core: bool, moisture: float = 20.0) -> np.ndarray:
    """A low of ``depth`` Pa and e-folding ``radius`` degrees with a cyclonic vortex; its mask (r < radius)."""
    east, north = _offsets(lat, lon, lat0, lon0)
    r = np.hypot(east, north)
    core = np.exp(-(r / radius) ** 2)
    rm = 0.45 * radius
    speed = vmax * (r / rm) * np.exp(0.5 * (1.0 - (r / rm) ** 2))
    with np.errstate(invalid="ignore", divide="ignore"):
        u = np.where(r > 0, -speed * north / r, 0.0) * hemisphere   # counter-clockwise in the north
        v = np.where(r > 0, speed * east / r, 0.0) * hemisphere
    fields["PSL"] -= depth * core
    fields["PS"] -= depth * core
    fields["Z1000"] -= 0.08 * depth * core
    fields["UBOT"] += u
    fields["VBOT"] += v
    fields["U850"] += 0.85 * u
    fields["V850"] += 0.85 * v
    if warm_core:
        warm = np.exp(-(r / (0.6 * radius)) ** 2) * depth / 4000.0
        fields["T500"] += 4.0 * warm
        fields["T200"] += 2.0 * warm
        fields["Z200"] += 60.0 * warm
        fields["TS"] += 0.5 * warm
        fields["PRECT"] += 4e-7 * np.exp(-(r / (0.5 * radius)) ** 2) * min(1.0, depth / 2000.0)
    else:
        # Cold core with a frontal contrast: the western half of the storm is colder.
        cold = core * (east < 0)
        fields["T500"] -= 4.0 * core
        fields["TS"] -= 6.0 * cold
        fields["TREFHT"] -= 6.0 * cold
        fields["PRECT"] += 2e-7 * core * (east > 0)
    fields["TMQ"] += moisture * core
    fields["QREFHT"] += 0.004 * core * moisture / 20.0
    return r < radius


def plant_depression(rng: np.random.Generator, fields: dict, lat: np.ndarray, lon: np.ndarray,
                     lon_range=(0.0, 360.0)) -> np.ndarray:
    """A tropical depression: a weak, small warm-core low."""
    hemisphere = rng.choice((-1.0, 1.0))
    lat0, lon0 = hemisphere * rng.uniform(5.0, 20.0), rng.uniform(*lon_range)
    return vortex(fields, lat, lon, lat0, lon0, rng.uniform(3.0, 4.5), rng.uniform(500.0, 1200.0),
                  rng.uniform(10.0, 17.0), hemisphere, warm_core=True, moisture=8.0)


def plant_extratropical(rng: np.random.Generator, fields: dict, lat: np.ndarray, lon: np.ndarray,
                        lon_range=(0.0, 360.0)) -> np.ndarray:
    """An extratropical cyclone: a broad mid-latitude cold-core low with a front."""
    hemisphere = rng.choice((-1.0, 1.0))
    lat0, lon0 = hemisphere * rng.uniform(38.0, 60.0), rng.uniform(*lon_range)
    return vortex(fields, lat, lon, lat0, lon0, rng.uniform(8.0, 12.0), rng.uniform(1500.0, 3500.0),
                  rng.uniform(15.0, 25.0), hemisphere, warm_core=False, moisture=6.0)


def plant_river(rng: np.random.Generator, fields: dict, labels: np.ndarray, lat: np.ndarray,
                lon: np.ndarray, lon_range=(0.0, 360.0)) -> np.ndarray:
    """An atmospheric river (label 2 where no cyclone is); returns its whole mask."""
    hemisphere = rng.choice((-1.0, 1.0))
    lat0, lon0 = hemisphere * rng.uniform(12.0, 25.0), rng.uniform(*lon_range)
    length_lon, rise = rng.uniform(50.0, 80.0), rng.uniform(18.0, 30.0)
    bend = rng.uniform(-6.0, 6.0)
    width = rng.uniform(2.0, 3.0)                  # degrees, Gaussian half-width of the filament
    amplitude = rng.uniform(16.0, 26.0)            # kg/m2 of extra precipitable water
    s = np.linspace(0.0, 1.0, 240)
    path_lat = lat0 + hemisphere * (rise * s + bend * np.sin(np.pi * s))
    path_lon = lon0 + length_lon * s
    # Distance to the path, computed in a box around it only.
    near_lat = (lat > path_lat.min() - 4 * width) & (lat < path_lat.max() + 4 * width)
    dist = np.full((len(lat), len(lon)), np.inf)
    rows = np.nonzero(near_lat)[0]
    tangent = np.zeros((len(lat), len(lon), 2))
    direction = np.stack([np.gradient(path_lon) * np.cos(np.radians(path_lat)), np.gradient(path_lat)], axis=-1)
    direction /= np.linalg.norm(direction, axis=-1, keepdims=True)
    for j in range(len(s)):
        de, dn = _offsets(lat[rows], lon, path_lat[j], path_lon[j] % 360.0)
        d = np.hypot(de, dn)
        closer = d < dist[rows]
        dist[rows] = np.where(closer, d, dist[rows])
        tangent[rows] = np.where(closer[..., None], direction[j], tangent[rows])
    profile = np.exp(-(dist / width) ** 2)
    fields["TMQ"] += amplitude * profile
    fields["QREFHT"] += 0.003 * profile
    fields["PRECT"] += 1.5e-7 * profile * (amplitude / 20.0)
    fields["U850"] += 12.0 * profile * tangent[..., 0]
    fields["V850"] += 12.0 * profile * tangent[..., 1]
    fields["UBOT"] += 7.0 * profile * tangent[..., 0]
    fields["VBOT"] += 7.0 * profile * tangent[..., 1]
    river = amplitude * profile > 0.25 * amplitude
    labels[river & (labels != 1)] = 2
    return river


def sample(rng: np.random.Generator, lat: np.ndarray, lon: np.ndarray,
           synth: SynthSection) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """One time step: (fields by name, labels)."""
    fields = background(rng, lat, lon)
    labels = np.zeros((len(lat), len(lon)), np.int8)
    for _ in range(rng.integers(synth.rivers_per_step[0], synth.rivers_per_step[1] + 1)):
        plant_river(rng, fields, labels, lat, lon)
    # Cyclones last: they take precedence over rivers where they overlap.
    for _ in range(rng.integers(synth.cyclones_per_step[0], synth.cyclones_per_step[1] + 1)):
        plant_cyclone(rng, fields, labels, lat, lon)
    return fields, labels


def write_netcdf(path: pathlib.Path, lat: np.ndarray, lon: np.ndarray, times_h: np.ndarray,
                 steps: list[tuple[dict[str, np.ndarray], np.ndarray]], labels_var: str | None = LABELS_VAR) -> None:
    """A CAM5-style netCDF file: (time, lat, lon) variables, CF time; written atomically."""
    with atomic_path(path) as temporary, netCDF4.Dataset(temporary, "w", format="NETCDF4") as nc:
        mark_hdf5(nc, "climate_seg.cam5.synth")
        nc.createDimension("time", None)
        nc.createDimension("lat", len(lat))
        nc.createDimension("lon", len(lon))
        nc.source = "climate_seg.cam5.synth: CAM5-like synthetic fields with planted extreme-weather features"
        t = nc.createVariable("time", "f8", ("time",))
        t.units, t.calendar = TIME_UNITS, "noleap"
        t[:] = times_h
        la = nc.createVariable("lat", "f8", ("lat",))
        la.units = "degrees_north"
        la[:] = lat
        lo = nc.createVariable("lon", "f8", ("lon",))
        lo.units = "degrees_east"
        lo[:] = lon
        for name in CHANNELS:
            var = nc.createVariable(name, "f4", ("time", "lat", "lon"))
            var.units = UNITS[name]
            var[:] = np.stack([fields[name] for fields, _ in steps]).astype(np.float32)
        if labels_var:
            var = nc.createVariable(labels_var, "i1", ("time", "lat", "lon"))
            var.flag_values = np.array([0, 1, 2], np.int8)
            var.flag_meanings = "background tropical_cyclone atmospheric_river"
            var[:] = np.stack([labels for _, labels in steps])


def generate_dataset(out_dir, synth: SynthSection, progress: bool = True) -> dict[str, list[pathlib.Path]]:
    """Write the train/validation/test netCDF files into an absent or empty ``out_dir`` (or the empty folder it
    links to: :func:`common.storage.generated.generated_folder`); returns them by split."""
    out_dir = pathlib.Path(out_dir)
    lat, lon = grid_coordinates(*synth.grid)
    counts = {"train": synth.n_train, "validation": synth.n_validation, "test": synth.n_test}
    names: dict[str, list[str]] = {}
    with generated_folder(out_dir, "synthetic CAM5 netCDF (train/, validation/, test/)") as work, \
            Progress(sum(counts.values()), "synthetic CAM5 steps", "steps", enabled=progress) as bar:
        for split_index, (split, count) in enumerate(counts.items()):
            rng = np.random.default_rng([synth.seed, split_index])
            (work / split).mkdir()
            names[split] = []
            for file_index, first in enumerate(range(0, count, synth.steps_per_file)):
                steps = []
                for _ in range(first, min(count, first + synth.steps_per_file)):
                    steps.append(sample(rng, lat, lon, synth))
                    bar.update()
                times = SPLIT_START_DAYS[split] * 24.0 + 3.0 * np.arange(first, first + len(steps))
                names[split].append(f"cam5-synth-{split}-{file_index:04d}.nc")
                write_netcdf(work / split / names[split][-1], lat, lon, times, steps)
    return {split: [out_dir / split / name for name in files] for split, files in names.items()}


def build_parser() -> argparse.ArgumentParser:
    defaults = SynthSection()
    parser = argparse.ArgumentParser(prog="python -m climate_seg.cam5.synth", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--grid", type=positive_int_argument, nargs=2, default=list(defaults.grid),
                        metavar=("NLAT", "NLON"))
    parser.add_argument("--n-train", type=positive_int_argument, default=defaults.n_train)
    parser.add_argument("--n-validation", type=positive_int_argument, default=defaults.n_validation)
    parser.add_argument("--n-test", type=positive_int_argument, default=defaults.n_test)
    parser.add_argument("--steps-per-file", type=positive_int_argument, default=defaults.steps_per_file)
    parser.add_argument("--seed", type=non_negative_int_argument, default=defaults.seed)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)

    # The options are the section's keys (--n-train is n_train): a value the schema refuses is named by its key.
    synth = validate(SynthSection, {"grid": args.grid, "n_train": args.n_train, "n_validation": args.n_validation,
                                    "n_test": args.n_test, "steps_per_file": args.steps_per_file,
                                    "seed": args.seed}, "the command line")
    written = generate_dataset(args.out, synth, progress=sys.stderr.isatty())
    for split, paths in written.items():
        print(f"{split}: {len(paths)} netCDF file(s) in {pathlib.Path(args.out) / split}")
    return 0


if __name__ == "__main__":
    exit_process(run_command(main, name="climate_seg.cam5.synth"))


# -- detection snapshots (four classes, ExtremeWeather layout) ------------------------------------

MAX_BOXES = 15


def _box_of(mask: np.ndarray, cls: int) -> list[float] | None:
    """[ymin, xmin, ymax, xmax, class] around a mask, in pixels (None if it left the grid)."""
    rows, cols = np.nonzero(mask.any(axis=1))[0], np.nonzero(mask.any(axis=0))[0]
    if not rows.size:
        return None
    return [float(rows[0]), float(cols[0]), float(rows[-1] + 1), float(cols[-1] + 1), float(cls)]


def detection_sample(rng: np.random.Generator, lat: np.ndarray, lon: np.ndarray) -> tuple[dict, np.ndarray]:
    """One snapshot with 1-6 events of the four classes: (fields by name, (15, 5) boxes padded with -1).

    Classes (ExtremeWeather): 0 tropical depression, 1 tropical cyclone, 2
    extratropical cyclone, 3 atmospheric river.  Features are kept away from
    the longitude seam so every box is one rectangle.
    """
    fields = background(rng, lat, lon)
    labels = np.zeros((len(lat), len(lon)), np.int8)
    boxes = []
    counts = rng.multinomial(rng.integers(1, 7), [0.25] * 4)
    for _ in range(counts[3]):
        boxes.append(_box_of(plant_river(rng, fields, labels, lat, lon, lon_range=(10.0, 270.0)), 3))
    for _ in range(counts[2]):
        boxes.append(_box_of(plant_extratropical(rng, fields, lat, lon, lon_range=(20.0, 340.0)), 2))
    for _ in range(counts[1]):
        hemisphere = rng.choice((-1.0, 1.0))
        lat0, lon0 = hemisphere * rng.uniform(8.0, 25.0), rng.uniform(15.0, 345.0)
        depth = rng.uniform(2000.0, 6000.0)
        mask = vortex(fields, lat, lon, lat0, lon0, rng.uniform(4.0, 6.5), depth,
                      25.0 + 30.0 * (depth - 2000.0) / 4000.0, hemisphere, warm_core=True)
        boxes.append(_box_of(mask, 1))
    for _ in range(counts[0]):
        boxes.append(_box_of(plant_depression(rng, fields, lat, lon, lon_range=(10.0, 350.0)), 0))
    padded = np.full((MAX_BOXES, 5), -1.0, np.float32)
    kept = [b for b in boxes if b is not None][:MAX_BOXES]
    if kept:
        padded[:len(kept)] = kept
    return fields, padded


def write_extremeweather(path, images: np.ndarray, boxes: np.ndarray, labeled: np.ndarray | None = None) -> None:
    """An ExtremeWeather-layout file: ``images`` (N, 16, H, W) in alphabetical channel order, ``boxes``
    (N, 15, 5) padded with -1, ``labeled`` (N,); written atomically.  ``boxes`` come as [ymin, xmin, ymax,
    xmax, class] and are stored in the ExtremeWeather writer's column order [row min, row max, column min,
    column max, class]."""
    stored = np.asarray(boxes, np.float32)[..., [BOX_COLUMNS.index(name) for name in FILE_BOX_COLUMNS]]
    with atomic_path(pathlib.Path(path)) as temporary, h5py.File(temporary, "w") as f:
        mark_hdf5(f, "climate_seg.cam5.synth")
        f.create_dataset("images", data=images.astype(np.float32))
        f.create_dataset("boxes", data=stored)
        if labeled is not None:
            f.create_dataset("labeled", data=labeled.astype(np.int8))
        f.attrs["channels"] = ",".join(sorted(CHANNELS))


def generate_detection_dataset(out_dir, synth, progress: bool = True) -> dict[str, list[pathlib.Path]]:
    """Train/validation/test files of snapshots with boxes, into an absent or empty ``out_dir``; every
    ``unlabeled_every``-th training snapshot is written unlabeled (no boxes, ``labeled`` 0)."""
    out_dir = pathlib.Path(out_dir)
    lat, lon = grid_coordinates(*synth.grid)
    names = sorted(CHANNELS)
    counts = {"train": synth.n_train, "validation": synth.n_validation, "test": synth.n_test}
    files: dict[str, list[str]] = {}
    with generated_folder(out_dir, "ExtremeWeather-layout snapshots (train/, validation/, test/)") as work, \
            Progress(sum(counts.values()), "synthetic detection snapshots", "snapshots", enabled=progress) as bar:
        for split_index, (split, count) in enumerate(counts.items()):
            rng = np.random.default_rng([synth.seed, 100 + split_index])
            (work / split).mkdir()
            files[split] = []
            for file_index, first in enumerate(range(0, count, synth.samples_per_file)):
                n = min(synth.samples_per_file, count - first)
                images = np.empty((n, len(names), *synth.grid), np.float32)
                boxes = np.empty((n, MAX_BOXES, 5), np.float32)
                labeled = np.ones(n, np.int8)
                for k in range(n):
                    fields, boxes[k] = detection_sample(rng, lat, lon)
                    images[k] = np.stack([fields[name] for name in names])
                    if split == "train" and synth.unlabeled_every and (first + k) % synth.unlabeled_every == 1:
                        labeled[k] = 0
                        boxes[k] = -1.0
                    bar.update()
                files[split].append(f"extremeweather-synth-{split}-{file_index:03d}.h5")
                write_extremeweather(work / split / files[split][-1], images, boxes, labeled)
    return {split: [out_dir / split / name for name in listed] for split, listed in files.items()}
