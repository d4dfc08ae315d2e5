"""Matrix products: the MatMul op (batch dims broadcast, like np.matmul) and Keras's dot
and batch_dot built from it with reshapes and transposes.

float16 and bfloat16 products accumulate in float32 (``impl.matmul``: cuBLAS on tensor cores
on a GPU, its NumPy twin elsewhere); float32 products run at full float32 precision (NumPy's
BLAS; CuPy uses cuBLAS without TF32 unless CUPY_TF32=1 is set by the user).
"""
import ml_dtypes
import numpy as np

from gpuk.graph import Meta, Tensor, apply, as_tensor
from gpuk.kernels.runtime import prepared
from gpuk.ops import elementwise as ew
from gpuk.ops import shape as shape_ops
from gpuk.ops.base import Op, broadcast_shapes

_HALF_DTYPES = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def _swap_last(t):
    perm = list(range(t.ndim))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return shape_ops.transpose(t, perm)


class MatMul(Op):
    """``a @ b`` for rank >= 2 operands; leading (batch) dims broadcast. Where the matmul family
    says FLOAT_PRODUCTS_IN_STEP_BUFFERS (the kernel runtimes), a plan step writes its
    float32/float64 products into reused buffers (shared by shape and dtype) (prepared.Kept's
    variant for the kept layouts, prepared.StepBuffers); the NumPy device keeps NumPy's own."""

    def __init__(self):
        self.kept = prepared.Kept()

    def infer(self, a, b):
        if len(a.shape) < 2 or len(b.shape) < 2:
            raise ValueError('matmul: operands need rank >= 2, got shapes %s and %s' % (a.shape, b.shape))
        inner_a, inner_b = a.shape[-1], b.shape[-2]
        if inner_a is not None and inner_b is not None and inner_a != inner_b:
            raise ValueError('matmul: inner dimensions differ: shapes %s and %s (%d != %d)'
                             % (a.shape, b.shape, inner_a, inner_b))
        batch = broadcast_shapes(a.shape[:-2], b.shape[:-2], 'matmul')
        return Meta(batch + (a.shape[-2], b.shape[-1]), a.dtype)

    def forward(self, impl, a, b):
        if a.dtype in _HALF_DTYPES:     # bfloat16 comes from a mixed-precision policy
            return impl.matmul.matmul(a, b)
        if impl.matmul.FLOAT_PRODUCTS_IN_STEP_BUFFERS:
            return self.kept.run(impl, (a, b), _product_runner)
        return impl.xp.matmul(a, b)

    def grad(self, inputs, outputs, output_grads):
        a, b = inputs
        if np.dtype(a.dtype).kind != 'f':
            return [None, None]
        g = output_grads[0]
        return [ew.sum_to_shape_of(matmul(g, _swap_last(b)), a),
                ew.sum_to_shape_of(matmul(_swap_last(a), g), b)]


def _product_runner(impl, a, b):
    """``run(a, b)``: xp.matmul, with a ``specialized`` variant writing into the step's reused
    output buffers (the product's shape and dtype read once from these operands)."""
    matmul = impl.xp.matmul

    def run(a, b):
        return matmul(a, b)

    def specialized(arrays):
        a, b = arrays   # its own names: the runner must hold no array of the call that made it
        if a.ndim < 2 or b.ndim < 2 or a.dtype != b.dtype or a.shape[-1] != b.shape[-2]:
            return run   # xp.matmul raises, or promotes, as it does without a buffer
        shape = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2])) + (a.shape[-2], b.shape[-1])
        take = prepared.StepBuffers(impl.xp.empty, shape, [a.dtype]).take

        def run_into(a, b):
            return matmul(a, b, out=take(0))
        return run_into
    run.specialized = specialized
    return run


def _operands(where, x, y):
    """Both as tensors of one dtype: a non-tensor operand takes the tensor's dtype; two
    tensors of different dtypes are a TypeError (as in TensorFlow)."""
    if isinstance(x, Tensor) and not isinstance(y, Tensor):
        y = as_tensor(y, x.dtype)
    elif isinstance(y, Tensor) and not isinstance(x, Tensor):
        x = as_tensor(x, y.dtype)
    x, y = as_tensor(x), as_tensor(y)
    if x.dtype != y.dtype:
        raise TypeError('%s: x and y must have the same dtype, got %s and %s' % (where, x.dtype, y.dtype))
    if x.dtype == 'bool':
        raise TypeError('%s: bool tensors cannot be multiplied; cast them first' % where)
    if x.ndim is None or y.ndim is None:
        raise ValueError('%s: operands of unknown rank are not supported' % where)
    return x, y


def matmul(a, b):
    """np.matmul semantics: rank-1 operands are promoted to matrices and the added axis removed."""
    a, b = _operands('matmul', a, b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError('matmul: operands need rank >= 1, got shapes %s and %s' % (a.shape, b.shape))
    squeeze = []
    if a.ndim == 1:
        a = shape_ops.expand_dims(a, 0)
        squeeze.append(-2)
    if b.ndim == 1:
        b = shape_ops.expand_dims(b, 1)
        squeeze.append(-1)
    out = apply(MatMul(), a, b)
    for axis in squeeze:
        out = shape_ops.squeeze(out, axis)
    return out


def _dims(t):
    """The shape of ``t`` with unknown entries as symbolic scalars (for reshape specs)."""
    symbolic = None
    dims = []
    for i, d in enumerate(t.shape):
        if d is None:
            symbolic = shape_ops.shape(t) if symbolic is None else symbolic
            d = symbolic[i]
        dims.append(d)
    return dims


def dot(x, y):
    """Keras/Theano ``dot``: contracts the last axis of x with the second-to-last of y
    (the last if y is a vector), like np.dot; nD operands go through one 2-D matmul."""
    x, y = _operands('dot', x, y)
    if x.ndim == 0 or y.ndim == 0:
        raise ValueError('dot: x and y need rank >= 1, got shapes %s and %s' % (x.shape, y.shape))
    if y.ndim == 1:
        return shape_ops.squeeze(dot(x, shape_ops.expand_dims(y, 1)), -1)
    inner_x, inner_y = x.shape[-1], y.shape[-2]
    if inner_x is not None and inner_y is not None and inner_x != inner_y:
        raise ValueError('dot: the last axis of x and the second-to-last of y differ: shapes %s and %s'
                         % (x.shape, y.shape))
    if x.ndim == 2 and y.ndim == 2:
        return apply(MatMul(), x, y)
    x_dims, y_dims = _dims(x), _dims(y)
    # y's contracted axis goes first, the rest are flattened into columns.
    y_perm = [y.ndim - 2] + [i for i in range(y.ndim) if i != y.ndim - 2]
    x_2d = shape_ops.reshape(x, (-1, x_dims[-1]))
    y_2d = shape_ops.reshape(shape_ops.transpose(y, y_perm), (y_dims[-2], -1))
    return shape_ops.reshape(apply(MatMul(), x_2d, y_2d), x_dims[:-1] + y_dims[:-2] + y_dims[-1:])


def _batch_dot_axes(axes, x_ndim, y_ndim, x_shape, y_shape):
    if axes is None:
        axes = [x_ndim - 1, y_ndim - 1 if y_ndim == 2 else y_ndim - 2]
    elif isinstance(axes, (int, np.integer)) and not isinstance(axes, bool):
        axes = [axes, axes]
    elif not (isinstance(axes, (list, tuple)) and len(axes) == 2):
        raise ValueError('batch_dot: axes must be None, an int or a pair of ints, got %r' % (axes,))
    if any(isinstance(a, (list, tuple)) for a in axes):
        raise ValueError('batch_dot: multiple target dimensions are not supported; expected None, '
                         'int or (int, int), got %r' % (axes,))
    if any(isinstance(a, bool) or not isinstance(a, (int, np.integer)) for a in axes):
        raise TypeError('batch_dot: axes must be ints, got %r' % (axes,))
    a0, a1 = int(axes[0]), int(axes[1])
    a0 += x_ndim if a0 < 0 else 0
    a1 += y_ndim if a1 < 0 else 0
    if not (0 <= a0 < x_ndim and 0 <= a1 < y_ndim):
        raise ValueError('batch_dot: axes %r out of range for shapes %s and %s' % (axes, x_shape, y_shape))
    if a0 == 0 or a1 == 0:
        raise ValueError('batch_dot: cannot reduce over the batch axis 0 (axes %r); add a batch axis '
                         'with K.expand_dims(x, 0) if the inputs are not batched' % (axes,))
    return a0, a1


def batch_dot(x, y, axes=None):
    """Keras 2.3.1's batch_dot: per sample, contract x's axis ``axes[0]`` with y's ``axes[1]``.

    The result has x's axes (less the contracted one) followed by y's (less batch and the
    contracted one); when both inputs are 2-D, or one is 2-D, the added unit axis is
    removed as Keras does (so 2-D with 2-D gives shape (batch, 1)).
    """
    x, y = _operands('batch_dot', x, y)
    x_shape, y_shape = x.shape, y.shape
    if x.ndim < 2 or y.ndim < 2:
        raise ValueError('batch_dot: inputs need rank >= 2, got shapes %s and %s' % (x_shape, y_shape))
    if x_shape[0] is not None and y_shape[0] is not None and x_shape[0] != y_shape[0]:
        raise ValueError('batch_dot: inputs have different batch sizes: shapes %s and %s' % (x_shape, y_shape))
    a0, a1 = _batch_dot_axes(axes, x.ndim, y.ndim, x_shape, y_shape)
    d0, d1 = x_shape[a0], y_shape[a1]
    if d0 is not None and d1 is not None and d0 != d1:
        raise ValueError('batch_dot: cannot contract shapes %s and %s with axes=%r: x.shape[%d] != y.shape[%d] '
                         '(%d != %d)' % (x_shape, y_shape, [a0, a1], a0, a1, d0, d1))
    if x.ndim == 2:
        x, a0 = shape_ops.expand_dims(x, 1), a0 + 1
    if y.ndim == 2:
        y = shape_ops.expand_dims(y, 2)
    # x: contracted axis last; y: contracted axis at position 1 (others keep their order).
    x = shape_ops.transpose(x, [i for i in range(x.ndim) if i != a0] + [a0])
    y_rest = [i for i in range(1, y.ndim) if i != a1]
    y = shape_ops.transpose(y, [0, a1] + y_rest)
    x_dims, y_dims = _dims(x), _dims(y)
    x_3d = x if x.ndim == 3 else shape_ops.reshape(x, (x_dims[0], -1, x_dims[-1]))
    y_3d = y if y.ndim == 3 else shape_ops.reshape(y, (y_dims[0], y_dims[1], -1))
    out = apply(MatMul(), x_3d, y_3d)
    if x.ndim > 3 or y.ndim > 3:
        out = shape_ops.reshape(out, x_dims[:-1] + y_dims[2:])
    if len(x_shape) == 2:
        out = shape_ops.squeeze(out, 1)
    elif len(y_shape) == 2:
        out = shape_ops.squeeze(out, -1)
    return out
