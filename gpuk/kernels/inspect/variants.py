"""Every (variant, arch) of the build registry compiled once, with its ptxas report and SASS.

A variant is a runtime.BuildSpec: a .cu file, the defines a launcher passes, the kernels in
it (what ``python -m gpuk.kernels.build`` compiles). Compiling goes through the AOT build's
compile cache (``build.cached_build``: the same NVRTC call and options as the build and the
CUDA runtime, entries named by a hash of the source, its headers, the defines, the arch and
the compiler), and the SASS listing is kept beside each cubin there, so ``build --check`` and
this report compile each variant once between them, an unchanged kernel is never compiled or
disassembled twice, and an edited one never reads a stale entry.
"""
import struct
from pathlib import Path

from .. import runtime   # the registry
from ..runtime import build   # the AOT build's compile cache
from . import sass

ARCHS = ('sm_90', 'sm_80')


class CompiledVariant:
    """One BuildSpec compiled for one arch: resources per kernel and SASS per kernel."""

    def __init__(self, spec, arch, usage, functions, max_threads, error=None):
        self.spec, self.arch, self.usage = spec, arch, usage
        self.functions, self.max_threads, self.error = functions, max_threads, error


def cache_folder():
    """The compile cache this report shares with ``python -m gpuk.kernels.build``."""
    return build.cache_folder()


def listing_path(cubin):
    return cubin.with_suffix('.sass')


def ensure_cached(spec, arch, folder, identity=None):
    """Compiles (spec, arch) into the cache ``folder`` and disassembles it there, each unless
    already done; the BuildResult (its ``error`` the compile error text, or None)."""
    result = build.cached_build(spec, arch, folder, identity)
    if not result.error and not listing_path(result.path).is_file():
        with build.entry_lock(result.path):   # another process may be disassembling it right now
            if not listing_path(result.path).is_file():
                build.write_atomically(listing_path(result.path), sass.disassemble_text(result.path))
    return result


def _is_cached(spec, arch, folder, identity):
    cubin, report = build.cached_paths(spec, arch, folder, identity)
    return cubin.is_file() and report.is_file() and listing_path(cubin).is_file()


def _load(result):
    if result.error:
        return CompiledVariant(result.spec, result.arch, {}, {}, {}, error=result.error)
    return CompiledVariant(result.spec, result.arch, result.usage, sass.parse(listing_path(result.path).read_text()),
                           max_threads_per_kernel(result.path.read_bytes()))


class PendingCompiles:
    """compile_all started: the jobs missing from the cache run in ``workers`` processes while
    the caller does other work (the report runs the emulator meanwhile); ``result()`` waits and
    returns the CompiledVariants (registry order, then arch)."""

    def __init__(self, archs=ARCHS, specs=None, workers=2, folder=None):
        specs = runtime.registered_builds() if specs is None else specs
        folder = Path(folder) if folder else cache_folder()
        folder.mkdir(parents=True, exist_ok=True)
        self._builds = build.PendingBuilds(specs, archs, folder, workers, fill=ensure_cached, filled=_is_cached)

    def result(self):
        return [_load(result) for result in self._builds.results()]


def compile_all(archs=ARCHS, specs=None, workers=2, folder=None):
    """CompiledVariants of every registered variant for every arch (registry order, then arch).

    Variants missing from the cache compile and disassemble in ``workers`` processes: a cold
    run takes about half the CPU time on 2 cores; a warm one only reads the cache."""
    return PendingCompiles(archs, specs, workers, folder).result()


# ---------------------------------------------------------------- the cubin's launch bounds

EIATTR_MAX_THREADS = 0x05   # .nv.info attribute: __launch_bounds__ maximum threads (x, y, z)
EIFMT_SVAL = 0x04           # attribute with a 16-bit size and a payload


def _sections(elf):
    """{section name: bytes} of a 64-bit little-endian ELF (a cubin)."""
    if elf[:4] != b'\x7fELF' or elf[4] != 2:
        raise ValueError('not a 64-bit ELF cubin')
    shoff, = struct.unpack_from('<Q', elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', elf, 0x3A)
    headers = [struct.unpack_from('<IIQQQQIIQQ', elf, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx]
    names = elf[strtab[4]:strtab[4] + strtab[5]]
    out = {}
    for header in headers:
        name = names[header[0]:names.index(b'\0', header[0])].decode()
        out[name] = elf[header[4]:header[4] + header[5]]
    return out


def max_threads_per_kernel(elf):
    """{kernel: threads per block its __launch_bounds__ allows} from the .nv.info.<kernel>
    sections; kernels without launch bounds are absent."""
    found = {}
    for name, data in _sections(elf).items():
        if not name.startswith('.nv.info.'):
            continue
        position = 0
        while position + 4 <= len(data):
            fmt, attribute, size = data[position], data[position + 1], struct.unpack_from('<H', data, position + 2)[0]
            if fmt != EIFMT_SVAL:   # other formats carry a 2-byte value in place of the size
                position += 4
                continue
            if attribute == EIATTR_MAX_THREADS and size >= 12:
                x, y, z = struct.unpack_from('<III', data, position + 4)
                found[name[len('.nv.info.'):]] = x * y * z
            position += 4 + size
    return found


def source_label(source_file):
    """The .cu path as the report shows it: relative to the repository (gpuk/kernels/...)."""
    path = Path(source_file).resolve()
    root = Path(__file__).resolve().parents[3]   # gpuk/kernels/inspect/ -> the repository
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()
