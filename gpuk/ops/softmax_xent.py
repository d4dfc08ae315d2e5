"""Softmax, log-softmax and the cross-entropy losses as graph ops.

Forward and backward passes run on the kernel family ``impl.softmax_xent`` (CUDA kernels
on a GPU, the NumPy twins otherwise). By-products the backward pass needs (the row
log-sum-exp) are extra outputs of the forward node. Backward nodes are differentiable
too: their gradients come from the same formula written with primitive ops
(``composite_partial_grads``), so second derivatives work.
"""
import numpy as np

from gpuk.autodiff import gradients
from gpuk.device import to_host
from gpuk.graph import Meta, apply, as_tensor
from gpuk.kernels.runtime import prepared
from gpuk.ops import elementwise as ew
from gpuk.ops.base import Op, normalize_axis
from gpuk.ops.fused import accumulate_dtype, composite_partial_grads, is_zero, require_float, same_shape
from gpuk.ops.reduction import reduce


def without_axis(shape, axis):
    return None if shape is None else shape[:axis] + shape[axis + 1:]


def keep_axis(stat, axis):
    """A per-row statistic (shape without ``axis``) put back on ``axis`` with size 1."""
    from gpuk.ops.shape import expand_dims
    return expand_dims(stat, axis)


class OneHotLike(Op):
    """One-hot of integer ``labels`` along ``axis``, with ``like``'s size and dtype."""
    differentiable = False

    def __init__(self, axis):
        self.axis = axis

    def infer(self, labels, like):
        return Meta(like.shape, like.dtype)

    def forward(self, impl, labels, like):
        xp = impl.xp
        shape = [1] * like.ndim
        shape[self.axis] = like.shape[self.axis]
        classes = xp.arange(like.shape[self.axis]).reshape(shape)
        return (xp.expand_dims(labels, self.axis) == classes).astype(like.dtype)


# --- softmax and log-softmax ----------------------------------------------------------------

class _RowOp(Op):
    """An op along one axis whose output has the input's meta."""

    def __init__(self, axis):
        self.axis = axis

    def infer(self, x, *rest):
        require_float(type(self).__name__, 'x', x)
        return Meta(x.shape, x.dtype)


class Softmax(_RowOp):
    def forward(self, impl, x):
        return impl.softmax_xent.softmax_fwd(x, self.axis)

    def grad(self, inputs, outputs, output_grads):
        return [apply(SoftmaxGrad(self.axis), outputs[0], output_grads[0])]


class SoftmaxGrad(_RowOp):
    """dx = y * (dy - sum(dy * y)) from the saved softmax output y."""

    def forward(self, impl, y, dy):
        return impl.softmax_xent.softmax_bwd(y, dy, self.axis)

    def grad(self, inputs, outputs, output_grads):
        def formula(y, dy):
            return y * (dy - reduce('sum', dy * y, self.axis, keepdims=True))
        return composite_partial_grads(formula, inputs, output_grads, (0, 1))


class LogSoftmax(_RowOp):
    def forward(self, impl, x):
        return impl.softmax_xent.log_softmax_fwd(x, self.axis)

    def grad(self, inputs, outputs, output_grads):
        return [apply(LogSoftmaxGrad(self.axis), outputs[0], output_grads[0])]


class LogSoftmaxGrad(_RowOp):
    """dx = dy - exp(log_y) * sum(dy)."""

    def forward(self, impl, log_y, dy):
        return impl.softmax_xent.log_softmax_bwd(log_y, dy, self.axis)

    def grad(self, inputs, outputs, output_grads):
        def formula(log_y, dy):
            return dy - ew.unary('exp', log_y) * reduce('sum', dy, self.axis, keepdims=True)
        return composite_partial_grads(formula, inputs, output_grads, (0, 1))


def softmax(x, axis=-1):
    x = as_tensor(x)
    return apply(Softmax(normalize_axis(axis, x.ndim, 'softmax')), x)


def log_softmax(x, axis=-1):
    x = as_tensor(x)
    return apply(LogSoftmax(normalize_axis(axis, x.ndim, 'log_softmax')), x)


def softmax_logits(tensor, axis):
    """The logits ``tensor`` is the softmax of along ``axis`` (non-negative), else None.

    Recognizes the Softmax op and Keras's ``exp(x - max(x)) / sum(...)`` spelling, which
    keras.activations.softmax uses for rank > 2.
    """
    node = tensor.node
    if node is None:
        return None
    if isinstance(node.op, Softmax):
        return node.inputs[0] if node.op.axis == axis else None
    if not (isinstance(node.op, ew.Binary) and node.op.name == 'divide'):
        return None
    e, s = node.inputs
    if not (_is_op(s, 'Reduce', kind='sum') and s.node.op.axes == (axis,) and s.node.op.keepdims
            and s.node.inputs[0] is e and _is_op(e, 'Unary', name='exp')):
        return None
    shifted = e.node.inputs[0]
    if not _is_op(shifted, 'Binary', name='subtract'):
        return None
    x, m = shifted.node.inputs
    if _is_op(m, 'Reduce', kind='max', keepdims=True) and m.node.inputs[0] is x and m.node.op.axes == (axis,):
        return x
    return None


def _is_op(tensor, cls_name, **attrs):
    node = tensor.node
    return node is not None and type(node.op).__name__ == cls_name and all(
        getattr(node.op, k, None) == v for k, v in attrs.items())


def sigmoid_logits(tensor):
    """The input of ``tensor`` when it is a sigmoid node, else None."""
    return tensor.node.inputs[0] if _is_op(tensor, 'Unary', name='sigmoid') else None


# --- cross-entropy from logits ---------------------------------------------------------------

class SoftmaxXent(Op):
    """(loss, lse) of softmax cross-entropy along ``axis`` for a dense target."""

    def __init__(self, axis, where='categorical_crossentropy'):
        self.axis, self.where = axis, where
        self.kept = prepared.Kept()

    def infer(self, logits, target):
        require_float(self.where, 'output', logits)
        require_float(self.where, 'target', target)
        shape = same_shape(self.where, 'target', target, 'output', logits)
        reduced = without_axis(shape, self.axis)
        return Meta(reduced, logits.dtype), Meta(reduced, accumulate_dtype(logits.dtype))

    def forward(self, impl, logits, target):
        # the step keeps the runner of its last problem (checked and set up once: prepared.Kept)
        return self.kept.run(impl, (logits, target), self._runner)

    def _runner(self, impl, logits, target):
        return impl.softmax_xent.softmax_xent_fwd_runner(logits, target, self.axis)

    def grad(self, inputs, outputs, output_grads):
        logits, target = inputs
        lse = outputs[1]
        g_loss, g_lse = output_grads
        d_logits = apply(SoftmaxXentGrad(self.axis), logits, target, lse, g_loss)
        d_target = apply(SoftmaxXentDTarget(self.axis), logits, lse, g_loss)
        if not is_zero(g_lse):
            d_logits = d_logits + ew.cast(softmax(logits, self.axis) * keep_axis(g_lse, self.axis),
                                          logits.dtype)
        return [d_logits, d_target]


def _probs_from_lse(logits, lse, axis):
    return ew.unary('exp', ew.cast(logits, lse.dtype) - keep_axis(lse, axis))


class SoftmaxXentGrad(Op):
    """dlogits = (softmax(logits) * sum(target) - target) * dloss."""

    def __init__(self, axis):
        self.axis = axis
        self.kept = prepared.Kept()

    def infer(self, logits, target, lse, dloss):
        return Meta(logits.shape, logits.dtype)

    def forward(self, impl, logits, target, lse, dloss):   # the step keeps its runner, as SoftmaxXent's
        return self.kept.run(impl, (logits, target, lse, dloss), self._runner)

    def _runner(self, impl, logits, target, lse, dloss):
        return impl.softmax_xent.softmax_xent_bwd_runner(logits, target, lse, dloss, self.axis)

    def grad(self, inputs, outputs, output_grads):
        def formula(logits, target, lse, dloss):
            t = ew.cast(target, lse.dtype)
            total = reduce('sum', t, self.axis, keepdims=True)
            return (_probs_from_lse(logits, lse, self.axis) * total - t) * keep_axis(dloss, self.axis)
        return composite_partial_grads(formula, inputs, output_grads, (0, 1, 2, 3))


class SoftmaxXentDTarget(Op):
    """dtarget = (lse - logits) * dloss."""

    def __init__(self, axis):
        self.axis = axis

    def infer(self, logits, lse, dloss):
        return Meta(logits.shape, logits.dtype)

    def forward(self, impl, logits, lse, dloss):
        return impl.softmax_xent.softmax_xent_dtarget(logits, lse, dloss, self.axis)

    def grad(self, inputs, outputs, output_grads):
        def formula(logits, lse, dloss):
            return (keep_axis(lse, self.axis) - ew.cast(logits, lse.dtype)) * keep_axis(dloss, self.axis)
        return composite_partial_grads(formula, inputs, output_grads, (0, 1, 2))


def checked_labels(xp, labels, classes, where, name='target'):
    """Integer class labels as int64, after checking they are whole numbers in [0, classes)."""
    if labels.dtype.kind == 'f':
        finite = bool(xp.all(xp.isfinite(labels)))
        if not finite or bool(xp.any(labels != xp.round(labels))):
            raise ValueError('%s: %s must hold integer class indices, got non-integer values'
                             % (where, name))
    elif labels.dtype.kind not in 'iub':
        raise ValueError('%s: %s must be an int or float tensor of class indices, got dtype %s'
                         % (where, name, labels.dtype))
    labels = labels.astype(np.int64)
    if labels.size:
        low, high = int(xp.min(labels)), int(xp.max(labels))
        if low < 0 or high >= classes:
            raise ValueError('%s: %s must lie in [0, %d) (the number of classes), got values in [%d, %d]'
                             % (where, name, classes, low, high))
    return labels


def labels_checked_later(impl, labels, classes, where, name='target'):
    """``checked_labels`` without a host sync: the dtype now, the values by a device-side flag
    that ``impl.check_later`` reads with the others before the call's results are used
    (an out-of-range label never indexes: the kernels guard it)."""
    xp = impl.xp
    if labels.dtype.kind not in 'iubf':
        checked_labels(np, labels[:0], classes, where, name)   # raises the dtype error
    bad = (labels < 0) | (labels >= classes)
    if labels.dtype.kind == 'f':
        bad |= ~xp.isfinite(labels) | (labels != xp.round(labels))
    impl.check_later(xp.any(bad), lambda: checked_labels(np, to_host(labels), classes, where, name))
    return xp.where(bad, -1, labels).astype(np.int64) if labels.dtype.kind == 'f' else labels.astype(np.int64)


class SparseSoftmaxXent(Op):
    """(loss, lse) of softmax cross-entropy along ``axis`` for integer (or whole float) labels."""

    def __init__(self, axis, where='sparse_categorical_crossentropy'):
        self.axis, self.where = axis, where

    def infer(self, logits, labels):
        require_float(self.where, 'output', logits)
        reduced = without_axis(logits.shape, self.axis)
        if reduced is not None and labels.shape is not None:
            same_shape(self.where, 'target', labels, 'output without axis %d' % self.axis,
                       Meta(reduced, labels.dtype))
        return Meta(reduced, logits.dtype), Meta(reduced, accumulate_dtype(logits.dtype))

    def forward(self, impl, logits, labels):
        if labels.shape != logits.shape[:self.axis] + logits.shape[self.axis + 1:]:
            raise ValueError('%s: target must have shape %s (output shape %s without axis %d), got %s'
                             % (self.where, logits.shape[:self.axis] + logits.shape[self.axis + 1:],
                                logits.shape, self.axis, labels.shape))
        labels = labels_checked_later(impl, labels, logits.shape[self.axis], self.where)
        return impl.softmax_xent.sparse_softmax_xent_fwd(logits, labels, self.axis)

    def grad(self, inputs, outputs, output_grads):
        logits, labels = inputs
        g_loss, g_lse = output_grads
        d_logits = apply(SparseSoftmaxXentGrad(self.axis), logits, labels, outputs[1], g_loss)
        if not is_zero(g_lse):
            d_logits = d_logits + ew.cast(softmax(logits, self.axis) * keep_axis(g_lse, self.axis),
                                          logits.dtype)
        return [d_logits, None]


class SparseSoftmaxXentGrad(Op):
    """dlogits = (softmax(logits) - one_hot(labels)) * dloss."""

    def __init__(self, axis):
        self.axis = axis

    def infer(self, logits, labels, lse, dloss):
        return Meta(logits.shape, logits.dtype)

    def forward(self, impl, logits, labels, lse, dloss):
        labels = labels.astype(np.int64)  # checked by the forward node
        return impl.softmax_xent.sparse_softmax_xent_bwd(logits, labels, lse, dloss, self.axis)

    def grad(self, inputs, outputs, output_grads):
        def formula(logits, labels, lse, dloss):
            one_hot = apply(OneHotLike(self.axis), labels, ew.cast(logits, lse.dtype))
            return (_probs_from_lse(logits, lse, self.axis) - one_hot) * keep_axis(dloss, self.axis)
        return composite_partial_grads(formula, inputs, output_grads, (0, 2, 3))


class _ElementwiseXent(Op):
    """Binary cross-entropies: elementwise in (first input, target)."""
    first_name = 'output'

    def __init__(self, where='binary_crossentropy', epsilon=None):
        self.where, self.epsilon = where, epsilon

    def infer(self, first, target, *rest):
        require_float(self.where, self.first_name, first)
        require_float(self.where, 'target', target)
        return Meta(same_shape(self.where, 'target', target, self.first_name, first), first.dtype)

    def check(self, first, target):
        if first.shape != target.shape:
            raise ValueError('%s: target and %s must have the same shape, got %s and %s'
                             % (self.where, self.first_name, target.shape, first.shape))


class BinaryXentLogits(_ElementwiseXent):
    def forward(self, impl, logits, target):
        self.check(logits, target)
        return impl.softmax_xent.binary_xent_logits_fwd(logits, target)

    def grad(self, inputs, outputs, output_grads):
        logits, target = inputs
        g = output_grads[0]
        return [apply(BinaryXentLogitsGrad(), logits, target, g),
                apply(BinaryXentLogitsDTarget(), logits, g)]


class BinaryXentLogitsGrad(_ElementwiseXent):
    def forward(self, impl, logits, target, dloss):
        return impl.softmax_xent.binary_xent_logits_bwd(logits, target, dloss)

    def grad(self, inputs, outputs, output_grads):
        def formula(x, z, d):
            return (ew.unary('sigmoid', x) - z) * d
        return composite_partial_grads(formula, inputs, output_grads, (0, 1, 2))


class BinaryXentLogitsDTarget(Op):
    def infer(self, logits, dloss):
        return Meta(logits.shape, logits.dtype)

    def forward(self, impl, logits, dloss):
        return impl.softmax_xent.binary_xent_logits_dtarget(logits, dloss)

    def grad(self, inputs, outputs, output_grads):
        return composite_partial_grads(lambda x, d: -x * d, inputs, output_grads, (0, 1))


# --- cross-entropy from probabilities (Keras's clipping) ----------------------------------------

def _clipped(p, epsilon):
    return ew.clip(p, epsilon, 1 - epsilon)


def _categorical_probs_formula(axis, epsilon):
    def formula(probs, target):
        p = ew.cast(probs, accumulate_dtype(probs.dtype))
        normalized = p / reduce('sum', p, axis, keepdims=True)
        loss = -reduce('sum', ew.cast(target, p.dtype) * ew.unary('log', _clipped(normalized, epsilon)), axis)
        return ew.cast(loss, probs.dtype)
    return formula


class CategoricalXentProbs(Op):
    """Keras categorical_crossentropy of probabilities: normalize, clip, -sum(t log p)."""

    def __init__(self, axis, epsilon, where='categorical_crossentropy'):
        self.axis, self.epsilon, self.where = axis, epsilon, where

    def infer(self, probs, target):
        require_float(self.where, 'output', probs)
        require_float(self.where, 'target', target)
        shape = same_shape(self.where, 'target', target, 'output', probs)
        return Meta(without_axis(shape, self.axis), probs.dtype)

    def forward(self, impl, probs, target):
        return impl.softmax_xent.categorical_xent_probs_fwd(probs, target, self.axis, self.epsilon)

    def grad(self, inputs, outputs, output_grads):
        probs, target = inputs
        g = output_grads[0]
        return [apply(CategoricalXentProbsGrad(self.axis, self.epsilon), probs, target, g),
                apply(CategoricalXentProbsDTarget(self.axis, self.epsilon), probs, g)]


class CategoricalXentProbsGrad(Op):
    def __init__(self, axis, epsilon):
        self.axis, self.epsilon = axis, epsilon

    def infer(self, probs, target, dloss):
        return Meta(probs.shape, probs.dtype)

    def forward(self, impl, probs, target, dloss):
        return impl.softmax_xent.categorical_xent_probs_bwd(probs, target, dloss, self.axis, self.epsilon)

    def grad(self, inputs, outputs, output_grads):
        forward = _categorical_probs_formula(self.axis, self.epsilon)

        def formula(probs, target, dloss):
            loss = forward(probs, target)
            return gradients(reduce('sum', loss * dloss), [probs])[0]
        return composite_partial_grads(formula, inputs, output_grads, (0, 1, 2))


class CategoricalXentProbsDTarget(Op):
    def __init__(self, axis, epsilon):
        self.axis, self.epsilon = axis, epsilon

    def infer(self, probs, dloss):
        return Meta(probs.shape, probs.dtype)

    def forward(self, impl, probs, dloss):
        return impl.softmax_xent.categorical_xent_probs_dtarget(probs, dloss, self.axis, self.epsilon)

    def grad(self, inputs, outputs, output_grads):
        def formula(probs, dloss):
            p = ew.cast(probs, accumulate_dtype(probs.dtype))
            normalized = p / reduce('sum', p, self.axis, keepdims=True)
            return -ew.unary('log', _clipped(normalized, self.epsilon)) * keep_axis(dloss, self.axis)
        return composite_partial_grads(formula, inputs, output_grads, (0, 1))


class BinaryXentProbs(_ElementwiseXent):
    """Keras binary_crossentropy of probabilities: q = clip(p); -(z log q + (1 - z) log(1 - q))."""

    def forward(self, impl, probs, target):
        self.check(probs, target)
        return impl.softmax_xent.binary_xent_probs_fwd(probs, target, self.epsilon)

    def grad(self, inputs, outputs, output_grads):
        probs, target = inputs
        g = output_grads[0]
        return [apply(BinaryXentProbsGrad(epsilon=self.epsilon), probs, target, g),
                apply(BinaryXentProbsDTarget(self.epsilon), probs, g)]


class BinaryXentProbsGrad(_ElementwiseXent):
    def forward(self, impl, probs, target, dloss):
        return impl.softmax_xent.binary_xent_probs_bwd(probs, target, dloss, self.epsilon)

    def grad(self, inputs, outputs, output_grads):
        eps = self.epsilon

        def formula(p, z, d):
            q = _clipped(p, eps)
            inside = ew.cast(ew.binary('logical_and', p >= eps, p <= 1 - eps), p.dtype)
            return (-z / q + (1 - z) / (1 - q)) * d * inside
        return composite_partial_grads(formula, inputs, output_grads, (0, 1, 2))


class BinaryXentProbsDTarget(Op):
    def __init__(self, epsilon):
        self.epsilon = epsilon

    def infer(self, probs, dloss):
        return Meta(probs.shape, probs.dtype)

    def forward(self, impl, probs, dloss):
        return impl.softmax_xent.binary_xent_probs_dtarget(probs, dloss, self.epsilon)

    def grad(self, inputs, outputs, output_grads):
        def formula(p, d):
            q = _clipped(p, self.epsilon)
            return (ew.unary('log1p', -q) - ew.unary('log', q)) * d
        return composite_partial_grads(formula, inputs, output_grads, (0, 1))


__all__ = ['Softmax', 'LogSoftmax', 'SoftmaxXent', 'SparseSoftmaxXent', 'BinaryXentLogits',
           'BinaryXentProbs', 'CategoricalXentProbs', 'softmax', 'log_softmax', 'softmax_logits',
           'sigmoid_logits', 'composite_partial_grads', 'is_zero']
