"""Host overhead of Keras 2.3.1 training steps on gpuk's CUDA path.

    python -m bench.host_overhead                   # a GPU, or the GPU rehearsal without one
    python -m bench.host_overhead --models mlp --steps 20 --json out.json

For three models (train_on_batch: forward, loss, gradients, Adam update):
- mlp: Dense 784-256-256-10 (relu, softmax), categorical cross-entropy;
- bn_cnn: Conv2D + BatchNormalization + relu + MaxPool, twice, Dense softmax;
- ctc: the demo's OCR model (conv + batch norm + pooling, bidirectional GRU, CTC loss),
  at a small size;
it reports per steady-state step (after warm-up steps that compile kernels and plans and,
with graphs on, capture the step), once with K.function's CUDA Graph replay off and once on
(``--graphs``):

- launches: gpuk kernel launches + cuBLAS GEMMs (gpuk/kernels/runtime/counters.py); with a
  replayed graph, those the graph holds. CuPy's own kernels (steps computed with ``xp``)
  are counted apart as xp steps (at least one kernel each);
- host µs per launch: graphs off, the time of the plan steps that launch, outside the
  device calls (gpuk's Python around each launch, and the array library's for the xp work
  inside a launcher); in the GPU rehearsal the time inside a launch is the emulator's and is
  excluded. Graphs on, the whole step's host time (Keras, K.function, input and output
  copies, the graph launch) over the launches and xp steps the graph holds;
- syncs in step: device-to-host copies inside the step; "incl. output" adds the copies of
  the step's outputs back to Keras (the loss);
- allocations: step outputs in memory no earlier counted step saw (a step's reused output
  buffers are not new; the warm-up steps are counted so the first timed one knows them); with a real
  CuPy also pool mallocs (every memory-pool request, a MemoryHook) and device allocs (the
  pool's cudaMalloc calls: what a steady-state step must not make, see docs/architecture.md).

``--peak-memory`` (the GPU rehearsal, dry launches) reports instead the peak traced memory
(tracemalloc) of a steady plain step of each model, with step buffers kept and under
GPUK_STEP_BUFFERS=0 (the memory pool's reuse alone), each in a child process; ``--batch N``
sets every model's batch (docs/architecture.md, "The memory plan").

Without a GPU it runs in the GPU rehearsal (tests/gpu_rehearsal: a NumPy stand-in for CuPy,
kernels in the emulator): counts are the CUDA path's, host times are this CPU's, and
nothing here is a GPU timing. ``--dry-launches`` (rehearsal only) checks launches without
running them: an emulated launch leaves the host's caches cold and inflates the Python
around it by tens of µs; the counts do not change, the trained values are meaningless.
NumPy's BLAS runs on one thread unless OPENBLAS_NUM_THREADS / OMP_NUM_THREADS say otherwise:
in the rehearsal its matmuls stand in for cuBLAS, and idle BLAS worker threads spinning on a
small shared VM evicted the caches around gpuk's Python (3x the MLP's host µs per launch).
"""
import argparse
import atexit
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

for _threads in ('OPENBLAS_NUM_THREADS', 'OMP_NUM_THREADS'):   # before NumPy loads its BLAS
    os.environ.setdefault(_threads, '1')

import numpy as np  # noqa: E402

from bench import keras_models  # noqa: E402

MODELS = ('mlp', 'bn_cnn', 'ctc')
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _gpu_available():
    """Asked in a child process: importing the real CuPy here would rule out the rehearsal."""
    code = 'from gpuk.kernels.runtime import gpu_unusable_reason as r; print(r() is None)'
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    return out.stdout.strip().endswith('True')


def setup_device(rehearsal):
    """Point gpuk at the CUDA path: a real GPU, or the rehearsal. Returns a description."""
    os.environ.setdefault('KERAS_BACKEND', 'gpuk.backend')
    if 'KERAS_HOME' not in os.environ:   # Keras writes its config there: a folder of this run's, removed at exit
        keras_home = tempfile.mkdtemp(prefix='gpuk-host-overhead-')
        atexit.register(shutil.rmtree, keras_home, ignore_errors=True)
        os.environ['KERAS_HOME'] = keras_home
    os.environ['GPUK_DEVICE'] = 'cuda'
    if rehearsal:
        from tests import gpu_rehearsal
        gpu_rehearsal.activate()
        return 'GPU rehearsal (NumPy stand-in for CuPy, kernels in the emulator): host times of this CPU'
    import cupy
    return 'GPU: %s' % cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()


def dry_launches():
    """In the rehearsal (setup_device(True) first): launches checked, not run."""
    from tests.gpu_rehearsal import rehearsal_runtime
    rehearsal_runtime.set_dry_launch_bytes(-1)


def _keras_models_builder(name):
    """(keras, batch) -> (net, inputs, targets) of bench/keras_models.py's model ``name``."""
    def build(keras, batch):
        x, y = keras_models.data(name, batch)
        return keras_models.build(keras, name), [x], [y]
    return build


def _ctc(keras, batch):
    from gpuk.demo import data, model, network, settings
    spec = settings.ModelSpec(conv_filters=(4, 8), dense_units=16, rnn_units=8)
    render = data.RenderSpec()
    dataset = data.make_dataset(batch, seed=0, spec=render)
    height, width = dataset.images.shape[1:3]
    training, _ = model.build_models(height, width, dataset.labels.shape[1], spec)
    inputs = network.model_inputs(dataset, network.time_steps(width))
    return training, inputs, [np.zeros((batch, 1), np.float32)]


BUILDERS = {'mlp': (_keras_models_builder('mlp'), 32), 'bn_cnn': (_keras_models_builder('bn_cnn'), 8),
            'ctc': (_ctc, 4)}


@contextlib.contextmanager
def _cuda_graphs(on):
    """K.function's CUDA Graph replay on or off (GPUK_CUDA_GRAPHS) inside the block only."""
    previous = os.environ.get('GPUK_CUDA_GRAPHS')
    os.environ['GPUK_CUDA_GRAPHS'] = '1' if on else '0'
    try:
        yield
    finally:
        if previous is None:
            del os.environ['GPUK_CUDA_GRAPHS']
        else:
            os.environ['GPUK_CUDA_GRAPHS'] = previous


def measure(name, steps=10, warmup=3, graphs=False, count_calls=False):
    """One row of the report for model ``name`` (see the module docstring), with K.function's
    CUDA Graph replay on or off (GPUK_CUDA_GRAPHS, set for the measurement only).
    ``count_calls`` (plain launches only): one more step, profiled, gives the Python calls per
    launch of its launching plan steps (counters.Counters.count_calls: load-free, unlike µs)."""
    import keras
    from gpuk.kernels.runtime import counters
    from gpuk.backend import clear_session   # keras.backend (2.3.1) does not re-export it
    with _cuda_graphs(graphs):
        clear_session()
        build, batch = BUILDERS[name]
        net, x, y = build(keras, batch)
        for _ in range(warmup):   # counted too: a step's new buffers are those no earlier counted step saw
            with counters.counting():
                net.train_on_batch(x, y)
        walls, rows = [], []
        for _ in range(steps):
            with counters.counting() as c:
                started = time.perf_counter()
                net.train_on_batch(x, y)
                walls.append(time.perf_counter() - started)
            rows.append(c)
        calls = None
        if count_calls and not graphs:
            with counters.counting(count_calls=True) as profiled:
                net.train_on_batch(x, y)
            calls = round(profiled.launching_calls / max(profiled.counted_launches, 1), 1)

    def median_us(values):
        return round(statistics.median(values) * 1e6, 2)

    last = rows[-1]
    plan_graphs = getattr(getattr(net.train_function, '_plan', None), 'graphs', None)
    refused = sorted(set(plan_graphs.refused.values())) if graphs and plan_graphs is not None else []
    if last.graph_replays:
        # the whole step's host time (Keras, K.function, input and output copies, the graph
        # launch call) over the launches the graph holds
        per_launch = [(w - r.device_s) / max(r.replayed_launches + r.replayed_xp_steps, 1)
                      for w, r in zip(walls, rows)]
    else:   # the plan steps that launch: their time outside the device calls
        per_launch = [r.launching_host_s / max(r.launching_launches, 1) for r in rows]
    return {'model': name, 'batch': batch, 'graphs': bool(last.graph_replays),
            'launches': last.replayed_launches if last.graph_replays else last.launches,
            'host_us_per_launch': median_us(per_launch), 'host_us_per_launch_min': median_us([min(per_launch)]),
            'launching_steps': last.launching_steps,
            'xp_steps': last.replayed_xp_steps if last.graph_replays else last.xp_steps,
            'xp_us_per_step': median_us([r.xp_steps_s / max(r.xp_steps, 1) for r in rows]),
            'host_us_per_step': median_us([w - r.device_s for w, r in zip(walls, rows)]),
            'syncs_in_step': last.in_step_syncs, 'syncs_total': last.host_syncs,
            'allocations': last.allocations, 'pool_mallocs': last.pool_mallocs,
            'device_allocs': last.device_allocs,
            'graph_replays': last.graph_replays, 'calls_per_launch': calls,
            'steady': len({(r.launches, r.allocations, r.host_syncs, r.graph_replays) for r in rows}) == 1,
            'graphs_refused': '; '.join(refused)}


def peak_memory(name, batch=None, steps=2, warmup=3):
    """Peak traced host memory (tracemalloc, bytes) of a steady-state plain step of model
    ``name`` (``batch``: BUILDERS' unless given), meant for the GPU rehearsal with dry launches,
    where every device array is NumPy memory: what the step holds from before it (variables,
    optimizer slots, the plan's kept step buffers) plus what it makes, at its most. Traced from
    before the model is built, so the weights count; the peak is reset after the warm-up steps
    and read after the last step. Whether step buffers are kept is the process's setting
    (GPUK_STEP_BUFFERS, read at import): ``main``'s --peak-memory runs both in child processes."""
    import tracemalloc

    import keras
    from gpuk.backend import clear_session
    with _cuda_graphs(False):
        tracemalloc.start()
        try:
            clear_session()
            build, default_batch = BUILDERS[name]
            net, x, y = build(keras, batch or default_batch)
            for _ in range(warmup):
                net.train_on_batch(x, y)
            held = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            for _ in range(steps):
                net.train_on_batch(x, y)
            current, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    return {'model': name, 'batch': batch or default_batch, 'held_before': held, 'held_after': current,
            'peak': peak}


def _peak_in_child(name, batch, steps, warmup, step_buffers, keras_home):
    """``peak_memory`` of model ``name`` in a child process in the GPU rehearsal with dry launches,
    with GPUK_STEP_BUFFERS=``step_buffers`` (read at import, hence a process of its own) and Keras's
    files in ``keras_home`` unless KERAS_HOME is set."""
    code = ('import json; from bench import host_overhead; '
            'host_overhead.setup_device(rehearsal=True); host_overhead.dry_launches(); '
            'print(json.dumps(host_overhead.peak_memory(%r, %r, %d, %d)))' % (name, batch, steps, warmup))
    env = dict(os.environ, GPUK_STEP_BUFFERS=step_buffers, KERAS_BACKEND='gpuk.backend',
               PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get('PYTHONPATH')])))
    env.setdefault('KERAS_HOME', keras_home)
    out = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True, timeout=900, cwd=REPO)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def peak_memory_rows(models, batch=None, steps=2, warmup=3):
    """``peak_memory`` of each model (at ``batch``, else BUILDERS') in the GPU rehearsal with dry
    launches, in child processes with step buffers kept (GPUK_STEP_BUFFERS=1) and not (0: the
    pool's reuse alone): rows of (model, batch, peak kept, peak not kept, their ratio)."""
    rows = []
    for name in models:
        peaks = {}
        for setting in ('1', '0'):
            with tempfile.TemporaryDirectory(prefix='gpuk-host-overhead-') as keras_home:
                peaks[setting] = _peak_in_child(name, batch, steps, warmup, setting, keras_home)
        kept, pool = peaks['1'], peaks['0']
        rows.append({'model': name, 'batch': kept['batch'], 'peak_kept': kept['peak'], 'peak_not_kept': pool['peak'],
                     'held_kept': kept['held_after'], 'held_not_kept': pool['held_after'],
                     'ratio': round(kept['peak'] / pool['peak'], 3)})
    return rows


def report(rows, device):
    lines = ['device: %s' % device, '',
             '| model | batch | graphs | launches/step | host µs/launch (median, min) | xp steps (µs each) '
             '| host µs/step | syncs in step | syncs incl. output | allocations/step | pool mallocs | device allocs '
             '| Python calls/launch |',
             '|---|---|---|---|---|---|---|---|---|---|---|---|---|']
    for r in rows:
        lines.append('| %(model)s | %(batch)d | %(graphs)s | %(launches)d | %(host_us_per_launch)s, '
                     '%(host_us_per_launch_min)s | %(xp_steps)d (%(xp_us_per_step).1f) | %(host_us_per_step).0f '
                     '| %(syncs_in_step)d | %(syncs_total)d | %(allocations)d | %(pool_mallocs)s | %(device_allocs)s '
                     '| %(calls)s |' % dict(r, calls='—' if r['calls_per_launch'] is None else r['calls_per_launch']))
    lines += ['%s: graphs asked for, plain launches because %s' % (r['model'], r['graphs_refused'][:300])
              for r in rows if r['graphs_refused']]
    lines += ['', 'graphs False: host µs/launch is the time of the plan steps that launch, outside the device '
              'calls; graphs True: the whole step\'s host time over the launches the replayed graph holds (gpuk\'s '
              'and one per step computed with xp, CuPy\'s kernels: a lower bound of their count).']
    return '\n'.join(lines)


def launcher_overhead(rehearsal, repeats=15, number=20):
    """Host µs per call of single launchers on small problems, outside the device calls: min
    over ``repeats`` batches of ``number`` calls, plain and inside runtime.prepared_launches()
    (a K.function step re-run for shapes it ran with). In the rehearsal the launches are dry
    (checked, not run: an emulated launch leaves the host's caches cold and adds tens of µs of
    noise to the Python around it). Rows: (name, plain µs, prepared µs)."""
    if rehearsal:
        dry_launches()
    from gpuk import device
    from gpuk.kernels import conv, elementwise, runtime
    from gpuk.kernels.runtime import counters
    rt = runtime.get_runtime('cuda')
    xp = device.xp()
    x, b = xp.ones((4, 64), xp.float32), xp.ones(64, xp.float32)
    kernel_args = (x, b, xp.empty_like(x), np.int64(x.size), np.int64(64), np.int64(1), np.int32(1))
    image, w = xp.ones((1, 6, 6, 4), xp.float32), xp.ones((3, 3, 4, 8), xp.float32)
    dy = xp.ones((1, 4, 4, 8), xp.float32)
    valid = ((0, 0), (0, 0))
    calls = [
        ('runtime: rt.load + kernel + launch', lambda: rt.load(elementwise.SOURCE, elementwise.defines(np.float32))
         .kernel('bias_act_fwd').launch(1, elementwise.BIAS_ACT_THREADS, kernel_args)),
        ('bias_act_fwd launcher', lambda: elementwise.bias_act_fwd(x, b, -1, 'relu', runtime=rt)),
        ('conv_fwd launcher, no bias', lambda: conv.conv_fwd(image, w, (1, 1), (1, 1), valid, 'channels_last',
                                                             runtime=rt)),
        ('conv_wgrad launcher', lambda: conv.conv_wgrad(image, dy, w.shape, (1, 1), (1, 1), valid, 'channels_last',
                                                        runtime=rt)),
    ]

    def host_us(call):
        best = float('inf')
        for _ in range(repeats):
            with counters.counting() as c:
                started = time.perf_counter()
                for _ in range(number):
                    call()
                wall = time.perf_counter() - started
            best = min(best, (wall - c.device_s) / number)
        return best * 1e6

    rows = []
    for name, call in calls:
        call()   # compiles, loads, prepares
        plain = host_us(call)
        with runtime.prepared_launches():
            prepared = host_us(call)
        rows.append((name, round(plain, 2), round(prepared, 2)))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m bench.host_overhead', description=__doc__.split('\n')[0])
    parser.add_argument('--models', nargs='+', choices=MODELS, default=list(MODELS))
    parser.add_argument('--steps', type=int, help='steady steps measured (default 10; 2 with --peak-memory, '
                        'whose peak is the same over any number of steady steps)')
    parser.add_argument('--warmup', type=int, default=3, help='steps run before the measured ones (default 3)')
    parser.add_argument('--rehearsal', choices=('auto', 'yes', 'no'), default='auto',
                        help='run in the GPU rehearsal (auto: when no GPU is usable)')
    parser.add_argument('--graphs', choices=('both', 'on', 'off'), default='both',
                        help='K.function CUDA Graph replay (both: one row each)')
    parser.add_argument('--launchers', action='store_true',
                        help='also time single launchers (host µs per call, plain and prepared)')
    parser.add_argument('--dry-launches', action='store_true',
                        help='rehearsal only: launches are checked, not run, so the emulator does not leave the '
                             'host caches cold around them (host times of gpuk\'s Python; counts unchanged, '
                             'trained values meaningless)')
    parser.add_argument('--calls', action='store_true',
                        help='graphs off: one more, profiled step counts the Python calls per launch of its '
                             'launching plan steps (a load-free measure of gpuk\'s Python per launch)')
    parser.add_argument('--peak-memory', action='store_true',
                        help='instead: the peak traced memory (tracemalloc) of a steady plain step in the GPU '
                             'rehearsal with dry launches, with step buffers kept and under GPUK_STEP_BUFFERS=0')
    parser.add_argument('--batch', type=int, help='with --peak-memory: this batch for every model')
    parser.add_argument('--json', help='also write the rows as JSON here')
    args = parser.parse_args(argv)
    for option, value, least in (('--steps', args.steps, 1), ('--warmup', args.warmup, 0), ('--batch', args.batch, 1)):
        if value is not None and value < least:   # (--steps -1 was an IndexError after the run)
            parser.error('%s must be >= %d, got %d' % (option, least, value))
    if args.peak_memory:
        rows = peak_memory_rows(args.models, args.batch, args.steps or 2, args.warmup)
        print('GPU rehearsal, dry launches: peak traced memory (tracemalloc) of a steady plain step\n\n'
              '| model | batch | peak, buffers kept | peak, GPUK_STEP_BUFFERS=0 | ratio | held between steps, kept / '
              'not |\n|---|---|---|---|---|---|')
        for r in rows:
            print('| %(model)s | %(batch)d | %(peak_kept)d | %(peak_not_kept)d | %(ratio).3f | %(held_kept)d / '
                  '%(held_not_kept)d |' % r)
        if args.json:
            with open(args.json, 'w') as f:
                json.dump({'rows': rows}, f, indent=1)
        return rows
    rehearsal = args.rehearsal == 'yes' or (args.rehearsal == 'auto' and not _gpu_available())
    device = setup_device(rehearsal)
    if rehearsal and args.dry_launches:
        dry_launches()
        device += '; dry launches (checked, not run)'
    modes = {'both': (False, True), 'on': (True,), 'off': (False,)}[args.graphs]
    rows = [measure(name, args.steps or 10, args.warmup, graphs, args.calls) for name in args.models for graphs in modes]
    if rehearsal and True in modes:
        print('GPU rehearsal: with graphs on, a replay re-runs gpuk\'s launches, cuBLAS and copies but not the '
              'NumPy work of ops computed with xp, so the trained values are wrong there; the counts and host '
              'times are what this measures.')
    print(report(rows, device))
    launchers = launcher_overhead(rehearsal) if args.launchers else []
    if launchers:
        print('\n| launcher call (small problem) | host µs plain | host µs prepared |\n|---|---|---|')
        for name, plain, prepared in launchers:
            print('| %s | %.2f | %.2f |' % (name, plain, prepared))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'device': device, 'rows': rows, 'launchers': launchers}, f, indent=1)
    return rows


if __name__ == '__main__':
    main()
