"""Launcher of layout.cu: the tiled transpose between channels_first (N, C, *spatial) and
channels_last (N, *spatial, C) arrays.

The implicit-GEMM convolutions (conv/__init__.py) run channels_first problems through their
channels_last kernels between two of these transposes: a channels_first load of the GEMM's
K dimension (channels) strides across a whole plane per element and cannot coalesce, while
the transpose reads and writes whole 128-byte lines (16-byte accesses where the row lengths
allow). Not a K function: the arguments come from the launchers, which checked them; the
checks here guard direct callers.
"""
import math
from pathlib import Path

import numpy as np

from gpuk.contracts.geometry import check_index_limit
from .runtime import prepared, register_build, resolve

SOURCE = Path(__file__).with_name('layout.cu')
# Tile constants: #defines of layout.cu and the grid below (one place).
LAYOUT_THREADS = 64     # the vector path: one 16-byte-square block of the tile per thread (8 x 8)
WORD_TYPES = {2: 'unsigned short', 4: 'unsigned', 8: 'unsigned long long'}   # element size -> C type
WORD_DTYPES = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def tile_size(itemsize):
    """Tile side in elements: a tile row is one 128-byte line (8 chunks of 16 bytes)."""
    return 128 // itemsize


def pad_elements(itemsize):
    """Padding of a scalar-path tile row: one 4-byte word (two 2-byte elements; one 8-byte)."""
    return 2 if itemsize == 2 else 1


def thin_stride(itemsize, short_len, pairs=False):
    """Elements between long-side indices of a thin-path tile (layout.cu transpose_planes_thin):
    at least `short_len`, an odd number of 4-byte words (2-byte elements) or of elements (4, 8
    bytes, and 2-byte elements moved in pairs), so that 32 lanes running along the long side
    hit distinct banks."""
    if itemsize == 2 and not pairs:
        return 2 * ((short_len + 1) // 2 | 1)
    return short_len | 1


def thin_tile_len(itemsize, short_len, pairs=False):
    """Long-side length of a thin-path tile: as much as the scalar tile's shared memory holds,
    in whole groups of 32 (sector-aligned lanes) when there is room for one."""
    tile = tile_size(itemsize)
    fit = tile * (tile + pad_elements(itemsize)) // thin_stride(itemsize, short_len, pairs)
    return fit // 32 * 32 if fit >= 32 else fit


def thin_pairs(itemsize, short_len, long_len):
    """Whether transpose_planes_thin moves 2-byte elements of the long side in 4-byte pairs:
    every long-side row and tile then starts on an even element (the kernel checks the base)."""
    return itemsize == 2 and long_len % 2 == 0 and thin_tile_len(itemsize, short_len, True) % 2 == 0


def defines(itemsize):
    return {'ELEMENT_T': WORD_TYPES[itemsize], 'LAYOUT_TILE': tile_size(itemsize), 'LAYOUT_THREADS': LAYOUT_THREADS,
            'LAYOUT_PAD': pad_elements(itemsize)}


for _itemsize in WORD_TYPES:
    register_build(SOURCE, defines(_itemsize), ['transpose_planes', 'transpose_planes_thin'])


def transpose_planes(a, planes, rows, cols, rt):
    """(planes, cols, rows) array: each (rows, cols) plane of `a` transposed. A plane of one row
    or one column is its own transpose in memory: then `a` itself, reshaped (a view when `a`
    is C-contiguous), and no launch."""
    xp = rt.xp
    if rows == 1 or cols == 1:
        return xp.ascontiguousarray(a).reshape(planes, cols, rows)
    out = xp.empty((planes, cols, rows), a.dtype)
    if out.size == 0:
        return out
    word = WORD_DTYPES[a.dtype.itemsize]
    launch, scalars = prepared.get(rt, 'transpose_planes', (), (planes, rows, cols, a.dtype.itemsize),
                                   lambda: _transpose_launch(rt, planes, rows, cols, a.dtype.itemsize))
    launch((xp.ascontiguousarray(a).reshape(-1).view(word), out.reshape(-1).view(word)) + scalars)
    return out


def _transpose_launch(rt, planes, rows, cols, itemsize):
    """(kernel launch, scalar arguments) of one transpose problem: its checks, path, tiles and
    grid, prepared once per (planes, rows, cols, element size) (runtime/prepared.py)."""
    for what, value in (('the plane rows', rows), ('the plane columns', cols)):
        check_index_limit('transpose_planes', what, value)
    tile, vec = tile_size(itemsize), 16 // itemsize
    scalars = (np.int32(rows), np.int32(cols))
    if min(rows, cols) < tile and (rows % vec or cols % vec):
        # a short side the vector path cannot take (C = 3 images): wide tiles of the whole short side
        few_rows = rows <= cols
        short_len, long_len = (rows, cols) if few_rows else (cols, rows)
        pairs = thin_pairs(itemsize, short_len, long_len)
        tile_len = thin_tile_len(itemsize, short_len, pairs)
        tiles = math.ceil(long_len / tile_len)
        name, blocks = 'transpose_planes_thin', planes * tiles
        scalars += (np.int32(tiles), np.int32(tile_len), np.int32(thin_stride(itemsize, short_len, pairs)),
                    np.int32(few_rows), np.int32(pairs))
    else:
        row_tiles, col_tiles = math.ceil(rows / tile), math.ceil(cols / tile)
        name, blocks = 'transpose_planes', planes * row_tiles * col_tiles
        scalars += (np.int32(row_tiles), np.int32(col_tiles))
    check_index_limit('transpose_planes', 'the tile count', blocks)
    return rt.kernel_launch(SOURCE, defines(itemsize), name, blocks, LAYOUT_THREADS), scalars


def _check(fn, x, xp):
    if not isinstance(x, xp.ndarray):
        raise TypeError('%s: x must be a %s.ndarray, got %s' % (fn, xp.__name__, type(x).__name__))
    if x.ndim < 3:
        raise ValueError('%s: x must have 3 to 5 dimensions (batch, channels and 1 to 3 spatial), got shape %s'
                         % (fn, tuple(x.shape)))
    if x.dtype.itemsize not in WORD_TYPES:
        raise TypeError('%s: x.dtype must have 2, 4 or 8 bytes per element, got %s' % (fn, x.dtype))


def to_channels_last(x, *, runtime=None):
    """(N, C, *spatial) -> (N, *spatial, C), C-contiguous (x itself, reshaped, when C == 1 or
    there is one spatial position: then nothing moves)."""
    rt = resolve(runtime)
    _check('to_channels_last', x, rt.xp)
    n, c, spatial = x.shape[0], x.shape[1], x.shape[2:]
    out = transpose_planes(x, n, c, math.prod(spatial), rt)
    return out.reshape(n, *spatial, c)


def to_channels_first(x, *, runtime=None):
    """(N, *spatial, C) -> (N, C, *spatial), C-contiguous (x itself, reshaped, when C == 1 or
    there is one spatial position)."""
    rt = resolve(runtime)
    _check('to_channels_first', x, rt.xp)
    n, c, spatial = x.shape[0], x.shape[-1], x.shape[1:-1]
    out = transpose_planes(x, n, math.prod(spatial), c, rt)
    return out.reshape(n, c, *spatial)
