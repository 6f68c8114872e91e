"""Tests for the grounded QA verifier with refusal ('qa')."""

import json
import os
import pickle
import time

from absl.testing import absltest
from absl.testing import parameterized

from jaxgrpo import verifiers
from jaxgrpo.data import sources
from jaxgrpo.example import Example
from jaxgrpo.verifiers import base
from jaxgrpo.verifiers import pool
from jaxgrpo.verifiers import qa

_SQUAD = os.path.join(os.path.dirname(__file__), '..', '..', '..', 'shared',
                      'data', 'squad2', 'cs224n-dev-v2.0.json')

# Answerable, with several golds; unanswerable; answerable from `answer` only.
_ANS = Example(id='q/1', prompt='Where is Normandy?', answer='France',
               meta={'answers': ['France', 'the French Republic', 'France'],
                     'answerable': True})
_UNANS = Example(id='q/2', prompt='Who ruled Normandy in 1600 BC?', answer='',
                 meta={'answers': [], 'answerable': False})
_PLAIN = Example(id='q/3', prompt='When?', answer='10th and 11th centuries')
_NO_GOLD = Example(id='q/4', prompt='Who?', answer='')
# A file's record of format 'fields' marks an unanswerable question so.
_REFUSAL_GOLD = Example(id='q/5', prompt='Who?', answer='unanswerable')
# Every gold normalises to nothing: the official evaluation's gold is then
# the empty answer, an unanswerable question (it could never score 1).
_EMPTY_GOLDS = Example(id='q/7', prompt='Where?', answer='.',
                       meta={'answers': ['.', 'the'], 'answerable': True})
# SQuAD's dev set has 'None' as a gold (of 'How many ...?').
_NONE_GOLD = Example(id='q/6', prompt='How many?', answer='None',
                     meta={'answers': ['None'], 'answerable': True})


def _example(name):
  return {'ans': _ANS, 'unans': _UNANS, 'plain': _PLAIN,
          'no_gold': _NO_GOLD, 'refusal_gold': _REFUSAL_GOLD,
          'none_gold': _NONE_GOLD, 'empty_golds': _EMPTY_GOLDS}[name]


class NormalizeTest(parameterized.TestCase):

  @parameterized.parameters(
      ('The  French Republic.', 'french republic'),
      ('An apple, a pear', 'apple pear'),
      ("Don't", 'dont'),
      ('\u201cNormandy\u2019s\u201d', 'normandys'),  # typographic quotes
      ('thea theatre', 'thea theatre'),  # articles only as whole words
      ('  ', ''),
      ('.', ''),
  )
  def test_normalize_answer(self, text, expected):
    self.assertEqual(qa.normalize_answer(text), expected)

  @parameterized.parameters(
      ('French', 'the French Republic', 2 / 3),  # precision 1, recall 1/2
      ('French Republic of Europe', 'French Republic', 2 / 3),
      ('a b c', 'c b a', 1.0),
      ('Paris', 'France', 0.0),
      ('', '', 1.0),  # both no-answer
      ('France', '.', 0.0),
  )
  def test_f1_score(self, prediction, gold, expected):
    self.assertAlmostEqual(qa.f1_score(prediction, gold), expected)


class QaTest(parameterized.TestCase):

  @parameterized.named_parameters(
      # Extraction.
      ('plain', 'France', 'ans', {}, 1.0, 'France'),
      ('second_gold_articles', 'The French republic!', 'ans', {}, 1.0,
       'The French republic!'),
      ('first_line', '\n\nFrance\nIt lies in Europe.', 'ans', {}, 1.0,
       'France'),
      ('tag', 'Normandy is in France.\n<answer> France </answer>', 'ans', {},
       1.0, 'France'),
      ('last_tag', '<answer>Spain</answer> no: <answer>France</answer>',
       'ans', {}, 1.0, 'France'),
      ('tag_case', '<Answer>France</ANSWER>', 'ans', {}, 1.0, 'France'),
      ('tag_wins_over_marker', 'The answer is Spain. <answer>France</answer>',
       'ans', {}, 1.0, 'France'),
      ('marker_colon', 'Reasoning here.\nFinal answer: France', 'ans', {},
       1.0, 'France'),
      ('marker_is', 'So the answer is France', 'ans', {}, 1.0, 'France'),
      ('marker_bold', 'Thinking.\n**Answer:** France.', 'ans', {}, 1.0,
       'France.'),
      ('marker_next_line', 'Answer:\n\nFrance\nbecause ...', 'ans', {}, 1.0,
       'France'),
      ('last_marker', 'answer: Spain\nanswer: France', 'ans', {}, 1.0,
       'France'),
      ('full', ' France ', 'ans', {'extract': 'full'}, 1.0, 'France'),
      ('full_keeps_reasoning', 'France\nbecause', 'ans', {'extract': 'full'},
       0.0, 'France\nbecause'),
      ('custom_tag', '<final>France</final>', 'ans', {'tag': 'final'}, 1.0,
       'France'),
      ('only_answer_field_is_gold', 'in the 10th and 11th centuries', 'plain',
       {}, 0.0, 'in the 10th and 11th centuries'),
      ('answer_field', '10th and 11th Centuries.', 'plain', {}, 1.0,
       '10th and 11th Centuries.'),
      ('wrong', 'Spain', 'ans', {}, 0.0, 'Spain'),
      ('curly_quotes', 'The answer is \u201cFrance\u201d.', 'ans', {}, 1.0,
       '\u201cFrance\u201d.'),
      # A lead-in after the marker (it was the answer: 'simple: France').
      ('lead_in_colon', 'The answer is simple: France', 'ans', {}, 1.0,
       'France'),
      ('lead_in_easy_to_see', 'So the answer is easy to see: France.', 'ans',
       {}, 1.0, 'France.'),
      ('lead_in_dash', 'The answer is quite simple - France', 'ans', {}, 1.0,
       'France'),
      ('lead_in_next_line', 'The answer is as follows:\n\nFrance', 'ans', {},
       1.0, 'France'),
      ('lead_in_sentence', 'The final answer is below.\n**France**', 'ans',
       {}, 1.0, '**France**'),
      ('lead_in_refusal', 'The answer is simple: the passage does not say.',
       'unans', {}, 1.0, 'the passage does not say.'),
      ('lead_in_alone', 'The answer is simple.', 'ans', {}, 0.0, 'simple.'),
      ('lead_in_then_nothing', 'The answer is as follows:', 'ans', {}, 0.0,
       'as follows:'),
      # Words before a colon are the answer unless they are a lead-in.
      ('answer_before_colon', 'The answer is Spain: France', 'ans', {}, 0.0,
       'Spain: France'),
      ('lead_in_word_starts_answer', 'The answer is this year: France', 'ans',
       {}, 0.0, 'this year: France'),
      ('lead_in_word_glued', 'The answer is clearly: France', 'ans', {}, 0.0,
       'clearly: France'),
      # Refusals.
      ('refusal_unanswerable', 'unanswerable', 'unans', {}, 1.0,
       'unanswerable'),
      ('refusal_tagged', '<answer>Unanswerable.</answer>', 'unans', {}, 1.0,
       'Unanswerable.'),
      ('refusal_dont', "I don't know.", 'unans', {}, 1.0, "I don't know."),
      ('refusal_dont_curly', 'I don\u2019t know', 'unans', {}, 1.0,
       'I don\u2019t know'),
      ('refusal_dont_bare', 'i dont know', 'unans', {}, 1.0, 'i dont know'),
      ('refusal_sentence', 'The context does not say who ruled it.', 'unans',
       {}, 1.0, 'The context does not say who ruled it.'),
      ('refusal_doesnt', "The passage doesn't say.", 'unans', {}, 1.0,
       "The passage doesn't say."),
      ('refusal_isnt_curly', 'It isn\u2019t in the context', 'unans', {},
       1.0, 'It isn\u2019t in the context'),
      ('refusal_cant_exact', "Can't answer", 'unans',
       {'refusal_match': 'exact'}, 1.0, "Can't answer"),
      ('refusal_custom_contraction', 'It is not given', 'unans',
       {'refusal_phrases': ["isn't given"]}, 1.0, 'It is not given'),
      ('refusal_cannot', 'This question cannot be answered from the text',
       'unans', {}, 1.0, 'This question cannot be answered from the text'),
      ('refusal_marker', 'Hmm.\nThe answer is: not answerable', 'unans', {},
       1.0, 'not answerable'),
      ('refusal_partial_word_is_not', 'unanswerableness', 'unans', {}, 0.0,
       'unanswerableness'),
      # Refusals as instruct models word them (they scored 0).
      ('refusal_not_stated', 'It is not stated.', 'unans', {}, 1.0,
       'It is not stated.'),
      ('refusal_not_provided', 'This information is not provided.', 'unans',
       {}, 1.0, 'This information is not provided.'),
      ('refusal_not_given_marker', 'The answer is not given in the passage.',
       'unans', {}, 1.0, 'not given in the passage.'),
      ('refusal_does_not_contain', 'The context does not contain the answer.',
       'unans', {}, 1.0, 'The context does not contain the answer.'),
      ('refusal_unable', 'I am unable to answer.', 'unans', {}, 1.0,
       'I am unable to answer.'),
      ('refusal_never_mentions', 'The passage never mentions it.', 'unans',
       {}, 1.0, 'The passage never mentions it.'),
      ('refusal_insufficient_context', 'Insufficient context.', 'unans', {},
       1.0, 'Insufficient context.'),
      ('refusal_on_answerable', 'unanswerable', 'ans', {}, 0.0,
       'unanswerable'),
      ('hedged_refusal_on_answerable', "France, but I don't know", 'ans',
       {'metric': 'f1'}, 0.0, "France, but I don't know"),
      ('guess_on_unanswerable', 'France', 'unans', {}, 0.0, 'France'),
      ('empty_is_not_refusal', '', 'unans', {}, 0.0, ''),
      ('empty_tag_is_not_refusal', '<answer> </answer>', 'unans', {}, 0.0,
       ''),
      ('no_gold_is_unanswerable', 'no answer', 'no_gold', {}, 1.0,
       'no answer'),
      ('empty_on_no_gold', '', 'no_gold', {}, 0.0, ''),
      ('refusal_on_golds_normalising_to_nothing', 'unanswerable',
       'empty_golds', {}, 1.0, 'unanswerable'),
      ('answer_on_golds_normalising_to_nothing', 'the', 'empty_golds',
       {'metric': 'f1'}, 0.0, 'the'),
      ('refusal_gold_is_unanswerable', "I don't know.", 'refusal_gold', {},
       1.0, "I don't know."),
      ('refusal_gold_own_words', 'Unanswerable', 'refusal_gold', {}, 1.0,
       'Unanswerable'),
      ('guess_on_refusal_gold', 'France', 'refusal_gold', {}, 0.0, 'France'),
      # Whole-answer refusals, and refusals models write (all scored 0).
      ('refusal_na', 'N/A', 'unans', {}, 1.0, 'N/A'),
      ('refusal_na_tagged', '<answer>n/a</answer>', 'unans', {}, 1.0, 'n/a'),
      ('refusal_none', 'None.', 'unans', {}, 1.0, 'None.'),
      ('refusal_unknown_exact', 'Unknown', 'unans',
       {'refusal_match': 'exact'}, 1.0, 'Unknown'),
      ('none_within_is_no_refusal', 'None of them', 'unans', {}, 0.0,
       'None of them'),
      ('unknown_within_is_no_refusal', 'an unknown soldier', 'unans', {}, 0.0,
       'an unknown soldier'),
      ('na_on_answerable', 'N/A', 'ans', {'metric': 'f1'}, 0.0, 'N/A'),
      ('refusal_answers_off', 'N/A', 'unans', {'refusal_answers': []}, 0.0,
       'N/A'),
      ('refusal_no_answer_is_given', 'No answer is given.', 'unans', {}, 1.0,
       'No answer is given.'),
      ('refusal_text_does_not_say', 'The text does not say.', 'unans', {},
       1.0, 'The text does not say.'),
      ('refusal_does_not_specify', 'The passage does not specify.', 'unans',
       {}, 1.0, 'The passage does not specify.'),
      ('refusal_cannot_be_found', 'The answer cannot be found in the context.',
       'unans', {}, 1.0, 'The answer cannot be found in the context.'),
      ('refusal_not_possible', 'It is not possible to answer.', 'unans', {},
       1.0, 'It is not possible to answer.'),
      ('gold_reading_as_refusal', 'None', 'none_gold', {}, 1.0, 'None'),
      ('refusal_of_gold_reading_as_refusal', "I don't know", 'none_gold', {},
       0.0, "I don't know"),
      # A refusal naming the gold is no answer, in F1 too (it scored 0.4).
      ('refusal_with_gold_word_f1', 'France is not mentioned.', 'ans',
       {'metric': 'f1'}, 0.0, 'France is not mentioned.'),
      ('refusal_with_gold_word_exact', 'The passage does not mention France.',
       'ans', {}, 0.0, 'The passage does not mention France.'),
      ('exact_match_refusal', 'unanswerable', 'unans',
       {'refusal_match': 'exact'}, 1.0, 'unanswerable'),
      ('exact_match_refusal_sentence', 'It is unanswerable', 'unans',
       {'refusal_match': 'exact'}, 0.0, 'It is unanswerable'),
      ('custom_phrases', 'Pass.', 'unans', {'refusal_phrases': ['pass']}, 1.0,
       'Pass.'),
      ('custom_phrases_replace_default', 'unanswerable', 'unans',
       {'refusal_phrases': ('pass',)}, 0.0, 'unanswerable'),
      # Metrics.
      ('f1_partial', 'French', 'ans', {'metric': 'f1'}, 2 / 3, 'French'),
      ('f1_best_gold', 'Republic of France', 'ans', {'metric': 'f1'}, 0.5,
       'Republic of France'),
      ('f1_full', 'france', 'ans', {'metric': 'f1'}, 1.0, 'france'),
      ('exact_no_partial_credit', 'French', 'ans', {}, 0.0, 'French'),
  )
  def test_table(self, completion, example, options, reward, extracted):
    verify = verifiers.build('qa', **options)
    example = _example(example)
    verdict = verify(completion, example)
    self.assertIsInstance(verdict, base.Verdict)
    self.assertAlmostEqual(verdict.reward, reward)
    self.assertEqual(verdict.details['extracted'], extracted)
    self.assertEqual(verdict.details['answerable'], example.meta.get(
        'answerable', example is _PLAIN) and example is not _EMPTY_GOLDS)

  def test_a_file_answer_that_normalises_to_nothing_is_an_error(self):
    # A choice letter 'A' (or 'The', '.') in a file of format 'fields':
    # it was an unanswerable question, so a refusal scored 1 and the
    # answer 'A' itself 0, without a word.
    path = os.path.join(self.create_tempdir().full_path, 'mc.jsonl')
    with open(path, 'w') as f:
      for i, answer in enumerate(['A', 'B', 'The', '.', 'unanswerable']):
        f.write(json.dumps({'prompt': f'Q{i}? (A) x (B) y', 'answer': answer})
                + '\n')
    ds = sources.make_dataset('jsonl', name='mc', path=path)
    examples = [ds[i] for i in range(len(ds))]
    for workers in (0, 1):
      with self.assertLogs(level='WARNING') as logs:
        with pool.Scorer({'mc': qa.GroundedQA()}, workers=workers,
                         names={'mc': 'qa'}) as scorer:
          rewards, stats = scorer.score(
              ['A', 'B', 'unanswerable', 'unanswerable', "I don't know"],
              examples)
      self.assertEqual(rewards.tolist(), [0, 1, 0, 0, 1])
      self.assertEqual(stats.errors, 3)
      self.assertEqual(logs.output, [
          'WARNING:jaxgrpo.verifiers.base:verifier qa raised on example '
          'mc/0 (dataset mc): ValueError("gold \'A\' normalises to nothing '
          '(SQuAD drops punctuation, a, an, the): no answer can match it; '
          'use exact_match"); scored 0 (logged once per verifier and kind)'])
    # An Example made in code without an answer stays unanswerable.
    self.assertEqual(qa.GroundedQA()('no answer', _NO_GOLD).reward, 1.0)

  def test_refused_detail(self):
    verify = qa.GroundedQA()
    self.assertTrue(verify('no answer', _ANS).details['refused'])
    self.assertFalse(verify('France', _ANS).details['refused'])

  @parameterized.parameters('France', 'answer: France', '')
  def test_tag_mode_needs_the_tag(self, completion):
    verify = qa.GroundedQA(extract='tag')
    verdict = verify(completion, _ANS)
    self.assertEqual(verdict, base.Verdict(0.0, {'failed': 'no answer tag'}))
    self.assertEqual(verify(f'<answer>{completion}</answer>', _ANS).reward,
                     float(completion == 'France'))

  def test_unclosed_or_reversed_tag_is_no_tag(self):
    verify = qa.GroundedQA(extract='tag')
    for text in ('<answer>France', 'France</answer>',
                 '</answer>France<answer>'):
      self.assertEqual(verify(text, _ANS).details, {'failed': 'no answer tag'})

  @parameterized.parameters(
      ({'extract': 'last'}, 'extract'),
      ({'tag': '<answer>'}, 'tag'),
      ({'tag': ''}, 'tag'),
      ({'refusal_match': 'regex'}, 'refusal_match'),
      ({'metric': 'em'}, 'metric'),
      ({'refusal_phrases': 'unanswerable'}, 'refusal_phrases'),
      ({'refusal_phrases': ['ok', 'the']}, 'refusal_phrases'),
      ({'refusal_phrases': ['ok', 3]}, 'refusal_phrases'),
      ({'strict': True}, 'strict'),
  )
  def test_bad_options(self, options, name):
    with self.assertRaisesRegex(ValueError, name):
      verifiers.build('qa', **options)

  def test_from_config_and_pickle(self):
    verify = base.from_config(
        {'name': 'qa', 'metric': 'f1', 'refusal_phrases': ['pass']})
    self.assertEqual(verify.refusal_phrases, ('pass',))
    clone = pickle.loads(pickle.dumps(verify))
    self.assertEqual(clone, verify)
    self.assertEqual(clone('pass', _UNANS).reward, 1.0)
    self.assertAlmostEqual(clone('French', _ANS).reward, 2 / 3)

  @parameterized.parameters(
      'x' * 10_000,
      '<answer>' * 1_250,
      '</answer>' * 1_100,
      'answer' + ' ' * 10_000 + 'is',
      'the answer is ' * 720,
      'answer:' * 1_430,
      "i don't " * 1_250,
      'a ' * 5_000,
      '\n' * 10_000,
      '.' * 10_000,
  )
  def test_adversarial_input_is_fast(self, text):
    verify = qa.GroundedQA(metric='f1')
    for example in (_ANS, _UNANS):
      start = time.perf_counter()
      verify(text, example)
      verify(f'<answer>{text}</answer>', example)
      self.assertLess((time.perf_counter() - start) / 2, 0.05)


@absltest.skipUnless(os.path.exists(_SQUAD),
                     f'SQuAD 2.0 dev data not found: {_SQUAD}')
class SquadDevTest(absltest.TestCase):
  """Scores the real SQuAD 2.0 dev set's own answers."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    with open(_SQUAD) as f:
      data = json.load(f)
    cls.examples = []
    for article in data['data']:
      for paragraph in article['paragraphs']:
        for q in paragraph['qas']:
          texts = [a['text'] for a in q['answers']]
          cls.examples.append(Example(
              id=q['id'], prompt=q['question'],
              answer=texts[0] if texts else '', dataset='squad2',
              meta={'answers': texts, 'answerable': not q['is_impossible']}))
    cls.answerable = [e for e in cls.examples if e.meta['answerable']]
    cls.unanswerable = [e for e in cls.examples if not e.meta['answerable']]

  def test_counts(self):
    self.assertLen(self.answerable, 2_910)
    self.assertLen(self.unanswerable, 3_168)
    self.assertTrue(all(e.meta['answers'] for e in self.answerable))
    self.assertFalse(any(e.meta['answers'] for e in self.unanswerable))

  def test_no_gold_answer_is_a_refusal(self):
    verify = qa.GroundedQA(refusal_answers=())
    refused = [a for e in self.answerable for a in e.meta['answers']
               if verify.is_refusal(a)]
    self.assertEqual(refused, [])
    # Whole-answer refusals may be golds (golds are matched first: they
    # score 1, test_every_gold_answer_scores_one).
    verify = qa.GroundedQA()
    refused = [a for e in self.answerable for a in e.meta['answers']
               if verify.is_refusal(a)]
    self.assertEqual(refused, ['None'] * 3 + ['unclear'])

  def test_every_gold_answer_scores_one(self):
    # The official SQuAD v2 evaluation drops golds that normalise to nothing;
    # the dev set has three such annotations ('.'), which score 0.
    for options in ({}, {'metric': 'f1'}, {'extract': 'tag'}):
      verify = qa.GroundedQA(**options)
      wrap = '<answer>{}</answer>' if options.get('extract') else '{}'
      scored, blank = 0, []
      for example in self.answerable:
        for gold in example.meta['answers']:
          reward = verify(wrap.format(gold), example).reward
          if qa.normalize_answer(gold):
            self.assertEqual(reward, 1.0, (options, gold, example.id))
            scored += 1
          else:
            self.assertEqual(reward, 0.0)
            blank.append(gold)
      self.assertEqual(scored, 10_049)
      self.assertEqual(blank, ['.'] * 3)

  def test_every_gold_after_a_marker_scores_one(self):
    # No gold starts with what reads as a lead-in ('simple:', 'as follows').
    verify = qa.GroundedQA()
    for example in self.answerable:
      for gold in example.meta['answers']:
        if not qa.normalize_answer(gold):
          continue
        for text in (f'The answer is {gold}.', f'Answer: {gold}',
                     f'The answer is:\n{gold}'):
          self.assertEqual(verify(text, example).reward, 1.0, text)

  def test_refusal_scores_one_only_on_unanswerable(self):
    for verify in (qa.GroundedQA(), qa.GroundedQA(extract='tag'),
                   qa.GroundedQA(metric='f1', refusal_match='exact')):
      for text in ('unanswerable', '<answer>unanswerable</answer>'):
        if verify.extract == 'tag' and '<' not in text:
          continue
        on_unanswerable = sum(verify(text, e).reward for e in self.unanswerable)
        on_answerable = sum(verify(text, e).reward for e in self.answerable)
        self.assertEqual(on_unanswerable, 3_168)
        self.assertEqual(on_answerable, 0)

  def test_an_answer_on_an_unanswerable_question_scores_zero(self):
    # Each unanswerable question gets the gold answer of the nearest earlier
    # answerable question (typically about the same paragraph).
    verify = qa.GroundedQA(metric='f1')
    previous_gold, rewards = 'Normandy', []
    for example in self.examples:
      if example.meta['answerable']:
        previous_gold = example.answer
      else:
        rewards.append(verify(previous_gold, example).reward)
        rewards.append(verify(f'<answer>{previous_gold}</answer>',
                              example).reward)
    self.assertLen(rewards, 2 * 3_168)
    self.assertEqual(sum(rewards), 0)


if __name__ == '__main__':
  absltest.main()
