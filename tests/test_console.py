"""The console: the application contract without TensorFlow (--help of every command: tests/test_contract.py),
TensorFlow's start-up lines kept off standard error unless the user asks for them, the callback order checked."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from common.console import quiet

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Any Abseil log line, at any level: "E0000 00:00:1796281232.920796   21326 util.cc:131] ...".
ABSEIL_LINE = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w.-]+:\d+\] ")


def _python(code: str, env_update: dict | None = None, drop=("TF_CPP_MIN_LOG_LEVEL",)):
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("HPC_DL_SUITE_SET_TF")}
    env.update(env_update or {})
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


def test_contract_and_applications_import_no_tensorflow():
    code = ("import sys, common.application, cosmoflow.application, hep_cnn.application, "
            "climate_seg.segmentation.application, climate_seg.detection.application, common.cli, common.config; "
            "print(sorted(m for m in ('tensorflow', 'keras', 'horovod', 'h5py') if m in sys.modules))")
    result = _python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_tensorflow_start_up_lines_filtered_but_errors_kept():
    # A line written to standard error during the import (here by a module TensorFlow imports, numpy's
    # warnings stand-in) must survive; Abseil's INFO/WARNING start-up lines must not.
    code = ("import os, sys, common\n"
            "import tensorflow as tf\n"
            "tf.constant(1.0) + 1.0\n"
            "print('after', file=sys.stderr)")
    result = _python(code)
    assert result.returncode == 0, result.stderr
    assert "absl::InitializeLog" not in result.stderr
    assert "oneDNN custom operations" not in result.stderr
    assert [line for line in result.stderr.splitlines() if quiet.NOISE.match(line)] == []
    assert result.stderr.strip().splitlines()[-1] == "after"


def test_cosmoflow_augmentation_prints_no_tensorflow_line():
    # The flips and permutation move each voxel as one 8-byte word; as int64, oneDNN's first int64 kernel
    # printed "E0000 ... util.cc:131] oneDNN supports DT_INT64 only on platforms with AVX-512" on every rank
    # (also on CPUs that have it).  An error line nobody can act on: none at all is wanted here.
    code = ("import sys, common\n"
            "import tensorflow as tf\n"
            "from cosmoflow.data import augment\n"
            "cube = tf.data.Dataset.from_tensors(tf.ones([4, 4, 4, 4], tf.int16))\n"
            "for seed in range(4):\n"
            "    list(cube.map(lambda x: augment(x, tf.constant([seed, 1], tf.int64))))\n"
            "print('after', file=sys.stderr)")
    result = _python(code)
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stderr.splitlines() if ABSEIL_LINE.match(line)] == []
    assert result.stderr.strip().splitlines()[-1] == "after"


def test_user_setting_wins():
    result = _python("import common, os, tensorflow; print(os.environ['TF_CPP_MIN_LOG_LEVEL'])",
                     {"TF_CPP_MIN_LOG_LEVEL": "0"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0"
    if os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1") != "0":
        # TensorFlow's own lines, unfiltered (their exact text is TensorFlow's, so only the Abseil shape).
        assert any(quiet.NOISE.match(line) for line in result.stderr.splitlines()), result.stderr


# TensorFlow's start-up lines: Abseil's notice, oneDNN's, the CPU feature guard's (and its second line).
START_UP_LINES = ("absl::InitializeLog", "oneDNN custom operations", "cpu_feature_guard",
                  "To enable the following instructions")


@pytest.mark.parametrize("level", ["2", "3", "0"])
def test_a_user_level_asking_for_less_stays_quiet(level):
    # An entry point that imports TensorFlow (build_info: the cheapest).  2 and 3 ask for less than
    # TensorFlow's default: the start-up lines, which ignore the variable, are filtered as without it, and the
    # user's value is kept; 0 asks for everything and gets TensorFlow's lines.
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DL_SUITE_SET_TF")}
    env["TF_CPP_MIN_LOG_LEVEL"] = level
    result = subprocess.run([sys.executable, "-m", "common.tools.build_info", "--json"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert '"tensorflow"' in result.stdout                               # TensorFlow was imported
    shown = [line for line in result.stderr.splitlines() if any(text in line for text in START_UP_LINES)]
    if level != "0":
        assert shown == [], result.stderr
        assert [line for line in result.stderr.splitlines() if quiet.NOISE.match(line)] == []
    else:
        assert any("absl::InitializeLog" in line for line in shown), result.stderr


def test_only_a_user_level_asking_for_more_turns_the_filter_off():
    for value, filtered in (("0", False), ("1", False), ("junk", False), ("2", True), ("3", True), (" 3", True),
                            ("\u00b2", False), ("-1", False)):   # a superscript two is no number (nor to TensorFlow)
        environ = {"TF_CPP_MIN_LOG_LEVEL": value}
        assert quiet.user_level(environ) is not None
        assert (quiet.user_level(environ) >= quiet.SUITE_LEVEL) is filtered, value
    assert quiet.user_level({}) is None
    # The suite's own value, inherited by a child: not the user's; a child given another value: the user's.
    environ = {"TF_CPP_MIN_LOG_LEVEL": str(quiet.SUITE_LEVEL), quiet._SET_BY_SUITE: str(quiet.SUITE_LEVEL)}
    assert quiet.user_level(environ) is None
    assert quiet.user_level({**environ, "TF_CPP_MIN_LOG_LEVEL": "0"}) == 0


def test_filter_keeps_everything_but_start_up_noise():
    text = ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
            "I0000 00:00:1796281232.920796   21326 port.cc:153] oneDNN custom operations are on.\n"
            "W1203 06:21:07.123456 42 cpu_feature_guard.cc:12] something\n"
            "E0000 00:00:1796281232.920796   21326 util.cc:1] a real error\n"
            "/x/y.py:3: UserWarning: kept\n"
            "I0000 is not a log line\n")
    assert quiet.keep(text) == ("E0000 00:00:1796281232.920796   21326 util.cc:1] a real error\n"
                                "/x/y.py:3: UserWarning: kept\n" "I0000 is not a log line\n")


def test_callback_order_is_checked():
    from common.loop.callbacks import EpochEndSync, LearningRateLog, SaveCheckpoint, Throughput
    from common.distributed import Distributed
    from common.trainer import check_callback_order

    dist = Distributed()
    throughput, sync = Throughput(8, 1, None, 0), EpochEndSync(dist)
    saver = SaveCheckpoint("/nonexistent/never-written", dist)
    check_callback_order([throughput, LearningRateLog(), sync, saver])
    with pytest.raises(RuntimeError, match=r"\['Throughput'\] must come before EpochEndSync"):
        check_callback_order([LearningRateLog(), sync, throughput, saver])
    with pytest.raises(RuntimeError, match=r"\['SaveCheckpoint'\] after it"):
        check_callback_order([saver, throughput, sync])
    with pytest.raises(RuntimeError, match="exactly one EpochEndSync"):
        check_callback_order([throughput, saver])
