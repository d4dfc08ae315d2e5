"""bench.report renders a table and a PNG from a pytest-benchmark JSON; the harness pieces
that produce the numbers it reads (replayed samples, ratios, roofline fraction, pools)."""
import json
import struct
import time

import pytest

from bench import harness, report


def _bench(name, median, extra=None, params=None, group=None):
    """One entry in pytest-benchmark's JSON format."""
    return {
        'group': group, 'name': name, 'fullname': 'bench/bench_x.py::' + name,
        'params': params, 'param': name.partition('[')[2].rstrip(']') or None,
        'extra_info': extra or {}, 'options': {'timer': 'replay_clock', 'min_rounds': 5},
        'stats': {'min': median * 0.9, 'max': median * 1.2, 'mean': median * 1.01,
                  'stddev': median * 0.05, 'rounds': 20, 'median': median,
                  'iqr': median * 0.02, 'q1': median * 0.99, 'q3': median * 1.01,
                  'iqr_outliers': 0, 'stddev_outliers': 1, 'outliers': '1;0',
                  'ld15iqr': median * 0.9, 'hd15iqr': median * 1.1, 'ops': 1 / median,
                  'total': median * 20, 'iterations': 1},
    }


def _row(family, case, impl, median, **extra):
    info = dict(family=family, case=case, impl=impl, device='NVIDIA H100 80GB HBM3', **extra)
    return _bench('test_%s[%s-%s]' % (family, impl, case), median, info)


def synthetic_results():
    conv = dict(bytes=int(2e8), flops=int(4e12), ceiling_gbps=3000.0, ceiling_tflops=50.0)
    return {
        'machine_info': {'node': 'x', 'python_version': '3.11'},
        'commit_info': {'id': 'abc', 'dirty': False},
        'benchmarks': [
            _row('conv', 'resnet50-3x3', 'gpuk', 0.125, **conv),
            _row('conv', 'resnet50-3x3', 'cudnn', 0.100, **conv),
            _row('conv', 'resnet50-3x3', 'numpy', 8.0, bytes=int(2e8), flops=int(4e12),
                 ceiling_gbps=20.0, ceiling_tflops=0.5),
            _row('conv', 'mobilenet-dw', 'gpuk', 0.002, bytes=int(3e9), ceiling_gbps=3000.0),
            _row('conv', 'mobilenet-dw', 'cudnn', 0.004, bytes=int(3e9), ceiling_gbps=3000.0),
            _row('ctc', 'warpctc-small', 'gpuk', 0.0005, flops=int(1e9), ceiling_tflops=50.0),
            _row('copy', '1024 MiB', 'gpuk', 0.0008, bytes=2 << 30, ceiling_gbps=2900.0),
            # a row without harness labels: family from the test name, impl from params
            _bench('test_pool[numpy-case1]', 0.5, params={'impl': 'numpy', 'shape': 'case1'}),
            # a row without a median (a failed benchmark) is left out
            dict(_bench('test_broken[gpuk]', 1.0), stats={}),
        ],
        'datetime': '2026-11-22T03:00:00', 'version': '5.2.3',
    }


@pytest.fixture
def results_file(tmp_path):
    path = tmp_path / 'results.json'
    path.write_text(json.dumps(synthetic_results()))
    return path


def _table_rows(text):
    """{(family, case, impl): [time, GB/s, TFLOP/s, fraction, ratio]} from the markdown."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip('|').split('|')]
        if len(cells) == 8 and cells[0] not in ('family', '---'):
            rows[tuple(cells[:3])] = cells[3:]
    return rows


def test_table_has_one_row_per_benchmark_with_computed_metrics(results_file, tmp_path):
    text, md_path, png_path = report.write_report(str(results_file), str(tmp_path / 'out'))
    assert open(md_path).read() == text
    rows = _table_rows(text)
    assert len(rows) == 8  # 9 benchmarks, one without a median
    assert rows[('conv', 'resnet50-3x3', 'gpuk')] == [
        '125.000 ms', '1.6', '32.00', '64.0%', '0.80x']    # 4e12/0.125; (4e12/50e12)/0.125
    assert rows[('conv', 'resnet50-3x3', 'cudnn')] == ['100.000 ms', '2.0', '40.00', '80.0%', '1.00x']
    assert rows[('conv', 'resnet50-3x3', 'numpy')][3:] == ['100.0%', '0.01x']  # 0.1/8
    assert rows[('conv', 'mobilenet-dw', 'gpuk')] == ['2.000 ms', '1500.0', '-', '50.0%', '2.00x']
    assert rows[('ctc', 'warpctc-small', 'gpuk')] == ['500.00 us', '-', '2.00', '4.0%', '-']
    assert rows[('copy', '1024 MiB', 'gpuk')][1] == '%.1f' % ((2 << 30) / 0.0008 / 1e9)
    assert rows[('pool', 'shape=case1', 'numpy')] == ['500.000 ms', '-', '-', '-', '-']
    assert 'NVIDIA H100 80GB HBM3' in text


def test_png_is_written(results_file, tmp_path):
    _, _, png_path = report.write_report(str(results_file), str(tmp_path))
    with open(png_path, 'rb') as f:
        header = f.read(24)
    assert header[:8] == b'\x89PNG\r\n\x1a\n'
    width, height = struct.unpack('>II', header[16:24])
    assert width >= 400 and height >= 300


def test_plot_shows_ratio_per_family_as_geometric_mean():
    kind, summary = report.plot_summary(report.rows_from_results(synthetic_results()))
    assert kind == 'ratio'
    assert list(summary) == ['conv']  # the only family with cuDNN rows
    assert summary['conv']['gpuk'] == pytest.approx((0.8 * 2.0) ** 0.5)
    assert summary['conv']['numpy'] == pytest.approx(0.1 / 8)
    assert 'cudnn' not in summary['conv']


def test_plot_falls_back_to_time_without_cudnn(tmp_path):
    results = synthetic_results()
    results['benchmarks'] = [b for b in results['benchmarks']
                             if (b.get('extra_info') or {}).get('impl') != 'cudnn']
    rows = report.rows_from_results(results)
    assert all(r.ratio_to_cudnn is None for r in rows)
    kind, summary = report.plot_summary(rows)
    assert kind == 'time'
    assert summary['conv']['gpuk'] == pytest.approx((0.125 * 0.002) ** 0.5)
    assert summary['copy'] == {'gpuk': pytest.approx(0.0008)}
    path = report.write_plot(rows, str(tmp_path / 'time.png'))
    assert open(path, 'rb').read(8) == b'\x89PNG\r\n\x1a\n'


def test_cli_writes_report_and_rejects_bad_files(results_file, tmp_path, capsys):
    assert report.main([str(results_file), '--out', str(tmp_path / 'cli')]) == 0
    assert (tmp_path / 'cli' / 'report.md').exists() and (tmp_path / 'cli' / 'report.png').exists()
    assert '| conv | resnet50-3x3 | gpuk |' in capsys.readouterr().out
    bad = tmp_path / 'bad.json'
    bad.write_text(json.dumps({'no': 'benchmarks'}))
    assert report.main([str(bad)]) == 1
    assert "rows_from_results: results must be a pytest-benchmark JSON object" in capsys.readouterr().err


def test_format_time_units():
    assert report.format_time(2.5) == '2.500 s'
    assert report.format_time(0.0125) == '12.500 ms'
    assert report.format_time(3.5e-6) == '3.50 us'


# ---------------------------------------------------------------- harness numbers

def test_ceiling_fraction_is_the_roofline_floor_over_time():
    # 1 GB at 1000 GB/s = 1 ms; 10 GFLOP at 20 TFLOP/s = 0.5 ms; floor 1 ms over 4 ms
    assert report.ceiling_fraction(4e-3, 1e9, 1e10, 1000.0, 20.0) == pytest.approx(0.25)
    assert report.ceiling_fraction(4e-3, 0, 1e10, 1000.0, 20.0) == pytest.approx(0.125)
    assert report.ceiling_fraction(4e-3, 1e9, 0, None, 20.0) is None


def test_row_metrics_and_session_ratios():
    gpuk = dict(harness.row_metrics(0.02, 4e9, 0, 2000.0, None), family='pool', case='a', impl='gpuk')
    assert gpuk['gbps'] == pytest.approx(200.0) and gpuk['ceiling_fraction'] == pytest.approx(0.1)
    cudnn = dict(harness.row_metrics(0.01, 4e9, 0, 2000.0, None), family='pool', case='a', impl='cudnn')
    other = dict(harness.row_metrics(0.01, 4e9, 0, 2000.0, None), family='pool', case='b', impl='gpuk')
    harness.fill_ratios([gpuk, cudnn, other])
    assert gpuk['ratio_to_cudnn'] == pytest.approx(0.5)
    assert cudnn['ratio_to_cudnn'] == pytest.approx(1.0)
    assert other['ratio_to_cudnn'] is None


def test_replay_clock_hands_samples_to_rounds():
    clock = harness.ReplayClock()
    clock.load([0.25, 0.5])
    durations = []
    for _ in range(2):
        start = clock()
        durations.append(clock() - start)
    assert durations == [0.25, 0.5] and clock.pending == 0
    before = time.perf_counter()
    assert clock() >= before  # unloaded: an ordinary clock


@pytest.mark.benchmark(timer=harness.REPLAY_CLOCK)  # what bench/conftest.py adds to every row
def test_record_samples_becomes_the_benchmark_stats(benchmark):
    harness.record_samples(benchmark, [0.003, 0.001, 0.002, 0.004, 0.005])
    assert benchmark.stats.stats.median == pytest.approx(0.003)
    assert benchmark.stats.stats.rounds == 5


def test_pool_size_covers_twice_the_cache():
    assert harness.pool_size(8 << 20, 50 << 20) == 13     # ceil(100 MiB / 8 MiB)
    assert harness.pool_size(2 << 30, 50 << 20) == 1
    assert harness.pool_size(1, 50 << 20) == harness.MAX_POOL_SETS
    with pytest.raises(ValueError, match='pool_size: set_bytes must be > 0, got 0'):
        harness.pool_size(0, 1)


def test_skip_reasons():
    with pytest.raises(ValueError, match="skip_reason: impl must be one of"):
        harness.skip_reason('tensorflow')
    assert harness.skip_reason('numpy') is None
    reason = harness.gpu_unusable_reason()
    if reason is not None:
        assert harness.skip_reason('gpuk') == 'gpuk needs a GPU: %s' % reason
