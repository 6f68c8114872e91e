"""Math final-answer verifier: extracts a completion's answer, checks it.

Size: the extraction rules, the number grammar and the reading of a marked
answer that is no bare number are one reading of a completion, tuned
against each other on one table (tests/verifiers/test_gsm8k_corpus.py).
"""

from collections.abc import Callable, Sequence
import dataclasses
import decimal
import functools
import importlib
import math
import re
from typing import Any

from jaxgrpo.example import Example
from jaxgrpo.verifiers import base

# Extraction rules, tried in the order of the `extract` option.
RULES = ('hashes', 'boxed', 'answer_tag', 'answer_is')
FALLBACKS = ('last_number', 'none')

# Longest normalised answer handed to sympy; a longer one is no final answer.
_SYMBOLIC_MAX_CHARS = 500
# A word of two letters or more, not a LaTeX command: prose, which math_verify
# would search for an expression of its own ('19 because 9 + 9 = 18' is 18).
_PROSE_RE = re.compile(r'(?<![\\A-Za-z])[A-Za-z]{2,}')
# A number too large for sympy to compute within a verifier's time limit
# ('9^{9^{9}}' has 369 million digits, and Python's integer power cannot be
# interrupted): a numeric exponent or factorial operand that holds a power
# or a factorial, or more digits than this.
_OPERAND_DIGITS = 5
_COMMAND_RE = re.compile(r'\\[A-Za-z]+')

# Every pattern below runs in time linear in its input: no nested or adjacent
# quantifiers over the same characters, so 10 KB of adversarial text is safe.
_HASHES_RE = re.compile(r'#{4,}([^\n]*)')
# '#### 2. Total', '#### 2) Total', '#### 2: Total', '#### 2 - Total',
# '#### (2) Total'.
_NUMBERED_HEADING_RE = re.compile(
    r'\(?\d+(?:[.)]\s+|:\s*|\s+[-\u2013\u2014]\s+)[^\W\d_]')
# '#### 2 Money' with more text after it: a heading too ('#### 18 Dollars'
# as the last line is an answer).
_TITLE_HEADING_RE = re.compile(r'\d+\s+[A-Z][a-z]')
_BOXED_RE = re.compile(r'\\(?:boxed|fbox)(?![A-Za-z])\s*')
_BOXED_TOKEN_RE = re.compile(r'[^\s{}$\\]+')
_BRACE_RE = re.compile(r'\\[\\{}]|[{}]')  # escaped braces do not group
_TAG_RE = re.compile(r'<(/?)answer\s*>', re.I)
_ANSWER_IS_RE = re.compile(  # not "the answer isn't"
    r"\banswer(?:\s+is\b(?!['\u2019])|[*_]*\s*:)\s*:?\s*", re.I)
_SEGMENT_END_RE = re.compile(r'\n|[.!?;](?=\s|$)')
# Thousands grouped by dots: two at least ('1.000' is a decimal point).
_DOT_GROUPS = r'\d{1,3}(?:\.\d{3}){2,}(?!\d|\.\d)'
# A number in unmarked text, its thousands grouped as a marked answer's may
# be ('1,000', "1'000", '1.000.000' and not '1.000', '10,00,000'; '1 000'
# only within a marked answer); a full stop after it ends the sentence.
_NUMBER_TOKEN_RE = re.compile(
    r'(?<![\w.])(?:\$?\d+ (?=\d+/\d))?[-\u2212\u2013]?\$?'  # $2 1/2, \u20135
    r'(?:(?:' + _DOT_GROUPS +
    r'|(?<![\d,])\d{1,2}(?:,\d\d)+,\d{3}(?!\d|,\d)'  # once a run: linear
    r"|\d{1,3}(?:(?:,|\{,\}|\\,|[\u00a0\u2009\u202f'\u2019\u066c])\d{3})+"
    r'(?!\d)|\d+)'
    r'(?:\.\d+)?|\.\d+)'
    r'(?:[eE][-+]?\d+)?'  # 1.5e3
    r'(?:\s*/\s*\d+(?:\.\d+)?)?')

# (pattern, replacement) pairs that strip LaTeX down to plain text.
_LATEX_SUBS = tuple((re.compile(p), r) for p, r in (
    (r'\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox|operatorname)\s*'
     r'\{([^{}]*)\}', r'\1'),
    (r'\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox|operatorname)\s*'
     r'\{([^{}]*)\}', r'\1'),  # once more for one level of nesting
    (r'\\[dt]?frac\s*\{\s*([-\u2212]?[\d.,]+)\s*\}\s*\{\s*([\d.,]+)\s*\}',
     r' \1/\2'),
    (r'\\[dt]?frac\s*(\d)\s*(\d)', r' \1/\2'),  # \frac34
    (r'\\[dt]frac(?![A-Za-z])', r'\\frac'),
    (r'(?<=\d)\\,(?=\d{3})', ''),  # 1\,000
    (r'\\[,;: ]|\\q?quad(?![A-Za-z])', ' '),
    (r'\\!', ''),
    (r'\\%', '%'),
    (r'\\\$', ''),
    (r'\\(?:left|right|displaystyle)(?![A-Za-z])', ''),
    (r'\^\s*\{?\s*\\circ\s*\}?|\\(?:circ|degree)(?![A-Za-z])', ''),
    (r'\\[()\[\]]', ''),
))
# Those the last number of unmarked text reads through: `\text{}` and its
# kin, and fractions of numbers.
_LAST_NUMBER_SUBS = _LATEX_SUBS[:4]
_BOLD_RE = re.compile(r'(?<!\d)\*\*|\*\*(?!\d)')  # not the power in 9**2
_THIN_SPACE_RE = re.compile(r'(?<=\d)[\u00a0\u2009\u202f](?=\d{3})')
# Other locales' thousands: 1'000 and 1’000 (Swiss), 1٬000 (Arabic),
# 1.000.000 (two dots or more; one is a decimal point), 10,00,000 (Indian).
_GROUP_SEP_RE = re.compile(r"(?<=\d)['\u2019\u066c](?=\d{3}(?!\d))")
_DOT_GROUPS_RE = re.compile(r'(?<![\d.])' + _DOT_GROUPS)
_LAKH_RE = re.compile(r'(?<![\d,])\d{1,2}(?:,\d\d)+,\d{3}(?![\d,])')
_PARENS_RE = re.compile(r'\(([^()]*)\)')  # '(18)'
_WHOLE_RE = re.compile(r'\d+(?:\.0*)?')  # '18', '18.00'
_VULGAR = {  # every vulgar fraction character: '\u00bd', '\u2153', '\u215c'
    '\u00bc': '1/4', '\u00bd': '1/2', '\u00be': '3/4', '\u2150': '1/7',
    '\u2151': '1/9', '\u2152': '1/10', '\u2153': '1/3', '\u2154': '2/3',
    '\u2155': '1/5', '\u2156': '2/5', '\u2157': '3/5', '\u2158': '4/5',
    '\u2159': '1/6', '\u215a': '5/6', '\u215b': '1/8', '\u215c': '3/8',
    '\u215d': '5/8', '\u215e': '7/8', '\u2189': '0/3'}
# Fullwidth forms are their ASCII characters ('\uff11\uff12\uff0e\uff15' is
# 12.5, '\uff03\uff03\uff03\uff03' is ####), as the Arabic decimal
# separator is a point and the ideographic space a space: the decimal digits
# of any script are digits, so their points and separators read too.
_FULLWIDTH = {0xff01 + k: 0x21 + k for k in range(94)}
_FULLWIDTH.update({0x066b: '.', 0x3000: ' '})


_FULLWIDTH_RE = re.compile('[\uff01-\uff5e\u066b\u3000]')


def _halfwidth(text: str) -> str:
  # translate() walks the whole text in Python: 0.1-0.8 ms for a long
  # completion with one '\u00d7' in it; most hold no full-width form.
  if text.isascii() or not _FULLWIDTH_RE.search(text):
    return text
  return text.translate(_FULLWIDTH)


_CHAR_MAP = str.maketrans({
    '$': '', '\u00b0': '', '\u2212': '-', '\ufe63': '-', '\uff0d': '-',
    '\u00a0': ' ', '\u2009': ' ', '\u202f': ' ',
    **{k: f' {v}' for k, v in _VULGAR.items()}})  # 2½ is 2 1/2

_NUM = (r'(?:\d{1,3}(?:,\d{3})+(?!\d)|\d{1,3}(?: \d{3})+(?!\d)|\d+)'
        r'(?:\.\d+)?|\.\d+')
_CUR = r'(?:[\u20ac\u00a3\u00a5\u20b9]|(?:US|USD|EUR|GBP|Rs\.?)(?=[ \d]))'
_NUMBER_RE = re.compile(
    r'(?:[A-Za-z] ?= ?)?'                                 # x = 5
    r'(?P<s1>[-+]?) ?(?:' + _CUR + r' ?)?(?P<s2>[-+]?) ?'  # -$5, $-5
    r'(?P<a>' + _NUM + r')(?P<e>[eE][-+]?\d{1,3})?'       # 1.5e3
    r'(?: ?/ ?(?P<b>' + _NUM + r')'                       # 3/4
    r'| (?P<n>\d+) ?/ ?(?P<d>\d+))?'                      # 2 1/2
    r' ?(?:%|[\u20ac\u00a3\u00a5\u20b9\u00a2])?'          # 25%, 5€
    r"(?:(?: | ?/ ?|(?![kKMB]\b|bn\b))"                # 5 km, 5km; not 5k
    r"(?P<u>[^\W\d_])(?:[^\W\d_]|[ ./'\u2019\u00b2\u00b3()])*)?")
# An answer that is no number alone may still state one: the number before a
# comment ('18 (9 x 2)', '18 dollars, since ...', '18 because ...', '18 \u2014
# her pay'), or the result of arithmetic ('20 - 2 = 18'). Commas before
# digits group them.
_LEAD_RE = re.compile(
    r'((?:(?!\s(?:because|since)\b)[^(,\u2014]|,(?=\d))*)'
    r'(?:\(|, *(?=[^\W\d_])|\u2014|\s(?:because|since)\b)')
# Words after which a phrase's number is not its value ('not 18', 'half of
# 36', 'about 18', 'more than 18').
_NOT_VALUE_RE = re.compile(
    r"\b(?:not|no|never|none|neither|nor|half|twice|double|triple|times"
    r"|minus|plus|less|more|fewer|than|divided|multiplied|least|most|about"
    r"|around|approx(?:imately)?|roughly|nearly|almost|over|under|up\s+to)\b"
    r"|n['\u2019]t\b"
    r'|~(?=\s*[-$.\d])|[\u2248\u2264\u2265\u2260]'
    r'|(?<![<>])[<>]=?(?=\s*[-$.\d])'  # not <<9*2=18>>18
    r'|\\(?:approx|sim|geq?|leq?|gt|lt|neq?)(?![A-Za-z])', re.I)
# LaTeX's non-breaking space after a number or before a word ('18~cm',
# '\mathrm{~cm}'); '~18' is "about 18".
_TILDE_SPACE_RE = re.compile(r'(?<=[\d}])~|~(?=[A-Za-z\\])')
# An <answer> tag's text that is sentences or working, not an answer alone.
_WORKING_RE = re.compile(r'[.!?;](?=\s)|\n|=')
# What may follow a stated result and say nothing of it: a check mark.
_CHECK_MARKS_RE = re.compile(r'[\s\u2713\u2714\u2705\u2611]+$')
# The same before the last number of unmarked text ("The answer isn't 72",
# '#### not 72', 'about 72'), which words earlier in its sentence leave be.
_NOT_VALUE_BEFORE_RE = re.compile(
    r"(?:\b(?:not|no|never|about|around|approx(?:imately)?|roughly|nearly"
    r"|almost|over|under|than|least|most|up\s+to)|n['\u2019]t"
    r'|[~\u2248\u2264\u2265]|(?<![<>])[<>]=?)'
    r'[\s*_]*\$?\Z', re.I)
# Words after a number that qualify it ('72 or more', '72 is wrong', '72
# (approximately)'): no unit, and no value.
_HEDGE = (r'(?:\(\s*)?(?:approx(?:imately\b|\.|\b)|roughly\b|estimated\b'
          r'|or so\b)')
_QUALIFIER_AFTER_RE = re.compile(
    r'(?:or|and) (?:more|less|fewer|so|above|below|over|under|higher|lower)\b'
    r'|(?:is|are) (?:wrong|incorrect|not)\b|at (?:most|least)\b|' + _HEDGE,
    re.I)
_HEDGE_AFTER_RE = re.compile(r'\s*' + _HEDGE, re.I)  # of a last number
# A unit's power written with a caret after a number ('72 cm^2', '5 ft^{3}'):
# as '\u00b2' ('5 m\u00b2'); an expression's ('x^2') stays a power.
# An en dash before a number, after no other ('\u20135', not '5\u20137'): a
# minus sign, as typeset text writes one.
_EN_DASH_MINUS_RE = re.compile(r'(?<![\w)\]}.,])\u2013(?=\$?\d)')
# A list item's mark at the start of a line ('Answer:\n- 18'): no sign.
_BULLET_RE = re.compile(r'[-+\u2022][ \t]+(?=\S)')
_UNIT_POWER_RE = re.compile(r'(\d\s*[A-Za-z]{1,3})\^\{?([23])\}?(?!\d)')
# A LaTeX fraction in unmarked text of anything but numbers (those are
# `_LAST_NUMBER_SUBS`'): no number (its denominator was read as one).
_OTHER_FRAC_RE = re.compile(r'\\[dt]?frac\s*\{[^{}]*\}\s*\{[^{}]*\}')
_OPERATOR_BEFORE = ('^', '\u221a', '\u221b', '\u221c')  # 10^3, roots
_SCALE_AFTER_RE = re.compile(r'(?:[kKMB]|bn)(?![A-Za-z])|:\d')  # 18k, 3:30
_TIME_BEFORE_RE = re.compile(r'\d:$')  # the 30 of 3:30
# What 'the answer is' may mark instead of an answer: a few words, then a
# colon or the end of the sentence ('simple:', 'as follows', 'easy to see').
_LEAD_IN_RE = re.compile(r'(?:[^\W\d_]+[ *_]+){0,3}[^\W\d_]+[*_]*(?::|\Z)')
# A result stated in words: '3 apples plus 15 apples gives 18'.
_RESULT_RE = re.compile(
    r'\s*(?:=|\b(?:gives?|makes?|equals?|is|are|totals?|yields?|leaves)\b)'
    r'\s*')
_OP_WORD = r'(?:plus|minus|times|and|x|divided\s+by|multiplied\s+by)\b'
_TERM = (r'[-\u2212]?\$?\d[\d,.]*%?'
         r'(?:\s+(?!' + _OP_WORD + r')[^\W\d_]+){0,2}')  # '3 red apples'
_WORDY_SUM_RE = re.compile(
    r'\s*' + _TERM + r'(?:\s*(?:[-+*/\u00d7\u00f7\u00b7\u2212]|' + _OP_WORD
    + r')\s*' + _TERM + r')+\s*')
_ARITHMETIC_RE = re.compile(  # '4\u00b2 = 16' as '4^2 = 16'
    r'(?:[\d\s.,+\-*/xX\u00d7\u00f7\u00b7()\[\]{}$%^='
    r'\u00b2\u00b3\u00b9\u2070-\u2079]'
    r'|\\(?:times|cdot|div|left|right)(?![A-Za-z]))*')


def _hashes(text: str) -> str | None:
  """Text after the last GSM8K-style `####` that is not a markdown heading."""
  if '####' not in text:
    return None
  for m in reversed(list(_HASHES_RE.finditer(text))):
    content = m.group(1).rsplit('####', 1)[-1].strip()
    head = content.lstrip('*_ \t')
    if (head and not head[0].isalpha()  # '#### Step 2' is a heading
        and not _NUMBERED_HEADING_RE.match(head)
        and not (_TITLE_HEADING_RE.match(head) and text[m.end():].strip())):
      return content
  return None


def _boxed(text: str) -> str | None:
  """Content of the last complete, non-empty `\\boxed{...}` or `\\fbox{...}`."""
  if '\\boxed' not in text and '\\fbox' not in text:
    return None
  # A box still open where a later unclosed box starts can never close, so
  # each box is scanned only up to the last unclosed one: linear time.
  limit = len(text)
  for m in reversed(list(_BOXED_RE.finditer(text))):
    start = m.end()
    if start < len(text) and text[start] == '{':
      depth = 0
      for brace in _BRACE_RE.finditer(text, start, limit):
        char = brace.group()
        if char == '{':
          depth += 1
        elif char == '}':
          depth -= 1
          if depth == 0:
            content = text[start + 1:brace.start()].strip()
            if content:
              return content
            break
      else:
        limit = m.start()
    else:  # \boxed 5
      token = _BOXED_TOKEN_RE.match(text, start, limit)
      if token:
        return token.group()
  return None


def _answer_tag(text: str) -> str | None:
  """Content of the last complete, non-empty `<answer>...</answer>` pair."""
  if '<' not in text:
    return None
  found, open_end = None, None
  for m in _TAG_RE.finditer(text):
    if not m.group(1):
      open_end = m.end()
    elif open_end is not None:
      content = text[open_end:m.start()].strip()
      if content:
        found = content
      open_end = None
  return found


def _segment(text: str, start: int) -> tuple[str, int | None]:
  """(the sentence or line from `start`, stripped; where the next begins)."""
  end = _SEGMENT_END_RE.search(text, start)
  content = text[start:end.start() if end else len(text)].strip(' \t*')
  return content, end.end() if end else None


def _answer_is(text: str) -> str | None:
  """The rest of the sentence after the last 'answer is' or 'answer:' that
  states a number; else after the last one ('Note: the answer is in
  dollars.' after 'The answer is 18.' left 18 unread)."""
  last, tried = None, 0
  for m in reversed(list(_ANSWER_IS_RE.finditer(text))):
    if tried == 4:  # the last few: 'answer: .' x 1000 stays linear
      break
    start = m.end()
    if '\n' in m.group() and (bullet := _BULLET_RE.match(text, start)):
      start = bullet.end()  # 'Answer:\n- 18': a list's mark, no sign
    content, after = _segment(text, start)
    for _ in range(3):  # '$$' or '**' alone on a line: the next lines
      if content.strip('$\\[]*_ ') or after is None:
        break
      content, after = _segment(text, after)
    if content:
      tried += 1
      if _normalise(content)[0] is not None or (
          _stated_number(content) is not None):
        return content
      last = last or content
  return last


def _after_lead_in(text: str) -> str | None:
  """What follows a lead-in that the last 'answer is' marks ('The answer is
  simple: ...', 'The answer is as follows.\n...'): the rest of its sentence
  after the colon, else the next sentence; None when it marks no lead-in."""
  for m in reversed(list(_ANSWER_IS_RE.finditer(text))):
    content, after = _segment(text, m.end())
    if not content:
      continue
    lead = _LEAD_IN_RE.match(content)
    if lead is None or _NOT_VALUE_RE.search(lead.group()):
      return None
    rest = content[lead.end():].strip(' \t*')
    while not rest and after is not None:
      rest, after = _segment(text, after)
    return rest or None
  return None


def _numeral(char: str) -> bool:
  """Whether `char` is a numeral but no decimal digit: '²', '₂', '①',
  'Ⅻ', '⅜'. Such a numeral is no digit (Python's int() refuses it) and no unit
  letter either, so a number glued to it ('10²') is no number."""
  return char.isnumeric() and not char.isdecimal()


def _stray_numeral(text: str) -> bool:
  """Whether `text` holds a numeral that is no digit and ends no unit word
  ('5 \u2460', not '5 m\u00b2'): another number, for `_only_number`."""
  return not text.isascii() and any(
      _numeral(char) and not text[i - 1:i].isalpha()
      for i, char in enumerate(text))


def _operand(text: str, start: int) -> bool:
  """Whether the number at `start` is an exponent or under a root sign
  ('10^3', '\u221a16'): not the value of what it is part of."""
  return text[max(0, start - 8):start].rstrip()[-1:] in _OPERATOR_BEFORE


def _unit_powers(text: str) -> str:
  return _UNIT_POWER_RE.sub(
      lambda m: m[1] + '\u00b2\u00b3'[int(m[2]) - 2], text)


def _last_number(text: str) -> str | None:
  """The last number token, with a vulgar fraction glued to it ('2½'); None
  when it is glued to another numeral ('10²'), an operand ('10^3'), a
  scale letter ('18k', '1.5M') or a time ('3:30'), as a marked answer's is,
  or after a word that makes it no value (`_NOT_VALUE_BEFORE_RE`). A LaTeX
  fraction of numbers is read as one ('\\frac{3}{4}' as '3/4')."""
  if '\\' in text:  # '\\text{ cm}^2' as ' cm^2', '\\frac{3}{4}' as '3/4'
    for pattern, repl in _LAST_NUMBER_SUBS:
      text = pattern.sub(repl, text)
    text = _OTHER_FRAC_RE.sub(' ', text)
  text = _unit_powers(text)
  found = _last(_NUMBER_TOKEN_RE, text)
  if found is None or _operand(text, found.start()) or _SCALE_AFTER_RE.match(
      text, found.end()) or _TIME_BEFORE_RE.search(text, 0, found.start()):
    return None
  if _NOT_VALUE_BEFORE_RE.search(text, max(0, found.start() - 24),
                                 found.start()):
    return None
  if _HEDGE_AFTER_RE.match(text, found.end()):  # '18 (approximately)'
    return None
  after = text[found.end():found.end() + 1]
  if after in _VULGAR:
    return found.group() + after
  return None if _numeral(after) else found.group()


_EXTRACTORS: dict[str, Callable[[str], str | None]] = {
    'hashes': _hashes, 'boxed': _boxed, 'answer_tag': _answer_tag,
    'answer_is': _answer_is}


def _clean(text: str) -> str:
  """`text` without LaTeX wrappers, markdown emphasis and spacing variants."""
  text = _halfwidth(text)
  if '\\' in text:
    inner = _boxed(text)
    if inner is not None:
      text = inner
    for pattern, repl in _LATEX_SUBS:
      text = pattern.sub(repl, text)
  text = _unit_powers(_TILDE_SPACE_RE.sub(' ', text))
  text = _CHECK_MARKS_RE.sub('', text)
  text = _BOLD_RE.sub('', text.replace('{,}', ','))
  text = _EN_DASH_MINUS_RE.sub('-', text) if '\u2013' in text else text
  text = _THIN_SPACE_RE.sub('', text).translate(_CHAR_MAP)
  text = _GROUP_SEP_RE.sub('', text)
  text = _DOT_GROUPS_RE.sub(lambda m: m.group().replace('.', ''), text)
  text = _LAKH_RE.sub(lambda m: m.group().replace(',', ''), text)
  text = ' '.join(text.split())  # one space at most: keeps _NUMBER_RE linear
  text = text.lstrip(' *_:').rstrip(' *_.,;')
  inner = _PARENS_RE.fullmatch(text)
  return inner.group(1).strip() if inner else text


def _number(text: str) -> int | float | None:
  """The value of a cleaned number such as '-1,000.5', '3/4', '2 1/2', '25%'.

  Unit words after the number, spaced or not, are dropped without conversion
  ('50 cents' is 50, '25 percent' is 25, '5km' is 5, '2nd' is 2); a scale
  letter glued to it ('18k', '2M', '3B', '1bn') makes it no number, as does
  a numeral that is no decimal digit ('10\u00b2', '5\u2460'), while the
  decimal digits of any script are digits ('\u0661\u0668' and
  '\uff11\uff18' are 18, as Python's int() reads them). Scientific notation
  reads as Python's float() does ('1e3' is 1000, '2.5E-3' 0.0025). A whole
  number is an int, exact however long (a float holds integers up to 2^53
  only); one too large for a float (past 1.8e308) is no number.
  """
  m = _NUMBER_RE.fullmatch(text)
  if m is None or (m['s1'] and m['s2']) or _numeral(m['u'] or '') or (
      m['u'] and _QUALIFIER_AFTER_RE.match(text, m.start('u'))):
    return None
  digits = m['a'].replace(',', '').replace(' ', '')
  value = float(digits + (m['e'] or ''))
  if not math.isfinite(value):  # past 1.8e308: no number, the texts decide
    return None
  if m['e'] is not None:  # '1.5e3', not within a fraction
    value = _scientific(digits + m['e']) if m['b'] is m['n'] is None else None
    if value is None:
      return None
  elif m['b'] is None and m['n'] is None and _WHOLE_RE.fullmatch(digits):
    value = int(digits.split('.')[0])  # exact: 10**18 + 1 is no float
  elif m['b'] is not None:
    b = m['b'].replace(',', '').replace(' ', '')
    denominator = float(b)
    if denominator == 0:
      return None
    value /= denominator
    if _WHOLE_RE.fullmatch(digits) and _WHOLE_RE.fullmatch(b):
      q, r = divmod(int(digits.split('.')[0]), int(b.split('.')[0]))
      value = value if r else q  # '2000000000000000002/2' is exact too
  elif m['n'] is not None:
    denominator = float(m['d'])
    if denominator == 0:
      return None
    value += float(m['n']) / denominator
  if '-' in (m['s1'], m['s2']):
    value = -value
  return value if math.isfinite(value) else None


def _scientific(text: str) -> int | float | None:
  """The value of '1.5e3' (an int when whole: 1500), as Python's float()
  reads it; None past a float's range (1e400, 1e-400)."""
  try:
    value = decimal.Decimal(text)
  except (ArithmeticError, ValueError):  # decimal.InvalidOperation
    return None
  if not 1e-300 < abs(value) < 1e300:
    return 0 if value == 0 else None
  return int(value) if value == value.to_integral_value() else float(value)


def _stated_number(text: str) -> float | None:
  """The number stated by an answer that is no number alone, or None."""
  lead = _LEAD_RE.match(text)
  if lead and _QUALIFIER_AFTER_RE.match(text, lead.end()):
    return None  # '18 (approximately)', '18, or more'
  head = lead.group(1) if lead else text
  value = _normalise(head)[0] if lead else None
  if value is None:
    value = _result(head)
  return _only_number(head) if value is None else value


def _result(text: str) -> float | None:
  """The result of arithmetic: '20 - 2 = 18', '3 apples plus 15 apples
  gives 18' (not '20 because 9 x 2 = 18')."""
  verb = _last(_RESULT_RE, text)
  if verb is None:
    return None
  left = text[:verb.start()]
  if _ARITHMETIC_RE.fullmatch(left) or _WORDY_SUM_RE.fullmatch(left):
    return _normalise(text[verb.end():])[0]
  return None


def _last(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
  found = None
  for found in pattern.finditer(text):
    pass
  return found


def _only_number(text: str) -> float | None:
  """The value of the one number in a phrase ('She makes $18 a day'), or
  None when it holds none, several, or a word that makes it no value ('not
  18', 'half of 36', 'about 18', 'more than 18')."""
  cleaned = _clean(text)
  if _NOT_VALUE_RE.search(cleaned) or _stray_numeral(cleaned):
    return None
  numbers = list(_NUMBER_TOKEN_RE.finditer(cleaned))
  if len(numbers) != 1:
    return None
  start, end = numbers[0].span()
  if (cleaned[start - 1:start] in ('-', '+')  # '--10' is no -10
      or cleaned[end:end + 1] in ('+', '!')  # '72+' is 72 or more; 18!
      or _COMMAND_RE.search(cleaned)  # in other maths: sqrt, pi, log
      or _operand(cleaned, start)
      or _SCALE_AFTER_RE.match(cleaned, end)
      or _numeral(cleaned[end:end + 1])):
    return None
  return _normalise(numbers[0].group())[0]


def _normalise_uncached(text: str) -> tuple[float | None, str]:
  """(numeric value or None, whitespace-free cleaned text) of an answer."""
  cleaned = _clean(text)
  return _number(cleaned), cleaned.replace(' ', '')


_normalise_cached = functools.lru_cache(maxsize=8192)(_normalise_uncached)


def _normalise(text: str) -> tuple[float | None, str]:
  # Gold answers and short extractions repeat across the samples of a group.
  if len(text) <= 64:
    return _normalise_cached(text)
  return _normalise_uncached(text)


def _load_math_verify() -> Any:
  try:
    return importlib.import_module('math_verify')
  except ImportError as e:
    raise ValueError(
        'math verifier option symbolic=True needs the math_verify package: '
        f"pip install 'jaxgrpo[math]' ({e})") from None


@base.register('math')
@dataclasses.dataclass(frozen=True)
class MathAnswer:
  """Reward 1.0 when a completion's final answer equals `example.answer`.

  The answer is taken by the first rule of `extract` that finds one:
    'hashes': text after the last GSM8K `#### ` marker (a line such as
      '#### Step 2' or '#### 2. Total', which starts with a letter or a
      numbered title, is a markdown heading);
    'boxed': content of the last `\\boxed{...}` or `\\fbox{...}`, braces
      nested;
    'answer_tag': content of the last `<answer>...</answer>`;
    'answer_is': the rest of the sentence after the last 'the (final) answer
      is', 'Answer:' or 'Final answer:' (any case); when that is a lead-in
      of a few words that fails ('simple: ...', 'as follows.'), what follows
      it: the rest of the sentence after its colon, else the next sentence;
  and failing those, with fallback='last_number', the last number in the text,
  its thousands grouped as in a marked answer (extract=() leaves only that
  fallback).

  The extracted text and the gold are normalised alike: LaTeX wrappers
  (`$..$`, `\\(..\\)`, `\\text{}`, `\\boxed{}`, spacing commands), `**bold**`,
  currency symbols, thousands separators ('1,000', '1{,}000', thin spaces,
  "1'000", '1.000.000', '10,00,000'; '1 000' only within a marked
  answer), parentheses around the answer ('(18)'), unicode minus, a
  trailing period, '%' and unit words go, spaced or not, without unit
  conversion ('25%' and '25 percent' are 25, '50 cents' is 50, '5km/h' is
  5, '2nd' is 2, and a scale word too: '18 thousand' is 18); '3/4',
  '\\frac{3}{4}', '\\dfrac34', '2 1/2', '2\u00bd' and '1e3' become numbers,
  and the decimal digits of any script are digits ('\u0661\u0668'), while '1,5'
  is ambiguous, '1.080' is 1.08, and '18k', '1.5M', '3:30' and '10\u00b2'
  (glued to a numeral that is no decimal digit) are no numbers (with
  symbolic=True superscript digits are powers). An answer that is no number
  alone may state one: the number before a comment ('18 (9 x 2)', '18
  dollars, since ...', '18 because ...', '18, not 20', '18 \u2014 her pay')
  or, failing that, the result of arithmetic ('20 - 2 = 18', '3 apples
  plus 15 apples gives 18', not '20 because 9 x 2 = 18'), or else its one
  number ('She makes $18 a day', not 'not
  18', 'half of 36', 'about 18' or '18 in 2 days'); so the first of '18, or
  20' counts, while '18 or 20' is none, and so is an estimate ('18
  (approximately)', '18 approx.'). An en dash before a number is a minus
  ('\u20135'), a list's mark on the line after a marker none. When both
  sides are numbers (or the answer states one and the gold is one) they
  are compared as numbers:
  exactly when the gold is an integer (so 1000001 never passes for
  1000000, nor '10^18 + 1 dollars' written out for 10^18: whole numbers
  are read as exact integers, with or without units), else within
  `rel_tol`. Otherwise the cleaned texts must be
  equal, ignoring whitespace, so a non-numeric gold such as 'x+1' can still
  match.

  With symbolic=True a failed comparison is retried with math_verify (sympy),
  e.g. 'x^2+2x+1' for '(x+1)^2', for answers up to 500 characters after
  normalisation that are mathematics, not prose (no word of two letters or
  more outside a LaTeX command: math_verify would pick an expression out of
  '19 because 9 + 9 = 18' or '18 or 20'), nor a number too large to
  compute: a numeric exponent or factorial holding a power or a factorial,
  or more than 5 digits ('9^{9^{9}}', '9^{99}!', '2^{123456}', '123456!';
  sympy computes such numbers in C code that no timer interrupts, so the
  call sat out `verify.timeout_s`). math_verify's own SIGALRM
  timeouts are disabled because they would replace the trainer's timer: the
  trainer runs verifiers in worker processes with a per-call timeout (and
  kills a worker stuck in C code), and that is what keeps sympy from
  stalling training. Unpickling rebuilds the verifier through its
  constructor, so a worker imports math_verify when it receives the
  verifier rather than inside its first timed call.

  Details: {'extracted': the answer text or None, 'how': the rule that found
  it, 'last_number', or 'none'}.

  Attributes:
    extract: extraction rules to try, in order; a subset of RULES.
    fallback: 'last_number' or 'none' (no answer unless a rule finds one).
    rel_tol: relative tolerance for comparing with a non-integer gold.
    symbolic: retry a failed comparison with math_verify (needs
      `pip install 'jaxgrpo[math]'`).
  """

  extract: tuple[str, ...] = RULES
  fallback: str = 'last_number'
  rel_tol: float = 1e-6
  symbolic: bool = False

  def __post_init__(self):
    extract = self.extract
    if isinstance(extract, str) or not isinstance(extract, (list, tuple)):
      raise ValueError(
          f'math verifier option extract={extract!r}: expected a list of '
          f'rules from {RULES}')
    bad = [r for r in extract if r not in RULES]
    if bad or len(set(extract)) != len(extract):
      raise ValueError(
          f'math verifier option extract={extract!r}: rules must be distinct '
          f'and drawn from {RULES}')
    object.__setattr__(self, 'extract', tuple(extract))
    if self.fallback not in FALLBACKS:
      raise ValueError(
          f'math verifier option fallback={self.fallback!r}: must be one of '
          f'{FALLBACKS}')
    if not extract and self.fallback == 'none':
      raise ValueError(
          "math verifier options extract=() and fallback='none' never find an "
          'answer; name a rule in extract or use fallback=\'last_number\'')
    tol = self.rel_tol
    if (isinstance(tol, bool) or not isinstance(tol, (int, float))
        or not 0 <= tol < 1):
      raise ValueError(
          f'math verifier option rel_tol={tol!r}: must be a number in [0, 1)')
    if not isinstance(self.symbolic, bool):
      raise ValueError(
          f'math verifier option symbolic={self.symbolic!r}: must be True or '
          'False')
    if self.symbolic:
      _load_math_verify()

  def __reduce__(self):
    return (type(self), tuple(
        getattr(self, f.name) for f in dataclasses.fields(self)))

  def extract_answer(self, completion: str) -> tuple[str | None, str]:
    """(answer text or None, rule that found it) for a completion."""
    return self._extract(_halfwidth(completion))

  def _extract(self, completion: str) -> tuple[str | None, str]:
    """`extract_answer` of a completion already in half-width forms: what
    follows a closed `</think>` first, then the whole text (a draft answer
    in the reasoning beat the final one)."""
    _, closed, after = completion.rpartition('</think>')
    for part in (after, completion) if closed else (completion,):
      found = self._extract_from(part, self.extract,
                                 self.fallback == 'last_number')
      if found[0] is not None:
        return found
    return None, 'none'

  def _extract_from(self, text: str, rules: Sequence[str],
                    last_number: bool) -> tuple[str | None, str]:
    for rule in rules:
      found = _EXTRACTORS[rule](text)
      if found is not None:
        return found, rule
    found = _last_number(text) if last_number else None
    return found, 'last_number' if found is not None else 'none'

  def matches(self, answer: str, gold: str) -> bool:
    """Whether an extracted answer equals the gold (see the class doc)."""
    value, text = _normalise(answer)
    gold_value, gold_text = _normalise(gold)
    if value is None and gold_value is not None:
      value = _stated_number(answer)
    if value is not None and gold_value is not None:
      if isinstance(gold_value, int) or gold_value.is_integer():
        # Exact; past 2^53 a float stands for many integers, so only an
        # integer answer can equal it ('1000000000000000000.5' reads as
        # the float 1e18).
        equal = value == gold_value and (
            isinstance(value, int) or abs(gold_value) < 2**53)
      else:
        equal = math.isclose(value, gold_value, rel_tol=self.rel_tol)
    else:  # not for a numeric gold: '5 6' is two numbers, not 56
      equal = gold_value is None and bool(gold_text) and text == gold_text
    if not equal and self.symbolic:
      cleaned = _clean(answer)  # '\\approx 18', '\\geq 18', '18+': no value
      equal = not (_NOT_VALUE_RE.search(cleaned) or cleaned.endswith('+')) and (
          _symbolic_equal(cleaned, _clean(gold)))
    return equal

  def __call__(self, completion: str, example: Example) -> base.Verdict:
    completion = _halfwidth(completion)
    answer, how = self._extract(completion)
    reward = 0.0
    if answer is not None and self.matches(answer, example.answer):
      reward = 1.0
    elif how == 'answer_tag' and _WORKING_RE.search(answer):
      # '<answer>She makes $18. The answer is 18.</answer>', or working
      # that ends in the result: the tag's text read as a completion.
      inner, _ = self._extract_from(
          answer, [r for r in self.extract if r != 'answer_tag'], True)
      if inner is not None:
        answer = inner
        reward = float(self.matches(answer, example.answer))
    elif how == 'answer_is':  # 'The answer is simple: ...' marks no answer
      after = _after_lead_in(completion)
      if after is not None:
        answer = after
        reward = float(self.matches(answer, example.answer))
    return base.Verdict(reward, {'extracted': answer, 'how': how})


def _group_end(text: str, start: int, step: int) -> int:
  """Where the bracketed group at `start` ends (its matching bracket), when
  scanning by `step`; the text's end when it does not close."""
  depth, end = 0, start
  ends = range(start, len(text)) if step > 0 else range(start, -1, -1)
  for end in ends:
    depth += (text[end] in '{(') - (text[end] in '})')
    if depth == 0:
      return end
  return end + step


def _operands(text: str) -> list[str]:
  """What each '^' raises to (the group or character after it), and what
  each '!' is the factorial of (the number, or the group and the power it
  ends, before it)."""
  found = []
  for m in re.finditer(r'\^\s*', text):
    start = m.end()
    if text[start:start + 1] in ('{', '('):
      found.append(text[start + 1:_group_end(text, start, 1)])
    else:
      found.append(text[start:start + 1])
  for m in re.finditer(r'\s*!', text):
    end = start = len(text[:m.start()].rstrip(' !'))  # (9!)! is 9!!
    if text[end - 1:end] in ('}', ')'):
      start = max(_group_end(text, end - 1, -1), 0)
      if text[start - 1:start] == '^':  # 9^{99}!
        start -= 1
    else:
      start -= len(re.search(r'\d*$', text[:end]).group())
    found.append(text[start:m.start()])
  return found


def _too_large(text: str) -> bool:
  """Whether `text` names a number too large to compute (_OPERAND_DIGITS)."""
  for operand in _operands(text):
    if re.search('[A-Za-z]', _COMMAND_RE.sub('', operand)):
      continue  # symbolic: 'e^{x^2}' and '(n+1)!' are not computed
    if (re.search(r'[\^!]', operand)
        or sum(map(str.isdigit, operand)) > _OPERAND_DIGITS):
      return True
  return False


_SUPERSCRIPT_RE = re.compile('[\u2070\u00b9\u00b2\u00b3\u2074-\u207b]+')
_SUPERSCRIPTS = str.maketrans(
    '\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079'
    '\u207a\u207b', '0123456789+-')


def _power(m: re.Match[str]) -> str:
  return f'^{{{m.group().translate(_SUPERSCRIPTS)}}}'


def _symbolic_equal(answer: str, gold: str) -> bool:
  """math_verify equivalence of two cleaned answers, without its timers.

  Superscript digits are powers ('10\u00b2' is 10^{2}): math_verify reads
  '2\u00b2' as 2.
  """
  answer, gold = (_SUPERSCRIPT_RE.sub(_power, t) for t in (answer, gold))
  if (not answer or not gold or len(answer) > _SYMBOLIC_MAX_CHARS
      or _PROSE_RE.search(answer) or _too_large(answer)):
    return False
  mv = _load_math_verify()
  parsed_gold = mv.parse(f'${gold}$', parsing_timeout=None)
  parsed = mv.parse(f'${answer}$', parsing_timeout=None)
  return bool(parsed_gold and parsed) and mv.verify(
      parsed_gold, parsed, timeout_seconds=None)
