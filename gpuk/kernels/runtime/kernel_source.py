"""Kernel sources as text: defines, include closure and hashing, kernel signatures.

Shared by the CUDA and emulated runtimes and by the ahead-of-time build, so that all
three compile the same text and agree on cache keys.
"""
import hashlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

import ml_dtypes
import numpy as np

KERNELS_DIR = Path(__file__).resolve().parent.parent    # gpuk/kernels: the .cu sources and common.cuh
# The NVRTC flags that shape the machine code (include paths aside). Every compile uses them
# (build.NVRTC_OPTIONS adds the include path), and cubin names hash them, so changing one
# never loads a cubin compiled without it.
NVRTC_FLAGS = ('-std=c++17',)

_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)
_DEFINE = re.compile(r'^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)[ \t]+([^\n]+?)[ \t]*$', re.M)
_TYPEDEF = re.compile(r'^[ \t]*typedef[ \t]+([A-Za-z_][\w \t]*?)[ \t]+([A-Za-z_]\w*)[ \t]*;', re.M)
_IDENT = re.compile(r'^[A-Za-z_]\w*$')

# C scalar type -> numpy dtype. bfloat16 is ml_dtypes.bfloat16 (the type CuPy and NumPy
# arrays use for it); uint16 arrays are refused, so raw bits must be passed as explicit
# .view(ml_dtypes.bfloat16) and a uint16 array of integers never reaches a bfloat16 kernel.
SCALAR_DTYPES = {
    'bool': np.bool_, 'char': np.int8, 'signed char': np.int8, 'int8_t': np.int8,
    'unsigned char': np.uint8, 'uint8_t': np.uint8,
    'short': np.int16, 'int16_t': np.int16, 'unsigned short': np.uint16, 'uint16_t': np.uint16,
    'int': np.int32, 'signed': np.int32, 'signed int': np.int32, 'int32_t': np.int32,
    'unsigned': np.uint32, 'unsigned int': np.uint32, 'uint32_t': np.uint32,
    'long': np.int64, 'long long': np.int64, 'long long int': np.int64, 'int64_t': np.int64,
    'ptrdiff_t': np.int64,
    'unsigned long': np.uint64, 'unsigned long long': np.uint64, 'unsigned long long int': np.uint64,
    'uint64_t': np.uint64, 'size_t': np.uint64,
    'float': np.float32, 'double': np.float64, '__half': np.float16, 'half': np.float16,
    '__nv_bfloat16': ml_dtypes.bfloat16, 'nv_bfloat16': ml_dtypes.bfloat16,
}
# Element dtype of buffers declared as pointers to vector types.
VECTOR_ELEMENT_DTYPES = {
    'float2': np.float32, 'float4': np.float32, 'double2': np.float64,
    'int2': np.int32, 'int4': np.int32, 'uint2': np.uint32, 'uint4': np.uint32,
    '__half2': np.float16, '__nv_bfloat162': ml_dtypes.bfloat16, 'char4': np.int8, 'uchar4': np.uint8,
}


@dataclass(frozen=True)
class KernelParam:
    """One kernel parameter as declared in the .cu file."""
    name: str
    c_type: str                 # the declaration without the name, e.g. 'const float*'
    is_pointer: bool
    is_const: bool              # pointer to const (the kernel never writes the buffer)
    dtype: Optional[np.dtype]   # scalar dtype, buffer element dtype, or None for void*


@dataclass(frozen=True)
class KernelSignature:
    name: str
    params: Tuple[KernelParam, ...]


def render_defines(defines):
    """`#define NAME VALUE` lines, sorted, checked: the text every runtime prepends."""
    lines = []
    for name in sorted(defines):
        value = defines[name]
        if not isinstance(name, str) or not _IDENT.match(name):
            raise ValueError(f"kernel defines: names must be C identifiers, got {name!r}")
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, (int, float, str)) or isinstance(value, str) and ('\n' in value or not value.strip()):
            raise ValueError(f"kernel defines: {name} must be an int, float or one-line string, got {value!r}")
        lines.append(f"#define {name} {value}\n")
    return ''.join(lines)


def normalized_defines(defines):
    return tuple(sorted((k, str(int(v) if isinstance(v, bool) else v)) for k, v in dict(defines or {}).items()))


def include_closure(source_file):
    """The source file and every local ("quoted") header it includes, recursively, in order."""
    source_file = Path(source_file).resolve()
    seen, order, stack = set(), [], [source_file]
    while stack:
        path = stack.pop()
        if path in seen:
            continue
        seen.add(path)
        order.append(path)
        for name in _INCLUDE.findall(path.read_text()):
            for base in (path.parent, KERNELS_DIR):
                candidate = (base / name).resolve()
                if candidate.is_file():
                    stack.append(candidate)
                    break
            else:
                raise FileNotFoundError(f"{path.name}: #include \"{name}\" not found next to it or in {KERNELS_DIR}")
    return order


# A digest of files is reused while every file it read keeps its stat; a file changed within
# this long of the digest is hashed again on every call (a later edit in the same timestamp
# tick could leave its stat as it was: git's "racily clean" entries).
_RACY_NS = 2 * 10**9
_digests = {}


def _stats(paths):
    try:
        return tuple((s.st_ctime_ns, s.st_mtime_ns, s.st_size, s.st_ino, s.st_dev) for s in map(os.stat, paths))
    except OSError:
        return None


def memoized_digest(memo_key, compute):
    """compute() -> (the paths it read, a digest of them), memoized under `memo_key` while
    those paths keep their (ctime, mtime, size, inode, device): launchers load their module
    on every call, and hashing the sources each time would cost more than the launch."""
    hit = _digests.get(memo_key)
    if hit is not None and _stats(hit[0]) == hit[1]:
        return hit[2]
    started = time.time_ns()
    paths, digest = compute()
    stats = _stats(paths)
    if stats is not None and all(ctime < started - _RACY_NS for ctime, *_ in stats):
        _digests[memo_key] = (paths, stats, digest)
    return digest


def source_key(source_file, defines, *extra):
    """sha256 over the source, every header it includes, the defines and `extra` strings."""
    defines = normalized_defines(defines)
    extra = tuple(str(item) for item in extra)

    def compute():
        closure = include_closure(source_file)
        h = hashlib.sha256()
        for path in closure:
            h.update(path.name.encode() + b'\0' + path.read_bytes() + b'\0')
        h.update(repr(defines).encode())
        for item in extra:
            h.update(b'\0' + item.encode())
        # the path as given (a symlink retargeted or a relative path from another folder is
        # another file) and the folders (a header added beside an including file may shadow
        # one in KERNELS_DIR)
        return [source_file] + closure + sorted({path.parent for path in closure}), h.hexdigest()
    return memoized_digest(('source_key', os.fspath(source_file), defines, extra), compute)


def kernel_source(source_file, defines):
    """The text compiled for (source_file, defines): defines, then the file under #line."""
    path = Path(source_file).resolve()
    return render_defines(defines or {}) + f'#line 1 "{path}"\n' + path.read_text()


def strip_comments(text):
    """Remove // and /* */ comments, keeping newlines so line numbers stay put."""
    def blank(match):
        return re.sub(r'[^\n]', ' ', match.group(0))
    return re.sub(r'//[^\n]*|/\*.*?\*/', blank, text, flags=re.S)


def _macro_table(source_file, defines):
    table = {}
    for path in include_closure(source_file):
        text = strip_comments(path.read_text())
        for name, value in _DEFINE.findall(text):
            table.setdefault(name, value.strip())
        for value, name in _TYPEDEF.findall(text):   # simple `typedef float elem_t;` aliases
            table.setdefault(name, value.strip())
    table.update({k: str(v) for k, v in (defines or {}).items()})   # the launcher's defines win
    return table


def _resolve_type(base, macros, where):
    seen = set()
    while base not in SCALAR_DTYPES and base not in VECTOR_ELEMENT_DTYPES and base != 'void':
        if base in seen or base not in macros:
            raise ValueError(f"{where}: unsupported parameter type {base!r} "
                             f"(allowed: C scalar types, vector types, or a #define / simple typedef naming one)")
        seen.add(base)
        base = ' '.join(macros[base].split())
    return base


def _parse_param(text, kernel, macros):
    where = f"kernel '{kernel}'"
    if any(c in text for c in '<>[]()&'):
        raise ValueError(f"{where}: parameter {text.strip()!r} must be a plain scalar or pointer")
    pointers = text.count('*')
    tokens = text.replace('*', ' * ').split()
    if not tokens or not _IDENT.match(tokens[-1]):
        raise ValueError(f"{where}: cannot parse parameter {text.strip()!r}")
    name = tokens[-1]
    words = [t for t in tokens[:-1] if t != '*']
    const_before_star = False
    seen_star = False
    for t in text.replace('*', ' * ').split()[:-1]:
        if t == '*':
            seen_star = True
        elif t == 'const' and not seen_star:
            const_before_star = True
    base_words = [w for w in words if w not in ('const', 'volatile', '__restrict__', '__restrict', 'restrict')]
    if pointers > 1:
        raise ValueError(f"{where}: parameter {name!r} is a pointer to pointer; pass flat buffers")
    base = _resolve_type(' '.join(base_words), macros, f"{where}, parameter {name!r}")
    if pointers == 0:
        if base not in SCALAR_DTYPES:
            raise ValueError(f"{where}: scalar parameter {name!r} has type {base!r}; use a C scalar type")
        dtype = np.dtype(SCALAR_DTYPES[base])
    elif base == 'void':
        dtype = None
    else:
        dtype = np.dtype(SCALAR_DTYPES.get(base) or VECTOR_ELEMENT_DTYPES[base])
    c_type = ' '.join(w for w in words if w not in ('__restrict__', '__restrict', 'restrict')) + '*' * pointers
    return KernelParam(name, c_type, pointers == 1, pointers == 1 and const_before_star, dtype)


def _balanced(text, start):
    """Index just past the parenthesis group opening at text[start] == '('."""
    depth = 0
    for i in range(start, len(text)):
        depth += text[i] == '('
        depth -= text[i] == ')'
        if depth == 0:
            return i + 1
    raise ValueError("unbalanced parentheses in kernel declaration")


_GLOBAL = re.compile(r'\b__global__\b')
_LAUNCH_BOUNDS = re.compile(r'\s*__launch_bounds__\s*(?=\()')


def _past_launch_bounds(text, pos):
    """Where the declaration goes on after a `__launch_bounds__(...)` at ``pos`` (``pos`` when
    there is none there): it may stand before the return type or after it."""
    bounds = _LAUNCH_BOUNDS.match(text, pos)
    return _balanced(text, bounds.end()) if bounds else pos


def parse_kernel_signatures(source_file, defines=None):
    """{name: KernelSignature} for every `extern "C" __global__ void name(...)` in the file.

    Deliberately strict: a __global__ function that is not extern "C", returns non-void,
    is a template, or takes a parameter that is not a plain scalar or a pointer is an error.
    """
    path = Path(source_file)
    text = strip_comments(path.read_text())
    macros = _macro_table(source_file, defines)
    kernels = {}
    for m in _GLOBAL.finditer(text):
        before = text[max(0, m.start() - 40):m.start()]
        line = text.count('\n', 0, m.start()) + 1
        where = f"{path.name}:{line}"
        if not re.search(r'extern\s+"C"\s*$', before):
            raise ValueError(f"{where}: __global__ functions must be declared 'extern \"C\" __global__ void name(...)'")
        pos = _past_launch_bounds(text, m.end())
        decl = re.compile(r'\s*void\s+').match(text, pos)
        if not decl:
            raise ValueError(f"{where}: kernels must return void")
        pos = _past_launch_bounds(text, decl.end())
        name_m = re.compile(r'\s*([A-Za-z_]\w*)\s*\(').match(text, pos)
        if not name_m:
            raise ValueError(f"{where}: cannot find the kernel name and '('")
        name = name_m.group(1)
        open_paren = name_m.end() - 1
        params_text = text[open_paren + 1:_balanced(text, open_paren) - 1]
        parts = [p for p in params_text.split(',')] if params_text.strip() not in ('', 'void') else []
        params = tuple(_parse_param(p, name, macros) for p in parts)
        if name in kernels:
            raise ValueError(f"{where}: kernel {name!r} declared twice")
        kernels[name] = KernelSignature(name, params)
    return kernels
