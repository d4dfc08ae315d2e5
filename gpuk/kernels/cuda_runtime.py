"""The CUDA runtime: kernels as CuPy RawModules launched on CuPy's current stream.

A prebuilt cubin at runtime.cubin_path(source, defines, arch) is loaded when present
(written by gpuk/kernels/build.py); otherwise the source is compiled with NVRTC through
CuPy, whose on-disk kernel cache (~/.cupy/kernel_cache) keeps the result across
processes. Modules are memoized in memory per (source + headers, defines, arch).
Arrays come from CuPy's memory pool (cupy.empty & co. in the launchers).
"""
import os
import threading
from pathlib import Path

import numpy as np

from . import runtime
from .kernel_source import KERNELS_DIR, kernel_source, parse_kernel_signatures, source_key

DEFAULT_SHARED_LIMIT = 48 * 1024   # above this a kernel must opt in (cudaFuncAttributeMaxDynamicSharedMemorySize)


def cuda_include_dirs():
    """Directories holding cuda_fp16.h / cuda_bf16.h for NVRTC, best first."""
    candidates = [os.environ.get('CUDA_PATH'), os.environ.get('CUDA_HOME'), '/usr/local/cuda']
    try:
        import cupy
        candidates.insert(0, cupy.cuda.get_cuda_path())
    except Exception:   # no cupy or no toolkit path: fall back to the environment
        pass
    return [str(Path(c) / 'include') for c in candidates if c and (Path(c) / 'include' / 'cuda_fp16.h').is_file()]


def nvrtc_options(source_file):
    """NVRTC options (without -arch) shared by the JIT path and the AOT build."""
    options = ['-std=c++17', f'-I{Path(source_file).resolve().parent}', f'-I{KERNELS_DIR}']
    options += [f'-I{d}' for d in cuda_include_dirs()[:1]]
    return options


class CudaKernel:
    def __init__(self, module, signature, function):
        self.module, self.signature, self.name = module, signature, signature.name
        self._function = function
        self._shared_opt_in = DEFAULT_SHARED_LIMIT

    def launch(self, grid, block, args, shared_mem=0):
        """Enqueue the kernel on the current CuPy stream."""
        import cupy
        grid, block = runtime.launch_dims(self.name, grid, block)
        limit = self.module.runtime.max_shared_mem
        if isinstance(shared_mem, bool) or not isinstance(shared_mem, (int, np.integer)) \
                or not 0 <= shared_mem <= limit:
            raise ValueError(f"kernel '{self.name}': shared_mem must be an int in [0, {limit}] on this device, "
                             f"got {shared_mem!r}")
        args = tuple(args)
        runtime.check_args(self.signature, args, cupy.ndarray)
        what = runtime.describe_launch(self.name, grid, block, shared_mem, args)
        try:
            if shared_mem > self._shared_opt_in:
                self._function.max_dynamic_shared_size_bytes = int(shared_mem)
                self._shared_opt_in = int(shared_mem)
            self._function(grid, block, args, shared_mem=int(shared_mem))
            if os.environ.get('GPUK_SYNC_LAUNCHES') == '1':   # attribute asynchronous faults to this launch
                cupy.cuda.get_current_stream().synchronize()
        except (cupy.cuda.driver.CUDADriverError, cupy.cuda.runtime.CUDARuntimeError) as exc:
            raise runtime.KernelLaunchError(f"{what}: {exc}", kernel=self.name, kind='cuda') from exc


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
            try:
                function = self.raw_module.get_function(name)
            except cupy.cuda.compiler.CompileException as exc:
                raise runtime.KernelCompileError(
                    f"NVRTC failed on {Path(self.source_file).name} with defines {self.defines}:\n{exc}") from exc
            self._kernels[name] = CudaKernel(self, self.signatures[name], function)
        return self._kernels[name]


class CudaRuntime:
    kind = 'cuda'

    def __init__(self):
        import cupy
        self.xp = cupy
        device = cupy.cuda.Device()
        self.arch = runtime.normalize_arch(device.compute_capability)
        attrs = device.attributes
        self.max_shared_mem = int(attrs.get('MaxSharedMemoryPerBlockOptin', DEFAULT_SHARED_LIMIT))
        self._modules = {}
        self._lock = threading.Lock()

    def load(self, source_file, defines=None):
        """The module for (source_file, defines): a prebuilt cubin if one matches, else NVRTC."""
        import cupy
        source_file = Path(source_file).resolve()
        defines = dict(defines or {})
        key = source_key(source_file, defines, self.arch)
        with self._lock:
            module = self._modules.get(key)
            if module is None:
                signatures = parse_kernel_signatures(source_file, defines)
                cubin = runtime.cubin_path(source_file, defines, self.arch)
                if cubin.is_file():
                    raw = cupy.RawModule(path=str(cubin))
                else:
                    cubin = None
                    raw = cupy.RawModule(code=kernel_source(source_file, defines),
                                         options=tuple(nvrtc_options(source_file)))
                module = self._modules[key] = CudaModule(self, source_file, defines, raw, signatures, cubin)
        return module

    def synchronize(self):
        self.xp.cuda.get_current_stream().synchronize()
