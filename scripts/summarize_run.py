r"""Summarizes a run's metrics.jsonl in windows of steps.

For each window: mean sampled reward, prompts generated per step against the
optimal B (rollout/groups_used), efficiency, rounds per step, and the last
held-out accuracy seen. Useful on a TPU VM without a plotting stack:

  python scripts/summarize_run.py runs/demo --window 20
"""

import argparse

import numpy as np

from jaxgrpo.reporting import plot_panels


def _mean(values: list[float]) -> float:
  """The mean, or nan for none (a step whose batch was all carried in
  generated nothing, and has no reward/mean)."""
  return float(np.mean(values)) if values else float('nan')


def summarize(records: list[dict], window: int) -> list[tuple]:
  """Rows (first step, last step, reward, generated/step, used/step,
  efficiency, rounds/step, eval accuracy or None)."""
  steps = [r for r in records if 'rollout/prompts_generated' in r]
  evals = {r['step']: r['eval/accuracy'] for r in records if 'eval/accuracy' in r}
  rows = []
  for start in range(0, len(steps), window):
    chunk = steps[start:start + window]
    generated = sum(r['rollout/prompts_generated'] for r in chunk)
    used = sum(r['rollout/groups_used'] for r in chunk)
    last = chunk[-1]['step']
    seen = [s for s in evals if s <= last]
    rows.append((
        chunk[0]['step'], last,
        _mean([r['reward/mean'] for r in chunk if 'reward/mean' in r]),
        generated / len(chunk), used / len(chunk),
        used / generated if generated else float('nan'),
        float(np.mean([r['rollout/rounds'] for r in chunk])),
        evals[max(seen)] if seen else None,
    ))
  return rows


def main(argv: list[str] | None = None) -> None:
  """Prints the table; a mistake ends with one line and exit code 2."""
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('workdir')
  parser.add_argument('--window', type=int, default=20)
  args = parser.parse_args(argv)
  if args.window < 1:
    parser.error(f'--window={args.window}: must be >= 1')
  # A line cut short by a killed run, or no object, is left out; a run
  # that has not written its first line (its lock there) has no records.
  try:
    records = plot_panels.read_records(args.workdir)
  except OSError as e:
    parser.error(f'{args.workdir}: cannot read its metrics.jsonl '
                 f'({e.strerror or e}); name a run workdir')
  rows = summarize(records, args.window)
  if not rows:  # stopped at step 0 (a warm start alone), or not started
    evals = [r['eval/accuracy'] for r in records if 'eval/accuracy' in r]
    print(f'{args.workdir}: no GRPO step in its metrics.jsonl yet'
          + (f' (held-out accuracy {evals[-1]:.3f})' if evals else ''))
    return
  print(f'{"steps":>11}  {"reward":>6}  {"gen/step":>8}  {"used/step":>9}  '
        f'{"eff":>5}  {"rounds":>6}  {"eval":>5}')
  for first, last, reward, gen, used, eff, rounds, acc in rows:
    acc_text = '-' if acc is None else f'{acc:.3f}'
    print(f'{first:>5}-{last:<5}  {reward:6.3f}  {gen:8.1f}  {used:9.1f}  '
          f'{eff:5.2f}  {rounds:6.2f}  {acc_text:>5}')


if __name__ == '__main__':
  main()
