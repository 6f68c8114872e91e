"""Arithmetic word problems written in the GSM8K file format.

Each record is `{"question": ..., "answer": ...}` where the answer is a
worked solution with a calculator annotation and a final `#### <number>`
line, exactly like GSM8K's files, so the GSM8K reader, prompt template and
math verifier run on it unchanged. The problems are one- or two-operand sums,
differences and products that a small model trained from scratch can learn,
which makes the file a stand-in for GSM8K in CPU runs and tests.

    python -m jaxgrpo.data.word_problems --out problems.jsonl --num 1000

`configs/data/word_problems.jsonl` holds 1,200 problems written with
`--num 1200` and the other defaults.
"""

import argparse
from collections.abc import Iterator
import json

import numpy as np

_NAMES = ('Ana', 'Ben', 'Carla', 'Dev', 'Eli', 'Fatima', 'Goro', 'Hana',
          'Ivan', 'Jun', 'Kofi', 'Lena', 'Mateo', 'Nia', 'Omar', 'Priya')
_ITEMS = ('apples', 'books', 'coins', 'pencils', 'stamps', 'marbles',
          'cookies', 'shells', 'cards', 'stickers')


def _problem(rng: np.random.Generator, max_value: int) -> dict[str, str]:
  name = str(rng.choice(_NAMES))
  item = str(rng.choice(_ITEMS))
  kind = int(rng.integers(3))
  if kind == 0:
    a, b = (int(x) for x in rng.integers(1, max_value + 1, size=2))
    c = a + b
    question = f'{name} has {a} {item} and gets {b} more. How many now?'
    answer = f'{name} has {a} + {b} = <<{a}+{b}={c}>>{c} {item}.'
  elif kind == 1:
    a, b = sorted((int(x) for x in rng.integers(1, max_value + 1, size=2)),
                  reverse=True)
    c = a - b
    question = f'{name} had {a} {item} and gave away {b}. How many are left?'
    answer = f'{a} - {b} = <<{a}-{b}={c}>>{c} {item} are left.'
  else:
    a = int(rng.integers(2, 10))
    b = int(rng.integers(2, max(3, max_value // 4)))
    c = a * b
    question = f'{name} buys {a} bags of {b} {item}. How many {item} in all?'
    answer = f'{a} bags of {b} is {a} * {b} = <<{a}*{b}={c}>>{c} {item}.'
  return {'question': question, 'answer': f'{answer}\n#### {c}'}


def records(num: int, *, seed: int = 0,
            max_value: int = 50) -> Iterator[dict[str, str]]:
  """`num` GSM8K-format records, reproducible from `seed`."""
  rng = np.random.default_rng(seed)
  for _ in range(num):
    yield _problem(rng, max_value)


def write(path: str, num: int, *, seed: int = 0, max_value: int = 50) -> int:
  """Writes `num` records as JSONL; returns the count."""
  with open(path, 'w', encoding='utf-8') as f:
    for record in records(num, seed=seed, max_value=max_value):
      f.write(json.dumps(record) + '\n')
  return num


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out', required=True, help='output JSONL file')
  parser.add_argument('--num', type=int, default=1000)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--max_value', type=int, default=50,
                      help='largest operand')
  args = parser.parse_args(argv)
  n = write(args.out, args.num, seed=args.seed, max_value=args.max_value)
  print(f'wrote {n} problems to {args.out}')


if __name__ == '__main__':
  main()
