"""Reports on benchmark runs: one run's summary, table and plot, or two runs compared.

    python -m bench.report RUN.json [--out DIR]
    python -m bench.report BEFORE.json AFTER.json [--allow-different-devices]

RUN may be the word ``latest`` (bench/results/latest names the newest run). One file:
writes ``<stem>.md`` (summary per family, rows that did not run and why, every row) and
``<stem>.png`` (bench/plot.py) beside the JSON or in DIR, and prints the summary. Two
files: prints, per row both ran, AFTER's time over BEFORE's (below 1: AFTER is faster)
and the geometric mean per family; it refuses runs from different devices, whose ratio
would measure the machines, unless --allow-different-devices.

Everything is recomputed from the rows' round medians and the ``extra_info`` the harness
stored (bytes, flops, ceilings); derived numbers in the file are not trusted. The
markdown stays within ~120 characters a line; the JSON has every detail.
"""
import argparse
import json
import os
import sys
import textwrap
from collections import Counter, OrderedDict

from bench import runs
from bench.rows import (NOISY_SPREAD, family_summary, geometric_mean, impl_label, noisy_rows,
                        rows_from_results, run_device, run_info, suite_summary)

CASE_WIDTH = 40
LINE_WIDTH = 110   # prose lines; the tables stay within ~120 characters


def format_time(seconds):
    """Seconds in the unit that keeps 3-4 significant digits: s, ms or us."""
    if seconds >= 1:
        return '%.3f s' % seconds
    if seconds >= 1e-3:
        return '%.3f ms' % (seconds * 1e3)
    return '%.2f us' % (seconds * 1e6)


def _rate(row):
    if row.tflops is not None:
        return '%.3g TFLOP/s' % row.tflops
    if row.gbps is not None:
        return '%.4g GB/s' % row.gbps
    return '-'


def _short(text, width=CASE_WIDTH):
    return text if len(text) <= width else text[:width - 1] + '~'


def load(path):
    with open(runs.resolve(path)) as f:
        results = json.load(f)
    return results, rows_from_results(results)


# ---------------------------------------------------------------- one run

def describe_run(results, rows):
    """Two lines: device, date, mode and rounds; threads and load average."""
    info = run_info(results)
    threads = info.get('threads') or {}
    load_start, load_end = info.get('load_average_start'), info.get('load_average_end')
    started = info.get('started_utc') or (results.get('datetime') or '?')[:19].replace('T', ' ')
    first = '%s; %s UTC; %s run, %s round(s)' % (
        run_device(results, rows), started,
        info.get('mode', '?'), info.get('rounds', '?'))
    second = 'threads: OMP/OpenBLAS/MKL %s, NumPy BLAS reports %s, torch %s; load average %s at start, %s at end' % (
        threads.get('OMP_NUM_THREADS') or 'unset', threads.get('numpy_blas_threads', '?'),
        threads.get('torch_threads', 'not loaded'),
        load_start[0] if load_start else '?', load_end[0] if load_end else '?')
    return first, second


def family_table(families):
    """Markdown: per family and implementation, the time relative to the reference
    (``families``: the rows' family_summary)."""
    lines = ['| family | implementation | time relative to reference | cases | worst spread |',
             '| --- | --- | --- | ---: | ---: |']
    for family, s in families.items():
        for impl, (mean, cases) in s['impls'].items():
            verdict = 'faster' if mean < 1 else 'slower'
            lines.append('| %s | %s | %.2f x %s (%s) | %d | %.2f |' % (
                family, impl_label(impl), mean, impl_label(s['reference']), verdict, len(cases),
                s['worst_spread']))
        for impl in s['alone']:
            why = 'no reference ran' if s['reference'] is None else 'no case shared with %s' % impl_label(
                s['reference'])
            lines.append('| %s | %s | - (%s) | - | %.2f |' % (family, impl_label(impl), why, s['worst_spread']))
    return '\n'.join(lines) + '\n'


def suite_table(rows, families):
    """Markdown: per family, suite and implementation, the time relative to the family's
    reference (``families``: the rows' family_summary) over the suite's cases (empty when no
    row names a suite)."""
    summary = suite_summary(rows, families)
    if not summary:
        return ''
    lines = ['| family | suite | implementation | time relative to reference | cases |',
             '| --- | --- | --- | --- | ---: |']
    for (family, suite), by_impl in summary.items():
        for impl, (mean, cases) in by_impl.items():
            lines.append('| %s | %s | %s | %.2f x %s | %d |' % (family, suite, impl_label(impl), mean,
                                                              impl_label(families[family]['reference']),
                                                              len(cases)))
    return '\n'.join(lines) + '\n'


def skipped_lines(results, limit=8):
    """'- N rows: reason' per distinct reason, most common first."""
    reasons = Counter(entry.get('reason', '?') for entry in results.get('skipped') or [])
    lines = ['- %d row%s: %s' % (n, '' if n == 1 else 's', reason) for reason, n in reasons.most_common(limit)]
    if len(reasons) > limit:
        lines.append('- ... %d more reasons (the JSON lists every row under "skipped")' % (len(reasons) - limit))
    lines += ['- FAILED %s (%s): %s' % (f.get('test'), f.get('when'), f.get('error'))
              for f in results.get('failed') or []]
    return lines


def noise_lines(rows, max_spread=NOISY_SPREAD):
    noisy = noisy_rows(rows, max_spread)
    if not noisy:
        return []
    worst = noisy[0]
    return ['WARNING: %d of %d rows varied by more than %gx between rounds (worst %.2fx: %s %s %s); '
            'the machine was busy, so do not trust those times: rerun on a quiet machine'
            % (len(noisy), len(rows), max_spread, worst.spread, worst.family, _short(worst.case, 30),
               impl_label(worst.impl))]


def rows_table(rows, families):
    """Markdown: every row (case names cut to CASE_WIDTH; the JSON has them whole), against its
    family's reference (``families``: the rows' family_summary)."""
    reference_time = {(r.family, r.case): r.time_s for r in rows if r.impl == families[r.family]['reference']}
    lines = ['| family | case | impl | time | spread | rate | vs ref |',
             '| --- | --- | --- | ---: | ---: | ---: | ---: |']
    for row in sorted(rows, key=lambda r: (r.family, r.case, r.impl)):
        ref = reference_time.get((row.family, row.case))
        lines.append('| %s | %s | %s | %s | %.2f | %s | %s |' % (
            row.family, _short(row.case), row.impl, format_time(row.time_s), row.spread, _rate(row),
            '%.2f' % (row.time_s / ref) if ref else '-'))
    return '\n'.join(lines) + '\n'


def summary_text(results, rows, families, max_spread=NOISY_SPREAD):
    """What ``python -m bench`` prints at the end: run, per-family table, skips, noise
    (``families``: the rows' family_summary)."""
    first, second = describe_run(results, rows)
    parts = ['gpuk bench: ' + first, second, '',
             'Per family, time relative to the reference (geometric mean over cases; below 1 is faster):',
             family_table(families)]
    suites = suite_table(rows, families)
    if suites:
        parts += ['Per suite, the same over the suite\'s cases only:', suites]
    skipped = skipped_lines(results)
    if skipped:
        parts += ['Rows that did not run:'] + [_wrap(line) for line in skipped] + ['']
    parts += [_wrap(line) for line in noise_lines(rows, max_spread)]
    return '\n'.join(parts).rstrip() + '\n'


def _wrap(line):
    return textwrap.fill(line, LINE_WIDTH, subsequent_indent='  ', break_on_hyphens=False)


def write_report(results_path, out_dir=None, max_spread=NOISY_SPREAD):
    """Writes <stem>.md and <stem>.png for one results JSON; returns (summary, md path, png path or None)."""
    from bench import plot
    results_path = runs.resolve(results_path)
    results, rows = load(results_path)
    if not rows:
        raise ValueError('write_report: %s holds no benchmark with a median time' % results_path)
    out_dir = out_dir or os.path.dirname(os.path.abspath(results_path))
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.splitext(os.path.basename(results_path))[0]
    families = family_summary(rows)   # once: the summary, the rows table and the plot all read it
    summary = summary_text(results, rows, families, max_spread)
    md_path = os.path.join(out_dir, stem + '.md')
    with open(md_path, 'w') as f:
        legend = ('Times are medians of each row\'s round medians; spread is the largest round median over '
                  'the smallest; "vs ref" is the time over the reference\'s for the same case (below 1 is '
                  'faster). Every row and round, whole case names and rates: %s.' % os.path.basename(results_path))
        f.write('# gpuk benchmarks\n\n```\n%s```\n\n%s\n\n%s'
                % (summary, textwrap.fill(legend, LINE_WIDTH), rows_table(rows, families)))
    png_path = plot.write_plot(families, os.path.join(out_dir, stem + '.png'),
                               title=describe_run(results, rows)[0])
    return summary, md_path, png_path


# ---------------------------------------------------------------- two runs

class DifferentDevices(ValueError):
    """Two runs from different devices, compared without --allow-different-devices."""


def compare(before_path, after_path, allow_different_devices=False, max_spread=NOISY_SPREAD):
    """The comparison text of two results files (AFTER's time over BEFORE's per row); a ratio
    marked ``noisy`` comes from a row whose rounds varied by more than ``max_spread`` in either
    run, and each run's noise warning follows the tables."""
    before, before_rows = load(before_path)
    after, after_rows = load(after_path)
    devices = run_device(before, before_rows), run_device(after, after_rows)
    if devices[0] != devices[1] and not allow_different_devices:
        raise DifferentDevices(
            'refusing to compare runs from different devices: %s ran on %r, %s on %r; the ratios would '
            'measure the machines, not a change. Pass --allow-different-devices to compare anyway.'
            % (before_path, devices[0], after_path, devices[1]))
    old = OrderedDict((r.key, r) for r in before_rows)
    new = OrderedDict((r.key, r) for r in after_rows)
    shared = [key for key in new if key in old]
    lines = ['Comparing %s (after) with %s (before): after time / before time, below 1 = after is faster.'
             % (after_path, before_path),
             'devices: %s' % (devices[0] if devices[0] == devices[1] else '%s (before) vs %s (after)' % devices)]
    threads = [run_info(r).get('threads', {}).get('OMP_NUM_THREADS') for r in (before, after)]
    if threads[0] != threads[1]:
        lines.append('note: thread counts differ (OMP_NUM_THREADS %s before, %s after)' % tuple(threads))
    lines += ['', '| family | case | impl | before | after | after / before |', '| --- | --- | --- | ---: | ---: | ---: |']
    per_family = OrderedDict()
    noisy = {r.key for r in noisy_rows(before_rows, max_spread) + noisy_rows(after_rows, max_spread)}
    for key in shared:
        ratio = new[key].time_s / old[key].time_s
        per_family.setdefault((key[0], key[2]), []).append(ratio)
        lines.append('| %s | %s | %s | %s | %s | %.2f%s |' % (key[0], _short(key[1]), key[2],
                                                             format_time(old[key].time_s),
                                                             format_time(new[key].time_s), ratio,
                                                             ' noisy' if key in noisy else ''))
    lines += ['', '| family | impl | rows | after / before (geometric mean) |', '| --- | --- | ---: | ---: |']
    lines += ['| %s | %s | %d | %.2f |' % (family, impl, len(ratios), geometric_mean(ratios))
              for (family, impl), ratios in per_family.items()]
    only_before, only_after = len(old) - len(shared), len(new) - len(shared)
    if only_before or only_after:
        lines.append('\n%d row(s) only before, %d only after (not compared).' % (only_before, only_after))
    warnings = [_wrap('%s: %s' % (which, line)) for which, rows in (('before', before_rows), ('after', after_rows))
                for line in noise_lines(rows, max_spread)]
    lines += [''] + warnings if warnings else []
    return '\n'.join(lines) + '\n'


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m bench.report', description=__doc__.split('\n\n')[0])
    parser.add_argument('results', nargs='+', metavar='RESULTS.json',
                        help="one run to report on, or two (before, after) to compare; 'latest' allowed")
    parser.add_argument('--out', default=None, help='folder for <stem>.md and <stem>.png (one run)')
    parser.add_argument('--allow-different-devices', action='store_true',
                        help='compare runs even when they ran on different devices')
    parser.add_argument('--max-spread', type=float, default=NOISY_SPREAD,
                        help='warn about rows whose round medians differ more than this (default %(default)s)')
    args = parser.parse_args(argv)
    if len(args.results) > 2:
        parser.error('give one results file to report on or two to compare, got %d' % len(args.results))
    try:
        if len(args.results) == 2:
            print(compare(*args.results, allow_different_devices=args.allow_different_devices,
                          max_spread=args.max_spread), end='')
            return 0
        summary, md_path, png_path = write_report(args.results[0], args.out, args.max_spread)
    except DifferentDevices as exc:
        print('bench.report: %s' % exc, file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        print('bench.report: %s' % exc, file=sys.stderr)
        return 1
    print(summary, end='')
    print('wrote %s%s' % (md_path, ' and %s' % png_path if png_path else ' (no plot: no family has a reference)'))
    return 0


if __name__ == '__main__':
    sys.exit(main())
