"""Helpers shared by the fused-op families (batch norm, softmax cross-entropy, CTC): dtype
policy, shape checks, and the gradients of fused backward nodes from their formula."""
import numpy as np

from gpuk.contracts.dtypes import accumulation_dtype
from gpuk.autodiff import vector_jacobian_products
from gpuk.graph import Constant, Placeholder, clone
from gpuk.ops import elementwise as ew


def accumulate_dtype(dtype):
    """The accumulation dtype (gpuk.contracts.dtypes) by name, as graph metas carry dtypes."""
    return accumulation_dtype(dtype).name


def require_float(where, name, meta):
    if np.dtype(meta.dtype).kind != 'f':
        raise TypeError('%s: %s must be a float tensor, got dtype %s' % (where, name, meta.dtype))


def same_shape(where, name_a, a, name_b, b):
    """Static shape of two tensors that must match; ValueError when known dims differ."""
    if a.shape is None or b.shape is None:
        return a.shape if b.shape is None else b.shape
    if len(a.shape) != len(b.shape) or any(
            x is not None and y is not None and x != y for x, y in zip(a.shape, b.shape)):
        raise ValueError('%s: %s and %s must have the same shape, got %s and %s'
                         % (where, name_a, name_b, a.shape, b.shape))
    return tuple(x if x is not None else y for x, y in zip(a.shape, b.shape))


def is_zero(tensor):
    """Whether ``tensor`` is a known all-zero fill (autodiff's stand-in for unused outputs)."""
    if isinstance(tensor, Constant):
        return not np.any(tensor.value)
    node = tensor.node
    return node is not None and isinstance(node.op, ew.FillLike) and node.op.value == 0


def composite_partial_grads(formula, inputs, output_grads, wrt):
    """Gradients of a fused node from ``formula`` (the same math in primitive ops).

    The formula is built on fresh placeholders so the result is the partial derivative
    for each input even when the inputs depend on each other; the placeholders are then
    replaced by the node's real inputs. Returns one tensor (or None) per input.
    """
    stand_ins = [Placeholder(t.shape, t.dtype, name='partial') for t in inputs]
    outputs = formula(*stand_ins)
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    seeded = [(out, ew.cast(g, out.dtype)) for out, g in zip(outputs, output_grads)
              if out is not None and not is_zero(g)]
    result = [None] * len(inputs)
    if not seeded:
        return result
    wanted = [i for i in wrt if np.dtype(inputs[i].dtype).kind == 'f']
    partials = vector_jacobian_products([out for out, _ in seeded], [g for _, g in seeded],
                                        [stand_ins[i] for i in wanted])
    present = [(i, g) for i, g in zip(wanted, partials) if g is not None]
    rebuilt = clone([ew.cast(g, inputs[i].dtype) for i, g in present], dict(zip(stand_ins, inputs)))
    for (i, _), g in zip(present, rebuilt):
        result[i] = g
    return result
