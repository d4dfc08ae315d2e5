"""One representative launch of each kernel family, for Nsight Compute (bench/gpu_session.sh, part `ncu`).

    ncu --profile-from-start off --nvtx --section SpeedOfLight ... python3 -m bench.ncu_cases
    python -m bench.ncu_cases --list
    python -m bench.ncu_cases --cases conv_fwd,ctc_loss --impl cudnn

Each case is one benchmark row of bench/ (the same row builder, the same shape as that row's
case, named in CASES): its inputs are made and the call is run ``--warmup`` times first
(module loads, NVRTC, plans and cuDNN's heuristics stay out of the profile), then once more
between cudaProfilerStart and cudaProfilerStop inside an NVTX range named after the case, so
``ncu --profile-from-start off`` profiles exactly the kernels of that one call (a case may
launch several: a split-K reduce, a layout transpose, CuPy's zero fills) and ``--nvtx`` names
the range in the report. It prints one line per case with the number of gpuk launches, so the
report's kernels can be told apart where NVTX is not available.

``--small`` swaps every shape for a tiny one (the GPU rehearsal runs this script in CI:
tests/bench/test_gpu_session.py); ``--impl cudnn`` profiles cuDNN's kernels on the same shapes,
where the row has a cuDNN implementation.
"""
import argparse
import contextlib
import importlib
import sys

from bench import bench_batchnorm, bench_conv, bench_ctc, bench_pooling, bench_softmax_xent, runs


class NoImplementation(Exception):
    """The case has no implementation for the asked impl (cuDNN's softmax cross-entropy)."""


def _case(cases, suffix):
    """The bench_conv case whose name ends with ``suffix``."""
    (case,) = [c for c in cases if c[0].endswith(suffix)]
    return case


# bench_conv's (name, N, spatial, C_in, C_out, kernel, strides): ResNet-50's res3 3x3 at N=32.
CONV = _case(bench_conv.RESNET_CASES, 'N=32 res3 3x3')
CONV_SMALL = ('small conv N=1 6^2 8-8 k=3', 1, (6, 6), 8, 8, (3, 3), (1, 1))
DEPTHWISE = _case(bench_conv.DEPTHWISE_CASES, 'N=32 56^2x144')   # (name, N, spatial, C)
DEPTHWISE_SMALL = ('small dw N=1 6^2x8', 1, (6, 6), 8)
BN, BN_SMALL = (256, 56, 256), (2, 6, 8)   # (N, H=W, C), NHWC
XENT, XENT_SMALL = (4096, 1000), (4, 33)
CTC, CTC_SMALL = (150, 40, 28, 32), (12, 3, 6, 2)   # (T, L, A, N)
POOL_N_SMALL = 1


def _conv(pass_name, dtype='float32'):
    def build(impl, small):
        case = CONV_SMALL if small else CONV
        fn, make = bench_conv._conv_row(impl, pass_name, *case[1:], dtype)[:2]
        return '%s %s %s' % (case[0], pass_name, dtype), fn, make
    return build


def _depthwise(pass_name):
    def build(impl, small):
        case = DEPTHWISE_SMALL if small else DEPTHWISE
        fn, make = bench_conv._depthwise_row(impl, pass_name, *case[1:], 'float32')[:2]
        return '%s %s float32' % (case[0], pass_name), fn, make
    return build


def _pool(direction):
    def build(impl, small):
        fn, make, _, _, label = bench_pooling.pool_row('max3x3s2', 'float32', direction, 'channels_last', impl,
                                                       n=POOL_N_SMALL if small else None)
        return label, fn, make
    return build


def _batchnorm(op):
    def build(impl, small):
        fn, make, _, _, label = bench_batchnorm.bn_row(BN_SMALL if small else BN, op, 'float32', 'channels_last',
                                                       impl)
        return label, fn, make
    return build


def _softmax_xent(impl, small):
    if impl == 'cudnn':
        raise NoImplementation('cuDNN 9 has no fused softmax cross-entropy')
    shape = XENT_SMALL if small else XENT
    fn, make = bench_softmax_xent._xent_row(impl, shape)
    return 'softmax_xent fwd %dx%d float32' % shape, fn, make


def _ctc_loss(impl, small):
    case = CTC_SMALL if small else CTC
    fn, make = bench_ctc._loss_row(impl, case)
    return 'ctc loss+grad T=%d L=%d A=%d N=%d' % case, fn, make


# case -> build(impl, small) -> (label, fn, make_inputs): one call of fn(*make_inputs(0)) is profiled
CASES = {
    'conv_fwd': _conv('fwd'),
    'conv_dgrad': _conv('dgrad'),
    'conv_wgrad': _conv('wgrad'),
    'conv_fwd_bf16': _conv('fwd', 'bfloat16'),
    'depthwise_fwd': _depthwise('fwd'),
    'depthwise_wgrad': _depthwise('wgrad'),
    'pool_fwd': _pool('fwd'),
    'pool_bwd': _pool('bwd'),
    'batchnorm_train': _batchnorm('train'),
    'batchnorm_bwd': _batchnorm('bwd'),
    'softmax_xent': _softmax_xent,
    'ctc_loss': _ctc_loss,
}


@contextlib.contextmanager
def profiled(name):
    """The CUDA profiler on (cudaProfilerStart: what ncu --profile-from-start off waits for)
    inside an NVTX range ``name``, the device synchronized before it is turned off."""
    import cupy
    nvtx = _nvtx()
    cupy.cuda.runtime.profilerStart()
    if nvtx:
        nvtx.RangePush(name)
    try:
        yield
        cupy.cuda.Device().synchronize()
    finally:
        if nvtx:
            nvtx.RangePop()
        cupy.cuda.runtime.profilerStop()


def _nvtx():
    """CuPy's NVTX module (RangePush, RangePop) where this CuPy build has one, else None: the
    ranges only label the report, so a CuPy without them profiles the same kernels."""
    try:
        nvtx = importlib.import_module('cupy.cuda.nvtx')
    except ImportError:
        return None
    return nvtx if getattr(nvtx, 'available', True) else None


def parse(argv):
    parser = argparse.ArgumentParser(prog='python -m bench.ncu_cases', description=__doc__.split('\n')[0])
    parser.add_argument('--cases', default=','.join(CASES), help='comma-separated (default: all; --list)')
    parser.add_argument('--impl', choices=('gpuk', 'cudnn'), default='gpuk')
    parser.add_argument('--small', action='store_true', help='tiny shapes (the GPU rehearsal)')
    parser.add_argument('--warmup', type=int, default=2, help='unprofiled calls before the profiled one')
    parser.add_argument('--list', action='store_true', help='print the case names and exit')
    args = parser.parse_args(argv)
    args.cases = runs.comma_list(args.cases)
    unknown = sorted(set(args.cases) - set(CASES))
    if unknown:
        parser.error('unknown case(s) %s; the cases: %s' % (', '.join(unknown), ', '.join(CASES)))
    return args


def main(argv=None):
    """Runs the cases; returns {case: gpuk launches of the profiled call} (None: not run, and why printed)."""
    args = parse(argv)
    if args.list:
        print('\n'.join(CASES))
        return {}
    from tests import gpu_rehearsal
    gpu_rehearsal.activate_if_requested()   # GPUK_GPU_REHEARSAL=1: before anything imports CuPy
    from gpuk.kernels.runtime import counters
    from bench import harness
    skip = harness.skip_reason(args.impl)
    if skip:
        raise SystemExit('ncu_cases: %s: %s' % (args.impl, skip))
    prepared = {}
    for name in args.cases:   # every case built and warmed up before the first profiled call
        try:
            label, fn, make = CASES[name](args.impl, args.small)
        except NoImplementation as reason:
            print('ncu case %s: not run (%s)' % (name, reason))
            continue
        inputs = make(0)
        for _ in range(args.warmup):
            fn(*inputs)
        prepared[name] = label, fn, inputs
    launches = dict.fromkeys(args.cases)
    for name, (label, fn, inputs) in prepared.items():
        with counters.counting() as counted, profiled('ncu:' + name):
            fn(*inputs)
        launches[name] = counted.launches
        print('ncu case %s (%s, %s): %d gpuk launch(es) profiled' % (name, args.impl, label, counted.launches))
        sys.stdout.flush()
    return launches


if __name__ == '__main__':
    main()
