"""Convolution kernels (gpuk/kernels/conv/__init__.py) against their NumPy twins, on every kernel runtime.

Shapes are tiny (the emulator runs each thread as a fiber) but odd, so every tile has tails.
"""
import contextlib
import math
import functools

import ml_dtypes
import numpy as np
import pytest

from gpuk import config
from gpuk.cpu_fallback import conv as twin
from gpuk.kernels import conv
from gpuk.kernels.conv import direct as conv_direct
from gpuk.kernels.conv import tiles as conv_tiles
from gpuk.kernels.conv import wgmma as conv_wgmma
from gpuk.kernels.runtime.emulated_runtime import aligned_copy
from gpuk.kernels.testing import assert_close, assert_matches_twin, relative_error, round_tf32, to_device, to_host

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.float16, BF16, np.float32, np.float64]
DTYPE_IDS = [np.dtype(d).name for d in DTYPES]
FORMATS = ['channels_last', 'channels_first']

# (input spatial, kernel spatial, strides, dilation, pads, C_in, C_out)
CONV_CASES = [
    ((11,), (3,), (1,), (1,), ((1, 1),), 3, 5),                      # conv1d 'same'
    ((13,), (4,), (3,), (2,), ((0, 0),), 4, 6),                      # conv1d strided, dilated, valid
    ((7, 6), (3, 2), (2, 1), (1, 2), ((1, 1), (0, 1)), 3, 5),        # asymmetric 'same'-like pads
    ((6, 7), (1, 1), (2, 2), (1, 1), ((0, 0), (0, 0)), 5, 7),        # strided 1x1 downsampling
    ((5, 5), (3, 3), (1, 1), (1, 1), ((2, 2), (2, 2)), 2, 3),        # 'full' padding
    ((4, 5, 3), (2, 3, 2), (1, 2, 1), (1, 1, 2), ((0, 1), (1, 1), (1, 0)), 2, 3),   # conv3d
]


def _ids(cases):
    return ['%dd-%s-k%s-s%s' % (len(c[0]), 'x'.join(map(str, c[0])), 'x'.join(map(str, c[1])),
                                'x'.join(map(str, c[2]))) for c in cases]


def _shape(batch, spatial, channels, data_format):
    return (batch, *spatial, channels) if data_format == 'channels_last' else (batch, channels, *spatial)


def _conv_arrays(case, dtype, data_format, seed=0, batch=2):
    spatial, kernel, strides, dilation, pads, c_in, c_out = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(_shape(batch, spatial, c_in, data_format)).astype(dtype)
    w = rng.standard_normal((*kernel, c_in, c_out)).astype(dtype)
    y = twin.conv_fwd(x, w, strides, dilation, pads, data_format)
    dy = rng.standard_normal(y.shape).astype(dtype)
    return x, w, dy


def _check_all_three(rt, case, dtype, data_format):
    _, kernel, strides, dilation, pads, _, _ = case
    x, w, dy = _conv_arrays(case, dtype, data_format)
    assert_matches_twin(conv.conv_fwd, twin.conv_fwd, (x, w, strides, dilation, pads, data_format), rt)
    assert_matches_twin(conv.conv_dgrad, twin.conv_dgrad, (dy, w, x.shape, strides, dilation, pads, data_format), rt)
    assert_matches_twin(conv.conv_wgrad, twin.conv_wgrad, (x, dy, w.shape, strides, dilation, pads, data_format), rt)


@pytest.mark.parametrize('data_format', FORMATS)
@pytest.mark.parametrize('dtype', DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize('case', CONV_CASES, ids=_ids(CONV_CASES))
def test_conv_fwd_dgrad_wgrad_match_twin(kernel_runtime, case, dtype, data_format):
    _check_all_three(kernel_runtime, case, dtype, data_format)


@contextlib.contextmanager
def _precision(value):
    previous = config.precision()
    config.set_precision(value)
    try:
        yield
    finally:
        config.set_precision(previous)


TILE_VARIANTS = [(dtype, precision, tile.name) for table, dtype, precision in
                 [('ffma', np.float32, 'float32'), ('ffma64', np.float64, 'float32'), ('f16', np.float16, 'float32'),
                  ('bf16', BF16, 'float32'), ('tf32', np.float32, 'tf32')]
                 for tile in conv_tiles.TILES[table]]


@pytest.mark.parametrize('dtype, precision, tile', TILE_VARIANTS,
                         ids=['%s-%s-%s' % (np.dtype(d).name, p, t) for d, p, t in TILE_VARIANTS])
@pytest.mark.parametrize('splits', [1, 3])
@pytest.mark.parametrize('channels', [(7, 9), (8, 24)], ids=['odd-channels', 'aligned-channels'])
def test_every_tile_and_split_k(kernel_runtime, dtype, precision, tile, splits, channels):
    """Each tile of the table on a problem with M, N and K tails; wgrad with and without split-K.
    Odd channel counts take the per-element copies; channel counts that are multiples of 8 the
    16-byte zero-filling copies (every neighbour of a chunk shares one padding check)."""
    case = ((9, 11), (3, 3), (1, 2), (1, 1), ((1, 1), (1, 0))) + channels
    _, kernel, strides, dilation, pads, _, _ = case
    x, w, dy = _conv_arrays(case, dtype, 'channels_last', seed=3, batch=3)
    # (wgmma.forced(False): the tile itself, also on an sm_90 device, where conv/wgmma.py would take over)
    with _precision(precision), conv_tiles.forced(tile=tile, splits=splits), conv_wgmma.forced(False):
        rounded = [round_tf32(a) for a in (x, w, dy)] if precision == 'tf32' else [x, w, dy]
        xr, wr, dyr = (a.astype(np.float64) for a in rounded)
        outs = [(conv.conv_fwd, (x, w, strides, dilation, pads, 'channels_last'),
                 twin.conv_fwd(xr, wr, strides, dilation, pads, 'channels_last')),
                (conv.conv_dgrad, (dy, w, x.shape, strides, dilation, pads, 'channels_last'),
                 twin.conv_dgrad(dyr, wr, x.shape, strides, dilation, pads, 'channels_last')),
                (conv.conv_wgrad, (x, dy, w.shape, strides, dilation, pads, 'channels_last'),
                 twin.conv_wgrad(xr, dyr, w.shape, strides, dilation, pads, 'channels_last'))]
        for fn, args, ref in outs:
            out = fn(*[to_device(kernel_runtime, a) for a in args], runtime=kernel_runtime)
            assert to_host(out).dtype == np.dtype(dtype)
            assert_close(out, ref, dtype, '%s with tile %s' % (fn.__name__, tile))


# 16-bit wgrad's rectangular tiles (built for conv_igemm_wgrad only): both on float16, 128x64
# on bfloat16 too (same loader and MMA code; only the MMA instruction differs).
WGRAD_ONLY_VARIANTS = [(np.float16, '128x64x64'), (np.float16, '64x128x64'), (BF16, '128x64x64')]


@pytest.mark.parametrize('dtype, tile', WGRAD_ONLY_VARIANTS,
                         ids=['%s-%s' % (np.dtype(d).name, t) for d, t in WGRAD_ONLY_VARIANTS])
@pytest.mark.parametrize('splits', [1, 3])
@pytest.mark.parametrize('channels', [(7, 9), (8, 24)], ids=['odd-channels', 'aligned-channels'])
def test_wgrad_only_tiles_and_split_k(kernel_runtime, dtype, tile, splits, channels):
    """The wgrad-only tiles on the problem of test_every_tile_and_split_k (M, N and K tails,
    per-element and 16-byte copies), with and without split-K."""
    case = ((9, 11), (3, 3), (1, 2), (1, 1), ((1, 1), (1, 0))) + channels
    out, ref = _forced_wgrad(kernel_runtime, case, dtype, tile, splits, seed=3)
    assert to_host(out).dtype == np.dtype(dtype)
    assert_close(out, ref, dtype, 'conv_wgrad with tile %s' % tile)


def _forced_wgrad(kernel_runtime, case, dtype, tile, splits, seed, precision='float32'):
    """(conv_wgrad on the device with ``tile`` and ``splits`` forced, wgmma off, under ``precision``;
    its float64 twin, on inputs rounded to tf32 under 'tf32') for a channels_last ``case`` of batch 3."""
    _, kernel, strides, dilation, pads, _, _ = case
    x, w, dy = _conv_arrays(case, dtype, 'channels_last', seed=seed, batch=3)
    args = (x, dy, w.shape, strides, dilation, pads, 'channels_last')
    as_multiplied = round_tf32 if precision == 'tf32' else np.asarray
    ref = twin.conv_wgrad(as_multiplied(x).astype(np.float64), as_multiplied(dy).astype(np.float64), *args[2:])
    with _precision(precision), conv_tiles.forced(tile=tile, splits=splits), conv_wgmma.forced(False):
        out = conv.conv_wgrad(*[to_device(kernel_runtime, a) for a in args[:2]], *args[2:], runtime=kernel_runtime)
    return out, ref


@pytest.mark.parametrize('dtype, tile', [(np.float16, t) for t in ('128x128x32', '64x128x64', '128x64x64', '64x64x64')]
                         + [(BF16, '64x64x64')])
@pytest.mark.parametrize('splits', [1, 3])
def test_16bit_wgrad_steady_state_and_k_tail(kernel_runtime, dtype, tile, splits):
    """16-bit wgrad over enough K tiles per split (K = 3 x 17 x 16 = 816: 13 tiles of 64, the last
    partial) that its K loop runs the groups without end tests, whose prefetched tiles skip the
    row tests against k_end (conv_igemm.cu pipeline_group), before the tested last groups; with
    3 splits the middle split ends on a full tile, the last on the partial one."""
    case = ((17, 17), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 0)), 8, 24)
    out, ref = _forced_wgrad(kernel_runtime, case, dtype, tile, splits, seed=4)
    assert_close(out, ref, dtype, 'conv_wgrad with tile %s, %d splits' % (tile, splits))


@pytest.mark.parametrize('tile, channels', [('64x64x32', (32, 96)), ('64x64x32', (64, 32)),
                                           ('128x128x16', (16, 144)), ('128x128x16', (48, 128)),
                                           ('128x128x16', (40, 144))],
                         ids=['64-cin32-cout96', '64-cin64-cout32', '128-cin16-cout144', '128-cin48-cout128',
                              '128-cin40-cout144'])
def test_tf32_tap_tiles(kernel_runtime, tile, channels):
    """The tf32 tap-tile copies (conv_igemm.cu TAP_TILES), taken where the gathered operand's channels
    are a multiple of BK (fwd: C_in, dgrad: C_out): each K tile in one tap, a thread's chunks 2 rows x
    4 units (64x64x32) or 2 rows x 2 units (128x128x16, whose A is then rounded in shared memory by
    the tap-tile mapping, and whose fwd copies the filter 8 lanes per k row). Padding and strides put
    rows partly outside the image (tap masks per row), M and the other operand's channels have tails;
    C_in = 64 (48 on 128x128x16) steps two (three) K tiles per tap (the cursor's wrap between them),
    C_out = 32 (C_in = 16) one. fwd takes tap tiles only in column blocks wholly before C_out (C_out
    144: the first of two; 128: its only one). C_in 40 / C_out 144: fwd keeps the chunk mapping (C_in
    a multiple of 4 and 8 but not of 16) beside dgrad's tap tiles, whose filter rows (C_in) have a tail
    inside a pass of 64 rows."""
    case = ((9, 11), (3, 3), (2, 1), (1, 1), ((1, 1), (1, 0))) + channels
    _, kernel, strides, dilation, pads, _, _ = case
    x, w, dy = _conv_arrays(case, np.float32, 'channels_last', seed=6, batch=2)
    xr, wr, dyr = (round_tf32(a).astype(np.float64) for a in (x, w, dy))
    with _precision('tf32'), conv_tiles.forced(tile=tile), conv_wgmma.forced(False):
        for fn, args, ref in [(conv.conv_fwd, (x, w, strides, dilation, pads, 'channels_last'),
                               twin.conv_fwd(xr, wr, strides, dilation, pads, 'channels_last')),
                              (conv.conv_dgrad, (dy, w, x.shape, strides, dilation, pads, 'channels_last'),
                               twin.conv_dgrad(dyr, wr, x.shape, strides, dilation, pads, 'channels_last'))]:
            out = fn(*[to_device(kernel_runtime, a) for a in args], runtime=kernel_runtime)
            assert_close(out, ref, np.float32, 'tf32 %s with tap tiles, channels %s' % (fn.__name__, channels))


@pytest.mark.parametrize('channels', [(32, 24), (96, 24), (64, 8)], ids=['cin32-cout24', 'cin96-cout24', 'cin64-cout8'])
@pytest.mark.parametrize('splits', [1, 3])
def test_tf32_wgrad_tap_groups(kernel_runtime, channels, splits):
    """The tf32 64x64 wgrad's tap groups (conv_igemm.cu WG_TAP_GROUPS), taken where C_in is a multiple
    of 32: each thread's 4-chunk half row of A in one tap, one address and one packed bounds test per
    half; where C_in is a multiple of 64, the whole row (8 chunks) in one tap (TAP 2), one of each per
    row. C_in = 32: M = 288, the last block's second half past the filter; C_in = 96: blocks whose
    halves lie in two taps; C_in = 64: whole rows. Padding and strides put rows partly outside the
    image; K = 3 x 9 x 16 = 432 (13.5 K tiles: the untested groups with the shared decode, then the
    partial last tile), split in 1 or 3."""
    case = ((17, 17), (3, 3), (2, 1), (1, 1), ((1, 1), (1, 0))) + channels
    out, ref = _forced_wgrad(kernel_runtime, case, np.float32, '64x64x32', splits, seed=8, precision='tf32')
    assert_close(out, ref, np.float32, 'tf32 conv_wgrad with tap groups, channels %s, %d splits' % (channels, splits))


@pytest.mark.parametrize('channels', [(32, 40), (32, 100), (12, 45)], ids=['cin32-cout40', 'cin32-cout100', 'cin12-cout45'])
@pytest.mark.parametrize('splits', [1, 3])
def test_tf32_wgrad_dy_unit_pairs(kernel_runtime, channels, splits):
    """The tf32 64x64 wgrad's dy copies in unit pairs (conv_igemm.cu RowStream<true>::UNIT_PAIRS: a lane's
    chunks are units g and g + 8 of 4 rows): C_out = 40 and 100 put the N tail between a lane's two
    units (the second zero-filled, hi_ok) in the first and the second column block; C_out = 45 takes
    the per-element copies, whose second unit tests its columns. C_in = 32 runs the tap groups (and
    their shared decode), C_in = 12 the per-element path; K = 3 x 9 x 16 = 432, split in 1 or 3."""
    case = ((17, 17), (3, 3), (2, 1), (1, 1), ((1, 1), (1, 0))) + channels
    out, ref = _forced_wgrad(kernel_runtime, case, np.float32, '64x64x32', splits, seed=9, precision='tf32')
    assert_close(out, ref, np.float32, 'tf32 conv_wgrad, dy in unit pairs, channels %s, %d splits' % (channels, splits))


@pytest.mark.parametrize('tile', ['128x128x16', '64x64x32'])
@pytest.mark.parametrize('splits', [1, 3])
def test_tf32_wgrad_steady_state_and_k_tail(kernel_runtime, tile, splits):
    """tf32 wgrad runs the same untested groups (conv_igemm.cu UNTESTED_GROUPS; 128x128 on its packed
    path, the one this image takes, and on sm_90 and the emulator): the problem above padded on both
    sides, K = 3 x 17 x 17 = 867, 55 K tiles of 16 or 28 of 32 (the last partial), split in 1 or 3."""
    case = ((17, 17), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), 8, 24)
    out, ref = _forced_wgrad(kernel_runtime, case, np.float32, tile, splits, seed=4, precision='tf32')
    assert_close(out, ref, np.float32, 'tf32 conv_wgrad with tile %s, %d splits' % (tile, splits))


@pytest.mark.parametrize('tile', ['128x128x16', '64x64x32'])
def test_tf32_wgrad_steady_state_on_the_three_compare_path(kernel_runtime, tile):
    """An image wider than WgradPack's 13-bit w field (4201 pixels) takes the three-compare bounds
    test: there the tf32 64x64 wgrad runs the untested groups too (FULL copies of the row tests'
    path), and the 128x128 one keeps the tested loop; 132 K tiles of 32 (263 of 16), the last partial."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 1, 4201, 8)).astype(np.float32)
    dy = rng.standard_normal((1, 1, 4201, 8)).astype(np.float32)
    args = ((1, 3, 8, 8), (1, 1), (1, 1), ((0, 0), (1, 1)), 'channels_last')
    ref = twin.conv_wgrad(round_tf32(x).astype(np.float64), round_tf32(dy).astype(np.float64), *args)
    with _precision('tf32'), conv_tiles.forced(tile=tile, splits=1), conv_wgmma.forced(False):
        out = conv.conv_wgrad(to_device(kernel_runtime, x), to_device(kernel_runtime, dy), *args,
                              runtime=kernel_runtime)
    assert_close(out, ref, np.float32, 'tf32 conv_wgrad with tile %s, 4201-pixel rows' % tile)


def test_16bit_wgrad_window_origins_past_2_32_pixels(kernel_runtime):
    """16-bit wgrad's 16-byte loader computes a row's window origin as a pixel index mod 2**32
    (conv_igemm.cu PixLinear): where padding puts an origin past 2**32 pixels (here d padded by
    4097 planes of 1024 x 1024 pixels, the one in-bounds row's origin at 4097 * 2**20), the block
    must take another path, not read far before x. A 1x1x1 filter with strides of the image's h and
    w: K = 4098 output pixels, of which only od = 4097 sees x, so dw is one outer product."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 1, 1024, 1024, 8)).astype(np.float16)
    dy = rng.standard_normal((1, 4098, 1, 1, 8)).astype(np.float16)
    ref = np.outer(x[0, 0, 0, 0].astype(np.float64), dy[0, 4097, 0, 0].astype(np.float64)).reshape(1, 1, 1, 8, 8)
    args = ((1, 1, 1, 8, 8), (1, 1024, 1024), (1, 1, 1), ((4097, 0), (0, 0), (0, 0)), 'channels_last')
    with conv_tiles.forced(tile='64x64x64', splits=1), conv_wgmma.forced(False):
        out = conv.conv_wgrad(to_device(kernel_runtime, x), to_device(kernel_runtime, dy), *args, runtime=kernel_runtime)
    assert_close(out, ref, np.float16, 'conv_wgrad with window origins past 2**32 pixels')


@pytest.mark.parametrize('data_format', FORMATS)
def test_tf32_mode_uses_tensor_cores_only_when_asked(kernel_runtime, data_format):
    case = CONV_CASES[2]
    _, kernel, strides, dilation, pads, _, _ = case
    x, w, _ = _conv_arrays(case, np.float32, data_format, seed=5)
    args = (x, w, strides, dilation, pads, data_format)
    exact = twin.conv_fwd(x.astype(np.float64), w.astype(np.float64), *args[2:])
    with _precision('tf32'):
        out = conv.conv_fwd(*[to_device(kernel_runtime, a) for a in args], runtime=kernel_runtime)
    # Inputs rounded to tf32, products and sums in float32: float32 tolerance holds.
    rounded = twin.conv_fwd(round_tf32(x).astype(np.float64), round_tf32(w).astype(np.float64), *args[2:])
    assert_close(out, rounded, np.float32, 'conv_fwd in tf32 mode')
    assert relative_error(out, exact) > 1e-5, 'tf32 mode should round the inputs to 10 mantissa bits'
    strict = conv.conv_fwd(*[to_device(kernel_runtime, a) for a in args], runtime=kernel_runtime)
    assert_close(strict, exact, np.float32, 'conv_fwd in strict float32 mode')


@pytest.mark.parametrize('tile', [t.name for t in conv_tiles.TILES['tf32']])
def test_tf32_epilogue_and_non_finite_inputs(kernel_runtime, tile):
    """The tf32 tiles reorder their MMA rows and columns (conv_igemm.cu, Tf32Order) and round each
    input once in shared memory: bias and relu still land on their channels, and inf and NaN
    inputs reach the outputs as in float64 (CUDA's canonical NaN 0x7fffffff included, which adding
    half a tf32 unit without the inf/NaN check would turn into -0)."""
    case = ((9, 11), (3, 3), (1, 2), (1, 1), ((1, 1), (1, 0)), 8, 24)
    _, kernel, strides, dilation, pads, _, c_out = case
    geometry = (strides, dilation, pads, 'channels_last')
    x, w, dy = _conv_arrays(case, np.float32, 'channels_last', seed=11, batch=3)
    bias = np.random.default_rng(12).standard_normal(c_out).astype(np.float32)
    nan = np.array([0x7fffffff], np.uint32).view(np.float32)[0]
    x_bad, dy_bad = x.copy(), dy.copy()
    x_bad[0, 2, 3, 1], x_bad[1, 5, 7, 4] = nan, np.inf
    dy_bad[2, 4, 2, 5], dy_bad[0, 1, 1, 3] = nan, -np.inf
    xr, wr, dyr, xbr, dybr = (round_tf32(a).astype(np.float64) for a in (x, w, dy, x_bad, dy_bad))
    dev = functools.partial(to_device, kernel_runtime)
    with _precision('tf32'), conv_tiles.forced(tile=tile), conv_wgmma.forced(False):
        out = conv.conv_fwd(dev(x), dev(w), *geometry, epilogue='bias_relu', bias=dev(bias), runtime=kernel_runtime)
        assert_close(out, np.maximum(twin.conv_fwd(xr, wr, *geometry) + bias, 0), np.float32, 'tf32 bias_relu')
        runs = [(conv.conv_fwd(dev(x_bad), dev(w), *geometry, runtime=kernel_runtime),
                 twin.conv_fwd(xbr, wr, *geometry)),
                (conv.conv_dgrad(dev(dy_bad), dev(w), x.shape, *geometry, runtime=kernel_runtime),
                 twin.conv_dgrad(dybr, wr, x.shape, *geometry)),
                (conv.conv_wgrad(dev(x_bad), dev(dy), w.shape, *geometry, runtime=kernel_runtime),
                 twin.conv_wgrad(xbr, dyr, w.shape, *geometry))]
        for got, ref in runs:
            got = to_host(got)
            assert np.isnan(ref).any() and np.isinf(ref).any()
            for special in (np.isnan, np.isposinf, np.isneginf):
                np.testing.assert_array_equal(special(got), special(ref))
            finite = np.isfinite(ref)
            assert_close(got[finite], ref[finite], np.float32, 'tf32 finite outputs beside inf and NaN')


@pytest.mark.parametrize('channels', [(7, 9), (8, 24)], ids=['odd-channels', 'aligned-channels'])
def test_fwd_only_tiles(kernel_runtime, channels):
    """The forward-only tiles (tf32 128x128x32: its stage ring in dynamic shared memory) on the problem
    of test_every_tile_and_split_k (M, N and K tails, per-element and 16-byte copies), fused bias and
    relu included, and ties between tf32 values rounded to even; and the forward picks it."""
    assert conv_tiles.choose_tile(np.float32, 'tf32', 32 * 56 * 56, 256, 576, fwd=True).name == '128x128x32'
    assert conv_tiles.choose_tile(np.float32, 'tf32', 32 * 56 * 56, 256, 128, fwd=True).name == '128x128x16'
    assert conv_tiles.choose_tile(np.float32, 'tf32', 32 * 56 * 56, 256, 64, fwd=True).name == '64x64x32'
    case = ((9, 11), (3, 3), (1, 2), (1, 1), ((1, 1), (1, 0))) + channels
    _, kernel, strides, dilation, pads, _, c_out = case
    geometry = (strides, dilation, pads, 'channels_last')
    x, w, _ = _conv_arrays(case, np.float32, 'channels_last', seed=3, batch=3)
    x[0] = _tf32_ties(x[0])
    bias = np.random.default_rng(4).standard_normal(c_out).astype(np.float32)
    ref = np.maximum(twin.conv_fwd(round_tf32(x).astype(np.float64), round_tf32(w).astype(np.float64), *geometry)
                     + bias, 0)
    for tile in conv_tiles.FWD_ONLY['tf32']:
        with _precision('tf32'), conv_tiles.forced(tile=tile.name), conv_wgmma.forced(False):
            out = conv.conv_fwd(to_device(kernel_runtime, x), to_device(kernel_runtime, w), *geometry,
                                epilogue='bias_relu', bias=to_device(kernel_runtime, bias), runtime=kernel_runtime)
        assert to_host(out).dtype == np.float32
        assert_close(out, ref, np.float32, 'conv_fwd with tile %s' % tile.name)


def test_tf32_filter_rounding_launches_without_the_tiles_shared_memory(emulator):
    """conv_round_tf32 lives in the tile's module but uses no shared memory: it is launched with
    none, not with the conv kernel's dynamic stage ring (68 KB for tf32 128x128x32, which would
    hold it to 3 blocks of 256 threads per SM and needs the 48 KB opt-in on a GPU)."""
    from gpuk.kernels.runtime import emulated_runtime
    case = ((9, 11), (3, 3), (1, 2), (1, 1), ((1, 1), (1, 0)), 8, 24)
    _, kernel, strides, dilation, pads, _, _ = case
    x, w, _ = _conv_arrays(case, np.float32, 'channels_last', seed=3, batch=1)
    (tile,) = conv_tiles.FWD_ONLY['tf32']
    with _precision('tf32'), conv_tiles.forced(tile=tile.name), conv_wgmma.forced(False), \
            emulated_runtime.counting() as launches:
        conv.conv_fwd(to_device(emulator, x), to_device(emulator, w), strides, dilation, pads, 'channels_last',
                      runtime=emulator)
    shared = {record['kernel']: record['shared_mem'] for record in launches}
    assert shared == {'conv_round_tf32': 0, 'conv_igemm_fwd': conv_tiles.dynamic_smem(tile, np.float32)}, shared
    assert shared['conv_igemm_fwd'] > 0


def _tf32_ties(a):
    """a with every element made a tf32 tie (the 13 dropped bits exactly half a tf32 unit)."""
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return ((bits & np.uint32(0xffffe000)) | np.uint32(0x1000)).view(np.float32)


def _round_tf32_ties_away(a):
    """The rounding the tf32 path does not do (cvt.rna: ties away from zero), to show the tie data tells them apart."""
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xffffe000)).view(np.float32)


def test_round_tf32_is_ieee_rounding_to_11_significant_bits():
    """The NumPy model every tf32 reference uses, against the IEEE definition worked in float64
    (np.rint: to nearest, ties to even) at tf32's quantum (11 significant bits, subnormals at
    float32's smallest exponent): ties, subnormals, a finite value rounding past the largest
    tf32 to inf, signed zeros; inf and NaN as they came."""
    rng = np.random.default_rng(7)
    finite = np.concatenate([rng.standard_normal(4000).astype(np.float32) * np.float32(1e3),
                             _tf32_ties(rng.standard_normal(1000).astype(np.float32)),
                             np.array([1e-40, -3e-39, 1.5e-45, 0.0, -0.0, 3.4028235e38, -3.40282e38], np.float32)])
    exponent = np.frexp(finite.astype(np.float64))[1]
    quantum = np.ldexp(1.0, np.maximum(exponent, -125) - 11)
    with np.errstate(over='ignore'):
        want = (np.rint(finite / quantum) * quantum).astype(np.float32)
    got = round_tf32(finite)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.isinf(got[-2]) and np.isinf(got[-1])   # past the largest tf32 (halfway and beyond)
    special = round_tf32(np.array([np.inf, -np.inf, np.nan], np.float32))
    assert special[0] == np.inf and special[1] == -np.inf and np.isnan(special[2])


TF32_EDGE_BITS = np.array([
    0x7fc00000, 0xffc00000, 0x7fffffff, 0xffffffff, 0x7fffe000, 0x7fffefff, 0x7ffff000, 0xfffff001,   # NaN payloads
    0x7f800001, 0x7f801fff, 0xff800fff,                               # NaN with a payload in the dropped bits only
    0x7f800000, 0xff800000,                                           # +-inf
    0x7f7fffff, 0xff7fffff, 0x7f7fefff, 0x7f7ff000, 0x7f7fe000,       # largest finite: to inf, down, a tie (odd: up, inf), exact
    0x00800000, 0x00000001, 0x80000fff, 0x00001000, 0x00003000, 0x807fffff, 0x007ff000,   # smallest normal, subnormals
    0x3f801000, 0x3f803000, 0xbf801000, 0xbf803000, 0x3f800fff, 0x3f801001,   # ties to even, just below / above
    0x00000000, 0x80000000, 0x3f800000], np.uint32)


def test_tf32_filter_rounding_on_edge_values(kernel_runtime):
    """conv_round_tf32 (float_to_tf32, common.cuh: the one rounding of every tf32 operand) on the
    bit patterns where a rounding on the bits can go wrong, against the NumPy model round_tf32, in
    the 19 bits the tensor core reads: NaN payloads that would carry into the sign (stay NaN), a NaN
    whose payload lies in the dropped bits only (reads as inf, as documented), inf, the largest finite
    value (rounds to inf when past the largest tf32), subnormals, ties to even and their neighbours."""
    bits = np.tile(TF32_EDGE_BITS, 37)   # past one block of the grid-stride loop's lanes, odd count
    w = bits.view(np.float32).reshape(1, 1, 1, -1)
    tile = conv_tiles.TILES['tf32'][0]
    g = type('Geometry', (), {'k_sp': (1, 1), 'c_in': 1, 'c_out': w.shape[-1]})   # what _filter_rounding reads
    round_filter = conv._filter_rounding(kernel_runtime, g, np.float32, tile)
    dev = to_device(kernel_runtime, w)
    out = kernel_runtime.xp.empty_like(dev)
    round_filter(dev, out)
    got = to_host(out).reshape(-1).view(np.uint32) & np.uint32(0xffffe000)
    want = round_tf32(bits.view(np.float32)).view(np.uint32)
    np.testing.assert_array_equal(got, want)
    finite = np.isfinite(bits.view(np.float32))
    assert np.array_equal(np.isnan(got.view(np.float32)), np.isnan(bits.view(np.float32)) & ((bits & 0x7fffe000) != 0x7f800000))
    # past the largest tf32: +-0x7f7fffff, and 0x7f7ff000 (a tie whose last kept bit is odd)
    assert np.isinf(got.view(np.float32)[finite]).sum() == 3 * 37


@pytest.mark.parametrize('tile', [t.name for t in conv_tiles.TILES['tf32']])
def test_tf32_rounds_ties_to_even(kernel_runtime, tile):
    """Every input a tie between two tf32 values: the kernels round to nearest even (the IEEE default,
    cvt.rn.tf32.f32 on sm_90), so half the inputs round down; rounding ties away from zero (cvt.rna)
    would move these outputs by 8e-4 to 1e-3 relative, about 80 times the float32 tolerance."""
    case = ((9, 11), (3, 3), (1, 2), (1, 1), ((1, 1), (1, 0)), 8, 24)
    _, kernel, strides, dilation, pads, _, _ = case
    geometry = (strides, dilation, pads, 'channels_last')
    x, w, dy = (_tf32_ties(a) for a in _conv_arrays(case, np.float32, 'channels_last', seed=13, batch=3))
    dev = functools.partial(to_device, kernel_runtime)
    with _precision('tf32'), conv_tiles.forced(tile=tile), conv_wgmma.forced(False):
        runs = [(conv.conv_fwd(dev(x), dev(w), *geometry, runtime=kernel_runtime), twin.conv_fwd, (x, w)),
                (conv.conv_dgrad(dev(dy), dev(w), x.shape, *geometry, runtime=kernel_runtime),
                 lambda a, b, *g: twin.conv_dgrad(a, b, x.shape, *g), (dy, w)),
                (conv.conv_wgrad(dev(x), dev(dy), w.shape, *geometry, runtime=kernel_runtime),
                 lambda a, b, *g: twin.conv_wgrad(a, b, w.shape, *g), (x, dy))]
        for got, reference, inputs in runs:
            even, away = (reference(*(rounding(a).astype(np.float64) for a in inputs), *geometry)
                          for rounding in (round_tf32, _round_tf32_ties_away))
            assert relative_error(away, even) > 1e-4
            assert_close(got, even, np.float32, 'tf32 on ties')


@pytest.mark.parametrize('tile', [t.name for t in conv_tiles.TILES['bf16']])
def test_bfloat16_keeps_the_float32_exponent_range(kernel_runtime, tile):
    """x ~ 1e30 and w ~ 1e-25 (inf and 0 in float16), results ~ 1e5, 1e-28 and 1e27: a path
    that went through float16 anywhere (operands, MMA, output) would give inf, NaN or zeros."""
    case = CONV_CASES[2]
    _, kernel, strides, dilation, pads, _, _ = case
    x, w, dy = _conv_arrays(case, np.float32, 'channels_last', seed=9)
    x, w, dy = (a * scale for a, scale in ((x, 1e30), (w, 1e-25), (dy, 1e-3)))
    x, w, dy = (a.astype(BF16) for a in (x, w, dy))
    geometry = (strides, dilation, pads, 'channels_last')
    xr, wr, dyr = (a.astype(np.float64) for a in (x, w, dy))
    runs = [(conv.conv_fwd, (x, w), twin.conv_fwd(xr, wr, *geometry)),
            (conv.conv_dgrad, (dy, w, x.shape), twin.conv_dgrad(dyr, wr, x.shape, *geometry)),
            (conv.conv_wgrad, (x, dy, w.shape), twin.conv_wgrad(xr, dyr, w.shape, *geometry))]
    with conv_tiles.forced(tile=tile):
        for fn, args, ref in runs:
            out = to_host(fn(*[to_device(kernel_runtime, a) for a in args], *geometry, runtime=kernel_runtime))
            assert out.dtype == BF16 and np.isfinite(out.astype(np.float32)).all()
            assert_close(out, ref, BF16, '%s with bfloat16 inputs far outside float16 range' % fn.__name__)


@pytest.mark.parametrize('data_format', FORMATS)
@pytest.mark.parametrize('dtype', DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize('epilogue', ['bias', 'bias_relu'])
def test_conv_fwd_fused_bias_relu(kernel_runtime, epilogue, dtype, data_format):
    case = CONV_CASES[2]
    _, kernel, strides, dilation, pads, _, c_out = case
    x, w, _ = _conv_arrays(case, dtype, data_format, seed=7)
    bias = np.random.default_rng(8).standard_normal(c_out).astype(dtype)
    out = conv.conv_fwd(to_device(kernel_runtime, x), to_device(kernel_runtime, w), strides, dilation, pads,
                        data_format, epilogue=epilogue, bias=to_device(kernel_runtime, bias), runtime=kernel_runtime)
    ref = twin.conv_fwd(x.astype(np.float64), w.astype(np.float64), strides, dilation, pads, data_format)
    ref = ref + (bias.astype(np.float64) if data_format == 'channels_last' else bias.astype(np.float64)[:, None, None])
    if epilogue == 'bias_relu':
        ref = np.maximum(ref, 0)
        assert (to_host(out) >= 0).all()
    assert to_host(out).dtype == np.dtype(dtype)
    assert_close(out, ref, dtype, 'conv_fwd epilogue=%s' % epilogue)


@pytest.mark.parametrize('dtype', [np.float16, np.float32], ids=['float16', 'float32'])
def test_filters_too_wide_for_tap_masks_take_the_per_element_path(kernel_runtime, dtype):
    """The 16-byte gather of fwd/dgrad tests a row's taps with a 32-bit mask, a bit per tap index
    of each dim plus room for the taps one K tile steps past the filter (conv_igemm.cu,
    tap_masks_fit: at most 31 bits); a 1-d filter of 34 taps does not fit, so aligned channels
    (8) take the per-element copies there, strided dgrad included, and still match the twin."""
    case = ((40,), (34,), (2,), (1,), ((3, 2),), 8, 8)
    _check_all_three(kernel_runtime, case, dtype, 'channels_last')


@pytest.mark.parametrize('dtype, tile', [(np.float16, '64x64x64'), (np.float32, '32x32x32')],
                         ids=['float16-64x64x64', 'float32-32x32x32'])
def test_a_filter_at_the_tap_mask_limit_takes_the_16_byte_path_and_matches(kernel_runtime, dtype, tile):
    """The largest filter the tap masks hold on these tiles (K steps of 8 chunks): 21 taps along w
    + 1 + 1 + CONV_BK / VEC = 31 bits (tap_masks_fit), so the last K tiles step the tap cursor's d
    bit up to bit 30 past the filter, where in_filter must refuse it; stride 2 runs dgrad's phases
    of 11 and 10 taps."""
    for strides in ((1,), (2,)):
        case = ((30,), (21,), strides, (1,), ((4, 3),), 8, 8)
        with conv_tiles.forced(tile=tile), conv_wgmma.forced(False):
            _check_all_three(kernel_runtime, case, dtype, 'channels_last')


# ---------------------------------------------------------------- depthwise

# (input spatial, kernel spatial, strides, dilation, pads, C_in, multiplier)
DEPTHWISE_CASES = [
    ((10,), (3,), (1,), (1,), ((1, 1),), 3, 1),
    ((9, 8), (3, 3), (2, 2), (1, 1), ((1, 1), (0, 1)), 5, 2),
    ((7, 9), (2, 3), (1, 2), (2, 1), ((0, 1), (1, 1)), 33, 1),          # > 32 channels: two channel tiles
    ((4, 5, 4), (2, 2, 3), (1, 1, 2), (1, 2, 1), ((1, 0), (0, 0), (1, 1)), 2, 3),
    ((7, 12), (3, 5), (1, 2), (1, 1), ((1, 1), (2, 2)), 8, 1),          # 5-wide register windows
    ((6, 7), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), 40, 1),          # 16-byte tile loads, partial tile
    ((6, 11), (2, 3), (1, 3), (1, 2), ((0, 0), (2, 1)), 3, 2),          # dilated, stride 3: generic rows
    ((5, 13), (1, 4), (2, 2), (1, 2), ((0, 0), (3, 2)), 2, 1),          # generic rows skipping dgrad holes
    ((4, 21), (2, 9), (1, 1), (1, 1), ((1, 0), (4, 4)), 3, 2),          # rolling window: one trip, 1-tap tail
    # channels_first wgrad's transposing 16-byte loads: 120-pixel planes (an odd number of
    # 16-bit vectors), rows wider than a chunk, a partial lane group
    ((6, 20), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), 34, 1),
]


def _depthwise_arrays(case, dtype, data_format, seed=0):
    spatial, kernel, strides, dilation, pads, c_in, mult = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(_shape(2, spatial, c_in, data_format)).astype(dtype)
    w = rng.standard_normal((*kernel, c_in, mult)).astype(dtype)
    dy = rng.standard_normal(twin.depthwise_conv_fwd(x, w, strides, dilation, pads, data_format).shape).astype(dtype)
    return x, w, dy


def _check_depthwise(rt, case, dtype, data_format, seed=0, wgrad=True):
    """depthwise_conv_fwd and _dgrad of ``case`` (and _wgrad, unless ``wgrad=False``: the tests of
    paths only fwd and dgrad take) against the twin."""
    _, _, strides, dilation, pads, _, _ = case
    x, w, dy = _depthwise_arrays(case, dtype, data_format, seed)
    geometry = (strides, dilation, pads, data_format)
    assert_matches_twin(conv.depthwise_conv_fwd, twin.depthwise_conv_fwd, (x, w, *geometry), rt)
    assert_matches_twin(conv.depthwise_conv_dgrad, twin.depthwise_conv_dgrad, (dy, w, x.shape, *geometry), rt)
    if wgrad:
        assert_matches_twin(conv.depthwise_conv_wgrad, twin.depthwise_conv_wgrad, (x, dy, w.shape, *geometry), rt)


@pytest.mark.parametrize('data_format', FORMATS)
@pytest.mark.parametrize('dtype', DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize('case', DEPTHWISE_CASES, ids=_ids(DEPTHWISE_CASES))
def test_depthwise_matches_twin(kernel_runtime, case, dtype, data_format):
    _check_depthwise(kernel_runtime, case, dtype, data_format)


@pytest.mark.parametrize('dtype', DTYPES, ids=DTYPE_IDS)
def test_depthwise_channels_first_wgrad_tiles_coalesce_without_bank_conflicts(emulator, dtype):
    """channels_first wgrad copies its tiles with 16-byte loads transposed in registers and
    16-byte shared stores (conv_depthwise.cu load_tile_transposed): on planes of whole 32-byte
    sectors every sector moved is fully used and every shared request takes one wavefront per
    phase, in every dtype and both register-window widths (the inspect report emulates float32
    3x3 only)."""
    from gpuk.kernels.inspect import emulated
    from gpuk.kernels.runtime import emulated_runtime
    for kernel in (3, 5):
        case = ((16, 16), (kernel, kernel), (1, 1), (1, 1), ((kernel // 2,) * 2,) * 2, 32, 1)
        x, w, dy = _depthwise_arrays(case, dtype, 'channels_first', seed=5)
        geometry = case[2:5] + ('channels_first',)
        with emulated_runtime.counting() as launches:
            assert_matches_twin(conv.depthwise_conv_wgrad, twin.depthwise_conv_wgrad, (x, dy, w.shape, *geometry),
                                emulator)
        records = emulated.summarize(launches, 'conv_depthwise', '')
        (record,) = [r for r in records if r['kernel'] == 'depthwise_wgrad']
        assert record['coalescing'] == 1.0 and record['bank_conflicts_per_request'] == 0.0, (kernel, record)


def test_depthwise_channels_first_wgrad_sizes_the_transposed_pitch_only_where_it_may_run(kernel_runtime):
    """channels_first wgrad's tiles take the transposing loader's pitch (36 words, not 33) only
    where its sources are planes of whole 16-byte vectors (direct.wgrad_transposable): 102-pixel
    planes keep the word loader, so a 1 x 8 output tile at stride 48 (339 input columns) still
    fits 48 KB, as it did before that loader; the launcher sized it for 36 and refused it."""
    case = ((2, 51), (1, 3), (1, 48), (1, 1), ((0, 0), (0, 0)), 3, 1)
    _, _, strides, dilation, pads, _, _ = case
    x, w, dy = _depthwise_arrays(case, np.float32, 'channels_first', seed=6)
    assert_matches_twin(conv.depthwise_conv_wgrad, twin.depthwise_conv_wgrad,
                        (x, dy, w.shape, strides, dilation, pads, 'channels_first'), kernel_runtime)
    assert not conv_direct.wgrad_transposable(np.float32, 3, 1, 2 * 51, 2 * 2)
    assert conv_direct.wgrad_transposable(np.float32, 4, 1, 2 * 52, 2 * 2)


# channels_first wgrad on planes of whole vectors (the transposing loader) where padding is wider than the
# dilated filter, with strides, dilation, a depth multiplier, batch 1 and partial lane groups
DEPTHWISE_TRANSPOSED_CASES = [
    ((8, 16), (3, 3), (2, 2), (2, 3), ((4, 3), (5, 8)), 8, 2, 1),
    ((4, 32), (2, 5), (1, 3), (3, 1), ((6, 6), (7, 11)), 8, 3, 2),
    ((8, 24), (3, 3), (2, 2), (1, 1), ((5, 6), (9, 16)), 34, 1, 1),
]


@pytest.mark.parametrize('dtype', DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize('case', DEPTHWISE_TRANSPOSED_CASES, ids=_ids(DEPTHWISE_TRANSPOSED_CASES))
def test_depthwise_channels_first_wgrad_transposed_tiles_with_wide_padding(kernel_runtime, case, dtype):
    *geometry_case, batch = case
    spatial, kernel, strides, dilation, pads, c_in, mult = geometry_case
    rng = np.random.default_rng(8)
    x = rng.standard_normal((batch, c_in, *spatial)).astype(dtype)
    w = rng.standard_normal((*kernel, c_in, mult)).astype(dtype)
    dy_shape = twin.depthwise_conv_fwd(x, w, strides, dilation, pads, 'channels_first').shape
    dy = rng.standard_normal(dy_shape).astype(dtype)
    assert conv_direct.wgrad_transposable(dtype, c_in, mult, math.prod(spatial), math.prod(dy_shape[2:]))
    for splits in (None, 3):
        with conv_tiles.forced(splits=splits):
            assert_matches_twin(conv.depthwise_conv_wgrad, twin.depthwise_conv_wgrad,
                                (x, dy, w.shape, strides, dilation, pads, 'channels_first'), kernel_runtime)


@pytest.mark.parametrize('data_format', FORMATS)
@pytest.mark.parametrize('k_w', [1, 2, 7, 8, 16, 17])
def test_depthwise_rolling_rows_every_trip_count_and_tail(kernel_runtime, k_w, data_format):
    """Stride-1 rows of widths other than 3 and 5 run conv_depthwise.cu row_roll: (k_w - 1) / 8
    trips of 8 taps, then a guarded tail of 1..8 taps (fwd; dgrad correlates with the flipped
    filter the same way)."""
    case = ((2, 40), (2, k_w), (1, 1), (1, 1), ((0, 1), (k_w // 2, (k_w - 1) // 2)), 6, 1)
    _check_depthwise(kernel_runtime, case, np.float32, data_format, seed=7, wgrad=False)


# whole-filter windows (conv_depthwise.cu tile_rows_window): 3x3 (4 rows per thread, 32-row
# channels_last tiles: 40 rows take two) and 5x5 (2 rows per thread), one plane of a 3-D
# problem, partial channel tiles; dgrad takes them where M = 1
ROWS_WINDOW_CASES = [
    ((40, 11), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), 35, 1),
    ((20, 19), (5, 5), (1, 1), (1, 1), ((2, 1), (0, 4)), 3, 2),
    ((21, 9), (5, 5), (1, 1), (1, 1), ((2, 2), (2, 2)), 5, 1),
    ((3, 10, 9), (1, 3, 3), (1, 1, 1), (1, 1, 1), ((1, 0), (1, 1), (0, 2)), 4, 1),
]


@pytest.mark.parametrize('data_format', FORMATS)
@pytest.mark.parametrize('dtype', [np.float32, np.float16], ids=['f32', 'f16'])
@pytest.mark.parametrize('case', ROWS_WINDOW_CASES, ids=_ids(ROWS_WINDOW_CASES))
def test_depthwise_whole_filter_windows(kernel_runtime, case, dtype, data_format):
    spatial, kernel, strides, dilation, _, _, _ = case
    tile = conv_direct.depthwise_tile('t', dtype, data_format == 'channels_first', spatial, kernel, strides, dilation,
                                      rows_window=True)
    assert tile.rows_per_thread == conv_direct.DW_ROWS_WINDOW[kernel[-1]]
    _check_depthwise(kernel_runtime, case, dtype, data_format, seed=8, wgrad=False)


def test_depthwise_rows_window_only_where_the_kernel_has_one():
    """The launcher asks for the whole-filter windows (rows_per_thread > 1, a taller tile) only
    where conv_depthwise.cu builds them: a kernel sent one elsewhere would run its per-row path
    on the taller tile and leave rows unwritten."""
    def rpt(dtype=np.float32, kernel=(3, 3), strides=(1, 1), dilation=(1, 1), rows_window=True, out=(56, 56)):
        return conv_direct.depthwise_tile('t', dtype, False, out, kernel, strides, dilation,
                                          rows_window=rows_window).rows_per_thread
    assert rpt() == 4 and rpt(np.float16, (5, 5)) == 2 and rpt(kernel=(1, 3, 3), out=(4, 56, 56)) == 4
    assert rpt(np.float64) == rpt(np.float64, (5, 5)) == 1          # not built for float64
    assert rpt(strides=(2, 2)) == rpt(dilation=(1, 2)) == rpt(kernel=(3, 5)) == rpt(kernel=(7, 7)) == 1
    assert rpt(kernel=(2, 3, 3), out=(4, 56, 56)) == 1 and rpt(rows_window=False) == 1   # planes; dgrad with M > 1


def test_depthwise_split_wgrad_and_chunked_kernel_rows(kernel_runtime):
    """Pixel-tile splits with the deterministic second pass; filters whose input tile does not
    fit shared memory at once (loaded in chunks of kernel rows) or need many tap groups."""
    case = DEPTHWISE_CASES[1]
    _, _, strides, dilation, pads, _, _ = case
    for dtype, data_format in ((np.float32, 'channels_last'), (BF16, 'channels_last'), (np.float64, 'channels_first')):
        x, w, dy = _depthwise_arrays(case, dtype, data_format, seed=2)
        with conv_tiles.forced(splits=4):
            assert_matches_twin(conv.depthwise_conv_wgrad, twin.depthwise_conv_wgrad,
                                (x, dy, w.shape, strides, dilation, pads, data_format), kernel_runtime)
    big = ((17, 16), (16, 14), (1, 1), (1, 1), ((0, 0), (0, 1)), 2, 2)   # 224 taps: 25 wgrad tap groups
    tile = conv_direct.depthwise_tile('t', np.float64, False, (2, 4), (16, 14), (1, 1), (1, 1))
    assert tile.kh_chunk < 16 and tile.shared_bytes <= conv_direct.DW_MAX_SHARED
    for dtype in (np.float32, np.float64):
        _check_depthwise(kernel_runtime, big, dtype, 'channels_last', seed=4)


# ---------------------------------------------------------------- locally connected

# (input spatial, kernel_size, strides, output_spatial, C_in, C_out)
LOCAL_CASES = [
    ((9,), (3,), (2,), (4,), 3, 4),
    ((7, 6), (3, 2), (1, 2), (5, 3), 2, 3),
    ((6, 7), (2, 3), (2, 2), (2, 2), 3, 2),      # windows that leave input pixels unread
    ((4, 3, 4), (2, 2, 3), (1, 1, 1), (3, 2, 2), 2, 2),
]


@pytest.mark.parametrize('data_format', FORMATS)
@pytest.mark.parametrize('dtype', DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize('case', LOCAL_CASES, ids=['%dd-%d' % (len(c[0]), i) for i, c in enumerate(LOCAL_CASES)])
def test_local_conv_matches_twin(kernel_runtime, case, dtype, data_format):
    _check_local_conv(kernel_runtime, case, 2, dtype, data_format, np.random.default_rng(11))


def _check_local_conv(kernel_runtime, case, images, dtype, data_format, rng):
    spatial, kernel_size, strides, output_spatial, c_in, c_out = case
    x = rng.standard_normal(_shape(images, spatial, c_in, data_format)).astype(dtype)
    w = rng.standard_normal((int(np.prod(output_spatial)), int(np.prod(kernel_size)) * c_in, c_out)).astype(dtype)
    dy = rng.standard_normal(_shape(images, output_spatial, c_out, data_format)).astype(dtype)
    geometry = (kernel_size, strides, output_spatial, data_format)
    assert_matches_twin(conv.local_conv_fwd, twin.local_conv_fwd, (x, w, *geometry), kernel_runtime)
    assert_matches_twin(conv.local_conv_dgrad, twin.local_conv_dgrad, (dy, w, x.shape, *geometry), kernel_runtime)
    assert_matches_twin(conv.local_conv_wgrad, twin.local_conv_wgrad, (x, dy, w.shape, *geometry), kernel_runtime)


@pytest.mark.parametrize('data_format', FORMATS)
@pytest.mark.parametrize('dtype', DTYPES, ids=DTYPE_IDS)
def test_local_conv_image_groups_feature_chunks_and_wide_c_out(kernel_runtime, dtype, data_format):
    """conv_local.cu's blocking: 5 images (a full group of LOCAL_IMAGES and a partial one), F =
    9 taps x 5 channels = 45 (two staged chunks of 32 in local_fwd), C_out = 33 (32 lanes per
    dgrad element, each summing two output channels; 1 or 2 (image group, p) rows per fwd warp)."""
    case = ((5, 6), (3, 3), (1, 1), (3, 4), 5, 33)
    _check_local_conv(kernel_runtime, case, 5, dtype, data_format, np.random.default_rng(12))


# ---------------------------------------------------------------- bad input

def _same_error(kernel_fn, twin_fn, args, exc_type, match):
    """The launcher raises exactly the twin's error (type and message), before any launch."""
    with pytest.raises(exc_type, match=match) as twin_error:
        twin_fn(*args)
    with pytest.raises(exc_type) as kernel_error:
        kernel_fn(*args, runtime='emulate')
    assert str(kernel_error.value) == str(twin_error.value)


X = np.zeros((2, 5, 5, 3), np.float32)
W = np.zeros((3, 3, 3, 4), np.float32)
DY = np.zeros((2, 3, 3, 4), np.float32)
VALID = (((1, 1), (1, 1), ((0, 0), (0, 0)), 'channels_last'))
BAD_INPUTS = [
    (conv.conv_fwd, twin.conv_fwd, (X, W[:, :, :2], *VALID), ValueError, r'conv_fwd: the channel count of x'),
    (conv.conv_fwd, twin.conv_fwd, (X[:, :0], W, *VALID), ValueError, r'conv_fwd: x must not have a zero-size'),
    (conv.conv_fwd, twin.conv_fwd, (X, W, (0, 1), *VALID[1:]), ValueError, r'conv_fwd: strides must be >= 1'),
    (conv.conv_fwd, twin.conv_fwd, (X.astype(np.int32), W.astype(np.int32), *VALID), TypeError,
     r'conv_fwd: x must be a float16, bfloat16, float32 or float64 array, got dtype int32'),
    (conv.conv_dgrad, twin.conv_dgrad, (DY.astype(np.uint16), W.astype(BF16), X.shape, *VALID), TypeError,
     r'conv_dgrad: dy must be a float16, bfloat16, float32 or float64 array, got dtype uint16'),
    (conv.conv_wgrad, twin.conv_wgrad, (X.astype(BF16), DY.astype(np.float16), W.shape, *VALID), TypeError,
     r'conv_wgrad: x and dy must have the same dtype, got bfloat16 and float16'),
    (conv.conv_fwd, twin.conv_fwd, (X, W.astype(np.float64), *VALID), TypeError, r'conv_fwd: x and w must have'),
    (conv.conv_fwd, twin.conv_fwd, (X, W, *VALID[:3], 'nhwc'), ValueError, r'data_format'),
    (conv.conv_fwd, twin.conv_fwd, (X[:, :2, :2], W, *VALID), ValueError, r'conv_fwd: padded input spatial size'),
    (conv.conv_dgrad, twin.conv_dgrad, (DY[:, :2], W, X.shape, *VALID), ValueError, r'conv_dgrad: dy spatial'),
    (conv.conv_dgrad, twin.conv_dgrad, (DY, W, (2, 5, 5, 2), *VALID), ValueError, r'conv_dgrad: the channel count'),
    (conv.conv_wgrad, twin.conv_wgrad, (X, DY[:1], W.shape, *VALID), ValueError, r'conv_wgrad: batch sizes'),
    (conv.conv_wgrad, twin.conv_wgrad, (X, DY, (3, 3, 3, 5), *VALID), ValueError, r'conv_wgrad: the channel count'),
    (conv.depthwise_conv_fwd, twin.depthwise_conv_fwd, (X, W[:, :, :2, :1], *VALID), ValueError,
     r'depthwise_conv_fwd: the channel count'),
    (conv.depthwise_conv_dgrad, twin.depthwise_conv_dgrad, (DY[..., :2], W[:, :, :, :1], X.shape, *VALID),
     ValueError, r'depthwise_conv_dgrad: the channel count of dy'),
    (conv.depthwise_conv_wgrad, twin.depthwise_conv_wgrad, (X, DY.astype(np.float16), (3, 3, 3, 1), *VALID),
     TypeError, r'depthwise_conv_wgrad: x and dy must have the same dtype'),
    (conv.local_conv_fwd, twin.local_conv_fwd, (X, np.zeros((9, 27, 2), np.float32), (3, 3), (1, 1), (3, 4),
                                                'channels_last'), ValueError, r'local_conv_fwd: output_spatial'),
    (conv.local_conv_wgrad, twin.local_conv_wgrad, (X, DY, (9, 26, 4), (3, 3), (1, 1), (3, 3), 'channels_last'),
     ValueError, r'local_conv_wgrad: w_shape must have shape \(9, 27, C_out\)'),
]


@pytest.mark.parametrize('kernel_fn, twin_fn, args, exc_type, match', BAD_INPUTS,
                         ids=['%s-%d' % (b[0].__name__, i) for i, b in enumerate(BAD_INPUTS)])
def test_bad_input_raises_the_twins_error(kernel_fn, twin_fn, args, exc_type, match):
    _same_error(kernel_fn, twin_fn, args, exc_type, match)


def test_bad_epilogue_and_array_type():
    x, w = X + 1, W + 1
    with pytest.raises(ValueError, match=r"conv_fwd: epilogue must be None, 'bias' or 'bias_relu', got 'relu'"):
        conv.conv_fwd(x, w, *VALID, epilogue='relu', runtime='emulate')
    with pytest.raises(ValueError, match=r'conv_fwd: bias must have shape \(4,\) \(C_out\), got \(3,\)'):
        conv.conv_fwd(x, w, *VALID, epilogue='bias', bias=np.zeros(3, np.float32), runtime='emulate')
    with pytest.raises(TypeError, match=r'conv_fwd: bias.dtype must equal x.dtype \(float32\), got float64'):
        conv.conv_fwd(x, w, *VALID, epilogue='bias_relu', bias=np.zeros(4), runtime='emulate')
    with pytest.raises(ValueError, match=r'conv_fwd: bias is only used with epilogue'):
        conv.conv_fwd(x, w, *VALID, bias=np.zeros(4, np.float32), runtime='emulate')
    with pytest.raises(TypeError, match=r'conv_fwd: x must be a numpy.ndarray, got list'):
        conv.conv_fwd(x.tolist(), w, *VALID, runtime='emulate')


def test_launchers_mirror_the_twin():
    import inspect
    for name in twin.__all__:
        kernel_params = inspect.signature(getattr(conv, name)).parameters
        twin_params = list(inspect.signature(getattr(twin, name)).parameters)
        assert list(kernel_params)[:len(twin_params)] == twin_params
        extra = [p for p in list(kernel_params)[len(twin_params):]]
        assert all(kernel_params[p].kind is inspect.Parameter.KEYWORD_ONLY for p in extra)
        assert 'runtime' in extra


def test_tile_choice_table():
    big = conv_tiles.choose_tile(np.float32, 'float32', 32 * 56 * 56, 256, 576)
    assert big.name == '128x128x16'
    assert conv_tiles.choose_tile(np.float32, 'float32', 60, 5, 27).name == '32x32x32'
    assert conv_tiles.choose_tile(np.float64, 'float32', 32 * 56 * 56, 256, 576).name == '64x64x8'
    assert conv_tiles.choose_tile(np.float16, 'float32', 32 * 56 * 56, 256, 576).math == 'f16'
    assert conv_tiles.choose_tile(BF16, 'float32', 32 * 56 * 56, 256, 576).math == 'bf16'
    assert conv_tiles.choose_tile(BF16, 'tf32', 60, 5, 27).name == '64x64x64'   # precision only concerns float32
    assert conv_tiles.choose_tile(np.float32, 'tf32', 32 * 56 * 56, 256, 576).math == 'tf32'
    # wgrad of a 3x3 64->64 layer at N=32: M x N = 576 x 64 gives few tiles, so K is split.
    tile = conv_tiles.choose_tile(np.float32, 'float32', 576, 64, 32 * 56 * 56, wgrad=True)
    assert conv_tiles.wgrad_splits(tile, 576, 64, 32 * 56 * 56) > 1


def test_16bit_wgrad_tile_choice():
    """16-bit wgrad (its own table): the rectangle whose small side fits C_out = 64 or taps*C_in = 64,
    64x64 only when both are that small; split-K fills the GPU in every case."""
    depth = 32 * 56 * 56
    for dtype in (np.float16, BF16):
        def choose(rows, cols):
            return conv_tiles.choose_tile(dtype, 'float32', rows, cols, depth, wgrad=True).name
        assert choose(2304, 256) == '128x128x32'   # 3x3 256 -> 256
        assert choose(576, 64) == '128x64x64'      # 3x3 64 -> 64
        assert choose(256, 64) == '128x64x64'      # 1x1 256 -> 64
        assert choose(64, 256) == '64x128x64'      # 1x1 64 -> 256
        assert choose(64, 64) == '64x64x64'        # 1x1 64 -> 64
    # fwd and dgrad keep the shared table: the wgrad-only tiles are not built for them
    with pytest.raises(ValueError, match='no tile'), conv_tiles.forced(tile='128x64x64'):
        conv_tiles.choose_tile(np.float16, 'float32', 576, 64, 576)


def test_wgrad_decode_args_reproduce_the_pixel_and_its_packed_origin():
    """The launcher's decode constants for conv_igemm_wgrad (geometry.wgrad_decode_args): the FastDiv
    multipliers divide exactly for every numerator < 2**31, and the two linear forms of the K
    position's quotients give the window origin's pixel index and WgradPack coordinates (mod 2**32),
    which the kernel computes from them alone (conv_igemm.cu PixLinear)."""
    from gpuk.kernels.conv import geometry
    rng = np.random.default_rng(0)
    for d in (1, 2, 3, 7, 56, 64, 1000, 65537, (1 << 31) - 1):
        mul, shift = geometry.fast_div(d)
        assert mul < 1 << 32
        n = np.concatenate([rng.integers(0, 1 << 31, 2000), [0, d - 1, d, (1 << 31) - 1]]).astype(object)
        assert all((v * mul) >> shift == v // d for v in n)
    g = geometry.Geometry(3, 8, 16, (5, 9, 11), (3, 4, 6), (2, 3, 3), (2, 2, 2), (1, 1, 1), (0, 1, 1), True)
    (w_mul, w_shift, h_mul, h_shift, d_mul, d_shift, *forms) = (int(v) for v in geometry.wgrad_decode_args(g))
    (in_d, in_h, in_w), (out_d, out_h, out_w), (s_d, s_h, s_w) = g.in_sp, g.out_sp, g.strides
    for k in range(g.batch * out_d * out_h * out_w):
        rows = (k * w_mul) >> w_shift
        planes = (rows * h_mul) >> h_shift
        n = (planes * d_mul) >> d_shift
        ow, oh, od = k - rows * out_w, rows - planes * out_h, planes - n * out_d
        pixel, packed = ((k * s_w + rows * a + planes * b + n * c) % (1 << 32) for a, b, c in (forms[:3], forms[3:]))
        assert pixel == ((n * in_d + od * s_d) * in_h + oh * s_h) * in_w + ow * s_w
        assert packed == ((od * s_d) << geometry.WGRAD_PACK_D_SHIFT) + ((oh * s_h) << geometry.WGRAD_PACK_H_SHIFT) + ow * s_w


def test_tile_rules_for_short_k_and_per_element_copies():
    # 1x1 64 -> 64 at N=32: K = 64 is 4 FFMA K tiles, too short for the largest tile's pipeline.
    assert conv_tiles.choose_tile(np.float32, 'float32', 32 * 56 * 56, 64, 64).name == '64x64x16'
    assert conv_tiles.choose_tile(np.float32, 'float32', 32 * 56 * 56, 256, 576).name == '128x128x16'
    # the 7x7 stem (C_in = 3, C_out = 64): per-element copies accept the 128-wide tile's padding.
    stem = (32 * 112 * 112, 64, 147)
    assert conv_tiles.choose_tile(np.float32, 'float32', *stem, aligned=False).name == '128x128x16'
    assert conv_tiles.choose_tile(np.float32, 'float32', *stem).name == '64x64x16'


class _CudaLikeRuntime:
    """The emulated runtime presented as an sm_80 CUDA device: the launchers take the cuDNN
    dispatcher's path (dispatch.run runs cuDNN only on the CUDA runtime)."""
    kind, arch = 'cuda', 'sm_80'

    def __init__(self, emulated):
        self._emulated = emulated

    def __getattr__(self, name):
        return getattr(self._emulated, name)


def test_prepared_runners_dispatch_to_cudnn_with_the_bias_epilogue(monkeypatch):
    """With GPUK_KERNELS=conv=cudnn the conv runners hand each call (kept problem or not) to
    cuDNN with the caller's arrays and geometry, and conv_fwd's fused bias + relu epilogue is
    applied after cuDNN's convolution (here cuDNN's functions are the twin's, counted)."""
    from gpuk.kernels.cudnn import conv as cudnn_conv, library as cudnn
    from gpuk.kernels.runtime import get_runtime
    from gpuk import config
    rt = _CudaLikeRuntime(get_runtime('emulate'))
    monkeypatch.setitem(config._kernels, 'conv', 'cudnn')   # GPUK_KERNELS=conv=cudnn
    monkeypatch.setattr(cudnn, 'choose', lambda family: 'cudnn')   # as if cuDNN were available
    calls = []
    for name in ('conv_fwd', 'conv_dgrad', 'conv_wgrad'):
        monkeypatch.setattr(cudnn_conv, name, lambda *a, _name=name: calls.append(_name) or getattr(twin, _name)(*a))
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2, 5, 5, 3)).astype(np.float32), rng.standard_normal((3, 3, 3, 4)).astype(np.float32)
    b, dy = rng.standard_normal(4).astype(np.float32), rng.standard_normal((2, 5, 5, 4)).astype(np.float32)
    geometry = ((1, 1), (1, 1), ((1, 1), (1, 1)), 'channels_last')
    for _ in range(2):   # the second call: the problems' kept runners
        y = conv.conv_fwd(x, w, *geometry, epilogue='bias_relu', bias=b, runtime=rt)
        np.testing.assert_allclose(y, twin.conv_fwd(x, w, *geometry, epilogue='bias_relu', bias=b), rtol=1e-5,
                                   atol=1e-5)
        np.testing.assert_allclose(conv.conv_dgrad(dy, w, x.shape, *geometry, runtime=rt),
                                   twin.conv_dgrad(dy, w, x.shape, *geometry), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(conv.conv_wgrad(x, dy, w.shape, *geometry, runtime=rt),
                                   twin.conv_wgrad(x, dy, w.shape, *geometry), rtol=1e-5, atol=1e-4)
    assert calls == ['conv_fwd', 'conv_dgrad', 'conv_wgrad'] * 2


# WgradPack (conv_igemm_loaders.cuh): the wgrad 16-byte loader tests "inside the image" on all three axes
# with one packed add per side, where every coordinate it can reach fits the fields (the d field
# holds [size - 128, 127]); otherwise it keeps three compares. Input depth 127 with pad 1 on both
# sides is the d field's limit (coordinates -1 .. 127), 128 one past it (the fallback); the 2D
# case pads every side, dilates and strides. Channels are multiples of 8 (16-byte copies).
# float64 (2 chunks per row) keeps the compares on every shape (WG_PACKED).
PACKED_BOUNDS_CASES = [
    ((127, 1, 2), (3, 1, 1), (1, 1, 1), (1, 1, 1), ((1, 1), (0, 0), (0, 0)), 8, 8),    # packed, at the limit
    ((128, 1, 2), (3, 1, 1), (1, 1, 1), (1, 1, 1), ((1, 1), (0, 0), (0, 0)), 8, 8),    # compares (fallback)
    ((7, 9), (3, 2), (2, 1), (1, 2), ((2, 1), (1, 2)), 8, 16),                         # packed, pads all round
]
PACKED_DTYPES = [(np.float16, 'float32'), (np.float32, 'float32'), (np.float32, 'tf32'), (np.float64, 'float32')]


@pytest.mark.parametrize('dtype, precision', PACKED_DTYPES,
                         ids=['%s-%s' % (np.dtype(d).name, p) for d, p in PACKED_DTYPES])
@pytest.mark.parametrize('case', PACKED_BOUNDS_CASES, ids=['d127-packed', 'd128-compares', '2d-pads-all-round'])
def test_wgrad_packed_bounds_and_their_fallback(kernel_runtime, case, dtype, precision):
    """wgrad's 16-byte loader on both sides of the packed bounds test's limit, with padding on
    every side, dilation, stride and M, N, K tails: the same weights gradient as the twin."""
    _, kernel, strides, dilation, pads, _, _ = case
    x, w, dy = _conv_arrays(case, dtype, 'channels_last', seed=5, batch=1)
    args = (x, dy, w.shape, strides, dilation, pads, 'channels_last')
    with _precision(precision), conv_wgmma.forced(False):
        rounded = [round_tf32(a) for a in (x, dy)] if precision == 'tf32' else [x, dy]
        ref = twin.conv_wgrad(*(a.astype(np.float64) for a in rounded), *args[2:])
        out = conv.conv_wgrad(*[to_device(kernel_runtime, a) for a in args[:2]], *args[2:], runtime=kernel_runtime)
    assert to_host(out).dtype == np.dtype(dtype)
    assert_close(out, ref, dtype, 'conv_wgrad %s' % (case[:2],))


# channels_last wgrad's strip tiles (run as channel quads, conv_depthwise.cu wgrad_quad): partial
# tiles along H and W, 3x3, 5x5 with a multiplier, 7x3 in tap groups of 3, 3 and 1 kernel rows,
# padding wider than the filter's half
DEPTHWISE_STRIP_CASES = [
    ((16, 29), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), 40, 1),
    ((30, 13), (5, 5), (1, 1), (1, 1), ((2, 2), (2, 2)), 6, 2),
    ((14, 16), (7, 3), (1, 1), (1, 1), ((3, 4), (1, 0)), 3, 1),
]


@pytest.mark.parametrize('dtype', DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize('case', DEPTHWISE_STRIP_CASES, ids=_ids(DEPTHWISE_STRIP_CASES))
def test_depthwise_wgrad_row_strips(kernel_runtime, case, dtype):
    """The launcher gives these the strip tiles (4-byte accumulators; float64 keeps one row per
    thread) and the kernel's sums match the twin's, with and without pixel-tile splits."""
    spatial, kernel, strides, dilation, pads, _, _ = case
    out = twin.depthwise_conv_fwd(*_depthwise_arrays(case, np.float32, 'channels_last')[:2], strides, dilation,
                                  pads, 'channels_last').shape[1:-1]
    tile = conv_direct.depthwise_wgrad_tile('t', dtype, False, out, kernel, strides, dilation)
    assert (tile.rows * tile.segs > conv_direct.DW_ROWS) == (np.dtype(dtype) != np.float64), tile
    x, w, dy = _depthwise_arrays(case, dtype, 'channels_last', seed=7)
    for splits in (None, 3):
        with conv_tiles.forced(splits=splits):
            assert_matches_twin(conv.depthwise_conv_wgrad, twin.depthwise_conv_wgrad,
                                (x, dy, w.shape, strides, dilation, pads, 'channels_last'), kernel_runtime)


# channels_last wgrad's channel quads (conv_depthwise.cu wgrad_quad: a thread sums 4 channels of
# one output row of 8 pixels, dy in registers, x through 16-byte shared loads) on the strip
# tiles: partial tiles along H and W, a partial channel tile (40 = 32 + 8: quads 2-7 of the
# second idle), 5x5 (tap groups of 2, 2 and 1 kernel rows), 7x3 (3, 3, 1), padding wider than
# the filter's half, a 3-D problem with k_d = 1, 5 channels (a quad of 1 channel: element loads)
# and a depth multiplier (element loads); 64 channels (two whole channel tiles: the dy base the
# block's threads share moves with j0, the quad's channels are in each thread's offset) on images
# 37 and 61 wide (5x5 on 16 x 16 tiles, 3x3 on 8 x 32: rows wholly inside dy, read through the
# per-pixel bases and the loop that ends on the offset, beside right-edge rows of 5 pixels, read
# with bounds)
DEPTHWISE_QUAD_CASES = [
    ((16, 29), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), 40, 1),
    ((30, 13), (5, 5), (1, 1), (1, 1), ((2, 2), (2, 2)), 24, 1),
    ((14, 16), (7, 3), (1, 1), (1, 1), ((3, 4), (1, 0)), 16, 1),
    ((13, 21), (5, 3), (1, 1), (1, 1), ((2, 2), (3, 3)), 8, 1),
    ((3, 16, 14), (1, 3, 3), (1, 1, 1), (1, 1, 1), ((0, 0), (1, 1), (1, 1)), 8, 1),
    ((16, 32), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), 5, 1),
    ((16, 16), (5, 5), (1, 1), (1, 1), ((2, 2), (2, 2)), 3, 3),
    ((14, 37), (5, 5), (1, 1), (1, 1), ((2, 2), (2, 2)), 64, 1),
    ((8, 61), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), 64, 1),
]


@pytest.mark.parametrize('dtype', DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize('case', DEPTHWISE_QUAD_CASES, ids=_ids(DEPTHWISE_QUAD_CASES))
def test_depthwise_wgrad_channel_quads(kernel_runtime, case, dtype):
    """The launcher's choice is the quads for 4-byte accumulators ('rows' in float64), and the
    sums match the twin's, with and without pixel-tile splits (the element loads: the 5-channel
    and multiplier cases); on a GPU also with a dy 4 bytes off its 16-byte alignment (the
    kernel's own check takes the element loads). The emulator copies each buffer to the end of
    its own pages, so there that view is aligned again and runs the 16-byte loads."""
    spatial, kernel, strides, dilation, pads, c_in, mult = case
    x, w, dy = _depthwise_arrays(case, dtype, 'channels_last', seed=11)
    tile = conv_direct.depthwise_wgrad_tile('t', dtype, False, dy.shape[1:-1], kernel, strides, dilation)
    math_path = conv_direct.depthwise_wgrad_math(tile)
    assert math_path == ('rows' if np.dtype(dtype) == np.float64 else 'quads'), (tile, math_path)
    args = (x, dy, w.shape, strides, dilation, pads, 'channels_last')
    for splits in (None, 3):
        with conv_tiles.forced(splits=splits):
            assert_matches_twin(conv.depthwise_conv_wgrad, twin.depthwise_conv_wgrad, args, kernel_runtime)
    if np.dtype(dtype) == np.float32 and len(spatial) == 2:
        flat = kernel_runtime.xp.zeros(dy.size + 1, dtype)
        shifted = flat[1:].reshape(dy.shape)   # 4 bytes past a 16-byte boundary
        shifted[...] = to_device(kernel_runtime, dy)
        ref = twin.depthwise_conv_wgrad(x.astype(np.float64), dy.astype(np.float64), *args[2:])
        out = conv.depthwise_conv_wgrad(to_device(kernel_runtime, x), shifted, *args[2:], runtime=kernel_runtime)
        assert_close(out, ref, dtype, 'depthwise_conv_wgrad, dy misaligned')


# channels_first wgrad's channel quads (conv_depthwise.cu: x and dy tiles both copied channel-minor
# by load_tile_transposed, 16-byte shared loads of 4 channels for both): partial tiles along H and
# W (16 x 28 and 26 x 12 on 16 x 16 tiles), a partial channel tile (40), 5x5 (tap groups of 2, 2 and 1
# kernel rows), 7x3 (3, 3, 1), 5x3 with padding wider than the filter's half, a 3-D problem with
# k_d = 1, a depth multiplier of 3, and 14 x 14 planes (whole 16-byte vectors in float32 only: the
# 16-bit sources are not transposable, so they keep one row per thread)
DEPTHWISE_QUAD_CF_CASES = [
    ((16, 28), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), 40, 1),
    ((26, 12), (5, 5), (1, 1), (1, 1), ((2, 2), (2, 2)), 24, 1),
    ((16, 16), (7, 3), (1, 1), (1, 1), ((3, 3), (1, 1)), 16, 1),
    ((13, 24), (5, 3), (1, 1), (1, 1), ((2, 2), (3, 3)), 8, 1),
    ((2, 16, 12), (1, 3, 3), (1, 1, 1), (1, 1, 1), ((0, 0), (1, 1), (1, 1)), 8, 1),
    ((16, 16), (5, 5), (1, 1), (1, 1), ((2, 2), (2, 2)), 4, 3),
    ((14, 14), (3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)), 32, 1),
]


def test_depthwise_wgrad_channels_first_quads_fit_two_sm80_blocks():
    """Every channels_first strip tile the launcher gives the quads (planar tiles, sized by the
    quads' tap groups) fits two blocks per sm_80 SM: (164 KB - 2 x 1 KB) / 2 = 82,944 bytes."""
    assert conv_direct.DW_WG_CF_MAX_SHARED == 82944
    shapes = set()
    for kernel in ((3, 3), (5, 5), (7, 3), (5, 3), (3, 5)):
        for out in ((56, 56), (112, 112), (28, 8), (8, 40), (4, 64), (32, 8), (16, 16), (7, 7), (30, 13), (2, 200)):
            tile = conv_direct.depthwise_wgrad_tile('t', np.float32, True, out, kernel, (1, 1), (1, 1))
            if conv_direct.depthwise_wgrad_math(tile) == 'quads':
                assert conv_direct.DW_MAX_SHARED < tile.shared_bytes <= 82944, (kernel, out, tile)
                shapes.add((tile.rows, tile.segs))
    assert len(shapes) >= 3, shapes   # (several strip shapes, not one)


@pytest.mark.parametrize('dtype', DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize('case', DEPTHWISE_QUAD_CF_CASES, ids=_ids(DEPTHWISE_QUAD_CF_CASES))
def test_depthwise_wgrad_channel_quads_channels_first(kernel_runtime, case, dtype):
    """channels_first: the launcher's choice is the quads for 4-byte accumulators where both
    sources are transposable (their strip tile holds the x and dy tiles, above 48 KB: the runtime
    opts the kernel in), 'rows' otherwise; the sums match the twin's with and without splits."""
    spatial, kernel, strides, dilation, pads, c_in, mult = case
    x, w, dy = _depthwise_arrays(case, dtype, 'channels_first', seed=13)
    # where a device array would start (NumPy's 16 bytes would leave the emulator's launches to
    # the tile without quads at random: the runner takes the quads only on 32-byte aligned views)
    x, dy = aligned_copy(x), aligned_copy(dy)
    in_pixels, out_pixels = int(np.prod(x.shape[2:])), int(np.prod(dy.shape[2:]))
    transposable = conv_direct.wgrad_transposable(dtype, c_in, mult, in_pixels, out_pixels)
    tile = conv_direct.depthwise_wgrad_tile('t', dtype, True, dy.shape[2:], kernel, strides, dilation, transposable)
    math_path = conv_direct.depthwise_wgrad_math(tile)
    quads = np.dtype(dtype) != np.float64 and transposable
    assert math_path == ('quads' if quads else 'rows'), (tile, math_path)
    if quads:
        assert conv_direct.DW_MAX_SHARED < tile.shared_bytes <= conv_direct.DW_WG_CF_MAX_SHARED, tile
        assert conv_direct._aligned32(x) and conv_direct._aligned32(dy)   # (the quads run)
    args = (x, dy, w.shape, strides, dilation, pads, 'channels_first')
    for splits in (None, 3):
        with conv_tiles.forced(splits=splits):
            assert_matches_twin(conv.depthwise_conv_wgrad, twin.depthwise_conv_wgrad, args, kernel_runtime)
    if quads and np.dtype(dtype) == np.float32 and len(spatial) == 2:
        # a dy view 4 bytes past a 32-byte boundary: the launcher takes the tile without quads
        # (the kernel's quads there need the transposing loader's aligned sources)
        flat = kernel_runtime.xp.zeros(dy.size + 1, dtype)
        shifted = flat[1:].reshape(dy.shape)
        shifted[...] = to_device(kernel_runtime, dy)
        assert not conv_direct._aligned32(shifted)
        ref = twin.depthwise_conv_wgrad(x.astype(np.float64), dy.astype(np.float64), *args[2:])
        out = conv.depthwise_conv_wgrad(to_device(kernel_runtime, x), shifted, *args[2:], runtime=kernel_runtime)
        assert_close(out, ref, dtype, 'depthwise_conv_wgrad, dy misaligned')
