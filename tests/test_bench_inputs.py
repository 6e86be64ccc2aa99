"""Rates and bench results validated where they are read: the bench's counts, the results it records (the
application, the sample shape, the config), and what --compare and the scaling model accept from a file or the
command line. Most results here are written by hand in the bench's format; one real input-only bench (of the
MLPerf CosmoFlow config, whose mixed_float16 needs a GPU to train) shows the format they copy."""

from __future__ import annotations

import json
import math

import pytest

from common import registry
from common.errors import DataError
from common.tools import bench, scaling
from tests.conftest import run_python

COSMO_16 = (16, 16, 16, 4)


def cosmo_work(shape=COSMO_16) -> scaling.Workload:
    """The workload of a CosmoFlow config at ``shape``, as workload_from_config makes it (no TensorFlow)."""
    return scaling.Workload(parameters=1000, training_flops_per_sample=3 * 2e6, local_batch=4,
                            application="cosmoflow", sample_shape=tuple(shape), config="mine.yaml")


def input_only_result(app="cosmoflow", shape=COSMO_16, rate=80.0, **extra) -> dict:
    """A bench --input-only result as the bench writes it (the keys its readers use)."""
    return {"config": "configs/cosmoflow/mlperf.yaml", "overrides": [], "app": app, "sample_shape": list(shape),
            "precision": "mixed_float16", "ranks": 1, "batch_size": 4,
            "input": {"samples_per_second_per_core": rate, "samples_per_second_all_cores": rate}, **extra}


def training_result(app="cosmoflow", shape=COSMO_16, end_to_end=40.0, ranks=1, compute=50.0) -> dict:
    """A bench result of the training measurements as the bench writes it (the keys its readers use)."""
    return {"config": "configs/cosmoflow/demo.yaml", "overrides": [], "app": app, "sample_shape": list(shape),
            "ranks": ranks, "precision": "fp32", "forward_flops_per_sample": 2e6,
            "compute": {"samples_per_second": compute}, "input": {"samples_per_second": 60.0},
            "end_to_end": {"samples_per_second": end_to_end}}


def write(path, payload) -> str:
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    return str(path)


def last_error(result) -> str:
    """The last stderr line of a command refused with exit 2 (argparse's, or the suite's ``error:`` line)."""
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.stderr.strip().splitlines()[-1]


def test_counts_and_rates_on_the_command_line_are_positive_and_finite():
    """--steps 0 printed negative rates with exit 0; a zero, negative, NaN or infinite rate went into the model.
    Both refused by argparse, before TensorFlow loads or anything runs."""
    cases = [(["common.tools.bench", "--config", "configs/hep_cnn/demo.yaml", "--steps", "0"], "--steps: '0'"),
             (["common.tools.bench", "--config", "configs/hep_cnn/demo.yaml", "--steps", "-3"], "--steps: '-3'"),
             (["common.tools.bench", "--config", "configs/hep_cnn/demo.yaml", "--batch-size", "0"], "--batch-size"),
             *[(["common.tools.scaling", "--config", "configs/cosmoflow/demo.yaml", "--system", "summit",
                 "--samples-per-second", rate], f"--samples-per-second: '{rate}'")
               for rate in ("0", "-5", "nan", "inf")],
             (["common.tools.scaling", "--config", "configs/cosmoflow/demo.yaml", "--system", "summit",
               "--input-cores-per-rank", "0"], "--input-cores-per-rank: '0'")]
    for args, named in cases:
        line = last_error(run_python(["-m", *args], check=False, timeout=120))
        assert named in line and line.endswith(("expected a whole number of at least 1",
                                                "expected a positive finite number")), line
    both = last_error(run_python(["-m", "common.tools.scaling", "--config", "configs/cosmoflow/demo.yaml", "--system",
                                  "summit", "--samples-per-second", "5", "--rate-from", "x.json"], check=False))
    assert "not allowed with argument" in both


@pytest.mark.parametrize("value", [-1.0, 0, math.nan, math.inf, None, "80"], ids=repr)
def test_a_rate_read_from_a_file_is_a_positive_finite_number(tmp_path, value):
    path = write(tmp_path / "input.json", input_only_result(rate=value))
    with pytest.raises(DataError) as refused:
        scaling.input_rate_from_json(path, cosmo_work())
    assert str(refused.value) == (f"{path}: input.samples_per_second_per_core: {json.dumps(value)}; expected a "
                                  "positive finite number")
    bad_compute = training_result()
    bad_compute["compute"]["samples_per_second"] = value
    path = write(tmp_path / "bench.json", bad_compute)
    with pytest.raises(DataError, match=f"^{path}: compute.samples_per_second: "):
        scaling.rate_from_json(path, cosmo_work())
    summary = write(tmp_path / "summary.json", {"app": "cosmoflow", "ranks": 2, "samples_per_second": value,
                                                "forward_flops_per_sample": 2e6})
    with pytest.raises(DataError, match=f"^{summary}: samples_per_second: "):
        scaling.rate_from_json(summary, cosmo_work())


def test_scaling_takes_a_rate_measured_for_the_workload_it_projects_only(tmp_path):
    work = cosmo_work()
    ok = write(tmp_path / "ok.json", input_only_result(rate=80.0, staged={"samples_per_second_per_core": 120.0}))
    assert scaling.input_rate_from_json(ok, work) == 80.0
    assert scaling.input_rate_from_json(ok, work, staged=True) == 120.0
    # Per rank: a bench's compute rate and a run's rate are summed over its ranks.
    assert scaling.rate_from_json(write(tmp_path / "t.json", training_result(ranks=2, compute=50.0)), work) == 25.0
    summary = {"app": "cosmoflow", "ranks": 2, "samples_per_second": 30.0, "forward_flops_per_sample": 2e6}
    assert scaling.rate_from_json(write(tmp_path / "summary.json", summary), work) == 15.0

    def refused(payload, reader=scaling.input_rate_from_json, name="bad.json", **kwargs) -> str:
        path = write(tmp_path / name, payload)
        with pytest.raises(DataError) as caught:
            reader(path, work, **kwargs)
        message = str(caught.value)
        assert message.startswith(f"{path}: ") and "\n" not in message
        return message

    # Another application's rate (an HEP image rate used for CosmoFlow volumes), another sample shape.
    assert ("measured hep_cnn at sample shape 64x64x3 (a bench of configs/cosmoflow/mlperf.yaml); expected "
            "cosmoflow at 16x16x16x4 (the samples of mine.yaml)") in refused(input_only_result("hep_cnn", (64, 64, 3)))
    assert "measured cosmoflow at sample shape 128x128x128x4" in refused(input_only_result(shape=(128, 128, 128, 4)))
    assert "sample shape 16x16x16x4" in refused(training_result(shape=(16, 16, 16, 4), app="climate_seg"),
                                                reader=scaling.rate_from_json)
    # A result from before the bench recorded its sample shape: refused, with what to do.
    old = input_only_result()
    del old["sample_shape"]
    assert refused(old).endswith("written before the bench recorded the sample_shape it measured; rerun "
                                 "common.tools.bench on that config to measure it again")
    # The other kind, a staged rate that was not measured, not a bench result at all, not a file.
    assert "holds the training measurements" in refused(training_result())
    assert "holds a --input-only measurement" in refused(input_only_result(), reader=scaling.rate_from_json)
    assert "no staged section" in refused(input_only_result(), staged=True)
    assert "not a common.tools.bench result" in refused({"samples_per_second": 3})
    assert "not a JSON file" in refused('{"app": "cosmoflow", ')
    assert "a JSON array; expected a JSON object" in refused("[1, 2]")
    assert "a JSON null; expected a JSON object" in refused("null")
    with pytest.raises(DataError, match=f"^{tmp_path / 'absent.json'}: cannot be read"):
        scaling.input_rate_from_json(str(tmp_path / "absent.json"), work)
    # A run's summary.json: its application and its network (the forward FLOPs per sample).
    assert "a hep_cnn run; expected a cosmoflow one (mine.yaml)" in refused(
        {**summary, "app": "hep_cnn"}, reader=scaling.rate_from_json)
    assert "forward_flops_per_sample 4000000.0; mine.yaml builds one of 2000000" in refused(
        {**summary, "forward_flops_per_sample": 4e6}, reader=scaling.rate_from_json)
    assert "ranks 0; expected a whole number of at least 1" in refused(
        {**summary, "ranks": 0}, reader=scaling.rate_from_json)


def test_bench_compare_reads_two_training_results_of_one_workload(tmp_path):
    one = write(tmp_path / "one.json", training_result(end_to_end=40.0))
    two = write(tmp_path / "two.json", training_result(end_to_end=70.0, ranks=2))
    assert bench.compare(one, two) == f"{two} (2 rank(s)) vs {one} (1 rank(s)): end-to-end 1.75x"
    other_shape = write(tmp_path / "shape.json", training_result(shape=(32, 32, 32, 4)))
    with pytest.raises(DataError, match=f"^{other_shape}: measured cosmoflow at sample shape 32x32x32x4 .*expected "
                                        f"cosmoflow at 16x16x16x4 \\(what {one} measured\\)"):
        bench.compare(one, other_shape)
    zero = write(tmp_path / "zero.json", training_result(end_to_end=0.0))
    with pytest.raises(DataError, match=f"^{zero}: end_to_end.samples_per_second: 0.0; expected a positive"):
        bench.compare(zero, two)
    # The command line: a missing, a malformed and an input-only file, each one line naming it, exit 2.
    cases = {str(tmp_path / "absent.json"): "cannot be read (No such file or directory)",
             write(tmp_path / "broken.json", '{"compute": '): "not a JSON file",
             write(tmp_path / "input.json", input_only_result()): "holds a --input-only measurement of the input "
                                                                  "pipeline; expected the training measurements"}
    for path, what in cases.items():
        result = run_python(["-m", "common.tools.bench", "--compare", one, path], check=False, timeout=120)
        assert last_error(result).startswith(f"error: {path}: {what}")
        assert result.stderr.count("error:") == 1 and result.stdout == ""


def test_cores_per_accelerator_only_at_the_sample_shape_of_the_published_rate():
    """The published H100 rate (about 200 samples/s) is for 128^3 x 4 volumes: the projection is made for
    those and said not to apply to any other shape, or to an application without a published rate."""
    cosmoflow = registry.application("cosmoflow")   # its declaration holds the published rate
    projection, why_not = bench.cores_per_accelerator(cosmoflow, [128, 128, 128, 4], 8.0, 20.0)
    assert why_not is None
    assert projection["cores_from_files"] == 25.0 and projection["cores_from_staged_inflated"] == 10.0
    projection, why_not = bench.cores_per_accelerator(cosmoflow, [32, 32, 32, 4], 8.0, None)
    assert projection is None and why_not == ("the published H100 rate is for samples of 128x128x128x4, these are "
                                              "32x32x32x4")
    assert bench.cores_per_accelerator(registry.application("hep_cnn"), [224, 224, 3], 8.0, None) == (
        None, "no per-accelerator training rate is published for hep_cnn in this suite")
    text = bench.input_table({**input_only_result(), "cpu": {}, "data_dir": "d", "compression": "none",
                              "augment": False, "projection_not_shown": why_not,
                              "input": {"samples_per_second_per_core": 8.0, "samples_per_second_all_cores": 9.0,
                                        "cores": 2, "ceiling_samples_per_second_per_core": None,
                                        "ratio_to_ceiling": None, "ceiling_why_none": "none",
                                        "timed_window": {"kind": "whole epochs", "epochs": 1, "batches": 4}}})
    assert text.splitlines()[-1] == f"  cores per accelerator not projected: {why_not}"


def test_input_only_bench_of_a_float16_config_on_the_cpu_feeds_the_scaling_model(tiny_cosmo_data, tmp_path):
    """The MLPerf config trains in mixed_float16, which needs a GPU; its input pipeline alone runs on any CPU
    (casting to float16 as on a GPU node). The result records what it measured, and the scaling model takes it
    for that workload and refuses it for another."""
    out = tmp_path / "input.json"
    shape = ["--set", "data.sample_shape=[16,16,16,4]"]
    bench_run = run_python(["-m", "common.tools.bench", "--config", "configs/cosmoflow/mlperf.yaml", *shape,
                            "--set", f"data.data_dir={tiny_cosmo_data}", "--set", "data.compression=none",
                            "--set", "data.mock.generate_if_missing=false", "--set", "data.batch_size=4",
                            "--input-only", "--steps", "2", "--json", str(out)])
    report = json.loads(out.read_text())
    assert report["app"] == "cosmoflow" and report["sample_shape"] == [16, 16, 16, 4]
    assert report["precision"] == "mixed_float16" and report["config"] == "configs/cosmoflow/mlperf.yaml"
    assert f"data.data_dir={tiny_cosmo_data}" in report["overrides"]
    assert report["input"]["samples_per_second_per_core"] > 0
    assert "cores per accelerator not projected: the published H100 rate is for samples of 128x128x128x4" \
        in bench_run.stdout
    # The workload benched (the network shrunk to fit 16^3 volumes) takes it; the command line's use of it is in
    # tests/test_end_to_end.py (test_bench_input_only_against_the_ceiling_and_staged_inflated).
    work = scaling.workload_from_config("configs/cosmoflow/mlperf.yaml", [*shape[1::2], "model.conv_blocks=2"], None)
    assert scaling.input_rate_from_json(str(out), work) == report["input"]["samples_per_second_per_core"]
    # An HEP projection from this CosmoFlow rate: one line naming the file, exit 2.
    line = last_error(run_python(["-m", "common.tools.scaling", "--system", "summit", "--nodes", "1",
                                  "--input-rate-from", str(out), "--config", "configs/hep_cnn/demo.yaml"], check=False))
    assert line == (f"error: {out}: measured cosmoflow at sample shape 16x16x16x4 (a bench of "
                    "configs/cosmoflow/mlperf.yaml); expected hep_cnn at 64x64x3 (the samples of "
                    "configs/hep_cnn/demo.yaml): bench that and use its result")
