"""python -m gpuk.kernels.inspect [--json PATH] [--arch sm_90,sm_80] [--no-emulate]
                                [--write-baseline | --check-baseline] [--dump-loop KERNEL]

Prints a one-line summary, then a table of every kernel of every .cu file in every launch
configuration the launchers register (docs/kernels.md, "Reading the inspect report").
No GPU needed: NVRTC and nvdisasm from pip; compiled variants are cached.
By default for the H100 (sm_90, with sm_90a); the baseline options cover sm_80 too.

Exit status: 0; 1 with --check-baseline when a kernel regressed against
bench/inspect_baseline.json; 2 when NVRTC or nvdisasm is missing.
"""
import argparse
import difflib
import functools
import json
import sys
from pathlib import Path

from ..runtime import build
from .. import runtime
from . import baseline, occupancy, report, sass, variants

GPU_RESULTS = Path(__file__).resolve().parents[3] / 'bench' / 'gpu-results'


def dump_loop(name, archs):
    """The hot loop of every variant of kernel ``name``: listing and counts by opcode (hand
    checks); False when no registered variant has that kernel."""
    specs = [spec for spec in runtime.registered_builds() if name in spec.kernels]
    for variant in variants.compile_all(archs, specs=specs):
        if variant.error:
            print('== %s %s: COMPILE ERROR %s' % (name, variant.arch, variant.error))
            continue
        loop = sass.hot_loop(variant.functions[name])
        print('== %s %s %s' % (name, variant.arch, report.config_label(variant.spec.defines_dict)))
        if loop is None:
            print('no loop')
            continue
        for instruction in loop.instructions:
            print('  /*%04x*/ %s %s %s' % (instruction.offset, instruction.predicate or '',
                                           instruction.opcode, instruction.operands))
        print('  %d instructions; by opcode: %s' % (len(loop.instructions), sass.opcode_counts(loop.instructions)))
    return bool(specs)


def kernel_names_hint(name):
    """The registered kernel names closest to ``name`` (or all of them), for an error message."""
    names = sorted({kernel for spec in runtime.registered_builds() for kernel in spec.kernels})
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.5) or [n for n in names if name in n]
    if close:
        return 'did you mean %s?' % ', '.join(close)
    return 'kernels: %s' % ', '.join(names)


def chosen_archs(arch_option, baseline_run):
    """--arch's architectures; without it the baseline's for a baseline run, else the default."""
    if arch_option:
        return build.parse_archs(arch_option)
    return variants.BASELINE_ARCHS if baseline_run else variants.DEFAULT_ARCHS


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m gpuk.kernels.inspect', description=__doc__.split('\n\n')[1])
    parser.add_argument('--json', metavar='PATH', help='write the records as a JSON list')
    parser.add_argument('--arch', help='comma-separated architectures (default %s; %s with --write-baseline '
                        'or --check-baseline)' % (','.join(variants.DEFAULT_ARCHS), ','.join(variants.BASELINE_ARCHS)))
    parser.add_argument('--no-emulate', action='store_true', help="skip the emulator's dynamic figures")
    parser.add_argument('--families', help='emulate only these comma-separated families')
    parser.add_argument('--write-baseline', action='store_true', help='write bench/inspect_baseline.json')
    parser.add_argument('--check-baseline', action='store_true', help='exit 1 on a regression against it')
    parser.add_argument('--dump-loop', metavar='KERNEL', help="print KERNEL's hot loop and its opcode counts")
    parser.add_argument('--quiet', action='store_true', help='print the summary line only')
    args = parser.parse_args(argv)
    try:
        archs = chosen_archs(args.arch, args.write_baseline or args.check_baseline)
        nvrtc = '%d.%d' % build.nvrtc_version()
        sass.find_tool('nvdisasm')
    except ValueError as exc:
        parser.error(str(exc))
    except (build.NvrtcMissing, sass.ToolMissing) as exc:
        print('inspect: %s' % exc, file=sys.stderr)
        return 2
    unknown = [a for a in archs if a not in occupancy.LIMITS]
    if unknown:
        parser.error('--arch: no occupancy limits for %s (have %s)' % (unknown, ', '.join(occupancy.LIMITS)))
    if args.write_baseline and set(archs) != set(variants.BASELINE_ARCHS):
        parser.error('--write-baseline: the baseline holds %s; got --arch %s'
                     % (','.join(variants.BASELINE_ARCHS), ','.join(archs)))
    families = args.families.split(',') if args.families else None
    if families and not args.no_emulate:
        try:
            from .emulated import FAMILIES   # optional: report.emulated_measure
        except ImportError:
            FAMILIES = families
        if not set(families) <= set(FAMILIES):
            parser.error('--families: %s not among %s'
                         % (','.join(f for f in families if f not in FAMILIES), ','.join(FAMILIES)))
    if args.dump_loop:
        if not dump_loop(args.dump_loop, archs):
            parser.error('--dump-loop: no registered kernel named %r; %s'
                         % (args.dump_loop, kernel_names_hint(args.dump_loop)))
        return 0
    # the emulator measures in this process while the variants missing from the cache compile
    measure = None if args.no_emulate else functools.partial(report.emulated_measure, families)
    records = report.build_records(archs, gpu_results=GPU_RESULTS, measure=measure)
    emulated = any(r.get('host_syncs_per_call') is not None for r in records)
    print(report.summary(records) + ('' if emulated else ' (no emulator)'))
    if not args.quiet:
        print(report.table(records))
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1) + '\n')
    if args.write_baseline:
        baseline.write(records, nvrtc=nvrtc)
        print('inspect: wrote %s' % baseline.BASELINE_PATH)
    if args.check_baseline:
        problems = baseline.compare(records, baseline.for_archs(baseline.load()['records'], archs))
        for sentence in problems:
            print('inspect: ' + sentence, file=sys.stderr)
        return 1 if problems else 0
    return 0


if __name__ == '__main__':
    sys.exit(main())
