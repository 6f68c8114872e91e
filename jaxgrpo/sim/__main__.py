"""Command line of the simulator's experiments.

    python -m jaxgrpo.sim EXPERIMENT --out DIR [--size N] [--seeds S]

Also --steps (default per experiment), --engine (rollout or fast) and
--workers (processes; default the CPU count, at most 8).

EXPERIMENT is one of waste, efficiency, drift, conflict, sweep, or all.
Each writes DIR/<experiment>.json (its numbers and curves) and
DIR/<experiment>.png, and prints the JSON's results.
"""

import argparse
import json
import os
import sys

from jaxgrpo.sim import experiments


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m jaxgrpo.sim',
      description='Simulated runs of the snooze-aware sampler.')
  parser.add_argument('experiment',
                      choices=sorted(experiments.EXPERIMENTS) + ['all'])
  parser.add_argument('--out', required=True, help='output directory')
  parser.add_argument('--size', type=int, default=None,
                      help='dataset size (total examples); default per '
                      'experiment')
  parser.add_argument('--seeds', type=int, default=3,
                      help='seeds to average over')
  parser.add_argument('--steps', type=int, default=None,
                      help='training steps; default per experiment')
  parser.add_argument('--engine', choices=('rollout', 'fast'), default=None,
                      help="'rollout' (real Rollout) or 'fast' (vectorized "
                      'rounds, same metrics); default per experiment')
  parser.add_argument('--workers', type=int,
                      default=min(8, os.cpu_count() or 1),
                      help='processes running the runs of an experiment')
  args = parser.parse_args(argv)
  if args.seeds < 1:
    parser.error(f'--seeds must be >= 1, got {args.seeds}')
  if args.size is not None and args.size < 2:
    parser.error(f'--size must be >= 2, got {args.size}')
  if args.steps is not None and args.steps < 1:
    parser.error(f'--steps must be >= 1, got {args.steps}')
  names = (sorted(experiments.EXPERIMENTS) if args.experiment == 'all'
           else [args.experiment])
  for name in names:
    kwargs = dict(size=args.size, seeds=args.seeds, steps=args.steps,
                  workers=args.workers)
    if args.engine:
      kwargs['engine'] = args.engine
    record = experiments.EXPERIMENTS[name](args.out, **kwargs)
    print(f'== {name} ({record["wall_s"]} s): {args.out}/{name}.json, '
          f'{args.out}/{name}.png')
    print(json.dumps(record['results'], indent=1))
  return 0


if __name__ == '__main__':
  sys.exit(main())
