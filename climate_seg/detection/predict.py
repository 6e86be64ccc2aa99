"""Boxes of a trained detection run on new snapshots: the detection half of ``python -m climate_seg.predict``.

    python -m climate_seg.predict --run-dir RUN --input FILE_OR_FOLDER [...] --out OUT [--force]

Inputs (checked before anything is written; a one-line error naming the file otherwise):

- ExtremeWeather-layout HDF5 (``images`` (N, C, H, W) with the run's ``data.file_channels`` and ``data.grid``;
  ``boxes`` and ``labeled`` are not needed).  These files carry no coordinates: boxes are put on the grid of
  :func:`climate_seg.cam5.synth.grid_coordinates` (:data:`ASSUMED_GRID`), and each output says so;
- CAM5 netCDF holding the run's ``data.channels`` as ``(time, lat, lon)`` variables on ``data.grid``; its
  own ``lat`` / ``lon`` (cell centres) and CF ``time`` are used when it has them.  NaN, Inf or fill values
  (``_FillValue``, ``missing_value``) are refused as the snapshots are read, naming the variable and the step.

Each snapshot is normalised with the run's channel statistics (never the new data's) and read in the order
of the file through the engine's ordered walk; the 3D variant takes the windows of ``model.time_steps``
snapshots its training took (0, w, 2w, ...), and a tail shorter than a window is covered by one more window
ending at the last snapshot (only its uncovered steps kept).  Boxes are decoded exactly as
``python -m climate_seg.evaluate`` scores them (:func:`climate_seg.detection.evaluate.image_detections`:
p(object) x p(class) >= ``evaluation.score_threshold``, NMS per class at ``evaluation.nms_iou``).

Per input ``<stem>.boxes.csv`` and ``<stem>.boxes.nc`` (one row per box: step, time, class, score, the box
as latitude / longitude bounds of its edges, and in network pixels) and ``<stem>.boxes.png`` (its first
snapshots with the boxes).
"""

from __future__ import annotations

import pathlib
import threading

import numpy as np

from climate_seg.detection.config import DetectConfig
from common.application import Predictor
from common.deferred import DeferredModule, h5py
from common.deferred import pyplot as plt   # at the first figure (Agg backend)
from common.deferred import tensorflow as tf
from common.errors import DataError
from common.loop import epochs

# At their first use, so that the declaration and --help answer without them: TensorFlow (the readers, the
# boxes, evaluate's decoding) and netCDF4.
netCDF4 = DeferredModule("netCDF4")
cam5_synth = DeferredModule("climate_seg.cam5.synth")
cam5_convert = DeferredModule("climate_seg.cam5.convert")
cam5_data = DeferredModule("climate_seg.cam5.data")
cam5_stats = DeferredModule("climate_seg.cam5.stats")
detection_data = DeferredModule("climate_seg.detection.data")
detection_boxes = DeferredModule("climate_seg.detection.boxes")
detection_evaluate = DeferredModule("climate_seg.detection.evaluate")

TOOL = "climate_seg.predict"
ASSUMED_GRID = ("regular global latitude-longitude grid of climate_seg.cam5.synth.grid_coordinates: row i at "
                "latitude -90 + (i + 0.5) * 180 / H (row 0 southernmost), column j at longitude j * 360 / W; "
                "the input has no lat/lon coordinates")
COLUMNS = ("step", "time", "class", "class_name", "score", "lat_min", "lat_max", "lon_min", "lon_max",
           "row_min", "row_max", "col_min", "col_max")
PLOTTED_STEPS = 3
_NETCDF_LOCK = threading.Lock()   # the netCDF-C library is not thread-safe; tf.data reads in parallel


# -- the inputs -------------------------------------------------------------------------------------------

def window_starts(steps: int, window: int) -> list[int]:
    """First snapshots of the windows read: training's (0, w, 2w, ...), then one ending at the last snapshot
    when a tail is left over."""
    starts = list(range(0, steps - window + 1, window))
    if steps % window:
        starts.append(steps - window)
    return starts


def _extremeweather(cfg: DetectConfig, path: pathlib.Path, handle: h5py.File) -> dict:
    data = cfg.data
    images = handle["images"]
    expected = (len(data.file_channels), *data.grid)
    if images.ndim != 4 or tuple(images.shape[1:]) != expected:
        raise DataError(f"{path}: images has shape {images.shape}, expected (N, {', '.join(map(str, expected))}) "
                        f"as the run was trained on (data.file_channels, data.grid)")
    named = handle.attrs.get("channels")
    if named is not None:
        named = (named.decode() if isinstance(named, bytes) else str(named)).split(",")
        if named != list(data.file_channels):
            missing = [c for c in data.channels if c not in named]
            raise DataError(f"{path}: holds channels {','.join(named)}, expected the run's data.file_channels "
                            f"{','.join(data.file_channels)}" + (f" (missing {', '.join(missing)})" if missing else ""))
    lat, lon = cam5_synth.grid_coordinates(*data.grid)
    return {"format": "ExtremeWeather HDF5", "steps": int(images.shape[0]), "lat": lat, "lon": lon,
            "grid": ASSUMED_GRID, "time": None}


def _cam5(cfg: DetectConfig, path: pathlib.Path) -> dict:
    """The run's channels in a CAM5 netCDF file; a DataError naming what is missing or on another grid."""

    data = cfg.data
    try:
        nc = netCDF4.Dataset(path, "r")
    except (OSError, RuntimeError):
        raise DataError(f"{path}: neither an ExtremeWeather-layout HDF5 file (images (N, C, H, W)) nor a "
                        "readable CAM5 netCDF file") from None
    with nc:
        nc.set_auto_mask(False)
        missing = [name for name in data.channels if name not in nc.variables]
        if missing:
            raise DataError(f"{path}: neither an ExtremeWeather-layout file (no images (N, C, H, W)) nor CAM5 netCDF "
                            f"with the run's channels (missing variable(s) {', '.join(missing)})")
        shape = None
        for name in data.channels:
            variable = nc.variables[name]
            cam5_convert.check_axes(variable, path)
            if variable.ndim != 3 or tuple(variable.shape[1:]) != tuple(data.grid) or \
                    (shape is not None and variable.shape[0] != shape[0]):
                raise DataError(f"{path}: variable {name} has dims {variable.dimensions} and shape "
                                f"{tuple(variable.shape)}, expected (time, lat, lon) = (T, {data.grid[0]}, "
                                f"{data.grid[1]}) as the run was trained on (data.grid)")
            shape = tuple(variable.shape)
        coordinates = {}
        for axis, size in (("lat", data.grid[0]), ("lon", data.grid[1])):
            values = np.asarray(nc.variables[axis][:], np.float64) if axis in nc.variables else None
            coordinates[axis] = values if values is not None and values.shape == (size,) else None
        time = None
        if "time" in nc.variables and nc.variables["time"].shape == (shape[0],):
            variable = nc.variables["time"]
            time = {"values": np.asarray(variable[:], np.float64), "units": getattr(variable, "units", None),
                    "calendar": getattr(variable, "calendar", None)}
    assumed_lat, assumed_lon = cam5_synth.grid_coordinates(*data.grid)
    own = coordinates["lat"] is not None and coordinates["lon"] is not None
    return {"format": "CAM5 netCDF", "steps": shape[0],
            "lat": coordinates["lat"] if own else assumed_lat, "lon": coordinates["lon"] if own else assumed_lon,
            "grid": "the input's own lat/lon coordinates (cell centres)" if own else ASSUMED_GRID, "time": time}


def statistics_path(cfg: DetectConfig) -> pathlib.Path:
    """The run's channel statistics (never the new data's); a one-line error naming the config keys."""
    path = cam5_data.stats_path(cfg)
    if not path.is_file():
        raise DataError(f"{path}: the run's channel statistics are not there (data.data_dir, data.stats_file, "
                        "data.derived_dir of its config.yaml); predict normalises with the run's statistics, "
                        "never the new data's")
    return path


def inspect(cfg: DetectConfig, path) -> dict:
    """What prediction needs of one input (its format, snapshots, coordinates), after checking it fits the run."""
    path = pathlib.Path(path)
    statistics_path(cfg)
    info = None
    if h5py.is_hdf5(path):
        try:
            with h5py.File(path, "r") as handle:
                if "images" in handle:
                    info = _extremeweather(cfg, path, handle)
        except OSError as exc:
            raise DataError(f"{path}: not a readable HDF5 file ({exc})") from None
    if info is None:
        info = _cam5(cfg, path)   # a netCDF-4 file is HDF5 too: told apart by its variables
    window = cfg.model.time_steps if cfg.model.variant == "3d" else 1
    if info["steps"] < window:
        raise DataError(f"{path}: holds {info['steps']} snapshot(s), fewer than the model.time_steps={window} "
                        "consecutive snapshots the run's 3d model takes")
    if info["steps"] < 1:
        raise DataError(f"{path}: holds no snapshot")
    return info


def outputs(cfg: DetectConfig, item) -> tuple[str, ...]:
    stem = item.path.stem
    return f"{stem}.boxes.csv", f"{stem}.boxes.nc", f"{stem}.boxes.png"


# -- the network ------------------------------------------------------------------------------------------

def _reader(cfg: DetectConfig, item, offset, scale):
    """index -> the window of snapshots from ``index`` as the network takes them."""

    window = cfg.model.time_steps if cfg.model.variant == "3d" else 1
    path = str(item.path)
    if item.info["format"] == "ExtremeWeather HDF5":
        return lambda index: detection_data.read_images(cfg, path, index, window, offset, scale)

    def read_cam5(index):
        with _NETCDF_LOCK, netCDF4.Dataset(path, "r") as nc:
            images = np.stack(cam5_convert.read_steps(nc, cfg.data.channels, index, index + window, path), axis=1)
        return detection_data.network_input(images, path, index, offset, scale)

    return read_cam5


def prediction_split(cfg: DetectConfig, item, starts: list[int]):
    """The windows of one input as a :class:`~common.loop.epochs.Split` the engine walks in order."""
    data, m = cfg.data, cfg.model
    offset, scale = cam5_data.normalizer(data.normalization, cam5_stats.load_stats(statistics_path(cfg)),
                               [data.file_channels.index(c) for c in data.channels])
    read = _reader(cfg, item, offset, scale)
    image_shape = (*data.grid, len(data.channels))
    if m.variant == "3d":
        image_shape = (m.time_steps, *image_shape)
    else:
        read = (lambda read_window: lambda index: read_window(index)[0])(read)

    def dataset(dist, seed, training):
        share = epochs.rank_share((tf.constant(starts, tf.int64),), dist, seed, shuffle=False)
        return share.samples(share.items.map(lambda index: tf.ensure_shape(
            tf.numpy_function(lambda i: read(int(i)), [index], tf.float32, stateful=False), image_shape),
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True))

    return epochs.Split(name="predict", where=str(item.path), count=len(starts), items=starts, read=dataset)


def detect_boxes(cfg: DetectConfig, model, item) -> tuple[list[tuple], list[tuple[int, np.ndarray]]]:
    """([(step, box (ymin, xmin, ymax, xmax) in pixels, score, class)] in step order, evaluate's order within
    a step; the first snapshots, normalised, for the figure)."""

    window = cfg.model.time_steps if cfg.model.variant == "3d" else 1
    starts = window_starts(item.info["steps"], window)
    ev = cfg.evaluation
    found, shown, done = [], [], 0
    windows = iter(starts)
    for images in epochs.evaluation_walk(prediction_split(cfg, item, starts), cfg.data.batch_size, seed=cfg.train.seed):
        detect = np.asarray(model(images, training=False)["detect"])
        if not np.all(np.isfinite(detect)):   # boxes at +-inf would be written as if found
            raise DataError(f"{item.path}: the network's output is not finite (inputs far outside the run's "
                            "training data, its channel statistics?); no boxes written")
        for i in range(len(detect)):
            start = next(windows)
            steps_detect = detect[i] if cfg.model.variant == "3d" else detect[i][None]
            steps_image = np.asarray(images[i]) if cfg.model.variant == "3d" else np.asarray(images[i])[None]
            for t in range(window):
                step = start + t
                if step < done:
                    continue   # the tail window's steps already predicted by a training window
                found += [(step, box, score, cls) for box, score, cls in
                          detection_evaluate.image_detections(steps_detect[t], cfg.model.cell, ev.score_threshold, ev.nms_iou)]
                if len(shown) < PLOTTED_STEPS:
                    shown.append((step, steps_image[t]))
            done = start + window
    return found, shown


# -- pixels to coordinates --------------------------------------------------------------------------------

def edge_coordinate(position, centres) -> np.ndarray:
    """Coordinate of pixel-edge positions (pixel i spans [i, i + 1), its centre at ``centres[i]``), clipped to
    the grid's outer edges: linear between centres, the end spacing continued beyond the first and last."""
    centres = np.asarray(centres, np.float64)
    n = len(centres)
    u = np.clip(np.asarray(position, np.float64), 0.0, n) - 0.5
    if n == 1:
        return np.full_like(u, centres[0])
    inner = np.interp(u, np.arange(n), centres)
    low = centres[0] + u * (centres[1] - centres[0])
    high = centres[-1] + (u - (n - 1)) * (centres[-1] - centres[-2])
    return np.where(u < 0, low, np.where(u > n - 1, high, inner))


def table(found: list[tuple], info: dict) -> dict[str, np.ndarray]:
    """The columns of :data:`COLUMNS` (``time``: the CF time value, or the step without a time axis)."""
    boxes = np.asarray([box for _, box, _, _ in found], np.float64).reshape(-1, 4)
    steps = np.asarray([step for step, _, _, _ in found], np.int64)
    lat = edge_coordinate(boxes[:, [0, 2]], info["lat"])
    lon = edge_coordinate(boxes[:, [1, 3]], info["lon"])
    time = info["time"]["values"][steps] if info["time"] is not None else steps.astype(np.float64)
    return {"step": steps, "time": time, "class": np.asarray([c for *_, c in found], np.int64),
            "score": np.asarray([s for _, _, s, _ in found], np.float64),
            "lat_min": lat.min(axis=1), "lat_max": lat.max(axis=1), "lon_min": lon.min(axis=1),
            "lon_max": lon.max(axis=1), "row_min": boxes[:, 0], "row_max": boxes[:, 2],
            "col_min": boxes[:, 1], "col_max": boxes[:, 3]}


def time_labels(columns: dict, info: dict) -> list:
    """The CSV's time column: ISO dates from a CF time axis, else the values (the step without one)."""
    time = info["time"]
    if time is not None and time["units"]:
        try:
            dates = netCDF4.num2date(columns["time"], time["units"], time["calendar"] or "standard")
            return [date.isoformat() for date in np.atleast_1d(dates)]
        except (ValueError, TypeError):
            pass   # units that are not CF dates: the values as they are
    return [repr(float(v)) if info["time"] is not None else int(v) for v in columns["time"]]


# -- the outputs ------------------------------------------------------------------------------------------

def write_netcdf(temporary, columns: dict, info: dict, attributes: dict, cfg: DetectConfig, source) -> None:


    with netCDF4.Dataset(temporary, "w", format="NETCDF4") as nc:
        nc.createDimension("box", None)
        described = {
            "step": ("i4", {"long_name": "snapshot index in the input file"}),
            "time": ("f8", {"long_name": "time of the snapshot", **(
                {k: v for k, v in (("units", info["time"]["units"]), ("calendar", info["time"]["calendar"])) if v}
                if info["time"] is not None else {"units": "1", "comment": "the input has no time axis: the step"})}),
            "class": ("i1", {"long_name": "event class", "flag_values": np.arange(len(detection_boxes.DETECTION_CLASSES), dtype="i1"),
                             "flag_meanings": " ".join(detection_boxes.DETECTION_CLASSES)}),
            "score": ("f8", {"long_name": "p(object) x p(class)", "units": "1"}),
            **{name: ("f8", {"long_name": f"box {name.split('_')[1]}imum latitude (edge)", "units": "degrees_north"})
               for name in ("lat_min", "lat_max")},
            **{name: ("f8", {"long_name": f"box {name.split('_')[1]}imum longitude (edge)", "units": "degrees_east"})
               for name in ("lon_min", "lon_max")},
            **{name: ("f8", {"long_name": f"box {name.replace('_', ' ')} in network input pixels (edges)",
                             "units": "1"}) for name in ("row_min", "row_max", "col_min", "col_max")},
        }
        for name, (kind, attrs) in described.items():
            variable = nc.createVariable(name, kind, ("box",))
            variable.setncatts(attrs)
            variable[:] = columns[name].astype(kind)
        nc.setncatts({**attributes, "title": "extreme-weather event boxes predicted by climate_seg detection",
                      "Conventions": "CF-1.8", "source_file": str(source), "source_format": info["format"],
                      "grid": info["grid"], "score_threshold": cfg.evaluation.score_threshold,
                      "nms_iou": cfg.evaluation.nms_iou, "steps": info["steps"]})


def figure(shown, found, info: dict, cfg: DetectConfig, stem: str):
    """The first snapshots' TMQ (normalised) on latitude / longitude with the predicted boxes."""

    channels = list(cfg.data.channels)
    shown_channel = "TMQ" if "TMQ" in channels else channels[0]
    lat_edges = edge_coordinate(np.arange(len(info["lat"]) + 1), info["lat"])
    lon_edges = edge_coordinate(np.arange(len(info["lon"]) + 1), info["lon"])
    fig, axes = plt.subplots(len(shown), 1, figsize=(7, 3.6 * len(shown)), squeeze=False)
    for axis, (step, image) in zip(axes[:, 0], shown):
        axis.pcolormesh(lon_edges, lat_edges, image[..., channels.index(shown_channel)], cmap="Blues",
                        shading="flat")
        boxes = [(box, score, cls) for s, box, score, cls in found if s == step]
        for (ymin, xmin, ymax, xmax), score, cls in boxes:
            lat = edge_coordinate([ymin, ymax], info["lat"])
            lon = edge_coordinate([xmin, xmax], info["lon"])
            axis.add_patch(plt.Rectangle((lon.min(), lat.min()), np.ptp(lon), np.ptp(lat), fill=False, lw=1.2,
                                         ec=detection_evaluate.COLORS[cls]))
            axis.text(lon.min(), lat.max(), f"{score:.2f}", color=detection_evaluate.COLORS[cls], fontsize=6, va="bottom")
        axis.set_title(f"{stem} step {step}: {shown_channel} (normalised), {len(boxes)} predicted boxes", fontsize=9)
        axis.set_xlabel("longitude (deg E)", fontsize=8)
        axis.set_ylabel("latitude (deg N)", fontsize=8)
        axis.tick_params(labelsize=7)
    fig.legend(handles=[plt.matplotlib.patches.Patch(color=c, label=n.replace("_", " "))
                        for c, n in zip(detection_evaluate.COLORS, detection_boxes.DETECTION_CLASSES)], loc="lower center", ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig


def predict(writer, cfg: DetectConfig, model, item, options) -> dict:
    """One input's boxes: the CSV and netCDF tables and the figure; its row of the index."""

    found, shown = detect_boxes(cfg, model, item)
    columns = table(found, item.info)
    csv_name, netcdf_name, figure_name = outputs(cfg, item)
    times = time_labels(columns, item.info)
    writer.csv(csv_name, list(COLUMNS), [
        [int(columns["step"][k]), times[k], int(columns["class"][k]), detection_boxes.DETECTION_CLASSES[columns["class"][k]],
         *(repr(float(columns[name][k])) for name in COLUMNS[4:])] for k in range(len(found))])
    with writer.path(netcdf_name, suffix=".partial.nc") as temporary:
        write_netcdf(temporary, columns, item.info, writer.provenance(), cfg,
                     item.path)
    picture = figure(shown, found, item.info, cfg, item.path.stem)
    writer.figure(picture, figure_name, dpi=100)
    counts = {name: int(np.sum(columns["class"] == k)) for k, name in enumerate(detection_boxes.DETECTION_CLASSES)}
    return {"input": str(item.path), "format": item.info["format"], "steps": item.info["steps"],
            "boxes": len(found), "boxes_per_class": counts, "grid": item.info["grid"],
            "outputs": list(outputs(cfg, item))}


def report(index: dict) -> list[str]:
    lines = []
    for row in index["inputs"]:
        classes = ", ".join(f"{count} {name.replace('_', ' ')}" for name, count in row["boxes_per_class"].items()
                            if count)
        lines.append(f"{row['input']}: {row['steps']} snapshot(s), {row['boxes']} boxes"
                     + (f" ({classes})" if classes else "") + f" -> {', '.join(row['outputs'])}")
    return lines


# Part of the detection application's declaration (climate_seg/detection/application.py).
PREDICTOR = Predictor(
    tool=TOOL, schema=DetectConfig, what="ExtremeWeather-layout HDF5 or CAM5 netCDF", patterns=("*.h5", "*.nc"),
    inspect=inspect, outputs=outputs, predict=predict, report=report,
    description="Boxes of a trained climate detection run on new snapshots (CSV and netCDF tables per input).")
