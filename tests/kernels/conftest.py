import os

import pytest

from gpuk.kernels import runtime

KERNEL_RUNTIMES = ['emulate', pytest.param('cuda', marks=pytest.mark.gpu)]


@pytest.fixture(scope='session', autouse=True)
def _kernel_cache_dir(tmp_path_factory):
    """Compile into a fresh per-session cache (each emulated module builds in < 1 s)."""
    if os.environ.get('GPUK_CACHE_DIR'):
        yield
        return
    os.environ['GPUK_CACHE_DIR'] = str(tmp_path_factory.mktemp('gpuk-cache'))
    try:
        yield
    finally:
        os.environ.pop('GPUK_CACHE_DIR', None)


@pytest.fixture(params=KERNEL_RUNTIMES)
def kernel_runtime(request):
    """Each kernel runtime: 'emulate' always, 'cuda' where a GPU is usable."""
    if request.param == 'cuda' and not runtime.cuda_usable():
        pytest.skip('no usable CUDA GPU')
    return runtime.get_runtime(request.param)


@pytest.fixture
def emulator():
    return runtime.get_runtime('emulate')
