# `make demo`, `make test` and `make bench` set everything up themselves on a bare machine:
# a virtual environment in .venv with gpuk installed (plus CuPy when an NVIDIA GPU is present).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
GPU_EXTRA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo ,cuda13)
EXTRAS := test,demo,bench$(GPU_EXTRA)
STAMP := $(BIN)/.installed-$(EXTRAS)

.PHONY: demo test bench venv clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	touch $@

venv: $(STAMP)

demo: venv
	$(BIN)/python -m gpuk.demo

test: venv
	$(BIN)/python -m gpuk.kernels.build --check
	$(BIN)/python -m pytest -q

bench: venv
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache .benchmarks
