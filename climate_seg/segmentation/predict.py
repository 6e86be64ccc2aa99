"""Apply a trained segmentation run to new CAM5 data: a class mask per input, on the input's own grid.

    python -m climate_seg.predict --run-dir RUN --input F.nc [F2.nc FOLDER ...] --out OUT [--probabilities]

Inputs: CAM5 netCDF files as the model wrote them (the 16 variables of :data:`climate_seg.cam5.config.CHANNELS`
on dims ``(time, lat, lon)``, any number of time steps, no labels needed), or the suite's HDF5 samples (DeepCAM
``climate/data`` H x W x 16, SC18 16 x H x W; their labels are not read).  Each input ``<stem>.<ext>`` becomes

- ``OUT/<stem>.mask.nc``: ``class_mask`` (time, lat, lon) byte, 0 background, 1 tropical cyclone, 2 atmospheric
  river (CF ``flag_values`` / ``flag_meanings``), on the input's own ``time``, ``lat``, ``lon`` coordinate
  variables with their attributes (an HDF5 sample has none: one time step, bare ``lat``/``lon`` dimensions);
  with ``--probabilities`` also ``probability_<class>`` (time, lat, lon) float32, units 1; global attributes
  ``Conventions``, ``written_by``, ``model_sha256``, ``config``, ``suite_version``, ``run_dir``, ``source``;
- ``OUT/<stem>.mask.png``: TMQ of the first time step with the predicted cyclones and rivers outlined.

How a field becomes a mask, step by step as the run was evaluated (:mod:`climate_seg.segmentation.evaluate`):
normalised per channel with the run's own statistics (``data.data_dir``/``data.stats_file`` of its config,
never the new data's), average-pooled by ``data.downsample``, cut into tiles of the network's input size
(``data.crop``, else ``data.grid / data.downsample``), run through the network in batches of ``data.batch_size``
(the last one filled up with copies of its last tile, so every call has the shape evaluate's had), the logits
of overlapping tiles stitched (each point from the tile whose centre is nearest), argmax.

``data.downsample`` k: the network predicts one class per k x k block of input points (training sampled each
block's label at its centre point, ``labels[k//2::k, k//2::k]``); the block's k x k points all get it.  So
``class_mask[..., k//2::k, k//2::k]`` is exactly the network's prediction, and the mask's resolution is k points.

Grids: the input's (lat, lon) points must divide by k; a grid larger than the network's input (after pooling) is
tiled with overlap (at least a quarter tile between neighbours; the networks are fully convolutional, but each
tile is the size they were trained on), one smaller in either direction is refused.  The grid's spacing in
degrees is not checked (a run's config does not record it): give the resolution the run was trained on.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import threading

import numpy as np

from climate_seg.cam5.config import CHANNELS, CLASS_NAMES
from climate_seg.segmentation.config import ClimateConfig
from common.application import Predictor
from common.deferred import DeferredModule, h5py
from common.deferred import pyplot as plt   # at the first figure (Agg backend)
from common.deferred import tensorflow as tf   # at the first prediction, after every input was checked
from common.errors import DataError
from common.loop.epochs import Split, evaluation_walk

# At their first use: the readers' modules import TensorFlow.
cam5_data = DeferredModule("climate_seg.cam5.data")
# At their first use: h5py and netCDF4 (the declaration and --help answer without them).
netCDF4 = DeferredModule("netCDF4")
cam5_convert = DeferredModule("climate_seg.cam5.convert")
cam5_stats = DeferredModule("climate_seg.cam5.stats")
segmentation_data = DeferredModule("climate_seg.segmentation.data")

TOOL = "climate_seg.predict"
# CF flag meanings are blank-separated words.
FLAG_MEANINGS = ("background", "tropical_cyclone", "atmospheric_river")
LONG_NAMES = {"background": "background", "cyclone": "tropical cyclone", "river": "atmospheric river"}
# netCDF-C is not thread-safe, and tf.data's reader thread and this one both open the input.
NETCDF_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class Fields:
    """What inspecting one input found: its kind (``netcdf`` or ``sample``), time steps and (lat, lon) grid."""

    kind: str
    steps: int
    grid: tuple[int, int]
    channels_first: bool = False   # an SC18 sample: climate/data (16, H, W)


# -- checking the inputs (before any output is written) ---------------------------------------------------

def inspect(cfg: ClimateConfig, path) -> Fields:
    """What ``path`` holds, checked against the run: a one-line DataError naming the file otherwise."""
    path = str(path)
    fields = _fields_of(path)
    (height, width), k = fields.grid, cfg.data.downsample
    tile = cfg.data.input_shape[:2]
    if height % k or width % k:
        raise DataError(f"{path}: fields on a {height} x {width} grid, which data.downsample={k} of the run does "
                        f"not divide (the run was trained on {cfg.data.grid[0]} x {cfg.data.grid[1]})")
    if height // k < tile[0] or width // k < tile[1]:
        raise DataError(f"{path}: fields on a {height} x {width} grid, smaller than the network's input of "
                        f"{tile[0] * k} x {tile[1] * k} points (data.grid {list(cfg.data.grid)}, data.downsample "
                        f"{k}" + (f", data.crop {list(cfg.data.crop)}" if cfg.data.crop else "") + "); it cannot be tiled")
    run_statistics(cfg)   # the run's, never the new data's: missing, nothing is predicted (imports TensorFlow)
    return fields


def _fields_of(path: str) -> Fields:
    if h5py.is_hdf5(path):   # a netCDF-4 file is an HDF5 file too: told apart by what it holds
        try:
            with h5py.File(path, "r") as f:
                if "climate/data" in f:
                    layout = cam5_stats.sample_layout(f, path)
                    if layout is None:
                        raise DataError(f"{path}: a statistics file, not a climate sample")
                    shape = f["climate/data"].shape
                    return Fields("sample", 1, tuple(shape[1:] if layout[0] else shape[:2]), layout[0])
                keys = sorted(f)
                if "images" in f and "boxes" in f:
                    raise DataError(f"{path}: an ExtremeWeather detection file (images, boxes), not CAM5 fields; "
                                    "predict it with a detection run (task: detection)")
                if cam5_stats.is_statistics(f):
                    raise DataError(f"{path}: a statistics file, not CAM5 fields")
        except OSError as exc:
            raise DataError(f"{path}: not a readable HDF5 file ({exc})") from None
        if not any(name in keys for name in CHANNELS):
            raise DataError(f"{path}: neither CAM5 netCDF fields ({', '.join(CHANNELS[:3])}, ...) nor a climate "
                            f"sample (climate/data); it holds {keys[:6]}")
    steps, height, width = cam5_convert.field_grid(path)
    if steps == 0:
        raise DataError(f"{path}: no time steps")
    return Fields("netcdf", steps, (height, width))


def run_statistics(cfg: ClimateConfig) -> dict:
    """The channel statistics the run was trained with (its config's ``data.data_dir`` / ``data.stats_file``)."""
    path = cam5_data.stats_path(cfg)
    if not path.is_file():
        raise DataError(f"{pathlib.Path(cfg.data.data_dir) / cfg.data.stats_file}: the run's channel statistics are "
                        f"not there, nor at {path} (data.data_dir, data.stats_file of its config.yaml); predict "
                        "normalises with the statistics the run was trained with, never the new data's")
    return cam5_stats.load_stats(path)


def outputs(cfg: ClimateConfig, item) -> tuple[str, str]:
    stem = pathlib.Path(item.path).stem
    return f"{stem}.mask.nc", f"{stem}.mask.png"


# -- reading -----------------------------------------------------------------------------------------------

def read_step(path: str, fields: Fields, step: int) -> np.ndarray:
    """The (lat, lon, 16) float32 fields of one time step, in the network's channel order; a DataError naming
    the file for NaN, Inf or fill values."""
    if fields.kind == "netcdf":
        with NETCDF_LOCK, netCDF4.Dataset(path, "r") as nc:
            return np.stack([v[0] for v in cam5_convert.read_steps(nc, CHANNELS, step, step + 1, path)], axis=-1)
    data = cam5_stats.read_sample(path)[0].astype(np.float32)
    bad = [name for i, name in enumerate(CHANNELS) if not np.all(np.isfinite(data[..., i]))]
    if bad:
        raise DataError(f"{path}: NaN, Inf or fill values in {', '.join(bad)} at time step {step}")
    return data


def tile_starts(length: int, tile: int) -> list[int]:
    """Where tiles of ``tile`` points start to cover ``length`` points, neighbours overlapping by at least a
    quarter tile, the first at 0 and the last at the end."""
    if length == tile:
        return [0]
    stride = tile - tile // 4
    count = math.ceil((length - tile) / stride) + 1
    return [round(i * (length - tile) / (count - 1)) for i in range(count)]


def owned(starts: list[int], tile: int, length: int) -> list[tuple[int, int]]:
    """The [begin, end) each tile along one axis contributes: the points nearer its centre than any other's."""
    cuts = [0] + [(a + b + tile) // 2 for a, b in zip(starts, starts[1:])] + [length]
    return list(zip(cuts, cuts[1:]))


def tiles_of(cfg: ClimateConfig, fields: Fields) -> list[tuple[int, int]]:
    """The (top, left) of every tile of one pooled time step, row by row."""
    k, (tile_h, tile_w) = cfg.data.downsample, cfg.data.input_shape[:2]
    return [(top, left) for top in tile_starts(fields.grid[0] // k, tile_h)
            for left in tile_starts(fields.grid[1] // k, tile_w)]


def input_split(cfg: ClimateConfig, path: str, fields: Fields):
    """One input as a :class:`~common.loop.epochs.Split` of network-sized tiles, (time step, tile) in order:
    read, normalised with the run's statistics and pooled as the training pipeline does it."""
    offset, scale = cam5_data.normalizer(cfg.data.normalization, run_statistics(cfg))
    (height, width), k = fields.grid, cfg.data.downsample
    tile_h, tile_w = cfg.data.input_shape[:2]
    corners = tiles_of(cfg, fields)

    def read(step):
        data = tf.numpy_function(lambda t: read_step(path, fields, int(t)), [step], tf.float32, stateful=False)
        return tf.ensure_shape(data, (height, width, len(CHANNELS)))

    def pooled(data):   # the same operations, in the same order, as segmentation.data's reader
        return segmentation_data.downsample((data - offset) / scale, tf.zeros((height, width), tf.int32), k)[0]

    def tiles(data):
        return tf.data.Dataset.from_tensor_slices(tf.stack([data[top:top + tile_h, left:left + tile_w]
                                                            for top, left in corners]))

    def samples(_dist, _seed, _training):
        # one step at a time (netCDF-C is not thread-safe), the arithmetic in parallel
        steps = tf.data.Dataset.range(fields.steps).map(read)
        return steps.map(pooled, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).flat_map(tiles)

    return Split(name="predict", where=path, count=fields.steps * len(corners),
                        items=list(range(fields.steps)), read=samples)


def predicted_logits(cfg: ClimateConfig, model, path: str, fields: Fields) -> np.ndarray:
    """The network's float32 logits (time, lat / k, lon / k, classes), tiles stitched."""
    batch_size = cfg.data.batch_size

    def full_batch(x):   # the shape of evaluate's batches: a short last batch takes copies of its last tile
        count = tf.shape(x)[0]
        return tf.concat([x, tf.repeat(x[-1:], batch_size - count, axis=0)], axis=0), count

    k, (tile_h, tile_w) = cfg.data.downsample, cfg.data.input_shape[:2]
    height, width = fields.grid[0] // k, fields.grid[1] // k
    split = input_split(cfg, path, fields)
    logits = np.concatenate([np.asarray(model(x, training=False))[:int(count)]
                             for x, count in evaluation_walk(split, batch_size, full_batch, seed=cfg.train.seed)])
    rows, columns = tile_starts(height, tile_h), tile_starts(width, tile_w)
    tiles = logits.reshape(fields.steps, len(rows), len(columns), tile_h, tile_w, logits.shape[-1])
    stitched = np.empty((fields.steps, height, width, logits.shape[-1]), np.float32)
    for i, (top, (row_begin, row_end)) in enumerate(zip(rows, owned(rows, tile_h, height))):
        for j, (left, (column_begin, column_end)) in enumerate(zip(columns, owned(columns, tile_w, width))):
            stitched[:, row_begin:row_end, column_begin:column_end] = \
                tiles[:, i, j, row_begin - top:row_end - top, column_begin - left:column_end - left]
    return stitched


def to_input_grid(values: np.ndarray, factor: int) -> np.ndarray:
    """(time, lat / k, lon / k, ...) -> (time, lat, lon, ...): each pooled cell's value on its k x k points."""
    return np.repeat(np.repeat(values, factor, axis=1), factor, axis=2) if factor > 1 else values


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (shifted / shifted.sum(axis=-1, keepdims=True)).astype(np.float32)


# -- writing -----------------------------------------------------------------------------------------------

def write_netcdf(target, path: str, fields: Fields, mask: np.ndarray, probabilities: np.ndarray | None,
                 attributes: dict, downsample: int) -> None:
    """The CF netCDF file of one input's prediction, on the input's own coordinates."""
    with netCDF4.Dataset(target, "w", format="NETCDF4") as out:
        if fields.kind == "netcdf":
            with NETCDF_LOCK, netCDF4.Dataset(path, "r") as source:
                dims = source.variables[CHANNELS[0]].dimensions
                for dim in dims:
                    given = source.dimensions[dim]
                    out.createDimension(dim, None if given.isunlimited() else len(given))
                    if dim in source.variables and source.variables[dim].dimensions == (dim,):
                        copy = source.variables[dim]
                        coordinate = out.createVariable(dim, copy.datatype, (dim,))
                        coordinate.setncatts({a: copy.getncattr(a) for a in copy.ncattrs() if a != "_FillValue"})
                        coordinate[:] = copy[:]
        else:   # an HDF5 sample: one step, no coordinates recorded
            dims = ("time", "lat", "lon")
            for dim, size in zip(dims, (None, *fields.grid)):
                out.createDimension(dim, size)
        out.setncatts({"Conventions": "CF-1.8", "title": "Extreme weather segmentation (tropical cyclones, "
                       "atmospheric rivers)", "source": str(pathlib.Path(path).resolve()), **attributes})
        variable = out.createVariable("class_mask", "i1", dims, zlib=True)
        variable.setncatts({
            "long_name": "predicted extreme weather class", "flag_values": np.arange(len(CLASS_NAMES), dtype="i1"),
            "flag_meanings": " ".join(FLAG_MEANINGS), "valid_range": np.array([0, len(CLASS_NAMES) - 1], "i1"),
            "comment": (f"one class per {downsample} x {downsample} block of points (data.downsample: the network "
                        "sees the block's average and was trained on the class of its point "
                        f"[{downsample // 2}, {downsample // 2}])" if downsample > 1 else "one class per point")})
        variable[:] = mask
        if probabilities is not None:
            for index, name in enumerate(CLASS_NAMES):
                probability = out.createVariable(f"probability_{name}", "f4", dims, zlib=True)
                probability.setncatts({"long_name": f"predicted probability of {LONG_NAMES[name]}", "units": "1",
                                       "valid_range": np.array([0.0, 1.0], "f4")})
                probability[:] = probabilities[..., index]


def coordinates_of(path: str, fields: Fields) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The input's lat and lon values (None where it has none)."""
    if fields.kind != "netcdf":
        return None, None
    with NETCDF_LOCK, netCDF4.Dataset(path, "r") as nc:
        return tuple(np.asarray(nc.variables[name][:]) if name in nc.variables else None for name in ("lat", "lon"))


def plot_prediction(tmq: np.ndarray, mask: np.ndarray, title: str, lat=None, lon=None):
    """TMQ with the predicted cyclones (red) and rivers (orange) outlined, on lat/lon axes where known."""
    fig, axis = plt.subplots(figsize=(9, 5))
    extent = None
    if lat is not None and lon is not None and lat.ndim == lon.ndim == 1 and len(lat) > 1 and len(lon) > 1:
        extent = (float(lon[0]), float(lon[-1]), float(lat[0]), float(lat[-1]))
        axis.set_xlabel("longitude (degrees east)")
        axis.set_ylabel("latitude (degrees north)")
    image = axis.imshow(tmq, origin="lower", cmap="Blues", extent=extent, aspect="auto")
    fig.colorbar(image, ax=axis, label="TMQ (kg m-2)")
    height, width = mask.shape
    x = np.linspace(extent[0], extent[1], width) if extent else np.arange(width)
    y = np.linspace(extent[2], extent[3], height) if extent else np.arange(height)
    for value, color in ((1, "red"), (2, "orange")):
        if np.any(mask == value):
            axis.contour(x, y, mask == value, levels=[0.5], colors=color, linewidths=1.2)
    axis.legend(handles=[plt.Line2D([], [], color="red", label="tropical cyclone"),
                         plt.Line2D([], [], color="orange", label="atmospheric river")], loc="lower left", fontsize=8)
    axis.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def predict(writer, cfg: ClimateConfig, model, item, options) -> dict:
    """One input's mask (and probabilities) into ``<stem>.mask.nc``, its first step's picture into
    ``<stem>.mask.png``; its row of the index."""
    path, fields = str(item.path), item.info
    k = cfg.data.downsample
    logits = predicted_logits(cfg, model, path, fields)
    mask = to_input_grid(np.argmax(logits, axis=-1).astype(np.int8), k)
    probabilities = to_input_grid(softmax(logits), k) if getattr(options, "probabilities", False) else None
    netcdf_name, figure_name = outputs(cfg, item)
    with writer.path(netcdf_name) as temporary:
        write_netcdf(temporary, path, fields, mask, probabilities,
                     writer.provenance(), k)
    lat, lon = coordinates_of(path, fields)
    figure = plot_prediction(read_step(path, fields, 0)[..., CHANNELS.index("TMQ")], mask[0],
                             f"{pathlib.Path(path).name}, time step 0 of {fields.steps}: TMQ and predicted masks",
                             lat, lon)
    writer.figure(figure, figure_name)
    counts = np.bincount(mask.reshape(-1), minlength=len(CLASS_NAMES))
    return {"input": path, "outputs": [netcdf_name, figure_name], "time_steps": fields.steps,
            "grid": list(fields.grid), "tiles_per_step": len(tiles_of(cfg, fields)),
            "class_fractions": {name: float(c / counts.sum()) for name, c in zip(CLASS_NAMES, counts)}}


def report(index: dict) -> list[str]:
    """The lines the command prints: one per input."""
    return [f"{pathlib.Path(row['input']).name}: {row['time_steps']} time step(s) on {row['grid'][0]} x "
            f"{row['grid'][1]} ({row['tiles_per_step']} tile(s) each): "
            + ", ".join(f"{name} {fraction:.2%}" for name, fraction in row["class_fractions"].items())
            + f" -> {row['outputs'][0]}" for row in index["inputs"]]


def add_options(parser) -> None:
    parser.add_argument("--probabilities", action="store_true",
                        help="segmentation: also write each class's probability (probability_<class>)")


# Part of the segmentation application's declaration (climate_seg/segmentation/application.py).
PREDICTOR = Predictor(
    tool=TOOL, schema=ClimateConfig, what="CAM5 netCDF or climate sample", patterns=("*.nc", "*.h5"),
    inspect=inspect, outputs=outputs, predict=predict, report=report, add_options=add_options,
    description="Segment tropical cyclones and atmospheric rivers in CAM5 fields with a trained run.")
