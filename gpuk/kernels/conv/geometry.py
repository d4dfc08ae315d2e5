"""The lifted convolution problem as the kernels see it (conv_common.cuh's ConvGeom, read by both
conv_igemm.cu and conv_wgmma.cu): the Geometry tuple, its kernel arguments (make_geom's) and the
GEMM shapes of fwd / dgrad / wgrad, shared by the implicit-GEMM launcher (conv/__init__.py) and
the wgmma one (conv/wgmma.py)."""
import math
from collections import namedtuple

import numpy as np

from gpuk.contracts.geometry import check_index_limit

# The lifted problem: per-dim tuples of 3 (d, h, w), sizes and the layout flag.
Geometry = namedtuple('Geometry', 'batch c_in c_out in_sp out_sp k_sp strides dilation pad_before channels_last')


def kernel_args(g):
    """The kernels' geometry scalars (make_geom's: batch, c_in, c_out, in, out, kernel, strides,
    dilation, pads); the kernels read channels_last only, so the layout flag is not among them."""
    return tuple(np.int32(v) for v in (g.batch, g.c_in, g.c_out, *g.in_sp, *g.out_sp, *g.k_sp, *g.strides,
                                       *g.dilation, *g.pad_before))


def check_gemm(fn, g, rows, cols, depth):
    """The kernels decode GEMM indices and pixel offsets within one image in 32 bits."""
    for what, value in (('the GEMM M', rows), ('the GEMM N', cols), ('the GEMM K', depth)):
        check_index_limit(fn, what, value)
    for what, value in (('the input pixels per image', math.prod(g.in_sp)),
                        ('the output pixels per image', math.prod(g.out_sp))):
        check_index_limit(fn, what, value, remedy='one image may hold at most that many pixels')


def fwd_gemm_shape(g):
    """(M, N, K) of the forward GEMM: output pixels, C_out, taps * C_in."""
    return g.batch * math.prod(g.out_sp), g.c_out, math.prod(g.k_sp) * g.c_in


def wgrad_gemm_shape(g):
    """(M, N, K) of the wgrad GEMM: dw's rows (tap, C_in), C_out, batch * output pixels."""
    return math.prod(g.k_sp) * g.c_in, g.c_out, g.batch * math.prod(g.out_sp)


def dgrad_phase_rows(g):
    """GEMM rows of dgrad's largest stride phase (phase 0: ceil(in / s) pixels per dim)."""
    return g.batch * math.prod(math.ceil(n / s) for n, s in zip(g.in_sp, g.strides))


# WgradPack (conv_igemm_loaders.cuh): bit positions of the packed d and h coordinates (w at bit 0)
WGRAD_PACK_D_SHIFT, WGRAD_PACK_H_SHIFT = 24, 13
_U32 = (1 << 32) - 1


def fast_div(divisor):
    """(multiplier, shift) of FastDiv (conv_igemm_index.cuh): n // divisor == (n * multiplier) >> shift
    for every n < 2**31 (shift = 31 + ceil(log2 divisor), multiplier = ceil(2**shift / divisor)
    < 2**32)."""
    shift = 31 + (divisor - 1).bit_length()
    return ((1 << shift) - 1) // divisor + 1, shift


def _linear_form(g, c_n, c_d, c_h):
    """The factors of rows, planes and n in PixLinear (conv_igemm_index.cuh) of a value
    n c_n + od c_d + oh c_h + ow s_w of a wgrad K position (mod 2**32)."""
    out_d, out_h, out_w = g.out_sp
    s_w = g.strides[2]
    return tuple(np.uint32(v & _U32) for v in (c_h - out_w * s_w, c_d - out_h * c_h, c_n - out_d * c_d))


def wgrad_decode_args(g):
    """conv_igemm_wgrad's decode parameters (its WgradDecode, after k_per_split): the FastDivs
    by out_w, out_h, out_d, then the window origin's pixel index in x and its packed coordinates
    (WgradPack) as linear forms of the K position's quotients."""
    in_d, in_h, in_w = g.in_sp
    s_d, s_h, _ = g.strides
    divs = []
    for size in reversed(g.out_sp):   # w, h, d
        multiplier, shift = fast_div(size)
        divs += [np.uint32(multiplier), np.int32(shift)]
    pixel = _linear_form(g, in_d * in_h * in_w, s_d * in_h * in_w, s_h * in_w)
    packed = _linear_form(g, 0, s_d << WGRAD_PACK_D_SHIFT, s_h << WGRAD_PACK_H_SHIFT)
    return tuple(divs) + pixel + packed
