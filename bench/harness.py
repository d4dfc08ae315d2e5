"""Benchmark harness: timing, input pools, the card's measured ceilings, per-row metrics.

GPU rows are timed with CUDA events around each call on CuPy's current stream, after a
warm-up, with no host synchronisation between runs (so the GPU queue stays full and a
launch gap is not counted as kernel time); CPU rows (numpy, torch) with perf_counter.
When one input set is smaller than twice the cache (L2 on the GPU), calls rotate
through a pool of sets that together are larger, so runs do not measure the cache.

pytest-benchmark gets the measured samples through ``REPLAY_CLOCK``, a timer that
replays them (bench/conftest.py makes it the timer of every benchmark), so its stats and
JSON hold the event times, not host times around asynchronous launches.
"""
import importlib.util
import math
import os
import sys
import statistics
import time
from collections import deque

from bench import runs
from gpuk import device

GPU_IMPLS = ('gpuk', 'cudnn', 'cupy', 'torch-cuda')   # torch-cuda: PyTorch on the GPU
CPU_IMPLS = ('numpy', 'torch')
IMPLEMENTATIONS = GPU_IMPLS + CPU_IMPLS
CPU_CACHE_BYTES = 64 << 20          # a generous last-level cache for the CPU rows
GPU_CALIBRATION_BYTES = 1 << 30     # each copy calibration moves 1 GiB in and 1 GiB out
CPU_CALIBRATION_BYTES = 256 << 20
MAX_POOL_SETS = 64


# ---------------------------------------------------------------- availability

gpu_unusable_reason = device.gpu_unusable_reason


def skip_reason(impl):
    """Why ``impl`` cannot run on this host, or None."""
    if impl not in IMPLEMENTATIONS:
        raise ValueError('skip_reason: impl must be one of %s, got %r' % (IMPLEMENTATIONS, impl))
    if impl in GPU_IMPLS:
        reason = gpu_unusable_reason()
        if reason:
            return '%s needs a GPU: %s' % (impl, reason)
        if impl == 'cudnn':
            from gpuk.kernels.cudnn import library as cudnn_library
            if not cudnn_library.available():
                return 'cuDNN unavailable: %s' % cudnn_library.why_unavailable()
    if impl in ('torch', 'torch-cuda') and importlib.util.find_spec('torch') is None:
        return 'PyTorch is not installed (pip install -e ".[bench]")'
    if impl == 'torch-cuda':
        import torch
        if not torch.cuda.is_available():
            return ('PyTorch %s cannot use this GPU (a CPU-only build, or its CUDA does not match the '
                    'driver): install a CUDA build of torch for the PyTorch GPU rows' % torch.__version__)
    return None


def require(impl):
    """Skips the calling test when ``impl`` cannot run here."""
    reason = skip_reason(impl)
    if reason:
        import pytest
        pytest.skip(reason)


def device_kind(impl):
    return 'gpu' if impl in GPU_IMPLS else 'cpu'


# ---------------------------------------------------------------- timing

def _run_count(per_run, min_time, min_runs, max_runs):
    if per_run <= 0:
        return max_runs
    return int(min(max(math.ceil(min_time / per_run), min_runs), max_runs))


class CupyEvents:
    """CUDA events on CuPy's current stream, the one gpuk's launchers and cuDNN enqueue on."""

    def __init__(self):
        import cupy
        self.cupy, self.stream = cupy, cupy.cuda.get_current_stream()

    def event(self):
        return self.cupy.cuda.Event()

    def record(self, event):
        event.record(self.stream)

    def synchronize(self):
        self.stream.synchronize()

    def elapsed_ms(self, start, end):
        return self.cupy.cuda.get_elapsed_time(start, end)


class TorchEvents:
    """CUDA events on torch's current stream, for the PyTorch GPU rows."""

    def __init__(self):
        import torch
        self.torch = torch

    def event(self):
        return self.torch.cuda.Event(enable_timing=True)

    def record(self, event):
        event.record()

    def synchronize(self):
        self.torch.cuda.synchronize()

    def elapsed_ms(self, start, end):
        return start.elapsed_time(end)


def time_gpu(fn, arg_sets, min_time=0.1, min_runs=10, max_runs=200, warmup_time=0.05, events=None):
    """Seconds per call of ``fn(*args)``, one sample per call, timed with CUDA events.

    Calls cycle through ``arg_sets``. The warm-up (module load, compilation, plan and
    handle creation) is never timed; the timed calls are queued behind it. ``events``
    (default CupyEvents) records on the stream the work is enqueued on. ``min_time`` is per
    round: python -m bench times every row in several rounds.
    """
    clock = events or CupyEvents()
    n = len(arg_sets)
    fn(*arg_sets[0])
    clock.synchronize()
    probe_start, probe_end = clock.event(), clock.event()
    clock.record(probe_start)
    for i in range(3):
        fn(*arg_sets[(1 + i) % n])
    clock.record(probe_end)
    probe_end.synchronize()
    per_run = clock.elapsed_ms(probe_start, probe_end) / 3e3   # milliseconds for 3 -> s per call
    runs = _run_count(per_run, min_time, min_runs, max_runs)
    warmup = _run_count(per_run, warmup_time, 3, max_runs)
    for i in range(warmup):
        fn(*arg_sets[i % n])
    pairs = [(clock.event(), clock.event()) for _ in range(runs)]   # created before timing starts
    for i, (start, end) in enumerate(pairs):
        clock.record(start)
        fn(*arg_sets[(warmup + i) % n])
        clock.record(end)
    pairs[-1][1].synchronize()
    return [clock.elapsed_ms(start, end) / 1e3 for start, end in pairs]


def time_cpu(fn, arg_sets, min_time=0.25, min_runs=5, max_runs=50):
    """Seconds per call of ``fn(*args)`` on the host (perf_counter), after one warm-up call.

    ``min_time`` is per round: python -m bench times every row in several rounds.
    """
    n = len(arg_sets)
    fn(*arg_sets[0])
    t0 = time.perf_counter()
    fn(*arg_sets[1 % n])
    runs = _run_count(time.perf_counter() - t0, min_time, min_runs, max_runs)
    samples = []
    for i in range(runs):
        t0 = time.perf_counter()
        fn(*arg_sets[i % n])
        samples.append(time.perf_counter() - t0)
    return samples


def pool_size(set_bytes, cache_bytes, max_sets=MAX_POOL_SETS):
    """How many input sets make a pool over twice ``cache_bytes`` (at least one)."""
    if set_bytes <= 0:
        raise ValueError('pool_size: set_bytes must be > 0, got %r' % (set_bytes,))
    return int(min(max(math.ceil(2 * cache_bytes / set_bytes), 1), max_sets))


def gpu_cache_bytes():
    """The L2 size of the current GPU in bytes, asked of the runtime by its enum."""
    import cupy
    return int(cupy.cuda.runtime.deviceGetAttribute(cupy.cuda.runtime.cudaDevAttrL2CacheSize,
                                                    cupy.cuda.Device().id))


def cache_bytes(kind):
    return gpu_cache_bytes() if kind == 'gpu' else CPU_CACHE_BYTES


def gpu_name():
    import cupy
    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)['name']
    return name.decode() if isinstance(name, bytes) else str(name)


cpu_name = runs.cpu_name


def run_device():
    """The device a run is named and compared by: the GPU when one is usable, else the CPU
    with its usable core count (two VMs with the same model name but not the same cores differ)."""
    if gpu_unusable_reason() is None:
        return gpu_name()
    return 'cpu %s x%d' % (cpu_name(), runs.usable_cpus())


def thread_settings():
    """The thread counts in force: the variables, what OpenBLAS and torch report."""
    from gpuk.cpu_fallback import parallel
    settings = {name: os.environ.get(name) for name in runs.THREAD_VARIABLES + ('OMP_WAIT_POLICY',)}
    settings['numpy_blas_threads'] = parallel.blas_threads()
    if importlib.util.find_spec('torch') is not None and 'torch' in sys.modules:
        settings['torch_threads'] = sys.modules['torch'].get_num_threads()
    return settings


# ---------------------------------------------------------------- pytest-benchmark bridge

class ReplayClock:
    """A pytest-benchmark timer that replays loaded samples, one per round.

    Unloaded it is perf_counter, so a benchmark that times itself still works.
    """
    __name__ = 'replay_clock'

    def __init__(self):
        self._samples = deque()
        self._now = 0.0
        self._round_end = None

    def reset(self):
        self._samples.clear()
        self._round_end = None

    def load(self, samples):
        if self._samples or self._round_end is not None:
            raise RuntimeError('ReplayClock.load: %d samples are still queued' % len(self._samples))
        self._samples.extend(float(s) for s in samples)

    @property
    def pending(self):
        return len(self._samples) + (self._round_end is not None)

    def __call__(self):
        if self._round_end is not None:     # end of a round
            self._now, self._round_end = self._round_end, None
            return self._now
        if self._samples:                   # start of a round
            self._round_end = self._now + self._samples.popleft()
            return self._now
        return time.perf_counter()

    def __repr__(self):
        return 'bench.harness.REPLAY_CLOCK'


REPLAY_CLOCK = ReplayClock()


def record_samples(benchmark, samples):
    """Hands measured ``samples`` (seconds) to the pytest-benchmark fixture as its rounds."""
    if getattr(benchmark, '_timer', REPLAY_CLOCK) is not REPLAY_CLOCK:
        raise RuntimeError('record_samples: the benchmark timer is not bench.harness.REPLAY_CLOCK; '
                           'run the suites through bench/conftest.py (python -m bench)')
    if getattr(benchmark, 'disabled', False):
        return
    REPLAY_CLOCK.load(samples)
    try:
        benchmark.pedantic(lambda: None, rounds=len(samples), iterations=1, warmup_rounds=0)
    finally:
        leftover = REPLAY_CLOCK.pending
        REPLAY_CLOCK.reset()
    if leftover:
        raise RuntimeError('record_samples: pytest-benchmark used %d of %d samples'
                           % (len(samples) - leftover, len(samples)))


# ---------------------------------------------------------------- ceilings

class Ceilings:
    """The measured ceilings of this host, each measured once on first use."""

    def __init__(self):
        self._cache = {}

    def _once(self, key, measure):
        if key not in self._cache:
            self._cache[key] = measure()
        return self._cache[key]

    def gpu_copy(self):
        """{'gpuk': GB/s, 'cupy': GB/s}: 1 GiB device-to-device, read + write bytes."""
        return self._once('gpu_copy', measure_gpu_copy)

    def gpu_copy_gbps(self):
        return max(self.gpu_copy().values())

    def cpu_copy_gbps(self):
        return self._once('cpu_copy', measure_cpu_copy)

    def gpu_matmul_tflops(self, dtype):
        return self._once(('gpu_matmul', dtype), lambda: measure_gpu_matmul(dtype))

    def cpu_matmul_tflops(self, dtype):
        return self._once(('cpu_matmul', dtype), lambda: measure_cpu_matmul(dtype))

    def bandwidth_gbps(self, kind):
        return self.gpu_copy_gbps() if kind == 'gpu' else self.cpu_copy_gbps()

    def matmul_tflops(self, kind, dtype):
        return self.gpu_matmul_tflops(dtype) if kind == 'gpu' else self.cpu_matmul_tflops(dtype)


def gpuk_copy(src):
    """A copy of ``src`` through gpuk's own copy kernel on the CUDA runtime.

    The result comes from CuPy's memory pool, so after the first call no time goes to
    cudaMalloc; the array is dropped, and its block reused, as soon as the call returns.
    """
    from gpuk.kernels import elementwise
    return elementwise.copy(src, runtime='cuda')


def cupy_copy(src, dst):
    dst[...] = src


def copy_gbps(nbytes, samples):
    return 2 * nbytes / statistics.median(samples) / 1e9


def measure_gpu_copy(nbytes=GPU_CALIBRATION_BYTES):
    import cupy
    src = cupy.random.standard_normal(nbytes // 4, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    try:
        if not bool(cupy.array_equal(gpuk_copy(src), src)):
            raise RuntimeError('measure_gpu_copy: the gpuk copy kernel produced a wrong copy')
        return {'gpuk': copy_gbps(nbytes, time_gpu(gpuk_copy, [(src,)])),
                'cupy': copy_gbps(nbytes, time_gpu(cupy_copy, [(src, dst)]))}
    finally:
        del src, dst
        cupy.get_default_memory_pool().free_all_blocks()


def measure_cpu_copy(nbytes=CPU_CALIBRATION_BYTES):
    import numpy as np
    src = np.random.default_rng(0).standard_normal(nbytes // 8)
    dst = np.empty_like(src)
    return copy_gbps(nbytes, time_cpu(np.copyto, [(dst, src)], min_time=0.3))


_MATMUL_SIZE = {'float16': 8192, 'bfloat16': 8192, 'float32': 8192, 'float64': 4096}


def measure_gpu_matmul(dtype):
    """TFLOP/s of a large square matmul through CuPy (cuBLAS) on random data."""
    import cupy
    n = _MATMUL_SIZE[dtype]
    a = cupy.random.standard_normal((n, n), dtype=cupy.float32).astype(dtype)
    b = cupy.random.standard_normal((n, n), dtype=cupy.float32).astype(dtype)
    c = cupy.empty((n, n), dtype=dtype)
    samples = time_gpu(lambda a, b, c: cupy.matmul(a, b, out=c), [(a, b, c)], min_runs=5, max_runs=20)
    return 2 * n ** 3 / statistics.median(samples) / 1e12


def measure_cpu_matmul(dtype):
    import numpy as np
    n = 1024
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(dtype) for _ in range(2))
    samples = time_cpu(np.matmul, [(a, b)], min_time=0.3)
    return 2 * n ** 3 / statistics.median(samples) / 1e12


# ---------------------------------------------------------------- rows

class Harness:
    """Runs benchmark rows with the session's measured ceilings. Ratios between rows are
    the report's business (bench/rows.py), taken over every round of both rows."""

    def __init__(self, ceilings=None):
        self.ceilings = ceilings or Ceilings()

    def run(self, benchmark, *, family, case, impl, fn, make_inputs, set_bytes,
            bytes_moved=0, flops=0, dtype='float32', suite=None):
        """Times ``fn`` for one row and fills ``benchmark.extra_info``.

        ``make_inputs(i)`` returns the i-th argument tuple of the pool (each built from its
        own seed); ``set_bytes`` is the size of one set; ``bytes_moved`` and ``flops`` are
        the fewest bytes one call must move and the floating-point operations it does.
        ``suite`` (optional) names a set of cases the report also averages on its own, per
        family (bench/rows.py suite_summary: 'resnet50 tf32', ...). Returns the extra_info dict.
        """
        require(impl)
        kind = device_kind(impl)
        sets = pool_size(set_bytes, cache_bytes(kind))
        pool = [make_inputs(i) for i in range(sets)]
        if kind == 'gpu':
            samples = time_gpu(fn, pool, events=TorchEvents() if impl == 'torch-cuda' else None)
        else:
            samples = time_cpu(fn, pool)
        del pool
        record_samples(benchmark, samples)
        median = statistics.median(samples)
        ceiling_gbps = self.ceilings.bandwidth_gbps(kind) if bytes_moved else None
        ceiling_tflops = self.ceilings.matmul_tflops(kind, dtype) if flops else None
        info = row_metrics(median, bytes_moved, flops, ceiling_gbps, ceiling_tflops)
        info.update(family=family, case=str(case), impl=impl, dtype=dtype,
                    device=gpu_name() if kind == 'gpu' else cpu_name(),
                    runs=len(samples), pool_sets=sets, load_average=runs.load_average())
        if suite:
            info['suite'] = suite
        benchmark.extra_info.update(info)
        return benchmark.extra_info


def row_metrics(time_s, bytes_moved, flops, ceiling_gbps, ceiling_tflops):
    """time, bytes, flops, GB/s, TFLOP/s, ceilings and the fraction of the roofline floor."""
    from bench.rows import ceiling_fraction
    return {
        'time_s': time_s, 'bytes': int(bytes_moved), 'flops': int(flops),
        'gbps': bytes_moved / time_s / 1e9 if bytes_moved else None,
        'tflops': flops / time_s / 1e12 if flops else None,
        'ceiling_gbps': ceiling_gbps, 'ceiling_tflops': ceiling_tflops,
        'ceiling_fraction': ceiling_fraction(time_s, bytes_moved, flops, ceiling_gbps,
                                             ceiling_tflops),
    }
