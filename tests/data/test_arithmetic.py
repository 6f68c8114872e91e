"""Tests for the built-in arithmetic task."""

from absl.testing import absltest
from absl.testing import parameterized

from jaxgrpo.data import arithmetic


class ArithmeticTest(parameterized.TestCase):

  def test_deterministic_and_seed_dependent(self):
    spec = arithmetic.ArithmeticSpec(seed=3)
    a = arithmetic.make_examples(spec, range(50), name='x')
    b = arithmetic.make_examples(spec, range(50), name='x')
    c = arithmetic.make_examples(
        arithmetic.ArithmeticSpec(seed=4), range(50), name='x')
    self.assertEqual(a, b)
    self.assertNotEqual([e.prompt for e in a], [e.prompt for e in c])
    # An example depends on its index only, not on what else was generated.
    self.assertEqual(arithmetic.make_examples(spec, [17], name='x')[0], a[17])

  @parameterized.parameters('+', '-', '*', '+-*')
  def test_answers_are_correct(self, ops):
    spec = arithmetic.ArithmeticSpec(ops=ops, min_digits=1, max_digits=4)
    for ex in arithmetic.make_examples(spec, range(200), name='t'):
      expr = ex.prompt.rstrip('=')
      op = next(c for c in '+-*' if c in expr[1:])
      a, b = expr.split(op, 1)
      want = {'+': int(a) + int(b), '-': int(a) - int(b),
              '*': int(a) * int(b)}[op]
      self.assertEqual(ex.answer, str(want))
      self.assertGreaterEqual(int(ex.answer), 0)

  def test_digit_range_and_subset_labels(self):
    spec = arithmetic.ArithmeticSpec(min_digits=2, max_digits=3)
    for ex in arithmetic.make_examples(spec, range(200), name='t'):
      a, b = ex.prompt.rstrip('=').split('+')
      self.assertTrue(2 <= len(a) <= 3 and 2 <= len(b) <= 3)
      self.assertEqual(ex.subset, f'{max(len(a), len(b))}d')

  @parameterized.parameters(('none', 0), ('required', 1))
  def test_carry_constraint(self, carries, min_carries):
    spec = arithmetic.ArithmeticSpec(carries=carries, max_digits=3)
    for ex in arithmetic.make_examples(spec, range(200), name='t'):
      a, b = map(int, ex.prompt.rstrip('=').split('+'))
      n = arithmetic.count_carries(a, b, '+')
      self.assertGreaterEqual(n, min_carries)
      if carries == 'none':
        self.assertEqual(n, 0)

  def test_count_carries_by_hand(self):
    self.assertEqual(arithmetic.count_carries(95, 7, '+'), 2)  # 5+7, 9+0+1
    self.assertEqual(arithmetic.count_carries(12, 34, '+'), 0)
    self.assertEqual(arithmetic.count_carries(100, 1, '-'), 2)
    self.assertEqual(arithmetic.count_carries(57, 23, '-'), 0)

  def test_held_out_prompts_are_not_in_train(self):
    train, held_out = arithmetic.split_train_eval(
        arithmetic.ArithmeticSpec(max_digits=2), 3000, 200, name='t')
    self.assertLen(held_out, 200)
    self.assertEmpty({e.prompt for e in train} & {e.prompt for e in held_out})
    self.assertLen({e.id for e in train + held_out}, 3200)

  def test_held_out_impossible_is_a_clear_error(self):
    # 1-digit addition has only 100 distinct problems.
    with self.assertRaisesRegex(ValueError, 'held-out'):
      arithmetic.split_train_eval(
          arithmetic.ArithmeticSpec(max_digits=1), 2000, 50, name='t')

  def test_bad_spec(self):
    with self.assertRaisesRegex(ValueError, 'min_digits'):
      arithmetic.ArithmeticSpec(min_digits=3, max_digits=2)
    with self.assertRaisesRegex(ValueError, 'ops'):
      arithmetic.ArithmeticSpec(ops='/')


class TemplateTest(absltest.TestCase):

  def test_template_words_the_same_problems(self):
    spec = arithmetic.ArithmeticSpec(seed=3)
    plain = arithmetic.make_examples(spec, range(5), name='a')
    worded = arithmetic.make_examples(
        spec, range(5), name='a',
        template='What is {expression}? Reply with the number only.')
    for p, w in zip(plain, worded):
      self.assertEqual(w.prompt, f'What is {p.prompt[:-1]}? Reply with the '
                       'number only.')
      self.assertEqual((w.id, w.answer, w.subset), (p.id, p.answer, p.subset))

  def test_config_rejects_other_fields(self):
    from jaxgrpo import errors  # pylint: disable=g-import-not-at-top
    from jaxgrpo.data import entry  # pylint: disable=g-import-not-at-top
    with self.assertRaisesRegex(errors.ConfigError, r'template=.*\{expression\}'):
      entry.DatasetSection(name='a', kind='arithmetic',
                           template='Q: {question}')


class UnanswerableTest(absltest.TestCase):

  def test_missing_operand_and_refusal(self):
    spec = arithmetic.ArithmeticSpec(seed=4, unanswerable=True)
    plain = arithmetic.make_examples(
        arithmetic.ArithmeticSpec(seed=4), range(20), name='a')
    refuse = arithmetic.make_examples(spec, range(20), name='u')
    for p, u in zip(plain, refuse):
      self.assertRegex(u.prompt, r'^\d+[-+*]\?=$')
      self.assertTrue(p.prompt.startswith(u.prompt[:-2]))
      self.assertEqual((u.answer, u.subset), (arithmetic.REFUSAL,
                                               'unanswerable'))

  def test_negative_subtractions_are_refused(self):
    answer = arithmetic.make_examples(
        arithmetic.ArithmeticSpec(ops='-', max_digits=2, seed=5), range(200),
        name='a')
    refuse = arithmetic.make_examples(
        arithmetic.ArithmeticSpec(ops='-', max_digits=2, seed=6,
                                  unanswerable='negative'), range(200),
        name='u')
    for e in answer:
      a, b = map(int, e.prompt[:-1].split('-'))
      self.assertGreaterEqual(a, b)
      self.assertEqual(e.answer, str(a - b))
    for e in refuse:
      self.assertRegex(e.prompt, r'^\d+-\d+=$')
      a, b = map(int, e.prompt[:-1].split('-'))
      self.assertLess(a, b, e.prompt)
      self.assertEqual((e.answer, e.subset),
                       (arithmetic.REFUSAL, 'unanswerable'))
    # The same cue-free shape: only the operands' order differs.
    self.assertEqual({len(e.prompt) for e in answer} & {
        len(e.prompt) for e in refuse}, {len(e.prompt) for e in refuse})

  def test_bad_unanswerable_mode(self):
    with self.assertRaisesRegex(ValueError, "needs ops='-'"):
      arithmetic.ArithmeticSpec(unanswerable='negative')
    with self.assertRaisesRegex(ValueError, 'must be one of'):
      arithmetic.ArithmeticSpec(unanswerable='maybe')


if __name__ == '__main__':
  absltest.main()
