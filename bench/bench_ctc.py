"""CTC: loss + gradient on warp-ctc's benchmark suite, greedy and beam-search decoding.
gpuk vs cuDNN (cudnnCTCLoss_v8) vs torch (GPU and CPU) vs NumPy. GPU rows skip without a GPU; the
numpy rows are slow on the large cases (`-k numpy and small` for a quick check)."""
import numpy as np
import pytest

from bench import harness as h

# (T, L, A, N): warp-ctc's suite (T=150 with L=40/A=28 and L=20/A=5000, N=1..128),
# a long one and one with labels longer than a block of threads (L > 256).
LOSS_CASES = ([(150, 40, 28, n) for n in (1, 16, 32, 64, 128)] +
              [(150, 20, 5000, n) for n in (1, 16, 32, 64, 128)] +
              [(700, 200, 29, 32), (600, 280, 29, 8)])
IMPLS = ['gpuk', 'cudnn', 'torch-cuda', 'torch', 'numpy']


def _loss_inputs(xp, T, L, A, N, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, T, A)).astype(np.float32)
    labels = rng.integers(0, A - 1, (N, L))
    lengths = np.full(N, T), np.full(N, L)
    return (xp.asarray(x), labels) + lengths


def _loss_row(impl, case):
    T, L, A, N = case
    if impl == 'numpy':
        from gpuk.cpu_fallback import ctc as twin

        def loss_and_grad(x, labels, il, ll):
            loss, log_alpha, frame_lse = twin.ctc_loss_fwd(x, labels, il, ll)
            return twin.ctc_loss_bwd(x, labels, il, ll, log_alpha, frame_lse, loss, np.ones(N, np.float32))
        return loss_and_grad, lambda i: _loss_inputs(np, T, L, A, N, i)
    if impl in ('torch', 'torch-cuda'):
        import torch
        where = 'cuda' if impl == 'torch-cuda' else 'cpu'

        def make(i):
            x, labels, il, ll = _loss_inputs(np, T, L, A, N, i)
            return (torch.tensor(x, device=where).transpose(0, 1).requires_grad_(),
                    torch.tensor(labels, device=where), torch.tensor(il, device=where),
                    torch.tensor(ll, device=where))

        def loss_and_grad(x, labels, il, ll):
            lp = torch.log_softmax(x, 2)
            torch.nn.functional.ctc_loss(lp, labels, il, ll, blank=A - 1, reduction='sum').backward()
        return loss_and_grad, make
    import cupy
    from gpuk.kernels import ctc
    from gpuk.kernels.cudnn import ctc as cudnn_ctc

    def gpuk_loss_and_grad(x, labels, il, ll):   # the 'ctc' family's default: gpuk's kernels
        loss, log_alpha, frame_lse = ctc.ctc_loss_fwd(x, labels, il, ll, runtime='cuda')
        return ctc.ctc_loss_bwd(x, labels, il, ll, log_alpha, frame_lse, loss, cupy.ones(N, cupy.float32),
                                runtime='cuda')
    fn = cudnn_ctc.cudnn_ctc_loss if impl == 'cudnn' else gpuk_loss_and_grad
    return fn, lambda i: _loss_inputs(cupy, T, L, A, N, i)


def _run_loss(benchmark, harness, impl, case):
    h.require(impl)
    T, L, A, N = case
    fn, make = _loss_row(impl, case)
    nbytes = 2 * 4 * N * T * A
    info = harness.run(benchmark, family='ctc', case='loss+grad T=%d L=%d A=%d N=%d' % case, impl=impl, fn=fn,
                       make_inputs=make, set_bytes=nbytes, bytes_moved=nbytes, dtype='float32')
    assert info['time_s'] > 0


@pytest.mark.parametrize('impl', IMPLS)
@pytest.mark.parametrize('case', LOSS_CASES, ids=lambda c: 'T%d-L%d-A%d-N%d' % c)
def test_ctc_loss(benchmark, harness, impl, case):
    _run_loss(benchmark, harness, impl, case)


def _decode_inputs(xp, N, T, V, seed):
    x = np.random.default_rng(seed).standard_normal((N, T, V)).astype(np.float32)
    x -= np.log(np.sum(np.exp(x), axis=2, keepdims=True))
    return xp.asarray(x), np.full(N, T)


def _decoder(impl, name, **kwargs):
    if impl in ('cudnn', 'torch', 'torch-cuda'):
        pytest.skip('%s has no CTC decoder' % impl)
    if impl == 'numpy':
        from gpuk.cpu_fallback import ctc as twin
        return (lambda x, lengths: getattr(twin, name)(x, lengths, **kwargs)), np
    import cupy
    from gpuk.kernels import ctc as launchers
    return (lambda x, lengths: getattr(launchers, name)(x, lengths, runtime='cuda', **kwargs)), cupy


DECODE_CASES = [('greedy', 128, 1000, 29, 0), ('beam', 1, 500, 500, 10), ('beam', 1, 500, 500, 100),
                ('beam-small', 1, 20, 10, 4)]


@pytest.mark.parametrize('impl', IMPLS)
@pytest.mark.parametrize('kind, N, T, V, beam', DECODE_CASES, ids=lambda v: str(v))
def test_ctc_decode(benchmark, harness, impl, kind, N, T, V, beam):
    h.require(impl)
    if kind == 'greedy':
        fn, xp = _decoder(impl, 'ctc_greedy_decode')
    else:
        fn, xp = _decoder(impl, 'ctc_beam_search_decode', beam_width=beam)
    nbytes = 4 * N * T * V
    info = harness.run(benchmark, family='ctc_decode', case='%s N=%d T=%d V=%d beam=%d' % (kind, N, T, V, beam),
                       impl=impl, fn=fn, make_inputs=lambda i: _decode_inputs(xp, N, T, V, i), set_bytes=nbytes,
                       bytes_moved=nbytes, dtype='float32')
    assert info['time_s'] > 0
