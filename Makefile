# The two commands of the README. Both set up a virtual environment from the project's own
# files first, so they work on a fresh machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# mlx's Linux CPU wheel uses a slow reference BLAS; preloading OpenBLAS makes float32 ~30x faster
OPENBLAS := $(firstword $(wildcard /usr/lib/*-linux-gnu/libopenblas.so.0))
RUN := $(if $(OPENBLAS),LD_PRELOAD=$(OPENBLAS) ,)

.PHONY: setup test reproduce bench

$(BIN)/mlxlab: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test]"
	touch $@

setup: $(BIN)/mlxlab

test: setup
	$(RUN)$(BIN)/python -m pytest -q $(PYTEST_ARGS)

reproduce: setup
	$(RUN)$(BIN)/mlxlab reproduce --quick

bench: setup
	$(RUN)$(BIN)/mlxlab bench engine --models small --repeats 7
