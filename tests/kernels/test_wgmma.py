"""The Hopper wgmma path: the emulator's wgmma (tests/kernels/cu/wgmma_test.cu, with planted
misuse) and conv_wgmma.cu forced on the emulator against the NumPy twin (forward pass)."""
import math
from pathlib import Path
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from gpuk import config
from gpuk.cpu_fallback import conv as twin
from gpuk.kernels import conv
from gpuk.kernels.conv import wgmma
from gpuk.kernels.runtime import KernelLaunchError, get_runtime
from gpuk.kernels.testing import assert_close, to_host

SOURCE = Path(__file__).with_name('cu') / 'wgmma_test.cu'
SHARED = 64 * 128 + 128 * 128 + 1024
BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture(scope='module')
def gemm():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 64)).astype(np.float16)
    b = rng.standard_normal((128, 64)).astype(np.float16)
    return get_runtime('emulate').load(SOURCE, {}).kernel('wgmma_gemm'), a, b


def _run(gemm, mode, threads=128):
    kernel, a, b = gemm
    d = np.zeros((64, 128), np.float32)
    kernel.launch(1, threads, (a, b, d, np.int32(mode)), shared_mem=SHARED)
    return d


@pytest.mark.parametrize('mode', [0, 6], ids=['swizzle-128B', 'no-swizzle'])
def test_wgmma_follows_the_ptx_layouts(gemm, mode):
    """K-major operands through descriptors (128-byte swizzle; no swizzle with LBO and SBO),
    four k16 steps, the accumulator fragment layout of PTX's m64nNk16: D = A B^T as float32
    sums of float16 products."""
    _, a, b = gemm
    d = _run(gemm, mode)
    np.testing.assert_allclose(d, a.astype(np.float64) @ b.astype(np.float64).T, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize('mode, kind, words', [
    (1, 'wgmma', ['without a wgmma.fence']),
    (2, 'wgmma', ['write of dynamic shared memory', 'not yet retired']),
    (3, 'synccheck', ['wgmma.mma_async in warpgroup 0', '96 of its 128 threads arrived', '32 exited']),
    (4, 'wgmma', ['descriptor b', 'dynamic shared memory']),
    (5, 'wgmma', ['never retired']),
], ids=['no-fence', 'operand-written-early', 'partial-warpgroup', 'descriptor-outside', 'never-waited'])
def test_wgmma_misuse_is_reported(gemm, mode, kind, words):
    with pytest.raises(KernelLaunchError) as info:
        _run(gemm, mode)
    assert info.value.kind == kind
    for word in words:
        assert word in str(info.value)


def test_wgmma_needs_whole_warpgroups(gemm):
    with pytest.raises(KernelLaunchError, match='multiple of 128'):
        _run(gemm, 0, threads=64)


# ---------------------------------------------------------------- conv_wgmma.cu

# (input spatial, kernel spatial, strides, dilation, pads, C_in, C_out, batch): channels_last,
# C_in a multiple of 8; M, N and K tails; 40 channels x 9 taps = 6 K tiles of 16-bit (12 of
# tf32) wrap the 4-stage ring; 136 output channels take two N tiles; 288 rows three M tiles.
CASES = [
    ((9, 11), (3, 3), (1, 2), (1, 1), ((1, 1), (1, 0)), 40, 20, 2),
    ((13,), (4,), (3,), (2,), ((0, 0),), 8, 136, 3),
    ((12, 12), (1, 1), (1, 1), (1, 1), ((0, 0), (0, 0)), 16, 6, 2),
    ((4, 5, 3), (2, 3, 2), (1, 2, 1), (1, 1, 2), ((0, 1), (1, 1), (1, 0)), 8, 3, 2),
]
PATHS = [(np.float16, 'float32'), (BF16, 'float32'), (np.float32, 'tf32')]


def _tf32_rounded(a):
    """float32 -> the tf32 operand the kernel multiplies: rounded half away from zero to 10
    mantissa bits in shared memory (cvt.rna) before wgmma reads its top 19 bits."""
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xffffe000)).view(np.float32)


@pytest.fixture
def precision():
    previous = config.precision()
    yield config.set_precision
    config.set_precision(previous)


@pytest.mark.parametrize('dtype, mode', PATHS, ids=['f16', 'bf16', 'tf32'])
def test_conv_wgmma_fwd_matches_twin(precision, dtype, mode):
    rt = get_runtime('emulate')
    precision(mode)
    rng = np.random.default_rng(4)
    for case in CASES:
        spatial, kernel, strides, dilation, pads, c_in, c_out, batch = case
        x = rng.standard_normal((batch, *spatial, c_in)).astype(dtype)
        w = rng.standard_normal((*kernel, c_in, c_out)).astype(dtype)
        bias = rng.standard_normal(c_out).astype(dtype)
        geometry = (strides, dilation, pads, 'channels_last')
        g = conv._geometry(conv.conv_checks.fwd_problem('conv_fwd', x, w, *geometry, np)[2])
        assert wgmma.fits(g, dtype, mode)
        xr, wr = ((_tf32_rounded(a) if mode == 'tf32' else a).astype(np.float64) for a in (x, w))
        ref = np.maximum(twin.conv_fwd(xr, wr, *geometry) + bias.astype(np.float64), 0)
        with wgmma.forced(True):
            out = conv.conv_fwd(x, w, *geometry, epilogue='bias_relu', bias=bias, runtime=rt)
        assert to_host(out).dtype == np.dtype(dtype)
        assert_close(out, ref, dtype, 'conv_wgmma_fwd %s on %s' % (np.dtype(dtype).name, case))
    assert any(m.source_file.name == 'conv_wgmma.cu' for m in rt._modules.values())


# Stride-1 dgrad problems (input spatial, kernel, dilation, pads, C_in, C_out, batch): C_out a
# multiple of 8; pads beyond the kernel's reach make the forward view's padding negative.
DGRAD_CASES = [
    ((9, 11), (3, 3), (1, 2), ((1, 1), (2, 0)), 12, 16, 2),
    ((13,), (4,), (2,), ((3, 0),), 8, 8, 3),
    ((4, 5, 3), (2, 3, 2), (1, 1, 2), ((0, 1), (1, 1), (1, 0)), 5, 8, 2),
    ((6, 7), (2, 2), (1, 1), ((2, 2), (0, 1)), 3, 24, 1),
]


@pytest.mark.parametrize('dtype, mode', PATHS, ids=['f16', 'bf16', 'tf32'])
def test_conv_wgmma_dgrad_matches_twin(precision, dtype, mode):
    """Stride-1 dgrad as a forward convolution of dy with the flipped filter, on the same kernel."""
    rt = get_runtime('emulate')
    precision(mode)
    rng = np.random.default_rng(6)
    for spatial, kernel, dilation, pads, c_in, c_out, batch in DGRAD_CASES:
        geometry = ((1,) * len(spatial), dilation, pads, 'channels_last')
        x_shape = (batch, *spatial, c_in)
        w = rng.standard_normal((*kernel, c_in, c_out)).astype(dtype)
        y_shape = twin.conv_fwd(np.zeros(x_shape, np.float32), w.astype(np.float32), *geometry).shape
        dy = rng.standard_normal(y_shape).astype(dtype)
        g = conv._geometry(conv.conv_checks.dgrad_problem('conv_dgrad', dy, w, x_shape, *geometry, np)[3])
        assert wgmma.fits(wgmma.dgrad_geometry(g), dtype, mode)
        dyr, wr = ((_tf32_rounded(a) if mode == 'tf32' else a).astype(np.float64) for a in (dy, w))
        with wgmma.forced(True):
            dx = conv.conv_dgrad(dy, w, x_shape, *geometry, runtime=rt)
        assert_close(dx, twin.conv_dgrad(dyr, wr, x_shape, *geometry), dtype,
                     'conv_dgrad on wgmma %s on %s' % (np.dtype(dtype).name, (spatial, kernel, dilation, pads)))


def test_wgmma_path_choice():
    """On the CUDA runtime of an sm_90 device for 16-bit and tf32 channels_last problems with
    vector-friendly channels; never elsewhere unless forced; forced(False) turns it off."""
    x16 = np.zeros((1, 8, 8, 16), np.float16)
    g = conv.Geometry(1, 16, 32, (1, 8, 8), (1, 8, 8), (1, 3, 3), (1, 1, 1), (1, 1, 1), (0, 1, 1), True)
    h100, a100 = SimpleNamespace(kind='cuda', arch='sm_90'), SimpleNamespace(kind='cuda', arch='sm_80')
    emulator = SimpleNamespace(kind='emulate')
    assert wgmma.applies(h100, g, x16, 'float32')
    assert not wgmma.applies(a100, g, x16, 'float32') and not wgmma.applies(emulator, g, x16, 'float32')
    assert not wgmma.applies(h100, g, x16.astype(np.float32), 'float32')    # strict float32: igemm's FFMA
    assert wgmma.applies(h100, g, x16.astype(np.float32), 'tf32')
    assert not wgmma.applies(h100, g, x16.astype(np.float64), 'tf32')
    assert not wgmma.applies(h100, g._replace(channels_last=False), x16, 'float32')
    assert not wgmma.applies(h100, g._replace(c_in=12), x16, 'float32')    # 12 channels: no 16-byte units
    with wgmma.forced(True):
        assert wgmma.applies(emulator, g, x16, 'float32')
        assert not wgmma.applies(emulator, g._replace(channels_last=False), x16, 'float32')
    with wgmma.forced(False):
        assert not wgmma.applies(h100, g, x16, 'float32')
    assert wgmma.launch_shape(g) == ((1, 1), 256, wgmma.SHARED_BYTES)
    assert wgmma.dgrad_geometry(g._replace(strides=(1, 2, 1))) is None   # strided dgrad: conv_igemm.cu
    assert wgmma.dgrad_geometry(g)._replace(pad_before=(0, 1, 1)) == g._replace(c_in=32, c_out=16)
    assert math.ceil(300 * 1 / 128) == wgmma.launch_shape(g._replace(c_out=300))[0][1]
