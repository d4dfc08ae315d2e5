"""The convolution graphs of gpuk.kernels.cudnn against the installed cuDNN Frontend, without
a GPU: every graph conv_fwd/conv_dgrad/conv_wgrad builds (fprop, dgrad, wgrad; NHWC and
NCHW; 1-d lifted, 2-d, 3-d; float16, bfloat16, float32, float64) is constructed with our
real arguments, and, where the cuDNN 9 library loads, planned for a described H100
(cuDNN's device-less heuristics) up to built plans. Skipped where the frontend does not
import (CI)."""
import pytest

from gpuk.kernels.cudnn import conv as cudnn_conv


CASES = [
    ('channels_last', (2, 9, 8, 3), (3, 2, 3, 4), (2, 1), (1, 2), ((1, 2), (0, 1))),
    ('channels_first', (2, 3, 7, 6), (2, 3, 3, 5), (1, 2), (2, 1), ((2, 0), (1, 1))),
    ('channels_last', (3, 11, 2), (3, 2, 4), (2,), (1,), ((0, 1),)),
    ('channels_first', (1, 2, 5, 4, 6), (2, 1, 3, 2, 3), (1, 1, 2), (1, 1, 1), ((1, 0), (0, 0), (1, 2))),
    ('channels_last', (1, 5, 4, 6, 8), (2, 1, 3, 8, 16), (2, 1, 1), (1, 1, 2), ((0, 0), (1, 1), (2, 2))),
]
OPS = ['fprop', 'dgrad', 'wgrad']
DTYPES = [('float16', 'float32'), ('bfloat16', 'float32'), ('float32', 'float32'), ('float32', 'tf32'),
          ('float64', 'float32')]
IO_TYPES = {'float16': 'HALF', 'bfloat16': 'BFLOAT16', 'float32': 'FLOAT', 'float64': 'DOUBLE'}


def _problem(case):
    data_format, x_shape, w_shape, strides, dilation, pads = case
    return cudnn_conv.conv_problem('t', x_shape, w_shape, strides, dilation, pads, data_format)


def _expected_dims(op, problem):
    """(input dims, input dims, output dims) in cuDNN's (N, C, *spatial) order."""
    cl = problem.channels_last
    x = cudnn_conv.cudnn_dims(problem.padded_x_shape, cl)
    y = cudnn_conv.cudnn_dims(problem.y_shape, cl)
    w = cudnn_conv.filter_dims(problem.w_shape)
    return {'fprop': (x, w, y), 'dgrad': (y, w, x), 'wgrad': (x, y, w)}[op]


@pytest.mark.parametrize('dtype, precision', DTYPES)
@pytest.mark.parametrize('op', OPS)
@pytest.mark.parametrize('case', CASES)
def test_graph_is_what_cudnn_must_run(frontend, case, op, dtype, precision):
    problem = _problem(case)
    graph, tensors, bar = cudnn_conv.graph_for(frontend, op, problem, dtype, precision)
    assert bar == (dtype == 'float32' and precision == 'float32')
    io_type = getattr(frontend.data_type, IO_TYPES[dtype])
    for tensor, dims in zip(tensors, _expected_dims(op, problem)):
        assert tensor.get_dim() == list(dims)
        assert tensor.get_stride() == list(cudnn_conv.layout_strides(dims, problem.channels_last))
        assert tensor.get_data_type() == io_type
    assert not any(t.get_is_virtual() for t in tensors)      # every one is a variant-pack buffer
    (node,) = graph.nodes
    assert node.params == {'padding': list(problem.symmetric_pads), 'stride': list(problem.strides),
                           'dilation': list(problem.dilation)}
    compute = frontend.data_type.DOUBLE if dtype == 'float64' else frontend.data_type.FLOAT
    assert node.compute_data_type == compute


@pytest.mark.parametrize('case', CASES)
def test_frontend_infers_our_output_dims(frontend, case):
    """fprop's dims follow from the inputs; dgrad's are ambiguous under stride (we set them)."""
    problem = _problem(case)
    x, w, y = _expected_dims('fprop', problem)
    graph = frontend.pygraph(io_data_type=frontend.data_type.FLOAT)
    out = graph.conv_fprop(image=graph.tensor(dim=list(x)), weight=graph.tensor(dim=list(w)),
                           padding=list(problem.symmetric_pads), stride=list(problem.strides),
                           dilation=list(problem.dilation))
    assert out.get_dim() == list(y)
    graph = frontend.pygraph(io_data_type=frontend.data_type.FLOAT)
    dx = graph.conv_dgrad(loss=graph.tensor(dim=list(y)), filter=graph.tensor(dim=list(w)),
                          padding=list(problem.symmetric_pads), stride=list(problem.strides),
                          dilation=list(problem.dilation))
    for inferred, ours, stride in zip(dx.get_dim()[2:], x[2:], problem.strides):
        assert 0 <= ours - inferred < stride


def _deselected_plans(graph):
    """Indices of the backend's plans a deselect_* filter has barred."""
    lowered, barred = graph._lowered_graph, set()
    for index in range(lowered.get_execution_plan_count()):
        try:
            lowered.build_plan_at_index(index)
        except Exception as exc:
            if 'Deselect' not in str(exc):
                raise
            barred.add(index)
    return barred


@pytest.mark.parametrize('dtype, precision', DTYPES)
@pytest.mark.parametrize('op', OPS)
@pytest.mark.parametrize('case', CASES)
def test_graph_plans_for_an_h100(frontend, h100, case, op, dtype, precision):
    """validate, build_operation_graph, heuristics, our filters and the plan walk (check_support
    needs a device); the variant pack we build is exactly the one the graph asks for."""
    problem = _problem(case)
    graph, tensors, bar = cudnn_conv.graph_for(frontend, op, problem, dtype, precision, device_property=h100)
    cudnn_conv.plan(frontend, graph, bar)
    graph.build_plans()
    assert graph._variant_pack_uids() == sorted(t.get_uid() for t in tensors)
    barred = _deselected_plans(graph)
    if bar:
        # the filter marks the tensor-core (TF32) engines, and the walk built another plan
        assert barred, 'no plan carries the TENSOR_CORE note: the filter cannot have acted'
        assert graph.plans[graph._plan_index].cpp_index not in barred
    else:
        assert not barred


# MobileNet-like depthwise problems (cudnn.conv.depthwise_conv_*): grouped convolutions whose
# filter has one input channel per group.
DEPTHWISE_CASES = [
    ('channels_last', (2, 12, 12, 32), (3, 3, 32, 1), (1, 1), (1, 1), ((1, 1), (1, 1))),
    ('channels_first', (2, 16, 9, 9), (3, 3, 16, 2), (2, 2), (1, 1), ((1, 1), (1, 1))),
]


def _depthwise_problem(case):
    data_format, x_shape, w_shape, strides, dilation, pads = case
    flat = cudnn_conv.depthwise_filter_shape('t', w_shape)
    return cudnn_conv.conv_problem('t', x_shape, flat, strides, dilation, pads, data_format, groups=w_shape[-2])


@pytest.mark.parametrize('op', OPS)
@pytest.mark.parametrize('case', DEPTHWISE_CASES)
def test_depthwise_graph_plans_for_an_h100(frontend, h100, case, op):
    """The grouped graph (x with C channels, filter (C * M, 1, *k)) passes cuDNN's validation
    and heuristics and builds plans, as the ordinary ones do."""
    problem = _depthwise_problem(case)
    graph, tensors, bar = cudnn_conv.graph_for(frontend, op, problem, 'float32', 'float32', device_property=h100)
    w_dims = cudnn_conv.filter_dims(problem.w_shape)
    assert w_dims[:2] == (case[2][-2] * case[2][-1], 1)
    assert [list(d) for d in _expected_dims(op, problem)] == [t.get_dim() for t in tensors]
    cudnn_conv.plan(frontend, graph, bar)
    graph.build_plans()
    assert graph._variant_pack_uids() == sorted(t.get_uid() for t in tensors)
