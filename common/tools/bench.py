"""Benchmark harness: where the time of a training step goes, measured in one process.

    python -m common.tools.bench --config configs/cosmoflow/demo.yaml [--set k=v] [--batch-size N]
                                 [--steps N] [--precision P] [--json FILE] [--app NAME]
    horovodrun -np 2 ... python -m common.tools.bench --config ...     # global rates over the ranks

Four measurements, each after warm-up steps:

1. peak: square matmul rate in fp32 and, where the device has bf16 units, in
   bf16 (the ceilings): the best of 5 warm repetitions at n = 1024 and 2048
   (4096 and 8192 on a GPU), with their spread (``peak_measurement`` in the JSON); a compute rate
   above the peak is flagged as a peak measurement problem
   (``compute.peak_measurement_problem``), never shown as an achievement;
2. compute: training steps on one batch held in memory (no I/O): samples/s,
   achieved FLOP/s (forward FLOPs x 3) and the ratio to the peak of the
   precision used; also that ratio for the FLOPs of the kernel taps that land
   inside the input (``ratio_to_peak_inside``: zero padding left out, which is
   what kernels that skip it execute; far lower for atrous convolutions whose
   rate nears the map size);
3. input: the application's tf.data pipeline alone, reading the configured
   files: samples/s and its ratio to the compute rate;
4. end to end: training steps fed by that pipeline: samples/s and ratio to compute.

With several ranks, samples/s and FLOP/s are global (summed over ranks) and
peaks are summed likewise.

Every result records what was measured: the application (``app``), the shape of one sample as the
network takes it (``sample_shape``), the config file and its overrides (``config``, ``overrides``) and the
precision.  The readers of a result (``--compare`` here, ``common.tools.scaling --rate-from`` and
``--input-rate-from``) go through :func:`read_result` and :func:`check_workload`: a file that is missing,
malformed, of the other kind, from before the application and sample shape were recorded, of another
application or sample shape, or whose rate is not a positive finite number is a one-line error naming it.

``--profile DIR`` also traces a few compute steps with TensorFlow's profiler
(trace in DIR, viewable in TensorBoard) and prints where the time went by op
type and by op: how the slow atrous convolutions and unfused batch norms of
the climate networks were found.

``--per-layer`` also times each layer's forward and backward pass alone on its real input, the optimizer's
update and the gradients' allreduce, and prints (and records as ``per_layer``) where the measured compute step
goes, with each layer's FLOPs and ratio to the peak of the run's precision (``common/tools/layer_account.py``).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import math
import pathlib
import time

from common.application import Application
from common.cli import exit_process, find_application, positive_int_argument, run_command
from common.config import load_config
from common.console import cpu, logs
from common.deferred import tensorflow as tf   # at first use, after the arguments are parsed
from common.errors import DataError, UserInputError
from common.storage.staging import check_stage_dir
from common.storage.transaction import OutputTransaction, Producer

TOOL = "common.tools.bench"

# Imported where used, not here: TensorFlow and the engine modules that import it, so that --help and argument or
# config errors answer without it.


def device_has_bf16() -> bool:
    return bool(tf.config.list_physical_devices("GPU")) or cpu.has_bf16_units()


def sample_shape(datasets) -> list[int]:
    """The shape of one training sample as the network takes it: a training batch's inputs less the batch axis."""
    inputs = datasets.train_epoch(0).element_spec[0]
    return inputs.shape.as_list()[1:]


def _timed_fit(model, dataset, steps: int, warmup: int, global_batch: int) -> float:
    """Global samples/s of ``steps`` training steps after ``warmup`` (the trainer's own timer)."""
    from common.loop.callbacks import Throughput   # deferred: imports TensorFlow (--help answers without it)

    timer = Throughput(global_batch, 0.0, None, warmup_steps=warmup)
    history = model.fit(dataset, epochs=1, steps_per_epoch=warmup + steps, callbacks=[timer], verbose=0,
                        shuffle=False)
    return float(history.history["samples_per_second"][-1])


def op_profile(model, dataset, steps: int, logdir: str, top: int = 12) -> dict:
    """Self time of ``steps`` training steps by op type and by op, from a TensorFlow profiler trace."""
    # deferred: TensorFlow's profiler and the engine modules that import TensorFlow (--help answers without them)
    from tensorflow.python.profiler.internal import _pywrap_profiler_plugin

    # The profiler adds a new plugins/profile/<time>/ folder per trace: read this one's, delete nothing.
    earlier = set(glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True))
    tf.profiler.experimental.start(logdir)
    try:
        model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0, shuffle=False)
    finally:
        tf.profiler.experimental.stop()
    paths = sorted(set(glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)) - earlier)
    data, ok = _pywrap_profiler_plugin.xspace_to_tools_data(paths, "framework_op_stats", {})
    if not ok:
        raise RuntimeError(f"the profiler could not summarise {paths}: {data[:200]!r}")
    table = json.loads(data)[0]
    columns = [column["id"] for column in table["cols"]]
    rows = [dict(zip(columns, [cell.get("v") if isinstance(cell, dict) else cell for cell in row["c"]]))
            for row in table["rows"]]
    rows = [row for row in rows if row["type"] != "IDLE"]
    by_type = collections.Counter()
    for row in rows:
        by_type[row["type"]] += row["total_self_time"]
    busy = sum(by_type.values()) or 1.0
    rows.sort(key=lambda row: -row["total_self_time"])
    to_ms = 1e-3 / steps  # microseconds over all steps -> ms per step
    return {"steps": steps, "busy_ms_per_step": busy * to_ms,
            "by_type": [{"type": kind, "ms_per_step": t * to_ms, "share": t / busy}
                        for kind, t in by_type.most_common(top)],
            "by_op": [{"op": row["operation"], "type": row["type"], "ms_per_step": row["total_self_time"] * to_ms,
                       "share": row["total_self_time"] / busy} for row in rows[:top]]}


def profile_table(profile: dict) -> str:
    """The ``--profile`` result as text: the share and time per step of each op type, then of the top ops."""
    lines = [f"  profile ({profile['steps']} steps; self time summed over threads, "
             f"{profile['busy_ms_per_step']:.1f} ms busy per step)"]
    lines += [f"    {row['share']:6.1%} {row['ms_per_step']:9.2f} ms  {row['type']}" for row in profile["by_type"]]
    lines.append("  top ops")
    lines += [f"    {row['share']:6.1%} {row['ms_per_step']:9.2f} ms  {row['op'][-100:]}" for row in profile["by_op"]]
    return "\n".join(lines)


def run(application, cfg, dist, steps: int, warmup: int = 3, profile_dir: str | None = None,
        per_layer: bool = False) -> dict:
    """The four measurements (peak, compute, input, end to end) for ``application``'s config, on ``dist``'s ranks."""
    # deferred: the engine modules that import TensorFlow (--help answers without them)
    from common.loop.callbacks import state_variables
    from common.nn.flops import TRAINING_FLOPS_FACTOR, forward_flops_per_sample, matmul_peak
    from common.trainer import prepare_data, prepare_run

    # The trainer's own set-up: the same precision decision, data, network, schedule and optimizer.
    datasets = prepare_data(application, cfg, dist)
    total = lambda value: float(dist.sum_array([value])[0])  # noqa: E731
    dtypes = ["float32"] + (["bfloat16"] if device_has_bf16() else []) + (
        ["float16"] if cfg.train.precision == "mixed_float16" else [])
    peaks = {dtype: matmul_peak(dtype) for dtype in dtypes}   # this rank's; the rates below are summed over ranks
    peak_fp32 = total(peaks["float32"].flops)
    peak_bf16 = total(peaks["bfloat16"].flops) if "bfloat16" in peaks else None
    peak_used = {"fp32": peak_fp32, "mixed_bfloat16": peak_bf16}.get(cfg.train.precision)
    if cfg.train.precision == "mixed_float16":
        peak_used = total(peaks["float16"].flops)
    prepared = prepare_run(application, cfg, dist, datasets)
    network, model = prepared.network, prepared.model
    flops = prepared.forward_flops
    flops_inside = forward_flops_per_sample(network, inside_only=True)
    dist.broadcast_variables(state_variables(model) + prepared.optimizer.variables)
    global_batch = prepared.global_batch_size
    epochs = 1 + (warmup + steps) // datasets.steps_per_epoch

    batch = next(iter(datasets.train_epoch(0)))
    in_memory = tf.data.Dataset.from_tensors(batch).repeat()
    compute = _timed_fit(model, in_memory, steps, warmup, global_batch)
    profile = op_profile(model, in_memory, min(steps, 3), profile_dir) if profile_dir else None

    input_rate = total(_input_rate(datasets, cfg.data.batch_size, steps, warmup, threads=None))

    end_to_end = _timed_fit(model, datasets.train_stream(0, epochs + 1), steps, warmup, global_batch)
    compute_flops = compute * TRAINING_FLOPS_FACTOR * flops
    ratio_to_peak = compute_flops / peak_used if peak_used else None
    layers = None
    if per_layer:   # this rank's step: its batch at the rates summed over ranks
        from common.tools.layer_account import account   # deferred: imports TensorFlow

        peak_here = peak_used / dist.size if peak_used else None
        layers = account(network, model, dist, batch[0], global_batch / compute, global_batch / end_to_end,
                         peak_here)
    return {
        "app": application.name,
        "sample_shape": sample_shape(datasets),
        "ranks": dist.size,
        # what TensorFlow computed on (scripts/gpu_check.sh files no CPU figures as a GPU's)
        "gpus_visible": len(tf.config.list_physical_devices("GPU")),
        "batch_size": cfg.data.batch_size,
        "global_batch_size": global_batch,
        "precision": cfg.train.precision,
        "cpu": cpu.describe(),
        "forward_flops_per_sample": flops,
        "forward_flops_per_sample_inside": flops_inside,
        "peak_flops": peak_fp32,
        "peak_flops_bf16": peak_bf16,
        # How each peak was measured on rank 0 (best of warm repetitions; spread = (best - worst) / best).
        "peak_measurement": {dtype: peak.as_dict() for dtype, peak in peaks.items()},
        "compute": {"samples_per_second": compute, "flops_per_second": compute_flops,
                    "ratio_to_peak": ratio_to_peak,
                    # A step cannot beat the matmul ceiling: above 1 the peak was measured too low (or the FLOP
                    # convention over-counts, docs/performance.md); flagged, never an achievement.
                    "peak_measurement_problem": bool(ratio_to_peak and ratio_to_peak > 1.0),
                    "ratio_to_peak_inside": compute_flops * flops_inside / flops / peak_used if peak_used else None},
        "input": {"samples_per_second": input_rate, "ratio_to_compute": input_rate / compute},
        "end_to_end": {"samples_per_second": end_to_end, "ratio_to_compute": end_to_end / compute},
        **({"profile": profile} if profile else {}),
        **({"per_layer": layers} if layers else {}),
    }


def cores_per_accelerator(application: Application, shape: list[int], per_core: float | None,
                          staged_per_core: float | None) -> tuple[dict | None, str | None]:
    """(cores of input pipeline one accelerator needs at the application's published rate (its declaration's
    ``published_rate``), from the GZIP files and from the staged inflated copies; None, why not) -- not
    projected when no rate is published for the application, or when ``shape`` (the sample shape benched) is not
    the one the published rate was measured at."""
    published = application.published_rate
    if published is None:
        return None, f"no per-accelerator training rate is published for {application.name} in this suite"
    if list(shape) != list(published.sample_shape):
        return None, (f"the published {published.accelerator} rate is for samples of "
                      f"{shape_text(published.sample_shape)}, these are {shape_text(shape)}")
    if not per_core:
        return None, "no input rate was measured"
    rate = published.samples_per_second
    return {**published.as_dict(), "cores_from_files": rate / per_core,
            "cores_from_staged_inflated": rate / staged_per_core if staged_per_core else None}, None


def _on_threads(stream, threads: int | None):
    """``stream`` on tf.data's private thread pool of ``threads`` with that intra-op parallelism (1: one
    core); None: as it is (TensorFlow's defaults)."""
    if threads is None:
        return stream
    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    options.threading.max_intra_op_parallelism = threads
    return stream.with_options(options)


def _input_rate(datasets, samples_per_step: int, steps: int, warmup: int, threads: int | None) -> float:
    """Samples/s of this rank's training input pipeline alone (``steps`` batches after ``warmup``); ``threads``:
    tf.data's private thread pool and intra-op parallelism (1: one core), None: TensorFlow's defaults."""
    epochs = 1 + (warmup + steps) // datasets.steps_per_epoch
    iterator = iter(_on_threads(datasets.train_stream(0, epochs + 1), threads))
    for _ in range(warmup):
        next(iterator)
    start = time.perf_counter()
    for _ in range(steps):
        next(iterator)
    return steps * samples_per_step / (time.perf_counter() - start)


def _steady_input_rate(datasets, samples_per_step: int, steps: int, threads: int | None) -> tuple[float, dict]:
    """Samples/s of this rank's training input pipeline alone, in steady state, and the window timed.

    When an epoch holds at most 4 x ``steps`` batches: the first epoch untimed (start-up, tracing), then
    whole epochs (``steps`` batches or more) timed from its end.  Each timed epoch's pipeline starts empty, so
    nothing read before the clock started counts: a shuffle buffer as large as the epoch is filled before its
    first batch and then lends the rest, which a window of a few batches after a warm-up would count as
    the pipeline's rate (a 4.5x ratio to the ceiling on HEP's 2048-event buffer).  Longer epochs: ``steps``
    batches timed after ``steps`` untimed ones.  ``threads`` as in :func:`_input_rate`."""
    per_epoch = datasets.steps_per_epoch
    if per_epoch <= 4 * steps:
        timed_epochs = -(-steps // per_epoch)
        untimed, timed = per_epoch, timed_epochs * per_epoch
        window = {"kind": "whole epochs", "epochs": timed_epochs, "batches": timed, "untimed_batches": untimed}
    else:
        untimed, timed = steps, steps
        window = {"kind": "within the first epoch", "epochs": 0, "batches": timed, "untimed_batches": untimed}
    return _input_rate(datasets, samples_per_step, timed, untimed, threads), window


def input_only(application, cfg, dist, steps: int, stage_decompressed: str | None = None) -> dict:
    """The input pipeline alone at the config's sample size, on one core and on all, against the simplest
    one-core loop doing the same work (the application's ``input_ceiling``); with ``stage_decompressed``,
    also the pipeline reading the training files staged there inflated.

    The training precision is not checked against this device: no network is built, and the pipeline runs on
    the CPU whatever the policy (it casts to the compute dtype, float16 for mixed_float16, as on a GPU node)."""
    # deferred: TensorFlow, loaded only after the arguments are parsed (--help answers without it)
    from common.trainer import prepare_data

    batch = cfg.data.batch_size
    # The rows time the files in data.data_dir: a config's staging folder (the Gordon Bell climate configs stage
    # to /dev/shm) would time the copies, and leave a copy of the training set in memory after the bench.
    config_stage_dir = getattr(cfg.data, "stage_dir", None)
    if config_stage_dir:
        cfg = cfg.model_copy(deep=True)
        cfg.data.stage_dir = None
    if stage_decompressed:   # checked before the first timing, not after it
        # The application's data section says whether its files are compressed ones its family stages inflated.
        stages_inflated = getattr(cfg.data, "stages_inflated", None)
        if not (stages_inflated and stages_inflated()):
            raise UserInputError(f"--stage-decompressed: {application.name}'s data in {cfg.data.data_dir} is not "
                                 "GZIP TFRecords (data.format: tfrecord, data.compression: gzip); nothing to inflate")
        check_stage_dir(pathlib.Path(stage_decompressed), [cfg.data.data_dir])
    datasets = prepare_data(application, cfg, dist, check_device=False)
    one_core, window = _steady_input_rate(datasets, batch, steps, threads=1)
    all_cores, _ = _steady_input_rate(datasets, batch, steps, threads=None)
    ceiling = (application.input_ceiling(cfg, window["batches"] * batch) if application.input_ceiling is not None
               else {"samples_per_second": None, "why_none": f"{application.name} has no input ceiling loop yet"})
    ceiling_rate = ceiling.get("samples_per_second")
    result = {
        "app": application.name, "sample_shape": sample_shape(datasets), "precision": cfg.train.precision,
        "ranks": dist.size, "batch_size": batch, "cpu": cpu.describe(),
        "data_dir": str(cfg.data.data_dir), "compression": getattr(cfg.data, "compression", None),
        "augment": getattr(cfg.data, "augment", None),
        "input": {"samples_per_second_per_core": one_core, "samples_per_second_all_cores": all_cores,
                  "cores": cpu.describe()["cpus_available"],
                  "ceiling_samples_per_second_per_core": ceiling_rate,
                  "ratio_to_ceiling": one_core / ceiling_rate if ceiling_rate else None,
                  "bytes_per_sample": ceiling.get("bytes_per_sample"), "timed_window": window,
                  **({"ceiling_why_none": ceiling["why_none"]} if "why_none" in ceiling else {}),
                  **({"config_stage_dir_not_used": config_stage_dir} if config_stage_dir else {})},
    }
    if stage_decompressed:
        staged_cfg = cfg.model_copy(deep=True)
        staged_cfg.data.stage_dir = stage_decompressed
        staged_cfg.data.stage_decompress = True
        staged = prepare_data(application, staged_cfg, dist, check_device=False)
        rate, _ = _steady_input_rate(staged, batch, steps, threads=1)
        result["staged"] = {"stage_dir": stage_decompressed, "samples_per_second_per_core": rate,
                            "ratio_to_gzip_per_core": rate / one_core}
    projection, why_not = cores_per_accelerator(application, result["sample_shape"], one_core,
                                                 result.get("staged", {}).get("samples_per_second_per_core"))
    if projection:
        result["projection"] = projection
    else:
        result["projection_not_shown"] = why_not
    return result


def window_text(window: dict) -> str:
    """How the input rate was timed, in words."""
    if window["kind"] == "whole epochs":
        return (f"{window['epochs']} whole epoch(s), {window['batches']} batches, after an untimed first epoch "
                "(nothing a buffer read before the clock counts)")
    return f"{window['batches']} batches after {window['untimed_batches']} untimed, within the first epoch"


def input_table(result: dict) -> str:
    """An :func:`input_only` result as the lines the command prints."""
    i = result["input"]
    rate = lambda x: f"{x:9.2f}" if x else "        -"  # noqa: E731
    lines = [f"{result['app']}: input pipeline alone, batch {result['batch_size']}, {result['data_dir']} "
             f"(compression {result['compression']}, augment {result['augment']})",
             f"  cpu              {cpu.one_line(result['cpu'])}",
             f"  pipeline         {rate(i['samples_per_second_per_core'])} samples/s on 1 core, "
             f"{rate(i['samples_per_second_all_cores'])} on all {i['cores']}",
             f"  timed            {window_text(i['timed_window'])}"
             + (f"; the files in data.data_dir, not the config's data.stage_dir {i['config_stage_dir_not_used']}"
                if i.get("config_stage_dir_not_used") else ""),
             f"  ceiling loop     {rate(i['ceiling_samples_per_second_per_core'])} samples/s on 1 core"
             + (f" (ratio {i['ratio_to_ceiling']:.2f})" if i["ratio_to_ceiling"] else f" ({i.get('ceiling_why_none')})")]
    if "staged" in result:
        st = result["staged"]
        lines.append(f"  staged inflated  {rate(st['samples_per_second_per_core'])} samples/s on 1 core "
                     f"({st['ratio_to_gzip_per_core']:.2f}x the GZIP files)")
    if "projection" in result:
        pr = result["projection"]
        staged = (f", {pr['cores_from_staged_inflated']:.1f} from the staged inflated copies"
                  if pr["cores_from_staged_inflated"] else "")
        lines.append(f"  to feed {pr['samples_per_second']:.0f} samples/s per {pr['accelerator']}: "
                     f"{pr['cores_from_files']:.1f} cores per accelerator from these files{staged} ({pr['source']})")
    elif result.get("projection_not_shown"):
        lines.append(f"  cores per accelerator not projected: {result['projection_not_shown']}")
    return "\n".join(lines)


def spread_note(measurements: dict) -> str:
    """`` (best of 5 warm repetitions: fp32 at n=2048, spread 3%; ...)``: how the peaks were measured."""
    if not measurements:
        return ""
    names = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
    each = "; ".join(f"{names.get(d, d)} at n={m['size']}, spread {100 * m['spread']:.0f}%"
                     for d, m in measurements.items())
    return f" (best of {len(next(iter(measurements.values()))['rates'])} warm repetitions: {each})"


def table(result: dict) -> str:
    """A :func:`run` result as the table the command prints."""
    from common.tools import layer_account   # deferred: imports TensorFlow (--help answers without it)

    gf = lambda x: f"{x / 1e9:.1f}" if x else "-"  # noqa: E731
    c, i, e = result["compute"], result["input"], result["end_to_end"]
    ratio = f"{c['ratio_to_peak']:.2f}" if c["ratio_to_peak"] else "-"
    if c.get("peak_measurement_problem"):
        ratio += (" (above 1: a peak measured low, or the 3x convention counting gradients the first layer does "
                  "not compute; not a rate above the ceiling)")
    inside = c.get("ratio_to_peak_inside")
    if inside and c["ratio_to_peak"] and inside < 0.98 * c["ratio_to_peak"]:
        ratio += f" ({inside:.2f} counting only taps inside the zero padding)"
    return "\n".join([
        f"{result['app']}: {result['ranks']} rank(s), batch {result['batch_size']}/rank, {result['precision']}, "
        f"{result['forward_flops_per_sample'] / 1e9:.3f} GFLOP forward/sample (training = 3x)",
        f"  cpu              {cpu.one_line(result['cpu'])}",
        f"  peak matmul      fp32 {gf(result['peak_flops'])} GFLOP/s, bf16 {gf(result['peak_flops_bf16'])} GFLOP/s"
        + spread_note(result.get("peak_measurement", {})),
        f"  compute          {c['samples_per_second']:9.2f} samples/s  {gf(c['flops_per_second'])} GFLOP/s  "
        f"ratio to peak {ratio}",
        f"  input pipeline   {i['samples_per_second']:9.2f} samples/s  ratio to compute {i['ratio_to_compute']:.2f}",
        f"  end to end       {e['samples_per_second']:9.2f} samples/s  ratio to compute {e['ratio_to_compute']:.2f}",
    ] + ([profile_table(result["profile"])] if result.get("profile") else [])
      + ([layer_account.account_table(result["per_layer"])] if result.get("per_layer") else []))


# -- a result read back: what --compare and common.tools.scaling may trust --------------------------------------

RESULT_KINDS = {"training": "the training measurements (compute, input pipeline, end to end)",
                "input-only": "a --input-only measurement of the input pipeline"}


def positive_finite(value, where: str) -> float:
    """``value`` when it is a positive finite number (a rate, a size); a one-line error naming ``where`` when it
    is zero, negative, NaN, infinite, null, a string or anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise DataError(f"{where}: {json.dumps(value)}; expected a positive finite number")
    return float(value)


def shape_text(shape) -> str:
    """``[128, 128, 128, 4]`` as ``128x128x128x4``."""
    return "x".join(str(d) for d in shape)


def load_json(path) -> dict:
    """The JSON object in ``path``; a one-line error naming it when it is missing, unreadable, not JSON, or
    not an object."""
    try:
        data = json.loads(pathlib.Path(path).read_text())
    except OSError as exc:
        raise DataError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except ValueError as exc:   # json.JSONDecodeError and UnicodeDecodeError
        raise DataError(f"{path}: not a JSON file ({exc})") from None
    if not isinstance(data, dict):
        kind = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
            type(data), "number")
        raise DataError(f"{path}: a JSON {kind}; expected a JSON object (a bench result)")
    return data


def result_kind(result: dict) -> str | None:
    """``training`` or ``input-only`` for a bench result, None for any other JSON object."""
    if isinstance(result.get("compute"), dict):
        return "training"
    if isinstance(result.get("input"), dict) and "samples_per_second_per_core" in result["input"]:
        return "input-only"
    return None


def read_result(path, kind: str) -> dict:
    """The bench result of ``kind`` (:data:`RESULT_KINDS`) in ``path``, with the application and sample shape it
    was measured at; a one-line error naming ``path`` when it holds anything else.

    A result from before the bench recorded its sample shape is refused, not taken with a warning: a rate is
    only meaningful for the sample shape it was measured at (a 16^3 volume has 1/512 of a 128^3 one's voxels),
    a warning scrolls past while the number it warns of goes into the projection, and measuring again is one
    bench run."""
    result = load_json(path)
    found = result_kind(result)
    if found is None:
        raise DataError(f"{path}: not a common.tools.bench result (no compute or input section); expected "
                        f"{RESULT_KINDS[kind]}")
    if found != kind:
        raise DataError(f"{path}: holds {RESULT_KINDS[found]}; expected {RESULT_KINDS[kind]}")
    missing = [key for key in ("app", "sample_shape") if key not in result]
    if missing:
        raise DataError(f"{path}: written before the bench recorded the {' and the '.join(missing)} it measured; "
                        "rerun common.tools.bench on that config to measure it again")
    shape = result["sample_shape"]
    if not isinstance(result["app"], str) or not (isinstance(shape, list) and shape and all(
            isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)):
        raise DataError(f"{path}: app {json.dumps(result['app'])}, sample_shape {json.dumps(shape)}; expected an "
                        "application name and a list of positive whole numbers")
    return result


def check_workload(result: dict, path, application: str, shape, expected_from: str) -> None:
    """A one-line error unless the result read from ``path`` was measured for ``application`` at sample shape
    ``shape`` (what ``expected_from`` describes, e.g. the config a projection is of)."""
    if result["app"] == application and list(result["sample_shape"]) == list(shape):
        return
    config = f" (a bench of {result['config']})" if result.get("config") else ""
    raise DataError(f"{path}: measured {result['app']} at sample shape {shape_text(result['sample_shape'])}"
                    f"{config}; expected {application} at {shape_text(shape)} ({expected_from}): bench that "
                    "and use its result")


def recorded_rate(result: dict, path, section: str, key: str = "samples_per_second") -> float:
    """``result[section][key]`` as a positive finite rate; a one-line error naming ``path`` and the key otherwise."""
    values = result.get(section)
    return positive_finite(values.get(key) if isinstance(values, dict) else None, f"{path}: {section}.{key}")


def recorded_ranks(result: dict, path) -> int:
    """The ranks a result's rates are summed over (1 where not recorded); a one-line error unless at least 1."""
    ranks = result.get("ranks", 1)
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise DataError(f"{path}: ranks {json.dumps(ranks)}; expected a whole number of at least 1")
    return ranks


def compare(one_path, other_path) -> str:
    """``--compare``: the end-to-end rate of one training result relative to another of the same application and
    sample shape (e.g. 2 ranks against 1 process), in words."""
    one, other = read_result(one_path, "training"), read_result(other_path, "training")
    check_workload(other, other_path, one["app"], one["sample_shape"], f"what {one_path} measured")
    ratio = (recorded_rate(other, other_path, "end_to_end") / recorded_rate(one, one_path, "end_to_end"))
    return (f"{other_path} ({recorded_ranks(other, other_path)} rank(s)) vs {one_path} "
            f"({recorded_ranks(one, one_path)} rank(s)): end-to-end {ratio:.2f}x")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m common.tools.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="the app config to benchmark")
    parser.add_argument("--compare", nargs=2, metavar=("ONE.json", "OTHER.json"),
                        help="print the end-to-end rate of OTHER relative to ONE (e.g. 2 ranks vs 1 process)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--app")
    parser.add_argument("--batch-size", type=positive_int_argument)
    parser.add_argument("--steps", type=positive_int_argument, default=10,
                        help="timed steps per measurement, after warm-up ones (at least 1; default 10)")
    parser.add_argument("--precision", choices=["fp32", "mixed_float16", "mixed_bfloat16", "auto"])
    parser.add_argument("--json", help="write the result here (a new file, or one this suite wrote)")
    parser.add_argument("--force", action="store_true", help="replace a --json file this suite did not write")
    parser.add_argument("--profile", metavar="DIR", help="also trace compute steps here and print the op times")
    parser.add_argument("--per-layer", action="store_true",
                        help="also time each layer's forward and backward alone on its real input, the optimizer "
                             "and the allreduce, and print where the step's time goes (common/tools/layer_account.py)")
    parser.add_argument("--input-only", action="store_true",
                        help="time the input pipeline alone (1 core and all) against the simplest loop's ceiling")
    parser.add_argument("--stage-decompressed", metavar="DIR",
                        help="with --input-only: also stage the training files to DIR inflated and time reading them")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.compare:
        print(compare(*args.compare))
        return 0
    if not args.config:
        parser.error("--config is required")
    if args.stage_decompressed and not args.input_only:
        parser.error("--stage-decompressed goes with --input-only")
    if args.per_layer and args.input_only:
        parser.error("--per-layer times the training step; --input-only times no step")
    # The outputs, one transaction: --profile a folder of the bench's own (new, empty, or an earlier trace's,
    # which this one replaces: rank<r>/ per rank), --json a file (absent, or an earlier bench result), checked
    # before the benchmark runs and committed when it has.
    transaction = OutputTransaction(Producer(TOOL, "", data=str(pathlib.Path(args.config).resolve())), args.force,
                                    inputs=[args.config])
    json_path = pathlib.Path(args.json).absolute() if args.json else None
    if args.profile:
        transaction.into(args.profile, "profile", "--profile")
    transaction.check([json_path] if json_path else [], options={json_path: "--json"} if json_path else None)

    application = find_application(args.config, args.app)
    overrides = list(args.set)
    if args.batch_size is not None:
        overrides.append(f"data.batch_size={args.batch_size}")
    if args.precision:
        overrides.append(f"train.precision={args.precision}")
    cfg = load_config(application.config_schema, args.config, overrides)
    transaction.inputs.append(pathlib.Path(cfg.data.data_dir))   # no output inside the data it reads
    transaction.check([json_path] if json_path else [])
    # deferred: TensorFlow and Horovod load only once the arguments and the config are checked
    from common import distributed

    dist = distributed.init(cfg.train.intra_op_threads, cfg.train.inter_op_threads)
    logs.configure(dist.rank, dist.size, ("common", application.package))
    traces = [f"rank{rank}" for rank in range(dist.size)] if args.profile else []
    transaction.plan([*traces, *([json_path] if json_path else [])])
    if args.profile:   # claimed before any work, every rank's verdict rank 0's; the others trace into its staging
        refusal, staging = None, None
        if dist.is_root:
            try:
                transaction.claim()
                staging = transaction.staging_folder
            except UserInputError as exc:
                refusal = str(exc)
        refusal, staging = dist.broadcast_object((refusal, staging))
        if refusal is not None:
            raise UserInputError(refusal)
        if not dist.is_root:
            transaction.follow(staging)
    try:
        if args.input_only:
            result = input_only(application, cfg, dist, args.steps, stage_decompressed=args.stage_decompressed)
        elif args.profile:
            with transaction.directory(f"rank{dist.rank}") as logdir:
                result = run(application, cfg, dist, args.steps, profile_dir=str(logdir), per_layer=args.per_layer)
        else:
            result = run(application, cfg, dist, args.steps, per_layer=args.per_layer)
        # What was measured, for whoever reads the result back (read_result, check_workload).
        result = {"config": args.config, "overrides": overrides, **result}
        dist.barrier()   # every rank's trace staged
        if dist.is_root:
            print(input_table(result) if args.input_only else table(result), flush=True)
            if transaction.state == "open" and json_path:
                transaction.claim()
            if json_path:
                with transaction.reading(args.config):
                    transaction.json(json_path, result)
        transaction.commit()
    except BaseException:
        transaction.rollback()
        raise
    # No rank leaves while another still talks to it (a "connection reset" from Horovod's loop otherwise).
    dist.barrier()
    return 0


if __name__ == "__main__":
    exit_process(run_command(main, name=TOOL))
