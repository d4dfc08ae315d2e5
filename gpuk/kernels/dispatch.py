"""Which implementation runs a kernel-family call: gpuk's handwritten kernel or cuDNN.

The choice is per family (``GPUK_KERNELS`` / ``gpuk.config.set_kernels``): 'gpuk', 'cudnn',
or 'auto' — time both once per problem (CUDA events, after a warm-up) and keep the faster.
cuDNN runs only on the CUDA runtime; a cuDNN function that cannot take a problem raises
``Unsupported`` and the call falls back to gpuk, saying so once per family and reason.
"""
import warnings

from gpuk import config
from gpuk.kernels import runtime
from gpuk.kernels.cudnn import library as cudnn
from gpuk.kernels.cudnn.library import Unsupported


_auto_choice = {}       # (family, problem key) -> 'gpuk' or 'cudnn'
_warned = set()         # (family, reason) already reported
_AUTO_REPEATS = 3


def _fallback(family, reason):
    if (family, reason) not in _warned:
        _warned.add((family, reason))
        warnings.warn('gpuk: cuDNN cannot run this %s problem (%s); using gpuk\'s kernel'
                      % (family, reason), RuntimeWarning, stacklevel=4)


def _time(fn, args, kwargs):
    import cupy
    fn(*args, **kwargs)  # warm-up: compiles, builds graphs, allocates
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(_AUTO_REPEATS):
        fn(*args, **kwargs)
    stop.record()
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop)


def _faster(gpuk_fn, cudnn_fn, args, kwargs):
    """'cudnn' when it is faster than gpuk on these arguments, else 'gpuk' (ties too).

    cuDNN is tried first, so a problem it cannot take costs no gpuk timing runs."""
    try:
        cudnn_ms = _time(cudnn_fn, args, kwargs)
    except Unsupported:
        return 'gpuk'
    return 'cudnn' if cudnn_ms < _time(gpuk_fn, args, kwargs) else 'gpuk'


def run(rt, family, problem_key, gpuk_fn, cudnn_fn, *args, **kwargs):
    """Calls the implementation chosen for ``family`` with ``args`` on the runtime ``rt`` (a
    runtime, a kind, or None for ``runtime.current()``): the one place that decides, so
    launchers never check the runtime kind themselves. Off the CUDA runtime gpuk's kernel runs.

    ``problem_key`` identifies the problem for 'auto' (shapes, dtypes, geometry);
    ``cudnn_fn`` may be None where cuDNN has no such operation.
    """
    # per launch: the common answers (not the CUDA runtime, or the family set to gpuk's
    # kernels, read in place) without a call; cudnn.choose handles the others
    if cudnn_fn is None or (getattr(rt, 'kind', None) or runtime.resolve(rt).kind) != 'cuda':
        return gpuk_fn(*args, **kwargs)
    if config._kernels.get(family) == 'gpuk':
        return gpuk_fn(*args, **kwargs)
    choice = cudnn.choose(family)
    if choice == 'gpuk':
        return gpuk_fn(*args, **kwargs)
    if choice == 'auto':
        key = (family, problem_key)
        if key not in _auto_choice:
            _auto_choice[key] = _faster(gpuk_fn, cudnn_fn, args, kwargs)
        if _auto_choice[key] == 'gpuk':
            return gpuk_fn(*args, **kwargs)
    try:
        return cudnn_fn(*args, **kwargs)
    except Unsupported as exc:
        _fallback(family, str(exc))
        return gpuk_fn(*args, **kwargs)
