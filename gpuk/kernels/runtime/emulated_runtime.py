"""The emulated runtime: .cu kernels compiled with the host C++ compiler, run on NumPy.

The source is compiled with g++ -std=c++17 against emulate/cuda_emu.h (force-included),
followed by a generated entry point per kernel that unpacks a void** argument array and
runs the grid (emulate/emu_host.h). Shared objects are cached on disk under
`cache_dir()/emulate`, keyed by the source, its headers, the emulation headers, the
defines and the compiler, and loaded with ctypes. Every array argument is copied into
its own guard-paged mapping so out-of-bounds accesses raise KernelLaunchError.

With GPUK_EMU_SANITIZE=1 (on in tests/kernels) modules are built instrumented: every memory
access of the kernel code reaches emu_host.h's hooks, which run racecheck, initcheck,
cp.async-landing and synccheck checks; `counting()` collects per-launch performance counters
from the same builds (gpuk.kernels.inspect.emulated). See docs/kernels.md.
"""
import ctypes
import hashlib
import os
import re
import shlex
import subprocess
import tempfile
import threading
import types
import weakref
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .. import runtime
from .kernel_source import KERNELS_DIR, include_closure, memoized_digest, parse_kernel_signatures, render_defines, \
    source_key, strip_comments

EMULATE_DIR = Path(__file__).resolve().parent / 'emulate'
ABI_VERSION = 2
MAX_SHARED_MEM = 232448          # the sm_90 opt-in limit per block
CXX_FLAGS = ('-O2', '-std=c++17', '-fPIC', '-shared', '-pthread', '-fvisibility=hidden',
             '-fno-strict-aliasing', '-fstack-clash-protection', '-U_FORTIFY_SOURCE', '-w')
ERROR_KINDS = {1: 'out of bounds', 2: 'write to const', 3: 'stack overflow', 4: 'deadlock',
               5: 'invalid warp collective', 6: 'trap', 7: 'invalid address', 8: 'bad launch',
               9: 'internal', 10: 'arithmetic', 11: 'underflow write', 12: 'racecheck', 13: 'initcheck',
               14: 'cp.async', 15: 'synccheck', 16: 'wgmma'}
# Instrumented builds: -fsanitize=thread only inserts the access hooks (emu_host.h defines
# them; libtsan is not linked), so the object is compiled and linked in two steps.
SANITIZE_FLAGS = ('-fsanitize=thread', '--param', 'tsan-instrument-func-entry-exit=0', '-DGPUK_EMU_INSTRUMENTED=1')
CHECK_MEMORY, CHECK_COUNTERS = 1, 2
POISON_BYTE = 0xA5   # what runtime-allocated (empty) arrays hold until written, under the sanitizer
SHARED_ARG, STATIC_SHARED_ARG = -2, -3
ARG_POINTER, ARG_CONST = 1, 2

_EXTERN_SHARED = re.compile(
    r'extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?([A-Za-z_][\w\s]*?)\s+'
    r'(?:__align__\s*\(\s*\d+\s*\)\s+)?([A-Za-z_]\w*)\s*\[\s*\]\s*;')
# One emulated launch at a time per process: the fault handler is process-wide.
_LAUNCH_LOCK = threading.Lock()


class _Arg(ctypes.Structure):
    _fields_ = [('host', ctypes.c_void_p), ('nbytes', ctypes.c_uint64), ('itemsize', ctypes.c_uint32),
                ('flags', ctypes.c_uint32), ('alias_of', ctypes.c_int32), ('pad', ctypes.c_int32),
                ('init_mask', ctypes.c_void_p)]


COUNTER_FIELDS = ('global_requests', 'global_sectors', 'global_ideal_sectors', 'global_load_bytes',
                  'global_store_bytes', 'shared_requests', 'shared_wavefronts', 'shared_ideal_wavefronts',
                  'shared_bytes', 'barriers', 'atomics', 'collectives')


class _Counters(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in COUNTER_FIELDS]


class _Config(ctypes.Structure):
    _fields_ = [('grid', ctypes.c_uint32 * 3), ('block', ctypes.c_uint32 * 3), ('shared_mem', ctypes.c_uint64),
                ('host_threads', ctypes.c_uint32), ('reverse_order', ctypes.c_uint32),
                ('stack_bytes', ctypes.c_uint64), ('checks', ctypes.c_uint32), ('n_tls_ignore', ctypes.c_uint32),
                ('counters', ctypes.POINTER(_Counters)), ('tls_ignore', ctypes.POINTER(ctypes.c_uint64))]


class _Error(ctypes.Structure):
    _fields_ = [('kind', ctypes.c_int32), ('arg_index', ctypes.c_int32), ('byte_offset', ctypes.c_int64),
                ('access', ctypes.c_int32), ('has_location', ctypes.c_int32), ('block', ctypes.c_uint32 * 3),
                ('thread', ctypes.c_uint32 * 3), ('message', ctypes.c_char * 768)]


def rewrite_dynamic_shared(text, where):
    """`extern __shared__ T name[];` -> a pointer to the launch's dynamic shared memory.

    Offsets are taken on the comment-stripped text (same length) so comments are ignored;
    the declaration must sit inside a function, as the emulator resolves it per block."""
    stripped = strip_comments(text)
    out, last = [], 0
    for m in _EXTERN_SHARED.finditer(stripped):
        depth = stripped.count('{', 0, m.start()) - stripped.count('}', 0, m.start())
        if depth <= 0:
            line = stripped.count('\n', 0, m.start()) + 1
            raise ValueError(f"{where}:{line}: the emulator needs `extern __shared__` declared inside the kernel body")
        ctype, name = ' '.join(m.group(1).split()), m.group(2)
        out.append(text[last:m.start()])
        out.append(f"{ctype}* const {name} = reinterpret_cast<{ctype}*>(::gpuk_emu::dynamic_shared_base());")
        out.append('\n' * stripped.count('\n', m.start(), m.end()))
        last = m.end()
    out.append(text[last:])
    return ''.join(out)


def sanitize_enabled():
    """GPUK_EMU_SANITIZE=1: instrumented builds with the memory checks (tests/kernels turns it on)."""
    raw = os.environ.get('GPUK_EMU_SANITIZE', '').strip()
    if raw not in ('', '0', '1'):
        raise ValueError(f"GPUK_EMU_SANITIZE must be 0 or 1, got {raw!r}")
    return raw == '1'


_collector = None   # the list counting() appends launch records to, while active


@contextmanager
def counting():
    """Collects one record per emulated launch (kernel, defines, grid, counters) while active.

    Modules loaded meanwhile are the instrumented builds; the memory checks stay as
    GPUK_EMU_SANITIZE says. Not reentrant, one collector per process."""
    global _collector
    if _collector is not None:
        raise RuntimeError('emulated_runtime.counting() is already active')
    _collector = records = []
    try:
        yield records
    finally:
        _collector = None


# ---- initcheck of global memory: arrays the runtime allocated uninitialized ----
# The emulated runtime's xp is NumPy with empty/empty_like wrapped: under the sanitizer their
# arrays are filled with POISON_BYTE and remembered (weakly); at a launch, an element of such
# an array whose bytes all still hold the poison counts as never written. Host writes
# (fill, copies) change the bytes and so count as writes; writing the poison itself is
# indistinguishable (0xA5A5A5A5 is -2.9e-16 as float32, -0.022 as float16).
_poisoned = {}   # id -> (weakref, first byte address, nbytes)


def _remember_poisoned(array):
    if sanitize_enabled() and array.nbytes:
        array.ravel(order='K').view(np.uint8).fill(POISON_BYTE)   # fresh arrays are contiguous: a view
        key = id(array)
        _poisoned[key] = (weakref.ref(array, lambda _, k=key: _poisoned.pop(k, None)), array.ctypes.data, array.nbytes)
    return array


# Device allocations start on DEVICE_ALIGNMENT bytes (CuPy's pool hands out 512-byte
# blocks, cudaMalloc 256 bytes); NumPy's host allocator gives 16. Arrays of the emulated
# runtime's xp.empty / empty_like start on this boundary too, so that the counters see the
# sectors a launch moves on a GPU (a 16-byte offset splits every row a kernel aligned).
DEVICE_ALIGNMENT = 256
MAX_WORKERS = 64   # host threads a launch runs its blocks on at most (emu_host.h takes worker_count())


def _aligned_empty(shape, dtype=float, order='C'):
    if order not in ('C', 'A', 'K'):
        return np.empty(shape, dtype, order)
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + DEVICE_ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % DEVICE_ALIGNMENT
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def _aligned_empty_like(prototype, dtype=None, order='K', subok=True, shape=None):
    if order == 'F' or (order in ('A', 'K') and not prototype.flags.c_contiguous and prototype.ndim > 1):
        return np.empty_like(prototype, dtype, order, subok, shape)   # keeps a Fortran / strided layout
    return _aligned_empty(prototype.shape if shape is None else shape, prototype.dtype if dtype is None else dtype)


def aligned_copy(array):
    """A copy of host ``array`` where a device array would live (DEVICE_ALIGNMENT), counted as
    written: inputs for measurements and tests (a poisoned xp.empty filled on the host would
    flag every element whose bytes happen to equal the poison, e.g. a uint8 0xA5)."""
    array = np.asarray(array)
    out = _aligned_empty(array.shape, array.dtype)
    out[...] = array
    return out


def _poisoned_empty(*args, **kwargs):
    return _remember_poisoned(_aligned_empty(*args, **kwargs))


def _poisoned_empty_like(*args, **kwargs):
    return _remember_poisoned(_aligned_empty_like(*args, **kwargs))


def _make_xp():
    xp = types.ModuleType('numpy', 'NumPy, with empty/empty_like device-aligned and poisoned under the sanitizer')
    xp.__getattr__ = lambda name: getattr(np, name)
    xp.empty, xp.empty_like = _poisoned_empty, _poisoned_empty_like
    return xp


def init_mask(array):
    """uint8 per byte of `array` (1 = written), or None when every byte counts as written."""
    lo, hi = array.ctypes.data, array.ctypes.data + array.nbytes
    if not _poisoned or not array.nbytes:
        return None
    owner = next((key for key, (_, base, n) in list(_poisoned.items()) if base <= lo and hi <= base + n), None)
    if owner is None:
        return None
    elements = array.reshape(-1).view(np.uint8).reshape(array.size, array.itemsize)
    written = ~(elements == POISON_BYTE).all(axis=1)
    if written.all():
        entry = _poisoned.get(owner)
        if entry is not None and (entry[1], entry[2]) == (lo, array.nbytes):
            _poisoned.pop(owner, None)   # wholly written: no longer checked
        return None
    return np.ascontiguousarray(np.repeat(written, array.itemsize).astype(np.uint8))


def worker_count():
    """The host threads a launch runs its blocks on: GPUK_EMULATE_THREADS (default 1), at most
    MAX_WORKERS. The one cap: emu_host.h starts as many workers as it is given (fewer only
    when the grid has fewer blocks)."""
    return min(_env_int('GPUK_EMULATE_THREADS', 1, 1), MAX_WORKERS)


def _env_int(name, default, minimum):
    raw = os.environ.get(name, '').strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {raw!r}")
    return int(raw)


class EmulatedKernel:
    def __init__(self, module, signature, function):
        self.module, self.signature, self.name = module, signature, signature.name
        self._function = function

    def launch(self, grid, block, args, shared_mem=0):
        """Run the grid to completion on the host; array arguments are updated in place."""
        grid, block = runtime.launch_dims(self.name, grid, block)
        if isinstance(shared_mem, bool) or not isinstance(shared_mem, (int, np.integer)) \
                or not 0 <= shared_mem <= MAX_SHARED_MEM:
            raise ValueError(f"kernel '{self.name}': shared_mem must be an int in [0, {MAX_SHARED_MEM}], "
                             f"got {shared_mem!r}")
        args = tuple(args)
        runtime.check_args(self.signature, args, np.ndarray)
        instrumented = self.module.instrumented
        checks = (CHECK_MEMORY if instrumented and sanitize_enabled() else 0) | \
                 (CHECK_COUNTERS if instrumented and _collector is not None else 0)
        c_args, keep_alive = self._marshal(args, checks & CHECK_MEMORY)
        order = os.environ.get('GPUK_EMULATE_ORDER', 'forward').strip() or 'forward'
        if order not in ('forward', 'reverse'):
            raise ValueError(f"GPUK_EMULATE_ORDER must be 'forward' or 'reverse', got {order!r}")
        config = _Config((ctypes.c_uint32 * 3)(*grid), (ctypes.c_uint32 * 3)(*block), int(shared_mem),
                         worker_count(), int(order == 'reverse'),
                         _env_int('GPUK_EMULATE_STACK_KB', 64, 16) * 1024, checks)
        counters = _Counters()
        if checks:
            config.tls_ignore, config.n_tls_ignore = self.module.tls_ignore()
        if checks & CHECK_COUNTERS:
            config.counters = ctypes.pointer(counters)
        error = _Error()
        with _LAUNCH_LOCK:
            status = self._function(ctypes.byref(config), c_args, len(args), ctypes.byref(error))
        del keep_alive
        if status:
            raise self._error(error, grid, block, shared_mem, args)
        if checks & CHECK_COUNTERS and _collector is not None:
            _collector.append({'kernel': self.name, 'source': self.module.source_file, 'defines': self.module.defines,
                               'grid': grid, 'block': block, 'shared_mem': int(shared_mem),
                               'arrays': [(p.name, a.nbytes, a.size, p.is_const)
                                          for p, a in zip(self.signature.params, args) if p.is_pointer],
                               **{name: int(getattr(counters, name)) for name in COUNTER_FIELDS}})

    def coresident_blocks(self, threads_per_block, shared_mem=0):
        """How many blocks of this kernel run at once: the emulator's worker threads
        (worker_count()), each running one block to its end; a grid-wide barrier is safe up to
        this many blocks."""
        return worker_count()

    def _marshal(self, args, check_init):
        c_args = (_Arg * max(1, len(args)))()
        keep_alive = []
        seen = {}
        spans, overlaps = [], []
        for i, (p, a) in enumerate(zip(self.signature.params, args)):
            if p.is_pointer:
                ptr, nbytes = a.ctypes.data, a.nbytes
                alias = seen.get((ptr, nbytes), -1) if nbytes else -1
                if alias < 0 and nbytes:
                    overlaps += [(j, i) for j, (lo, hi) in spans if ptr < hi and lo < ptr + nbytes]
                    seen[(ptr, nbytes)] = i
                    spans.append((i, (ptr, ptr + nbytes)))
                if alias >= 0 and not p.is_const:
                    c_args[alias].flags &= ~ARG_CONST   # the shared region is written through arg i
                flags = ARG_POINTER | (ARG_CONST if p.is_const else 0)
                mask = init_mask(a) if check_init and alias < 0 else None
                if mask is not None:
                    keep_alive.append(mask)
                c_args[i] = _Arg(ptr, nbytes, a.itemsize, flags, alias, 0, None if mask is None else mask.ctypes.data)
            else:
                value = np.array(a)
                keep_alive.append(value)
                c_args[i] = _Arg(value.ctypes.data, value.nbytes, value.itemsize, 0, -1, 0)
        for j, i in overlaps:   # each gets a copy of its own: right only while none is written
            if not c_args[j].flags & c_args[i].flags & ARG_CONST:
                raise ValueError(f"kernel '{self.name}': arguments {j} and {i} partly overlap and one is written; "
                                 f"the emulator supports identical or disjoint buffers only, or read-only ones")
        return c_args, keep_alive

    def _error(self, e, grid, block, shared_mem, args):
        params = self.signature.params
        message = e.message.decode(errors='replace')
        argument = None
        if 0 <= e.arg_index < len(params):
            argument = params[e.arg_index].name
            message = message.replace(f"argument #{e.arg_index}", f"argument {e.arg_index} ({argument})")
        elif e.arg_index == SHARED_ARG:
            argument = 'dynamic shared memory'
        elif e.arg_index == STATIC_SHARED_ARG:
            argument = 'static __shared__ memory'
            symbol = self.module.static_shared_name(int(e.byte_offset))
            if symbol:
                message = message.replace(f'static __shared__ memory at byte offset {int(e.byte_offset)}',
                                          f'static __shared__ {symbol} (TLS offset {int(e.byte_offset)})')
        block_idx = tuple(e.block) if e.has_location else None
        thread_idx = tuple(e.thread) if e.has_location else None
        where = f" in block {block_idx} thread {thread_idx}" if e.has_location else ''
        text = f"{runtime.describe_launch(self.name, grid, block, shared_mem, args)}: {message}{where} (emulated)"
        return runtime.KernelLaunchError(text, kernel=self.name, kind=ERROR_KINDS.get(e.kind, 'internal'),
                                         block_idx=block_idx, thread_idx=thread_idx, argument=argument,
                                         byte_offset=int(e.byte_offset) if argument else None)


class EmulatedModule:
    def __init__(self, source_file, defines, library_path, signatures, instrumented=False):
        self.source_file, self.defines, self.path = source_file, dict(defines), library_path
        self.instrumented = instrumented
        self._tls_symbols = self._tls_ignore = None
        self.signatures = signatures
        self._lib = ctypes.CDLL(str(library_path))
        if self._lib.gpuk_emu_abi_version() != ABI_VERSION:
            raise RuntimeError(f"{library_path}: emulator ABI mismatch; delete the cache directory")
        self._kernels = {}

    def tls_symbols(self):
        """[(offset, size, demangled name)] of the module's thread-local variables: its static
        __shared__ arrays, the emulator's own state and C++ guard variables (from readelf)."""
        if self._tls_symbols is None:
            try:
                out = subprocess.run(['readelf', '-sW', '-C', str(self.path)], capture_output=True, text=True,
                                     check=True).stdout
            except (OSError, subprocess.CalledProcessError) as exc:
                raise RuntimeError(f"{self.path}: the sanitizer needs readelf (binutils) to read the module's "
                                   f"thread-local symbols: {exc}")
            symbols = []
            for line in out.splitlines():
                parts = line.split(None, 7)
                if len(parts) == 8 and parts[3] == 'TLS':
                    symbols.append((int(parts[1], 16), int(parts[2], 0), parts[7]))
            self._tls_symbols = symbols
        return self._tls_symbols

    def tls_ignore(self):
        """(uint64 array of (offset, size) pairs, count): thread-locals the sanitizer must not
        take for __shared__ memory: C++ guard variables."""
        if self._tls_ignore is None:
            pairs = [v for offset, size, name in self.tls_symbols() if name.startswith('guard variable for')
                     for v in (offset, size)]
            self._tls_ignore = ((ctypes.c_uint64 * max(1, len(pairs)))(*pairs), len(pairs) // 2)
        return self._tls_ignore

    def static_shared_name(self, offset):
        """'`kernel::array` byte N' for a byte offset into the thread-local block, or ''."""
        for start, size, name in self.tls_symbols():
            if start <= offset < start + size and 'gpuk_emu' not in name:
                return f"`{name}` byte {offset - start}"
        return ''

    def kernel(self, name):
        if name not in self.signatures:
            raise ValueError(f"kernel: {Path(self.source_file).name} has no kernel {name!r}; "
                             f"it has {sorted(self.signatures)}")
        if name not in self._kernels:
            fn = getattr(self._lib, f"gpuk_emu_run_{name}")
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.POINTER(_Config), ctypes.POINTER(_Arg), ctypes.c_int, ctypes.POINTER(_Error)]
            self._kernels[name] = EmulatedKernel(self, self.signatures[name], fn)
        return self._kernels[name]


class EmulatedRuntime:
    kind = 'emulate'
    xp = _make_xp()
    host_syncs = 0      # device-to-host copies launchers made through runtime.to_host
    l2_bytes = 50 * 1024 * 1024   # the L2 a launcher plans for: an H100's (CudaRuntime asks the device)

    def __init__(self):
        self.cxx = os.environ.get('GPUK_CXX') or os.environ.get('CXX') or 'g++'
        self._compiler_id = None
        self._modules = {}
        self._lock = threading.Lock()
        self.compile_count = 0      # how many times this process ran the compiler (tests read it)

    def compiler_id(self):
        if self._compiler_id is None:
            try:
                out = subprocess.run(shlex.split(self.cxx) + ['--version'], capture_output=True, text=True, check=True)
            except (OSError, subprocess.CalledProcessError) as exc:
                raise runtime.KernelCompileError(f"emulated runtime: cannot run the C++ compiler {self.cxx!r}: {exc}")
            self._compiler_id = out.stdout.splitlines()[0] if out.stdout else self.cxx
        return self._compiler_id

    @staticmethod
    def instrumented():
        """Whether modules loaded now are the instrumented builds (sanitizer or counters on)."""
        return sanitize_enabled() or _collector is not None

    def module_key(self, source_file, defines, instrumented=False):
        def emulation_headers():
            headers = sorted(EMULATE_DIR.glob('*.h'))
            return [EMULATE_DIR] + headers, hashlib.sha256(b''.join(p.read_bytes() for p in headers)).hexdigest()
        emu = memoized_digest('emulation headers', emulation_headers)
        flags = CXX_FLAGS + (SANITIZE_FLAGS if instrumented else ())
        return source_key(source_file, defines, 'emulate', ABI_VERSION, emu, self.compiler_id(), flags)

    def kernel_launch(self, source_file, defines, name, grid, block, shared_mem=0, arch=None):
        """What CudaRuntime.kernel_launch gives, for the emulator: ``launch(args)`` loads the
        module on every call (which build it is, instrumented or not, follows the sanitizer and
        counters switches of the moment) and checks and runs the launch as EmulatedKernel.launch."""
        defines = dict(defines or {})

        def launch(args):
            self.load(source_file, defines, arch).kernel(name).launch(grid, block, args, shared_mem)
        return launch

    def load(self, source_file, defines=None, arch=None):
        """Compile (or fetch from the caches) `source_file` with `defines`; returns a module.
        ``arch`` (the CUDA runtime's target override, e.g. 'sm_90a') changes nothing here."""
        defines = dict(defines or {})
        instrumented = self.instrumented()
        key = self.module_key(source_file, defines, instrumented)   # memoized: no file read on a hit
        with self._lock:
            module = self._modules.get(key)
            if module is None:
                source_file = Path(source_file).resolve()
                signatures = parse_kernel_signatures(source_file, defines)
                library = self._build(source_file, defines, signatures, key, instrumented)
                module = self._modules[key] = EmulatedModule(source_file, defines, library, signatures, instrumented)
        return module

    def _build(self, source_file, defines, signatures, key, instrumented=False):
        out_dir = runtime.cache_dir() / 'emulate'
        library = out_dir / f"{source_file.stem}{'-san' if instrumented else ''}-{key[:24]}.so"
        if library.exists():
            return library
        out_dir.mkdir(parents=True, exist_ok=True)
        for header in include_closure(source_file)[1:]:
            if _EXTERN_SHARED.search(strip_comments(header.read_text())):
                raise ValueError(f"{header.name}: `extern __shared__` belongs in kernels (.cu), not headers")
        text = (render_defines(defines) + f'#line 1 "{source_file}"\n'
                + rewrite_dynamic_shared(source_file.read_text(), source_file.name)
                + '\n' + self._entry_points(signatures))
        fd, tmp = tempfile.mkstemp(prefix=library.stem + '-', suffix='.so', dir=out_dir)
        os.close(fd)
        cpp = Path(tmp).with_suffix('.cpp')
        cpp.write_text(text)
        include = ['-include', str(EMULATE_DIR / 'cuda_emu.h'), f'-I{source_file.parent}', f'-I{KERNELS_DIR}']
        obj = Path(tmp).with_suffix('.o')
        if instrumented:   # instrument when compiling; link without libtsan (emu_host.h has the hooks)
            commands = [shlex.split(self.cxx) + [f for f in CXX_FLAGS if f != '-shared'] + list(SANITIZE_FLAGS)
                        + include + ['-c', str(cpp), '-o', str(obj)],
                        shlex.split(self.cxx) + ['-shared', '-pthread', str(obj), '-o', tmp]]
        else:
            commands = [shlex.split(self.cxx) + list(CXX_FLAGS) + include + [str(cpp), '-o', tmp]]
        try:
            for command in commands:
                result = subprocess.run(command, capture_output=True, text=True)
                if result.returncode != 0:
                    break
            self.compile_count += 1
            if result.returncode != 0:
                raise runtime.KernelCompileError(
                    f"emulated runtime: compiling {source_file.name} with defines {defines} failed:\n"
                    f"{result.stderr[-6000:]}\ncommand: {' '.join(command)}")
            os.replace(tmp, library)   # atomic: concurrent builders never see a half-written file
        finally:
            for leftover in (tmp, cpp, obj):
                if os.path.exists(leftover):
                    os.unlink(leftover)
        return library

    @staticmethod
    def _entry_points(signatures):
        lines = ['#line 1 "gpuk-emulate-entry-points"', f'#include "{EMULATE_DIR / "emu_host.h"}"']
        for name, sig in signatures.items():
            fn = f"decltype(&{name})"
            lines.append(f"static_assert(::gpuk_emu::fn_traits<{fn}>::arity == {len(sig.params)}, "
                         f"\"kernel {name}: the signature parser found {len(sig.params)} parameters\");")
            for i, p in enumerate(sig.params):
                size = 0 if p.is_pointer else p.dtype.itemsize
                lines.append(f"static_assert(::gpuk_emu::param_is<{fn}, {i}>({str(p.is_pointer).lower()}, {size}), "
                             f"\"kernel {name}: parameter {i} ({p.name}) is not the parsed '{p.c_type}'\");")
            lines.append(f"static void gpuk_emu_thunk_{name}(void** a) {{ ::gpuk_emu::invoke(&{name}, a); }}")
            lines.append(f'extern "C" __attribute__((visibility("default"))) int gpuk_emu_run_{name}('
                         f"const gpuk_emu_config* c, gpuk_emu_arg* a, int n, gpuk_emu_error* e) "
                         f"{{ return ::gpuk_emu::launch(c, a, n, e, &gpuk_emu_thunk_{name}); }}")
        return '\n'.join(lines) + '\n'

    def synchronize(self):
        """Launches are synchronous in the emulator; present for API symmetry with CUDA."""
