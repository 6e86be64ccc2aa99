"""``python -m climate_seg.predict`` on a detection run: boxes per snapshot as CSV and netCDF tables, read back
with the csv module and xarray; the same boxes evaluate scores; CAM5 netCDF and label-free inputs; two ranks;
the refusals (one line, exit 2, nothing changed)."""

from __future__ import annotations

import csv
import json
import pathlib
import shutil

import h5py
import netCDF4
import numpy as np
import pytest
import xarray as xr

from climate_seg.cam5.config import EXTREMEWEATHER_CHANNELS
from climate_seg.cam5.synth import grid_coordinates
from climate_seg.detection.config import BOX_COLUMNS, FILE_BOX_COLUMNS
from conftest import assert_predict_refuses, run_python, tree_state

GRID = (32, 48)
PREDICT = ["-m", "climate_seg.predict"]   # the entry module: the run's config picks the task


def train(run: pathlib.Path, data: pathlib.Path, **extra) -> None:
    overrides = {"data.data_dir": str(data), "data.grid": "[32, 48]", "data.synth.grid": "[32, 48]",
                 "data.synth.n_train": "16", "data.synth.n_validation": "4", "data.synth.n_test": "8",
                 "data.synth.samples_per_file": "8", "data.synth.unlabeled_every": "0", "data.batch_size": "4",
                 "data.labeled_per_batch": "2", "data.labeled_fraction": "0.5", "model.filters": "[4, 8]",
                 "train.epochs": "1", "train.tensorboard": "false", **extra}
    args = [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]
    run_python(["-m", "climate_seg.train", "--config", "configs/climate_seg/demo_detect.yaml", "--output-dir",
                str(run), *args])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny 2D detection run, evaluated on its test split (one file of 8 labelled snapshots)."""
    root = tmp_path_factory.mktemp("detect-predict")
    train(root / "run", root / "data")
    run_python(["-m", "climate_seg.evaluate", "--run-dir", str(root / "run")])
    (test_file,) = sorted((root / "data" / "test").glob("*.h5"))
    return root, root / "run", test_file


def predict(run, inputs, out, ranks: int = 1, check: bool = True):
    return run_python([*PREDICT, "--run-dir", str(run), "--input", *map(str, inputs), "--out", str(out)],
                      ranks=ranks, check=check)


def read_csv(path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def true_boxes(path) -> list[np.ndarray]:
    """Each snapshot's boxes [ymin, xmin, ymax, xmax, class] (the synthetic files number classes 0-3)."""
    with h5py.File(path, "r") as f:
        stored = f["boxes"][()].astype(np.float64)
    boxes = stored[..., [FILE_BOX_COLUMNS.index(name) for name in BOX_COLUMNS]]
    return [b[b[:, 4] >= 0] for b in boxes]


def test_boxes_are_the_ones_evaluate_scores(trained, tmp_path):
    from climate_seg.detection.evaluate import average_precisions   # TensorFlow: in the test, not at collection

    root, run, test_file = trained
    result = predict(run, [test_file], tmp_path / "out")
    stem = test_file.stem
    rows = read_csv(tmp_path / "out" / f"{stem}.boxes.csv")
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["n_images"] == 8 and len(rows) == metrics["n_predicted_boxes"] > 0
    predictions = [[] for _ in range(8)]
    for row in rows:
        box = np.array([float(row[k]) for k in ("row_min", "col_min", "row_max", "col_max")])
        predictions[int(row["step"])].append((box, float(row["score"]), int(row["class"])))
    recomputed = average_precisions(predictions, true_boxes(test_file))
    assert recomputed["ap"] == metrics["ap"] and recomputed["map"] == metrics["map"]   # exactly: the same boxes

    table = xr.open_dataset(tmp_path / "out" / f"{stem}.boxes.nc")
    assert table.sizes["box"] == len(rows)
    for name in ("step", "class", "score", "row_min", "row_max", "col_min", "col_max", "lat_min", "lon_max"):
        np.testing.assert_array_equal(table[name].values, [float(row[name]) for row in rows])
    assert table["class"].attrs["flag_meanings"].split() == [
        "tropical_depression", "tropical_cyclone", "extratropical_cyclone", "atmospheric_river"]
    assert table["lat_min"].attrs["units"] == "degrees_north" and table["lon_min"].attrs["units"] == "degrees_east"
    # No coordinates in an ExtremeWeather file: the assumed grid is said, and is the one the bounds use.
    assert "no lat/lon coordinates" in table.attrs["grid"]
    lat_step, lon_step = 180.0 / GRID[0], 360.0 / GRID[1]
    np.testing.assert_allclose(table["lat_min"], -90.0 + np.clip(table["row_min"], 0, GRID[0]) * lat_step)
    np.testing.assert_allclose(table["lon_max"], (np.clip(table["col_max"], 0, GRID[1]) - 0.5) * lon_step)
    assert (table["lat_min"] <= table["lat_max"]).all() and (table["score"] >= 0.05).all()
    from common.predict import sha256_of
    assert table.attrs["model_sha256"] == sha256_of(run / "model.keras") and "task: detection" in table.attrs["config"]
    index = json.loads((tmp_path / "out" / "predictions.json").read_text())
    assert index["inputs"][0]["boxes"] == len(rows) and index["inputs"][0]["outputs"][-1] == f"{stem}.boxes.png"
    assert (tmp_path / "out" / f"{stem}.boxes.png").stat().st_size > 10_000
    assert f"{len(rows)} boxes" in result.stdout


def without_labels(test_file, path) -> None:
    """The snapshots of ``test_file`` in an ExtremeWeather file holding images only."""
    with h5py.File(test_file, "r") as source, h5py.File(path, "w") as f:
        f["images"] = source["images"][()]


def as_cam5(test_file, path, lon_shift: float = 0.0, drop: str | None = None, grid=GRID,
            fill: tuple[str, int] | None = None) -> None:
    """The snapshots of ``test_file`` as a CAM5 netCDF file: (time, lat, lon) variables, a noleap CF time axis;
    ``fill``: (variable, step) whose point (1, 2) holds the variable's ``_FillValue`` (1e20, finite)."""
    with h5py.File(test_file, "r") as source:
        images = source["images"][()]
    lat, lon = grid_coordinates(*GRID)
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("time", None)
        nc.createDimension("lat", grid[0])
        nc.createDimension("lon", grid[1])
        time = nc.createVariable("time", "f8", ("time",))
        time.units, time.calendar = "hours since 2005-01-01 00:00:00", "noleap"
        time[:] = 3.0 * np.arange(len(images))
        nc.createVariable("lat", "f8", ("lat",))[:] = lat[:grid[0]]
        nc.createVariable("lon", "f8", ("lon",))[:] = (lon + lon_shift)[:grid[1]]
        for k, name in enumerate(EXTREMEWEATHER_CHANNELS):
            if name != drop:
                variable = nc.createVariable(name, "f4", ("time", "lat", "lon"), fill_value=np.float32(1e20))
                variable[:] = images[:, k, :grid[0], :grid[1]]
                if fill is not None and fill[0] == name:
                    variable[fill[1], 1, 2] = np.ma.masked   # written as the _FillValue


@pytest.fixture(scope="module")
def new_inputs(trained, tmp_path_factory):
    """A label-free ExtremeWeather file and a CAM5 netCDF file of the test snapshots, predicted by one rank."""
    root, run, test_file = trained
    folder = tmp_path_factory.mktemp("new-inputs")
    without_labels(test_file, folder / "nolabels.h5")
    as_cam5(test_file, folder / "cam5.nc", lon_shift=10.0)
    predict(run, [test_file, folder / "nolabels.h5", folder / "cam5.nc"], folder / "out")
    return [test_file, folder / "nolabels.h5", folder / "cam5.nc"], folder / "out"


def test_label_free_and_cam5_inputs_give_the_same_boxes(trained, new_inputs):
    inputs, out = new_inputs
    reference = xr.open_dataset(out / f"{inputs[0].stem}.boxes.nc")
    assert reference.sizes["box"] > 0
    for name in ("nolabels", "cam5"):
        table = xr.open_dataset(out / f"{name}.boxes.nc")
        for column in ("step", "class", "score", "row_min", "row_max", "col_min", "col_max", "lat_min", "lat_max"):
            np.testing.assert_array_equal(table[column].values, reference[column].values)
    cam5 = xr.open_dataset(out / "cam5.boxes.nc")
    # Its own longitudes (10 degrees east of the assumed grid) are the ones used, and said to be.
    np.testing.assert_allclose(cam5["lon_min"].values, reference["lon_min"].values + 10.0)
    assert cam5.attrs["grid"].startswith("the input's own lat/lon") and cam5.attrs["source_format"] == "CAM5 netCDF"
    # Its CF time axis (noleap, 3-hourly) decoded by xarray and written as dates in the CSV.
    first = cam5["time"].values[cam5["step"].values == 1]
    assert len(first) and str(first[0]) == "2005-01-01 03:00:00"
    rows = read_csv(out / "cam5.boxes.csv")
    assert {row["time"] for row in rows if row["step"] == "1"} == {"2005-01-01T03:00:00"}
    assert [row["class_name"] for row in rows][:1] and all(row["time"] for row in rows)


@pytest.mark.horovod
def test_two_ranks_write_what_one_rank_does(trained, new_inputs, tmp_path):
    root, run, _ = trained
    inputs, one_rank = new_inputs
    predict(run, inputs, tmp_path / "out", ranks=2)
    index = json.loads((tmp_path / "out" / "predictions.json").read_text())
    assert index["ranks"] == 2 and [row["input"] for row in index["inputs"]] == sorted(map(str, inputs))
    for path in inputs:
        name = f"{path.stem}.boxes.csv"
        assert (tmp_path / "out" / name).read_bytes() == (one_rank / name).read_bytes()
        two, one = (xr.open_dataset(folder / f"{path.stem}.boxes.nc") for folder in (tmp_path / "out", one_rank))
        assert two.equals(one)


def test_3d_windows_as_training_takes_them(tmp_path):
    """3D: the windows training takes (0, 3) scored exactly as evaluate scores them; the tail (steps 6, 7) by
    one more window ending at the last snapshot."""
    from climate_seg.detection.evaluate import average_precisions   # TensorFlow: in the test, not at collection

    run = tmp_path / "run"
    train(run, tmp_path / "data", **{"model.variant": "3d", "model.time_steps": "3", "data.batch_size": "2",
                                     "data.labeled_per_batch": "1", "data.synth.n_train": "12",
                                     "data.synth.n_validation": "6"})
    run_python(["-m", "climate_seg.evaluate", "--run-dir", str(run)])
    metrics = json.loads((run / "metrics.json").read_text())
    (test_file,) = sorted((tmp_path / "data" / "test").glob("*.h5"))
    predict(run, [test_file], tmp_path / "out")
    rows = read_csv(tmp_path / "out" / f"{test_file.stem}.boxes.csv")
    assert metrics["n_images"] == 6 and {int(row["step"]) for row in rows} <= set(range(8))
    predictions = [[] for _ in range(6)]
    for row in rows:
        if int(row["step"]) < 6:
            box = np.array([float(row[k]) for k in ("row_min", "col_min", "row_max", "col_max")])
            predictions[int(row["step"])].append((box, float(row["score"]), int(row["class"])))
    assert sum(map(len, predictions)) == metrics["n_predicted_boxes"] > 0
    recomputed = average_precisions(predictions, true_boxes(test_file)[:6])
    assert recomputed["ap"] == metrics["ap"] and recomputed["map"] == metrics["map"]
    assert any(int(row["step"]) >= 6 for row in rows) or metrics["n_predicted_boxes"] == 0


def test_fill_values_and_nan_images_are_refused_naming_the_variable_and_step(trained, tmp_path):
    """A CAM5 netCDF input whose PSL holds its (finite) _FillValue at one point of step 5, and an ExtremeWeather
    file with a NaN in one snapshot: one line naming the file (the variable and the step), exit 2, nothing
    written to --out, though the first batch of snapshots was good and predicted."""
    root, run, test_file = trained
    filled = tmp_path / "inputs" / "filled.nc"
    filled.parent.mkdir()
    as_cam5(test_file, filled, fill=("PSL", 5))
    with netCDF4.Dataset(filled) as nc:   # what a reader that does not mask would take for a pressure
        nc.set_auto_mask(False)
        assert nc.variables["PSL"][5, 1, 2] == np.float32(1e20)
    nan = tmp_path / "inputs" / "nan.h5"
    with h5py.File(test_file, "r") as source, h5py.File(nan, "w") as f:
        images = source["images"][()]
        images[6, 0, 3, 4] = np.nan
        f["images"] = images
    cases = [(run, [filled], tmp_path / "out", f"{filled}: NaN, Inf or fill values in PSL at time step 5"),
             (run, [nan], tmp_path / "out", f"{nan}: images[6] hold NaN or Inf")]
    assert_predict_refuses("climate_seg", cases, watched=[root])
    assert not (tmp_path / "out").exists()


def test_refusals_are_one_line_and_change_nothing(trained, new_inputs, tmp_path):
    root, run, test_file = trained
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("mine\n")
    wrong_grid = tmp_path / "wrong-grid.h5"
    with h5py.File(wrong_grid, "w") as f:
        f["images"] = np.zeros((2, 16, 16, 24), np.float32)
    segmentation = tmp_path / "segmentation-sample.h5"
    with h5py.File(segmentation, "w") as f:
        f["climate/data"] = np.zeros((*GRID, 16), np.float32)
        f["climate/labels_0"] = np.zeros(GRID, np.int32)
    no_tmq = tmp_path / "no-tmq.nc"
    as_cam5(test_file, no_tmq, drop="TMQ")
    other_grid = tmp_path / "other-grid.nc"
    as_cam5(test_file, other_grid, grid=(32, 40))
    no_model = tmp_path / "no-model"
    no_model.mkdir()
    shutil.copy(run / "config.yaml", no_model / "config.yaml")
    no_stats = tmp_path / "no-stats"
    no_stats.mkdir()
    (no_stats / "model.keras").symlink_to(run / "model.keras")
    (no_stats / "config.yaml").write_text((run / "config.yaml").read_text().replace(
        str(root / "data"), str(tmp_path / "gone")))
    # A predictions folder where the user put a file of a name predict would write for a new input.
    ours = tmp_path / "ours"
    shutil.copytree(new_inputs[1], ours)
    shutil.copy(test_file, tmp_path / "second.h5")
    (ours / "second.boxes.csv").write_text("the user's own table\n")

    cases = [
        (run, [test_file], user, "holds files this suite did not write"),
        (run, [test_file], run, "a training run"),
        (run, [tmp_path / "second.h5"], ours, "second.boxes.csv"),
        (run, [wrong_grid], tmp_path / "out", "expected (N, 16, 32, 48)"),
        (run, [segmentation], tmp_path / "out", "neither an ExtremeWeather-layout"),
        (run, [no_tmq], tmp_path / "out", "missing variable(s) TMQ"),
        (run, [other_grid], tmp_path / "out", "expected (time, lat, lon) = (T, 32, 48)"),
        (no_model, [test_file], tmp_path / "out", "model.keras: not found"),
        (no_stats, [test_file], tmp_path / "out", "the run's channel statistics"),
    ]
    assert_predict_refuses("climate_seg", cases, watched=[tmp_path, root])
    assert not (tmp_path / "out").exists()
    # Segmentation's --probabilities on a detection run: refused by name, not ignored.
    before = tree_state(tmp_path, root)
    result = run_python(["-m", "climate_seg.predict", "--run-dir", str(run), "--input", str(test_file),
                         "--out", str(tmp_path / "out"), "--probabilities"], check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
    assert lines[0] == (f"error: --probabilities: an option of climate_seg prediction; the run at {run} is "
                        "climate_detection")
    assert tree_state(tmp_path, root) == before
