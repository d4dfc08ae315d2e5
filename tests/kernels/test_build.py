"""gpuk.kernels.build: NVRTC ahead-of-time compile of every registered kernel, the ptxas
resource report, spill policy and exit codes. Needs the NVRTC wheels (test extras), no GPU."""
import dataclasses
import threading
import time

import pytest

from gpuk.kernels import runtime
from gpuk.kernels.runtime import build

SPILLING_SOURCE = r'''
// 96 live floats under a 32-register cap (1024 threads x 2 blocks per SM): spills.
extern "C" __global__ void __launch_bounds__(1024, 2)
spiller(const float* __restrict__ x, float* __restrict__ y) {
    float v[96];
    float a = x[threadIdx.x];
#pragma unroll
    for (int i = 0; i < 96; ++i) { a = a * x[i] + 1.0f; v[i] = a; }
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 96; ++i) s = s * v[95 - i] + v[i];
    y[threadIdx.x] = s;
}
'''

SHARED_SOURCE = r'''
#include "common.cuh"
#ifndef TILE
#define TILE 128
#endif
extern "C" __global__ void tiled(const float* __restrict__ x, float* __restrict__ y, long long n) {
    __shared__ float tile[TILE];
    long long i = global_thread_index();
    tile[threadIdx.x] = i < n ? x[i] : 0.f;
    __syncthreads();
    if (i < n) y[i] = tile[(threadIdx.x + 1) % TILE];
}
'''

# ptxas -v as CUDA 13 prints it, plus a non-inlined device function that spills.
LOG_13 = """ptxas info    : 0 bytes gmem
ptxas info    : Function properties for _Z6helperPf
ptxas         .     48 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Compiling entry function 'first' for 'sm_90'
ptxas info    : Function properties for first
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 4096 bytes smem
ptxas info    : Compiling entry function 'second' for 'sm_90'
ptxas info    : Function properties for second
ptxas         .     64 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers, 64 bytes cumulative stack size
ptxas info    : Compile time = 5.0 ms
"""
# the older wording: no barrier count, smem before cmem
LOG_OLD = """ptxas info    : Compiling entry function 'k' for 'sm_80'
ptxas info    : Function properties for k
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 18 registers, 2048 bytes smem, 360 bytes cmem[0]
"""


def test_parse_ptxas_log_cuda13_wording():
    usage = build.parse_ptxas_log(LOG_13)
    assert usage['first'] == build.ResourceUsage(40, 4096, 0, 0, 0)
    assert usage['second'] == build.ResourceUsage(255, 0, 64, 4, 4)
    assert usage['_Z6helperPf'] == build.ResourceUsage(None, 0, 48, 8, 12)


def test_parse_ptxas_log_older_wording():
    assert build.parse_ptxas_log(LOG_OLD) == {'k': build.ResourceUsage(18, 2048, 0, 0, 0)}


def test_kernel_usage_counts_every_spill_and_requires_every_kernel():
    usage, spilled = build.kernel_usage(LOG_13, ['first'])
    assert list(usage) == ['first'] and spilled == 8 + 12 + 4 + 4
    with pytest.raises(build.BuildError, match="kernel 'third': no resource report"):
        build.kernel_usage(LOG_13, ['first', 'third'])


def test_compile_reports_real_resources():
    source = SHARED_SOURCE.replace('#include "common.cuh"', '#include "common.cuh"\n#define TILE 256')
    cubin, log = build.compile_cubin(source, 'tiled.cu', 'sm_90')
    assert cubin[:4] == b'\x7fELF'
    usage, spilled = build.kernel_usage(log, ['tiled'])
    assert usage['tiled'].shared_bytes == 256 * 4 and 0 < usage['tiled'].registers <= 255
    assert spilled == 0


def test_compile_error_carries_the_compiler_message():
    with pytest.raises(build.BuildError) as info:
        build.compile_cubin('extern "C" __global__ void k() { undeclared_name = 1; }', 'bad.cu', 'sm_80')
    assert 'bad.cu (sm_80) does not compile' in str(info.value)
    assert 'undeclared_name' in str(info.value)


def _spec(tmp_path, text, kernels, may_spill=False, name='case.cu', defines=None):
    path = tmp_path / name
    path.write_text(text)
    return runtime.BuildSpec(str(path), tuple(sorted((defines or {}).items())), tuple(kernels), may_spill)


def test_spills_fail_only_where_not_allowed(tmp_path):
    strict = build.cached_build(_spec(tmp_path, SPILLING_SOURCE, ['spiller']), 'sm_80', tmp_path / 'cache')
    assert strict.error is None and strict.spilled > 0
    assert strict.usage['spiller'].spill_stores > 0
    [sentence] = build.problems([strict])
    assert 'spills' in sentence and 'may_spill=False' in sentence
    allowed = strict._replace(spec=dataclasses.replace(strict.spec, may_spill=True))
    assert build.problems([allowed]) == []
    assert '(spills allowed)' in build.format_table([allowed])
    assert 'SPILLS' in build.format_table([strict])


def test_install_writes_the_runtime_cubin_name(tmp_path):
    spec = _spec(tmp_path, SHARED_SOURCE, ['tiled'], defines={'TILE': '64'})
    result = build.install(build.cached_build(spec, 'sm_90', tmp_path / 'cache'), tmp_path / 'out')
    expected = runtime.cubin_path(spec.source_file, {'TILE': '64'}, 'sm_90').name
    assert result.error is None and result.path == tmp_path / 'out' / expected
    assert result.path.read_bytes()[:4] == b'\x7fELF'
    assert result.usage['tiled'].shared_bytes == 64 * 4   # the define reached the compile
    assert not list((tmp_path / 'out').glob('*.tmp'))


def test_main_builds_every_registered_variant(tmp_path, capsys, monkeypatch):
    # Two real registrations stand for the registry: `make test` compiles the whole registry
    # once already (`python -m gpuk.kernels.build --check`), and so does the inspect baseline test.
    builds = runtime.registered_builds()
    assert builds, 'no kernel registered'
    builds = [builds[0], builds[-1]]
    monkeypatch.setattr(runtime, 'registered_builds', lambda: list(builds))
    assert build.main(['--out', str(tmp_path), '--arch', 'sm_80,sm_90', '--table']) == 0
    out = capsys.readouterr().out
    written = sorted(p.name for p in tmp_path.glob('*.cubin'))
    assert written == sorted(runtime.cubin_path(s.source_file, dict(s.defines), arch).name
                             for s in builds for arch in s.build_archs(('sm_80', 'sm_90')))
    for spec in builds:
        for kernel in spec.kernels:   # one table line per arch at least
            assert out.count('\n%s ' % kernel) >= len(spec.build_archs(('sm_80', 'sm_90')))


def test_arch_specific_variants_build_for_their_family_only():
    """The Hopper convolution is registered for sm_90a: built when sm_90 is asked for, never for sm_80."""
    from gpuk.kernels.conv import wgmma
    specs = [s for s in runtime.registered_builds() if s.source_file.endswith('conv_wgmma.cu')]
    assert len(specs) == len(wgmma.DTYPES) * len(wgmma.BLOCK_NS) and all(s.archs == ('sm_90a',) for s in specs)
    assert {int(s.defines_dict['WG_BN']) for s in specs} == set(wgmma.BLOCK_NS)   # every tile of the table
    assert specs[0].build_archs(('sm_80', 'sm_90')) == ('sm_90a',)
    assert specs[0].build_archs(('sm_80',)) == ()
    assert runtime.normalize_arch('sm_90a') == 'sm_90a' and runtime.normalize_arch(90) == 'sm_90'
    with pytest.raises(ValueError, match="sm_90a"):
        runtime.normalize_arch('sm_9x')
    others = [s for s in runtime.registered_builds() if s.archs is None]
    assert others and others[0].build_archs(('sm_80', 'sm_90')) == ('sm_80', 'sm_90')


def test_main_check_writes_nothing_and_fails_on_errors(tmp_path, capsys, monkeypatch):
    bad = _spec(tmp_path, 'extern "C" __global__ void k() { nope(); }', ['k'])
    good = _spec(tmp_path, SHARED_SOURCE, ['tiled'], name='good.cu')
    monkeypatch.setattr(runtime, 'registered_builds', lambda: [good, bad])
    monkeypatch.setenv('GPUK_CUBIN_DIR', str(tmp_path / 'cubins'))
    assert build.main(['--check', '--arch', 'sm_90', '--table']) == 1
    captured = capsys.readouterr()
    assert 'COMPILE ERROR' in captured.out and 'tiled' in captured.out
    assert 'case.cu' in captured.err and 'nope' in captured.err
    assert not (tmp_path / 'cubins').exists()


def test_main_prints_one_summary_line_by_default(tmp_path, capsys, monkeypatch):
    tiled = _spec(tmp_path, SHARED_SOURCE, ['tiled'], name='good.cu')
    spiller = _spec(tmp_path, SPILLING_SOURCE, ['spiller'], may_spill=True)
    monkeypatch.setattr(runtime, 'registered_builds', lambda: [tiled, spiller])
    assert build.main(['--check', '--arch', 'sm_80,sm_90']) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 1, out
    assert '2 variants (2 kernels) compiled for sm_80, sm_90; most registers' in out
    assert '; 2 build(s) spill (all allowed) (--table: per kernel)' in out


def test_main_without_nvrtc_exits_2(monkeypatch, capsys):
    def missing():
        raise build.NvrtcMissing('NVRTC bindings not found (pip install cuda-bindings nvidia-cuda-nvrtc)')
    monkeypatch.setattr(build, '_nvrtc_module', missing)
    assert build.main(['--check']) == 2
    assert 'pip install cuda-bindings' in capsys.readouterr().err


def test_parse_archs():
    assert build.parse_archs('sm_80, 90') == ('sm_80', 'sm_90')
    with pytest.raises(ValueError, match="build: --arch must list architectures"):
        build.parse_archs(' , ')
    with pytest.raises(ValueError, match="arch must look like 'sm_90'"):
        build.parse_archs('hopper')


def _fake_entry(tmp_path, monkeypatch):
    """A variant whose 'compile' is a stand-in that counts its calls (no NVRTC needed), and a
    fixed compiler identity, for the cache's locking."""
    source = tmp_path / 'locked.cu'
    source.write_text('extern "C" __global__ void k() {}\n')
    spec = runtime.BuildSpec(str(source), (), ('k',))
    calls = []

    def compile_variant(spec, arch):
        calls.append(arch)
        time.sleep(0.2)   # long enough for the other caller to arrive while this one compiles
        return b'\x7fELF cubin', {'k': build.ResourceUsage(8, 0, 0, 0, 0)}, 0
    monkeypatch.setattr(build, 'compile_variant', compile_variant)
    return spec, calls, ('test compiler',)


@pytest.mark.skipif(build.fcntl is None, reason='entry locks need fcntl (POSIX)')
def test_an_entry_being_filled_elsewhere_is_waited_for_not_compiled_again(tmp_path, monkeypatch):
    """build --check beside the test suite, or two inspect runs: a caller that finds an entry
    locked waits, then reads what the holder wrote; two callers missing it compile it once."""
    spec, calls, identity = _fake_entry(tmp_path, monkeypatch)
    cubin, report = build.cached_paths(spec, 'sm_90', tmp_path / 'cache', identity)
    results = []
    with build.entry_lock(cubin):   # another process is compiling this entry
        waiter = threading.Thread(target=lambda: results.append(
            build.cached_build(spec, 'sm_90', tmp_path / 'cache', identity)))
        waiter.start()
        waiter.join(0.3)
        assert waiter.is_alive() and not results   # waiting on the lock, not compiling
        build.write_atomically(cubin, b'\x7fELF from the holder')
        build.write_atomically(report, '{"usage": {"k": {"registers": 9, "shared_bytes": 0, "stack_frame": 0, '
                                       '"spill_stores": 0, "spill_loads": 0}}, "spilled": 0}')
    waiter.join()
    assert calls == [] and results[0].usage['k'].registers == 9 and results[0].error is None

    callers = [threading.Thread(target=lambda: results.append(
        build.cached_build(spec, 'sm_80', tmp_path / 'cache', identity))) for _ in range(2)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert calls == ['sm_80'] and [r.usage['k'].registers for r in results[1:]] == [8, 8]
