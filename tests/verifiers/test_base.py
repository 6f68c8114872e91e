"""Tests for the verifier registry and batch scoring."""

from absl.testing import absltest
import numpy as np

from jaxgrpo import verifiers
from jaxgrpo.example import Example
from jaxgrpo.verifiers import base

_EX = Example(id='a/1', prompt='1+1=', answer='2')


class VerifierTest(absltest.TestCase):

  def test_exact_match(self):
    verify = verifiers.get('exact_match')
    self.assertEqual(verify('2', _EX), 1.0)
    self.assertEqual(verify(' 2 ', _EX), 1.0)
    self.assertEqual(verify('22', _EX), 0.0)
    self.assertEqual(verify('', _EX), 0.0)

  def test_unknown_name_lists_known(self):
    with self.assertRaisesRegex(ValueError, 'exact_match'):
      verifiers.get('nope')

  def test_errors_and_out_of_range_score_zero_and_are_counted(self):
    def flaky(text, example):
      if text == 'boom':
        raise RuntimeError('bad')
      if text == 'big':
        return 2.0
      if text == 'nan':
        return float('nan')
      return 0.5

    rewards, stats = base.score_batch(
        flaky, ['ok', 'boom', 'big', 'nan', 'ok'], [_EX] * 5, name='flaky')
    np.testing.assert_array_equal(rewards, [0.5, 0, 0, 0, 0.5])
    self.assertEqual(stats.errors, 1)
    self.assertEqual(stats.out_of_range, 2)

  def test_length_mismatch(self):
    with self.assertRaisesRegex(ValueError, '2 completions for 1'):
      base.score_batch(verifiers.get('exact_match'), ['a', 'b'], [_EX])


if __name__ == '__main__':
  absltest.main()
