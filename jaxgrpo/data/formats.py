"""Record formats: how one record (a dict) becomes an Example.

A dataset picks one format by name (`FORMATS`):

  fields: generic; `RecordFields` names the prompt, answer, id and subset
    fields of the record.
  gsm8k: GSM8K's `{question, answer}` records as shipped; the ground truth
    is the final answer after the last '####' of the worked solution.
  squad2: one SQuAD 2.0 question with its paragraph's context and its
    article's title; `jaxgrpo.data.squad2_file.Squad2File` flattens the
    JSON file as shipped into such records.

Records come from JSONL lines, ArrayRecord entries, TFDS examples (text as
bytes, numbers as numpy values) or a `squad2_file.Squad2File`. A record
that cannot become an Example raises BadRecordError naming where it came
from (file and line, record index, or JSON path), so that load-time
screening can skip it.

Size: the three formats share one template renderer and one field lookup
(`_render`, `_field`), and `make_format` checks every format's settings
where a config names them; apart, those would become public helpers.
"""

from collections.abc import Callable, Mapping
import dataclasses
import decimal
import functools
import hashlib
import json
import re
import string
from typing import Any, ClassVar, Protocol

import numpy as np

from jaxgrpo import errors
from jaxgrpo.example import Example
from jaxgrpo.verifiers import qa

FORMATS = ('fields', 'gsm8k', 'squad2')

# The local TFDS builders (`jaxgrpo.data.tfds_builders`) and their format.
TFDS_BUILDERS = {'jaxgrpo_gsm8k': 'gsm8k', 'jaxgrpo_squad2': 'squad2'}

GSM8K_TEMPLATE = (
    '{question}\nSolve it step by step, then write the final answer on its '
    'own line as "#### <number>".'
)
# The refusal the default SQuAD 2.0 template asks for.
UNANSWERABLE = 'unanswerable'
SQUAD2_TEMPLATE = (
    'Answer the question using only the context. If the context does not '
    'contain the answer, reply "unanswerable".\n\nContext: {context}\n\n'
    'Question: {question}\nAnswer:'
)
# Fields a squad2 prompt template may name.
SQUAD2_TEMPLATE_FIELDS = ('context', 'question', 'title', 'id')

# Where a record came from, for error messages: e.g. 'data.jsonl:3'.
Where = Callable[[], str]


class BadRecordError(errors.DataError):
  """A record cannot become an Example; the message says where and why."""


class RecordFormat(Protocol):
  """Maps one record to an Example, or raises BadRecordError."""

  FORMAT: ClassVar[str]
  template: str

  def example(self, record: Mapping[str, Any], *, name: str, index: int,
              where: Where) -> Example:
    ...


def _template_names(template: str) -> list[str]:
  """Names of the fields a `str.format` template uses; ValueError if bad."""
  try:
    names = [f for _, f, _, _ in string.Formatter().parse(template)
             if f is not None]
  except ValueError as e:
    raise ValueError(f'bad prompt template {template!r}: {e}') from e
  literal = [n for n in names if not n or n.isdigit() or n[0] in '"\'']
  if literal:  # \boxed{}, \frac{1}{2}, {"answer": 1}: meant as text
    raise ValueError(
        f'prompt template {template!r} has {{{literal[0]}}}, which names no '
        'record field; write a brace meant as text doubled: \\boxed{{}}, '
        '{{"answer": 1}}'
    )
  dotted = [n for n in names if '.' in re.sub(r'\[[^\]]*\]', '', n)]
  if dotted:
    raise ValueError(
        f'prompt template {template!r} reads an attribute ({{{dotted[0]}}}); '
        'name a record field, or a nested one as {field[key]}')
  return names


@functools.lru_cache(maxsize=64)
def _template_fields(template: str) -> frozenset[str]:
  """Top-level record fields a prompt template names."""
  names = (f for _, f, _, _ in string.Formatter().parse(template) if f)
  return frozenset(re.split(r'[.\[]', n, maxsplit=1)[0] for n in names)


def plain(value: Any) -> Any:
  """Text and numpy values as Python ones (TFDS returns bytes and numpy);
  a float16 or float32 as the shortest decimal that reads back to it (1.1,
  not the 1.100000023841858 of its bits as a Python float)."""
  if isinstance(value, np.ndarray) and value.ndim == 1:
    return [plain(v) for v in value]
  if isinstance(value, (np.float16, np.float32)):
    return float(str(value))
  if isinstance(value, (np.ndarray, np.generic)) and np.ndim(value) == 0:
    value = value.item()
  if isinstance(value, bytes):
    value = value.decode('utf-8')
  return value


def _keys(record: Mapping[str, Any]) -> str:
  return ', '.join(sorted(record))


def _lookup(record: Mapping[str, Any], key: str, *, name: str,
            where: Where) -> Any:
  """The value of field `key`; 'a.b' reaches into a nested record (a
  Parquet struct such as verl's `reward_model.ground_truth`)."""
  if key in record:
    return record[key]
  value, parts = record, key.split('.')
  for i, part in enumerate(parts):
    if i and not isinstance(value, Mapping):  # e.g. a null struct
      got = 'null' if value is None else f'a {type(value).__name__}'
      raise BadRecordError(
          f"{where()}: field {key!r}: {'.'.join(parts[:i])!r} is {got}, not "
          f'an object holding {part!r}')
    if part not in value:
      same = [k for k in record if str(k).lower() == key.lower()] + [
          '.'.join([*parts[:i], str(k), *parts[i + 1:]]) for k in value
          if str(k).lower() == part.lower()]
      raise BadRecordError(
          f'{where()}: record has no field {key!r} (dataset {name!r}; its '
          f'fields: {_keys(record)}' + (
              f'; field names are case-sensitive: {same[0]!r}?'
              if same else '') + ')'
      )
    value = value[part]
  return value


def chat_prompt(value: Any, key: str, where: Where) -> str:
  """The user's message of a chat prompt (verl's `prompt` column: one user
  turn); prompt encoding applies the model's chat template to it."""
  roles = [m.get('role') if isinstance(m, Mapping) else None for m in value]
  if roles != ['user']:
    raise BadRecordError(
        f'{where()}: field {key!r} holds chat messages with roles {roles}; '
        "one 'user' message is supported (a system message goes in "
        'model.system_prompt)'
    )
  return value[0].get('content')


def _field(record: Mapping[str, Any], key: str, *, name: str,
           where: Where) -> str:
  """A text (or number) field as text; BadRecordError if absent or not."""
  value = _lookup(record, key, name=name, where=where)
  if isinstance(value, (list, tuple)) and value and isinstance(
      value[0], Mapping):  # chat messages
    value = chat_prompt(value, key, where)
  try:
    value = plain(value)
  except UnicodeDecodeError as e:
    raise BadRecordError(f'{where()}: not valid UTF-8 ({e})') from e
  return _as_text(value, key, where)


def _as_text(value: Any, key: str, where: Where) -> str:
  """A field's value as text: text, or a finite number (not a bool:
  `True` would become 'True'; a whole float or decimal is written as an
  int, 1e16 too); BadRecordError naming the field if not."""
  if isinstance(value, decimal.Decimal) and value.is_finite():
    # A Parquet decimal column (SQL and Spark exports), a JSON number.
    if not np.isfinite(float(value)):  # 1e400: past any float
      raise BadRecordError(f'{where()}: field {key!r} must be text or a '
                           f'finite number, got {value}')
    value = str(_written(value))
  if isinstance(value, bool) or not isinstance(value, (str, int, float)):
    raise BadRecordError(
        f'{where()}: field {key!r} must be text or a number, got '
        f'{type(value).__name__}'
    )
  if isinstance(value, float) and not np.isfinite(value):
    raise BadRecordError(f'{where()}: field {key!r} must be text or a finite '
                         f'number, got {value}')
  if isinstance(value, float) and value.is_integer():
    value = _whole(value)
  text = str(value)
  try:
    text.encode('utf-8')
  except UnicodeEncodeError as e:  # a lone surrogate, e.g. "\ud800" in JSON
    raise BadRecordError(
        f'{where()}: field {key!r} is not valid Unicode ({e.reason}: '
        f'{text[e.start:e.end]!r} at character {e.start})') from None
  return text


def _whole(value: float) -> int:
  """A whole float as the int it is written as: 18, not '18.0' (Parquet
  stores ints with nulls so); from 2**53 on, the integer of the shortest
  decimal that reads back to it, as float32s are read (`plain`): 1e16 is
  10000000000000000, not '1e+16'."""
  if abs(value) < 2**53:
    return int(value)
  return int(decimal.Decimal(repr(value)))


class _Fixed(decimal.Decimal):
  """A decimal written in fixed point unless a format spec says otherwise
  (Decimal's str() writes 0.0000001 as 1E-7)."""

  def __format__(self, spec: str) -> str:
    return format(decimal.Decimal(self), spec or 'f')

  def __str__(self) -> str:
    return format(self, '')


def _written(value: decimal.Decimal) -> 'int | _Fixed':
  """A finite decimal as it was written: a whole one as its int (a JSON
  1e3 as 1000), another in fixed point (2.50, 0.0000001)."""
  return int(value) if value == value.to_integral_value() else _Fixed(value)


class _PromptFormatter(string.Formatter):
  """`str.format` for prompt templates: every value it puts in the prompt
  must be text or a number (a null, a list or a bool is a bad record); a
  whole float is put as its int, as `_as_text` writes it."""

  def __init__(self, where: Where):
    self.where = where

  def get_field(self, field_name, args, kwargs):
    value, used = super().get_field(field_name, args, kwargs)
    number = plain(value)
    _as_text(number, field_name, self.where)
    if isinstance(number, float) and number.is_integer():
      value = _whole(number)  # as in answers: 18, 10000000000000000
    elif isinstance(number, decimal.Decimal):  # as in answers; {n:.2f} too
      value = _written(number)
    return value, used


def _text(record: Mapping[str, Any], key: str, what: str, *, name: str,
          where: Where) -> str:
  """A field that must hold non-blank text (a prompt, question or id)."""
  value = _field(record, key, name=name, where=where)
  if not value.strip():
    raise BadRecordError(f'{where()}: field {key!r} ({what}) is empty')
  return value


def _render(template: str, record: Mapping[str, Any],
            values: dict[str, Any], *, name: str, where: Where) -> str:
  """The prompt: `template` over `values`, which must not come out empty."""
  try:
    prompt = _PromptFormatter(where).vformat(template, (), values)
  except BadRecordError:
    raise
  except KeyError as e:
    raise BadRecordError(
        f'{where()}: prompt template {template!r} names field '
        f'{e.args[0]!r}, which the record lacks (dataset {name!r}; its '
        f'fields: {_keys(record)})'
    ) from e
  except (AttributeError, IndexError, TypeError, ValueError) as e:
    raise BadRecordError(
        f'{where()}: prompt template {template!r} does not fit this record '
        f'({type(e).__name__}: {e})'
    ) from e
  if not prompt.strip():
    raise BadRecordError(
        f'{where()}: the prompt is empty (template {template!r})'
    )
  return prompt


def _plain_values(record: Mapping[str, Any], where: Where) -> dict[str, Any]:
  try:
    return {k: plain(v) for k, v in record.items()}
  except UnicodeDecodeError as e:
    raise BadRecordError(f'{where()}: not valid UTF-8 ({e})') from e


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecordFields:
  """The generic format: named fields of a record make the Example.

  Attributes:
    prompt: field holding the prompt; `{prompt}` in the template means it.
    answer: field holding the ground truth (numbers become strings); a
      blank one makes a bad record.
    id: field holding a stable id; None uses `f'{name}/{index}'`.
    subset: field holding the subset label; None leaves it empty.
    template: `str.format` template of the prompt text over the record's
      fields, e.g. 'Solve: {question}\\nAnswer:'.
  """

  FORMAT: ClassVar[str] = 'fields'
  prompt: str = 'prompt'
  answer: str = 'answer'
  id: str | None = None
  subset: str | None = None
  template: str = '{prompt}'

  def __post_init__(self):
    _template_names(self.template)

  def example(self, record: Mapping[str, Any], *, name: str, index: int,
              where: Where) -> Example:
    """The Example of `record`, the `index`-th of dataset `name`."""
    values = _plain_values(record, where)
    if 'prompt' in _template_fields(self.template):
      values['prompt'] = _text(record, self.prompt, 'the prompt', name=name,
                               where=where)
    prompt = _render(self.template, record, values, name=name, where=where)
    if self.id:
      example_id = _text(record, self.id, 'the id', name=name, where=where)
    else:
      example_id = f'{name}/{index}'
    subset = ''
    if self.subset:
      subset = _field(record, self.subset, name=name, where=where)
    answer = _field(record, self.answer, name=name, where=where)
    if not answer.strip():  # an empty completion would match it
      raise BadRecordError(
          f'{where()}: field {self.answer!r} (the answer) is empty; an '
          "unanswerable question's answer is a refusal such as "
          f'{UNANSWERABLE!r}')
    return Example(
        id=example_id,
        prompt=prompt,
        answer=answer,
        dataset=name,
        subset=subset,
    )


def gsm8k_final_answer(solution: str) -> str | None:
  """The text after the last '####' of a GSM8K solution, or None."""
  head, marker, final = solution.rpartition('####')
  del head
  return final.strip() if marker else None


def gsm8k_id(question: str, final: str) -> str:
  """A GSM8K example's id: a hash of its question and final answer."""
  digest = hashlib.sha256(f'{question}\0{final}'.encode('utf-8'))
  return f'gsm8k-{digest.hexdigest()[:12]}'


@dataclasses.dataclass(frozen=True, kw_only=True)
class Gsm8kFormat:
  """GSM8K records `{question, answer}` as shipped.

  `answer` is a worked solution ending in a line `#### <final answer>`. The
  Example's answer is that final answer, stripped (thousands separators such
  as '1,000' are kept: verifiers normalise numbers), and
  `meta['solution']` is the whole solution. A record without '####', or
  with nothing after it, is a bad record.

  The id is 'gsm8k-' and 12 hex digits of the SHA-256 of the question and
  the final answer, so it does not depend on the record's position: it
  survives reordering, filtering and re-sharding of the file. Duplicate
  records (same question and final answer, their worked solutions the same
  or not) therefore share one id, and both stay in the dataset as separate
  examples; the shipped train
  and test files hold no duplicates (and no question of one is in the
  other).

  Attributes:
    template: `str.format` template of the prompt over the record's fields.
  """

  FORMAT: ClassVar[str] = 'gsm8k'
  template: str = GSM8K_TEMPLATE

  def __post_init__(self):
    _template_names(self.template)

  def example(self, record: Mapping[str, Any], *, name: str, index: int,
              where: Where) -> Example:
    """The Example of `record`; `index` is unused (ids are content hashes)."""
    del index
    values = _plain_values(record, where)
    question = _text(record, 'question', 'the question', name=name,
                     where=where)
    solution = _field(record, 'answer', name=name, where=where)
    final = gsm8k_final_answer(solution)
    if final is None:
      raise BadRecordError(
          f"{where()}: field 'answer' has no '#### <final answer>' line"
      )
    if not final:
      raise BadRecordError(
          f"{where()}: field 'answer' has nothing after its last '####'"
      )
    return Example(
        id=gsm8k_id(question, final),
        prompt=_render(self.template, record, values, name=name, where=where),
        answer=final,
        dataset=name,
        meta={'solution': solution},
    )


def squad2_answers(value: Any, where: Where) -> list[str]:
  """The gold texts of a question, in order, duplicates kept: from a list
  of `{'text': ...}` dicts or texts (the JSON file as shipped), or a dict
  of lists `{'text': [...], 'answer_start': [...]}` (Hugging Face's and
  TFDS's `squad_v2`)."""
  try:
    value = plain(value)
    if isinstance(value, Mapping) and 'text' in value:
      value = plain(value['text'])
  except UnicodeDecodeError as e:
    raise BadRecordError(f'{where()}: not valid UTF-8 ({e})') from e
  if not isinstance(value, (list, tuple)):
    raise BadRecordError(
        f"{where()}: field 'answers' must be a list, or a dict with a list "
        f"'text', got {type(value).__name__}"
    )
  texts = []
  for i, answer in enumerate(value):
    text = answer.get('text') if isinstance(answer, Mapping) else answer
    text = plain(text)
    if not isinstance(text, str) or not text.strip():
      raise BadRecordError(
          f"{where()}: answers[{i}] must be non-empty text or a dict with "
          f"non-empty 'text', got {answer!r:.80}"
      )
    texts.append(text)
  return texts


@dataclasses.dataclass(frozen=True, kw_only=True)
class Squad2Format:
  """One SQuAD 2.0 question: fields id, question, context, answers, ...

  A record holds `id`, `question`, `context`, `answers` (a list of
  `{'text': ...}` dicts as shipped, or of texts, or Hugging Face's
  `{'text': [...], 'answer_start': [...]}`), optionally `title` and
  `is_impossible` (a bool; absent means "unanswerable when `answers` is
  empty"). The Example's id is the record's `id`; its answer is the first
  gold text, or for an unanswerable question `UNANSWERABLE`, the reply the
  default template asks for (what a warm start teaches; the `qa` verifier
  accepts any refusal); `meta['answers']` lists
  the distinct gold texts in order and `meta['answerable']` says whether
  there are any; the subset is 'answerable' or 'unanswerable'. As in the
  official SQuAD 2.0 evaluation, a gold that normalises to nothing ('.',
  'the') is dropped, and a question left with none is scored as
  unanswerable (answer `UNANSWERABLE`, `meta['answerable']` False) but
  stays in subset 'answerable', where the official script counts it. A missing
  id, question or context, `answers` that is not a list of texts, or an
  `is_impossible` that contradicts `answers` makes a bad record.

  Attributes:
    template: `str.format` template of the prompt over the fields named in
      `SQUAD2_TEMPLATE_FIELDS`.
  """

  FORMAT: ClassVar[str] = 'squad2'
  template: str = SQUAD2_TEMPLATE

  def __post_init__(self):
    names = _template_names(self.template)
    unknown = sorted(set(_template_fields(self.template))
                     - set(SQUAD2_TEMPLATE_FIELDS))
    if unknown or not names:
      raise ValueError(
          f'squad2 prompt template {self.template!r} may name only '
          f'{", ".join(SQUAD2_TEMPLATE_FIELDS)}'
          + (f' (it names {", ".join(unknown)})' if unknown else
             ' and names none of them')
      )

  def example(self, record: Mapping[str, Any], *, name: str, index: int,
              where: Where) -> Example:
    """The Example of `record`; `index` is unused (ids come from the file)."""
    del index
    values = {
        'id': _text(record, 'id', 'the id', name=name, where=where),
        'question': _text(record, 'question', 'the question', name=name,
                          where=where),
        'context': _text(record, 'context', 'the context', name=name,
                         where=where),
        'title': (_field(record, 'title', name=name, where=where)
                  if record.get('title') is not None else ''),
    }
    if 'answers' not in record:
      raise BadRecordError(
          f"{where()}: record has no field 'answers' (dataset {name!r}; its "
          f'fields: {_keys(record)})'
      )
    texts = squad2_answers(record['answers'], where)
    answerable = bool(texts)
    if record.get('is_impossible') is not None:
      impossible = plain(record['is_impossible'])
      if not isinstance(impossible, bool):
        raise BadRecordError(
            f"{where()}: field 'is_impossible' must be true or false, got "
            f'{impossible!r:.40}'
        )
      if impossible == answerable:
        raise BadRecordError(
            f"{where()}: 'is_impossible' is {json.dumps(impossible)} but "
            f"'answers' has {len(texts)} entries"
        )
    # As in the official evaluation, golds that normalise to nothing ('.',
    # 'the') are dropped; with none left the question is scored as
    # unanswerable (its gold becomes the empty answer there).
    golds = [t for t in dict.fromkeys(texts) if qa.normalize_answer(t)]
    return Example(
        id=values['id'],
        prompt=_render(self.template, record, values, name=name, where=where),
        answer=golds[0] if golds else UNANSWERABLE,
        dataset=name,
        subset='answerable' if answerable else 'unanswerable',
        meta={'answers': golds, 'answerable': bool(golds)},
    )


def make_format(name: str, *, template: str | None = None,
                **fields: Any) -> RecordFormat:
  """The format called `name` (one of FORMATS).

  Args:
    name: 'fields', 'gsm8k' or 'squad2'.
    template: the prompt template; None takes the format's default.
    **fields: `RecordFields` attributes (prompt, answer, id, subset), for
      'fields' only.

  Returns:
    The format.
  """
  if name not in FORMATS:
    raise ValueError(f'record format must be one of {FORMATS}, got {name!r}')
  kwargs = {} if template is None else {'template': template}
  if name == 'fields':
    return RecordFields(**fields, **kwargs)
  if fields:
    raise ValueError(
        f'record format {name!r} does not take {sorted(fields)} (only '
        "format 'fields' does)"
    )
  return (Gsm8kFormat if name == 'gsm8k' else Squad2Format)(**kwargs)


def fields_read(record_format: RecordFormat) -> tuple[str, ...] | None:
  """The record fields (dotted for nested ones) that `record_format` reads,
  or None when it may read any: a columnar file reads only these.

  For 'fields', its field keys and the other fields its template names;
  for 'gsm8k', `question`, `answer` and those of its template; 'squad2'
  reads optional fields too, so None.
  """
  template = _template_fields(record_format.template)
  if isinstance(record_format, RecordFields):
    keys = {record_format.answer, *template - {'prompt'}}
    keys |= {record_format.prompt} if 'prompt' in template else set()
    keys |= {k for k in (record_format.id, record_format.subset) if k}
  elif isinstance(record_format, Gsm8kFormat):
    keys = {'question', 'answer', *template}
  else:
    return None
  return tuple(sorted(keys))


def default_format(kind: str, tfds_name: str | None = None) -> str:
  """The format of a dataset kind when its config names none.

  'gsm8k' and 'squad2' files use their own format, a TFDS dataset of
  `TFDS_BUILDERS` that of its builder, anything else 'fields'.
  """
  if kind in ('gsm8k', 'squad2'):
    return kind
  if kind == 'tfds' and tfds_name:
    return TFDS_BUILDERS.get(re.split('[/:]', tfds_name)[0], 'fields')
  return 'fields'
