"""The kernel families: one list for the device, the configuration and the kernels.

Each family is a module of the same name in gpuk/kernels/ (the CUDA launchers) and in
gpuk/cpu_fallback/ (their NumPy twins), with the same functions and signatures.
"""

FAMILIES = ('elementwise', 'conv', 'pooling', 'batchnorm', 'softmax_xent', 'ctc')

# The families with a cuDNN implementation beside gpuk's kernels: the names GPUK_KERNELS and
# gpuk.config.set_kernels take ('elementwise' is gpuk's own: a bias/activation epilogue and a copy).
SELECTABLE_FAMILIES = tuple(f for f in FAMILIES if f != 'elementwise')
