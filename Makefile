# The README's commands, and their helpers.
#
#   make lab     set up .venv if needed, copy the student edition's lessons and labs into
#                workspace/ (first run; later runs add only what is new, never overwriting your
#                work) and open JupyterLab there on the lesson map, `autograder` on its
#                terminal's PATH
#   make setup   create or refresh .venv: torch (the CPU build: scripts/install_torch.py), then
#                this project
# BEGIN INSTRUCTORS ONLY
#   make test    set up .venv if needed, then run the whole test suite (what .ci/run calls)
#                (and, the first time, install headless Chromium for the browser test: see browser,
#                and SLURM for the cluster tests: see slurm)
#   make test-busy   the same suite with a CPU-burning process beside it (a busy laptop)
#   make site    the course as a static website in build/site/html (every lesson executed)
# END INSTRUCTORS ONLY
#
# Everything is installed into .venv inside the repo from the project's own files. torch first:
# scripts/install_torch.py keeps a torch already in .venv within pyproject's range (a GPU user's
# CUDA build), else installs its pin, the CPU build on Linux from PyTorch's CPU index (falling
# back to pip's configured index, saying so, when that cannot be reached). TORCH_SPEC='torch==X'
# and/or TORCH_INDEX=URL (e.g. https://download.pytorch.org/whl/cu126; `default`: pip's own)
# install another over it. Then `pip install -e .`, whose torch range is then satisfied.

PYTHON     ?= python3
VENV       := .venv
BIN        := $(VENV)/bin
TORCH_SPEC ?=
TORCH_INDEX ?=
# Naming a spec or an index replaces the torch there is; the script's pin is the default.
TORCH_ARGS := $(if $(TORCH_SPEC),--spec '$(TORCH_SPEC)' --replace) $(if $(TORCH_INDEX),--index '$(TORCH_INDEX)' --replace)
STAMP      := $(VENV)/.installed
# `make lab`'s folder: the student's copies of the lessons and labs (git-ignored).
WORKSPACE  ?= workspace
# BEGIN INSTRUCTORS ONLY
# pip extras `make setup` installs: the test suite's and the website's tools (a student edition
# has no tests and installs none).
SETUP_EXTRAS ?= [test]
# Elsewhere than Debian's path: CHROMIUM=/path/to/chromium (tests/chromium.py reads it too).
CHROMIUM   ?= /usr/bin/chromium
# Set once an apt-get install of Chromium was tried, so a failed one is not retried every run.
BROWSER_STAMP := $(VENV)/.browser-tried
SLURM_STAMP   := $(VENV)/.slurm-tried
NODE_STAMP    := $(VENV)/.node-tried
SITE_ARGS ?=
PYTEST_ARGS ?=
# `make test` runs the suite in PYTEST_WORKERS pytest-xdist processes. Its tests spend about half
# their time waiting (ranks on each other, launches, timeouts they provoke): one process kept 2
# cores 40-50 % idle. A notebook's cells, and the files whose tests share a costly module fixture
# (JupyterLab and Chromium, a SLURM cluster, a site build), each run whole on one worker
# (conftest.py: pytest_xdist_make_scheduler). PYTEST_WORKERS=0 runs everything in one process.
PYTEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -n $(PYTEST_WORKERS)
GPU_CHECK_ARGS ?=
# END INSTRUCTORS ONLY

.PHONY: lab test test-busy setup browser slurm node site bench gpu-check wheelhouse clean help

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

setup: $(STAMP)  ## create or refresh .venv (re-runs when pyproject.toml or this file changes)

$(STAMP): pyproject.toml Makefile binder/overrides.json scripts/install_torch.py
	@echo "Setting up $(VENV) (the first time downloads torch and JupyterLab: minutes)..."
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python scripts/install_torch.py $(TORCH_ARGS)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".$(SETUP_EXTRAS)"
	@# The course's JupyterLab settings, as on Binder: Markdown (the lesson map) opens rendered.
	@mkdir -p $(VENV)/share/jupyter/lab/settings
	@cp binder/overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json
	@touch $(STAMP)
	@echo "$(VENV) is ready: $$($(BIN)/python -c 'import torch; print("torch", torch.__version__)')"

# JupyterLab refuses to start as root (containers, Binder-like machines) unless told it may.
LAB_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

# Rooted at the workspace, which holds lessons/ and labs/ side by side (JupyterLab never goes
# above its root); the URL it prints opens the lesson map first, rendered (overrides.json).
LAB_MAP := --LabApp.default_url=/lab/tree/lessons/README.md
# Its terminals: the user's shell, not a login shell (JupyterLab starts one with -l when its own
# output is not a terminal, and a login shell's /etc/profile resets PATH), so that the PATH
# `lab` gives it, with .venv/bin first, reaches them: `autograder` works there.
LAB_TERMINAL := --ServerApp.terminado_settings=shell_command="$${SHELL:-/bin/sh}"
LAB_PATH := PATH="$(CURDIR)/$(BIN):$$PATH"
LAB_ARGS ?=

lab: setup  ## copy lessons and labs into workspace/ (never overwriting), open JupyterLab there
	$(BIN)/autograder release --workspace --out $(WORKSPACE)
	$(LAB_PATH) $(BIN)/jupyter lab --ip=127.0.0.1 --no-browser $(LAB_ROOT) --ServerApp.root_dir=$(WORKSPACE) $(LAB_MAP) $(LAB_TERMINAL) $(LAB_ARGS)

# BEGIN INSTRUCTORS ONLY
# tests/test_browser.py runs the lessons in a real (headless) Chromium; without one it skips.
# Debian's package is the only browser we can get: Playwright's own download needs the open
# internet. This step never fails the build: no root, no apt-get or a failed install mean skip.
browser: | $(STAMP)  ## install Chromium for the browser test if missing (Debian, as root; else it skips)
	@if [ -x $(CHROMIUM) ]; then :; \
	elif [ -e $(BROWSER_STAMP) ]; then \
	  echo "browser test will be skipped: installing chromium failed before (see $(VENV)/browser-install.log; rm $(BROWSER_STAMP) to retry)"; \
	elif [ "$$(id -u)" != 0 ]; then \
	  echo "browser test will be skipped: $(CHROMIUM) is missing and installing it needs root (apt-get install chromium)"; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
	  echo "browser test will be skipped: $(CHROMIUM) is missing and there is no apt-get to install it"; \
	else \
	  touch $(BROWSER_STAMP); \
	  echo "Installing chromium for the browser test (apt-get: about 125 MB, 10-20 s on a fast mirror)..."; \
	  if { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
	         chromium fonts-dejavu-core; } > $(VENV)/browser-install.log 2>&1 && [ -x $(CHROMIUM) ]; then \
	    echo "$$($(CHROMIUM) --version 2>/dev/null) is installed"; \
	  else \
	    echo "browser test will be skipped: apt-get install chromium failed (see $(VENV)/browser-install.log)"; \
	  fi; \
	fi

# tests/test_slurm.py stands up a one-node SLURM cluster (slurmctld + slurmd on localhost, a
# generated slurm.conf) and runs batch grading and torchrun through it; without slurmctld,
# slurmd, srun and munged it skips. Same rules as browser: never fails the build.
slurm: | $(STAMP)  ## install SLURM + munge for the cluster tests if missing (Debian, as root; else they skip)
	@if command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 \
	    && command -v srun >/dev/null 2>&1 && command -v munged >/dev/null 2>&1; then :; \
	elif [ -e $(SLURM_STAMP) ]; then \
	  echo "SLURM tests will be skipped: installing slurm failed before (see $(VENV)/slurm-install.log; rm $(SLURM_STAMP) to retry)"; \
	elif [ "$$(id -u)" != 0 ]; then \
	  echo "SLURM tests will be skipped: slurmctld/slurmd are missing and installing them needs root (apt-get install slurmctld slurmd slurm-client munge)"; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
	  echo "SLURM tests will be skipped: slurmctld/slurmd are missing and there is no apt-get to install them"; \
	else \
	  touch $(SLURM_STAMP); \
	  echo "Installing SLURM and munge for the cluster tests (apt-get: about 4 MB, 15-30 s)..."; \
	  if { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
	         slurmctld slurmd slurm-client munge; } > $(VENV)/slurm-install.log 2>&1 \
	     && command -v slurmctld >/dev/null 2>&1; then \
	    echo "$$(slurmctld -V 2>/dev/null) is installed"; \
	  else \
	    echo "SLURM tests will be skipped: apt-get install slurm failed (see $(VENV)/slurm-install.log)"; \
	  fi; \
	fi

# Jupyter Book 2 (pip, in .venv) runs on Node.js >= 18; without one it would try to download
# Node itself, which a closed network refuses. Debian's nodejs (bookworm: 18) is installed
# when missing, as root; otherwise the site test skips and `make site` says why.
node: | $(STAMP)  ## install Node.js for the website build if missing (Debian, as root; else its test skips)
	@if node -e 'process.exit(parseInt(process.versions.node) >= 18 ? 0 : 1)' 2>/dev/null; then :; \
	elif [ -e $(NODE_STAMP) ]; then \
	  echo "site test will be skipped: installing nodejs failed before (see $(VENV)/node-install.log; rm $(NODE_STAMP) to retry)"; \
	elif [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
	  echo "site test will be skipped: Node.js >= 18 is missing (install nodejs; as root with apt-get this step does it)"; \
	else \
	  touch $(NODE_STAMP); \
	  echo "Installing nodejs for the website build (apt-get)..."; \
	  if { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
	         nodejs; } > $(VENV)/node-install.log 2>&1 && command -v node >/dev/null 2>&1; then \
	    echo "node $$(node --version) is installed"; \
	  else \
	    echo "site test will be skipped: apt-get install nodejs failed (see $(VENV)/node-install.log)"; \
	  fi; \
	fi

# Every lesson executed once (2 at a time), parsed by Jupyter Book 2 / MyST, drawn as HTML:
# build/site/html. SITE_ARGS: --execute NAMES (a subset), --jobs N, --repo OWNER/NAME (Binder).
site: setup node  ## build the course website into build/site/html (runs every lesson once)
	$(BIN)/python website/site_build.py $(SITE_ARGS)

# A GPU node: `make gpu-check` runs the course's GPU half with GPU_PYTHON, the Python that holds
# the node's CUDA torch (default: .venv's, once you installed your CUDA torch there: README). It
# never installs torch: benchmarks/wheelhouse.py checks torch is there, installs from WHEELHOUSE
# (with --no-index) what else is missing, and the project itself (editable, --no-deps). A node
# without internet gets its wheels from `make wheelhouse`, run on a connected machine for the
# node's Python (WHEEL_PYTHON) and platform (WHEEL_PLATFORM). docs/cluster.md has the recipe.
GPU_PYTHON     ?= $(BIN)/python
WHEELHOUSE     ?= wheelhouse
WHEEL_PYTHON   ?= 3.12
WHEEL_PLATFORM ?= x86_64

wheelhouse:  ## connected machine: wheels of all the GPU check needs but torch -> WHEELHOUSE (WHEEL_PYTHON, WHEEL_PLATFORM)
	$(PYTHON) benchmarks/wheelhouse.py download --python $(WHEEL_PYTHON) --platform $(WHEEL_PLATFORM) --dest $(WHEELHOUSE)

gpu-check:  ## GPU node: fork safety, GPU figures and tests, grades, benchmarks, lessons -> results/gpu-HOST/ (GPU_PYTHON=...)
	@test -x "$(GPU_PYTHON)" || { echo "gpu-check: no Python at $(GPU_PYTHON): set GPU_PYTHON to the one that holds your CUDA torch (docs/cluster.md)"; exit 2; }
	$(GPU_PYTHON) benchmarks/wheelhouse.py install $(if $(wildcard $(WHEELHOUSE)),--from $(WHEELHOUSE))
	$(GPU_PYTHON) benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

test: setup browser slurm node  ## run every test: unit, multi-rank, notebooks, lessons in a browser, SLURM
	$(PYTEST) $(PYTEST_ARGS)

# The suite as a busy laptop runs it: BURNERS processes that spin on the CPU beside pytest (on 2
# cores, one burner takes half the machine). Started and stopped here, whatever pytest does, so
# anyone can repeat the check that no test depends on how fast the machine is.
BURNERS ?= 1
test-busy: setup browser slurm node  ## run every test with BURNERS (default 1) CPU-burning processes beside it
	@pids=""; for i in $$(seq $(BURNERS)); do sh -c 'while :; do :; done' & pids="$$pids $$!"; done; \
	trap 'kill $$pids 2>/dev/null' INT TERM EXIT; \
	echo "$(BURNERS) CPU burner(s) running beside the suite (pids$$pids)"; \
	$(PYTEST) $(PYTEST_ARGS)
# END INSTRUCTORS ONLY

# Every figure of docs/figures.md (and those docs/grading.md argues from), measured with --save
# into benchmarks/results/ beside the machine's cores and load, then written into the pages
# (benchmarks/figures_page.py; tests/test_figures_page.py fails when they disagree). Run it on a
# machine as quiet as you can get: the pages say how busy it was.
BENCH_COLLECTIVES ?= --sizes 4K:64M:2 --runs 3
BENCH_MORE :=
# BEGIN INSTRUCTORS ONLY
# The grader's, the lessons' and the cluster paths' figures: they grade the reference solutions
# and the tests' fault corpus, run the lessons with their answers or run the test suite, so
# only this repository measures them (the student edition shows the instructor's figures).
# The class (BENCH_CLASS lab-01 grades) takes longest: BENCH_CLASS=20 grades a smaller one.
BENCH_CLASS ?= 200
# The corpus's attacks on the grader's memory and on its judges (docs/grading.md's tables).
BENCH_FAULTS ?= 01_collectives/output_hoard 01_collectives/mark_flood 01_collectives/stack_flood \
  01_collectives/result_alias 06_mixed_precision/broadcast_shapes 02_ddp/traffic_flood
BENCH_MORE := bench-instructor
bench-instructor: setup  ## the grader's, the lessons' and the cluster's figures (make bench runs it)
	$(BIN)/python benchmarks/rank_start.py --save
	$(BIN)/python benchmarks/grader_footprint.py --save --fault $(BENCH_FAULTS)
	$(BIN)/python benchmarks/grade_timeout.py --save
	$(BIN)/python benchmarks/grading.py --class $(BENCH_CLASS) --save
	$(BIN)/python benchmarks/lesson_resources.py --save
	$(BIN)/python benchmarks/gpu_check.py --device cpu --quick --lessons 00 --save
	$(BIN)/python benchmarks/cluster_paths.py --save || test $$? -eq 2  # 2: no root or SLURM here
# END INSTRUCTORS ONLY
bench: setup  ## measure every figure (benchmarks/*.py --save), then write docs/figures.md and the lesson map from them
	$(BIN)/python benchmarks/launch_overhead.py --save
	$(BIN)/python benchmarks/collectives.py $(BENCH_COLLECTIVES) --save
	$(BIN)/python benchmarks/collective_cpu.py
	$(BIN)/python benchmarks/ddp_step.py --save
	$(BIN)/python benchmarks/fsdp_step.py --save
	$(BIN)/python benchmarks/memory_measured.py --save
	$(BIN)/python benchmarks/pipeline_bubbles.py --part all --save
	$(if $(BENCH_MORE),$(MAKE) --no-print-directory $(BENCH_MORE))
	$(BIN)/python benchmarks/lesson_map.py
	$(BIN)/python benchmarks/figures_page.py

clean:  ## remove the venv and caches
	rm -rf $(VENV) .pytest_cache build *.egg-info
