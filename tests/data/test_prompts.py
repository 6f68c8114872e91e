"""Tests for the in-memory epoch prompt source."""

from absl.testing import absltest
import numpy as np

from jaxgrpo.data import prompts
from jaxgrpo.typing import Example


def _examples(n):
  return [Example(id=f'd/{i}', prompt=f'{i}+0=', answer=str(i)) for i in range(n)]


class EpochSourceTest(absltest.TestCase):

  def test_every_example_once_per_epoch(self):
    src = prompts.EpochSource(_examples(10), seed=0)
    drawn = [ex.id for ex in src.next_prompts(30)]
    for epoch in range(3):
      self.assertCountEqual(drawn[10 * epoch:10 * (epoch + 1)],
                            [f'd/{i}' for i in range(10)])
    self.assertNotEqual(drawn[:10], drawn[10:20])  # reshuffled each epoch

  def test_state_round_trip_continues_identically(self):
    a = prompts.EpochSource(_examples(7), seed=5)
    a.next_prompts(9)
    a.observe(a.examples[:2], np.ones((2, 4)))
    b = prompts.EpochSource(_examples(7), seed=5)
    b.set_state(a.get_state())
    self.assertEqual([e.id for e in a.next_prompts(12)],
                     [e.id for e in b.next_prompts(12)])
    np.testing.assert_array_equal(a.trials, b.trials)

  def test_state_for_other_dataset_rejected(self):
    a = prompts.EpochSource(_examples(7), seed=5)
    b = prompts.EpochSource(_examples(8), seed=5)
    with self.assertRaisesRegex(ValueError, '7 examples'):
      b.set_state(a.get_state())

  def test_duplicate_ids_rejected(self):
    with self.assertRaisesRegex(ValueError, 'unique'):
      prompts.EpochSource(_examples(3) + _examples(1), seed=0)


if __name__ == '__main__':
  absltest.main()
