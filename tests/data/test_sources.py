"""Tests for the dataset sources: JSONL, ArrayRecord, TFDS and arithmetic."""

import bz2
import functools
import gzip
import importlib.util
import json
import lzma
import os
import pickle
import re
import sys
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from jaxgrpo import errors
from jaxgrpo.data import arithmetic
from jaxgrpo.data import formats
from jaxgrpo.data import jsonl
from jaxgrpo.data import sources
from jaxgrpo.data import squad2_file
from jaxgrpo.example import Example

_HAS_TFDS = importlib.util.find_spec('tensorflow_datasets') is not None

_RECORDS = [
    {'id': 'q7', 'question': '1+1=', 'answer': 2, 'level': 'easy'},
    {'id': 'q8', 'question': 'Why?', 'answer': 'because', 'level': 'hard'},
    {'id': 'q9', 'question': 'Café?', 'answer': '3.5', 'level': 'easy'},
]
_FIELDS = sources.RecordFields(
    prompt='question', id='id', subset='level', template='Q: {prompt}\nA:'
)


def _write(path: str, text: str) -> str:
  with open(path, 'w', encoding='utf-8') as f:
    f.write(text)
  return path


def _jsonl(records) -> str:
  return ''.join(json.dumps(r, ensure_ascii=False) + '\n' for r in records)


@functools.cache
def _tfds_builder_class():
  """A local TFDS builder that reads data.jsonl from its manual_dir."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  class JaxgrpoTestJsonl(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version('1.0.0')
    MANUAL_DOWNLOAD_INSTRUCTIONS = 'Place data.jsonl in the manual dir.'

    def _info(self):
      text = tfds.features.Text()
      return tfds.core.DatasetInfo(
          builder=self,
          features=tfds.features.FeaturesDict({
              'id': text, 'question': text, 'level': text,
              'answer': tfds.features.Scalar(np.int64),
          }),
          disable_shuffling=True,  # keep file order, to compare with JSONL
      )

    def _split_generators(self, dl_manager):
      path = dl_manager.manual_dir / 'data.jsonl'
      return {'train': self._generate_examples(path)}

    def _generate_examples(self, path):
      with path.open() as f:
        for i, line in enumerate(f):
          yield i, json.loads(line)

  return JaxgrpoTestJsonl


class JsonlSourceTest(parameterized.TestCase):

  def test_records_by_index(self):
    path = _write(self.create_tempfile().full_path, _jsonl(_RECORDS))
    src = sources.JsonlSource(path)
    self.assertLen(src, 3)
    self.assertEqual([src[i] for i in (2, 0, 1)],
                     [_RECORDS[2], _RECORDS[0], _RECORDS[1]])
    self.assertEqual(src[-1], _RECORDS[2])
    with self.assertRaisesRegex(IndexError, 'out of range'):
      src[3]  # pylint: disable=pointless-statement

  def test_blank_lines_skipped_and_counted(self):
    text = '\n{"a": 1}\r\n   \n\t\r\n{"a": 2}\n\n{"a": 3}'  # no final newline
    src = sources.JsonlSource(_write(self.create_tempfile().full_path, text))
    self.assertEqual([src[i]['a'] for i in range(len(src))], [1, 2, 3])
    self.assertEqual(src.blank_lines, 4)
    self.assertEqual(src.describe(1).rsplit(':', 1)[1], '5')

  def test_empty_file(self):
    src = sources.JsonlSource(self.create_tempfile().full_path)
    self.assertEmpty(src)

  @parameterized.parameters(
      ('{"a": 1}\n\n{"a": \n', 3, 'invalid JSON'),
      ('{"a": 1}\n[1, 2]\n', 2, 'expected a JSON object'),
      ('\n\n{"a": 1}\n\xff\n', 4, None),
      # Valid JSON that Python's reader refuses: a bad record, not a crash.
      ('{"a": ' + '9' * 5000 + '}\n', 1, 'invalid JSON: Exceeds the limit'),
      ('{"a": ' + '[' * 100_000 + '}\n', 1, 'invalid JSON: maximum recursion'),
      # A key given twice was read as its last value, silently.
      ('{"a": 1}\n{"prompt": "x", "answer": 1, "prompt": "y"}\n', 2,
       "the key 'prompt' appears twice in one object"),
      ('{"a": {"b": 1, "b": 2}}\n', 1, "the key 'b' appears twice"),
  )
  def test_bad_line_names_file_and_line(self, text, line, message):
    path = self.create_tempfile().full_path
    with open(path, 'wb') as f:
      f.write(text.encode('latin-1' if message is None else 'utf-8'))
    src = sources.JsonlSource(path)
    with self.assertRaisesRegex(ValueError, f'{path}:{line}: ') as e:
      src[len(src) - 1]  # pylint: disable=pointless-statement
    if message:
      self.assertIn(message, str(e.exception))

  def test_compressed_files_are_named_with_the_fix(self):
    body = _jsonl(_RECORDS).encode()
    folder = self.create_tempdir().full_path
    for suffix, data, kind, command in (
        ('gz', gzip.compress(body), 'gzip', 'gunzip -k'),
        ('bz2', bz2.compress(body), 'bzip2', 'bunzip2 -k'),
        ('xz', lzma.compress(body), 'xz', 'unxz -k')):
      path = os.path.join(folder, f'x.jsonl.{suffix}')
      with open(path, 'wb') as f:
        f.write(data)
      with self.assertRaisesRegex(
          ValueError, f'^{path}: is {kind}-compressed; decompress it first '
          rf'\({command} {path}\)'):
        sources.JsonlSource(path)
    with self.assertRaisesRegex(ValueError, 'is gzip-compressed'):
      squad2_file.Squad2File(os.path.join(folder, 'x.jsonl.gz'))
    path = os.path.join(folder, 'train.parquet')
    with open(path, 'wb') as f:
      f.write(b'PAR1\x15\x04' + bytes(40) + b'PAR1')
    for read in (sources.JsonlSource, squad2_file.Squad2File):
      with self.assertRaisesRegex(
          ValueError, f"^{path}: is a Parquet file; read it with "
          "kind='parquet' \\(and format='gsm8k' or 'squad2'"):
        read(path)

  def test_utf16_files_are_refused_naming_the_fix(self):
    # Windows PowerShell 5 writes `>` and Out-File as UTF-16 with a byte
    # order mark: line 1 was 'not valid UTF-8', each later line 'invalid
    # JSON: Expecting value (column 1)'.
    folder = self.create_tempdir().full_path
    for encoding in ('utf-16-le', 'utf-16-be'):
      path = os.path.join(folder, f'{encoding}.jsonl')
      with open(path, 'wb') as f:
        f.write(('\ufeff' + _jsonl(_RECORDS)).encode(encoding))
      for read in (sources.JsonlSource, squad2_file.Squad2File):
        with self.assertRaisesRegex(ValueError, re.escape(
            f'{path}: is UTF-16 text (its first bytes are a UTF-16 byte order '
            f'mark); save it as UTF-8 first (iconv -f UTF-16 -t UTF-8 {path} '
            '> OUT)')):
          read(path)

  def test_json_that_is_not_json_lines_is_refused_naming_the_fix(self):
    # Each of its lines was a bad record, 'invalid JSON: Expecting value'
    # and the like, one by one; with on_bad_record='skip' all were skipped.
    folder = self.create_tempdir().full_path
    for text, what, command in (
        (json.dumps(_RECORDS, indent=2), "a JSON array indented over several"
         " lines (its first line is '[' alone)", "'.[]'"),
        ('\ufeff\n' + json.dumps(_RECORDS), 'a JSON array of objects',
         "'.[]'"),
        (json.dumps(_RECORDS).replace('}, ', '},\n'),
         'a JSON array of objects', "'.[]'"),
        ('\n'.join(json.dumps(r, indent=1) for r in _RECORDS),
         "JSON objects indented over several lines (its first line is '{' "
         'alone)', '.')):
      path = _write(os.path.join(folder, 'train.json'), text)
      for kind in ('jsonl', 'gsm8k'):
        with self.assertRaisesRegex(ValueError, re.escape(
            f'{path}: holds {what}, not JSON Lines (one object per line); '
            f'write it as JSON Lines first: jq -c {command} {path} > '
            'OUT.jsonl')):
          sources.make_dataset(kind, name='q', path=path)
    # A first record that is an array on a line of its own stays one bad
    # record of the file.
    for first in ('[1, 2]', '[{"a": 1}]', '[]'):
      path = _write(os.path.join(folder, 'train.jsonl'),
                    first + '\n' + _jsonl(_RECORDS))
      src = sources.JsonlSource(path)
      self.assertEqual(src[1], _RECORDS[0])
      with self.assertRaisesRegex(ValueError, 'expected a JSON object'):
        src[0]  # pylint: disable=pointless-statement

  def test_csv_files_are_refused_naming_the_fix(self):
    # Each line was a bad record ('invalid JSON: Expecting value'); a
    # quoted newline split a row in two.
    folder = self.create_tempdir().full_path
    for name, text, sep in (
        ('qa.csv', '\ufeffprompt,answer\n"two\nlines",1\n', ''),
        ('qa.TSV', 'prompt\tanswer\nx\t1\n', ', sep=chr(9)')):
      path = _write(os.path.join(folder, name), text)
      with self.assertRaisesRegex(ValueError, re.escape(
          f'{path}: is CSV, not JSON Lines (one JSON object per line), and '
          'CSV is not read; write it as JSON Lines first: python -c "import '
          f"pandas; pandas.read_csv('{path}'{sep}).to_json('OUT.jsonl', "
          "orient='records', lines=True, force_ascii=False)\"")):
        sources.make_dataset('jsonl', name='q', path=path)
    # JSON Lines named .csv are read.
    path = _write(os.path.join(folder, 'lines.csv'), _jsonl(_RECORDS))
    self.assertEqual(sources.JsonlSource(path)[2], _RECORDS[2])

  def test_bare_cr_line_ends_are_refused_naming_the_fix(self):
    # Classic Mac OS line ends: the whole file was one bad record, 'invalid
    # JSON: Extra data', and with on_bad_record='skip' none was read.
    folder = self.create_tempdir().full_path
    lines = [json.dumps(r, ensure_ascii=False) for r in _RECORDS]
    path = os.path.join(folder, 'mac.jsonl')
    for text in ('\r'.join(lines) + '\r', '\ufeff' + '\r\r'.join(lines)):
      with open(path, 'wb') as f:
        f.write(text.encode('utf-8'))
      for kind in ('jsonl', 'gsm8k'):
        with self.assertRaisesRegex(ValueError, re.escape(
            f'{path}: ends its lines with a bare CR (classic Mac OS line '
            'ends), so its records read as one line; convert them to '
            f"newlines first: tr '\\r' '\\n' < {path} > OUT.jsonl")):
          sources.make_dataset(kind, name='q', path=path)
    # Later lines so ended are one bad record naming the same fix.
    with open(path, 'wb') as f:
      f.write((lines[0] + '\n' + '\r'.join(lines[1:]) + '\n').encode())
    src = sources.JsonlSource(path)
    self.assertEqual(src[0], _RECORDS[0])
    with self.assertRaisesRegex(formats.BadRecordError, re.escape(
        f'{path}:2: invalid JSON: Extra data (column 72); it ends its lines '
        'with a bare CR')):
      src[1]  # pylint: disable=pointless-statement
    # Windows line ends, and a CR between a record's tokens, are read.
    with open(path, 'wb') as f:
      f.write(('\r\n'.join(lines) + '\r\n{"a":\r 1}\r\n').encode())
    src = sources.JsonlSource(path)
    self.assertEqual([src[i] for i in range(len(src))], _RECORDS + [{'a': 1}])

  def test_long_lines_and_bom(self):
    records = [{'prompt': 'x' * 10_000, 'answer': str(i)} for i in range(3)]
    path = _write(self.create_tempfile().full_path, '\ufeff' + _jsonl(records))
    src = sources.JsonlSource(path)
    self.assertEqual([src[i] for i in range(3)], records)

  def test_a_bom_alone_on_the_first_line_is_a_blank_line(self):
    # It was record 0, 'invalid JSON' at a line that looks empty.
    path = _write(self.create_tempfile().full_path,
                  '\ufeff\r\n' + _jsonl(_RECORDS))
    src = sources.JsonlSource(path)
    self.assertEqual([src[i] for i in range(len(src))], _RECORDS)
    self.assertEqual((src.blank_lines, src.describe(0)), (1, f'{path}:2'))

  def test_pickles(self):
    path = _write(self.create_tempfile().full_path, _jsonl(_RECORDS))
    src = pickle.loads(pickle.dumps(sources.JsonlSource(path)))
    self.assertEqual(src[1], _RECORDS[1])

  def test_a_file_changed_while_read_is_an_error(self):
    # Records are read by the offsets indexed when the file was opened: a
    # file rewritten during a run gave other records under the same ids.
    path = _write(self.create_tempfile().full_path, _jsonl(_RECORDS))
    src = sources.JsonlSource(path)
    pickled = pickle.dumps(src)
    with open(path, 'w') as f:  # in place: the same inode
      f.write(_jsonl(_RECORDS[::-1]))
    with self.assertRaisesRegex(errors.DataError, rf'^{re.escape(path)}: the '
                                'file changed while the run read it'):
      src[0]  # pylint: disable=pointless-statement
    replaced = path + '.new'  # written beside, then renamed over it
    _write(replaced, _jsonl(_RECORDS))
    os.replace(replaced, path)
    with self.assertRaisesRegex(errors.DataError, 'the file changed'):
      pickle.loads(pickled)  # a worker opens the path again

  @settings(max_examples=40, deadline=None)
  @given(lines=st.lists(st.one_of(
      st.integers(0, 99).map(lambda i: json.dumps({'a': i})),
      st.sampled_from(['', ' ', '\t', '\r', '  \r'])), max_size=12),
         final_newline=st.booleans(), scan_bytes=st.integers(1, 40))
  def test_index_matches_splitlines(self, lines, final_newline, scan_bytes):
    # A tiny scan piece puts newlines on piece boundaries.
    text = '\n'.join(lines) + ('\n' if final_newline and lines else '')
    path = os.path.join(self.create_tempdir().full_path, 'x.jsonl')
    with mock.patch.object(jsonl, '_SCAN_BYTES', scan_bytes):
      src = sources.JsonlSource(_write(path, text))
    file_lines = text.split('\n')
    if not file_lines[-1]:  # what follows a final newline is no line
      file_lines.pop()
    want = [json.loads(line) for line in file_lines if line.strip()]
    self.assertEqual([src[i] for i in range(len(src))], want)
    self.assertEqual(src.blank_lines, len(file_lines) - len(want))
    numbers = [n for n, line in enumerate(file_lines, 1) if line.strip()]
    self.assertEqual([src.describe(i) for i in range(len(src))],
                     [f'{path}:{n}' for n in numbers])

  def test_line_numbers_of_errors_read_nothing(self):
    # Skipping many bad records of a large file read the file up to each
    # one to number its line: quadratic (300k lines, 15k bad: 188 s).
    text = '\n\n'.join(json.dumps({'a': i}) for i in range(50)) + '\n'
    src = sources.JsonlSource(_write(self.create_tempfile().full_path, text))
    with mock.patch.object(jsonl.os, 'pread', side_effect=AssertionError):
      self.assertEqual(src.describe(49), f'{src.path}:99')


class MakeDatasetTest(parameterized.TestCase):

  def _jsonl_path(self, records=None):
    return _write(self.create_tempfile().full_path, _jsonl(records or _RECORDS))

  def test_jsonl_fields_template_and_ids(self):
    ds = sources.make_dataset(
        'jsonl', name='qa', path=self._jsonl_path(), record_format=_FIELDS
    )
    self.assertEqual(ds[1], Example(
        id='q8', prompt='Q: Why?\nA:', answer='because', dataset='qa',
        subset='hard'))
    self.assertEqual(ds[0].answer, '2')  # numbers become text
    self.assertEqual(ds[2].prompt, 'Q: Café?\nA:')

  def test_json_numbers_become_text_as_written(self):
    # As floats, 0.00001 became '1e-05' and 2.50 '2.5': an exact_match
    # model was trained to write 1e-05.
    path = self.create_tempfile().full_path
    with open(path, 'w') as f:
      f.write('{"question": "a", "answer": 0.0000001, "id": 1, "n": 1.10}\n'
              '{"question": "b", "answer": 2.50, "id": 2, "n": 1e3}\n'
              '{"question": "c", "answer": 1e3, "id": 3, "n": 1e-7}\n'
              '{"question": "d", "answer": 1e400, "id": 4, "n": 0}\n')
    ds = sources.make_dataset('jsonl', name='qa', path=path,
                              record_format=sources.RecordFields(
                                  prompt='question', id='id',
                                  template='{prompt} {n}'))
    self.assertEqual((ds[0].answer, ds[0].prompt), ('0.0000001', 'a 1.10'))
    self.assertEqual((ds[1].answer, ds[1].prompt), ('2.50', 'b 1000'))
    self.assertEqual((ds[2].answer, ds[2].prompt), ('1000', 'c 0.0000001'))
    with self.assertRaisesRegex(formats.BadRecordError,
                                "field 'answer' must be text or a finite "):
      ds[3]  # pylint: disable=pointless-statement

  def test_a_file_named_with_glob_characters_is_read_as_named(self):
    # 'set[1].jsonl' read set1.jsonl instead, without a word.
    folder = self.create_tempdir().full_path
    named = _write(os.path.join(folder, 'set[1].jsonl'), _jsonl(_RECORDS))
    _write(os.path.join(folder, 'set1.jsonl'),
           _jsonl([{'prompt': 'other', 'answer': '0'}]))
    ds = sources.make_dataset('jsonl', name='qa', path=named,
                              record_format=_FIELDS)
    self.assertLen(ds, len(_RECORDS))
    self.assertEqual(ds[1].id, 'q8')

  def test_template_over_record_fields(self):
    fields = sources.RecordFields(template='[{level}] {question}')
    ds = sources.make_dataset(
        'jsonl', name='qa', path=self._jsonl_path(), record_format=fields
    )
    # The template does not name {prompt}, so no 'prompt' field is needed.
    self.assertEqual(ds[0].prompt, '[easy] 1+1=')

  def test_default_ids_are_stable_and_index_based(self):
    path = self._jsonl_path()
    fields = sources.RecordFields(prompt='question')
    a = sources.make_dataset('jsonl', name='qa', path=path,
                             record_format=fields)
    b = sources.make_dataset('jsonl', name='qa', path=path,
                             record_format=fields)
    self.assertEqual([a[i].id for i in (2, 0, 1)], ['qa/2', 'qa/0', 'qa/1'])
    self.assertEqual([a[i] for i in range(3)], [b[i] for i in range(3)])
    self.assertEqual(a[4], a[1])  # grain wraps indices; ids follow

  @parameterized.parameters(
      (sources.RecordFields(prompt='question', answer='solution'), 'solution'),
      (sources.RecordFields(), 'prompt'),
      (sources.RecordFields(template='{question} {hint}'), 'hint'),
      (sources.RecordFields(prompt='question', subset='split'), 'split'),
  )
  def test_missing_field_names_field_file_and_line(self, fields, field):
    path = _write(self.create_tempfile().full_path,
                  '\n' + _jsonl(_RECORDS[:2]))
    ds = sources.make_dataset('jsonl', name='qa', path=path,
                              record_format=fields)
    with self.assertRaisesRegex(ValueError, f"{path}:3: .*'{field}'"):
      ds[1]  # pylint: disable=pointless-statement

  def test_non_text_field_is_an_error(self):
    path = self._jsonl_path([{'prompt': 'p', 'answer': [1, 2]}])
    ds = sources.make_dataset('jsonl', name='qa', path=path)
    with self.assertRaisesRegex(ValueError, "'answer' must be text"):
      ds[0]  # pylint: disable=pointless-statement

  @parameterized.named_parameters(
      # A template's field: a null, a list, a dict or a bool is no text.
      ('null_in_template', {'hint': None}, 'Q: {prompt} ({hint})',
       "field 'hint' must be text or a number, got NoneType"),
      ('dict_in_template', {'hint': {'a': 1}}, 'Q: {prompt} ({hint})',
       "field 'hint' must be text or a number, got dict"),
      ('list_item', {'hint': [[1]]}, 'Q: {prompt} ({hint[0]})',
       "field 'hint\\[0\\]' must be text or a number, got list"),
      ('bool_prompt', {'prompt': True}, '{prompt}',
       "field 'prompt' must be text or a number, got bool"),
      ('bool_answer', {'answer': False}, '{prompt}',
       "field 'answer' must be text or a number, got bool"),
      ('nan_answer', {'answer': float('nan')}, '{prompt}',
       "field 'answer' must be text or a finite number, got nan"),
      ('lone_surrogate', {'prompt': 'he\ud800llo'}, '{prompt}',
       "field 'prompt' is not valid Unicode \\(surrogates not allowed: "
       "'\\\\ud800' at character 2\\)"),
      ('empty_id', {'id': ' '}, '{prompt}', "field 'id' \\(the id\\) is empty"),
      # An empty completion would match it (exact_match scored '' 1).
      ('empty_answer', {'answer': ''}, '{prompt}',
       "field 'answer' \\(the answer\\) is empty; an unanswerable "
       "question's answer is a refusal such as 'unanswerable'"),
      ('blank_answer', {'answer': ' \t'}, '{prompt}',
       "field 'answer' \\(the answer\\) is empty"),
  )
  def test_values_that_are_no_text_name_the_field(self, record, template,
                                                  message):
    path = _write(self.create_tempfile().full_path, json.dumps(  # \uXXXX
        {'id': 'a', 'prompt': 'p', 'answer': '1', **record}) + '\n')
    ds = sources.make_dataset('jsonl', name='qa', path=path,
                              record_format=sources.RecordFields(
                                  id='id', template=template))
    with self.assertRaisesRegex(ValueError, f'^{path}:1: {message}'):
      ds[0]  # pylint: disable=pointless-statement

  def test_numbers_in_templates_keep_their_format(self):
    path = self._jsonl_path([{'prompt': 'p', 'answer': 2, 'n': 0.5,
                              'meta': {'k': 'v'}}])
    ds = sources.make_dataset('jsonl', name='qa', path=path,
                              record_format=sources.RecordFields(
                                  template='{prompt} {n:.2f} {meta[k]}'))
    self.assertEqual((ds[0].prompt, ds[0].answer), ('p 0.50 v', '2'))
    # A whole float is an int (a Parquet column of ints with nulls is one).
    path = self._jsonl_path([{'prompt': 'p', 'answer': 18.0},
                             {'prompt': 'p', 'answer': 2.5}])
    ds = sources.make_dataset('jsonl', name='qa', path=path)
    self.assertEqual([ds[i].answer for i in range(2)], ['18', '2.5'])

  @parameterized.named_parameters(
      ('empty_field', '{prompt}', {'prompt': ''}, "'prompt' .*is empty"),
      ('blank_field', 'Q: {prompt}', {'prompt': ' \t'}, "'prompt' .*is empty"),
      ('blank_text', '{question}', {'question': '  '}, 'the prompt is empty'),
      ('bad_template', '{question[0]}', {'question': ''}, 'does not fit'),
  )
  def test_unusable_prompt_names_file_and_line(self, template, record,
                                               message):
    path = self._jsonl_path([{'prompt': 'ok', 'question': 'ok', 'answer': 1},
                             dict(record, answer=2)])
    fields = sources.RecordFields(template=template)
    ds = sources.make_dataset('jsonl', name='qa', path=path,
                              record_format=fields)
    self.assertEqual(ds[0].answer, '1')
    with self.assertRaisesRegex(sources.BadRecordError,
                                f'{path}:2: .*{message}'):
      ds[1]  # pylint: disable=pointless-statement

  def test_bad_record_error_is_a_user_error(self):
    # The command line prints a UserError in one line, without a traceback.
    self.assertTrue(issubclass(sources.BadRecordError, errors.UserError))
    self.assertTrue(issubclass(sources.BadRecordError, ValueError))

  @parameterized.parameters('{prompt', 'a {} b', '{prompt!z}x}',
                            '{prompt.upper}', '{meta[k].real}')
  def test_bad_template(self, template):
    with self.assertRaisesRegex(ValueError, 'template'):
      sources.RecordFields(template=template)

  @parameterized.parameters(
      ('Put it in \\boxed{}. {prompt}', '{}'),
      ('Compute \\frac{1}{2} of {prompt}', '{1}'),
      ('Reply as {"answer": 1}. {prompt}', '{"answer"}'))
  def test_braces_meant_as_text_are_a_config_error(self, template, brace):
    # Each was a bad record of every line (or IndexError), never the fix.
    with self.assertRaisesRegex(
        ValueError, f'has {re.escape(brace)}, which names no record field; '
        'write a brace meant as text doubled'):
      sources.RecordFields(template=template)
    doubled = sources.RecordFields(template='\\boxed{{}} {prompt}')
    example = doubled.example({'prompt': 'p', 'answer': '1'}, name='q',
                              index=0, where=lambda: 'f:1')
    self.assertEqual(example.prompt, '\\boxed{} p')

  def test_array_record_round_trip_equals_jsonl(self):
    path = self._jsonl_path()
    src = sources.JsonlSource(path)
    out = os.path.join(self.create_tempdir().full_path, 'qa.array_record')
    self.assertEqual(
        sources.write_array_record(out, (src[i] for i in range(len(src)))), 3
    )
    a = sources.make_dataset('jsonl', name='qa', path=path,
                             record_format=_FIELDS)
    b = sources.make_dataset('array_record', name='qa', path=out,
                             record_format=_FIELDS)
    self.assertLen(b, 3)
    self.assertEqual([b[i] for i in range(3)], [a[i] for i in range(3)])
    self.assertEqual(sources.fingerprint(a), sources.fingerprint(b))

  def test_array_record_bad_record_names_index(self):
    out = os.path.join(self.create_tempdir().full_path, 'bad.array_record')
    sources.write_array_record(out, [{'prompt': 'p', 'answer': 'a'}, {'x': 1}])
    ds = sources.make_dataset('array_record', name='qa', path=out)
    self.assertEqual(ds[0].prompt, 'p')
    with self.assertRaisesRegex(ValueError, f"{out}: record 1: .*'prompt'"):
      ds[1]  # pylint: disable=pointless-statement
    with self.assertRaisesRegex(ValueError, 'record 1 is a list'):
      sources.write_array_record(out, [{'a': 1}, [1]])

  def test_array_record_key_given_twice_names_the_record(self):
    from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
    out = os.path.join(self.create_tempdir().full_path, 'dup.array_record')
    writer = array_record_module.ArrayRecordWriter(out, 'group_size:1')
    writer.write(b'{"prompt": "p", "answer": "a"}')
    writer.write(b'{"prompt": "p", "answer": "a", "answer": "b"}')
    writer.close()
    ds = sources.make_dataset('array_record', name='qa', path=out)
    self.assertEqual(ds[0].answer, 'a')
    with self.assertRaisesRegex(
        ValueError, f"{out}: record 1: the key 'answer' appears twice"):
      ds[1]  # pylint: disable=pointless-statement

  def test_array_record_shards_by_glob(self):
    root = self.create_tempdir().full_path
    for shard in range(2):
      sources.write_array_record(
          os.path.join(root, f'qa-0000{shard}-of-00002'),
          _RECORDS[2 * shard:2 * shard + 2],
      )
    ds = sources.make_dataset('array_record', name='qa',
                              path=os.path.join(root, 'qa-*'),
                              record_format=_FIELDS)
    self.assertEqual([ds[i].id for i in range(len(ds))], ['q7', 'q8', 'q9'])
    # A bad record is named by its shard and its place there (it was the
    # glob and the index over every shard: `qa-*: record 3`).
    sources.write_array_record(os.path.join(root, 'qa-00001-of-00002'),
                               [_RECORDS[2], {'x': 1}])
    ds = sources.make_dataset('array_record', name='qa',
                              path=os.path.join(root, 'qa-*'),
                              record_format=_FIELDS)
    shard = re.escape(os.path.join(root, 'qa-00001-of-00002'))
    with self.assertRaisesRegex(ValueError, f'^{shard}: record 1: '):
      ds[3]  # pylint: disable=pointless-statement

  def test_damaged_array_record_files(self):
    root = self.create_tempdir().full_path
    not_one = _write(os.path.join(root, 'qa.jsonl'), _jsonl(_RECORDS))
    with self.assertRaisesRegex(ValueError, 'not a readable ArrayRecord file '
                                r'\(ArrayRecord file should be at least'):
      sources.make_dataset('array_record', name='qa', path=not_one)
    whole = os.path.join(root, 'qa.array_record')
    sources.write_array_record(whole, [{'prompt': 'p' * 1000, 'answer': 'a'}]
                               * 400)
    with open(whole, 'rb') as f:
      data = f.read()
    cut = _write(os.path.join(root, 'cut.array_record'), '')
    with open(cut, 'wb') as f:
      f.write(data[:len(data) - 300])
    with self.assertRaisesRegex(ValueError, 'not a readable ArrayRecord file'):
      sources.make_dataset('array_record', name='qa', path=cut)

  def test_file_globs_read_sorted_matches_in_order(self):
    root = self.create_tempdir().full_path
    for shard, records in ((1, _RECORDS[2:]), (0, _RECORDS[:2])):
      _write(os.path.join(root, f'qa-{shard}.jsonl'), _jsonl(records))
    ds = sources.make_dataset('jsonl', name='qa', record_format=_FIELDS,
                              path=os.path.join(root, 'qa-*.jsonl'))
    self.assertEqual([ds[i].id for i in range(len(ds))], ['q7', 'q8', 'q9'])
    _write(os.path.join(root, 'qa-2.jsonl'), '{"id": "q10"}\n')
    ds = sources.make_dataset('jsonl', name='qa', record_format=_FIELDS,
                              path=os.path.join(root, 'qa-*.jsonl'))
    with self.assertRaisesRegex(ValueError, f'^{root}/qa-2.jsonl:1: record has '
                                "no field 'question'"):
      ds[3]  # pylint: disable=pointless-statement
    ds = pickle.loads(pickle.dumps(ds))  # grain workers reopen the files
    self.assertEqual(ds[2].id, 'q9')
    with self.assertRaisesRegex(ValueError, 'no file matches the pattern'):
      sources.make_dataset('jsonl', name='qa', path=os.path.join(root, 'x*'))

  def test_home_folder_is_expanded(self):
    home = self.create_tempdir().full_path
    _write(os.path.join(home, 'qa.jsonl'), _jsonl(_RECORDS))
    with mock.patch.dict(os.environ, {'HOME': home}):
      ds = sources.make_dataset('jsonl', name='qa', path='~/qa.jsonl',
                                record_format=_FIELDS)
    self.assertLen(ds, 3)

  @absltest.skipUnless(
      _HAS_TFDS,
      "tensorflow_datasets is not installed (pip install 'jaxgrpo[tfds]')")
  def test_tfds_local_builder_equals_jsonl(self):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

    tfds.disable_progress_bar()
    manual = self.create_tempdir()
    jsonl = _write(os.path.join(manual.full_path, 'data.jsonl'),
                   _jsonl([dict(r, answer=i) for i, r in enumerate(_RECORDS)]))
    data_dir = self.create_tempdir().full_path
    builder = _tfds_builder_class()(data_dir=data_dir,
                                    file_format='array_record')
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
        manual_dir=manual.full_path))
    ds = sources.make_dataset('tfds', name='qa', tfds_name=builder.name,
                              split='train', data_dir=data_dir,
                              record_format=_FIELDS)
    want = sources.make_dataset('jsonl', name='qa', path=jsonl,
                                record_format=_FIELDS)
    self.assertLen(ds, 3)
    self.assertEqual([ds[i] for i in range(3)], [want[i] for i in range(3)])
    with self.assertRaisesRegex(ValueError, 'not prepared'):
      sources.make_dataset('tfds', name='qa', tfds_name=builder.name,
                           data_dir=self.create_tempdir().full_path)

  def test_tfds_missing_is_a_clear_error(self):
    with mock.patch.dict(sys.modules, {'tensorflow_datasets': None}):
      with self.assertRaisesRegex(ImportError, r'jaxgrpo\[tfds\]'):
        sources.make_dataset('tfds', name='qa', tfds_name='x')

  def test_datasets_pickle_for_grain_workers(self):
    path = self._jsonl_path()
    out = os.path.join(self.create_tempdir().full_path, 'qa.array_record')
    sources.write_array_record(out, _RECORDS)
    for ds in (
        sources.make_dataset('jsonl', name='qa', path=path,
                             record_format=_FIELDS),
        sources.make_dataset('array_record', name='qa', path=out,
                             record_format=_FIELDS),
        sources.make_dataset('arithmetic', name='ar', size=5),
    ):
      self.assertEqual(pickle.loads(pickle.dumps(ds))[2], ds[2])

  def test_arithmetic_equals_make_examples(self):
    spec = arithmetic.ArithmeticSpec(ops='+-', max_digits=4, seed=7)
    ds = sources.make_dataset('arithmetic', name='ar', arithmetic=spec,
                              size=50)
    self.assertLen(ds, 50)
    self.assertEqual([ds[i] for i in range(50)],
                     arithmetic.make_examples(spec, range(50), name='ar'))

  def test_size_keeps_first_records(self):
    ds = sources.make_dataset('jsonl', name='qa', path=self._jsonl_path(),
                              record_format=_FIELDS, size=2)
    self.assertEqual([ds[i].id for i in range(len(ds))], ['q7', 'q8'])
    with self.assertRaisesRegex(ValueError, 'size 4 exceeds the 3 records'):
      sources.make_dataset('jsonl', name='qa', path=self._jsonl_path(),
                           size=4)

  def test_gsm8k_and_squad2_kinds_take_only_their_format(self):
    path = self._jsonl_path([{'question': 'q', 'answer': 'x\n#### 4'}])
    ds = sources.make_dataset('gsm8k', name='g', path=path)
    self.assertEqual((ds[0].answer, ds[0].meta), ('4', {
        'solution': 'x\n#### 4'}))
    ds = sources.make_dataset('jsonl', name='g', path=path,
                              record_format=formats.Gsm8kFormat())
    self.assertEqual(ds[0].answer, '4')
    with self.assertRaisesRegex(ValueError, "only the 'gsm8k' record format"):
      sources.make_dataset('gsm8k', name='g', path=path,
                           record_format=_FIELDS)
    with self.assertRaisesRegex(ValueError, "only the 'squad2' record format"):
      sources.make_dataset('squad2', name='s', path=path,
                           record_format=formats.Gsm8kFormat())

  @parameterized.named_parameters(
      ('unknown_kind', dict(kind='csv', path='x'), 'kind must be one of'),
      ('no_path', dict(kind='jsonl'), 'needs a path'),
      ('no_size', dict(kind='arithmetic'), 'needs a size'),
      ('wrong_arg', dict(kind='jsonl', path='x', tfds_name='y'), 'tfds_name'),
      ('no_tfds_name', dict(kind='tfds'), 'needs tfds_name'),
      ('squad2_no_path', dict(kind='squad2'), 'needs a path'),
      ('gsm8k_tfds_name', dict(kind='gsm8k', path='x', tfds_name='y'),
       'tfds_name'),
  )
  def test_bad_arguments(self, kwargs, message):
    with self.assertRaisesRegex(ValueError, message):
      sources.make_dataset(name='d', **kwargs)

  def test_empty_file_is_an_error(self):
    with self.assertRaisesRegex(ValueError, 'no records'):
      sources.make_dataset('jsonl', name='d',
                           path=self.create_tempfile().full_path)

  def test_fingerprint_tracks_content_and_size(self):
    def fp(records):
      return sources.fingerprint(sources.make_dataset(
          'jsonl', name='qa', path=self._jsonl_path(records),
          record_format=_FIELDS))

    base = fp(_RECORDS)
    self.assertEqual(fp(_RECORDS), base)
    self.assertNotEqual(fp(_RECORDS[:2]), base)
    self.assertNotEqual(fp(_RECORDS + [_RECORDS[0]]), base)
    for i in range(3):  # first, middle and last record are all read
      changed = [dict(r) for r in _RECORDS]
      changed[i]['answer'] = 'changed'
      self.assertNotEqual(fp(changed), base)
    ar = functools.partial(sources.make_dataset, 'arithmetic', name='ar')
    self.assertNotEqual(sources.fingerprint(ar(size=10)),
                        sources.fingerprint(ar(size=11)))
    self.assertNotEqual(
        sources.fingerprint(ar(size=10)),
        sources.fingerprint(ar(size=10,
                               arithmetic=arithmetic.ArithmeticSpec(seed=1))))


class SplitHoldoutTest(parameterized.TestCase):

  @parameterized.parameters((10, 3), (10, 9), (7, 1), (1319, 100))
  def test_disjoint_spread_and_sized(self, size, holdout):
    ds = sources.make_dataset('arithmetic', name='ar', size=size)
    train, held = sources.split_holdout(ds, holdout)
    self.assertEqual((len(train), len(held)), (size - holdout, holdout))
    held_ids = [held[i].id for i in range(len(held))]
    train_ids = [train[i].id for i in range(len(train))]
    self.assertEqual(held_ids, [ds[i * size // holdout].id
                                for i in range(holdout)])
    self.assertEmpty(set(held_ids) & set(train_ids))
    self.assertEqual(sorted(held_ids + train_ids),
                     sorted(ds[i].id for i in range(size)))
    self.assertEqual(train_ids, sorted(train_ids, key=lambda x: int(
        x.split('/')[1])))  # file order kept

  def test_index_based_ids_are_file_positions(self):
    path = _write(self.create_tempfile().full_path, _jsonl(_RECORDS * 2))
    ds = sources.make_dataset('jsonl', name='qa', path=path,
                              record_format=sources.RecordFields(
                                  prompt='question'))
    train, held = sources.split_holdout(ds, 2)
    self.assertEqual([held[i].id for i in range(2)], ['qa/0', 'qa/3'])
    self.assertEqual([train[i].id for i in range(4)],
                     ['qa/1', 'qa/2', 'qa/4', 'qa/5'])
    again = pickle.loads(pickle.dumps(train))
    self.assertEqual(again[3], train[3])

  def test_squad2_file(self):
    qa = {'id': 'x', 'question': 'q', 'answers': [], 'is_impossible': True}
    path = _write(self.create_tempfile().full_path, json.dumps({'data': [
        {'title': 't', 'paragraphs': [{'context': 'c', 'qas': [
            dict(qa, id=str(i)) for i in range(5)]}]}]}))
    ds = sources.make_dataset('squad2', name='sq', path=path)
    train, held = sources.split_holdout(ds, 2)
    self.assertEqual([held[i].id for i in range(2)], ['0', '2'])
    self.assertEqual([train[i].id for i in range(3)], ['1', '3', '4'])

  @parameterized.parameters(0, 5, 6, -1)
  def test_out_of_range(self, holdout):
    ds = sources.make_dataset('arithmetic', name='ar', size=5)
    with self.assertRaisesRegex(ValueError, r'holdout must be in \[1, 4\]'):
      sources.split_holdout(ds, holdout)


if __name__ == '__main__':
  absltest.main()
