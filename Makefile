# Two commands on a fresh machine: `make demo` and `make test`.
# Set-up is idempotent: the virtual environment, the installed packages and the
# Horovod wheel (cached in ~/.cache/hpc-dl-suite/wheels) are reused.

PYTHON_BIN ?= python3.11
VENV       ?= .venv
# GPU clusters: make setup TF_PACKAGE='tensorflow[and-cuda]==2.21.0' HOROVOD_GPU=1
TF_PACKAGE ?= tensorflow-cpu==2.21.0
HOROVOD_GPU ?= 0
NP         ?= 2
DEMO_DIR   ?= runs/demo
PYTEST_ARGS ?=

PY    := $(VENV)/bin/python
STAMP := $(VENV)/.setup-complete

.PHONY: setup demo demo-hep test clean-runs setup-cluster

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/build_horovod.sh Makefile
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

# The CosmoFlow demo: mock universes generated once into data/, then training
# on $(NP) Horovod ranks (Gloo, CPU), then evaluation.
demo: setup
	$(PY) -m cosmoflow.mock --config configs/cosmoflow/demo.yaml
	PATH=$(abspath $(VENV))/bin:$$PATH horovodrun -np $(NP) -H localhost:$(NP) --gloo \
	    $(PY) -m cosmoflow.train --config configs/cosmoflow/demo.yaml --output-dir $(DEMO_DIR)
	$(PY) -m cosmoflow.evaluate --run-dir $(DEMO_DIR)

# The HEP CNN demo: synthetic events generated once, 2 ranks, evaluation on the test split.
demo-hep: setup
	$(PY) -m hep_cnn.synth --config configs/hep_cnn/demo.yaml
	PATH=$(abspath $(VENV))/bin:$$PATH horovodrun -np $(NP) -H localhost:$(NP) --gloo \
	    $(PY) -m hep_cnn.train --config configs/hep_cnn/demo.yaml --output-dir runs/demo-hep
	$(PY) -m hep_cnn.evaluate --run-dir runs/demo-hep

test: setup
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m pytest $(PYTEST_ARGS)

# Clusters: site TensorFlow module + system MPI (+ NCCL); see README.
setup-cluster:
	bash scripts/setup_cluster.sh

clean-runs:
	rm -rf runs
