"""Tests for the structure and length verifier ('format')."""

import pickle
import time

from absl.testing import absltest
from absl.testing import parameterized

from jaxgrpo import verifiers
from jaxgrpo.example import Example
from jaxgrpo.verifiers import base
from jaxgrpo.verifiers import format_check

_EX = Example(id='f/1', prompt='Where is Normandy?', answer='France')
_GOOD = '<think>It is in the north.</think>\n<answer>France</answer>'


class FormatTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('think_answer', _GOOD, {'preset': 'think_answer'}, 1.0, []),
      ('tags_option', _GOOD, {'tags': ['think', 'answer']}, 1.0, []),
      ('answer_tag', 'So: <answer>France</answer>.', {'preset': 'answer_tag'},
       1.0, []),
      ('missing_answer', '<think>x</think> France', {'preset': 'think_answer'},
       0.0, ['tag:answer']),
      ('missing_both', 'France', {'preset': 'think_answer'}, 0.0,
       ['tag:think', 'tag:answer']),
      ('wrong_order', '<answer>France</answer><think>x</think>',
       {'preset': 'think_answer'}, 0.0, ['tag:answer']),
      ('overlapping', '<think>x <answer>France</think></answer>',
       {'preset': 'think_answer'}, 0.0, ['tag:answer']),
      ('unclosed', '<think>x</think><answer>France',
       {'preset': 'think_answer'}, 0.0, ['tag:answer']),
      ('close_before_open', '</answer>France<answer>',
       {'preset': 'answer_tag'}, 0.0, ['tag:answer']),
      ('nested_same_tag', '<answer><answer>France</answer>',
       {'preset': 'answer_tag'}, 0.0, ['tag:answer']),
      ('case_sensitive', '<Answer>France</Answer>', {'preset': 'answer_tag'},
       0.0, ['tag:answer']),
      ('empty_content_is_well_formed', '<answer></answer>',
       {'preset': 'answer_tag'}, 1.0, []),
      ('repeated_tag_option', '<step>a</step><step>b</step>',
       {'tags': ('step', 'step')}, 1.0, []),
      ('repeated_tag_once', '<step>a</step>', {'tags': ('step', 'step')}, 0.0,
       ['tag:step']),
      ('partial_tags', '<think>x</think> France',
       {'preset': 'think_answer', 'partial': True}, 0.5, ['tag:answer']),
      ('strict_ok', f'\n {_GOOD} \n', {'preset': 'think_answer',
                                       'strict': True}, 1.0, []),
      ('strict_text_before', f'Sure! {_GOOD}', {'preset': 'think_answer',
                                                'strict': True}, 0.0,
       ['strict']),
      ('strict_text_between', '<think>x</think> so <answer>y</answer>',
       {'preset': 'think_answer', 'strict': True}, 0.0, ['strict']),
      ('strict_text_after', f'{_GOOD} done', {'preset': 'think_answer',
                                              'strict': True}, 0.0,
       ['strict']),
      ('strict_and_missing_tag', '<think>x</think> France',
       {'preset': 'think_answer', 'strict': True, 'partial': True}, 1 / 3,
       ['tag:answer', 'strict']),
      ('min_chars_ok', ' abcd ', {'min_chars': 4}, 1.0, []),
      ('min_chars_short', ' abc  ', {'min_chars': 4}, 0.0, ['min_chars']),
      ('max_chars_ok', 'abcd\n', {'max_chars': 4}, 1.0, []),
      ('max_chars_long', 'abcde', {'max_chars': 4}, 0.0, ['max_chars']),
      ('max_words_ok', ' one two\nthree ', {'max_words': 3}, 1.0, []),
      ('max_words_long', 'one two three four', {'max_words': 3}, 0.0,
       ['max_words']),
      ('regex_found', 'The answer is 42.', {'regex': r'\b\d+\b'}, 1.0, []),
      ('regex_missing', 'The answer is x.', {'regex': r'\b\d+\b'}, 0.0,
       ['regex']),
      ('regex_flags', 'ANSWER: x', {'regex': '(?i)^answer:'}, 1.0, []),
      ('all_fail_partial', 'x' * 20,
       {'preset': 'answer_tag', 'min_chars': 1, 'max_chars': 10,
        'max_words': 0, 'regex': 'y', 'partial': True}, 0.2,
       ['tag:answer', 'max_chars', 'max_words', 'regex']),
      ('all_fail', 'x' * 20,
       {'preset': 'answer_tag', 'max_chars': 10, 'regex': 'y'}, 0.0,
       ['tag:answer', 'max_chars', 'regex']),
  )
  def test_table(self, completion, options, reward, failed):
    verify = verifiers.build('format', **options)
    verdict = verify(completion, _EX)
    self.assertIsInstance(verdict, base.Verdict)
    self.assertAlmostEqual(verdict.reward, reward)
    self.assertEqual(verdict.details, {'failed': failed})

  def test_find_tags_spans(self):
    text = 'a <think>b</think> c <answer>d</answer> e'
    missing, spans = format_check.find_tags(text, ('think', 'answer'))
    self.assertEqual(missing, [])
    self.assertEqual([text[s:e] for s, e in spans],
                     ['<think>b</think>', '<answer>d</answer>'])

  def test_preset_fills_tags(self):
    self.assertEqual(format_check.FormatCheck(preset='think_answer').tags,
                     ('think', 'answer'))
    self.assertEqual(format_check.FormatCheck(tags=['answer']).tags,
                     ('answer',))

  @parameterized.parameters(
      ({'preset': 'xml'}, 'preset'),
      ({'tags': 'answer'}, 'tags'),
      ({'tags': ['think', '<answer>']}, 'tags'),
      ({'tags': ['']}, 'tags'),
      ({'tags': ['answer'], 'preset': 'answer_tag'}, 'preset'),
      ({'strict': True}, 'strict'),
      ({'strict': 'yes', 'tags': ['a']}, 'strict'),
      ({'partial': 1}, 'partial'),
      ({'min_chars': -1}, 'min_chars'),
      ({'min_chars': None}, 'min_chars'),
      ({'max_chars': 2.5}, 'max_chars'),
      ({'max_chars': True}, 'max_chars'),
      ({'min_chars': 5, 'max_chars': 4}, 'max_chars'),
      ({'max_words': -3}, 'max_words'),
      ({'regex': '(unclosed'}, 'regex'),
      ({'regex': 5}, 'regex'),
      ({'max_tokens': 5}, 'max_tokens'),
      ({}, 'no check configured'),  # it scored every completion 1
      ({'partial': True, 'min_chars': 0}, 'no check configured'),
  )
  def test_bad_options(self, options, name):
    with self.assertRaisesRegex(ValueError, name):
      verifiers.build('format', **options)

  def test_combined_with_qa_from_config(self):
    verify = base.from_config([
        {'name': 'qa', 'weight': 0.9},
        {'name': 'format', 'preset': 'think_answer', 'weight': 0.1},
    ])
    self.assertAlmostEqual(verify(_GOOD, _EX).reward, 1.0)
    self.assertAlmostEqual(verify('<answer>France</answer>', _EX).reward, 0.9)
    self.assertAlmostEqual(verify('<think>x</think><answer>Spain</answer>',
                                  _EX).reward, 0.1)
    gate = base.from_config({'combine': 'product', 'parts': [
        'qa', {'name': 'format', 'preset': 'think_answer'}]})
    self.assertEqual(gate('<answer>France</answer>', _EX).reward, 0.0)
    self.assertEqual(gate(_GOOD, _EX).reward, 1.0)

  def test_pickle_keeps_compiled_regex(self):
    verify = format_check.FormatCheck(preset='answer_tag', regex=r'\d')
    clone = pickle.loads(pickle.dumps(verify))
    self.assertEqual(clone, verify)
    self.assertEqual(clone('<answer>1</answer>', _EX).reward, 1.0)
    self.assertEqual(clone('<answer>x</answer>', _EX).details,
                     {'failed': ['regex']})

  @parameterized.parameters(
      'x' * 10_000,
      '<think>' * 1_430,
      '</think><think>' * 660,
      '<think>' * 700 + '</think>' * 620,
      '<answer>x' * 1_100,
      ' ' * 10_000,
      'a ' * 5_000,
      '<' * 10_000,
  )
  def test_adversarial_input_is_fast(self, text):
    verify = format_check.FormatCheck(
        preset='think_answer', strict=True, min_chars=1, max_chars=20_000,
        max_words=100, regex=r'<answer>[^<]*</answer>', partial=True)
    start = time.perf_counter()
    verify(text, _EX)
    verify(text + _GOOD, _EX)
    self.assertLess((time.perf_counter() - start) / 2, 0.05)


if __name__ == '__main__':
  absltest.main()
