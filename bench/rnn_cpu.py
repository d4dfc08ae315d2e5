"""Keras 2.3.1 LSTM / GRU training step on gpuk's NumPy device against PyTorch CPU, one thread each.

    python -m bench.rnn_cpu [--cells LSTM,GRU] [--impls gpuk,torch] [--steps N] [--repeats N]

Model: (batch 32, 50 time steps, 32 features) -> LSTM(128) (or GRU(128)) -> Dense(10),
softmax cross-entropy, Adam; one ``train_on_batch`` step. The torch rows train
bench/keras_models.py's twin (torch.nn.LSTM / GRU + Linear, torch.optim.Adam): the same work
per step, with a second bias per gate, and a GRU whose reset gate follows the recurrent
product (Keras's reset_after=True, not 2.3.1's default). The implementations take
turns: each of ``--repeats`` rounds times ``--steps`` steps of each, so a load on the shared
machine hits both alike; a row gives the median over rounds of the per-round medians, and the
ratio row the median over rounds of gpuk / torch (both sides measured in the same round).
``GPUK_FUSION=0`` in the environment gives the unfused row.
Run as a script (not a pytest-benchmark suite: its name keeps bench/conftest.py from
collecting it), it pins BLAS/OpenMP to one thread and gpuk to the NumPy device unless the
environment says otherwise.
"""
import argparse
import os
import statistics
import sys
import time

if __name__ == '__main__':   # before NumPy loads its BLAS
    for _var in ('OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'MKL_NUM_THREADS'):
        os.environ.setdefault(_var, '1')
    os.environ.setdefault('KERAS_BACKEND', 'gpuk.backend')
    os.environ.setdefault('GPUK_DEVICE', 'cpu')

from bench import keras_models, runs  # noqa: E402

BATCH = 32
STEPS, UNITS = keras_models.RNN_STEPS, keras_models.RNN_UNITS


def _data():
    return keras_models.data('lstm', BATCH)   # the GRU's inputs are the LSTM's


def keras_step(cell):
    import keras
    net = keras_models.build(keras, cell.lower())
    x, y = _data()
    return lambda: net.train_on_batch(x, y)


def torch_step(cell):
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    step = keras_models.torch_step(torch, cell.lower())
    x, labels = keras_models.torch_inputs(torch, 'lstm', *_data())
    return lambda: step(x, labels)


def step_ms(step, steps, clock):
    """The median time of ``steps`` calls of ``step`` on ``clock``, in ms."""
    times = []
    for _ in range(steps):
        start = clock()
        step()
        times.append(clock() - start)
    return 1e3 * statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--cells', default='LSTM,GRU')
    parser.add_argument('--impls', default='gpuk,torch')
    parser.add_argument('--steps', type=int, default=5)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--clock', choices=('wall', 'cpu'), default='wall',
                        help="wall: elapsed time; cpu: this thread's CPU time (both sides run on "
                             "the calling thread), less disturbed by other processes on a shared machine")
    args = parser.parse_args(argv)
    clock = time.perf_counter if args.clock == 'wall' else time.thread_time
    fusion = os.environ.get('GPUK_FUSION', '1')
    impls = runs.comma_list(args.impls)
    for cell in runs.comma_list(args.cells):
        steps = {impl: keras_step(cell) if impl == 'gpuk' else torch_step(cell) for impl in impls}
        for step in steps.values():
            step()   # compile / warm up
        rounds = [{impl: step_ms(step, args.steps, clock) for impl, step in steps.items()} for _ in range(args.repeats)]
        for impl in impls:
            label = 'gpuk (GPUK_FUSION=%s)' % fusion if impl == 'gpuk' else 'torch %s' % __import__('torch').__version__
            ms = statistics.median(r[impl] for r in rounds)
            print('%s(%d) x %d steps, batch %d | %-22s | %8.2f ms/step (%s)' % (cell, UNITS, STEPS, BATCH, label, ms,
                                                                             args.clock))
        if len(impls) == 2:
            ratio = statistics.median(r[impls[0]] / r[impls[1]] for r in rounds)
            print('%s(%d) x %d steps, batch %d | %-22s | %8.2f x' % (cell, UNITS, STEPS, BATCH,
                                                                     '%s / %s' % tuple(impls), ratio))
        sys.stdout.flush()


if __name__ == '__main__':
    main()
