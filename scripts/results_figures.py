"""The figures of docs/results.md, drawn from the committed run data.

Every seed is drawn (thin lines); where policies share a panel each has its
colour. Called by `python scripts/reproduce.py report`.
"""

import os

import results_report as rr
from jaxgrpo.reporting.plot_panels import smooth

# The policies drawn in the efficiency figures (all of them crowd a panel).
SHOWN = ('none', 'filter', 'snooze2', 'snooze5', 'snooze_prob5', 'weighted',
         'snooze5_hard5')


def _plt():
  import matplotlib
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt
  return plt


def _colors(names):
  plt = _plt()
  cycle = plt.rcParams['axes.prop_cycle'].by_key()['color']
  return {n: cycle[i % len(cycle)] for i, n in enumerate(names)}


def generated_vs_optimal(runs, path: str) -> str | None:
  """Prompts generated per step (10-step mean) against the optimal B."""
  if not any(v in runs for v in SHOWN):
    return None
  fig, ax = _plt().subplots(figsize=(7, 4))
  batch = None
  for r, style, label in _each_seed(runs, SHOWN):
    steps, gen = r.series('rollout/prompts_generated')
    batch = r.header['batch_size']
    ax.plot(steps, smooth(gen, 10), label=label, **style)
  ax.axhline(batch, color='k', ls='--', lw=1, label='optimal (B)')
  ax.set_yscale('log')
  ax.set_ylabel('prompts generated per step (10-step mean)')
  return _save(fig, [ax], 'Generated against optimal, every seed', path)


def accuracy_vs_generation(runs, path: str) -> str | None:
  """Held-out accuracy against cumulative prompts and tokens."""
  if not any(v in runs for v in SHOWN):
    return None
  fig, axes = _plt().subplots(1, 2, figsize=(11, 4))
  for r, style, label in _each_seed(runs, SHOWN):
    steps, acc = r.eval_series()
    axes[0].plot([r.cum[s][0] for s in steps], acc, label=label, **style)
    axes[1].plot([r.cum[s][1] for s in steps], acc, **style)
  for ax in axes:
    ax.set_xscale('log')
    ax.set_ylabel('held-out accuracy')
  return _save(fig, axes, 'Held-out accuracy against generation, every seed',
               path, xlabels=['prompts generated (cumulative)',
                              'completion tokens generated (cumulative)'])


def _each_seed(runs, names=None):
  """(run, {color, lw, alpha}, label) for every seed of every variant; the
  label only on a variant's first seed, so the legend names it once."""
  names = [v for v in (names or runs) if v in runs]
  colors = _colors(names)
  for v in names:
    first = min(runs[v])
    for seed, r in sorted(runs[v].items()):
      yield r, dict(color=colors[v], lw=0.8, alpha=0.7), (
          v if seed == first else None)


def _save(fig, axes, title: str, path: str, xlabels=None) -> str:
  plt = _plt()
  for ax, xlabel in zip(axes, xlabels or ['step'] * len(axes)):
    ax.set_xlabel(xlabel)
  axes[0].legend(fontsize=7)
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)
  return path


def short_batch(runs, path: str) -> str | None:
  if not runs:
    return None
  fig, axes = _plt().subplots(1, 2, figsize=(11, 4))
  for r, style, label in _each_seed(runs):
    axes[0].plot(*r.eval_series(), label=label, **style)
    steps, fill = r.series('train/batch_fill')
    axes[1].plot(steps, smooth(fill, 20), **style)
  axes[0].set_title('held-out accuracy')
  axes[1].set_title('batch fill (20-step mean)')
  return _save(fig, axes, 'Short steps: trained on anyway (train), held '
               '(wait), scaled (scale); every seed', path)


def drift(runs, path: str) -> str | None:
  if not runs:
    return None
  fig, axes = _plt().subplots(1, 2, figsize=(11, 4))
  for r, style, label in _each_seed(runs):
    steps, share = r.series('data/batch_share/easy')
    axes[0].plot(steps, smooth(share, 20), label=label, **style)
    for name, ls in (('easy', '-'), ('hard', '--')):
      axes[1].plot(*r.eval_series(f'eval/accuracy/{name}'), ls=ls, **style)
  axes[0].axhline(0.5, color='k', ls=':', lw=1, label='weight')
  axes[0].set_title('batch share of the easy dataset (20-step mean)')
  axes[1].set_title('held-out accuracy: easy (solid), hard (dashed)')
  return _save(fig, axes, 'Batch drift under plain dynamic sampling, every '
               'seed', path)


def conflict(runs, path: str) -> str | None:
  if not runs:
    return None
  fig, axes = _plt().subplots(1, 3, figsize=(15, 4))
  for r, style, label in _each_seed(runs):
    for ax, name in zip(axes[:2], ('answerable', 'unanswerable')):
      ax.plot(*r.eval_series(f'eval/accuracy/{name}'), label=label, **style)
    steps, share = r.series('data/batch_share/unanswerable')
    axes[2].plot(steps, smooth(share, 20), **style)
  axes[0].set_title('held-out accuracy, answerable')
  axes[1].set_title('held-out accuracy, unanswerable')
  axes[2].axhline(0.1, color='k', ls=':', lw=1)
  axes[2].set_title('minority batch share (20-step mean; weight 0.1)')
  return _save(fig, axes, 'Conflicting tasks, every seed', path)


def draw_all(data: str, out: str) -> list[str]:
  try:
    _plt()
  except ImportError:
    print('matplotlib not installed (pip install -e .[plots]): no figures')
    return []
  os.makedirs(out, exist_ok=True)
  primary = rr.main_runs(data)
  made = [
      generated_vs_optimal(primary, os.path.join(out, 'generated.png')),
      accuracy_vs_generation(primary, os.path.join(out, 'accuracy.png')),
      short_batch(rr.load(data, 'short_batch'),
                  os.path.join(out, 'short_batch.png')),
      drift(rr.load(data, 'drift'), os.path.join(out, 'drift.png')),
      conflict(rr.load(data, 'conflict'), os.path.join(out, 'conflict.png')),
  ]
  return [m for m in made if m]
