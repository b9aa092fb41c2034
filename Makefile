# The two commands of the README: `make demo` and `make test`. Everything else is for developers.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: demo test test-fast lint typecheck bench schemas docs clean

# --no-compile: Python compiles a module to bytecode the first time a command imports it, rather
# than pip compiling every module of every package at install (~100 MB, most never imported).
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --no-compile --upgrade pip

# One stamp per install flavour, refreshed when pyproject.toml changes. The demo needs qualify
# and its runtime dependencies only; the tests also need the dev, bench and fleet extras, an
# install that holds the demo's too (so it stamps both).
$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --no-compile -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[dev,bench,fleet]"
	touch $@ $(VENV)/.installed-run

demo: $(VENV)/.installed-run
	$(BIN)/qualify demo --workdir demo --force

test: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -n 2 -m "not fleet and not quiet" $(PYTEST_ARGS)
	# The Ray clusters load the machine, and the timing judgements must not share it: alone,
	# one at a time, after the rest.
	$(BIN)/python -m pytest -m "fleet or quiet" $(PYTEST_ARGS)

test-fast: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -n 2 -m "not slow and not fleet" $(PYTEST_ARGS)

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy

schemas: $(VENV)/.installed-dev
	$(BIN)/python -m schemas.generate

docs: $(VENV)/.installed-dev
	$(BIN)/python -m qualify.cli.docgen

bench: $(VENV)/.installed-dev
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) demo .pytest_cache .mypy_cache .ruff_cache build *.egg-info
