"""Climate segmentation: models, netCDF conversion, statistics, pipeline, loss, IoU, training."""

from __future__ import annotations

import json
import pathlib
import shutil

import h5py
import keras
import netCDF4
import numpy as np
import pytest
import tensorflow as tf

from climate_seg.cam5.config import CHANNELS, CLASS_NAMES, SynthSection
from climate_seg.cam5.convert import convert
from climate_seg.cam5.stats import compute_stats, load_stats, write_stats
from climate_seg.cam5.synth import generate_dataset
from climate_seg.segmentation.config import ClimateConfig, DeeplabSection, TiramisuSection
from climate_seg.segmentation.data import (build_datasets, crop, downsample, evaluation_dataset, input_ceiling,
                                           inspect_file)
from climate_seg.segmentation.deeplab import build_deeplab
from climate_seg.segmentation.loss import WeightedPixelCrossEntropy, class_weights
from climate_seg.segmentation.tiramisu import build_tiramisu
from common.distributed import Distributed
from common.errors import DataError, data_error_from_pipeline
from common.nn.metrics import ConfusionMatrix, iou_from_confusion
from tests.conftest import REPO, last_json_line, run_python

TINY_GRID = (64, 96)


# -- models --------------------------------------------------------------------------------

def tiramisu_parameters(c: TiramisuSection, in_channels: int, n_classes: int) -> int:
    """Parameter count of the climate Tiramisu, from its published structure (BN: 4 per channel)."""
    k, g, bn = c.kernel_size, c.growth_rate, 4 if c.batch_norm else 0
    total = k * k * in_channels * c.first_filters + c.first_filters
    channels, skips = c.first_filters, []

    def block(channels, n):
        nonlocal total
        for _ in range(n):
            total += bn * channels + k * k * channels * g + g
            channels += g
        return channels

    for n in c.down_blocks:
        channels = block(channels, n)
        skips.append(channels)
        total += bn * channels + channels * channels + channels       # transition down, 1x1
    block(channels, c.bottleneck_layers)
    fresh = c.bottleneck_layers * g
    for n, skip in zip(c.up_blocks, reversed(skips)):
        total += 3 * 3 * fresh * fresh + fresh                          # transition up keeps the width
        channels = block(fresh + skip, n)
        fresh = n * g
    return total + channels * n_classes + n_classes


@pytest.mark.parametrize("batch_norm", [True, False])
def test_tiramisu_shapes_and_parameters(batch_norm):
    cfg = TiramisuSection(growth_rate=8, kernel_size=3, first_filters=12, batch_norm=batch_norm)
    model = build_tiramisu(cfg, (32, 48, 16), 3)
    assert model.output_shape == (None, 32, 48, 3)
    assert model.count_params() == tiramisu_parameters(cfg, 16, 3)
    # The bottleneck runs at 1/16 of the input.
    assert model.get_layer("bottleneck_new").output.shape[1:3] == (2, 3)
    # The SC18 configuration at full size (shapes only: no data).
    full = build_tiramisu(TiramisuSection(), (768, 1152, 16), 3)
    assert full.count_params() == tiramisu_parameters(TiramisuSection(), 16, 3)
    assert full.get_layer("bottleneck_new").output.shape[1:3] == (48, 72)


def test_deeplab_backbone_is_resnet50_v2_and_decoders_reach_full_resolution():
    model = build_deeplab(DeeplabSection(output_stride=16, decoder="bilinear"), (64, 96, 16), 3)
    backbone = keras.Model(model.inputs, model.get_layer("backbone_post_relu").output)
    reference = keras.applications.ResNet50V2(include_top=False, weights=None, input_shape=(64, 96, 16))
    assert backbone.count_params() == reference.count_params()
    assert backbone.output_shape == (None, 4, 6, 2048)
    small = dict(blocks=[1, 1, 1, 1], base_filters=8, aspp_filters=16, decoder_filters=16, low_level_filters=8)
    for stride, rates in ((8, [12, 24, 36]), (16, [6, 12, 18])):
        for decoder in ("bilinear", "deconv", "deconv1x"):
            cfg = DeeplabSection(output_stride=stride, decoder=decoder, **small)
            model = build_deeplab(cfg, (32, 48, 16), 3)
            assert model.output_shape == (None, 32, 48, 3), (stride, decoder)
            assert model.get_layer("backbone_post_relu").output.shape[1:3] == (32 // stride, 48 // stride)
            assert [model.get_layer(f"aspp_rate{r}").dilation_rate for r in rates] == [(r, r) for r in rates]
            assert model.get_layer("low_level_reduce").output.shape[-1] == 8
    assert "full_resolution_skip" in [layer.name for layer in model.layers]


def test_logits_are_float32_under_bf16_and_dry_run_reports_full_size(tmp_path):
    from common.nn import precision

    precision.set_precision("mixed_bfloat16")
    try:
        for model in (build_tiramisu(TiramisuSection(growth_rate=4, first_filters=8), (32, 48, 16), 3),
                      build_deeplab(DeeplabSection(blocks=[1, 1, 1, 1], base_filters=8, aspp_filters=16,
                                                   decoder_filters=16, decoder="bilinear"), (32, 48, 16), 3)):
            assert model.output.dtype == "float32"
            assert model(np.zeros((1, 32, 48, 16), np.float32)).dtype == "float32"
    finally:
        precision.set_precision("fp32")
    for name in ("gordon_bell_tiramisu", "gordon_bell_deeplab"):
        result = last_json_line(run_python(["-m", "climate_seg.train", "--config",
                                            f"configs/climate_seg/{name}.yaml", "--dry-run"]).stdout)
        assert result["input_shape"] == [768, 1152, 16]
        assert result["forward_flops_per_sample"] > 1e11


# -- conversion -----------------------------------------------------------------------------

def write_cam5(path, fields: np.ndarray, labels=None, skip=(), lat_override=None, start_hour=0.0, fill_value=None):
    """A CAM5-style netCDF file: fields (time, lat, lon, 16) in CHANNELS order (each variable's ``_FillValue``
    ``fill_value``, where given)."""
    steps, nlat, nlon, _ = fields.shape
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("time", None)
        nc.createDimension("lat", nlat)
        nc.createDimension("lon", nlon)
        nc.createDimension("lat2", nlat + 1)
        time = nc.createVariable("time", "f8", ("time",))
        time.units, time.calendar = "hours since 2000-01-01 00:00:00", "noleap"
        time[:] = start_hour + 3.0 * np.arange(steps)
        # Variables written in alphabetical order (as in the ExtremeWeather files): the converter orders them.
        for name in sorted(CHANNELS):
            if name in skip:
                continue
            dims = ("time", "lat2", "lon") if name == lat_override else ("time", "lat", "lon")
            var = nc.createVariable(name, "f4", dims, fill_value=fill_value)
            values = fields[..., CHANNELS.index(name)]
            if name == lat_override:
                values = np.concatenate([values, values[:, :1]], axis=1)
            var[:] = values
        if labels is not None:
            nc.createVariable("LABELS", "i1", ("time", "lat", "lon"))[:] = labels


def test_convert_netcdf_to_hdf5_in_channel_order(tmp_path):
    rng = np.random.default_rng(0)
    fields = rng.normal(size=(3, 8, 12, 16)).astype(np.float32)
    labels = rng.integers(0, 3, size=(3, 8, 12))
    write_cam5(tmp_path / "a.nc", fields, labels)
    written = convert([str(tmp_path / "a.nc")], tmp_path / "out")
    assert [p.name for p in written] == ["data-2000-01-01-00-1.h5", "data-2000-01-01-03-1.h5",
                                         "data-2000-01-01-06-1.h5"]
    for t, path in enumerate(written):
        with h5py.File(path) as f:
            np.testing.assert_array_equal(f["climate/data"][()], fields[t])
            np.testing.assert_array_equal(f["climate/labels_0"][()], labels[t])
            assert f["climate/data"].chunks is None
        assert inspect_file(str(path), (8, 12)).data_offset is not None

    # Labels from separate files, one per input: HDF5 for the first, netCDF for the second.
    write_cam5(tmp_path / "b.nc", fields[:2], start_hour=24.0)
    with h5py.File(tmp_path / "b_labels.h5", "w") as f:
        f["masks"] = labels[:2].astype(np.int32)
    write_cam5(tmp_path / "c.nc", fields[1:], start_hour=48.0)
    with netCDF4.Dataset(tmp_path / "c_labels.nc", "w") as nc:
        for dim, size in zip(("time", "lat", "lon"), (2, 8, 12)):
            nc.createDimension(dim, size)
        nc.createVariable("masks", "i4", ("time", "lat", "lon"))[:] = labels[1:]
    written = convert([str(tmp_path / "b.nc"), str(tmp_path / "c.nc")], tmp_path / "out2",
                      labels=[str(tmp_path / "b_labels.h5"), str(tmp_path / "c_labels.nc")], labels_var="masks")
    assert len(written) == 4
    for path, expected in zip(written, [labels[0], labels[1], labels[1], labels[2]]):
        with h5py.File(path) as f:
            np.testing.assert_array_equal(f["climate/labels_0"][()], expected)


@pytest.mark.parametrize("case, pattern", [
    ("missing", r"a\.nc: missing variable\(s\) PRECT"),
    ("grid", r"a\.nc: variable TS has shape \(2, 9, 12\), but TMQ has \(2, 8, 12\)"),
    ("labels", r"a\.nc: no label variable 'LABELS'"),
    ("label_values", r"a\.nc: label variable LABELS holds values \[7\]"),
    ("nan", r"a\.nc: NaN, Inf or fill values in TMQ at time step 1"),
    ("fill", r"a\.nc: NaN, Inf or fill values in TMQ at time step 1"),   # a finite _FillValue is no field value
    ("other_grid", r"b\.nc: fields on a 4 x 12 grid, but the first input is on 8 x 12"),
])
def test_convert_rejects_bad_input_naming_file_and_variable(tmp_path, case, pattern):
    fields = np.ones((2, 8, 12, 16), np.float32)
    labels = np.zeros((2, 8, 12), np.int8)
    inputs = [str(tmp_path / "a.nc")]
    if case == "missing":
        write_cam5(tmp_path / "a.nc", fields, labels, skip=("PRECT",))
    elif case == "grid":
        write_cam5(tmp_path / "a.nc", fields, labels, lat_override="TS")
    elif case == "labels":
        write_cam5(tmp_path / "a.nc", fields)
    elif case == "label_values":
        labels[1, 2, 3] = 7
        write_cam5(tmp_path / "a.nc", fields, labels)
    elif case == "nan":
        fields[1, 0, 0, 0] = np.nan
        write_cam5(tmp_path / "a.nc", fields, labels)
    elif case == "fill":
        fields[1, 0, 0, 0] = 1e20
        write_cam5(tmp_path / "a.nc", fields, labels, fill_value=np.float32(1e20))
    else:
        write_cam5(tmp_path / "a.nc", fields, labels)
        write_cam5(tmp_path / "b.nc", fields[:, :4], labels[:, :4], start_hour=100.0)
        inputs.append(str(tmp_path / "b.nc"))
    with pytest.raises(DataError, match=pattern):
        convert(inputs, tmp_path / "out")
    if case != "other_grid":
        assert not list((tmp_path / "out").glob("*.h5")), "a failing file must leave nothing behind"
    result = run_python(["-m", "climate_seg.cam5.convert", "--input", *inputs, "--out", str(tmp_path / "cli")],
                        check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: ")


# -- synthetic data, statistics, class weights ---------------------------------------------------

@pytest.fixture(scope="module")
def tiny_climate(tmp_path_factory) -> pathlib.Path:
    """Synthetic netCDF (64 x 96 grid) converted into train/validation/test, with stats.h5."""
    root = tmp_path_factory.mktemp("climate") / "data"
    synth = SynthSection(grid=TINY_GRID, n_train=12, n_validation=4, n_test=4, steps_per_file=4, seed=3)
    netcdf = generate_dataset(root / "netcdf", synth, progress=False)
    for split, paths in netcdf.items():
        convert([str(p) for p in paths], root / split)
    write_stats(root / "stats.h5", compute_stats(sorted(str(p) for p in (root / "train").glob("*.h5"))))
    return root


def test_synthetic_features_are_physical(tiny_climate):
    nc = netCDF4.Dataset(sorted((tiny_climate / "netcdf" / "train").glob("*.nc"))[0])
    labels = nc["LABELS"][:]
    psl, tmq = nc["PSL"][:], nc["TMQ"][:]
    ubot, vbot = nc["UBOT"][:], nc["VBOT"][:]
    lat = nc["lat"][:]
    assert 0.002 < (labels == 1).mean() < 0.05 and 0.005 < (labels == 2).mean() < 0.08
    cyclone, river, background = labels == 1, labels == 2, labels == 0
    # Cyclones are lows with strong winds; rivers are moist filaments; tropics are moister than poles.
    assert psl[cyclone].mean() < psl[background].mean() - 1000
    assert np.hypot(ubot, vbot)[cyclone].mean() > 2 * np.hypot(ubot, vbot)[background].mean()
    assert tmq[river].mean() > tmq[background].mean() + 10
    assert tmq[:, np.abs(lat) < 15].mean() > 3 * tmq[:, np.abs(lat) > 60].mean()


def test_stats_match_numpy(tiny_climate, tmp_path):
    files = sorted(str(p) for p in (tiny_climate / "train").glob("*.h5"))
    data = np.stack([h5py.File(f)["climate/data"][()] for f in files]).reshape(-1, 16).astype(np.float64)
    labels = np.stack([h5py.File(f)["climate/labels_0"][()] for f in files]).reshape(-1)
    stats = load_stats(tiny_climate / "stats.h5")
    np.testing.assert_allclose(stats["mean"], data.mean(axis=0), rtol=1e-10)
    np.testing.assert_allclose(stats["std"], data.std(axis=0), rtol=1e-8)
    np.testing.assert_array_equal(stats["min"], data.min(axis=0))
    np.testing.assert_array_equal(stats["max"], data.max(axis=0))
    np.testing.assert_allclose(stats["class_frequencies"], np.bincount(labels, minlength=3) / len(labels))
    # Two real ranks, each a share of the files: the same statistics.
    out = tmp_path / "stats2.h5"
    run_python(["-m", "climate_seg.cam5.stats", str(tiny_climate / "train"), "--out", str(out)], ranks=2)
    two = load_stats(out)
    for key in ("mean", "std", "min", "max", "class_frequencies"):
        np.testing.assert_allclose(two[key], stats[key], rtol=1e-10)


def test_class_weights():
    frequencies = np.array([0.986, 0.0005, 0.0135])
    stats = {"class_frequencies": frequencies}
    cfg = ClimateConfig(data={"data_dir": "unused"})
    inverse = class_weights(cfg, stats)
    np.testing.assert_allclose(inverse, (1 / frequencies) / (1 / frequencies).sum())
    assert inverse.sum() == pytest.approx(1.0)
    cfg = ClimateConfig(data={"data_dir": "unused"}, loss={"class_weights": "power", "weight_power": 0.125})
    np.testing.assert_allclose(class_weights(cfg, stats), [1.00, 2.59, 1.71], atol=0.01)   # DeepCAM: 1.00/2.61/1.72
    cfg = ClimateConfig(data={"data_dir": "unused"}, loss={"class_weights": [1, 2, 3]})
    np.testing.assert_array_equal(class_weights(cfg, stats), [1, 2, 3])
    with pytest.raises(DataError, match="never occur"):
        class_weights(ClimateConfig(data={"data_dir": "x"}), {"class_frequencies": np.array([1.0, 0.0, 0.0])})


def test_weighted_loss_matches_numpy():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 4, 5, 3)).astype(np.float32)
    labels = rng.integers(0, 3, size=(2, 4, 5))
    weights = np.array([0.1, 5.0, 2.0])
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected = np.mean(-np.take_along_axis(log_p, labels[..., None], -1)[..., 0] * weights[labels])
    assert float(WeightedPixelCrossEntropy(weights)(labels, logits)) == pytest.approx(expected, rel=1e-5)


# -- IoU ----------------------------------------------------------------------------------------

def test_iou_against_a_hand_computed_confusion_matrix():
    # truth:     0 0 0 1 1 2      predicted: 0 0 1 1 2 2
    truth = np.array([[0, 0, 0, 1, 1, 2]])
    predicted = np.array([[0, 0, 1, 1, 2, 2]])
    metric = ConfusionMatrix(3)
    metric.update_state(truth, np.eye(3)[predicted])
    np.testing.assert_array_equal(np.asarray(metric.confusion), [[2, 1, 0], [0, 1, 1], [0, 0, 1]])
    pooled = iou_from_confusion(np.asarray(metric.confusion))
    # IoU: background 2/3, cyclone 1/(2+2-1) = 1/3, river 1/2.
    np.testing.assert_allclose(pooled["iou"], [2 / 3, 1 / 3, 1 / 2])
    assert pooled["mean_iou"] == pytest.approx((2 / 3 + 1 / 3 + 1 / 2) / 3)
    assert float(metric.result()) == pytest.approx(pooled["mean_iou"], rel=1e-6)
    assert pooled["pixel_accuracy"] == pytest.approx(4 / 6)
    # Against scikit-learn on random data.
    from sklearn.metrics import confusion_matrix, jaccard_score

    rng = np.random.default_rng(2)
    truth, predicted = rng.integers(0, 3, (4, 7, 9)), rng.integers(0, 3, (4, 7, 9))
    metric = ConfusionMatrix(3)
    metric.update_state(truth, np.eye(3)[predicted])
    np.testing.assert_array_equal(np.asarray(metric.confusion), confusion_matrix(truth.ravel(), predicted.ravel()))
    np.testing.assert_allclose(iou_from_confusion(np.asarray(metric.confusion))["iou"],
                               jaccard_score(truth.ravel(), predicted.ravel(), average=None))


def test_iou_pooled_over_two_real_ranks(tmp_path):
    out = tmp_path / "pooled.json"
    run_python([str(REPO / "tests" / "workers" / "pooled_iou.py"), str(out)], ranks=2)
    result = json.loads(out.read_text())
    from sklearn.metrics import jaccard_score

    truth, predicted = (np.concatenate([np.array(r[k]).ravel() for r in result["ranks"]]) for k in ("truth", "pred"))
    expected = jaccard_score(truth, predicted, average=None)
    for rank in result["ranks"]:
        np.testing.assert_allclose([rank["logs"][f"val_iou_{n}"] for n in CLASS_NAMES], expected)
        assert rank["logs"]["val_mean_iou"] == pytest.approx(expected.mean())
    # The per-rank means differ from the pooled one (what averaging per-rank IoUs would report).
    per_rank = np.mean([r["local_mean_iou"] for r in result["ranks"]])
    assert abs(per_rank - expected.mean()) > 0.01


# -- pipeline -------------------------------------------------------------------------------------

def tiny_cfg(root, **data) -> ClimateConfig:
    return ClimateConfig(data={"data_dir": str(root), "grid": list(TINY_GRID), "batch_size": 2, **data},
                         train={"seed": 5})


def test_raw_reader_equals_h5py_and_transforms_match_numpy(tiny_climate, tmp_path):
    cfg = tiny_cfg(tiny_climate, downsample=2)
    stats = load_stats(tiny_climate / "stats.h5")
    (fields, labels), = evaluation_dataset(cfg, "validation")[0].take(1)
    files = sorted((tiny_climate / "validation").glob("*.h5"))
    raw = [(h5py.File(f)["climate/data"][()], h5py.File(f)["climate/labels_0"][()]) for f in files[:2]]
    for i, (x, y) in enumerate(raw):
        expected = (x.astype(np.float64) - stats["min"]) / (stats["max"] - stats["min"])
        expected = expected.reshape(32, 2, 48, 2, 16).mean(axis=(1, 3))
        np.testing.assert_allclose(fields[i], expected, rtol=2e-5, atol=2e-6)
        np.testing.assert_array_equal(labels[i], y[1::2, 1::2])
    # Chunked + compressed copies go through h5py and give the same batches.
    chunked = tmp_path / "chunked"
    for split in ("train", "validation", "test"):
        (chunked / split).mkdir(parents=True)
        for f in sorted((tiny_climate / split).glob("*.h5")):
            with h5py.File(f) as src, h5py.File(chunked / split / f.name, "w") as dst:
                dst.create_dataset("climate/data", data=src["climate/data"][()], chunks=(16, 16, 16),
                                   compression="gzip")
                dst.create_dataset("climate/labels_0", data=src["climate/labels_0"][()].astype(np.uint8),
                                   chunks=True)
    (chunked / "stats.h5").write_bytes((tiny_climate / "stats.h5").read_bytes())
    assert inspect_file(str(next((chunked / "train").glob("*.h5"))), TINY_GRID).data_offset is None
    (fields2, labels2), = evaluation_dataset(tiny_cfg(chunked, downsample=2), "validation")[0].take(1)
    np.testing.assert_array_equal(fields2, fields)
    np.testing.assert_array_equal(labels2, labels)


@pytest.mark.parametrize("cut", ["fields", "labels"])
def test_a_file_cut_short_after_screening_is_named_by_the_raw_reader(tiny_climate, tmp_path, cut):
    """The raw reader reads each array at its offset: a file truncated after the start-up screening (a copy
    still arriving, a full disk) is named with the array it cuts, never read short."""
    root = tmp_path / "data"
    shutil.copytree(tiny_climate, root, ignore=shutil.ignore_patterns("netcdf"))
    cfg = tiny_cfg(root)
    dataset, _ = evaluation_dataset(cfg, "validation")
    victim = sorted((root / "validation").glob("*.h5"))[0]
    info = inspect_file(str(victim), TINY_GRID)
    keep = info.data_offset + 100 if cut == "fields" else info.label_offset + 10
    victim.write_bytes(victim.read_bytes()[:keep])
    with pytest.raises(tf.errors.OpError) as caught:
        for _ in dataset:
            pass
    error = data_error_from_pipeline(caught.value)
    what, offset = ("climate/data", info.data_offset) if cut == "fields" else ("labels", info.label_offset)
    assert error is not None and str(error) == (
        f"{victim}: truncated: {what} at byte offset {offset} needs "
        f"{TINY_GRID[0] * TINY_GRID[1] * (16 * 4 if cut == 'fields' else np.dtype(info.label_dtype).itemsize)} "
        f"bytes, the file holds {keep - offset} of them")


def test_input_ceiling_does_the_pipeline_work_on_both_readers_and_the_bench_reports_it(tiny_climate, tmp_path):
    """The one-core numpy loop that ``bench --input-only`` measures the pipeline against: 15 samples of the 12
    training files (cycled in name order) read by byte offset, or with h5py from chunked, compressed copies,
    normalised and pooled like the pipeline (``value_sum`` against numpy in float64), then cropped and rolled."""
    files = sorted((tiny_climate / "train").glob("*.h5"))
    stats = load_stats(tiny_climate / "stats.h5")
    fields = [h5py.File(f)["climate/data"][()].astype(np.float64) for f in files]
    expected = sum(((x - stats["min"]) / (stats["max"] - stats["min"])).sum() / 4 for x in fields + fields[:3])
    chunked = tmp_path / "chunked" / "train"
    chunked.mkdir(parents=True)
    for f in files:
        with h5py.File(f) as src, h5py.File(chunked / f.name, "w") as dst:
            dst.create_dataset("climate/data", data=src["climate/data"][()], chunks=(16, 16, 16), compression="gzip")
            dst.create_dataset("climate/labels_0", data=src["climate/labels_0"][()], chunks=True)
    (chunked.parent / "stats.h5").write_bytes((tiny_climate / "stats.h5").read_bytes())
    for root in (tiny_climate, chunked.parent):
        ceiling = input_ceiling(tiny_cfg(root, downsample=2, crop=[24, 40], augment=True), 15)
        assert ceiling["samples"] == 15 and ceiling["samples_per_second"] == pytest.approx(15 / ceiling["seconds"])
        # Each value: x - min, / (max - min), the mean of 4 in float32, each step within half an ulp, all
        # values >= 0 (the training minimum): the sum within 6 ulps relative.
        assert ceiling["value_sum"] == pytest.approx(expected, rel=6 * 2.0 ** -24)
        label_bytes = h5py.File(files[0])["climate/labels_0"].dtype.itemsize
        assert ceiling["bytes_per_sample"] == 64 * 96 * (16 * 4 + label_bytes)
    # The bench runs it beside the pipeline and reports the ratio, on the files in data_dir: a config's staging
    # folder is neither timed nor filled (the Gordon Bell configs stage to /dev/shm).
    out, stage = tmp_path / "input.json", tmp_path / "stage"
    run_python(["-m", "common.tools.bench", "--config",
                str(REPO / "configs/climate_seg/demo_tiramisu.yaml"), *tiny_train_overrides(tiny_climate, "tiramisu"),
                "--set", f"data.stage_dir={stage}", "--steps", "2", "--input-only", "--json", str(out)])
    i = json.loads(out.read_text())["input"]
    assert not stage.exists() and i["config_stage_dir_not_used"] == str(stage)
    assert i["ceiling_samples_per_second_per_core"] > 0 and i["bytes_per_sample"] == 64 * 96 * (64 + label_bytes)
    assert i["ratio_to_ceiling"] == pytest.approx(i["samples_per_second_per_core"]
                                                  / i["ceiling_samples_per_second_per_core"])


def test_a_shuffle_buffer_larger_than_the_epoch_shuffles_within_the_epoch(tiny_climate):
    """data.shuffle_buffer above a rank's epoch: the epoch is still each training sample once (per-sample
    field sums as in an unshuffled epoch) and ends there."""
    def sums(cfg):
        datasets = build_datasets(cfg, Distributed())
        batches = list(datasets.train_epoch(0).take(7))   # one more than the epoch's, if it did not end
        assert len(batches) == datasets.steps_per_epoch == 6
        return np.sort(np.concatenate([tf.reduce_sum(x, axis=(1, 2, 3)).numpy() for x, _ in batches]))

    np.testing.assert_array_equal(sums(tiny_cfg(tiny_climate, shuffle_buffer=100)), sums(tiny_cfg(tiny_climate)))


def test_crops_and_downsampling(tiny_climate):
    x = tf.reshape(tf.range(8 * 12 * 16, dtype=tf.float32), (8, 12, 16))
    y = tf.reshape(tf.range(8 * 12), (8, 12))
    cx, cy = crop(x, y, (4, 6))
    np.testing.assert_array_equal(cy, y.numpy()[2:6, 3:9])
    a, b = crop(x, y, (4, 6), tf.constant([1, 2])), crop(x, y, (4, 6), tf.constant([1, 2]))
    np.testing.assert_array_equal(a[1], b[1])
    dx, dy = downsample(x, y, 4)
    np.testing.assert_allclose(dx, x.numpy().reshape(2, 4, 3, 4, 16).mean(axis=(1, 3)))
    np.testing.assert_array_equal(dy, y.numpy()[2::4, 2::4])

    cfg = tiny_cfg(tiny_climate, crop=[32, 48], augment=True, batch_size=1)

    stand_in = Distributed()   # rank 0 of 2: the epoch's steps count both ranks' samples (the shares: test_epochs)
    stand_in.rank, stand_in.size = 0, 2
    datasets = build_datasets(cfg, stand_in)
    assert datasets.steps_per_epoch == 6 and datasets.train_samples == 12
    batches = list(datasets.train_epoch(0).take(6))
    assert all(b[0].shape == (1, 32, 48, 16) for b in batches)


# -- gradient lag -----------------------------------------------------------------------------------

def test_gradient_lag_applies_each_step_gradient_one_step_later():
    from common import distributed
    from common.training_model import TrainingModel

    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(3, 4, 2)).astype(np.float32), rng.normal(size=(3, 4, 1)).astype(np.float32)
    w0 = rng.normal(size=(2, 1)).astype(np.float32)
    inputs = keras.Input((2,))
    network = keras.Model(inputs, keras.layers.Dense(1, use_bias=False)(inputs))
    network.layers[-1].kernel.assign(w0)
    model = TrainingModel(network, distributed.init(), gradient_lag=1)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=False)
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)), epochs=1, verbose=0, shuffle=False)

    def gradient(w, xb, yb):
        return 2 * xb.T @ (xb @ w - yb) / len(xb)

    weights, pending = w0.astype(np.float64), None
    for xb, yb in zip(x, y):
        g = gradient(weights, xb, yb)
        if pending is not None:
            weights = weights - 0.1 * pending
        pending = g
    np.testing.assert_allclose(np.asarray(network.layers[-1].kernel), weights, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(model._lagged_gradients[0]), pending, rtol=1e-5)


# -- training end to end ------------------------------------------------------------------------------

def tiny_train_overrides(root, model: str, epochs: int = 2) -> list[str]:
    pairs = {
        "data.data_dir": str(root), "data.grid": "[64, 96]", "data.downsample": "2", "data.batch_size": "2",
        "data.synth.generate_if_missing": "false", "model.name": model,
        "model.tiramisu.growth_rate": "4", "model.tiramisu.first_filters": "8", "model.tiramisu.kernel_size": "3",
        "model.deeplab.blocks": "[1, 1, 1, 1]", "model.deeplab.base_filters": "8",
        "model.deeplab.aspp_filters": "16", "model.deeplab.decoder_filters": "16",
        "model.deeplab.low_level_filters": "8", "train.epochs": str(epochs), "train.tensorboard": "false",
    }
    return [arg for key, value in pairs.items() for arg in ("--set", f"{key}={value}")]


@pytest.mark.horovod
def test_tiny_tiramisu_two_ranks_with_gradient_lag_trains_and_evaluates(tiny_climate, tmp_path):
    run = tmp_path / "run"
    run_python(["-m", "climate_seg.train", "--config", "configs/climate_seg/demo_tiramisu.yaml", "--output-dir",
                str(run), *tiny_train_overrides(tiny_climate, "tiramisu"), "--set", "train.gradient_lag=1",
                "--set", "mlperf.enabled=true"], ranks=2)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["ranks"] == 2 and summary["epochs_completed"] == 2
    for key in ("val_mean_iou", "val_iou_cyclone", "val_pixel_accuracy"):
        assert 0.0 <= summary["final"][key] <= 1.0
    checker = run_python(["-m", "mlperf_logging.compliance_checker", "--usage", "hpc", "--ruleset", "3.0.0",
                          str(run / "mlperf.log")], check=False, cwd=run)
    output = checker.stdout + checker.stderr
    # Open division; a 2-epoch run cannot reach mean IoU 0.82, the only check allowed to fail.
    assert "open_deepcam.yaml" in output and "CHECK for" not in output and "Required" not in output, output
    assert "Failed checks for eval_accuracy" in output
    result = run_python(["-m", "climate_seg.evaluate", "--run-dir", str(run)])
    metrics = json.loads((run / "metrics.json").read_text())
    assert set(metrics["iou"]) == set(CLASS_NAMES)
    assert 0.0 <= metrics["mean_iou"] <= 1.0 and 0.0 <= metrics["pixel_accuracy"] <= 1.0
    confusion = np.array(metrics["confusion_matrix"])
    assert confusion.sum() == 4 * 32 * 48
    assert metrics["mean_iou"] == pytest.approx(iou_from_confusion(confusion)["mean_iou"])
    assert (run / "masks.png").stat().st_size > 10_000 and "mean IoU" in result.stdout


@pytest.mark.parametrize("onednn", ["0", "1"])
def test_tiny_deeplab_trains_and_evaluates(tiny_climate, tmp_path, onednn):
    """With TensorFlow's Eigen kernels (no dilated-conv gradient) as well as with oneDNN's."""
    run = tmp_path / "run"
    kernels = {"TF_ENABLE_ONEDNN_OPTS": onednn}
    run_python(["-m", "climate_seg.train", "--config", "configs/climate_seg/demo_deeplab.yaml", "--output-dir",
                str(run), *tiny_train_overrides(tiny_climate, "deeplab"), "--set", "model.deeplab.decoder=bilinear"],
               env=kernels)
    assert json.loads((run / "summary.json").read_text())["cpu"]["onednn"] is (onednn == "1")
    run_python(["-m", "climate_seg.evaluate", "--run-dir", str(run), "--split", "validation"], env=kernels)
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["split"] == "validation" and metrics["n_samples"] == 4


@pytest.mark.parametrize("split,dataset,index,value,message", [
    ("train", "climate/data", (5, 7, 3), np.nan, "climate/data holds NaN or Inf"),
    ("validation", "climate/labels_0", (0, 41), 7, "climate/labels_0 holds values 7 outside 0-2"),
])
@pytest.mark.parametrize("reader", ["raw", "h5py"])
def test_bad_values_stop_the_run_naming_the_file(tiny_climate, tmp_path, split, dataset, index, value, message,
                                                 reader):
    """NaN fields and labels out of range, found as the samples are read (on the fast raw path too)."""
    root = tmp_path / "data"
    shutil.copytree(tiny_climate, root, ignore=shutil.ignore_patterns("netcdf"))
    victim = sorted((root / split).glob("*.h5"))[1]
    with h5py.File(victim, "r+") as f:
        values = f[dataset][()]
        values[index] = value
        del f[dataset]
        # Contiguous: the raw reader takes it; chunked: the h5py reader does.
        f.create_dataset(dataset, data=values, chunks=True if reader == "h5py" else None)
    result = run_python(["-m", "climate_seg.train", "--config", "configs/climate_seg/demo_tiramisu.yaml",
                         "--output-dir", str(tmp_path / "run"), *tiny_train_overrides(root, "tiramisu", epochs=1)],
                        check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == f"error: {victim}: {message}" + \
        (" (background, cyclone, river)" if "labels" in dataset else "")


def test_bad_sample_is_a_one_line_error(tiny_climate, tmp_path):
    root = tmp_path / "data"
    for split in ("train", "validation", "test"):
        (root / split).mkdir(parents=True)
        for f in (tiny_climate / split).glob("*.h5"):
            (root / split / f.name).write_bytes(f.read_bytes())
    (root / "stats.h5").write_bytes((tiny_climate / "stats.h5").read_bytes())
    victim = sorted((root / "train").glob("*.h5"))[0]
    victim.write_bytes(victim.read_bytes()[:5000])
    result = run_python(["-m", "climate_seg.train", "--config", "configs/climate_seg/demo_tiramisu.yaml",
                         "--output-dir", str(tmp_path / "run"), *tiny_train_overrides(root, "tiramisu")], check=False)
    assert result.returncode == 2
    assert f"{victim}: not a readable HDF5 file" in result.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "run").exists()
    result = run_python(["-m", "common.tools.check_data", "--config", "configs/climate_seg/demo_tiramisu.yaml",
                         *tiny_train_overrides(root, "tiramisu")], check=False)
    assert result.returncode != 0 and victim.name in result.stdout + result.stderr
