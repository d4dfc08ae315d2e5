"""Fused softmax cross-entropy (forward: loss + lse in one read pass), binary cross-entropy,
and softmax forward / backward: gpuk vs cuDNN vs torch (GPU and CPU) vs NumPy. Bytes: the arrays read and
written once (logits + target read, loss written; x read, y written; y + dy read, dx
written). GPU rows skip without a GPU; `-k numpy` runs the CPU rows alone."""
import numpy as np
import pytest

from bench import harness as h

SHAPES = [(256, 1000), (4096, 1000), (8192, 32000), (8192, 128256)]
BINARY = [(1 << 20,)]
IMPLS = ['gpuk', 'cudnn', 'torch-cuda', 'torch', 'numpy']


def _logits_and_targets(impl, shape):
    """make_inputs of float32 (logits, targets): standard normal and uniform [0, 1), on impl's device."""
    if impl == 'numpy':
        def make(i):
            rng = np.random.default_rng(i)
            return rng.standard_normal(shape, dtype=np.float32), rng.random(shape, dtype=np.float32)
    elif impl in ('torch', 'torch-cuda'):
        import torch
        where = 'cuda' if impl == 'torch-cuda' else 'cpu'

        def make(i):
            g = torch.Generator(device=where).manual_seed(i)
            return (torch.randn(shape, generator=g, device=where),
                    torch.rand(shape, generator=g, device=where))
    else:
        import cupy

        def make(i):
            rs = cupy.random.RandomState(i)
            return rs.standard_normal(shape, dtype=cupy.float32), rs.random_sample(shape, dtype=cupy.float32)
    return make


def _fused_row(impl, shape, name, torch_loss, cudnn_missing):
    """(fn, make_inputs) of one fused cross-entropy on ``impl``: ``name`` is the twin's and the
    kernels' function, ``torch_loss`` torch.nn.functional's, ``cudnn_missing`` why cuDNN skips."""
    if impl == 'numpy':
        from gpuk.cpu_fallback import softmax_xent as twin
        fn = getattr(twin, name)
    elif impl in ('torch', 'torch-cuda'):
        import torch
        loss = getattr(torch.nn.functional, torch_loss)
        fn = lambda x, t: loss(x, t, reduction='none')   # noqa: E731
    elif impl == 'cudnn':
        pytest.skip(cudnn_missing)
    else:
        from gpuk.kernels import softmax_xent
        kernel = getattr(softmax_xent, name)
        fn = lambda x, t: kernel(x, t, runtime='cuda')   # noqa: E731
    return fn, _logits_and_targets(impl, shape)


def _xent_row(impl, shape):
    return _fused_row(impl, shape, 'softmax_xent_fwd', 'cross_entropy',
                      'cuDNN 9 has no fused softmax cross-entropy; its softmax alone is not the same work')


@pytest.mark.parametrize('impl', IMPLS)
@pytest.mark.parametrize('shape', SHAPES, ids=lambda s: '%dx%d' % s)
def test_softmax_xent_fwd(benchmark, harness, impl, shape):
    h.require(impl)
    fn, make = _xent_row(impl, shape)
    nbytes = 2 * 4 * shape[0] * shape[1] + 8 * shape[0]
    info = harness.run(benchmark, family='softmax_xent', case='fwd %dx%d' % shape, impl=impl, fn=fn,
                       make_inputs=make, set_bytes=nbytes, bytes_moved=nbytes, dtype='float32')
    assert info['time_s'] > 0


def _binary_row(impl, n):
    return _fused_row(impl, (n,), 'binary_xent_logits_fwd', 'binary_cross_entropy_with_logits',
                      'cuDNN has no binary cross-entropy')


@pytest.mark.parametrize('impl', IMPLS)
@pytest.mark.parametrize('shape', BINARY, ids=lambda s: '%d' % s)
def test_binary_xent_logits_fwd(benchmark, harness, impl, shape):
    h.require(impl)
    fn, make = _binary_row(impl, shape[0])
    nbytes = 3 * 4 * shape[0]
    info = harness.run(benchmark, family='binary_xent', case='logits fwd %d' % shape, impl=impl, fn=fn,
                       make_inputs=make, set_bytes=nbytes, bytes_moved=nbytes, dtype='float32')
    assert info['time_s'] > 0


def _softmax_row(impl, shape, direction):
    """(fn, make_inputs) of softmax along the last axis: 'fwd' (x) or 'bwd' (y, dy)."""
    def arrays(standard_normal, i):
        x = standard_normal(i)
        return (x,) if direction == 'fwd' else (x, standard_normal(i + 1))
    if impl == 'numpy':
        from gpuk.cpu_fallback import softmax_xent as twin
        fn = twin.softmax_fwd if direction == 'fwd' else twin.softmax_bwd
        return fn, lambda i: arrays(lambda s: np.random.default_rng(s).standard_normal(shape, dtype=np.float32), i)
    if impl in ('torch', 'torch-cuda'):
        import torch
        where = 'cuda' if impl == 'torch-cuda' else 'cpu'
        if direction == 'fwd':
            fn = lambda x: torch.softmax(x, dim=-1)   # noqa: E731
        else:
            fn = lambda y, dy: torch._softmax_backward_data(dy, y, -1, y.dtype)   # noqa: E731
        return fn, lambda i: arrays(lambda s: torch.randn(shape, device=where,
                                                          generator=torch.Generator(device=where).manual_seed(s)), i)
    import cupy
    from gpuk.kernels import softmax_xent
    from gpuk.kernels.cudnn import softmax as cudnn_softmax
    if impl == 'cudnn':
        fn = cudnn_softmax.softmax_fwd if direction == 'fwd' else cudnn_softmax.softmax_bwd
    elif direction == 'fwd':
        fn = lambda x: softmax_xent.softmax_fwd(x, runtime='cuda')   # noqa: E731
    else:
        fn = lambda y, dy: softmax_xent.softmax_bwd(y, dy, runtime='cuda')   # noqa: E731
    return fn, lambda i: arrays(lambda s: cupy.random.RandomState(s).standard_normal(shape, dtype=cupy.float32), i)


@pytest.mark.parametrize('impl', IMPLS)
@pytest.mark.parametrize('direction', ['fwd', 'bwd'])
@pytest.mark.parametrize('shape', SHAPES, ids=lambda s: '%dx%d' % s)
def test_softmax(benchmark, harness, impl, direction, shape):
    h.require(impl)
    fn, make = _softmax_row(impl, shape, direction)
    arrays_moved = 2 if direction == 'fwd' else 3
    nbytes = arrays_moved * 4 * shape[0] * shape[1]
    info = harness.run(benchmark, family='softmax', case='%s %dx%d' % ((direction,) + shape), impl=impl, fn=fn,
                       make_inputs=make, set_bytes=nbytes, bytes_moved=nbytes, dtype='float32')
    assert info['time_s'] > 0
