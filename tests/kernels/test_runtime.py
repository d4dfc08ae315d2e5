"""The runtime API: argument checks, signature parsing, caching, build registry."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpuk.kernels import elementwise, runtime
from gpuk.kernels.runtime.emulated_runtime import EmulatedRuntime, rewrite_dynamic_shared
from gpuk.kernels.runtime.kernel_source import parse_kernel_signatures

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def copy_kernel(emulator):
    return emulator.load(elementwise.SOURCE, elementwise.defines(np.float32)).kernel('copy_bytes')


def test_python_scalars_are_rejected_naming_kernel_and_position(copy_kernel):
    src, dst = np.zeros(8, np.uint8), np.zeros(8, np.uint8)
    with pytest.raises(TypeError, match=r"kernel 'copy_bytes': argument 2 \(nbytes, 'long long'\) must be a "
                                        r"numpy.int64 scalar; got int"):
        copy_kernel.launch(1, 32, (src, dst, 8))
    with pytest.raises(TypeError, match=r"argument 2 \(nbytes, 'long long'\) must be numpy.int64, got numpy.int32"):
        copy_kernel.launch(1, 32, (src, dst, np.int32(8)))


def test_array_arguments_are_checked(copy_kernel):
    ok = np.zeros(8, np.uint8)
    with pytest.raises(TypeError, match=r"argument 0 \(src, 'const unsigned char\*'\) must have dtype uint8, got float32"):
        copy_kernel.launch(1, 32, (np.zeros(8, np.float32), ok, np.int64(8)))
    with pytest.raises(ValueError, match=r"argument 1 \(dst.*must be C-contiguous"):
        copy_kernel.launch(1, 32, (ok, np.zeros(16, np.uint8)[::2], np.int64(8)))
    readonly = np.zeros(8, np.uint8)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match=r"argument 1 \(dst.*read-only"):
        copy_kernel.launch(1, 32, (ok, readonly, np.int64(8)))
    copy_kernel.launch(1, 32, (readonly, ok, np.int64(8)))   # const parameters accept read-only arrays
    with pytest.raises(TypeError, match=r"kernel 'copy_bytes': takes 3 arguments \(src, dst, nbytes\), got 2"):
        copy_kernel.launch(1, 32, (ok, ok))


@pytest.mark.parametrize('grid, block, match', [(0, 32, 'grid entries must be positive'),
                                                (1, 2048, 'exceeds 1024 threads'),
                                                ((1, 70000), 32, 'exceeds'),
                                                (1, (1, 2, 3, 4), 'tuple of 1 to 3 ints')])
def test_bad_launch_configuration(copy_kernel, grid, block, match):
    with pytest.raises(ValueError, match=match):
        copy_kernel.launch(grid, block, (np.zeros(1, np.uint8), np.zeros(1, np.uint8), np.int64(1)))


def test_signature_parsing_resolves_defines_and_typedefs():
    sigs = parse_kernel_signatures(elementwise.SOURCE, elementwise.defines(np.float16))
    params = sigs['bias_act_fwd'].params
    assert [p.name for p in params] == ['x', 'bias', 'y', 'n', 'channels', 'inner', 'activation']
    assert [str(p.dtype) for p in params] == ['float16'] * 3 + ['int64'] * 3 + ['int32']
    assert [p.is_const for p in params[:3]] == [True, True, False]


@pytest.mark.parametrize('decl, match', [
    ('__global__ void k(float* y) {}', 'must be declared'),
    ('extern "C" __global__ void k(float** y) {}', 'pointer to pointer'),
    ('extern "C" __global__ void k(mystery_t v) {}', "unsupported parameter type 'mystery_t'"),
    ('extern "C" __global__ void k(float& v) {}', 'plain scalar or pointer'),
])
def test_signature_parser_is_strict(tmp_path, decl, match):
    path = tmp_path / 'bad.cu'
    path.write_text(decl + '\n')
    with pytest.raises(ValueError, match=match):
        parse_kernel_signatures(path)


def test_dynamic_shared_rewrite_requires_function_scope():
    body = 'extern "C" __global__ void k() {\n  extern __shared__ __align__(16) float buf[];\n}\n'
    out = rewrite_dynamic_shared(body, 'k.cu')
    assert 'float* const buf = reinterpret_cast<float*>(::gpuk_emu::dynamic_shared_base());' in out
    assert out.count('\n') == body.count('\n')
    with pytest.raises(ValueError, match='inside the kernel body'):
        rewrite_dynamic_shared('extern __shared__ float buf[];\n', 'k.cu')


def test_modules_are_memoized_in_memory_and_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv('GPUK_CACHE_DIR', str(tmp_path / 'cache'))
    (tmp_path / 'scale.cuh').write_text('#define SCALE 2.0f\n')
    source = tmp_path / 'scale.cu'
    source.write_text('#include "scale.cuh"\n'
                      'extern "C" __global__ void scale(const float* x, float* y, int n) {\n'
                      '  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = SCALE * x[i]; }\n')
    rt = EmulatedRuntime()
    module = rt.load(source, {'UNUSED': 1})
    assert rt.load(source, {'UNUSED': 1}) is module and rt.compile_count == 1
    fresh = EmulatedRuntime()
    fresh.load(source, {'UNUSED': 1})
    assert fresh.compile_count == 0                     # the .so came from the disk cache
    x = np.arange(40, dtype=np.float32)
    module.kernel('scale').launch(2, 32, (x, x, np.int32(40)))   # the same array twice: aliased, like on a GPU
    np.testing.assert_array_equal(x, 2 * np.arange(40, dtype=np.float32))
    (tmp_path / 'scale.cuh').write_text('#define SCALE 3.0f\n')   # a header change is a new module
    y = np.zeros(40, np.float32)
    fresh.load(source, {'UNUSED': 1}).kernel('scale').launch(2, 32, (np.ones(40, np.float32), y, np.int32(40)))
    assert fresh.compile_count == 1 and (y == 3).all()


def test_partly_overlapping_arguments_only_when_none_is_written(tmp_path, monkeypatch):
    """Two read-only arguments may share part of their memory (a fused kernel reading a value in
    place beside another view of it): each is read as it is; a written one may not."""
    monkeypatch.setenv('GPUK_CACHE_DIR', str(tmp_path / 'cache'))
    source = tmp_path / 'add.cu'
    source.write_text('extern "C" __global__ void add(const float* a, const float* b, float* y, int n) {\n'
                      '  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = a[i] + b[i]; }\n'
                      'extern "C" __global__ void shift(const float* a, float* y, int n) {\n'
                      '  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = a[i]; }\n')
    module = EmulatedRuntime().load(source)
    x = np.arange(12, dtype=np.float32)
    y = np.zeros(8, np.float32)
    module.kernel('add').launch(1, 32, (x[:8], x[4:], y, np.int32(8)))
    np.testing.assert_array_equal(y, x[:8] + x[4:])
    with pytest.raises(ValueError, match='arguments 0 and 1 partly overlap and one is written'):
        module.kernel('shift').launch(1, 32, (x[:8], x[4:], np.int32(8)))
    # written through a later argument identical to a read-only one (the two share one mapping,
    # no longer read-only): checked once every argument is marshalled
    with pytest.raises(ValueError, match='arguments 0 and 1 partly overlap and one is written'):
        module.kernel('add').launch(1, 32, (x[:8], x[4:], x[:8], np.int32(8)))


def test_compile_errors_carry_compiler_output(tmp_path, monkeypatch):
    monkeypatch.setenv('GPUK_CACHE_DIR', str(tmp_path))
    source = tmp_path / 'broken.cu'
    source.write_text('extern "C" __global__ void broken(float* y) { y[0] = undefined_name; }\n')
    with pytest.raises(runtime.KernelCompileError, match='undefined_name'):
        EmulatedRuntime().load(source)


def test_build_registry_and_cubin_paths(monkeypatch, tmp_path):
    builds = runtime.registered_builds()
    ew = [b for b in builds if Path(b.source_file).name == 'elementwise.cu']
    assert {b.defines_dict['ELEMENT_T'] for b in ew} == {'__half', 'float', 'double'}
    assert any('copy_bytes' in b.kernels for b in ew)
    monkeypatch.setenv('GPUK_CUBIN_DIR', str(tmp_path))
    d32, d64 = elementwise.defines(np.float32), elementwise.defines(np.float64)
    p = runtime.cubin_path(elementwise.SOURCE, d32, 'sm_90')
    assert p.parent == tmp_path and p.name.endswith('-sm_90.cubin') and p.name.startswith('elementwise-')
    assert p == runtime.cubin_path(elementwise.SOURCE, dict(reversed(list(d32.items()))), 90)
    assert p != runtime.cubin_path(elementwise.SOURCE, d64, 'sm_90')
    assert p != runtime.cubin_path(elementwise.SOURCE, d32, 'sm_80')
    with pytest.raises(TypeError, match='kernels must be a non-empty list'):
        runtime.register_build(elementwise.SOURCE, d32, 'copy_bytes')


def test_current_runtime_selection(monkeypatch):
    previous = runtime.set_current(None)
    try:
        monkeypatch.setenv('GPUK_DEVICE', 'emulate')
        assert runtime.current().kind == 'emulate'
        monkeypatch.setenv('GPUK_DEVICE', 'tpu')
        with pytest.raises(ValueError, match="GPUK_DEVICE must be"):
            runtime.current()
        runtime.set_current('emulate')
        assert runtime.current() is runtime.get_runtime('emulate')
        assert runtime.resolve('emulate') is runtime.get_runtime('emulate')
        with pytest.raises(ValueError, match="set_current: kind must be one of"):
            runtime.set_current('gpu')
        with pytest.raises(ValueError, match="get_runtime: kind must be one of"):
            runtime.get_runtime('opencl')
    finally:
        runtime.set_current(previous)


def test_importing_kernels_does_not_import_cupy():
    code = ('import sys, gpuk.kernels, gpuk.kernels.elementwise; from gpuk.kernels import runtime; '
            'runtime.registered_builds(); assert "cupy" not in sys.modules, "cupy imported"')
    result = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_cubins_compiled_on_first_use_equal_the_prebuilt_ones(tmp_path, monkeypatch):
    """The CUDA runtime compiles with the AOT build's NVRTC call and options (not CuPy's, which
    appends -ftz=true), so a kernel is the same machine code with or without the build."""
    from gpuk.kernels.runtime import build
    from gpuk.kernels.runtime import cuda_runtime
    monkeypatch.setenv('GPUK_CACHE_DIR', str(tmp_path / 'cache'))
    spec = next(s for s in runtime.registered_builds()
                if Path(s.source_file).name == 'elementwise.cu' and 'copy_bytes' in s.kernels)
    try:
        jit = cuda_runtime.compile_to_cache(spec.source_file, spec.defines_dict, 'sm_90')
    except build.NvrtcMissing as exc:
        pytest.skip(f'NVRTC is not installed: {exc}')
    aot = build.install(build.cached_build(spec, 'sm_90', tmp_path / 'nvrtc'), tmp_path / 'prebuilt')   # what build does
    assert aot.error is None
    assert jit == cuda_runtime.jit_cubin_path(spec.source_file, spec.defines_dict, 'sm_90')
    assert jit.name == aot.path.name and jit.read_bytes() == aot.path.read_bytes()
    assert cuda_runtime.compile_to_cache(spec.source_file, spec.defines_dict, 'sm_90') == jit   # cached


def test_first_use_compile_errors_carry_the_nvrtc_log(tmp_path, monkeypatch):
    from gpuk.kernels.runtime import build
    from gpuk.kernels.runtime import cuda_runtime
    monkeypatch.setenv('GPUK_CACHE_DIR', str(tmp_path / 'cache'))
    source = tmp_path / 'broken.cu'
    source.write_text('extern "C" __global__ void broken(float* y) { y[0] = undefined_name; }\n')
    try:
        build.nvrtc_version()
    except build.NvrtcMissing as exc:
        pytest.skip(f'NVRTC is not installed: {exc}')
    with pytest.raises(runtime.KernelCompileError, match='undefined_name'):
        cuda_runtime.compile_to_cache(source, {}, 'sm_90')
    assert not list((tmp_path / 'cache').rglob('*.cubin'))


def test_one_function_reads_an_arrays_address_for_cublas_cudnn_and_the_alignment_tests():
    """runtime.device_pointer: a NumPy array's host address (the emulated runtime's and the GPU
    rehearsal's arrays), a CuPy array's ``data.ptr``; cuDNN's library and MatMul's cuBLAS
    arguments and wgmma's alignment test read it through this one function."""
    import types
    from gpuk.kernels import matmul
    from gpuk.kernels.conv import wgmma
    from gpuk.kernels.cudnn import library
    array = np.zeros(8, np.float32)
    assert runtime.device_pointer(array) == array.ctypes.data
    assert runtime.device_pointer(array[1:]) == array.ctypes.data + 4
    assert runtime.device_pointer(types.SimpleNamespace(data=types.SimpleNamespace(ptr=4096))) == 4096
    assert library.device_pointer is matmul.device_pointer is wgmma.device_pointer is runtime.device_pointer
    assert wgmma._aligned16(types.SimpleNamespace(data=types.SimpleNamespace(ptr=4096)))
    assert not wgmma._aligned16(types.SimpleNamespace(data=types.SimpleNamespace(ptr=4104)))
