"""``python -m hep_cnn.predict`` on a HEP CNN run: per-event scores read back by h5py and the csv module, equal to
what ``hep_cnn.evaluate`` wrote on the same labelled files; the working point (the cuts' background efficiency,
one given, a threshold given) recorded; both layouts, labels optional; two ranks; the refusals (exit 2, one line,
nothing changed)."""

from __future__ import annotations

import argparse
import csv
import json
import shutil

import h5py
import numpy as np
import pytest
import yaml

from common.errors import UserInputError
from common.storage.run_dirs import mark_run_dir
from hep_cnn.synth import generate_dataset, write_all_events, write_benchmark
from conftest import assert_predict_refuses, run_python

SIZE = 16
BATCH = 16   # the test files hold 32 events: evaluate's batches (across the files) are predict's (per file)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """Synthetic 16 x 16 events (32 a file), a one-epoch tiny CNN trained on them, evaluated on the test split
    (predictions.npz)."""
    root = tmp_path_factory.mktemp("predict-hep")
    data = generate_dataset(root / "data", 96, 64, 64, SIZE, events_per_file=32, seed=5, progress=False)
    run = root / "run"
    pairs = {"data.data_dir": str(data), "data.derived_dir": str(root / "derived"), "data.image_size": str(SIZE),
             "data.batch_size": str(BATCH), "data.synth.generate_if_missing": "false", "model.conv_units": "1",
             "model.filters": "4", "model.dense_units": "8", "train.epochs": "1", "train.tensorboard": "false"}
    run_python(["-m", "hep_cnn.train", "--config", "configs/hep_cnn/demo.yaml", "--output-dir", str(run),
                *[arg for key, value in pairs.items() for arg in ("--set", f"{key}={value}")]])
    run_python(["-m", "hep_cnn.evaluate", "--run-dir", str(run)])
    return {"root": root, "data": data, "run": run}


def predict(run, inputs, out, *options, ranks=1, check=True):
    return run_python(["-m", "hep_cnn.predict", "--run-dir", str(run), "--input", *map(str, inputs),
                       "--out", str(out), *options], ranks=ranks, check=check)


def read_hdf5(path) -> tuple[dict, dict]:
    with h5py.File(path, "r") as f:
        return {name: f[name][()] for name in f}, dict(f.attrs)


def read_csv(path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def columns_of(path) -> dict:
    """The labels, raw weights and passSR an all_events file holds."""
    with h5py.File(path, "r") as f:
        return {"label": f["all_events/y"][()], "weight": f["all_events/weight"][()],
                "pass_sr": f["all_events/passSR"][()]}


def weighted_efficiency(selected, labels, weights, signal: bool) -> float:
    chosen = labels == (1 if signal else 0)
    return float(np.sum(weights * (selected & chosen)) / np.sum(weights * chosen))


def test_scores_equal_evaluate_and_the_cuts_working_point_is_recorded(trained, tmp_path):
    run, data = trained["run"], trained["data"]
    tests = sorted(data.glob("test_*.h5"))
    out = tmp_path / "out"
    result = predict(run, tests, out)
    assert "working point: score >= " in result.stdout and f"wrote {out / 'predictions.json'}" in result.stdout
    evaluated = np.load(run / "predictions.npz")
    scores, threshold = [], None
    for path in tests:
        table, attributes = read_hdf5(out / f"{path.stem}.scores.h5")
        assert attributes["written_by"] == "hpc-dl-suite hep_cnn.predict"
        assert attributes["config"] == (run / "config.yaml").read_text() and len(attributes["model_sha256"]) == 64
        assert attributes["working_point"] == "cuts" and attributes["source"] == str(path.resolve())
        threshold = attributes["threshold"]
        assert np.array_equal(table["selected"], (table["score"] >= np.float32(threshold)).astype(np.uint8))
        given = columns_of(path)
        for name in ("label", "weight", "pass_sr"):
            assert np.array_equal(table[name], given[name])
        rows = read_csv(out / f"{path.stem}.scores.csv")
        assert list(rows[0]) == ["event", "score", "selected", "label", "weight", "pass_sr"]
        assert [int(r["event"]) for r in rows] == list(range(len(table["score"])))
        assert np.array_equal(np.array([float(r["score"]) for r in rows], np.float32), table["score"])
        assert [int(r["selected"]) for r in rows] == table["selected"].tolist()
        scores.append(table["score"])
    assert np.array_equal(np.concatenate(scores), evaluated["scores"])   # exactly evaluate's floats
    assert (out / f"{tests[0].stem}.scores.png").stat().st_size > 10_000

    # The working point: the cuts' weighted background efficiency on the validation split (from its files), the
    # loosest network threshold whose weighted background efficiency there does not exceed it.
    validation = sorted(data.glob("val_*.h5"))
    given = {name: np.concatenate([columns_of(p)[name] for p in validation]) for name in ("label", "weight", "pass_sr")}
    cut_fpr = weighted_efficiency(given["pass_sr"].astype(bool), given["label"], given["weight"], signal=False)
    _, attributes = read_hdf5(out / f"{tests[0].stem}.scores.h5")
    assert attributes["target_background_efficiency"] == pytest.approx(cut_fpr, rel=1e-12)
    assert attributes["validation_events"] == len(given["label"])
    scored = tmp_path / "validation"
    predict(run, validation, scored, "--threshold", "0.5")
    validation_scores = np.concatenate([read_hdf5(scored / f"{p.stem}.scores.h5")[0]["score"] for p in validation])
    fpr = weighted_efficiency(validation_scores >= threshold, given["label"], given["weight"], signal=False)
    assert fpr == pytest.approx(attributes["validation_background_efficiency"], rel=1e-9) and fpr <= cut_fpr + 1e-12
    looser = validation_scores[validation_scores < threshold]
    if len(looser):   # the next ROC point down selects more background than the cuts do
        assert weighted_efficiency(validation_scores >= looser.max(), given["label"], given["weight"],
                                   signal=False) > cut_fpr
    index = json.loads((out / "predictions.json").read_text())
    assert [row["threshold"] for row in index["inputs"]] == [threshold] * len(tests)
    assert [row["input"] for row in index["inputs"]] == sorted(str(p) for p in tests)


def test_both_layouts_without_labels_give_the_same_scores(trained, tmp_path):
    """A test file's images alone, in the all_events and the benchmark layout: the labelled file's scores; the
    outputs hold no columns the inputs lack; --threshold and --background-efficiency recorded."""
    run, data = trained["run"], trained["data"]
    source = sorted(data.glob("test_*.h5"))[0]
    with h5py.File(source, "r") as f:
        images = np.stack([f[f"all_events/{k}"][()] for k in ("hist", "histEM", "histtrack")], axis=1)
    new = tmp_path / "new"
    new.mkdir()
    with h5py.File(new / "images_only.h5", "w") as f:
        for name, channel in (("hist", 0), ("histEM", 1), ("histtrack", 2)):
            f[f"all_events/{name}"] = images[:, channel]
    with h5py.File(new / "benchmark.hdf5", "w") as f:
        f["data"] = np.ascontiguousarray(np.transpose(images, (0, 1, 3, 2)))   # (N, 3, phi, eta)
    labelled = tmp_path / "labelled"
    predict(run, [source], labelled, "--threshold", "0.25")
    expected, attributes = read_hdf5(labelled / f"{source.stem}.scores.h5")
    assert attributes["working_point"] == "threshold" and attributes["threshold"] == 0.25
    assert "validation_events" not in attributes
    out = tmp_path / "out"
    predict(run, [new], out, "--background-efficiency", "0.2")
    for stem in ("images_only", "benchmark"):
        table, attributes = read_hdf5(out / f"{stem}.scores.h5")
        assert sorted(table) == ["score", "selected"]
        assert np.array_equal(table["score"], expected["score"])
        assert attributes["working_point"] == "background_efficiency"
        assert attributes["target_background_efficiency"] == 0.2
        assert attributes["validation_background_efficiency"] <= 0.2
        assert list(read_csv(out / f"{stem}.scores.csv")[0]) == ["event", "score", "selected"]


@pytest.mark.horovod
def test_two_ranks_write_what_one_rank_writes(trained, tmp_path):
    inputs = sorted(trained["data"].glob("test_*.h5"))
    predict(trained["run"], inputs, tmp_path / "one")
    predict(trained["run"], inputs, tmp_path / "two", ranks=2)
    one, two = (json.loads((tmp_path / name / "predictions.json").read_text()) for name in ("one", "two"))
    assert two["ranks"] == 2
    assert [{k: v for k, v in row.items()} for row in one["inputs"]] == two["inputs"]
    for row in one["inputs"]:
        for name in row["outputs"][:2]:
            if name.endswith(".h5"):
                a, b = read_hdf5(tmp_path / "one" / name)[0], read_hdf5(tmp_path / "two" / name)[0]
                assert all(np.array_equal(a[k], b[k]) for k in a) and sorted(a) == sorted(b)
            else:
                assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


def refusal_cases(trained, tmp_path) -> dict:
    """name -> (run, inputs, out, what the one-line error says)."""
    run, data = trained["run"], trained["data"]
    source = sorted(data.glob("test_*.h5"))[0]
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    cases = {}
    user = tmp_path / "user-out"   # a predictions folder (its marker) where the user put a file of that name
    mark_run_dir(user, "hep_cnn", files=[], kind="predictions", tool="hep_cnn.predict")
    (user / f"{source.stem}.scores.csv").write_text("a user's file")
    cases["a user's file at an output name"] = (run, [source], user, "was not written by this suite")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    cases["a non-empty folder of the user's"] = (run, [source], foreign, "holds files this suite did not write")
    cases["a training run's folder"] = (run, [source], run, "run")
    climate = inputs / "climate.h5"
    with h5py.File(climate, "w") as f:
        f["climate/data"] = np.zeros((SIZE, SIZE, 16), np.float32)
    cases["a file of another application"] = (run, [climate], tmp_path / "o1", "not HEP events")
    rng = np.random.default_rng(0)
    images = rng.random((4, 3, 2 * SIZE, 2 * SIZE)).astype(np.float32)
    labels, weights = np.zeros(4, np.int32), np.ones(4, np.float32)
    write_all_events(inputs / "larger.h5", images, labels, weights, labels)
    cases["another image size"] = (run, [inputs / "larger.h5"], tmp_path / "o2", "data.image_size")
    one_channel = inputs / "one_channel.h5"
    with h5py.File(one_channel, "w") as f:
        f["data"] = np.zeros((4, 1, SIZE, SIZE), np.float32)
    cases["another channel count"] = (run, [one_channel], tmp_path / "o3", "(4, 1, 16, 16)")
    write_benchmark(inputs / "short_labels.h5", images[:, :, :SIZE, :SIZE], labels[:3], weights, labels)
    cases["labels that do not match the events"] = (run, [inputs / "short_labels.h5"], tmp_path / "o4",
                                                     "one value per event")
    bare = tmp_path / "run-without-model"
    bare.mkdir()
    shutil.copy(run / "config.yaml", bare / "config.yaml")
    cases["a run folder without model.keras"] = (bare, [source], tmp_path / "o5", "model.keras: not found")
    moved = tmp_path / "run-without-maxima"
    moved.mkdir()
    shutil.copy(run / "model.keras", moved / "model.keras")
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["data"]["derived_dir"] = str(tmp_path / "gone")
    (moved / "config.yaml").write_text(yaml.safe_dump(config))
    cases["a run whose maxima are gone"] = (moved, [source], tmp_path / "o6", "the run's channel maxima")
    cut = tmp_path / "run-with-a-cut-model"
    cut.mkdir()
    shutil.copy(run / "config.yaml", cut / "config.yaml")
    (cut / "model.keras").write_bytes((run / "model.keras").read_bytes()[:1000])
    cases["a model.keras cut short"] = (cut, [source], tmp_path / "o7", "not a readable Keras model")
    grouped = inputs / "grouped.h5"
    with h5py.File(grouped, "w") as f:
        f.create_group("all_events/hist")
        f["all_events/histEM"] = f["all_events/histtrack"] = np.zeros((4, SIZE, SIZE), np.float32)
    cases["a group where a dataset belongs"] = (run, [grouped], tmp_path / "o8", "is a group, expected a dataset")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    cases["--out a link to nothing"] = (run, [source], tmp_path / "dangling", "which does not exist")
    return cases


def test_refusals_are_one_line_exit_2_and_change_nothing(trained, tmp_path):
    assert_predict_refuses("hep_cnn", refusal_cases(trained, tmp_path).values())
    for out in (tmp_path / f"o{k}" for k in range(10)):
        assert not out.exists(), out


def test_the_default_working_point_needs_the_validation_split(trained, tmp_path):
    """A run whose data folder is gone: the cuts' working point cannot be chosen (one line naming the folder and
    --threshold, exit 2, before --out is claimed: no folder made); --threshold predicts without it."""
    run, source = trained["run"], sorted(trained["data"].glob("test_*.h5"))[0]
    moved = tmp_path / "run-without-data"
    moved.mkdir()
    shutil.copy(run / "model.keras", moved / "model.keras")
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["data"]["data_dir"] = str(tmp_path / "gone")   # the maxima stay where data.derived_dir says
    (moved / "config.yaml").write_text(yaml.safe_dump(config))
    result = predict(moved, [source], tmp_path / "out", check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert str(tmp_path / "gone") in lines[0] and "--threshold" in lines[0]
    assert not (tmp_path / "out").exists()   # refused before the claim (the working point is prepare's)
    predict(moved, [source], tmp_path / "out", "--threshold", "0.5")
    assert (tmp_path / "out" / f"{source.stem}.scores.h5").is_file()


def test_a_validation_split_of_one_class_needs_threshold(trained, tmp_path):
    """The run pointed (its config.yaml's data.data_dir) at a folder whose validation files hold signal events
    only: the default working point and --background-efficiency are refused in one line naming the folder, its
    files and the class missing (exit 2, --out not made); --threshold predicts without the split."""
    from common.predict import predict_files, predictor_of   # TensorFlow: in the test, not at collection

    run, data = trained["run"], trained["data"]
    source = sorted(data.glob("test_*.h5"))[0]
    signal_only = tmp_path / "signal-only"
    signal_only.mkdir()
    for path in sorted(data.glob("val_*.h5")):
        given = columns_of(path)
        keep = given["label"] == 1
        with h5py.File(path, "r") as f:
            images = np.stack([f[f"all_events/{k}"][()] for k in ("hist", "histEM", "histtrack")], axis=1)
        write_all_events(signal_only / path.name, images[keep], given["label"][keep], given["weight"][keep],
                         given["pass_sr"][keep])
    moved = tmp_path / "run-on-signal-only"
    moved.mkdir()
    shutil.copy(run / "model.keras", moved / "model.keras")
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["data"]["data_dir"] = str(signal_only)   # the maxima stay where data.derived_dir says
    (moved / "config.yaml").write_text(yaml.safe_dump(config))
    words = [f"{signal_only} (the run's validation split: val_", "holds no background events (label 0)",
             "--threshold T"]
    assert_predict_refuses("hep_cnn", [(moved, [source], tmp_path / "out", words)])
    with pytest.raises(UserInputError, match="--background-efficiency needs both classes") as refused:
        predict_files(predictor_of("hep_cnn", moved), moved, [source], tmp_path / "out",
                      options=argparse.Namespace(background_efficiency=0.1, threshold=None))
    assert str(refused.value).startswith(f"{signal_only} (") and "\n" not in str(refused.value)
    assert not (tmp_path / "out").exists()
    predict(moved, [source], tmp_path / "out", "--threshold", "0.5")
    assert read_hdf5(tmp_path / "out" / f"{source.stem}.scores.h5")[1]["threshold"] == 0.5


def test_a_file_that_fails_while_read_is_one_line_and_leaves_no_output(trained, tmp_path):
    """NaN images found by the reader after the checks (the first file is good): exit 2, one line naming the
    file, the good file's outputs removed and --out as it was (absent), the process ending (no hang)."""
    source = sorted(trained["data"].glob("test_*.h5"))[0]
    nan = tmp_path / "zz_nan.h5"
    images = np.full((4, SIZE, SIZE), np.nan, np.float32)
    with h5py.File(nan, "w") as f:
        for key in ("hist", "histEM", "histtrack"):
            f[f"all_events/{key}"] = images
    result = predict(trained["run"], [source, nan], tmp_path / "out", "--threshold", "0.5", check=False)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1 and str(nan) in errors[0], result.stderr[-3000:]
    assert not (tmp_path / "out").exists()


def test_a_folder_another_command_holds_is_refused_and_its_marker_left_as_it_was(trained, tmp_path):
    """The claim takes --out's lock before it marks the folder: a predict refused because another command holds
    the folder leaves the marker's list as it was, so a file the user then puts under a name that predict would
    have written stays the user's (refused, not replaced, by the next predict)."""
    from common.storage import outputs, run_dirs

    run, source = trained["run"], sorted(trained["data"].glob("test_*.h5"))[0]
    out, second = tmp_path / "out", tmp_path / "second.h5"
    predict(run, [source], out, "--threshold", "0.5")
    shutil.copy(source, second)
    marker = (out / outputs.RUN_MARKER).read_bytes()
    lock = run_dirs.RunDirLock(out, "test").acquire()
    try:
        held = predict(run, [second], out, "--threshold", "0.5", check=False)
    finally:
        lock.release()
    lines = held.stderr.strip().splitlines()
    assert held.returncode == 2 and len(lines) == 1 and f"{out}: in use by" in lines[0], held.stderr[-2000:]
    assert (out / outputs.RUN_MARKER).read_bytes() == marker
    (out / "second.scores.h5").write_text("the user's own file\n")
    refused = predict(run, [second], out, "--threshold", "0.5", check=False)
    assert refused.returncode == 2 and "second.scores.h5: exists and was not written by this suite" in refused.stderr
    assert (out / "second.scores.h5").read_text() == "the user's own file\n"
