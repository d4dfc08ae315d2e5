"""Dynamic performance counters of every kernel family, measured on the emulated runtime.

`measure(families=None)` runs each family's benchmark-like problems, scaled down so the whole
measurement takes seconds on a CPU, through the launchers on the emulated runtime with the
counters of emu_host.h on (instrumented builds, `emulated_runtime.counting()`), and returns one
record per (kernel, config): how the kernel's threads touch memory, not how fast it runs.

Record keys (docs/kernels.md, "Emulated performance counters"):
  kernel, source, family, config       the __global__ function, its .cu (repository-relative),
                                       its family and a short shape/dtype string
  launches                             launches of this kernel in one launcher call
  coalescing                           ideal 32-byte sectors / sectors moved, over the warp-level
                                       global requests (None without global accesses)
  global_requests, sectors_per_request
  global_bytes                         32 x sectors moved (load + store, SM <-> L2 granularity)
  requested_bytes                      bytes the threads asked for
  compulsory_bytes                     every array argument once: inputs read, outputs written
  bank_conflicts_per_request           extra shared-memory wavefronts per warp-level request
                                       (None without shared accesses)
  shared_requests, barriers, barriers_per_output (block barriers executed / output elements),
  atomics, host_syncs_per_call         device-to-host copies the launcher call made
"""
from collections import OrderedDict
from pathlib import Path

import numpy as np

from ..runtime import emulated_runtime
from ..runtime import get_runtime

REPO = Path(__file__).resolve().parents[3]
FAMILIES = ('elementwise', 'fused_elementwise', 'conv', 'conv_wgmma', 'conv_depthwise', 'conv_local', 'layout',
            'pooling', 'batchnorm', 'softmax_xent', 'ctc')


def _rng():
    return np.random.default_rng(0)


def _dev(array):
    """`array` copied where a device array would live (emulated_runtime.aligned_copy), as a
    benchmark's inputs already sit in device memory (NumPy's own 16-byte alignment would
    split rows that start on a sector on the GPU)."""
    return emulated_runtime.aligned_copy(array)


def _elementwise(rt):
    from .. import elementwise
    x = _dev(_rng().standard_normal((64, 8, 8, 32)).astype(np.float32))
    bias = _dev(_rng().standard_normal(32).astype(np.float32))
    yield 'copy f32 131072', lambda: elementwise.copy(x, runtime=rt)
    yield 'bias_act relu f32 64x8x8x32', lambda: elementwise.bias_act_fwd(x, bias, -1, 'relu', runtime=rt)


def _fused_elementwise(rt):
    from .. import elementwise
    x = _dev(_rng().standard_normal((64, 8, 8, 32)).astype(np.float32))
    bias = _dev(_rng().standard_normal(32).astype(np.float32))
    yield 'fused (x + bias) * 0.5, relu f32 64x8x8x32', lambda: elementwise.fused(_fused_bias_scale_relu(), [x, bias],
                                                                                   runtime=rt)


def _fused_bias_scale_relu():
    """A FusedProgram as the elementwise fusion pass makes one: (x + bias) * 0.5, then relu,
    over a bias broadcast along the last axis (one emulator compile, as one fused group)."""
    from gpuk.contracts.fused_program import FusedProgram, Instruction
    f32 = np.dtype(np.float32)
    return FusedProgram((f32, f32), (
        Instruction('{0} + {1}', (0, 1), f32, f32, np.add),
        Instruction('{0} * ({T})0.5', (2,), f32, f32, lambda a: a * np.float32(0.5)),
        Instruction('{0} > ({T})0 ? {0} : ({T})0', (3,), f32, f32, lambda a: np.maximum(a, np.float32(0)))), (4,))


def _conv(rt):
    """wgrad in 2 K splits (forced: K = 2 x 8 x 8 = 128 is 4 K tiles of the 32x32x32 FFMA tile,
    too few to split by the tile rules), so that conv_reduce_splits runs too."""
    from .. import conv
    from ..conv import tiles as conv_tiles
    from gpuk.contracts.geometry import conv_pads

    def split_in_two(x, dy, w, g):
        with conv_tiles.forced(splits=2):
            return conv.conv_wgrad(x, dy, w.shape, *g, runtime=rt)

    def operands(dtype):   # x, w, dy
        return (_dev(_rng().standard_normal((2, 8, 8, 32)).astype(dtype)),
                _dev((_rng().standard_normal((3, 3, 32, 64)) * 0.1).astype(dtype)),
                _dev(_rng().standard_normal((2, 8, 8, 64)).astype(dtype)))
    geometry = ((1, 1), (1, 1), conv_pads((8, 8), (3, 3), (1, 1), (1, 1), 'same'), 'channels_last')
    for dtype, name in ((np.float32, 'f32'), (np.float16, 'f16')):
        x, w, dy = operands(dtype)
        config = f'NHWC 2x8x8x32 -> 64, 3x3 same, {name}'
        yield f'fwd {config}', lambda x=x, w=w: conv.conv_fwd(x, w, *geometry, runtime=rt)
        yield f'dgrad {config}', lambda dy=dy, w=w, x=x: conv.conv_dgrad(dy, w, x.shape, *geometry, runtime=rt)
        yield f'wgrad {config}, 2 splits', lambda x=x, dy=dy, w=w: split_in_two(x, dy, w, geometry)
    # tf32: the forward rounds its filter first (conv_round_tf32). The config names tf32, not f32, so
    # these rows are joined only to records no f32 row matches (conv_round_tf32's own).
    x, w, _ = operands(np.float32)
    yield 'fwd NHWC 2x8x8x32 -> 64, 3x3 same, tf32', lambda: _under_tf32(lambda: conv.conv_fwd(x, w, *geometry,
                                                                                              runtime=rt))


def _under_tf32(call):
    """call() with the precision policy 'tf32' (float32 convolutions on tensor cores)."""
    from gpuk import config
    previous = config.precision()
    config.set_precision('tf32')
    try:
        return call()
    finally:
        config.set_precision(previous)


def _conv_wgmma(rt):
    """conv_wgmma.cu (the sm_90 path), forced on (the emulator has no architecture), on each
    tile of its table. dgrad with stride 2 (4 stride phases); wgrad in 2 splits, so that the
    reduce kernel runs too."""
    from .. import conv
    from ..conv import tiles as conv_tiles
    from ..conv import wgmma
    from gpuk.contracts.geometry import conv_pads
    x = _dev(_rng().standard_normal((2, 8, 8, 32)).astype(np.float16))
    w = _dev((_rng().standard_normal((3, 3, 32, 64)) * 0.1).astype(np.float16))
    geometry = ((1, 1), (1, 1), conv_pads((8, 8), (3, 3), (1, 1), (1, 1), 'same'), 'channels_last')
    strided = ((2, 2), (1, 1), conv_pads((8, 8), (3, 3), (2, 2), (1, 1), 'same'), 'channels_last')
    dy = _dev(_rng().standard_normal((2, 4, 4, 64)).astype(np.float16))
    x_big = _dev(_rng().standard_normal((2, 16, 16, 32)).astype(np.float16))   # K = 512: 4 K tiles to split
    dy_big = _dev(_rng().standard_normal((2, 16, 16, 64)).astype(np.float16))

    def forced(call, tile):
        def run():
            with wgmma.forced(True, tile=tile), conv_tiles.forced(splits=2):
                call()
        return run
    for tile in wgmma.TILE_NAMES:   # every tile of the table (C_out 64 would pick 128x64 only)
        yield f'fwd NHWC 2x8x8x32 -> 64, 3x3 same, f16, {tile} tile', forced(
            lambda: conv.conv_fwd(x, w, *geometry, runtime=rt), tile)
        yield f'dgrad NHWC 2x8x8x32 -> 64, 3x3 same stride 2, f16, {tile} tile', forced(
            lambda: conv.conv_dgrad(dy, w, x.shape, *strided, runtime=rt), tile)
        yield f'wgrad NHWC 2x16x16x32 -> 64, 3x3 same, 2 splits, f16, {tile} tile', forced(
            lambda: conv.conv_wgrad(x_big, dy_big, w.shape, *geometry, runtime=rt), tile)


def _conv_depthwise(rt):
    """channels_first wgrad in 2 pixel-tile splits (forced: its 16 x 16 strip tile leaves 2 tiles,
    too few to split by the launcher's rule), so that depthwise_reduce_splits runs too."""
    from ..conv import direct as conv_direct
    from ..conv import tiles as conv_tiles

    def wgrad(x, dy, w, g):
        with conv_tiles.forced(splits=2 if g[-1] == 'channels_first' else None):
            return conv_direct.depthwise_conv_wgrad(x, dy, w.shape, *g, runtime=rt)
    w = _dev(_rng().standard_normal((3, 3, 32, 1)).astype(np.float32))
    for data_format, name in (('channels_last', 'NHWC 2x16x16x32'), ('channels_first', 'NCHW 2x32x16x16')):
        shape = (2, 16, 16, 32) if data_format == 'channels_last' else (2, 32, 16, 16)
        x = _dev(_rng().standard_normal(shape).astype(np.float32))
        dy = _dev(_rng().standard_normal(shape).astype(np.float32))
        g = ((1, 1), (1, 1), ((1, 1), (1, 1)), data_format)
        config = f'{name}, 3x3 same, f32'
        yield f'fwd {config}', lambda x=x, g=g: conv_direct.depthwise_conv_fwd(x, w, *g, runtime=rt)
        yield f'dgrad {config}', lambda dy=dy, x=x, g=g: conv_direct.depthwise_conv_dgrad(dy, w, x.shape, *g,
                                                                                          runtime=rt)
        yield f'wgrad {config}' + (', 2 splits' if data_format == 'channels_first' else ''), \
            lambda x=x, dy=dy, g=g: wgrad(x, dy, w, g)


def _conv_local(rt):
    from ..conv import direct as conv_direct
    x = _dev(_rng().standard_normal((2, 10, 10, 8)).astype(np.float32))
    w = _dev((_rng().standard_normal((64, 3 * 3 * 8, 16)) * 0.1).astype(np.float32))
    window = ((3, 3), (1, 1), (8, 8), 'channels_last')
    dy = _dev(_rng().standard_normal((2, 8, 8, 16)).astype(np.float32))
    config = 'NHWC 2x10x10x8 -> 8x8x16, 3x3 valid, f32'
    yield f'fwd {config}', lambda: conv_direct.local_conv_fwd(x, w, *window, runtime=rt)
    yield f'dgrad {config}', lambda: conv_direct.local_conv_dgrad(dy, w, x.shape, *window, runtime=rt)
    yield f'wgrad {config}', lambda: conv_direct.local_conv_wgrad(x, dy, w.shape, *window, runtime=rt)


def _layout(rt):
    """The channels_first convolutions' transposes on a ResNet-50 stage-2 activation scaled down
    (batch 2, 64 channels, 28x28) and an RGB image (3 channels), each way; b32 is float32,
    b16 float16/bfloat16."""
    from .. import layout
    for dtype, name in ((np.float32, 'b32'), (np.float16, 'b16')):
        x = _dev(_rng().standard_normal((2, 64, 28, 28)).astype(dtype))
        y = _dev(np.moveaxis(x, 1, -1))
        yield f'NCHW -> NHWC 2x64x28x28 {name}', lambda x=x: layout.to_channels_last(x, runtime=rt)
        yield f'NHWC -> NCHW 2x28x28x64 {name}', lambda y=y: layout.to_channels_first(y, runtime=rt)
        rgb = _dev(_rng().standard_normal((2, 3, 32, 32)).astype(dtype))   # a first layer's input (transpose_planes_thin)
        yield f'NCHW -> NHWC 2x3x32x32 {name}', lambda rgb=rgb: layout.to_channels_last(rgb, runtime=rt)
        rgb_last = _dev(np.moveaxis(rgb, 1, -1))     # an RGB output or gradient
        yield f'NHWC -> NCHW 2x32x32x3 {name}', lambda y=rgb_last: layout.to_channels_first(y, runtime=rt)


def _pooling(rt):
    from .. import pooling
    x = _dev(_rng().standard_normal((2, 16, 16, 32)).astype(np.float32))
    geometry = ((2, 2), (2, 2), ((0, 0), (0, 0)), 'channels_last')
    dy = _dev(_rng().standard_normal((2, 8, 8, 32)).astype(np.float32))
    config = 'NHWC 2x16x16x32, 2x2/2, f32'
    yield f'max fwd {config}', lambda: pooling.max_pool_fwd(x, *geometry, runtime=rt)
    yield f'avg fwd {config}', lambda: pooling.avg_pool_fwd(x, *geometry, runtime=rt)
    argmax = pooling.max_pool_fwd(x, *geometry, runtime=rt)[1]
    yield f'max bwd {config}', lambda: pooling.max_pool_bwd(dy, argmax, x.shape, *geometry, runtime=rt)
    yield f'avg bwd {config}', lambda: pooling.avg_pool_bwd(dy, x.shape, *geometry, runtime=rt)
    # global average pooling (the window is the whole input): a reduction kernel per layout
    whole = ((16, 16), (16, 16), ((0, 0), (0, 0)))
    yield 'global avg fwd NHWC 2x16x16x32, f32', lambda: pooling.avg_pool_fwd(x, *whole, 'channels_last', runtime=rt)
    xc = _dev(x.transpose(0, 3, 1, 2))
    yield 'global avg fwd NCHW 2x32x16x16, f32', lambda: pooling.avg_pool_fwd(xc, *whole, 'channels_first',
                                                                              runtime=rt)
    # windows of more than 256 taps keep int32 argmax (17x17 = 289)
    big = ((17, 17), (17, 17), ((0, 0), (0, 0)), 'channels_last')
    xb = _dev(_rng().standard_normal((2, 17, 17, 16)).astype(np.float32))
    dyb = _dev(_rng().standard_normal((2, 1, 1, 16)).astype(np.float32))
    config = 'NHWC 2x17x17x16, 17x17/17 (int32 taps), f32'
    yield f'max fwd {config}', lambda: pooling.max_pool_fwd(xb, *big, runtime=rt)
    argmax_i32 = pooling.max_pool_fwd(xb, *big, runtime=rt)[1]
    yield f'max bwd {config}', lambda: pooling.max_pool_bwd(dyb, argmax_i32, xb.shape, *big, runtime=rt)


def _batchnorm(rt):
    from .. import batchnorm
    x = _dev(_rng().standard_normal((8, 8, 8, 64)).astype(np.float32))
    gamma, beta = _dev(np.ones(64, np.float32)), _dev(np.zeros(64, np.float32))
    axes = (0, 1, 2)
    config = 'NHWC 8x8x8x64 f32'
    # channels last within the L2: the single-kernel forward (one block per emulator thread)
    yield f'train fwd {config}', lambda: batchnorm.bn_train_fwd(x, gamma, beta, axes, 1e-3, runtime=rt)
    yield f'train fwd {config}, split path', lambda: batchnorm.bn_train_fwd(x, gamma, beta, axes, 1e-3, runtime=rt,
                                                                            single_kernel=False)
    _, mean, _, inv_std = batchnorm.bn_train_fwd(x, gamma, beta, axes, 1e-3, runtime=rt)
    dy = _dev(_rng().standard_normal(x.shape).astype(np.float32))
    yield f'bwd {config}', lambda: batchnorm.bn_bwd(dy, x, gamma, mean, inv_std, axes, runtime=rt)
    yield f'infer fwd {config}', lambda: batchnorm.bn_infer_fwd(x, mean, inv_std, gamma, beta, 1e-3, -1, runtime=rt)
    moving_mean, moving_var = _dev(np.zeros(64, np.float32)), _dev(np.ones(64, np.float32))
    yield f'train fwd, moving averages {config}', lambda: batchnorm.bn_train_fwd(
        x, gamma, beta, axes, 1e-3, 'linear', moving_mean, moving_var, 0.01, runtime=rt)
    yield f'train fwd, moving averages {config}, split path', lambda: batchnorm.bn_train_fwd(
        x, gamma, beta, axes, 1e-3, 'linear', moving_mean, moving_var, 0.01, runtime=rt, single_kernel=False)
    y_relu = batchnorm.bn_train_fwd(x, gamma, beta, axes, 1e-3, 'relu', runtime=rt)[0]
    yield f'bwd relu {config}', lambda: batchnorm.bn_bwd(dy, x, gamma, mean, inv_std, axes, activation='relu',
                                                         y=y_relu, runtime=rt)
    xc = _dev(x.transpose(0, 3, 1, 2))
    dyc = _dev(dy.transpose(0, 3, 1, 2))
    config = 'NCHW 8x64x8x8 f32'
    yield f'train fwd {config}', lambda: batchnorm.bn_train_fwd(xc, gamma, beta, (0, 2, 3), 1e-3, runtime=rt)
    _, mean_c, _, inv_std_c = batchnorm.bn_train_fwd(xc, gamma, beta, (0, 2, 3), 1e-3, runtime=rt)
    yield f'bwd {config}', lambda: batchnorm.bn_bwd(dyc, xc, gamma, mean_c, inv_std_c, (0, 2, 3), runtime=rt)
    yc_relu = batchnorm.bn_train_fwd(xc, gamma, beta, (0, 2, 3), 1e-3, 'relu', runtime=rt)[0]
    yield f'bwd relu {config}', lambda: batchnorm.bn_bwd(dyc, xc, gamma, mean_c, inv_std_c, (0, 2, 3),
                                                         activation='relu', y=yc_relu, runtime=rt)


def _softmax_xent(rt):
    from .. import softmax_xent
    logits = _dev(_rng().standard_normal((64, 1000)).astype(np.float32))
    labels = _dev(_rng().integers(0, 1000, 64))
    config = '64x1000 f32'
    yield f'softmax fwd {config}', lambda: softmax_xent.softmax_fwd(logits, runtime=rt)
    y = softmax_xent.softmax_fwd(logits, runtime=rt)
    yield f'softmax bwd {config}', lambda: softmax_xent.softmax_bwd(y, logits, runtime=rt)
    yield f'sparse xent fwd {config}', lambda: softmax_xent.sparse_softmax_xent_fwd(logits, labels, runtime=rt)
    loss, lse = softmax_xent.sparse_softmax_xent_fwd(logits, labels, runtime=rt)
    dloss = _dev(np.ones(64, np.float32))
    yield f'sparse xent bwd {config}', lambda: softmax_xent.sparse_softmax_xent_bwd(logits, labels, lse, dloss,
                                                                                  runtime=rt)
    target = softmax_xent.softmax_fwd(_dev(logits[::-1]), runtime=rt)
    yield f'xent fwd {config}', lambda: softmax_xent.softmax_xent_fwd(logits, target, runtime=rt)
    yield f'log_softmax fwd {config}', lambda: softmax_xent.log_softmax_fwd(logits, runtime=rt)
    yield f'categorical probs fwd {config}', lambda: softmax_xent.categorical_xent_probs_fwd(y, target, runtime=rt)
    # short rows: several per warp (sub-warp groups)
    small = _dev(_rng().standard_normal((512, 10)).astype(np.float32))
    small_target = softmax_xent.softmax_fwd(_dev(small[::-1]), runtime=rt)
    small_labels = _dev(_rng().integers(0, 10, 512))
    small_lse = softmax_xent.softmax_xent_fwd(small, small_target, runtime=rt)[1]
    ones = _dev(np.ones(512, np.float32))
    yield 'xent fwd 512x10 f32', lambda: softmax_xent.softmax_xent_fwd(small, small_target, runtime=rt)
    yield 'xent bwd 512x10 f32', lambda: softmax_xent.softmax_xent_bwd(small, small_target, small_lse, ones,
                                                                      runtime=rt)
    yield 'sparse xent fwd 512x10 f32', lambda: softmax_xent.sparse_softmax_xent_fwd(small, small_labels, runtime=rt)
    yield 'xent bwd 64x1000 f32', lambda: softmax_xent.softmax_xent_bwd(logits, target, lse, dloss, runtime=rt)
    yield 'xent dtarget 64x1000 f32', lambda: softmax_xent.softmax_xent_dtarget(logits, lse, dloss, runtime=rt)
    bits = _dev((_rng().random((64, 1000)) < 0.5).astype(np.float32))
    yield f'binary logits fwd {config}', lambda: softmax_xent.binary_xent_logits_fwd(logits, bits, runtime=rt)
    yield f'binary logits bwd {config}', lambda: softmax_xent.binary_xent_logits_bwd(logits, bits, logits, runtime=rt)


def _ctc(rt):
    from .. import ctc
    steps, batch, classes = 24, 4, 12
    logits = _dev(_rng().standard_normal((batch, steps, classes)).astype(np.float32))
    labels = _dev(_rng().integers(0, classes - 1, (batch, 6)))
    input_lengths = _dev(np.full(batch, steps, np.int64))
    label_lengths = _dev(np.full(batch, 6, np.int64))
    config = f'batch {batch}, {steps} steps, {classes} classes, labels 6, f32'
    args = (logits, labels, input_lengths, label_lengths)
    yield f'loss fwd {config}', lambda: ctc.ctc_loss_fwd(*args, runtime=rt)
    loss, log_alpha, frame_lse = ctc.ctc_loss_fwd(*args, runtime=rt)
    yield f'loss bwd {config}', lambda: ctc.ctc_loss_bwd(*args, log_alpha, frame_lse, loss,
                                                         _dev(np.ones_like(loss)), runtime=rt)
    log_probs = _dev(logits - np.log(np.exp(logits).sum(-1, keepdims=True)))
    yield f'greedy {config}', lambda: ctc.ctc_greedy_decode(log_probs, input_lengths, runtime=rt)
    # the beam search's emulated time grows with the steps (a block per sequence, serial over
    # time): its first 12 / 16 steps show the same access pattern at a third of the cost
    short = _dev(log_probs[:, :12])
    yield f'beam 8 {config.replace(f"{steps} steps", "12 steps")}', lambda: ctc.ctc_beam_search_decode(
        short, np.full(batch, 12, np.int32), 8, 1, runtime=rt)
    # closer to warp-ctc's character models: 29 classes, 20-label transcripts (41 states)
    steps, batch, classes, width = 60, 2, 29, 20
    logits = _dev(_rng().standard_normal((batch, steps, classes)).astype(np.float32))
    labels = _dev(_rng().integers(0, classes - 1, (batch, width)))
    args = (logits, labels, _dev(np.full(batch, steps, np.int64)), _dev(np.full(batch, width, np.int64)))
    config = f'batch {batch}, {steps} steps, {classes} classes, labels {width}, f32'
    yield f'loss fwd {config}', lambda: ctc.ctc_loss_fwd(*args, runtime=rt)
    loss, log_alpha, frame_lse = ctc.ctc_loss_fwd(*args, runtime=rt)
    yield f'loss bwd {config}', lambda: ctc.ctc_loss_bwd(*args, log_alpha, frame_lse, loss,
                                                         _dev(np.ones_like(loss)), runtime=rt)
    # the graph op's value check (ctc_check.cu), on the float labels Keras feeds
    keras_labels = _dev(_rng().integers(0, classes - 1, (batch, width)).astype(np.float32))
    yield f'check labels {config}', lambda: ctc.ctc_check_loss_values(keras_labels, args[2], args[3], steps,
                                                                      classes, runtime=rt)
    log_probs = _dev(logits - np.log(np.exp(logits).sum(-1, keepdims=True)))
    short = _dev(log_probs[:, :16])
    yield f'beam 10 {config.replace(f"{steps} steps", "16 steps")}', lambda: ctc.ctc_beam_search_decode(
        short, _dev(np.full(batch, 16, np.int32)), 10, 1, runtime=rt)


_PROBLEMS = {'elementwise': _elementwise, 'fused_elementwise': _fused_elementwise, 'conv': _conv,
             'conv_wgmma': _conv_wgmma, 'conv_depthwise': _conv_depthwise, 'conv_local': _conv_local,
             'layout': _layout, 'pooling': _pooling,
             'batchnorm': _batchnorm, 'softmax_xent': _softmax_xent, 'ctc': _ctc}


def _source_name(path):
    path = Path(path).resolve()
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def _ratio(num, den):
    return float(num) / float(den) if den else None


def summarize(launches, family, config, host_syncs=0):
    """Records (one per kernel) from the launch records of one launcher call."""
    per_kernel = OrderedDict()
    for launch in launches:
        key = (launch['kernel'], _source_name(launch['source']))
        total = per_kernel.setdefault(key, {'launches': 0, 'compulsory_bytes': 0, 'outputs': 0,
                                            **{name: 0 for name in emulated_runtime.COUNTER_FIELDS}})
        total['launches'] += 1
        total['compulsory_bytes'] += sum(nbytes for _, nbytes, _, _ in launch['arrays'])
        total['outputs'] += sum(size for _, _, size, const in launch['arrays'] if not const)
        for name in emulated_runtime.COUNTER_FIELDS:
            total[name] += launch[name]
    records = []
    for (kernel, source), t in per_kernel.items():
        records.append({
            'kernel': kernel, 'source': source, 'family': family, 'config': config, 'launches': t['launches'],
            'coalescing': _ratio(t['global_ideal_sectors'], t['global_sectors']),
            'global_requests': t['global_requests'],
            'sectors_per_request': _ratio(t['global_sectors'], t['global_requests']),
            'global_bytes': 32 * t['global_sectors'],
            'requested_bytes': t['global_load_bytes'] + t['global_store_bytes'],
            'compulsory_bytes': t['compulsory_bytes'],
            'bank_conflicts_per_request': _ratio(t['shared_wavefronts'] - t['shared_ideal_wavefronts'],
                                                 t['shared_requests']),
            'shared_requests': t['shared_requests'],
            'barriers': t['barriers'],
            'barriers_per_output': _ratio(t['barriers'], t['outputs']),
            'atomics': t['atomics'],
            'host_syncs_per_call': host_syncs,
        })
    return records


def measure(families=None):
    """One record per (kernel, config) for `families` (default: all of FAMILIES)."""
    families = FAMILIES if families is None else tuple(families)
    unknown = [f for f in families if f not in _PROBLEMS]
    if unknown:
        raise ValueError(f"measure: families must be among {FAMILIES}, got {unknown}")
    rt = get_runtime('emulate')
    records = []
    with emulated_runtime.counting() as launches:   # the set-up launches load instrumented builds too
        for family in families:
            for config, call in _PROBLEMS[family](rt):
                before, first = rt.host_syncs, len(launches)
                call()
                records.extend(summarize(launches[first:], family, config, rt.host_syncs - before))
    return records
