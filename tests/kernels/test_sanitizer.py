"""The emulator as a sanitizer (racecheck, initcheck, cp.async landing, synccheck) and its
performance counters, on planted bugs and their correct twins (tests/kernels/cu/sanitizer_test.cu).
tests/kernels/conftest.py turns the sanitizer on (GPUK_EMU_SANITIZE=1) for every kernel test."""
import os
from pathlib import Path

import numpy as np
import pytest

from gpuk.kernels.runtime import emulated_runtime
from gpuk.kernels.runtime import KernelLaunchError, get_runtime

SOURCE = Path(__file__).with_name('cu') / 'sanitizer_test.cu'
THREADS = 64


@pytest.fixture(scope='module', autouse=True)
def _sanitizer_on():
    """These tests are about the sanitizer: on even where GPUK_EMU_SANITIZE=0 turns it off elsewhere."""
    saved = os.environ.get('GPUK_EMU_SANITIZE')
    os.environ['GPUK_EMU_SANITIZE'] = '1'
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop('GPUK_EMU_SANITIZE', None)
        else:
            os.environ['GPUK_EMU_SANITIZE'] = saved


@pytest.fixture(scope='module')
def module(_sanitizer_on):
    return get_runtime('emulate').load(SOURCE, {'THREADS': THREADS})


def _launch(module, name, grid, block, *args):
    module.kernel(name).launch(grid, block, args)


def _report(module, name, grid, block, *args):
    with pytest.raises(KernelLaunchError) as info:
        _launch(module, name, grid, block, *args)
    return info.value


def test_kernel_tests_run_instrumented_builds(module):
    assert module.instrumented


def test_missing_syncthreads_is_a_race(module):
    x, y = np.arange(2 * THREADS, dtype=np.float32), np.zeros(2 * THREADS, np.float32)
    _launch(module, 'reverse_shared', 2, THREADS, x, y, np.int32(1))
    np.testing.assert_array_equal(y.reshape(2, THREADS), x.reshape(2, THREADS)[:, ::-1])
    e = _report(module, 'reverse_shared', 2, THREADS, x, y, np.int32(0))
    assert e.kind == 'racecheck' and e.argument == 'static __shared__ memory' and e.block_idx == (0, 0, 0)
    assert 'reverse_shared' in str(e) and 'tile' in str(e) and 'hazard' in str(e)


def test_intra_warp_exchange_needs_syncwarp(module):
    x, y = np.arange(64, dtype=np.float32), np.zeros(64, np.float32)
    _launch(module, 'warp_exchange', 2, 32, x, y, np.int32(1))
    np.testing.assert_array_equal(y.reshape(2, 32), x.reshape(2, 32) + np.roll(x.reshape(2, 32), -1, axis=1))
    e = _report(module, 'warp_exchange', 2, 32, x, y, np.int32(0))
    assert e.kind == 'racecheck' and 'warp_exchange::lanes' in str(e)


def test_read_of_cp_async_destination_before_its_wait(module):
    x, y = np.arange(8 * THREADS, dtype=np.float32), np.zeros(8 * THREADS, np.float32)
    _launch(module, 'cp_async_stage', 2, THREADS, x, y, np.int32(0))
    np.testing.assert_array_equal(y.reshape(2, THREADS, 4), x.reshape(2, THREADS, 4)[:, ::-1])
    e = _report(module, 'cp_async_stage', 2, THREADS, x, y, np.int32(1))
    assert e.kind == 'cp.async' and 'not yet waited for' in str(e) and e.thread_idx == (0, 0, 0)


def test_read_of_uninitialized_shared_memory(module):
    x, y = np.arange(2 * THREADS, dtype=np.float32), np.zeros(2 * THREADS, np.float32)
    _launch(module, 'neighbour_sum', 2, THREADS, x, y, np.int32(THREADS))
    e = _report(module, 'neighbour_sum', 2, THREADS, x, y, np.int32(THREADS - 4))
    assert e.kind == 'initcheck' and 'uninitialized static __shared__' in str(e)
    assert THREADS - 5 <= e.thread_idx[0] < THREADS   # a thread reading one of tile[THREADS - 4:THREADS]
    assert THREADS - 4 <= e.byte_offset // 4 - _tile_base(e) < THREADS


def _tile_base(error):
    """Element index of tile[0] within the TLS block, from the report's 'tile` byte N' text."""
    byte = int(str(error).split('tile` byte ')[1].split()[0])
    return (error.byte_offset - byte) // 4


def test_shuffle_with_a_mask_naming_absent_lanes(module):
    x, y = np.arange(64, dtype=np.int32), np.zeros(2, np.int32)
    _launch(module, 'half_warp_sum', 1, 64, x, y, np.uint32(0x0000ffff))
    np.testing.assert_array_equal(y, [x[:16].sum(), x[32:48].sum()])
    e = _report(module, 'half_warp_sum', 1, 64, x, y, np.uint32(0xffffffff))
    assert e.kind == 'synccheck' and e.argument is None
    assert '__shfl_xor_sync with mask 0xffffffff' in str(e) and '0xffff0000 exited' in str(e)


def test_read_of_a_runtime_allocated_array_never_written(module):
    rt = get_runtime('emulate')
    x = np.ones(128, np.float32)
    y = rt.xp.empty(128, np.float32)
    e = _report(module, 'accumulate', 1, 64, x, y, np.int64(128))
    assert (e.kind, e.argument, e.byte_offset) == ('initcheck', 'y', 0)
    y[:100] = 0.0                                   # host writes count as writes ...
    e = _report(module, 'accumulate', 1, 64, x, y, np.int64(128))
    assert (e.kind, e.byte_offset) == ('initcheck', 400)
    y[100:] = 2.0
    _launch(module, 'accumulate', 1, 64, x, y, np.int64(128))
    np.testing.assert_array_equal(y, np.r_[np.ones(100), np.full(28, 3.0)])
    z = np.asarray(np.empty(128, np.float32))      # arrays the runtime did not allocate count as written
    _launch(module, 'accumulate', 1, 64, x, z, np.int64(128))


def test_shared_atomics_are_not_races(module):
    x = np.arange(128, dtype=np.int32)
    counts = np.zeros(16, np.int32)
    _launch(module, 'shared_histogram', 2, THREADS, x, counts, np.int64(128))
    np.testing.assert_array_equal(counts, np.bincount(x & 15, minlength=16))


def test_sanitizer_off_runs_the_plain_build(monkeypatch):
    monkeypatch.setenv('GPUK_EMU_SANITIZE', '0')
    plain = get_runtime('emulate').load(SOURCE, {'THREADS': THREADS})
    assert not plain.instrumented
    x, y = np.arange(2 * THREADS, dtype=np.float32), np.zeros(2 * THREADS, np.float32)
    plain.kernel('reverse_shared').launch(2, THREADS, (x, y, np.int32(0)))   # the race goes unnoticed
    monkeypatch.setenv('GPUK_EMU_SANITIZE', 'yes')
    with pytest.raises(ValueError, match="GPUK_EMU_SANITIZE must be 0 or 1, got 'yes'"):
        get_runtime('emulate').load(SOURCE, {'THREADS': THREADS})


# ---------------------------------------------------------------- counters

def _counted(name, grid, block, *args):
    from gpuk.kernels.inspect.emulated import summarize
    with emulated_runtime.counting() as launches:
        module = get_runtime('emulate').load(SOURCE, {'THREADS': THREADS})
        module.kernel(name).launch(grid, block, args)
    (record,) = summarize(launches, 'test', name)
    return record


def test_coalesced_copy_scores_one_and_strided_copy_is_flagged():
    rows, cols = 64, 64
    x, y = np.arange(rows * cols, dtype=np.float32), np.zeros(rows * cols, np.float32)
    good = _counted('copy_coalesced', 8, 128, x, y, np.int64(x.size))
    assert good['coalescing'] == 1.0 and good['sectors_per_request'] == 4.0   # 32 lanes x 4 bytes
    assert good['global_bytes'] == good['compulsory_bytes'] == 2 * x.nbytes
    bad = _counted('copy_strided', 8, 128, x, y, np.int32(rows), np.int32(cols))
    np.testing.assert_array_equal(y.reshape(cols, rows), x.reshape(rows, cols).T)
    assert bad['coalescing'] < 0.95
    assert bad['global_bytes'] > 2 * bad['compulsory_bytes']   # reads move a sector per element


def test_vector_accesses_count_as_one_request_per_warp():
    x, y = np.arange(4096, dtype=np.float32), np.zeros(4096, np.float32)
    record = _counted('copy_float4', 4, 128, x, y, np.int64(1024))
    np.testing.assert_array_equal(y, x)
    assert record['coalescing'] == 1.0 and record['sectors_per_request'] == 16.0   # 32 lanes x 16 bytes
    assert record['global_requests'] == 2 * 1024 // 32


def test_zero_filled_cp_async_lanes_stay_in_step_with_their_warp():
    # A zero-filled lane's copy reads nothing but is part of its warp's request: its next copy
    # pairs with the other lanes' next ones (read as a lane out of step, the second row's
    # coalesced copies would count as split requests).
    x, y = np.arange(2 * THREADS * 4, dtype=np.float32), np.zeros(2 * THREADS * 4, np.float32)
    whole = _counted('cp_async_zfill_rows', 1, THREADS, x, y, np.int32(0))
    np.testing.assert_array_equal(y, x)
    skipped = _counted('cp_async_zfill_rows', 1, THREADS, x, y, np.int32(1))
    rows = y.reshape(2, THREADS, 4)
    skipped_lanes = (np.arange(THREADS) & 2) != 0
    assert not rows[0, skipped_lanes].any()
    np.testing.assert_array_equal(rows[0, ~skipped_lanes], x.reshape(2, THREADS, 4)[0, ~skipped_lanes])
    np.testing.assert_array_equal(rows[1], x.reshape(2, THREADS, 4)[1])
    assert whole['coalescing'] == skipped['coalescing'] == 1.0
    assert skipped['global_requests'] == whole['global_requests']


def test_bank_conflicts_of_a_transpose_tile_and_its_padded_twin():
    x, y = np.arange(2048, dtype=np.float32), np.zeros(2048, np.float32)
    conflicted = _counted('transpose_tile', 2, (32, 32), x, y, np.int32(0))
    # writes (row-wise) are conflict-free; column reads put 32 words in one bank: 31 extra wavefronts
    assert conflicted['shared_requests'] == 2 * 2 * 32
    assert conflicted['bank_conflicts_per_request'] == pytest.approx(31 / 2)
    padded = _counted('transpose_tile', 2, (32, 32), x, y, np.int32(1))
    assert padded['bank_conflicts_per_request'] == 0.0
    np.testing.assert_array_equal(y.reshape(2, 32, 32), x.reshape(2, 32, 32).transpose(0, 2, 1))
    assert padded['barriers'] == 2 and padded['barriers_per_output'] == 2 / y.size


def test_atomics_are_counted():
    x = np.arange(128, dtype=np.int32)
    record = _counted('shared_histogram', 2, THREADS, x, np.zeros(16, np.int32), np.int64(128))
    assert record['atomics'] == 128 + 2 * 16
    assert record['barriers'] == 2 * 2


def test_measure_reports_every_key_for_a_family():
    from gpuk.kernels.inspect.emulated import measure
    records = measure(['elementwise'])
    assert {r['kernel'] for r in records} == {'copy_bytes', 'bias_act_fwd'}
    for r in records:
        assert r['source'] == 'gpuk/kernels/elementwise.cu' and r['family'] == 'elementwise'
        assert {'config', 'coalescing', 'bank_conflicts_per_request', 'global_bytes', 'compulsory_bytes',
                'barriers_per_output', 'atomics', 'host_syncs_per_call'} <= set(r)
    copy = next(r for r in records if r['kernel'] == 'copy_bytes')
    assert copy['coalescing'] == 1.0 and copy['global_bytes'] == copy['compulsory_bytes']
    with pytest.raises(ValueError, match="measure: families must be among"):
        measure(['nope'])


@pytest.mark.usefixtures('deferred_checks')
def test_host_syncs_are_counted_per_launcher_call():
    from gpuk.kernels import softmax_xent
    rt = get_runtime('emulate')
    logits = np.random.default_rng(0).standard_normal((4, 10)).astype(np.float32)
    from gpuk.kernels.runtime import deferred
    before = rt.host_syncs
    softmax_xent.sparse_softmax_xent_fwd(logits, np.array([1, 2, 3, 4]), runtime=rt)
    softmax_xent.sparse_softmax_xent_fwd(logits, np.array([0, 2, 3, 4]), runtime=rt)
    assert rt.host_syncs == before         # the label checks wait on the device (deferred.py)
    deferred.raise_pending()
    assert rt.host_syncs - before == 1     # one read of every pending flag
    before = rt.host_syncs
    softmax_xent.softmax_fwd(logits, runtime=rt)
    assert rt.host_syncs == before
