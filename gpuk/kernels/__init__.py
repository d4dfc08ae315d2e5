"""Handwritten CUDA kernels: <family>.cu beside its <family>.py launcher.

Importing this package never imports CuPy; runtimes load lazily (see runtime/).
Launcher modules are importable as attributes (gpuk.kernels.elementwise).
"""
import importlib

# Launcher modules; each registers its ahead-of-time build variants at import.
LAUNCHERS = (
    'gpuk.kernels.softmax_xent',
    'gpuk.kernels.ctc',
    'gpuk.kernels.elementwise',
    'gpuk.kernels.conv',
    'gpuk.kernels.pooling',
    'gpuk.kernels.batchnorm',
)


def __getattr__(name):
    module = f"{__name__}.{name}"
    if module in LAUNCHERS:
        return importlib.import_module(module)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
