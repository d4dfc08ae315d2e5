"""bench.report: one run's summary, table and plot; two runs compared (and refused across
devices); the `latest` pointer; the harness pieces that produce the numbers it reads
(replayed samples, ratios, roofline fraction, pools)."""
import json
import os
import struct
import time

import pytest

from bench import harness, plot, report, rows, runs


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


def _row(family, case, impl, median, bench_round=0, **extra):
    info = dict(family=family, case=case, impl=impl, device='NVIDIA H100 80GB HBM3', **extra)
    entry = _bench('test_%s[%s-%s-r%d]' % (family, impl, case, bench_round), median, info)
    entry['params'] = {'impl': impl, 'bench_round': bench_round}
    return entry


def synthetic_results(device='NVIDIA H100 80GB HBM3', scale=1.0):
    """Two rounds of a small GPU run; ``scale`` multiplies every time."""
    conv = dict(bytes=int(2e8), flops=int(4e12), ceiling_gbps=3000.0, ceiling_tflops=50.0)
    benchmarks = []
    for r, jitter in enumerate((1.0, 1.1)):
        t = scale * jitter
        benchmarks += [
            _row('conv', 'resnet50-3x3', 'gpuk', 0.125 * t, r, **conv),
            _row('conv', 'resnet50-3x3', 'cudnn', 0.100 * t, r, **conv),
            _row('conv', 'mobilenet-dw', 'gpuk', 0.002 * t, r, bytes=int(3e9), ceiling_gbps=3000.0),
            _row('conv', 'mobilenet-dw', 'cudnn', 0.004 * t, r, bytes=int(3e9), ceiling_gbps=3000.0),
            _row('softmax', 'fwd 256x1000', 'gpuk', 0.001 * t, r),
            _row('softmax', 'fwd 256x1000', 'torch', 0.004 * t, r),
            _row('ctc', 'warpctc-small', 'gpuk', 0.0005 * t, r, flops=int(1e9), ceiling_tflops=50.0),
        ]
    benchmarks += [
        # a row without harness labels: family from the test name, impl from params
        _bench('test_pool[numpy-case1]', 0.5, params={'impl': 'numpy', 'shape': 'case1'}),
        # a row without a median (a failed benchmark) is left out
        dict(_bench('test_broken[gpuk]', 1.0), stats={}),
    ]
    return {
        'machine_info': {'node': 'x', 'gpuk_bench': {
            'device': device, 'mode': 'full', 'rounds': 2, 'load_average_start': [0.5, 0.4, 0.3],
            'load_average_end': [0.7, 0.5, 0.3], 'threads': {'OMP_NUM_THREADS': '1', 'numpy_blas_threads': 1}}},
        'commit_info': {'id': 'abc', 'dirty': False},
        'benchmarks': benchmarks,
        'skipped': [{'test': 'bench/bench_x.py::test_conv[a-torch-r0]', 'reason': 'PyTorch is not installed'},
                    {'test': 'bench/bench_x.py::test_conv[b-torch-r0]', 'reason': 'PyTorch is not installed'}],
        'datetime': '2026-11-22T03:00:00', 'version': '5.2.3',
    }


def _write(path, results):
    path.write_text(json.dumps(results))
    return str(path)


@pytest.fixture
def results_file(tmp_path):
    return _write(tmp_path / 'run-full.json', synthetic_results())


def _table_rows(text):
    """{(family, case, impl): [time, spread, rate, vs ref]} from the every-row markdown table."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip('|').split('|')]
        if len(cells) == 7 and cells[0] not in ('family', '---'):
            rows[tuple(cells[:3])] = cells[3:]
    return rows


def test_rows_take_the_median_of_round_medians_and_their_spread():
    rows = {r.key: r for r in report.rows_from_results(synthetic_results())}
    assert len(rows) == 8   # 7 labelled rows over two rounds, one unlabelled, one without a median
    gpuk = rows[('conv', 'resnet50-3x3', 'gpuk')]
    assert gpuk.round_times == pytest.approx([0.125, 0.1375])
    assert gpuk.time_s == pytest.approx(0.13125) and gpuk.spread == pytest.approx(1.1)
    assert rows[('pool', 'shape=case1', 'numpy')].round_times == [0.5]


def test_family_summary_uses_cudnn_else_torch_as_reference():
    summary = rows.family_summary(report.rows_from_results(synthetic_results()))
    assert summary['conv']['reference'] == 'cudnn'
    mean, cases = summary['conv']['impls']['gpuk']
    assert mean == pytest.approx((1.25 * 0.5) ** 0.5) and len(cases) == 2
    assert summary['softmax']['reference'] == 'torch'
    assert summary['softmax']['impls']['gpuk'][0] == pytest.approx(0.25)
    assert summary['ctc']['reference'] is None and summary['ctc']['alone'] == ['gpuk']


def test_suite_summary_averages_each_suite_against_the_familys_reference():
    """Rows naming a suite get their own geometric mean per (family, suite), each case against
    the reference's row of the same case; rows without a suite stay out of it."""
    results = synthetic_results()
    for r, jitter in enumerate((1.0, 1.0)):
        results['benchmarks'] += [
            _row('conv', 'resnet50-1x1 tf32', 'gpuk', 0.090 * jitter, r, suite='resnet50 tf32'),
            _row('conv', 'resnet50-1x1 tf32', 'cudnn', 0.100 * jitter, r, suite='resnet50 tf32'),
            _row('conv', 'resnet50-3x3 tf32', 'gpuk', 0.160 * jitter, r, suite='resnet50 tf32'),
            _row('conv', 'resnet50-3x3 tf32', 'cudnn', 0.100 * jitter, r, suite='resnet50 tf32'),
            _row('conv', 'mobilenet-dw2', 'gpuk', 0.001 * jitter, r, suite='mobilenetv2 depthwise'),
            _row('conv', 'mobilenet-dw2', 'cudnn', 0.004 * jitter, r, suite='mobilenetv2 depthwise'),
            _row('conv', 'resnet50-7x7 tf32', 'gpuk', 0.5 * jitter, r, suite='resnet50 tf32'),   # cuDNN did not run
        ]
    table_rows = report.rows_from_results(results)
    families = rows.family_summary(table_rows)
    summary = rows.suite_summary(table_rows, families)
    assert list(summary) == [('conv', 'resnet50 tf32'), ('conv', 'mobilenetv2 depthwise')]
    mean, cases = summary[('conv', 'resnet50 tf32')]['gpuk']
    assert mean == pytest.approx((0.9 * 1.6) ** 0.5) and [c for c, _ in cases] == ['resnet50-1x1 tf32',
                                                                                    'resnet50-3x3 tf32']
    assert summary[('conv', 'mobilenetv2 depthwise')]['gpuk'][0] == pytest.approx(0.25)
    table = report.suite_table(table_rows, families)
    assert '| conv | resnet50 tf32 | gpuk | 1.20 x cuDNN | 2 |' in table
    plain = report.rows_from_results(synthetic_results())
    assert report.suite_table(plain, rows.family_summary(plain)) == ''


def test_report_files_summary_and_table(results_file, tmp_path):
    summary, md_path, png_path = report.write_report(results_file, str(tmp_path / 'out'))
    assert md_path.endswith('run-full.md') and png_path.endswith('run-full.png')
    text = open(md_path).read()
    assert summary in text
    assert 'NVIDIA H100 80GB HBM3; 2026-11-22 03:00:00 UTC; full run, 2 round(s)' in summary
    assert 'load average 0.5 at start, 0.7 at end' in summary
    assert '| conv | gpuk | 0.79 x cuDNN (faster) | 2 | 1.10 |' in summary
    assert '| softmax | gpuk | 0.25 x PyTorch CPU (faster) | 1 | 1.10 |' in summary
    assert '| ctc | gpuk | - (no reference ran) | - | 1.10 |' in summary
    assert '- 2 rows: PyTorch is not installed' in summary
    assert 'WARNING' not in summary
    table = _table_rows(text)
    assert table[('conv', 'resnet50-3x3', 'gpuk')] == ['131.250 ms', '1.10', '30.5 TFLOP/s', '1.25']
    assert table[('conv', 'mobilenet-dw', 'gpuk')] == ['2.100 ms', '1.10', '1429 GB/s', '0.50']
    assert table[('pool', 'shape=case1', 'numpy')] == ['500.000 ms', '1.00', '-', '-']


def test_a_report_summarises_the_families_once(results_file, tmp_path, monkeypatch):
    """The text, the rows table and the plot read one family summary (bench/rows.py)."""
    calls = []

    def counted(table_rows):
        calls.append(len(table_rows))
        return rows.family_summary(table_rows)
    monkeypatch.setattr(report, 'family_summary', counted)
    report.write_report(results_file, str(tmp_path))
    assert len(calls) == 1


def test_markdown_lines_stay_within_120_characters(tmp_path):
    results = synthetic_results()
    long_case = 'resnet50 N=256 down5 1x1/2 1024-2048 bfloat16 with a long tail of words'
    results['benchmarks'] += [_row('conv_wgrad_bfloat16_family', long_case, 'torch-cuda', 1.5e-5)]
    _, md_path, _ = report.write_report(_write(tmp_path / 'wide.json', results), str(tmp_path))
    table_lines = [line for line in open(md_path).read().splitlines() if line.startswith('|')]
    assert max(len(line) for line in table_lines) <= 120


def test_noisy_rows_warn(tmp_path):
    results = synthetic_results()
    for bench in results['benchmarks']:
        if bench['extra_info'].get('impl') == 'torch' and bench['params'].get('bench_round') == 1:
            bench['stats']['median'] *= 3   # one round of one row three times slower
    table_rows = report.rows_from_results(results)
    summary = report.summary_text(results, table_rows, rows.family_summary(table_rows))
    assert ('WARNING: 1 of 8 rows varied by more than 1.5x between rounds (worst 3.30x: softmax fwd 256x1000 '
            'PyTorch CPU)') in summary


def test_png_is_written_with_one_panel_per_family_with_a_reference(results_file, tmp_path):
    _, _, png_path = report.write_report(results_file, str(tmp_path))
    with open(png_path, 'rb') as f:
        header = f.read(24)
    assert header[:8] == b'\x89PNG\r\n\x1a\n'
    width, height = struct.unpack('>II', header[16:24])
    assert 400 <= width <= 1200 and 150 <= height <= 1200   # legible at README width


def test_no_plot_when_no_family_has_a_reference(tmp_path):
    results = synthetic_results()
    results['benchmarks'] = [b for b in results['benchmarks']
                             if (b.get('extra_info') or {}).get('impl') not in ('cudnn', 'torch')]
    families = rows.family_summary(report.rows_from_results(results))
    assert plot.write_plot(families, str(tmp_path / 'none.png')) is None


def test_cli_writes_report_and_rejects_bad_files(results_file, tmp_path, capsys):
    assert report.main([results_file, '--out', str(tmp_path / 'cli')]) == 0
    assert (tmp_path / 'cli' / 'run-full.md').exists() and (tmp_path / 'cli' / 'run-full.png').exists()
    assert '| conv | gpuk | 0.79 x cuDNN (faster) |' in capsys.readouterr().out
    bad = tmp_path / 'bad.json'
    bad.write_text(json.dumps({'no': 'benchmarks'}))
    assert report.main([str(bad)]) == 1
    assert "rows_from_results: results must be a pytest-benchmark JSON object" in capsys.readouterr().err


def test_compare_gives_after_over_before_per_row_and_family(tmp_path, capsys):
    before = _write(tmp_path / 'before.json', synthetic_results())
    after = _write(tmp_path / 'after.json', synthetic_results(scale=0.5))
    assert report.main([before, after]) == 0
    out = capsys.readouterr().out
    assert '| conv | resnet50-3x3 | gpuk | 131.250 ms | 65.625 ms | 0.50 |' in out
    assert '| conv | gpuk | 2 | 0.50 |' in out
    assert 'devices: NVIDIA H100 80GB HBM3' in out


def test_compare_marks_rows_whose_rounds_varied_and_warns_per_run(tmp_path, capsys):
    before = _write(tmp_path / 'before.json', synthetic_results())
    after = _write(tmp_path / 'after.json', synthetic_results(scale=0.5))
    assert report.main([before, after]) == 0   # rounds 1.1x apart: steady enough
    assert 'noisy' not in capsys.readouterr().out
    assert report.main([before, after, '--max-spread', '1.05']) == 0
    out = capsys.readouterr().out
    assert '| conv | resnet50-3x3 | gpuk | 131.250 ms | 65.625 ms | 0.50 noisy |' in out
    assert '\nbefore: WARNING: 7 of 8 rows varied by more than 1.05x' in out
    assert '\nafter: WARNING: 7 of 8 rows varied' in out


def test_compare_refuses_runs_from_different_devices_unless_asked(tmp_path, capsys):
    before = _write(tmp_path / 'h100.json', synthetic_results())
    after = _write(tmp_path / 'cpu.json', synthetic_results(device='cpu AMD EPYC x2', scale=40))
    assert report.main([before, after]) == 2
    captured = capsys.readouterr()
    assert captured.out == ''
    assert ("refusing to compare runs from different devices: %s ran on 'NVIDIA H100 80GB HBM3', %s on "
            "'cpu AMD EPYC x2'" % (before, after)) in captured.err
    assert 'Pass --allow-different-devices to compare anyway' in captured.err
    assert report.main([before, after, '--allow-different-devices']) == 0
    out = capsys.readouterr().out
    assert 'devices: NVIDIA H100 80GB HBM3 (before) vs cpu AMD EPYC x2 (after)' in out
    assert '| conv | gpuk | 2 | 40.00 |' in out


def test_latest_pointer_names_the_newest_run(tmp_path):
    assert runs.read_latest(str(tmp_path)) is None
    with pytest.raises(ValueError, match="no 'latest' run"):
        runs.resolve('latest', str(tmp_path))
    first = runs.new_results_path('cpu AMD EPYC x2', 'full', str(tmp_path))
    open(first, 'w').close()
    second = runs.new_results_path('cpu AMD EPYC x2', 'full', str(tmp_path))
    assert second != first and os.path.basename(first).startswith('cpu-amd-epyc-x2-2')
    assert first.endswith('-full.json')
    runs.write_latest(second)
    assert runs.resolve('latest', str(tmp_path)) == second
    assert runs.resolve(str(tmp_path / 'latest')) == second   # a pointer named by its path
    assert runs.resolve('x.json', str(tmp_path)) == 'x.json'


def test_format_time_units():
    assert report.format_time(2.5) == '2.500 s'
    assert report.format_time(0.0125) == '12.500 ms'
    assert report.format_time(3.5e-6) == '3.50 us'


# ---------------------------------------------------------------- harness numbers

def test_ceiling_fraction_is_the_roofline_floor_over_time():
    # 1 GB at 1000 GB/s = 1 ms; 10 GFLOP at 20 TFLOP/s = 0.5 ms; floor 1 ms over 4 ms
    assert rows.ceiling_fraction(4e-3, 1e9, 1e10, 1000.0, 20.0) == pytest.approx(0.25)
    assert rows.ceiling_fraction(4e-3, 0, 1e10, 1000.0, 20.0) == pytest.approx(0.125)
    assert rows.ceiling_fraction(4e-3, 1e9, 0, None, 20.0) is None


def test_row_metrics():
    info = harness.row_metrics(0.02, 4e9, 0, 2000.0, None)
    assert info['gbps'] == pytest.approx(200.0) and info['ceiling_fraction'] == pytest.approx(0.1)
    assert info['tflops'] is None


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


def test_comma_list_takes_the_bench_scripts_list_arguments():
    assert runs.comma_list('mlp,lstm') == ['mlp', 'lstm']
    assert runs.comma_list(' mlp, lstm ,') == ['mlp', 'lstm']
    assert runs.comma_list('') == []


def test_bench_and_host_overhead_refuse_counts_below_one(capsys):
    """--rounds 0 ran the default rounds silently; host_overhead --steps -1 failed with an
    IndexError after its run."""
    from bench import __main__ as bench_main
    from bench import host_overhead
    for main, argv, message in [(bench_main.parse, ['--rounds', '0'], '--rounds must be >= 1, got 0'),
                                (host_overhead.main, ['--steps', '-1'], '--steps must be >= 1, got -1'),
                                (host_overhead.main, ['--warmup', '-2'], '--warmup must be >= 0, got -2'),
                                (host_overhead.main, ['--peak-memory', '--batch', '0'], '--batch must be >= 1')]:
        with pytest.raises(SystemExit):
            main(argv)
        assert message in capsys.readouterr().err
