# Two commands do all set-up on a fresh machine: `make test` and `make run`.
# Python 3.10 is required (see README "Requirements").
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PYTHON310 ?= $(shell PYENV_VERSION=3.10.13 command -v python3.10 >/dev/null 2>&1 && echo "env PYENV_VERSION=3.10.13 python3.10" || (test -x /root/.pyenv/versions/3.10.13/bin/python3.10 && echo /root/.pyenv/versions/3.10.13/bin/python3.10))
PYTEST_ARGS ?=
# `make test` runs the suite in TEST_WORKERS pytest-xdist processes. The suite
# is compile-bound and XLA compiles one program on one core, so two workers on
# the 2-core CI machine take ~8.5 min where one takes ~12.5 (the measurement:
# bench/results/suite_2026-12-06.md). TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
# ACCEL=cpu (default) installs jax[cpu]; ACCEL=cuda12 adds jax[cuda12] (NVIDIA
# GPUs, CUDA 12) on top, same jax version. docs/multihost.md.
ACCEL ?= cpu
ACCELS := cpu cuda12
JAX_VERSION := $(shell sed -n 's/^jax==\(.*\)/\1/p' requirements.lock)
STAMP := $(VENV)/.installed-$(ACCEL)
$(if $(filter $(ACCEL),$(ACCELS)),,$(error ACCEL=$(ACCEL) is not known: use ACCEL=cpu (the default) or ACCEL=cuda12 (NVIDIA GPUs with CUDA 12 drivers)))

.PHONY: setup test test-slow run bench clean

$(STAMP): pyproject.toml requirements.lock
	@if [ ! -x $(PY) ]; then \
	  if [ -z "$(PYTHON310)" ]; then echo "error: Python 3.10 not found (set PYTHON310=/path/to/python3.10); see README Requirements" >&2; exit 1; fi; \
	  $(PYTHON310) -m venv $(VENV); \
	fi
	@$(PY) -c 'import sys; assert sys.version_info[:2] == (3, 10), f"{sys.executable} is Python {sys.version.split()[0]}, need 3.10 (README Requirements)"'
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c requirements.lock -e '.[test]'
ifeq ($(ACCEL),cuda12)
	$(PY) -m pip install -q -c requirements.lock "jax[cuda12]==$(JAX_VERSION)"
	@$(PY) -c 'import jax, sys; gpus = [d for d in jax.devices() if d.platform == "gpu"]; print(f"jax sees {len(gpus)} GPU(s): {gpus}" if gpus else "warning: jax[cuda12] is installed but jax sees no GPU (is nvidia-smi working? CUDA 12 driver >= 525?). Runs fall back to the CPU; make setup ACCEL=cpu removes the CUDA plugin.", file=sys.stderr)'
else
	@$(PY) -m pip uninstall -q -y jax-cuda12-plugin jax-cuda12-pjrt 2>/dev/null || true
endif
	rm -f $(VENV)/.installed $(VENV)/.installed-*
	touch $@

setup: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --durations=15 $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

run: $(STAMP)
	$(PY) experiments/run_dmc.py --flagfile=experiments/flags/quickstart.flags $(RUN_ARGS)

bench: $(STAMP)
	$(PY) bench/learner.py --size=size1m

clean:
	rm -rf $(VENV) .pytest_cache
