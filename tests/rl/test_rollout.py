"""Tests for dynamic sampling, driven by the scripted generator."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np
import optax

from jaxgrpo import train_state as train_state_lib
from jaxgrpo import train_step as train_step_lib
from jaxgrpo.data import mixture
from jaxgrpo.data import snooze
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.example import Example
from jaxgrpo.generate.generator import Completions
from jaxgrpo.rl import batch as batch_lib
from jaxgrpo.rl import rollout as rollout_lib
from jaxgrpo.rl import rounds
from jaxgrpo.sim import standins
from jaxgrpo.verifiers import pool as verifier_pool
from tests import scripted
from tests import tiny

G = 4


class ClassifyTest(absltest.TestCase):

  def test_by_hand(self):
    rewards = np.array([[1, 1, 1, 1], [0, 0, 0, 0], [0, 1, 0, 1],
                        [.5, .5, .5, .5], [.9, 1, .95, 1]], np.float32)
    informative, easy, hard = rounds.classify(rewards, 1.0, 0.0)
    np.testing.assert_array_equal(informative, [0, 0, 1, 0, 1])
    np.testing.assert_array_equal(easy, [1, 0, 0, 0, 0])
    np.testing.assert_array_equal(hard, [0, 1, 0, 0, 0])
    # With a lower easy threshold the near-perfect group is too easy.
    informative, easy, _ = rounds.classify(rewards, 0.9, 0.0)
    np.testing.assert_array_equal(informative, [0, 0, 1, 0, 0])
    np.testing.assert_array_equal(easy, [1, 0, 0, 0, 1])


def _rollout(rates, **kw):
  return scripted.make_rollout([('d', 1.0, rates)], group_size=G, **kw)


class RolloutTest(absltest.TestCase):

  def test_only_informative_groups_are_used(self):
    # Three always right, three always wrong, three mixed.
    ro, sampler, _ = _rollout([1.0] * 3 + [0.0] * 3 + [0.5] * 3,
                              batch_size=3, round_size=9, max_rounds=1)
    res = ro.collect(None, jax.random.key(0))
    m = res.metrics
    # The always-right and always-wrong examples are dropped (a mixed one may
    # also come out all right or all wrong by chance).
    self.assertGreaterEqual(m['rollout/groups_easy'], 3)
    self.assertGreaterEqual(m['rollout/groups_hard'], 3)
    self.assertEqual(m['rollout/groups_easy'] + m['rollout/groups_hard']
                     + m['rollout/groups_used'] + m['rollout/surplus']
                     + m['rollout/held'], 9)
    self.assertEqual(m['rollout/prompts_generated'], 9)
    self.assertEqual(m['rollout/prompts_generated/d'], 9)
    used = {g.example.id for g in res.groups}
    self.assertTrue(used <= {'d/6', 'd/7', 'd/8'})
    for g in res.groups:
      self.assertGreater(np.ptp(g.rewards), 0)
    self.assertAlmostEqual(m['rollout/efficiency'],
                           m['rollout/groups_used'] / 9)
    # Feedback reached the dataset's table.
    self.assertEqual(int(sampler.tables[0].get_state()['trials'].sum()), 9 * G)

  def test_reward_mean_counts_the_dropped_groups(self):
    # Three always right, three always wrong: every group is dropped, and
    # the reward is still that of the 24 completions generated.
    ro, _, _ = _rollout([1.0] * 3 + [0.0] * 3, batch_size=3, round_size=6,
                        max_rounds=1)
    m = ro.collect(None, jax.random.key(0)).metrics
    self.assertEqual(m['rollout/groups_used'], 0)
    self.assertEqual(m['reward/mean'], 0.5)
    self.assertEqual(m['reward/mean/d'], 0.5)

  def test_outcomes_reach_the_sampler_before_the_next_round(self):
    # Under filter, round 1's four groups are all too easy: round 2 of the
    # same step has nothing left to offer, and the step ends after one call.
    ro, _, gen = _rollout([1.0] * 4, policy='filter', batch_size=4,
                          round_size=4, max_rounds=3)
    m = ro.collect(None, jax.random.key(0)).metrics
    self.assertEqual(gen.calls, 1)
    self.assertEqual(m['rollout/rounds'], 1)
    self.assertEqual(m['rollout/prompts_generated'], 4)
    self.assertEqual(m['data/filtered/d'], 4)
    self.assertEqual(m['data/exhausted/d'], 1.0)

  def test_rounds_until_batch_full_and_surplus_carried(self):
    ro, _, gen = _rollout([0.5] * 12, batch_size=4, round_size=3,
                          max_rounds=10)
    res = ro.collect(None, jax.random.key(0), 0)
    # p=0.5, G=4: a group is informative with probability 7/8, so a few
    # rounds of 3 fill 4 groups; whatever exceeded 4 is carried.
    self.assertEqual(res.metrics['rollout/groups_used'], 4)
    self.assertEqual(res.metrics['rollout/rounds'], gen.calls)
    carried = len(ro.accumulator.carried)
    self.assertEqual(res.metrics['rollout/surplus'], carried)
    calls = gen.calls
    res2 = ro.collect(None, jax.random.key(1), 1)
    self.assertEqual(res2.metrics['rollout/carried_in'], carried)
    self.assertEqual(gen.calls - calls, res2.metrics['rollout/rounds'])
    self.assertEqual(res2.metrics['rollout/cum_groups_used'], 8)

  def test_surplus_drop(self):
    ro, _, _ = _rollout([0.5] * 12, batch_size=1, round_size=6,
                        surplus='drop')
    ro.collect(None, jax.random.key(0))
    self.assertEmpty(ro.accumulator.carried)

  def test_short_batch_is_padded_and_reported(self):
    # Only one example is ever informative; max_rounds stops the step.
    ro, _, _ = _rollout([0.5] + [1.0] * 5, batch_size=4, round_size=3,
                        max_rounds=2, short_batch='train')
    res = ro.collect(None, jax.random.key(0))
    used = int(res.metrics['rollout/groups_used'])
    self.assertLessEqual(used, 1)
    self.assertEqual(res.metrics['rollout/batch_short'], 4 - used)
    self.assertEqual(res.metrics['train/batch_fill'], used / 4)
    if res.batch is not None:
      batch = res.batch
      self.assertEqual(batch.completion_mask.shape, (4 * G, scripted.T))
      self.assertFalse(batch.completion_mask[used * G:].any())
      np.testing.assert_array_equal(batch.advantages[used * G:], 0)

  def test_short_batch_waits_until_full(self):
    # Two informative examples of twelve, B=4, one round of 6 per step: a
    # step rarely fills, and under 'wait' it takes no update until B groups
    # are in hand; every batch that trains is full.
    ro, _, gen = _rollout([0.5] * 2 + [1.0] * 10, batch_size=4, round_size=6,
                          max_rounds=1, short_batch='wait')
    in_hand, batches = 0, 0
    for step in range(12):
      res = ro.collect(None, jax.random.key(step), step)
      m = res.metrics
      self.assertEqual(m['rollout/carried_in'], in_hand)
      if res.batch is None:
        self.assertEmpty(res.groups)
        self.assertEqual(m['rollout/groups_used'], 0)
        self.assertEqual(m['rollout/held'], len(ro.accumulator.carried))
        self.assertLess(m['rollout/held'], 4)
        self.assertEqual(m['train/batch_fill'], m['rollout/held'] / 4)
        in_hand = len(ro.accumulator.carried)
      else:
        batches += 1
        self.assertLen(res.groups, 4)
        self.assertEqual(m['train/batch_fill'], 1.0)
        self.assertEqual(m['rollout/held'], 0)
        self.assertTrue((res.batch.completion_mask.reshape(4, G, -1)
                         .any(axis=(1, 2))).all())
        in_hand = len(ro.accumulator.carried)
    self.assertGreater(batches, 0)
    self.assertEqual(gen.calls, 12)

  def test_short_batch_waits_through_a_checkpoint(self):
    ro, _, _ = _rollout([0.5] * 2 + [1.0] * 10, batch_size=4, round_size=6,
                        max_rounds=1)
    for step in range(10):  # until some groups wait
      res = ro.collect(None, jax.random.key(step), step)
      if res.metrics['rollout/held']:
        break
    self.assertIsNone(res.batch)
    held = [g.example.id for g in ro.accumulator.carried]
    self.assertNotEmpty(held)
    fresh, _, _ = _rollout([0.5] * 2 + [1.0] * 10, batch_size=4,
                           round_size=6, max_rounds=1)
    fresh.set_state(ro.get_state())
    self.assertEqual([g.example.id for g in fresh.accumulator.carried], held)

  def test_short_batch_scale(self):
    # Two of six examples can be informative and B=4: the same groups under
    # 'train' and 'scale', whose advantages are those of 'train' x n / B.
    outs = {}
    for mode in ('train', 'scale'):
      ro, _, _ = _rollout([0.5] * 2 + [1.0] * 4, batch_size=4, round_size=6,
                          max_rounds=1, short_batch=mode)
      outs[mode] = ro.collect(None, jax.random.key(0))
    used = len(outs['train'].groups)
    self.assertBetween(used, 1, 3)
    self.assertEqual([g.example.id for g in outs['scale'].groups],
                     [g.example.id for g in outs['train'].groups])
    np.testing.assert_allclose(outs['scale'].batch.advantages,
                               outs['train'].batch.advantages * used / 4)
    self.assertGreater(np.abs(outs['train'].batch.advantages).max(), 0)

  def test_short_batch_option_is_checked(self):
    with self.assertRaisesRegex(ValueError, 'rollout.short_batch'):
      _rollout([0.5], short_batch='sometimes')

  def test_no_informative_group_gives_no_batch(self):
    ro, _, _ = _rollout([1.0] * 4, batch_size=2, round_size=2, max_rounds=3)
    res = ro.collect(None, jax.random.key(0))
    self.assertIsNone(res.batch)
    self.assertEqual(res.metrics['rollout/rounds'], 3)
    self.assertEqual(res.metrics['reward/mean'], 1.0)

  def test_batch_layout_is_prompt_major(self):
    ro, _, gen = _rollout([0.5] * 8, batch_size=2, round_size=8, max_rounds=1)
    res = ro.collect(None, jax.random.key(0))
    b = res.batch
    tok = gen.tok
    for i, g in enumerate(res.groups):
      self.assertEqual(tok.decode(b.prompt_tokens[i]), g.example.prompt)
      for j in range(G):
        np.testing.assert_array_equal(b.completion_tokens[i * G + j],
                                      g.completion_tokens[j])
      adv = b.advantages[i * G:(i + 1) * G]
      self.assertAlmostEqual(float(adv.mean()), 0.0, places=5)
      np.testing.assert_array_equal(np.sign(adv),
                                    np.sign(g.rewards - g.rewards.mean()))

  def test_adaptive_round_size_follows_pass_rates(self):
    # Mostly mastered examples: few groups are informative, so adaptive
    # rounds grow to fill the batch in about one round.
    rates = [1.0] * 48 + [0.5] * 16
    ro, _, gen = _rollout(rates, batch_size=4, round_size='adaptive',
                          max_rounds=20, max_round_size=64, policy='none')
    rounds = []
    for step in range(8):
      res = ro.collect(None, jax.random.key(step), step)
      rounds.append(res.metrics['rollout/rounds'])
    # Powers of two only (few compiled shapes), capped.
    self.assertTrue(set(gen.round_sizes) <= {8, 16, 32, 64}, gen.round_sizes)
    # Once the pass rates are known, rounds grow past the minimum and the
    # batch fills in about one round.
    self.assertGreater(max(gen.round_sizes), 8)
    self.assertLessEqual(np.mean(rounds[-4:]), 2.0)



class RolloutStateTest(absltest.TestCase):

  def test_carried_groups_survive_a_checkpoint(self):
    import tempfile  # pylint: disable=g-import-not-at-top
    from jaxgrpo import checkpoint  # pylint: disable=g-import-not-at-top
    ro, _, _ = _rollout([0.5] * 12, batch_size=1, round_size=6)
    ro.collect(None, jax.random.key(0))
    self.assertNotEmpty(ro.accumulator.carried)
    ckpt = checkpoint.Checkpointer(tempfile.mkdtemp(), every=1, max_to_keep=1)
    empty, _, _ = _rollout([0.5] * 12)
    for step, source in enumerate((ro, empty), start=1):
      ckpt.save(step, {'x': np.zeros(())}, {'rollout': source.get_state()}, {})
      ckpt.wait()
      restored = ckpt.restore(step, {'x': np.zeros(())}).data['rollout']
      twin, _, _ = _rollout([0.5] * 12)
      twin.set_state(restored)
      self.assertLen(twin.accumulator.carried, len(source.accumulator.carried))
      for a, b in zip(source.accumulator.carried, twin.accumulator.carried):
        self.assertEqual(a.example, b.example)
        np.testing.assert_array_equal(a.completion_tokens, b.completion_tokens)
        np.testing.assert_array_equal(a.old_logps, b.old_logps)
        np.testing.assert_array_equal(a.rewards, b.rewards)
      self.assertEqual(twin.accumulator.cum_prompts_generated,
                       source.accumulator.cum_prompts_generated)
    ckpt.close()


class _EosGenerator:
  """Ends every completion at once; keeps the prompt rows it was given."""

  def __init__(self, group_size: int, eos_id: int):
    self.num_samples = group_size
    self.eos_id = eos_id
    self.prompts = []

  def generate(self, params, tokens, mask, rng):
    del params, mask, rng
    self.prompts.extend(np.asarray(tokens))
    n = len(tokens) * self.num_samples
    out = np.full((n, 2), self.eos_id, np.int32)
    m = np.zeros((n, 2), bool)
    m[:, 0] = True
    return Completions(tokens=out, logps=np.zeros((n, 2), np.float32),
                       mask=m, lengths=m.sum(1).astype(np.int32))


class LongPromptTest(absltest.TestCase):

  PROMPTS = ('1=', '1234+5678=', '12=', '99+1=')  # 3, 11, 4, 6 tokens

  def _rollout(self, long_prompts):
    tok = tokenizer_lib.CharTokenizer()
    examples = [Example(id=f'd/{i}', prompt=p, answer='1', dataset='d')
                for i, p in enumerate(self.PROMPTS)]
    spec = mixture.DatasetSpec(
        name='d', weight=1.0,
        policy=snooze.PolicyConfig(policy='none', group_size=G))
    sampler = mixture.MixtureSampler([(spec, examples)], balance='pre_filter',
                                     batch_size=2, seed=0)
    cfg = rollout_lib.RolloutConfig(
        batch_size=2, group_size=G, round_size=4, max_rounds=1,
        max_prompt_len=5, long_prompts=long_prompts)
    gen = _EosGenerator(G, tok.eos_id)
    return (rollout_lib.Rollout.for_model(
        cfg, sampler, tok, gen, verifier_pool.Scorer(lambda t, ex: 0.0)),
            gen, tok)

  def test_truncate_keeps_bos_and_the_end_and_counts(self):
    ro, gen, tok = self._rollout('truncate')
    res = ro.collect(None, jax.random.key(0))
    self.assertEqual(res.metrics['data/truncated/d'], 2)
    self.assertEqual(res.metrics['rollout/prompts_generated'], 4)
    self.assertCountEqual([tok.decode(row) for row in gen.prompts],
                          ['1=', '678=', '12=', '9+1='])
    for row in gen.prompts:
      self.assertEqual(row[-1 - len(tok.decode(row))], tok.bos_id)

  def test_error_names_the_example_and_the_key(self):
    ro, _, _ = self._rollout('error')
    with self.assertRaisesRegex(
        tokenizer_lib.PromptTooLongError,
        r'example d/[13] is \d+ tokens .*rollout.max_prompt_len=5'):
      ro.collect(None, jax.random.key(0))

  def test_unknown_mode(self):
    with self.assertRaisesRegex(ValueError, 'rollout.long_prompts'):
      rollout_lib.RolloutConfig(batch_size=1, group_size=2, round_size=1,
                                max_rounds=1, max_prompt_len=4,
                                long_prompts='cut')


class _TableRound:
  """A round function without a model: each example's G rewards come from a
  table, as the simulator's do. Keeps the (prompt ids, size) of each call."""

  def __init__(self, table):
    self.table = table
    self.calls = []

  def __call__(self, params, rng, examples, size):
    del params, rng
    self.calls.append(([ex.id for ex in examples], size))
    rewards = np.array([self.table[ex.id] for ex in examples], np.float32)
    return rounds.Round(
        groups=[standins.SimGroup(ex, r) for ex, r in zip(examples, rewards)],
        rewards=rewards, gen_s=0.5, gen_tokens=float(rewards.size))


class RoundFunctionTest(absltest.TestCase):

  def test_a_plugged_in_round_function_feeds_dynamic_sampling(self):
    ro, sampler, _ = _rollout([0.5] * 4, batch_size=1, round_size=4,
                              max_rounds=2)
    round_fn = _TableRound({'d/0': [1, 1, 1, 1], 'd/1': [0, 0, 0, 0],
                            'd/2': [1, 0, 0, 0], 'd/3': [0, 1, 1, 0]})
    plugged = rollout_lib.Rollout(ro.cfg, sampler, round_fn, pad_id=None)
    res = plugged.collect(None, jax.random.key(0))
    self.assertLen(round_fn.calls, 1)  # one round filled the batch
    ids, size = round_fn.calls[0]
    self.assertCountEqual(ids, ['d/0', 'd/1', 'd/2', 'd/3'])
    self.assertEqual(size, 4)
    # The too easy and too hard groups are dropped; of the two informative
    # ones, one trains and one is carried.
    self.assertIsNone(res.batch)  # no pad id: no batch
    self.assertLen(res.groups, 1)
    self.assertIn(res.groups[0].example.id, ('d/2', 'd/3'))
    m = res.metrics
    self.assertEqual((m['rollout/groups_easy'], m['rollout/groups_hard'],
                      m['rollout/groups_used'], m['rollout/surplus']),
                     (1.0, 1.0, 1.0, 1.0))
    self.assertEqual(m['rollout/tokens_generated'], 16.0)
    self.assertEqual(m['reward/mean'], 7 / 16)
    self.assertEqual(m, res.stats.to_metrics() | sampler.metrics())
    self.assertLen(plugged.accumulator.carried, 1)
    # The outcomes reached the sampler's tables.
    self.assertEqual(int(sampler.tables[0].get_state()['trials'].sum()),
                     4 * G)


def _groups(n, t, lengths, seed=0):
  """n groups of G completions over a 16-token vocabulary, right-padded to t:
  completion i of group b has lengths[b][i] valid tokens."""
  rng = np.random.default_rng(seed)
  out = []
  for b in range(n):
    mask = np.arange(t)[None] < np.asarray(lengths[b])[:, None]
    out.append(rounds.Group(
        example=Example(id=f'd/{b}', prompt='', answer='', dataset='d'),
        prompt_tokens=np.r_[0, rng.integers(3, 16, 5)].astype(np.int32),
        prompt_mask=np.r_[False, np.ones(5, bool)],
        completion_tokens=np.where(mask, rng.integers(2, 16, (G, t)),
                                   0).astype(np.int32),
        completion_mask=mask,
        old_logps=np.where(mask, -rng.uniform(0.5, 3.0, (G, t)),
                           0.0).astype(np.float32),
        rewards=rng.integers(0, 2, G).astype(np.float32)))
  return out


class AssembleTest(parameterized.TestCase):
  """The train batch's completion axis is cut to the lengths in use."""

  def _cfg(self, train_lengths, b=2):
    return rollout_lib.RolloutConfig(batch_size=b, group_size=G,
                                     train_lengths=train_lengths)

  def test_train_lengths(self):
    self.assertEqual(batch_lib.train_lengths(512, 4), (128, 256, 384, 512))
    self.assertEqual(batch_lib.train_lengths(512, 1), (512,))
    # Steps of at least 64 tokens, in multiples of 16.
    self.assertEqual(batch_lib.train_lengths(130, 4), (64, 128, 130))
    self.assertEqual(batch_lib.train_lengths(300, 3), (112, 224, 300))
    self.assertEqual(batch_lib.train_lengths(64, 8), (64,))
    self.assertEqual(batch_lib.train_lengths(6, 4), (6,))

  def test_cuts_only_padding(self):
    lengths = [[5, 70, 12, 1], [30, 2, 9, 40]]
    groups = _groups(2, 160, lengths)
    cut = batch_lib.assemble(groups, self._cfg(4), pad_id=0)
    whole = batch_lib.assemble(groups, self._cfg(1), pad_id=0)
    self.assertEqual(whole.completion_tokens.shape, (2 * G, 160))
    # The longest completion (70) fits the second of (64, 128, 160).
    self.assertEqual(cut.completion_tokens.shape, (2 * G, 128))
    for name in ('completion_tokens', 'completion_mask', 'old_logps'):
      np.testing.assert_array_equal(getattr(cut, name),
                                    getattr(whole, name)[:, :128], name)
    self.assertFalse(whole.completion_mask[:, 128:].any())
    self.assertFalse(whole.old_logps[:, 128:].any())
    for name in ('prompt_tokens', 'prompt_mask', 'advantages'):
      np.testing.assert_array_equal(getattr(cut, name), getattr(whole, name))
    # A completion that reaches T keeps it whole; an empty batch keeps the
    # shortest length.
    full = batch_lib.assemble(_groups(2, 160, [[160, 1, 1, 1]] * 2),
                                self._cfg(4), pad_id=0)
    self.assertEqual(full.completion_tokens.shape, (2 * G, 160))
    empty = batch_lib.assemble(_groups(1, 160, [[0] * G]), self._cfg(4),
                                 pad_id=0)
    self.assertEqual(empty.completion_tokens.shape, (2 * G, 64))

  # T, completion lengths, the length the batch is cut to. T = 256:
  # GSM8K's lengths, completions of 1 to 180 tokens cut to 192.
  _SHORT = (130, [[5, 50, 12, 1], [30, 2, 9, 40]], 64)
  _GSM8K = (256, [[1, 180, 12, 140], [30, 2, 100, 64]], 192)

  # Each aggregation on one shape, each shape under two (every pair
  # compiles two train steps).
  @parameterized.parameters(('token_mean', _SHORT),
                            ('seq_mean_token_mean', _GSM8K),
                            ('dr_grpo', _SHORT), ('dr_grpo', _GSM8K))
  def test_cut_batch_trains_as_the_padded_one(self, loss_agg, shape):
    # The same update from the cut batch as from the one padded to T: the
    # cut columns are padding, which no loss or metric counts (dr_grpo
    # divides by T from the config, not by the batch's length). Plain SGD
    # with a unit rate, so that the params move by the gradients (Adam's
    # first step, g / (|g| + eps), would magnify float rounding in gradients
    # near eps).
    graphdef, params = tiny.random_model()
    t, lengths, cut = shape
    groups = _groups(2, t, lengths, seed=1)
    optimizer = optax.sgd(1.0)
    step_fn = train_step_lib.make_train_step(
        graphdef=graphdef, optimizer=optimizer,
        loss_cfg=train_step_lib.LossConfig(loss_agg=loss_agg,
                                           max_completion_len=t),
        num_minibatches=2)
    out = {}
    for n in (1, 4):
      batch = batch_lib.assemble(groups, self._cfg(n), pad_id=0)
      state = train_state_lib.create_train_state(
          graphdef, jax.tree.map(np.array, params), optimizer,
          keep_reference=False)
      out[n] = step_fn(state, jax.tree.map(np.array, batch),
                       jax.random.key(3))
    self.assertEqual(batch_lib.assemble(groups, self._cfg(4), 0)
                     .completion_tokens.shape[1], cut)
    (state_t, metrics_t), (state_c, metrics_c) = out[1], out[4]
    self.assertGreater(float(metrics_t['train/grad_norm']), 0.0)
    for k in metrics_t:
      np.testing.assert_allclose(metrics_c[k], metrics_t[k], rtol=2e-5,
                                 atol=1e-7, err_msg=k)
    # float32 rounding: summed in another order over the other length, a
    # gradient entry moves by up to ~6e-5 of its tensor's largest (dr_grpo's
    # gradients are the smallest); padding the same groups to 200 or 256
    # instead of 130 moves them as much.
    def close(a, b, p):
      da, db = np.asarray(a - p), np.asarray(b - p)
      np.testing.assert_allclose(da, db, atol=1e-4 * np.abs(db).max())
    jax.tree.map(close, state_c.params, state_t.params, params)


if __name__ == '__main__':
  absltest.main()
