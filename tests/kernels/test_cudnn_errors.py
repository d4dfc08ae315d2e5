"""A failed call of cuDNN's legacy API (the pooling, softmax and CTC paths) names the gpuk
function the user called, the cuDNN function and the problem as cuDNN got it (shapes, dtype,
layout, window), then cuDNN's status (library.describe / check).

The status is injected through a stand-in libcudnn whose calls all succeed but one; the
arrays are NumPy arrays standing in for CuPy's (``library.device_pointer`` takes both)."""
import sys
import threading
import types

import numpy as np
import pytest

from gpuk import config
from gpuk.kernels import pooling, softmax_xent
from gpuk.kernels.cudnn import ctc as cudnn_ctc
from gpuk.kernels.cudnn import library
from gpuk.kernels.cudnn import pooling as cudnn_pooling
from gpuk.kernels.cudnn import softmax as cudnn_softmax

_STATUS_NAMES = {3: 'CUDNN_STATUS_BAD_PARAM', 4004: 'CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED'}


class _Libcudnn:
    """libcudnn.so.9 where every call returns success but ``failing``, which returns ``status``."""

    def __init__(self, failing, status):
        self.failing, self.status = failing, status

    def cudnnGetErrorString(self, status):
        return _STATUS_NAMES[status].encode()

    def __getattr__(self, name):
        if not name.startswith('cudnn'):
            raise AttributeError(name)
        return lambda *args: self.status if name == self.failing else 0


class _NumpyStandIn(types.ModuleType):
    """NumPy under another name, with ``overrides`` (CuPy's ``cuda`` for ``cupy``; for the CTC
    path's own ``np``, an ``ndarray`` no array is, so that NumPy logits pass for device arrays)."""

    def __init__(self, name, **overrides):
        super().__init__(name)
        self.__dict__.update(overrides)

    def __getattr__(self, name):
        return getattr(np, name)


@pytest.fixture
def failing(monkeypatch):
    """``failing(call, status)``: the legacy paths run on the stand-in libcudnn, whose ``call``
    returns ``status``."""
    cuda = types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=0),
                                 get_current_stream=lambda: types.SimpleNamespace(ptr=0))
    monkeypatch.setitem(sys.modules, 'cupy', _NumpyStandIn('cupy', cuda=cuda))
    monkeypatch.setattr(cudnn_ctc, 'np', _NumpyStandIn('numpy', ndarray=type('DeviceArraysOnly', (), {})))
    monkeypatch.setattr(library, 'available', lambda: True)
    monkeypatch.setattr(library, '_handles', threading.local())

    def fail(call, status):
        monkeypatch.setattr(library, 'library', lambda: _Libcudnn(call, status))
    return fail


def _pool_case(fn, **kwargs):
    """(fn, its arguments) on x (2, 5, 5, 3), 2x2 windows, stride 2, channels_last."""
    rng = np.random.default_rng(0)
    geometry = ((2, 2), (2, 2), ((0, 0), (0, 0)), 'channels_last')
    x = rng.standard_normal((2, 5, 5, 3)).astype(np.float32)
    dy = rng.standard_normal((2, 2, 2, 3)).astype(np.float32)
    taps = np.zeros((2, 2, 2, 3), np.int32)
    args = {'pool_fwd': (x,) + geometry + ('max',), 'avg_pool_fwd': (x,) + geometry,
            'avg_pool_bwd': (dy, x.shape) + geometry,
            'max_pool_bwd': (dy, taps, (2, 4, 4, 3), (2, 2), (2, 2), ((0, 0), (0, 0)), 'channels_last')}[fn]
    return getattr(cudnn_pooling, fn), args


_POOL_PROBLEM = 'y (2, 2, 2, 3), window (2, 2), strides (2, 2), pads (0, 0), layout channels_last'
_LOGITS = np.random.default_rng(1).standard_normal((3, 8, 5)).astype(np.float32)
_CTC_ARGS = (_LOGITS, np.array([[1, 2, 2], [0, 3, 0], [4, 4, 4]]), np.array([8, 6, 3]), np.array([3, 2, 0]))
_CTC_PROBLEM = 'logits (3, 8, 5), labels (3, 3), max_label_length 3, blank 4, dtype float32'
_SOFTMAX_X = np.random.default_rng(2).standard_normal((4, 3, 5)).astype(np.float64)

CASES = [
    # (function, arguments), the cuDNN call made to fail, what the message says it failed for
    (_pool_case('pool_fwd'), 'cudnnPoolingForward',
     'pool_fwd: cuDNN cudnnPoolingForward failed for x (2, 5, 5, 3), %s, mode max, dtype float32' % _POOL_PROBLEM),
    (_pool_case('avg_pool_fwd'), 'cudnnPoolingForward',
     'avg_pool_fwd: cuDNN cudnnPoolingForward failed for x (2, 5, 5, 3), %s, mode avg, dtype float32' % _POOL_PROBLEM),
    (_pool_case('avg_pool_bwd'), 'cudnnPoolingBackward',
     'avg_pool_bwd: cuDNN cudnnPoolingBackward failed for x (2, 5, 5, 3), %s, mode avg, dtype float32' % _POOL_PROBLEM),
    (_pool_case('max_pool_bwd'), 'cudnnPoolingBackward',
     'max_pool_bwd: cuDNN cudnnPoolingBackward failed for x (2, 4, 4, 3), %s, mode max, dtype float32' % _POOL_PROBLEM),
    (_pool_case('avg_pool_fwd'), 'cudnnSetPoolingNdDescriptor',
     'avg_pool_fwd: cuDNN cudnnSetPoolingNdDescriptor failed for x (2, 5, 5, 3), %s, mode avg, dtype float32'
     % _POOL_PROBLEM),
    ((cudnn_softmax.softmax_fwd, (_SOFTMAX_X, 1)), 'cudnnSoftmaxForward',
     'softmax_fwd: cuDNN cudnnSoftmaxForward failed for x (4, 3, 5), axis 1, nchw (4, 3, 5, 1), dtype float64'),
    ((cudnn_softmax.log_softmax_bwd, (_SOFTMAX_X, _SOFTMAX_X, -1)), 'cudnnSoftmaxBackward',
     'log_softmax_bwd: cuDNN cudnnSoftmaxBackward failed for log_y (4, 3, 5), axis 2, nchw (12, 5, 1, 1), '
     'dtype float64'),
    ((cudnn_softmax.softmax_fwd, (_SOFTMAX_X, 1)), 'cudnnSetStream',
     'softmax_fwd: cuDNN cudnnSetStream failed for x (4, 3, 5), axis 1, nchw (4, 3, 5, 1), dtype float64'),
    ((cudnn_ctc.ctc_loss_fwd, _CTC_ARGS), 'cudnnCTCLoss_v8',
     'ctc_loss_fwd: cuDNN cudnnCTCLoss_v8 failed for ' + _CTC_PROBLEM),
    ((cudnn_ctc.ctc_loss_bwd, _CTC_ARGS + (None, None, None, np.ones(3))), 'cudnnGetCTCLossWorkspaceSize_v8',
     'ctc_loss_bwd: cuDNN cudnnGetCTCLossWorkspaceSize_v8 failed for ' + _CTC_PROBLEM),
    ((cudnn_ctc.cudnn_ctc_loss, _CTC_ARGS), 'cudnnSetCTCLossDescriptor_v9',
     'cudnn_ctc_loss: cuDNN cudnnSetCTCLossDescriptor_v9 failed for ' + _CTC_PROBLEM),
]


@pytest.mark.parametrize('case, call, message', CASES, ids=[c[2].split(' failed')[0] for c in CASES])
def test_a_failed_legacy_call_names_the_function_the_call_and_the_problem(failing, case, call, message):
    function, args = case
    failing(call, 3)
    with pytest.raises(RuntimeError) as caught:
        function(*args)
    assert type(caught.value) is RuntimeError
    assert str(caught.value) == message + ' (status 3: CUDNN_STATUS_BAD_PARAM)'


def test_a_failed_allocation_names_the_problem_too(failing):
    function, args = _pool_case('avg_pool_fwd')
    failing('cudnnPoolingForward', 4004)
    with pytest.raises(library.AllocationFailed) as caught:
        function(*args)
    assert caught.value.status == 4004 and isinstance(caught.value, MemoryError)
    assert str(caught.value) == ('avg_pool_fwd: cuDNN cudnnPoolingForward failed for x (2, 5, 5, 3), %s, mode avg, '
                                 'dtype float32 (status 4004: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)'
                                 % _POOL_PROBLEM)


@pytest.mark.parametrize('family, call, launch, message', [
    ('pooling', 'cudnnPoolingForward',
     lambda rt: pooling.avg_pool_fwd(np.ones((2, 5, 5, 3), np.float32), (2, 2), (2, 2), ((0, 0), (0, 0)),
                                     'channels_last', runtime=rt),
     'avg_pool_fwd: cuDNN cudnnPoolingForward failed for x (2, 5, 5, 3), %s, mode avg' % _POOL_PROBLEM),
    ('softmax_xent', 'cudnnSoftmaxForward', lambda rt: softmax_xent.log_softmax_fwd(_SOFTMAX_X, 1, runtime=rt),
     'log_softmax_fwd: cuDNN cudnnSoftmaxForward failed for x (4, 3, 5), axis 1'),
])
def test_the_kernel_api_on_cudnn_names_the_function_called(failing, cuda_standin, family, call, launch, message):
    """What someone benchmarking gpuk's kernels against cuDNN calls (gpuk.kernels.<family>)."""
    config.set_kernels(**{family: 'cudnn'})
    failing(call, 3)
    with pytest.raises(RuntimeError) as caught:
        launch(cuda_standin)
    assert str(caught.value).startswith(message), str(caught.value)
