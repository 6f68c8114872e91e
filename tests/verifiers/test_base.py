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

  def test_no_verifier_scores_an_empty_completion_against_an_empty_gold(self):
    # Files refuse such records; an Example built in code may hold one.
    # exact_match scored '' 1 against ''.
    for gold in ('', ' \n'):
      example = Example(id='a/2', prompt='1+1=', answer=gold)
      for name in ('exact_match', 'math', 'qa'):
        for completion in ('', '  ', '\n'):
          self.assertEqual(
              base.as_reward(verifiers.build(name)(completion, example)), 0.0,
              (name, completion, gold))

  def test_a_negative_zero_reward_is_zero(self):
    # -0.0 passed as a reward, and a step whose rewards were all -0.0
    # reported reward/mean -0.0.
    for value in (-0.0, np.float32(-0.0), np.array([-0.0]),
                  base.Verdict(-0.0)):
      reward = base.as_reward(value)
      self.assertEqual(np.copysign(1.0, reward), 1.0, repr(value))
    rewards, _ = base.score_batch(lambda text, ex: -0.0, ['a'], [_EX])
    self.assertFalse(np.signbit(rewards).any())

  def test_unknown_name_lists_known(self):
    with self.assertRaisesRegex(ValueError, 'exact_match'):
      verifiers.get('nope')

  def test_a_notebook_cell_run_again_replaces_its_verifier(self):
    # The same definition again (same module and name) replaces the old (it
    # was `verifier 'cell' is already registered`); another definition under
    # a taken name is refused.
    name = 'test_base_cell'
    # pylint: disable-next=protected-access
    self.addCleanup(base._REGISTRY.pop, name)
    for value in (0.25, 0.5):

      def cell(text, example, value=value):
        del text, example
        return value

      verifiers.register(name)(cell)
      self.assertEqual(verifiers.get(name)('x', _EX), value)

    def renamed(text, example):  # the cell edited: it was refused
      del text, example
      return 0.75

    verifiers.register(name)(renamed)
    self.assertEqual(verifiers.get(name)('x', _EX), 0.75)
    with self.assertRaisesRegex(ValueError, "'exact_match' is already"):
      verifiers.register('exact_match')(cell)

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

  def test_results_that_are_rewards(self):
    for value, reward in [
        (True, 1.0), (False, 0.0), (1, 1.0), (np.float32(0.25), 0.25),
        (np.bool_(True), 1.0), (np.array(0.5), 0.5), (np.array([[0.5]]), 0.5),
        (base.Verdict(np.float64(0.75), {'why': 'x'}), 0.75)]:
      with self.subTest(value=value):
        out = base.score_one(lambda t, e, v=value: v, 'x', _EX, None)
        self.assertEqual((out.kind, out.reward), ('ok', reward))

  def test_results_that_are_not_rewards_score_zero(self):
    class BadFloat(float):

      def __float__(self):
        raise RuntimeError('no float')

    for value in ['0.7', '1', None, b'1', np.array([0.5, 0.5]),
                  np.array(['1']), 10**400, BadFloat(0.5),
                  base.Verdict('1')]:
      with self.subTest(value=value):
        out = base.score_one(lambda t, e, v=value: v, 'x', _EX, None)
        self.assertEqual((out.kind, out.reward), ('range', 0.0))
        self.assertTrue(out.message.startswith('returned '), out.message)

  def test_any_exit_from_a_verifier_is_an_error(self):
    for exc in [SystemExit(0), SystemExit(3), GeneratorExit(),
                ArithmeticError('x')]:
      def verify(text, example, exc=exc):
        raise exc

      with self.subTest(exc=exc):
        out = base.score_one(verify, 'x', _EX, 1.0)
        self.assertEqual((out.kind, out.reward), ('error', 0.0))
        self.assertIn(type(exc).__name__, out.message)

  def test_a_part_returning_text_fails_the_combination(self):
    combined = base.Combined((('a', 1.0, lambda t, e: 1.0),
                              ('b', 1.0, lambda t, e: '1')))
    out = base.score_one(combined, 'x', _EX, None)
    self.assertEqual(out.kind, 'error')
    self.assertIn("part 'b' returned '1': a str is not a number", out.message)

  def test_numpy_values_in_options_and_weights_are_their_values(self):
    # np.float32(0.9) as a weight was 'must be a finite number >= 0', and
    # numpy option values were refused by each verifier's own checks.
    ex = Example(id='t', prompt='', answer='18')
    verify = base.from_config([
        {'name': 'math', 'weight': np.float32(0.75),
         'rel_tol': np.float64(1e-3)},
        {'name': 'format', 'max_words': np.int64(200),
         'weight': np.int64(1)}])
    self.assertEqual(verify('#### 18', ex).reward, 1.0)
    self.assertAlmostEqual(verify('#### 17', ex).reward, 1 / 1.75)  # format's

  def test_length_mismatch(self):
    with self.assertRaisesRegex(ValueError, '2 completions for 1'):
      base.score_batch(verifiers.get('exact_match'), ['a', 'b'], [_EX])


if __name__ == '__main__':
  absltest.main()
