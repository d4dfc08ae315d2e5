"""Launchers of the direct convolution kernels: depthwise (conv_depthwise.cu) and locally
connected (conv_local.cu). Re-exported by gpuk/kernels/conv/__init__.py; same signatures as the
twins in gpuk/cpu_fallback/conv.py plus a keyword-only `runtime`.
"""
import math
from collections import namedtuple
from pathlib import Path

import numpy as np

from gpuk.contracts import conv_checks
from gpuk.contracts.dtypes import ELEMENT_TYPES, FLOAT_DTYPES, accumulation_dtype
from gpuk.contracts.geometry import MAX_GRID_YZ, check_index_limit
from . import split_k
from . import tiles as conv_tiles
from ..runtime import prepared, register_build, resolve

DEPTHWISE_SOURCE = Path(__file__).with_name('conv_depthwise.cu')
LOCAL_SOURCE = Path(__file__).with_name('conv_local.cu')
# Tile constants: #defines of the .cu files and the grids below (one place).
DW_CHANNELS, DW_ROWS, DW_PIX = 32, 8, 8    # lanes x thread rows; output pixels per thread along W
DW_WG_TAPS = 15                            # wgrad: most taps one block reduces at once
DW_WG_STRIP = 4                            # wgrad strip tiles: DW_ROWS * DW_WG_STRIP rows (channel quads)
DW_WG_QTAPS = 10                           # wgrad channel quads: most taps per group (conv_depthwise.cu)
DW_MAX_SHARED = 48 * 1024                  # the tiles live in (default-sized) dynamic shared memory
DW_WG_CF_MAX_SHARED = 82944                # channels_first quads: x and dy tiles (opt-in; 2 blocks per sm_80 SM:
                                           # (164 KB - 2 x 1 KB reserved) / 2)
DW_CHANNELS_FIRST_SEGS = 4                 # channels_first tiles: 2 rows x 32 pixels (loads along W)
DW_TARGET_BLOCKS = 528                     # wgrad splits pixel tiles until about four waves of 132 SMs
DW_MIN_TILES_PER_SPLIT = 4
DW_MAX_SPLITS = 4096
DW_THREADS = DW_CHANNELS * DW_ROWS
LOCAL_THREADS = 256
LOCAL_IMAGES = 4                           # images one local_fwd / local_dgrad work item sums (w read once per group)
LOCAL_MAX_BLOCKS = 65535


def depthwise_defines(dtype, channels_first):
    dtype = np.dtype(dtype)
    return {'ELEMENT_T': ELEMENT_TYPES[dtype], 'ACC_T': ELEMENT_TYPES[accumulation_dtype(dtype)], 'DW_CHANNELS': DW_CHANNELS,
            'DW_ROWS': DW_ROWS, 'DW_PIX': DW_PIX, 'DW_WG_TAPS': DW_WG_TAPS,
            'DW_CHANNELS_LAST': int(not channels_first)}


def local_defines(dtype):
    dtype = np.dtype(dtype)
    return {'ELEMENT_T': ELEMENT_TYPES[dtype], 'ACC_T': ELEMENT_TYPES[accumulation_dtype(dtype)],
            'LOCAL_THREADS': LOCAL_THREADS, 'LOCAL_IMAGES': LOCAL_IMAGES}


for _dtype in FLOAT_DTYPES:
    for _channels_first in (False, True):
        register_build(DEPTHWISE_SOURCE, depthwise_defines(_dtype, _channels_first),
                       ['depthwise_fwd', 'depthwise_dgrad', 'depthwise_wgrad', 'depthwise_reduce_splits'])
    register_build(LOCAL_SOURCE, local_defines(_dtype), ['local_fwd', 'local_dgrad', 'local_wgrad'])


def lift3(values, fill):
    """A per-spatial-dim tuple of 1 to 3 values as 3 values, `fill` in front."""
    values = tuple(int(v) for v in values)
    return (fill,) * (3 - len(values)) + values


def _spatial_args(*groups):
    return tuple(np.int32(v) for group in groups for v in group)


# ---------------------------------------------------------------- depthwise

def _depthwise_args(x_spatial, out_spatial, kernel_spatial, strides, dilation, pads):
    return _spatial_args(lift3(x_spatial, 1), lift3(out_spatial, 1), lift3(kernel_spatial, 1), lift3(strides, 1),
                         lift3(dilation, 1), lift3([b for b, _ in pads], 0))


DwTile = namedtuple('DwTile', 'rows segs kh_chunk shared_bytes rows_per_thread', defaults=(1,))
# fwd / dgrad with a whole K x K filter at stride 1, dilation 1: output rows per thread
# (conv_depthwise.cu correlate / rows_window)
DW_ROWS_WINDOW = {3: 4, 5: 2}


def _shared_words_per_pixel(channels_first):
    """Shared-memory pitch of a tile pixel (conv_depthwise.cu DW_PITCH): channels_first
    loads write 32 pixels of one channel, so an odd pitch keeps them on 32 banks."""
    return DW_CHANNELS + 1 if channels_first else DW_CHANNELS


def _wgrad_elements_per_pixel(dtype, channels_first, transposable):
    """The same for depthwise_wgrad's tiles, in accumulator elements: channels_first tiles copied
    by its transposing loader (``transposable``: wgrad_transposable) have 16-byte shared stores,
    which need a pixel padded by 16 bytes (conv_depthwise.cu DW_TRANSPOSED_PITCH)."""
    if channels_first and transposable:
        return DW_CHANNELS + 16 // _acc_bytes(dtype)
    return _shared_words_per_pixel(channels_first)


def wgrad_transposable(dtype, c_in, mult, in_pixels, out_pixels):
    """Whether channels_first depthwise_wgrad may copy x and dy with its transposing loader
    (conv_depthwise.cu transposable_source, less the 32-byte alignment of the base, which only
    the kernel sees): planes of whole 16-byte vectors, samples of whole 32-byte sectors. Where
    it may not, its tiles keep the smaller pitch, and so do the tile sizes here."""
    vec = 16 // np.dtype(dtype).itemsize
    return all(pixels % vec == 0 and channels * pixels % (2 * vec) == 0
               for channels, pixels in ((c_in, in_pixels), (c_in * mult, out_pixels)))


def _acc_bytes(dtype):
    return 8 if np.dtype(dtype) == np.float64 else 4


def _covered(out_h, out_w, rows, segs):
    """Output pixels (padding included) that tiles of rows x segs * DW_PIX cover."""
    cols = segs * DW_PIX
    return math.ceil(out_h / rows) * rows * math.ceil(out_w / cols) * cols


def _tile_shape(channels_first, out_h, out_w, segs_multiple=1, rows_per_thread=1):
    """(rows, segments) of the output tile (rows x segments * DW_PIX pixels, rows * segments
    = DW_ROWS * rows_per_thread): the shape that covers the output with the least padding; ties
    go to 8 x 8 in channels_last (smallest halo) and to 2 x 32 in channels_first (loads and
    stores run along W). segs_multiple: only segment counts it divides (dgrad's hole
    skipping), when there are any."""
    preferred = (4, 2, 8, 1) if channels_first else (1, 2, 4, 8)
    preferred = [segs for segs in preferred if segs % segs_multiple == 0] or preferred
    best = None
    for segs in preferred:
        rows = DW_ROWS // segs * rows_per_thread
        covered = _covered(out_h, out_w, rows, segs)
        if best is None or covered < best[0]:
            best = (covered, rows, segs)
    return best[1], best[2]


def _smaller_tile(fn, rows, segs, nbytes):
    """The next smaller output tile when `nbytes` of shared memory is too much: fewer rows,
    then fewer segments (the threads left without a row only help with the loads)."""
    if rows > 1:
        return rows // 2, segs
    if segs > 1:
        return rows, segs // 2
    raise ValueError('%s: the smallest shared-memory tile of this filter and stride needs %d bytes, above the '
                     'kernel limit of %d; use smaller strides or dilations' % (fn, nbytes, DW_MAX_SHARED))


def _dw_weight_bytes(dtype, k_w, chunk):
    """Shared memory of the filter values fwd / dgrad stage per tile (conv_depthwise.cu
    dw_weight_pitch): DW_CHANNELS lanes x `chunk` kernel rows of k_w rounded up to DW_PIX
    slots, plus one 16-byte vector per lane."""
    acc = _acc_bytes(dtype)
    return DW_CHANNELS * (math.ceil(k_w / DW_PIX) * DW_PIX * chunk * acc + 16)


def _unit_steps(strides, dilation):
    """Whether every stride and dilation is 1 (the whole-filter windows and wgrad's row strips)."""
    return all(s == 1 for s in lift3(strides, 1)) and all(d == 1 for d in lift3(dilation, 1))


def _rows_window_tile(dtype, channels_first, out_h, out_w, k):
    """The DwTile of conv_depthwise.cu's whole-filter windows (k x k, stride 1, dilation 1, one
    plane), R = DW_ROWS_WINDOW[k] output rows per thread, or None where its input tile and
    filter do not fit DW_MAX_SHARED at once, and in float64 (not built: its tiles never fit)."""
    if _acc_bytes(dtype) != 4:
        return None
    rpt = DW_ROWS_WINDOW[k]
    rows, segs = _tile_shape(channels_first, out_h, out_w, rows_per_thread=rpt)
    nbytes = ((rows + k - 1) * (segs * DW_PIX + k - 1) * _shared_words_per_pixel(channels_first)
              * _acc_bytes(dtype) + _dw_weight_bytes(dtype, k, k))
    return DwTile(rows, segs, k, nbytes, rpt) if nbytes <= DW_MAX_SHARED else None


def depthwise_tile(fn, dtype, channels_first, out_spatial, kernel_spatial, strides, dilation, hole_stride=1,
                   rows_window=False):
    """The DwTile of depthwise_fwd / depthwise_dgrad (dgrad passes stride 1: it correlates
    the zero-stuffed dy, and its real stride along W as hole_stride): all kernel rows in one
    input tile (with their staged filter values, _dw_weight_bytes) when it fits DW_MAX_SHARED,
    else chunks of kernel rows, then fewer output rows. Segment counts that hole_stride divides
    are preferred: the kernel then skips the stride holes along W. rows_window: the caller's
    problem may take the whole-filter windows (one multiplier group, no stride holes); they run
    where the filter is 3x3 or 5x5 in one plane at stride 1, dilation 1, and their tile fits."""
    (_, out_h, out_w), (k_d, k_h, k_w) = lift3(out_spatial, 1), lift3(kernel_spatial, 1)
    (_, s_h, s_w), (_, dil_h, dil_w) = lift3(strides, 1), lift3(dilation, 1)
    if (rows_window and k_d == 1 and k_h == k_w and k_w in DW_ROWS_WINDOW and hole_stride == 1
            and _unit_steps(strides, dilation)):
        tile = _rows_window_tile(dtype, channels_first, out_h, out_w, k_w)
        if tile is not None:
            return tile
    rows, segs = _tile_shape(channels_first, out_h, out_w, hole_stride)
    pixel_bytes = _shared_words_per_pixel(channels_first) * _acc_bytes(dtype)

    def nbytes(rows, segs, chunk):
        cols_in = (segs * DW_PIX - 1) * s_w + (k_w - 1) * dil_w + 1
        return (((rows - 1) * s_h + (chunk - 1) * dil_h + 1) * cols_in * pixel_bytes
                + _dw_weight_bytes(dtype, k_w, chunk))
    chunk = k_h
    while nbytes(rows, segs, chunk) > DW_MAX_SHARED:
        if chunk > 1:
            chunk = math.ceil(chunk / 2)
        else:
            rows, segs = _smaller_tile(fn, rows, segs, nbytes(rows, segs, chunk))
    return DwTile(rows, segs, chunk, nbytes(rows, segs, chunk))


def wgrad_group_taps(kernel_spatial, limit=DW_WG_TAPS):
    """Taps per wgrad group: whole kernel rows (as many as `limit` holds: DW_WG_TAPS, or
    DW_WG_QTAPS for the channel quads) when a row fits."""
    k_w = lift3(kernel_spatial, 1)[2]
    return limit // k_w * k_w if k_w <= limit else limit


def _tap_groups(kernel_spatial, limit=DW_WG_TAPS):
    """(planes, kernel rows) spanned by each wgrad tap group (conv_depthwise.cu depthwise_wgrad) of
    at most `limit` taps (wgrad_group_taps)."""
    k_d, k_h, k_w = lift3(kernel_spatial, 1)
    taps, group = k_d * k_h * k_w, wgrad_group_taps(kernel_spatial, limit)
    for lo in range(0, taps, group):
        hi = min(taps, lo + group)
        kd_lo, kd_hi = lo // (k_h * k_w), (hi - 1) // (k_h * k_w)
        if kd_lo == kd_hi:
            yield kd_hi - kd_lo, (hi - 1) // k_w % k_h - lo // k_w % k_h
        else:
            yield kd_hi - kd_lo, k_h - 1


def _planar_pixels(pixels):
    """Pixels one 4-lane plane of a channels_first quads tile holds (conv_depthwise.cu
    planar_pixels): odd, so that the 8 planes of one pixel start on 8 distinct 4-bank groups."""
    return pixels | 1


def _wgrad_strip_tile(out_h, out_w, k_w, span_h, pixel_bytes, reduction, channels_first=False):
    """depthwise_wgrad's strip tiles, DW_ROWS * DW_WG_STRIP rows of DW_PIX pixels, which it runs
    as channel quads (conv_depthwise.cu wgrad_quad: 32 workers of one row, a thread 4 channels;
    channels_last: the x tile only in shared memory, dy is read into registers, within
    DW_MAX_SHARED; channels_first: x and dy tiles, both transposed by load_tile_transposed into
    planes of 4 lanes (16 bytes a pixel, an odd pixel count a plane), within DW_WG_CF_MAX_SHARED,
    dynamic shared memory above 48 KB that the runtime opts the kernel into); the shape of the
    least padding of those that fit (ties: 16 x 16, then 8 x 32), or None."""
    best = None
    limit = DW_WG_CF_MAX_SHARED if channels_first else DW_MAX_SHARED
    for segs in (2, 4, 1, 8):
        rows, cols = DW_ROWS // segs * DW_WG_STRIP, segs * DW_PIX
        x_pixels = (rows + span_h) * (cols + k_w - 1)
        if channels_first:   # (pixel_bytes: a pixel's DW_CHANNELS lanes)
            pixels = _planar_pixels(x_pixels) + _planar_pixels(rows * cols)
        else:
            pixels = x_pixels
        nbytes = max(reduction, pixels * pixel_bytes)
        covered = _covered(out_h, out_w, rows, segs)
        if nbytes <= limit and (best is None or covered < best[0]):
            best = (covered, DwTile(rows, segs, 1, nbytes, DW_WG_STRIP))
    return best and best[1]


def depthwise_wgrad_tile(fn, dtype, channels_first, out_spatial, kernel_spatial, strides, dilation,
                         transposable=True, quads=True):
    """The DwTile of depthwise_wgrad (kh_chunk unused): the input tile of the widest tap
    group, the dy tile and the final reduction buffer fit DW_MAX_SHARED. transposable: the
    sources may take the transposing loader's wider pitch (wgrad_transposable); quads=False:
    never the channel quads' strip tiles (channels_first sources that are not 32-byte aligned,
    which the kernel's quads do not take there)."""
    (_, out_h, out_w), (k_d, _, k_w) = lift3(out_spatial, 1), lift3(kernel_spatial, 1)
    (_, s_h, s_w), (dil_d, dil_h, dil_w) = lift3(strides, 1), lift3(dilation, 1)
    rows, segs = _tile_shape(channels_first, out_h, out_w)
    pixel_bytes = _wgrad_elements_per_pixel(dtype, channels_first, transposable) * _acc_bytes(dtype)
    spans = set(_tap_groups(kernel_spatial))
    reduction = DW_ROWS * DW_WG_TAPS * DW_CHANNELS * _acc_bytes(dtype)
    # channel quads: channels_last, or channels_first whose sources the transposing loader takes
    # (x and dy tiles channel-minor, up to DW_WG_CF_MAX_SHARED; views not 32-byte aligned get the
    # runner's second launch, on the tile of quads=False)
    if (quads and (not channels_first or transposable) and _acc_bytes(dtype) == 4 and k_d == 1 and k_w in (3, 5)
            and _unit_steps(strides, dilation)):
        if channels_first:   # (planes of 4 lanes, 16 bytes a pixel; the quads' groups of DW_WG_QTAPS taps)
            strip = _wgrad_strip_tile(out_h, out_w, k_w, max(h for _, h in _tap_groups(kernel_spatial, DW_WG_QTAPS)),
                                      DW_CHANNELS * _acc_bytes(dtype), reduction, True)
        else:
            strip = _wgrad_strip_tile(out_h, out_w, k_w, max(h for _, h in spans), pixel_bytes, reduction)
        # not where its taller tile pads the output much more (short images, 1-D filters)
        if strip is not None and (_covered(out_h, out_w, strip.rows, strip.segs)
                                  <= 1.25 * _covered(out_h, out_w, rows, segs)):
            return strip

    def nbytes(rows, segs):
        cols = segs * DW_PIX
        cols_in = (cols - 1) * s_w + (k_w - 1) * dil_w + 1
        tiles = max((d * dil_d + 1) * ((rows - 1) * s_h + h * dil_h + 1) * cols_in for d, h in spans)
        return max(reduction, (tiles + rows * cols) * pixel_bytes)
    while nbytes(rows, segs) > DW_MAX_SHARED:
        rows, segs = _smaller_tile(fn, rows, segs, nbytes(rows, segs))
    return DwTile(rows, segs, 1, nbytes(rows, segs))


def _check_sample_sizes(fn, channels, pixels, filter_size):
    """Inside a sample and the filter the kernels use 32-bit offsets; the grid has at most
    MAX_GRID_YZ channel tiles."""
    check_index_limit(fn, 'channels x pixels of one sample', max(c * p for c, p in zip(channels, pixels)))
    check_index_limit(fn, 'the filter size', filter_size)
    if math.ceil(max(channels) / DW_CHANNELS) > MAX_GRID_YZ:
        raise ValueError('%s: %d channels is above the kernel limit of %d'
                         % (fn, max(channels), MAX_GRID_YZ * DW_CHANNELS))


def _checked_pair(fn, runtime, first, second):
    """(rt, a, b): the runtime and the two named inputs (name, array) as float arrays of its
    xp with one dtype; the checks of every launcher here, in the twins' order."""
    rt = resolve(runtime)
    a = conv_checks.float_array(fn, first[0], first[1], xp=rt.xp)
    b = conv_checks.float_array(fn, second[0], second[1], xp=rt.xp)
    conv_checks.same_dtype(fn, [(first[0], a), (second[0], b)])
    return rt, a, b


# Every launcher here checks its problem and sets up its launches once per problem signature
# (runtime/prepared.py): prepare() returns (output shape, dtype, the launches as (launch,
# scalar arguments) pairs, ...); a repeated problem only converts its arrays and launches.

def _contiguous(rt, *arrays):
    xp = rt.xp
    return tuple(xp.ascontiguousarray(a if isinstance(a, xp.ndarray) else xp.asarray(a)) for a in arrays)


def _depthwise_tiled(rt, fn, kernel_name, dtype, n, c_in, mult, geometry, channels_first, tile_spatial,
                     tile_strides, lanes, hole_stride=1, rows_window=True):
    """(launch, scalar arguments) of depthwise_fwd / depthwise_dgrad (same argument list): one
    block per (sample, plane, tile of output pixels) x DW_CHANNELS lanes. geometry: the
    (in_spatial, out_spatial, kernel_spatial, strides, dilation, pads) of _depthwise_args;
    tile_spatial / tile_strides: the spatial size the kernel writes and the strides of its
    correlation; rows_window: see depthwise_tile."""
    tile = depthwise_tile(fn, dtype, channels_first, tile_spatial, geometry[2], tile_strides, geometry[4],
                          hole_stride, rows_window)
    t_d, t_h, t_w = lift3(tile_spatial, 1)
    blocks = n * t_d * math.ceil(t_h / tile.rows) * math.ceil(t_w / (tile.segs * DW_PIX))
    check_index_limit(fn, 'the tile count', blocks)
    launch = rt.kernel_launch(DEPTHWISE_SOURCE, depthwise_defines(dtype, channels_first), kernel_name,
                              (blocks, math.ceil(lanes / DW_CHANNELS)), (DW_CHANNELS, DW_ROWS), tile.shared_bytes)
    return launch, (np.int32(n), np.int32(c_in), np.int32(mult), *_depthwise_args(*geometry),
                    np.int32(tile.rows), np.int32(tile.segs), np.int32(tile.kh_chunk), np.int32(tile.rows_per_thread))


def _pair_runner(rt, problem):
    """``run(a, b)``: the output of a one-launch problem (shape, dtype, (launch, scalars)) on
    inputs a, b (made contiguous arrays of the runtime's, per call)."""
    out_shape, dtype, (launch, scalars) = problem
    xp = rt.xp
    array_type, empty, contiguous = xp.ndarray, xp.empty, xp.ascontiguousarray

    def run(a, b):
        a = contiguous(a if type(a) is array_type else xp.asarray(a))
        b = contiguous(b if type(b) is array_type else xp.asarray(b))
        out = empty(out_shape, dtype)
        launch((a, b, out) + scalars)
        return out
    return run


def _run_pair(rt, problem, a, b):
    """The output of a one-launch problem on inputs a, b (the locally connected launchers')."""
    return _pair_runner(rt, problem)(a, b)


def depthwise_conv_fwd(x, w, strides, dilation, pads, data_format, *, runtime=None):
    """Depthwise convolution; w is (*k, C_in, M), output channel c*M + m like TensorFlow."""
    return depthwise_conv_fwd_runner(x, w, strides, dilation, pads, data_format, runtime=runtime)(x, w)


def depthwise_conv_fwd_runner(x, w, strides, dilation, pads, data_format, *, runtime=None):
    """``run(x, w)``, depthwise_conv_fwd with this geometry for arrays of the types, shapes and
    dtypes of these: checked and set up once per problem signature (runtime/prepared.py); a
    depthwise ConvFwd plan step keeps it (prepared.Kept)."""
    fn = 'depthwise_conv_fwd'
    rt = resolve(runtime)

    def prepare():
        _, cx, cw = _checked_pair(fn, rt, ('x', x), ('w', w))
        (channels_first, rank, c_strides, c_dilation, c_pads, c_in, mult, in_spatial,
         out_spatial) = conv_checks.depthwise_fwd_setup(fn, cx, cw, strides, dilation, pads, data_format)
        kernel_spatial = cw.shape[:rank]
        c_out, n = c_in * mult, cx.shape[0]
        check_index_limit(fn, 'N * output pixels', n * math.prod(out_spatial))
        _check_sample_sizes(fn, (c_in, c_out), (math.prod(in_spatial), math.prod(out_spatial)), cw.size)
        y_shape = (n, c_out, *out_spatial) if channels_first else (n, *out_spatial, c_out)
        problem = y_shape, cx.dtype, _depthwise_tiled(
            rt, fn, 'depthwise_fwd', cx.dtype, n, c_in, mult,
            (in_spatial, out_spatial, kernel_spatial, c_strides, c_dilation, c_pads), channels_first, out_spatial,
            c_strides, lanes=c_out)
        return _pair_runner(rt, problem)

    return prepared.get(rt, fn, (x, w), (strides, dilation, pads, data_format), prepare)


def depthwise_conv_dgrad(dy, w, x_shape, strides, dilation, pads, data_format, *, runtime=None):
    """Gradient of depthwise_conv_fwd with respect to x."""
    return depthwise_conv_dgrad_runner(dy, w, x_shape, strides, dilation, pads, data_format, runtime=runtime)(dy, w)


def depthwise_conv_dgrad_runner(dy, w, x_shape, strides, dilation, pads, data_format, *, runtime=None):
    """``run(dy, w)``, depthwise_conv_dgrad with this x_shape and geometry for arrays of the types,
    shapes and dtypes of these: checked and set up once per problem signature
    (runtime/prepared.py); a depthwise ConvDgrad plan step keeps it (prepared.Kept)."""
    fn = 'depthwise_conv_dgrad'
    rt = resolve(runtime)

    def prepare():
        _, cdy, cw = _checked_pair(fn, rt, ('dy', dy), ('w', w))
        channels_first, rank, c_strides, c_dilation, c_pads = conv_checks.conv_setup(
            fn, 'dy', cdy, data_format, cw, 'w', strides, dilation, pads)
        c_x_shape = conv_checks.shape_tuple(fn, 'x_shape', x_shape, rank + 2)
        conv_checks.check_batch(fn, 'dy', cdy.shape, 'x_shape', c_x_shape)
        c_in = conv_checks.channel_count(c_x_shape, channels_first)
        conv_checks.check_channels(fn, 'the channel count', 'x_shape', c_x_shape, c_in, 'w', cw.shape, cw.shape[-2])
        in_spatial = conv_checks.spatial_dims(c_x_shape, channels_first)
        kernel_spatial, mult = cw.shape[:rank], cw.shape[-1]
        out_spatial = conv_checks.output_spatial(fn, in_spatial, kernel_spatial, c_strides, c_dilation, c_pads)
        conv_checks.check_dy_spatial(fn, cdy, channels_first, out_spatial, 'x_shape %s' % (c_x_shape,))
        conv_checks.check_channels(fn, 'the channel count', 'dy', cdy.shape,
                                   conv_checks.channel_count(cdy.shape, channels_first), 'w', cw.shape, c_in * mult)
        n = c_x_shape[0]
        check_index_limit(fn, 'N * input pixels', n * math.prod(in_spatial))
        _check_sample_sizes(fn, (c_in, c_in * mult), (math.prod(in_spatial), math.prod(out_spatial)), cw.size)
        return _pair_runner(rt, (c_x_shape, cdy.dtype, _depthwise_tiled(
            rt, fn, 'depthwise_dgrad', cdy.dtype, n, c_in, mult,
            (in_spatial, out_spatial, kernel_spatial, c_strides, c_dilation, c_pads), channels_first, in_spatial,
            (1,) * rank, lanes=c_in, hole_stride=c_strides[-1],
            rows_window=mult == 1 and all(s == 1 for s in c_strides))))

    return prepared.get(rt, fn, (dy, w), (x_shape, strides, dilation, pads, data_format), prepare)


def depthwise_wgrad_math(tile):
    """Which math conv_depthwise.cu's depthwise_wgrad runs on this launcher tile: 'quads'
    (wgrad_quad, on the strip tiles depthwise_wgrad_tile gives channels_last with 4-byte
    accumulators at stride 1: a thread sums 4 channels of one output row of DW_PIX pixels,
    tap groups of at most DW_WG_QTAPS) or 'rows' (one output row of DW_PIX pixels of one
    channel per thread, groups of at most DW_WG_TAPS). The kernel tells them apart the same way
    (tile rows x segments above DW_ROWS: wgrad_quads)."""
    return 'quads' if tile.rows * tile.segs > DW_ROWS else 'rows'


def depthwise_wgrad_splits(tiles, blocks_per_split):
    """Splits of depthwise wgrad's pixel tiles: enough blocks to fill the GPU, >= 4 tiles each."""
    wanted = math.ceil(DW_TARGET_BLOCKS / blocks_per_split)
    return int(max(1, min(wanted, tiles // DW_MIN_TILES_PER_SPLIT, DW_MAX_SPLITS)))


def depthwise_conv_wgrad(x, dy, w_shape, strides, dilation, pads, data_format, *, runtime=None):
    """Gradient of depthwise_conv_fwd with respect to w."""
    return depthwise_conv_wgrad_runner(x, dy, w_shape, strides, dilation, pads, data_format, runtime=runtime)(x, dy)


def depthwise_conv_wgrad_runner(x, dy, w_shape, strides, dilation, pads, data_format, *, runtime=None):
    """``run(x, dy)``, depthwise_conv_wgrad with this w_shape and geometry (and the split count
    conv/tiles.py may force) for arrays of the types, shapes and dtypes of these: checked and set
    up once per problem signature (runtime/prepared.py); a depthwise ConvWgrad plan step keeps it
    (prepared.Kept), and makes it again when the forced split count changes."""
    fn = 'depthwise_conv_wgrad'
    rt = resolve(runtime)
    forced_splits = conv_tiles.forced_splits()   # tests force it: part of the problem

    def prepare():
        _, cx, cdy = _checked_pair(fn, rt, ('x', x), ('dy', dy))
        channels_first = conv_checks.is_channels_first(fn, data_format)
        rank = conv_checks.spatial_rank(fn, 'x', cx)
        conv_checks.check_rank(fn, 'dy', cdy, rank + 2, 'like x')
        c_w_shape = conv_checks.shape_tuple(fn, 'w_shape', w_shape, rank + 2)
        c_strides, c_dilation, c_pads = conv_checks.window_params(fn, rank, strides, dilation, pads)
        conv_checks.check_batch(fn, 'x', cx.shape, 'dy', cdy.shape)
        c_in = conv_checks.channel_count(cx.shape, channels_first)
        conv_checks.check_channels(fn, 'the channel count', 'x', cx.shape, c_in, 'w_shape', c_w_shape, c_w_shape[-2])
        kernel_spatial, mult = c_w_shape[:rank], c_w_shape[-1]
        in_spatial = conv_checks.spatial_dims(cx.shape, channels_first)
        out_spatial = conv_checks.output_spatial(fn, in_spatial, kernel_spatial, c_strides, c_dilation, c_pads)
        conv_checks.check_dy_spatial(fn, cdy, channels_first, out_spatial, 'x shape %s' % (cx.shape,))
        conv_checks.check_channels(fn, 'the channel count', 'dy', cdy.shape,
                                   conv_checks.channel_count(cdy.shape, channels_first), 'w_shape', c_w_shape,
                                   c_in * mult)
        n, c_out, taps = cx.shape[0], c_in * mult, math.prod(kernel_spatial)
        check_index_limit(fn, 'N * output pixels', n * math.prod(out_spatial))
        _check_sample_sizes(fn, (c_in, c_out), (math.prod(in_spatial), math.prod(out_spatial)), taps * c_out)
        transposable = wgrad_transposable(cx.dtype, c_in, mult, math.prod(in_spatial), math.prod(out_spatial))
        out_d, out_h, out_w = lift3(out_spatial, 1)
        channel_tiles = math.ceil(c_out / DW_CHANNELS)
        defines = depthwise_defines(cx.dtype, channels_first)

        def wgrad_launch(quads_allowed):
            tile = depthwise_wgrad_tile(fn, cx.dtype, channels_first, out_spatial, kernel_spatial, c_strides,
                                        c_dilation, transposable, quads_allowed)
            tiles = n * out_d * math.ceil(out_h / tile.rows) * math.ceil(out_w / (tile.segs * DW_PIX))
            # the channel quads hold 4 sums per tap: groups of at most DW_WG_QTAPS taps
            quads = depthwise_wgrad_math(tile) == 'quads'
            group_taps = wgrad_group_taps(kernel_spatial, DW_WG_QTAPS if quads else DW_WG_TAPS)
            groups = math.ceil(taps / group_taps)
            if groups > MAX_GRID_YZ:
                raise ValueError('%s: %d filter taps is above the kernel limit of %d'
                                 % (fn, taps, MAX_GRID_YZ * group_taps))
            splits = forced_splits or depthwise_wgrad_splits(tiles, channel_tiles * groups)
            per_split = math.ceil(tiles / min(splits, tiles))
            splits = math.ceil(tiles / per_split)
            return quads, split_k.wgrad_launch(
                rt.kernel_launch(DEPTHWISE_SOURCE, defines, 'depthwise_wgrad', (channel_tiles, groups, splits),
                                 (DW_CHANNELS, DW_ROWS), tile.shared_bytes),
                (np.int32(n), np.int32(c_in), np.int32(mult),
                 *_depthwise_args(in_spatial, out_spatial, kernel_spatial, c_strides, c_dilation, c_pads),
                 np.int32(tile.rows), np.int32(tile.segs), np.int32(group_taps), np.int32(per_split)),
                splits, taps * c_out,
                lambda blocks: rt.kernel_launch(DEPTHWISE_SOURCE, defines, 'depthwise_reduce_splits', blocks,
                                                DW_THREADS),
                DW_THREADS)
        quads, launch = wgrad_launch(True)
        # channels_first quads need both sources 32-byte aligned (the kernel's transposing loader;
        # its quads have no element-loader variant there, which spilled on sm_80): other views
        # take the tile without quads, chosen per call
        unaligned_launch = wgrad_launch(False)[1] if quads and channels_first else None
        xp, c_dtype = rt.xp, cx.dtype

        def run(x, dy):
            if conv_tiles.forced_splits() != forced_splits:   # another split count: another problem
                return depthwise_conv_wgrad(x, dy, w_shape, strides, dilation, pads, data_format, runtime=rt)
            x, dy = _contiguous(rt, x, dy)
            chosen = launch if unaligned_launch is None or (_aligned32(x) and _aligned32(dy)) else unaligned_launch
            return split_k.run(xp, x, dy, xp.empty(c_w_shape, c_dtype), chosen)
        return run

    return prepared.get(rt, fn, (x, dy), (w_shape, strides, dilation, pads, data_format, forced_splits), prepare)


def _aligned32(array):
    """Whether the array's first element is 32-byte aligned (conv_depthwise.cu transposable_source)."""
    pointer = array.ctypes.data if isinstance(array, np.ndarray) else array.data.ptr
    return pointer % 32 == 0


# ---------------------------------------------------------------- locally connected

def _local_launch(rt, kernel_name, dtype, out_shape, work, sizes, n, c_in, c_out, in_spatial, output_spatial,
                  kernel_size, strides, channels_first):
    """(launch, scalar arguments) of local_fwd / local_dgrad / local_wgrad; ``sizes``: the
    element counts of the two inputs."""
    for name, size in zip(('x or dy', 'w or dy'), sizes):
        check_index_limit(kernel_name, 'the element count of %s' % name, size)
    check_index_limit(kernel_name, 'the element count of the result', math.prod(out_shape))
    blocks = max(1, min(math.ceil(work / LOCAL_THREADS), LOCAL_MAX_BLOCKS))
    return rt.kernel_launch(LOCAL_SOURCE, local_defines(dtype), kernel_name, blocks, LOCAL_THREADS), (
        np.int32(n), np.int32(c_in), np.int32(c_out),
        *_spatial_args(lift3(in_spatial, 1), lift3(output_spatial, 1), lift3(kernel_size, 1), lift3(strides, 1)),
        np.int32(not channels_first))


def _image_groups(batch):
    """Groups of LOCAL_IMAGES images (the last one partial) local_fwd and local_dgrad iterate over."""
    return math.ceil(batch / LOCAL_IMAGES)


def local_dgrad_lanes(c_out):
    """Lanes per dx element of local_dgrad (conv_local.cu, local_dgrad_lane_bits): C_out rounded
    up to a power of two, at most 32 (they split the sum over C_out)."""
    return min(32, 1 << max(0, int(c_out) - 1).bit_length())


def _local_window(fn, data_format, rank_name, rank_array, x_shape, kernel_size, strides, output_spatial):
    """(channels_first, rank, x_shape, in_spatial, kernel_size, strides, output_spatial): the
    window checks shared by the three local launchers, in the twins' order. The spatial rank
    comes from `rank_array`; x_shape None means rank_array's own shape."""
    channels_first = conv_checks.is_channels_first(fn, data_format)
    rank = conv_checks.spatial_rank(fn, rank_name, rank_array)
    x_shape = rank_array.shape if x_shape is None else conv_checks.shape_tuple(fn, 'x_shape', x_shape, rank + 2)
    in_spatial = conv_checks.spatial_dims(x_shape, channels_first)
    kernel_size, strides, output_spatial = conv_checks.local_setup(fn, rank, kernel_size, strides, output_spatial,
                                                             in_spatial)
    return channels_first, rank, x_shape, in_spatial, kernel_size, strides, output_spatial


def local_conv_fwd(x, w, kernel_size, strides, output_spatial, data_format, *, runtime=None):
    """Convolution with unshared weights w (P, prod(k) * C_in, C_out), P = prod(output_spatial)."""
    fn = 'local_conv_fwd'
    rt = resolve(runtime)

    def prepare():
        _, cx, cw = _checked_pair(fn, rt, ('x', x), ('w', w))
        channels_first, _, _, in_spatial, c_kernel, c_strides, c_output = _local_window(
            fn, data_format, 'x', cx, None, kernel_size, strides, output_spatial)
        c_in = conv_checks.channel_count(cx.shape, channels_first)
        conv_checks.check_local_kernel(fn, 'w', cw.shape, c_output, c_kernel, c_in)
        n, c_out = cx.shape[0], cw.shape[-1]
        y_shape = (n, c_out, *c_output) if channels_first else (n, *c_output, c_out)
        work = _image_groups(n) * math.prod(y_shape[1:])   # work items (image group, p, c_out)
        return y_shape, cx.dtype, _local_launch(rt, 'local_fwd', cx.dtype, y_shape, work,
                                                (cx.size, cw.size), n, c_in, c_out, in_spatial, c_output, c_kernel,
                                                c_strides, channels_first)

    problem = prepared.get(rt, fn, (x, w), (kernel_size, strides, output_spatial, data_format), prepare)
    return _run_pair(rt, problem, x, w)


def local_conv_dgrad(dy, w, x_shape, kernel_size, strides, output_spatial, data_format, *, runtime=None):
    """Gradient of local_conv_fwd with respect to x."""
    fn = 'local_conv_dgrad'
    rt = resolve(runtime)

    def prepare():
        _, cdy, cw = _checked_pair(fn, rt, ('dy', dy), ('w', w))
        channels_first, _, c_x_shape, in_spatial, c_kernel, c_strides, c_output = _local_window(
            fn, data_format, 'dy', cdy, x_shape, kernel_size, strides, output_spatial)
        c_in = conv_checks.check_local_dgrad_operands(fn, cdy, cw, c_x_shape, channels_first, c_output, c_kernel)
        # work items (image group, input pixel, c_in), local_dgrad_lanes(C_out) lanes each
        work = _image_groups(c_x_shape[0]) * math.prod(c_x_shape[1:]) * local_dgrad_lanes(cw.shape[-1])
        return c_x_shape, cdy.dtype, _local_launch(rt, 'local_dgrad', cdy.dtype, c_x_shape, work,
                                                   (cdy.size, cw.size), c_x_shape[0], c_in, cw.shape[-1], in_spatial,
                                                   c_output, c_kernel, c_strides, channels_first)

    problem = prepared.get(rt, fn, (dy, w), (x_shape, kernel_size, strides, output_spatial, data_format), prepare)
    return _run_pair(rt, problem, dy, w)


def local_conv_wgrad(x, dy, w_shape, kernel_size, strides, output_spatial, data_format, *, runtime=None):
    """Gradient of local_conv_fwd with respect to w."""
    fn = 'local_conv_wgrad'
    rt = resolve(runtime)

    def prepare():
        _, cx, cdy = _checked_pair(fn, rt, ('x', x), ('dy', dy))
        channels_first, rank, _, in_spatial, c_kernel, c_strides, c_output = _local_window(
            fn, data_format, 'x', cx, None, kernel_size, strides, output_spatial)
        conv_checks.check_rank(fn, 'dy', cdy, rank + 2, 'like x')
        c_w_shape = conv_checks.shape_tuple(fn, 'w_shape', w_shape, 3)
        conv_checks.check_batch(fn, 'x', cx.shape, 'dy', cdy.shape)
        c_in = conv_checks.channel_count(cx.shape, channels_first)
        conv_checks.check_local_kernel(fn, 'w_shape', c_w_shape, c_output, c_kernel, c_in)
        c_out = conv_checks.channel_count(cdy.shape, channels_first)
        conv_checks.check_channels(fn, 'the channel count', 'dy', cdy.shape, c_out, 'w_shape', c_w_shape,
                                   c_w_shape[-1])
        conv_checks.check_dy_spatial(fn, cdy, channels_first, c_output, 'output_spatial')
        return c_w_shape, cx.dtype, _local_launch(rt, 'local_wgrad', cx.dtype, c_w_shape, math.prod(c_w_shape),
                                                  (cx.size, cdy.size), cx.shape[0], c_in, c_out, in_spatial,
                                                  c_output, c_kernel, c_strides, channels_first)

    problem = prepared.get(rt, fn, (x, dy), (w_shape, kernel_size, strides, output_spatial, data_format), prepare)
    return _run_pair(rt, problem, x, dy)
