import types
import warnings

import pytest

from gpuk import config
from gpuk.kernels import dispatch, runtime
from gpuk.kernels.cudnn import library as cudnn_library


@pytest.fixture
def on_cuda_runtime(monkeypatch):
    monkeypatch.setattr(runtime, 'current', lambda: types.SimpleNamespace(kind='cuda'))
    monkeypatch.setattr(config, '_kernels', dict(config._kernels))
    monkeypatch.setattr(dispatch, '_warned', set())
    monkeypatch.setattr(dispatch, '_auto_choice', {})


def test_emulated_runtime_always_runs_gpuk(monkeypatch):
    monkeypatch.setattr(runtime, 'current', lambda: types.SimpleNamespace(kind='emulate'))
    monkeypatch.setattr(config, '_kernels', dict(config._kernels, conv='cudnn'))
    assert dispatch.run(None, 'conv', 'k', lambda v: ('gpuk', v), lambda v: ('cudnn', v), 1) == ('gpuk', 1)


def test_selection_and_unsupported_fallback(on_cuda_runtime, monkeypatch):
    monkeypatch.setattr(cudnn_library, 'available', lambda: True)
    config.set_kernels(ctc='cudnn')

    def cudnn_ctc(labels):
        if labels >= 256:
            raise dispatch.Unsupported('labels must be < 256')
        return 'cudnn'
    assert dispatch.run(None, 'ctc', 'a', lambda labels: 'gpuk', cudnn_ctc, 10) == 'cudnn'
    with pytest.warns(RuntimeWarning, match="cuDNN cannot run this ctc problem \\(labels must be < 256\\)"):
        assert dispatch.run(None, 'ctc', 'b', lambda labels: 'gpuk', cudnn_ctc, 300) == 'gpuk'
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # said once only
        assert dispatch.run(None, 'ctc', 'b', lambda labels: 'gpuk', cudnn_ctc, 300) == 'gpuk'
    config.set_kernels(ctc='gpuk')
    assert dispatch.run(None, 'ctc', 'a', lambda labels: 'gpuk', cudnn_ctc, 10) == 'gpuk'
    assert dispatch.run(None, 'ctc', 'a', lambda labels: 'gpuk', None, 10) == 'gpuk'


def test_auto_keeps_the_faster_per_problem(on_cuda_runtime, monkeypatch):
    monkeypatch.setattr(cudnn_library, 'available', lambda: True)
    config.set_kernels(pooling='auto')
    timings = {'gpuk': 2.0, 'cudnn': 1.0}
    calls = []
    monkeypatch.setattr(dispatch, '_time', lambda fn, args, kwargs: timings[fn(*args, **kwargs)])

    def gpuk_fn():
        calls.append('gpuk')
        return 'gpuk'

    def cudnn_fn():
        calls.append('cudnn')
        return 'cudnn'
    assert dispatch.run(None, 'pooling', 'p1', gpuk_fn, cudnn_fn) == 'cudnn'
    timings.update(gpuk=0.5)
    assert dispatch.run(None, 'pooling', 'p1', gpuk_fn, cudnn_fn) == 'cudnn'  # decided once per problem
    assert dispatch.run(None, 'pooling', 'p2', gpuk_fn, cudnn_fn) == 'gpuk'
