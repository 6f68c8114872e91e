"""A SQuAD 2.0 JSON file as shipped, read as one flat record per question.

The records are those `formats.Squad2Format` turns into Examples;
`squad2_features` writes them as flat typed features for TFDS and
ArrayRecord.
"""

from collections.abc import Mapping
import json
import logging
import os
from typing import Any

import numpy as np

from jaxgrpo.data import formats
from jaxgrpo.data import jsonl
from jaxgrpo.verifiers import qa as qa_lib

_LOG = logging.getLogger(__name__)  # `jaxgrpo.*`: the CLIs show them
# Questions named in the log per kind; the counts cover the rest.
_SHOWN = 3


class Squad2File:
  """The questions of a SQuAD 2.0 JSON file, one flat record each.

  A grain RandomAccessDataSource. The file as shipped,
  `{'version': ..., 'data': [articles]}` with articles ->
  `paragraphs` (`context`, `qas`) -> questions, is read and parsed once; record
  i is the i-th question's dict with its paragraph's `context` and its
  article's `title` added, for `formats.Squad2Format`. An article or
  paragraph too broken to list its questions counts as one record that
  raises BadRecordError, as does a question that is not a dict: errors name
  the file and the JSON path, e.g. `data[3].paragraphs[2].qas[5]`.

  Questions with gold answers that SQuAD normalisation empties ('.',
  'the') are counted when the file is read and logged once, as a warning
  naming the first few: those left with no gold are scored as unanswerable
  but stay in subset 'answerable' (`formats.Squad2Format`), as in the
  official evaluation.

  Attributes:
    path: the JSON file.
    no_gold_left: where each question whose gold answers all normalise to
      nothing is, e.g. "data[0].paragraphs[1].qas[2] (id 'q7')".
    golds_dropped: questions that lose some of their golds that way and
      keep others.
  """

  def __init__(self, path: str):
    self.path = os.fspath(path)
    jsonl.check_not_compressed(self.path)
    with open(self.path, 'rb') as f:
      raw = f.read()
    try:
      data = json.loads(raw.decode('utf-8-sig'))
    except UnicodeDecodeError as e:
      raise formats.BadRecordError(f'{self.path}: not valid UTF-8 ({e})') from e
    except json.JSONDecodeError as e:
      # One object per line: the Hugging Face squad_v2 layout, not the file
      # as SQuAD ships it.
      hint = (" (JSON Lines: for one question per line, as Hugging Face's "
              "squad_v2 writes them, use kind='jsonl' with format='squad2')"
              if e.msg == 'Extra data' and e.lineno > 1 and e.colno == 1
              else '')
      raise formats.BadRecordError(
          f'{self.path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}{hint}'
      ) from e
    if not isinstance(data, dict) or not isinstance(data.get('data'), list):
      shape = (f'keys {sorted(data)}' if isinstance(data, dict)
               else type(data).__name__)
      raise formats.BadRecordError(
          f'{self.path}: not a SQuAD 2.0 file: expected a JSON object '
          f'{{"version": ..., "data": [articles]}}, got {shape}'
      )
    self._articles = data['data']
    # (article, paragraph, question) of each record; -1 marks a broken
    # article or paragraph, one record.
    places = []
    for a, article in enumerate(self._articles):
      paragraphs = (article.get('paragraphs')
                    if isinstance(article, dict) else None)
      if not isinstance(paragraphs, list):
        places.append((a, -1, -1))
        continue
      for p, paragraph in enumerate(paragraphs):
        qas = paragraph.get('qas') if isinstance(paragraph, dict) else None
        if not isinstance(qas, list):
          places.append((a, p, -1))
          continue
        places.extend((a, p, q) for q in range(len(qas)))
    self._places = np.asarray(places, np.int32).reshape(-1, 3)
    self.no_gold_left: tuple[str, ...] = ()
    self.golds_dropped = 0
    self._count_empty_golds()

  def _count_empty_golds(self) -> None:
    """Counts the questions with golds that normalise to nothing and logs
    them (records that are bad are left to their access to report)."""
    no_gold, dropped = [], 0
    for index in range(len(self)):
      a, p, q = self._place(index)
      qa = self._articles[a]['paragraphs'][p]['qas'][q] if q >= 0 else None
      if not isinstance(qa, dict) or not qa.get('answers'):
        continue
      try:
        texts = formats.squad2_answers(qa['answers'], lambda: '')
      except formats.BadRecordError:
        continue
      kept = sum(bool(qa_lib.normalize_answer(t)) for t in texts)
      if not kept:
        no_gold.append(f'{self.json_path(index)} (id {qa.get("id")!r:.40})')
      elif kept < len(texts):
        dropped += 1
    self.no_gold_left, self.golds_dropped = tuple(no_gold), dropped
    if no_gold:
      _LOG.warning(
          '%s: %d of %d questions have gold answers that all normalise to '
          "nothing under SQuAD normalisation (such as '.' or 'the'): %s%s. "
          'They are scored as unanswerable (a refusal scores 1, as the '
          "official evaluation's empty gold) and counted in subset "
          "'answerable', as the official evaluation counts them in HasAns; "
          '%d other questions lost some of their golds that way',
          self.path, len(no_gold), len(self), '; '.join(no_gold[:_SHOWN]),
          '; ...' if len(no_gold) > _SHOWN else '', dropped)

  def __len__(self) -> int:
    return len(self._places)

  def __repr__(self) -> str:
    return f'Squad2File({self.path!r}, records={len(self)})'

  def _place(self, index: int) -> tuple[int, int, int]:
    if not -len(self) <= index < len(self):
      raise IndexError(
          f'{self.path}: record {index} out of range ({len(self)} records)'
      )
    a, p, q = (int(i) for i in self._places[index])
    return a, p, q

  def json_path(self, index: int) -> str:
    """The JSON path of record `index`, e.g. 'data[3].paragraphs[2].qas[5]'."""
    a, p, q = self._place(index)
    path = f'data[{a}]'
    if p >= 0:
      path += f'.paragraphs[{p}]'
    if q >= 0:
      path += f'.qas[{q}]'
    return path

  def describe(self, index: int) -> str:
    """`path: data[a].paragraphs[p].qas[q]` of record `index`."""
    return f'{self.path}: {self.json_path(index)}'

  def __getitem__(self, index: int) -> dict[str, Any]:
    a, p, q = self._place(index)
    article = self._articles[a]
    if p < 0:
      raise formats.BadRecordError(
          f"{self.describe(index)}: an article must be an object with a list "
          f"'paragraphs', got {_shape(article)}"
      )
    paragraph = article['paragraphs'][p]
    if q < 0:
      raise formats.BadRecordError(
          f"{self.describe(index)}: a paragraph must be an object with a "
          f"list 'qas', got {_shape(paragraph)}"
      )
    qa = paragraph['qas'][q]
    if not isinstance(qa, dict):
      raise formats.BadRecordError(
          f'{self.describe(index)}: a question must be an object, got '
          f'{type(qa).__name__}'
      )
    record = dict(qa)
    if 'context' in paragraph:
      record['context'] = paragraph['context']
    if 'title' in article:
      record['title'] = article['title']
    return record


def _shape(value: Any) -> str:
  if isinstance(value, dict):
    return f'an object with keys {sorted(value)}'
  return type(value).__name__


def squad2_features(record: Mapping[str, Any]) -> dict[str, Any]:
  """A valid squad2 record as flat typed features (TFDS, ArrayRecord).

  Args:
    record: a record `formats.Squad2Format` accepts.

  Returns:
    {'id', 'title', 'context', 'question': text, 'answers': [texts],
    'is_impossible': bool}; the same Example comes out of it.
  """
  texts = formats.squad2_answers(record['answers'], lambda: 'record')
  impossible = record.get('is_impossible')
  return {
      'id': str(formats.plain(record['id'])),
      'title': str(formats.plain(record.get('title') or '')),
      'context': formats.plain(record['context']),
      'question': formats.plain(record['question']),
      'answers': texts,
      'is_impossible': bool(not texts if impossible is None
                            else formats.plain(impossible)),
  }

