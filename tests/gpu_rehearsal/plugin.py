"""pytest hooks of the GPU rehearsal (tests/conftest.py registers this module when it is active).

- only `gpu` tests run: the others ran in the ordinary suite, and some assume CuPy is absent;
- test_cupy_conformance.py is not collected: it checks our names against the real CuPy,
  and the stand-in has every NumPy name;
- tests that can only pass on real CuPy or a real GPU are skipped with the reason (SKIPS);
- plans keep their elementwise steps unfused unless a test is marked `fuse_elementwise`, as in
  the on_device fixture's 'emulate' case (tests/conftest.py): each fused group would be one
  more emulator compile.
"""
from pathlib import Path

import pytest

CONFORMANCE_TEST = 'test_cupy_conformance.py'
# node id prefix -> why the rehearsal cannot run it (a difference between the stand-in and CuPy)
SKIPS = {
    'tests/test_device.py::test_host_device_copies_round_trip[cuda]':
        'GPU rehearsal: asserts the array type comes from the cupy package; the stand-in\'s ndarray is NumPy\'s',
}


def pytest_report_header(config):
    return ('GPU rehearsal (GPUK_GPU_REHEARSAL=1): cupy is a NumPy stand-in, the \'cuda\' runtime runs kernels '
            'in the emulator, cuDNN is unavailable; only `gpu` tests run')


def pytest_ignore_collect(collection_path, config):
    if Path(collection_path).name == CONFORMANCE_TEST:
        return True
    return None


def pytest_collection_modifyitems(config, items):
    kept, dropped = [], []
    for item in items:
        (kept if 'gpu' in item.keywords else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    for item in items:
        for prefix, reason in SKIPS.items():
            if item.nodeid.startswith(prefix):
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def _elementwise_unfused_unless_marked(request, monkeypatch):
    if request.node.get_closest_marker('fuse_elementwise') is None:
        monkeypatch.setenv('GPUK_FUSE_ELEMENTWISE', '0')
