"""NumPy twin of gpuk/kernels/elementwise.py: the CPU path and the kernels' oracle."""
import operator

import numpy as np

from gpuk.contracts.fused_program import check_fused_args

ACTIVATIONS = ('linear', 'relu')
FLOAT_DTYPES = (np.float16, np.float32, np.float64)
_WIDE_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))   # computed in their own dtype
# NumPy's ufuncs read a strided operand in place (gpuk/kernels/elementwise.py says True).
COPIES_STRIDED_OPERANDS = False
# A Scan's backward step reads its forward step's sigmoids and tanhs stacked: each is several
# ufunc calls here (a sigmoid four), a stacked value one copy per step (measured: ~8% of Keras's
# LSTM training step). gpuk/kernels/elementwise.py says True (ops/scan.py).
RECOMPUTES_STEP_ACTIVATIONS = False


def copy(x):
    """A new C-contiguous array equal to `x`."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"copy: x must be a numpy.ndarray, got {type(x).__name__}")
    return np.array(x, copy=True, order='C')


def check_bias_act_args(x, bias, axis, activation, array_type, fn='bias_act_fwd'):
    """Shared argument checks of bias_act_fwd; returns the axis made non-negative."""
    if not isinstance(x, array_type) or not isinstance(bias, array_type):
        raise TypeError(f"{fn}: x and bias must be {array_type.__module__}.ndarray, "
                        f"got {type(x).__name__} and {type(bias).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{fn}: x.dtype must be float16, float32 or float64, got {x.dtype}")
    if bias.dtype != x.dtype:
        raise TypeError(f"{fn}: bias.dtype must equal x.dtype ({x.dtype}), got {bias.dtype}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"{fn}: activation must be one of {ACTIVATIONS}, got {activation!r}")
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -x.ndim <= axis < x.ndim:
        raise ValueError(f"{fn}: axis must be an int in [{-x.ndim}, {x.ndim}) for x of shape {x.shape}, got {axis!r}")
    axis = int(axis) % x.ndim
    if bias.shape != (x.shape[axis],):
        raise ValueError(f"{fn}: bias must have shape ({x.shape[axis]},) to broadcast along axis {axis} "
                         f"of x with shape {x.shape}, got {bias.shape}")
    return axis


def bias_act_fwd(x, bias, axis=-1, activation='linear'):
    """act(x + bias) with the 1-D `bias` broadcast along `axis` of `x`.

    # Arguments
        x: float16/32/64 array. bias: 1-D, same dtype, length x.shape[axis].
        axis: the axis of x that bias runs along. activation: 'linear' or 'relu'.
    # Returns
        An array like x (float16 is computed in float32 and rounded once).
    """
    if (activation == 'linear' and type(x) is np.ndarray and type(bias) is np.ndarray
            and x.dtype in _WIDE_FLOATS and bias.dtype == x.dtype and axis in (-1, x.ndim - 1)
            and bias.shape == x.shape[-1:]):
        # the common case (a dense layer's or an RNN cell's bias), checked without the
        # messages: the plain broadcast add below, per time step in a recurrent layer
        return x + bias
    axis = check_bias_act_args(x, bias, axis, activation, np.ndarray)
    acc = np.float32 if x.dtype == np.float16 else x.dtype.type
    shape = [1] * x.ndim
    shape[axis] = -1
    y = x.astype(acc, copy=False) + bias.astype(acc, copy=False).reshape(shape)   # no copies for float32/64
    if activation == 'relu':
        y = np.where(y < 0, acc(0), y)   # keeps NaN, as the kernel does
    return y.astype(x.dtype, copy=False)


def bias_act_fwd_runner(x, bias, axis=-1, activation='linear'):
    """``run(x, bias)``, ``bias_act_fwd(x, bias, axis, activation)`` for arrays of the shapes and
    dtypes of these (what a BiasAct plan step keeps between calls): the plain broadcast add
    where bias_act_fwd takes it, else bias_act_fwd itself."""
    if (activation == 'linear' and type(x) is np.ndarray and type(bias) is np.ndarray
            and x.dtype in _WIDE_FLOATS and bias.dtype == x.dtype and axis in (-1, x.ndim - 1)
            and bias.shape == x.shape[-1:]):
        return operator.add
    return lambda x, bias: bias_act_fwd(x, bias, axis, activation)


def fused(program, inputs):
    """The outputs (a list) of a fused elementwise ``program`` (gpuk.contracts.fused_program):
    its ops run one by one with their own NumPy forwards, so results equal the unfused plan's."""
    run = fused_runner(program, inputs)   # (checks the program first)
    return program.output_list(run(*inputs))


def fused_runner(program, inputs):
    """``run(*inputs)``, ``fused(program, inputs)`` as a plan step returns it (the one output,
    or a tuple: FusedProgram.step_result) for inputs of the dtypes of these ``inputs`` (checked
    now): what a fused plan step keeps between calls."""
    check_fused_args(program, inputs)
    run_unfused, step_result = program.run_unfused, program.step_result

    def run(*inputs):
        return step_result(run_unfused(inputs))
    return run
