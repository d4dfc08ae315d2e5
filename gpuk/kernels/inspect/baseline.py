"""The checked-in baseline (bench/inspect_baseline.json) and the regression check against it.

    python -m gpuk.kernels.inspect --write-baseline     # deliberate: review the diff, commit it
    python -m gpuk.kernels.inspect --check-baseline     # exit 1 on a regression

A record regresses when it gains spills, loses occupancy, or its useful-math fraction or
its coalescing drops by more than 10% (relative) against its baseline entry. Records are
matched by (kernel, .cu file name, arch, config); a record without a baseline entry, or a
baseline entry without a record, is a problem too (a new or renamed kernel or variant
needs a baseline update, like a changed one). Improvements pass; write a new baseline to
hold them.
"""
import json
from pathlib import Path

BASELINE_PATH = Path(__file__).resolve().parents[3] / 'bench' / 'inspect_baseline.json'
KEPT = ('kernel', 'source', 'arch', 'config', 'registers', 'spills', 'smem_bytes', 'occupancy',
        'math_fraction', 'other_per_mma', 'coalescing', 'bank_conflicts_per_request', 'host_syncs_per_call')
RELATIVE_DROP = 0.10


def key(record):
    return (record['kernel'], Path(record['source']).name, record['arch'], record['config'])


def baseline_entries(records):
    """The baseline's view of the records: the compared figures and a few for the reader."""
    entries = [{k: record.get(k) for k in KEPT} for record in records if 'error' not in record]
    return sorted(entries, key=key)


def write(records, path=BASELINE_PATH, nvrtc=None):
    data = {'about': 'python -m gpuk.kernels.inspect --write-baseline; compared by '
                     'tests/kernels/test_inspect.py (docs/kernels.md)',
            'nvrtc': nvrtc, 'records': baseline_entries(records)}
    records = ',\n'.join('  ' + json.dumps(entry, sort_keys=True) for entry in data.pop('records'))
    head = json.dumps(data, sort_keys=True)[:-1]   # one record per line: reviewable diffs
    Path(path).write_text('%s, "records": [\n%s\n]}\n' % (head, records))


def load(path=BASELINE_PATH):
    return json.loads(Path(path).read_text())


def for_archs(baseline_records, archs):
    """The entries a report for ``archs`` is compared with: those of the asked architectures
    and of their arch-specific targets (sm_90 brings sm_90a, as the build does)."""
    return [b for b in baseline_records if b['arch'] in archs or b['arch'].rstrip('a') in archs]


def _dropped(before, after):
    """True when ``after`` is more than RELATIVE_DROP below ``before`` (None: no figure, no check)."""
    if before is None or after is None:
        return False
    return after < before * (1 - RELATIVE_DROP) - 1e-12


def compare(records, baseline_records):
    """Sentences, one per regression or unmatched record; [] when nothing regressed."""
    current = {key(r): r for r in records}
    previous = {key(b): b for b in baseline_records}
    problems = []
    for k, record in sorted(current.items()):
        label = '%s (%s, %s, %s)' % (k[0], k[1], k[2], k[3])
        if 'error' in record:
            problems.append('%s does not compile: %s' % (label, record['error'].splitlines()[0]))
            continue
        before = previous.get(k)
        if before is None:
            problems.append('%s is not in the baseline (new or renamed: write the baseline)' % label)
            continue
        if (record['spills'] or 0) > (before['spills'] or 0):
            problems.append('%s spills %d bytes, baseline %d' % (label, record['spills'], before['spills'] or 0))
        if record['occupancy'] < before['occupancy'] - 1e-9:
            problems.append('%s occupancy %.3f, baseline %.3f (registers %s -> %s, shared memory %s -> %s)'
                            % (label, record['occupancy'], before['occupancy'], before.get('registers'),
                               record.get('registers'), before.get('smem_bytes'), record.get('smem_bytes')))
        for figure in ('math_fraction', 'coalescing'):
            if _dropped(before.get(figure), record.get(figure)):
                problems.append('%s %s %.3f, baseline %.3f (more than %d%% lower)'
                                % (label, figure, record[figure], before[figure], 100 * RELATIVE_DROP))
    for k in sorted(set(previous) - set(current)):
        problems.append('%s (%s, %s, %s) is in the baseline but no longer built (removed or renamed: '
                        'write the baseline)' % k)
    return problems
