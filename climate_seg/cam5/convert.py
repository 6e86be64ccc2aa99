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

import h5py
import netCDF4
import numpy as np

from climate_seg.cam5.config import CHANNELS, CLASS_NAMES
from common.cli import exit_process, non_negative_int_argument, run_command
from common.errors import DataError
from common.storage.outputs import folder_summary, mark_hdf5, written_by_suite
from common.storage.sample_files import list_inputs
from common.storage.transaction import OutputTransaction, Producer

TOOL = "climate_seg.cam5.convert"

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


def write_sample(transaction: OutputTransaction, path: pathlib.Path, data: np.ndarray, labels: np.ndarray) -> None:
    """One training sample, contiguous datasets, staged in the conversion's transaction."""
    with transaction.path(path) as temporary, h5py.File(temporary, "w") as f:
        mark_hdf5(f, TOOL)
        f.create_dataset("climate/data", data=data.astype(np.float32))
        f.create_dataset("climate/labels_0", data=labels.astype(np.int32))
        f["climate"].attrs["channels"] = ",".join(CHANNELS)


def convert_file(transaction: OutputTransaction, path: str, out_dir: pathlib.Path, labels_path: str | None,
                 labels_var: str, member: int = 1, grid: tuple[int, int] | None = None) -> list[pathlib.Path]:
    """Convert one netCDF file, its samples staged in ``transaction``; the samples' paths."""
    with _open_netcdf(path) as nc:
        shape = _grid_of(nc, path)
        if grid is not None and shape[1:] != grid:
            raise DataError(f"{path}: fields on a {shape[1]} x {shape[2]} grid, but the first input is on "
                            f"{grid[0]} x {grid[1]}")
        if labels_path is None and labels_var not in nc.variables:
            raise DataError(f"{path}: no label variable {labels_var!r}; pass --labels FILE or --labels-var NAME")
        labels = read_labels(labels_path or path, labels_var, shape, path)
        names = _step_names(nc, path, shape[0], member)
        written = []
        with transaction.reading(path):
            for t, (name, mask) in enumerate(zip(names, labels)):
                data = np.stack([v[0] for v in read_steps(nc, CHANNELS, t, t + 1, path)], axis=-1)
                target = (out_dir / f"{name}.h5").absolute()
                write_sample(transaction, target, data, mask)
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
    """Convert netCDF files (with one labels file per input, or labels inside them) into ``out_dir``, as one
    output transaction: every sample staged, all of them in place at the end or none (a bad input, a failure or
    a signal leaves ``out_dir`` as it was).

    Without ``force``, ``out_dir`` must be absent, empty or hold only samples the suite wrote, and no
    file the suite did not write is replaced."""
    # The one listing (common/storage/sample_files.py): files, or folders of them; a dangling link or a folder
    # named like a file refused, never skipped
    given = [pathlib.Path(path) for path in inputs if pathlib.Path(path).is_dir()]   # folders of inputs: read whole
    inputs = list_inputs(inputs, ("*.nc", "*.nc4"), "CAM5 netCDF", "--input")
    labels = list_inputs(labels, ("*.nc", "*.nc4", "*.h5"), "label", "--labels") if labels else labels
    if labels and len(labels) != len(inputs):
        raise DataError(f"--labels: {len(labels)} label file(s) for {len(inputs)} input(s); give one per input")
    out_dir = pathlib.Path(out_dir)
    check_output_folder(out_dir, force)
    grid = None
    seen: dict[str, str] = {}
    for path in inputs:   # every name first: a step named twice is refused before anything is written
        with _open_netcdf(path) as nc:
            shape = _grid_of(nc, path)
            names = _step_names(nc, path, shape[0], member)
        for name in names:
            if name in seen:
                raise DataError(f"{path}: time step {name} was already converted from {seen[name]} "
                                "(give each ensemble member its own --member)")
            seen[name] = path
    targets = [(out_dir / f"{name}.h5").absolute() for name in seen]
    transaction = OutputTransaction(Producer(TOOL, "climate_seg"), force, inputs=[*inputs, *(labels or []), *given])
    transaction.plan(targets)
    transaction.check(targets)
    written: list[pathlib.Path] = []
    with transaction:
        for i, path in enumerate(inputs):
            with _open_netcdf(path) as nc:
                shape = _grid_of(nc, path)
            grid = grid or shape[1:]
            written += convert_file(transaction, path, out_dir, labels[i] if labels else None, labels_var, member,
                                    grid)
    return written


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m climate_seg.cam5.convert", description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", nargs="+", required=True, help="CAM5 netCDF files (*.nc), or folders of them")
    parser.add_argument("--out", required=True, help="output directory for the HDF5 samples")
    parser.add_argument("--labels", nargs="+", help="label files (netCDF or HDF5), one per input")
    parser.add_argument("--labels-var", default=DEFAULT_LABELS_VAR, help="name of the label variable")
    parser.add_argument("--member", type=non_negative_int_argument, default=1,
                        help="ensemble member number in the file names")
    parser.add_argument("--force", action="store_true",
                        help="write into a folder holding other files, replacing same-named ones")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    written = convert(args.input, args.out, args.labels, args.labels_var, args.member, args.force)
    print(f"wrote {len(written)} sample(s) to {args.out}")
    return 0


def field_grid(path: str) -> tuple[int, int, int]:
    """(time steps, lat, lon) of a CAM5 netCDF file holding all 16 variables on one (time, lat, lon) grid; a
    one-line DataError naming the file and the variable otherwise (what convert checks; predict too)."""
    with _open_netcdf(path) as nc:
        return _grid_of(nc, path)


if __name__ == "__main__":
    exit_process(run_command(main, name=TOOL))
