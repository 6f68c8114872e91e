r"""Fits the simulator's learner to the real `none` runs, then predicts.

  python scripts/fit_simulator.py            # writes docs/results/data/sim_fit.json

The learner (jaxgrpo/sim/learner.py) has four free numbers: the starting
skill, the spread of example difficulties, the skill gained per full batch
(lr) and the memorisation an example gains each time it is trained on
(lr_example). A grid search picks those whose simulated `none` run, with
the regime's B, G, round size, round cap, dataset size and steps, best
matches the real `none` runs (mean over seeds) in two per-step series:

  * prompts generated per step (10-step mean, in logs), which decides every
    generation cost;
  * the mean reward of the step's completions on training prompts.

Held-out accuracy is not fitted: the real runs measure it greedily, the
learner as a mean pass rate. With the fitted learner every policy of the
regime is simulated, and its saving in prompts to reach 0.95 x `none`'s
final held-out accuracy, and in prompts over the whole run, are computed as
for the real runs; the report sets those predictions beside the measured
savings. `--predict-only` keeps the fitted numbers and predicts again.
"""

import argparse
import dataclasses
import itertools
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# pylint: disable=g-import-not-at-top,wrong-import-position
import reproduce
import results_report as rr
from jaxgrpo.reporting.plot_panels import smooth
from jaxgrpo.sim import engine
from jaxgrpo.sim import learner as learner_lib

# Each simulated run walks up to 128 rounds of 64 prompts a step through the
# real sampler, so a point costs seconds: a coarse grid.
GRID = {
    'skill0': (1.5, 2.5, 3.5),
    'scale': (1.0, 3.0),
    'lr': (0.01, 0.04),
    'lr_example': (0.1, 1.0),
}
SIM_SEEDS = (0, 1, 2)


def real_curves(data: str):
  """Mean over seeds of the `none` runs' per-step series."""
  runs = rr.load(data, 'regime').get('none', {})
  if not runs:
    raise SystemExit(f'no regime/none runs under {data}')
  gen = np.mean([[r.get('rollout/prompts_generated', 0.0) for r in run.steps]
                 for run in runs.values()], axis=0)
  reward = np.mean([[r.get('reward/mean', np.nan) for r in run.steps]
                    for run in runs.values()], axis=0)
  return (smooth(gen, 10), smooth(np.nan_to_num(reward, nan=1.0), 10),
          len(runs))


def spec(params: dict, experiment, policy: dict, seed: int) -> engine.SimSpec:
  s = {**experiment.settings, **policy}
  entry = experiment.datasets[0]
  return engine.SimSpec(
      datasets=(engine.SimDataset(
          name=entry['name'], size=entry['num_train'],
          difficulty=learner_lib.Difficulty(scale=params['scale'])),),
      policy=s['sampler.policy'],
      snooze_factor=s.get('sampler.snooze_factor', 5),
      snooze_hard_factor=s.get('sampler.snooze_hard_factor', 0),
      batch_size=16, group_size=8, round_size=s['rollout.round_size'],
      max_rounds=s['rollout.max_rounds'], steps=experiment.steps,
      skill0={entry['name']: params['skill0']}, lr=params['lr'],
      lr_example=params['lr_example'], heldout_size=1024, seed=seed,
      engine='fast')


def simulate(params, experiment, policy, seed):
  records = engine.run(spec(params, experiment, policy, seed))
  name = experiment.datasets[0]['name']
  gen = np.array([r['rollout/prompts_generated'] for r in records])
  reward = np.array([r.get('reward/mean', np.nan) for r in records])
  acc = np.array([r[f'sim/accuracy/{name}'] for r in records])
  return gen, reward, acc


def loss(params, experiment, real_gen, real_reward) -> tuple[float, float,
                                                             float]:
  gen, reward, _ = simulate(params, experiment, reproduce.POLICIES['none'], 0)
  gen, reward = smooth(gen, 10), smooth(np.nan_to_num(reward, nan=1.0), 10)
  gen_err = float(np.sqrt(np.mean((np.log1p(gen) - np.log1p(real_gen))**2)))
  reward_err = float(np.sqrt(np.mean((reward - real_reward)**2)))
  return gen_err + 5.0 * reward_err, gen_err, reward_err


def cost_to_target(gen, acc, target):
  cum = np.cumsum(gen)
  hit = np.flatnonzero(acc >= target)
  return float(cum[hit[0]]) if len(hit) else None


def predict(params, experiment) -> dict:
  """Per policy: predicted saving in prompts (per sim seed) and accuracy."""
  base = {s: simulate(params, experiment, reproduce.POLICIES['none'], s)
          for s in SIM_SEEDS}
  out = {}
  for name, policy in experiment.variants.items():
    ratios, whole, finals = [], [], []
    for s in SIM_SEEDS:
      gen, _, acc = (base[s] if name == 'none'
                     else simulate(params, experiment, policy, s))
      b_gen, _, b_acc = base[s]
      target = rr.TARGET * float(b_acc[-1])
      c, b = cost_to_target(gen, acc, target), cost_to_target(b_gen, b_acc,
                                                              target)
      ratios.append(0.0 if c is None else b / c)
      whole.append(float(b_gen.sum()) / max(float(gen.sum()), 1.0))
      finals.append(float(acc[-1]))
    out[name] = {'saving_prompts': ratios, 'saving_prompts_whole': whole,
                 'final_accuracy': finals}
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--data', default=reproduce.DATA)
  parser.add_argument('--out', default=None,
                      help='default: DATA/sim_fit.json, which `reproduce.py '
                      'report --data DATA` reads')
  parser.add_argument('--predict-only', action='store_true',
                      help='keep the fitted params in --out; predict again')
  args = parser.parse_args(argv)
  args.out = args.out or os.path.join(args.data, 'sim_fit.json')
  if args.predict_only:
    with open(args.out) as f:
      result = json.load(f)
    experiment = reproduce.experiments()['regime']
    result['predictions'] = predict(result['params'], experiment)
    # The fit's commit stays; the predictions name the code that made them.
    result['predicted_at'] = reproduce.commit()
    with open(args.out, 'w') as f:
      json.dump(result, f, indent=1)
    print(f'wrote {args.out}')
    return
  real_gen, real_reward, n = real_curves(args.data)
  # As many steps as the runs had (a smoke sweep has a few).
  experiment = dataclasses.replace(reproduce.experiments()['regime'],
                                   steps=len(real_gen))
  t0 = time.perf_counter()
  scored = []
  for values in itertools.product(*GRID.values()):
    params = dict(zip(GRID, values))
    scored.append((loss(params, experiment, real_gen, real_reward), params))
    print(f'{params}: loss {scored[-1][0][0]:.3f} '
          f'({time.perf_counter() - t0:.0f}s)', flush=True)
  scored.sort(key=lambda x: x[0][0])
  (total, gen_err, reward_err), best = scored[0]
  print(f'grid of {len(scored)} in {time.perf_counter() - t0:.0f}s; best '
        f'{best}: log-prompts RMSE {gen_err:.3f}, reward RMSE '
        f'{reward_err:.3f}')
  code = reproduce.commit()
  result = {
      'params': best, 'grid': {k: list(v) for k, v in GRID.items()},
      'none_seeds_fitted': n,
      'fit': {'log_prompts_rmse': gen_err, 'reward_rmse': reward_err},
      'runner_up': [{'params': p, 'loss': l[0]} for l, p in scored[1:4]],
      'predictions': predict(best, experiment),
      'sim_seeds': list(SIM_SEEDS),
      'command': 'python scripts/fit_simulator.py',
      'commit': code, 'predicted_at': code,
  }
  with open(args.out, 'w') as f:
    json.dump(result, f, indent=1)
  print(f'wrote {args.out}')


if __name__ == '__main__':
  main()
