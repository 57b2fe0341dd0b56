# The README's two commands, and their helpers.
#
#   make lab     set up .venv if needed, then open JupyterLab on lessons/ (CPU)
#   make test    set up .venv if needed, then run the whole test suite (what .ci/run calls)
#
# Everything is installed into .venv inside the repo from the project's own files. torch is
# pinned to the CPU build first so that `pip install -e .` (which accepts a range) installs no
# CUDA wheel; on a GPU node install your CUDA torch into .venv first, or set TORCH_SPEC.

PYTHON     ?= python3
VENV       := .venv
BIN        := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
STAMP      := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: lab test setup bench clean help

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

setup: $(STAMP)  ## create or refresh .venv (re-runs when pyproject.toml or this file changes)

$(STAMP): pyproject.toml Makefile
	@echo "Setting up $(VENV) (the first time takes about a minute)..."
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[test]"
	@touch $(STAMP)
	@echo "$(VENV) is ready: $$($(BIN)/python -c 'import torch; print("torch", torch.__version__)')"

# JupyterLab refuses to start as root (containers, Binder-like machines) unless told it may.
LAB_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

lab: setup  ## open JupyterLab on the lessons (CPU; prints the URL to open)
	cd lessons && ../$(BIN)/jupyter lab --ip=127.0.0.1 --no-browser $(LAB_ROOT)

test: setup  ## run every test: unit, multi-rank, notebooks
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: setup  ## print the launcher, recorder and lesson figures (benchmarks/)
	$(BIN)/python benchmarks/launch_overhead.py
	$(BIN)/python benchmarks/lesson_resources.py

clean:  ## remove the venv and caches
	rm -rf $(VENV) .pytest_cache build *.egg-info
