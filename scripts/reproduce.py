r"""Real GRPO runs that test the method's claims at small scale, on a CPU.

Each experiment trains the demo model on built-in arithmetic under several
sampler settings, writes every run's metrics.jsonl under
`OUT/<experiment>/<variant>_s<seed>/`, a JSON summary `OUT/<experiment>.json`
and a plot `OUT/<experiment>.png`:

  waste       policy=none on a dataset the model gradually masters: prompts
              generated per step against the optimal B, and the used share.
  efficiency  none, filter, snooze (N=5), snooze_prob, weighted: prompts
              generated and generator calls over the same steps, held-out
              accuracy at the end, savings as a ratio to none.
  drift       an easy and a hard dataset at equal weights under filter:
              each one's batch share over steps, pre_filter vs post_filter.
  conflict    answerable (90%) and unanswerable (10%, the right answer is
              the refusal 'none') subtractions, '57-23=' vs '23-57=' (no
              negative numbers): per-subset held-out accuracy and the
              minority's batch share for none, filter, snooze N=2, 3, 5
              and snooze_prob.
  conflict_missing
              the same with an obvious cue: answerable sums and '47+?='.

Every variant of a seed starts from the same warm-started checkpoint (the
warm start runs once per seed and its step-0 checkpoint is copied), so the
variants differ only in the sampler.

  python scripts/reproduce.py efficiency --seeds 0,1,2 --out docs/results
  python scripts/reproduce.py all --smoke --out /tmp/repro    # a few steps each
  python scripts/reproduce.py conflict --variants none,snooze3  # some variants
"""

import argparse
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top
from configs import common
from jaxgrpo import metrics as metrics_lib
from jaxgrpo import train

EXPERIMENTS = ('waste', 'efficiency', 'drift', 'conflict', 'conflict_missing')


def _base(steps: int, seed: int, smoke: bool):
  c = common.base_config()
  c.seed = seed
  c.total_steps = steps
  c.log_every = 50
  c.eval.every = max(1, steps // 6)
  c.checkpoint.every = 10_000  # the end and step 0 are always saved
  c.verify.workers = 0  # exact_match cannot hang; keep the runs lean
  c.plots = False  # the experiment draws its own
  if smoke:
    common.shrink_for_runlocal(c)
    c.total_steps = steps
    c.eval.every = steps
  return c


def _dataset(name, smoke, **keys):
  entry = common.arithmetic_dataset(name, **keys)
  if smoke:
    entry['num_train'] = min(entry.get('num_train', 256), 256)
    entry['num_eval'] = min(entry.get('num_eval', 16), 16)
  return entry


def variants(experiment: str, smoke: bool) -> tuple[list, dict]:
  """(datasets, {variant name: config overrides}) of an experiment."""
  if experiment in ('waste', 'efficiency'):
    # Sums without carries: the model masters them within the run, which is
    # when dynamic sampling starts to waste generation.
    datasets = [_dataset('arithmetic', smoke, min_digits=1, max_digits=2,
                         carries='none', num_train=1000, num_eval=256)]
    if experiment == 'waste':
      return datasets, {'none': {'sampler.policy': 'none'}}
    return datasets, {
        'none': {'sampler.policy': 'none'},
        'filter': {'sampler.policy': 'filter'},
        'snooze5': {'sampler.policy': 'snooze', 'sampler.snooze_factor': 5},
        'snooze_prob5': {'sampler.policy': 'snooze_prob',
                         'sampler.snooze_factor': 5},
        'weighted': {'sampler.policy': 'weighted'},
    }
  if experiment == 'drift':
    datasets = [
        _dataset('easy', smoke, weight=0.5, min_digits=1, max_digits=2,
                 carries='none', num_train=1000, num_eval=128, seed=1),
        _dataset('hard', smoke, weight=0.5, min_digits=3, max_digits=3,
                 carries='required', num_train=1000, num_eval=128, seed=2),
    ]
    return datasets, {
        'pre_filter': {'sampler.policy': 'filter', 'data.balance': 'pre_filter'},
        'post_filter': {'sampler.policy': 'filter',
                        'data.balance': 'post_filter'},
    }
  if experiment == 'conflict':
    # The two tasks look alike: only comparing the operands tells whether
    # to answer or refuse, so refusing leaks into answerable problems.
    datasets = [
        _dataset('answerable', smoke, weight=0.9, min_digits=1, max_digits=2,
                 ops='-', num_train=2000, num_eval=256, seed=3),
        _dataset('unanswerable', smoke, weight=0.1, min_digits=1, max_digits=2,
                 ops='-', num_train=500, num_eval=128, seed=4,
                 unanswerable='negative'),
    ]
  elif experiment == 'conflict_missing':
    datasets = [
        _dataset('answerable', smoke, weight=0.9, min_digits=1, max_digits=2,
                 num_train=2000, num_eval=256, seed=3),
        # '47+?=' has fewer distinct prompts than a full problem: 1-3 digits.
        _dataset('unanswerable', smoke, weight=0.1, min_digits=1, max_digits=3,
                 num_train=500, num_eval=128, seed=4, unanswerable=True),
    ]
  if experiment in ('conflict', 'conflict_missing'):
    out = {'none': {'sampler.policy': 'none'},
           'filter': {'sampler.policy': 'filter'}}
    for n in (2, 3, 5):
      out[f'snooze{n}'] = {'sampler.policy': 'snooze',
                           'sampler.snooze_factor': n}
    out['snooze_prob5'] = {'sampler.policy': 'snooze_prob',
                           'sampler.snooze_factor': 5}
    return datasets, out
  raise ValueError(f'unknown experiment {experiment!r}; one of {EXPERIMENTS}')


def _set(c, key: str, value) -> None:
  section, _, name = key.rpartition('.')
  (c[section] if section else c)[name] = value


def run_experiment(experiment: str, *, seeds, steps: int, out: str,
                   smoke: bool = False, only=None, log=print) -> dict:
  """Runs the variants of `experiment` (all, or those named in `only`) for
  each seed; returns the summary."""
  datasets, table = variants(experiment, smoke)
  if only:
    unknown = sorted(set(only) - set(table))
    if unknown:
      raise ValueError(f'--variants: {experiment} has no variant {unknown}; '
                       f'it has {list(table)}')
    table = {name: v for name, v in table.items() if name in only}
  root = os.path.join(out, experiment)
  runs = {}
  for seed in seeds:
    start = os.path.join(root, f'_warm_s{seed}')
    if not os.path.exists(os.path.join(start, 'checkpoints')):
      c = _base(0, seed, smoke)
      c.data.datasets = datasets
      t0 = time.perf_counter()
      train.run(c, start, log=lambda _: None)
      log(f'{experiment}: warm start for seed {seed} in '
          f'{time.perf_counter() - t0:.0f}s')
    for name, overrides in table.items():
      workdir = os.path.join(root, f'{name}_s{seed}')
      if not os.path.exists(os.path.join(workdir, 'metrics.jsonl')) or not (
          _done(workdir, steps)):
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.copytree(start, workdir)
        c = _base(steps, seed, smoke)
        c.data.datasets = datasets
        for key, value in overrides.items():
          _set(c, key, value)
        t0 = time.perf_counter()
        train.run(c, workdir, log=lambda _: None)
        log(f'{experiment}: {name} seed {seed}, {steps} steps in '
            f'{time.perf_counter() - t0:.0f}s')
      runs[f'{name}_s{seed}'] = metrics_lib.read_metrics(workdir)
  summary = summarize(experiment, runs, table, seeds,
                      batch_size=_base(steps, 0, smoke).rollout.batch_size)
  with open(os.path.join(out, f'{experiment}.json'), 'w') as f:
    json.dump(summary, f, indent=1)
  plot(experiment, runs, table, seeds, os.path.join(out, f'{experiment}.png'),
       batch_size=summary['batch_size'])
  return summary


def _done(workdir: str, steps: int) -> bool:
  records = metrics_lib.read_metrics(workdir)
  return bool(records) and records[-1]['step'] >= steps


def _series(records, key):
  return [(r['step'], r[key]) for r in records if key in r and r['step'] > 0]


def _smooth(series, window: int = 20):
  """A trailing mean over `window` steps of (step, value) pairs."""
  out, values = [], []
  for step, value in series:
    values.append(value)
    recent = values[-window:]
    out.append((step, sum(recent) / len(recent)))
  return out


def summarize(experiment, runs, table, seeds, *, batch_size) -> dict:
  """Per variant: totals and final accuracies, averaged over seeds."""
  out = {'experiment': experiment, 'seeds': list(seeds),
         'batch_size': batch_size, 'variants': {}}
  for name in table:
    rows = []
    for seed in seeds:
      records = runs[f'{name}_s{seed}']
      steps = [r for r in records if r['step'] > 0]
      last_eval = [r for r in records if 'eval/accuracy' in r][-1]
      first_eval = [r for r in records if 'eval/accuracy' in r][0]
      row = {
          'steps': len(steps),
          'prompts_generated': sum(r['rollout/prompts_generated']
                                   for r in steps),
          'generator_calls': sum(r['rollout/rounds'] for r in steps),
          'groups_used': sum(r['rollout/groups_used'] for r in steps),
          'eval_first': first_eval['eval/accuracy'],
          'eval_last': last_eval['eval/accuracy'],
      }
      for key, value in last_eval.items():
        if key.startswith('eval/accuracy/'):
          row[key] = value
      for key in {k for r in steps for k in r
                  if k.startswith('data/batch_share/')}:
        row[key] = sum(r.get(key, 0.0) for r in steps) / max(1, len(steps))
      row['prompts_per_group_used'] = (
          row['prompts_generated'] / max(1.0, row['groups_used']))
      rows.append(row)
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
    out['variants'][name] = {'per_seed': rows, 'mean': mean}
  base = out['variants'].get('none')
  if base:
    for name, v in out['variants'].items():
      v['mean']['generation_saving_vs_none'] = (
          base['mean']['prompts_generated'] / v['mean']['prompts_generated'])
  return out


def plot(experiment, runs, table, seeds, path, *, batch_size) -> None:
  try:
    import matplotlib
    matplotlib.use('Agg')
    from matplotlib import pyplot as plt
  except ImportError:
    print(f'matplotlib not installed (pip install -e .[plots]): no {path}')
    return
  seed = seeds[0]
  fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
  left, right = axes
  for name in table:
    records = runs[f'{name}_s{seed}']
    if experiment in ('waste', 'efficiency'):
      gen = _series(records, 'rollout/prompts_generated')
      left.plot(*zip(*gen), label=name, lw=1)
      cum = _series(records, 'rollout/cum_prompts_generated')
      right.plot(*zip(*cum), label=name, lw=1)
    elif experiment == 'drift':
      share = _smooth(_series(records, 'data/batch_share/easy'))
      left.plot(*zip(*share), label=f'{name}: easy', lw=1)
      acc = _series(records, 'eval/accuracy')
      right.plot(*zip(*acc), label=name, marker='o', lw=1)
    else:
      share = _smooth(_series(records, 'data/batch_share/unanswerable'))
      left.plot(*zip(*share), label=name, lw=1)
      acc = _series(records, 'eval/accuracy/answerable')
      line, = right.plot(*zip(*acc), label=f'{name}: answerable', marker='o',
                         lw=1, ms=3)
      acc = _series(records, 'eval/accuracy/unanswerable')
      right.plot(*zip(*acc), ls='--', lw=1, color=line.get_color())
  if experiment in ('waste', 'efficiency'):
    left.axhline(batch_size, color='k', ls='--', lw=1, label='optimal B')
    left.set_title('prompts generated per step')
    right.set_title('cumulative prompts generated')
  elif experiment == 'drift':
    left.axhline(0.5, color='k', ls='--', lw=1, label='weight')
    left.set_title('batch share of the easy dataset (20-step mean)')
    right.set_title('held-out accuracy')
  else:
    left.axhline(0.1, color='k', ls='--', lw=1, label='weight')
    left.set_title('batch share of unanswerable problems (20-step mean)')
    right.set_title('held-out accuracy: answerable (solid), unanswerable '
                    '(dashed)', fontsize=9)
  for ax in axes:
    ax.set_xlabel('step')
    ax.legend(fontsize=7)
  fig.suptitle(f'{experiment} (seed {seed})')
  fig.tight_layout()
  fig.savefig(path, dpi=80)
  plt.close(fig)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('experiment', choices=EXPERIMENTS + ('all',))
  parser.add_argument('--seeds', default='0')
  parser.add_argument('--steps', type=int, default=300)
  parser.add_argument('--out', default='docs/results')
  parser.add_argument('--smoke', action='store_true',
                      help='tiny sizes and a few steps (keeps this working)')
  parser.add_argument('--variants', default='',
                      help='comma-separated variant names (default: all)')
  args = parser.parse_args()
  only = [v for v in args.variants.split(',') if v]
  seeds = [int(s) for s in args.seeds.split(',')]
  os.makedirs(args.out, exist_ok=True)
  for experiment in (EXPERIMENTS if args.experiment == 'all'
                     else (args.experiment,)):
    t0 = time.perf_counter()
    summary = run_experiment(experiment, seeds=seeds, steps=args.steps,
                             out=args.out, smoke=args.smoke, only=only)
    print(f'{experiment} ({time.perf_counter() - t0:.0f}s):')
    for name, v in summary['variants'].items():
      m = v['mean']
      print(f'  {name:14s} prompts {m["prompts_generated"]:8.0f}  calls '
            f'{m["generator_calls"]:6.0f}  eval {m["eval_first"]:.3f} -> '
            f'{m["eval_last"]:.3f}'
            + (f'  saving {m["generation_saving_vs_none"]:.2f}x'
               if 'generation_saving_vs_none' in m else ''))


if __name__ == '__main__':
  main()
