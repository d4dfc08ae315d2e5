"""The kernel runtime API every launcher uses.

    rt = runtime.current()                      # or runtime.get_runtime('emulate')
    module = rt.load(SOURCE, {'ELEMENT_T': 'float', 'THREADS': 256})
    module.kernel('copy_bytes').launch(grid, block, (src, dst, np.int64(n)))
    launch = rt.kernel_launch(SOURCE, defines, 'copy_bytes', grid, block)   # kept by a prepared
    launch((src, dst, np.int64(n)))                                         # problem (prepared.py)

Two implementations: 'cuda' (CuPy RawModule on the current stream) and 'emulate'
(the same .cu compiled with the host C++ compiler against an emulation of the CUDA
execution model, run on NumPy arrays). Neither is imported until asked for, so this
module and every launcher import without CuPy.

The current runtime is process-wide: gpuk.device calls `set_current(kind)` once; until
then `current()` follows GPUK_DEVICE (cuda, emulate/cpu, auto = cuda when usable).
"""
import contextlib
import importlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

import numpy as np

from gpuk import config
from gpuk.contracts.geometry import MAX_GRID_X, MAX_GRID_YZ
from . import counters
from .kernel_source import NVRTC_FLAGS, normalized_defines, source_key

RUNTIME_KINDS = ('cuda', 'emulate')
MAX_THREADS_PER_BLOCK = 1024


class KernelLaunchError(RuntimeError):
    """A kernel failed to launch or faulted while running (names kernel, grid, block, ...)."""

    def __init__(self, message, *, kernel=None, kind=None, block_idx=None, thread_idx=None,
                 argument=None, byte_offset=None):
        super().__init__(message)
        self.kernel, self.kind = kernel, kind
        self.block_idx, self.thread_idx = block_idx, thread_idx
        self.argument, self.byte_offset = argument, byte_offset


class KernelCompileError(RuntimeError):
    """The compiler rejected a kernel source (message carries the compiler's output)."""


# ---- runtimes ----
_runtimes = {}
_current = None
_lock = threading.Lock()


def get_runtime(kind):
    """The memoized runtime of `kind` ('cuda' or 'emulate')."""
    if kind not in RUNTIME_KINDS:
        raise ValueError(f"get_runtime: kind must be one of {RUNTIME_KINDS}, got {kind!r}")
    with _lock:
        if kind not in _runtimes:
            if kind == 'cuda':
                from .cuda_runtime import CudaRuntime
                _runtimes[kind] = CudaRuntime()
            else:
                from .emulated_runtime import EmulatedRuntime
                _runtimes[kind] = EmulatedRuntime()
        return _runtimes[kind]


def gpu_unusable_reason():
    """None when CuPy sees a usable GPU, else a sentence saying why not."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install raising anything
        return 'CuPy cannot be imported (%s: %s)' % (type(exc).__name__, exc)
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return 'the CUDA driver/runtime is not usable (%s: %s)' % (type(exc).__name__, exc)
    if count < 1:
        return 'CUDA reports no GPU'
    return None


def cuda_usable():
    """True when CuPy imports and sees at least one CUDA device."""
    return gpu_unusable_reason() is None


def set_current(kind):
    """Make `kind` ('cuda', 'emulate', or None to reset) the runtime launchers use by default.

    Returns the previous setting (a kind or None)."""
    global _current
    if kind is not None and kind not in RUNTIME_KINDS:
        raise ValueError(f"set_current: kind must be one of {RUNTIME_KINDS} or None, got {kind!r}")
    previous, _current = _current, kind
    return previous


def current_setting():
    """What set_current last set: a kind, or None when GPUK_DEVICE decides."""
    return _current


def current():
    """The runtime launchers use when not given one explicitly."""
    if _current is not None:
        # every launcher call asks: the memoized runtime without the lock (a dict read is atomic)
        return _runtimes.get(_current) or get_runtime(_current)
    wanted = config.requested_device()
    if wanted == 'cpu':   # the NumPy twins run no kernels: never a silent switch to the emulator
        raise RuntimeError("runtime.current: GPUK_DEVICE=cpu runs the NumPy twins, not the CUDA kernels; "
                           "pass runtime='emulate' or 'cuda', or set GPUK_DEVICE=emulate")
    if wanted == 'auto':
        wanted = 'cuda' if cuda_usable() else 'emulate'
    return get_runtime(wanted)


def resolve(rt):
    """A launcher's `runtime=` argument: None (current), a kind string, or a runtime."""
    if rt is None:
        return current()
    if isinstance(rt, str):
        return get_runtime(rt)
    if getattr(rt, 'kind', None) in RUNTIME_KINDS:
        return rt
    raise TypeError(f"runtime must be None, 'cuda', 'emulate' or a runtime object, got {rt!r}")


# ---- per-call launch checks: on, except inside a step already checked for its shapes ----
_prepared_depth = [0]
_forced = [os.environ.get('GPUK_CHECK_LAUNCHES', '').strip() == '1']


def check_launches_forced():
    """GPUK_CHECK_LAUNCHES=1, as read at import and at each prepared_launches() block."""
    return _forced[0]


def launch_checks_per_call():
    """True when launches check their dims, shared memory and arguments on this call: outside
    a prepared step, or always with GPUK_CHECK_LAUNCHES=1 (a debug switch)."""
    return not _prepared_depth[0] or _forced[0]


@contextlib.contextmanager
def prepared_launches(prepared=True):
    """The block re-runs launches already checked once (a plan step for the same input shapes
    and dtypes: same kernels, dims and argument types), so they skip their per-call checks.
    GPUK_CHECK_LAUNCHES=1 keeps them on; it is read when a block starts (``prepared=False``:
    a block that only reads it, for a step's first, checked run)."""
    previous = _forced[0]
    _forced[0] = os.environ.get('GPUK_CHECK_LAUNCHES', '').strip() == '1'
    depth = 0 if _forced[0] or not prepared else 1
    _prepared_depth[0] += depth
    try:
        yield
    finally:
        _prepared_depth[0] -= depth
        _forced[0] = previous


# ---- launch configuration and argument checks shared by both runtimes ----
def device_pointer(array):
    """The address of an array's buffer, as cuBLAS, cuDNN and the kernels' alignment tests take
    it: a CuPy array's device memory, or a NumPy array's host memory (the emulated runtime's
    arrays, the GPU rehearsal's stand-in arrays, a cuDNN Frontend graph's pass-by-value scalars)."""
    return array.ctypes.data if isinstance(array, np.ndarray) else array.data.ptr


def to_host(rt, value):
    """`value` as a NumPy array. Where it is an array of the runtime's `xp` (a device array on
    a GPU) this is a device-to-host copy that waits for the stream: counted in
    `rt.host_syncs`, so the emulated runtime counts the host syncs a launcher makes on a GPU."""
    # NumPy-backed runtimes hand out NumPy scalars where CuPy reductions give 0-d device arrays.
    device_types = (rt.xp.ndarray,) + ((np.generic,) if rt.xp.ndarray is np.ndarray else ())
    if isinstance(value, device_types) or (hasattr(value, 'get') and not isinstance(value, np.ndarray)):
        rt.host_syncs = getattr(rt, 'host_syncs', 0) + 1
        counters.host_sync()
        get = getattr(value, 'get', None)
        return get() if get is not None and not isinstance(value, np.ndarray) else np.asarray(value)
    return np.asarray(value)


def _dims(value, what, kernel):
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (value,)
    if not isinstance(value, (tuple, list)) or not 1 <= len(value) <= 3:
        raise ValueError(f"kernel '{kernel}': {what} must be an int or a tuple of 1 to 3 ints, got {value!r}")
    dims = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"kernel '{kernel}': {what} entries must be positive ints, got {value!r}")
        dims.append(int(v))
    return tuple(dims) + (1,) * (3 - len(dims))


def launch_dims(kernel, grid, block):
    grid, block = _dims(grid, 'grid', kernel), _dims(block, 'block', kernel)
    if block[0] * block[1] * block[2] > MAX_THREADS_PER_BLOCK or block[2] > 64:
        raise ValueError(f"kernel '{kernel}': block {block} exceeds {MAX_THREADS_PER_BLOCK} threads or z > 64")
    if grid[0] > MAX_GRID_X or grid[1] > MAX_GRID_YZ or grid[2] > MAX_GRID_YZ:
        raise ValueError(f"kernel '{kernel}': grid {grid} exceeds (2^31-1, {MAX_GRID_YZ}, {MAX_GRID_YZ})")
    return grid, block


def check_args(signature, args, array_type):
    """Validate launch arguments against the parsed kernel signature."""
    name, params = signature.name, signature.params
    if len(args) != len(params):
        raise TypeError(f"kernel '{name}': takes {len(params)} arguments "
                        f"({', '.join(p.name for p in params)}), got {len(args)}")
    for i, (p, a) in enumerate(zip(params, args)):
        where = f"kernel '{name}': argument {i} ({p.name}, '{p.c_type}')"
        if p.is_pointer:
            if not isinstance(a, array_type):
                raise TypeError(f"{where} must be a {array_type.__module__}.ndarray, got {type(a).__name__}")
            if not a.flags.c_contiguous:
                raise ValueError(f"{where} must be C-contiguous")
            if p.dtype is not None and a.dtype != p.dtype:
                raise TypeError(f"{where} must have dtype {p.dtype}, got {a.dtype}")
            # CuPy's ndarray.flags has no 'writeable' (device arrays are always writable)
            if not p.is_const and not getattr(a.flags, 'writeable', True):
                raise ValueError(f"{where} is written by the kernel but the array is read-only")
        else:
            if not isinstance(a, np.generic):  # np.float64 subclasses float: test np.generic
                raise TypeError(f"{where} must be a numpy.{p.dtype.type.__name__} scalar; got "
                                f"{type(a).__name__} (convert scalars to their C type in the launcher)")
            if a.dtype != p.dtype:
                raise TypeError(f"{where} must be numpy.{p.dtype.type.__name__}, got numpy.{a.dtype.type.__name__}")


def describe_launch(kernel, grid, block, shared_mem, args):
    shapes = ', '.join(f"{a.dtype}{list(a.shape)}" if hasattr(a, 'shape') and not isinstance(a, np.generic)
                       else repr(a) for a in args)
    return f"kernel '{kernel}' grid={grid} block={block} shared_mem={shared_mem} args=({shapes})"


# ---- ahead-of-time build registry ----
@dataclass(frozen=True)
class BuildSpec:
    """One variant the AOT build compiles: a source, its defines and the kernels in it."""
    source_file: str
    defines: Tuple[Tuple[str, str], ...]
    kernels: Tuple[str, ...]
    may_spill: bool = False
    archs: Optional[Tuple[str, ...]] = None   # None: every architecture built; else only these

    def build_archs(self, requested):
        """The architectures this variant is compiled for when ``requested`` are asked for: all of
        them, or for an arch-specific variant (archs=('sm_90a',)) its archs whose family
        (sm_90a -> sm_90) or exact name is requested."""
        if self.archs is None:
            return tuple(requested)
        return tuple(a for a in self.archs if a in requested or a.rstrip('a') in requested)

    @property
    def defines_dict(self):
        return dict(self.defines)


_builds = []


def register_build(source_file, defines, kernels, may_spill=False, archs=None):
    """Declare a variant for the ahead-of-time build (launchers call this at import). ``archs``:
    None for every architecture built, or the only ones this variant compiles for (a kernel
    using sm_90a instructions: ('sm_90a',))."""
    if isinstance(kernels, str) or not kernels or not all(isinstance(k, str) for k in kernels):
        raise TypeError(f"register_build: kernels must be a non-empty list of names, got {kernels!r}")
    archs = None if archs is None else tuple(normalize_arch(a) for a in archs)
    spec = BuildSpec(str(Path(source_file).resolve()), normalized_defines(defines), tuple(kernels), bool(may_spill),
                     archs)
    with _lock:
        if spec not in _builds:
            _builds.append(spec)
    return spec


def registered_builds():
    """Every registered variant, after importing all launchers in gpuk.kernels.LAUNCHERS."""
    from .. import LAUNCHERS
    for module in LAUNCHERS:
        importlib.import_module(module)
    with _lock:
        return list(_builds)


def cubin_dir():
    """Where prebuilt cubins live: $GPUK_CUBIN_DIR, else gpuk/kernels/prebuilt/."""
    return Path(os.environ.get('GPUK_CUBIN_DIR') or Path(__file__).resolve().parent.parent / 'prebuilt')


def normalize_arch(arch):
    """'sm_NN' (or 'sm_NNa', an architecture-specific target such as sm_90a) from 'sm_90', '90', 90."""
    text = str(arch).lower().replace('sm_', '').replace('compute_', '')
    if not (text.isdigit() or (text[:-1].isdigit() and text.endswith('a'))):
        raise ValueError(f"cubin_path: arch must look like 'sm_90', 'sm_90a' or 90, got {arch!r}")
    return f"sm_{text}"


def cubin_path(source_file, defines, arch):
    """Path of the prebuilt cubin for (source and its headers, defines, arch, NVRTC flags)."""
    arch = normalize_arch(arch)
    key = source_key(source_file, defines, arch, *NVRTC_FLAGS)
    return cubin_dir() / f"{Path(source_file).stem}-{key[:24]}-{arch}.cubin"


def cache_dir():
    """Root of gpuk's on-disk caches: $GPUK_CACHE_DIR, else ~/.cache/gpuk."""
    return Path(os.environ.get('GPUK_CACHE_DIR') or Path.home() / '.cache' / 'gpuk')
