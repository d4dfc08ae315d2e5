"""Copy bandwidth: the calibration of the card's memory ceiling as its own benchmark
(device-to-device through gpuk's copy kernel and through CuPy), plus NumPy on the CPU.
Bytes are counted read + write."""
import pytest

from bench import harness as h

MiB = 1 << 20
CASES = [
    ('gpuk', 1024 * MiB), ('gpuk', 4 * MiB),
    ('cupy', 1024 * MiB), ('cupy', 4 * MiB),
    ('numpy', 256 * MiB), ('numpy', 4 * MiB),
]


def _copy_row(impl, nbytes):
    """(fn, make_inputs) for one copy of nbytes of float32 on impl's device."""
    count = nbytes // 4
    if impl == 'numpy':
        import numpy as np

        def make_dst_src(i):  # np.copyto takes (dst, src)
            src = np.random.default_rng(i).standard_normal(count, dtype=np.float32)
            return np.empty_like(src), src
        return np.copyto, make_dst_src
    import cupy

    def make_inputs(i):
        src = cupy.random.RandomState(i).standard_normal(count, dtype=cupy.float32)
        return (src,) if impl == 'gpuk' else (src, cupy.empty_like(src))
    return (h.gpuk_copy if impl == 'gpuk' else h.cupy_copy), make_inputs


@pytest.mark.parametrize('impl, nbytes', CASES, ids=['%s-%dMiB' % (i, n // MiB) for i, n in CASES])
def test_copy(benchmark, harness, impl, nbytes):
    h.require(impl)
    fn, make_inputs = _copy_row(impl, nbytes)
    info = harness.run(benchmark, family='copy', case='%d MiB' % (nbytes // MiB), impl=impl,
                       fn=fn, make_inputs=make_inputs, set_bytes=2 * nbytes,
                       bytes_moved=2 * nbytes, dtype='float32')
    assert info['gbps'] > 0


def test_copy_calibration(benchmark, harness):
    """The session's GPU ceiling: the faster of gpuk's and CuPy's copy of GPU_CALIBRATION_BYTES (1 GiB)."""
    h.require('gpuk')
    measured = harness.ceilings.gpu_copy()
    ceiling = harness.ceilings.gpu_copy_gbps()
    h.record_samples(benchmark, [2 * h.GPU_CALIBRATION_BYTES / (ceiling * 1e9)])
    case = 'copy %d MiB' % (h.GPU_CALIBRATION_BYTES >> 20)
    benchmark.extra_info.update(family='calibration', case=case, impl='best of gpuk, cupy',
                                device=h.gpu_name(), bytes=2 * h.GPU_CALIBRATION_BYTES,
                                gpuk_gbps=measured['gpuk'], cupy_gbps=measured['cupy'],
                                ceiling_gbps=ceiling)
    assert measured['gpuk'] > 0 and measured['cupy'] > 0
