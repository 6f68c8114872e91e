"""Experiments on the simulator; each writes DIR/<name>.json and <name>.png.

  waste: plain dynamic sampling (policy none) on a dataset the learner
    masters: prompts generated per step against the optimal B, and the
    share of generated prompts that the batch used.
  efficiency: none, filter, snooze (N=5), snooze_prob (N=5) and weighted
    on the same dataset: cumulative prompts generated and generator calls
    over the same number of steps, final held-out accuracy, and the saving
    of each policy as a ratio to none.
  drift: one dataset split at its median difficulty into an easy and a
    hard half, weighted equally: each half's batch share over steps under
    pre_filter and post_filter balance.
  conflict: 'answerable' (weight 0.9) and 'unanswerable' (0.1) tasks, where
    training on unanswerable (refusing) lowers the answerable skill: each
    task's held-out accuracy and the unanswerable batch share over steps
    for none, filter, snooze N=2, 3, 5 and snooze_prob (N=5).
  sweep: snooze with N in {1, 2, 3, 5, 8, 13, 21} (plus none and filter for
    reference): prompts generated and final accuracy, on 1M examples and,
    for contrast, on the efficiency experiment's run, which walks its
    dataset several times.

Defaults (chosen as plausible settings, not fitted to any result):
  - G = 8 completions, B = 64 groups per step, rounds of R = 64 prompts
    (a batch's worth, as DAPO generates), at most 32 rounds per step,
    surplus carried, binary rewards (easy: all 1, hard: all 0).
  - Difficulty offsets d ~ Normal(0, 3) in logits: at skill 0 this gives
    held-out accuracy 0.5 and the U-shaped per-example pass-rate histogram
    that offline stratification of real data tends to show (many examples
    always or never solved).
  - lr = 0.01 skill per full batch (300 steps take held-out accuracy from
    0.5 to about 0.8, the range of a GSM8K run), lr_example = 0.25 (an
    example trained on 4 times is 1 logit easier than its held-out twins:
    the train/test gap of RL on a fixed set).
  - waste, efficiency, drift: 7,473 examples (the size of GSM8K train),
    300 steps. conflict: 6,000 examples split 90/10 (about the size of
    the SQuAD 2.0 dev half), 600 steps, initial skills answerable 1.0
    (held-out 0.65) and unanswerable -1.0 (0.35: a model that rarely
    refuses), interference unanswerable -> answerable -0.5 (a full batch
    of refusals undoes half a batch of answering). sweep at scale: 1M
    examples, B = R = 1024, 600 steps, lr = 0.005 (a large-batch run).
  - Every number is the mean over seeds 0..S-1 (each seed redraws the
    difficulties, the sampler's walk and the rewards).

Engines: waste, efficiency and drift run the real `Rollout` ('rollout':
tokens, text and the exact_match verifier included); conflict and sweep,
which generate millions of completions, run 'fast' (the same
`Rollout.collect` with vectorized rounds, which gives identical metrics).
`workers` > 1 runs the (variant, seed) runs in that many processes.
"""

from collections.abc import Callable
import dataclasses
import time

import numpy as np

from jaxgrpo.sim import engine as engine_lib
from jaxgrpo.sim import learner as learner_lib
from jaxgrpo.sim import plots
from jaxgrpo.sim import report

DIFFICULTY = learner_lib.Difficulty(kind='normal', loc=0.0, scale=3.0)
GSM8K_SIZE = 7473
SQUAD_SIZE = 6000
SWEEP_SIZE = 1_000_000
SWEEP_FACTORS = (1, 2, 3, 5, 8, 13, 21)
BASE = dict(batch_size=64, group_size=8, round_size=64, max_rounds=32,
            surplus='carry', lr=0.01, lr_example=0.25)
AT_SCALE = dict(batch_size=1024, round_size=1024, lr=0.005)

_CUM = 'rollout/cum_prompts_generated'
_CALLS = 'sim/cum_generator_calls'
_ACC = 'sim/accuracy/math'


def _spec(datasets, steps, engine, **overrides) -> engine_lib.SimSpec:
  return engine_lib.SimSpec(datasets=tuple(datasets), steps=steps,
                            engine=engine, **{**BASE, **overrides})


def _math(size: int) -> tuple[engine_lib.SimDataset, ...]:
  return (engine_lib.SimDataset(name='math', size=size,
                                difficulty=DIFFICULTY),)


def _total(runs, key) -> float:
  """A per-step metric summed over the run, mean over seeds."""
  return float(np.nansum(report.series(runs, key), axis=1).mean())


def waste(out_dir: str, *, size: int | None = None, seeds: int = 3,
          steps: int | None = None, engine: str = 'rollout',
          workers: int = 1) -> dict:
  """Policy none on a dataset the learner masters: generated vs optimal."""
  t0 = time.perf_counter()
  spec = _spec(_math(size or GSM8K_SIZE), steps or 300, engine)
  runs = report.compare(spec, [('none', {})], seeds, workers)['none']
  B = spec.batch_size
  gen = report.mean(runs, 'rollout/prompts_generated')
  eff = report.mean(runs, 'rollout/efficiency')
  acc = report.mean(runs, _ACC)
  train = report.mean(runs, 'sim/train_pass/math')
  cum_gen = report.series(runs, _CUM)[:, -1]
  cum_used = report.series(runs, 'rollout/cum_groups_used')[:, -1]
  first, last = report.part(gen, 'first'), report.part(gen, 'last')
  results = {
      'optimal_prompts_per_step': B,
      'generated_per_step_first_tenth': first,
      'generated_per_step_last_tenth': last,
      'generated_over_optimal_first_tenth': first / B,
      'generated_over_optimal_last_tenth': last / B,
      'used_share_first_tenth': report.part(eff, 'first'),
      'used_share_last_tenth': report.part(eff, 'last'),
      'used_share_whole_run': float((cum_used / cum_gen).mean()),
      'final_accuracy': report.final(runs, _ACC),
      'final_train_pass': report.final(runs, 'sim/train_pass/math'),
      'epochs': report.final(runs, 'data/epoch/math'),
  }
  x = np.arange(len(gen))
  panels = [
      plots.Panel('prompts generated per step (10-step mean)', 'step',
                  'prompts', {'generated': (x, plots.smooth(gen, 10))},
                  hlines={f'optimal (B={B})': B}),
      plots.Panel('used / generated and accuracy', 'step', 'share',
                  {'used/generated (10-step mean)': (x, plots.smooth(eff, 10)),
                   'held-out accuracy': (x, acc),
                   'train pass rate': (x, train)}),
  ]
  curves = {'prompts_generated': gen, 'efficiency': eff, 'accuracy': acc,
            'train_pass': train}
  return report.write(out_dir, 'waste', spec, seeds, t0, results, curves,
                      panels, 'waste: dynamic sampling as the learner '
                      'masters data')


EFFICIENCY_POLICIES = (
    ('none', dict(policy='none')),
    ('filter', dict(policy='filter')),
    ('snooze N=5', dict(policy='snooze', snooze_factor=5)),
    ('snooze_prob N=5', dict(policy='snooze_prob', snooze_factor=5)),
    ('weighted', dict(policy='weighted')),
)


def _costs(all_runs: dict[str, list[list[dict]]]) -> dict[str, dict]:
  """Prompts, generator calls, accuracy and savings against 'none'."""
  base_gen = report.final(all_runs['none'], _CUM)['mean']
  base_calls = report.final(all_runs['none'], _CALLS)['mean']
  out = {}
  for label, runs in all_runs.items():
    gen, calls = report.final(runs, _CUM), report.final(runs, _CALLS)
    out[label] = {
        'cum_prompts_generated': gen,
        'cum_generator_calls': calls,
        'final_accuracy': report.final(runs, _ACC),
        'saving_prompts_vs_none': base_gen / gen['mean'],
        'saving_calls_vs_none': base_calls / calls['mean'],
        'batch_short_total': _total(runs, 'rollout/batch_short'),
        'epochs': report.final(runs, 'data/epoch/math'),
    }
  return out


def efficiency(out_dir: str, *, size: int | None = None, seeds: int = 3,
               steps: int | None = None, engine: str = 'rollout',
               workers: int = 1) -> dict:
  """Generation cost of each policy over the same number of steps."""
  t0 = time.perf_counter()
  spec = _spec(_math(size or GSM8K_SIZE), steps or 300, engine)
  all_runs = report.compare(spec, EFFICIENCY_POLICIES, seeds, workers)
  results = _costs(all_runs)
  curves = {}
  for label, runs in all_runs.items():
    curves[f'cum_prompts_generated/{label}'] = report.mean(runs, _CUM)
    curves[f'accuracy/{label}'] = report.mean(runs, _ACC)
  x = np.arange(spec.steps)

  def pick(prefix):
    return {k[len(prefix):]: (x, v) for k, v in curves.items()
            if k.startswith(prefix)}

  panels = [
      plots.Panel('cumulative prompts generated', 'step', 'prompts',
                  pick('cum_prompts_generated/')
                  | {'optimal': (x, (x + 1) * spec.batch_size)}),
      plots.Panel('held-out accuracy', 'step', 'accuracy',
                  pick('accuracy/')),
  ]
  return report.write(out_dir, 'efficiency', spec, seeds, t0, results,
                      curves, panels, 'efficiency: generation cost per policy')


def drift(out_dir: str, *, size: int | None = None, seeds: int = 3,
          steps: int | None = None, engine: str = 'rollout',
          workers: int = 1) -> dict:
  """Batch shares of an easy and a hard half under both balance modes."""
  t0 = time.perf_counter()
  half = (size or GSM8K_SIZE) // 2
  datasets = [
      engine_lib.SimDataset(
          name=name, size=half, weight=1.0, task='math',
          difficulty=dataclasses.replace(DIFFICULTY, quantiles=q))
      for name, q in (('easy', (0.5, 1.0)), ('hard', (0.0, 0.5)))]
  spec = _spec(datasets, steps or 300, engine)
  balances = [(b, dict(balance=b)) for b in ('pre_filter', 'post_filter')]
  all_runs = report.compare(spec, balances, seeds, workers)
  results, curves = {}, {}
  for balance, runs in all_runs.items():
    share = report.mean(runs, 'data/batch_share/easy')
    curves[f'easy_share/{balance}'] = share
    curves[f'cum_prompts_generated/{balance}'] = report.mean(runs, _CUM)
    results[balance] = {
        'easy_share_first_tenth': report.part(share, 'first'),
        'easy_share_last_tenth': report.part(share, 'last'),
        'cum_prompts_generated': report.final(runs, _CUM),
        'final_accuracy': report.final(runs, _ACC),
        'easy_slots_handed_over': _total(runs, 'data/handover_out/easy'),
    }
  x = np.arange(spec.steps)
  shares = {}
  for b in all_runs:
    easy = curves[f'easy_share/{b}']
    shares[f'easy half, {b}'] = (x, plots.smooth(easy, 10))
    shares[f'hard half, {b}'] = (x, plots.smooth(1.0 - easy, 10))
  panels = [
      plots.Panel('batch share (10-step mean)', 'step', 'share', shares,
                  hlines={'weight 0.5': 0.5}),
      plots.Panel('cumulative prompts generated', 'step', 'prompts',
                  {b: (x, curves[f'cum_prompts_generated/{b}'])
                   for b in all_runs}),
  ]
  return report.write(out_dir, 'drift', spec, seeds, t0, results, curves,
                      panels, 'drift: easy and hard halves, equal weights')


CONFLICT_POLICIES = (
    ('none', dict(policy='none')),
    ('filter', dict(policy='filter')),
    ('snooze N=2', dict(policy='snooze', snooze_factor=2)),
    ('snooze N=3', dict(policy='snooze', snooze_factor=3)),
    ('snooze N=5', dict(policy='snooze', snooze_factor=5)),
    ('snooze_prob N=5', dict(policy='snooze_prob', snooze_factor=5)),
)


def conflict_spec(size: int, steps: int, engine: str) -> engine_lib.SimSpec:
  """The conflicting-tasks mixture: answerable 90%, unanswerable 10%."""
  majority = round(size * 0.9)
  datasets = (
      engine_lib.SimDataset(name='answerable', size=majority, weight=0.9,
                            difficulty=DIFFICULTY),
      engine_lib.SimDataset(name='unanswerable', size=max(1, size - majority),
                            weight=0.1, difficulty=DIFFICULTY),
  )
  return _spec(datasets, steps, engine,
               skill0={'answerable': 1.0, 'unanswerable': -1.0},
               interference=(('unanswerable', 'answerable', -0.5),))


def conflict(out_dir: str, *, size: int | None = None, seeds: int = 3,
             steps: int | None = None, engine: str = 'fast',
             workers: int = 1) -> dict:
  """Per-task accuracy and minority share with conflicting tasks."""
  t0 = time.perf_counter()
  spec = conflict_spec(size or SQUAD_SIZE, steps or 600, engine)
  all_runs = report.compare(spec, CONFLICT_POLICIES, seeds, workers)
  results, curves = {}, {}
  for label, runs in all_runs.items():
    ans = report.mean(runs, 'sim/accuracy/answerable')
    share = report.mean(runs, 'data/batch_share/unanswerable')
    curves[f'accuracy/answerable/{label}'] = ans
    curves[f'accuracy/unanswerable/{label}'] = report.mean(
        runs, 'sim/accuracy/unanswerable')
    curves[f'minority_share/{label}'] = share
    results[label] = {
        'final_accuracy_answerable': report.final(
            runs, 'sim/accuracy/answerable'),
        'final_accuracy_unanswerable': report.final(
            runs, 'sim/accuracy/unanswerable'),
        'peak_accuracy_answerable': float(ans.max()),
        'answerable_drop_from_peak': float(ans.max() - ans[-1]),
        'minority_share_first_tenth': report.part(share, 'first'),
        'minority_share_last_tenth': report.part(share, 'last'),
        'minority_share_max_10step': float(plots.smooth(share, 10).max()),
        'cum_prompts_generated': report.final(runs, _CUM),
        'batch_short_total': _total(runs, 'rollout/batch_short'),
    }
  x = np.arange(spec.steps)

  def pick(prefix, window=1):
    return {k[len(prefix):]: (x, plots.smooth(v, window))
            for k, v in curves.items() if k.startswith(prefix)}

  panels = [
      plots.Panel('answerable: held-out accuracy', 'step', 'accuracy',
                  pick('accuracy/answerable/')),
      plots.Panel('unanswerable: held-out accuracy', 'step', 'accuracy',
                  pick('accuracy/unanswerable/')),
      plots.Panel('unanswerable batch share (10-step mean)', 'step', 'share',
                  pick('minority_share/', 10), hlines={'weight 0.1': 0.1}),
  ]
  return report.write(out_dir, 'conflict', spec, seeds, t0, results, curves,
                      panels, 'conflict: answerable 90% vs unanswerable 10%')


def sweep(out_dir: str, *, size: int | None = None, seeds: int = 3,
          steps: int | None = None, engine: str = 'fast',
          workers: int = 1) -> dict:
  """Snooze factor N against prompts generated and accuracy.

  Two settings: 'at_scale' (`size`, default 1M examples, a large-batch
  run) and 'multi_epoch' (the efficiency experiment's run on 7,473
  examples). A snooze only acts when its example comes up again, so N
  matters in proportion to the epochs a run walks.
  """
  t0 = time.perf_counter()
  specs = {
      'at_scale': _spec(_math(size or SWEEP_SIZE), steps or 600, engine,
                        **AT_SCALE),
      'multi_epoch': _spec(_math(GSM8K_SIZE), steps or 300, engine),
  }
  variants = [('none', dict(policy='none')), ('filter', dict(policy='filter'))]
  variants += [(f'snooze N={n}', dict(policy='snooze', snooze_factor=n))
               for n in SWEEP_FACTORS]
  results = {setting: _costs(report.compare(spec, variants, seeds, workers))
             for setting, spec in specs.items()}
  factors = np.array(SWEEP_FACTORS, np.float64)

  def by_n(setting, key, scale=1.0):
    return factors, np.array([results[setting][f'snooze N={n}'][key]['mean']
                              for n in SWEEP_FACTORS]) / scale

  none = {s: results[s]['none']['cum_prompts_generated']['mean']
          for s in specs}
  sizes = {s: spec.datasets[0].size for s, spec in specs.items()}
  names = {s: f'{sizes[s]:,} examples ({none[s] / sizes[s]:.1f} passes '
              'under none)' for s in specs}
  panels = [
      plots.Panel('prompts generated / none\'s', 'snooze factor N', 'ratio',
                  {names[s]: by_n(s, 'cum_prompts_generated', none[s])
                   for s in specs},
                  hlines={f'filter, {s}': results[s]['filter'][
                      'cum_prompts_generated']['mean'] / none[s]
                          for s in specs}, logx=True),
      plots.Panel('final held-out accuracy', 'snooze factor N', 'accuracy',
                  {names[s]: by_n(s, 'final_accuracy') for s in specs},
                  logx=True),
  ]
  return report.write(out_dir, 'sweep', specs, seeds, t0, results,
                      {'snooze_factors': list(SWEEP_FACTORS)}, panels,
                      'sweep: snooze factor N')


EXPERIMENTS: dict[str, Callable[..., dict]] = {
    'waste': waste,
    'efficiency': efficiency,
    'drift': drift,
    'conflict': conflict,
    'sweep': sweep,
}
