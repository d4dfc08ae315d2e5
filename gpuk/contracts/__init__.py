"""What every implementation agrees on, written once: argument checks (against an array
namespace ``xp``, so a NumPy twin and its CUDA launcher call the same function), convolution
and pooling geometry, the dtype policy, the list of kernel families.

Imports nothing else of gpuk (import-linter holds it to that in ``make test``).
"""
