"""NumPy twins of gpuk/kernels/<family>.py: the CPU path and the oracle of the kernel tests."""
