#!/usr/bin/env bash
# The first (or any) GPU session in one command, from the repository root, without make:
#
#   bash bench/gpu_session.sh [--parts LIST] [--budget SECONDS] [--sync] [--bench-args ARGS]
#                             [--bench-k EXPR]
#
# LIST is comma-separated, run in this order (default: info,build,tests), except that every
# bench-FAMILY part runs last, all in one pytest session; an unknown part (or a FAMILY without
# its bench/bench_FAMILY.py) ends the call with status 2 before any part runs:
#   info           nvidia-smi, CuPy's device and limits, NVRTC, cuDNN and its frontend, where
#                  compute-sanitizer and ncu are
#   build          python -m gpuk.kernels.build for this device's architecture (prebuilt cubins),
#                  one compile process per core
#   tests          pytest -m gpu over tests/ (GPUK_REQUIRE_GPU=1: no silent skips)
#   tests-kernels  the same, tests/kernels only (the launchers against their NumPy twins)
#   sanitizer      compute-sanitizer memcheck, then racecheck, over the kernel tests that
#                  bench/sanitize.py lists (every kernel source once, small shapes), each tool
#                  at most SANITIZER_SECONDS (default 100)
#   ncu            Nsight Compute (SpeedOfLight and memory sections) on one call of each case
#                  of bench/ncu_cases.py (conv fwd/dgrad/wgrad, depthwise, pooling, batch norm,
#                  softmax xent, CTC), at most NCU_SECONDS (default 150); ncu-cudnn: cuDNN's
#                  kernels on the same shapes. NCU_ARGS: more bench.ncu_cases options
#                  ("--cases conv_wgrad,ctc_loss"), NCU_LAUNCH_COUNT: kernels at most (80)
#   keras3         bench/keras3_jax.py: the Keras training steps on Keras 3 with JAX, from the
#                  wheels in .whl/keras3/ (a site of its own: Keras 3 and 2.3.1 share a name)
#   demo           python -m gpuk.demo --device cuda (the OCR demo: training time, accuracy;
#                  its plot and results stay in /tmp/gpuk-demo, the numbers are in session.log)
#   bench-quick    python -m bench --quick (one case per benchmark and implementation)
#   bench          python -m bench (everything; far longer than one 10-minute command)
#   host-overhead  python -m bench.host_overhead --rehearsal no: launches, host µs per launch,
#                  syncs, allocations and graph replays per Keras training step (mlp, bn_cnn, ctc)
#   bench-FAMILY   python -m bench -k bench_FAMILY: copy, conv, pooling, batchnorm,
#                  softmax_xent, ctc, graph, keras, cpu
#
# --sync runs the test parts (tests, tests-kernels, sanitizer) with GPUK_SYNC_LAUNCHES=1: each
# launch is waited for, so a device fault fails the launch that made it. --bench-args adds
# options to every python -m bench call (split on spaces: "--rounds 2"); --bench-k narrows the
# bench-FAMILY rows with a pytest -k expression, and-ed with the families' own
# ("not numpy": no CPU rows; "resnet50 and 32": conv's ResNet-50 rows at N=32, and N=256 tf32).
#
# Every step runs under what is left of --budget (default 540 s, inside the device tool's
# 10-minute command limit); a step that would start with under 30 s left is skipped and
# says so. Wheels the image lacks (keras==2.3.1 and its two helpers, nvidia-cudnn-frontend)
# are installed from .whl/ when it is there (see docs/kernels.md, "Running on a GPU").
#
# Output goes to $OUT (the device tool's folder; ./gpu-session-out elsewhere), all at its top
# level, at most 8 files (the device tool's limit): session.log (everything printed, the
# sanitizers' reports too), tests-junit.xml, bench.json, bench.md, bench.png, ncu.txt,
# ncu-cudnn.txt, keras3.json. The exit status is the first failing step's.
set -uo pipefail

PYTHON=${PYTHON:-python3}
PARTS=info,build,tests
BUDGET=540
MIN_STEP_SECONDS=30
SYNC=0
BENCH_ARGS=()
BENCH_K=
SANITIZER_SECONDS=${SANITIZER_SECONDS:-100}
NCU_SECONDS=${NCU_SECONDS:-150}

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
    case "$1" in
        --parts|--part) PARTS=$2; shift 2 ;;
        --budget) BUDGET=$2; shift 2 ;;
        --sync) SYNC=1; shift ;;
        --bench-args) read -r -a BENCH_ARGS <<< "$2"; shift 2 ;;
        --bench-k) BENCH_K=$2; shift 2 ;;
        -h|--help) usage 0 ;;
        *) echo "gpu_session: unknown argument $1" >&2; usage 2 ;;
    esac
done

cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-$PWD/gpu-session-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/session.log") 2>&1
TEE_PID=$!
START=$(date +%s)
STATUS=0

remaining() { echo $(( BUDGET - ($(date +%s) - START) )); }

# step NAME COMMAND...: runs COMMAND (a program or a function below) under the time left;
# records the first failure. timeout runs programs only: functions go through bash -c.
step() { capped_step "$BUDGET" "$@"; }

# capped_step SECONDS NAME COMMAND...: step, given at most SECONDS of what is left.
capped_step() {
    local cap=$1 name=$2; shift 2
    local left; left=$(remaining)
    if [ "$left" -lt "$MIN_STEP_SECONDS" ]; then
        echo "=== $name: SKIPPED, ${left}s of the ${BUDGET}s budget left"
        [ "$STATUS" -ne 0 ] || STATUS=124
        return
    fi
    [ "$cap" -lt "$left" ] && left=$cap
    echo "=== $name ($(date -u +%H:%M:%S), ${left}s given): $*"
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
    local tool path
    for tool in compute-sanitizer ncu; do   # the sanitizer and ncu parts' tools
        path=$(find_tool "$tool") && echo "$tool: $path, $(timeout 30 "$path" --version | tail -1)"
    done
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

# test_settings SECONDS: what the test parts (tests, tests-kernels, sanitizer) share, set in the
# step's own process. Under --sync every launch is waited for (the variable is read when gpuk's
# CUDA runtime is made); where pytest-timeout is installed a test may take SECONDS, so a hung
# kernel fails its test instead of the step: sets the caller's local per_test to pytest's
# arguments (bash locals are seen by the functions a function calls).
test_settings() {
    [ "$SYNC" -eq 0 ] || export GPUK_SYNC_LAUNCHES=1
    per_test=()
    "$PYTHON" -c 'import pytest_timeout' 2>/dev/null && per_test=(--timeout "$1")
}

run_tests() {   # run_tests PATH...
    local per_test
    test_settings 120
    GPUK_REQUIRE_GPU=1 "$PYTHON" -m pytest -m gpu -q -rfEs -p no:cacheprovider "${per_test[@]}" \
        --junitxml="$OUT/tests-junit.xml" "$@"
}

run_bench() {   # run_bench [python -m bench ARGS...]
    "$PYTHON" -m bench --json "$OUT/bench.json" --out "$OUT" "$@"
}

# find_tool NAME: the CUDA tool NAME on PATH, else in the toolkit's or Nsight Compute's folders.
find_tool() {
    command -v "$1" 2>/dev/null && return
    local found
    for found in /usr/local/cuda/bin/"$1" /usr/local/cuda-*/bin/"$1" /opt/nvidia/nsight-compute/*/"$1"; do
        [ -x "$found" ] && { echo "$found"; return; }
    done
    echo "gpu_session: $1 not found (PATH, /usr/local/cuda*/bin, /opt/nvidia/nsight-compute)" >&2
    return 1
}

# run_sanitizer TOOL: compute-sanitizer's TOOL over bench/sanitize.py's tests (CuPy's pool off).
# API errors are not reported: gpuk and CuPy check every CUDA call's status and raise, failing
# the test, and libraries probing the device (cuDNN, CuPy) make expected ones. No leak check:
# gpuk keeps device buffers (plans, workspaces) alive until the process ends, by design.
run_sanitizer() {
    local tool=$1 sanitizer per_test=()
    sanitizer=$(find_tool compute-sanitizer) || return
    local options=(--tool "$tool" --target-processes all --error-exitcode 86 --print-limit 25
                   --report-api-errors no)
    [ "$tool" = racecheck ] && options+=(--racecheck-report analysis)
    test_settings 90
    GPUK_REQUIRE_GPU=1 "$sanitizer" "${options[@]}" "$PYTHON" -m bench.sanitize "${per_test[@]}"
}

# run_ncu FILE [bench.ncu_cases ARGS...]: the cases under Nsight Compute, its report in $OUT/FILE.
# --clock-control none: the card's clocks are left as found (never lock or change them here).
run_ncu() {
    local file=$1; shift
    local ncu section sections=() more=()
    read -r -a more <<< "${NCU_ARGS:-}"
    ncu=$(find_tool ncu) || return
    local available; available=$("$ncu" --list-sections 2>&1)
    for section in SpeedOfLight MemoryWorkloadAnalysis MemoryWorkloadAnalysis_Tables; do
        if grep -qw "$section" <<< "$available"; then sections+=(--section "$section")
        else echo "ncu has no section $section here: left out"; fi
    done
    "$ncu" --version | tail -1
    "$ncu" --profile-from-start off --nvtx --clock-control none --target-processes all \
        --launch-count "${NCU_LAUNCH_COUNT:-80}" "${sections[@]}" --log-file "$OUT/$file" \
        "$PYTHON" -m bench.ncu_cases "$@" "${more[@]}" || return
    grep -E '^  [A-Za-z_0-9].*\(|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput' \
        "$OUT/$file" | head -120   # the kernels and their speed-of-light lines, into session.log
}

# run_keras3: bench/keras3_jax.py in a site of its own (.whl/keras3/: keras 3 and the
# dependencies the image lacks), without the Keras 2.3.1 of /tmp/gpuk-site on the path.
run_keras3() {
    compgen -G '.whl/keras3/*.whl' >/dev/null || { echo "no .whl/keras3/: see docs/kernels.md"; return 1; }
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/keras3-site .whl/keras3/*.whl || return
    env PYTHONPATH="/tmp/keras3-site:$PWD" KERAS_BACKEND=jax XLA_PYTHON_CLIENT_PREALLOCATE=false \
        "$PYTHON" -m bench.keras3_jax --json "$OUT/keras3.json"
}

export -f device_info test_settings run_tests run_bench find_tool run_sanitizer run_ncu run_keras3
export PYTHON OUT SYNC
echo "gpu_session: parts=$PARTS budget=${BUDGET}s sync=$SYNC OUT=$OUT"
IFS=',' read -r -a PART_LIST <<< "$PARTS"
# Every part checked before any runs: a misspelt last part is an error now, not after the
# device time the parts before it took. (The case below runs them; the test holds both alike.)
KNOWN_PARTS=" info build tests tests-kernels sanitizer ncu ncu-cudnn keras3 demo bench-quick host-overhead bench "
for part in "${PART_LIST[@]}"; do
    case "$KNOWN_PARTS" in *" $part "*) continue ;; esac
    [[ "$part" == bench-?* && -f "bench/bench_${part#bench-}.py" ]] && continue   # a family: its file
    echo "gpu_session: unknown part '$part' (of${KNOWN_PARTS% }, bench-FAMILY; see --help)"
    exit 2
done
install_wheels || { echo "installing .whl/ failed"; STATUS=1; }
BENCH_FILTER=()
for part in "${PART_LIST[@]}"; do
    case "$part" in
        info) step info device_info ;;
        build)
            if ARCH=$(device_arch); then
                step build "$PYTHON" -m gpuk.kernels.build --arch "$ARCH" --table --jobs "$(nproc)"
            else echo "=== build: no device architecture (CuPy sees no GPU)"; [ "$STATUS" -ne 0 ] || STATUS=1; fi ;;
        tests) step tests run_tests tests ;;
        tests-kernels) step tests-kernels run_tests tests/kernels ;;
        sanitizer)
            capped_step "$SANITIZER_SECONDS" memcheck run_sanitizer memcheck
            capped_step "$SANITIZER_SECONDS" racecheck run_sanitizer racecheck ;;
        ncu) capped_step "$NCU_SECONDS" ncu run_ncu ncu.txt ;;
        ncu-cudnn) capped_step "$NCU_SECONDS" ncu-cudnn run_ncu ncu-cudnn.txt --impl cudnn ;;
        keras3) step keras3 run_keras3 ;;
        demo) step demo "$PYTHON" -m gpuk.demo --device cuda --out /tmp/gpuk-demo ;;
        bench-quick) step bench-quick run_bench --quick "${BENCH_ARGS[@]}" ;;
        host-overhead) step host-overhead env KERAS_BACKEND=gpuk.backend "$PYTHON" -m bench.host_overhead --rehearsal no ;;
        bench) step bench run_bench "${BENCH_ARGS[@]}" ;;
        bench-*) BENCH_FILTER+=("bench_${part#bench-}") ;;
    esac
done
if [ ${#BENCH_FILTER[@]} -gt 0 ]; then   # one pytest run for all families: one bench.json
    FILTER=$(IFS='|'; echo "${BENCH_FILTER[*]}")
    EXPRESSION="(${FILTER//|/ or })${BENCH_K:+ and ($BENCH_K)}"
    step "bench ${FILTER//|/ }" run_bench -k "$EXPRESSION" "${BENCH_ARGS[@]}"
fi
echo "gpu_session: done in $(( $(date +%s) - START ))s, status $STATUS; files in $OUT:"
ls -la "$OUT"
# tee runs asynchronously: close our ends of its pipe and let it write the log's last lines
# before the device tool collects $OUT. Bounded: a killed step's orphan may still hold the pipe.
exec >&- 2>&-
for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$TEE_PID" 2>/dev/null || break; sleep 0.5; done
exit "$STATUS"
