"""gpuk: a GPU-first Keras 2 backend.

``from gpuk import backend as K`` for the K API, ``KERAS_BACKEND=gpuk.backend`` for Keras
2.3.1. Importing gpuk never needs CuPy or a GPU: the device is chosen on first use
(``GPUK_DEVICE``, see gpuk.device).
"""
__version__ = '0.1.0'
