"""The rows of a results JSON: one per (family, case, impl), over its rounds; references and ratios.

A results file is pytest-benchmark's JSON with one entry per row and round (bench/conftest.py
runs every row in ``--rounds`` interleaved rounds). A row's time is the median of its round
medians; its spread is the largest round median over the smallest, 1.0 for a steady machine.

Each family is compared with one reference implementation, the first of
``REFERENCE_ORDER`` that ran in it: cuDNN on a GPU, else PyTorch (on the GPU, else on the
CPU). A row's relative time is its time over the reference's time for the same case (below
1 is faster than the reference); a family's figure is the geometric mean over its cases.
"""
import math
import statistics
from collections import OrderedDict

REFERENCE_ORDER = ('cudnn', 'torch-cuda', 'torch')
IMPL_LABELS = {'numpy': 'gpuk NumPy', 'gpuk': 'gpuk', 'cudnn': 'cuDNN', 'cupy': 'CuPy',
               'torch': 'PyTorch CPU', 'torch-cuda': 'PyTorch GPU'}
NOISY_SPREAD = 1.5   # a row whose round medians differ by more than this was timed on a busy machine


def impl_label(impl):
    return IMPL_LABELS.get(impl, impl)


class Row:
    """One benchmark row over its rounds, with the harness's extra_info of its first round."""

    def __init__(self, family, case, impl, round_times, extra=None):
        if not round_times:
            raise ValueError('Row: %s %s %s has no round with a median time' % (family, case, impl))
        self.family, self.case, self.impl = family, case, impl
        self.round_times = list(round_times)
        self.extra = dict(extra or {})

    @property
    def key(self):
        return self.family, self.case, self.impl

    @property
    def time_s(self):
        return statistics.median(self.round_times)

    @property
    def spread(self):
        return max(self.round_times) / min(self.round_times)

    @property
    def device(self):
        return self.extra.get('device', '')

    @property
    def gbps(self):
        moved = self.extra.get('bytes') or 0
        return moved / self.time_s / 1e9 if moved else None

    @property
    def tflops(self):
        flops = self.extra.get('flops') or 0
        return flops / self.time_s / 1e12 if flops else None

    @property
    def ceiling_fraction(self):
        return ceiling_fraction(self.time_s, self.extra.get('bytes'), self.extra.get('flops'),
                                self.extra.get('ceiling_gbps'), self.extra.get('ceiling_tflops'))


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
    """(family, case, impl) for an entry the harness did not label: test name and params."""
    name = bench.get('name', '?')
    base = name.split('[', 1)[0]
    family = bench.get('group') or (base[5:] if base.startswith('test_') else base)
    params = {k: v for k, v in (bench.get('params') or {}).items() if k != 'bench_round'}
    impl = str(params.get('impl', '?'))
    case = '-'.join('%s=%s' % (k, v) for k, v in sorted(params.items()) if k != 'impl')
    return family, case or (bench.get('param') or ''), impl


def rows_from_results(results):
    """The Rows of a parsed results JSON, in file order; entries without a median are left out."""
    if not isinstance(results, dict) or not isinstance(results.get('benchmarks'), list):
        raise ValueError("rows_from_results: results must be a pytest-benchmark JSON object "
                         "with a 'benchmarks' list, got %s" % type(results).__name__)
    times, extras = OrderedDict(), {}
    for bench in results['benchmarks']:
        median = (bench.get('stats') or {}).get('median')
        if not median:
            continue
        extra = bench.get('extra_info') or {}
        family, case, impl = _split_name(bench)
        key = (extra.get('family', family), str(extra.get('case', case)), extra.get('impl', impl))
        times.setdefault(key, []).append(float(median))
        extras.setdefault(key, extra)
    return [Row(*key, round_times, extras[key]) for key, round_times in times.items()]


def run_info(results):
    """machine_info['gpuk_bench'] of a results JSON ({} for files from before it existed)."""
    return dict((results.get('machine_info') or {}).get('gpuk_bench') or {})


def run_device(results, rows=None):
    """The device a run ran on: what the run recorded, else its rows' devices joined."""
    device = run_info(results).get('device')
    if device:
        return device
    rows = rows_from_results(results) if rows is None else rows
    return ', '.join(sorted({r.device for r in rows if r.device})) or 'unknown device'


def geometric_mean(values):
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def family_summary(rows):
    """{family: {'reference': impl or None, 'impls': {impl: (geo-mean relative time, cases)},
    'alone': [impls with no reference case], 'worst_spread': float}} in first-seen order."""
    by_family = OrderedDict()
    for row in rows:
        by_family.setdefault(row.family, []).append(row)
    summary = OrderedDict()
    for family, family_rows in by_family.items():
        impls = {r.impl for r in family_rows}
        reference = next((impl for impl in REFERENCE_ORDER if impl in impls), None)
        reference_time = {r.case: r.time_s for r in family_rows if r.impl == reference}
        ratios = OrderedDict()
        for row in family_rows:
            if row.impl != reference and row.case in reference_time:
                ratios.setdefault(row.impl, []).append((row.case, row.time_s / reference_time[row.case]))
        summary[family] = {
            'reference': reference,
            'impls': OrderedDict((impl, (geometric_mean(r for _, r in cases), cases))
                                 for impl, cases in ratios.items()),
            'alone': sorted(impls - set(ratios) - {reference}),
            'worst_spread': max(r.spread for r in family_rows),
        }
    return summary


def suite_summary(rows, families):
    """{(family, suite): {impl: (geo-mean relative time, cases)}} for the rows that name a
    suite (the harness's ``suite=``), each against its family's reference (``families``: the
    rows' family_summary) on the same case: the figures a target is stated in ('conv_fwd',
    'resnet50 bf16': gpuk / cuDNN)."""
    reference_time = {(r.family, r.case): r.time_s for r in rows if r.impl == families[r.family]['reference']}
    ratios = OrderedDict()
    for row in rows:
        suite, ref = row.extra.get('suite'), reference_time.get((row.family, row.case))
        if suite and ref and row.impl != families[row.family]['reference']:
            ratios.setdefault((row.family, suite), OrderedDict()).setdefault(row.impl, []).append(
                (row.case, row.time_s / ref))
    return OrderedDict((key, OrderedDict((impl, (geometric_mean(r for _, r in cases), cases))
                                         for impl, cases in by_impl.items()))
                       for key, by_impl in ratios.items())


def noisy_rows(rows, max_spread=NOISY_SPREAD):
    """Rows timed in more than one round whose spread exceeds ``max_spread``, worst first."""
    return sorted((r for r in rows if len(r.round_times) > 1 and r.spread > max_spread),
                  key=lambda r: r.spread, reverse=True)
