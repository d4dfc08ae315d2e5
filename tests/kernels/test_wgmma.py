"""The Hopper wgmma path: the emulator's wgmma (tests/kernels/cu/wgmma_test.cu, with planted
misuse) and conv_wgmma.cu forced on the emulator against the NumPy twin (forward, dgrad in
stride phases, split-K wgrad), and the launchers' choice of it."""
import math
from pathlib import Path
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from gpuk import config
from gpuk.cpu_fallback import conv as twin
from gpuk.kernels import conv
from gpuk.kernels.conv import tiles as conv_tiles
from gpuk.kernels.conv import wgmma
from gpuk.kernels.runtime import KernelLaunchError, get_runtime
from gpuk.kernels.testing import assert_close, round_tf32, to_device, to_host

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
    (7, 'wgmma', ['thread (5, 0, 0)', 'generic proxy', 'no fence.proxy.async']),
    (8, 'wgmma', ['write of dynamic shared memory', 'not yet retired']),
], ids=['no-fence', 'operand-written-early', 'partial-warpgroup', 'descriptor-outside', 'never-waited',
        'no-proxy-fence', 'operand-written-before-the-warpgroup-waited'])
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

# (input spatial, kernel spatial, strides, dilation, pads, C_in, C_out, batch, tile): channels_last,
# C_in a multiple of 8; M, N and K tails; 40 channels x 9 taps = 6 K tiles of 16-bit (12 of
# tf32) wrap the 4-stage ring; 136 output channels take two N tiles of 128 (three of 64); 288
# rows three M tiles. tile: the one forced (wgmma.forced), None: the rule's (128x64 on these
# small grids).
CASES = [
    ((9, 11), (3, 3), (1, 2), (1, 1), ((1, 1), (1, 0)), 40, 20, 2, None),
    ((13,), (4,), (3,), (2,), ((0, 0),), 8, 136, 3, '128x128'),
    ((13,), (4,), (3,), (2,), ((0, 0),), 8, 136, 3, None),
    ((12, 12), (1, 1), (1, 1), (1, 1), ((0, 0), (0, 0)), 16, 6, 2, '128x128'),
    ((4, 5, 3), (2, 3, 2), (1, 2, 1), (1, 1, 2), ((0, 1), (1, 1), (1, 0)), 8, 3, 2, None),
]
PATHS = [(np.float16, 'float32'), (BF16, 'float32'), (np.float32, 'tf32')]


def _runs_tile(choose, g, tile):
    """Asserts the tile conv_wgmma's launcher picks for Geometry g (choose: wgmma.fwd_tile, ...)
    under forced(True, tile): the forced one, else the rule's 128x64 (these grids are small)."""
    with wgmma.forced(True, tile=tile):
        assert wgmma.tile_name(choose(g)) == (tile or '128x64')


def _both_tiles_loaded(rt, dtype):
    """Whether conv_wgmma.cu's builds of both tiles for dtype ran on rt."""
    element_t = wgmma.defines(dtype)['ELEMENT_T']
    return {str(m.defines.get('WG_BN')) for m in rt._modules.values()
            if m.source_file.name == 'conv_wgmma.cu' and m.defines.get('ELEMENT_T') == element_t} >= {'64', '128'}


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
        spatial, kernel, strides, dilation, pads, c_in, c_out, batch, tile = case
        x = rng.standard_normal((batch, *spatial, c_in)).astype(dtype)
        w = rng.standard_normal((*kernel, c_in, c_out)).astype(dtype)
        bias = rng.standard_normal(c_out).astype(dtype)
        geometry = (strides, dilation, pads, 'channels_last')
        g = conv._geometry(conv.conv_checks.fwd_problem('conv_fwd', x, w, *geometry, np)[2])
        assert wgmma.fits(g, dtype, mode)
        _runs_tile(wgmma.fwd_tile, g, tile)
        xr, wr = ((round_tf32(a) if mode == 'tf32' else a).astype(np.float64) for a in (x, w))
        ref = np.maximum(twin.conv_fwd(xr, wr, *geometry) + bias.astype(np.float64), 0)
        with wgmma.forced(True, tile=tile):
            out = conv.conv_fwd(x, w, *geometry, epilogue='bias_relu', bias=bias, runtime=rt)
        assert to_host(out).dtype == np.dtype(dtype)
        assert_close(out, ref, dtype, 'conv_wgmma_fwd %s on %s' % (np.dtype(dtype).name, case))
    assert _both_tiles_loaded(rt, dtype)


# dgrad problems (input spatial, kernel, strides, dilation, pads, C_in, C_out, batch): C_out a
# multiple of 8. Stride 1 (one phase; pads beyond the kernel's reach make the phase's offsets
# point past dy); strides 2 and 3 with dilation (phases with fewer taps), a 1x1 stride-2 layer
# (3 of 4 phases have no tap: zeros) with 136 input channels (two N tiles), 200 rows in a phase
# (two M tiles), and a 3-d problem with a different stride per dim; tile as in CASES.
DGRAD_CASES = [
    ((9, 11), (3, 3), (1, 1), (1, 2), ((1, 1), (2, 0)), 12, 16, 2, None),
    ((13,), (4,), (1,), (2,), ((3, 0),), 8, 8, 3, '128x128'),
    ((6, 7), (2, 2), (1, 1), (1, 1), ((2, 2), (0, 1)), 3, 24, 1, None),
    ((9, 11), (3, 3), (2, 2), (1, 2), ((1, 1), (2, 0)), 12, 16, 2, None),
    ((13,), (4,), (3,), (2,), ((0, 0),), 8, 16, 3, '128x128'),
    ((12, 12), (1, 1), (2, 2), (1, 1), ((0, 0), (0, 0)), 136, 8, 2, None),
    ((20, 20), (3, 3), (2, 2), (1, 1), ((1, 1), (1, 1)), 8, 8, 2, '128x128'),
    ((5, 7, 6), (2, 3, 2), (2, 1, 3), (1, 2, 1), ((0, 1), (2, 1), (1, 0)), 5, 8, 2, None),
]


@pytest.mark.parametrize('dtype, mode', PATHS, ids=['f16', 'bf16', 'tf32'])
def test_conv_wgmma_dgrad_matches_twin(precision, dtype, mode):
    """Every dgrad on conv_wgmma_dgrad: one stride phase per grid z, only the taps that land on
    the phase's pixels (the implicit GEMM's decomposition, DgradPhase in conv_common.cuh)."""
    rt = get_runtime('emulate')
    precision(mode)
    rng = np.random.default_rng(6)
    for spatial, kernel, strides, dilation, pads, c_in, c_out, batch, tile in DGRAD_CASES:
        geometry = (strides, dilation, pads, 'channels_last')
        x_shape = (batch, *spatial, c_in)
        w = rng.standard_normal((*kernel, c_in, c_out)).astype(dtype)
        y_shape = twin.conv_fwd(np.zeros(x_shape, np.float32), w.astype(np.float32), *geometry).shape
        dy = rng.standard_normal(y_shape).astype(dtype)
        g = conv._geometry(conv.conv_checks.dgrad_problem('conv_dgrad', dy, w, x_shape, *geometry, np)[3])
        assert wgmma.dgrad_fits(g, dtype, mode)
        _runs_tile(wgmma.dgrad_tile, g, tile)
        dyr, wr = ((round_tf32(a) if mode == 'tf32' else a).astype(np.float64) for a in (dy, w))
        with wgmma.forced(True, tile=tile):
            dx = conv.conv_dgrad(dy, w, x_shape, *geometry, runtime=rt)
        assert to_host(dx).dtype == np.dtype(dtype)
        assert_close(dx, twin.conv_dgrad(dyr, wr, x_shape, *geometry), dtype,
                     'conv_dgrad on wgmma %s on %s' % (np.dtype(dtype).name, (spatial, kernel, strides, dilation)))
    assert _both_tiles_loaded(rt, dtype)


# wgrad problems (input spatial, kernel, strides, dilation, pads, C_in, C_out, batch, forced
# splits): C_in and C_out multiples of 8. M = taps * C_in with tails (360 rows: three M tiles),
# 136 output channels (two N tiles), K = batch * output pixels with tails, split 3 ways
# (800 = 7 K tiles of 16-bit, 13 of tf32; the last split partial), strides with dilation,
# a 1x1 stride-2 layer, 3-d; tile as in CASES (the rule: 128x64 for C_out <= 64, else 128x128).
WGRAD_CASES = [
    ((9, 11), (3, 3), (2, 1), (1, 2), ((1, 1), (2, 0)), 40, 24, 2, None, None),
    ((13,), (4,), (3,), (2,), ((0, 0),), 8, 136, 3, None, None),
    ((13,), (4,), (3,), (2,), ((0, 0),), 8, 136, 3, None, '128x64'),
    ((20, 20), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), 8, 16, 2, 3, None),
    ((20, 20), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), 8, 16, 2, 3, '128x128'),
    ((12, 12), (1, 1), (2, 2), (1, 1), ((0, 0), (0, 0)), 136, 8, 2, None, '128x128'),
    ((4, 5, 3), (2, 3, 2), (1, 2, 1), (1, 1, 2), ((0, 1), (1, 1), (1, 0)), 8, 8, 2, None, None),
]


@pytest.mark.parametrize('dtype, mode', PATHS, ids=['f16', 'bf16', 'tf32'])
def test_conv_wgmma_wgrad_matches_twin(precision, dtype, mode):
    """wgrad on conv_wgmma_wgrad (operands transposed to K-major by the producer), split over K
    with the float32 partials added in split order by conv_wgmma_reduce_splits."""
    rt = get_runtime('emulate')
    precision(mode)
    rng = np.random.default_rng(8)
    for spatial, kernel, strides, dilation, pads, c_in, c_out, batch, splits, tile in WGRAD_CASES:
        geometry = (strides, dilation, pads, 'channels_last')
        x = rng.standard_normal((batch, *spatial, c_in)).astype(dtype)
        w_shape = (*kernel, c_in, c_out)
        y_shape = twin.conv_fwd(np.zeros(x.shape, np.float32), np.zeros(w_shape, np.float32), *geometry).shape
        dy = rng.standard_normal(y_shape).astype(dtype)
        g = conv._geometry(conv.conv_checks.wgrad_problem('conv_wgrad', x, dy, w_shape, *geometry, np)[3])
        assert wgmma.wgrad_fits(g, dtype, mode)
        if tile or c_out <= 64:
            _runs_tile(wgmma.wgrad_tile, g, tile)
        else:
            assert wgmma.wgrad_tile(g) == 128   # C_out 136: no fill rule for wgrad
        if splits:
            with conv_tiles.forced(splits=splits):
                assert wgmma.wgrad_plan(g, dtype)[0][2] == splits
        xr, dyr = ((round_tf32(a) if mode == 'tf32' else a).astype(np.float64) for a in (x, dy))
        with wgmma.forced(True, tile=tile), conv_tiles.forced(splits=splits):
            dw = conv.conv_wgrad(x, dy, w_shape, *geometry, runtime=rt)
        assert to_host(dw).dtype == np.dtype(dtype) and dw.shape == w_shape
        assert_close(dw, twin.conv_wgrad(xr, dyr, w_shape, *geometry), dtype,
                     'conv_wgrad on wgmma %s on %s' % (np.dtype(dtype).name, (spatial, kernel, strides, splits, tile)))


def test_wgmma_path_choice():
    """On the CUDA runtime of an sm_90 device for 16-bit and tf32 channels_last problems with
    vector-friendly channels; never elsewhere unless forced; forced(False) turns it off."""
    x16 = np.zeros((1, 8, 8, 16), np.float16)
    g = conv.Geometry(1, 16, 32, (1, 8, 8), (1, 8, 8), (1, 3, 3), (1, 1, 1), (1, 1, 1), (0, 1, 1), True)
    h100, a100 = SimpleNamespace(kind='cuda', arch='sm_90'), SimpleNamespace(kind='cuda', arch='sm_80')
    emulator = SimpleNamespace(kind='emulate')
    assert wgmma.fits(g, np.float16, 'float32') and wgmma.applies(h100, True, x16)
    assert not wgmma.applies(a100, True, x16) and not wgmma.applies(emulator, True, x16)
    assert not wgmma.applies(h100, False, x16)                               # a problem that does not fit
    assert not wgmma.fits(g, np.float32, 'float32')    # strict float32: igemm's FFMA
    assert wgmma.fits(g, np.float32, 'tf32')
    assert not wgmma.fits(g, np.float64, 'tf32')
    assert not wgmma.fits(g._replace(channels_last=False), np.float16, 'float32')
    assert not wgmma.fits(g._replace(c_in=12), np.float16, 'float32')    # 12 channels: no 16-byte units
    with wgmma.forced(True):
        assert wgmma.applies(emulator, True, x16)
        assert not wgmma.applies(emulator, False, x16)
    with wgmma.forced(False):
        assert not wgmma.applies(h100, True, x16)
    assert wgmma.launch_shape(g) == ((1, 1), 256, wgmma.shared_bytes(64))   # C_out 32: the 128x64 tile
    assert wgmma.launch_shape(g._replace(c_out=300))[0][1] == math.ceil(300 / 64)   # 3 blocks: far under a wave
    assert wgmma.launch_shape(g._replace(c_out=300), 128) == ((1, 3), 256, wgmma.SHARED_BYTES)
    # dgrad reads dy's C_out channels in 16-byte units, wgrad x's C_in and dy's C_out; strides too
    dy16 = np.zeros((1, 8, 8, 32), np.float16)
    strided = g._replace(strides=(1, 2, 2), out_sp=(1, 4, 4))
    for geometry in (g, strided):
        assert wgmma.dgrad_fits(geometry, np.float16, 'float32')
        assert wgmma.wgrad_fits(geometry, np.float16, 'float32')
        assert not wgmma.dgrad_fits(geometry, np.float32, 'float32')
        assert wgmma.wgrad_fits(geometry, np.float32, 'tf32')
    assert wgmma.dgrad_fits(g._replace(c_in=12), np.float16, 'float32')        # C_in: the output
    assert not wgmma.dgrad_fits(g._replace(c_out=12), np.float16, 'float32')   # C_out: dy's units
    assert not wgmma.wgrad_fits(g._replace(c_in=12), np.float16, 'float32')
    assert not wgmma.wgrad_fits(g._replace(c_out=20), np.float16, 'float32')
    assert not wgmma.dgrad_fits(g._replace(channels_last=False), np.float16, 'float32')
    assert not wgmma.dgrad_fits(g._replace(strides=(1, 256, 256)), np.float16, 'float32')   # > 65535 phases
    misaligned = np.zeros(8 * 8 * 32 + 1, np.float16)[1:].reshape(1, 8, 8, 32)
    assert wgmma.applies(h100, True, x16, dy16) and not wgmma.applies(h100, True, misaligned)
    assert not wgmma.applies(h100, True, x16, misaligned)
    assert wgmma.dgrad_launch_shape(strided._replace(c_in=300)) == ((1, 5, 4), 256, wgmma.shared_bytes(64))
    # wgrad: M = taps * C_in, N = C_out, splits along K = batch * output pixels (tiles.py's rule)
    big = g._replace(batch=32, in_sp=(1, 56, 56), out_sp=(1, 56, 56), c_in=64, c_out=64)
    grid, per_split = wgmma.wgrad_plan(big, np.float16)
    assert grid[:2] == (math.ceil(9 * 64 / 128), 1) and per_split % wgmma.k_step(np.float16) == 0
    assert grid[2] == math.ceil(32 * 56 * 56 / per_split) > 1
    with conv_tiles.forced(splits=1):
        assert wgmma.wgrad_plan(big, np.float16) == ((5, 1, 1), math.ceil(32 * 56 * 56 / 128) * 128)
    assert wgmma.k_step(np.float32) == 64 and wgmma.k_step(BF16) == 128


class _Sm90Runtime:
    """The emulated runtime presented as an sm_90 CUDA device: what the launchers see on an H100."""
    kind, arch = 'cuda', 'sm_90'

    def __init__(self, emulated):
        self._emulated = emulated

    def __getattr__(self, name):
        return getattr(self._emulated, name)


def test_launchers_choose_wgmma_on_sm90_devices(kernel_runtime, precision):
    """conv_fwd, conv_dgrad (strided) and conv_wgrad on an sm_90 device launch conv_wgmma.cu's
    kernels, not the implicit GEMM's, without forcing, and give the twin's results (on the
    emulator: the emulated runtime presented as an sm_90 device; on CUDA: an sm_90 device)."""
    if kernel_runtime.kind == 'emulate':
        loader, rt = kernel_runtime, _Sm90Runtime(kernel_runtime)
    elif getattr(kernel_runtime, 'arch', None) == 'sm_90':
        loader = rt = kernel_runtime
    else:
        pytest.skip('the wgmma path is for sm_90 devices; this one is %s' % getattr(kernel_runtime, 'arch', None))
    loaded = []
    load = loader.load

    def recording_load(source, defines=None, arch=None):
        loaded.append((Path(source).name, arch))
        return load(source, defines, arch=arch)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 6, 6, 16)).astype(np.float16)
    w = rng.standard_normal((3, 3, 16, 8)).astype(np.float16)
    geometry = ((2, 2), (1, 1), ((1, 1), (1, 1)), 'channels_last')
    dy = rng.standard_normal((2, 3, 3, 8)).astype(np.float16)
    xd, wd, dyd = (to_device(kernel_runtime, a) for a in (x, w, dy))
    loader.load = recording_load
    try:
        y = conv.conv_fwd(xd, wd, *geometry, runtime=rt)
        dx = conv.conv_dgrad(dyd, wd, x.shape, *geometry, runtime=rt)
        dw = conv.conv_wgrad(xd, dyd, w.shape, *geometry, runtime=rt)
    finally:
        del loader.load
    assert loaded and set(loaded) == {('conv_wgmma.cu', 'sm_90a')}
    xr, wr, dyr = (a.astype(np.float64) for a in (x, w, dy))
    assert_close(y, twin.conv_fwd(xr, wr, *geometry), np.float16, 'fwd')
    assert_close(dx, twin.conv_dgrad(dyr, wr, x.shape, *geometry), np.float16, 'dgrad')
    assert_close(dw, twin.conv_wgrad(xr, dyr, w.shape, *geometry), np.float16, 'wgrad')


def test_wgmma_launches_are_prepared_once_per_problem(monkeypatch):
    """Whether a problem fits the wgmma path, and the grid, split plan and scalars of each wgmma
    launch, are decided on a problem's first call and kept (runtime/prepared.py), as the
    implicit GEMM's are: later calls only check the alignment and launch."""
    rt = _Sm90Runtime(get_runtime('emulate'))
    made = []
    for name in ('fwd_launch', 'dgrad_launch', 'wgrad_launch'):
        def counted(*args, _make=getattr(wgmma, name), _name=name):
            made.append(_name)
            return _make(*args)
        monkeypatch.setattr(wgmma, name, counted)
    for op, fits in list(wgmma.FITS.items()):   # whether the problem fits: decided once too
        def counted_fits(*args, _fits=fits, _op=op):
            made.append(_op + ' fits')
            return _fits(*args)
        monkeypatch.setitem(wgmma.FITS, op, counted_fits)
    x = np.ones((1, 4, 4, 8), np.float16)
    w = np.ones((1, 1, 8, 8), np.float16)
    geometry = ((2, 2), (1, 1), ((0, 0), (0, 0)), 'channels_last')
    dy = np.ones((1, 2, 2, 8), np.float16)
    for _ in range(2):
        conv.conv_fwd(x, w, *geometry, runtime=rt)
        dx = conv.conv_dgrad(dy, w, x.shape, *geometry, runtime=rt)
        dw = conv.conv_wgrad(x, dy, w.shape, *geometry, runtime=rt)
    assert sorted(made) == ['dgrad fits', 'dgrad_launch', 'fwd fits', 'fwd_launch', 'wgrad fits', 'wgrad_launch']
    assert to_host(dx)[0, ::2, ::2].min() == 8 and to_host(dx)[0, 1::2].max() == 0   # stride holes: zeros
    assert (to_host(dw) == 4).all()


def test_wgmma_tile_rule():
    """The tile table's rule (conv/wgmma.py): 128x64 where N <= 64 or, for fwd and dgrad, where
    128x128 blocks would not make one wave on 132 SMs; wgrad's split-K fills the SMs itself."""
    def layer(batch, size, k, c_in, c_out, stride=1):
        out = size // stride
        return conv.Geometry(batch, c_in, c_out, (1, size, size), (1, out, out), (1, k, k), (1, stride, stride),
                             (1, 1, 1), (0, k // 2, k // 2), True)
    assert wgmma.fwd_tile(layer(32, 56, 1, 256, 64)) == 64              # ResNet-50 stage 1: C_out 64
    assert wgmma.fwd_tile(layer(32, 56, 3, 64, 64)) == 64
    assert wgmma.fwd_tile(layer(32, 56, 1, 64, 256)) == 128             # 784 x 2 blocks
    assert wgmma.fwd_tile(layer(32, 7, 3, 512, 512)) == 64              # 13 x 4 blocks < 132
    assert wgmma.fwd_tile(layer(256, 7, 3, 512, 512)) == 128            # 98 x 4 blocks
    assert wgmma.dgrad_tile(layer(32, 56, 3, 64, 64)) == 64             # N = C_in 64
    assert wgmma.dgrad_tile(layer(32, 56, 1, 64, 256, stride=2)) == 64  # N = C_in 64
    assert wgmma.dgrad_tile(layer(32, 56, 1, 256, 512, stride=2)) == 128   # 196 x 2 x 4 phases
    assert wgmma.dgrad_tile(layer(8, 14, 1, 256, 512, stride=2)) == 64     # 4 x 2 x 4 phases
    assert wgmma.wgrad_tile(layer(32, 56, 3, 64, 64)) == 64             # N = C_out 64
    assert wgmma.wgrad_tile(layer(1, 7, 1, 512, 2048)) == 128           # small M: split-K fills
    g = layer(32, 7, 3, 512, 512)
    with wgmma.forced(True, tile='128x128'):
        assert wgmma.fwd_tile(g) == 128 and wgmma.launch_key() == 'wgmma 128x128'
    assert wgmma.launch_key() == 'wgmma'
    with pytest.raises(ValueError, match='128x64'):
        with wgmma.forced(True, tile='64x64'):
            pass
    # the wgrad split plan sizes its grid with the chosen tile
    grid, _ = wgmma.wgrad_plan(layer(32, 56, 3, 64, 64), np.float16)
    assert grid[:2] == (math.ceil(9 * 64 / 128), 1)
    grid, _ = wgmma.wgrad_plan(layer(32, 56, 3, 64, 64), np.float16, 128)
    assert grid[:2] == (math.ceil(9 * 64 / 128), 1)
    assert wgmma.wgrad_plan(layer(2, 8, 3, 64, 200), np.float16)[0][1] == 2
