"""Kernel performance and correctness without a GPU (issue 21): ``python -m gpuk.kernels.inspect``.

Static half (no GPU, no emulator): variants.py compiles every registered variant with the
AOT build's NVRTC call and disassembles it (sass.py: loops, hot loop, instruction mix);
occupancy.py applies the CUDA occupancy rules; model.py predicts the bound and the
fraction of the H100 roofline; report.py assembles the records, joins the emulator's
dynamic figures and measured GPU rows; baseline.py holds the regression check of
tests/kernels/test_inspect.py. Dynamic half: `emulated` measures each kernel's counters on
the emulated runtime (docs/kernels.md, "Emulated performance counters").
"""
