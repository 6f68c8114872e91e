"""Strata tables and a pass-rate histogram of a stratify output directory.

For each dataset: the count and share of examples in each stratum
(`bands`), per checkpoint tag and pooled over the selected tags (trials and
passes summed per example). The tables are printed and written to
OUT/strata.json; OUT/pass_rates.png shows the pass-rate histograms. An
example whose every verifier call failed under a checkpoint has no pass
rate from it (`passrates.read`), and is named after the tables.
"""

from collections.abc import Callable, Sequence
import json
import os
from typing import Any

import numpy as np

from jaxgrpo.reporting import console
from jaxgrpo.stratify import bands as bands_lib
from jaxgrpo.stratify import passrates

STRATA_JSON = 'strata.json'
PLOT = 'pass_rates.png'
POOLED = 'pooled'

Log = Callable[[str], None]


def strata_table(rates: passrates.PassRates,
                 edges: Sequence[float]) -> dict[str, Any]:
  """Counts and shares of each stratum, and the mean pass rate."""
  names = bands_lib.stratum_names(edges)
  counts = np.bincount(bands_lib.assign(rates.pass_rate, edges),
                       minlength=len(names))
  n = int(counts.sum())
  return {
      'examples': n,
      'mean_pass_rate': float(rates.pass_rate.mean()) if n else 0.0,
      'counts': dict(zip(names, counts.tolist())),
      'shares': {name: c / n if n else 0.0
                 for name, c in zip(names, counts.tolist())},
  }


def format_tables(result: dict[str, Any]) -> list[str]:
  """Text lines of the tables in a `report` result."""
  names = result['strata']
  tags = [t for d in result['datasets'].values() for t in d['checkpoints']]
  # Padded by terminal columns: a CJK tag takes two per glyph.
  rows_width = max(console.width(label) for label in ['checkpoint', *tags])
  widths = [max(len(n), 11) for n in names]
  lines = []
  for dataset, entry in result['datasets'].items():
    lines.append(f'dataset {dataset} ({entry[POOLED]["examples"]} examples '
                 f'with pass rates)')
    lines.append('  '.join([console.pad('checkpoint', rows_width), 'mean']
                           + [f'{n:>{w}}' for n, w in zip(names, widths)]))
    rows = list(entry['checkpoints'].items())
    if len(rows) > 1:
      rows.append((POOLED, entry[POOLED]))
    for label, table in rows:
      cells = [f'{table["counts"][n]} {100 * table["shares"][n]:4.1f}%'
               for n in names]
      lines.append('  '.join(
          [console.pad(label, rows_width), f'{table["mean_pass_rate"]:.2f}']
          + [f'{c:>{w}}' for c, w in zip(cells, widths)]))
    lines.append('')
  return lines


def report(
    out_dir: str,
    edges: Sequence[float] = bands_lib.DEFAULT_EDGES,
    plot: bool = True,
    *,
    checkpoints: Sequence[str] | None = None,
    log: Log = console.print_line,
) -> dict[str, Any]:
  """Prints the strata tables, writes strata.json and pass_rates.png.

  Also rewrites summary.json from the part files.

  Args:
    out_dir: a `jaxgrpo-stratify` output directory.
    edges: band edges (see `bands.stratum_names`).
    plot: write the histogram (skipped, with a note, without matplotlib).
    checkpoints: tags to report and pool (None: all).
    log: receives the printed lines.

  Returns:
    {'edges', 'strata', 'checkpoints', 'datasets': {name: {'checkpoints':
    {tag: table}, 'pooled': table}}, 'plot'}, each table as
    `strata_table` gives it; 'plot' is the PNG path or None.

  Raises:
    errors.UserError: no pass rates in `out_dir`, or an unknown tag.
    ValueError: bad edges.
  """
  edges = bands_lib.check_edges(edges)
  pooled = passrates.read(out_dir, checkpoints=checkpoints)
  selected = (passrates.tags(out_dir) if checkpoints is None
              else list(dict.fromkeys(checkpoints)))
  per_tag = {tag: passrates.read(out_dir, checkpoints=[tag])
             for tag in selected}
  result = {
      'edges': list(edges),
      'strata': bands_lib.stratum_names(edges),
      'checkpoints': selected,
      'datasets': {},
  }
  for dataset, rates in pooled.items():
    result['datasets'][dataset] = {
        'checkpoints': {tag: strata_table(tables[dataset], edges)
                        for tag, tables in per_tag.items()
                        if dataset in tables},
        POOLED: strata_table(rates, edges),
    }
  summary = passrates.write_summary(out_dir)
  result['plot'] = (_plot(out_dir, pooled, per_tag, edges, log) if plot
                    else None)
  for line in format_tables(result):
    log(line)
  for dataset, entry in result['datasets'].items():
    for tag in entry['checkpoints']:
      rows, want = passrates.coverage(out_dir, dataset, tag)
      if rows < want:
        log(f'checkpoint {tag} has pass rates of {rows} of the {want} '
            f'examples of dataset {dataset} that its jaxgrpo-stratify run '
            'set out to measure (interrupted, or shards not run yet): the '
            'same jaxgrpo-stratify run command finishes it')
      failed = summary['datasets'][dataset].get('verify', {}).get(
          tag, {}).get('all_failed', [])
      if failed:
        log(_failed_line(out_dir, dataset, tag, failed))
  path = os.path.join(out_dir, STRATA_JSON)

  def write(tmp: str) -> None:
    with open(tmp, 'w') as f:
      json.dump(result, f, indent=2)
      f.write('\n')

  passrates.atomic_write(path, write)
  log(f'wrote {path}' + (f' and {result["plot"]}' if result['plot'] else ''))
  return result


def _failed_line(out_dir: str, dataset: str, tag: str,
                 failed: Sequence[str]) -> str:
  """Names the examples of `dataset` whose every verifier call failed under
  `tag`, which have no pass rate from it (the first five)."""
  return (f'checkpoint {tag}: {len(failed)} examples of dataset {dataset} '
          'had every verifier call fail: their pass rate of 0 would '
          'measure the verifier, not the model, so they have none from '
          f'this checkpoint and count in no stratum of its row '
          f'({", ".join(failed[:5])}' + (', ...' if len(failed) > 5 else '')
          + f'; all of them in {os.path.join(out_dir, passrates.SUMMARY)}); '
          'fix the verifier and measure them again under another --out')


def _bins(trials: np.ndarray) -> np.ndarray:
  """Histogram bin edges: one bin per possible rate when K is one value."""
  k = np.unique(trials)
  if len(k) == 1 and 0 < k[0] <= 40:
    # Rates are i / K: bins centred on them, none empty by construction.
    return (np.arange(k[0] + 2) - 0.5) / k[0]
  return np.linspace(0.0, 1.0, 21)


def _plot(
    out_dir: str,
    pooled: dict[str, passrates.PassRates],
    per_tag: dict[str, dict[str, passrates.PassRates]],
    edges: Sequence[float],
    log: Log,
) -> str | None:
  """One histogram of pass rates per dataset; the PNG path, or None."""
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use('Agg')
    from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    log('matplotlib is not installed: no pass_rates.png (pip install '
        'matplotlib)')
    return None
  names = list(pooled)
  fig, axes = plt.subplots(len(names), 1, figsize=(6, 2.6 * len(names)),
                           squeeze=False)
  for ax, dataset in zip(axes[:, 0], names):
    bins = _bins(pooled[dataset].trials)
    tags = [t for t, tables in per_tag.items() if dataset in tables]
    if len(tags) > 1:
      for tag in tags:
        ax.hist(per_tag[tag][dataset].pass_rate, bins=bins, histtype='step',
                label=tag)
      ax.legend(fontsize='small')
    else:
      ax.hist(pooled[dataset].pass_rate, bins=bins, rwidth=0.9, label=tags[0])
    for edge in edges:
      ax.axvline(edge, color='gray', linestyle=':', linewidth=1)
    ax.set_title(f'{dataset}: {len(pooled[dataset].ids)} examples',
                 fontsize='medium')
    ax.set_xlabel('pass rate')
    ax.set_ylabel('examples')
    ax.set_xlim(bins[0], bins[-1])
  fig.tight_layout()
  path = os.path.join(out_dir, PLOT)
  passrates.atomic_write(
      path, lambda tmp: fig.savefig(tmp, dpi=80, format='png'))
  plt.close(fig)
  return path
