r"""Draws the sampler policies as the code runs them: docs/sampler_policies.png.

Top: for each policy, a timeline over epochs of a dataset whose examples the
model solves partly (3 of G=8 samples right) until epoch 3 and in every
sample from then on. Each cell is what `SnoozeTable.draw` and `.observe`
(jaxgrpo/data/snooze.py) did with that example in that epoch, walking a
3-example dataset with a fixed seed: offered (its group informative, or too
easy and dropped by dynamic sampling), skipped, or filtered for good. The
random policies, snooze_prob and weighted, get a row per example.

Bottom: the batch share of the easier of two equally weighted datasets under
pre_filter and post_filter balance, from the simulator (`jaxgrpo.sim`: the
real mixture sampler and rollout loop with a synthetic learner).

  python scripts/draw_concepts.py --out docs/sampler_policies.png
"""

import argparse
import dataclasses
import time

import matplotlib
import numpy as np

from jaxgrpo.data import snooze
from jaxgrpo.sim import engine
from jaxgrpo.sim import experiments
from jaxgrpo.sim import plots

matplotlib.use('Agg')
from matplotlib import colors  # pylint: disable=g-import-not-at-top
from matplotlib import patches  # pylint: disable=g-import-not-at-top
from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

EPOCHS = 24
MASTERED_AT = 3
EXAMPLES = 3
GROUP_SIZE = 8
SNOOZE_FACTOR = 5
# Policies that decide at random get a row per example; the others treat
# every example alike and get one.
RANDOM_POLICIES = ('snooze_prob', 'weighted')

# Cell codes of a timeline.
INFORMATIVE, TOO_EASY, SKIPPED, GONE = range(4)
CELL_COLORS = ('#4c72b0', '#f0a13a', '#e6e6e6', '#3a3a3a')
CELL_LABELS = ('offered: group informative (trains)',
               'offered: too easy (generated, group dropped)',
               'skipped this epoch (not generated)',
               'filtered: never offered again')

MIXTURE_STEPS = 300
MIXTURE_SIZE = 2000


def _rewards(epoch: int) -> np.ndarray:
  """[1, G] rewards of the example's group in `epoch`."""
  if epoch >= MASTERED_AT:
    return np.ones((1, GROUP_SIZE))
  return (np.arange(GROUP_SIZE) < 3).astype(np.float64)[None]


def timeline(policy: str, seed: int) -> np.ndarray:
  """What the sampler did with each example in each epoch under `policy`.

  Args:
    policy: one of `snooze.POLICIES`.
    seed: the snooze table's seed (epoch order and random skips).

  Returns:
    [EXAMPLES, EPOCHS] int cell codes (INFORMATIVE, TOO_EASY, SKIPPED, GONE).
  """
  cfg = snooze.PolicyConfig(policy=policy, snooze_factor=SNOOZE_FACTOR,
                            group_size=GROUP_SIZE)
  table = snooze.SnoozeTable(EXAMPLES, cfg, seed=seed)
  cells = np.full((EXAMPLES, EPOCHS), SKIPPED)
  gone_from = np.full(EXAMPLES, EPOCHS)
  step = 0
  # One prompt per draw, so each outcome is seen before the next offer.
  while table.epoch < EPOCHS:
    drawn = table.draw(1, step)
    epoch = table.epoch
    if drawn.size and epoch < EPOCHS:
      i = int(drawn[0])
      rewards = _rewards(epoch)
      cells[i, epoch] = TOO_EASY if rewards.min() == 1.0 else INFORMATIVE
      table.observe(drawn, rewards, step)
      if table.status[i] == snooze.FILTERED:
        gone_from[i] = min(gone_from[i], epoch + 1)
    step += 1
  for i in range(EXAMPLES):
    cells[i, gone_from[i]:][cells[i, gone_from[i]:] == SKIPPED] = GONE
  return cells


def batch_shares(seed: int) -> dict[str, np.ndarray]:
  """Per-step batch share of the easier dataset under each balance mode.

  Two datasets of MIXTURE_SIZE examples (the easier and the harder half of
  the simulator's difficulty distribution), weight 0.5 each, policy snooze.
  """
  datasets = tuple(
      engine.SimDataset(
          name=name, size=MIXTURE_SIZE, weight=0.5, task='math',
          difficulty=dataclasses.replace(experiments.DIFFICULTY, quantiles=q))
      for name, q in (('easy', (0.5, 1.0)), ('hard', (0.0, 0.5))))
  out = {}
  for balance in ('pre_filter', 'post_filter'):
    spec = engine.SimSpec(
        datasets=datasets, policy='snooze', snooze_factor=SNOOZE_FACTOR,
        balance=balance, steps=MIXTURE_STEPS, seed=seed, engine='fast',
        **experiments.BASE)
    records = engine.run(spec)
    # NaN on a step without an update: it has no batch to share.
    out[balance] = np.array([r.get('data/batch_share/easy', np.nan)
                             for r in records])
  return out


def _draw_timelines(ax, seed: int) -> None:
  rows, labels = [], []
  for policy in snooze.POLICIES:
    cells = timeline(policy, seed)
    if policy in RANDOM_POLICIES:
      for i in range(EXAMPLES):
        rows.append(cells[i])
        labels.append(f'{policy}, example {i + 1}')
    else:
      rows.append(cells[0])
      labels.append(policy)
  grid = np.stack(rows)
  cmap = colors.ListedColormap(CELL_COLORS)
  ax.imshow(grid, cmap=cmap, vmin=-0.5, vmax=len(CELL_COLORS) - 0.5,
            aspect='auto', interpolation='nearest')
  ax.set_xticks(np.arange(grid.shape[1]) - 0.5, minor=True)
  ax.set_yticks(np.arange(grid.shape[0]) - 0.5, minor=True)
  ax.grid(which='minor', color='white', linewidth=1.5)
  ax.tick_params(which='minor', length=0)
  ax.set_xticks(np.arange(0, EPOCHS, 2))
  ax.set_yticks(np.arange(len(labels)), labels, fontsize=8)
  ax.tick_params(axis='x', labelsize=8)
  ax.set_xlabel("the dataset's epoch", fontsize=8)
  ax.axvline(MASTERED_AT - 0.5, color='#c44e52', lw=1.5, ls='--')
  ax.text(MASTERED_AT - 0.4, -0.6, 'mastered: all G samples right from here',
          color='#c44e52', fontsize=7, va='bottom')
  ax.set_title(
      f'Policies: examples the model masters in epoch {MASTERED_AT} '
      f'(G={GROUP_SIZE}, N={SNOOZE_FACTOR}, w_min=0.05; SnoozeTable of '
      f'{EXAMPLES} examples, seed {seed})', fontsize=9, pad=16)
  handles = [patches.Patch(color=c, label=l)
             for c, l in zip(CELL_COLORS, CELL_LABELS)]
  ax.legend(handles=handles, loc='upper center', bbox_to_anchor=(0.5, -0.16),
            ncol=2, fontsize=7, frameon=False)


def _draw_shares(ax, seed: int) -> None:
  shares = batch_shares(seed)
  x = np.arange(MIXTURE_STEPS)
  for (balance, share), color in zip(shares.items(), ('#c44e52', '#4c72b0')):
    ax.plot(x, share, color=color, lw=0.6, alpha=0.25)
    ax.plot(x, plots.smooth(share, 10), color=color, lw=1.6, label=balance)
  ax.axhline(0.5, color='gray', ls='--', lw=1.0, label='its weight, 0.5')
  ax.set_ylim(0, 1)
  ax.set_xlim(0, MIXTURE_STEPS - 1)
  ax.set_xlabel('training step', fontsize=8)
  ax.set_ylabel("easy dataset's\nbatch share", fontsize=8)
  ax.tick_params(labelsize=8)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, loc='lower left', ncol=3)
  ax.set_title(
      'Balance: an easy and a hard dataset, weight 0.5 each, policy snooze\n'
      f'(simulator: the real sampler and rollout loop, B=64, seed {seed})',
      fontsize=9)


def draw(out: str, seed: int) -> None:
  """Draws both parts and writes the PNG to `out`."""
  fig, (top, bottom) = plt.subplots(
      2, 1, figsize=(9.0, 7.4), dpi=90,
      gridspec_kw={'height_ratios': [3.2, 1.4], 'hspace': 0.62})
  _draw_timelines(top, seed)
  _draw_shares(bottom, seed)
  fig.subplots_adjust(left=0.19, right=0.98, top=0.94, bottom=0.07)
  fig.savefig(out)
  plt.close(fig)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out', default='docs/sampler_policies.png',
                      help='PNG to write')
  parser.add_argument('--seed', type=int, default=0,
                      help='seed of the snooze tables and the simulator')
  args = parser.parse_args()
  t0 = time.perf_counter()
  draw(args.out, args.seed)
  print(f'{args.out} ({time.perf_counter() - t0:.1f} s)')


if __name__ == '__main__':
  main()
