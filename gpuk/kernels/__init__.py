"""Handwritten CUDA kernels: <family>.cu beside its <family>.py launcher.

Importing this package never imports CuPy; runtimes load lazily (see runtime/).
Launcher modules are importable as attributes (gpuk.kernels.elementwise).
"""
import importlib

from gpuk.contracts.families import FAMILIES

# Launcher modules; each registers its ahead-of-time build variants at import.
LAUNCHERS = tuple('gpuk.kernels.' + family for family in FAMILIES)


def __getattr__(name):
    module = f"{__name__}.{name}"
    if module in LAUNCHERS:
        return importlib.import_module(module)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
