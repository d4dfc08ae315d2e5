# `make test` and `make demo` set everything up themselves on a bare machine:
# a virtual environment in .venv with gpuk installed (plus CuPy when an NVIDIA GPU is present).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
GPU_EXTRA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo ,cuda13)
EXTRAS := test$(GPU_EXTRA)

.PHONY: test venv clean

$(BIN)/.installed-$(EXTRAS): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	touch $@

venv: $(BIN)/.installed-$(EXTRAS)

test: venv
	$(BIN)/python -m gpuk.kernels.build --check
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache .benchmarks
