"""The ctypes side of the cuDNN paths (gpuk.kernels.cudnn: library, pooling, ctc,
softmax) against the real cuDNN 9 library, without a GPU.

The prototype table and enumerator values are compared with the headers the cuDNN wheel
ships (nvidia/cudnn/include), and every descriptor our code sets is created with our real
arguments and read back through cuDNN's getters. Creating and setting descriptors needs
no device, so these run wherever libcudnn.so.9 loads (e.g. the nvidia-cudnn-cu13 wheel;
on a machine without a driver, a stub libcuda.so.1 on LD_LIBRARY_PATH is enough) and
skip, saying why, where it does not (CI).
"""
import ctypes
import glob
import os
import re
import sys

import pytest

from gpuk.kernels.cudnn import conv as cudnn_conv
from gpuk.kernels.cudnn import ctc as cudnn_ctc
from gpuk.kernels.cudnn import library as cudnn_library
from gpuk.kernels.cudnn import pooling as cudnn_pooling
from gpuk.kernels.cudnn import softmax as cudnn_softmax


@pytest.fixture(scope='module')
def lib():
    try:
        return cudnn_library.load()
    except RuntimeError as exc:
        pytest.skip('libcudnn.so.9 cannot be loaded here: %s' % exc)


def _include_dirs():
    found = []
    path = cudnn_library.library_path()
    if path:
        found.append(os.path.join(os.path.dirname(os.path.dirname(path)), 'include'))
    for base in sys.path:
        found.extend(glob.glob(os.path.join(base or '.', 'nvidia', 'cudnn', 'include')))
    found.append('/usr/include')
    return [d for d in found if os.path.isfile(os.path.join(d, 'cudnn_ops.h'))]


@pytest.fixture(scope='module')
def headers():
    """cudnn_graph.h + cudnn_ops.h + cudnn_adv.h with comments removed, as one text."""
    dirs = _include_dirs()
    if not dirs:
        pytest.skip('the cuDNN 9 headers (cudnn_ops.h) are not installed here')
    text = ''
    for name in ('cudnn_graph.h', 'cudnn_ops.h', 'cudnn_adv.h'):
        with open(os.path.join(dirs[0], name)) as f:
            text += f.read()
    text = re.sub(r'/\*.*?\*/', ' ', text, flags=re.S)
    return re.sub(r'//[^\n]*', ' ', text)


# ---------------------------------------------------------------- symbols, prototypes, enumerators

def test_the_library_is_cudnn_9(lib):
    assert lib.cudnnGetVersion() // 10000 == 9


def test_every_declared_function_is_exported(lib):
    missing = []
    for name in cudnn_library.PROTOTYPES:
        try:
            getattr(lib, name)
        except AttributeError:
            missing.append(name)
    assert missing == []


_OPAQUE = re.compile(r'^(cudnnHandle_t|cudaStream_t|cudnn\w*Descriptor_t)$')


def _ctypes_of(c_type, restype=False):
    """The ctypes type a C parameter type of the headers needs (enums are int-sized)."""
    c_type = re.sub(r'\b(const|CUDNN_DEPRECATED)\b', ' ', c_type)
    pointer = '*' in c_type or '[' in c_type
    base = re.sub(r'[*\[\]]', ' ', c_type).split()[0]
    if restype and pointer and base == 'char':
        return ctypes.c_char_p
    if pointer:
        if base == 'void':
            return ctypes.c_void_p
        if base == 'size_t':
            return ctypes.POINTER(ctypes.c_size_t)
        if _OPAQUE.match(base):
            return ctypes.POINTER(ctypes.c_void_p)
        return ctypes.POINTER(ctypes.c_int)      # int and every enum
    if _OPAQUE.match(base):
        return ctypes.c_void_p
    if base == 'size_t':
        return ctypes.c_size_t
    return ctypes.c_int                            # int, cudnnStatus_t and every other enum


def _header_prototype(headers, name):
    match = re.search(r'(\w[\w\s*]*?)\s*\bCUDNNWINAPI\s+%s\s*\(([^;]*?)\)\s*;' % re.escape(name), headers)
    assert match, '%s is not declared in the cuDNN 9 headers' % name
    restype = match.group(1).split()[-1] if '*' not in match.group(1) else match.group(1)
    params = [p.strip() for p in match.group(2).split(',') if p.strip() not in ('', 'void')]
    # drop the parameter name: the last identifier, unless the parameter is only a type
    types = [re.sub(r'\b\w+\s*(\[\s*\])?$', lambda m: m.group(1) or '', p) if len(p.replace('*', ' ').split()) > 1
             else p for p in params]
    return _ctypes_of(restype, restype=True), [_ctypes_of(t) for t in types]


# int arrays in GPU memory: CuPy hands out their addresses as ints, so they are void* to us
DEVICE_INT_ARRAYS = {('cudnnCTCLoss_v8', 5), ('cudnnCTCLoss_v8', 6), ('cudnnCTCLoss_v8', 7)}


@pytest.mark.parametrize('name', sorted(cudnn_library.PROTOTYPES))
def test_prototype_matches_the_header(headers, name):
    restype, argtypes = cudnn_library.PROTOTYPES[name]
    header_restype, header_argtypes = _header_prototype(headers, name)
    assert restype == header_restype
    for position in range(len(header_argtypes)):
        if (name, position) in DEVICE_INT_ARRAYS:
            assert header_argtypes[position] == ctypes.POINTER(ctypes.c_int)
            header_argtypes[position] = ctypes.c_void_p
    assert argtypes == header_argtypes, '%s: ours %s, header %s' % (name, argtypes, header_argtypes)


def _header_enumerators(headers):
    return {name: int(value) for name, value in
            re.findall(r'\b(CUDNN_[A-Z0-9_x]+)\s+(?:CUDNN_DEPRECATED_ENUM\s*)?=\s*(\d+)', headers)}


def test_enumerator_values_match_the_headers(headers):
    enumerators = _header_enumerators(headers)
    ours = {name: getattr(cudnn_library, name) for name in dir(cudnn_library) if name.startswith('CUDNN_')}
    assert len(ours) >= 12
    assert {name: enumerators.get(name) for name in ours} == ours
    assert cudnn_library.DATA_TYPES == {'float32': enumerators['CUDNN_DATA_FLOAT'],
                                        'float64': enumerators['CUDNN_DATA_DOUBLE'],
                                        'float16': enumerators['CUDNN_DATA_HALF']}


# ---------------------------------------------------------------- descriptors, set and read back

DESCRIBED = cudnn_library.describe('test', x=(2, 3))     # what a failure here would name


def _tensor_read_back(lib, desc, nb_requested=8):
    data_type, nb = ctypes.c_int(), ctypes.c_int()
    dims, strides = (ctypes.c_int * nb_requested)(), (ctypes.c_int * nb_requested)()
    cudnn_library.check(lib, lib.cudnnGetTensorNdDescriptor(desc, nb_requested, ctypes.byref(data_type),
                                                           ctypes.byref(nb), dims, strides), 'get tensor', DESCRIBED)
    return data_type.value, list(dims[:nb.value]), list(strides[:nb.value])


POOL_CASES = [
    # x shape, window, strides, pads, data format
    ((2, 9, 8, 3), (3, 2), (2, 1), ((1, 1), (0, 0)), 'channels_last'),
    ((2, 3, 9, 8), (2, 2), (2, 2), ((0, 0), (0, 0)), 'channels_first'),
    ((3, 11, 4), (3,), (2,), ((1, 1),), 'channels_last'),
    ((3, 4, 11), (2,), (1,), ((0, 0),), 'channels_first'),
    ((1, 5, 6, 7, 2), (2, 3, 2), (1, 2, 2), ((1, 1), (0, 0), (1, 1)), 'channels_last'),
]


@pytest.mark.parametrize('dtype', ['float16', 'float32', 'float64'])
@pytest.mark.parametrize('mode', ['max', 'avg'])
@pytest.mark.parametrize('x_shape, window, strides, pads, data_format', POOL_CASES)
def test_pooling_descriptors_read_back_and_give_our_output_shape(lib, dtype, mode, x_shape, window, strides, pads,
                                                                 data_format):
    problem = cudnn_pooling.pool_problem('t', x_shape, window, strides, pads, data_format)
    with cudnn_library.Descriptors(lib, DESCRIBED) as d:
        pool, xd, yd = cudnn_pooling._pooling_descriptors(d, problem, mode, dtype)
        for desc, shape in ((xd, problem.x_shape), (yd, problem.y_shape)):
            data_type, _, dims, strides_ = cudnn_pooling.tensor_descriptor_args(shape, problem.channels_last, dtype)
            assert _tensor_read_back(lib, desc) == (data_type, dims, strides_)
        code, nan, nb, window_, pads_, strides_ = cudnn_pooling.pooling_descriptor_args(problem, mode)
        got_mode, got_nan, got_nb = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        got = [(ctypes.c_int * 3)() for _ in range(3)]
        cudnn_library.check(lib, lib.cudnnGetPoolingNdDescriptor(pool, 3, ctypes.byref(got_mode), ctypes.byref(got_nan),
                                                                ctypes.byref(got_nb), *got), 'get pooling', DESCRIBED)
        assert (got_mode.value, got_nan.value, got_nb.value) == (code, nan, nb)
        assert [list(a[:nb]) for a in got] == [window_, pads_, strides_]
        out = (ctypes.c_int * len(problem.x_shape))()
        cudnn_library.check(lib, lib.cudnnGetPoolingNdForwardOutputDim(pool, xd, len(problem.x_shape), out),
                            'output dim', DESCRIBED)
        assert tuple(out) == cudnn_conv.cudnn_dims(problem.y_shape, problem.channels_last)


def test_ctc_descriptors_read_back(lib):
    args = cudnn_ctc.descriptor_args((4, 50, 28), 12)     # logits (N, T, A)
    assert args['dims'] == (50, 4, 28)
    with cudnn_library.Descriptors(lib, DESCRIBED) as d:
        probs = d.tensor(args['data_type'], args['dims'], args['strides'])
        assert _tensor_read_back(lib, probs) == (args['data_type'], [50, 4, 28], [4 * 28, 28, 1])
        loss = d.ctc_loss(args['comp_type'], args['norm_mode'], args['grad_mode'], args['max_label_length'])
        got = [ctypes.c_int() for _ in range(4)]
        cudnn_library.check(lib, lib.cudnnGetCTCLossDescriptor_v9(loss, *(ctypes.byref(v) for v in got)), 'get ctc',
                            DESCRIBED)
        assert [v.value for v in got] == [args['comp_type'], args['norm_mode'], args['grad_mode'], 12]


@pytest.mark.parametrize('shape, axis', [((7, 10), -1), ((7, 10), 0), ((2, 3, 4, 5), 1), ((5,), 0), ((3, 1), 1)])
@pytest.mark.parametrize('dtype', ['float16', 'float32', 'float64'])
def test_softmax_tensor_descriptor_reads_back(lib, shape, axis, dtype):
    data_type, dims, strides = cudnn_softmax.tensor_args(shape, axis, dtype)
    with cudnn_library.Descriptors(lib, DESCRIBED) as d:
        assert _tensor_read_back(lib, d.tensor(data_type, dims, strides)) == (data_type, list(dims), list(strides))


def test_descriptors_report_cudnn_errors_by_name(lib):
    with cudnn_library.Descriptors(lib, DESCRIBED) as d:
        with pytest.raises(RuntimeError, match=r'^test: cuDNN cudnnSetTensorNdDescriptor failed for x \(2, 3\) '
                                                 r'\(status \d+: CUDNN_STATUS_BAD'):
            d.tensor(cudnn_library.CUDNN_DATA_FLOAT, (2, -3, 4, 1), (12, 4, 1, 1))


def test_descriptors_are_destroyed_on_exit(lib, monkeypatch):
    destroyed = []
    with cudnn_library.Descriptors(lib, DESCRIBED) as d:
        d.tensor(cudnn_library.CUDNN_DATA_FLOAT, (2, 3, 1, 1), (3, 1, 1, 1))
        d.ctc_loss(cudnn_library.CUDNN_DATA_FLOAT, 1, 0, 5)
        real = d.lib
        monkeypatch.setattr(d, 'lib', type('Spy', (), {
            '__getattr__': lambda self, name: (lambda desc: destroyed.append(name) or getattr(real, name)(desc))})())
    assert destroyed == ['cudnnDestroyCTCLossDescriptor', 'cudnnDestroyTensorDescriptor']


def test_scalars_follow_the_data_type():
    assert [type(v) for v in cudnn_library.scalars('float64')] == [ctypes.c_double, ctypes.c_double]
    assert [type(v) for v in cudnn_library.scalars('float16')] == [ctypes.c_float, ctypes.c_float]
    assert [v.value for v in cudnn_library.scalars('float32')] == [1.0, 0.0]
