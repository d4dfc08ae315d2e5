"""Every (variant, arch) of the build registry compiled once, with its ptxas report and SASS.

A variant is a runtime.BuildSpec: a .cu file, the defines a launcher passes, the kernels in
it (what ``python -m gpuk.kernels.build`` compiles). Compiling goes through
``build.build_variant`` (the same NVRTC call and options as the AOT build and the CUDA
runtime); the cubin, its per-kernel resource report and its disassembly are kept under
``$GPUK_CACHE_DIR/inspect/`` named like the runtime's cubins (a hash of the source, its
headers, the defines, the arch and the NVRTC flags), so an unchanged kernel is never
compiled or disassembled twice and an edited one never reads a stale entry.
"""
import json
import os
import struct
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from .. import runtime   # the registry
from ..runtime import build   # the AOT build's compile step
from . import sass

ARCHS = ('sm_90', 'sm_80')


class CompiledVariant:
    """One BuildSpec compiled for one arch: resources per kernel and SASS per kernel."""

    def __init__(self, spec, arch, usage, functions, max_threads, error=None):
        self.spec, self.arch, self.usage = spec, arch, usage
        self.functions, self.max_threads, self.error = functions, max_threads, error


def cache_folder():
    return runtime.cache_dir() / 'inspect'


def _usage_to_json(usage):
    return {kernel: u._asdict() for kernel, u in usage.items()}


def _usage_from_json(data):
    return {kernel: build.ResourceUsage(**fields) for kernel, fields in data.items()}


def _cached_paths(spec, arch, folder):
    cubin = Path(folder) / runtime.cubin_path(spec.source_file, spec.defines_dict, arch).name
    return cubin, cubin.with_suffix('.usage.json'), cubin.with_suffix('.sass')


def ensure_cached(spec, arch, folder):
    """Compiles and disassembles (spec, arch) into ``folder`` unless already there; the compile
    error text, or None."""
    cubin, report, listing = _cached_paths(spec, arch, folder)
    if cubin.is_file() and report.is_file() and listing.is_file():
        return None
    result = build.build_variant(spec, arch, out_dir=folder, write=True)
    if result.error:
        return result.error
    _write(report, json.dumps(_usage_to_json(result.usage)))
    _write(listing, sass.disassemble_text(cubin))
    return None


def compile_variant(spec, arch, folder=None):
    """The CompiledVariant of (spec, arch), from the cache ``folder`` (default cache_folder())
    or compiled now."""
    folder = Path(folder) if folder else cache_folder()
    error = ensure_cached(spec, arch, folder)
    return CompiledVariant(spec, arch, {}, {}, {}, error=error) if error else _load(spec, arch, folder)


def _load(spec, arch, folder):
    cubin, report, listing = _cached_paths(spec, arch, folder)
    usage = _usage_from_json(json.loads(report.read_text()))
    return CompiledVariant(spec, arch, usage, sass.parse(listing.read_text()),
                           max_threads_per_kernel(cubin.read_bytes()))


def _write(path, text):
    partial = path.with_name('%s.%d.tmp' % (path.name, os.getpid()))
    partial.write_text(text)
    partial.replace(path)   # atomic: a concurrent report never reads half a file


def compile_all(archs=ARCHS, specs=None, workers=2, folder=None):
    """CompiledVariants of every registered variant for every arch (registry order, then arch).

    Variants missing from the cache compile in ``workers`` processes (NVRTC's Python bindings
    hold the GIL, so threads would not overlap the compiles): a cold run takes about half the
    CPU time on 2 cores; a warm one only reads the cache."""
    specs = runtime.registered_builds() if specs is None else specs
    folder = Path(folder) if folder else cache_folder()
    folder.mkdir(parents=True, exist_ok=True)
    jobs = [(spec, arch) for spec in specs for arch in spec.build_archs(archs)]
    missing = [(spec, arch) for spec, arch in jobs
               if not all(path.is_file() for path in _cached_paths(spec, arch, folder))]
    errors = {}
    if len(missing) > 1 and workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            found = pool.map(ensure_cached, *zip(*missing), [folder] * len(missing))
            errors = {job: error for job, error in zip(missing, found) if error}
    else:
        errors = {job: error for job in missing for error in [ensure_cached(*job, folder)] if error}
    return [CompiledVariant(spec, arch, {}, {}, {}, error=errors[(spec, arch)]) if (spec, arch) in errors
            else _load(spec, arch, folder) for spec, arch in jobs]


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
