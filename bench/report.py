"""Turns a pytest-benchmark results JSON into a markdown table and a PNG plot.

    python -m bench.report RESULTS.json [--out DIR]

Writes DIR/report.md and DIR/report.png (DIR defaults to the JSON's folder) and prints
the table. One row per benchmark: family, case, impl, time, GB/s, TFLOP/s, fraction of
the measured ceiling and the ratio to cuDNN.

Everything is recomputed from each row's median time and the ``extra_info`` the harness
stored (bytes, flops, ceilings), so the report does not trust derived numbers in the
file. ``ratio to cuDNN`` is cuDNN's time over this row's time for the same family and
case: 1.0 is parity, above 1 faster than cuDNN.
"""
import argparse
import json
import math
import os
import sys
from collections import OrderedDict


class ReportRow:
    """One benchmark of the results file, with its derived metrics."""

    def __init__(self, family, case, impl, time_s, bytes_moved=0, flops=0,
                 ceiling_gbps=None, ceiling_tflops=None, device=''):
        self.family = family
        self.case = case
        self.impl = impl
        self.time_s = time_s
        self.bytes_moved = bytes_moved or 0
        self.flops = flops or 0
        self.ceiling_gbps = ceiling_gbps
        self.ceiling_tflops = ceiling_tflops
        self.device = device
        self.ratio_to_cudnn = None

    @property
    def gbps(self):
        return self.bytes_moved / self.time_s / 1e9 if self.bytes_moved else None

    @property
    def tflops(self):
        return self.flops / self.time_s / 1e12 if self.flops else None

    @property
    def ceiling_fraction(self):
        return ceiling_fraction(self.time_s, self.bytes_moved, self.flops,
                                self.ceiling_gbps, self.ceiling_tflops)


def ceiling_fraction(time_s, bytes_moved, flops, ceiling_gbps, ceiling_tflops):
    """Roofline floor over measured time: max(bytes / bandwidth, flops / rate) / time.

    None when neither a byte count with a bandwidth nor a flop count with a rate is known.
    """
    floors = []
    if bytes_moved and ceiling_gbps:
        floors.append(bytes_moved / (ceiling_gbps * 1e9))
    if flops and ceiling_tflops:
        floors.append(flops / (ceiling_tflops * 1e12))
    if not floors or not time_s:
        return None
    return max(floors) / time_s


def _split_name(bench):
    """(family, case, impl) for a row the harness did not label: test name and param id."""
    name = bench.get('name', '?')
    base = name.split('[', 1)[0]
    family = bench.get('group') or (base[5:] if base.startswith('test_') else base)
    params = bench.get('params') or {}
    impl = str(params.get('impl', '?'))
    case = '-'.join('%s=%s' % (k, v) for k, v in sorted(params.items()) if k != 'impl')
    return family, case or (bench.get('param') or ''), impl


def rows_from_results(results):
    """ReportRows of a pytest-benchmark JSON object (already parsed), ratios filled in."""
    if not isinstance(results, dict) or not isinstance(results.get('benchmarks'), list):
        raise ValueError("rows_from_results: results must be a pytest-benchmark JSON object "
                         "with a 'benchmarks' list, got %s" % type(results).__name__)
    rows = []
    for bench in results['benchmarks']:
        stats = bench.get('stats') or {}
        time_s = stats.get('median')
        if not time_s:
            continue
        extra = bench.get('extra_info') or {}
        family, case, impl = _split_name(bench)
        rows.append(ReportRow(
            family=extra.get('family', family), case=str(extra.get('case', case)),
            impl=extra.get('impl', impl), time_s=float(time_s),
            bytes_moved=extra.get('bytes', 0), flops=extra.get('flops', 0),
            ceiling_gbps=extra.get('ceiling_gbps'), ceiling_tflops=extra.get('ceiling_tflops'),
            device=extra.get('device', '')))
    fill_cudnn_ratios(rows)
    return rows


def fill_cudnn_ratios(rows):
    """Sets ``ratio_to_cudnn`` on every row whose (family, case) also has a cudnn row."""
    cudnn_time = {(r.family, r.case): r.time_s for r in rows if r.impl == 'cudnn'}
    for row in rows:
        reference = cudnn_time.get((row.family, row.case))
        row.ratio_to_cudnn = reference / row.time_s if reference else None
    return rows


def format_time(seconds):
    """Seconds in the unit that keeps 3-4 significant digits: s, ms or us."""
    if seconds >= 1:
        return '%.3f s' % seconds
    if seconds >= 1e-3:
        return '%.3f ms' % (seconds * 1e3)
    return '%.2f us' % (seconds * 1e6)


def _fmt(value, pattern):
    return '-' if value is None else pattern % value


def markdown_table(rows):
    """The report table, one line per row, sorted by family, case, impl."""
    lines = ['| family | case | impl | time | GB/s | TFLOP/s | fraction of ceiling | ratio to cuDNN |',
             '| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |']
    for row in sorted(rows, key=lambda r: (r.family, r.case, r.impl)):
        lines.append('| %s | %s | %s | %s | %s | %s | %s | %s |' % (
            row.family, row.case, row.impl, format_time(row.time_s),
            _fmt(row.gbps, '%.1f'), _fmt(row.tflops, '%.2f'),
            _fmt(None if row.ceiling_fraction is None else 100 * row.ceiling_fraction, '%.1f%%'),
            _fmt(row.ratio_to_cudnn, '%.2fx')))
    return '\n'.join(lines) + '\n'


def _geometric_mean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values))


def plot_summary(rows):
    """What the plot shows: ('ratio', {family: {impl: value}}) or ('time', ...).

    Ratio to cuDNN (geometric mean over a family's cases) for families that have a cuDNN
    row; when no family has one, the geometric-mean time per impl instead.
    """
    ratios = OrderedDict()
    for row in sorted(rows, key=lambda r: (r.family, r.impl)):
        if row.ratio_to_cudnn is not None and row.impl != 'cudnn':
            ratios.setdefault(row.family, OrderedDict()).setdefault(row.impl, []).append(row.ratio_to_cudnn)
    kind = 'ratio'
    if not ratios:
        kind = 'time'
        for row in sorted(rows, key=lambda r: (r.family, r.impl)):
            ratios.setdefault(row.family, OrderedDict()).setdefault(row.impl, []).append(row.time_s)
    summary = OrderedDict(
        (family, OrderedDict((impl, _geometric_mean(values)) for impl, values in per_impl.items()))
        for family, per_impl in ratios.items())
    return kind, summary


def write_plot(rows, path):
    """Grouped bars per kernel family (see ``plot_summary``) saved as a PNG at ``path``."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    kind, summary = plot_summary(rows)
    impls = sorted({impl for per_impl in summary.values() for impl in per_impl})
    families = list(summary)
    width = 0.8 / max(len(impls), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(families) + 2), 4.5))
    try:
        for i, impl in enumerate(impls):
            xs = [f + (i - (len(impls) - 1) / 2) * width for f in range(len(families))
                  if impl in summary[families[f]]]
            ys = [summary[family][impl] for family in families if impl in summary[family]]
            ax.bar(xs, ys, width=width, label=impl)
        ax.set_xticks(range(len(families)))
        ax.set_xticklabels(families)
        if kind == 'ratio':
            ax.set_yscale('log')  # numpy rows sit orders of magnitude below the GPU ones
            ax.axhline(1.0, color='black', linewidth=0.8, linestyle='--')
            ax.set_ylabel('speed relative to cuDNN (cuDNN time / time)')
            ax.set_title('Kernel families against cuDNN (geometric mean over cases)')
        else:
            ax.set_yscale('log')
            ax.set_ylabel('median time (s, geometric mean over cases)')
            ax.set_title('Median time per implementation (no cuDNN rows)')
        if impls:
            ax.legend()
        fig.tight_layout()
        fig.savefig(path, format='png', dpi=100)
    finally:
        plt.close(fig)
    return path


def write_report(results_path, out_dir=None):
    """Reads ``results_path``, writes report.md and report.png into ``out_dir``.

    Returns (markdown text, markdown path, png path).
    """
    with open(results_path) as f:
        results = json.load(f)
    rows = rows_from_results(results)
    if not rows:
        raise ValueError('write_report: %s holds no benchmark with a median time' % results_path)
    out_dir = out_dir or os.path.dirname(os.path.abspath(results_path))
    os.makedirs(out_dir, exist_ok=True)
    devices = sorted({r.device for r in rows if r.device})
    text = '# gpuk benchmarks\n\n'
    if devices:
        text += 'Devices: %s\n\n' % ', '.join(devices)
    text += ('Time is the median of many runs. Fraction of ceiling is the roofline floor '
             '(bytes over the measured copy bandwidth, or flops over the measured matrix '
             'rate, whichever is larger) over the time. Ratio to cuDNN is cuDNN time over '
             'this time: above 1 is faster than cuDNN.\n\n')
    text += markdown_table(rows)
    md_path = os.path.join(out_dir, 'report.md')
    with open(md_path, 'w') as f:
        f.write(text)
    png_path = write_plot(rows, os.path.join(out_dir, 'report.png'))
    return text, md_path, png_path


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m bench.report', description=__doc__.split('\n\n')[0])
    parser.add_argument('results', help='pytest-benchmark JSON (--benchmark-json=PATH)')
    parser.add_argument('--out', default=None, help='folder for report.md and report.png')
    args = parser.parse_args(argv)
    try:
        text, md_path, png_path = write_report(args.results, args.out)
    except (OSError, ValueError) as exc:
        print('bench.report: %s' % exc, file=sys.stderr)
        return 1
    print(text)
    print('wrote %s and %s' % (md_path, png_path))
    return 0


if __name__ == '__main__':
    sys.exit(main())
