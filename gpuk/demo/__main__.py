"""``python -m gpuk.demo``: Keras 2.3.1 on gpuk learns to read strings of digits.

The backend and device are chosen through environment variables, which Keras and gpuk
read once on import — so this module sets them from the flags before importing either.
"""
import os

# The model's matrices are small (e.g. 32x48 @ 48x144 per GRU step): OpenBLAS's thread pool
# costs more than it gains there and, on a loaded host, spins; one thread trained 2.5x faster
# on a shared 2-core machine. OpenBLAS reads this when NumPy is first imported, so it is set
# before anything else is imported; an explicit user setting wins.
os.environ.setdefault('OPENBLAS_NUM_THREADS', '1')

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

DEVICES = ('auto', 'cpu', 'cuda', 'emulate')
PRECISIONS = ('float32', 'tf32', 'mixed_bfloat16', 'mixed_float16')    # gpuk.config.PRECISIONS


def _int_at_least(minimum):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError('expected an integer >= %d, got %r' % (minimum, text)) from None
        if value < minimum:
            raise argparse.ArgumentTypeError('expected an integer >= %d, got %d' % (minimum, value))
        return value
    return parse


_positive_int = _int_at_least(1)


def parse_args(argv=None):
    from gpuk.demo.settings import TrainConfig  # keras-free
    defaults = TrainConfig()
    parser = argparse.ArgumentParser(
        prog='python -m gpuk.demo',
        description='Train a Keras 2.3.1 CNN + GRU with CTC loss on gpuk to read rendered digit strings.')
    parser.add_argument('--epochs', type=_positive_int, default=defaults.epochs,
                        help='training epochs (default %(default)s)')
    parser.add_argument('--batch-size', type=_positive_int, default=defaults.batch_size,
                        help='minibatch size (default %(default)s)')
    parser.add_argument('--device', choices=DEVICES, default=None,
                        help='gpuk device (sets GPUK_DEVICE; default: $GPUK_DEVICE or auto)')
    parser.add_argument('--kernels', default=None, metavar='SPEC',
                        help="kernel implementation per family, e.g. 'conv=cudnn,ctc=gpuk' (sets GPUK_KERNELS)")
    parser.add_argument('--precision', choices=PRECISIONS, default=None,
                        help='precision policy (sets GPUK_PRECISION; default: $GPUK_PRECISION or float32)')
    parser.add_argument('--out', default='demo_output', help='folder for the plot and results (default %(default)s)')
    parser.add_argument('--seed', type=_int_at_least(0), default=defaults.seed,
                        help='seed of the data, the weights and the shuffling (default %(default)s)')
    parser.add_argument('--train-size', type=_positive_int, default=defaults.train_size,
                        help='training images (default %(default)s)')
    parser.add_argument('--val-size', type=_positive_int, default=defaults.val_size,
                        help='held-out images (default %(default)s)')
    return parser, parser.parse_args(argv)


def configure_environment(device, kernels, precision=None):
    """Sets KERAS_BACKEND, GPUK_DEVICE, GPUK_KERNELS and GPUK_PRECISION; must run before keras
    is imported."""
    keras_backend = sys.modules.get('keras.backend')
    if keras_backend is not None and keras_backend.backend() != 'gpuk.backend':
        raise RuntimeError('gpuk.demo: Keras was already imported with the %r backend' % keras_backend.backend())
    os.environ['KERAS_BACKEND'] = 'gpuk.backend'
    if device is not None:
        os.environ['GPUK_DEVICE'] = device
    if kernels is not None:
        os.environ['GPUK_KERNELS'] = kernels
    if precision is not None:
        os.environ['GPUK_PRECISION'] = precision


def describe_implementations():
    """Lines naming the device and, per kernel family, the module that computes it."""
    import gpuk.config
    import gpuk.device
    from gpuk.contracts.families import FAMILIES
    impl = gpuk.device.impl()
    lines = ['device: %s (arrays: %s)' % (gpuk.device.kind(), impl.xp.__name__),
             'kernel choices (GPUK_KERNELS): %s' % ', '.join('%s=%s' % kv for kv in gpuk.config.kernels().items()),
             'precision policy (GPUK_PRECISION): %s' % gpuk.config.precision()]
    modules = ['%s -> %s' % (family, getattr(impl, family).__name__) for family in FAMILIES]
    lines.append('implementations: ' + ', '.join(modules))
    if gpuk.device.kind() != 'cuda':
        lines.append('(the gpuk/cudnn/auto choices apply on cuda; on %s the modules above run)' % gpuk.device.kind())
    return lines


def main(argv=None):
    parser, args = parse_args(argv)
    configure_environment(args.device, args.kernels, args.precision)
    try:
        import gpuk.config  # reads GPUK_KERNELS on first import
        import gpuk.device
        # Applied again explicitly: gpuk may have been imported before (in-process use).
        if args.kernels is not None:
            gpuk.config.set_kernels(args.kernels)
        if args.precision is not None:
            gpuk.config.set_precision(args.precision)
        if args.device is not None:
            gpuk.device.set_device(args.device)
        gpuk.device.kind()
    except (ValueError, RuntimeError) as exc:  # a bad spec, or DeviceError: no usable GPU
        parser.error(str(exc))
    for line in describe_implementations():
        print(line)

    import json
    from dataclasses import asdict

    from gpuk.demo.plot import plot_history
    from gpuk.demo.settings import TrainConfig
    from gpuk.demo.train import train
    config = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, train_size=args.train_size,
                         val_size=args.val_size, seed=args.seed)

    started = time.perf_counter()
    # Keras's progress bar redraws itself with carriage returns: in a file or a pipe that is one
    # line per update, so there it prints one line per epoch (verbose=2) instead.
    results = train(config, verbose=1 if sys.stdout.isatty() else 2)
    total_seconds = time.perf_counter() - started

    print('\nheld-out set (%d strings):' % config.val_size)
    print('  sequence accuracy: greedy %.1f%%, beam search (width %d) %.1f%%'
          % (100 * results.greedy_accuracy, config.beam_width, 100 * results.beam_accuracy))
    print('  character error rate: greedy %.2f%%, beam search %.2f%%'
          % (100 * results.greedy_cer, 100 * results.beam_cer))
    print('  final loss: training %.4f, held-out %.4f'
          % (results.history['loss'][-1], results.history['val_loss'][-1]))
    print('\n  %-10s %-10s %-10s' % ('truth', 'greedy', 'beam'))
    for truth, greedy, beam in results.examples:
        mark = '' if greedy == truth and beam == truth else '   <- wrong'
        print('  %-10s %-10s %-10s%s' % (truth, greedy, beam, mark))

    plot_path = plot_history(results.history, os.path.join(args.out, 'training.png'),
                             title='gpuk OCR demo (%s, %s, %d epochs)'
                             % (gpuk.device.kind(), gpuk.config.precision(), config.epochs))
    summary = {'device': gpuk.device.kind(), 'kernels': gpuk.config.kernels(),
               'precision': gpuk.config.precision(), 'config': asdict(config),
               'history': results.history, 'greedy_accuracy': results.greedy_accuracy,
               'beam_accuracy': results.beam_accuracy, 'greedy_cer': results.greedy_cer,
               'beam_cer': results.beam_cer, 'examples': results.examples,
               'held_out': list(zip(results.val_texts, results.greedy_texts, results.beam_texts)),
               'train_seconds': results.train_seconds, 'total_seconds': total_seconds}
    results_path = os.path.join(args.out, 'results.json')
    with open(results_path, 'w') as f:
        json.dump(summary, f, indent=1)
    print('\ntrained in %.0f s (%.0f s in all); wrote %s and %s'
          % (results.train_seconds, total_seconds, plot_path, results_path))
    return 0


if __name__ == '__main__':
    sys.exit(main())
