#!/usr/bin/env bash
# The first (or any) GPU session in one command, from the repository root, without make:
#
#   bash bench/gpu_session.sh [--parts LIST] [--budget SECONDS]
#
# LIST is comma-separated, run in this order (default: info,build,tests):
#   info           nvidia-smi, CuPy's device and limits, NVRTC, cuDNN and its frontend
#   build          python -m gpuk.kernels.build for this device's architecture (prebuilt cubins)
#   tests          pytest -m gpu over tests/ (GPUK_REQUIRE_GPU=1: no silent skips)
#   tests-kernels  the same, tests/kernels only (the launchers against their NumPy twins)
#   bench-quick    python -m bench --quick (one case per benchmark and implementation)
#   bench          python -m bench (everything; far longer than one 10-minute command)
#   host-overhead  python -m bench.host_overhead --rehearsal no: launches, host µs per launch,
#                  syncs, allocations and graph replays per Keras training step (mlp, bn_cnn, ctc)
#   bench-FAMILY   python -m bench -k bench_FAMILY: copy, conv, pooling, batchnorm,
#                  softmax_xent, ctc, graph, keras, cpu
#
# Every step runs under what is left of --budget (default 540 s, inside the device tool's
# 10-minute command limit); a step that would start with under 30 s left is skipped and
# says so. Wheels the image lacks (keras==2.3.1 and its two helpers, nvidia-cudnn-frontend)
# are installed from .whl/ when it is there (see docs/kernels.md, "Running on a GPU").
#
# Output goes to $OUT (the device tool's folder; ./gpu-session-out elsewhere), five files
# at most, all at its top level: session.log (everything printed), tests-junit.xml,
# bench.json, bench.md, bench.png. The exit status is the first failing step's.
set -uo pipefail

PYTHON=${PYTHON:-python3}
PARTS=info,build,tests
BUDGET=540
MIN_STEP_SECONDS=30

usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
    case "$1" in
        --parts|--part) PARTS=$2; shift 2 ;;
        --budget) BUDGET=$2; shift 2 ;;
        -h|--help) usage 0 ;;
        *) echo "gpu_session: unknown argument $1" >&2; usage 2 ;;
    esac
done

cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-$PWD/gpu-session-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/session.log") 2>&1
START=$(date +%s)
STATUS=0

remaining() { echo $(( BUDGET - ($(date +%s) - START) )); }

# step NAME COMMAND...: runs COMMAND (a program or a function below) under the time left;
# records the first failure. timeout runs programs only: functions go through bash -c.
step() {
    local name=$1; shift
    local left; left=$(remaining)
    if [ "$left" -lt "$MIN_STEP_SECONDS" ]; then
        echo "=== $name: SKIPPED, ${left}s of the ${BUDGET}s budget left"
        [ "$STATUS" -ne 0 ] || STATUS=124
        return
    fi
    echo "=== $name ($(date -u +%H:%M:%S), ${left}s left): $*"
    timeout --kill-after=10 "$left" bash -c '"$@"' "$name" "$@"
    local code=$?
    echo "=== $name: exit $code after $(( $(date +%s) - START ))s in all"
    [ "$code" -eq 0 ] || [ "$STATUS" -ne 0 ] || STATUS=$code
}

install_wheels() {
    # The image has no network: missing packages travel as wheels in .whl/ (carry: ['.whl']).
    compgen -G '.whl/*.whl' >/dev/null || { echo "no .whl/: keras and the cuDNN frontend come from the image or not at all"; return 0; }
    "$PYTHON" -m pip install -q --no-index --find-links .whl --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/gpuk-site .whl/*.whl || return
    export PYTHONPATH=$PYTHONPATH:/tmp/gpuk-site   # after the repo: the image's own packages win
}

device_info() {
    nvidia-smi || echo "nvidia-smi failed"
    "$PYTHON" - <<'EOF'
import sys
import cupy
from gpuk import device
print('python', sys.version.split()[0], '| cupy', cupy.__version__)
reason = device.gpu_unusable_reason()
if reason:
    sys.exit('no usable GPU: ' + reason)
rt = cupy.cuda.runtime
dev = cupy.cuda.Device()
props = rt.getDeviceProperties(dev.id)
name = props['name'].decode() if isinstance(props['name'], bytes) else props['name']
print('device %d: %s, compute capability %s' % (dev.id, name, dev.compute_capability))
print('CUDA runtime %d, driver %d' % (rt.runtimeGetVersion(), rt.driverGetVersion()))
print('SMs %d, L2 %d B, shared memory per block opt-in %d B, memory %d B' % (
    rt.deviceGetAttribute(rt.cudaDevAttrMultiProcessorCount, dev.id),
    rt.deviceGetAttribute(rt.cudaDevAttrL2CacheSize, dev.id),
    rt.deviceGetAttribute(rt.cudaDevAttrMaxSharedMemoryPerBlockOptin, dev.id), dev.mem_info[1]))
from gpuk.kernels.cudnn import library as cudnn_library
from gpuk.kernels.runtime import build
try:
    print('NVRTC (gpuk build) %d.%d' % build.nvrtc_version())
except build.NvrtcMissing as exc:
    print('NVRTC (gpuk build) missing:', exc)
try:
    import cudnn as frontend
    print('cuDNN frontend', getattr(frontend, '__version__', '?'), 'from', frontend.__file__)
except Exception as exc:
    print('cuDNN frontend not importable:', type(exc).__name__, exc)
print('cuDNN path usable' if cudnn_library.available() else 'cuDNN path unavailable: %s' % cudnn_library.why_unavailable())
try:
    import keras  # noqa: F401  (imported for its version only; KERAS_BACKEND is not set here)
except Exception as exc:
    print('keras not importable:', type(exc).__name__, exc)
EOF
}

device_arch() {
    "$PYTHON" -c 'import cupy; print("sm_" + cupy.cuda.Device().compute_capability)'
}

run_tests() {   # run_tests PATH...: a hung kernel fails its test (pytest-timeout) instead of the step
    local per_test=()
    "$PYTHON" -c 'import pytest_timeout' 2>/dev/null && per_test=(--timeout 120)
    GPUK_REQUIRE_GPU=1 "$PYTHON" -m pytest -m gpu -q -rfEs -p no:cacheprovider "${per_test[@]}" \
        --junitxml="$OUT/tests-junit.xml" "$@"
}

run_bench() {   # run_bench [python -m bench ARGS...]
    "$PYTHON" -m bench --json "$OUT/bench.json" --out "$OUT" "$@"
}

export -f device_info run_tests run_bench
export PYTHON OUT
echo "gpu_session: parts=$PARTS budget=${BUDGET}s OUT=$OUT"
install_wheels || { echo "installing .whl/ failed"; STATUS=1; }
IFS=',' read -r -a PART_LIST <<< "$PARTS"
BENCH_FILTER=()
for part in "${PART_LIST[@]}"; do
    case "$part" in
        info) step info device_info ;;
        build)
            if ARCH=$(device_arch); then step build "$PYTHON" -m gpuk.kernels.build --arch "$ARCH" --table
            else echo "=== build: no device architecture (CuPy sees no GPU)"; [ "$STATUS" -ne 0 ] || STATUS=1; fi ;;
        tests) step tests run_tests tests ;;
        tests-kernels) step tests-kernels run_tests tests/kernels ;;
        bench-quick) step bench-quick run_bench --quick ;;
        host-overhead) step host-overhead env KERAS_BACKEND=gpuk.backend "$PYTHON" -m bench.host_overhead --rehearsal no ;;
        bench) step bench run_bench ;;
        bench-*) BENCH_FILTER+=("bench_${part#bench-}") ;;
        *) echo "gpu_session: unknown part '$part'"; STATUS=2 ;;
    esac
done
if [ ${#BENCH_FILTER[@]} -gt 0 ]; then   # one pytest run for all families: one bench.json
    FILTER=$(IFS='|'; echo "${BENCH_FILTER[*]}")
    step "bench ${FILTER//|/ }" run_bench -k "${FILTER//|/ or }"
fi
echo "gpu_session: done in $(( $(date +%s) - START ))s, status $STATUS; files in $OUT:"
ls -la "$OUT"
exit "$STATUS"
