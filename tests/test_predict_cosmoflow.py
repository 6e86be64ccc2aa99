"""``python -m cosmoflow.predict``: the parameters of new volumes, read back with the csv and json modules; the
same numbers evaluate writes for the same labelled samples (de-normalised the same way); a box larger than the
training volume cut into sub-volumes in C order; files without targets; two ranks; the refusals (one line,
exit 2, nothing changed)."""

from __future__ import annotations

import csv
import json
import pathlib
import shutil

import h5py
import numpy as np
import pytest

from conftest import REPO, assert_predict_refuses, run_python, tiny_cosmo_overrides

DEMO = str(REPO / "configs/cosmoflow/demo.yaml")
NAMES = ["Omega_m", "sigma_8", "n_s", "H0"]
OFFSET = np.array([0.1, 0.0, -0.05, 0.0])   # the run's normalisation: what predict de-normalises with
SCALE = np.array([2.0, 1.0, 1.5, 1.0])


@pytest.fixture(scope="module")
def trained(tiny_cosmo_data, tmp_path_factory):
    """A tiny run with a target normalisation, evaluated on its validation split (16 samples, one per file)."""
    run = tmp_path_factory.mktemp("cosmo-predict") / "run"
    run_python(["-m", "cosmoflow.train", "--config", DEMO, *tiny_cosmo_overrides(tiny_cosmo_data, epochs=1),
                "--set", f"data.target_offset={OFFSET.tolist()}", "--set", f"data.target_scale={SCALE.tolist()}",
                "--output-dir", str(run)])
    run_python(["-m", "cosmoflow.evaluate", "--run-dir", str(run)])
    with np.load(run / "predictions.npz") as npz:
        evaluated = {"predictions": npz["predictions"], "targets": npz["targets"]}
    assert list(evaluated["predictions"].shape) == [16, 4]
    return run, tiny_cosmo_data, evaluated


def validation_samples(data_dir) -> tuple[list[pathlib.Path], list[tuple[np.ndarray, np.ndarray]]]:
    """The validation files and their (x int16, y) samples, in name order (evaluate's order)."""
    import tensorflow as tf

    files = sorted((data_dir / "validation").glob("*.tfrecord"))
    samples = []
    for path in files:
        for record in tf.data.TFRecordDataset(str(path)):
            features = tf.train.Example.FromString(record.numpy()).features.feature
            x = np.frombuffer(features["x"].bytes_list.value[0], "<i2").reshape(16, 16, 16, 4)
            samples.append((x, np.array(features["y"].float_list.value, np.float32)))
    return files, samples


def write_box(path, samples, with_targets: bool = True) -> None:
    """A raw universe (``full``, ``unitPar``) of 32^3 whose 2x2x2 crops of 16^3, in C order, are ``samples``."""
    full = np.zeros((32, 32, 32, 4), np.int16)
    for n, (x, _) in enumerate(samples):
        i, j, k = np.unravel_index(n, (2, 2, 2))
        full[16 * i:16 * i + 16, 16 * j:16 * j + 16, 16 * k:16 * k + 16] = x
    with h5py.File(path, "w") as f:
        f["full"] = full
        if with_targets:
            f["unitPar"] = samples[0][1]


def predict(run, inputs, out, ranks: int = 1, check: bool = True, extra=()):
    return run_python(["-m", "cosmoflow.predict", "--run-dir", str(run), "--input", *map(str, inputs),
                       "--out", str(out), *extra], ranks=ranks, check=check)


def read_csv(path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def physical(normalised) -> np.ndarray:
    return np.asarray(normalised, np.float32).astype(np.float64) * SCALE + OFFSET


def test_predictions_equal_evaluate(trained, tmp_path):
    run, data, evaluated = trained
    files, samples = validation_samples(data)
    result = predict(run, [data / "validation"], tmp_path / "out")
    expected = physical(evaluated["predictions"])
    for n, path in enumerate(files):
        (row,) = read_csv(tmp_path / "out" / f"{path.name.removesuffix('.tfrecord')}.parameters.csv")
        assert [float(row[name]) for name in NAMES] == expected[n].tolist()   # exactly: same model, same floats
        # the stored targets are the file's values (its units), beside the prediction
        assert [float(row[f"stored_{name}"]) for name in NAMES] == samples[n][1].astype(np.float64).tolist()
        assert physical(evaluated["targets"][n]) == pytest.approx([float(row[f"stored_{name}"]) for name in NAMES])
    document = json.loads((tmp_path / "out" / f"{files[0].name.removesuffix('.tfrecord')}.parameters.json").read_text())
    assert document["labelled"] and document["box"] is None and document["target_names"] == NAMES
    assert list(document["volumes"][0]["predicted"].values()) == expected[0].tolist()
    index = json.loads((tmp_path / "out" / "predictions.json").read_text())
    assert len(index["inputs"]) == 16 and index["ranks"] == 1
    assert "wrote" in result.stdout


def test_box_cut_into_sub_volumes_in_c_order(trained, tmp_path):
    run, data, evaluated = trained
    _, samples = validation_samples(data)
    write_box(tmp_path / "box.h5", samples[:8])
    write_box(tmp_path / "unlabelled.h5", samples[:8], with_targets=False)
    predict(run, [tmp_path / "box.h5", tmp_path / "unlabelled.h5"], tmp_path / "out")
    expected = physical(evaluated["predictions"][:8])   # evaluate's batches of 4: the box's too
    rows = read_csv(tmp_path / "out" / "box.parameters.csv")
    assert [[int(r[f"origin_{a}"]) for a in "xyz"] for r in rows] == \
        [[16 * i for i in np.unravel_index(n, (2, 2, 2))] for n in range(8)]
    assert np.array([[float(r[name]) for name in NAMES] for r in rows]).tolist() == expected.tolist()
    assert {tuple(float(r[f"stored_{name}"]) for name in NAMES) for r in rows} == {tuple(samples[0][1].tolist())}
    unlabelled = read_csv(tmp_path / "out" / "unlabelled.parameters.csv")
    assert not any(key.startswith("stored_") for key in unlabelled[0])
    assert [[float(r[name]) for name in NAMES] for r in unlabelled] == expected.tolist()
    box = json.loads((tmp_path / "out" / "box.parameters.json").read_text())["box"]
    assert box["sub_volumes"] == 8 and box["box"] == [32, 32, 32, 4]
    assert list(box["mean"].values()) == pytest.approx(expected.mean(axis=0).tolist(), rel=1e-12)
    assert list(box["std"].values()) == pytest.approx(expected.std(axis=0, ddof=1).tolist(), rel=1e-12)
    assert (tmp_path / "out" / "box.parameters.png").stat().st_size > 10_000


@pytest.mark.horovod
def test_two_ranks_write_what_one_rank_writes(trained, tmp_path):
    run, data, _ = trained
    _, samples = validation_samples(data)
    write_box(tmp_path / "box.h5", samples[8:16])
    inputs = [data / "validation", tmp_path / "box.h5"]
    predict(run, inputs, tmp_path / "one")
    predict(run, inputs, tmp_path / "two", ranks=2)
    tables = sorted(p.name for p in (tmp_path / "one").glob("*.parameters.*") if p.suffix != ".png")
    assert len(tables) == 34 and tables == sorted(p.name for p in (tmp_path / "two").glob("*.parameters.*")
                                                  if p.suffix != ".png")
    for name in tables:
        assert (tmp_path / "one" / name).read_text() == (tmp_path / "two" / name).read_text(), name
    index = json.loads((tmp_path / "two" / "predictions.json").read_text())
    assert index["ranks"] == 2 and len(index["inputs"]) == 17


def test_refusals(trained, tmp_path):
    run, data, _ = trained
    _, samples = validation_samples(data)
    good = tmp_path / "box.h5"
    write_box(good, samples[:8])
    # a file of the user's where an output would go
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "box.parameters.csv").write_text("mine\n")
    cases = [(run, [good], tmp_path / "user", ["user"])]
    # a user's file at an output name inside a folder of predict's own
    predict(run, [good], tmp_path / "made")
    shutil.copy(good, tmp_path / "other.h5")
    (tmp_path / "made" / "other.parameters.csv").write_text("mine\n")
    cases.append((run, [tmp_path / "other.h5"], tmp_path / "made", ["other.parameters.csv", "--force"]))
    # a foreign non-empty folder, and a training run's folder
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine\n")
    cases.append((run, [good], tmp_path / "foreign", ["foreign"]))
    cases.append((run, [good], run, [str(run)]))
    # a box that is not a multiple of the crop, another channel count, a split crop of another shape
    with h5py.File(tmp_path / "odd.h5", "w") as f:
        f["full"] = np.zeros((24, 24, 24, 4), np.int16)
    cases.append((run, [tmp_path / "odd.h5"], tmp_path / "out", ["odd.h5", "multiple of the crop"]))
    with h5py.File(tmp_path / "channels.h5", "w") as f:
        f["full"] = np.zeros((32, 32, 32, 3), np.int16)
    cases.append((run, [tmp_path / "channels.h5"], tmp_path / "out", ["channels.h5", "channels last"]))
    with h5py.File(tmp_path / "crop.h5", "w") as f:
        f["x"] = np.zeros((32, 32, 32, 4), np.int16)
    cases.append((run, [tmp_path / "crop.h5"], tmp_path / "out", ["crop.h5", "data.sample_shape"]))
    # a file of another application (an ExtremeWeather-layout climate file), and a TFRecord of another size
    with h5py.File(tmp_path / "climate.h5", "w") as f:
        f["images"] = np.zeros((2, 16, 32, 48), np.float32)
    cases.append((run, [good, tmp_path / "climate.h5"], tmp_path / "out", ["climate.h5", "'full'"]))
    from cosmoflow.formats.tfrecord import write_tfrecord

    write_tfrecord(tmp_path / "big.tfrecord", [(np.zeros((32, 32, 32, 4), np.int16), samples[0][1])])
    cases.append((run, [tmp_path / "big.tfrecord"], tmp_path / "out", ["big.tfrecord", "bytes"]))
    # a run folder without its model
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.yaml").write_text((run / "config.yaml").read_text())
    cases.append((bare, [good], tmp_path / "out", ["model.keras"]))

    assert_predict_refuses("cosmoflow", cases)
    assert not (tmp_path / "out").exists()

def test_a_mock_runs_unit_parameters_map_back_onto_the_mock_ranges():
    """For a run on the suite's mock universes, predict's physical values invert the mock's own normalisation
    (cosmoflow.mock.normalise_targets, the reference) over every target order; other runs keep the files' units."""
    from cosmoflow.config import CosmoflowConfig
    from cosmoflow.mock import normalise_targets, parameter_ranges
    from cosmoflow.predict import mock_physical

    cfg = CosmoflowConfig.model_validate({"data": {"data_dir": "d", "mock": {"generate_if_missing": True}}})
    low, high = np.array(parameter_ranges(cfg.data.mock)).T
    physical = np.random.default_rng(0).uniform(low, high, size=(50, 4))
    unit = normalise_targets(physical, cfg.data.mock).astype(np.float64)   # float32 in the files
    for order in (["Omega_m", "sigma_8", "n_s", "H0"], ["H0", "n_s"]):
        cfg.data.target_names = order
        half, centre = mock_physical(cfg)
        columns = [["Omega_m", "sigma_8", "n_s", "H0"].index(name) for name in order]
        # float32 unitPar: a relative error of 2^-24 of |unit| <= 1, times the half width
        np.testing.assert_allclose(unit[:, columns] * half + centre, physical[:, columns], rtol=0,
                                   atol=float(np.max(high - low)) * 2.0 ** -23)
    assert mock_physical(CosmoflowConfig.model_validate({"data": {"data_dir": "d", "mock": {"generate_if_missing": False}}})) is None
    assert mock_physical(CosmoflowConfig.model_validate({"data": {"data_dir": "d",
        "mock": {"generate_if_missing": True}, "target_offset": [0, 0, 0, 0], "target_scale": [1, 1, 1, 1]}})) is None
