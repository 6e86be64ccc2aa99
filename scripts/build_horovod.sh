#!/usr/bin/env bash
# Build Horovod 0.28.1 against the TensorFlow already installed in the active
# Python environment, cache the wheel, and install it.
#
# Plain `pip install horovod` fails on TF >= 2.16: horovod/tensorflow/xla_mpi_ops.cc
# includes XLA headers that moved.  Those ops are only needed to call Horovod
# inside XLA-compiled functions, which we never do (XLA is off for 3D convs on
# CPU and our train_step calls Horovod outside jit), so the file is dropped.
#
# Environment:
#   PYTHON              interpreter of the target environment (default: python)
#   HOROVOD_VERSION     default 0.28.1
#   HOROVOD_CACHE_DIR   where built wheels are kept (default: ~/.cache/hpc-dl-suite/wheels)
#   HOROVOD_GPU         set to 1 to build NCCL GPU operations (clusters)
#   MAKEFLAGS           default -j<ncpu>
set -euo pipefail

PYTHON=${PYTHON:-python}
HOROVOD_VERSION=${HOROVOD_VERSION:-0.28.1}
CACHE_DIR=${HOROVOD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hpc-dl-suite/wheels}

tf_version=$("$PYTHON" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null) || {
    echo "build_horovod: TensorFlow is not importable by $PYTHON; install it first" >&2
    exit 2
}
py_tag=$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')

# MPI (srun- and mpirun-launched ranks need it) whenever an MPI compiler is present; Gloo always.
with_mpi=0
if command -v mpicxx >/dev/null 2>&1 || command -v mpicc >/dev/null 2>&1; then
    with_mpi=1
else
    echo "build_horovod: no MPI compiler (mpicc) found: building with Gloo only (horovodrun --gloo works;" \
         "srun/mpirun-launched ranks need the MPI build: install Open MPI, e.g. make setup as root with apt)"
fi
variant="gloo"
[ "$with_mpi" = 1 ] && variant="${variant}-mpi"
[ "${HOROVOD_GPU:-0}" = 1 ] && variant="${variant}-nccl"

key="horovod-${HOROVOD_VERSION}-tf${tf_version}-${py_tag}-${variant}"
wheel_dir="$CACHE_DIR/$key"

if "$PYTHON" - "$HOROVOD_VERSION" "$with_mpi" <<'PYEOF' 2>/dev/null
import sys, importlib.metadata as md
import horovod.tensorflow as hvd  # fails when built against another TF
# The installed build must be this variant: an MPI build is not a Gloo-only build.
sys.exit(0 if md.version("horovod") == sys.argv[1] and hvd.mpi_built() == (sys.argv[2] == "1") else 1)
PYEOF
then
    echo "build_horovod: horovod $HOROVOD_VERSION ($variant) already installed and importable"
    exit 0
fi

if ! ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1; then
    echo "build_horovod: building $key (a few minutes, once; cached in $wheel_dir)"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: \
        "horovod==$HOROVOD_VERSION" -d "$work"
    tar -xzf "$work"/horovod-"$HOROVOD_VERSION".tar.gz -C "$work"
    src="$work/horovod-$HOROVOD_VERSION"
    sed -i '/xla_mpi_ops.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
    if grep -q xla_mpi_ops.cc "$src/horovod/tensorflow/CMakeLists.txt"; then
        echo "build_horovod: could not remove xla_mpi_ops.cc from the CMake sources" >&2
        exit 1
    fi
    export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1
    export HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
    if [ "$with_mpi" = 1 ]; then
        export HOROVOD_WITH_MPI=1
    else
        export HOROVOD_WITHOUT_MPI=1
    fi
    if [ "${HOROVOD_GPU:-0}" = 1 ]; then
        export HOROVOD_GPU_OPERATIONS=NCCL
    fi
    export MAKEFLAGS=${MAKEFLAGS:--j$(nproc)}
    mkdir -p "$work/dist"
    "$PYTHON" -m pip wheel --no-build-isolation --no-deps -w "$work/dist" "$src"
    mkdir -p "$wheel_dir"
    cp "$work"/dist/horovod-*.whl "$wheel_dir"/
fi

"$PYTHON" -m pip install --quiet --no-deps --force-reinstall "$wheel_dir"/horovod-*.whl
# Horovod's own runtime dependencies (horovodrun needs them).
"$PYTHON" -m pip install --quiet cloudpickle psutil pyyaml packaging
"$PYTHON" -c 'import horovod.tensorflow as hvd; import horovod; print("build_horovod: horovod", horovod.__version__, "gloo:", hvd.gloo_built(), "mpi:", hvd.mpi_built())'
