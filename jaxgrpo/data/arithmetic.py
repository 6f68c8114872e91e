"""The built-in verifiable task: synthetic arithmetic with difficulty levels.

Problems look like `47+385=` with answer `432`. Each example is generated from
`(seed, index)` alone, so a dataset of any size is reproducible without files,
and example ids (`<name>/<index>`) are stable across runs.
"""

from collections.abc import Iterator, Sequence
import dataclasses

import numpy as np

from jaxgrpo import checks
from jaxgrpo.example import Example

_OPS = ('+', '-', '*')
# The right answer to an unanswerable problem.
REFUSAL = 'none'
_CARRIES = ('any', 'none', 'required')
UNANSWERABLE = (False, True, 'missing', 'negative')


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArithmeticSpec:
  """Which problems a synthetic arithmetic dataset holds.

  Attributes:
    min_digits: fewest digits of an operand.
    max_digits: most digits of an operand.
    ops: operators to draw from, e.g. '+' or '+-'.
    carries: 'any', 'none' (no carry or borrow anywhere) or 'required' (at
      least one); only constrains '+' and '-' problems.
    seed: generation seed; different seeds give different problems.
    unanswerable: False: ordinary problems. True or 'missing': the second
      operand is missing ('47+?='), a cue the model sees at once. 'negative':
      subtractions whose result would be negative ('23-57='), which in
      natural numbers have no answer; they look like the answerable
      subtractions ('57-23=', drawn with a >= b), so the model must compare
      the operands to know whether to answer. The right answer is the
      refusal `REFUSAL` ('none') and the subset label 'unanswerable'. A
      mixture of these with answerable problems is a pair of conflicting
      tasks (answer vs refuse); 'negative' makes them interfere.
  """

  min_digits: int = 1
  max_digits: int = 3
  ops: str = '+'
  carries: str = 'any'
  seed: int = 0
  unanswerable: bool | str = False

  def __post_init__(self):
    for key, ok, message in spec_checks(self):
      if not ok:
        checks.fail(f'arithmetic.{key}', getattr(self, key), message)


def spec_checks(spec) -> Iterator[tuple[str, bool, str]]:
  """(key, ok, message) of a spec's checks, in order: `ArithmeticSpec`'s,
  and those of the config's dataset entries of kind 'arithmetic'."""
  yield 'min_digits', 1 <= spec.min_digits <= 9, 'must be in [1, 9]'
  yield 'max_digits', spec.min_digits <= spec.max_digits <= 9, (
      'must be in [min_digits, 9]')
  yield 'ops', bool(spec.ops) and set(spec.ops) <= set(_OPS), (
      "must be a non-empty string of '+', '-', '*'")
  yield 'carries', spec.carries in _CARRIES, f'must be one of {_CARRIES}'
  yield 'unanswerable', spec.unanswerable in UNANSWERABLE, (
      f'must be one of {UNANSWERABLE}')
  yield 'unanswerable', spec.unanswerable != 'negative' or spec.ops == '-', (
      "'negative' needs ops='-'")


def count_carries(a: int, b: int, op: str) -> int:
  """Number of digit positions that carry (for '+') or borrow (for '-')."""
  if op not in '+-':
    return 0
  count, carry = 0, 0
  while a or b:
    da, db = a % 10, b % 10
    if op == '+':
      carry = int(da + db + carry >= 10)
    else:
      carry = int(da - db - carry < 0)
    count += carry
    a, b = a // 10, b // 10
  return count


def _operand(rng: np.random.Generator, spec: ArithmeticSpec) -> int:
  digits = int(rng.integers(spec.min_digits, spec.max_digits + 1))
  low = 0 if digits == 1 else 10 ** (digits - 1)
  return int(rng.integers(low, 10**digits))


def make_problem(spec: ArithmeticSpec, index: int) -> tuple[int, str, int]:
  """Deterministically draws problem `index`: returns (a, op, b)."""
  rng = np.random.default_rng([spec.seed, index])
  for _ in range(1000):
    op = spec.ops[int(rng.integers(len(spec.ops)))]
    a, b = _operand(rng, spec), _operand(rng, spec)
    if op == '-' and b > a:
      a, b = b, a
    if spec.unanswerable == 'negative':
      if a == b:
        continue
      a, b = b, a
    carries = count_carries(a, b, op)
    if (
        spec.carries == 'any'
        or (spec.carries == 'none' and carries == 0)
        or (spec.carries == 'required' and carries > 0)
    ):
      return a, op, b
  raise ValueError(f'arithmetic: no problem satisfies {spec}')


def _solve(a: int, op: str, b: int) -> int:
  return a + b if op == '+' else a - b if op == '-' else a * b


def make_examples(
    spec: ArithmeticSpec,
    indices: Sequence[int] | range,
    *,
    name: str = 'arithmetic',
    template: str | None = None,
) -> list[Example]:
  """Builds examples for the given problem indices of a dataset.

  Args:
    spec: which problems.
    indices: problem indices; ids are `f'{name}/{index}'`.
    name: dataset name, also the id prefix.
    template: prompt text for models that read questions, a `str.format`
      template over `{expression}` ('47+385') and `{prompt}` ('47+385=');
      None: the prompt is `{prompt}`.

  Returns:
    Examples whose subset label is the operand digit count, e.g. '3d'.
  """
  out = []
  for i in indices:
    a, op, b = make_problem(spec, i)
    digits = max(len(str(a)), len(str(b)))
    missing = spec.unanswerable in (True, 'missing')
    expression = f'{a}{op}{"?" if missing else b}'
    prompt = f'{expression}='
    if template is not None:
      prompt = template.format(expression=expression, prompt=prompt)
    out.append(
        Example(
            id=f'{name}/{i}',
            prompt=prompt,
            answer=REFUSAL if spec.unanswerable else str(_solve(a, op, b)),
            dataset=name,
            subset='unanswerable' if spec.unanswerable else f'{digits}d',
        )
    )
  return out


def split_train_eval(
    spec: ArithmeticSpec, num_train: int, num_eval: int, *, name: str,
    template: str | None = None,
) -> tuple[list[Example], list[Example]]:
  """A train set and a held-out eval set with no prompt in common.

  Eval problems are drawn from indices after the train range; any whose
  prompt also occurs in the train set is skipped (and the next index used),
  so held-out accuracy never measures memorised training prompts.
  """
  train = make_examples(spec, range(num_train), name=name, template=template)
  seen = {ex.prompt for ex in train}
  held_out: list[Example] = []
  index = num_train
  limit = num_train + 100 * max(num_eval, 1)
  while len(held_out) < num_eval and index < limit:
    (ex,) = make_examples(spec, [index], name=name, template=template)
    if ex.prompt not in seen:
      held_out.append(ex)
      seen.add(ex.prompt)
    index += 1
  if len(held_out) < num_eval:
    raise ValueError(
        f'only {len(held_out)} held-out problems differ from the {num_train} '
        f'training problems of dataset {name!r} (wanted {num_eval}); widen '
        'the digit range or shrink num_train or num_eval')
  return train, held_out
