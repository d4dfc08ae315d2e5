"""Self-tests of the emulated CUDA execution model (tests/kernels/cu/*.cu)."""
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from gpuk.kernels.runtime import KernelLaunchError
from gpuk.kernels.testing import round_tf32

CU = Path(__file__).with_name('cu')
SELFTEST = CU / 'emu_selftest.cu'
MMA = CU / 'mma_test.cu'


@pytest.fixture(scope='module')
def selftest():
    from gpuk.kernels.runtime import get_runtime
    return get_runtime('emulate').load(SELFTEST, {'TILE': 16})


def test_block_reduction_with_shuffles(selftest):
    rng = np.random.default_rng(1)
    n, threads = 1000, 256
    x = rng.standard_normal(n).astype(np.float32)
    blocks = -(-n // threads)
    out = np.zeros(blocks, np.float32)
    selftest.kernel('block_sums').launch(blocks, threads, (x, out, np.int64(n)))
    padded = np.zeros(blocks * threads)
    padded[:n] = x
    np.testing.assert_allclose(out, padded.reshape(blocks, threads).sum(1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('src, delta, width', [(3, 1, 32), (7, 2, 8), (0, 5, 16), (31, 16, 32)])
def test_shuffle_variants(selftest, src, delta, width):
    values = np.arange(100, 132, dtype=np.int32)
    out = np.zeros(128, np.int32)
    selftest.kernel('shuffles').launch(1, 32, (values, out, np.int32(src), np.int32(delta), np.int32(width)))
    lane = np.arange(32)
    base, pos = lane & ~(width - 1), lane % width
    idx = base + (src % width)
    up = np.where(pos >= delta, lane - delta, lane)
    down = np.where(pos + delta < width, lane + delta, lane)
    xor = lane ^ delta
    xor = np.where(xor >= base + width, lane, xor)
    np.testing.assert_array_equal(out.reshape(4, 32), values[np.stack([idx, up, down, xor])])


def test_byte_perm_follows_the_cuda_definition(selftest):
    """__byte_perm(x, y, s) as the CUDA Math API defines it (libdevice __nv_byte_perm): byte n of
    the result is byte s<4n+2:4n> of y:x (x bytes 0-3, y bytes 4-7), the upper 16 bits of s unused.
    conv_depthwise.cu's 16-bit transposes (swap_halves) rest on it: a wrong emulation would hide a
    wrong selector. Includes CUB's PRMT example and swap_halves' selectors."""
    rng = np.random.default_rng(9)
    selectors = [0x7531, 0x5410, 0x7632, 0x3254, 0x3276, 0x7610, 0x3210, 0x7654, 0xffff0123]
    n = 64
    x = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32)
    y = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32)
    x[0], y[0] = 0x03020100, 0x07060504
    s = np.array(selectors + list(rng.integers(0, 0x8888, n - len(selectors)) & 0x7777), np.uint32)
    out = np.zeros(n, np.uint32)
    selftest.kernel('byte_perms').launch(1, n, (x, y, s, out, np.int32(n)))
    both = x.astype(np.uint64) | (y.astype(np.uint64) << np.uint64(32))
    want = np.zeros(n, np.uint64)
    for byte in range(4):
        pick = (s.astype(np.uint64) >> np.uint64(4 * byte)) & np.uint64(7)
        want |= ((both >> (np.uint64(8) * pick)) & np.uint64(0xff)) << np.uint64(8 * byte)
    np.testing.assert_array_equal(out, want.astype(np.uint32))
    assert out[0] == 0x07050301


def test_tiled_matmul_with_syncthreads(selftest):
    rng = np.random.default_rng(2)
    m, n, k = 37, 29, 45
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = np.zeros((m, n), np.float32)
    selftest.kernel('tiled_matmul').launch((-(-n // 16), -(-m // 16)), (16, 16),
                                           (a, b, c, np.int32(m), np.int32(n), np.int32(k)))
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4)


def test_atomics(selftest):
    rng = np.random.default_rng(3)
    n = 777
    values = rng.integers(1, 1000, n).astype(np.int32)
    fsum, dsum = np.zeros(1, np.float32), np.zeros(1, np.float64)
    ints = np.array([0, -1, 0, 0, 0], np.int32)
    umin = np.array([0xffffffff], np.uint32)
    selftest.kernel('atomics').launch(-(-n // 128), 128, (values, fsum, dsum, ints, umin, np.int64(n)))
    total = int(values.sum())
    assert fsum[0] == np.float32(total)          # integers < 2^24: exact in float32
    assert dsum[0] == total * 0.5
    assert ints.tolist() == [total, int(values.max()), total, 1, 1]
    assert umin[0] == values.min()


def test_worker_threads_are_capped_once_by_the_runtime(selftest, monkeypatch):
    """GPUK_EMULATE_THREADS beyond MAX_WORKERS runs MAX_WORKERS host threads (the runtime's
    one cap, which the C++ launcher takes as given): the grid-wide barrier bound reports it,
    and a grid of more blocks than workers still adds every thread's atomics."""
    from gpuk.kernels.runtime import emulated_runtime
    monkeypatch.setenv('GPUK_EMULATE_THREADS', str(10 * emulated_runtime.MAX_WORKERS))
    assert emulated_runtime.worker_count() == emulated_runtime.MAX_WORKERS
    kernel = selftest.kernel('atomics')
    assert kernel.coresident_blocks(32) == emulated_runtime.MAX_WORKERS
    n = 32 * (emulated_runtime.MAX_WORKERS + 7)
    values = np.arange(1, n + 1, dtype=np.int32)
    fsum, dsum = np.zeros(1, np.float32), np.zeros(1, np.float64)
    ints, umin = np.array([0, -1, 0, 0, 0], np.int32), np.array([0xffffffff], np.uint32)
    kernel.launch(n // 32, 32, (values, fsum, dsum, ints, umin, np.int64(n)))
    assert ints.tolist() == [int(values.sum()), n, int(values.sum()), 1, 1]


def test_votes(selftest):
    pred = np.zeros(96, np.int32)
    pred[[0, 5, 31]] = 1             # warp 0: some
    pred[32:64] = 7                  # warp 1: all
    ballot = np.zeros(3, np.uint32)  # warp 2: none
    any_all = np.zeros(6, np.int32)
    selftest.kernel('votes').launch(1, 96, (pred, ballot, any_all))
    assert ballot.tolist() == [(1 << 0) | (1 << 5) | (1 << 31), 0xffffffff, 0]
    assert any_all.tolist() == [1, 0, 1, 1, 0, 0]


def test_dynamic_shared_memory(selftest):
    x = np.arange(3 * 64, dtype=np.float32)
    y = np.zeros_like(x)
    selftest.kernel('reverse_blocks').launch(3, 64, (x, y), shared_mem=64 * 4)
    np.testing.assert_array_equal(y, x.reshape(3, 64)[:, ::-1].reshape(-1))


def _float_samples(rng):
    special = np.array([0.0, -0.0, 1.0, -1.0, 65504.0, 65519.99, 65520.0, 1e-8, 2.0**-24, 2.0**-25,
                        3 * 2.0**-26, 2.0**-14, 5.96e-8, np.inf, -np.inf, 3.4e38, 1.17549435e-38], np.float32)
    bits = rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    halfway = (rng.integers(0, 2**16, 2000, dtype=np.uint32) << 16 | 0x8000).view(np.float32)  # bf16 ties
    return np.concatenate([special, bits[np.isfinite(bits)], halfway[np.isfinite(halfway)],
                           rng.standard_normal(2000).astype(np.float32)])


def _bf16_reference(x):
    """Nearest bfloat16 (ties to even) by distances in float64: independent of bit tricks."""
    bits = x.view(np.uint32)
    lo = bits & 0xffff0000
    hi = lo + 0x10000
    with np.errstate(invalid='ignore'):
        lo_f = lo.view(np.float32).astype(np.float64)
        hi_f = hi.astype(np.uint32).view(np.float32).astype(np.float64)
    # IEEE overflow rule: rounding up past the largest finite value compares against 2^128.
    hi_f = np.where(np.isinf(hi_f) & np.isfinite(lo_f), np.copysign(2.0**128, lo_f), hi_f)
    xd = x.astype(np.float64)
    with np.errstate(invalid='ignore'):
        d_lo, d_hi = np.abs(xd - lo_f), np.abs(hi_f - xd)
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & ((lo >> 16) & 1).astype(bool))
    return np.where(pick_hi, hi >> 16, lo >> 16).astype(np.uint16)


def test_half_and_bfloat16_conversions_bit_exact(selftest):
    x = _float_samples(np.random.default_rng(4))
    n = x.size
    h, b = np.zeros(n, np.float16), np.zeros(n, ml_dtypes.bfloat16)   # __nv_bfloat16* takes ml_dtypes.bfloat16
    h_back, b_back = np.zeros(n, np.float32), np.zeros(n, np.float32)
    selftest.kernel('convert_lowp').launch(64, 256, (x, h, b, h_back, b_back, np.int64(n)))
    with np.errstate(over='ignore'):
        np.testing.assert_array_equal(h.view(np.uint16), x.astype(np.float16).view(np.uint16))
    np.testing.assert_array_equal(h_back, h.astype(np.float32))
    np.testing.assert_array_equal(b.view(np.uint16), _bf16_reference(x))
    np.testing.assert_array_equal(b_back, (b.view(np.uint16).astype(np.uint32) << 16).view(np.float32))
    nan = np.array([np.nan, -np.nan], np.float32)
    h2, b2 = np.zeros(2, np.float16), np.zeros(2, ml_dtypes.bfloat16)
    selftest.kernel('convert_lowp').launch(1, 32, (nan, h2, b2, np.zeros(2, np.float32), np.zeros(2, np.float32),
                                                   np.int64(2)))
    assert h2.view(np.uint16).tolist() == [0x7fff, 0x7fff] and b2.view(np.uint16).tolist() == [0x7fff, 0x7fff]


def test_bfloat16_buffers_take_ml_dtypes_bfloat16_not_uint16_bits(selftest):
    x = np.ones(4, np.float32)
    args = lambda b: (x, np.zeros(4, np.float16), b, np.zeros(4, np.float32), np.zeros(4, np.float32), np.int64(4))
    with pytest.raises(TypeError, match=r"argument 2 \(b, '__nv_bfloat16\*'\) must have dtype bfloat16, got uint16"):
        selftest.kernel('convert_lowp').launch(1, 32, args(np.zeros(4, np.uint16)))
    bits = np.zeros(4, np.uint16)
    selftest.kernel('convert_lowp').launch(1, 32, args(bits.view(ml_dtypes.bfloat16)))   # a view shares the bits
    assert bits.tolist() == [0x3f80] * 4


@pytest.mark.parametrize('defines', [{}, {'GPUK_MMA_VIA_SHUFFLES': 1}], ids=['collective', 'shuffles'])
def test_mma_wrappers_match_numpy(emulator, defines):
    module = emulator.load(MMA, defines)
    rng = np.random.default_rng(5)
    m, n, k = 32, 16, 32
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = rng.standard_normal((m, n)).astype(np.float32)
    tiles = (m // 16) * (n // 8)
    dims = (np.int32(m), np.int32(n), np.int32(k))

    d = np.zeros((m, n), np.float32)
    module.kernel('mma_tf32_matmul').launch(tiles, 32, (a, b, c, d) + dims)
    ref = round_tf32(a).astype(np.float64) @ round_tf32(b) + c
    np.testing.assert_allclose(d, ref, rtol=0, atol=1e-4 * np.abs(ref).max())
    assert np.abs(d - (a.astype(np.float64) @ b + c)).max() > 1e-5   # inputs really were rounded

    for use_bf16, rounded in ((0, lambda x: x.astype(np.float16).astype(np.float64)),
                              (1, lambda x: _bf16_reference(x).astype(np.uint32).__lshift__(16).view(np.float32)
                               .astype(np.float64))):
        d = np.zeros((m, n), np.float32)
        module.kernel('mma_lowp_matmul').launch(tiles, 32, (a, b, c, d) + dims + (np.int32(use_bf16),))
        ref = rounded(a) @ rounded(b) + c
        np.testing.assert_allclose(d, ref, rtol=0, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize('defines', [{}, {'GPUK_MMA_VIA_SHUFFLES': 1}], ids=['collective', 'shuffles'])
@pytest.mark.parametrize('num', [1, 2, 4])
@pytest.mark.parametrize('trans', [0, 1], ids=['plain', 'trans'])
def test_ldmatrix_fragments_follow_the_ptx_layout(emulator, defines, num, trans):
    """ldmatrix.m8n8.x{1,2,4}[.trans].b16: lane 4g+t gets (row g, cols 2t, 2t+1) of matrix i
    in register i, or with .trans (rows 2t, 2t+1, col g); the lower index in the low half."""
    module = emulator.load(MMA, defines)
    tile = np.arange(256, dtype=np.uint16).reshape(16, 16) * np.uint16(3) + np.uint16(7)
    out = np.zeros((32, 4), np.uint32)
    module.kernel('ldmatrix_probe').launch(1, 32, (tile.reshape(-1), out.reshape(-1), np.int32(num), np.int32(trans)))
    expected = np.zeros((32, 4), np.uint32)
    for lane in range(32):
        g, t = divmod(lane, 4)
        for i in range(num):
            m = tile[8 * (i & 1):8 * (i & 1) + 8, 8 * (i >> 1):8 * (i >> 1) + 8].astype(np.uint32)
            lo, hi = (m[2 * t, g], m[2 * t + 1, g]) if trans else (m[g, 2 * t], m[g, 2 * t + 1])
            expected[lane, i] = lo | (hi << 16)
    np.testing.assert_array_equal(out, expected)


# ---- errors the emulator must report instead of hanging or corrupting memory ----
def test_barrier_deadlock_is_reported(selftest):
    with pytest.raises(KernelLaunchError, match=r"barrier_after_exit.*deadlock: 32 thread\(s\) wait at "
                                                r"__syncthreads.*32 exited") as info:
        selftest.kernel('barrier_after_exit').launch(2, 64, (np.zeros(64, np.float32),))
    assert info.value.kind == 'deadlock' and info.value.block_idx == (0, 0, 0)


def test_warp_collective_with_missing_lane_is_reported(selftest):
    with pytest.raises(KernelLaunchError, match=r"shuffle_missing_lane.*deadlock.*31 wait in warp collectives"):
        selftest.kernel('shuffle_missing_lane').launch(1, 32, (np.zeros(32, np.int32),))


def test_out_of_bounds_write_names_kernel_block_thread(selftest):
    n = 300   # blocks of 128: thread 300 is block 2, thread 44
    y = np.zeros(n, np.float32)
    with pytest.raises(KernelLaunchError) as info:
        selftest.kernel('write_past_end').launch(3, 128, (y, np.int64(n)))
    e = info.value
    assert (e.kind, e.argument, e.byte_offset, e.block_idx, e.thread_idx) == \
        ('out of bounds', 'y', 4 * n, (2, 0, 0), (44, 0, 0))
    assert "write_past_end" in str(e) and "write of argument 0 (y)" in str(e)
    assert not y.any()   # a failed launch writes nothing back


def test_out_of_bounds_read_names_kernel_block_thread(selftest):
    n = 100
    x, y = np.ones(n, np.float32), np.zeros(n, np.float32)
    with pytest.raises(KernelLaunchError, match=r"read_past_end.*out-of-bounds read of argument 0 \(x\) at byte "
                                                r"offset 400.*block \(1, 0, 0\) thread \(35, 0, 0\)"):
        selftest.kernel('read_past_end').launch(2, 64, (x, y, np.int64(n)))


def test_underflow_write_is_detected(selftest):
    with pytest.raises(KernelLaunchError, match=r"write before the start of argument 0 \(y\) at byte offset -8"):
        selftest.kernel('write_before_start').launch(1, 32, (np.zeros(10, np.float32), np.int64(2)))


def test_dynamic_shared_memory_overflow_is_reported(selftest):
    with pytest.raises(KernelLaunchError, match=r"out-of-bounds write of dynamic shared memory") as info:
        selftest.kernel('shared_overflow').launch(1, 32, (np.zeros(32, np.float32),), shared_mem=4096)
    assert info.value.argument == 'dynamic shared memory' and info.value.byte_offset >= 4096


def test_stack_overflow_is_reported(selftest):
    with pytest.raises(KernelLaunchError, match=r"huge_locals.*stack overflow of an emulated thread"):
        selftest.kernel('huge_locals').launch(1, 32, (np.zeros(32, np.float32), np.int32(64 * 1024)))


def test_warp_logsumexp_handles_minus_infinity_and_double_scalars(selftest):
    x = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)
    x[1, :] = -np.inf           # an all -inf row: -inf, not NaN
    x[2, ::2] = -np.inf         # masked entries add nothing
    out = np.zeros(3, np.float32)
    selftest.kernel('warp_logsumexp').launch(3, 32, (x, out, np.float64(2.0)))
    with np.errstate(divide='ignore'):
        want = 2.0 * np.log(np.exp(x.astype(np.float64)).sum(axis=1))
    np.testing.assert_allclose(out, want, rtol=1e-5)
