"""GPU rehearsal: the `gpu` tests and the GPU benchmark rows on a host without a GPU.

    GPUK_GPU_REHEARSAL=1 python -m pytest -m gpu tests/kernels/test_pooling.py -x
    GPUK_GPU_REHEARSAL=1 python -m bench --quick          # results go to a scratch folder

With the switch set, tests/conftest.py and bench/conftest.py call ``activate()`` before
anything asks whether a GPU is usable. It

- puts a NumPy-backed stand-in for CuPy into ``sys.modules['cupy']`` (standin_cupy.py),
  so ``device.gpu_unusable_reason()`` reports a usable GPU and ``xp`` is "cupy" on 'cuda';
- serves the runtime kind 'cuda' with gpuk's own CudaRuntime whose modules come from the
  emulated runtime (rehearsal_runtime.py), so launchers take their CUDA paths and the
  kernels run in the emulator on the stand-in's arrays;
- keeps cuDNN unavailable (it needs a GPU): cuDNN rows and tests skip, 'cudnn'/'auto'
  choices fall back to gpuk's kernels as they do without cuDNN;
- turns K.function's CUDA Graph replay off unless GPUK_CUDA_GRAPHS is set: the stand-in's
  graphs replay only gpuk's launches, cuBLAS and copyto, not the NumPy work of ops computed
  with xp (see standin_cupy.py), so only tests that choose kernel-only steps turn it on.

Nothing here is imported without the switch, and gpuk/ has no rehearsal code: the
rehearsal is monkeypatching from the test side. What it proves: the Python of the CUDA
paths runs (names, shapes, host/device handling, dispatch, the tests' own logic); what it
cannot: real CUDA behaviour (asynchrony, alignment, the cubins NVRTC makes), cuDNN,
CuPy's exact API (test_cupy_conformance.py's job) and any timing.
"""
import os
import sys

SWITCH = 'GPUK_GPU_REHEARSAL'
CUDNN_REASON = 'GPU rehearsal: cuDNN needs a real GPU'
_state = {'active': False}


def requested():
    """True when the rehearsal switch is set (GPUK_GPU_REHEARSAL=1)."""
    value = os.environ.get(SWITCH, '').strip()
    if value not in ('', '0', '1'):
        raise ValueError('%s must be 0 or 1, got %r' % (SWITCH, value))
    return value == '1'


def active():
    return _state['active']


def activate():
    """Install the CuPy stand-in and the rehearsal CUDA runtime (idempotent; refuses a real CuPy)."""
    if _state['active']:
        return
    existing = sys.modules.get('cupy')
    if existing is not None and not getattr(existing, 'STANDIN', False):
        raise RuntimeError('%s=1 but the real CuPy is already imported; the rehearsal is for hosts '
                           'without a GPU' % SWITCH)
    from . import standin_cupy
    _, modules = standin_cupy.build_module()
    sys.modules.update(modules)

    from gpuk import device
    from gpuk.kernels import runtime
    from gpuk.kernels.cudnn import library as cudnn_library
    from gpuk.kernels.runtime import cuda_runtime
    from . import rehearsal_runtime
    # get_runtime('cuda') imports CudaRuntime from cuda_runtime each time it builds one
    cuda_runtime.CudaRuntime = rehearsal_runtime.RehearsalCudaRuntime
    runtime._runtimes.pop('cuda', None)
    # cuDNN is found by loading its library: make that fail with a reason that says why
    cudnn_library._load_library = lambda: (None, CUDNN_REASON)
    cudnn_library.reset_probe()
    device._state.update(kind=None, impl=None)
    os.environ.setdefault('GPUK_CUDA_GRAPHS', '0')
    _state['active'] = True


def activate_if_requested():
    """activate() when the switch is set; returns whether the rehearsal is active."""
    if requested():
        activate()
    return active()
