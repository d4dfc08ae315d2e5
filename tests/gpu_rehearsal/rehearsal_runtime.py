"""The CUDA runtime of the GPU rehearsal: gpuk's own CudaRuntime with the emulator behind it.

Everything of gpuk/kernels/runtime/cuda_runtime.py runs (the device queries, module memoization,
CudaModule.kernel, CudaKernel.launch with its shared-memory limit and opt-in, argument
checks against ``cupy.ndarray``, error wrapping) except ``_raw_module``, which would load a
cubin into the GPU: here it returns a RawModule look-alike whose kernels run the same .cu
on the emulated runtime, on the stand-in's (NumPy) arrays, in place.

Like CUDA, a launch asking for more dynamic shared memory than the kernel's
``max_dynamic_shared_size_bytes`` (48 KB until raised) fails, so a launcher that forgets
the opt-in fails here as it would on the GPU. Static shared memory is unknown to the
emulator and counted as 0.

Bench mode (``dry_launch_bytes``): a launch whose array arguments total more than that many
bytes is checked (dims, shared memory, arguments) but not run, so the benchmarks' big
shapes exercise their Python without hours of emulation; the arrays it may write are zeroed
instead (`_zero_outputs`). The test rehearsal never sets it.
"""
import sys

from gpuk.kernels import runtime
from gpuk.kernels.runtime import cuda_runtime
from gpuk.kernels.runtime.emulated_runtime import EmulatedRuntime
from . import standin_cupy

CUDA_DEFAULT_DYNAMIC_SHARED = 48 * 1024
_dry_launch_bytes = [None]


def set_dry_launch_bytes(limit):
    """Bench rehearsal: launches with more array bytes than ``limit`` are checked, not run (None: run all)."""
    _dry_launch_bytes[0] = limit


class EmulatedRawKernel:
    """What CudaKernel needs of a cupy.RawKernel, running the emulated kernel."""

    def __init__(self, emulated_kernel):
        self._kernel = emulated_kernel
        self.shared_size_bytes = 0
        self.max_dynamic_shared_size_bytes = CUDA_DEFAULT_DYNAMIC_SHARED

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        cupy = sys.modules['cupy']
        if shared_mem > self.max_dynamic_shared_size_bytes:
            # cuLaunchKernel's answer when the kernel did not opt in to this much
            raise cupy.cuda.driver.CUDADriverError(
                'CUDA_ERROR_INVALID_VALUE: dynamic shared memory %d above the kernel\'s '
                'max_dynamic_shared_size_bytes %d (rehearsal)' % (shared_mem, self.max_dynamic_shared_size_bytes))
        limit = _dry_launch_bytes[0]
        if limit is not None and sum(getattr(a, 'nbytes', 0) for a in args if hasattr(a, 'shape')) > limit:
            runtime.launch_dims(self._kernel.name, grid, block)
            runtime.check_args(self._kernel.signature, args, cupy.ndarray)
            _zero_outputs(self._kernel.signature, args)
            return
        # a capturing stream records the launch for its graph's replay instead of running it
        standin_cupy.run_or_record(self._kernel.launch, grid, block, args, shared_mem=shared_mem)


def _zero_outputs(signature, args):
    """A dry launch's outputs read as zeros rather than whatever the memory held: a flag a
    kernel computes (ctc_check_inputs' deferred value check, gpuk/kernels/runtime/deferred.py)
    then says "no error", and the step reads it as it would after a real launch."""
    for param, array in zip(signature.params, args):
        if param.is_pointer and not param.is_const:
            array.fill(0)


class EmulatedRawModule:
    """What CudaModule needs of a cupy.RawModule: get_function(name)."""

    def __init__(self, emulated_module):
        self._module = emulated_module

    def get_function(self, name):
        return EmulatedRawKernel(self._module.kernel(name))


class RehearsalCudaRuntime(cuda_runtime.CudaRuntime):
    """kind 'cuda', xp the CuPy stand-in, kernels compiled and run by the emulator."""

    def __init__(self):
        super().__init__()
        self.emulator = EmulatedRuntime()

    def _raw_module(self, source_file, defines, arch):
        return EmulatedRawModule(self.emulator.load(source_file, defines, arch=arch)), None
