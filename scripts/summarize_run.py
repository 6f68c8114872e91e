r"""Summarizes a run's metrics.jsonl in windows of steps.

For each window: mean sampled reward, prompts generated per step against the
optimal B (rollout/groups_used), efficiency, rounds per step, and the last
held-out accuracy seen. Useful on a TPU VM without a plotting stack:

  python scripts/summarize_run.py runs/demo --window 20
"""

import argparse
import sys

import numpy as np

from jaxgrpo.records import as_float
from jaxgrpo.reporting import plot_panels

# The metrics read, and those a GRPO step's record holds.
STEP_KEYS = ('rollout/prompts_generated', 'rollout/groups_used',
             'rollout/rounds')
KEYS = STEP_KEYS + ('reward/mean', 'eval/accuracy')


def _mean(values: list[float | None]) -> float:
  """The mean of the numbers, or nan for none (a step whose batch was all
  carried in generated nothing, and has no reward/mean)."""
  values = [v for v in values if v is not None]
  return float(np.mean(values)) if values else float('nan')


def _numbers(records: list[dict], keys: tuple[str, ...]) -> tuple[list, list]:
  """`records` with each of `keys` read as a float (`records.as_float`):
  one that is no number (null, a string) is left out of its record; and
  'step S: key=value' for each left out."""
  out, left_out = [], []
  for r in records:
    r = dict(r)
    for key in keys:
      if key in r and (value := as_float(r[key])) is None:
        left_out.append(f'step {r.get("step", "?")}: {key}={r.pop(key)!r}')
      elif key in r:
        r[key] = value
    out.append(r)
  return out, left_out


def summarize(records: list[dict], window: int) -> list[tuple]:
  """Rows (first step, last step, reward, generated/step, used/step,
  efficiency, rounds/step, eval accuracy or None); each figure is over the
  steps of the window that hold it."""
  steps = [r for r in records if 'step' in r and any(k in r for k in STEP_KEYS)]
  evals = {r['step']: r['eval/accuracy'] for r in records if 'eval/accuracy' in r}
  rows = []
  for start in range(0, len(steps), window):
    chunk = steps[start:start + window]
    both = [r for r in chunk
            if 'rollout/prompts_generated' in r and 'rollout/groups_used' in r]
    generated = sum(r['rollout/prompts_generated'] for r in both)
    last = chunk[-1]['step']
    seen = [s for s in evals if s <= last]
    rows.append((
        chunk[0]['step'], last,
        *(_mean([r.get(k) for r in chunk]) for k in (
            'reward/mean', 'rollout/prompts_generated', 'rollout/groups_used')),
        sum(r['rollout/groups_used'] for r in both) / generated if generated
        else float('nan'),
        _mean([r.get('rollout/rounds') for r in chunk]),
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
  records, left_out = _numbers(records, KEYS)
  if left_out:  # a hand-edited or damaged value: said, not a traceback
    print(f'summarize_run: {len(left_out)} value(s) that are not numbers '
          f'left out ({"; ".join(left_out[:3])}'
          f'{"; ..." * (len(left_out) > 3)})', file=sys.stderr)
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
