r"""Verifier throughput, and its share of a GRPO step.

Part 1: 4,096 GSM8K-style completions scored by the `math` verifier (built
from the GSM8K test solutions in ../shared/data: a quarter verbatim, a
quarter with the `####` line replaced by "The answer is \boxed{x}.", a
quarter without any marker (last-number fallback) and a quarter with a wrong
final answer), in the trainer's process and with a pool of worker processes
(the default 2). Prints completions/s for each and their ratio, median of
`--repeats` timed batches after one warm-up batch.

Part 2: a short GRPO run of configs/gsm8k_mixture.py (tiny model; the
built-in task plus GSM8K-format word problems, verified by `math`) with
verifier workers, reporting perf/verify_s as a share of perf/step_s.

  python benchmarks/verify.py
  python benchmarks/verify.py --workers 2 --repeats 5 --steps 6
"""

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top
from jaxgrpo import configs
from jaxgrpo import verifiers
from jaxgrpo.example import Example
from jaxgrpo.verifiers import pool

_DATA = configs.shared_data('gsm8k', 'test.jsonl')


def completions(n: int) -> tuple[list[str], list[Example]]:
  """n GSM8K-style completions and the examples they answer."""
  with open(_DATA, encoding='utf-8') as f:
    records = [json.loads(line) for line in f if line.strip()]
  texts, examples = [], []
  for i in range(n):
    record = records[i % len(records)]
    solution = record['answer']
    final = solution.rsplit('####', 1)[1].strip()
    body = solution.rsplit('####', 1)[0].rstrip()
    style = i % 4
    if style == 0:
      text = solution
    elif style == 1:
      text = f'{body}\nThe answer is $\\boxed{{{final}}}$.'
    elif style == 2:
      text = re.sub(r'<<[^>]*>>', '', body)
    else:
      text = f'{body}\n#### {final}1'
    texts.append(text)
    examples.append(Example(id=f'gsm8k/{i % len(records)}',
                            prompt=record['question'], answer=final,
                            dataset='gsm8k'))
  return texts, examples


def bench_scoring(args) -> None:
  texts, examples = completions(args.batch)
  math_verifier = verifiers.build('math')
  rows = {}
  for workers in (0, args.workers):
    with pool.Scorer({'gsm8k': math_verifier}, workers=workers,
                     timeout_s=10.0) as scorer:
      rewards, _ = scorer.score(texts, examples)  # warm-up (and start-up)
      times = []
      for _ in range(args.repeats):
        t0 = time.perf_counter()
        scorer.score(texts, examples)
        times.append(time.perf_counter() - t0)
    rows[workers] = statistics.median(times)
    print(f'workers={workers}: {args.batch / rows[workers]:,.0f} '
          f'completions/s ({rows[workers] * 1e3:.1f} ms per batch of '
          f'{args.batch}; mean reward {rewards.mean():.3f})')
  print(f'ratio (workers={args.workers} / in-process): '
        f'{rows[0] / rows[args.workers]:.2f}x')


def bench_step_share(args) -> None:
  # Imported here: part 1 needs no JAX.
  from jaxgrpo.configs import gsm8k_mixture  # pylint: disable=g-import-not-at-top
  from jaxgrpo.reporting import metrics as metrics_lib  # pylint: disable=g-import-not-at-top
  from jaxgrpo import train  # pylint: disable=g-import-not-at-top

  c = gsm8k_mixture.get_config()
  c.total_steps = args.steps
  c.eval.every = 0
  c.verify.workers = args.workers
  c.warmstart.max_steps = 300
  with tempfile.TemporaryDirectory() as workdir:
    train.run(c, workdir, log=lambda _: None)
    records = [r for r in metrics_lib.read_metrics(workdir)[2:]
               if 'perf/verify_s' in r]  # step 1 compiles
  verify_s = statistics.mean(r['perf/verify_s'] for r in records)
  step_s = statistics.mean(r['perf/step_s'] for r in records)
  done = statistics.mean(
      r['rollout/prompts_generated'] * c.rollout.group_size for r in records)
  print(f'GRPO step (configs/gsm8k_mixture.py, steps 2-{args.steps}): '
        f'{step_s:.3f} s, of which verifying {verify_s * 1e3:.1f} ms for '
        f'{done:.0f} completions = {verify_s / step_s:.1%} of the step')


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--batch', type=int, default=4096)
  parser.add_argument('--workers', type=int, default=2)
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--steps', type=int, default=6)
  parser.add_argument('--part', choices=('all', 'scoring', 'step'),
                      default='all')
  args = parser.parse_args()
  if not os.path.exists(_DATA):
    sys.exit(f'GSM8K test file not found: {_DATA}')
  if args.part in ('all', 'scoring'):
    bench_scoring(args)
  if args.part in ('all', 'step'):
    bench_step_share(args)


if __name__ == '__main__':
  main()
