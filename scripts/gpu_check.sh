#!/usr/bin/env bash
# The one short check of a GPU node (or any GPU machine), about 10 minutes:
#   bash scripts/gpu_check.sh [OUT_DIR]            # default OUT_DIR: runs/gpu-check-<host>-<time>
#
# 1. nvidia-smi: the GPUs, driver and compute capability;
# 2. with TensorFlow (the GPU build, `make check-gpu-build` or `make setup-cluster`): the pinned build line
#    (common.tools.build_info), then common.tools.bench on CosmoFlow at 128^3 x 4 with `precision: auto`
#    (mixed_bfloat16 from Ampere on, mixed_float16 before) on 1 GPU, and on 2 GPUs over NCCL when there are two
#    and Horovod has NCCL;
# 3. with JAX and Keras (no TensorFlow needed): scripts/backend_bench.py on CosmoFlow under Keras' JAX backend;
# 4. one JSON (the last line printed, and OUT_DIR/gpu_check.json): samples/s per GPU and the ratio to the
#    same run's matmul peak, for each part that ran on a GPU, and the parts skipped with why.
# Each part runs only where its tools are; a machine with PyTorch and JAX but no TensorFlow runs 1, 3 and 4.
# A part whose framework sees no GPU (a CPU-only build) is skipped, not run at MLPerf size on the CPU.
#
# Exit status: 0 when a part measured; 1 when there is no GPU here (nvidia-smi lists none; nothing is run or
# written, unless GPU_CHECK_TINY=1) or when no part measured anything; 2 when OUT_DIR is not empty.
#
# Environment:
#   TF_PYTHON    the Python of the GPU build (default: .venv-gpu/bin/python, else .venv/bin/python, else python3)
#   JAX_PYTHON   a Python with jax and keras (default: .venv-jax/bin/python if present, else python3)
#   STEPS        timed steps per measurement (default 8); BATCH: per-GPU batch (default: the config's)
#   GPU_CHECK_TINY=1   small shapes (the demo config, tiny JAX networks): also without a GPU, a check of this
#                      script itself on the CPU; its figures are then filed as the CPU's (tensorflow_cpu, jax_cpu)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

stamp=$(date -u +%Y%m%dT%H%M%SZ)
OUT=${1:-runs/gpu-check-$(hostname -s)-$stamp}
if [ -e "$OUT" ] && [ -n "$(ls -A "$OUT" 2>/dev/null)" ]; then
    echo "gpu_check: $OUT exists and is not empty; name a new folder" >&2
    exit 2
fi
tiny=${GPU_CHECK_TINY:-0}

# 1. The GPUs: found before anything is written, so that a machine without one is told so and left as it was.
gpu_rows=""
smi_problem="not on PATH (no NVIDIA driver here)"
if command -v nvidia-smi >/dev/null 2>&1; then
    if gpu_rows=$(nvidia-smi --query-gpu=index,name,memory.total,driver_version,compute_cap \
                      --format=csv,noheader 2>&1); then
        smi_problem="lists no GPU"
    else
        smi_problem="failed: $(echo "$gpu_rows" | head -n 1)"
        gpu_rows=""
    fi
fi
gpus=$(printf '%s' "$gpu_rows" | grep -c . || true)
if [ "$gpus" -eq 0 ] && [ "$tiny" != 1 ]; then
    echo "gpu_check: no GPU here: nvidia-smi $smi_problem; nothing was measured or written (this checks a GPU" \
         "node: run it on one; GPU_CHECK_TINY=1 runs its small shapes on the CPU, a check of the script itself)" >&2
    exit 1
fi

mkdir -p "$OUT"
STEPS=${STEPS:-8}
pick_python() {   # the first of the arguments that is an executable Python
    local candidate
    for candidate in "$@"; do
        if [ -x "$candidate" ] || command -v "$candidate" >/dev/null 2>&1; then
            echo "$candidate"
            return
        fi
    done
}
TF_PYTHON=${TF_PYTHON:-$(pick_python .venv-gpu/bin/python .venv/bin/python python3)}
JAX_PYTHON=${JAX_PYTHON:-$(pick_python .venv-jax/bin/python python3)}
skipped="$OUT/skipped.txt"
: > "$skipped"
skip() { echo "gpu_check: skipped $1: $2"; echo "$1: $2" >> "$skipped"; }

if [ "$gpus" -gt 0 ]; then
    nvidia-smi
    printf '%s\n' "$gpu_rows" > "$OUT/gpus.csv"
else
    skip nvidia-smi "$smi_problem: GPU_CHECK_TINY=1, the small shapes run on the CPU and are filed as the CPU's"
fi
capability=$(head -n 1 "$OUT/gpus.csv" 2>/dev/null | awk -F', *' '{print $5}')
precision_jax=mixed_bfloat16
# Before Ampere (compute capability 8.0) GPUs have no bf16 units: float16 with loss scaling.
if [ -n "$capability" ] && [ "${capability%%.*}" -lt 8 ]; then precision_jax=mixed_float16; fi

if [ "$tiny" = 1 ]; then
    bench_config=(--config configs/cosmoflow/demo.yaml --set "data.data_dir=$OUT/data"
                  --set data.mock.n_train=16 --set data.mock.n_validation=8)
    jax_tiny=(--tiny)
else
    bench_config=(--config configs/cosmoflow/mlperf.yaml --set "data.data_dir=$OUT/data-128"
                  --set data.compression=none --set data.mock.generate_if_missing=true
                  --set data.mock.n_train=32 --set data.mock.n_validation=8 --set data.mock.box_size_mpc_h=512)
    jax_tiny=()
fi
[ -n "${BATCH:-}" ] && bench_config+=(--batch-size "$BATCH")

# 2. TensorFlow: the build line and the bench, on 1 GPU and on 2 over NCCL.
tf_sees_gpu='import sys, tensorflow as tf; sys.exit(0 if tf.config.list_physical_devices("GPU") else 1)'
if ! "$TF_PYTHON" -c 'import tensorflow' >/dev/null 2>&1; then
    skip tensorflow "$TF_PYTHON cannot import tensorflow (set TF_PYTHON to the GPU build's Python)"
elif [ "$gpus" -gt 0 ] && ! "$TF_PYTHON" -c "$tf_sees_gpu" >/dev/null 2>&1; then
    "$TF_PYTHON" -m common.tools.build_info | tee "$OUT/build_line.txt"
    skip tensorflow "$TF_PYTHON's TensorFlow sees no GPU (a CPU-only build? set TF_PYTHON to the GPU build's Python)"
else
    "$TF_PYTHON" -m common.tools.build_info | tee "$OUT/build_line.txt"
    "$TF_PYTHON" -m common.tools.build_info --json > "$OUT/build.json" 2>/dev/null || true
    one_device="1 GPU"
    [ "$gpus" -eq 0 ] && one_device=CPU
    "$TF_PYTHON" -m common.tools.bench "${bench_config[@]}" --precision auto --steps "$STEPS" \
        --json "$OUT/bench-1.json" || skip "tensorflow bench ($one_device)" "common.tools.bench failed (above)"
    if [ "$gpus" -ge 2 ]; then
        if grep -q 'nccl_built=True' "$OUT/build_line.txt"; then
            PATH="$(dirname "$TF_PYTHON"):$PATH" horovodrun -np 2 -H localhost:2 \
                "$TF_PYTHON" -m common.tools.bench "${bench_config[@]}" --precision auto --steps "$STEPS" \
                --json "$OUT/bench-2.json" || skip "tensorflow bench (2 GPUs)" "horovodrun failed (above)"
        else
            skip "tensorflow bench (2 GPUs)" "Horovod has no NCCL (build with make check-gpu-build)"
        fi
    else
        skip "tensorflow bench (2 GPUs)" "fewer than 2 GPUs"
    fi
fi

# 3. Keras on JAX, no TensorFlow needed.
jax_sees_gpu='import sys, jax; sys.exit(0 if jax.default_backend() == "gpu" else 1)'
if ! KERAS_BACKEND=jax "$JAX_PYTHON" -c 'import jax, keras' >/dev/null 2>&1; then
    skip jax "$JAX_PYTHON cannot import jax and keras (set JAX_PYTHON)"
elif [ "$gpus" -gt 0 ] && ! "$JAX_PYTHON" -c "$jax_sees_gpu" >/dev/null 2>&1; then
    skip jax "$JAX_PYTHON's JAX sees no GPU (a CPU-only jaxlib? install jax[cuda12])"
else
    KERAS_BACKEND=jax "$JAX_PYTHON" scripts/backend_bench.py --apps cosmoflow --precision "$precision_jax" \
        --steps "$STEPS" ${BATCH:+--batch-size "$BATCH"} "${jax_tiny[@]}" | tee "$OUT/jax.log" \
        || skip jax "scripts/backend_bench.py failed (above)"
    tail -n 1 "$OUT/jax.log" > "$OUT/jax.json"
fi

# 4. One JSON over what ran; its status is the script's (1 when nothing measured).
"$(pick_python "$JAX_PYTHON" python3)" - "$OUT" "$gpus" <<'PYEOF'
import json, pathlib, socket, sys
out, gpus = pathlib.Path(sys.argv[1]), int(sys.argv[2])
# Without a GPU (GPU_CHECK_TINY only) the figures are the CPU's, one process each, and named so.
per = "per_gpu" if gpus else "per_process"

def load(name):
    path = out / name
    try:
        return json.loads(path.read_text()) if path.is_file() and path.stat().st_size else None
    except json.JSONDecodeError:
        return None

skipped = [line for line in (out / "skipped.txt").read_text().splitlines() if line]

def tf_part(name, result, devices):
    if not result:
        return None
    if gpus and result.get("gpus_visible", 0) < 1:   # checked before the run; a bench that fell back is not a GPU's
        skipped.append(f"{name}: the bench ran on the CPU (its TensorFlow saw no GPU); not filed as a GPU's")
        return None
    compute = result["compute"]
    return {"ranks": result["ranks"], "precision": result["precision"], "batch_size_per_rank": result["batch_size"],
            f"samples_per_second_{per}": compute["samples_per_second"] / devices,
            "ratio_to_peak": compute["ratio_to_peak"], "peak_flops": result["peak_flops"],
            "peak_flops_bf16": result["peak_flops_bf16"],
            f"end_to_end_samples_per_second_{per}": result["end_to_end"]["samples_per_second"] / devices}

def jax_part(result):
    rows = (result or {}).get("results", [])
    if not rows:
        return None
    return {"backend": result["backend"], "precision": result["precision"], "peak_flops": result["peak_flops"],
            f"samples_per_second_{per}": rows[0]["samples_per_second"], "ratio_to_peak": rows[0]["ratio_to_peak"],
            "batch": rows[0]["batch"]}

if gpus:
    parts = {"tensorflow_1gpu": tf_part("tensorflow bench (1 GPU)", load("bench-1.json"), 1),
             "tensorflow_2gpus_nccl": tf_part("tensorflow bench (2 GPUs)", load("bench-2.json"), 2),
             "jax": jax_part(load("jax.json"))}
else:
    parts = {"tensorflow_cpu": tf_part("tensorflow bench (CPU)", load("bench-1.json"), 1),
             "jax_cpu": jax_part(load("jax.json"))}
report = {
    "host": socket.gethostname(),
    "gpus": [line.strip() for line in (out / "gpus.csv").read_text().splitlines()] if (out / "gpus.csv").is_file() else [],
    "build": load("build.json"),
    **parts,
    "on_cpu": gpus == 0,
    "skipped": skipped,
}
text = json.dumps(report)
(out / "gpu_check.json").write_text(text + "\n")
print(text)
if not any(parts.values()):
    print("gpu_check: nothing was measured (see skipped above)", file=sys.stderr)
    sys.exit(1)
PYEOF
