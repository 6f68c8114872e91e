"""Value rules, shared by the config schema and the library dataclasses.

A rule maps a value to None (fine) or to what is wrong with it ('must be
> 0'). `config_lib` attaches rules to its fields; a library dataclass that
takes the same setting (`rl.rollout.RolloutConfig`, `data.snooze.PolicyConfig`,
`train_step.LossConfig`) checks it with the same rule through `check`, so a
setting has one rule and one message.
"""

from collections.abc import Callable, Iterable
from typing import Any

from jaxgrpo.errors import ConfigError

Rule = Callable[[Any], str | None]


def rule(ok: Callable[[Any], bool], message: str) -> Rule:
  return lambda value: None if ok(value) else message


def one_of(choices: Iterable[str] | Callable[[], Iterable[str]]) -> Rule:
  """Value in `choices` (or in what a registry's `choices()` returns now)."""

  def check(value):
    names = tuple(choices() if callable(choices) else choices)
    return None if value in names else f'must be one of {names}'

  return check


def in_range(lo: float, hi: float, brackets: str = '[]') -> Rule:
  """Value in the interval, e.g. brackets '(]' for (lo, hi]."""
  lo_ok = (lambda v: v >= lo) if brackets[0] == '[' else (lambda v: v > lo)
  hi_ok = (lambda v: v <= hi) if brackets[1] == ']' else (lambda v: v < hi)
  return rule(lambda v: lo_ok(v) and hi_ok(v),
              f'must be in {brackets[0]}{lo:g}, {hi:g}{brackets[1]}')


def optional(check: Rule, none: str) -> Rule:
  """`check`, or None (which means `none`)."""
  return lambda v: None if v is None else (
      check(v) and f'{check(v)}, or None ({none})')


POSITIVE = rule(lambda v: v > 0, 'must be > 0')
NON_NEGATIVE = rule(lambda v: v >= 0, 'must be >= 0')


def check(obj: Any, rules: dict[str, Rule], section: str) -> None:
  """Raises ConfigError `section.key=value: message` for the first broken
  rule of `obj`'s attributes."""
  for key, broken in rules.items():
    value = getattr(obj, key)
    message = broken(value)
    if message:
      name = f'{section}.{key}' if section else key
      raise ConfigError(f'{name}={value!r}: {message}')
