"""gpuk: a GPU-first Keras 2 backend.

``from gpuk import backend as K`` for the K API, ``KERAS_BACKEND=gpuk.backend`` for Keras
2.3.1. Importing gpuk never needs CuPy or a GPU: the device is chosen on first use
(``GPUK_DEVICE``, see gpuk.device).

``gpuk.OutOfMemoryError`` (a MemoryError) is what a K.function call that runs out of device
memory raises, having changed no variable (gpuk.device.OutOfMemoryError).
"""
__version__ = '0.1.0'


def __getattr__(name):
    # on first use: importing gpuk stays as light as the docstring says (gpuk.device imports
    # the kernel runtime)
    if name == 'OutOfMemoryError':
        from gpuk.device import OutOfMemoryError
        return OutOfMemoryError
    raise AttributeError('module %r has no attribute %r' % (__name__, name))
