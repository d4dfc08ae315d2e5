"""The report's records: static figures (cubin, SASS, occupancy, model), the emulator's
dynamic figures joined on, measured GPU rows beside the prediction; the table and summary.

One record per (kernel, arch, launch configuration); docs/kernels.md explains every key.
"""
import json
import re
import statistics
from pathlib import Path

from . import launches, model, occupancy, sass, variants

# Targets the kernel rewrites are held to (docs/kernels.md, issue 21).
TARGET_FFMA_FRACTION = 0.80
TARGET_OTHER_PER_MMA = 2.0
TARGET_COALESCING = 0.95
# The keys every record has (issue 21's --json contract; a record whose variant does not compile
# has them null, beside its 'error').
REQUIRED_KEYS = ('kernel', 'source', 'family', 'arch', 'config', 'registers', 'spills', 'smem_bytes', 'occupancy',
                 'math_fraction', 'other_per_mma', 'coalescing', 'bank_conflicts_per_request',
                 'host_syncs_per_call', 'predicted_bound', 'predicted_fraction')
DYNAMIC_KEYS = ('coalescing', 'bank_conflicts_per_request', 'global_bytes', 'compulsory_bytes',
                'barriers_per_output', 'atomics', 'host_syncs_per_call')
_SHORT_TYPES = {'float': 'f32', 'double': 'f64', '__half': 'f16', '__nv_bfloat16': 'bf16',
                'unsigned short': 'b16', 'unsigned': 'b32', 'unsigned long long': 'b64'}   # layout.cu moves bits
_CONV_MATH = {'0': 'ffma', '1': 'mma', '2': 'tf32'}
BENCH_FAMILIES = {   # bench family of the op a kernel serves (bench/bench_*.py)
    'conv_igemm_fwd': 'conv_fwd', 'conv_igemm_dgrad': 'conv_dgrad', 'conv_igemm_wgrad': 'conv_wgrad',
    'conv_wgmma_fwd': 'conv_fwd', 'conv_wgmma_dgrad': 'conv_dgrad', 'conv_wgmma_wgrad': 'conv_wgrad',
    'depthwise_fwd': 'depthwise_fwd', 'depthwise_dgrad': 'depthwise_dgrad', 'depthwise_wgrad': 'depthwise_wgrad',
    'copy_bytes': 'copy',
}
BENCH_FAMILY_OF_SOURCE = {'batchnorm': 'batchnorm', 'pooling': 'pooling', 'softmax_xent': 'softmax_xent',
                          'ctc': 'ctc', 'ctc_decode': 'ctc_decode'}
_BENCH_DTYPES = {'float': 'float32', 'double': 'float64', '__half': 'float16', '__nv_bfloat16': 'bfloat16'}


def config_label(defines):
    """A short name for a launch configuration: element type, then the conv tile and math path."""
    parts = [_SHORT_TYPES.get(defines.get('ELEMENT_T'), defines.get('ELEMENT_T', ''))]
    if 'CONV_BM' in defines:
        parts.append('%sx%sx%s' % (defines['CONV_BM'], defines['CONV_BN'], defines['CONV_BK']))
        parts.append(_CONV_MATH.get(defines.get('CONV_MATH'), 'math' + str(defines.get('CONV_MATH'))))
    if 'WG_STAGES' in defines:   # conv_wgmma.cu: 128 x WG_BN tiles, K in 128-byte steps
        parts.append('128x%s wgmma %s stages' % (defines.get('WG_BN', 128), defines['WG_STAGES']))
    return ' '.join(p for p in parts if p)


def unique_labels(specs):
    """{spec: config label}, unique per .cu file: variants the short label does not tell apart
    get the defines in which they differ appended ('f32 THREADS=128')."""
    labels = {spec: config_label(spec.defines_dict) for spec in specs}
    groups = {}
    for spec, label in labels.items():
        groups.setdefault((spec.source_file, label), []).append(spec)
    for (_, label), same in groups.items():
        if len(same) > 1:
            names = sorted({name for spec in same for name in spec.defines_dict})
            differing = [n for n in names if len({spec.defines_dict.get(n) for spec in same}) > 1]
            for spec in same:
                labels[spec] = ' '.join([label] + ['%s=%s' % (n, spec.defines_dict.get(n)) for n in differing])
    return labels


def loop_figures(function):
    """(hot loop summary dict or None, mix used by the model, MMA opcodes, basis)."""
    found = sass.loops(function)
    loop = sass.hot_loop(function, found)
    instructions = loop.instructions if loop else function.instructions
    mix = sass.instruction_mix(instructions)
    mmas = [i.opcode for i in instructions if sass.classify(i) in ('mma', 'wgmma')]
    if loop is None:
        return None, mix, mmas, 'kernel body'
    summary = {'head': '0x%x' % loop.head, 'back_edge': '0x%x' % loop.tail, 'instructions': mix['total'],
               'counts': _json_mix(mix),
               'loops_in_kernel': len(found)}
    return summary, mix, mmas, 'hot loop'


def _json_mix(mix):
    return {key: ({str(bits): n for bits, n in sorted(value.items())} if isinstance(value, dict) else value)
            for key, value in mix.items() if value}


def static_records(compiled):
    """Records (dicts) of every kernel of every CompiledVariant, without dynamic figures."""
    records = []
    labels = unique_labels({variant.spec for variant in compiled})
    for variant in compiled:
        defines = variant.spec.defines_dict
        for kernel in variant.spec.kernels:
            base = {'kernel': kernel, 'source': variants.source_label(variant.spec.source_file),
                    'family': Path(variant.spec.source_file).stem, 'arch': variant.arch,
                    'config': labels[variant.spec], 'defines': defines}
            if variant.error:
                records.append(dict({key: None for key in REQUIRED_KEYS}, **base, error=variant.error))
                continue
            records.append(dict(base, **_kernel_figures(variant, kernel, defines)))
    return records


def _kernel_figures(variant, kernel, defines):
    usage = variant.usage[kernel]
    threads = variant.max_threads.get(kernel, 256)
    dynamic = launches.dynamic_shared_bytes(kernel, defines)
    occ = occupancy.theoretical(variant.arch, threads, usage.registers, usage.shared_bytes + dynamic)
    loop, mix, mmas, basis = loop_figures(variant.functions[kernel])
    mma_count = mix['mma'] + mix['wgmma']
    figures = {
        'threads_per_block': threads, 'registers': usage.registers,
        'spills': usage.spill_stores + usage.spill_loads, 'stack_frame': usage.stack_frame,
        'static_smem_bytes': usage.shared_bytes, 'dynamic_smem_bytes': dynamic,
        'smem_bytes': usage.shared_bytes + dynamic,
        'blocks_per_sm': occ.blocks_per_sm, 'warps_per_sm': occ.warps_per_sm,
        'occupancy': round(occ.occupancy, 4), 'occupancy_limiter': occ.limiter,
        'hot_loop': loop,
        'math_fraction': round(mix['math'] / mix['total'], 4) if loop and mix['total'] else None,
        'ffma_fraction': round(mix['ffma'] / mix['total'], 4) if loop and mix['ffma'] else None,
        'other_per_mma': round((mix['total'] - mma_count) / mma_count, 2) if loop and mma_count else None,
        'math_path': math_path(mix) if loop else None,
        'model_basis': basis, '_mix': mix, '_mmas': mmas,
    }
    figures.update({key: None for key in DYNAMIC_KEYS})
    return figures


def math_path(mix):
    """'mma' (tensor cores), 'ffma' / 'hfma2' / 'dfma' (that instruction is at least half the
    useful math), 'other' (some math), or None (no math in the loop)."""
    if mix['mma'] + mix['wgmma']:
        return 'mma'
    for key in ('ffma', 'hfma2', 'dfma'):
        if mix[key] and 2 * mix[key] >= mix['math']:
            return key
    return 'other' if mix['math'] else None


FFMA_TILE_MINIMUM = 64   # FFMA per iteration of a register-tiled loop (4x4 micro-tile, 4 deep)


def ffma_target_applies(record):
    """The FFMA target is for register-tiled GEMM-like loops (the conv main loops): FFMA is
    most of the loop's math, at least FFMA_TILE_MINIMUM per iteration, on operands staged in
    shared memory (LDS/LDSM in the loop). Elementwise loops full of FFMA (polynomial
    exp/log) are not held to it."""
    counts = (record.get('hot_loop') or {}).get('counts', {})
    return (record.get('math_path') == 'ffma' and counts.get('ffma', 0) >= FFMA_TILE_MINIMUM
            and bool(counts.get('lds') or counts.get('ldsm')))


# ---------------------------------------------------------------- the emulator's figures

def emulated_measure(families=None):
    """The emulator's records (gpuk.kernels.inspect.emulated.measure), or None where that module
    is not there (the report then leaves the dynamic keys null)."""
    try:
        from . import emulated
    except ImportError:
        return None
    return emulated.measure(families)


def _config_matches(record, row):
    """Whether an emulated row ran our configuration: its defines (a dict under 'defines' or
    'config') agree with ours on every define they name; a string config matches our label
    or names our element type as a word ('fwd NHWC 2x8x8x32 -> 64, 3x3 same, f32')."""
    theirs = row.get('defines', row.get('config'))
    if theirs is None:
        return True
    if isinstance(theirs, dict):
        return all(str(record['defines'].get(k)) == str(v) for k, v in theirs.items())
    text = str(theirs)
    element = record['config'].split(' ')[0]
    return text == record['config'] or bool(element and re.search(r'(?<![\w.])%s(?![\w.])' % re.escape(element), text))


def join_emulated(records, emulated):
    """Fills the dynamic keys of each record from the emulated records with the same kernel and
    .cu file name (paths may move; names are unique): the ones whose config matches, else the
    worst over all of that kernel's (lowest coalescing, most conflicts, syncs, ...)."""
    by_kernel = {}
    for row in emulated or ():
        by_kernel.setdefault((row['kernel'], Path(row['source']).name), []).append(row)
    for record in records:
        rows = by_kernel.get((record['kernel'], Path(record['source']).name))
        if not rows:
            continue
        matching = [row for row in rows if _config_matches(record, row)] or rows
        for key in DYNAMIC_KEYS:
            values = [row.get(key) for row in matching if row.get(key) is not None]
            if values:
                record[key] = min(values) if key == 'coalescing' else max(values)
    return records


# ---------------------------------------------------------------- prediction and measurement

def add_predictions(records):
    for record in records:
        if 'error' in record:
            continue
        bound, fraction, times = model.predict(record['_mix'], record['_mmas'], record['warps_per_sm'],
                                               record.get('coalescing'))
        record['predicted_bound'] = bound
        record['predicted_fraction'] = round(fraction, 3) if fraction is not None else None
        record['model_cycles'] = {name: round(t, 1) for name, t in times.items() if t}
    return records


def measured_rows(folder):
    """Benchmark rows (pytest-benchmark extra_info dicts) from every *.json under ``folder``;
    [] when there is none (no GPU session has stored results yet)."""
    rows = []
    for path in sorted(Path(folder).glob('**/*.json')) if Path(folder).is_dir() else ():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for bench in data.get('benchmarks', []) if isinstance(data, dict) else []:
            extra = bench.get('extra_info') or {}
            if extra.get('ceiling_fraction') is not None:
                rows.append(extra)
    return rows


def add_measured(records, rows):
    """measured_fraction: the median fraction of the roofline ('ceiling_fraction') of gpuk's
    benchmark rows of the op this kernel serves, same dtype, on an H100 (sm_90 records only);
    measured_rows: how many. A benchmark times the op (all its kernels), not one kernel."""
    for record in records:
        record['measured_fraction'], record['measured_rows'] = None, 0
        family = BENCH_FAMILIES.get(record['kernel'], BENCH_FAMILY_OF_SOURCE.get(record['family']))
        if record['arch'] != 'sm_90' or family is None:
            continue
        dtype = _BENCH_DTYPES.get(record['defines'].get('ELEMENT_T'))
        found = [row['ceiling_fraction'] for row in rows
                 if row.get('family') == family and row.get('impl') == 'gpuk' and 'H100' in str(row.get('device'))
                 and (row.get('dtype') in (None, dtype))]
        if found:
            record['measured_fraction'] = round(statistics.median(found), 3)
            record['measured_rows'] = len(found)
    return records


# ---------------------------------------------------------------- assembling

def build_records(archs=variants.BASELINE_ARCHS, emulated=None, gpu_results=None, workers=2, cache=None, measure=None):
    """Every record, JSON-ready. ``emulated``: the emulator's records (None: none joined), or
    ``measure``: a function returning them, run in this process while the variants missing from
    the compile cache compile in ``workers`` others (a cold run overlaps the two); ``gpu_results``:
    folder of measured benchmark JSON (bench/gpu-results); ``cache``: the compile cache folder
    (default variants.cache_folder())."""
    pending = variants.PendingCompiles(archs, workers=workers, folder=cache)
    if measure is not None:
        emulated = measure()
    records = static_records(pending.result())
    return finish(records, emulated, measured_rows(gpu_results) if gpu_results else [])


def finish(records, emulated=None, measured=()):
    """Static records -> report records: the emulator's figures joined, predictions, measured
    rows beside them, flags; the model's working keys removed."""
    join_emulated(records, emulated)
    add_predictions(records)
    add_measured(records, measured)
    for record in records:
        record.pop('_mix', None)
        record.pop('_mmas', None)
        record['flags'] = flags(record)
    return records


def flags(record):
    """Short names of the targets a record misses (empty when it meets them or has no figure)."""
    if 'error' in record:
        return ['compile error']
    found = []
    if record['spills']:
        found.append('spills')
    if ffma_target_applies(record) and record['ffma_fraction'] < TARGET_FFMA_FRACTION:
        found.append('ffma<80%')
    if record['other_per_mma'] is not None and record['other_per_mma'] > TARGET_OTHER_PER_MMA:
        found.append('other/mma>2')
    if record['coalescing'] is not None and record['coalescing'] < TARGET_COALESCING:
        found.append('uncoalesced')
    if record['bank_conflicts_per_request']:
        found.append('bank conflicts')
    if record['host_syncs_per_call']:
        found.append('host syncs')
    return found


def _pct(value):
    return '-' if value is None else '%.0f%%' % (100 * value)


def _num(value, pattern='%g'):
    return '-' if value is None else pattern % value


COLUMNS = (('kernel', 28), ('arch', 4), ('config', 19), ('regs', 4), ('spl', 4), ('smem', 6), ('occ', 4),
           ('loop', 5), ('math', 4), ('o/mma', 5), ('coal', 4), ('bound', 11), ('pred', 4), ('meas', 4))


def table(records):
    """Fixed-width text table, one line per record (<= 120 characters)."""
    lines = [' '.join(name.ljust(width) if i < 3 or name == 'bound' else name.rjust(width)
                      for i, (name, width) in enumerate(COLUMNS)).rstrip()]
    for r in sorted(records, key=lambda r: (r['source'], r['kernel'], r['config'], r['arch'])):
        if 'error' in r:
            cells = [r['kernel'], r['arch'][3:], r['config'], 'COMPILE ERROR']
            lines.append(' '.join(c.ljust(w) for c, (_, w) in zip(cells, COLUMNS)))
            continue
        loop = r['hot_loop']
        # arch without 'sm_': 80, 90, 90a
        cells = [r['kernel'][:28], r['arch'][3:], r['config'][:19], str(r['registers']), str(r['spills']),
                 str(r['smem_bytes']), _pct(r['occupancy']), str(loop['instructions']) if loop else '-',
                 _pct(r['math_fraction']), _num(r['other_per_mma'], '%.0f'), _pct(r['coalescing']),
                 r['predicted_bound'], _pct(r['predicted_fraction']), _pct(r['measured_fraction'])]
        lines.append(' '.join(c.ljust(w) if i < 3 or COLUMNS[i][0] == 'bound' else c.rjust(w)
                              for i, (c, (_, w)) in enumerate(zip(cells, COLUMNS))).rstrip())
    return '\n'.join(lines)


def summary(records):
    """The one-line summary: coverage and how many records meet each target."""
    ok = [r for r in records if 'error' not in r]
    sources = {r['source'] for r in records}
    archs = sorted({r['arch'] for r in records})
    ffma = [r for r in ok if ffma_target_applies(r)]
    mma = [r for r in ok if r['other_per_mma'] is not None]
    coal = [r for r in ok if r['coalescing'] is not None]
    syncs = [r for r in ok if r['host_syncs_per_call'] is not None]
    errors = len(records) - len(ok)
    parts = ['inspect: %d records (%d kernels, %d .cu, sm %s)' % (
                len(records), len({(r['kernel'], r['source']) for r in records}), len(sources),
                '+'.join(a[3:] for a in archs))
             + (' COMPILE ERRORS %d' % errors if errors else ''),
             'spills %d' % sum(1 for r in ok if r['spills']),
             'FFMA>=80%% %d/%d' % (sum(r['ffma_fraction'] >= TARGET_FFMA_FRACTION for r in ffma), len(ffma)),
             'o/MMA<=2 %d/%d' % (sum(r['other_per_mma'] <= TARGET_OTHER_PER_MMA for r in mma), len(mma)),
             'coal>=95%% %d/%d' % (sum(r['coalescing'] >= TARGET_COALESCING for r in coal), len(coal))
             if coal else 'coal n/a']
    if syncs:
        parts.append('0 syncs %d/%d' % (sum(not r['host_syncs_per_call'] for r in syncs), len(syncs)))
    return '; '.join(parts)
