"""The NumPy twins against PyTorch on the CPU: forward + backward per family.

Each row runs one training step of a layer: the forward pass and every gradient the
layer needs (conv: fwd, dgrad, wgrad; pooling: fwd, bwd; batch norm: training fwd, bwd;
cross-entropy: loss, dlogits; CTC: loss, dlogits), on the small ResNet / MobileNetV2
layers at batch 8 (NHWC float32) that users run without a GPU. The torch rows do the
same math with torch.nn.functional and autograd, in channels_last (oneDNN's fast layout
for conv, depthwise, pooling and batch norm on the CPU), with torch.set_num_threads set
to the thread count of NumPy's BLAS, so both sides use the same cores.

``python -m bench`` reports NumPy time / torch time per family (the goal is <= 2).
``python -m bench.bench_cpu``
times every case several times, alternating numpy and torch, and prints a markdown
table of the medians (the host is shared, so one pytest run is noisy).
"""
import argparse
import datetime
import math
import os
import statistics
import sys

import numpy as np
import pytest

from bench import harness as h
from gpuk.cpu_fallback import batchnorm, conv, ctc, parallel, pooling, softmax_xent

# torch's OpenMP threads spin at barriers by default; on a host whose cores are shared,
# a spinning thread waits for a descheduled one and torch's small ops measured 30-80x
# slower (e.g. cross-entropy 48 ms instead of 0.8 ms). Passive waiting is torch's best
# setting here; it must be set before torch (imported lazily below) loads OpenMP.
os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')

BATCH = 8
GOAL_RATIO = 2.0


def numpy_blas_threads():
    """Threads NumPy's OpenBLAS uses (asked from the library; else its env vars or the CPUs)."""
    threads = parallel.blas_threads()
    if threads is not None:
        return threads
    for variable in ('OPENBLAS_NUM_THREADS', 'OMP_NUM_THREADS'):
        if os.environ.get(variable, '').isdigit():
            return int(os.environ[variable])
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()


def _same_pads(size, k, stride):
    """TensorFlow 'same' (before, after) for one spatial dim."""
    out = -(-size // stride)
    total = max((out - 1) * stride + k - size, 0)
    return total // 2, total - total // 2


# ---------------------------------------------------------------- cases

class Case:
    """One layer: its family, label, and how to build the numpy and torch rows."""

    def __init__(self, family, label, build, set_bytes):
        self.family, self.label, self.build, self.set_bytes = family, label, build, set_bytes

    @property
    def id(self):
        return '%s %s' % (self.family, self.label)


def _normal(rng, shape):
    return rng.standard_normal(shape, dtype=np.float32)


def _normals(*shapes):
    """A case's make_numpy for inputs drawn from a standard normal: i -> one float32 array per
    shape, from the generator seeded i."""
    def make_numpy(i):
        rng = np.random.default_rng(i)
        return tuple(_normal(rng, shape) for shape in shapes)
    return make_numpy


def _conv_build(shapes, numpy_step, weight_axes, torch_forward):
    """build() of a conv family case: x, w, dy drawn from a standard normal (``shapes``); the
    numpy row runs ``numpy_step``, the torch row ``torch_forward(F, x, w)`` (F is
    torch.nn.functional; w permuted to ``weight_axes``) and its backward from dy."""
    def build(impl):
        make_numpy = _normals(*shapes)
        if impl == 'numpy':
            return numpy_step, make_numpy
        import torch

        def make_torch(i):
            x, w, dy = make_numpy(i)
            return (_torch_nhwc(x, True), _torch_weight(w, *weight_axes), _torch_nhwc(dy, False))

        def step(x, w, dy):
            x.grad = w.grad = None
            torch_forward(torch.nn.functional, x, w).backward(dy)
        return step, make_torch
    return build


def _conv_case(label, hw, c_in, c_out, k, stride):
    """Ordinary conv, 'same' padding (symmetric where torch can express it)."""
    out = -(-hw // stride)
    pad = _same_pads(hw, k, stride)
    pads = (pad, pad)
    x_shape, w_shape, y_shape = (BATCH, hw, hw, c_in), (k, k, c_in, c_out), (BATCH, out, out, c_out)
    geometry = ((stride, stride), (1, 1), pads, 'channels_last')

    def numpy_step(x, w, dy):
        conv.conv_fwd(x, w, *geometry)
        conv.conv_dgrad(dy, w, x_shape, *geometry)
        conv.conv_wgrad(x, dy, w_shape, *geometry)
    conv_build = _conv_build((x_shape, w_shape, y_shape), numpy_step, (3, 2, 0, 1),
                             lambda F, x, w: F.conv2d(x, w, stride=stride, padding=pad[0]))

    def build(impl):
        if impl != 'numpy' and pad[0] != pad[1]:
            raise ValueError('_conv_case: asymmetric padding %s has no torch conv2d equivalent' % (pad,))
        return conv_build(impl)
    return Case('conv', label, build, 4 * sum(math.prod(s) for s in (x_shape, w_shape, y_shape)))


def _conv_transpose_case(label, hw_in, c_in, c_out, k, stride):
    """conv_transpose (= conv_dgrad forward) from hw_in^2 x c_in to (stride hw_in)^2 x c_out.

    Its backward is the forward conv (dx) and conv_wgrad with the roles swapped (dw).
    torch's padding=1, output_padding=1 is the geometry of pads (1, 1) on the big side.
    """
    hw_out = hw_in * stride
    pads = ((k // 2, k // 2),) * 2
    small_shape, w_shape, big_shape = (BATCH, hw_in, hw_in, c_in), (k, k, c_out, c_in), (BATCH, hw_out, hw_out, c_out)
    geometry = ((stride, stride), (1, 1), pads, 'channels_last')

    def numpy_step(x, w, dy):
        conv.conv_dgrad(x, w, big_shape, *geometry)       # the transpose conv itself
        conv.conv_fwd(dy, w, *geometry)                   # its dx
        conv.conv_wgrad(dy, x, w_shape, *geometry)        # its dw
    # torch's transpose weight is (C_in of the transpose, C_out, kh, kw)
    build = _conv_build((small_shape, w_shape, big_shape), numpy_step, (3, 2, 0, 1),
                        lambda F, x, w: F.conv_transpose2d(x, w, stride=stride, padding=k // 2,
                                                           output_padding=stride - 1))
    return Case('conv', label, build, 4 * sum(math.prod(s) for s in (small_shape, w_shape, big_shape)))


def _depthwise_case(label, hw, channels):
    x_shape, w_shape = (BATCH, hw, hw, channels), (3, 3, channels, 1)
    geometry = ((1, 1), (1, 1), ((1, 1), (1, 1)), 'channels_last')

    def numpy_step(x, w, dy):
        conv.depthwise_conv_fwd(x, w, *geometry)
        conv.depthwise_conv_dgrad(dy, w, x_shape, *geometry)
        conv.depthwise_conv_wgrad(x, dy, w_shape, *geometry)
    build = _conv_build((x_shape, w_shape, x_shape), numpy_step, (2, 3, 0, 1),
                        lambda F, x, w: F.conv2d(x, w, padding=1, groups=channels))
    return Case('depthwise', label, build, 4 * (2 * math.prod(x_shape) + math.prod(w_shape)))


def _pool_case(label, mode, hw, channels, k, stride, pad):
    out = (hw + 2 * pad - k) // stride + 1
    x_shape, y_shape = (BATCH, hw, hw, channels), (BATCH, out, out, channels)
    geometry = ((k, k), (stride, stride), ((pad, pad), (pad, pad)), 'channels_last')

    def build(impl):
        make_numpy = _normals(x_shape, y_shape)
        if impl == 'numpy':
            if mode == 'max':
                def step(x, dy):
                    _, argmax = pooling.max_pool_fwd(x, *geometry)
                    pooling.max_pool_bwd(dy, argmax, x_shape, *geometry)
            else:
                def step(x, dy):
                    pooling.avg_pool_fwd(x, *geometry)
                    pooling.avg_pool_bwd(dy, x_shape, *geometry)
            return step, make_numpy
        import torch
        pool = torch.nn.functional.max_pool2d if mode == 'max' else torch.nn.functional.avg_pool2d

        def make_torch(i):
            x, dy = make_numpy(i)
            return _torch_nhwc(x, True), _torch_nhwc(dy, False)

        def step(x, dy):
            x.grad = None
            pool(x, k, stride, pad).backward(dy)
        return step, make_torch
    return Case('pool', label, build, 4 * (math.prod(x_shape) + math.prod(y_shape)))


def _batchnorm_case(label, hw, channels):
    x_shape = (BATCH, hw, hw, channels)

    def build(impl):
        def make_numpy(i):
            rng = np.random.default_rng(i)
            return (_normal(rng, x_shape), rng.uniform(0.5, 1.5, channels).astype(np.float32),
                    _normal(rng, (channels,)), _normal(rng, x_shape))
        if impl == 'numpy':
            def step(x, gamma, beta, dy):
                _, mean, _, inv_std = batchnorm.bn_train_fwd(x, gamma, beta, (0, 1, 2), 1e-3)
                batchnorm.bn_bwd(dy, x, gamma, mean, inv_std, (0, 1, 2))
            return step, make_numpy
        import torch

        def make_torch(i):
            x, gamma, beta, dy = make_numpy(i)
            return (_torch_nhwc(x, True), torch.from_numpy(gamma).requires_grad_(),
                    torch.from_numpy(beta).requires_grad_(), _torch_nhwc(dy, False))

        def step(x, gamma, beta, dy):
            x.grad = gamma.grad = beta.grad = None
            torch.nn.functional.batch_norm(x, None, None, gamma, beta, training=True, eps=1e-3).backward(dy)
        return step, make_torch
    return Case('batchnorm', label, build, 4 * 2 * math.prod(x_shape))


def _xent_case(label, rows, classes, sparse):
    def build(impl):
        def make_numpy(i):
            rng = np.random.default_rng(i)
            logits = _normal(rng, (rows, classes))
            if sparse:
                return logits, rng.integers(0, classes, rows)
            target = rng.random((rows, classes), dtype=np.float32)
            return logits, target / target.sum(axis=1, keepdims=True)
        dloss = np.ones(rows, np.float32)
        if impl == 'numpy':
            if sparse:
                def step(logits, labels):
                    _, lse = softmax_xent.sparse_softmax_xent_fwd(logits, labels)
                    softmax_xent.sparse_softmax_xent_bwd(logits, labels, lse, dloss)
            else:
                def step(logits, target):
                    _, lse = softmax_xent.softmax_xent_fwd(logits, target)
                    softmax_xent.softmax_xent_bwd(logits, target, lse, dloss)
            return step, make_numpy
        import torch

        def make_torch(i):
            logits, target = make_numpy(i)
            return torch.from_numpy(logits).requires_grad_(), torch.from_numpy(target)

        def step(logits, target):
            logits.grad = None
            torch.nn.functional.cross_entropy(logits, target, reduction='sum').backward()
        return step, make_torch
    return Case('softmax_xent', label, build, 4 * rows * classes * (1 if sparse else 2))


def _ctc_case(label, steps, width, classes, batch):
    def build(impl):
        def make_numpy(i):
            rng = np.random.default_rng(i)
            return (_normal(rng, (batch, steps, classes)), rng.integers(0, classes - 1, (batch, width)),
                    np.full(batch, steps), np.full(batch, width))
        dloss = np.ones(batch, np.float32)
        if impl == 'numpy':
            def step(logits, labels, input_lengths, label_lengths):
                loss, log_alpha, frame_lse = ctc.ctc_loss_fwd(logits, labels, input_lengths, label_lengths)
                ctc.ctc_loss_bwd(logits, labels, input_lengths, label_lengths, log_alpha, frame_lse, loss, dloss)
            return step, make_numpy
        import torch

        def make_torch(i):
            logits, labels, input_lengths, label_lengths = make_numpy(i)
            # torch's ctc_loss takes (T, N, A) log-probabilities
            return (torch.from_numpy(logits).transpose(0, 1).requires_grad_(), torch.from_numpy(labels),
                    torch.from_numpy(input_lengths), torch.from_numpy(label_lengths))

        def step(logits, labels, input_lengths, label_lengths):
            logits.grad = None
            torch.nn.functional.ctc_loss(torch.log_softmax(logits, 2), labels, input_lengths, label_lengths,
                                         blank=classes - 1, reduction='sum').backward()
        return step, make_torch
    return Case('ctc', label, build, 4 * batch * steps * classes)


def _torch_nhwc(array, requires_grad):
    """An NHWC NumPy array as a torch NCHW tensor in channels_last memory (no copy)."""
    import torch
    tensor = torch.from_numpy(array).permute(0, 3, 1, 2)
    return tensor.requires_grad_() if requires_grad else tensor


def _torch_weight(w, *axes):
    """An (kh, kw, ., .) NumPy kernel as torch's (., ., kh, kw) weight (``axes`` order), in
    channels_last memory, requiring its gradient."""
    import torch
    return torch.from_numpy(w).permute(*axes).contiguous(memory_format=torch.channels_last).requires_grad_()


CASES = [
    _conv_case('3x3 N=8 56^2x64->64', 56, 64, 64, 3, 1),
    _conv_case('3x3 N=8 28^2x128->128', 28, 128, 128, 3, 1),
    _conv_case('3x3 N=8 14^2x256->256', 14, 256, 256, 3, 1),
    _conv_case('1x1 N=8 14^2x256->1024', 14, 256, 1024, 1, 1),
    _conv_case('1x1/2 N=8 28^2x256->512', 28, 256, 512, 1, 2),
    _conv_transpose_case('transpose 3x3/2 N=8 14^2x256->28^2x128', 14, 256, 128, 3, 2),
    _depthwise_case('3x3 N=8 56^2x144', 56, 144),
    _depthwise_case('3x3 N=8 28^2x240', 28, 240),
    _pool_case('max 3x3/2 pad 1 N=8 112^2x64', 'max', 112, 64, 3, 2, 1),
    _pool_case('global avg N=8 7^2x512', 'avg', 7, 512, 7, 1, 0),
    _batchnorm_case('train N=8 56^2x64', 56, 64),
    _batchnorm_case('train N=8 14^2x256', 14, 256),
    _xent_case('dense (256, 1000)', 256, 1000, sparse=False),
    _xent_case('sparse (256, 1000)', 256, 1000, sparse=True),
    _xent_case('dense (64, 32000)', 64, 32000, sparse=False),
    _xent_case('sparse (64, 32000)', 64, 32000, sparse=True),
    _ctc_case('T=150 L=40 A=28 N=16', 150, 40, 28, 16),
]


def set_torch_threads():
    import torch
    torch.set_num_threads(numpy_blas_threads())


@pytest.mark.parametrize('case, impl', [(c, impl) for c in CASES for impl in h.CPU_IMPLS],
                         ids=['%s-%s' % (c.id, impl) for c in CASES for impl in h.CPU_IMPLS])
def test_cpu_step(benchmark, harness, case, impl):
    h.require(impl)
    if impl == 'torch':
        set_torch_threads()
    fn, make_inputs = case.build(impl)
    info = harness.run(benchmark, family='cpu_' + case.family, case=case.label, impl=impl, fn=fn,
                       make_inputs=make_inputs, set_bytes=case.set_bytes, dtype='float32')
    info['threads'] = numpy_blas_threads()
    assert info['time_s'] > 0


# ---------------------------------------------------------------- table

def measure(cases, repeats, min_time):
    """{case id: {'numpy': [median per repeat], 'torch': [...]}}, numpy and torch alternating."""
    impls = [impl for impl in h.CPU_IMPLS if h.skip_reason(impl) is None]
    if 'torch' in impls:
        set_torch_threads()
    results = {c.id: {impl: [] for impl in impls} for c in cases}
    for _ in range(repeats):
        for case in cases:
            for impl in impls:
                fn, make_inputs = case.build(impl)
                pool = [make_inputs(i) for i in range(h.pool_size(case.set_bytes, h.CPU_CACHE_BYTES))]
                results[case.id][impl].append(statistics.median(h.time_cpu(fn, pool, min_time=min_time)))
    return results


def markdown_table(cases, results):
    lines = ['| family | case | numpy ms | torch ms | numpy / torch | spread (max/min of %d repeats) |'
             % len(next(iter(results.values()))['numpy']),
             '|---|---|---:|---:|---:|---|']
    for case in cases:
        row = results[case.id]
        numpy_ms = 1e3 * statistics.median(row['numpy'])
        torch_ms = 1e3 * statistics.median(row['torch']) if row.get('torch') else None
        spread = ', '.join('%s %.2f' % (impl, max(v) / min(v)) for impl, v in row.items())
        ratio = 'n/a'
        if torch_ms:
            ratio = '%.2f%s' % (numpy_ms / torch_ms, ' (> %g)' % GOAL_RATIO if numpy_ms > GOAL_RATIO * torch_ms else '')
        lines.append('| %s | %s | %.2f | %s | %s | %s |' % (
            case.family, case.label, numpy_ms, '%.2f' % torch_ms if torch_ms else 'n/a', ratio, spread))
    return '\n'.join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m bench.bench_cpu',
                                     description='Times every case, prints a markdown table of medians.')
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--min-time', type=float, default=0.3, help='seconds per timing of a row')
    parser.add_argument('-k', default='', help='only cases whose id contains this text')
    args = parser.parse_args(argv)
    cases = [c for c in CASES if args.k in c.id]
    if not cases:
        raise SystemExit('bench_cpu: no case id contains %r' % args.k)
    results = measure(cases, args.repeats, args.min_time)
    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        torch_version = 'absent'
    print('CPU: %s; threads: %d (NumPy BLAS and torch); NumPy %s; torch %s; %s'
          % (h.cpu_name(), numpy_blas_threads(), np.__version__, torch_version,
             datetime.date.today().isoformat()))
    print(markdown_table(cases, results))
    return 0


if __name__ == '__main__':
    sys.exit(main())
