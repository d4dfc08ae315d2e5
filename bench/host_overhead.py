"""Host overhead of Keras 2.3.1 training steps on gpuk's CUDA path.

    python -m bench.host_overhead                   # a GPU, or the GPU rehearsal without one
    python -m bench.host_overhead --models mlp --steps 20 --json out.json

For three models (train_on_batch: forward, loss, gradients, Adam update):
- mlp: Dense 784-256-256-10 (relu, softmax), categorical cross-entropy;
- bn_cnn: Conv2D + BatchNormalization + relu + MaxPool, twice, Dense softmax;
- ctc: the demo's OCR model (conv + batch norm + pooling, bidirectional GRU, CTC loss),
  at a small size;
it reports per steady-state step (after warm-up steps that compile kernels and plans):

- launches: gpuk kernel launches + cuBLAS GEMMs (gpuk/kernels/runtime/counters.py; CuPy's
  own elementwise kernels are not counted);
- host_us_per_launch: (step wall time - time inside the device calls) / launches, i.e. the
  Python around each launch (gpuk's, Keras's and the array library's for ops computed with
  xp). In the GPU rehearsal the time inside a launch is the emulator's and is excluded;
  the stand-in's NumPy work for xp ops is not excluded, so the figure is an upper bound;
- syncs_in_step: device-to-host copies inside the compiled plan (the step proper);
  syncs_total adds the copies of the step's outputs back to Keras (the loss);
- allocations: arrays the plan's steps created (outputs owning a new buffer); with a real
  CuPy also pool_mallocs (every memory-pool request, a MemoryHook);
- graph_replays: steps that ran as a CUDA Graph replay.

Without a GPU it runs in the GPU rehearsal (tests/gpu_rehearsal: a NumPy stand-in for CuPy,
kernels in the emulator): counts are the CUDA path's, host times are this CPU's, and
nothing here is a GPU timing.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

MODELS = ('mlp', 'bn_cnn', 'ctc')


def _gpu_available():
    """Asked in a child process: importing the real CuPy here would rule out the rehearsal."""
    code = 'from gpuk.kernels.runtime import gpu_unusable_reason as r; print(r() is None)'
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    return out.stdout.strip().endswith('True')


def setup_device(rehearsal):
    """Point gpuk at the CUDA path: a real GPU, or the rehearsal. Returns a description."""
    os.environ.setdefault('KERAS_BACKEND', 'gpuk.backend')
    os.environ.setdefault('KERAS_HOME', tempfile.mkdtemp(prefix='gpuk-host-overhead-'))
    os.environ['GPUK_DEVICE'] = 'cuda'
    if rehearsal:
        from tests import gpu_rehearsal
        gpu_rehearsal.activate()
        return 'GPU rehearsal (NumPy stand-in for CuPy, kernels in the emulator): host times of this CPU'
    import cupy
    return 'GPU: %s' % cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()


def _mlp(keras, batch):
    layers = keras.layers
    net = keras.models.Sequential([layers.Dense(256, activation='relu', input_shape=(784,)),
                                   layers.Dense(256, activation='relu'), layers.Dense(10, activation='softmax')])
    net.compile(keras.optimizers.Adam(1e-3), 'categorical_crossentropy')
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 784)).astype(np.float32)
    return net, [x], [np.eye(10, dtype=np.float32)[rng.integers(0, 10, batch)]]


def _bn_cnn(keras, batch):
    layers = keras.layers
    stack = [layers.Conv2D(8, 3, use_bias=False, input_shape=(16, 16, 1)), layers.BatchNormalization(),
             layers.Activation('relu'), layers.MaxPooling2D(),
             layers.Conv2D(16, 3, use_bias=False), layers.BatchNormalization(), layers.Activation('relu'),
             layers.MaxPooling2D(), layers.Flatten(), layers.Dense(10, activation='softmax')]
    net = keras.models.Sequential(stack)
    net.compile(keras.optimizers.Adam(1e-3), 'categorical_crossentropy')
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 16, 16, 1)).astype(np.float32)
    return net, [x], [np.eye(10, dtype=np.float32)[rng.integers(0, 10, batch)]]


def _ctc(keras, batch):
    from gpuk.demo import data, model, settings, train
    spec = settings.ModelSpec(conv_filters=(4, 8), dense_units=16, rnn_units=8)
    render = data.RenderSpec()
    dataset = data.make_dataset(batch, seed=0, spec=render)
    height, width = dataset.images.shape[1:3]
    training, _ = model.build_models(height, width, dataset.labels.shape[1], spec)
    inputs = train.model_inputs(dataset, model.time_steps(width))
    return training, inputs, [np.zeros((batch, 1), np.float32)]


BUILDERS = {'mlp': (_mlp, 32), 'bn_cnn': (_bn_cnn, 8), 'ctc': (_ctc, 4)}


def measure(name, steps=10, warmup=3):
    """One row of the report for model ``name`` (see the module docstring)."""
    import keras
    from gpuk.kernels.runtime import counters
    from gpuk.backend import clear_session   # keras.backend (2.3.1) does not re-export it
    clear_session()
    build, batch = BUILDERS[name]
    net, x, y = build(keras, batch)
    for _ in range(warmup):
        net.train_on_batch(x, y)
    walls, rows = [], []
    for _ in range(steps):
        with counters.counting() as c:
            started = time.perf_counter()
            net.train_on_batch(x, y)
            walls.append(time.perf_counter() - started)
        rows.append(c)
    def median_us(values):
        return round(statistics.median(values) * 1e6, 2)

    launches = rows[-1].launches
    return {'model': name, 'batch': batch, 'launches': launches,
            'host_us_per_launch': median_us([r.launching_host_s / r.launching_launches for r in rows])
            if launches else None,
            'host_us_per_launch_min': min(median_us([r.launching_host_s / r.launching_launches])
                                          for r in rows) if launches else None,
            'launching_steps': rows[-1].launching_steps, 'xp_steps': rows[-1].xp_steps,
            'xp_us_per_step': median_us([r.xp_steps_s / max(r.xp_steps, 1) for r in rows]),
            'outside_plan_us': median_us([w - r.device_s - r.launching_host_s - r.xp_steps_s
                                          for w, r in zip(walls, rows)]),
            'syncs_in_step': rows[-1].in_step_syncs, 'syncs_total': rows[-1].host_syncs,
            'allocations': rows[-1].allocations, 'pool_mallocs': rows[-1].pool_mallocs,
            'graph_replays': rows[-1].graph_replays,
            'steady': len({(r.launches, r.allocations, r.host_syncs) for r in rows}) == 1}


# Syncs inside a step that other branches remove (so this bench's 0-sync goal waits on them).
# Implicit syncs (int() of a device scalar) are invisible to the counters in the rehearsal,
# where device arrays are NumPy's: max-pool backward's argmax range check (contracts/
# pooling_checks.py, int(argmax.min()), two per call) is one, in bn_cnn and ctc.
KNOWN_SYNCS = {
    'bn_cnn': 'max-pool backward\'s argmax range check, 2 per pooling backward, implicit, not counted in the '
              'rehearsal (branch k15mem removes them)',
    'ctc': 'CTC forward/backward .get() of labels and lengths (branch k15ctc removes them); max-pool backward\'s '
           'implicit ones as in bn_cnn (k15mem)',
}


def report(rows, device):
    lines = ['device: %s' % device, '',
             '| model | batch | launches/step | host µs/launch (median, min) | xp steps (µs each) | µs outside the plan '
             '| syncs in step | syncs incl. output | allocations/step | pool mallocs | graph replays |',
             '|---|---|---|---|---|---|---|---|---|---|---|']
    for r in rows:
        lines.append('| %(model)s | %(batch)d | %(launches)d | %(host_us_per_launch)s, %(host_us_per_launch_min)s '
                     '| %(xp_steps)d '
                     '(%(xp_us_per_step).1f) | %(outside_plan_us).0f | %(syncs_in_step)d | %(syncs_total)d '
                     '| %(allocations)d | %(pool_mallocs)s | %(graph_replays)d |' % r)
    return '\n'.join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m bench.host_overhead', description=__doc__.split('\n')[0])
    parser.add_argument('--models', nargs='+', choices=MODELS, default=list(MODELS))
    parser.add_argument('--steps', type=int, default=10)
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--rehearsal', choices=('auto', 'yes', 'no'), default='auto',
                        help='run in the GPU rehearsal (auto: when no GPU is usable)')
    parser.add_argument('--json', help='also write the rows as JSON here')
    args = parser.parse_args(argv)
    rehearsal = args.rehearsal == 'yes' or (args.rehearsal == 'auto' and not _gpu_available())
    device = setup_device(rehearsal)
    rows = [measure(name, args.steps, args.warmup) for name in args.models]
    print(report(rows, device))
    for r in rows:
        if r['model'] in KNOWN_SYNCS:
            print('%s: in-step syncs other branches remove: %s' % (r['model'], KNOWN_SYNCS[r['model']]))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'device': device, 'rows': rows}, f, indent=1)
    return rows


if __name__ == '__main__':
    main()
