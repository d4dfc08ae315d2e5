"""Ahead-of-time build: every registered kernel variant, compiled with NVRTC to cubin.

    python -m gpuk.kernels.build [--arch sm_80,sm_90] [--out DIR] [--check] [--table]

A variant registered with ``archs`` (the Hopper wgmma convolution: ('sm_90a',)) compiles
only for those, when their family is asked for: the default sm_80,sm_90 builds it for sm_90a.

Needs no GPU and no driver: NVRTC comes from pip (``cuda-bindings`` with
``nvidia-cuda-nvrtc`` for CUDA 13, or ``cuda-bindings<13`` with
``nvidia-cuda-nvrtc-cu12``). Each variant (``runtime.registered_builds()``) is compiled
from exactly the text the CUDA runtime compiles (``kernel_source``) for each
architecture, written to ``runtime.cubin_path(...)`` (or into ``--out DIR`` under the
same file name) so the runtime loads it instead of compiling at run time, and summed up
in one line; ``--table`` reports each kernel: registers, static shared memory, stack
frame, spill stores / loads.

The compile cache: every (variant, arch) compiled here is kept under
``$GPUK_CACHE_DIR/nvrtc/`` (cubin and its ptxas resource report) named by a hash of what
shapes the machine code: the source and every header it includes, the defines, the arch, the
NVRTC flags, the NVRTC version and the CUDA headers. ``--check`` and
``python -m gpuk.kernels.inspect`` (which adds the SASS listing beside each entry) read and
fill the same entries, so ``make test`` compiles each variant once, and an edited kernel
(or another compiler) never reads a stale one. Missing entries compile in ``--jobs``
processes (default 2: NVRTC's bindings hold the GIL, so threads would not overlap). An entry
is filled under a lock (``entry_lock``), so processes running at once (``make test`` runs
``--check`` beside the test suite; two inspect runs) never compile the same entry twice: the
second waits for the first and reads what it wrote.

Where the numbers come from: ptxas's verbose report (``--ptxas-options=-v``), read from
the NVRTC program log. It is the only place that states spills; the cubin's ELF
attributes have no spill count and their layout moves between toolkits (seen here: NVRTC
13.5 keeps the register count in ``.nv.info`` where older ones used the section header,
and its ``.nv.shared`` size on sm_90 includes 1 KiB the system reserves). A kernel the
log does not describe is an error rather than a silent zero.

Exit status: 0 when everything compiled and no variant with ``may_spill=False`` spills;
1 on a compile error, a spill where none is allowed, or an unreadable report; 2 when
NVRTC is not installed.
"""
import argparse
import contextlib
import hashlib
import json
import os
import re
import sys
from collections import namedtuple
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

try:
    import fcntl
except ImportError:   # not POSIX: no entry locks (concurrent runs may then compile an entry twice)
    fcntl = None

from .. import runtime
from .kernel_source import KERNELS_DIR, NVRTC_FLAGS, kernel_source, memoized_digest, source_key

DEFAULT_ARCHS = ('sm_80', 'sm_90')
# Options the CUDA runtime must use too, so a prebuilt cubin equals a JIT-compiled one.
NVRTC_OPTIONS = NVRTC_FLAGS + ('-I' + str(KERNELS_DIR),)


def nvrtc_options(source_file):
    """NVRTC options (without -arch and the CUDA headers) of every compile of ``source_file``:
    NVRTC_OPTIONS after the source's own folder (searched first, as the emulator does), so a
    kernel in a family's subfolder (conv/) finds the headers beside it."""
    own_folder = f'-I{Path(source_file).resolve().parent}'
    return [own_folder] + [option for option in NVRTC_OPTIONS if option != own_folder]

ResourceUsage = namedtuple('ResourceUsage', ['registers', 'shared_bytes', 'stack_frame',
                                             'spill_stores', 'spill_loads'])


class BuildError(RuntimeError):
    """A variant failed to compile, or its resource report could not be read."""


class NvrtcMissing(RuntimeError):
    """cuda-python's NVRTC bindings or the NVRTC library are not installed."""


# ---------------------------------------------------------------- NVRTC

def _nvrtc_module():
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        try:
            from cuda import nvrtc   # cuda-python before 12.6 named it so
        except ImportError as exc:
            raise NvrtcMissing('NVRTC bindings not found (pip install cuda-bindings '
                               'nvidia-cuda-nvrtc, or cuda-bindings<13 nvidia-cuda-nvrtc-cu12): %s'
                               % exc) from None
    return nvrtc


def _check(nvrtc, result, what):
    err = result[0]
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, text = nvrtc.nvrtcGetErrorString(err)
        raise BuildError('NVRTC %s failed: %s' % (what, text.decode() if isinstance(text, bytes) else text))
    return result[1:] if len(result) > 2 else (result[1] if len(result) == 2 else None)


def nvrtc_version():
    """(major, minor) of the NVRTC library."""
    nvrtc = _nvrtc_module()
    try:
        return tuple(_check(nvrtc, nvrtc.nvrtcVersion(), 'nvrtcVersion'))
    except RuntimeError as exc:   # the bindings load the library lazily
        raise NvrtcMissing('the NVRTC library could not be loaded: %s' % exc) from None


def cuda_include_dir():
    """The CUDA headers NVRTC needs for <cuda_fp16.h> / <cuda_bf16.h>, from the
    nvidia-cuda-runtime wheel (site-packages) or a toolkit (CUDA_HOME, /usr/local/cuda)."""
    try:
        from cuda import pathfinder
        found = pathfinder.find_nvidia_header_directory('cudart')
    except Exception:   # pathfinder absent or too old: look for the wheel layouts ourselves
        found = None
    candidates = [found] if found else []
    for base in sys.path:
        candidates += sorted(str(p.parent) for p in Path(base or '.').glob('nvidia/*/include/cuda_fp16.h'))
    for home in (os.environ.get('CUDA_HOME'), os.environ.get('CUDA_PATH'), '/usr/local/cuda'):
        if home:
            candidates.append(os.path.join(home, 'include'))
    for candidate in candidates:
        if candidate and os.path.isfile(os.path.join(candidate, 'cuda_fp16.h')):
            return candidate
    raise NvrtcMissing('the CUDA headers (cuda_fp16.h) were not found: pip install '
                       'nvidia-cuda-runtime (CUDA 13) or nvidia-cuda-runtime-cu12, or set CUDA_HOME')


def compile_cubin(source_text, name, arch, options=NVRTC_OPTIONS):
    """(cubin bytes, ptxas log text) of ``source_text`` for ``arch`` ('sm_90')."""
    nvrtc = _nvrtc_module()
    try:
        program = _check(nvrtc, nvrtc.nvrtcCreateProgram(source_text.encode(), name.encode(), 0, [], []),
                         'nvrtcCreateProgram')
    except RuntimeError as exc:
        if isinstance(exc, BuildError):
            raise
        raise NvrtcMissing('the NVRTC library could not be loaded: %s' % exc) from None
    try:
        flags = [o.encode() for o in tuple(options) + (
            '-I' + cuda_include_dir(), '--gpu-architecture=' + runtime.normalize_arch(arch),
            '--ptxas-options=-v')]
        compiled = nvrtc.nvrtcCompileProgram(program, len(flags), flags)
        log_size = _check(nvrtc, nvrtc.nvrtcGetProgramLogSize(program), 'nvrtcGetProgramLogSize')
        log = b' ' * log_size
        _check(nvrtc, nvrtc.nvrtcGetProgramLog(program, log), 'nvrtcGetProgramLog')
        log = log.rstrip(b'\0 ').decode(errors='replace')
        if compiled[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise BuildError('%s (%s) does not compile:\n%s' % (name, arch, log))
        size = _check(nvrtc, nvrtc.nvrtcGetCUBINSize(program), 'nvrtcGetCUBINSize')
        cubin = b' ' * size
        _check(nvrtc, nvrtc.nvrtcGetCUBIN(program, cubin), 'nvrtcGetCUBIN')
        return cubin, log
    finally:
        nvrtc.nvrtcDestroyProgram(program)


# ---------------------------------------------------------------- the ptxas report

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPERTIES = re.compile(r'Function properties for (\S+)')
_STACK = re.compile(r'(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads')
_USED = re.compile(r'Used (\d+) registers')
_SMEM = re.compile(r'(\d+) bytes smem')


def parse_ptxas_log(log):
    """{function: ResourceUsage} from ptxas -v output; non-entry functions have registers None.

    Entry functions get their 'Used N registers ... smem' line; every function with a
    'Function properties' block gets its stack frame and spills.
    """
    usage, entry, current = {}, None, None

    def row(name):
        return usage.setdefault(name, {'registers': None, 'shared_bytes': 0, 'stack_frame': 0,
                                       'spill_stores': 0, 'spill_loads': 0})
    for line in log.splitlines():
        match = _ENTRY.search(line)
        if match:
            entry = current = match.group(1)
            row(entry)
            continue
        match = _PROPERTIES.search(line)
        if match:
            current = match.group(1)
            row(current)
            continue
        match = _STACK.search(line)
        if match and current is not None:
            row(current).update(stack_frame=int(match.group(1)), spill_stores=int(match.group(2)),
                                spill_loads=int(match.group(3)))
            continue
        match = _USED.search(line)
        if match and entry is not None:
            smem = _SMEM.search(line)
            row(entry).update(registers=int(match.group(1)),
                              shared_bytes=int(smem.group(1)) if smem else 0)
    return {name: ResourceUsage(**fields) for name, fields in usage.items()}


def kernel_usage(log, kernels):
    """(ResourceUsage per kernel, bytes spilled by any function in the log).

    Raises BuildError when a kernel is missing from the report.
    """
    usage = parse_ptxas_log(log)
    result = {}
    for kernel in kernels:
        found = usage.get(kernel)
        if found is None or found.registers is None:
            raise BuildError('kernel %r: no resource report in the ptxas log (is it declared '
                             'extern "C" __global__ in the source?); log was:\n%s' % (kernel, log))
        result[kernel] = found
    spilled = sum(u.spill_stores + u.spill_loads for u in usage.values())
    return result, spilled


# ---------------------------------------------------------------- building

BuildResult = namedtuple('BuildResult', ['spec', 'arch', 'path', 'usage', 'spilled', 'error'])
BuildResult.__doc__ = ('One (variant, arch) compiled: ``path`` is the cubin written (or, for a cached '
                       'build, the cache entry), ``error`` the compile error text or None.')


def variant_label(spec):
    """'elementwise.cu ELEMENT_T=float ...' for the table."""
    defines = ' '.join('%s=%s' % kv for kv in spec.defines)
    return '%s %s' % (Path(spec.source_file).name, defines)


def compile_source(source_file, defines, arch):
    """(cubin bytes, ptxas log text) of ``source_file`` with ``defines`` for ``arch``: the one
    compile of a kernel module, behind the AOT build and its cache (so the inspect report) and
    the CUDA runtime's first-use compile alike (cuda_runtime.compile_to_cache), so all of them
    get the same machine code from the same text (``kernel_source``) and options."""
    return compile_cubin(kernel_source(source_file, defines), Path(source_file).name, arch,
                         options=nvrtc_options(source_file))


def compile_variant(spec, arch):
    """(cubin bytes, ResourceUsage per kernel, bytes spilled) of one variant for one arch, what
    a cache entry holds (``cached_build``); raises BuildError (or OSError, ValueError for an
    unreadable source or bad defines)."""
    cubin, log = compile_source(spec.source_file, spec.defines_dict, arch)
    usage, spilled = kernel_usage(log, spec.kernels)
    return cubin, usage, spilled


# ---------------------------------------------------------------- the compile cache

def cache_folder():
    """The compile cache shared by ``--check`` and the inspect report: $GPUK_CACHE_DIR/nvrtc."""
    return runtime.cache_dir() / 'nvrtc'


def cuda_headers_digest():
    """sha256 of the CUDA headers NVRTC compiles against (cuda_fp16.h and the rest of that
    folder, not its subfolders), memoized while the files keep their stat."""
    folder = Path(cuda_include_dir())

    def compute():
        headers = sorted(p for p in folder.iterdir() if p.suffix in ('.h', '.hpp') and p.is_file())
        h = hashlib.sha256()
        for path in headers:
            h.update(path.name.encode() + b'\0' + path.read_bytes() + b'\0')
        return [folder] + headers, h.hexdigest()
    return memoized_digest(('cuda headers', str(folder)), compute)


def compiler_identity():
    """What, besides the source and its arch, shapes every cubin: the NVRTC flags, the NVRTC
    version and the CUDA headers (part of each cache key)."""
    return NVRTC_FLAGS + ('nvrtc %d.%d' % nvrtc_version(), cuda_headers_digest())


def cached_paths(spec, arch, folder=None, identity=None):
    """(cubin, resource report) of (spec, arch) in the cache ``folder`` (default cache_folder()).
    ``identity``: compiler_identity(), when the caller already has it. The kernel names are part
    of the key since the report holds theirs only."""
    arch = runtime.normalize_arch(arch)
    key = source_key(spec.source_file, spec.defines_dict, arch, ' '.join(spec.kernels),
                     *(identity or compiler_identity()))
    cubin = Path(folder or cache_folder()) / ('%s-%s-%s.cubin' % (Path(spec.source_file).stem, key[:32], arch))
    return cubin, cubin.with_suffix('.usage.json')


def write_atomically(path, data):
    """Writes ``data`` (bytes or text) to ``path`` through a temporary beside it: a concurrent
    reader (another process of the pool, another test session) never sees half a file."""
    partial = path.with_name('%s.%d.tmp' % (path.name, os.getpid()))
    if isinstance(data, bytes):
        partial.write_bytes(data)
    else:
        partial.write_text(data)
    partial.replace(path)


@contextlib.contextmanager
def entry_lock(cubin):
    """Held while this process fills the cache entry of ``cubin`` (compiles it, or adds its SASS
    listing): another process asking for the same entry meanwhile waits here, then finds it
    filled, instead of compiling it a second time. An advisory lock on ``<entry>.lock`` beside
    it (the file stays: removing it could let a third process lock a new one while the second
    still waits on the old), released by the system if the holder dies."""
    cubin.parent.mkdir(parents=True, exist_ok=True)
    with open(cubin.with_name(cubin.name + '.lock'), 'a') as handle:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield   # closing the file releases the lock


def _stored_build(spec, arch, cubin, report):
    """The BuildResult of a filled cache entry, or None when it is not (yet) there."""
    if not (cubin.is_file() and report.is_file()):
        return None
    stored = json.loads(report.read_text())
    usage = {kernel: ResourceUsage(**fields) for kernel, fields in stored['usage'].items()}
    return BuildResult(spec, arch, cubin, usage, stored['spilled'], None)


def cached_build(spec, arch, folder=None, identity=None):
    """The BuildResult of (spec, arch) from the cache, or compiled now and stored there
    (compile errors are not stored: they are reported on every run). A process compiling the
    same entry at the same time is waited for (entry_lock), not duplicated."""
    cubin, report = cached_paths(spec, arch, folder, identity)
    arch = runtime.normalize_arch(arch)
    found = _stored_build(spec, arch, cubin, report)
    if found:
        return found
    with entry_lock(cubin):
        found = _stored_build(spec, arch, cubin, report)   # filled while this process waited
        if found:
            return found
        try:
            binary, usage, spilled = compile_variant(spec, arch)
        except (BuildError, OSError, ValueError) as exc:
            return BuildResult(spec, arch, cubin, {}, 0, str(exc))
        write_atomically(cubin, binary)
        write_atomically(report, json.dumps({'usage': {k: u._asdict() for k, u in usage.items()},
                                             'spilled': spilled}))
    return BuildResult(spec, arch, cubin, usage, spilled, None)


def install(result, out_dir=None):
    """Copies a cached build's cubin to where the runtime loads it (runtime.cubin_path, or
    ``out_dir`` under the same name); the result, with ``path`` the installed cubin."""
    if result.error:
        return result
    target = runtime.cubin_path(result.spec.source_file, result.spec.defines_dict, result.arch)
    if out_dir is not None:
        target = Path(out_dir) / target.name
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(target, result.path.read_bytes())
    return result._replace(path=target)


def is_cached(spec, arch, folder=None, identity=None):
    return all(path.is_file() for path in cached_paths(spec, arch, folder, identity))


class Jobs:
    """``function(*job)`` for each job, started at once in up to ``workers`` processes, so the
    caller can do other work meanwhile; ``results()`` waits for them (in job order). One job
    or one worker: they run in this process, at ``results()``."""

    def __init__(self, function, jobs, workers=2):
        self._function, self._jobs = function, list(jobs)
        self._pool = ProcessPoolExecutor(max_workers=min(workers, len(self._jobs))) \
            if len(self._jobs) > 1 and workers > 1 else None
        self._futures = [self._pool.submit(function, *job) for job in self._jobs] if self._pool else []

    def results(self):
        if self._pool is None:
            return [self._function(*job) for job in self._jobs]
        try:
            return [future.result() for future in self._futures]
        finally:
            self._pool.shutdown()


class PendingBuilds:
    """Every (spec, arch) through the cache ``folder``, started at once: the entries missing
    there compile (cached_build) in ``workers`` processes while the caller does other work;
    ``results()`` waits and returns the BuildResults, spec order then arch order (an entry
    already there is read in this process)."""

    def __init__(self, specs, archs, folder=None, workers=2):
        self._folder, self._identity = Path(folder or cache_folder()), compiler_identity()
        self._jobs = [(spec, arch) for spec in specs for arch in spec.build_archs(archs)]
        self._missing = [job for job in self._jobs if not is_cached(*job, self._folder, self._identity)]
        self._pending = Jobs(cached_build, [job + (self._folder, self._identity) for job in self._missing], workers)

    def results(self):
        done = dict(zip(self._missing, self._pending.results()))
        return [done.get(job) or cached_build(*job, self._folder, self._identity) for job in self._jobs]


def build_all(specs, archs, folder=None, workers=2):
    """BuildResults of every (spec, arch), spec order then arch order, through the cache:
    entries already there are read, the others compiled in ``workers`` processes."""
    return PendingBuilds(specs, archs, folder, workers).results()


def problems(results):
    """Sentences for every failure: compile errors and forbidden spills."""
    found = []
    for r in results:
        if r.error:
            found.append('%s for %s: %s' % (variant_label(r.spec), r.arch, r.error))
        elif r.spilled and not r.spec.may_spill:
            found.append('%s for %s spills %d bytes (stores + loads) but is registered with '
                         'may_spill=False' % (variant_label(r.spec), r.arch, r.spilled))
    return found


def format_table(results):
    """One line per (variant, arch, kernel) with its resources."""
    header = ('kernel', 'arch', 'regs', 'smem B', 'stack B', 'spill st/ld B', 'variant')
    lines = []
    for r in results:
        if r.error:
            lines.append(('-', r.arch, '-', '-', '-', '-', variant_label(r.spec) + '  COMPILE ERROR'))
            continue
        for kernel in r.spec.kernels:
            u = r.usage[kernel]
            flag = '' if not (u.spill_stores or u.spill_loads) else (
                '  (spills allowed)' if r.spec.may_spill else '  SPILLS')
            lines.append((kernel, r.arch, str(u.registers), str(u.shared_bytes), str(u.stack_frame),
                          '%d/%d' % (u.spill_stores, u.spill_loads), variant_label(r.spec) + flag))
    widths = [max(len(row[i]) for row in [header] + lines) for i in range(len(header))]
    rule = '  '.join('-' * w for w in widths)
    out = ['  '.join(c.ljust(w) for c, w in zip(header, widths)), rule]
    out += ['  '.join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in lines]
    return '\n'.join(out)


def summary_line(results, archs):
    """One line for the whole build: variants and kernels compiled, the most registers, spills, failures."""
    built = [r for r in results if not r.error]
    usages = [(u.registers, kernel, r.arch) for r in built for kernel, u in r.usage.items()]
    variants = {variant_label(r.spec): len(r.spec.kernels) for r in results}
    line = '%d variants (%d kernels) compiled for %s' % (len(variants), sum(variants.values()), ', '.join(archs))
    if usages:
        line += '; most registers %d (%s, %s)' % max(usages)
    spilling = [r for r in built if r.spilled]
    if not spilling:
        line += '; no spills'
    else:
        forbidden = sum(1 for r in spilling if not r.spec.may_spill)
        line += '; %d build(s) spill (%s)' % (len(spilling), '%d where not allowed' % forbidden if forbidden
                                              else 'all allowed')
    failed = len(results) - len(built)
    return line + ('; %d FAILED to compile' % failed if failed else '')


def parse_archs(text):
    archs = tuple(runtime.normalize_arch(a.strip()) for a in text.split(',') if a.strip())
    if not archs:
        raise ValueError("build: --arch must list architectures like 'sm_80,sm_90', got %r" % text)
    return archs


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m gpuk.kernels.build',
                                     description='Compile every registered gpuk kernel to cubin with NVRTC.')
    parser.add_argument('--arch', default=','.join(DEFAULT_ARCHS),
                        help='comma-separated architectures (default %(default)s)')
    parser.add_argument('--out', default=None, help='write cubins here instead of runtime.cubin_dir()')
    parser.add_argument('--check', action='store_true',
                        help='compile (through the compile cache) and report only; install no cubin')
    parser.add_argument('--table', action='store_true',
                        help='print registers, shared memory, stack and spills per kernel (default: one summary line)')
    parser.add_argument('--jobs', type=int, default=2,
                        help='compile processes for the variants missing from the cache (default %(default)s)')
    args = parser.parse_args(argv)
    try:
        archs = parse_archs(args.arch)
    except ValueError as exc:
        parser.error(str(exc))
    if args.jobs < 1:
        parser.error('--jobs must be at least 1, got %d' % args.jobs)
    try:
        major, minor = nvrtc_version()
        results = build_all(runtime.registered_builds(), archs, workers=args.jobs)
    except NvrtcMissing as exc:   # the library, or the CUDA headers the cache key hashes
        print('build: %s' % exc, file=sys.stderr)
        return 2
    if not args.check:
        results = [install(result, args.out) for result in results]
    print('NVRTC %d.%d: %s%s' % (major, minor, summary_line(results, archs),
                                '' if args.table else ' (--table: per kernel)'))
    if args.table:
        print(format_table(results))
    if not args.check:
        folder = args.out or runtime.cubin_dir()
        print('cubins in %s' % folder)
    found = problems(results)
    for sentence in found:
        print('build: ' + sentence, file=sys.stderr)
    return 1 if found else 0


if __name__ == '__main__':
    sys.exit(main())
