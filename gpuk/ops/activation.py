"""Activations with TensorFlow's semantics: relu (leaky, capped, thresholded), elu,
hard_sigmoid, l2_normalize and in_top_k."""
import numpy as np

from gpuk.graph import Meta, apply, as_tensor
from gpuk.ops import elementwise as ew
from gpuk.ops.base import Op, XpOp, normalize_axes


def _is_float(dtype):
    return np.dtype(dtype).kind == 'f'


# --- relu ----------------------------------------------------------------------------------

class Relu(Op):
    """Keras 2.3.1's relu in one pass.

    alpha only (leaky): ``x if x > 0 else alpha * x``. Otherwise, with
    ``p = x if x > threshold else 0`` (``max(x, 0)`` when threshold is 0), ``p`` clipped to
    [0, max_value] when max_value is given, minus ``alpha * max(threshold - x, 0)``.
    """

    def __init__(self, alpha, max_value, threshold):
        self.alpha, self.max_value, self.threshold = alpha, max_value, threshold

    @property
    def leaky_only(self):
        return self.alpha != 0 and self.max_value is None and self.threshold == 0

    def infer(self, x):
        return Meta(x.shape, x.dtype)

    def forward(self, impl, x):
        xp = impl.xp
        if self.leaky_only:
            return xp.where(x > 0, x, x * self.alpha).astype(x.dtype, copy=False)
        out = xp.where(x > self.threshold, x, 0) if self.threshold != 0 else xp.maximum(x, 0)
        if self.max_value is not None:
            out = xp.minimum(xp.maximum(out, 0), self.max_value)
        if self.alpha != 0:
            out = out - self.alpha * xp.maximum(self.threshold - x, 0)
        return out.astype(x.dtype, copy=False)

    def slope(self, xp, x):
        """The derivative TensorFlow's gradient uses (its convention at the kinks)."""
        if self.leaky_only:
            return 1.0 + (self.alpha - 1.0) * (x <= 0)
        if self.threshold != 0:
            passes = x > self.threshold
            before_clip = xp.where(passes, x, 0)
        elif self.max_value == 6:  # TF's relu6: gradient 0 at both ends
            passes = (x > 0) & (x < 6)
            before_clip = None
        else:
            passes = x > 0
            before_clip = xp.maximum(x, 0)
        if self.max_value is not None and before_clip is not None:
            passes = passes & (before_clip >= 0) & (before_clip <= self.max_value)
        out = passes.astype(np.float64)
        if self.alpha != 0:
            out = out + self.alpha * (x < self.threshold)
        return out

    @property
    def plain(self):
        """max(x, 0): Keras's default relu."""
        return self.alpha == 0 and self.max_value is None and self.threshold == 0

    def c_expression(self):
        """The plain relu's element expression for fused kernels (NaN kept), else None."""
        return '({0} < 0 ? ({T})0 : {0})' if self.plain else None

    def grad(self, inputs, outputs, output_grads):
        if not _is_float(inputs[0].dtype):
            return [None]
        # The plain relu's slope reads the output: relu(x) > 0 iff x > 0 (NaN included), and
        # then x need not be kept for the backward pass (and conv/bias_add can fuse into it).
        source = outputs[0] if self.plain else inputs[0]
        return [apply(ReluGrad(self), output_grads[0], source)]


class ReluGrad(XpOp):
    """``g * relu'(x)``: linear in g, piecewise constant in x (so no gradient to x)."""

    def __init__(self, relu):
        self.relu = relu

    def infer(self, g, x):
        return Meta(g.shape, g.dtype)

    def compute(self, xp, g, x, out=None):
        if self.relu.plain:   # relu'(x) = (x > 0): a bool mask times g, no float64 slope array
            return g * (x > 0) if out is None else xp.multiply(g, x > 0, out=out)
        return g * self.relu.slope(xp, x).astype(g.dtype, copy=False)

    def c_expression(self):
        """g * (x > 0) for the plain relu (a non-finite g at a masked entry gives NaN, as here)."""
        return '{0} * ({T})({1} > 0)' if self.relu.plain else None

    def grad(self, inputs, outputs, output_grads):
        return [apply(ReluGrad(self.relu), output_grads[0], inputs[1]), None]


def relu(x, alpha=0., max_value=None, threshold=0.):
    return apply(Relu(alpha, max_value, threshold), as_tensor(x))


# --- elu, hard_sigmoid -----------------------------------------------------------------------

class Elu(Op):
    """``x if x > 0 else alpha * (exp(x) - 1)``."""

    def __init__(self, alpha):
        self.alpha = alpha

    def infer(self, x):
        if not _is_float(x.dtype):
            raise TypeError('elu: x must be a float tensor, got dtype %s' % x.dtype)
        return Meta(x.shape, x.dtype)

    def forward(self, impl, x):
        xp = impl.xp
        # expm1 of min(x, 0): the positive branch is discarded, so do not let it overflow.
        negative = self.alpha * xp.expm1(xp.minimum(x, 0))
        return xp.where(x > 0, x, negative).astype(x.dtype, copy=False)

    def grad(self, inputs, outputs, output_grads):
        x, g = inputs[0], output_grads[0]
        below = g * self.alpha * ew.unary('exp', ew.binary('minimum', x, 0))
        return [ew.where(x > 0, g, below)]


def elu(x, alpha=1.):
    return apply(Elu(alpha), as_tensor(x))


class HardSigmoid(Op):
    """``clip(0.2 * x + 0.5, 0, 1)``."""

    def infer(self, x):
        if not _is_float(x.dtype):
            raise TypeError('hard_sigmoid: x must be a float tensor, got dtype %s' % x.dtype)
        return Meta(x.shape, x.dtype)

    def forward(self, impl, x):
        return impl.xp.clip(x * 0.2 + 0.5, 0, 1).astype(x.dtype, copy=False)

    def grad(self, inputs, outputs, output_grads):
        x, g = inputs[0], output_grads[0]
        linear = x * 0.2 + 0.5
        inside = ew.binary('logical_and', linear >= 0, linear <= 1)  # TF's clip gradient: ends included
        return [g * ew.cast(inside, g.dtype) * 0.2]


def hard_sigmoid(x):
    return apply(HardSigmoid(), as_tensor(x))


# --- l2_normalize ---------------------------------------------------------------------------

def l2_normalize(x, axis=None):
    """``x / sqrt(max(sum(x ** 2, axis), 1e-12))`` like tf.nn.l2_normalize; float16 is
    computed in float32 (1e-12 is 0 in float16)."""
    from gpuk.ops.reduction import reduce
    x = as_tensor(x)
    if not _is_float(x.dtype):
        raise TypeError('l2_normalize: x must be a float tensor, got dtype %s' % x.dtype)
    axes = normalize_axes(axis, x.ndim, 'l2_normalize')
    source = ew.cast(x, 'float32') if x.dtype == 'float16' else x
    square_sum = reduce('sum', ew.unary('square', source), axes, keepdims=True)
    inverse_norm = 1 / ew.unary('sqrt', ew.binary('maximum', square_sum, 1e-12))
    return ew.cast(source * inverse_norm, x.dtype)


# --- in_top_k ------------------------------------------------------------------------------

class InTopK(Op):
    """TensorFlow's in_top_k: target t of row b counts when fewer than k predictions of
    the row are strictly greater than predictions[b, t] (so ties at the k-th value count).
    A target out of range, or a row holding a non-finite prediction, gives False."""
    differentiable = False

    def infer(self, predictions, targets, k):
        if len(predictions.shape) != 2:
            raise ValueError('in_top_k: predictions must be 2-D (batch, classes), got shape %s'
                             % (predictions.shape,))
        if len(targets.shape) != 1:
            raise ValueError('in_top_k: targets must be 1-D (batch,), got shape %s' % (targets.shape,))
        if len(k.shape) != 0:
            raise ValueError('in_top_k: k must be a scalar, got shape %s' % (k.shape,))
        rows, n = predictions.shape[0], targets.shape[0]
        if rows is not None and n is not None and rows != n:
            raise ValueError('in_top_k: predictions of shape %s and targets of shape %s differ in batch size'
                             % (predictions.shape, targets.shape))
        return Meta((rows if rows is not None else n,), 'bool')

    def forward(self, impl, predictions, targets, k):
        xp = impl.xp
        batch, classes = predictions.shape
        if targets.shape[0] != batch:
            raise ValueError('in_top_k: predictions of shape %s and targets of shape %s differ in batch size'
                             % (predictions.shape, targets.shape))
        in_range = (targets >= 0) & (targets < classes)
        safe_targets = xp.where(in_range, targets, 0).astype(np.int64)
        target_values = predictions[xp.arange(batch), safe_targets]
        greater = xp.sum(predictions > target_values[:, None], axis=1)
        finite_rows = xp.all(xp.isfinite(predictions), axis=1)
        return in_range & finite_rows & (greater < k)


def in_top_k(predictions, targets, k):
    return apply(InTopK(), as_tensor(predictions), as_tensor(targets), as_tensor(k))
