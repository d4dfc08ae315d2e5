"""The NCCL path on one GPU: a 1-rank communicator (gpuk.distributed started without a
launcher, transport='nccl') trains to the same weights as the plain optimizer on the GPU.

In the GPU rehearsal (no GPU: CuPy is a NumPy stand-in) NCCL is standin_nccl's, whose 1-rank
communicator, like the real one, leaves the buffers as they are: the rehearsal runs the
NCCL path's Python (init, the transport, the graph nodes on 'cupy' arrays), not NCCL."""
import sys

import numpy as np
import pytest

import gpuk.distributed as hvd
from gpuk import backend as K
from gpuk.distributed import transport_nccl, world
from tests.distributed import standin_nccl
from tests.distributed.k_models import SGD, mlp

pytestmark = pytest.mark.gpu


@pytest.fixture
def nccl_world(on, monkeypatch):
    on('cuda')
    import cupy
    if getattr(cupy, 'STANDIN', False):
        nccl = standin_nccl.make_nccl([], unique_id=tuple(range(-64, 64)))
        nccl.available = True
        monkeypatch.setitem(sys.modules, 'cupy.cuda.nccl', nccl)
        monkeypatch.setattr(cupy.cuda, 'nccl', nccl, raising=False)
        monkeypatch.setattr(cupy.cuda.Stream, 'wait_event', lambda self, event: None, raising=False)
        monkeypatch.setattr(transport_nccl, 'device_pointer', lambda a: a.__array_interface__['data'][0])
    saved = world._world['transport']
    world.shutdown()
    hvd.init(transport='nccl')
    yield world.transport('nccl_world')
    world._world['transport'] = saved


def test_one_rank_nccl_training_equals_training_without_it(nccl_world):
    assert nccl_world.name == 'nccl' and hvd.size() == 1
    results = []
    for distributed in (False, True):
        params, x, y, loss = mlp()
        opt = hvd.DistributedOptimizer(SGD(0.1), bucket_bytes=100) if distributed else SGD(0.1)
        f = K.function([x, y], [loss], updates=opt.get_updates(loss, params))
        rng = np.random.RandomState(0)
        for _ in range(3):
            f([rng.normal(size=(4, 5)), rng.normal(size=(4, 2))])
        results.append([K.get_value(p) for p in params])
    for plain, with_nccl in zip(*results):
        np.testing.assert_allclose(with_nccl, plain, rtol=1e-6)
    v = K.variable(np.arange(6.0).reshape(2, 3))
    hvd.broadcast_variables([v], 0)
    np.testing.assert_array_equal(K.get_value(v), np.arange(6.0).reshape(2, 3))
