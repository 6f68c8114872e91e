"""Tests for the gsm8k and squad2 record formats, their files and configs."""

import collections
import json
import os
import random
import re

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from jaxgrpo import config_lib
from jaxgrpo import errors
from jaxgrpo import example as example_lib
from jaxgrpo.configs import demo
from jaxgrpo.data import formats
from jaxgrpo.data import loading
from jaxgrpo.data import entry
from jaxgrpo.data import sources
from jaxgrpo.data import squad2_file
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.verifiers import qa

_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..',
                     '..', 'shared', 'data')
_GSM8K = os.path.join(_DATA, 'gsm8k')
_SQUAD2 = os.path.join(_DATA, 'squad2', 'cs224n-dev-v2.0.json')


def _needs(path: str):
  return absltest.skipUnless(
      os.path.exists(path), f'real data not found: {os.path.normpath(path)}')


def _gsm8k_line(question: str, final: str, steps: str = 'It is so.') -> bytes:
  return json.dumps({'question': question,
                     'answer': f'{steps}\n#### {final}'}).encode()


def _qa(qid: str, question: str, answers=(), **extra) -> dict:
  return dict(id=qid, question=question,
              answers=[{'text': a, 'answer_start': 0} for a in answers],
              is_impossible=not answers, **extra)


def _squad(articles: list) -> dict:
  return {'version': 'v2.0', 'data': articles}


def _article(*paragraphs, title='Topic') -> dict:
  return {'title': title, 'paragraphs': list(paragraphs)}


def _where():
  return 'here:1'


class Gsm8kFormatTest(parameterized.TestCase):

  def test_final_answer_prompt_id_and_meta(self):
    solution = 'Add <<2+3=5>>5.\n#### 1,000 '
    record = {'question': 'How many?', 'answer': solution}
    ex = formats.Gsm8kFormat().example(record, name='gsm', index=7,
                                       where=_where)
    self.assertEqual(ex.answer, '1,000')  # commas kept, spaces stripped
    self.assertEqual(ex.meta, {'solution': solution})
    self.assertEqual(ex.dataset, 'gsm')
    self.assertEqual(ex.prompt, formats.GSM8K_TEMPLATE.format(
        question='How many?'))
    self.assertTrue(ex.prompt.startswith('How many?\n'))
    self.assertIn('####', ex.prompt)
    self.assertRegex(ex.id, '^gsm8k-[0-9a-f]{12}$')
    self.assertEqual(ex.id, formats.gsm8k_id('How many?', '1,000'))
    # The id depends on the content only: not on the index or the steps.
    again = formats.Gsm8kFormat().example(
        {'question': 'How many?', 'answer': 'Other steps.\n####1,000'},
        name='gsm', index=0, where=_where)
    self.assertEqual(again.id, ex.id)
    other = formats.Gsm8kFormat().example(
        {'question': 'How many?', 'answer': '#### 1000'}, name='gsm',
        index=7, where=_where)
    self.assertNotEqual(other.id, ex.id)

  def test_last_marker_wins_and_custom_template(self):
    fmt = formats.Gsm8kFormat(template='Q: {question}\nA:')
    ex = fmt.example({'question': 'q', 'answer': '#### 1\n#### 2'},
                     name='g', index=0, where=_where)
    self.assertEqual((ex.prompt, ex.answer), ('Q: q\nA:', '2'))

  @parameterized.named_parameters(
      ('no_marker', {'question': 'q', 'answer': 'It is 4.'}, "no '####"),
      ('nothing_after', {'question': 'q', 'answer': 'x\n#### '},
       "nothing after its last '####'"),
      ('no_answer', {'question': 'q'}, "no field 'answer'"),
      ('no_question', {'answer': '#### 1'}, "no field 'question'"),
      ('blank_question', {'question': ' ', 'answer': '#### 1'}, 'is empty'),
      ('list_answer', {'question': 'q', 'answer': ['#### 1']},
       "'answer' must be text"),
  )
  def test_bad_records(self, record, message):
    with self.assertRaisesRegex(formats.BadRecordError,
                                f'^here:1: .*{message}'):
      formats.Gsm8kFormat().example(record, name='g', index=0, where=_where)

  @parameterized.parameters('{question', 'a {} b')
  def test_bad_template(self, template):
    with self.assertRaisesRegex(ValueError, 'template'):
      formats.Gsm8kFormat(template=template)


class Squad2FormatTest(parameterized.TestCase):

  def _example(self, record, **kwargs):
    record = dict({'context': 'Paris is in France.', 'title': 'Paris'},
                  **record)
    return formats.Squad2Format(**kwargs).example(record, name='sq', index=3,
                                                  where=_where)

  def test_answerable(self):
    ex = self._example(_qa('a1', 'Where is Paris?',
                           ['France', 'in France', 'France']))
    self.assertEqual(ex.id, 'a1')
    self.assertEqual(ex.answer, 'France')
    self.assertEqual(ex.meta, {'answers': ['France', 'in France'],
                               'answerable': True})
    self.assertEqual(ex.subset, 'answerable')
    self.assertEqual(ex.prompt, formats.SQUAD2_TEMPLATE.format(
        context='Paris is in France.', question='Where is Paris?'))
    json.dumps(dict(ex.meta))  # verifiers get JSON-serialisable extras

  def test_unanswerable_and_plain_text_answers(self):
    ex = self._example(_qa('u1', 'Who built it?'))
    self.assertEqual((ex.answer, ex.subset), ('unanswerable', 'unanswerable'))
    self.assertEqual(ex.meta, {'answers': [], 'answerable': False})
    # Answers as plain texts, no is_impossible: answerable iff any.
    ex = self._example({'id': 'a2', 'question': 'q', 'answers': ['x']})
    self.assertEqual((ex.answer, ex.subset), ('x', 'answerable'))

  def test_golds_that_normalise_to_nothing_are_dropped(self):
    # The official evaluation drops golds that normalise to nothing: a
    # warm start taught '.' (the shortest gold), which never scores.
    ex = self._example(_qa('a4', 'Why?', ['renewal of hostilities', '.']))
    self.assertEqual(ex.meta, {'answers': ['renewal of hostilities'],
                               'answerable': True})
    self.assertEqual(example_lib.shortest_answer(ex), 'renewal of hostilities')
    # None left: scored as unanswerable, as the official script does, in
    # the subset it counts the question in (HasAns).
    ex = self._example(_qa('a5', 'Which?', ['.', 'The']))
    self.assertEqual((ex.answer, ex.subset), ('unanswerable', 'answerable'))
    self.assertEqual(ex.meta, {'answers': [], 'answerable': False})
    self.assertEqual(qa.GroundedQA()('<answer>unanswerable</answer>', ex).reward, 1.0)

  def test_hugging_face_answers_a_dict_of_lists(self):
    # rajpurkar/squad_v2's Parquet files and TFDS squad/v2.0 hold `answers`
    # as columns; every record was bad ('answers' must be a list).
    ex = self._example({'id': 'a3', 'question': 'Where?', 'answers': {
        'text': np.array([b'France', b'in France']),
        'answer_start': np.array([12, 9])}})
    self.assertEqual((ex.answer, ex.subset), ('France', 'answerable'))
    self.assertEqual(ex.meta['answers'], ['France', 'in France'])
    ex = self._example({'id': 'u3', 'question': 'Who?',
                        'answers': {'text': [], 'answer_start': []}})
    self.assertEqual((ex.answer, ex.subset), ('unanswerable', 'unanswerable'))

  def test_template_fields(self):
    ex = self._example(_qa('a1', 'Q?', ['A']),
                       template='[{title}/{id}] {context} | {question}')
    self.assertEqual(ex.prompt, '[Paris/a1] Paris is in France. | Q?')
    with self.assertRaisesRegex(ValueError, 'may name only.*contxt'):
      formats.Squad2Format(template='{contxt} {question}')
    with self.assertRaisesRegex(ValueError, 'names none'):
      formats.Squad2Format(template='Answer:')

  @parameterized.named_parameters(
      ('no_question', dict(id='x', answers=[]), "no field 'question'"),
      ('no_id', dict(question='q', answers=[]), "no field 'id'"),
      ('blank_id', dict(id=' ', question='q', answers=[]), 'is empty'),
      ('no_answers', dict(id='x', question='q'), "no field 'answers'"),
      ('answers_not_list', dict(id='x', question='q', answers='France'),
       "'answers' must be a list"),
      ('answer_without_text', dict(id='x', question='q',
                                   answers=[{'answer_start': 3}]),
       r"answers\[0\] must be"),
      ('impossible_with_answers', dict(id='x', question='q',
                                       answers=[{'text': 'a'}],
                                       is_impossible=True),
       "'is_impossible' is true but 'answers' has 1"),
      ('possible_without_answers', dict(id='x', question='q', answers=[],
                                        is_impossible=False),
       "'is_impossible' is false but 'answers' has 0"),
      ('impossible_not_bool', dict(id='x', question='q', answers=[],
                                   is_impossible='yes'),
       'must be true or false'),
  )
  def test_bad_records(self, record, message):
    with self.assertRaisesRegex(formats.BadRecordError,
                                f'^here:1: .*{message}'):
      self._example(record)

  def test_make_format_and_defaults(self):
    self.assertEqual(formats.make_format('gsm8k'), formats.Gsm8kFormat())
    self.assertEqual(formats.make_format('squad2', template='{question}'),
                     formats.Squad2Format(template='{question}'))
    self.assertEqual(formats.make_format('fields', prompt='q'),
                     formats.RecordFields(prompt='q'))
    with self.assertRaisesRegex(ValueError, 'does not take'):
      formats.make_format('gsm8k', prompt='q')
    with self.assertRaisesRegex(ValueError, 'must be one of'):
      formats.make_format('csv')
    self.assertEqual(
        [formats.default_format(*a) for a in [
            ('gsm8k',), ('squad2',), ('jsonl',), ('tfds', 'jaxgrpo_gsm8k'),
            ('tfds', 'jaxgrpo_squad2/x:1.0.0'), ('tfds', 'gsm8k')]],
        ['gsm8k', 'squad2', 'fields', 'gsm8k', 'squad2', 'fields'])
    with self.assertRaisesRegex(errors.ConfigError,
                                re.escape(str(formats.FORMATS))):
      entry.DatasetSection(name='a', kind='jsonl', path='x', format='csv')


  def test_numpy_float32_values_are_the_numbers_written(self):
    # A TFDS tf.float32 feature comes as np.float32: 1.1 is the float32
    # nearest it, 1.100000023841858 as a Python float.
    record = {'prompt': np.bytes_(b'Halve 2.2'), 'answer': np.float32(1.1),
              'w': np.array([0.1, 2.5], np.float32), 'h': np.float16(0.2)}
    ex = formats.RecordFields(template='{prompt} {w[0]} {h}').example(
        record, name='q', index=0, where=lambda: 'record 0')
    self.assertEqual((ex.prompt, ex.answer), ('Halve 2.2 0.1 0.2', '1.1'))
    self.assertEqual(formats.plain(record['w']), [0.1, 2.5])

class Squad2FileTest(parameterized.TestCase):

  def _file(self, data) -> str:
    path = os.path.join(self.create_tempdir().full_path, 'squad.json')
    with open(path, 'wb') as f:
      f.write(data if isinstance(data, bytes) else json.dumps(data).encode())
    return path

  def test_flattens_in_order_with_context_and_title(self):
    path = self._file(_squad([
        _article({'context': 'c0', 'qas': [_qa('a', 'qa?', ['x']),
                                            _qa('b', 'qb?')]}),
        _article({'context': 'c1', 'qas': [_qa('c', 'qc?', ['y'])]},
                 title='Other'),
    ]))
    src = squad2_file.Squad2File(path)
    self.assertLen(src, 3)
    self.assertEqual([src[i]['id'] for i in range(3)], ['a', 'b', 'c'])
    self.assertEqual((src[2]['context'], src[2]['title']), ('c1', 'Other'))
    self.assertEqual(src.describe(2), f'{path}: data[1].paragraphs[0].qas[0]')
    ds = sources.make_dataset('squad2', name='sq', path=path)
    self.assertEqual([ds[i].subset for i in range(3)],
                     ['answerable', 'unanswerable', 'answerable'])

  def test_bad_entries_raise_on_access_naming_json_path(self):
    good = _qa('ok', 'q?', ['a'])
    path = self._file(_squad([
        _article({'context': 'c', 'qas': [good]}),
        _article({'context': 'c', 'qas': [good, good]},
                 {'context': 'c', 'qas': 'oops'},
                 {'context': 'c', 'qas': [good, good, dict(good, answers={})]}),
        ['not', 'an', 'article'],
        _article({'qas': [good]}),
    ]))
    src = squad2_file.Squad2File(path)
    self.assertLen(src, 9)
    ds = sources.make_dataset('squad2', name='sq', path=path)
    self.assertEqual(ds[0].id, 'ok')
    for index, where, message in [
        (3, 'data[1].paragraphs[1]', "a list 'qas'"),
        (6, 'data[1].paragraphs[2].qas[2]', "'answers' must be a list"),
        (7, 'data[2]', "a list 'paragraphs'"),
        (8, 'data[3].paragraphs[0].qas[0]', "no field 'context'"),
    ]:
      with self.assertRaisesRegex(
          sources.BadRecordError,
          f'^{re.escape(path)}: {re.escape(where)}: .*{message}'):
        ds[index]  # pylint: disable=pointless-statement

  def test_questions_left_without_gold_are_counted_and_logged(self):
    # Golds that SQuAD normalisation empties are dropped (fault 301); a
    # question left with none is scored as unanswerable in subset
    # 'answerable', as the official script does: said when the file loads.
    path = self._file(_squad([_article({'context': 'c', 'qas': [
        _qa('a', 'qa?', ['x']), _qa('dot', 'q1?', ['.', '!']),
        _qa('b', 'qb?', ['y', '.']), _qa('u', 'qu?'),
        _qa('the', 'q2?', ['The', ' the ']),
    ]})]))
    with self.assertLogs('jaxgrpo.data.squad2_file', 'WARNING') as logs:
      src = squad2_file.Squad2File(path)
    self.assertEqual(src.no_gold_left, (
        "data[0].paragraphs[0].qas[1] (id 'dot')",
        "data[0].paragraphs[0].qas[4] (id 'the')"))
    self.assertEqual(src.golds_dropped, 1)
    self.assertLen(logs.output, 1)
    self.assertRegex(logs.output[0], (
        f"{re.escape(path)}: 2 of 5 questions have gold answers that all "
        r"normalise to nothing .*qas\[1\] \(id 'dot'\); .*qas\[4\] "
        r"\(id 'the'\)\. They are scored as unanswerable .*subset "
        r"'answerable'.*HasAns; 1 other questions lost some"))
    ds = sources.make_dataset('squad2', name='sq', path=path)
    self.assertEqual(
        [(ds[i].subset, ds[i].meta['answerable']) for i in (1, 4)],
        [('answerable', False)] * 2)
    with self.assertNoLogs('jaxgrpo.data.squad2_file', 'WARNING'):
      src = squad2_file.Squad2File(self._file(_squad([_article(
          {'context': 'c', 'qas': [_qa('b', 'qb?', ['y', '.'])]})])))
    self.assertEqual((src.no_gold_left, src.golds_dropped), ((), 1))

  @parameterized.named_parameters(
      ('invalid_json', b'{"version": "v2.0",\n "data": [}',
       ':2:11: invalid JSON: Expecting value'),
      ('not_utf8', b'{"data": ["caf\xe9"]}', ': not valid UTF-8'),
      ('a_list', b'[1, 2]', ': not a SQuAD 2.0 file: .*got list'),
      ('no_data', b'{"version": "v2.0"}',
       r": not a SQuAD .*keys \['version'\]"),
      # Hugging Face's squad_v2 as JSON Lines: the reader is named.
      ('json_lines', b'{"id": "a", "question": "q"}\n{"id": "b"}\n',
       ":2:1: invalid JSON: Extra data \\(JSON Lines: .* use kind='jsonl' "
       "with format='squad2'\\)"),
  )
  def test_unreadable_file_names_it(self, data, message):
    path = self._file(data)
    with self.assertRaisesRegex(sources.BadRecordError,
                                f'^{re.escape(path)}{message}'):
      squad2_file.Squad2File(path)


@_needs(_GSM8K)
class Gsm8kRealFileTest(absltest.TestCase):

  def test_counts_answers_and_unique_ids(self):
    for split, count in (('test', 1319), ('train', 7473)):
      ds = sources.make_dataset('gsm8k', name='gsm8k',
                                path=os.path.join(_GSM8K, f'{split}.jsonl'))
      examples = [ds[i] for i in range(len(ds))]
      self.assertLen(examples, count)
      self.assertLen({ex.id for ex in examples}, count)
      self.assertTrue(all(ex.answer and ex.answer == ex.answer.strip()
                          for ex in examples))
      self.assertTrue(all(ex.meta['solution'].rstrip().endswith(ex.answer)
                          for ex in examples))
      if split == 'test':
        self.assertEqual(examples[0].answer, '18')
        self.assertEqual(sum(',' in ex.answer for ex in examples), 14)

  def test_ids_survive_reordering(self):
    path = os.path.join(_GSM8K, 'test.jsonl')
    with open(path, 'rb') as f:
      lines = f.read().splitlines()
    random.Random(0).shuffle(lines)
    shuffled = os.path.join(self.create_tempdir().full_path, 'test.jsonl')
    with open(shuffled, 'wb') as f:
      f.write(b'\n'.join(lines) + b'\n')
    a = sources.make_dataset('gsm8k', name='gsm8k', path=path)
    b = sources.make_dataset('gsm8k', name='gsm8k', path=shuffled)
    by_id = {a[i].id: a[i] for i in range(len(a))}
    self.assertNotEqual(a[0].id, b[0].id)
    self.assertEqual({b[i].id: b[i] for i in range(len(b))}, by_id)


@_needs(_SQUAD2)
class Squad2RealFileTest(absltest.TestCase):

  def test_counts_subsets_and_ids(self):
    with self.assertNoLogs('jaxgrpo.data.squad2_file', 'WARNING'):
      src = squad2_file.Squad2File(_SQUAD2)
    # Three questions have a gold '.' beside real ones; none is left
    # without a gold.
    self.assertEqual((src.no_gold_left, src.golds_dropped), ((), 3))
    ds = sources.make_dataset('squad2', name='squad2', path=_SQUAD2)
    examples = [ds[i] for i in range(len(ds))]
    self.assertLen(examples, 6078)
    self.assertLen({ex.id for ex in examples}, 6078)
    self.assertEqual(collections.Counter(ex.subset for ex in examples),
                     {'answerable': 2910, 'unanswerable': 3168})
    for ex in examples:
      self.assertEqual(ex.meta['answerable'], ex.subset == 'answerable')
      self.assertEqual(ex.answer, (ex.meta['answers'] or ['unanswerable'])[0])
      self.assertLen(set(ex.meta['answers']), len(ex.meta['answers']))
    first = examples[0]
    self.assertEqual((first.id, first.answer),
                     ('68cf05f67fd29c6f129fe2fb9', 'France'))
    self.assertIn('In what country is Normandy located?', first.prompt)
    self.assertIn('The Normans (Norman: Nourmands', first.prompt)


def _config(**entry):
  c = demo.get_config('runlocal')
  c.data.datasets = [dict(name='qa', **entry)]
  return c


def _load(c):
  cfg = config_lib.from_config_dict(c)
  return loading.load_dataset(cfg, cfg.data.datasets[0],
                              tokenizer_lib.CharTokenizer())


class LoadDatasetTest(parameterized.TestCase):
  """Bad records of the new kinds through `loading.load_dataset`."""

  def _gsm8k_file(self) -> str:
    lines = [
        _gsm8k_line('One?', '1'),
        b'{"question": "Two?", "answer": ',  # line 2: invalid JSON
        _gsm8k_line('Three?', '3'),
        b'{"question": "Four?"}',  # line 4: no answer
        b'{"question": "Five?", "answer": "It is 5."}',  # line 5: no ####
        b'{"question": "Caf\xe9?", "answer": "#### 6"}',  # line 6: latin-1
        _gsm8k_line('Seven?', '7,000'),
    ]
    path = os.path.join(self.create_tempdir().full_path, 'gsm8k.jsonl')
    with open(path, 'wb') as f:
      f.write(b'\n'.join(lines) + b'\n')
    return path

  def test_gsm8k_bad_records_error_or_skip(self):
    path = self._gsm8k_file()
    _, ds, _ = _load(_config(kind='gsm8k', path=path))
    self.assertEqual(ds[0].answer, '1')
    for index, message in ((1, 'invalid JSON'), (3, "no field 'answer'"),
                           (4, "no '#### <final answer>'"),
                           (5, 'not valid UTF-8')):
      with self.assertRaisesRegex(
          sources.BadRecordError,
          rf'^data\.datasets\[0\]( \(dataset .qa.\))?: {path}:{index + 1}: '
          f'.*{message}'):
        ds[index]  # pylint: disable=pointless-statement
    with self.assertLogs(level='WARNING') as logs:
      spec, ds, _ = _load(_config(kind='gsm8k', path=path,
                                  on_bad_record='skip'))
    self.assertEqual(spec.skipped_records, 4)
    self.assertEqual([ds[i].answer for i in range(len(ds))],
                     ['1', '3', '7,000'])
    self.assertIn(f'{path}:2: invalid JSON', logs.output[0])

  def test_a_squad2_file_that_does_not_parse_names_the_entry(self):
    # Read whole when opened: its error named the file but not the key.
    path = os.path.join(self.create_tempdir().full_path, 'dev.json')
    with open(path, 'w') as f:
      f.write('{"version": "v2.0", "data": [')
    with self.assertRaisesRegex(
        sources.BadRecordError,
        rf"^data\.datasets\[0\]\.path \(dataset 'qa'\): {path}:1:\d+: "
        'invalid JSON'):
      _load(_config(kind='squad2', path=path))

  def test_gsm8k_format_for_jsonl_and_array_record(self):
    path = self._gsm8k_file()
    out = os.path.join(self.create_tempdir().full_path, 'g.array_record')
    src = sources.JsonlSource(path)
    sources.write_array_record(out, [src[i] for i in (0, 2, 6)])
    _, a, _ = _load(_config(kind='array_record', path=out, format='gsm8k',
                            template='{question}'))
    _, b, _ = _load(_config(kind='jsonl', path=path, format='gsm8k',
                            template='{question}', on_bad_record='skip'))
    self.assertEqual([a[i] for i in range(3)], [b[i] for i in range(3)])
    self.assertEqual(a[2].prompt, 'Seven?')

  def test_squad2_bad_entry_error_or_skip(self):
    path = os.path.join(self.create_tempdir().full_path, 'squad.json')
    with open(path, 'w') as f:
      json.dump(_squad([_article({'context': 'Ctx.', 'qas': [
          _qa('a', 'Q1?', ['Ans']), {'id': 'b', 'answers': []},
          _qa('c', 'Q3?'), dict(_qa('d', 'Q4?'), is_impossible=False),
      ]})]), f)
    _, ds, _ = _load(_config(kind='squad2', path=path))
    with self.assertRaisesRegex(
        sources.BadRecordError,
        rf"^data\.datasets\[0\]: {path}: "
        r"data\[0\]\.paragraphs\[0\]\.qas\[1\]: .*'question'"):
      ds[1]  # pylint: disable=pointless-statement
    with self.assertLogs(level='WARNING') as logs:
      spec, ds, _ = _load(_config(kind='squad2', path=path,
                                  on_bad_record='skip'))
    self.assertEqual(spec.skipped_records, 2)
    self.assertEqual([ds[i].id for i in range(len(ds))], ['a', 'c'])
    self.assertIn(r'data[0].paragraphs[0].qas[3]', logs.output[0])

  def test_holdout_with_skip(self):
    path = self._gsm8k_file()  # 7 records; 1, 3, 4 and 5 are bad
    with self.assertLogs(level='WARNING'):
      spec, ds, held = _load(_config(kind='gsm8k', path=path, holdout=2,
                                     on_bad_record='skip'))
    # Records 0 and 3 (= 1 * 7 // 2) are held out; 3 is bad, so only 0 is
    # left to evaluate; training keeps the good ones of the others.
    self.assertEqual([ex.answer for ex in held], ['1'])
    self.assertEqual([ds[i].answer for i in range(len(ds))], ['3', '7,000'])
    self.assertEqual(spec.skipped_records, 3)

  @_needs(_GSM8K)
  def test_holdout_of_a_real_file(self):
    path = os.path.join(_GSM8K, 'test.jsonl')
    _, ds, held = _load(_config(kind='gsm8k', path=path, holdout=100,
                                num_eval=100))
    self.assertLen(ds, 1219)
    self.assertLen(held, 100)
    train_ids = {ds[i].id for i in range(len(ds))}
    self.assertLen(train_ids, 1219)
    self.assertEmpty(train_ids & {ex.id for ex in held})
    full = sources.make_dataset('gsm8k', name='qa', path=path)
    self.assertEqual(held[1], full[13])  # 1 * 1319 // 100
    # num_eval caps what is evaluated; the rest of the holdout is not trained.
    _, ds, held = _load(_config(kind='gsm8k', path=path, holdout=100,
                                num_eval=10))
    self.assertEqual((len(ds), len(held)), (1219, 10))

  def test_a_glob_match_that_cannot_be_read_is_named(self):
    # It said `Is a directory`, naming the pattern alone.
    folder = self.create_tempdir().full_path
    with open(os.path.join(folder, 'a.jsonl'), 'wb') as f:
      f.write(_gsm8k_line('One?', '1') + b'\n')
    os.mkdir(os.path.join(folder, '0.jsonl'))  # read first
    for kind in ('gsm8k', 'squad2'):
      pattern = os.path.join(folder, '*.jsonl')
      with self.assertRaisesRegex(errors.DataError, re.escape(
          f"data.datasets[0].path='{pattern}' (dataset 'qa'): "
          f'{folder}/0.jsonl: Is a directory')):
        _load(_config(kind=kind, path=pattern))
    with self.assertRaisesRegex(errors.DataError, re.escape(
        f"data.datasets[0].path='{folder}/0.jsonl' (dataset 'qa'): Is a "
        'directory')):
      _load(_config(kind='gsm8k', path=f'{folder}/0.jsonl'))

  def test_holdout_must_leave_records_to_train(self):
    path = self._gsm8k_file()
    with self.assertRaisesRegex(errors.ConfigError,
                                r"'qa': holdout=7 must be less .*\(7\)"):
      _load(_config(kind='gsm8k', path=path, holdout=7))

  def test_template_that_does_not_fit_is_a_config_error(self):
    with self.assertRaisesRegex(errors.ConfigError,
                                "'qa': template='{cntext}'.*may name only"):
      _load(_config(kind='squad2', path='x.json', template='{cntext}'))


class DatasetConfigTest(parameterized.TestCase):

  def test_defaults(self):
    cfg = config_lib.from_config_dict(_config(kind='gsm8k', path='g.jsonl'))
    entry = cfg.data.datasets[0]
    self.assertEqual((entry.format, entry.template, entry.holdout),
                     (None, None, 0))

  @parameterized.named_parameters(
      ('unknown_format', dict(kind='jsonl', path='x', format='csv'),
       r"format='csv': must be one of"),
      ('format_of_other_kind', dict(kind='gsm8k', path='x', format='squad2'),
       r"format='squad2': must be None or 'gsm8k'"),
      ('field_key_for_gsm8k', dict(kind='gsm8k', path='x', prompt_field='q'),
       r"prompt_field='q': applies to format='fields' only"),
      ('field_key_for_squad2_format', dict(kind='jsonl', path='x',
                                           format='squad2', id_field='qid'),
       r"id_field='qid': applies to format='fields' only"),
      ('negative_holdout', dict(kind='gsm8k', path='x', holdout=-1),
       r'holdout=-1: must be >= 0'),
      ('holdout_and_eval_path', dict(kind='squad2', path='x', eval_path='y',
                                     holdout=5),
       r'holdout=5: needs no eval_path'),
      ('holdout_and_eval_split', dict(kind='tfds', tfds_name='jaxgrpo_gsm8k',
                                      eval_split='test', holdout=5),
       r'holdout=5: needs no eval_path or eval_split'),
      ('holdout_for_arithmetic', dict(kind='arithmetic', holdout=5),
       r"holdout=5: does not apply to kind='arithmetic'"),
      ('squad2_needs_path', dict(kind='squad2'), r"path=None: is required"),
      # A key of another kind: read by nothing, it passed without a word.
      ('arithmetic_key_on_a_file', dict(kind='jsonl', path='x', num_train=5),
       r"num_train=5: does not apply to kind='jsonl'"),
      ('file_key_on_arithmetic', dict(kind='arithmetic', path='x.jsonl'),
       r"path='x.jsonl': does not apply to kind='arithmetic'"),
      ('eval_path_on_arithmetic', dict(kind='arithmetic', eval_path='y'),
       r"eval_path='y': does not apply to kind='arithmetic'"),
      ('tfds_key_on_a_file', dict(kind='jsonl', path='x', eval_split='test'),
       r"eval_split='test': does not apply to kind='jsonl'"),
      ('file_key_on_tfds', dict(kind='tfds', tfds_name='jaxgrpo_gsm8k',
                                eval_path='y'),
       r"eval_path='y': does not apply to kind='tfds'"),
  )
  def test_bad_entries_name_the_key(self, entry, message):
    with self.assertRaisesRegex(errors.ConfigError,
                                rf'^data\.datasets\[0\]\.{message}'):
      config_lib.from_config_dict(_config(**entry))

  def test_field_keys_of_a_tfds_builder_with_its_own_format(self):
    c = _config(kind='tfds', tfds_name='jaxgrpo_squad2', subset_field='x')
    with self.assertRaisesRegex(  # When the config is read, before loading.
        errors.ConfigError,
        r"^data\.datasets\[0\]\.subset_field='x': applies to format='fields'"):
      config_lib.from_config_dict(c)


if __name__ == '__main__':
  absltest.main()
