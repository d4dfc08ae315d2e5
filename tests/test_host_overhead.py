"""The step counters (gpuk/kernels/runtime/counters.py) and bench.host_overhead count launches,
syncs and allocations of a step correctly, on the CUDA path (the GPU rehearsal, in a fresh
process: it installs process-wide state)."""
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _rehearse(code, timeout=300):
    script = 'from tests import gpu_rehearsal\ngpu_rehearsal.activate()\n' + textwrap.dedent(code)
    result = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, cwd=REPO,
                            env={'PYTHONPATH': str(REPO), 'PATH': '/usr/bin:/bin', 'KERAS_BACKEND': 'gpuk.backend',
                                 'HOME': str(Path.home())}, timeout=timeout)
    assert result.stdout.strip().endswith('ok'), result.stdout + result.stderr
    return result


def test_a_step_counts_its_launches_syncs_and_allocations():
    _rehearse('''
        import numpy as np
        from gpuk import backend as K
        from gpuk.kernels.runtime import counters
        x = K.placeholder((4, 8))
        w = K.variable(np.ones((8, 3), np.float32))
        b = K.variable(np.zeros(3, np.float32))
        h = K.dot(x, w)                                  # MatMul: an xp step (CuPy's GEMM in float32)
        y = K.relu(K.bias_add(h, b))                     # BiasAct: one gpuk launch
        f = K.function([x], [y, h], updates=[K.update(b, b + 1.0)])
        f([np.ones((4, 8), np.float32)])                 # compiles
        with counters.counting() as c:
            out = f([np.ones((4, 8), np.float32)])
        assert np.allclose(out[0], 9.0), out[0]
        assert c.launches == 1 and c.launching_launches == 1, c.as_dict()
        assert c.in_step_syncs == 0, c.as_dict()
        assert c.host_syncs == 2, c.as_dict()            # the two outputs copied back to the host
        # MatMul's product, BiasAct's result and the update b + 1 are new buffers
        assert c.allocations == 3, c.as_dict()
        with counters.counting() as outer:
            f([np.ones((4, 8), np.float32)])
            with counters.counting() as inner:
                K.function([x], [y])([np.ones((4, 8), np.float32)])
        assert inner.launches == 1 and outer.launches == 1, (outer.as_dict(), inner.as_dict())
        from gpuk.kernels import runtime
        rt = runtime.current()
        with counters.counting() as c:                   # a launcher's device-to-host copy
            runtime.to_host(rt, rt.xp.zeros(3))
        assert c.host_syncs == 1
        print('ok')
    ''')


def test_bench_host_overhead_reports_a_steady_mlp_step_without_syncs():
    result = _rehearse('''
        from bench import host_overhead
        row = host_overhead.measure('mlp', steps=2, warmup=1)
        print(row)
        assert row['steady'], row
        assert row['launches'] == 5, row       # 3 bias + relu forward, softmax cross-entropy fwd + bwd
        assert row['syncs_in_step'] == 0 and row['syncs_total'] == 1, row
        assert row['host_us_per_launch'] > 0, row
        print(host_overhead.report([row], 'rehearsal'))
        print('ok')
    ''')
    assert '| mlp | 32 | 5 |' in result.stdout
