"""cuDNN path for batch normalization: cuDNN Frontend graphs (batchnorm,
batchnorm_inference, batchnorm_backward nodes), with the twin's signatures.

Detection, handle and stream come from ``gpuk.kernels.cudnn``. cuDNN normalizes per
channel of an (N, C, *spatial) tensor, so x is described as (outer, C, inner, 1) with
packed strides (C * inner, inner, 1, 1): that is channels first for inner > 1 and
channels last for inner == 1, with no copy. Statistics, scale and bias are (1, C, 1, 1)
float32 (float16 inputs) tensors.

Where the contract and cuDNN differ, calls raise ``dispatch.Unsupported`` (gpuk's kernels
run instead): float64 (the frontend's batchnorm nodes take half/bfloat16/float), kept axes
that are not one contiguous run, and bn_bwd with dmean / dvar (cuDNN's backward has no
terms for gradients flowing into the batch statistics). The training graph returns
inv_std, not the variance: var = 1 / inv_std^2 - epsilon, which loses relative precision
where var is much smaller than epsilon.

Fusions, like with like: activation='relu' adds a pointwise relu after the batchnorm /
batchnorm_inference node (the normalized tensor stays virtual) and, backward, a
relu_backward of dy against the fused output y feeding batchnorm_backward. The moving
averages are the batchnorm node's own running statistics (in_running_mean / var ->
next_running_mean / var, cuDNN's momentum being Keras's decay = 1 - momentum). cuDNN
corrects the variance by n / (n - 1); Keras's layer by var_factor, so the difference
var_decay * var * (var_factor - n / (n - 1)) is added per channel afterwards (C-sized
work; small, so var's precision loss from inv_std hardly shows). decay and var_decay go to
cuDNN as host scalars (a device value costs a small copy) and must be equal.
"""
import math
from collections import namedtuple

import numpy as np

from gpuk import config
from . import cudnn

__all__ = ['bn_train_fwd', 'bn_infer_fwd', 'bn_bwd', 'bn_dims', 'graph_key']

_graphs = {}
_Built = namedtuple('_Built', ['graph', 'tensors', 'workspace_size'])


def _unsupported(reason):
    from .dispatch import Unsupported   # dispatch imports cudnn; import late to stay acyclic
    return Unsupported(reason)


def bn_dims(outer, channels, inner):
    """(dims, strides, stat dims, stat strides) of x viewed as (outer, C, inner, 1)."""
    return ([outer, channels, inner, 1], [channels * inner, inner, 1, 1], [1, channels, 1, 1], [channels, 1, 1, 1])


def contiguous_view(shape, axes):
    """(outer, C, inner) when the kept axes of `shape` form one run, else None."""
    kept = [i for i in range(len(shape)) if i not in axes]
    if kept and kept != list(range(kept[0], kept[-1] + 1)):
        return None
    if not kept:
        return 1, 1, math.prod(shape)
    return math.prod(shape[:kept[0]]), math.prod(shape[kept[0]:kept[-1] + 1]), math.prod(shape[kept[-1] + 1:])


def graph_key(op, device_id, dtype_name, view, precision):
    return (op, device_id, dtype_name, tuple(view), precision)


def _io_type(frontend, dtype_name):
    if dtype_name == 'float64':
        raise _unsupported('the cuDNN Frontend batchnorm nodes take no float64')
    return frontend.data_type.HALF if dtype_name == 'float16' else frontend.data_type.FLOAT


def _build(frontend, handle, op, dtype_name, view):
    """op: 'train', 'infer' or 'bwd', with '_relu' for the fused relu."""
    op, relu = op.replace('_relu', ''), op.endswith('_relu')
    io = _io_type(frontend, dtype_name)
    f32 = frontend.data_type.FLOAT
    graph = frontend.pygraph(io_data_type=io, intermediate_data_type=f32, compute_data_type=f32, handle=handle)
    dims, strides, sdims, sstrides = bn_dims(*view)

    def data(name):
        return graph.tensor(name=name, dim=dims, stride=strides, data_type=io)

    def stat(name):
        return graph.tensor(name=name, dim=sdims, stride=sstrides, data_type=f32)

    def scalar(name):
        return graph.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=f32, is_pass_by_value=True)
    if op == 'train':
        x, scale, bias, run_mean, run_var = data('x'), stat('scale'), stat('bias'), stat('rm'), stat('rv')
        eps, momentum = scalar('epsilon'), scalar('momentum')
        y, mean, inv_var, next_mean, next_var = graph.batchnorm(
            name='bn', input=x, scale=scale, bias=bias, in_running_mean=run_mean, in_running_var=run_var,
            epsilon=eps, momentum=momentum)
        y = graph.relu(input=y, name='relu') if relu else y
        y.set_output(True).set_data_type(io)
        for t in (mean, inv_var, next_mean, next_var):
            t.set_output(True).set_data_type(f32)
        tensors = (x, scale, bias, run_mean, run_var, eps, momentum, y, mean, inv_var, next_mean, next_var)
    elif op == 'infer':
        x, mean, inv_var, scale, bias = data('x'), stat('mean'), stat('inv_var'), stat('scale'), stat('bias')
        y = graph.batchnorm_inference(input=x, mean=mean, inv_variance=inv_var, scale=scale, bias=bias)
        y = graph.relu(input=y, name='relu') if relu else y
        y.set_output(True).set_data_type(io)
        tensors = (x, mean, inv_var, scale, bias, y)
    else:
        dy, x, scale, mean, inv_var = data('dy'), data('x'), stat('scale'), stat('mean'), stat('inv_var')
        inputs = (dy, x, scale, mean, inv_var)
        if relu:
            fused_y = data('y')
            inputs += (fused_y,)
            dy = graph.relu_backward(loss=dy, input=fused_y, name='drelu')
        dx, dscale, dbias = graph.batchnorm_backward(name='dbn', grad=dy, input=x, scale=scale, mean=mean,
                                                     inv_variance=inv_var)
        dx.set_output(True).set_data_type(io)
        dscale.set_output(True).set_data_type(f32)
        dbias.set_output(True).set_data_type(f32)
        tensors = inputs + (dx, dscale, dbias)
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([frontend.heur_mode.A, frontend.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()
    return _Built(graph, tensors, graph.get_workspace_size())


def _execute(fn, op, dtype_name, view, arrays):
    """Builds (once per key) and runs the graph; ``arrays`` in the order of its tensors."""
    import cupy
    frontend = cudnn._require()
    device_id, handle = cudnn._handle(frontend, cupy)
    key = graph_key(op, device_id, dtype_name, view, config.precision())
    built = _graphs.get(key)
    if built is None:
        try:
            built = _graphs[key] = _build(frontend, handle, op, dtype_name, view)
        except Exception as exc:
            if type(exc).__name__ == 'Unsupported':
                raise
            raise RuntimeError('%s: cuDNN could not build a batchnorm %s graph for (outer, C, inner) %s, dtype %s '
                               '(%s: %s)' % (fn, op, view, dtype_name, type(exc).__name__, exc)) from exc
    workspace = cupy.empty(max(built.workspace_size, 1), dtype=cupy.uint8)
    pack = {t: (a.ctypes.data if isinstance(a, np.ndarray) else a.data.ptr) for t, a in zip(built.tensors, arrays)}
    built.graph.execute(pack, workspace.data.ptr, handle=handle)


def _view_or_unsupported(shape, axes):
    view = contiguous_view(shape, axes)
    if view is None:
        raise _unsupported('cuDNN normalizes (N, C, *spatial) channels; the kept axes must be one contiguous run')
    return view


def _stats(xp, value, channels, fill):
    if value is None:
        return xp.full(channels, fill, np.float32)
    return xp.ascontiguousarray(value.reshape(-1), dtype=np.float32)


def _op(base, activation):
    return base + '_relu' if activation == 'relu' else base


def _host_momentum(decay, var_decay):
    """cuDNN's one momentum (pass-by-value) from Keras's decay (= 1 - momentum) of both averages."""
    decay = float(np.asarray(decay.get() if hasattr(decay, 'get') else decay).reshape(()))
    var_decay = float(np.asarray(var_decay.get() if hasattr(var_decay, 'get') else var_decay).reshape(()))
    if decay != var_decay:
        raise _unsupported('cuDNN updates both running statistics with one momentum; got %r and %r'
                           % (decay, var_decay))
    return decay


def bn_train_fwd(x, gamma, beta, axes, epsilon=1e-3, activation='linear', moving_mean=None, moving_var=None,
                 decay=None, var_decay=None, var_factor=None):
    """The twin's bn_train_fwd through a cuDNN batchnorm (training) graph [+ relu]; with the
    moving statistics as the node's running statistics."""
    import cupy
    view = _view_or_unsupported(x.shape, axes)
    kept = tuple(x.shape[i] for i in range(x.ndim) if i not in axes)
    c = view[1]
    moving = moving_mean is not None
    momentum = _host_momentum(decay, decay if var_decay is None else var_decay) if moving else 0.0
    x = cupy.ascontiguousarray(x)
    y = cupy.empty_like(x)
    mean, inv_std, next_mean, next_var = (cupy.zeros(c, np.float32) for _ in range(4))
    run_mean, run_var = (_stats(cupy, moving_mean, c, 0), _stats(cupy, moving_var, c, 1)) if moving \
        else (next_mean, next_var)
    host_eps, host_momentum = np.full(1, epsilon, np.float32), np.full(1, momentum, np.float32)
    _execute('bn_train_fwd', _op('train', activation), x.dtype.name, view,
             (x, _stats(cupy, gamma, c, 1), _stats(cupy, beta, c, 0), run_mean, run_var, host_eps, host_momentum,
              y, mean, inv_std, next_mean, next_var))
    var = cupy.maximum(1.0 / (inv_std * inv_std) - np.float32(epsilon), 0)
    acc = np.float64 if x.dtype == np.float64 else np.float32
    stats = (y, mean.astype(acc).reshape(kept), var.astype(acc).reshape(kept), inv_std.astype(acc).reshape(kept))
    if not moving:
        return stats
    count = math.prod(x.shape) // max(c, 1)
    factor = 1.0 if var_factor is None else cupy.asarray(var_factor, dtype=np.float32).reshape(())
    # cuDNN's unbiased n / (n - 1) -> the caller's var_factor
    next_var = next_var + np.float32(momentum) * var * (factor - np.float32(count / max(count - 1, 1)))
    return stats + (next_mean.astype(acc).reshape(kept), next_var.astype(acc).reshape(kept))


def bn_infer_fwd(x, mean, var, gamma, beta, epsilon=1e-3, axis=-1, activation='linear'):
    """The twin's bn_infer_fwd (parameters already placed by the launcher) through cuDNN [+ relu].

    Parameters must vary along `axis` only (the BatchNormalization layer's case)."""
    import cupy
    shape = x.shape
    for p in (mean, var, gamma, beta):
        if p is not None and any(s != 1 for i, s in enumerate(p.shape) if i != axis):
            raise _unsupported('cuDNN batchnorm_inference takes per-channel parameters only')
    c = shape[axis]
    view = (math.prod(shape[:axis]), c, math.prod(shape[axis + 1:]))
    x = cupy.ascontiguousarray(x)
    y = cupy.empty_like(x)
    inv_std = 1.0 / cupy.sqrt(_stats(cupy, var, c, 1) + np.float32(epsilon))
    _execute('bn_infer_fwd', _op('infer', activation), x.dtype.name, view,
             (x, _stats(cupy, mean, c, 0), inv_std.astype(np.float32), _stats(cupy, gamma, c, 1),
              _stats(cupy, beta, c, 0), y))
    return y


def bn_bwd(dy, x, gamma, mean, inv_std, axes, dmean=None, dvar=None, activation='linear', y=None):
    """The twin's bn_bwd through a cuDNN batchnorm_backward graph (no dmean / dvar), after a
    relu_backward against the fused output y with activation='relu'."""
    import cupy
    if dmean is not None or dvar is not None:
        raise _unsupported("cuDNN's batchnorm backward has no terms for dmean / dvar")
    view = _view_or_unsupported(x.shape, axes)
    kept = tuple(x.shape[i] for i in range(x.ndim) if i not in axes)
    c = view[1]
    x, dy = cupy.ascontiguousarray(x), cupy.ascontiguousarray(dy, dtype=x.dtype)
    dx = cupy.empty_like(x)
    dgamma, dbeta = cupy.empty(c, np.float32), cupy.empty(c, np.float32)
    inputs = (dy, x, _stats(cupy, gamma, c, 1), _stats(cupy, mean, c, 0), _stats(cupy, inv_std, c, 1))
    if activation == 'relu':
        inputs += (cupy.ascontiguousarray(y),)
    _execute('bn_bwd', _op('bwd', activation), x.dtype.name, view, inputs + (dx, dgamma, dbeta))
    acc = np.float64 if x.dtype == np.float64 else np.float32
    return dx, dgamma.astype(acc).reshape(kept), dbeta.astype(acc).reshape(kept)
