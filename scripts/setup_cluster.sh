#!/usr/bin/env bash
# Set up on a cluster whose site module provides TensorFlow (and CUDA, MPI):
#   module load tensorflow/2.21 openmpi   # names differ per site
#   HOROVOD_GPU=1 bash scripts/setup_cluster.sh
# Creates .venv on top of the site Python (--system-site-packages, so the
# module's TensorFlow is used, not reinstalled), installs the project, and
# builds Horovod against that TensorFlow with MPI (and NCCL when HOROVOD_GPU=1).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON_BIN=${PYTHON_BIN:-python3}
VENV=${VENV:-.venv}

"$PYTHON_BIN" -c 'import tensorflow' 2>/dev/null || {
    echo "setup_cluster: $PYTHON_BIN cannot import tensorflow; load the site TensorFlow module first" >&2
    exit 2
}
command -v mpicxx >/dev/null 2>&1 || command -v mpicc >/dev/null 2>&1 || {
    echo "setup_cluster: no MPI compiler (mpicc/mpicxx) on PATH; load the site MPI module (srun launches need an MPI build)" >&2
    exit 2
}
[ -x "$VENV/bin/python" ] || "$PYTHON_BIN" -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -m pip install --quiet -e ".[test]"
PYTHON="$VENV/bin/python" bash scripts/build_horovod.sh
"$VENV/bin/python" -c 'import horovod.tensorflow as hvd; assert hvd.mpi_built(), "Horovod built without MPI"'
echo "setup_cluster: done; run with: srun ... $VENV/bin/python -m <app>.train --config ..."
