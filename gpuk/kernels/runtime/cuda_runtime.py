"""The CUDA runtime: kernels as CuPy RawModules launched on CuPy's current stream.

Every module is loaded from a cubin compiled by gpuk's own NVRTC call
(gpuk/kernels/runtime/build.py, ``compile_source``), so a kernel is the same machine code
whether it comes from the ahead-of-time build or is compiled here on first use:

1. the prebuilt cubin at runtime.cubin_path(source, defines, arch), written by
   ``python -m gpuk.kernels.build``, when it exists;
2. else a cubin compiled now and kept in $GPUK_CACHE_DIR/cubin (same file name);
3. else, only where gpuk's NVRTC bindings (cuda-bindings) are missing, CuPy's own NVRTC
   (``RawModule(code=...)``), with a warning: CuPy appends ``-ftz=true`` after the caller's
   options, so float32 denormals flush to zero there, unlike in the other two.

Modules are memoized in memory per (source + headers, defines, arch). Arrays come from
CuPy's memory pool (cupy.empty & co. in the launchers).
"""
import os
import threading
import warnings
from pathlib import Path

import numpy as np

from .. import runtime
from . import counters
from .kernel_source import kernel_source, parse_kernel_signatures, source_key



def cuda_include_dirs():
    """Directories holding cuda_fp16.h / cuda_bf16.h for NVRTC, best first."""
    candidates = [os.environ.get('CUDA_PATH'), os.environ.get('CUDA_HOME'), '/usr/local/cuda']
    try:
        import cupy
        candidates.insert(0, cupy.cuda.get_cuda_path())
    except Exception:   # no cupy or no toolkit path: fall back to the environment
        pass
    return [str(Path(c) / 'include') for c in candidates if c and (Path(c) / 'include' / 'cuda_fp16.h').is_file()]


def jit_cubin_path(source_file, defines, arch):
    """Where a cubin compiled on first use is kept: $GPUK_CACHE_DIR/cubin/<the AOT file name>."""
    return runtime.cache_dir() / 'cubin' / runtime.cubin_path(source_file, defines, arch).name


def compile_to_cache(source_file, defines, arch):
    """The cached cubin for (source, defines, arch), compiled with gpuk's NVRTC when missing.

    Raises build.NvrtcMissing without the NVRTC bindings and KernelCompileError when NVRTC
    rejects the source."""
    from . import build
    target = jit_cubin_path(source_file, defines, arch)
    if target.is_file():
        return target
    try:
        cubin, _log = build.compile_source(source_file, defines, arch)
    except build.BuildError as exc:
        raise runtime.KernelCompileError(
            f"NVRTC failed on {Path(source_file).name} with defines {dict(defines)}:\n{exc}") from exc
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f'{target.name}.{os.getpid()}.{threading.get_ident()}.tmp')
    partial.write_bytes(cubin)
    partial.replace(target)   # atomic: another process never loads half a cubin
    return target


_warned_cupy_nvrtc = []


def _warn_cupy_nvrtc(reason):
    if not _warned_cupy_nvrtc:
        _warned_cupy_nvrtc.append(reason)
        warnings.warn(f"gpuk: compiling kernels through CuPy's NVRTC because gpuk's cannot run ({reason}); "
                      "CuPy adds -ftz=true, so float32 denormals flush to zero, unlike in prebuilt cubins "
                      "(pip install cuda-bindings to compile with gpuk's options)", RuntimeWarning, stacklevel=4)


# GPUK_SYNC_LAUNCHES=1: wait for each launch (read when the runtime is made; set_sync_launches changes it)
_SYNC_LAUNCHES = [False]


def set_sync_launches(enabled):
    _SYNC_LAUNCHES[0] = bool(enabled)


class CudaKernel:
    def __init__(self, module, signature, function):
        self.module, self.signature, self.name = module, signature, signature.name
        self._function = function          # a cupy.RawKernel
        self._dynamic_limit = None         # what the device allows this kernel beside its static shared memory
        self._dynamic_allowed = None       # the kernel's current cudaFuncAttributeMaxDynamicSharedMemorySize
        self._launches = {}                # (grid, block, shared_mem) as given -> its CudaLaunch

    def _check_config(self, grid, block, shared_mem):
        """(grid, block, shared_mem) checked and normalized."""
        dims = runtime.launch_dims(self.name, grid, block)
        config = dims + (self._check_shared_mem(shared_mem),)
        self._opt_in(config[2])
        return config

    def _check_shared_mem(self, shared_mem):
        if self._dynamic_limit is None:
            static = int(self._function.shared_size_bytes)
            self._dynamic_limit = self.module.runtime.max_shared_mem - static
            self._dynamic_allowed = int(self._function.max_dynamic_shared_size_bytes)
        limit = self._dynamic_limit
        if isinstance(shared_mem, bool) or not isinstance(shared_mem, (int, np.integer)) \
                or not 0 <= shared_mem <= limit:
            raise ValueError(f"kernel '{self.name}': shared_mem must be an int in [0, {limit}] on this device "
                             f"(the opt-in limit less the kernel's static shared memory), got {shared_mem!r}")
        return int(shared_mem)

    def _opt_in(self, shared_mem):
        """Raise the kernel's dynamic shared-memory ceiling when a launch asks for more (CUDA's
        default is 48 KB less the static shared memory)."""
        if shared_mem > self._dynamic_allowed:
            self._function.max_dynamic_shared_size_bytes = shared_mem
            self._dynamic_allowed = shared_mem

    def coresident_blocks(self, threads_per_block, shared_mem=0):
        """How many blocks of this kernel the device holds at once (the occupancy rules of
        gpuk/kernels/inspect/occupancy.py for its registers and shared memory, times the SMs);
        0 where that is unknown (an architecture without limits there, or a function object
        that does not report its registers): a grid-wide barrier is safe up to this many."""
        from ..inspect import occupancy
        registers = getattr(self._function, 'num_regs', None)
        arch = self.module.runtime.arch
        if registers is None or arch not in occupancy.LIMITS:
            return 0
        static = int(getattr(self._function, 'shared_size_bytes', 0))
        per_sm = occupancy.theoretical(arch, threads_per_block, int(registers), static + shared_mem).blocks_per_sm
        return per_sm * self.module.runtime.multiprocessors

    def configured(self, grid, block, shared_mem=0):
        """The CudaLaunch of this kernel with (grid, block, shared_mem). Inside a prepared step
        (runtime.prepared_launches(): launches already checked for these shapes) a
        configuration checked before is reused; elsewhere, and under GPUK_CHECK_LAUNCHES=1, it
        is checked on every call (an int-equal bool or float must still raise its error)."""
        key = (grid, block, shared_mem)
        if not runtime.launch_checks_per_call():
            try:
                launch = self._launches.get(key)
            except TypeError:   # a list for a grid or block: checked, not kept
                launch = None
            if launch is not None:
                return launch
        launch = CudaLaunch(self, grid, block, shared_mem)
        if type(grid) is not list and type(block) is not list:
            self._launches[key] = launch
        return launch

    def launch(self, grid, block, args, shared_mem=0):
        """Enqueue the kernel on the current CuPy stream: ``configured(grid, block,
        shared_mem)(args)`` (dims and shared memory checked once per configuration, the
        arguments as CudaLaunch says)."""
        self.configured(grid, block, shared_mem)(args)


class CudaLaunch:
    """One kernel with one checked (grid, block, shared_mem): ``launch(args)`` enqueues it on
    the current stream; the one launch path of the CUDA runtime (CudaKernel.launch goes
    through it too). What a launcher's prepared problem keeps (runtime/prepared.py), so a
    repeated problem skips the module lookup (``rt.load`` keys its defines), the kernel lookup
    and the launch configuration's checks. The arguments are checked on every call outside
    runtime.prepared_launches() and under GPUK_CHECK_LAUNCHES=1."""
    __slots__ = ('kernel', 'config', '_function', '_grid', '_block', '_shared_mem', '_array_type', '_errors',
                 '_cupy')

    def __init__(self, kernel, grid, block, shared_mem):
        cupy = kernel.module.runtime.xp   # (no import statement: made per call outside prepared steps)
        self.kernel, self.config = kernel, kernel._check_config(grid, block, shared_mem)
        self._grid, self._block, self._shared_mem = self.config
        self._function, self._array_type, self._cupy = kernel._function, cupy.ndarray, cupy
        self._errors = (cupy.cuda.driver.CUDADriverError, cupy.cuda.runtime.CUDARuntimeError)

    def __call__(self, args):
        if not runtime._prepared_depth[0] or runtime._forced[0]:   # runtime.launch_checks_per_call()
            runtime.check_args(self.kernel.signature, args, self._array_type)
        try:
            if counters._active:   # counted and timed (bench.host_overhead)
                counters.device_call(self._function, self._grid, self._block, args, shared_mem=self._shared_mem)
            else:
                self._function(self._grid, self._block, args, shared_mem=self._shared_mem)
            if _SYNC_LAUNCHES[0]:   # attribute asynchronous faults to this launch
                self._cupy.cuda.get_current_stream().synchronize()
        except self._errors as exc:
            what = runtime.describe_launch(self.kernel.name, *self.config, args)
            raise runtime.KernelLaunchError(f"{what}: {exc}", kernel=self.kernel.name, kind='cuda') from exc


class CudaModule:
    def __init__(self, rt, source_file, defines, raw_module, signatures, cubin):
        self.runtime, self.source_file, self.defines = rt, source_file, dict(defines)
        self.raw_module, self.signatures, self.cubin = raw_module, signatures, cubin
        self._kernels = {}

    def kernel(self, name):
        if name not in self.signatures:
            raise ValueError(f"kernel: {Path(self.source_file).name} has no kernel {name!r}; "
                             f"it has {sorted(self.signatures)}")
        if name not in self._kernels:
            import cupy
            try:   # RawModule compiles (CuPy's NVRTC) or loads the cubin here, on first use
                function = self.raw_module.get_function(name)
            except cupy.cuda.compiler.CompileException as exc:
                raise runtime.KernelCompileError(
                    f"NVRTC failed on {Path(self.source_file).name} with defines {self.defines}:\n{exc}") from exc
            except (cupy.cuda.driver.CUDADriverError, cupy.cuda.runtime.CUDARuntimeError) as exc:
                raise runtime.KernelLaunchError(
                    f"kernel '{name}': loading {self.cubin or Path(self.source_file).name} on "
                    f"{self.runtime.arch} failed: {exc}", kernel=name, kind='cuda') from exc
            self._kernels[name] = CudaKernel(self, self.signatures[name], function)
        return self._kernels[name]


def max_shared_mem_per_block(device_id):
    """The most shared memory one block may use after opting in (the CUDA guide gives 227 KB for sm_90).

    Asked of the runtime by its enum: Device().attributes would build a dict of every
    attribute (one driver call each) to read one."""
    import cupy
    return int(cupy.cuda.runtime.deviceGetAttribute(cupy.cuda.runtime.cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                                    device_id))


class CudaRuntime:
    kind = 'cuda'

    def __init__(self):
        import cupy
        self.xp = cupy
        device = cupy.cuda.Device()
        self.device_id = device.id
        self.arch = runtime.normalize_arch(device.compute_capability)   # CuPy gives '90' for 9.0
        self.max_shared_mem = max_shared_mem_per_block(device.id)
        self.multiprocessors = int(device.attributes['MultiProcessorCount'])
        self.l2_bytes = int(device.attributes['L2CacheSize'])
        self._modules = {}
        self._loaded = {}        # (source_file, defines items) as given -> module: no re-keying per launch
        self._lock = threading.Lock()
        set_sync_launches(os.environ.get('GPUK_SYNC_LAUNCHES') == '1')

    def _raw_module(self, source_file, defines, arch):
        """(cupy.RawModule, the cubin it loads or None when CuPy compiles the source itself)."""
        import cupy
        from .build import NvrtcMissing, nvrtc_options
        cubin = runtime.cubin_path(source_file, defines, arch)
        if not cubin.is_file():
            try:
                cubin = compile_to_cache(source_file, defines, arch)
            except NvrtcMissing as exc:
                _warn_cupy_nvrtc(exc)
                options = nvrtc_options(source_file) + [f'-I{d}' for d in cuda_include_dirs()[:1]]
                return cupy.RawModule(code=kernel_source(source_file, defines), options=tuple(options)), None
        return cupy.RawModule(path=str(cubin)), cubin

    def load(self, source_file, defines=None, arch=None):
        """The module for (source_file, defines): a prebuilt cubin, else one compiled now (cached).
        ``arch``: the target when not the device's own (an sm_90a kernel on an sm_90 device).

        A module asked for again with the same arguments comes from a dict keyed by them (no
        hashing or stat of the sources per launch); under GPUK_CHECK_LAUNCHES=1 the sources
        are re-keyed on every call, so an edited kernel is recompiled in a live process."""
        try:
            fast_key = (source_file, tuple(sorted(defines.items())) if defines else (), arch)
            module = self._loaded.get(fast_key)
        except TypeError:   # unhashable define values: the full key below
            fast_key = module = None
        if module is not None and not runtime.check_launches_forced():
            return module
        module = self._load(source_file, defines, runtime.normalize_arch(arch) if arch else self.arch)
        if fast_key is not None:
            self._loaded[fast_key] = module
        return module

    def kernel_launch(self, source_file, defines, name, grid, block, shared_mem=0, arch=None):
        """A CudaLaunch of kernel ``name`` of ``load(source_file, defines, arch)`` with (grid,
        block, shared_mem) checked now (a launcher's prepare() keeps it per problem)."""
        return self.load(source_file, defines, arch).kernel(name).configured(grid, block, shared_mem)

    def _load(self, source_file, defines, arch):
        defines = dict(defines or {})
        key = source_key(source_file, defines, arch)   # memoized: no file read on a hit
        with self._lock:
            module = self._modules.get(key)
            if module is None:
                source_file = Path(source_file).resolve()
                signatures = parse_kernel_signatures(source_file, defines)
                raw, cubin = self._raw_module(source_file, defines, arch)
                module = self._modules[key] = CudaModule(self, source_file, defines, raw, signatures, cubin)
        return module

    def synchronize(self):
        self.xp.cuda.get_current_stream().synchronize()
