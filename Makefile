# `make demo`, `make test` and `make bench` set everything up themselves on a bare machine:
# a virtual environment in .venv with gpuk installed (plus CuPy when an NVIDIA GPU is present).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
GPU_EXTRA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo ,cuda13)
EXTRAS := test,demo,bench$(GPU_EXTRA)
STAMP := $(BIN)/.installed-$(EXTRAS)

.PHONY: demo test bench keras-suite venv wheels clean

# --no-compile: no .pyc for every file of every wheel up front (torch alone is thousands);
# Python writes them for the modules a run imports, when it first imports them.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile -e ".[$(EXTRAS)]"
	touch $@

venv: $(STAMP)

demo: venv
	$(BIN)/python -m gpuk.demo

# lint-imports checks the layering of docs/architecture.md (pyproject.toml: [tool.importlinter]).
# The op and Keras model tests run on every implementation through the on_device fixture
# (tests/conftest.py): the NumPy twins, the CUDA kernels on the emulated CUDA runtime (marker
# `emulate`: the whole backend as it runs on a GPU, on any host) and, with a GPU, on CUDA.
# The GPU rehearsal (tests/gpu_rehearsal, about 1.5 minutes): the `gpu` tests and one GPU benchmark
# row per suite, with a NumPy stand-in for CuPy and the 'cuda' runtime running the kernels in
# the emulator, so the CUDA paths' Python is run on every commit; its timings go to a temp folder.
# One kernel cache for every step (entries are named by a hash of what they are built from, so
# reuse is safe): build --check fills the NVRTC cache the inspect baseline test reads, and the
# emulator's g++ builds of the first pytest run serve the rehearsal and the bench after it
# (tests/kernels would otherwise compile into a fresh folder per session).
# build --check (minutes of NVRTC on a cold cache) runs beside the suite, in one niced process
# on the core the suite (one process) leaves idle; its output follows the suite's. Each cache
# entry is filled under a lock, so when the inspect test comes to an entry build --check is
# still compiling it waits for it rather than compiling it again (docs/kernels.md, "The
# compile cache"); make test fails when either fails.
test: export GPUK_CACHE_DIR ?= $(HOME)/.cache/gpuk
test: venv
	$(BIN)/lint-imports
	@echo "python -m gpuk.kernels.build --check (beside pytest)"; log=$$(mktemp); \
	nice -n 5 $(BIN)/python -m gpuk.kernels.build --check --jobs 1 >$$log 2>&1 & build=$$!; \
	trap 'kill $$build 2>/dev/null; rm -f $$log' INT TERM; \
	$(BIN)/python -m pytest -q; tests=$$?; \
	wait $$build; built=$$?; cat $$log; rm -f $$log; \
	test $$tests -eq 0 -a $$built -eq 0
	GPUK_GPU_REHEARSAL=1 $(BIN)/python -m pytest -q -m gpu tests
	GPUK_GPU_REHEARSAL=1 $(BIN)/python -m bench --quick -q

# BENCH_ARGS: e.g. --quick, --strict, -k keras (python -m bench --help)
bench: venv
	$(BIN)/python -m bench $(BENCH_ARGS)

# Keras 2.3.1's own test suite on gpuk (tests/keras_upstream.py; not part of `make test`: about
# 2 minutes on 2 cores): fetches the sdist into .keras-upstream/ once, prints per file passed /
# failed / errors / skipped and the pass rate. KERAS_SUITE_ARGS: e.g. --failures, --device emulate
# tests/keras/layers/pooling_test.py (python -m tests.keras_upstream --help).
$(BIN)/.installed-keras-suite: pyproject.toml | venv
	$(BIN)/python -m pip install --quiet --no-compile -e ".[keras-suite]"
	touch $@

keras-suite: $(BIN)/.installed-keras-suite
	$(BIN)/python -m tests.keras_upstream $(KERAS_SUITE_ARGS)

# The wheels a GPU session carries to the device machine (no package registry there; Python
# 3.12): Keras 2.3.1, the cuDNN frontend and ml_dtypes in .whl/, Keras 3 in .whl/keras3/ (a site
# of its own). docs/kernels.md, "Running on a GPU"; .whl/ is ignored by git.
WHEEL_PLATFORMS := --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
	--platform manylinux_2_27_x86_64 --platform manylinux2014_x86_64 --platform any
wheels:
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: $(WHEEL_PLATFORMS) -d .whl \
		keras==2.3.1 keras-applications==1.0.8 keras-preprocessing==1.1.2 \
		nvidia-cudnn-frontend==1.32.0 ml_dtypes==0.5.4
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: $(WHEEL_PLATFORMS) -d .whl/keras3 \
		keras==3.15.1 namex==0.1.0 optree==0.20.0
	ls .whl .whl/keras3

clean:
	rm -rf $(VENV) .pytest_cache .benchmarks
