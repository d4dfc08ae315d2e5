"""The report's PNG: one small panel per family, each implementation's time relative to the
family's reference (log scale, reference = 1 drawn as a line; left of it is faster).

A bar is the geometric mean over the family's cases; a dot is one case. Families where no
reference ran are not drawn (the markdown lists them). Sized to stay legible when a README
shows it at about 800 pixels wide.
"""
import math

from bench.rows import impl_label

COLUMNS = 3
PANEL_WIDTH_IN, PANEL_HEIGHT_IN = 3.0, 1.0   # per panel; height grows with the bars
DPI = 110
COLORS = {'gpuk': '#1b7837', 'numpy': '#5aae61', 'cupy': '#762a83', 'cudnn': '#2166ac',
          'torch': '#d6604d', 'torch-cuda': '#b2182b'}


def _limits(values):
    low, high = min(values + [1.0]), max(values + [1.0])
    return 10 ** math.floor(math.log10(low) - 0.05), 10 ** math.ceil(math.log10(high) + 0.05)


def _all_ratios(s):
    return [mean for mean, _ in s['impls'].values()] + [r for _, cases in s['impls'].values() for _, r in cases]


def _panel(ax, family, s, show_reference, limits):
    """One family: a bar from 1 to each implementation's mean relative time, its cases as dots."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    impls = list(s['impls'])
    for y, impl in enumerate(impls):
        mean, cases = s['impls'][impl]
        ratios = [r for _, r in cases]
        ax.barh(y, abs(mean - 1.0), left=min(mean, 1.0), height=0.6, color=COLORS.get(impl, '#888888'))
        ax.plot(ratios, [y] * len(ratios), 'o', color='black', markersize=2.5)
        ax.annotate('%.2g' % mean, (max(ratios + [mean, 1.0]), y), xytext=(4, 0),
                    textcoords='offset points', va='center', fontsize=8, fontweight='bold')
    ax.set_xscale('log')
    ax.set_xlim(limits[0], limits[1] * 2)   # room for the label right of the last dot
    ax.xaxis.set_major_locator(LogLocator(base=10))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: '%g' % x))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.axvline(1.0, color='black', linewidth=1.0)
    ax.set_yticks(range(len(impls)))
    ax.set_yticklabels([impl_label(i) for i in impls], fontsize=9)
    ax.set_ylim(-0.6, len(impls) - 0.4)
    ax.tick_params(axis='x', labelsize=8)
    cases = max(len(s['impls'][i][1]) for i in impls)
    title = '%s, %d case%s' % (family, cases, '' if cases == 1 else 's')
    if show_reference:
        title += ' (1 = %s)' % impl_label(s['reference'])
    ax.set_title(title, fontsize=9)


def write_plot(families, path, title=''):
    """Writes a panel per family of ``families`` (bench/rows.py family_summary) to ``path``
    (PNG); returns the path, or None when no family has a reference to compare with."""
    panels = [(family, s) for family, s in families.items() if s['impls']]
    if not panels:
        return None
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    columns = min(COLUMNS, len(panels))
    grid_rows = math.ceil(len(panels) / columns)
    most_bars = max(len(s['impls']) for _, s in panels)
    height = PANEL_HEIGHT_IN + 0.3 * most_bars
    fig, axes = plt.subplots(grid_rows, columns, squeeze=False,
                             figsize=(PANEL_WIDTH_IN * columns, height * grid_rows + 0.6))
    try:
        references = {s['reference'] for _, s in panels}
        shared_reference = references.pop() if len(references) == 1 else None
        limits = _limits([r for _, s in panels for r in _all_ratios(s)])   # one scale for every panel
        for ax, (family, s) in zip(axes.flat, panels):
            _panel(ax, family, s, shared_reference is None, limits)
        for ax in list(axes.flat)[len(panels):]:
            ax.axis('off')
        reference = ('%s = 1' % impl_label(shared_reference)) if shared_reference else 'reference = 1'
        fig.suptitle((title + '\n' if title else '') +
                     'time relative to the reference, %s (log scale; bar: geometric mean over cases, '
                     'dots: cases; left of 1 is faster)' % reference, fontsize=9)
        fig.tight_layout()
        fig.savefig(path, format='png', dpi=DPI)
    finally:
        plt.close(fig)
    return path
