"""Planning cuDNN Frontend graphs without a GPU, for the graph tests of tests/kernels
(test_cudnn_graphs.py: convolutions; test_cudnn_batchnorm_graphs.py: batch norm): the
installed frontend, or a skip where it does not import (CI), and an H100 described to
cuDNN's device-less (AOT) heuristics, or a skip where the cuDNN 9 library does not load."""
import json

import pytest

from gpuk.kernels.cudnn import library as cudnn_library

# A device description for cuDNN's device-less (AOT) heuristics: an H100 SXM (sm_90).
H100 = dict(cudaDeviceId=0, deviceName='NVIDIA H100 80GB HBM3', deviceVer=900, driverVer=13000, isTccDriver=0,
            l2CacheSize=50 << 20, maxCtasPerSM=32, maxRegistersPerSM=65536, maxSharedMemoryPerBlock=48 << 10,
            maxSharedMemoryPerBlockOptin=227 << 10, maxThreadsPerBlock=1024, maxThreadsPerSM=2048,
            memClockRateKHz=2619000, memoryBusWidth=5120, multiProcessorCount=132, pciDeviceId=0,
            regsPerBlock=65536, reservedSharedMemoryPerBlock=1024, smClockRateKHz=1980000, smCountOrigin=0,
            supportCoopLaunch=1, totalGlobalMem=80 << 30, warpSize=32, maxBlockSize=[1024, 1024, 64],
            maxGridSize=[2 ** 31 - 1, 65535, 65535])


def frontend_or_skip():
    """The cuDNN Frontend module; skips the test where it does not import."""
    module, reason = cudnn_library._import_frontend()
    if module is None:
        pytest.skip(reason)
    return module


def h100_or_skip(frontend):
    """The H100 as a frontend device_property (needs libcudnn, no GPU); skips where it cannot."""
    library, reason = cudnn_library._load_library()
    if library is None:
        pytest.skip(reason)
    try:
        return frontend._pybind_module.create_device_properties(json.dumps(H100))
    except Exception as exc:
        pytest.skip('this cuDNN cannot describe a device without one: %s' % exc)
