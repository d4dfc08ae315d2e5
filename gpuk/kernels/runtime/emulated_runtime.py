"""The emulated runtime: .cu kernels compiled with the host C++ compiler, run on NumPy.

The source is compiled with g++ -std=c++17 against emulate/cuda_emu.h (force-included),
followed by a generated entry point per kernel that unpacks a void** argument array and
runs the grid (emulate/emu_host.h). Shared objects are cached on disk under
`cache_dir()/emulate`, keyed by the source, its headers, the emulation headers, the
defines and the compiler, and loaded with ctypes. Every array argument is copied into
its own guard-paged mapping so out-of-bounds accesses raise KernelLaunchError.
"""
import ctypes
import hashlib
import os
import re
import shlex
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

from .. import runtime
from .kernel_source import KERNELS_DIR, include_closure, memoized_digest, parse_kernel_signatures, render_defines, \
    source_key, strip_comments

EMULATE_DIR = Path(__file__).resolve().parent / 'emulate'
ABI_VERSION = 1
MAX_SHARED_MEM = 232448          # the sm_90 opt-in limit per block
CXX_FLAGS = ('-O2', '-std=c++17', '-fPIC', '-shared', '-pthread', '-fvisibility=hidden',
             '-fno-strict-aliasing', '-fstack-clash-protection', '-U_FORTIFY_SOURCE', '-w')
ERROR_KINDS = {1: 'out of bounds', 2: 'write to const', 3: 'stack overflow', 4: 'deadlock',
               5: 'invalid warp collective', 6: 'trap', 7: 'invalid address', 8: 'bad launch',
               9: 'internal', 10: 'arithmetic', 11: 'underflow write'}
SHARED_ARG = -2
ARG_POINTER, ARG_CONST = 1, 2

_EXTERN_SHARED = re.compile(
    r'extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?([A-Za-z_][\w\s]*?)\s+'
    r'(?:__align__\s*\(\s*\d+\s*\)\s+)?([A-Za-z_]\w*)\s*\[\s*\]\s*;')
# One emulated launch at a time per process: the fault handler is process-wide.
_LAUNCH_LOCK = threading.Lock()


class _Arg(ctypes.Structure):
    _fields_ = [('host', ctypes.c_void_p), ('nbytes', ctypes.c_uint64), ('itemsize', ctypes.c_uint32),
                ('flags', ctypes.c_uint32), ('alias_of', ctypes.c_int32), ('pad', ctypes.c_int32)]


class _Config(ctypes.Structure):
    _fields_ = [('grid', ctypes.c_uint32 * 3), ('block', ctypes.c_uint32 * 3), ('shared_mem', ctypes.c_uint64),
                ('host_threads', ctypes.c_uint32), ('reverse_order', ctypes.c_uint32),
                ('stack_bytes', ctypes.c_uint64)]


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
        c_args, keep_alive = self._marshal(args)
        order = os.environ.get('GPUK_EMULATE_ORDER', 'forward').strip() or 'forward'
        if order not in ('forward', 'reverse'):
            raise ValueError(f"GPUK_EMULATE_ORDER must be 'forward' or 'reverse', got {order!r}")
        config = _Config((ctypes.c_uint32 * 3)(*grid), (ctypes.c_uint32 * 3)(*block), int(shared_mem),
                         _env_int('GPUK_EMULATE_THREADS', 1, 1), int(order == 'reverse'),
                         _env_int('GPUK_EMULATE_STACK_KB', 64, 16) * 1024)
        error = _Error()
        with _LAUNCH_LOCK:
            status = self._function(ctypes.byref(config), c_args, len(args), ctypes.byref(error))
        del keep_alive
        if status:
            raise self._error(error, grid, block, shared_mem, args)

    def _marshal(self, args):
        c_args = (_Arg * max(1, len(args)))()
        keep_alive = []
        seen = {}
        spans = []
        for i, (p, a) in enumerate(zip(self.signature.params, args)):
            if p.is_pointer:
                ptr, nbytes = a.ctypes.data, a.nbytes
                alias = seen.get((ptr, nbytes), -1) if nbytes else -1
                if alias < 0 and nbytes:
                    for j, (lo, hi) in spans:
                        if ptr < hi and lo < ptr + nbytes:
                            raise ValueError(f"kernel '{self.name}': arguments {j} and {i} partly overlap; the "
                                             f"emulator supports identical or disjoint buffers only")
                    seen[(ptr, nbytes)] = i
                    spans.append((i, (ptr, ptr + nbytes)))
                if alias >= 0 and not p.is_const:
                    c_args[alias].flags &= ~ARG_CONST   # the shared region is written through arg i
                flags = ARG_POINTER | (ARG_CONST if p.is_const else 0)
                c_args[i] = _Arg(ptr, nbytes, a.itemsize, flags, alias, 0)
            else:
                value = np.array(a)
                keep_alive.append(value)
                c_args[i] = _Arg(value.ctypes.data, value.nbytes, value.itemsize, 0, -1, 0)
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
        block_idx = tuple(e.block) if e.has_location else None
        thread_idx = tuple(e.thread) if e.has_location else None
        where = f" in block {block_idx} thread {thread_idx}" if e.has_location else ''
        text = f"{runtime.describe_launch(self.name, grid, block, shared_mem, args)}: {message}{where} (emulated)"
        return runtime.KernelLaunchError(text, kernel=self.name, kind=ERROR_KINDS.get(e.kind, 'internal'),
                                         block_idx=block_idx, thread_idx=thread_idx, argument=argument,
                                         byte_offset=int(e.byte_offset) if argument else None)


class EmulatedModule:
    def __init__(self, source_file, defines, library_path, signatures):
        self.source_file, self.defines, self.path = source_file, dict(defines), library_path
        self.signatures = signatures
        self._lib = ctypes.CDLL(str(library_path))
        if self._lib.gpuk_emu_abi_version() != ABI_VERSION:
            raise RuntimeError(f"{library_path}: emulator ABI mismatch; delete the cache directory")
        self._kernels = {}

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
    xp = np

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

    def module_key(self, source_file, defines):
        def emulation_headers():
            headers = sorted(EMULATE_DIR.glob('*.h'))
            return [EMULATE_DIR] + headers, hashlib.sha256(b''.join(p.read_bytes() for p in headers)).hexdigest()
        emu = memoized_digest('emulation headers', emulation_headers)
        return source_key(source_file, defines, 'emulate', ABI_VERSION, emu, self.compiler_id(), CXX_FLAGS)

    def load(self, source_file, defines=None):
        """Compile (or fetch from the caches) `source_file` with `defines`; returns a module."""
        defines = dict(defines or {})
        key = self.module_key(source_file, defines)   # memoized: no file read on a hit
        with self._lock:
            module = self._modules.get(key)
            if module is None:
                source_file = Path(source_file).resolve()
                signatures = parse_kernel_signatures(source_file, defines)
                library = self._build(source_file, defines, signatures, key)
                module = self._modules[key] = EmulatedModule(source_file, defines, library, signatures)
        return module

    def _build(self, source_file, defines, signatures, key):
        out_dir = runtime.cache_dir() / 'emulate'
        library = out_dir / f"{source_file.stem}-{key[:24]}.so"
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
        command = shlex.split(self.cxx) + list(CXX_FLAGS) + [
            '-include', str(EMULATE_DIR / 'cuda_emu.h'), f'-I{source_file.parent}', f'-I{KERNELS_DIR}',
            str(cpp), '-o', tmp]
        try:
            result = subprocess.run(command, capture_output=True, text=True)
            self.compile_count += 1
            if result.returncode != 0:
                raise runtime.KernelCompileError(
                    f"emulated runtime: compiling {source_file.name} with defines {defines} failed:\n"
                    f"{result.stderr[-6000:]}\ncommand: {' '.join(command)}")
            os.replace(tmp, library)   # atomic: concurrent builders never see a half-written file
        finally:
            for leftover in (tmp, cpp):
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
