"""CAM5 netCDF output -> one training HDF5 sample per time step.

    python -m climate_seg.cam5.convert --input F.nc [F2.nc ...] --out DIR
                                  [--labels L.nc [L2.nc ...]] [--labels-var LABELS]

Each input file holds the 16 CAM5 variables (TMQ, U850, ..., ZBOT) on dims
``(time, lat, lon)``.  Label masks (0 background, 1 tropical cyclone, 2
atmospheric river) come from the variable ``--labels-var`` of the input file,
or of one ``--labels`` file per input (netCDF or HDF5, ``(time, lat, lon)`` or
``(lat, lon)`` for a single step).  Every time step becomes
``DIR/data-YYYY-MM-DD-HH-<member>.h5`` (the date from the file's CF time axis;
``<stem>-tNNNN`` without one) holding ``climate/data`` float32 (lat, lon, 16)
in the channel order of :data:`climate_seg.cam5.config.CHANNELS` and
``climate/labels_0`` int32 (lat, lon), stored contiguously so the training
pipeline can read them without HDF5 (see :mod:`climate_seg.segmentation.data`).

A missing variable, a variable on another grid, labels of the wrong shape or
with values outside {0, 1, 2}, or NaN, Inf or fill values are one-line errors
naming the file and the variable; nothing is written for a file that fails.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import h5py
import netCDF4
import numpy as np

from climate_seg.cam5.config import CHANNELS, CLASS_NAMES
from common.cli import exit_on_user_error
from common.errors import DataError
from common.storage.outputs import atomic_path, check_replaceable, folder_summary, mark_hdf5, written_by_suite

DEFAULT_LABELS_VAR = "LABELS"


def _open_netcdf(path: str) -> netCDF4.Dataset:
    try:
        nc = netCDF4.Dataset(path, "r")
    except (OSError, RuntimeError) as exc:
        raise DataError(f"{path}: not a readable netCDF file ({exc})") from None
    nc.set_auto_mask(False)
    return nc


def check_axes(variable, path) -> None:
    """A one-line DataError unless ``variable`` lies on (time, lat, lon) in that order, told by its dimensions'
    names: the same sizes in (time, lon, lat) would be read as transposed images, silently."""
    dims = tuple(variable.dimensions)
    if len(dims) != 3 or "lat" not in dims[1].lower() or "lon" not in dims[2].lower():
        raise DataError(f"{path}: variable {variable.name} has dims {dims}, expected (time, lat, lon) in that order")


def read_steps(nc: netCDF4.Dataset, names, start: int, stop: int, path) -> list[np.ndarray]:
    """Variables ``names`` at time steps ``start`` .. ``stop`` - 1, one float32 (time, lat, lon) array each; a
    one-line DataError naming the file, the variables and the first step holding NaN, Inf or fill values.

    Read through netCDF4's mask whatever the dataset's setting (restored after): with it off, a finite
    ``_FillValue`` or ``missing_value`` reads as a number and would be trained on or predicted from as if it
    were a field value.  Convert and both tasks' predict read CAM5 fields through it."""
    values, bad = [], []
    for name in names:
        variable = nc.variables[name]
        masked = variable.mask
        variable.set_auto_mask(True)
        try:
            value = variable[start:stop]
        finally:
            variable.set_auto_mask(masked)
        data = np.asarray(np.ma.getdata(value), np.float32)
        bad.append(np.any(np.ma.getmaskarray(value) | ~np.isfinite(data), axis=(1, 2)))
        values.append(data)
    bad_steps = np.flatnonzero(np.any(bad, axis=0))
    if len(bad_steps):
        step = int(bad_steps[0])
        found = [name for name, flags in zip(names, bad) if flags[step]]
        raise DataError(f"{path}: NaN, Inf or fill values in {', '.join(found)} at time step {start + step}")
    return values


def _grid_of(nc: netCDF4.Dataset, path: str) -> tuple[int, int, int]:
    """(time steps, lat, lon) after checking all 16 variables are there on one grid."""
    missing = [name for name in CHANNELS if name not in nc.variables]
    if missing:
        raise DataError(f"{path}: missing variable(s) {', '.join(missing)} (need all 16 CAM5 variables "
                        f"{', '.join(CHANNELS)})")
    shape = None
    for name in CHANNELS:
        var = nc.variables[name]
        check_axes(var, path)
        if shape is None:
            shape, first = tuple(var.shape), name
        elif tuple(var.shape) != shape:
            raise DataError(f"{path}: variable {name} has shape {tuple(var.shape)}, but {first} has {shape} "
                            "(all variables must share one time x lat x lon grid)")
    return shape


def _step_names(nc: netCDF4.Dataset, path: str, steps: int, member: int) -> list[str]:
    """``data-YYYY-MM-DD-HH-<member>`` from a CF time axis, else ``<stem>-tNNNN``."""
    time = nc.variables.get("time")
    dates = None
    if time is not None and getattr(time, "units", None) and len(time) == steps:
        try:
            dates = netCDF4.num2date(time[:], time.units, getattr(time, "calendar", "standard"))
        except (ValueError, TypeError):
            dates = None   # units that are not CF dates: name the steps by index
    if dates is not None:
        return [f"data-{d.year:04d}-{d.month:02d}-{d.day:02d}-{d.hour:02d}-{member}" for d in dates]
    stem = pathlib.Path(path).stem
    return [f"{stem}-t{i:04d}" for i in range(steps)]


def read_labels(path: str, variable: str, shape: tuple[int, int, int], data_path: str) -> np.ndarray:
    """Label masks (time, lat, lon) int32 from a netCDF or HDF5 file, checked against ``shape``."""
    # netCDF-4 variables are HDF5 datasets of the same name: h5py reads any HDF5 file, netCDF4 the classic formats.
    if h5py.is_hdf5(path):
        with h5py.File(path, "r") as f:
            if variable not in f:
                raise DataError(f"{path}: no label variable {variable!r} (--labels-var)")
            labels = np.asarray(f[variable][()])
    else:
        with _open_netcdf(path) as nc:
            if variable not in nc.variables:
                raise DataError(f"{path}: no label variable {variable!r} (--labels-var)")
            labels = np.asarray(nc.variables[variable][:])
    if labels.ndim == 2:
        labels = labels[None]
    if labels.shape != shape:
        raise DataError(f"{path}: label variable {variable} has shape {labels.shape}, but {data_path} holds "
                        f"fields of shape {shape} (time, lat, lon)")
    if not np.all(np.isin(labels, np.arange(len(CLASS_NAMES)))):
        bad = sorted(set(np.unique(labels).tolist()) - set(range(len(CLASS_NAMES))))[:5]
        raise DataError(f"{path}: label variable {variable} holds values {bad} outside 0-{len(CLASS_NAMES) - 1} "
                        f"({', '.join(CLASS_NAMES)})")
    return labels.astype(np.int32)


def write_sample(path: pathlib.Path, data: np.ndarray, labels: np.ndarray, force: bool = False) -> None:
    """One training sample, contiguous datasets, written atomically (never over a file the suite did not write)."""
    with atomic_path(path, force) as temporary, h5py.File(temporary, "w") as f:
        mark_hdf5(f, "climate_seg.cam5.convert")
        f.create_dataset("climate/data", data=data.astype(np.float32))
        f.create_dataset("climate/labels_0", data=labels.astype(np.int32))
        f["climate"].attrs["channels"] = ",".join(CHANNELS)


def convert_file(path: str, out_dir: pathlib.Path, labels_path: str | None, labels_var: str,
                 member: int = 1, grid: tuple[int, int] | None = None, force: bool = False) -> list[pathlib.Path]:
    """Convert one netCDF file; returns the samples written (none if the file fails a check)."""
    with _open_netcdf(path) as nc:
        shape = _grid_of(nc, path)
        if grid is not None and shape[1:] != grid:
            raise DataError(f"{path}: fields on a {shape[1]} x {shape[2]} grid, but the first input is on "
                            f"{grid[0]} x {grid[1]}")
        if labels_path is None and labels_var not in nc.variables:
            raise DataError(f"{path}: no label variable {labels_var!r}; pass --labels FILE or --labels-var NAME")
        labels = read_labels(labels_path or path, labels_var, shape, path)
        names = _step_names(nc, path, shape[0], member)
        for name in names:
            check_replaceable(out_dir / f"{name}.h5", force)
        # Check every step before writing any, so a bad file leaves nothing behind.
        steps = []
        for t in range(shape[0]):
            steps.append(np.stack([v[0] for v in read_steps(nc, CHANNELS, t, t + 1, path)], axis=-1))
    written = []
    for name, data, mask in zip(names, steps, labels):
        target = out_dir / f"{name}.h5"
        write_sample(target, data, mask, force)
        written.append(target)
    return written


def check_output_folder(out_dir: pathlib.Path, force: bool) -> None:
    """``out_dir`` must be absent, empty, or hold only samples this suite wrote (adding to them is fine)."""
    if force or not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise DataError(f"{out_dir}: --out is a file, expected a folder for the converted samples")
    foreign = [p for p in out_dir.iterdir() if not written_by_suite(p)]
    if foreign:
        raise DataError(f"{out_dir}: expected an absent or empty folder, or one of samples this suite converted; "
                        f"found {len(foreign)} other file(s) ({folder_summary(out_dir)}); nothing was written "
                        "(choose another --out, or pass --force to write beside them)")


def convert(inputs: list[str], out_dir, labels: list[str] | None = None, labels_var: str = DEFAULT_LABELS_VAR,
            member: int = 1, force: bool = False) -> list[pathlib.Path]:
    """Convert netCDF files (with one labels file per input, or labels inside them) into ``out_dir``.

    Without ``force``, ``out_dir`` must be absent, empty or hold only samples the suite wrote, and no
    file the suite did not write is replaced."""
    if labels and len(labels) != len(inputs):
        raise DataError(f"--labels: {len(labels)} label file(s) for {len(inputs)} input(s); give one per input")
    out_dir = pathlib.Path(out_dir)
    check_output_folder(out_dir, force)
    out_dir.mkdir(parents=True, exist_ok=True)
    grid = None
    written: list[pathlib.Path] = []
    seen: dict[str, str] = {}
    for i, path in enumerate(inputs):
        with _open_netcdf(path) as nc:
            shape = _grid_of(nc, path)
            names = _step_names(nc, path, shape[0], member)
        for name in names:
            if name in seen:
                raise DataError(f"{path}: time step {name} was already converted from {seen[name]} "
                                "(give each ensemble member its own --member)")
            seen[name] = path
        grid = grid or shape[1:]
        written += convert_file(path, out_dir, labels[i] if labels else None, labels_var, member, grid, force)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m climate_seg.cam5.convert", description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", nargs="+", required=True, help="CAM5 netCDF files")
    parser.add_argument("--out", required=True, help="output directory for the HDF5 samples")
    parser.add_argument("--labels", nargs="+", help="label files (netCDF or HDF5), one per input")
    parser.add_argument("--labels-var", default=DEFAULT_LABELS_VAR, help="name of the label variable")
    parser.add_argument("--member", type=int, default=1, help="ensemble member number in the file names")
    parser.add_argument("--force", action="store_true",
                        help="write into a folder holding other files, replacing same-named ones")
    args = parser.parse_args(argv)
    with exit_on_user_error():
        written = convert(args.input, args.out, args.labels, args.labels_var, args.member, args.force)
    print(f"wrote {len(written)} sample(s) to {args.out}")
    return 0


def field_grid(path: str) -> tuple[int, int, int]:
    """(time steps, lat, lon) of a CAM5 netCDF file holding all 16 variables on one (time, lat, lon) grid; a
    one-line DataError naming the file and the variable otherwise (what convert checks; predict too)."""
    with _open_netcdf(path) as nc:
        return _grid_of(nc, path)


if __name__ == "__main__":
    sys.exit(main())
