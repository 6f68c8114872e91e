"""How settings are declared and checked: rules, fields and sections.

A config section, `class X(Section, name='x')`, declares each setting with
`field(default, help, rule)`; `jaxgrpo.config_lib` puts the sections
together. A rule maps a value to None (fine) or to what is wrong with it
('must be > 0'). A library dataclass that takes a section's settings
(`rl.rollout.RolloutConfig`, `data.snooze.PolicyConfig`,
`train_step.LossConfig`) is a subclass of the section that adds the values
it takes from elsewhere: a setting is declared once, with one rule and one
message, and every message names the key.
"""

from collections.abc import Callable, Iterable, Iterator
import dataclasses
import math
import numbers
import operator
import typing
from typing import Any, ClassVar

from jaxgrpo.errors import ConfigError

Rule = Callable[[Any], str | None]


def rule(ok: Callable[[Any], bool], message: str) -> Rule:
  return lambda value: None if ok(value) else message


def one_of(choices: Iterable[str] | Callable[[], Iterable[str]]) -> Rule:
  """Value in `choices` (or in what a registry's `choices()` returns now)."""

  def check(value):
    names = options(check)
    return None if value in names else f'must be one of {names}'

  check.choices = choices  # for the reference tables (`options`)
  return check


def options(check: Rule | None) -> tuple[str, ...]:
  """The choices of a `one_of` rule as they are now; () for other rules."""
  choices = getattr(check, 'choices', ())
  return tuple(choices() if callable(choices) else choices)


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


def names(message: str) -> Rule:
  """A list of non-empty strings."""
  return rule(lambda v: isinstance(v, (list, tuple)) and all(
      isinstance(x, str) and x for x in v), message)


_TYPE_NAMES = {int: 'an int', float: 'a number', bool: 'a bool',
               str: 'a string', dict: 'a dict', list: 'a list',
               tuple: 'a list', type(None): 'None'}


def type_error(value: Any, kind: Any) -> str | None:
  """What is wrong with the type of `value` for a field declared `kind`
  (`int`, `str | None`, ...); None when it fits, or when `kind` is not made
  of plain types (a tuple of settings), which is not checked here."""
  kinds = typing.get_args(kind) or (kind,)
  if not set(kinds) <= set(_TYPE_NAMES):
    return None
  flag = isinstance(value, bool)  # an Integral, but no number
  number = isinstance(value, numbers.Real) and not flag
  fits = {int: number and isinstance(value, numbers.Integral), float: number,
          bool: flag}
  if any(fits.get(k, isinstance(value, k)) for k in kinds):
    return None
  names = list(dict.fromkeys(_TYPE_NAMES[k] for k in kinds))
  return (f'must be {", ".join(names[:-1])}{" or " * (len(names) > 1)}'
          f'{names[-1]}, not {type(value).__name__}')


def plain(value: Any, kind: Any) -> Any:
  """A numpy scalar (a 0-d array) as its Python value; an integral float as
  an int where an int fits and a float does not (`total_steps=1e3`)."""
  value = value.item() if getattr(value, 'shape', None) == () else value
  return int(value) if isinstance(value, float) and value.is_integer() and (
      type_error(value, kind) and not type_error(1, kind)) else value


POSITIVE = rule(lambda v: v > 0, 'must be > 0')
NON_NEGATIVE = rule(lambda v: v >= 0, 'must be >= 0')
MIN_TEMPERATURE = 1e-6  # below it logits / T overflow float32 under jit
TEMPERATURE = rule(lambda v: v == 0 or v >= MIN_TEMPERATURE,
                   f'must be 0 or >= {MIN_TEMPERATURE:g}')


def values(section: Any, kind: type | None = None) -> dict[str, Any]:
  """A section's settings by name (not copied deeper); with `kind`, only
  the fields of that class (a base of the section's)."""
  return {f.name: getattr(section, f.name)
          for f in dataclasses.fields(kind or section)}


def fail(key: str, value: Any, message: str) -> None:
  """Raises ConfigError `key=value: message` (`key: message` where the
  value's text is long: a whole list of dataset entries)."""
  shown = repr(value)
  raise ConfigError(f'{key}={shown}: {message}' if len(shown) <= 160
                    else f'{key}: {message}')


# pylint: disable-next=redefined-builtin,redefined-outer-name
def field(default: Any = dataclasses.MISSING, help: str = '',
          check: Rule | None = None, inf: bool = False) -> Any:
  """A setting: its default, its help text (the configuration reference)
  and the rule its value must meet; `inf`: whether infinity is a value (no
  limit), which is refused otherwise. A section class as default nests it."""
  if isinstance(default, type):
    return dataclasses.field(default_factory=default)
  return dataclasses.field(default=default, metadata={
      'help': help, 'check': check, 'inf': inf})


class Section:
  """A frozen dataclass of settings that checks them when made: the rules
  of its fields, then what `_validate` yields; errors name `SECTION.key`.
  A list given for a tuple field is kept as a tuple."""

  SECTION: ClassVar[str] = ''

  def __init_subclass__(cls, name: str = '', **kwargs):
    super().__init_subclass__(**kwargs)
    cls.SECTION = name or cls.SECTION  # a subclass keeps its section's
    dataclasses.dataclass(frozen=True, kw_only=True)(cls)

  def __post_init__(self):
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if isinstance(value, list) and typing.get_origin(f.type) is tuple:
        object.__setattr__(self, f.name, value := tuple(value))
      message = f.metadata.get('check') and f.metadata['check'](value) or (
          value in (math.inf, -math.inf) and not f.metadata.get('inf')
          and 'must be finite')
      if message:
        fail(f'{self.SECTION}.{f.name}'.lstrip('.'), value, message)
    for key, ok, message in self._validate():
      if not ok:
        fail(f'{self.SECTION}.{key}'.lstrip('.'),
             operator.attrgetter(key)(self), message)

  def _validate(self) -> Iterator[tuple[str, Any, str]]:
    """(key, ok, message) of the checks that read several fields, in order."""
    return iter(())
