"""Grounded question answering with refusal (SQuAD 2.0 style): 'qa'.

An example is answerable or not. Its acceptable answers are
`meta['answers']` (else `[answer]`); `meta['answerable']` says whether the
context answers the question (else: whether it has an answer that is no
refusal, so a file's record of `format='fields'` marks an unanswerable
question with the answer "unanswerable", or any refusal).
The model's answer is extracted from the completion, then:

- on an unanswerable question it scores 1 only if it is a refusal (e.g.
  "unanswerable", "I don't know"); an empty answer is not a refusal. A
  question whose golds all normalise to nothing ('.', 'the') is
  unanswerable, as the official evaluation scores it; but an `answer`
  without `meta['answers']` that normalises to nothing (a file's 'A', a
  choice letter) raises ValueError: it is a mistake, which the scorer
  counts and logs (scored 0), not an unanswerable question;
- on an answerable question an answer equal to a gold scores 1 (a gold
  may read as a refusal: 'None'); else a refusal scores 0, and any other
  answer the official SQuAD v2 exact match against any gold, or the best
  token F1.

Answers are compared after SQuAD normalisation: lowercase, punctuation
removed, the articles a/an/the dropped, whitespace collapsed. Unlike the
official script, which removes ASCII punctuation only, typographic quotes
and apostrophes go too, so '“Normandy”' is 'Normandy'. Refusals are
matched on the same normalisation with negations in full, so "doesn't",
"doesn’t", "doesnt" and "does not" are alike (as are "can't", "cannot"
and "can not").
"""

import collections
from collections.abc import Sequence
import dataclasses
import functools
import re
import string
from typing import Any

from jaxgrpo.example import Example
from jaxgrpo.verifiers import base

EXTRACT = ('auto', 'tag', 'full')
REFUSAL_MATCH = ('contains', 'exact')
METRICS = ('exact', 'f1')

# Checked against every gold answer of the SQuAD 2.0 dev set: none contains
# one of these as whole words after normalisation.
DEFAULT_REFUSAL_PHRASES = (
    'unanswerable',
    'cannot be answered',
    'can not be answered',
    "can't be answered",
    'cannot answer',
    "can't answer",
    'impossible to answer',
    'no answer',
    'not answerable',
    "i don't know",
    'i do not know',
    'not enough information',
    'insufficient information',
    'no information',
    'not mentioned in the context',
    'not mentioned in the passage',
    'not mentioned in the text',
    'not stated in the context',
    'not stated in the passage',
    'not in the context',
    'not in the passage',
    'not provided in the context',
    'not provided in the passage',
    'the context does not say',
    'the passage does not say',
    'the context does not mention',
    'the passage does not mention',
    'the context does not provide',
    'the passage does not provide',
    'cannot be determined',
    'cannot determine',
    'impossible to determine',
    'not possible to answer',
    'not possible to determine',
    'the text does not say',
    'the text does not mention',
    'the text does not provide',
    'the context does not specify',
    'the passage does not specify',
    'the text does not specify',
    'not specified in',
    'not provided in the text',
    'not stated in the text',
    'not in the text',
    'not mentioned',
    'cannot be found in',
    # What instruct models write as often ("It is not stated.", "This
    # information is not provided.", "I am unable to answer.").
    'is not stated',
    'not provided',
    'not given in',
    'not available in',
    'does not contain the answer',
    'does not answer',
    'unable to answer',
    'never mentions',
    'never mentioned',
    'insufficient context',
    'not enough context',
)
# Refusals when they are the whole answer, not within one ("None of the
# above", "an unknown soldier" answer questions). A gold answer that equals
# one ("none": once in the dev set) still scores: golds are matched first.
DEFAULT_REFUSAL_ANSWERS = (
    'n/a',
    'none',
    'unknown',
    'not given',
    'not known',
    'not specified',
    'not stated',
    'unclear',
)

_TAG_NAME = re.compile(r'[A-Za-z_][\w.-]*\Z')
_ARTICLES = re.compile(r'\b(?:a|an|the)\b')
# 'answer:' or '... answer is' ("The answer is", "My final answer is");
# 'answer isn't' is not a marker.
# 'no answer is given' is a refusal, not a marker.
_MARKER = re.compile(r"(?<!\bno )\banswer\s*(?::|is(?![\w'\u2019]))",
                     re.IGNORECASE)
_MARKER_LEAD = ' \t*_:-"\'`'
# What a marker may point at before the answer: 'The answer is simple:
# France', '... as follows:' or '... below.' and the answer on the next
# line. A closed list, unlike math's any few words: an answer is words too
# ('The answer is Paris: its capital' answers Paris).
_LEAD_IN = re.compile(
    r'(?:(?:quite|very|really|pretty|fairly|rather|actually)\s+)?'
    r'(?:(?:simple|easy|clear|obvious|straightforward|evident|short|this|here)'
    r'(?:\s+(?:to\s+(?:see|find|tell)|enough))?[\s*_]*'
    r'(?::|\u2014|\u2013|\s-\s)'
    r'|(?:as\s+follows|the\s+following|(?:given\s+|shown\s+)?below)'
    r'[\s*_]*(?:[:.!\u2014\u2013]|\s-\s|(?=\n)))', re.IGNORECASE)
# Typographic quotes and apostrophes count as their ASCII forms do.
_QUOTES = '\u2018\u2019\u201c\u201d\u00ab\u00bb\u2039\u203a\u02bc'
_PUNCT = str.maketrans('', '', string.punctuation + _QUOTES)
# Negations once apostrophes are gone: "doesn't" and "doesnt" are "does not".
_CONTRACTION = re.compile(
    r'\b(?:(do|does|did|is|are|was|were|has|have|had|could|would|should)nt'
    r'|(ca)nt|(can)not|(wo)nt)\b')
_LONG_FORM = {'ca': 'can', 'wo': 'will'}


def normalize_answer(text: str) -> str:
  """The official SQuAD normalisation: lowercase, no punctuation or articles.

  Typographic quotes and apostrophes ('\u201cNormandy\u201d') are punctuation
  too, as their ASCII forms are in the official script.
  """
  text = text.lower().translate(_PUNCT)
  return ' '.join(_ARTICLES.sub(' ', text).split())


def _normalize_refusal(text: str) -> str:
  text = _CONTRACTION.sub(_long_form, text.lower().translate(_PUNCT))
  return ' '.join(_ARTICLES.sub(' ', text).split())


def _long_form(m: re.Match[str]) -> str:
  verb = next(g for g in m.groups() if g)
  return f'{_LONG_FORM.get(verb, verb)} not'


def exact_score(prediction: str, gold: str) -> float:
  """SQuAD v2 exact match: 1.0 when the normalised texts are equal."""
  return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str) -> float:
  """SQuAD v2 token F1 between the normalised texts.

  When either side has no tokens the score is 1.0 if both have none, else 0.
  """
  return _f1(normalize_answer(prediction).split(),
             normalize_answer(gold).split())


def _f1(pred_toks: list[str], gold_toks: list[str]) -> float:
  if not pred_toks or not gold_toks:
    return float(pred_toks == gold_toks)
  common = collections.Counter(pred_toks) & collections.Counter(gold_toks)
  num_same = sum(common.values())
  if not num_same:
    return 0.0
  precision = num_same / len(pred_toks)
  recall = num_same / len(gold_toks)
  return 2 * precision * recall / (precision + recall)


# Golds repeat across the G samples of a prompt and across epochs.
_normalized_gold = functools.lru_cache(maxsize=1 << 14)(normalize_answer)


def golds_of(example: Example) -> list[str]:
  """The acceptable answers: `meta['answers']`, else `[example.answer]`.

  As in the official SQuAD v2 evaluation, answers that normalise to nothing
  (e.g. '.') are dropped.
  """
  answers = example.meta.get('answers')
  if answers is None:
    answers = [example.answer]
  return [a for a in answers if _normalized_gold(a)]


@functools.lru_cache(maxsize=64)
def _tag_patterns(tag: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
  return (re.compile(f'<{re.escape(tag)}>', re.IGNORECASE),
          re.compile(f'</{re.escape(tag)}>', re.IGNORECASE))


def _last(pattern: re.Pattern[str], text: str, end: int) -> re.Match | None:
  """The last match of `pattern` in `text[:end]`, in one linear scan."""
  found = None
  for found in pattern.finditer(text, 0, end):
    pass
  return found


def last_tag_content(text: str, tag: str) -> str | None:
  """Content of the last `<tag>...</tag>` (tag names ignore case), or None."""
  opening, closing = _tag_patterns(tag)
  close = _last(closing, text, len(text))
  if close is None:
    return None
  start = _last(opening, text, close.start())
  if start is None:
    return None
  return text[start.end():close.start()].strip()


def _first_line(text: str) -> str:
  for line in text.splitlines():
    if line.strip():
      return line.strip()
  return ''


def _after_marker(text: str) -> str | None:
  """The first non-empty line after the last marker; after a lead-in
  (`_LEAD_IN`), the first after that, when there is one."""
  last = _last(_MARKER, text, len(text))
  if last is None:
    return None
  rest = text[last.end():].lstrip(_MARKER_LEAD)
  lead = _LEAD_IN.match(rest)
  answer = _first_line(rest[lead.end():]) if lead else ''
  return answer or _first_line(rest)


def _is_tag_name(tag: Any) -> bool:
  return isinstance(tag, str) and _TAG_NAME.match(tag) is not None


@base.register('qa')
@dataclasses.dataclass(frozen=True)
class GroundedQA:
  """Scores an answer to a possibly unanswerable question (module docstring).

  Attributes:
    extract: how the answer is taken from the completion. 'tag': the content
      of the last `<tag>...</tag>` (no tag scores 0); 'full': the whole
      completion; 'auto': the tag if present, else the first non-empty
      line after the last "answer:" / "answer is" (as in "The answer is"),
      or after the lead-in it starts with ("The answer is simple: France",
      "... as follows:" and the answer on the next line), else the first
      non-empty line.
    tag: the answer tag's name.
    refusal_phrases: phrases that make an answer a refusal.
    refusal_match: 'contains': the normalised answer contains a normalised
      phrase as whole words; 'exact': it equals one.
    refusal_answers: answers that are refusals when they are the whole
      answer ('N/A', 'None', 'Unknown'), whatever `refusal_match`.
    metric: 'exact' (SQuAD exact match) or 'f1' (SQuAD token F1) for
      answerable questions; both take the best gold.
  """

  extract: str = 'auto'
  tag: str = 'answer'
  refusal_phrases: Sequence[str] = DEFAULT_REFUSAL_PHRASES
  refusal_match: str = 'contains'
  metric: str = 'exact'
  refusal_answers: Sequence[str] = DEFAULT_REFUSAL_ANSWERS
  # Normalised phrases, as a set and each padded with spaces (whole words).
  _refusals: frozenset[str] = dataclasses.field(
      init=False, repr=False, compare=False, default=frozenset())
  _whole: frozenset[str] = dataclasses.field(
      init=False, repr=False, compare=False, default=frozenset())
  _padded: tuple[str, ...] = dataclasses.field(
      init=False, repr=False, compare=False, default=())

  def __post_init__(self):
    if self.extract not in EXTRACT:
      raise ValueError(f'extract={self.extract!r}: must be one of {EXTRACT}')
    if not _is_tag_name(self.tag):
      raise ValueError(f'tag={self.tag!r}: must be a tag name such as '
                       "'answer' (a letter or _, then letters, digits, _.-)")
    if self.refusal_match not in REFUSAL_MATCH:
      raise ValueError(f'refusal_match={self.refusal_match!r}: must be one '
                       f'of {REFUSAL_MATCH}')
    if self.metric not in METRICS:
      raise ValueError(f'metric={self.metric!r}: must be one of {METRICS}')
    normalized = self._phrases('refusal_phrases')
    object.__setattr__(self, '_whole',
                       self._phrases('refusal_answers', allow_empty=True))
    object.__setattr__(self, '_refusals', normalized)
    object.__setattr__(self, '_padded',
                       tuple(sorted(f' {p} ' for p in normalized)))

  def _phrases(self, key: str, allow_empty: bool = False) -> frozenset[str]:
    """The normalised phrases of option `key`, which it stores as a tuple."""
    phrases = getattr(self, key)
    if (isinstance(phrases, str) or not isinstance(phrases, Sequence)
        or not (phrases or allow_empty)):
      raise ValueError(f'{key}={phrases!r}: must be a list of strings')
    normalized = set()
    for phrase in phrases:
      norm = _normalize_refusal(phrase) if isinstance(phrase, str) else ''
      if not norm:
        raise ValueError(f'{key}: {phrase!r} is not a phrase with words '
                         '(after dropping punctuation and articles)')
      normalized.add(norm)
    object.__setattr__(self, key, tuple(phrases))
    return frozenset(normalized)

  def extract_answer(self, completion: str) -> str | None:
    """The model's answer, or None when `extract='tag'` finds no tag."""
    if self.extract == 'full':
      return completion.strip()
    content = last_tag_content(completion, self.tag)
    if content is not None or self.extract == 'tag':
      return content
    after = _after_marker(completion)
    return after if after is not None else _first_line(completion)

  def is_refusal(self, answer: str) -> bool:
    """Whether `answer` declines to answer (see `refusal_match`)."""
    norm = _normalize_refusal(answer)
    if not norm:
      return False
    if norm in self._whole:
      return True
    if self.refusal_match == 'exact':
      return norm in self._refusals
    padded = f' {norm} '
    return any(phrase in padded for phrase in self._padded)

  def __call__(self, completion: str, example: Example) -> base.Verdict:
    answer = self.extract_answer(completion)
    if answer is None:
      return base.Verdict(0.0, {'failed': f'no {self.tag} tag'})
    golds = golds_of(example)
    if not golds and 'answers' not in example.meta and example.answer.strip():
      # A file's answer 'A' (a choice letter), 'The' or '.': an error that
      # is counted and logged, not an unanswerable question (a refusal
      # scored 1 and the answer itself 0).
      raise ValueError(
          f'gold {example.answer!r:.20} normalises to nothing (SQuAD drops '
          'punctuation, a, an, the): no answer can match it; use exact_match')
    answerable = example.meta.get('answerable')
    if answerable is None:
      answerable = not all(map(self.is_refusal, golds))  # False if none
    # No gold left that can score ('.' normalises to nothing): unanswerable,
    # as the official evaluation scores it.
    answerable = bool(answerable) and bool(golds)
    refused = self.is_refusal(answer)
    pred = normalize_answer(answer)
    if answerable and any(pred == _normalized_gold(g) for g in golds):
      reward = 1.0  # a gold that reads as a refusal ('none') still scores
    elif not answerable or refused:
      reward = float(refused and not answerable)
    elif self.metric == 'exact':
      reward = 0.0
    else:
      toks = pred.split()
      reward = max((_f1(toks, _normalized_gold(g).split()) for g in golds),
                   default=0.0)
    return base.Verdict(
        reward,
        {'extracted': answer, 'refused': refused, 'answerable': answerable})
