r"""Cost of the snooze-aware sampler at scale, and adaptive vs fixed rounds.

Part 1 (`--part scale`): a mixture of 4 datasets totalling 10M examples,
half of them snoozed, under `snooze`:
  * median time to choose a round of 1,024 prompts (allocation across
    datasets plus each dataset's epoch walk; sources are plain ranges so the
    figure is the choice, not record decoding);
  * state bytes per example;
  * time to save and restore the sampler state through orbax (the same
    Checkpointer the trainer uses), and the state's size on disk;
  * the choice as a share of a GRPO step of the ~10M-parameter config
    (pass its time with --grpo-step-s; BENCHMARKS.md has the measured one).

Part 2 (`--part rounds`): generator calls and prompts generated to fill
B=16 groups per step over 60 steps, for fixed round sizes and
`round_size='adaptive'`, on a dataset that the (scripted) model has mostly
mastered: 75% of examples at pass rate 0.97, 25% at 0.5.

  python benchmarks/sampler.py --part scale
  python benchmarks/sampler.py --part rounds
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxgrpo import checkpoint  # pylint: disable=g-import-not-at-top
from jaxgrpo.data import mixture
from jaxgrpo.data import snooze
from tests import scripted


def bench_scale(args):
  sizes = [4_000_000, 3_000_000, 2_000_000, 1_000_000]
  policy = snooze.PolicyConfig(policy='snooze', snooze_factor=5)
  specs = [(mixture.DatasetSpec(name=f'd{i}', weight=w, policy=policy),
            range(n))
           for i, (n, w) in enumerate(zip(sizes, (0.4, 0.3, 0.2, 0.1)))]
  t0 = time.perf_counter()
  sampler = mixture.MixtureSampler(specs, balance='pre_filter',
                                   batch_size=256, seed=0)
  build_s = time.perf_counter() - t0
  rng = np.random.default_rng(0)
  for table in sampler.tables:
    asleep = rng.random(table.size) < 0.5
    table.status[asleep] = snooze.SNOOZED
    table.wake_epoch[asleep] = 1_000
  times = []
  for step in range(args.rounds):
    sampler.start_step(step)
    t0 = time.perf_counter()
    picked = sampler.next_prompts(1024)
    times.append(time.perf_counter() - t0)
    assert len(picked) == 1024
  total = sum(sizes)
  state_bytes = sum(t.bytes_per_example * t.size for t in sampler.tables)
  print(f'datasets: 4, {total:,} examples, 50% snoozed; built in '
        f'{build_s:.2f}s')
  print(f'choose a round of 1,024: median {statistics.median(times) * 1e3:.2f}'
        f' ms, p90 {np.percentile(times, 90) * 1e3:.2f} ms, max '
        f'{max(times) * 1e3:.2f} ms over {len(times)} rounds')
  print(f'state: {state_bytes / total:.1f} bytes per example '
        f'({state_bytes / 2**20:.0f} MiB)')

  tmp = tempfile.mkdtemp()
  try:
    saves, restores = [], []
    for i in range(args.ckpt_repeats):
      ckpt = checkpoint.Checkpointer(os.path.join(tmp, f'run{i}'), every=1,
                                     max_to_keep=1)
      state = sampler.get_state()
      t0 = time.perf_counter()
      ckpt.save(1, {'x': jax.numpy.zeros(())}, {'source': state}, {})
      ckpt.wait()
      saves.append(time.perf_counter() - t0)
      t0 = time.perf_counter()
      restored = ckpt.restore(1, {'x': jax.numpy.zeros(())})
      sampler.set_state(restored.data['source'])
      restores.append(time.perf_counter() - t0)
      ckpt.close()
      disk = sum(os.path.getsize(os.path.join(d, f))
                 for d, _, fs in os.walk(os.path.join(tmp, f'run{i}'))
                 for f in fs)
    print(f'orbax save (to completion): median {statistics.median(saves):.2f}s;'
          f' restore into the sampler: median '
          f'{statistics.median(restores):.2f}s; {disk / 2**20:.0f} MiB on disk')
  finally:
    shutil.rmtree(tmp)
  if args.grpo_step_s:
    share = statistics.median(times) / args.grpo_step_s
    print(f'choice per round vs a {args.grpo_step_s:.2f}s GRPO step: '
          f'{share * 100:.3f}%')


def bench_rounds(args):
  rates = [0.97] * 768 + [0.5] * 256
  print(f'{"surplus":>8}  {"round size":>10}  {"calls/step":>10}  '
        f'{"prompts/step":>12}  {"efficiency":>10}  {"short steps":>11}')
  for surplus in ('carry', 'drop'):
    for round_size in (8, 16, 32, 64, 'adaptive'):
      _rounds_row(args, rates, surplus, round_size)


def _rounds_row(args, rates, surplus, round_size):
  ro, _, gen = scripted.make_rollout(
      [('d', 1.0, rates)], policy='none', batch_size=16, group_size=8,
      round_size=round_size, max_rounds=50, max_round_size=256,
      surplus=surplus)
  short = 0
  for step in range(args.steps):
    res = ro.collect(None, jax.random.key(step), step)
    short += res.metrics['rollout/batch_short'] > 0
  m = res.metrics
  calls = gen.calls / args.steps
  prompts = m['rollout/cum_prompts_generated'] / args.steps
  efficiency = m['rollout/cum_groups_used'] / m['rollout/cum_prompts_generated']
  print(f'{surplus:>8}  {round_size!s:>10}  {calls:10.2f}  {prompts:12.1f}  '
        f'{efficiency:10.3f}  {short:11d}')


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--part', choices=('scale', 'rounds'), default='scale')
  parser.add_argument('--rounds', type=int, default=200)
  parser.add_argument('--ckpt-repeats', type=int, default=3)
  parser.add_argument('--steps', type=int, default=60)
  parser.add_argument('--grpo-step-s', type=float, default=0.0)
  args = parser.parse_args()
  if args.part == 'scale':
    bench_scale(args)
  else:
    bench_rounds(args)


if __name__ == '__main__':
  main()
