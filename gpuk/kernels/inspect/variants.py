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
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .. import build, runtime   # the registry and the AOT build's compile step
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


def compile_variant(spec, arch, folder=None):
    """The CompiledVariant of (spec, arch), from the cache ``folder`` (default cache_folder())
    or compiled now."""
    folder = Path(folder) if folder else cache_folder()
    cubin = folder / runtime.cubin_path(spec.source_file, spec.defines_dict, arch).name
    report, listing = cubin.with_suffix('.usage.json'), cubin.with_suffix('.sass')
    if not (cubin.is_file() and report.is_file() and listing.is_file()):
        result = build.build_variant(spec, arch, out_dir=folder, write=True)
        if result.error:
            return CompiledVariant(spec, arch, {}, {}, {}, error=result.error)
        _write(report, json.dumps(_usage_to_json(result.usage)))
        _write(listing, sass.disassemble_text(cubin))
    usage = _usage_from_json(json.loads(report.read_text()))
    functions = sass.parse(listing.read_text())
    return CompiledVariant(spec, arch, usage, functions, max_threads_per_kernel(cubin.read_bytes()))


def _write(path, text):
    partial = path.with_suffix(path.suffix + '.tmp')
    partial.write_text(text)
    partial.replace(path)   # atomic: a concurrent report never reads half a file


def compile_all(archs=ARCHS, specs=None, workers=2, folder=None):
    """CompiledVariants of every registered variant for every arch (registry order, then arch)."""
    specs = runtime.registered_builds() if specs is None else specs
    folder = Path(folder) if folder else cache_folder()
    jobs = [(spec, arch, folder) for spec in specs for arch in archs]
    folder.mkdir(parents=True, exist_ok=True)
    # Threads overlap nvdisasm (a subprocess) with compiles; NVRTC's bindings seem to hold the
    # GIL (two threads compiled no faster than one here), so a cold run is ~2.5 minutes.
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda job: compile_variant(*job), jobs))


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
    root = Path(build.KERNELS_DIR).resolve().parents[1]
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()
