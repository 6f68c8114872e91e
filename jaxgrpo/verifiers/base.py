"""Verifier protocol, name registry and batch scoring.

A verifier maps (completion text, example) to a reward in [0, 1]. Batches are
scored in one place, `score_batch`, which turns a verifier's exception or an
out-of-range value into reward 0 and counts it, so one bad call never stops a
training run.
"""

from collections.abc import Callable, Sequence
import dataclasses
import logging
import math

import numpy as np

from jaxgrpo.typing import Example

VerifyFn = Callable[[str, Example], float]

_REGISTRY: dict[str, VerifyFn] = {}


def register(name: str) -> Callable[[VerifyFn], VerifyFn]:
  """Registers a verify function under `name` (decorator)."""

  def wrap(fn: VerifyFn) -> VerifyFn:
    if name in _REGISTRY and _REGISTRY[name] is not fn:
      raise ValueError(f'verifier {name!r} is already registered')
    _REGISTRY[name] = fn
    return fn

  return wrap


def get(name: str) -> VerifyFn:
  """The verify function registered as `name`."""
  try:
    return _REGISTRY[name]
  except KeyError:
    raise ValueError(
        f'unknown verifier {name!r}; known: {sorted(_REGISTRY)}'
    ) from None


def names() -> list[str]:
  return sorted(_REGISTRY)


@dataclasses.dataclass
class ScoreStats:
  """Counts of verifier calls that did not return a valid reward."""

  errors: int = 0
  out_of_range: int = 0


_logged_kinds: set[tuple[str, str]] = set()


def _log_once(kind: str, name: str, message: str) -> None:
  if (kind, name) not in _logged_kinds:
    _logged_kinds.add((kind, name))
    logging.warning('%s (logged once per verifier and kind)', message)


def score_batch(
    verify: VerifyFn,
    completions: Sequence[str],
    examples: Sequence[Example],
    *,
    name: str = 'verifier',
) -> tuple[np.ndarray, ScoreStats]:
  """Scores completions against their examples.

  Args:
    verify: the verify function.
    completions: N completion texts.
    examples: the N examples they answer (repeated G times per prompt).
    name: verifier name for log messages.

  Returns:
    rewards [N] float32 in [0, 1] and the error counts.
  """
  if len(completions) != len(examples):
    raise ValueError(
        f'{len(completions)} completions for {len(examples)} examples'
    )
  stats = ScoreStats()
  rewards = np.zeros(len(completions), np.float32)
  for i, (text, example) in enumerate(zip(completions, examples)):
    try:
      value = float(verify(text, example))
    except Exception as e:  # pylint: disable=broad-except
      stats.errors += 1
      _log_once('error', name, f'verifier {name} raised on example {example.id}: {e!r}')
      continue
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
      stats.out_of_range += 1
      _log_once(
          'range', name,
          f'verifier {name} returned {value} for example {example.id}; '
          'rewards must lie in [0, 1], scored 0',
      )
      continue
    rewards[i] = value
  return rewards, stats
