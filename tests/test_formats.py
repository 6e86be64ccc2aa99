"""The published datasets as their reference codes write them (shared/reference/formats.md): fixtures
written here with h5py and TensorFlow's own writers in each reference layout, tiny shapes, and the
values the network sees checked against numpy: normalised tensors, boxes in pixel rows and columns,
targets in order."""

import hashlib
import json

import h5py
import numpy as np
import pytest
import tensorflow as tf

from climate_seg.detection.config import DetectConfig
from climate_seg.segmentation.config import ClimateConfig
from common.config import validate
from common.distributed import Distributed
from common.errors import DataError, UserInputError
from conftest import DERIVED, run_python

GRID = (6, 10)
RNG = np.random.default_rng(2026)


# -- climate segmentation: DeepCAM and SC18 --------------------------------------------------------------

def climate_fields(n):
    """n samples (H, W, 16) in physical-ish units, labels (H, W) in 0-2."""
    fields = RNG.normal(100.0, 30.0, (n, *GRID, 16)).astype(np.float32) * np.linspace(0.5, 3, 16, dtype=np.float32)
    labels = RNG.integers(0, 3, (n, *GRID))
    return fields, labels


def write_deepcam(root, fields, labels):
    """DeepCAM: climate/data (H, W, 16), climate/labels_0 float32; <root>/stats.h5 with climate/{minval, maxval,
    mean, sqmean, count} (summarize_data.py)."""
    for split, take in (("train", slice(0, 4)), ("validation", slice(4, 6))):
        (root / split).mkdir(parents=True)
        for i, (x, y) in enumerate(zip(fields[take], labels[take])):
            with h5py.File(root / split / f"data-2106-01-0{i + 1}-00-1.h5", "w") as f:
                f["climate/data"], f["climate/labels_0"] = x, y.astype(np.float32)
    pixels = fields[:4].reshape(-1, 16).astype(np.float64)
    with h5py.File(root / "stats.h5", "w") as f:
        f["climate/count"] = np.full(16, len(pixels))
        f["climate/mean"], f["climate/sqmean"] = pixels.mean(0), (pixels ** 2).mean(0)
        f["climate/minval"], f["climate/maxval"] = pixels.min(0), pixels.max(0)
    return pixels


def write_sc18(root, fields, labels):
    """SC18 ClimDeepLearn: climate/data (16, H, W), climate/labels; climate/stats (16, 4) [mean, max, min, std]
    saved as stats.h5 inside each split folder (summarize_stats.py)."""
    pixels = fields[:4].reshape(-1, 16).astype(np.float64)
    table = np.stack([pixels.mean(0), pixels.max(0), pixels.min(0), pixels.std(0)], axis=1)
    for split, take in (("train", slice(0, 4)), ("validation", slice(4, 6))):
        (root / split).mkdir(parents=True)
        for i, (x, y) in enumerate(zip(fields[take], labels[take])):
            with h5py.File(root / split / f"sample_{i}.h5", "w") as f:
                f["climate/data"], f["climate/labels"] = np.transpose(x, (2, 0, 1)), y.astype(np.int32)
        with h5py.File(root / split / "stats.h5", "w") as f:
            f["climate/stats"] = table
    return pixels


def climate_cfg(root, **data):
    return ClimateConfig(data={"data_dir": str(root), "grid": list(GRID), "batch_size": 2, **data}, train={"seed": 1})


@pytest.mark.parametrize("layout", ["deepcam", "sc18"])
@pytest.mark.parametrize("normalization", ["minmax", "zscore"])
def test_climate_samples_and_statistics_as_published(tmp_path, layout, normalization):
    from climate_seg.cam5.data import stats_path
    from climate_seg.cam5.stats import load_stats
    from climate_seg.segmentation.data import build_datasets, evaluation_dataset, split_files

    fields, labels = climate_fields(6)
    pixels = (write_deepcam if layout == "deepcam" else write_sc18)(tmp_path, fields, labels)
    cfg = climate_cfg(tmp_path, normalization=normalization)
    assert stats_path(cfg) == (tmp_path / "stats.h5" if layout == "deepcam" else tmp_path / "train" / "stats.h5")
    stats = load_stats(stats_path(cfg))
    assert stats["format"].startswith("DeepCAM" if layout == "deepcam" else "SC18")
    np.testing.assert_allclose(stats["std"], pixels.std(0), rtol=1e-6)   # DeepCAM's from sqmean - mean^2
    assert len(split_files(cfg, "train")) == 4   # SC18's stats.h5 among the samples is not one
    (x, y), = evaluation_dataset(cfg, "validation")[0].take(1)
    if normalization == "minmax":   # DeepCAM: (x - minval) / (maxval - minval)
        expected = (fields[4:6] - pixels.min(0)) / (pixels.max(0) - pixels.min(0))
    else:
        expected = (fields[4:6] - pixels.mean(0)) / pixels.std(0)
    np.testing.assert_allclose(x.numpy(), expected, rtol=2e-5, atol=2e-5)   # channels last in either layout
    np.testing.assert_array_equal(y.numpy(), labels[4:6])
    cfg.loss.class_weights = "none"
    datasets = build_datasets(cfg, Distributed())
    assert datasets.steps_per_epoch == 2 and datasets.validation_steps == 1


def test_published_statistics_are_read_and_class_counts_go_to_the_derived_folder(tmp_path):
    """A short training run on DeepCAM-layout data: its stats.h5 is read, and the class counts the weighted loss
    needs are written into the derived folder (by default one per dataset under $HPCDL_DERIVED_DIR, named after
    the data folder and the sha256 of its absolute path); the data folder is left exactly as it was."""
    fields, labels = climate_fields(6)
    write_deepcam(tmp_path / "data", fields, labels)
    before = {p: p.read_bytes() for p in sorted((tmp_path / "data").rglob("*")) if p.is_file()}
    result = run_python(["-m", "climate_seg.train", "--config", "configs/climate_seg/demo_tiramisu.yaml",
                         "--output-dir", str(tmp_path / "run"), "--set", f"data.data_dir={tmp_path / 'data'}",
                         "--set", f"data.grid=[{GRID[0]},{GRID[1]}]", "--set", "data.downsample=1",
                         "--set", "data.batch_size=2", "--set", "data.synth.generate_if_missing=false",
                         "--set", "model.tiramisu.growth_rate=2", "--set", "model.tiramisu.first_filters=4",
                         "--set", "model.tiramisu.kernel_size=3", "--set", "model.tiramisu.down_blocks=[1]",
                         "--set", "model.tiramisu.up_blocks=[1]", "--set", "model.tiramisu.bottleneck_layers=1",
                         "--set", "train.epochs=1", "--set", "train.tensorboard=false",
                         "--set", "loss.class_weights=inverse_frequency"])
    assert "DeepCAM (climate/data H x W x 16, climate/labels_0) samples" in result.stdout
    assert {p: p.read_bytes() for p in sorted((tmp_path / "data").rglob("*")) if p.is_file()} == before
    folder = (tmp_path / "data").resolve()
    derived = DERIVED / f"data-{hashlib.sha256(str(folder).encode()).hexdigest()[:12]}"
    counts = json.loads((derived / "class_counts.json").read_text())
    np.testing.assert_array_equal(counts["counts"], np.bincount(labels[:4].reshape(-1), minlength=3))


# -- ExtremeWeather boxes ------------------------------------------------------------------------------------

def write_extremeweather(path, boxes):
    """hur-detect: images (N, 16, H, W), boxes (N, 15, 5) as [xmin, xmax, ymin, ymax, category] with its x along
    the first image axis, i.e. [row min, row max, column min, column max, class], padded with -1."""
    n = len(boxes)
    padded = np.full((n, 15, 5), -1, np.int32)
    for i, rows in enumerate(boxes):
        padded[i, :len(rows)] = rows
    with h5py.File(path, "w") as f:
        f["images"] = RNG.normal(size=(n, 16, 32, 48)).astype(np.float32)
        f["boxes"] = padded


def detect_cfg(root, **data):
    return DetectConfig(task="detection", data={"data_dir": str(root), "grid": [32, 48], "batch_size": 2, **data},
                        model={"filters": [8, 16, 16]})


@pytest.mark.parametrize("numbering", [0, 1])
def test_extremeweather_boxes_in_the_writers_column_order(tmp_path, numbering):
    from climate_seg.detection.data import split_samples, true_boxes

    # One tall narrow box: rows 2-20, columns 30-34 (an atmospheric river, class 3 in 0-3).
    rows = [[[2, 20, 30, 34, 3 + numbering], [5, 9, 1, 6, 0 + numbering]], [[10, 12, 40, 47, 1 + numbering]]]
    (tmp_path / "train").mkdir()
    write_extremeweather(tmp_path / "train" / "climo_1979.h5", rows)
    samples = split_samples(detect_cfg(tmp_path), "train")
    assert [s.class_offset for s in samples] == [numbering, numbering]   # told by the classes present
    first, = true_boxes(detect_cfg(tmp_path), samples[0])
    # The network's boxes are [ymin (row), xmin (column), ymax, xmax, class 0-3].
    np.testing.assert_array_equal(first, [[2, 30, 20, 34, 3], [5, 1, 9, 6, 0]])


@pytest.mark.parametrize("rows, message", [
    ([[[2, 20, 30, 34, 2]]], "cannot tell 0-3 (hur-detect keras-tf) from 1-4"),
    ([[[2, 20, 30, 34, 0], [1, 2, 3, 4, 4]]], "classes 0 and 4"),
    ([[[20, 2, 30, 34, 0]]], "boxes[0] row 0 [20.0, 2.0, 30.0, 34.0, 0.0]"),
    ([[[2, 20, 30, 50, 0]]], "outside the 32 x 48 image"),
    ([[[2, 20, 30, 34, 7]]], "class 7 outside 0-4"),
])
def test_bad_boxes_are_named_by_file_sample_and_row(tmp_path, rows, message):
    from climate_seg.detection.data import split_samples

    (tmp_path / "train").mkdir()
    write_extremeweather(tmp_path / "train" / "climo_1979.h5", rows)
    with pytest.raises(DataError) as raised:
        split_samples(detect_cfg(tmp_path), "train")
    assert str(raised.value).startswith(str(tmp_path / "train")) and message in str(raised.value)


# -- HEP benchmark files -------------------------------------------------------------------------------------

def test_hep_benchmark_files_by_their_names_and_layout(tmp_path):
    from hep_cnn.config import HepConfig
    from hep_cnn.data import evaluation_events, split_chunks

    eta_phi = RNG.exponential(1.0, (6, 3, 8, 8)).astype(np.float32)   # (N, 3, eta, phi)
    for split in ("training", "validation", "test"):
        with h5py.File(tmp_path / f"hep_{split}_chunk0.hdf5", "w") as f:
            f["data"] = np.transpose(eta_phi, (0, 1, 3, 2))   # the benchmark's (N, 3, phi, eta)
            f["label"], f["weight"], f["psr"] = np.arange(6) % 2, np.ones(6, np.float32), np.zeros(6)
            f["normweight"] = np.ones(6, np.float32)
    (tmp_path / "channel_maxima.json").write_text(json.dumps({"channel_max": [1, 1, 1], "weight_max": 1.0}))
    cfg = validate(HepConfig, {"data": {"data_dir": str(tmp_path), "image_size": 8, "batch_size": 6,
                                        "scale_by_maxima": False}}, "test")
    assert [c.layout for c in split_chunks(cfg, "train")] == ["benchmark"]
    x = next(iter(evaluation_events(cfg, "test")))[0].numpy()
    np.testing.assert_array_equal(x, np.transpose(eta_phi, (0, 2, 3, 1)))   # (N, eta, phi, C)


# -- CosmoFlow ------------------------------------------------------------------------------------------------

SHAPE = (4, 4, 4, 2)


def cosmo_cfg(root, **data):
    from cosmoflow.config import CosmoflowConfig

    return validate(CosmoflowConfig, {"data": {"data_dir": str(root), "sample_shape": list(SHAPE), "batch_size": 2,
                                               **data}}, "test")


def volumes(n, channels=SHAPE[3]):
    return RNG.integers(0, 30, (n, *SHAPE[:3], channels)).astype(np.int16)


def network_view(cfg, split="validation"):
    from cosmoflow.data import evaluation_dataset

    xs, ys = zip(*[(x.numpy(), y.numpy()) for x, y in evaluation_dataset(cfg, split)[0]])
    return np.concatenate(xs), np.concatenate(ys)


def write_records(directory, examples):
    directory.mkdir(parents=True)
    for i, feature in enumerate(examples):
        with tf.io.TFRecordWriter(str(directory / f"univ_{i:03d}.tfrecord")) as writer:
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def test_cosmoflow_split_hdf5_from_prepare(tmp_path):
    """prepare.py without --write-tfrecord: one crop per .hdf5 file, datasets x (int16) and y."""
    x, y = volumes(4), RNG.uniform(-1, 1, (4, 4)).astype(np.float32)
    for split, take in (("train", slice(0, 2)), ("validation", slice(2, 4))):
        (tmp_path / split).mkdir()
        for i in range(take.start, take.stop):
            with h5py.File(tmp_path / split / f"subdir_univ_{i:03d}.hdf5", "w") as f:
                f["x"], f["y"] = x[i], y[i]
    seen_x, seen_y = network_view(cosmo_cfg(tmp_path, format="hdf5", target_names=["sigma_8", "Omega_m"]))
    np.testing.assert_allclose(seen_x, np.log1p(x[2:].astype(np.float32)), rtol=1e-6)
    np.testing.assert_allclose(seen_y, y[2:][:, [1, 0]], rtol=1e-6)


def test_cosmoflow_raw_hdf5_target_order_from_namepar(tmp_path):
    """Raw universes whose namePar orders the targets otherwise than the MLPerf files do."""
    full, order = volumes(3), ["H_0", "Omega_m", "N_spec", "sigma_8"]
    unit = RNG.uniform(-1, 1, (3, 4)).astype(np.float32)
    for split, take in (("train", [0, 1]), ("validation", [2])):
        (tmp_path / split).mkdir()
        for i in take:
            with h5py.File(tmp_path / split / f"univ_{i}.hdf5", "w") as f:
                f["full"], f["unitPar"], f["namePar"] = full[i], unit[i], np.array(order, dtype="S")
    cfg = cosmo_cfg(tmp_path, format="hdf5", batch_size=1)
    _, seen_y = network_view(cfg)
    np.testing.assert_allclose(seen_y, unit[2:][:, [1, 3, 2, 0]], rtol=1e-6)   # Omega_m, sigma_8, n_s, H0
    with pytest.raises(DataError, match="namePar gives the targets"):
        network_view(cosmo_cfg(tmp_path, format="hdf5", batch_size=1, file_target_names=list(
            ["Omega_m", "sigma_8", "n_s", "H0"])))


def test_cosmoflow_records_with_x_as_a_float_list(tmp_path):
    """cosmoflow-benchmark before March 2020 stored x as a float list."""
    x, y = volumes(4), RNG.uniform(-1, 1, (4, 4)).astype(np.float32)
    for split, take in (("train", range(2)), ("validation", range(2, 4))):
        write_records(tmp_path / split, [{
            "x": tf.train.Feature(float_list=tf.train.FloatList(value=x[i].astype(np.float32).ravel())),
            "y": tf.train.Feature(float_list=tf.train.FloatList(value=y[i]))} for i in take])
    seen_x, seen_y = network_view(cosmo_cfg(tmp_path))
    np.testing.assert_allclose(seen_x, np.log1p(x[2:].astype(np.float32)), rtol=1e-6)
    np.testing.assert_allclose(seen_y, y[2:], rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cosmoflow_sc18_records(tmp_path, dtype):
    """NERSC/CosmoFlow (SC18): data_raw and label_raw raw bytes, one channel, physical parameter values that
    its reader z-scored with zsAVG / zsSTD."""
    x = volumes(4, channels=1).astype(dtype)
    physical = np.stack([RNG.uniform(0.25, 0.35, 4), RNG.uniform(0.7, 0.9, 4)], axis=1).astype(dtype)
    for split, take in (("train", range(2)), ("validation", range(2, 4))):
        write_records(tmp_path / split, [{
            "data_raw": tf.train.Feature(bytes_list=tf.train.BytesList(value=[x[i].tobytes()])),
            "label_raw": tf.train.Feature(bytes_list=tf.train.BytesList(value=[physical[i].tobytes()]))}
            for i in take])
    settings = dict(sample_shape=[*SHAPE[:3], 1], file_target_names=["Omega_m", "sigma_8"], target_names=["Omega_m",
                    "sigma_8"], apply_log=False)
    with pytest.raises(DataError, match="set data.target_offset and data.target_scale"):
        network_view(cosmo_cfg(tmp_path, **settings))
    offset, scale = [0.3, 0.8], [0.05, 0.1]
    seen_x, seen_y = network_view(cosmo_cfg(tmp_path, target_offset=offset, target_scale=scale, **settings))
    volume = x[2:].astype(np.float32)
    np.testing.assert_allclose(seen_x, volume / volume.mean(axis=(1, 2, 3, 4), keepdims=True), rtol=1e-5)
    # In float32 the targets near the offset lose their leading digits: the rounding of the value and of the
    # offset (u = 2^-24 each, relative to them) divided by the scale bounds the absolute error, with a factor
    # 4 for the subtraction's and the division's own roundings.
    atol = 4 * 2.0 ** -24 * float(np.max(np.abs(physical[2:]) + np.abs(offset))) / min(scale)
    np.testing.assert_allclose(seen_y, (physical[2:] - offset) / scale, rtol=1e-5, atol=atol)


def test_cosmoflow_targets_beyond_the_output_range_are_named(tmp_path):
    from common.errors import data_error_from_pipeline

    x, y = volumes(4), RNG.uniform(-1, 1, (4, 4)).astype(np.float32)
    y[3, 2] = 3.5   # physical n_s-like values written where unitPar belong
    for split, take in (("train", range(2)), ("validation", range(2, 4))):
        write_records(tmp_path / split, [{
            "x": tf.train.Feature(bytes_list=tf.train.BytesList(value=[x[i].tobytes()])),
            "y": tf.train.Feature(float_list=tf.train.FloatList(value=y[i]))} for i in take])
    with pytest.raises(tf.errors.OpError) as raised:
        network_view(cosmo_cfg(tmp_path))
    error = str(data_error_from_pipeline(raised.value))
    assert error.startswith(str(tmp_path / "validation" / "univ_001.tfrecord")) and "output range" in error


def test_cosmoflow_families_hold_one_protocol_and_every_list_is_read_from_their_table():
    """data.format's choices and default, predict's and the data tools' file names come from FAMILIES; each
    family module holds what cosmoflow/data.py calls (a family missing a member fails here, not in a run)."""
    import typing

    from cosmoflow import formats, predict
    from cosmoflow.config import CosmoDataSection

    field = CosmoDataSection.model_fields["format"]
    assert typing.get_args(field.annotation) == tuple(formats.FAMILIES) and field.default == formats.DEFAULT
    assert predict.PATTERNS == formats.patterns() == tuple(
        pattern for name in formats.FAMILIES for pattern in formats.family(name).PATTERNS)
    assert "*.tfrecords.gz" in formats.patterns() and "*.hdf5" in formats.patterns()
    for name in formats.FAMILIES:
        family = formats.family(name)
        assert family.NAME == name
        members = ["WHAT", "PATTERNS", "select", "read", "bad_file_finder", "read_targets", "file_samples",
                   "file_selection", "COMPRESSIONS", "HOLDS_CROPS", "file_name", "write_sample"] + (
                       [] if name == formats.DEFAULT else ["recognises"])
        assert [m for m in members if not hasattr(family, m)] == [], name


def test_cosmoflow_families_write_what_they_read_and_the_mock_asks_them_what_they_hold(tmp_path):
    """The writing half of the protocol: each family's file of one mock universe, in each of its compressions, is
    named as its PATTERNS list it, told as its own by its content, and read back as written; a family that holds
    crops cuts a larger volume into them; the mock's --format choices and refusals come from the declarations."""
    import fnmatch

    from cosmoflow import formats, mock

    x = volumes(1)[0]
    y = np.array([0.25, -0.5, 0.75, -1.0], np.float32)
    physical = np.array([0.3, 0.8, 0.96, 70.0])
    for name in formats.FAMILIES:
        family = formats.family(name)
        assert "none" in family.COMPRESSIONS, name
        for compression in family.COMPRESSIONS:
            folder = tmp_path / name / compression / "train"
            folder.mkdir(parents=True)
            path = folder / family.file_name("univ_train_000000", compression)
            family.write_sample(path, x, y, physical, compression)
            assert any(fnmatch.fnmatch(path.name, pattern) for pattern in family.PATTERNS), path.name
            assert formats.family_of_file(str(path)) is family
            cfg = cosmo_cfg(tmp_path / name / compression, format=name, compression=compression)
            [(_, read_x, read_y, _)] = family.file_samples(cfg, str(path), {})
            np.testing.assert_array_equal(read_x, x)
            np.testing.assert_array_equal(read_y, y)
        if family.HOLDS_CROPS:   # the sample tiled to twice its side: a volume read as 8 crops, each the sample
            path = tmp_path / name / family.file_name("univ_large", "none")
            family.write_sample(path, np.tile(x, (2, 2, 2, 1)), y, physical, "none")
            crops = list(family.file_samples(cosmo_cfg(tmp_path, format=name), str(path), {}))
            assert len(crops) == 8 and all(np.array_equal(crop[1], x) for crop in crops)
    parser = mock.build_parser()
    assert next(a for a in parser._actions if a.dest == "format").choices == list(formats.FAMILIES)
    for name in formats.FAMILIES:
        family = formats.family(name)
        for option, refused in ((["--gzip"], "gzip" not in family.COMPRESSIONS),
                                (["--crops-per-side", "2"], not family.HOLDS_CROPS)):
            out = tmp_path / "refused" / name / option[0].strip("-")
            if refused:
                with pytest.raises(UserInputError, match=rf"^{option[0]}\b.* {name}\b"):
                    mock.main(["--format", name, "--out", str(out), *option])
                assert not out.exists()
