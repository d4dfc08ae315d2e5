"""The kernel families: one list for the device, the configuration and the kernels.

Each family is a module of the same name in gpuk/kernels/ (the CUDA launchers) and in
gpuk/cpu_fallback/ (their NumPy twins), with the same functions and signatures.
"""

# matmul: the float16/bfloat16 products of the mixed-precision policies (cuBLAS on a GPU).
FAMILIES = ('elementwise', 'conv', 'pooling', 'batchnorm', 'softmax_xent', 'ctc', 'matmul')

# The families with a cuDNN implementation beside gpuk's kernels: the names GPUK_KERNELS and
# gpuk.config.set_kernels take ('elementwise' is gpuk's own: a bias/activation epilogue and a copy;
# 'matmul' is cuBLAS's).
SELECTABLE_FAMILIES = tuple(f for f in FAMILIES if f not in ('elementwise', 'matmul'))
