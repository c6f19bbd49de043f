# The commands of the README. Each sets up a virtual environment from the project's own files
# first, so they work on a fresh machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# mlx's Linux CPU wheel uses a slow reference BLAS; preloading OpenBLAS makes float32 ~30x faster
OPENBLAS := $(firstword $(wildcard /usr/lib/*-linux-gnu/libopenblas.so.0))
RUN := $(if $(OPENBLAS),LD_PRELOAD=$(OPENBLAS) ,)

NOTEBOOKS := $(patsubst notebooks/src/%.py,notebooks/%.ipynb,$(wildcard notebooks/src/[0-9][0-9]_*.py))

.PHONY: setup test reproduce bench notebooks lab

$(BIN)/mlxlab: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test]"
	touch $@

# the 'mlxlab' Jupyter kernel: this environment's Python with OpenBLAS preloaded (mlxlab/notebook/kernel.py)
KERNEL := $(VENV)/share/jupyter/kernels/mlxlab/kernel.json
$(KERNEL): $(BIN)/mlxlab
	$(BIN)/python -m mlxlab.notebook.kernel

setup: $(BIN)/mlxlab $(KERNEL)

# JupyterLab on the notebooks, with the 'mlxlab' kernel they name. As root (a container) JupyterLab
# refuses to start without --allow-root; on Linux without a display it cannot open a browser, so it
# only prints the URL to open. LAB_ARGS replaces both choices (e.g. LAB_ARGS="--port 8890").
USER_ID ?= $(shell id -u)
LAB_ARGS ?= $(if $(filter 0,$(USER_ID)),--allow-root) $(if $(or $(DISPLAY),$(filter Darwin,$(shell uname -s))),,--no-browser)
lab: setup
	$(BIN)/jupyter lab $(strip $(LAB_ARGS)) notebooks/

test: setup
	$(RUN)$(BIN)/python -m pytest -q $(PYTEST_ARGS)

reproduce: setup
	$(RUN)$(BIN)/mlxlab reproduce --quick

# the committed CPU benchmark (data/results/cpu/bench_engine.json), measured again and replaced
bench: setup
	$(RUN)$(BIN)/mlxlab bench engine --models small --repeats 5 --save

# Each notebooks/NN_x.ipynb from its plain-text source notebooks/src/NN_x.py (jupytext's percent
# format), without outputs; the cell ids of an existing notebook are kept.
notebooks: $(NOTEBOOKS)

notebooks/%.ipynb: notebooks/src/%.py | setup
	$(BIN)/jupytext --quiet --update --set-kernel mlxlab --to ipynb --output $@ $<
