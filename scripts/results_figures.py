"""The figures of docs/results.md, drawn from the committed run data.

Every seed is drawn (thin lines); where policies share a panel each has its
colour. Called by `python scripts/reproduce.py report`.
"""

import os

import numpy as np

import results_report as rr

# The policies drawn in the efficiency figures (all of them crowd a panel).
SHOWN = ('none', 'filter', 'snooze2', 'snooze5', 'snooze_prob5', 'weighted',
         'snooze5_hard5')


def _plt():
  import matplotlib
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt
  return plt


def _smooth(x: np.ndarray, window: int = 10) -> np.ndarray:
  out = np.empty_like(x, dtype=float)
  for i in range(len(x)):
    out[i] = x[max(0, i - window + 1):i + 1].mean()
  return out


def _colors(names):
  plt = _plt()
  cycle = plt.rcParams['axes.prop_cycle'].by_key()['color']
  return {n: cycle[i % len(cycle)] for i, n in enumerate(names)}


def generated_vs_optimal(runs, path: str) -> str | None:
  """Prompts generated per step (10-step mean) against the optimal B."""
  shown = [v for v in SHOWN if v in runs]
  if not shown:
    return None
  plt = _plt()
  colors = _colors(shown)
  fig, ax = plt.subplots(figsize=(7, 4))
  batch = None
  for v in shown:
    for seed, r in sorted(runs[v].items()):
      steps, gen = r.series('rollout/prompts_generated')
      batch = r.header['batch_size']
      ax.plot(steps, _smooth(gen), color=colors[v], lw=0.8, alpha=0.7,
              label=v if seed == min(runs[v]) else None)
  if batch:
    ax.axhline(batch, color='k', ls='--', lw=1, label='optimal (B)')
  ax.set_yscale('log')
  ax.set_xlabel('step')
  ax.set_ylabel('prompts generated per step (10-step mean)')
  ax.set_title('Generated against optimal, every seed')
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)
  return path


def accuracy_vs_generation(runs, path: str) -> str | None:
  """Held-out accuracy against cumulative prompts and tokens."""
  shown = [v for v in SHOWN if v in runs]
  if not shown:
    return None
  plt = _plt()
  colors = _colors(shown)
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for v in shown:
    for seed, r in sorted(runs[v].items()):
      steps, acc = r.eval_series()
      prompts = [r.cum[s][0] for s in steps]
      tokens = [r.cum[s][1] for s in steps]
      label = v if seed == min(runs[v]) else None
      axes[0].plot(prompts, acc, color=colors[v], lw=0.8, alpha=0.7,
                   label=label)
      axes[1].plot(tokens, acc, color=colors[v], lw=0.8, alpha=0.7)
  axes[0].set_xlabel('prompts generated (cumulative)')
  axes[1].set_xlabel('completion tokens generated (cumulative)')
  for ax in axes:
    ax.set_xscale('log')
    ax.set_ylabel('held-out accuracy')
  axes[0].legend(fontsize=7)
  fig.suptitle('Held-out accuracy against generation, every seed')
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)
  return path


def short_batch(runs, path: str) -> str | None:
  if not runs:
    return None
  plt = _plt()
  colors = _colors(list(runs))
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for v, seeds in runs.items():
    for seed, r in sorted(seeds.items()):
      steps, acc = r.eval_series()
      label = v if seed == min(seeds) else None
      axes[0].plot(steps, acc, color=colors[v], lw=0.8, alpha=0.7,
                   label=label)
      steps, fill = r.series('train/batch_fill')
      axes[1].plot(steps, _smooth(fill, 20), color=colors[v], lw=0.8,
                   alpha=0.7)
  axes[0].set_title('held-out accuracy')
  axes[1].set_title('batch fill (20-step mean)')
  for ax in axes:
    ax.set_xlabel('step')
  axes[0].legend(fontsize=7)
  fig.suptitle('Short steps: trained on anyway (train), held (wait), '
               'scaled (scale); every seed')
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)
  return path


def drift(runs, path: str) -> str | None:
  if not runs:
    return None
  plt = _plt()
  colors = _colors(list(runs))
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for v, seeds in runs.items():
    for seed, r in sorted(seeds.items()):
      steps, share = r.series('data/batch_share/easy')
      label = v if seed == min(seeds) else None
      axes[0].plot(steps, _smooth(share, 20), color=colors[v], lw=0.8,
                   alpha=0.7, label=label)
      for name, ls in (('easy', '-'), ('hard', '--')):
        steps, acc = r.eval_series(f'eval/accuracy/{name}')
        axes[1].plot(steps, acc, color=colors[v], ls=ls, lw=0.8, alpha=0.7)
  axes[0].axhline(0.5, color='k', ls=':', lw=1, label='weight')
  axes[0].set_title('batch share of the easy dataset (20-step mean)')
  axes[1].set_title('held-out accuracy: easy (solid), hard (dashed)')
  for ax in axes:
    ax.set_xlabel('step')
  axes[0].legend(fontsize=7)
  fig.suptitle('Batch drift under plain dynamic sampling, every seed')
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)
  return path


def conflict(runs, path: str) -> str | None:
  if not runs:
    return None
  plt = _plt()
  colors = _colors(list(runs))
  fig, axes = plt.subplots(1, 3, figsize=(15, 4))
  for v, seeds in runs.items():
    for seed, r in sorted(seeds.items()):
      label = v if seed == min(seeds) else None
      for ax, name in zip(axes[:2], ('answerable', 'unanswerable')):
        steps, acc = r.eval_series(f'eval/accuracy/{name}')
        ax.plot(steps, acc, color=colors[v], lw=0.8, alpha=0.7, label=label)
      steps, share = r.series('data/batch_share/unanswerable')
      axes[2].plot(steps, _smooth(share, 20), color=colors[v], lw=0.8,
                   alpha=0.7)
  axes[0].set_title('held-out accuracy, answerable')
  axes[1].set_title('held-out accuracy, unanswerable')
  axes[2].axhline(0.1, color='k', ls=':', lw=1)
  axes[2].set_title('minority batch share (20-step mean; weight 0.1)')
  for ax in axes:
    ax.set_xlabel('step')
  axes[0].legend(fontsize=7)
  fig.suptitle('Conflicting tasks, every seed')
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)
  return path


def draw_all(data: str, out: str) -> list[str]:
  try:
    _plt()
  except ImportError:
    print('matplotlib not installed (pip install -e .[plots]): no figures')
    return []
  os.makedirs(out, exist_ok=True)
  regime = rr.load(data, 'regime')
  made = [
      generated_vs_optimal(regime, os.path.join(out, 'generated.png')),
      accuracy_vs_generation(regime, os.path.join(out, 'accuracy.png')),
      short_batch(rr.load(data, 'short_batch'),
                  os.path.join(out, 'short_batch.png')),
      drift(rr.load(data, 'drift'), os.path.join(out, 'drift.png')),
      conflict(rr.load(data, 'conflict'), os.path.join(out, 'conflict.png')),
  ]
  return [m for m in made if m]
