"""The synthetic-data generators' command lines: counts and sizes are positive whole numbers, seeds are not
negative, and an option left out takes the config's value (``is None``, not ``or``: a 0 never falls back to it).

Each case is a real ``python -m`` process; the refusals come from argparse before any sample is computed, so they
need neither TensorFlow nor colossus.
"""

from __future__ import annotations

import h5py
import pytest

from climate_seg.cam5.config import SynthSection
from common.config import validate
from common.errors import ConfigError
from tests.conftest import run_python

COSMO = ["cosmoflow.mock", "--config", "configs/cosmoflow/demo.yaml"]
HEP = ["hep_cnn.synth", "--config", "configs/hep_cnn/demo.yaml"]
CAM5 = ["climate_seg.cam5.synth"]

NOT_POSITIVE = [
    (COSMO, "--n-train", ["-1"]), (COSMO, "--n-validation", ["0"]), (COSMO, "--size", ["0"]), (COSMO, "--workers", ["0"]),
    (COSMO, "--workers", ["2.5"]), (COSMO, "--crops-per-side", ["0"]),
    (HEP, "--n-train", ["0"]), (HEP, "--n-validation", ["-5"]), (HEP, "--n-test", ["-1"]),
    (HEP, "--image-size", ["0"]), (HEP, "--image-size", ["x"]),
    (CAM5, "--grid", ["0", "0"]), (CAM5, "--grid", ["8", "-16"]), (CAM5, "--n-train", ["-1"]),
    (CAM5, "--n-validation", ["0"]), (CAM5, "--n-test", ["1e3"]), (CAM5, "--steps-per-file", ["0"]),
]


def refusal(result) -> str:
    """The one line a refused command ends with (exit 2, no traceback)."""
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("command, option, values", NOT_POSITIVE,
                         ids=[f"{c[0]}{o}={'x'.join(v)}" for c, o, v in NOT_POSITIVE])
def test_a_count_or_size_that_is_not_a_positive_whole_number_is_refused(tmp_path, command, option, values):
    """--n-train -1 wrote an empty train/ with exit 0, --n-train 0 and --size 0 silently took the config's
    value, --grid 0 0 was a pydantic traceback: each is argparse's one-line error naming the option, exit 2,
    and nothing is written."""
    out = tmp_path / "out"
    result = run_python(["-m", *command, "--out", str(out), option, *values], check=False, timeout=120)
    bad = next(v for v in values if not (v.isdigit() and int(v) > 0))
    assert refusal(result).endswith(f"error: argument {option}: '{bad}': expected a whole number of at least 1")
    assert not out.exists()


@pytest.mark.parametrize("command", [COSMO, HEP, CAM5], ids=lambda c: c[0])
def test_a_negative_seed_is_refused(tmp_path, command):
    """NumPy's seeds are whole numbers of at least 0: -1 was a ValueError traceback after the folder was claimed."""
    result = run_python(["-m", *command, "--out", str(tmp_path / "out"), "--seed", "-1"], check=False, timeout=120)
    assert refusal(result).endswith("error: argument --seed: '-1': expected a whole number of at least 0")
    assert not (tmp_path / "out").exists()


def test_a_negative_seed_in_the_config_is_refused_by_the_schema(tmp_path):
    result = run_python(["-m", *COSMO, "--out", str(tmp_path / "out"), "--set", "data.mock.seed=-3"],
                        check=False, timeout=120)
    assert refusal(result) == ("error: configs/cosmoflow/demo.yaml (with --set overrides): key 'data.mock.seed': "
                               "Input should be greater than or equal to 0 (got -3)")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("options, message", [
    (["--crops-per-side", "2"], "error: --crops-per-side 2: only HDF5 files hold volumes cut into crops "
                                "(--format hdf5); a tfrecord file holds one sample"),
    (["--format", "hdf5", "--gzip"], "error: --gzip: only TFRecord files are compressed (--format tfrecord), not hdf5"),
], ids=["crops-tfrecord", "gzip-hdf5"])
def test_mock_options_the_format_cannot_hold_are_refused(tmp_path, options, message):
    """A TFRecord file holds one sample of data.sample_shape: --crops-per-side 2 wrote volumes twice that size,
    which no reader takes; --gzip on HDF5 files was ignored."""
    result = run_python(["-m", *COSMO, "--out", str(tmp_path / "out"), *options], check=False, timeout=120)
    assert refusal(result) == message
    assert not (tmp_path / "out").exists()


def test_a_planted_feature_range_must_have_its_minimum_first():
    """cyclones_per_step: [5, 2] was NumPy's 'low >= high' traceback in the middle of the generation."""
    with pytest.raises(ConfigError, match=r"^cam5\.yaml: key 'cyclones_per_step': expected \[min, max\] with "
                                          r"min <= max \(got \[5, 2\]\)$"):
        validate(SynthSection, {"cyclones_per_step": [5, 2]}, "cam5.yaml")
    assert validate(SynthSection, {"rivers_per_step": [0, 0]}, "cam5.yaml").rivers_per_step == (0, 0)


def test_options_given_are_used_and_those_left_out_come_from_the_config(tmp_path):
    """--n-validation 1 --n-test 2 --image-size 4 as given; n_train from the config (3 with --set): the events
    in the written files say which value each split got."""
    out = tmp_path / "events"
    run_python(["-m", *HEP, "--out", str(out), "--set", "data.synth.n_train=3", "--n-validation", "1",
                "--n-test", "2", "--image-size", "4", "--seed", "0"], timeout=120)
    shapes = {}
    for path in sorted(out.glob("*.h5")):
        with h5py.File(path) as f:
            shapes[path.name] = f["all_events/hist"].shape
    assert shapes == {"train_0000.h5": (3, 4, 4), "val_0000.h5": (1, 4, 4), "test_0000.h5": (2, 4, 4)}
