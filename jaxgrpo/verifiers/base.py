"""Verifier protocol, name registry, combination and inline batch scoring.

A verifier maps (completion text, example) to a reward in [0, 1]: a real
number or bool (True is 1.0; a string such as '0.7' is invalid), or a
`Verdict` that adds details (what was extracted, which check failed).
Verifiers are registered by name; a registered class is built with its
options as keyword arguments (its constructor checks them), a registered
function takes none. Config entries name them:

    verifier='math'
    verifier={'name': 'math', 'fallback': 'none'}
    verifier=[{'name': 'math', 'weight': 0.9}, {'name': 'format', 'weight': 0.1}]

Built verifiers must pickle (worker processes receive them), so classes are
plain dataclasses and functions live at module level.

Scoring turns a verifier's exception (SystemExit included) or an invalid or
out-of-range result into reward 0 and counts it, so one bad call never stops
a training run; what a call prints to stdout goes to stderr, counted.
`score_batch` scores in the calling process;
`jaxgrpo.verifiers.pool.Scorer` adds worker processes and per-call timeouts
on top of it.

Size: the registry, the combination and the scoring share `Verdict` and
its checks, and user code finds them in one place (`base.register`,
`base.Verdict`, docs/data.md).
"""

from collections.abc import Callable, Mapping, Sequence
import dataclasses
import logging
import math
import numbers
import reprlib
import signal
import sys
import threading
from typing import Any, NamedTuple, Protocol

import numpy as np

from jaxgrpo.example import Example

_LOG = logging.getLogger(__name__)  # `jaxgrpo.*`: the CLIs show them


@dataclasses.dataclass(frozen=True)
class Verdict:
  """A reward with details, e.g. {'extracted': '18'} or {'failed': 'tags'}."""

  reward: float
  details: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class Verifier(Protocol):

  def __call__(self, completion: str, example: Example) -> float | Verdict:
    ...


VerifyFn = Callable[[str, Example], 'float | Verdict']

_REGISTRY: dict[str, Any] = {}


def register(name: str) -> Callable[[Any], Any]:
  """Registers a verifier class or function under `name` (decorator).

  A class is built with the config's options as keyword arguments and must
  raise ValueError on a bad one; a function takes no options. Registering
  the name again from the module that registered it (a notebook cell run
  again, a module reloaded, the function renamed or not) replaces it.
  """

  def wrap(obj):
    if name in _REGISTRY and not same_definition(_REGISTRY[name], obj):
      raise ValueError(f'verifier {name!r} is already registered')
    _REGISTRY[name] = obj
    return obj

  return wrap


def same_definition(old: Any, new: Any) -> bool:
  """Whether `new` is `old` or defines it again: from the same module (a
  notebook cell run again, a module reloaded, the function renamed or
  not)."""
  module = getattr(old, '__module__', None)
  return old is new or (module is not None
                        and module == getattr(new, '__module__', None))


def names() -> list[str]:
  return sorted(_REGISTRY)


def build(name: str, **options: Any) -> Verifier:
  """The verifier registered as `name`, built with `options`.

  Raises:
    ValueError: unknown name, or options the verifier does not take or
      rejects; the message names them.
  """
  try:
    obj = _REGISTRY[name]
  except KeyError:
    raise ValueError(
        f'unknown verifier {name!r}; known: {names()}') from None
  if not isinstance(obj, type):
    if options:
      raise ValueError(
          f'verifier {name!r} takes no options, got {sorted(options)}')
    return obj
  if dataclasses.is_dataclass(obj):
    known = {f.name for f in dataclasses.fields(obj) if f.init}
    unknown = sorted(set(options) - known)
    if unknown:
      raise ValueError(
          f'verifier {name!r} has no option {", ".join(unknown)}; its '
          f'options: {", ".join(sorted(known)) or "none"}')
  try:
    return obj(**options)
  except TypeError as e:
    raise ValueError(f'verifier {name!r}: {e}') from None


def get(name: str) -> Verifier:
  """The verifier registered as `name` with default options."""
  return build(name)


COMBINE = ('mean', 'product')


@dataclasses.dataclass(frozen=True)
class Combined:
  """Several verifiers as one reward.

  'mean' is the weighted mean of the parts' rewards (weights need not sum to
  1); 'product' multiplies them, so any part scoring 0 (e.g. a format check)
  gates the rest. The details hold each part's reward by name.
  """

  parts: tuple[tuple[str, float, Any], ...]  # (name, weight, verifier)
  combine: str = 'mean'

  def __call__(self, completion: str, example: Example) -> Verdict:
    rewards, details = [], {}
    for name, _, verify in self.parts:
      value = verify(completion, example)
      try:
        reward = as_reward(value)
      except (ArithmeticError, TypeError, ValueError) as e:
        raise ValueError(
            f'part {name!r} returned {_short.repr(value)}: {e}') from None
      rewards.append(reward)
      details[name] = reward
    if self.combine == 'product':
      total = float(np.prod(rewards))
    else:
      weights = [w for _, w, _ in self.parts]
      total = sum(w * r for w, r in zip(weights, rewards)) / sum(weights)
    return Verdict(total, details)


def from_config(value: Any, key: str = 'verifier') -> Verifier:
  """Builds a verifier from a config value (see the module docstring).

  Args:
    value: a name, a dict with 'name' and options, or a list of those (each
      with an optional 'weight', default 1), or a dict
      {'combine': 'mean'|'product', 'parts': [...]}.
    key: the config key, for error messages.

  Raises:
    ValueError: naming `key` (and the part) and what is wrong.
  """
  if hasattr(value, 'to_dict'):  # ml_collections.ConfigDict
    value = value.to_dict()
  value = _plain(value)
  if isinstance(value, str):
    try:
      return build(value)
    except ValueError as e:
      raise ValueError(f'{key}={value!r}: {e}') from None
  if isinstance(value, Mapping) and 'parts' in value:
    extra = sorted(set(value) - {'parts', 'combine'})
    if extra:
      raise ValueError(f'{key}: unknown keys {extra} (a combination takes '
                       "'parts' and 'combine')")
    combine = value.get('combine', 'mean')
    if combine not in COMBINE:
      raise ValueError(f'{key}.combine={combine!r}: must be one of {COMBINE}')
    return _combine(value['parts'], combine, f'{key}.parts')
  if isinstance(value, Mapping):
    if 'weight' in value:
      raise ValueError(f"{key}: 'weight' only applies to a part of a list")
    return _one(value, key)
  if isinstance(value, (list, tuple)):
    return _combine(value, 'mean', key)
  raise ValueError(
      f'{key}={value!r}: expected a verifier name, a dict with a name and '
      'options, or a list of them')


def _plain(value: Any) -> Any:
  """`value` with each numpy scalar (a 0-d array too), in dicts and lists
  at any depth, as its Python value, as the config's other keys take them
  (`np.float32(0.9)` as a weight)."""
  if getattr(value, 'shape', None) == () and hasattr(value, 'item'):
    return value.item()
  if isinstance(value, Mapping):
    return {k: _plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return type(value)(_plain(v) for v in value)
  return value


def _one(value: Mapping[str, Any], key: str) -> Verifier:
  options = dict(value)
  name = options.pop('name', None)
  if not isinstance(name, str):
    raise ValueError(f"{key}: needs a 'name' (one of {names()})")
  try:
    return build(name, **options)
  except ValueError as e:
    raise ValueError(f'{key}: {e}') from None


def _combine(parts: Any, combine: str, key: str) -> Verifier:
  if not isinstance(parts, (list, tuple)) or not parts:
    raise ValueError(f'{key}: expected a non-empty list of verifiers')
  built = []
  for i, part in enumerate(parts):
    where = f'{key}[{i}]'
    if hasattr(part, 'to_dict'):
      part = part.to_dict()
    if isinstance(part, str):
      part = {'name': part}
    if not isinstance(part, Mapping):
      raise ValueError(f'{where}={part!r}: expected a name or a dict')
    part = dict(part)
    if combine == 'product' and 'weight' in part:
      raise ValueError(
          f"{where}.weight={part['weight']!r}: a product takes no weights "
          "(it multiplies the parts' rewards); drop it, or combine='mean'")
    weight = part.pop('weight', 1.0)
    if (isinstance(weight, bool) or not isinstance(weight, (int, float))
        or not 0 <= weight < math.inf):
      raise ValueError(
          f'{where}.weight={weight!r}: must be a finite number >= 0')
    built.append((part.get('name'), float(weight), _one(part, where)))
  if combine == 'mean' and not 0 < sum(w for _, w, _ in built) < math.inf:
    raise ValueError(f'{key}: weights must have a positive, finite sum')
  names_ = [n for n, _, _ in built]
  if len(set(names_)) != len(names_):  # details are keyed by name
    built = [(f'{n}[{i}]', w, v) for i, (n, w, v) in enumerate(built)]
  return Combined(tuple(built), combine)


@dataclasses.dataclass
class ScoreStats:
  """Counts of verifier calls that did not return a valid reward, of calls
  that printed to stdout, and of worker processes replaced as their memory
  or open files grew (`pool.Scorer`)."""

  errors: int = 0
  out_of_range: int = 0
  timeouts: int = 0
  printed: int = 0
  workers_replaced: int = 0

  def add(self, other: 'ScoreStats') -> None:
    self.errors += other.errors
    self.out_of_range += other.out_of_range
    self.timeouts += other.timeouts
    self.printed += other.printed
    self.workers_replaced += other.workers_replaced


_logged_kinds: set[tuple[str, str]] = set()


def log_once(kind: str, name: str, message: str) -> None:
  """Logs `message` the first time (kind, name) is seen since the last
  `forget_logged` (each `pool.Scorer`, so each run, starts afresh)."""
  if (kind, name) not in _logged_kinds:
    _logged_kinds.add((kind, name))
    _LOG.warning('%s (logged once per verifier and kind)', message)


def forget_logged() -> None:
  """Lets `log_once` log each message again (a new run in this process)."""
  _logged_kinds.clear()


class VerifierTimeout(BaseException):
  """A verifier call ran past its time limit.

  A BaseException, so that verifier code (or a library it calls) catching
  Exception cannot swallow it and turn a timeout into a normal result.
  """


class Outcome(NamedTuple):
  """One scored completion: reward, how it went, the verdict details, and
  how many characters the call printed to stdout (sent to stderr)."""

  reward: float
  kind: str  # 'ok', 'error', 'range' or 'timeout'
  message: str = ''
  details: Mapping[str, Any] = {}
  printed: int = 0


# Whether the current call's timer has fired: a verifier that catches
# everything (a bare `except:`) may swallow VerifierTimeout and return.
_alarm_fired = False
# Whether a call is running under the timer. The handler raises only then,
# and at most once per call: a timer that expires as the call returns, or
# whose signal is handled after it returned, is ignored instead of raising
# where nothing catches it (`_timed_call`).
_armed = False


def _on_alarm(signum, frame):
  global _alarm_fired, _armed
  del signum, frame
  if not _armed:
    return
  _armed = False
  _alarm_fired = True
  raise VerifierTimeout()


_alarm_kept = False

# What a verifier may raise, as an error. Not KeyboardInterrupt, a real Ctrl-C
# in the trainer, except in workers (which ignore SIGINT): `enter_worker`.
_caught: tuple[type[BaseException], ...] = (
    Exception, SystemExit, GeneratorExit)


def enter_worker() -> None:
  """Sets up a worker process: the timeout handler stays installed, and any
  exception a verifier raises, KeyboardInterrupt included, is an error."""
  global _alarm_kept, _caught
  signal.signal(signal.SIGALRM, _on_alarm)
  _alarm_kept = True
  _caught = (BaseException,)


def as_reward(value: Any) -> float:
  """A verifier's result (or its Verdict's) as a reward.

  Raises:
    TypeError: not a real number, bool or one-element numeric array (e.g. a
      string). float() may raise others (OverflowError for a huge int).
    ValueError: not in [0, 1] (NaN included).
  """
  if isinstance(value, Verdict):
    value = value.reward
  if isinstance(value, (numbers.Real, np.bool_)):
    reward = float(value)
  elif (hasattr(value, '__array__') and np.size(value) == 1
        and np.asarray(value).dtype.kind in 'biuf'):
    reward = float(np.asarray(value).reshape(()))
  else:
    raise TypeError(f'a {type(value).__name__} is not a number')
  if not 0.0 <= reward <= 1.0:
    raise ValueError('rewards must lie in [0, 1]')
  return reward + 0.0  # -0.0 (a penalty of 0 negated) is 0.0


_short = reprlib.Repr()  # for messages: long values are cut short
_short.maxstring, _short.maxother = 80, 200
short_repr = _short.repr


def score_one(
    verify: VerifyFn, text: str, example: Example, timeout_s: float | None,
) -> Outcome:
  """Calls `verify` once, turning every failure into reward 0 and a kind.

  With `timeout_s` on the main thread, a SIGALRM timer interrupts Python
  code that runs too long (a call stuck in C code is not interrupted; the
  worker pool's parent process kills such a worker).

  Any exception from the call is an 'error', SystemExit included, but a
  KeyboardInterrupt outside a worker is a real Ctrl-C of the trainer
  (verify.workers=0) and propagates. A result that `as_reward` rejects is
  'range'. A call whose timer fired is a 'timeout' whatever it returns or
  raises (a bare `except:` in the verifier may have caught the timer).

  What the call prints to `sys.stdout` goes to stderr, counted in
  `Outcome.printed`: stdout holds the program's own lines (`jaxgrpo-eval`'s
  table, the step lines), also when they are kept in a file or read by
  another program.
  """
  printed = _Printed()
  try:
    outcome = _score_one(verify, text, example, timeout_s)
  finally:
    printed.remove()
  return outcome._replace(printed=printed.chars) if printed.chars else outcome


class _Printed:
  """`sys.stdout` during a verifier call: what the calling thread writes
  goes to stderr and is counted; other threads' writes (the trainer's
  lines, while a thread scores) go where stdout went."""

  def __init__(self):
    self.previous = sys.stdout
    self.thread = threading.get_ident()
    self.chars = 0
    sys.stdout = self

  def remove(self) -> None:
    if sys.stdout is self:
      sys.stdout = self.previous

  def _target(self) -> Any:
    if threading.get_ident() == self.thread:
      return sys.stderr
    return self.previous

  def write(self, text: str) -> int:
    target = self._target()
    if target is sys.stderr:
      self.chars += len(text)
    return len(text) if target is None else target.write(text)

  def flush(self) -> None:
    if self._target() is not None:
      self._target().flush()

  def __getattr__(self, name: str) -> Any:
    return getattr(self._target(), name)  # fileno, isatty, buffer, ...


def _score_one(
    verify: VerifyFn, text: str, example: Example, timeout_s: float | None,
) -> Outcome:
  """`score_one`, but for what the call prints."""
  use_alarm = (timeout_s is not None and timeout_s > 0
               and threading.current_thread() is threading.main_thread())
  if use_alarm:
    value, error = _timed_call(verify, text, example, timeout_s)
  else:
    try:
      value, error = verify(text, example), None
    except _caught as e:
      value, error = None, e
  if error is not None and not isinstance(error, _caught + (VerifierTimeout,)):
    raise error  # a real Ctrl-C of the trainer (verify.workers=0)
  if use_alarm and _alarm_fired:
    if isinstance(error, VerifierTimeout):
      return Outcome(0.0, 'timeout', f'took longer than {timeout_s} s')
    return _swallowed(timeout_s)
  if error is not None:
    return Outcome(0.0, 'error', _short.repr(error))
  details = value.details if isinstance(value, Verdict) else {}
  try:
    return Outcome(as_reward(value), 'ok', '', details)
  except _caught as e:
    return Outcome(0.0, 'range', f'returned {_short.repr(value)} '
                   f'({type(e).__name__}: {e})')


def _timed_call(
    verify: VerifyFn, text: str, example: Example, timeout_s: float,
) -> tuple[Any, BaseException | None]:
  """Calls `verify` under a SIGALRM timer: (its result, None) or (None, what
  it raised), with `_alarm_fired` telling whether the timer fired.

  The timer may expire at any instruction, also just as the call returns
  and before it is disarmed. It is armed inside the `try` and `_armed` is
  cleared in the inner `finally`: until then the handler's VerifierTimeout
  lands in the outer `except`, and after it the handler ignores the signal.
  So a timeout never escapes, which in a worker would cost a worker restart
  and with verify.workers=0 end the training run.
  """
  global _alarm_fired, _armed
  previous = None if _alarm_kept else signal.signal(signal.SIGALRM, _on_alarm)
  _alarm_fired = False
  try:
    try:
      _armed = True
      signal.setitimer(signal.ITIMER_REAL, timeout_s)
      return verify(text, example), None
    finally:
      _armed = False
  except BaseException as e:  # pylint: disable=broad-except  # sorted by score_one
    return None, e
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    if previous is not None:  # None: set outside Python, cannot be put back
      signal.signal(signal.SIGALRM, previous)


def _swallowed(timeout_s: float) -> Outcome:
  return Outcome(0.0, 'timeout', f'took longer than {timeout_s} s (the '
                 'verifier caught the timer and went on; its result is void)')


def tally(
    outcomes: Sequence[Outcome], examples: Sequence[Example], name: str,
) -> tuple[np.ndarray, ScoreStats]:
  """Rewards and failure counts of scored completions (and the calls that
  printed), logging each kind once."""
  stats = ScoreStats()
  rewards = np.zeros(len(outcomes), np.float32)
  for i, (out, example) in enumerate(zip(outcomes, examples)):
    rewards[i] = out.reward
    if out.printed:
      stats.printed += 1
      log_once('printed', name,
               f'verifier {name} printed {out.printed} characters to stdout '
               f'on example {example.id} (dataset {example.dataset}): they '
               "went to stderr, so that stdout holds only the program's own "
               'lines')
    if out.kind == 'ok':
      continue
    if out.kind == 'error':
      stats.errors += 1
      what = 'raised'
    elif out.kind == 'range':
      stats.out_of_range += 1
      what = 'gave an invalid reward'
    else:
      stats.timeouts += 1
      what = 'timed out'
    log_once(out.kind, name,
             f'verifier {name} {what} on example {example.id} (dataset '
             f'{example.dataset}): {out.message}; scored 0')
  return rewards, stats


def score_batch(
    verify: VerifyFn,
    completions: Sequence[str],
    examples: Sequence[Example],
    *,
    name: str = 'verifier',
    timeout_s: float | None = None,
) -> tuple[np.ndarray, ScoreStats]:
  """Scores completions against their examples in this process.

  Args:
    verify: the verifier.
    completions: N completion texts.
    examples: the N examples they answer (repeated G times per prompt).
    name: verifier name for log messages.
    timeout_s: per-call limit (see `score_one`); None: no limit.

  Returns:
    rewards [N] float32 in [0, 1] and the failure counts.
  """
  if len(completions) != len(examples):
    raise ValueError(
        f'{len(completions)} completions for {len(examples)} examples'
    )
  outcomes = [score_one(verify, text, example, timeout_s)
              for text, example in zip(completions, examples)]
  return tally(outcomes, examples, name)
