"""Launchers for elementwise.cu: copy (bandwidth calibration) and fused bias + activation.

Same names and signatures as gpuk/cpu_fallback/elementwise.py, plus a keyword-only
`runtime` (None: runtime.current(); 'cuda', 'emulate', or a runtime object).
"""
from pathlib import Path

import numpy as np

from gpuk.contracts.dtypes import ELEMENT_TYPES
from gpuk.cpu_fallback.elementwise import check_bias_act_args
from .runtime import prepared, register_build, resolve

SOURCE = Path(__file__).with_name('elementwise.cu')
# Tile constants: passed to the .cu as #defines and used for the grid below (one place).
COPY_THREADS = 256
COPY_MAX_BLOCKS = 4096
BIAS_ACT_THREADS = 256
BIAS_ACT_MAX_BLOCKS = 8192
ACTIVATION_CODES = {'linear': 0, 'relu': 1}
# The launchers take C-contiguous operands only, so a strided one is copied on every call (the
# fused kernels' too, fused_elementwise._contiguous, except a dense block of memory such as a
# transpose, which a plan step reads in place; a time step's slice of a sequence has gaps); a
# Scan copies a sequence with strided per-step slices once per loop instead (ops/scan.py). The
# twin says False.
COPIES_STRIDED_OPERANDS = True
# A Scan's backward step recomputes its forward step's sigmoids and tanhs: they fuse into the
# backward cell's generated kernel at no cost, where keeping them stacked would add outputs to
# the forward cell's kernel (at most 4) and split it (ops/scan.py). The twin says False.
RECOMPUTES_STEP_ACTIVATIONS = True


def defines(dtype):
    return {'ELEMENT_T': ELEMENT_TYPES[np.dtype(dtype)], 'COPY_THREADS': COPY_THREADS,
            'BIAS_ACT_THREADS': BIAS_ACT_THREADS}


# copy_bytes is dtype-agnostic and is taken from the float32 module.
register_build(SOURCE, defines(np.float32), ['copy_bytes', 'bias_act_fwd'])
register_build(SOURCE, defines(np.float16), ['bias_act_fwd'])
register_build(SOURCE, defines(np.float64), ['bias_act_fwd'])


def _blocks(work_items, threads, max_blocks):
    return max(1, min(-(-work_items // threads), max_blocks))


def copy(x, *, runtime=None):
    """A new C-contiguous array equal to `x` (a non-contiguous x is made contiguous first)."""
    rt = resolve(runtime)
    if not isinstance(x, rt.xp.ndarray):
        raise TypeError(f"copy: x must be a {rt.xp.__name__}.ndarray, got {type(x).__name__}")
    x = rt.xp.ascontiguousarray(x)
    y = rt.xp.empty_like(x)
    if x.nbytes:
        src, dst = x.reshape(-1).view(np.uint8), y.reshape(-1).view(np.uint8)
        kernel = rt.load(SOURCE, defines(np.float32)).kernel('copy_bytes')
        blocks = _blocks(-(-x.nbytes // 16), COPY_THREADS, COPY_MAX_BLOCKS)
        kernel.launch(blocks, COPY_THREADS, (src, dst, np.int64(x.nbytes)))
    return y


def bias_act_fwd(x, bias, axis=-1, activation='linear', *, runtime=None):
    """act(x + bias) with the 1-D `bias` broadcast along `axis` of `x` ('linear' or 'relu')."""
    return bias_act_fwd_runner(x, bias, axis, activation, runtime=runtime)(x, bias)


def bias_act_fwd_runner(x, bias, axis=-1, activation='linear', *, runtime=None):
    """``run(x, bias)``, ``bias_act_fwd(x, bias, axis, activation)`` for arrays of the shapes and
    dtypes of these: checked and set up once per problem signature (runtime/prepared.py); a
    BiasAct plan step keeps it for its next calls (prepared.Kept)."""
    rt = resolve(runtime)
    return prepared.get(rt, 'bias_act_fwd', (x, bias), (axis, activation),
                        lambda: _prepare_bias_act(rt, x, bias, axis, activation))


def _prepare_bias_act(rt, x, bias, axis, activation):
    checked_axis = check_bias_act_args(x, bias, axis, activation, rt.xp.ndarray)
    contiguous, empty_like = rt.xp.ascontiguousarray, rt.xp.empty_like
    if not x.size:
        return lambda x, bias: empty_like(contiguous(x))
    inner = int(np.prod(x.shape[checked_axis + 1:], dtype=np.int64))
    blocks = _blocks(x.size, BIAS_ACT_THREADS, BIAS_ACT_MAX_BLOCKS)
    launch = rt.kernel_launch(SOURCE, defines(x.dtype), 'bias_act_fwd', blocks, BIAS_ACT_THREADS)
    scalars = (np.int64(x.size), np.int64(x.shape[checked_axis]), np.int64(inner),
               np.int32(ACTIVATION_CODES[activation]))

    def run(x, bias):
        x = contiguous(x)
        y = empty_like(x)
        launch((x, contiguous(bias), y) + scalars)
        return y

    def specialized(arrays):
        """The run of one plan step (prepared.Kept, which compared the strides) for contiguous
        operands: no conversion calls, the output in a reused buffer (prepared.StepBuffers:
        shared with the plan's other steps of its shape and dtype)."""
        if not all(type(a) is array_type and a.flags.c_contiguous for a in arrays):
            return run
        # (read from ``arrays``, not the prepared x: the cached runner must not hold x)
        take = prepared.StepBuffers(rt.xp.empty, arrays[0].shape, [arrays[0].dtype]).take

        def run_contiguous(x, bias):
            y = take(0)
            launch((x, bias, y) + scalars)
            return y
        return run_contiguous

    array_type = rt.xp.ndarray
    run.specialized = specialized
    return run


from .fused_elementwise import fused, fused_runner  # noqa: E402,F401 - the family's fused chains (generated kernels)
