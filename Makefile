# The two ways in: `make demo` and `make test` (`make test-fast` while working). Each sets up a venv from the pinned
# environment when needed.
SHELL := /bin/bash
# ENV picks the tested environment: `default` (Python 3.12, the newest stack: environments/cpu.txt, into .venv) or
# `oldest` (Python 3.11, the oldest supported set: environments/cpu-oldest.txt, into .venv-oldest).
ENV   ?= default
ifeq ($(ENV),oldest)
PY_VERSION := 3.11
LOCK  ?= environments/cpu-oldest.txt
VENV  ?= .venv-oldest
else ifeq ($(ENV),default)
PY_VERSION := 3.12
LOCK  ?= environments/cpu.txt
VENV  ?= .venv
else
$(error ENV=$(ENV) is not an environment: use ENV=default (Python 3.12) or ENV=oldest (Python 3.11))
endif
# The interpreter the venv is made with: PYTHON=/path/to/python3.12 to choose; else python3.12 on PATH, else pyenv's.
PYTHON ?= $(firstword $(foreach p,python$(PY_VERSION) $(wildcard $(HOME)/.pyenv/versions/$(PY_VERSION).*/bin/python$(PY_VERSION)),\
            $(shell $(p) -c 'import sys; assert sys.version_info[:2] == ($(subst .,$(,),$(PY_VERSION)))' 2>/dev/null && echo $(p))))
TORCH := $(shell sed -n 's/^torch==\([0-9.]*\).*/\1/p' $(LOCK))
PY    := $(VENV)/bin/python
BIN   := $(abspath $(VENV))/bin
STAMP := $(VENV)/.mtnlg-installed
BUILD := .build
export OMP_NUM_THREADS ?= 1
TEST_WORKERS ?= 2       # pytest-xdist workers of `make test` (tests/conftest.py: how tests are grouped)
, := ,

.PHONY: demo test test-fast lab env check-sync check-clean pytest readme export clean-build docs outputs check-outputs

env: $(STAMP)

# Idempotent set-up: rebuilt only when the lock file, setup.py or settings.ini change; a venv of another Python is
# made again. torch first, by exact version (the lock's), then the lock with --no-deps: pip never resolves.
$(STAMP): $(LOCK) setup.py settings.ini
	@test -n "$(PYTHON)" || { echo "make: no Python $(PY_VERSION) found (ENV=$(ENV)): install it, or name it with" \
	  "PYTHON=/path/to/python$(PY_VERSION)"; exit 1; }
	@$(PY) -c 'import sys; assert sys.version_info[:2] == ($(subst .,$(,),$(PY_VERSION)))' 2>/dev/null || \
	  { rm -rf $(VENV); $(PYTHON) -m venv $(VENV); }
	@echo "== installing $(LOCK) (Python $(PY_VERSION), torch $(TORCH)) into $(VENV) (first time: a few minutes)"
	@# -qq: errors only (a pip configured with absent local indexes warns once per package, burying the test log)
	$(PY) -m pip install -qq --disable-pip-version-check torch==$(TORCH)
	$(PY) -m pip install -qq --disable-pip-version-check --no-deps --no-build-isolation -r $(LOCK)
	$(PY) -m pip install -qq --disable-pip-version-check --no-deps --no-build-isolation -e .
	$(PY) -m ipykernel install --sys-prefix --name mtnlg --display-name "Python (mtnlg)" >/dev/null
	@# versions from the installed packages' metadata (megatron-core's own __version__ appends the git commit of the
	@# folder it is asked from: this repository's, not its own)
	@$(PY) -W ignore -c "import sys; from importlib.metadata import version as v; print('== Python', sys.version.split()[0], \
	  *(f'| {n} {v(n)}' for n in ('torch', 'deepspeed', 'megatron-core', 'nbdev')))"
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/mtnlg demo

test: $(STAMP) check-sync check-clean pytest

# The fast tier while working: the checks above, unit tests and one small multi-process run (tests/test_small_run.py),
# every test not marked `slow` (under 5 minutes on 2 cores); `make test` runs everything, as CI does.
test-fast: $(STAMP) check-sync check-clean
	$(PY) -m pytest tests -m "not slow" -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder --tb=short $(PYTEST_ARGS)

# (1) the library must be exactly what the notebooks export
check-sync: $(STAMP)
	@rm -rf $(BUILD)/sync && mkdir -p $(BUILD)/sync && cp -r nbs mtnlg settings.ini $(BUILD)/sync/
	@cd $(BUILD)/sync && $(BIN)/nbdev_export
	@diff -r -x __pycache__ $(BUILD)/sync/mtnlg mtnlg >/dev/null || { diff -r -x __pycache__ $(BUILD)/sync/mtnlg mtnlg | head -20; \
	  echo "FAIL: mtnlg/ differs from what nbs/ exports: edit the notebook, then run nbdev_export"; exit 1; }
	@echo "== check-sync: mtnlg/ matches the notebooks"

# (2) notebooks must be committed clean (nbdev_clean; papermill's parameters tag is kept)
check-clean: $(STAMP)
	@rm -rf $(BUILD)/clean && mkdir -p $(BUILD)/clean && cp -r nbs settings.ini $(BUILD)/clean/
	@cd $(BUILD)/clean && $(BIN)/nbdev_clean --fname nbs
	@diff -r $(BUILD)/clean/nbs nbs >/dev/null || { diff -rq $(BUILD)/clean/nbs nbs; \
	  echo "FAIL: notebooks are not clean: run nbdev_clean"; exit 1; }
	@echo "== check-clean: notebooks are clean"

# (3) tests/ and every notebook in nbs/ (through nbdev's runner, so `#| eval: false` is honoured)
pytest: $(STAMP)
	$(PY) -m pytest tests -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder --tb=short --durations=25 $(PYTEST_ARGS)

export: $(STAMP)
	$(VENV)/bin/nbdev_export && $(VENV)/bin/nbdev_clean

readme: $(STAMP)
	$(VENV)/bin/jupyter nbconvert --to markdown --execute --ExecutePreprocessor.kernel_name=mtnlg nbs/index.ipynb --output-dir $(BUILD)/readme
	mv $(BUILD)/readme/index.md README.md

# The documentation site (mkdocs, Python only) into _docs/: README as home page, one page per notebook with its
# committed outputs, API reference, search. Open _docs/index.html.
# DOCS_EXECUTE=07_eval,09_jobs: those notebooks executed now instead (cached in .build/docs); `all` every one.
DOCS_EXECUTE ?= none
docs: $(STAMP)
	$(PY) docs/build.py --out _docs --execute $(DOCS_EXECUTE)

# Every notebook is committed with its outputs. `make outputs` executes each (STEMS="07_eval 11_train_job": only
# those) and writes it back with its outputs, and the README's figures (docs/images) from them; 12_demo_report
# first makes a fresh demo run (.build/outputs/demo, about 9 minutes). `make check-outputs`: compare without writing
# (the suite does it in tests/test_notebooks.py).
STEMS ?=
outputs: $(STAMP)
	$(PY) docs/build.py --outputs $(STEMS)

check-outputs: $(STAMP)
	$(PY) docs/build.py --check-outputs $(STEMS)

lab: $(STAMP)
	$(VENV)/bin/jupyter lab --allow-root --no-browser --ip 127.0.0.1 --notebook-dir nbs

clean-build:
	rm -rf $(BUILD)
