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
from . import elf, sass

# The report's default: the H100 whose roofline it predicts (sm_90, and sm_90a for the Hopper
# convolution). The A100's sm_80 doubles a cold run's NVRTC work, which puts it over two minutes
# on two cores; the baseline (make test) holds both, read from the cache build --check fills.
DEFAULT_ARCHS = ('sm_90',)
BASELINE_ARCHS = ('sm_90', 'sm_80')


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


def add_listings(results, processes=2):
    """Writes the SASS listing beside each cached cubin of ``results`` (BuildResults) that has
    none yet: the missing ones disassembled together (sass.disassemble_texts), in
    ``processes`` nvdisasm runs at a time. A listing is a pure function of its cubin, so a
    process that writes one at the same moment as another writes the same text."""
    missing = [r.path for r in results if not r.error and not listing_path(r.path).is_file()]
    for cubin, text in zip(missing, sass.disassemble_texts(missing, processes) if missing else ()):
        build.write_atomically(listing_path(cubin), text)


def _load(result):
    if result.error:
        return CompiledVariant(result.spec, result.arch, {}, {}, {}, error=result.error)
    return CompiledVariant(result.spec, result.arch, result.usage, sass.parse(listing_path(result.path).read_text()),
                           max_threads_per_kernel(result.path.read_bytes()))


class PendingCompiles:
    """compile_all started: the jobs missing from the cache compile in ``workers`` processes
    while the caller does other work (the report runs the emulator meanwhile); ``result()``
    waits, disassembles the cubins without a listing (in ``workers`` nvdisasm runs at a time)
    and returns the CompiledVariants (registry order, then arch)."""

    def __init__(self, archs=BASELINE_ARCHS, specs=None, workers=2, folder=None):
        specs = runtime.registered_builds() if specs is None else specs
        folder = Path(folder) if folder else cache_folder()
        folder.mkdir(parents=True, exist_ok=True)
        self._workers = workers
        self._builds = build.PendingBuilds(specs, archs, folder, workers)

    def result(self):
        results = self._builds.results()
        add_listings(results, self._workers)
        return [_load(result) for result in results]


def compile_all(archs=BASELINE_ARCHS, specs=None, workers=2, folder=None):
    """CompiledVariants of every registered variant for every arch (registry order, then arch).

    Variants missing from the cache compile in ``workers`` processes, then the cubins without a
    listing are disassembled in batches; a warm run only reads the cache."""
    return PendingCompiles(archs, specs, workers, folder).result()


# ---------------------------------------------------------------- the cubin's launch bounds

EIATTR_MAX_THREADS = 0x05   # .nv.info attribute: __launch_bounds__ maximum threads (x, y, z)


def max_threads_per_kernel(cubin):
    """{kernel: threads per block its __launch_bounds__ allows} from the .nv.info.<kernel>
    sections; kernels without launch bounds are absent."""
    found = {}
    for name, data in elf.sections(cubin).items():
        if not name.startswith('.nv.info.'):
            continue
        position = 0
        while position + 4 <= len(data):
            fmt, attribute, size = data[position], data[position + 1], struct.unpack_from('<H', data, position + 2)[0]
            if fmt != elf.EIFMT_SVAL:   # other formats carry a 2-byte value in place of the size
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
