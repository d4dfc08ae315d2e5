"""Kernel inspection without a GPU: `emulated` measures each kernel's dynamic counters on the
emulated runtime (docs/kernels.md, "Emulated performance counters")."""
