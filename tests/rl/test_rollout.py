"""Tests for dynamic sampling, driven by a scripted generator.

The scripted generator answers each prompt correctly with a fixed per-example
probability, so the accounting of rounds, drops and surplus is exact and fast.
"""

from absl.testing import absltest
import jax
import numpy as np

from jaxgrpo import verifiers
from jaxgrpo.data import prompts
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.generate.sampler import Completions
from jaxgrpo.rl import rollout as rollout_lib
from jaxgrpo.typing import Example

T = 6
G = 4


class ScriptedGenerator:
  """Answers prompt p correctly with probability `pass_rate[p]`."""

  def __init__(self, tokenizer, examples, pass_rate, seed=0):
    self.num_samples = G
    self.tok = tokenizer
    self.answers = {ex.prompt: ex.answer for ex in examples}
    self.pass_rate = pass_rate
    self.rng = np.random.default_rng(seed)
    self.calls = 0

  def generate(self, params, tokens, mask, rng):
    del params, mask, rng
    self.calls += 1
    rows = []
    for row in tokens:
      prompt = self.tok.decode(row)
      for _ in range(G):
        ok = self.rng.random() < self.pass_rate[prompt]
        text = self.answers[prompt] if ok else self.answers[prompt] + '9'
        rows.append(self.tok.encode(text) + [self.tok.eos_id])
    out = np.zeros((len(rows), T), np.int32)
    m = np.zeros((len(rows), T), bool)
    for i, r in enumerate(rows):
      out[i, :len(r)] = r
      m[i, :len(r)] = True
    return Completions(tokens=out, logps=np.where(m, -0.5, 0.0).astype(np.float32),
                       mask=m, lengths=m.sum(1).astype(np.int32))


def _setup(rates, *, batch_size=2, round_size=3, max_rounds=4, surplus='carry'):
  tok = tokenizer_lib.CharTokenizer()
  examples = [Example(id=f'd/{i}', prompt=f'{i}+0=', answer=str(i), dataset='d')
              for i in range(len(rates))]
  gen = ScriptedGenerator(tok, examples,
                          {ex.prompt: r for ex, r in zip(examples, rates)})
  source = prompts.EpochSource(examples, seed=0)
  cfg = rollout_lib.RolloutConfig(
      batch_size=batch_size, group_size=G, round_size=round_size,
      max_rounds=max_rounds, surplus=surplus, max_prompt_len=8)
  ro = rollout_lib.Rollout(cfg, source, tok, gen, verifiers.get('exact_match'))
  return ro, gen, source


class ClassifyTest(absltest.TestCase):

  def test_by_hand(self):
    rewards = np.array([[1, 1, 1, 1], [0, 0, 0, 0], [0, 1, 0, 1],
                        [.5, .5, .5, .5], [.9, 1, .95, 1]], np.float32)
    informative, easy, hard = rollout_lib.classify(rewards, 1.0, 0.0)
    np.testing.assert_array_equal(informative, [0, 0, 1, 0, 1])
    np.testing.assert_array_equal(easy, [1, 0, 0, 0, 0])
    np.testing.assert_array_equal(hard, [0, 1, 0, 0, 0])
    # With a lower easy threshold the near-perfect group is too easy.
    informative, easy, _ = rollout_lib.classify(rewards, 0.9, 0.0)
    np.testing.assert_array_equal(informative, [0, 0, 1, 0, 0])
    np.testing.assert_array_equal(easy, [1, 0, 0, 0, 1])


class RolloutTest(absltest.TestCase):

  def test_only_informative_groups_are_used(self):
    # Three always right, three always wrong, three mixed.
    ro, gen, source = _setup([1.0] * 3 + [0.0] * 3 + [0.5] * 3,
                             batch_size=3, round_size=9, max_rounds=1)
    res = ro.collect(None, jax.random.key(0))
    m = res.metrics
    self.assertEqual(m['rollout/groups_easy'], 3)
    self.assertEqual(m['rollout/groups_hard'], 3)
    self.assertEqual(m['rollout/prompts_generated'], 9)
    used = {g.example.id for g in res.groups}
    self.assertTrue(used <= {'d/6', 'd/7', 'd/8'})
    for g in res.groups:
      self.assertGreater(np.ptp(g.rewards), 0)
    self.assertAlmostEqual(m['rollout/efficiency'],
                           m['rollout/groups_used'] / 9)
    self.assertEqual(int(source.trials.sum()), 9 * G)  # feedback recorded

  def test_rounds_until_batch_full_and_surplus_carried(self):
    ro, gen, _ = _setup([0.5] * 12, batch_size=4, round_size=3, max_rounds=10)
    res = ro.collect(None, jax.random.key(0))
    # p=0.5, G=4: a group is informative with probability 7/8, so a few
    # rounds of 3 fill 4 groups; whatever exceeded 4 is carried.
    self.assertEqual(res.metrics['rollout/groups_used'], 4)
    self.assertEqual(res.metrics['rollout/rounds'], gen.calls)
    carried = len(ro.carried)
    self.assertEqual(res.metrics['rollout/surplus'], carried)
    calls = gen.calls
    res2 = ro.collect(None, jax.random.key(1))
    self.assertEqual(res2.metrics['rollout/carried_in'], carried)
    self.assertEqual(gen.calls - calls, res2.metrics['rollout/rounds'])
    self.assertEqual(res2.metrics['rollout/cum_groups_used'], 8)

  def test_surplus_drop(self):
    ro, _, _ = _setup([0.5] * 12, batch_size=1, round_size=6, surplus='drop')
    ro.collect(None, jax.random.key(0))
    self.assertEmpty(ro.carried)

  def test_short_batch_is_padded_and_reported(self):
    # Only one example is ever informative; max_rounds stops the step.
    ro, _, _ = _setup([0.5] + [1.0] * 5, batch_size=4, round_size=3,
                      max_rounds=2)
    res = ro.collect(None, jax.random.key(0))
    used = int(res.metrics['rollout/groups_used'])
    self.assertLessEqual(used, 1)
    self.assertEqual(res.metrics['rollout/batch_short'], 4 - used)
    if res.batch is not None:
      batch = res.batch
      self.assertEqual(batch.completion_mask.shape, (4 * G, T))
      self.assertFalse(batch.completion_mask[used * G:].any())
      np.testing.assert_array_equal(batch.advantages[used * G:], 0)

  def test_no_informative_group_gives_no_batch(self):
    ro, _, _ = _setup([1.0] * 4, batch_size=2, round_size=2, max_rounds=3)
    res = ro.collect(None, jax.random.key(0))
    self.assertIsNone(res.batch)
    self.assertEqual(res.metrics['rollout/rounds'], 3)
    self.assertEqual(res.metrics['reward/mean'], 1.0)

  def test_batch_layout_is_prompt_major(self):
    ro, _, _ = _setup([0.5] * 8, batch_size=2, round_size=8, max_rounds=1)
    res = ro.collect(None, jax.random.key(0))
    b = res.batch
    tok = tokenizer_lib.CharTokenizer()
    for i, g in enumerate(res.groups):
      for j in range(G):
        row = i * G + j
        self.assertEqual(tok.decode(b.prompt_tokens[i]), g.example.prompt)
        np.testing.assert_array_equal(b.completion_tokens[row],
                                      g.completion_tokens[j])
      adv = b.advantages[i * G:(i + 1) * G]
      self.assertAlmostEqual(float(adv.mean()), 0.0, places=5)
      np.testing.assert_array_equal(np.sign(adv), np.sign(g.rewards - g.rewards.mean()))


if __name__ == '__main__':
  absltest.main()
