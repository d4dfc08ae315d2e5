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

# The second run sends the graph ops and Keras models through the CUDA kernels on the
# emulated CUDA runtime: the whole backend as it runs on a GPU, on any host.
EMULATED_TESTS := tests/test_emulated_backend.py tests/test_conv_ops.py tests/test_pooling_ops.py \
	tests/test_batchnorm_ops.py tests/test_xent_ops.py tests/test_ctc_ops.py tests/test_bias.py \
	tests/keras/test_models.py

# The GPU rehearsal (tests/gpu_rehearsal, about 1.5 minutes): the `gpu` tests and one GPU benchmark
# row per suite, with a NumPy stand-in for CuPy and the 'cuda' runtime running the kernels in
# the emulator, so the CUDA paths' Python is run on every commit; its timings go to a temp folder.
test: venv
	$(BIN)/python -m gpuk.kernels.build --check
	$(BIN)/python -m pytest -q
	GPUK_DEVICE=emulate $(BIN)/python -m pytest -q $(EMULATED_TESTS)
	GPUK_GPU_REHEARSAL=1 $(BIN)/python -m pytest -q -m gpu tests
	GPUK_GPU_REHEARSAL=1 $(BIN)/python -m bench --quick -q

# BENCH_ARGS: e.g. --quick, --strict, -k keras (python -m bench --help)
bench: venv
	$(BIN)/python -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .benchmarks
