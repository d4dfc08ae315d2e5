"""cuDNN path: convolution through NVIDIA's cuDNN Frontend Python package (graph API).

Optional: detection, handles and the per-family choice live in ``library``.

``conv_fwd`` / ``conv_dgrad`` / ``conv_wgrad`` have the signatures of their NumPy twins in
``gpuk.cpu_fallback.conv``: arrays (N, *spatial, C) for 'channels_last' or (N, C, *spatial)
for 'channels_first', filters in the Keras layout (*k, C_in, C_out), ``pads`` one
(before, after) pair per spatial dim. cuDNN describes every tensor in (N, C, *spatial)
order and says the memory layout with strides; its filters must match the data layout
(KRSC for NHWC, KCRS for NCHW), so the Keras filter is transposed into that. Its padding
is symmetric, so uneven pads are applied explicitly to x first. One spatial dim is run as
two with a height of 1 (cuDNN takes 4-d and 5-d tensors only).

Depthwise convolutions (``depthwise_conv_fwd`` / ``_dgrad`` / ``_wgrad``, the twins'
signatures) are grouped convolutions with one group per input channel: the Keras depthwise
filter (*k, C, M) is the ordinary filter (*k, 1, C * M) (output channel c * M + m, like
TensorFlow), and cuDNN infers the group count from the filter's input-channel dim (1)
against x's (C).

The translation to cuDNN's terms (``conv_problem``, ``layout_strides``, the filter axis
orders, ``split_pads``, ``graph_cache_key``) is pure Python, tested without a GPU; so is
building the graph (``graph_for``) and planning it (``plan``, with a device description
in place of a GPU) against the installed frontend.
Graphs are built once per (op, device, shapes, dtype, layout, geometry, precision) and
run on CuPy's current stream with CuPy device pointers.
"""
import math
from collections import namedtuple

from gpuk import config
from gpuk.contracts import geometry
from . import library

__all__ = ['conv_fwd', 'conv_dgrad', 'conv_wgrad', 'depthwise_conv_fwd', 'depthwise_conv_dgrad',
           'depthwise_conv_wgrad', 'conv_problem', 'graph_cache_key']

_FLOAT_DTYPES = ('float16', 'bfloat16', 'float32', 'float64')   # dtype names (ml_dtypes.bfloat16's is 'bfloat16')
_graphs = {}          # graph_cache_key(...) -> library.BuiltGraph


# ---------------------------------------------------------------- pure translation

ConvProblem = namedtuple('ConvProblem', [
    'channels_last', 'rank', 'lifted',  # lifted: a 1-d problem run as 2-d
    'x_shape', 'w_shape', 'y_shape',    # in the caller's layout (x and y lifted if 1-d)
    'padded_x_shape',                   # x after the explicit part of the padding
    'strides', 'dilation', 'symmetric_pads', 'explicit_pads'])


def split_pads(pads):
    """(symmetric, explicit): cuDNN pads min(before, after) per side; the rest is explicit.

    ``((1, 2), (0, 0))`` -> ``((1, 0), ((0, 1), (0, 0)))``.
    """
    symmetric = tuple(min(before, after) for before, after in pads)
    explicit = tuple((before - s, after - s) for (before, after), s in zip(pads, symmetric))
    return symmetric, explicit


def _spatial_of(shape, channels_last):
    return tuple(shape[1:-1]) if channels_last else tuple(shape[2:])


def _channels_of(shape, channels_last):
    return shape[-1] if channels_last else shape[1]


def _with_spatial(shape, spatial, channels_last):
    if channels_last:
        return (shape[0],) + tuple(spatial) + (shape[-1],)
    return (shape[0], shape[1]) + tuple(spatial)


def conv_problem(fn, x_shape, w_shape, strides, dilation, pads, data_format, dy_shape=None, groups=1):
    """Checks a convolution and describes it in cuDNN's terms (a ``ConvProblem``).

    ``dy_shape``, when given, must be the output shape. ``groups``: x's channels are this many
    groups of w's C_in (w_shape[-2]), each with C_out / groups of the outputs. Errors name ``fn``.
    """
    channels_last = geometry.normalize_data_format(data_format, fn) == 'channels_last'
    x_shape, w_shape = tuple(x_shape), tuple(w_shape)
    if len(x_shape) not in (3, 4, 5):
        raise ValueError('%s: x must have rank 3, 4 or 5 (batch, 1 to 3 spatial dims, '
                         'channels), got shape %s' % (fn, x_shape))
    rank = len(x_shape) - 2
    if len(w_shape) != rank + 2:
        raise ValueError('%s: w must have rank %d (*kernel_spatial, C_in, C_out) to match x '
                         'of shape %s, got shape %s' % (fn, rank + 2, x_shape, w_shape))
    strides = geometry.normalize_positive_tuple(strides, rank, fn, 'strides')
    dilation = geometry.normalize_positive_tuple(dilation, rank, fn, 'dilation')
    pads = geometry.normalize_pads(pads, rank, fn)
    if _channels_of(x_shape, channels_last) != w_shape[-2] * groups:
        raise ValueError('%s: the channel count of x (shape %s) is %d but w (shape %s) has '
                         'C_in %d%s' % (fn, x_shape, _channels_of(x_shape, channels_last),
                                        w_shape, w_shape[-2], ' x %d groups' % groups if groups > 1 else ''))
    if w_shape[-1] % groups:
        raise ValueError('%s: C_out %d of w (shape %s) is not a multiple of the %d groups'
                         % (fn, w_shape[-1], w_shape, groups))
    out_spatial = []
    for size, k, s, d, (before, after) in zip(_spatial_of(x_shape, channels_last),
                                              w_shape[:rank], strides, dilation, pads):
        padded, extent = size + before + after, geometry.dilated_size(k, d)
        if padded < extent:
            raise ValueError('%s: padded input spatial size %d is smaller than the dilated '
                             'kernel extent %d (x %s, w %s, pads %s, dilation %s)'
                             % (fn, padded, extent, x_shape, w_shape, pads, dilation))
        out_spatial.append((padded - extent) // s + 1)
    y_shape = _with_spatial((x_shape[0], w_shape[-1]), out_spatial, channels_last)
    if dy_shape is not None and tuple(dy_shape) != y_shape:
        raise ValueError('%s: dy must have the output shape %s of x %s and w %s, got %s'
                         % (fn, y_shape, x_shape, w_shape, tuple(dy_shape)))
    lifted = rank == 1
    if lifted:  # (N, L, C) -> (N, 1, L, C); w (k, Ci, Co) -> (1, k, Ci, Co)
        x_shape = _with_spatial(x_shape, (1,) + _spatial_of(x_shape, channels_last), channels_last)
        y_shape = _with_spatial(y_shape, (1,) + _spatial_of(y_shape, channels_last), channels_last)
        w_shape = (1,) + w_shape
        strides, dilation, pads = (1,) + strides, (1,) + dilation, ((0, 0),) + pads
    symmetric, explicit = split_pads(pads)
    padded_spatial = [s + b + a for s, (b, a) in zip(_spatial_of(x_shape, channels_last), explicit)]
    return ConvProblem(channels_last, len(strides), lifted, x_shape, w_shape, y_shape,
                       _with_spatial(x_shape, padded_spatial, channels_last),
                       strides, dilation, symmetric, explicit)


def cudnn_dims(shape, channels_last):
    """(N, C, *spatial) order of an array shaped for its layout."""
    if channels_last:
        return (shape[0], shape[-1]) + tuple(shape[1:-1])
    return tuple(shape)


def layout_strides(dims, channels_last):
    """Element strides, in (N, C, *spatial) order, of a packed NCHW- or NHWC-style array."""
    c, spatial = dims[1], dims[2:]
    if not channels_last:
        strides, step = [], 1
        for size in reversed(dims):
            strides.append(step)
            step *= size
        return tuple(reversed(strides))
    spatial_strides, step = [], c
    for size in reversed(spatial):
        spatial_strides.append(step)
        step *= size
    return (step, 1) + tuple(reversed(spatial_strides))


def keras_to_cudnn_filter_axes(rank, channels_last):
    """Transpose axes taking a Keras filter (*k, Ci, Co) to KRSC (Co, *k, Ci) or KCRS (Co, Ci, *k)."""
    spatial = tuple(range(rank))
    return (rank + 1,) + spatial + (rank,) if channels_last else (rank + 1, rank) + spatial


def cudnn_to_keras_filter_axes(rank, channels_last):
    """The inverse of ``keras_to_cudnn_filter_axes``."""
    forward = keras_to_cudnn_filter_axes(rank, channels_last)
    inverse = [0] * len(forward)
    for position, axis in enumerate(forward):
        inverse[axis] = position
    return tuple(inverse)


def filter_dims(w_shape):
    """cuDNN filter dims (K=C_out, C=C_in, *k) of a Keras filter shape."""
    return (w_shape[-1], w_shape[-2]) + tuple(w_shape[:-2])


def data_type_names(dtype_name, precision):
    """(io, compute) cuDNN data type names and whether tensor-core engines are barred."""
    if dtype_name not in _FLOAT_DTYPES:
        raise TypeError('cudnn: arrays must be float16, bfloat16, float32 or float64, got %s' % dtype_name)
    io = {'float16': 'HALF', 'bfloat16': 'BFLOAT16', 'float32': 'FLOAT', 'float64': 'DOUBLE'}[dtype_name]
    compute = 'DOUBLE' if dtype_name == 'float64' else 'FLOAT'
    # float32 under the strict policy must not run as TF32 on tensor cores
    return io, compute, dtype_name == 'float32' and precision == 'float32'


def graph_cache_key(op, device_id, problem, dtype_name, precision):
    """Everything a built cuDNN graph depends on; equal keys may share one graph."""
    return (op, device_id, dtype_name, precision, problem.channels_last,
            problem.padded_x_shape, problem.w_shape, problem.y_shape,
            problem.strides, problem.dilation, problem.symmetric_pads)


# ---------------------------------------------------------------- execution

def graph_for(frontend, op, problem, dtype_name, precision, **graph_kwargs):
    """(graph, tensors in variant-pack order, bar_tensor_cores): the cuDNN Frontend graph of
    ``op`` ('fprop', 'dgrad', 'wgrad') for ``problem``, built up to (not including) validate().

    ``graph_kwargs`` go to ``frontend.pygraph`` (``handle=``; the tests pass none, or a
    ``device_property`` to plan without a GPU). Needs no GPU.
    """
    io, compute, bar_tensor_cores = data_type_names(dtype_name, precision)
    io_type, compute_type = getattr(frontend.data_type, io), getattr(frontend.data_type, compute)
    graph = frontend.pygraph(io_data_type=io_type, intermediate_data_type=compute_type,
                             compute_data_type=compute_type, **graph_kwargs)
    cl = problem.channels_last
    x_dims = cudnn_dims(problem.padded_x_shape, cl)
    y_dims = cudnn_dims(problem.y_shape, cl)
    w_dims = filter_dims(problem.w_shape)

    def tensor(name, dims):
        return graph.tensor(name=name, dim=list(dims), stride=list(layout_strides(dims, cl)),
                            data_type=io_type)

    geometry_args = dict(padding=list(problem.symmetric_pads), stride=list(problem.strides),
                         dilation=list(problem.dilation), compute_data_type=compute_type)
    if op == 'fprop':
        x, w = tensor('x', x_dims), tensor('w', w_dims)
        out = graph.conv_fprop(image=x, weight=w, name='fprop', **geometry_args)
        inputs, out_dims = (x, w), y_dims
    elif op == 'dgrad':
        dy, w = tensor('dy', y_dims), tensor('w', w_dims)
        out = graph.conv_dgrad(loss=dy, filter=w, name='dgrad', **geometry_args)
        inputs, out_dims = (dy, w), x_dims
    elif op == 'wgrad':
        x, dy = tensor('x', x_dims), tensor('dy', y_dims)
        out = graph.conv_wgrad(image=x, loss=dy, name='wgrad', **geometry_args)
        inputs, out_dims = (x, dy), w_dims
    else:
        raise ValueError("graph_for: op must be 'fprop', 'dgrad' or 'wgrad', got %r" % (op,))
    # dgrad's and wgrad's output dims are not inferable (strided dgrad is ambiguous): always set
    out.set_output(True).set_dim(list(out_dims)).set_stride(
        list(layout_strides(out_dims, cl))).set_data_type(io_type)
    return graph, inputs + (out,), bar_tensor_cores


def plan(frontend, graph, bar_tensor_cores):
    """validate -> build_operation_graph -> create_execution_plans -> the engine filters.

    The filters come after create_execution_plans, when the backend has plans for them
    to mark (frontend 1.32 also replays earlier ones then). Strict float32 must not run as
    TF32: cuDNN marks its tensor-core engines with the TENSOR_CORE numerical note, and the
    frontend's Python conv engine (frost_conv, opt-in by CUDNN_FRONTEND_ENABLE_FROST_ENGINES)
    declares no notes, so it is excluded by name.
    """
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([frontend.heur_mode.A, frontend.heur_mode.FALLBACK])
    if bar_tensor_cores:
        graph.deselect_numeric_notes([frontend.numerical_note.TENSOR_CORE])
        graph.deselect_engines(['frost_conv'])


def _build(frontend, handle, op, problem, dtype_name):
    graph, tensors, bar_tensor_cores = graph_for(frontend, op, problem, dtype_name, config.precision(),
                                                 handle=handle)
    plan(frontend, graph, bar_tensor_cores)
    graph.check_support()
    graph.build_plans()
    return library.BuiltGraph(graph, tensors, graph.get_workspace_size())


def _run(fn, op, problem, arrays, out_shape_layout, dtype):
    """Builds (once) and executes the graph; ``arrays`` are the inputs in graph order."""
    import cupy
    frontend = library.frontend()
    device_id, handle = library.frontend_handle(frontend, cupy)
    dtype_name = cupy.dtype(dtype).name
    key = graph_cache_key(op, device_id, problem, dtype_name, config.precision())
    described = 'x %s, w %s, dtype %s' % (problem.padded_x_shape, problem.w_shape, dtype_name)
    built = library.cached_graph(_graphs, key, lambda: _build(frontend, handle, op, problem, dtype_name),
                                 '%s: cuDNN could not build a %s graph for %s' % (fn, op, described))
    out = cupy.empty(out_shape_layout, dtype=dtype)
    pack = {t: library.device_pointer(a) for t, a in zip(built.tensors, tuple(arrays) + (out,))}
    library.execute_graph(built, pack, handle, '%s: cuDNN %s failed for %s' % (fn, op, described))
    return out


def _float_device_array(fn, name, array):
    import cupy
    if not isinstance(array, cupy.ndarray):
        raise TypeError('%s: %s must be a CuPy array, got %s' % (fn, name, type(array).__name__))
    if array.dtype.name not in _FLOAT_DTYPES:
        raise TypeError('%s: %s must be float16, bfloat16, float32 or float64, got dtype %s'
                        % (fn, name, array.dtype))
    return cupy.ascontiguousarray(array)


def _same_dtype(fn, a_name, a, b_name, b):
    if a.dtype != b.dtype:
        raise TypeError('%s: %s and %s must have the same dtype, got %s and %s'
                        % (fn, a_name, b_name, a.dtype, b.dtype))


def pad_explicit(xp, x, problem):
    """x in the lifted layout with the uneven part of the padding applied (zeros)."""
    x = x.reshape(problem.x_shape)
    if not any(b or a for b, a in problem.explicit_pads):
        return x
    spatial = list(problem.explicit_pads)
    width = [(0, 0)] + spatial + [(0, 0)] if problem.channels_last else [(0, 0), (0, 0)] + spatial
    return xp.pad(x, width)


def crop_explicit(xp, dx_padded, problem, x_shape):
    """dx of the explicitly padded x -> dx of x, in the caller's shape."""
    if any(b or a for b, a in problem.explicit_pads):
        spatial = _spatial_of(problem.x_shape, problem.channels_last)
        interior = tuple(slice(b, b + s) for s, (b, _) in zip(spatial, problem.explicit_pads))
        index = ((slice(None),) + interior + (slice(None),) if problem.channels_last
                 else (slice(None), slice(None)) + interior)
        dx_padded = xp.ascontiguousarray(dx_padded[index])
    return dx_padded.reshape(x_shape)


def to_cudnn_filter(xp, w, problem):
    """Keras filter -> packed KRSC (channels_last) or KCRS (channels_first) array."""
    axes = keras_to_cudnn_filter_axes(problem.rank, problem.channels_last)
    return xp.ascontiguousarray(w.reshape(problem.w_shape).transpose(axes))


def cudnn_filter_memory_shape(problem):
    """Array shape of a packed cuDNN filter: (Co, *k, Ci) or (Co, Ci, *k)."""
    axes = keras_to_cudnn_filter_axes(problem.rank, problem.channels_last)
    return tuple(problem.w_shape[a] for a in axes)


def from_cudnn_filter(xp, dw, problem, w_shape):
    """Packed KRSC / KCRS array -> Keras filter of shape ``w_shape``."""
    dw = dw.reshape(cudnn_filter_memory_shape(problem))
    dw = dw.transpose(cudnn_to_keras_filter_axes(problem.rank, problem.channels_last))
    return xp.ascontiguousarray(dw).reshape(w_shape)


def unlifted_shape(shape, problem):
    """Drop the height-1 dim a 1-d problem was given."""
    if not problem.lifted:
        return tuple(shape)
    return (shape[0],) + tuple(shape[2:]) if problem.channels_last else tuple(shape[:2]) + tuple(shape[3:])


def conv_fwd(x, w, strides, dilation, pads, data_format, *, groups=1, fn='conv_fwd'):
    """Convolution (cross-correlation) of x with w -> y, through cuDNN (``groups``: see conv_problem)."""
    x, w = _float_device_array(fn, 'x', x), _float_device_array(fn, 'w', w)
    return _fwd(fn, x, w, strides, dilation, pads, data_format, groups)


def _fwd(fn, x, w, strides, dilation, pads, data_format, groups):
    """conv_fwd of x and w as _float_device_array gives them (converted once by the caller)."""
    import cupy
    _same_dtype(fn, 'x', x, 'w', w)
    problem = conv_problem(fn, x.shape, w.shape, strides, dilation, pads, data_format, groups=groups)
    y = _run(fn, 'fprop', problem, (pad_explicit(cupy, x, problem), to_cudnn_filter(cupy, w, problem)),
             problem.y_shape, x.dtype)
    return y.reshape(unlifted_shape(y.shape, problem))


def conv_dgrad(dy, w, x_shape, strides, dilation, pads, data_format, *, groups=1, fn='conv_dgrad'):
    """Gradient of conv_fwd with respect to x, through cuDNN."""
    dy, w = _float_device_array(fn, 'dy', dy), _float_device_array(fn, 'w', w)
    return _dgrad(fn, dy, w, x_shape, strides, dilation, pads, data_format, groups)


def _dgrad(fn, dy, w, x_shape, strides, dilation, pads, data_format, groups):
    """conv_dgrad of dy and w as _float_device_array gives them."""
    import cupy
    _same_dtype(fn, 'dy', dy, 'w', w)
    x_shape = geometry.normalize_positive_tuple(x_shape, dy.ndim, fn, 'x_shape')
    problem = conv_problem(fn, x_shape, w.shape, strides, dilation, pads, data_format,
                           dy_shape=dy.shape, groups=groups)
    dx = _run(fn, 'dgrad', problem, (dy.reshape(problem.y_shape), to_cudnn_filter(cupy, w, problem)),
              problem.padded_x_shape, dy.dtype)
    return crop_explicit(cupy, dx, problem, x_shape)


def conv_wgrad(x, dy, w_shape, strides, dilation, pads, data_format, *, groups=1, fn='conv_wgrad'):
    """Gradient of conv_fwd with respect to w (Keras layout), through cuDNN."""
    x, dy = _float_device_array(fn, 'x', x), _float_device_array(fn, 'dy', dy)
    return _wgrad(fn, x, dy, w_shape, strides, dilation, pads, data_format, groups)


def _wgrad(fn, x, dy, w_shape, strides, dilation, pads, data_format, groups):
    """conv_wgrad of x and dy as _float_device_array gives them."""
    import cupy
    _same_dtype(fn, 'x', x, 'dy', dy)
    w_shape = geometry.normalize_positive_tuple(w_shape, x.ndim, fn, 'w_shape')
    problem = conv_problem(fn, x.shape, w_shape, strides, dilation, pads, data_format,
                           dy_shape=dy.shape, groups=groups)
    dw = _run(fn, 'wgrad', problem, (pad_explicit(cupy, x, problem), dy.reshape(problem.y_shape)),
              cudnn_filter_memory_shape(problem), x.dtype)
    return from_cudnn_filter(cupy, dw, problem, w_shape)


def flops_conv(problem):
    """Multiply-adds x2 of one fprop (the same for dgrad and wgrad)."""
    y_spatial = _spatial_of(problem.y_shape, problem.channels_last)
    return 2 * problem.x_shape[0] * math.prod(y_spatial) * math.prod(problem.w_shape)


# ---------------------------------------------------------------- depthwise (grouped)

def depthwise_filter_shape(fn, w_shape):
    """The ordinary Keras filter shape (*k, 1, C * M) of a depthwise filter (*k, C, M)."""
    w_shape = tuple(w_shape)
    if len(w_shape) < 3:
        raise ValueError('%s: w must have shape (*kernel_spatial, C_in, multiplier), got %s' % (fn, w_shape))
    return w_shape[:-2] + (1, w_shape[-2] * w_shape[-1])


def depthwise_conv_fwd(x, w, strides, dilation, pads, data_format):
    """Depthwise convolution through cuDNN (a grouped convolution, one group per channel)."""
    fn = 'depthwise_conv_fwd'
    x, w = _float_device_array(fn, 'x', x), _float_device_array(fn, 'w', w)
    return _fwd(fn, x, w.reshape(depthwise_filter_shape(fn, w.shape)), strides, dilation, pads, data_format,
                w.shape[-2])


def depthwise_conv_dgrad(dy, w, x_shape, strides, dilation, pads, data_format):
    """Gradient of depthwise_conv_fwd with respect to x, through cuDNN."""
    fn = 'depthwise_conv_dgrad'
    dy, w = _float_device_array(fn, 'dy', dy), _float_device_array(fn, 'w', w)
    return _dgrad(fn, dy, w.reshape(depthwise_filter_shape(fn, w.shape)), x_shape, strides, dilation, pads,
                  data_format, w.shape[-2])


def depthwise_conv_wgrad(x, dy, w_shape, strides, dilation, pads, data_format):
    """Gradient of depthwise_conv_fwd with respect to w (shape (*k, C, M)), through cuDNN."""
    fn = 'depthwise_conv_wgrad'
    x, dy = _float_device_array(fn, 'x', x), _float_device_array(fn, 'dy', dy)
    w_shape = geometry.normalize_positive_tuple(w_shape, x.ndim, fn, 'w_shape')
    dw = _wgrad(fn, x, dy, depthwise_filter_shape(fn, w_shape), strides, dilation, pads, data_format,
                w_shape[-2])
    return dw.reshape(w_shape)
