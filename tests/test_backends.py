"""The models are plain Keras 3: they build and train under JAX with no TensorFlow installed."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

from common import registry
from tests.conftest import REPO

JAX_PYTHON = REPO / ".venv-jax" / "bin" / "python"
BENCH = REPO / "scripts" / "backend_bench.py"


def bench_networks() -> dict[str, str]:
    """scripts/backend_bench.py's networks, in its order: name -> config path (its ``APPS`` table, read from the
    source: importing the script builds Keras and every application's model module)."""
    table = next(node.value for node in ast.parse(BENCH.read_text()).body
                 if isinstance(node, ast.Assign) and [ast.unparse(target) for target in node.targets] == ["APPS"])
    return {name: config for name, (config, _) in ast.literal_eval(table).items()}


NETWORKS = tuple(bench_networks())


@pytest.fixture(scope="module")
def jax_report() -> dict:
    """scripts/backend_bench.py --tiny run in .venv-jax (Keras on JAX, no TensorFlow)."""
    assert JAX_PYTHON.is_file(), f"{JAX_PYTHON} missing: make setup-jax (make test does it)"
    env = {**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": str(REPO),
           # XLA's CPU compiler without its expensive optimisations: what is checked here is that each model builds,
           # trains and counts its FLOPs under JAX, not how fast.  The fixture took 138 s with them and 54 s without
           # (2-core Xeon, AVX-512, the cores shared with another job).
           "XLA_FLAGS": " ".join([os.environ.get("XLA_FLAGS", ""), "--xla_backend_optimization_level=0",
                                  "--xla_llvm_disable_expensive_passes=true"]).strip()}
    check = subprocess.run([str(JAX_PYTHON), "-c", "import tensorflow"], capture_output=True, env=env)
    assert check.returncode != 0, "the JAX environment must not have TensorFlow"
    result = subprocess.run([str(JAX_PYTHON), str(BENCH), "--tiny", "--steps", "1"],
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_bench_has_a_network_of_every_registered_application():
    # The applications come from the registry; the bench's table names a network (its config under
    # configs/<package>/) for each, so a new application without one fails here.
    packages = {config.split("/")[1] for config in bench_networks().values()}
    assert set(registry.names()) <= packages, f"scripts/backend_bench.py's APPS lacks {set(registry.names()) - packages}"


def test_every_app_trains_under_jax_without_tensorflow(jax_report):
    report = jax_report
    assert report["backend"] == "jax" and report["precision"] == "mixed_bfloat16"
    assert [r["app"] for r in report["results"]] == list(NETWORKS)
    for row in report["results"]:
        assert row["output_dtype"] == "float32" and row["samples_per_second"] > 0
        assert 0 < row["loss"] < 1e4


@pytest.mark.parametrize("app", NETWORKS)
def test_flop_count_under_jax_equals_the_count_under_tensorflow(jax_report, app):
    sys.path.insert(0, str(REPO / "scripts"))
    import backend_bench

    from common.nn.flops import forward_flops_per_sample

    network, *_ = backend_bench.build(app, tiny=True, batch=None)
    row = next(r for r in jax_report["results"] if r["app"] == app)
    assert row["forward_flops_per_sample"] == pytest.approx(forward_flops_per_sample(network), rel=1e-9)
