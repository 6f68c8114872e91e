r"""Which rollout engine a config should default to: whole training runs.

Runs the same config (the built-in demo by default) once per mode, with the
same seed, as `python -m jaxgrpo.main` subprocesses, and compares their GRPO
steps' wall time from `metrics.jsonl` (`perf/step_s`, `perf/gen_s`). The
modes:
  * static: `rollout.engine=static`, `collect=rounds` (the default);
  * continuous: `engine=continuous` with the default `rollout.slots`;
  * continuous_matched: `engine=continuous` with as many slots as a round
    has rows (R x G), the static engine's batch;
  * streaming: `engine=continuous`, `collect=streaming`, matched slots.
Repeats are interleaved (mode order rotates). Steps before --skip are left
out of the sums (they compile); the ratio is static's summed step time
over each mode's, so above 1 means faster than static.

  python benchmarks/default_engine.py --json benchmarks/results/default_engine.json
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

# pylint: disable=g-import-not-at-top,wrong-import-position
from jaxgrpo.cli import common as cli_common
from jaxgrpo.reporting import environment

MODES = {
    'static': {'rollout.engine': 'static', 'rollout.collect': 'rounds'},
    'continuous': {'rollout.engine': 'continuous',
                   'rollout.collect': 'rounds'},
    'continuous_matched': {'rollout.engine': 'continuous',
                           'rollout.collect': 'rounds', 'slots': 'matched'},
    'streaming': {'rollout.engine': 'continuous',
                  'rollout.collect': 'streaming', 'slots': 'matched'},
}


def run_once(config: str, mode: str, steps: int, rows: int,
             extra: list[str]) -> dict:
  """One training run of `mode`: its per-step perf metrics and wall time."""
  overrides = dict(MODES[mode])
  if overrides.pop('slots', None) == 'matched':
    overrides['rollout.slots'] = str(rows)
  with tempfile.TemporaryDirectory() as workdir:
    cmd = [sys.executable, '-m', 'jaxgrpo.main', f'--config={config}',
           f'--workdir={workdir}', f'--config.total_steps={steps}',
           '--config.eval.every=0', '--config.plots=False',
           '--config.tensorboard=False', '--quiet'] + [
               f'--config.{k}={v}' for k, v in overrides.items()] + extra
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                          check=False)
    wall = time.perf_counter() - t0
    if proc.returncode:
      raise RuntimeError(f'{mode} failed ({proc.returncode}):\n'
                         f'{proc.stderr[-3000:]}')
    with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
      records = [json.loads(line) for line in f]
  steps_ = [r for r in records
            if r.get('step', 0) >= 1 and 'perf/step_s' in r]
  return {
      'wall_s': round(wall, 2),
      'step_s': [r['perf/step_s'] for r in steps_],
      'gen_s': [r.get('perf/gen_s', 0.0) for r in steps_],
      'tokens_generated': sum(r.get('rollout/tokens_generated', 0)
                              for r in steps_),
      'updates': sum(1 for r in steps_ if not r.get('rollout/batch_short')),
  }


def summarise(runs: list[dict], skip: int) -> dict:
  """Sums over the steps from `skip` on, medians over the repeats."""
  step = [sum(r['step_s'][skip - 1:]) for r in runs]
  gen = [sum(r['gen_s'][skip - 1:]) for r in runs]
  return {
      'steps_s': [round(x, 3) for x in step],
      'gen_s': [round(x, 3) for x in gen],
      'median_steps_s': round(statistics.median(step), 3),
      'median_gen_s': round(statistics.median(gen), 3),
      'median_wall_s': round(statistics.median(r['wall_s'] for r in runs), 2),
      'tokens_generated': [r['tokens_generated'] for r in runs],
      'updates': [r['updates'] for r in runs],
  }


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--config', default='configs/demo.py')
  parser.add_argument('--steps', type=int, default=100)
  parser.add_argument('--skip', type=int, default=3,
                      help='first step summed (earlier ones compile)')
  parser.add_argument('--repeats', type=int, default=2)
  parser.add_argument('--modes', default=','.join(MODES))
  parser.add_argument('--set', action='append', default=[],
                      help='another --config.KEY=VALUE for every run')
  parser.add_argument('--json', default=None)
  args = parser.parse_args(argv)
  if not 1 <= args.skip <= args.steps:
    parser.error(f'--skip={args.skip}: the first step summed, from 1 to '
                 f'--steps={args.steps}')
  modes = args.modes.split(',')
  if unknown := [m for m in modes if m not in MODES]:
    parser.error(f'unknown modes {unknown}; known: {list(MODES)}')
  extra = [f'--config.{item}' for item in args.set]
  cfg = cli_common.load_config('default_engine', args.config, extra)
  round_size = cfg.rollout.round_size
  if round_size == 'adaptive':
    round_size = cfg.rollout.max_round_size
  rows = round_size * cfg.rollout.group_size
  runs = {m: [] for m in modes}
  out = {'command': ' '.join([os.path.basename(sys.argv[0])] + (
      argv if argv is not None else sys.argv[1:])),
         'config': args.config, 'steps': args.steps, 'skip': args.skip,
         'slots_matched': rows, 'environment': environment.environment()}
  for rep in range(args.repeats):
    order = modes[rep % len(modes):] + modes[:rep % len(modes)]
    for mode in order:
      runs[mode].append(run_once(args.config, mode, args.steps, rows, extra))
      print(f'repeat {rep}: {mode}: '
            f'{sum(runs[mode][-1]["step_s"][args.skip - 1:]):.2f}s in steps '
            f'{args.skip}-{args.steps}', flush=True)
    out['modes'] = {m: summarise(r, args.skip) for m, r in runs.items() if r}
    if base := out['modes'].get('static'):
      for s in out['modes'].values():
        s['speedup_vs_static'] = round(
            base['median_steps_s'] / s['median_steps_s'], 3)
    if args.json:
      with open(args.json, 'w', encoding='utf-8') as f:
        json.dump(out, f, indent=1)
  for m, s in out['modes'].items():
    print(f'{m:20s} steps {s["median_steps_s"]:8.2f}s  generation '
          f'{s["median_gen_s"]:8.2f}s  x{s.get("speedup_vs_static", 1):.2f} '
          'vs static')
  return 0


if __name__ == '__main__':
  sys.exit(main())
