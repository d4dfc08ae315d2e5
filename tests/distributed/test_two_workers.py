"""Two MPI processes on the CPU (mpiexec from the mpich wheel), started from pytest: data-parallel
Keras training equals one process on the whole batch; broadcast, allreduce; a dead or hung
worker makes the other fail with a clear error, not hang. worker.py is what each process runs."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

WORKER = Path(__file__).with_name('worker.py')
REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 3  # GPUK_DIST_TIMEOUT of the failure tests, seconds


def mpiexec():
    """The mpiexec of the test extra's mpich wheel (in the venv's bin/, beside python)."""
    beside = Path(sys.executable).with_name('mpiexec')
    found = str(beside) if beside.exists() else shutil.which('mpiexec')
    if found is None:
        pytest.fail('mpiexec not found beside %s nor on PATH: install the test extra (mpich, '
                    'mpi4py)' % sys.executable)
    return found


def run(scenario, out, processes=2, timeout=TIMEOUT, under_shell=False):
    env = dict(os.environ, KERAS_BACKEND='gpuk.backend', KERAS_HOME=str(out / 'keras-home'),
               GPUK_DEVICE='cpu', GPUK_DIST_TIMEOUT=str(timeout),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get('PYTHONPATH')])))
    command = [sys.executable, str(WORKER), scenario, str(out)]
    if under_shell:
        command = ['sh', '-c', '"$0" "$@"; sleep 60'] + command
    if processes:
        command = [mpiexec(), '-n', str(processes)] + command
    start = time.monotonic()
    done = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=120)
    return done, time.monotonic() - start


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp('dist-train')
    for scenario, processes in (('reference', 0), ('train', 2)):
        done, _ = run(scenario, out, processes=processes, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
    load = lambda name: dict(np.load(out / name))
    return load('reference-0.npz'), load('train-0.npz'), load('train-1.npz')


def weights(result, prefix):
    return [result[k] for k in sorted(result) if k.startswith(prefix)]


def test_two_workers_on_half_batches_end_where_one_process_on_whole_batches_does(trained):
    reference, rank0, rank1 = trained
    for ref, w0, w1 in zip(weights(reference, 'final'), weights(rank0, 'final'), weights(rank1, 'final')):
        np.testing.assert_array_equal(w0, w1)  # identical on both ranks, not just close
        np.testing.assert_allclose(w0, ref, rtol=1e-5, atol=1e-6)
    # The epochs moved the weights (else equality would prove nothing)
    assert max(np.abs(f - i).max() for f, i in zip(weights(rank0, 'final'), weights(rank0, 'initial'))) > 0.05


def test_metric_average_gives_the_whole_batch_loss(trained):
    reference, rank0, rank1 = trained
    np.testing.assert_array_equal(rank0['loss'], rank1['loss'])
    np.testing.assert_allclose(rank0['loss'], reference['loss'], rtol=1e-5)


def test_broadcast_callback_makes_differently_initialised_workers_start_equal(trained):
    reference, rank0, rank1 = trained
    before0, before1 = weights(rank0, 'before'), weights(rank1, 'before')
    assert any(np.abs(a - b).max() > 0.01 for a, b in zip(before0, before1))  # seeds differ
    for start0, start1, b0, ref in zip(weights(rank0, 'initial'), weights(rank1, 'initial'), before0,
                                       weights(reference, 'initial')):
        np.testing.assert_array_equal(start0, start1)
        np.testing.assert_array_equal(start1, b0)    # rank 1 starts from rank 0's weights
        np.testing.assert_array_equal(start0, ref)   # which the reference was seeded to have


def test_allreduce_and_broadcast_variables(tmp_path):
    done, _ = run('collectives', tmp_path, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    r0, r1 = (dict(np.load(tmp_path / ('collectives-%d.npz' % r))) for r in (0, 1))
    for r in (r0, r1):
        np.testing.assert_allclose(r['mean'], [1.5, 3.0])            # (x + 2x) / 2
        assert r['sum'].tolist() == [3] and r['sum'].dtype == np.int64
        np.testing.assert_allclose(r['graph'], [3.0, 3.0, 3.0])      # mean of 2*1 and 2*2
        # d/dx of sum(c * mean_over_workers(2x)) summed back over workers' outputs: 2 * c
        np.testing.assert_allclose(r['graph_grad'], [2.0, 4.0, 6.0])
        np.testing.assert_array_equal(r['broadcast_v'], np.full((2, 2), 1.0))   # root_rank=1's
        np.testing.assert_array_equal(r['broadcast_w'], np.arange(3) + 10.0)
        assert 'differ in number, shape or dtype between workers' in str(r['mismatch_error'])
        np.testing.assert_array_equal(r['unchanged_v'], r['broadcast_v'])


def test_bandwidth_tool_reports_ring_bus_bandwidth(tmp_path):
    env = dict(os.environ, GPUK_DEVICE='cpu', GPUK_DIST_TIMEOUT='60',
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get('PYTHONPATH')])))
    done = subprocess.run([mpiexec(), '-n', '2', sys.executable, '-m', 'gpuk.distributed.bandwidth',
                           '--mb', '1', '--iters', '3'], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])  # rank 0 only prints
    assert report['ranks'] == 2 and report['transport'] == 'mpi' and report['megabytes'] == 1
    assert report['seconds'] > 0
    assert report['algbw_GBps'] == pytest.approx(1e-3 / report['seconds'])
    assert report['busbw_GBps'] == pytest.approx(report['algbw_GBps'])  # 2(N-1)/N = 1 for N = 2


def test_killed_worker_makes_the_other_fail_with_a_clear_error_within_the_timeout(tmp_path):
    # Each worker runs under a shell that outlives it, so the launcher does not see rank 1
    # die (as on a node whose launcher daemon is gone): only the survivor's own deadline can
    # end the job. It must, with a DistributedError naming the collective, then MPI_Abort.
    done, elapsed = run('kill', tmp_path, under_shell=True)
    assert done.returncode != 0
    stderr = done.stderr
    assert 'DistributedError' in stderr and 'gradient bucket' in stderr, stderr
    assert 'did not complete within %g s (GPUK_DIST_TIMEOUT)' % TIMEOUT in stderr, stderr
    # The abort is what ended the job: without it the shells' `sleep 60` would keep it alive.
    # (MPICH's own "MPI_Abort" line is not asserted: the launcher forwards output asynchronously
    # and, on a loaded machine, the teardown can beat it; CI lost it once.)
    assert TIMEOUT <= elapsed < TIMEOUT + 20, elapsed  # 20 s: two interpreter and Keras start-ups


def test_killed_worker_ends_the_job_under_the_default_launcher(tmp_path):
    done, elapsed = run('kill', tmp_path)
    assert done.returncode != 0
    assert 'Killed (signal 9)' in done.stdout + done.stderr
    assert elapsed < TIMEOUT + 20, elapsed


def test_hung_worker_makes_the_other_fail_after_the_timeout(tmp_path):
    # Rank 1 stops (SIGSTOP) mid-training: alive, silent. Rank 0's all-reduce waits
    # GPUK_DIST_TIMEOUT seconds, raises, and aborts the job (which also ends rank 1).
    done, elapsed = run('stop', tmp_path)
    assert done.returncode != 0
    assert 'did not complete within %g s (GPUK_DIST_TIMEOUT)' % TIMEOUT in done.stderr, done.stderr
    assert 'MPI_Abort' in done.stderr
    assert TIMEOUT <= elapsed < TIMEOUT + 20, elapsed
