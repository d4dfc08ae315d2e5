"""The batch-norm graphs of gpuk.kernels.cudnn.batchnorm against the installed cuDNN Frontend,
without a GPU: every graph bn_train_fwd / bn_infer_fwd / bn_bwd builds (train, infer, bwd,
each also with the fused relu; float16 and float32; x viewed channels last and channels
first) is constructed with our real arguments, and, where the cuDNN 9 library loads,
lowered for a described H100 (validate, the backend operation graph, the variant pack) and
planned (which needs a driver for batch norm: skipped without one). Skipped where the
frontend does not import (CI)."""
import pytest

from gpuk.kernels.cudnn import batchnorm as cudnn_batchnorm


OPS = [base + relu for base in cudnn_batchnorm.GRAPH_OPS for relu in ('', '_relu')]
DTYPES = ['float16', 'float32']
# (outer, C, inner): NHWC (N*H*W, C, 1) and NCHW (N, C, H*W)
VIEWS = {'nhwc': (2 * 5 * 5, 64, 1), 'nchw': (2, 64, 25)}
INPUTS = {'train': ('x', 'scale', 'bias', 'epsilon', 'running_mean', 'running_var', 'momentum'),
          'infer': ('x', 'mean', 'inv_var', 'scale', 'bias'),
          'bwd': ('dy', 'x', 'scale', 'mean', 'inv_var')}
OUTPUTS = {'train': ('y', 'mean', 'inv_var', 'next_running_mean', 'next_running_var'),
           'infer': ('y',), 'bwd': ('dx', 'dscale', 'dbias')}
DATA = {'x', 'dy', 'y', 'dx'}          # x-shaped, of x's dtype; the rest are float32 statistics
SCALARS = {'epsilon', 'momentum'}      # pass-by-value host scalars


def _names(op):
    base = op.replace('_relu', '')
    inputs = INPUTS[base] + (('y',) if op == 'bwd_relu' else ())
    return set(inputs + OUTPUTS[base])


@pytest.mark.parametrize('view', VIEWS.values(), ids=VIEWS.keys())
@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('op', OPS)
def test_graph_is_what_cudnn_must_run(frontend, op, dtype, view):
    graph, tensors = cudnn_batchnorm.graph_for(frontend, op, dtype, view)
    assert set(tensors) == _names(op)
    dims, strides, sdims, sstrides = cudnn_batchnorm.bn_dims(*view)
    io = frontend.data_type.HALF if dtype == 'float16' else frontend.data_type.FLOAT
    for name, tensor in tensors.items():
        assert not tensor.get_is_virtual(), name        # every one is a variant-pack buffer
        assert tensor.get_is_pass_by_value() == (name in SCALARS), name
        if name in SCALARS:
            continue
        assert tensor.get_data_type() == (io if name in DATA else frontend.data_type.FLOAT), name
        assert (tensor.get_dim(), tensor.get_stride()) == ((dims, strides) if name in DATA else (sdims, sstrides))
    nodes = {'train': ['bn'], 'infer': ['bn'], 'bwd': ['dbn'],
             'train_relu': ['bn', 'relu'], 'infer_relu': ['bn', 'relu'], 'bwd_relu': ['drelu', 'dbn']}
    assert [node.name for node in graph.nodes] == nodes[op]
    if op in ('train_relu', 'infer_relu'):
        (normalized,) = graph.nodes[1].inputs.values()
        assert normalized.get_is_virtual()              # the relu's input never reaches memory


def test_graph_for_refuses_unknown_ops_and_float64(frontend):
    with pytest.raises(ValueError, match="graph_for: op must be one of"):
        cudnn_batchnorm.graph_for(frontend, 'train_tanh', 'float32', (2, 3, 4))
    with pytest.raises(Exception, match='no float64') as info:
        cudnn_batchnorm.graph_for(frontend, 'train', 'float64', (2, 3, 4))
    assert type(info.value).__name__ == 'Unsupported'


@pytest.mark.parametrize('view', VIEWS.values(), ids=VIEWS.keys())
@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('op', OPS)
def test_graph_lowers_for_an_h100(frontend, h100, op, dtype, view):
    """validate and the backend operation graph (the lowering: data types, virtual and output
    tensors, the batchnorm node's required ports), then the variant pack cuDNN asks for:
    exactly our buffers, the pass-by-value epsilon / momentum included."""
    graph, tensors = cudnn_batchnorm.graph_for(frontend, op, dtype, view, device_property=h100)
    graph.validate()
    graph.build_operation_graph()
    assert graph._variant_pack_uids() == sorted(t.get_uid() for t in tensors.values())


@pytest.mark.parametrize('view', VIEWS.values(), ids=VIEWS.keys())
@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('op', OPS)
def test_graph_plans_for_an_h100(frontend, h100, op, dtype, view):
    """plan (heuristics) and build_plans. cuDNN's batch-norm engines are compiled at run time
    and its batch-norm heuristics need a device, so without a driver cuDNN proposes no engine:
    that one refusal skips; any other error fails."""
    graph, tensors = cudnn_batchnorm.graph_for(frontend, op, dtype, view, device_property=h100)
    try:
        cudnn_batchnorm.plan(frontend, graph)
        graph.build_plans()
    except Exception as exc:
        if type(exc).__name__ != 'cudnnGraphNotSupportedError':
            raise
        pytest.skip('cuDNN proposes no batch-norm engine without a driver here: %s' % str(exc).splitlines()[0])
    assert graph._variant_pack_uids() == sorted(t.get_uid() for t in tensors.values())
