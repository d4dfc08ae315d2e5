"""Keras 3 on JAX: the training steps of bench/bench_keras.py, to compare gpuk's Keras 2.3.1 with.

    PYTHONPATH=/tmp/keras3-site:. KERAS_BACKEND=jax python3 -m bench.keras3_jax [--models mlp,lstm]
        [--precisions float32,mixed_bfloat16] [--warmup 3] [--steps 50] [--json PATH]

Keras 3 and Keras 2.3.1 are both the package ``keras``, so this runs in a process of its own
whose path holds Keras 3 (bench/gpu_session.sh, part ``keras3``, installs the wheels of
.whl/keras3/ into /tmp/keras3-site for it; docs/kernels.md says how to fetch them). Of gpuk it
imports only gpuk.demo's NumPy modules (the ctc model's settings, data and Keras-version-free
network), never its backend. The models and batches are bench/keras_models.py's, as
bench_keras.py's are (ctc: the OCR demo's network, on keras.ops.ctc_loss); before timing, each
model's parameter count must equal keras_models.PARAMS (the count Keras 2.3.1 gives,
tests/keras/test_benchmark_models.py), so both sides train the same network.

A row: ``--warmup`` train_on_batch calls (the first traces and compiles the step with XLA),
then ``--steps`` timed calls, each on the host clock. Keras 3's train_on_batch returns the loss
as a host value, so every timed call waits for its step on the device, as gpuk's does. The
rows have bench_keras.py's fields (family 'keras', case, impl 'keras3 jax' or 'keras3 jax
<policy>', device, dtype, time_s the median, samples_per_s), printed as a table and, with
--json, written as {'device', 'versions', 'rows'}. The JAX device is whatever JAX picks (the
GPU where its CUDA plugin finds one; JAX_PLATFORMS=cpu forces the CPU).
"""
import argparse
import functools
import json
import os
import statistics
import sys
import time
import warnings

from bench import keras_models, runs

PRECISIONS = ('float32', 'mixed_bfloat16', 'mixed_float16')


def parse(argv):
    parser = argparse.ArgumentParser(prog='python -m bench.keras3_jax', description=__doc__.split('\n')[0])
    parser.add_argument('--models', default=','.join(keras_models.BATCH),
                        help='comma-separated, of %s (default: all)' % ', '.join(keras_models.BATCH))
    parser.add_argument('--precisions', default='float32', help='comma-separated Keras dtype policies, of %s'
                        % ', '.join(PRECISIONS))
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--steps', type=int, default=50)
    parser.add_argument('--json', help='also write the rows here')
    args = parser.parse_args(argv)
    args.models = runs.comma_list(args.models)
    args.precisions = runs.comma_list(args.precisions)
    for name, given, known in (('model', args.models, keras_models.BATCH), ('precision', args.precisions,
                                                                            PRECISIONS)):
        unknown = sorted(set(given) - set(known))
        if unknown:
            parser.error('unknown %s(s) %s: of %s' % (name, ', '.join(unknown), ', '.join(known)))
    if args.warmup < 1 or args.steps < 1:
        parser.error('--warmup and --steps must be >= 1 (the first call compiles the step)')
    return args


def _keras3():
    os.environ.setdefault('KERAS_BACKEND', 'jax')
    # keras_models passes input_shape to the first layer, which Keras 2.3.1 needs and 3 accepts
    warnings.filterwarnings('ignore', message='Do not pass an `input_shape`', category=UserWarning)
    # the ctc model's length inputs are int64, as the demo's (Keras 2.3.1) are; JAX without x64
    # holds them as int32, which is what the CTC loss takes them as anyway
    warnings.filterwarnings('ignore', message='Explicitly requested dtype int64', category=UserWarning)
    import keras
    if not keras.__version__.startswith('3.'):
        raise SystemExit('keras3_jax: keras %s from %s is not Keras 3: put its site first on PYTHONPATH'
                         % (keras.__version__, keras.__file__))
    if keras.backend.backend() != 'jax':
        raise SystemExit('keras3_jax: the Keras backend is %r, not jax (KERAS_BACKEND)' % keras.backend.backend())
    return keras


@functools.lru_cache(maxsize=None)
def device_name():
    """The name of the device JAX runs on (found once: every row and JSON write names it)."""
    import jax
    device = jax.devices()[0]
    if device.platform == 'cpu':
        return 'cpu %s x%d' % (runs.cpu_name(), os.cpu_count() or 1)
    return getattr(device, 'device_kind', device.platform)


def measure(keras, model, precision, warmup, steps):
    """One row (see the module docstring) of ``model`` under dtype policy ``precision``."""
    keras.utils.clear_session()
    keras.mixed_precision.set_global_policy(precision)
    try:
        net = keras_models.build(keras, model)
        if net.count_params() != keras_models.PARAMS[model]:
            raise SystemExit('keras3_jax: %s has %d parameters on Keras 3, %d on Keras 2.3.1: not the same network'
                             % (model, net.count_params(), keras_models.PARAMS[model]))
        batch = keras_models.BATCH[model]
        x, y = keras_models.data(model, batch)
        first = float(net.train_on_batch(x, y))
        for _ in range(warmup - 1):
            net.train_on_batch(x, y)
        samples = []
        for _ in range(steps):
            started = time.perf_counter()
            net.train_on_batch(x, y)
            samples.append(time.perf_counter() - started)
        last = float(net.train_on_batch(x, y))
    finally:
        keras.mixed_precision.set_global_policy('float32')
    median = statistics.median(samples)
    return {'family': 'keras', 'case': '%s train step, batch %d' % (model, batch),
            'impl': 'keras3 jax' if precision == 'float32' else 'keras3 jax ' + precision,
            'device': device_name(), 'dtype': precision, 'time_s': median, 'time_s_min': min(samples),
            'samples_per_s': batch / median, 'steps': steps, 'loss_first': first, 'loss_last': last}


def table(rows):
    lines = ['| case | impl | device | ms/step (median) | samples/s | loss first -> last |', '|---|---|---|---:|---:|---|']
    lines += ['| %s | %s | %s | %.3f | %.0f | %.3f -> %.3f |' % (r['case'], r['impl'], r['device'], 1e3 * r['time_s'],
                                                              r['samples_per_s'], r['loss_first'], r['loss_last'])
              for r in rows]
    return '\n'.join(lines)


def main(argv=None):
    args = parse(argv)
    keras = _keras3()
    import jax
    versions = {'keras': keras.__version__, 'jax': jax.__version__, 'jax_backend': jax.default_backend(),
                'python': sys.version.split()[0]}
    print('keras3_jax: keras %(keras)s, jax %(jax)s on %(jax_backend)s' % versions)
    rows = []
    for model in args.models:
        for precision in args.precisions:
            rows.append(measure(keras, model, precision, args.warmup, args.steps))
            print('keras3_jax: %(case)s, %(impl)s: %(time_s).6f s/step' % rows[-1])
            sys.stdout.flush()
            if args.json:   # after every row: a run cut short by the session's budget keeps its rows
                _write_json(args.json, versions, rows)
    print(table(rows))
    return rows


def _write_json(path, versions, rows):
    """The rows so far, replacing the file (in place: a file beside it could be left behind in
    $OUT, whose files the device tool counts)."""
    with open(path, 'w') as f:
        json.dump({'device': device_name(), 'versions': versions, 'rows': rows}, f, indent=1)


if __name__ == '__main__':
    main()
