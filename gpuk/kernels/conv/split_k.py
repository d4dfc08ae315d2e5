"""Split-K wgrad, one way for every convolution wgrad (conv_igemm.cu's conv_igemm_wgrad,
conv_wgmma.cu's conv_wgmma_wgrad, conv_depthwise.cu's depthwise_wgrad): the reduction over
batch * output pixels is split over grid z (the GEMMs: tiles.py's split rule, ``plan``), each
split writes its partial dw in the accumulation dtype, and the reduce kernel (conv_common.cuh's
reduce_splits_body) adds the partials in split order into dw. With one split the main kernel
writes dw itself and no reduce runs."""
import math
from collections import namedtuple

import numpy as np

from gpuk.contracts.dtypes import accumulation_dtype
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


def grid_stride_blocks(count, threads=REDUCE_THREADS):
    """Blocks of ``threads`` for a grid-stride pass over ``count`` elements (the reduce, and
    conv_round_tf32 over a tf32 filter): one element a thread, at most REDUCE_MAX_BLOCKS."""
    return max(1, min(math.ceil(count / threads), REDUCE_MAX_BLOCKS))


def wgrad_launch(run, scalars, splits, count, reduce_launch, threads=REDUCE_THREADS):
    """The WgradLaunch of the main kernel's launch ``run`` with its scalars, over ``splits``
    splits of a dw of ``count`` elements; ``reduce_launch(blocks)`` makes the reduce's launch
    (``threads`` per block) when there are several splits."""
    if splits == 1:
        return WgradLaunch(run, scalars, (1,), None, None)
    return WgradLaunch(run, scalars, (splits, count), reduce_launch(grid_stride_blocks(count, threads)),
                       (np.int64(count), np.int32(splits)))


def run(xp, x, dy, dw, launch):
    """``dw`` (the output: w's shape, contiguous) written from x and dy (both as the kernel reads
    them) by ``launch``; returns it."""
    partial = xp.empty(launch.partial_shape, accumulation_dtype(dw.dtype))   # (the launch's own size: per call)
    launch.run((xp.ascontiguousarray(x), xp.ascontiguousarray(dy), dw, partial, *launch.scalars))
    if launch.reduce is not None:
        launch.reduce((partial, dw.reshape(-1), *launch.reduce_scalars))
    return dw
