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
#
# With HOROVOD_GPU=1 (see docs/clusters.md, "The GPU build"):
#   HOROVOD_CUDA_HOME   a CUDA toolkit with bin/nvcc; default: the nvcc on PATH (CUDA_FROM_WHEELS=1 skips it),
#                       else NVIDIA's CUDA 13 compiler
#                       wheels (nvcc, nvvm, crt, runtime, cccl) installed once into the cache, used at build time
#                       only (Horovod links the CUDA runtime statically; the library then needs a driver that
#                       supports that runtime)
#   HOROVOD_NCCL_HOME   NCCL (include/nccl.h, lib/libnccl.so*); default: the nvidia-nccl-cu12 wheel that
#                       tensorflow[and-cuda] installs, found at run time through a RUNPATH relative to Horovod
#   HOROVOD_BUILD_CUDA_CC_LIST   compute capabilities, default 80,90 (A100, H100/H200)
set -euo pipefail

PYTHON=${PYTHON:-python}
HOROVOD_VERSION=${HOROVOD_VERSION:-0.28.1}
CUDA_COMPILER_VERSION=${CUDA_COMPILER_VERSION:-13.0}
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
with_nccl=0
gpu_flag=${HOROVOD_GPU:-0}
# Horovod's own CMake reads HOROVOD_GPU as the GPU kind (CUDA or ROCM): "1" stops its configure step.
unset HOROVOD_GPU
if [ "$gpu_flag" = 1 ]; then
    with_nccl=1
    export HOROVOD_BUILD_CUDA_CC_LIST=${HOROVOD_BUILD_CUDA_CC_LIST:-80,90}
    variant="${variant}-nccl-cc${HOROVOD_BUILD_CUDA_CC_LIST//,/.}"
fi

# The GPU build's compiler, NCCL and two source fixes (../docs/clusters.md "The GPU build"); sets the
# environment of the pip build that follows.
prepare_gpu_build() {
    local src=$1 site cuda nccl
    site=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    if [ -n "${HOROVOD_CUDA_HOME:-}" ]; then
        cuda=$HOROVOD_CUDA_HOME
        echo "build_horovod: CUDA compiler: $cuda/bin/nvcc (HOROVOD_CUDA_HOME)"
    elif [ "${CUDA_FROM_WHEELS:-0}" != 1 ] && command -v nvcc >/dev/null 2>&1; then
        # nvcc on PATH may be a wrapper: nvcc itself says where its toolkit is.
        cuda=$(nvcc -dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n 1)
        cuda=$(readlink -f "${cuda:-$(dirname "$(command -v nvcc)")/..}")
        echo "build_horovod: CUDA compiler: the system's $cuda/bin/nvcc"
    else
        # TensorFlow's CUDA 12 wheels carry no nvcc; NVIDIA's CUDA 13 compiler wheels do (build time only).
        local wheels="$CACHE_DIR/cuda-compiler-${CUDA_COMPILER_VERSION}"
        cuda="$wheels/nvidia/cu13"
        if [ ! -x "$cuda/bin/nvcc" ]; then
            echo "build_horovod: installing NVIDIA's CUDA ${CUDA_COMPILER_VERSION} compiler wheels into $wheels (once)"
            rm -rf "$wheels.partial"
            "$PYTHON" -m pip install --quiet --no-deps --target "$wheels.partial" \
                "nvidia-cuda-nvcc==${CUDA_COMPILER_VERSION}.*" "nvidia-nvvm==${CUDA_COMPILER_VERSION}.*" \
                "nvidia-cuda-crt==${CUDA_COMPILER_VERSION}.*" "nvidia-cuda-runtime==${CUDA_COMPILER_VERSION}.*" \
                "nvidia-cuda-cccl==${CUDA_COMPILER_VERSION}.*"
            # nvcc searches lib64; CMake's FindCUDAToolkit wants an unversioned libcudart.so.
            ln -sfn lib "$wheels.partial/nvidia/cu13/lib64"
            ln -sfn libcudart.so.13 "$wheels.partial/nvidia/cu13/lib/libcudart.so"
            mv "$wheels.partial" "$wheels"
        fi
        echo "build_horovod: CUDA compiler: $cuda/bin/nvcc (NVIDIA's compiler wheels)"
    fi
    "$cuda/bin/nvcc" --version | tail -n 2
    if [ -n "${HOROVOD_NCCL_HOME:-}" ]; then
        nccl=$HOROVOD_NCCL_HOME
    else
        [ -f "$site/nvidia/nccl/include/nccl.h" ] || {
            echo "build_horovod: no NCCL: set HOROVOD_NCCL_HOME or install tensorflow[and-cuda] (it brings" \
                 "nvidia-nccl-cu12) into $PYTHON's environment" >&2
            exit 2
        }
        # The wheel has only libnccl.so.2: link the build against a folder of our own with the unversioned name,
        # and find the wheel's library at run time relative to Horovod's own libraries.
        nccl="$src/nccl-from-wheel"
        mkdir -p "$nccl/lib"
        ln -sfn "$site/nvidia/nccl/include" "$nccl/include"
        ln -sfn "$site/nvidia/nccl/lib/libnccl.so.2" "$nccl/lib/libnccl.so"
        export LDFLAGS="${LDFLAGS:-} -Wl,-rpath,\$ORIGIN/../../nvidia/nccl/lib"
    fi
    export HOROVOD_GPU=CUDA HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME=$cuda CUDAToolkit_ROOT=$cuda
    export HOROVOD_NCCL_HOME=$nccl HOROVOD_NCCL_LINK=SHARED
    export PATH="$cuda/bin:$PATH"
    # cuda_fp16.h needs CCCL's <nv/target> in host compilations too (CMake before 3.31 does not add it).
    [ -d "$cuda/include/cccl" ] && export CPATH="$cuda/include:$cuda/include/cccl${CPATH:+:$CPATH}"
    patch_gpu_sources "$src"
}

# TensorFlow's CUDA wheels do not export stream_executor::gpu::AsGpuStreamValue, which mpi_ops.cc declares and
# calls; where the installed TensorFlow's Stream has platform_specific_handle() (TF >= 2.18), read the CUDA
# stream from it instead. CCCL 3 (CUDA 13) needs C++17 in the one .cu file.
patch_gpu_sources() {
    local src=$1 include ops="$1/horovod/tensorflow/mpi_ops.cc"
    include=$("$PYTHON" -c 'import tensorflow as tf; print(tf.sysconfig.get_include())')
    if grep -q platform_specific_handle "$include/xla/stream_executor/stream.h" 2>/dev/null; then
        sed -i 's/stream_executor::gpu::AsGpuStreamValue(/HvdGpuStream(/' "$ops"
        sed -i '/^#endif \/\/ HAVE_GPU$/i\
static inline GpuStreamHandle HvdGpuStream(stream_executor::Stream* stream) {\
  return static_cast<GpuStreamHandle>(stream->platform_specific_handle().stream);\
}' "$ops"
        grep -q 'HvdGpuStream(stream_executor::Stream' "$ops" || {
            echo "build_horovod: could not patch AsGpuStreamValue in $ops" >&2
            exit 1
        }
    fi
    if "$HOROVOD_CUDA_HOME/bin/nvcc" --version | grep -qE 'release (1[3-9]|[2-9][0-9])\.'; then
        sed -i 's/set(CMAKE_CUDA_STANDARD 11)/set(CMAKE_CUDA_STANDARD 17)/' "$src/horovod/common/ops/cuda/CMakeLists.txt"
    fi
}

key="horovod-${HOROVOD_VERSION}-tf${tf_version}-${py_tag}-${variant}"
wheel_dir="$CACHE_DIR/$key"

if "$PYTHON" - "$HOROVOD_VERSION" "$with_mpi" "$with_nccl" <<'PYEOF' 2>/dev/null
import sys, importlib.metadata as md
import horovod.tensorflow as hvd  # fails when built against another TF
# The installed build must be this variant: an MPI build is not a Gloo-only build, nor a CPU build an NCCL one.
sys.exit(0 if md.version("horovod") == sys.argv[1] and hvd.mpi_built() == (sys.argv[2] == "1")
         and bool(hvd.nccl_built()) == (sys.argv[3] == "1") else 1)
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
    if [ "$with_nccl" = 1 ]; then
        prepare_gpu_build "$src"
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
"$PYTHON" -c 'import horovod.tensorflow as hvd; import horovod; print("build_horovod: horovod", horovod.__version__, "gloo:", hvd.gloo_built(), "mpi:", hvd.mpi_built(), "nccl:", bool(hvd.nccl_built()))'
