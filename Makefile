# `make demo` and `make test` set up .venv from nothing, then run.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# On a GPU machine: make test CONSTRAINTS=/dev/null (lets pip pick a CUDA build of torch).
CONSTRAINTS ?= constraints-cpu.txt
# The core, the engine (models, generate, bench) and the bundled plugins.
PACKAGES := -e ".[dev,docs]" -e "engine[serve]" -e plugins/cpu -e plugins/cuda -e plugins/ascend_stub
STAMP := $(VENV)/.installed

.PHONY: setup demo test docs lint format bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml engine/pyproject.toml plugins/cpu/pyproject.toml \
          plugins/cuda/pyproject.toml plugins/ascend_stub/pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c $(CONSTRAINTS) \
		torch $(PACKAGES)
	touch $@

# The main job: the environment report, then decode-step latency of the ~30M-parameter
# preset, eager against piecewise-compiled (and graph-captured where the platform can).
demo: setup
	$(BIN)/slotwise env
	$(BIN)/slotwise bench --preset small --batch-sizes 1,4,16

# The suite runs on every core (pytest-xdist); TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= auto

test: setup docs
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -n $(TEST_WORKERS)

# The documentation site (mkdocs.yml): --strict fails on a broken link or anchor and on a
# page left out of the nav. The site goes to site/, which git ignores.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: setup
	$(BIN)/python benchmarks/import_time.py
	$(BIN)/python benchmarks/dispatch_overhead.py
	$(BIN)/python benchmarks/compile_time.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache site
