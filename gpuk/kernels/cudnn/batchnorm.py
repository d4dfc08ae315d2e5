"""cuDNN path for batch normalization: cuDNN Frontend graphs (batchnorm,
batchnorm_inference, batchnorm_backward nodes), with the twin's signatures.

Detection, handle and stream come from ``gpuk.kernels.cudnn``. cuDNN normalizes per
channel of an (N, C, *spatial) tensor, so x is described as (outer, C, inner, 1) with
packed strides (C * inner, inner, 1, 1): that is channels first for inner > 1 and
channels last for inner == 1, with no copy. Statistics, scale and bias are (1, C, 1, 1)
float32 (float16 inputs) tensors.

Where the contract and cuDNN differ, calls raise ``library.Unsupported`` (gpuk's kernels
run instead): float64 (the frontend's batchnorm nodes take half/bfloat16/float), kept axes
that are not one contiguous run, empty tensors (a graph has no dim-0 tensors), bn_bwd
with dmean / dvar (cuDNN's backward has no terms for gradients flowing into the batch
statistics), and moving averages over fewer than 2 values per channel (cuDNN's n / (n - 1)
divides by 0). The training graph returns inv_std, not the variance:
var = 1 / inv_std^2 - epsilon, which loses relative precision where var is much smaller
than epsilon.

Fusions, like with like: activation='relu' adds a pointwise relu after the batchnorm /
batchnorm_inference node (the normalized tensor stays virtual) and, backward, a
relu_backward of dy against the fused output y feeding batchnorm_backward. The moving
averages are the batchnorm node's own running statistics (in_running_mean / var ->
next_running_mean / var, separate buffers; cuDNN's momentum being Keras's decay =
1 - momentum); without them the same graph updates throwaway statistics with momentum 0
(the lowered batchnorm node requires running statistics).
cuDNN corrects the variance by n / (n - 1); Keras's layer by var_factor, so the difference
var_decay * var * (var_factor - n / (n - 1)) is added per channel afterwards (C-sized
work; small, so var's precision loss from inv_std hardly shows). epsilon, decay and
var_decay go to cuDNN as host scalars (a device value costs a small copy); decay and
var_decay must be equal.

The graphs are built by ``graph_for`` and planned by ``plan``, which need no GPU (the tests
plan them for a described device, tests/kernels/test_cudnn_batchnorm_graphs.py); built
graphs are kept per (op, device, dtype, view, precision).
"""
import math

import numpy as np

from gpuk import config
from gpuk.contracts.batchnorm_checks import kept_shape
from . import library
from .library import Unsupported

__all__ = ['bn_train_fwd', 'bn_infer_fwd', 'bn_bwd', 'bn_dims', 'graph_key', 'graph_for', 'plan', 'GRAPH_OPS']

# graph_for's ops, each also with '_relu' (the fused relu / relu_backward)
GRAPH_OPS = ('train', 'infer', 'bwd')
_graphs = {}            # graph_key(...) -> library.BuiltGraph


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
        raise Unsupported('the cuDNN Frontend batchnorm nodes take no float64')
    return frontend.data_type.HALF if dtype_name == 'float16' else frontend.data_type.FLOAT


def graph_for(frontend, op, dtype_name, view, **graph_kwargs):
    """(graph, {name: tensor} in the order of the variant pack's buffers): the batchnorm graph
    of ``op`` (GRAPH_OPS, with '_relu' for the fused relu) for x viewed as ``view``
    (outer, C, inner), built up to (not including) validate().

    ``graph_kwargs`` go to ``frontend.pygraph`` (``handle=``; the tests pass a
    ``device_property`` to plan without a GPU). Needs no GPU.
    """
    base, relu = (op[:-len('_relu')], True) if op.endswith('_relu') else (op, False)
    if base not in GRAPH_OPS:
        raise ValueError('graph_for: op must be one of %s, optionally with _relu, got %r' % (GRAPH_OPS, op))
    io = _io_type(frontend, dtype_name)
    f32 = frontend.data_type.FLOAT
    graph = frontend.pygraph(io_data_type=io, intermediate_data_type=f32, compute_data_type=f32, **graph_kwargs)
    dims, strides, sdims, sstrides = bn_dims(*view)
    tensors = {}

    def data(name):
        tensors[name] = graph.tensor(name=name, dim=dims, stride=strides, data_type=io)
        return tensors[name]

    def stat(name):
        tensors[name] = graph.tensor(name=name, dim=sdims, stride=sstrides, data_type=f32)
        return tensors[name]

    def scalar(name):
        tensors[name] = graph.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=f32,
                                     is_pass_by_value=True)
        return tensors[name]

    def output(name, tensor, data_type, tensor_dims, tensor_strides):
        tensors[name] = tensor.set_output(True).set_data_type(data_type).set_dim(tensor_dims).set_stride(
            tensor_strides)

    def activation(y):
        return graph.relu(input=y, name='relu') if relu else y
    if base == 'train':
        # the running statistics are not optional once lowered (the backend graph's batchnorm
        # takes them): without moving averages the caller passes throwaway ones
        y, mean, inv_var, next_mean, next_var = graph.batchnorm(
            name='bn', input=data('x'), scale=stat('scale'), bias=stat('bias'), epsilon=scalar('epsilon'),
            in_running_mean=stat('running_mean'), in_running_var=stat('running_var'), momentum=scalar('momentum'))
        output('y', activation(y), io, dims, strides)
        for name, tensor in (('mean', mean), ('inv_var', inv_var), ('next_running_mean', next_mean),
                             ('next_running_var', next_var)):
            output(name, tensor, f32, sdims, sstrides)
    elif base == 'infer':
        x, mean, inv_var, scale, bias = data('x'), stat('mean'), stat('inv_var'), stat('scale'), stat('bias')
        y = graph.batchnorm_inference(name='bn', input=x, mean=mean, inv_variance=inv_var, scale=scale, bias=bias)
        output('y', activation(y), io, dims, strides)
    else:
        dy, x, scale, mean, inv_var = data('dy'), data('x'), stat('scale'), stat('mean'), stat('inv_var')
        if relu:
            dy = graph.relu_backward(loss=dy, input=data('y'), name='drelu')
        dx, dscale, dbias = graph.batchnorm_backward(name='dbn', grad=dy, input=x, scale=scale, mean=mean,
                                                     inv_variance=inv_var)
        output('dx', dx, io, dims, strides)
        output('dscale', dscale, f32, sdims, sstrides)
        output('dbias', dbias, f32, sdims, sstrides)
    return graph, tensors


def plan(frontend, graph):
    """validate -> build_operation_graph -> create_execution_plans (heuristics A, then the
    fallback list). Needs no GPU when the graph was made with a device_property."""
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([frontend.heur_mode.A, frontend.heur_mode.FALLBACK])


def _build(frontend, handle, op, dtype_name, view):
    graph, tensors = graph_for(frontend, op, dtype_name, view, handle=handle)
    plan(frontend, graph)
    graph.check_support()
    graph.build_plans()
    return library.BuiltGraph(graph, tensors, graph.get_workspace_size())


def _execute(fn, op, dtype_name, view, arrays):
    """Builds (once per key) and runs the graph; ``arrays`` maps each of its tensors' names to
    a buffer (NumPy arrays for the pass-by-value scalars, CuPy arrays for the rest)."""
    import cupy
    frontend = library.frontend()
    device_id, handle = library.frontend_handle(frontend, cupy)
    key = graph_key(op, device_id, dtype_name, view, config.precision())
    described = 'batchnorm %s graph for x %s as (outer, C, inner) %s, dtype %s' % (op, tuple(arrays['x'].shape),
                                                                                 view, dtype_name)
    built = library.cached_graph(_graphs, key, lambda: _build(frontend, handle, op, dtype_name, view),
                                 '%s: cuDNN could not build a %s' % (fn, described))
    pack = {tensor: library.device_pointer(arrays[name]) for name, tensor in built.tensors.items()}
    library.execute_graph(built, pack, handle, '%s: cuDNN failed running the %s' % (fn, described))


def _nonempty_or_unsupported(x):
    if x.size == 0:
        raise Unsupported('cuDNN graphs take no empty tensors, got x of shape %s' % (tuple(x.shape),))


def _view_or_unsupported(x, axes):
    _nonempty_or_unsupported(x)
    view = contiguous_view(x.shape, axes)
    if view is None:
        raise Unsupported('cuDNN normalizes (N, C, *spatial) channels; the kept axes must be one contiguous run')
    return view


def _stats(xp, value, channels, fill):
    if value is None:
        return xp.full(channels, fill, np.float32)
    return xp.ascontiguousarray(value.reshape(-1), dtype=np.float32)


def _op(base, activation):
    return base + '_relu' if activation == 'relu' else base


def _host_scalar(value):
    if not isinstance(value, np.ndarray) and type(value).__module__.startswith('cupy'):
        value = value.get()     # a CuPy array (a device scalar the plan computed)
    return float(np.asarray(value).reshape(()))


def _host_momentum(decay, var_decay):
    """cuDNN's one momentum (pass-by-value) from Keras's decay (= 1 - momentum) of both averages."""
    decay, var_decay = _host_scalar(decay), _host_scalar(var_decay)
    if decay != var_decay:
        raise Unsupported('cuDNN updates both running statistics with one momentum; got %r and %r'
                           % (decay, var_decay))
    return decay


def _host_value(value):
    """A pass-by-value scalar's buffer: float32 host memory."""
    return np.full(1, value, np.float32)


def bn_train_fwd(x, gamma, beta, axes, epsilon=1e-3, activation='linear', moving_mean=None, moving_var=None,
                 decay=None, var_decay=None, var_factor=None):
    """The twin's bn_train_fwd through a cuDNN batchnorm (training) graph [+ relu]; with the
    moving statistics as the node's running statistics."""
    view = _view_or_unsupported(x, axes)
    kept = kept_shape(x.shape, axes)
    c = view[1]
    count = x.size // c
    moving = moving_mean is not None
    if moving and count < 2:
        raise Unsupported("cuDNN's running variance divides by n - 1; got n = %d value(s) per channel" % count)
    momentum = _host_momentum(decay, decay if var_decay is None else var_decay) if moving else 0.0
    import cupy
    x = cupy.ascontiguousarray(x)
    # without moving averages the running statistics are throwaway inputs and outputs, but
    # separate buffers: the frontend documents no in-place update of a running statistic
    buffers = dict(x=x, scale=_stats(cupy, gamma, c, 1), bias=_stats(cupy, beta, c, 0), epsilon=_host_value(epsilon),
                   running_mean=_stats(cupy, moving_mean, c, 0), running_var=_stats(cupy, moving_var, c, 1),
                   momentum=_host_value(momentum), y=cupy.empty_like(x),
                   **{name: cupy.empty(c, np.float32) for name in ('mean', 'inv_var', 'next_running_mean',
                                                                   'next_running_var')})
    _execute('bn_train_fwd', _op('train', activation), x.dtype.name, view, buffers)
    inv_std = buffers['inv_var']
    var = cupy.maximum(1.0 / (inv_std * inv_std) - np.float32(epsilon), 0)
    acc = np.float64 if x.dtype == np.float64 else np.float32
    stats = (buffers['y'],) + tuple(s.astype(acc).reshape(kept) for s in (buffers['mean'], var, inv_std))
    if not moving:
        return stats
    factor = 1.0 if var_factor is None else cupy.asarray(var_factor, dtype=np.float32).reshape(())
    # cuDNN's unbiased n / (n - 1) -> the caller's var_factor
    next_var = buffers['next_running_var'] + np.float32(momentum) * var * (factor - np.float32(count / (count - 1)))
    return stats + (buffers['next_running_mean'].astype(acc).reshape(kept), next_var.astype(acc).reshape(kept))


def bn_infer_fwd(x, mean, var, gamma, beta, epsilon=1e-3, axis=-1, activation='linear'):
    """The twin's bn_infer_fwd (parameters already placed by the launcher) through cuDNN [+ relu].

    Parameters must vary along `axis` only (the BatchNormalization layer's case)."""
    _nonempty_or_unsupported(x)
    shape = x.shape
    for p in (mean, var, gamma, beta):
        if p is not None and any(s != 1 for i, s in enumerate(p.shape) if i != axis):
            raise Unsupported('cuDNN batchnorm_inference takes per-channel parameters only')
    c = shape[axis]
    view = (math.prod(shape[:axis]), c, math.prod(shape[axis + 1:]))
    import cupy
    x = cupy.ascontiguousarray(x)
    inv_std = 1.0 / cupy.sqrt(_stats(cupy, var, c, 1) + np.float32(epsilon))
    buffers = dict(x=x, mean=_stats(cupy, mean, c, 0), inv_var=inv_std.astype(np.float32),
                   scale=_stats(cupy, gamma, c, 1), bias=_stats(cupy, beta, c, 0), y=cupy.empty_like(x))
    _execute('bn_infer_fwd', _op('infer', activation), x.dtype.name, view, buffers)
    return buffers['y']


def bn_bwd(dy, x, gamma, mean, inv_std, axes, dmean=None, dvar=None, activation='linear', y=None):
    """The twin's bn_bwd through a cuDNN batchnorm_backward graph (no dmean / dvar), after a
    relu_backward against the fused output y with activation='relu'."""
    if dmean is not None or dvar is not None:
        raise Unsupported("cuDNN's batchnorm backward has no terms for dmean / dvar")
    view = _view_or_unsupported(x, axes)
    kept = kept_shape(x.shape, axes)
    c = view[1]
    import cupy
    x = cupy.ascontiguousarray(x)
    buffers = dict(dy=cupy.ascontiguousarray(dy, dtype=x.dtype), x=x, scale=_stats(cupy, gamma, c, 1),
                   mean=_stats(cupy, mean, c, 0), inv_var=_stats(cupy, inv_std, c, 1), dx=cupy.empty_like(x),
                   dscale=cupy.empty(c, np.float32), dbias=cupy.empty(c, np.float32))
    if activation == 'relu':
        buffers['y'] = cupy.ascontiguousarray(y)
    _execute('bn_bwd', _op('bwd', activation), x.dtype.name, view, buffers)
    acc = np.float64 if x.dtype == np.float64 else np.float32
    return buffers['dx'], buffers['dscale'].astype(acc).reshape(kept), buffers['dbias'].astype(acc).reshape(kept)
