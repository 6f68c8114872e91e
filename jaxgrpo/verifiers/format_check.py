"""Structure and length checks on a completion: 'format'.

Usable alone or as a part of a combination, e.g. a small weight next to a
correctness verifier, or a gate with `combine='product'`:

    verifier=[{'name': 'qa', 'weight': 0.9},
              {'name': 'format', 'preset': 'think_answer', 'weight': 0.1}]

Each configured option adds one or more named checks; the reward is 1 when
all pass (or the fraction passed, with `partial=True`). One with no check
configured is refused: it would score every completion 1.
"""

from collections.abc import Sequence
import dataclasses
import re
from typing import Any

from jaxgrpo.example import Example
from jaxgrpo.verifiers import base

PRESETS = {
    'think_answer': ('think', 'answer'),
    'answer_tag': ('answer',),
}

_TAG_NAME = re.compile(r'[A-Za-z_][\w.-]*\Z')


def find_tags(
    text: str, tags: Sequence[str],
) -> tuple[list[str], list[tuple[int, int]]]:
  """Finds each tag's `<t>...</t>` pair, in order and non-overlapping.

  Tags are searched left to right: each pair must start after the previous
  found pair ends, and its content must not open the same tag again. Tag
  names are case-sensitive.

  Args:
    text: the completion.
    tags: tag names, in the order they must appear.

  Returns:
    The names of the tags not found, and the (start, end) spans of the
    pairs found, in order.
  """
  missing, spans = [], []
  pos = 0
  for tag in tags:
    opening, closing = f'<{tag}>', f'</{tag}>'
    start = text.find(opening, pos)
    close = -1 if start < 0 else text.find(closing, start + len(opening))
    if close < 0 or text.find(opening, start + len(opening), close) >= 0:
      missing.append(tag)
      continue
    pos = close + len(closing)
    spans.append((start, pos))
  return missing, spans


def _outside_is_blank(text: str, spans: Sequence[tuple[int, int]]) -> bool:
  pos = 0
  for start, end in spans:
    if text[pos:start].strip():
      return False
    pos = end
  return not text[pos:].strip()


def _check_limit(name: str, value: Any, optional: bool) -> None:
  if optional and value is None:
    return
  if isinstance(value, bool) or not isinstance(value, int) or value < 0:
    allowed = 'None or an int >= 0' if optional else 'an int >= 0'
    raise ValueError(f'{name}={value!r}: must be {allowed}')


@base.register('format')
@dataclasses.dataclass(frozen=True)
class FormatCheck:
  """Checks tags, layout, length and a pattern (module docstring).

  Attributes:
    tags: tag names that must each appear as a `<t>...</t>` pair, in this
      order and non-overlapping; one check per tag, named 'tag:<t>'.
    preset: fills `tags`: 'think_answer' = ('think', 'answer'), 'answer_tag'
      = ('answer',).
    strict: check 'strict': nothing but whitespace outside the tag pairs.
    min_chars: check 'min_chars': at least this many characters.
    max_chars: check 'max_chars': at most this many characters.
    max_words: check 'max_words': at most this many whitespace-separated
      words.
    regex: check 'regex': this pattern is found somewhere in the completion
      (`re.search`; the pattern should avoid catastrophic backtracking).
    partial: reward = fraction of checks passed, instead of 1 only when all
      pass.
  Lengths are measured on the completion with surrounding whitespace
  stripped. Details: {'failed': [names of the failed checks]}.
  """

  tags: Sequence[str] = ()
  preset: str | None = None
  strict: bool = False
  min_chars: int = 0
  max_chars: int | None = None
  max_words: int | None = None
  regex: str | None = None
  partial: bool = False
  _pattern: re.Pattern[str] | None = dataclasses.field(
      init=False, repr=False, compare=False, default=None)

  def __post_init__(self):
    tags = self.tags
    if isinstance(tags, str) or not isinstance(tags, Sequence):
      raise ValueError(f'tags={tags!r}: must be a list of tag names')
    for tag in tags:
      if not isinstance(tag, str) or not _TAG_NAME.match(tag):
        raise ValueError(f'tags: {tag!r} is not a tag name (a letter or _, '
                         'then letters, digits, _.-)')
    if self.preset is not None:
      if self.preset not in PRESETS:
        raise ValueError(f'preset={self.preset!r}: must be None or one of '
                         f'{sorted(PRESETS)}')
      if tags:
        raise ValueError(f'tags={tags!r} and preset={self.preset!r}: give '
                         'one of them')
      tags = PRESETS[self.preset]
    object.__setattr__(self, 'tags', tuple(tags))
    for name in ('strict', 'partial'):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f'{name}={getattr(self, name)!r}: must be a bool')
    if self.strict and not self.tags:
      raise ValueError('strict=True needs tags (or a preset): it checks the '
                       'text outside them')
    _check_limit('min_chars', self.min_chars, optional=False)
    _check_limit('max_chars', self.max_chars, optional=True)
    _check_limit('max_words', self.max_words, optional=True)
    if self.max_chars is not None and self.max_chars < self.min_chars:
      raise ValueError(f'max_chars={self.max_chars} is below '
                       f'min_chars={self.min_chars}')
    if self.regex is not None:
      if not isinstance(self.regex, str):
        raise ValueError(f'regex={self.regex!r}: must be a string or None')
      try:
        pattern = re.compile(self.regex)
      except re.error as e:
        raise ValueError(f'regex={self.regex!r}: not a valid pattern: '
                         f'{e}') from None
      object.__setattr__(self, '_pattern', pattern)
    if not (self.tags or self.min_chars or self.max_chars is not None
            or self.max_words is not None or self.regex is not None):
      raise ValueError(
          'no check configured: every completion would score 1; give tags, '
          'preset, regex, min_chars, max_chars or max_words')

  def failed_checks(self, completion: str) -> tuple[list[str], int]:
    """The names of the failed checks, and the number of checks."""
    missing, spans = find_tags(completion, self.tags)
    failed = [f'tag:{t}' for t in missing]
    n = len(self.tags)
    if self.strict:
      n += 1
      if not _outside_is_blank(completion, spans):
        failed.append('strict')
    text = completion.strip()
    if self.min_chars:
      n += 1
      if len(text) < self.min_chars:
        failed.append('min_chars')
    if self.max_chars is not None:
      n += 1
      if len(text) > self.max_chars:
        failed.append('max_chars')
    if self.max_words is not None:
      n += 1
      if len(text.split()) > self.max_words:
        failed.append('max_words')
    if self._pattern is not None:
      n += 1
      if not self._pattern.search(completion):
        failed.append('regex')
    return failed, n

  def __call__(self, completion: str, example: Example) -> base.Verdict:
    del example  # the format does not depend on the question
    failed, n = self.failed_checks(completion)
    if self.partial:
      reward = (n - len(failed)) / n
    else:
      reward = float(not failed)
    return base.Verdict(reward, {'failed': failed})
