# Two commands do all set-up on a fresh machine: `make test` and `make run`.
# Python 3.10 is required (see README "Requirements").
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PYTHON310 ?= $(shell PYENV_VERSION=3.10.13 command -v python3.10 >/dev/null 2>&1 && echo "env PYENV_VERSION=3.10.13 python3.10" || (test -x /root/.pyenv/versions/3.10.13/bin/python3.10 && echo /root/.pyenv/versions/3.10.13/bin/python3.10))
PYTEST_ARGS ?=

.PHONY: setup test test-slow run bench clean

$(VENV)/.installed: pyproject.toml requirements.lock
	@if [ ! -x $(PY) ]; then \
	  if [ -z "$(PYTHON310)" ]; then echo "error: Python 3.10 not found (set PYTHON310=/path/to/python3.10); see README Requirements" >&2; exit 1; fi; \
	  $(PYTHON310) -m venv $(VENV); \
	fi
	@$(PY) -c 'import sys; assert sys.version_info[:2] == (3, 10), f"{sys.executable} is Python {sys.version.split()[0]}, need 3.10 (README Requirements)"'
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c requirements.lock -e '.[test]'
	touch $@

setup: $(VENV)/.installed

test: $(VENV)/.installed
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

test-slow: $(VENV)/.installed
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

run: $(VENV)/.installed
	$(PY) experiments/run_dmc.py --flagfile=experiments/flags/quickstart.flags $(RUN_ARGS)

bench: $(VENV)/.installed
	$(PY) bench/learner.py --size=size1m

clean:
	rm -rf $(VENV) .pytest_cache
