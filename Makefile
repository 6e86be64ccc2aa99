# Two commands on a fresh machine: `make demo` and `make test`.
# Set-up is idempotent: the virtual environment, the installed packages and the
# Horovod wheel (cached in ~/.cache/hpc-dl-suite/wheels) are reused.

PYTHON_BIN ?= python3.11
VENV       ?= .venv
# GPU clusters: make setup TF_PACKAGE='$(TF_GPU_PACKAGE)' HOROVOD_GPU=1 (the recipe `make check-gpu-build` runs)
TF_VERSION     := 2.21.0
TF_PACKAGE     ?= tensorflow-cpu==$(TF_VERSION)
TF_GPU_PACKAGE ?= tensorflow[and-cuda]==$(TF_VERSION)
HOROVOD_GPU ?= 0
NP         ?= 2
DEMO_DIR   ?= runs/demo
PYTEST_ARGS ?=
# make test's pytest worker processes (pytest-xdist): one per CPU, at most 4.  The tests' own processes leave
# cores idle much of the time (a TensorFlow import or trace runs on one core; the clusters wait on SLURM), so
# two workers on two cores finish sooner than one; tests/conftest.py says what a worker takes.  TEST_WORKERS=0: one process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)
PARALLEL := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS))

PY    := $(VENV)/bin/python
STAMP := $(VENV)/.setup-complete
# Keras on JAX without TensorFlow: checks that the models are backend-agnostic (tests/test_backends.py).
JAX_VENV  ?= .venv-jax
JAX_STAMP := $(JAX_VENV)/.setup-complete

.PHONY: setup setup-jax check-gpu-build demo demo-hep demo-climate demo-detect test test-fast durations bench clean-runs setup-cluster

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/build_horovod.sh Makefile
	@command -v mpicc >/dev/null 2>&1 || \
	    { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	      echo "setup: installing Open MPI (Horovod is built with MPI and Gloo)" && apt-get update -qq && \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev >/dev/null; } || \
	    echo "setup: no MPI and no root with apt: Horovod is built with Gloo only (srun/mpirun launches need MPI)"
	@test -x $(PY) || $(PYTHON_BIN) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip wheel setuptools
	$(PY) -m pip install --quiet "$(TF_PACKAGE)"
	$(PY) -m pip install --quiet -e ".[test]"
	PYTHON=$(PY) HOROVOD_GPU=$(HOROVOD_GPU) bash scripts/build_horovod.sh
	@command -v shellcheck >/dev/null 2>&1 || \
	    { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	      apt-get update -qq && apt-get install -y -qq shellcheck >/dev/null; } || \
	    echo "note: shellcheck could not be installed; tests/test_slurm.py skips its check outside CI"
	@touch $@

setup-jax: $(JAX_STAMP)

$(JAX_STAMP): $(STAMP)
	@test -x $(JAX_VENV)/bin/python || $(PYTHON_BIN) -m venv $(JAX_VENV)
	$(JAX_VENV)/bin/python -m pip install --quiet "jax[cpu]" "keras==$$($(PY) -c 'import keras; print(keras.__version__)')" \
	    numpy pydantic pyyaml
	@touch $@

# The GPU build, compiled and imported on any machine (no GPU needed; not part of `make test`: it downloads
# about 3 GB of CUDA wheels into $(GPU_VENV), 6.3 GB installed): TensorFlow's CUDA build, Horovod with NCCL (and
# MPI) for compute capabilities $(CUDA_CC_LIST), its wheel cached by variant, then the pinned build line and one
# CosmoFlow demo training step on 2 Gloo ranks on the CPU with that TensorFlow.  docs/clusters.md, "The GPU build".
GPU_VENV     ?= .venv-gpu
CUDA_CC_LIST ?= 80,90
GPU_PY       := $(GPU_VENV)/bin/python
check-gpu-build:
	@test -x $(GPU_PY) || $(PYTHON_BIN) -m venv $(GPU_VENV)
	$(GPU_PY) -m pip install --quiet --upgrade pip wheel setuptools
	$(GPU_PY) -m pip install --quiet "$(TF_GPU_PACKAGE)"
	$(GPU_PY) -m pip install --quiet -e ".[test]"
	PYTHON=$(GPU_PY) HOROVOD_GPU=1 HOROVOD_BUILD_CUDA_CC_LIST=$(CUDA_CC_LIST) bash scripts/build_horovod.sh
	$(GPU_PY) -m common.tools.build_info --require-gpu-build
	PATH=$(abspath $(GPU_VENV))/bin:$$PATH horovodrun -np 2 -H localhost:2 --gloo \
	    $(GPU_PY) -m cosmoflow.train --config configs/cosmoflow/demo.yaml --set data.data_dir=data/gpu-build-check \
	    --set data.mock.n_train=16 --set data.mock.n_validation=16 --set train.epochs=1 --set mlperf.enabled=false \
	    --output-dir runs/gpu-build-check --force
	@$(GPU_PY) -m common.tools.build_info

# $(NP) Horovod ranks on this machine: horovodrun itself (its arguments, output and exit codes), without the
# TensorFlow import its build check makes on every launch (common/tools/launch.py).
LAUNCH = PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m common.tools.launch -np $(NP) -H localhost:$(NP) --gloo

# The CosmoFlow demo: mock universes generated once into data/, then training
# on $(NP) Horovod ranks (Gloo, CPU), then evaluation.
# Each demo target starts its run directory afresh (--force: the trainer otherwise refuses a folder
# holding an earlier run's checkpoints), so running it twice gives a second, equal run; the generated
# data is reused.
demo: setup
	$(PY) -m cosmoflow.mock --config configs/cosmoflow/demo.yaml
	$(LAUNCH) \
	    $(PY) -m cosmoflow.train --config configs/cosmoflow/demo.yaml --output-dir $(DEMO_DIR) --force
	$(PY) -m cosmoflow.evaluate --run-dir $(DEMO_DIR)

# The HEP CNN demo: synthetic events generated once, 2 ranks, evaluation on the test split.
demo-hep: setup
	$(PY) -m hep_cnn.synth --config configs/hep_cnn/demo.yaml
	$(LAUNCH) \
	    $(PY) -m hep_cnn.train --config configs/hep_cnn/demo.yaml --output-dir runs/demo-hep --force
	$(PY) -m hep_cnn.evaluate --run-dir runs/demo-hep

# The climate segmentation demos: synthetic CAM5 netCDF generated and converted
# once into data/climate-demo, then Tiramisu and DeepLabv3+ on 2 ranks, each evaluated.
demo-climate: setup
	$(LAUNCH) \
	    $(PY) -m climate_seg.train --config configs/climate_seg/demo_tiramisu.yaml --output-dir runs/demo-tiramisu --force
	$(PY) -m climate_seg.evaluate --run-dir runs/demo-tiramisu
	$(LAUNCH) \
	    $(PY) -m climate_seg.train --config configs/climate_seg/demo_deeplab.yaml --output-dir runs/demo-deeplab --force
	$(PY) -m climate_seg.evaluate --run-dir runs/demo-deeplab

# The detection demos: synthetic ExtremeWeather-layout snapshots generated once into
# data/detect-demo, then the semi-supervised run and its supervised baseline on 2 ranks.
demo-detect: setup
	$(LAUNCH) \
	    $(PY) -m climate_seg.train --config configs/climate_seg/demo_detect.yaml --output-dir runs/demo-detect --force
	$(PY) -m climate_seg.evaluate --run-dir runs/demo-detect
	$(LAUNCH) \
	    $(PY) -m climate_seg.train --config configs/climate_seg/demo_detect_supervised.yaml \
	    --output-dir runs/demo-detect-supervised --force
	$(PY) -m climate_seg.evaluate --run-dir runs/demo-detect-supervised

test: setup setup-jax
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m pytest $(PARALLEL) $(PYTEST_ARGS)

# The edit-test loop (a few minutes): no SLURM cluster, no Horovod launch, nothing that took over 2.5 s in the
# recorded run (tests/durations.json; tests/conftest.py says how it chooses).  `make test` is the whole suite.
test-fast: setup
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m pytest --fast -q $(PYTEST_ARGS)

# The whole suite, recording what each test and fixture took into tests/durations.json (test-fast's choice).
durations: setup setup-jax
	HPCDL_RECORD_DURATIONS=$(abspath tests/durations.json) PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m pytest $(PARALLEL) $(PYTEST_ARGS)

# Benchmarks (numbers, not pass/fail): each app's demo and full-size config, and
# 1 process x 2 threads vs 2 Horovod ranks x 1 thread.  JSON in runs/bench/.
BENCH = $(PY) -m common.tools.bench
HVD2  = PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m common.tools.launch -np 2 -H localhost:2 --gloo
bench: setup
	@mkdir -p runs/bench
	$(BENCH) --config configs/cosmoflow/demo.yaml --steps 30 --json runs/bench/cosmoflow-demo.json
	$(HVD2) $(BENCH) --config configs/cosmoflow/demo.yaml --steps 30 --json runs/bench/cosmoflow-demo-2ranks.json
	$(BENCH) --compare runs/bench/cosmoflow-demo.json runs/bench/cosmoflow-demo-2ranks.json
	$(BENCH) --config configs/cosmoflow/mlperf.yaml --batch-size 1 --precision auto --steps 8 \
	    --set data.data_dir=data/cosmoflow-128 --set data.compression=none --set data.mock.generate_if_missing=true \
	    --set data.mock.n_train=12 --set data.mock.n_validation=4 --set data.mock.box_size_mpc_h=512 \
	    --json runs/bench/cosmoflow-128-auto.json
	$(BENCH) --config configs/cosmoflow/mlperf.yaml --batch-size 1 --precision fp32 --steps 8 \
	    --set data.data_dir=data/cosmoflow-128 --set data.compression=none --json runs/bench/cosmoflow-128-fp32.json
	$(BENCH) --config configs/hep_cnn/demo.yaml --steps 30 --json runs/bench/hep-demo.json
	$(PY) -m hep_cnn.synth --out data/hep-224 --image-size 224 --layout benchmark --n-train 256 --n-validation 64 --n-test 64
	$(BENCH) --config configs/hep_cnn/benchmark_224.yaml --batch-size 8 --steps 6 --set data.data_dir=data/hep-224 \
	    --set data.chunk_size=32 --set data.shuffle_buffer=64 --precision fp32 --json runs/bench/hep-224-fp32.json
	$(BENCH) --config configs/hep_cnn/benchmark_224.yaml --batch-size 8 --steps 6 --set data.data_dir=data/hep-224 \
	    --set data.chunk_size=32 --set data.shuffle_buffer=64 --json runs/bench/hep-224-auto.json
	$(BENCH) --config configs/climate_seg/demo_tiramisu.yaml --steps 10 --json runs/bench/tiramisu-demo.json
	$(BENCH) --config configs/climate_seg/demo_deeplab.yaml --steps 10 --json runs/bench/deeplab-demo.json
	$(BENCH) --config configs/climate_seg/gordon_bell_tiramisu.yaml --batch-size 1 --steps 4 --precision mixed_bfloat16 \
	    --set data.data_dir=data/climate-demo --set data.grid=[192,288] --set data.stage_dir=null \
	    --json runs/bench/tiramisu-full-192x288-bf16.json
	$(BENCH) --config configs/climate_seg/gordon_bell_deeplab.yaml --batch-size 1 --steps 4 --precision mixed_bfloat16 \
	    --set data.data_dir=data/climate-demo --set data.grid=[192,288] --set data.stage_dir=null \
	    --json runs/bench/deeplab-full-192x288-bf16.json

# Clusters: site TensorFlow module + system MPI (+ NCCL); see README.
setup-cluster:
	bash scripts/setup_cluster.sh

clean-runs:
	rm -rf runs
