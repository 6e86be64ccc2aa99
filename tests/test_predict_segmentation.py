"""``python -m climate_seg.predict`` on a segmentation run: CF netCDF masks read back by xarray, the evaluate
path's numbers on labelled files, tiling of larger grids, two ranks, and the refusals (exit 2, one line,
nothing changed)."""

from __future__ import annotations

import json
import pathlib
import shutil

import h5py
import netCDF4
import numpy as np
import pytest
import xarray

from climate_seg.cam5.config import CHANNELS, CLASS_NAMES, SynthSection
from climate_seg.cam5.convert import convert
from climate_seg.cam5.stats import compute_stats, write_stats
from climate_seg.cam5.synth import generate_dataset
from common.storage.run_dirs import mark_run_dir
from conftest import assert_predict_refuses, run_python

GRID = (64, 96)
DOWNSAMPLE = 2


def train_overrides(root) -> list[str]:
    pairs = {
        "data.data_dir": str(root), "data.grid": f"[{GRID[0]}, {GRID[1]}]", "data.downsample": str(DOWNSAMPLE),
        "data.batch_size": "2", "data.synth.generate_if_missing": "false", "model.name": "tiramisu",
        "model.tiramisu.growth_rate": "4", "model.tiramisu.first_filters": "8", "model.tiramisu.kernel_size": "3",
        "train.epochs": "1", "train.tensorboard": "false",
    }
    return [arg for key, value in pairs.items() for arg in ("--set", f"{key}={value}")]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """Synthetic CAM5 netCDF (64 x 96, 4 steps a file) converted into HDF5 splits, a one-epoch Tiramisu run on
    them, evaluated on the test split (metrics.json)."""
    root = tmp_path_factory.mktemp("predict-seg")
    data = root / "data"
    synth = SynthSection(grid=GRID, n_train=8, n_validation=4, n_test=4, steps_per_file=4, seed=11)
    netcdf = generate_dataset(data / "netcdf", synth, progress=False)
    for split, paths in netcdf.items():
        convert([str(p) for p in paths], data / split)
    write_stats(data / "stats.h5", compute_stats(sorted(str(p) for p in (data / "train").glob("*.h5"))))
    run = root / "run"
    run_python(["-m", "climate_seg.train", "--config", "configs/climate_seg/demo_tiramisu.yaml", "--output-dir",
                str(run), *train_overrides(data)])
    run_python(["-m", "climate_seg.evaluate", "--run-dir", str(run)])
    return {"root": root, "data": data, "run": run, "test_netcdf": sorted(netcdf["test"])}


def predict(run, inputs, out, *options, ranks=1, check=True):
    return run_python(["-m", "climate_seg.predict", "--run-dir", str(run), "--input", *map(str, inputs),
                       "--out", str(out), *options], ranks=ranks, check=check)


def confusion_of(masks: dict[str, np.ndarray], files) -> np.ndarray:
    """The confusion matrix of predicted masks on the input's grid against the HDF5 samples' labels, both at
    the pooled blocks' centre points (where the training pipeline samples the labels)."""
    n, k = len(CLASS_NAMES), DOWNSAMPLE
    confusion = np.zeros((n, n), np.int64)
    for path in files:
        with h5py.File(path, "r") as f:
            truth = f["climate/labels_0"][()][k // 2::k, k // 2::k].astype(np.int64)
        predicted = masks[pathlib.Path(path).stem][k // 2::k, k // 2::k].astype(np.int64)
        confusion += np.bincount(truth.reshape(-1) * n + predicted.reshape(-1), minlength=n * n).reshape(n, n)
    return confusion


def iou(confusion: np.ndarray) -> list[float]:
    """common.nn.metrics.iou_from_confusion's arithmetic (without importing Keras here)."""
    confusion = np.asarray(confusion, np.float64)
    tp = np.diag(confusion)
    return [float(v) for v in tp / (confusion.sum(axis=0) + confusion.sum(axis=1) - tp)]


def test_masks_are_cf_netcdf_on_the_input_grid_and_give_evaluate_ious(trained, tmp_path):
    run, data = trained["run"], trained["data"]
    samples = sorted((data / "test").glob("*.h5"))
    out = tmp_path / "samples"
    result = predict(run, [data / "test"], out)
    assert f"wrote {out / 'predictions.json'}" in result.stdout
    masks = {}
    for path in samples:
        with xarray.open_dataset(out / f"{path.stem}.mask.nc") as ds:
            assert ds["class_mask"].dims == ("time", "lat", "lon") and ds["class_mask"].shape == (1, *GRID)
            masks[path.stem] = ds["class_mask"].values[0]
    metrics = json.loads((run / "metrics.json").read_text())
    confusion = confusion_of(masks, samples)
    assert confusion.tolist() == metrics["confusion_matrix"]
    assert iou(confusion) == [metrics["iou"][name] for name in CLASS_NAMES]
    # Each pooled cell's class on its 2 x 2 points.
    mask = next(iter(masks.values()))
    assert np.array_equal(mask, np.repeat(np.repeat(mask[::2, ::2], 2, 0), 2, 1))

    # The netCDF files the samples were converted from: the same masks, on their own coordinates, as CF.
    source = trained["test_netcdf"][0]
    nc_out = tmp_path / "netcdf"
    predict(run, [source], nc_out, "--probabilities")
    with xarray.open_dataset(nc_out / f"{source.stem}.mask.nc") as ds, xarray.open_dataset(source) as given:
        mask = ds["class_mask"]
        assert mask.dims == ("time", "lat", "lon") and mask.shape == given["TMQ"].shape
        for name in ("time", "lat", "lon"):
            assert np.array_equal(ds[name].values, given[name].values)
            assert {k: v for k, v in ds[name].attrs.items()} == {k: v for k, v in given[name].attrs.items()}
        assert ds["time"].encoding["units"] == given["time"].encoding["units"]
        assert ds["time"].encoding["calendar"] == given["time"].encoding["calendar"] == "noleap"
        assert list(mask.attrs["flag_values"]) == [0, 1, 2]
        assert mask.attrs["flag_meanings"] == "background tropical_cyclone atmospheric_river"
        assert ds.attrs["Conventions"] == "CF-1.8"
        assert ds.attrs["written_by"] == "hpc-dl-suite climate_seg.predict"
        assert ds.attrs["config"] == (run / "config.yaml").read_text()
        assert len(ds.attrs["model_sha256"]) == 64 and "suite_version" in ds.attrs
        probabilities = np.stack([ds[f"probability_{name}"].values for name in CLASS_NAMES], axis=-1)
        assert ds["probability_river"].attrs["units"] == "1"
        np.testing.assert_allclose(probabilities.sum(axis=-1), 1.0, rtol=1e-5)
        assert np.array_equal(np.argmax(probabilities, axis=-1), mask.values)
        converted = sorted(masks)   # the converted samples are the file's time steps, in time order
        for step in range(mask.shape[0]):
            assert np.array_equal(mask.values[step], masks[converted[step]])
    index = json.loads((nc_out / "predictions.json").read_text())
    assert [row["outputs"] for row in index["inputs"]] == [[f"{source.stem}.mask.nc", f"{source.stem}.mask.png"]]
    assert (nc_out / f"{source.stem}.mask.png").stat().st_size > 10_000


def write_fields(path, fields: np.ndarray, lat=None, lon=None, skip=(), axes=("lat", "lon")) -> None:
    """A CAM5-style netCDF file of ``fields`` (time, lat, lon, 16) in CHANNELS order (``axes``: the names of
    the last two dimensions)."""
    steps, nlat, nlon, _ = fields.shape
    with netCDF4.Dataset(path, "w") as nc:
        for name, size in (("time", None), (axes[0], nlat), (axes[1], nlon)):
            nc.createDimension(name, size)
        time = nc.createVariable("time", "f8", ("time",))
        time.units, time.calendar = "hours since 2000-01-01 00:00:00", "noleap"
        time[:] = 3.0 * np.arange(steps)
        if lat is not None:
            nc.createVariable("lat", "f8", ("lat",))[:] = lat
            nc.createVariable("lon", "f8", ("lon",))[:] = lon
        for i, name in enumerate(CHANNELS):
            if name not in skip:
                nc.createVariable(name, "f4", ("time", *axes))[:] = fields[..., i]


def read_fields(path) -> np.ndarray:
    with netCDF4.Dataset(path) as nc:
        return np.stack([nc[name][:] for name in CHANNELS], axis=-1).astype(np.float32)


def test_a_larger_grid_is_tiled_with_overlap(trained, tmp_path):
    """The globe twice around in longitude (64 x 192): its first and last tiles are the original field, so the
    mask there is the original's; a smaller grid is refused."""
    source = trained["test_netcdf"][0]
    fields = read_fields(source)
    wide = tmp_path / "wide.nc"
    write_fields(wide, np.concatenate([fields, fields], axis=2))
    predict(trained["run"], [source, wide], tmp_path / "out")
    with xarray.open_dataset(tmp_path / "out" / f"{source.stem}.mask.nc") as ds:
        original = ds["class_mask"].values
    with xarray.open_dataset(tmp_path / "out" / "wide.mask.nc") as ds:
        tiled = ds["class_mask"].values
    assert tiled.shape == (4, 64, 192)
    # pooled: 96 columns in tiles of 48 starting at 0, 24, 48; tile 0 owns columns 0-35, tile 2 columns 60-95
    assert np.array_equal(tiled[..., :72], original[..., :72])
    assert np.array_equal(tiled[..., 120:], original[..., 24:])
    index = json.loads((tmp_path / "out" / "predictions.json").read_text())
    assert [row["tiles_per_step"] for row in index["inputs"]] == [1, 3]


@pytest.mark.horovod
def test_two_ranks_write_what_one_rank_writes(trained, tmp_path):
    inputs = [*trained["test_netcdf"], *sorted((trained["data"] / "test").glob("*.h5"))[:2]]
    predict(trained["run"], inputs, tmp_path / "one")
    predict(trained["run"], inputs, tmp_path / "two", ranks=2)
    one, two = (json.loads((tmp_path / name / "predictions.json").read_text()) for name in ("one", "two"))
    assert two["ranks"] == 2 and [r["outputs"] for r in one["inputs"]] == [r["outputs"] for r in two["inputs"]]
    for row in one["inputs"]:
        name = row["outputs"][0]
        with xarray.open_dataset(tmp_path / "one" / name) as a, xarray.open_dataset(tmp_path / "two" / name) as b:
            assert np.array_equal(a["class_mask"].values, b["class_mask"].values)


def refusal_cases(trained, tmp_path) -> dict:
    """name -> (run, inputs, out, what the one-line error says)."""
    run, data = trained["run"], trained["data"]
    source = trained["test_netcdf"][0]
    fields = read_fields(source)
    cases = {}
    user = tmp_path / "user-out"   # a predictions folder (its marker) where the user put a file of that name
    mark_run_dir(user, "climate_seg", files=[], kind="predictions", tool="climate_seg.predict")
    (user / f"{source.stem}.mask.nc").write_text("a user's file")
    cases["a user's file at an output name"] = (run, [source], user, "was not written by this suite")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    cases["a non-empty folder of the user's"] = (run, [source], foreign, "holds files this suite did not write")
    cases["a training run's folder"] = (run, [source], run, "holds a training run")
    detection = tmp_path / "extremeweather.h5"
    with h5py.File(detection, "w") as f:
        f["images"], f["boxes"] = np.zeros((2, 16, 64, 96), np.float32), -np.ones((2, 15, 5), np.float32)
    cases["a detection file"] = (run, [detection], tmp_path / "o1", "ExtremeWeather detection file")
    cosmo = tmp_path / "universe.h5"
    with h5py.File(cosmo, "w") as f:
        f["full"], f["unitPar"] = np.zeros((8, 8, 8, 4), np.int16), np.zeros(4, np.float32)
    cases["a file of another application"] = (run, [cosmo], tmp_path / "o2", "neither CAM5 netCDF fields")
    small = tmp_path / "small.nc"
    write_fields(small, fields[:, :32, :48])
    cases["a smaller grid"] = (run, [small], tmp_path / "o3", "smaller than the network's input")
    odd = tmp_path / "odd.nc"
    write_fields(odd, fields[:, :63])
    cases["a grid data.downsample does not divide"] = (run, [odd], tmp_path / "o4", "does not divide")
    missing = tmp_path / "missing.nc"
    write_fields(missing, fields, skip=("PSL",))
    cases["a missing variable"] = (run, [missing], tmp_path / "o5", "missing variable(s) PSL")
    transposed = tmp_path / "transposed.nc"   # the same sizes, stored as (time, lon, lat): no silent transpose
    write_fields(transposed, fields, axes=("lon", "lat"))
    cases["fields stored as (time, lon, lat)"] = (run, [transposed], tmp_path / "o8",
                                                  "expected (time, lat, lon) in that order")
    bare = tmp_path / "run-without-model"
    bare.mkdir()
    shutil.copy(run / "config.yaml", bare / "config.yaml")
    cases["a run folder without model.keras"] = (bare, [source], tmp_path / "o6", "model.keras: not found")
    moved = tmp_path / "run-without-statistics"
    moved.mkdir()
    shutil.copy(run / "model.keras", moved / "model.keras")
    (moved / "config.yaml").write_text((run / "config.yaml").read_text().replace(str(data), str(tmp_path / "gone")))
    cases["a run whose statistics are gone"] = (moved, [source], tmp_path / "o7", "data.stats_file")
    return cases


def test_refusals_are_one_line_exit_2_and_change_nothing(trained, tmp_path):
    assert_predict_refuses("climate_seg", refusal_cases(trained, tmp_path).values())
    for out in (tmp_path / f"o{k}" for k in range(10)):
        assert not out.exists(), out
