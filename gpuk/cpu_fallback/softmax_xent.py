"""NumPy twins of the softmax / cross-entropy kernels (gpuk/kernels/softmax_xent.py).

Every function works along any `axis` (default -1). float16 and bfloat16
(ml_dtypes.bfloat16) inputs are computed in float32 and returned in their own
dtype; the log-sum-exp saved for the backward pass stays float32 for them (a
float16 lse would cost ~1% of relative error in the recomputed softmax, a
bfloat16 one ~8x more).

Cross-entropy from logits is -sum(target * log_softmax(logits)) =
sum(target) * lse - sum(target * logits): Keras targets need not sum to 1,
and this is exact for any target. 0 * (-inf) counts as 0, so -inf logits of
classes with a zero target keep the loss finite.

The probability-input losses follow Keras 2.3.1 (numpy, theano and cntk
backends, and TF 1.x's tf.keras): categorical normalizes by the sum along
axis, clips to [epsilon, 1 - epsilon] and takes -sum(target * log p); binary
clips and takes -(z log p + (1 - z) log(1 - p)). TF 2.x's tf.keras adds a
further epsilon inside both logs of the binary loss; we do not. Gradients
through the clip pass where epsilon <= p <= 1 - epsilon, like TF's
clip_by_value gradient.
"""
import numpy as np

from gpuk.contracts.dtypes import accumulation_dtype
from gpuk.contracts import softmax_xent_checks as checks

__all__ = [
    'softmax_fwd', 'softmax_bwd', 'log_softmax_fwd', 'log_softmax_bwd',
    'softmax_xent_fwd', 'softmax_xent_bwd', 'softmax_xent_dtarget',
    'softmax_xent_fwd_runner', 'softmax_xent_bwd_runner',
    'sparse_softmax_xent_fwd', 'sparse_softmax_xent_bwd',
    'categorical_xent_probs_fwd', 'categorical_xent_probs_bwd',
    'categorical_xent_probs_dtarget',
    'binary_xent_logits_fwd', 'binary_xent_logits_bwd', 'binary_xent_logits_dtarget',
    'binary_xent_probs_fwd', 'binary_xent_probs_bwd', 'binary_xent_probs_dtarget',
]


# ---------------------------------------------------------------- helpers

def _times_nonzero(weight, value):
    """weight * value with 0 * (+-inf) = 0 (the limit of t log p as t -> 0)."""
    with np.errstate(invalid='ignore'):
        return np.where(weight == 0, 0, weight * value)


def _shifted_max(x, axis):
    """Row max for the exp shift; non-finite maxima shift by 0 so an all -inf
    row gives exp() = 0 instead of -inf - -inf = NaN."""
    m = np.max(x, axis=axis, keepdims=True)
    return np.where(np.isfinite(m), m, 0)


def log_sum_exp(x, axis):
    """Stable log(sum(exp(x))) along axis, keepdims=True, in x's dtype."""
    m = _shifted_max(x, axis)
    shifted = np.subtract(x, m)
    np.exp(shifted, out=shifted)    # in place: one x-sized temporary, not two
    with np.errstate(divide='ignore'):
        return np.log(np.sum(shifted, axis=axis, keepdims=True)) + m


def _weighted_row_sum(weight, value, axis):
    """sum(weight * value) along axis with 0 * (+-inf) = 0.

    einsum sums the products without an x-sized temporary; only rows where it
    met 0 * inf (NaN or inf there) are summed again through _times_nonzero.
    """
    if axis % weight.ndim != weight.ndim - 1:   # moveaxis costs µs even when it moves nothing
        weight, value = np.moveaxis(weight, axis, -1), np.moveaxis(value, axis, -1)
    a, b = weight, value
    total = np.asarray(np.einsum('...i,...i->...', a, b))    # 1-D inputs give a scalar
    redo = ~np.isfinite(total)
    if redo.any():
        with np.errstate(invalid='ignore'):
            total[redo] = np.sum(_times_nonzero(a[redo], b[redo]), axis=-1)
    return total if total.ndim else total[()]     # a scalar, as np.sum gives


# ---------------------------------------------------------------- softmax

def softmax_fwd(x, axis=-1):
    """exp(x - max) / sum(exp(x - max)) along axis."""
    fn = 'softmax_fwd'
    x = checks.float_array(fn, 'x', x)
    axis = checks.check_axis(fn, axis, x.ndim)
    xa = x.astype(accumulation_dtype(x.dtype), copy=False)
    e = np.exp(xa - _shifted_max(xa, axis))
    with np.errstate(invalid='ignore'):
        return (e / np.sum(e, axis=axis, keepdims=True)).astype(x.dtype, copy=False)


def _saved_and_dy(fn, saved_name, saved, dy, axis):
    """The checked backward inputs in the accumulation dtype: (saved, dy, axis, output dtype)."""
    saved = checks.float_array(fn, saved_name, saved)
    dy = checks.float_array(fn, 'dy', dy)
    checks.same_shape(fn, saved_name, saved, 'dy', dy)
    axis = checks.check_axis(fn, axis, saved.ndim)
    acc = accumulation_dtype(saved.dtype)
    return saved.astype(acc, copy=False), dy.astype(acc, copy=False), axis, saved.dtype


def softmax_bwd(y, dy, axis=-1):
    """dx = y * (dy - sum(dy * y)) with y the saved softmax output."""
    ya, dya, axis, dtype = _saved_and_dy('softmax_bwd', 'y', y, dy, axis)
    dx = ya * (dya - np.sum(dya * ya, axis=axis, keepdims=True))
    return dx.astype(dtype, copy=False)


def log_softmax_fwd(x, axis=-1):
    """x - log(sum(exp(x))) along axis."""
    fn = 'log_softmax_fwd'
    x = checks.float_array(fn, 'x', x)
    axis = checks.check_axis(fn, axis, x.ndim)
    xa = x.astype(accumulation_dtype(x.dtype), copy=False)
    with np.errstate(invalid='ignore'):
        return (xa - log_sum_exp(xa, axis)).astype(x.dtype, copy=False)


def log_softmax_bwd(log_y, dy, axis=-1):
    """dx = dy - exp(log_y) * sum(dy) with log_y the saved log_softmax output."""
    log_ya, dya, axis, dtype = _saved_and_dy('log_softmax_bwd', 'log_y', log_y, dy, axis)
    dx = dya - np.exp(log_ya) * np.sum(dya, axis=axis, keepdims=True)
    return dx.astype(dtype, copy=False)


# ---------------------------------------------------------------- cross-entropy from logits

def _logits_and_target(fn, logits, target, axis):
    """The checked (logits, target, axis) of one shape, and the dtype to compute in."""
    logits = checks.float_array(fn, 'logits', logits)
    target = checks.float_array(fn, 'target', target)
    checks.same_shape(fn, 'logits', logits, 'target', target)
    return logits, target, checks.check_axis(fn, axis, logits.ndim), accumulation_dtype(logits.dtype)


def softmax_xent_fwd(logits, target, axis=-1):
    """Cross-entropy of softmax(logits) against `target` (same shape).

    The CUDA kernel reads each row once with an online max/sum; here the max
    and the sum are two vectorized passes.

    # Returns
        (loss, lse): both with the input shape without axis; lse is the
        log-sum-exp of each row, saved for the backward pass.
    """
    fn = 'softmax_xent_fwd'
    logits, target, axis, acc = _logits_and_target(fn, logits, target, axis)
    xa, ta = logits.astype(acc, copy=False), target.astype(acc, copy=False)
    # With m the row max and s = sum(exp(x - m)), lse = log(s) + m and
    # loss = sum(t) log(s) - sum(t (x - m)). For t >= 0 both terms are >= 0
    # (s >= 1, x - m <= 0), so nothing cancels; the product sum is taken from
    # x - m before exp overwrites it, saving an x-sized temporary and a pass.
    m = _shifted_max(xa, axis)
    shifted = np.subtract(xa, m)
    with np.errstate(invalid='ignore'):
        weighted = _weighted_row_sum(ta, shifted, axis)
    np.exp(shifted, out=shifted)
    with np.errstate(divide='ignore'):
        log_s = np.squeeze(np.log(np.sum(shifted, axis=axis, keepdims=True)), axis)
    with np.errstate(invalid='ignore'):
        loss = _times_nonzero(np.sum(ta, axis=axis), log_s) - weighted
    return loss.astype(logits.dtype, copy=False), log_s + np.squeeze(m, axis)


def _expand_row_values(fn, name, value, full_shape, axis, acc):
    array = checks.float_array(fn, name, value)
    checks.reduced_shape_check(fn, name, array, full_shape, axis)
    return np.expand_dims(array.astype(acc, copy=False), axis)


def softmax_xent_fwd_runner(logits, target, axis=-1):
    """``run(logits, target)``: softmax_xent_fwd with this axis (what a plan step keeps between
    calls; the checks run per call here, as in softmax_xent_fwd)."""
    return lambda logits, target: softmax_xent_fwd(logits, target, axis)


def softmax_xent_bwd_runner(logits, target, lse, dloss, axis=-1):
    """``run(logits, target, lse, dloss)``: softmax_xent_bwd with this axis (what a plan step
    keeps between calls; the checks run per call here, as in softmax_xent_bwd)."""
    return lambda logits, target, lse, dloss: softmax_xent_bwd(logits, target, lse, dloss, axis)


def softmax_xent_bwd(logits, target, lse, dloss, axis=-1):
    """dlogits = (softmax(logits) * sum(target) - target) * dloss."""
    fn = 'softmax_xent_bwd'
    logits, target, axis, acc = _logits_and_target(fn, logits, target, axis)
    lse = _expand_row_values(fn, 'lse', lse, logits.shape, axis, acc)
    dloss = _expand_row_values(fn, 'dloss', dloss, logits.shape, axis, acc)
    ta = target.astype(acc, copy=False)
    with np.errstate(invalid='ignore'):
        dlogits = np.subtract(logits.astype(acc, copy=False), lse)
        np.exp(dlogits, out=dlogits)                    # the softmax, in place
    # (probs * sum(target) - target) * dloss, in place in one x-sized buffer
    dlogits *= np.sum(ta, axis=axis, keepdims=True)
    dlogits -= ta
    dlogits *= dloss
    return dlogits.astype(logits.dtype, copy=False)


def softmax_xent_dtarget(logits, lse, dloss, axis=-1):
    """Gradient of softmax_xent_fwd's loss with respect to target: -(logits - lse) * dloss."""
    fn = 'softmax_xent_dtarget'
    logits = checks.float_array(fn, 'logits', logits)
    axis = checks.check_axis(fn, axis, logits.ndim)
    acc = accumulation_dtype(logits.dtype)
    lse = _expand_row_values(fn, 'lse', lse, logits.shape, axis, acc)
    dloss = _expand_row_values(fn, 'dloss', dloss, logits.shape, axis, acc)
    with np.errstate(invalid='ignore'):
        dtarget = (lse - logits.astype(acc, copy=False)) * dloss
    return dtarget.astype(logits.dtype, copy=False)


def _check_labels(fn, labels, logits_shape, axis):
    labels = np.asarray(labels)
    if not np.issubdtype(labels.dtype, np.integer):
        raise TypeError('%s: labels must be an integer array, got dtype %s' % (fn, labels.dtype))
    checks.reduced_shape_check(fn, 'labels', labels, logits_shape, axis)
    checks.label_range_check(fn, labels, logits_shape[axis], axis)
    return np.expand_dims(labels.astype(np.intp, copy=False), axis)


def sparse_softmax_xent_fwd(logits, labels, axis=-1):
    """Cross-entropy of softmax(logits) against integer class `labels`.

    # Returns
        (loss, lse): loss = lse - logits[label], both with the input shape
        without axis.
    """
    fn = 'sparse_softmax_xent_fwd'
    logits = checks.float_array(fn, 'logits', logits)
    axis = checks.check_axis(fn, axis, logits.ndim)
    index = _check_labels(fn, labels, logits.shape, axis)
    xa = logits.astype(accumulation_dtype(logits.dtype), copy=False)
    lse = log_sum_exp(xa, axis)
    with np.errstate(invalid='ignore'):
        loss = np.squeeze(lse - np.take_along_axis(xa, index, axis), axis)
    return loss.astype(logits.dtype, copy=False), np.squeeze(lse, axis)


def sparse_softmax_xent_bwd(logits, labels, lse, dloss, axis=-1):
    """dlogits = (softmax(logits) - one_hot(labels)) * dloss."""
    fn = 'sparse_softmax_xent_bwd'
    logits = checks.float_array(fn, 'logits', logits)
    axis = checks.check_axis(fn, axis, logits.ndim)
    index = _check_labels(fn, labels, logits.shape, axis)
    acc = accumulation_dtype(logits.dtype)
    lse = _expand_row_values(fn, 'lse', lse, logits.shape, axis, acc)
    dloss = _expand_row_values(fn, 'dloss', dloss, logits.shape, axis, acc)
    with np.errstate(invalid='ignore'):
        grad = np.subtract(logits.astype(acc, copy=False), lse)
        np.exp(grad, out=grad)
    np.put_along_axis(grad, index, np.take_along_axis(grad, index, axis) - 1, axis)
    grad *= dloss
    return grad.astype(logits.dtype, copy=False)


# ---------------------------------------------------------------- cross-entropy from probabilities

def _categorical_clipped(fn, probs, target, axis, epsilon, need_target=True):
    probs = checks.float_array(fn, 'probs', probs)
    axis = checks.check_axis(fn, axis, probs.ndim)
    epsilon = checks.check_epsilon(fn, epsilon)
    acc = accumulation_dtype(probs.dtype)
    pa = probs.astype(acc, copy=False)
    total = np.sum(pa, axis=axis, keepdims=True)
    with np.errstate(divide='ignore', invalid='ignore'):
        normalized = pa / total
    clipped = np.clip(normalized, epsilon, 1 - epsilon)
    ta = None
    if need_target:
        target = checks.float_array(fn, 'target', target)
        checks.same_shape(fn, 'probs', probs, 'target', target)
        ta = target.astype(acc, copy=False)
    return probs, axis, epsilon, acc, total, normalized, clipped, ta


def categorical_xent_probs_fwd(probs, target, axis=-1, epsilon=1e-7):
    """Keras categorical_crossentropy(from_logits=False):
    p = probs / sum(probs); -sum(target * log(clip(p, eps, 1 - eps)))."""
    probs, axis, _, _, _, _, clipped, ta = _categorical_clipped(
        'categorical_xent_probs_fwd', probs, target, axis, epsilon)
    loss = -np.sum(ta * np.log(clipped), axis=axis)
    return loss.astype(probs.dtype, copy=False)


def categorical_xent_probs_bwd(probs, target, dloss, axis=-1, epsilon=1e-7):
    """Gradient of categorical_xent_probs_fwd with respect to probs.

    With g = d loss / d p = -target / clip(p) inside the clip range (0
    outside), the normalization p = probs / s gives dprobs = (g - sum(g p)) / s.
    """
    fn = 'categorical_xent_probs_bwd'
    probs, axis, epsilon, acc, total, normalized, clipped, ta = _categorical_clipped(
        fn, probs, target, axis, epsilon)
    dloss = _expand_row_values(fn, 'dloss', dloss, probs.shape, axis, acc)
    inside = (normalized >= epsilon) & (normalized <= 1 - epsilon)
    g = np.where(inside, -ta / clipped, 0)
    with np.errstate(divide='ignore', invalid='ignore'):
        dprobs = (g - np.sum(g * normalized, axis=axis, keepdims=True)) / total * dloss
    return dprobs.astype(probs.dtype, copy=False)


def categorical_xent_probs_dtarget(probs, dloss, axis=-1, epsilon=1e-7):
    """Gradient of categorical_xent_probs_fwd with respect to target: -log(clip(p)) * dloss."""
    fn = 'categorical_xent_probs_dtarget'
    probs, axis, _, acc, _, _, clipped, _ = _categorical_clipped(
        fn, probs, None, axis, epsilon, need_target=False)
    dloss = _expand_row_values(fn, 'dloss', dloss, probs.shape, axis, acc)
    return (-np.log(clipped) * dloss).astype(probs.dtype, copy=False)


def _binary_inputs(fn, first_name, first, target, dloss=None):
    first = checks.float_array(fn, first_name, first)
    acc = accumulation_dtype(first.dtype)
    arrays = [first.astype(acc, copy=False)]
    if target is not None:
        target = checks.float_array(fn, 'target', target)
        checks.same_shape(fn, first_name, first, 'target', target)
        arrays.append(target.astype(acc, copy=False))
    if dloss is not None:
        dloss = checks.float_array(fn, 'dloss', dloss)
        checks.same_shape(fn, first_name, first, 'dloss', dloss)
        arrays.append(dloss.astype(acc, copy=False))
    return first.dtype, arrays


def _sigmoid(x):
    # 1 / (1 + exp(-x)) overflows for x << 0; exp(-log(1 + exp(-x))) does not.
    return np.exp(-np.logaddexp(0, -x))


def binary_xent_logits_fwd(logits, target):
    """Elementwise max(x, 0) - x z + log1p(exp(-|x|)) (no overflow for any x)."""
    dtype, (x, z) = _binary_inputs('binary_xent_logits_fwd', 'logits', logits, target)
    with np.errstate(invalid='ignore'):
        # x (1 - z) for x >= 0 and -x z for x < 0, so an infinite x with a
        # zero weight on its side gives 0, not inf - inf
        linear = np.where(x >= 0, _times_nonzero(1 - z, x), _times_nonzero(z, -x))
        loss = linear + np.log1p(np.exp(-np.abs(x)))
    return loss.astype(dtype, copy=False)


def binary_xent_logits_bwd(logits, target, dloss):
    """dlogits = (sigmoid(x) - z) * dloss."""
    dtype, (x, z, d) = _binary_inputs('binary_xent_logits_bwd', 'logits', logits, target, dloss)
    return ((_sigmoid(x) - z) * d).astype(dtype, copy=False)


def binary_xent_logits_dtarget(logits, dloss):
    """dtarget = -x * dloss."""
    dtype, (x, d) = _binary_inputs('binary_xent_logits_dtarget', 'logits', logits, None, dloss)
    return (-x * d).astype(dtype, copy=False)


def _binary_clip(fn, p, epsilon):
    epsilon = checks.check_epsilon(fn, epsilon)
    return epsilon, np.clip(p, epsilon, 1 - epsilon)


def binary_xent_probs_fwd(probs, target, epsilon=1e-7):
    """Keras binary_crossentropy(from_logits=False):
    q = clip(p, eps, 1 - eps); -(z log q + (1 - z) log(1 - q))."""
    fn = 'binary_xent_probs_fwd'
    dtype, (p, z) = _binary_inputs(fn, 'probs', probs, target)
    _, q = _binary_clip(fn, p, epsilon)
    return (-(z * np.log(q) + (1 - z) * np.log1p(-q))).astype(dtype, copy=False)


def binary_xent_probs_bwd(probs, target, dloss, epsilon=1e-7):
    """dprobs = (-z / q + (1 - z) / (1 - q)) * dloss inside the clip range, 0 outside."""
    fn = 'binary_xent_probs_bwd'
    dtype, (p, z, d) = _binary_inputs(fn, 'probs', probs, target, dloss)
    epsilon, q = _binary_clip(fn, p, epsilon)
    inside = (p >= epsilon) & (p <= 1 - epsilon)
    grad = np.where(inside, (-z / q + (1 - z) / (1 - q)) * d, 0)
    return grad.astype(dtype, copy=False)


def binary_xent_probs_dtarget(probs, dloss, epsilon=1e-7):
    """dtarget = (log(1 - q) - log q) * dloss."""
    fn = 'binary_xent_probs_dtarget'
    dtype, (p, d) = _binary_inputs(fn, 'probs', probs, None, dloss)
    _, q = _binary_clip(fn, p, epsilon)
    return ((np.log1p(-q) - np.log(q)) * d).astype(dtype, copy=False)
