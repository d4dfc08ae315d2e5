"""Split-K wgrad, one way for both GEMMs (conv_igemm.cu's conv_igemm_wgrad and conv_wgmma.cu's
conv_wgmma_wgrad): K = batch * output pixels is split over grid z (tiles.py's split rule), each
split writes its float32 (float64 for float64 inputs) partial dw, and the reduce kernel
(conv_common.cuh's reduce_splits_body) adds the partials in split order into dw. With one split
the GEMM writes dw itself and no reduce runs."""
import math
from collections import namedtuple

import numpy as np

from . import tiles as conv_tiles

REDUCE_THREADS = 256      # REDUCE_THREADS of both .cu builds
REDUCE_MAX_BLOCKS = 4096  # the reduce is a grid-stride loop past this many blocks

# A prepared wgrad (kept per problem, runtime/prepared.py): the GEMM's launch and scalar
# arguments; with several splits the partials' shape, the reduce's launch and its scalars (with
# one split a (1,) placeholder partial and None).
WgradLaunch = namedtuple('WgradLaunch', 'run scalars partial_shape reduce reduce_scalars')


def plan(tile, rows, cols, depth):
    """(grid, K elements per split) of a rows x cols x depth wgrad GEMM on ``tile``: grid z is the
    split count; every split but the last has whole BK tiles."""
    per_split = conv_tiles.k_per_split(tile, depth, conv_tiles.wgrad_splits(tile, rows, cols, depth))
    return (math.ceil(rows / tile.bm), math.ceil(cols / tile.bn), math.ceil(depth / per_split)), per_split


def wgrad_launch(run, scalars, grid, rows, cols, reduce_launch):
    """The WgradLaunch of a GEMM launch ``run`` on ``grid`` (from plan) with its scalars;
    ``reduce_launch(blocks)`` makes the reduce's launch when there are several splits."""
    splits = grid[2]
    if splits == 1:
        return WgradLaunch(run, scalars, (1,), None, None)
    count = rows * cols
    blocks = max(1, min(math.ceil(count / REDUCE_THREADS), REDUCE_MAX_BLOCKS))
    return WgradLaunch(run, scalars, (splits, rows, cols), reduce_launch(blocks),
                       (np.int64(count), np.int32(splits)))


def run(xp, x, dy, w_shape, launch):
    """dw of the filter shape w_shape from x and dy (both as the kernel reads them) by ``launch``."""
    acc_dtype = np.float64 if x.dtype == np.float64 else np.float32
    dw = xp.empty(w_shape, x.dtype)
    partial = xp.empty(launch.partial_shape, acc_dtype)
    launch.run((xp.ascontiguousarray(x), xp.ascontiguousarray(dy), dw, partial, *launch.scalars))
    if launch.reduce is not None:
        launch.reduce((partial, dw.reshape(-1), *launch.reduce_scalars))
    return dw
