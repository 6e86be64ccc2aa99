"""Compute benchmark of every app's network on whichever Keras 3 backend is installed.

    KERAS_BACKEND=jax python scripts/backend_bench.py [--precision mixed_bfloat16] [--steps 10] [--tiny]
    python scripts/backend_bench.py --xla both          # TensorFlow: jit_compile off and on

For GPU machines without TensorFlow (JAX or PyTorch only): the models are
plain Keras 3 (keras.layers / keras.ops, no tf.*), so they build and train
under any backend; this script needs only keras, its backend, numpy,
pydantic and pyyaml.  It measures the backend's matmul peak at the run's
precision, then times training steps on an in-memory random batch for each
app's full-size config (CosmoFlow 128^3 x 4, HEP-224, Tiramisu and
DeepLabv3+ at 768 x 1152 x 16) and prints samples/s, achieved FLOP/s
(3 x the forward FLOPs of common.nn.flops, which needs no TensorFlow) and the
ratio to the measured peak, saying which backend (and XLA setting) ran.
``--tiny`` runs small shapes (the CPU test in tests/test_backends.py).
The last line is JSON.  The mark on a GPU: about 209 CosmoFlow training
samples/s per H100 (MLPerf HPC v3.0, PyTorch).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import common  # noqa: E402,F401  (before TensorFlow, where the backend is TensorFlow)
import keras  # noqa: E402
import numpy as np  # noqa: E402

from common.cli import positive_int_argument  # noqa: E402
from common.config import load_config  # noqa: E402
from common.nn.flops import TRAINING_FLOPS_FACTOR, forward_flops_per_sample  # noqa: E402
from common.nn.precision import compute_dtype, set_precision  # noqa: E402
from climate_seg.segmentation import model as climate_model  # noqa: E402
from climate_seg.segmentation.config import ClimateConfig  # noqa: E402
from climate_seg.segmentation.loss import WeightedPixelCrossEntropy  # noqa: E402
from cosmoflow import model as cosmoflow_model  # noqa: E402
from cosmoflow.config import CosmoflowConfig  # noqa: E402
from hep_cnn import model as hep_model  # noqa: E402
from hep_cnn.config import HepConfig  # noqa: E402

# app -> (config, overrides at --tiny, loss builder)
APPS = {
    "cosmoflow": ("configs/cosmoflow/mlperf.yaml", ["data.sample_shape=[16,16,16,4]", "model.conv_blocks=2",
                                                    "model.base_filters=4", "model.dense_units=[8]"]),
    "hep_cnn_224": ("configs/hep_cnn/benchmark_224.yaml", ["data.image_size=32", "model.filters=8"]),
    "tiramisu": ("configs/climate_seg/gordon_bell_tiramisu.yaml",
                 ["data.grid=[32,48]", "model.tiramisu.growth_rate=4", "model.tiramisu.first_filters=8"]),
    "deeplab": ("configs/climate_seg/gordon_bell_deeplab.yaml",
                ["data.grid=[32,48]", "model.deeplab.blocks=[1,1,1,1]", "model.deeplab.base_filters=8",
                 "model.deeplab.aspp_filters=16", "model.deeplab.decoder_filters=16"]),
}


def build(app: str, tiny: bool, batch: int | None):
    """(network, loss, x, y, batch) for one app from its config."""
    config, small = APPS[app]
    overrides = (small if tiny else []) + ([f"data.batch_size={batch}"] if batch else [])
    rng = np.random.default_rng(0)
    if app == "cosmoflow":
        cfg = load_config(CosmoflowConfig, REPO / config, overrides)
        network, loss = cosmoflow_model.build_model(cfg), "mse"
        y = rng.uniform(-1, 1, (cfg.data.batch_size, len(cfg.data.target_names))).astype("float32")
    elif app == "hep_cnn_224":
        cfg = load_config(HepConfig, REPO / config, overrides)
        network, loss = hep_model.build_model(cfg), keras.losses.SparseCategoricalCrossentropy()
        y = rng.integers(0, 2, cfg.data.batch_size).astype("int32")
    else:
        cfg = load_config(ClimateConfig, REPO / config, overrides)
        network, loss = climate_model.build_model(cfg), WeightedPixelCrossEntropy([0.1, 5.0, 2.0])
        y = rng.integers(0, 3, (cfg.data.batch_size, *cfg.data.input_shape[:2])).astype("int32")
    x = rng.normal(size=(cfg.data.batch_size, *network.input_shape[1:])).astype("float32")
    return network, loss, x, y, cfg.data.batch_size


def _wait(tensor) -> None:
    """Block until ``tensor`` is computed (every backend runs asynchronously on accelerators)."""
    keras.ops.convert_to_numpy(keras.ops.cast(tensor[0, 0], "float32"))


def matmul_peak(dtype: str, n: int, repeats: int = 5) -> float:
    a = keras.ops.ones((n, n), dtype=dtype)
    product = keras.ops.matmul(a, a)
    _wait(product)
    start = time.perf_counter()
    for _ in range(repeats):
        product = keras.ops.matmul(a, product * 1e-3)
    _wait(product)
    return repeats * 2.0 * n ** 3 / (time.perf_counter() - start)


def time_training(network, loss, x, y, steps: int, jit_compile) -> tuple[float, float]:
    """(seconds per step after two warm-up steps, last loss)."""
    network.compile(optimizer=keras.optimizers.Adam(1e-4), loss=loss, jit_compile=jit_compile)
    for _ in range(2):
        value = network.train_on_batch(x, y)
    start = time.perf_counter()
    for _ in range(steps):
        value = network.train_on_batch(x, y)
    return (time.perf_counter() - start) / steps, float(np.asarray(value).reshape(-1)[0])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--apps", default=",".join(APPS))
    parser.add_argument("--precision", default="mixed_bfloat16", choices=["fp32", "mixed_bfloat16", "mixed_float16"])
    parser.add_argument("--batch-size", type=positive_int_argument, help="per app default: the config's")
    parser.add_argument("--steps", type=positive_int_argument, default=10)
    parser.add_argument("--xla", choices=["off", "on", "both", "auto"], default="auto",
                        help="TensorFlow: jit_compile (off on CPUs: 5.7x slower for 3D convs); JAX always compiles")
    parser.add_argument("--tiny", action="store_true", help="small shapes, for a CPU check")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    backend = keras.backend.backend()
    set_precision(args.precision)
    dtype = compute_dtype(args.precision)
    peak = matmul_peak(dtype, 512 if args.tiny else 8192)
    xla_settings = {"off": [False], "on": [True], "both": [False, True], "auto": ["auto"]}[args.xla]
    print(f"backend {backend} (keras {keras.__version__}), precision {args.precision}, "
          f"{dtype} matmul peak {peak / 1e12:.2f} TFLOP/s", flush=True)
    results = []
    for app in args.apps.split(","):
        for jit in xla_settings:
            keras.utils.set_random_seed(0)
            network, loss, x, y, batch = build(app, args.tiny, args.batch_size)
            seconds, last_loss = time_training(network, loss, x, y, args.steps, jit)
            forward = forward_flops_per_sample(network)
            flops = TRAINING_FLOPS_FACTOR * forward * batch / seconds
            row = {"app": app, "backend": backend, "jit_compile": jit, "batch": batch,
                   "forward_flops_per_sample": forward,
                   "samples_per_second": batch / seconds, "flops_per_second": flops,
                   "ratio_to_peak": flops / peak, "loss": last_loss, "output_dtype": str(network.output.dtype)}
            results.append(row)
            print(f"  {app:<12} xla {str(jit):<5} batch {batch:>3}: {row['samples_per_second']:9.2f} samples/s, "
                  f"{flops / 1e12:7.3f} TFLOP/s, {row['ratio_to_peak']:.2f} of peak, loss {last_loss:.4g}",
                  flush=True)
    print(json.dumps({"backend": backend, "precision": args.precision, "peak_flops": peak, "results": results}))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
