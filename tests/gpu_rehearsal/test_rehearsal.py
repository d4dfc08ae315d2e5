"""The GPU rehearsal's own checks. They run in the ordinary suite too, where the stand-in must
stay out of sys.modules; the ones that need it build their own and never install it."""
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests import gpu_rehearsal
from tests.gpu_rehearsal import standin_cupy

REPO = Path(__file__).resolve().parents[2]


def test_the_standin_is_not_installed_without_the_switch():
    if gpu_rehearsal.active():
        pytest.skip('GPU rehearsal active: the stand-in is meant to be installed')
    assert not getattr(sys.modules.get('cupy'), 'STANDIN', False)


def test_events_time_in_milliseconds_and_need_a_record():
    cupy, _ = standin_cupy.build_module()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    with pytest.raises(cupy.cuda.runtime.CUDARuntimeError):
        cupy.cuda.get_elapsed_time(start, end)
    start.record(cupy.cuda.get_current_stream())
    end.record()
    end.synchronize()
    assert 0 <= cupy.cuda.get_elapsed_time(start, end) < 1e3


def test_device_answers_like_an_h100():
    cupy, _ = standin_cupy.build_module()
    device = cupy.cuda.Device()
    rt = cupy.cuda.runtime
    assert (device.id, device.compute_capability) == (0, '90')
    assert rt.deviceGetAttribute(rt.cudaDevAttrMaxSharedMemoryPerBlockOptin, device.id) == 232448
    with pytest.raises(rt.CUDARuntimeError):
        rt.deviceGetAttribute(rt.cudaDevAttrL2CacheSize, 1)


def test_random_takes_cupys_dtype_keyword():
    cupy, _ = standin_cupy.build_module()
    sample = cupy.random.RandomState(3).standard_normal((2, 5), dtype=cupy.float32)
    assert sample.dtype == np.float32 and sample.shape == (2, 5)
    with pytest.raises(TypeError, match='float32 or float64'):
        cupy.random.RandomState(3).standard_normal(4, dtype=np.int32)


def test_the_default_pool_limit_refuses_like_cupy_and_frees_with_the_array():
    cupy, _ = standin_cupy.build_module()
    pool = cupy.get_default_memory_pool()
    pool.set_limit(size=1000)
    try:
        kept = cupy.empty(100, np.float32)
        with pytest.raises(cupy.cuda.memory.OutOfMemoryError, match=r'^Out of memory allocating 800 bytes '
                                                                     r'\(allocated so far: 400 bytes, limit set '
                                                                     r'to: 1,000 bytes\)\.$'):
            cupy.zeros_like(kept, shape=(200,))
        assert pool.used_bytes() == 400 and isinstance(cupy.cuda.memory.OutOfMemoryError(1, 0), MemoryError)
        del kept
        assert pool.used_bytes() == 0 and cupy.ones((2, 125), np.float32).nbytes == 1000
    finally:
        pool.set_limit(size=0)
    assert cupy.empty(10 ** 4).nbytes == 8 * 10 ** 4 and pool.used_bytes() == 0   # no limit: not counted


def _rehearse(code):
    script = 'from tests import gpu_rehearsal\ngpu_rehearsal.activate()\n' + textwrap.dedent(code)
    return subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, cwd=REPO,
                          env={'PYTHONPATH': str(REPO), 'PATH': '/usr/bin:/bin'}, timeout=120)


def test_cuda_runtime_runs_kernels_in_the_emulator_and_enforces_the_shared_memory_opt_in():
    """In a fresh process: the rehearsal installs process-wide state."""
    result = _rehearse('''
        import numpy as np
        from gpuk import device
        from gpuk.kernels import elementwise, runtime
        from gpuk.kernels.cudnn import library as cudnn_library
        assert device.gpu_unusable_reason() is None and device.kind() == 'cuda'
        assert device.xp().__name__ == 'cupy' and not cudnn_library.available()
        rt = runtime.get_runtime('cuda')
        assert rt.kind == 'cuda' and rt.arch == 'sm_90'
        x = np.arange(1000, dtype=np.float32)
        assert np.array_equal(elementwise.copy(x, runtime='cuda'), x)
        kernel = rt.load(elementwise.SOURCE, elementwise.defines(np.float32)).kernel('copy_bytes')
        src, dst = x.view(np.uint8), np.zeros(x.nbytes, np.uint8)
        args = (src, dst, np.int64(x.nbytes))
        try:   # straight to the RawKernel, skipping CudaKernel's opt-in: CUDA refuses > 48 KB
            kernel._function((1,), (256,), args, shared_mem=64 * 1024)
        except Exception as exc:
            assert 'CUDA_ERROR_INVALID_VALUE' in str(exc), exc
        else:
            raise AssertionError('a launch above 48 KB of dynamic shared memory needs the opt-in')
        kernel.launch(1, 256, args, shared_mem=64 * 1024)   # CudaKernel opts in first
        assert np.array_equal(dst, src)
        print('ok')
    ''')
    assert result.stdout.strip().endswith('ok'), result.stdout + result.stderr
