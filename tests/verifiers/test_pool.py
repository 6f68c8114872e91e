"""Tests for the verifier worker pool: timeouts, errors and crashes."""

import time

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from jaxgrpo.example import Example
from jaxgrpo.verifiers import base
from jaxgrpo.verifiers import pool
from tests import flaky_verifiers


def _examples(n, dataset='d'):
  return [Example(id=f'{dataset}/{i}', prompt='p', answer='a', dataset=dataset)
          for i in range(n)]


class ScorerTest(parameterized.TestCase):

  @parameterized.parameters(0, 2)
  def test_scores_match_inline_scoring(self, workers):
    texts = ['ok', 'no', 'half', 'ok'] * 25
    with pool.Scorer({'d': flaky_verifiers.Flaky()}, workers=workers,
                     timeout_s=5.0) as scorer:
      rewards, stats = scorer.score(texts, _examples(len(texts)))
    np.testing.assert_array_equal(rewards, [1, 0, 0.5, 1] * 25)
    self.assertEqual((stats.errors, stats.out_of_range, stats.timeouts),
                     (0, 0, 0))

  @parameterized.parameters(0, 2)
  def test_failures_score_zero_and_are_counted(self, workers):
    texts = ['ok', 'raise', 'big', 'nan', 'sleep', 'ok']
    start = time.monotonic()
    with pool.Scorer({'d': flaky_verifiers.Flaky()}, workers=workers,
                     timeout_s=0.5) as scorer:
      rewards, stats, outcomes = scorer.score(
          texts, _examples(len(texts)), with_details=True)
    np.testing.assert_array_equal(rewards, [1, 0, 0, 0, 0, 1])
    self.assertEqual(stats.errors, 1)
    self.assertEqual(stats.out_of_range, 2)
    self.assertEqual(stats.timeouts, 1)
    self.assertEqual([o.kind for o in outcomes],
                     ['ok', 'error', 'range', 'range', 'timeout', 'ok'])
    self.assertLess(time.monotonic() - start, 10.0)  # not the 30 s sleep

  def test_call_stuck_in_c_is_killed_and_the_batch_completes(self):
    texts = ['ok', 'stuck', 'ok', 'ok', 'stuck', 'ok', 'ok', 'ok']
    with pool.Scorer({'d': flaky_verifiers.Flaky()}, workers=2,
                     timeout_s=0.3) as scorer:
      start = time.monotonic()
      rewards, stats = scorer.score(texts, _examples(len(texts)))
      elapsed = time.monotonic() - start
      self.assertEqual(scorer.restarts, 2)
      self.assertEqual(scorer.workers, 2)
      # The replacement workers score the next batch normally.
      again, _ = scorer.score(['ok'] * 4, _examples(4))
    np.testing.assert_array_equal(rewards, [1, 0, 1, 1, 0, 1, 1, 1])
    self.assertEqual(stats.timeouts, 2)
    self.assertLess(elapsed, 20.0)
    np.testing.assert_array_equal(again, [1] * 4)

  def test_a_dying_worker_is_replaced(self):
    texts = ['ok', 'die', 'ok', 'half']
    with pool.Scorer({'d': flaky_verifiers.Flaky()}, workers=1,
                     timeout_s=5.0) as scorer:
      rewards, stats = scorer.score(texts, _examples(len(texts)))
      self.assertEqual(scorer.restarts, 1)
    np.testing.assert_array_equal(rewards, [1, 0, 1, 0.5])
    self.assertEqual(stats.errors, 1)

  def test_each_dataset_uses_its_own_verifier(self):
    verifiers = {'a': base.get('exact_match'), 'b': flaky_verifiers.Flaky()}
    examples = _examples(2, 'a') + _examples(2, 'b')
    with pool.Scorer(verifiers, workers=1) as scorer:
      rewards, _ = scorer.score(['a', 'ok', 'ok', 'a'], examples)
    np.testing.assert_array_equal(rewards, [1, 0, 1, 0])

  def test_unknown_dataset_is_an_error(self):
    with pool.Scorer({'a': base.get('exact_match')}) as scorer:
      with self.assertRaisesRegex(ValueError, r"dataset\(s\) \['zz'\]"):
        scorer.score(['x'], _examples(1, 'zz'))

  def test_unpicklable_verifier_is_a_clear_error(self):
    with self.assertRaisesRegex(ValueError, 'verify.workers=0'):
      pool.Scorer({'d': lambda text, example: 1.0}, workers=1)


class FromConfigTest(absltest.TestCase):

  def test_weighted_mean_and_product(self):
    ex = Example(id='x', prompt='p', answer='ok')
    mean = base.from_config([{'name': 'exact_match', 'weight': 3},
                             {'name': 'exact_match', 'weight': 1}])
    self.assertEqual(mean('ok', ex).reward, 1.0)
    mixed = base.from_config({'combine': 'product', 'parts': [
        'exact_match', {'name': 'exact_match'}]})
    self.assertEqual(mixed('no', ex).reward, 0.0)

  def test_errors_name_the_key(self):
    with self.assertRaisesRegex(ValueError, r'verifier\[1\].weight'):
      base.from_config(['exact_match', {'name': 'exact_match', 'weight': -1}])
    with self.assertRaisesRegex(ValueError, "unknown verifier 'nope'"):
      base.from_config('nope')
    with self.assertRaisesRegex(ValueError, 'takes no options'):
      base.from_config({'name': 'exact_match', 'x': 1})
    with self.assertRaisesRegex(ValueError, 'combine'):
      base.from_config({'combine': 'max', 'parts': ['exact_match']})


if __name__ == '__main__':
  absltest.main()
