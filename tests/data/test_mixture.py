"""Tests for the snooze-aware mixture, driven by the scripted generator."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

from jaxgrpo import checkpoint as checkpoint_lib
from jaxgrpo import config_lib
from jaxgrpo import verifiers
from jaxgrpo.configs import common
from jaxgrpo.configs import demo
from jaxgrpo.data import loading
from jaxgrpo.data import mixture
from jaxgrpo.data import snooze
from jaxgrpo.example import Example
from tests import scripted


def _run(ro, steps, start=0):
  out = []
  for step in range(start, start + steps):
    out.append(ro.collect(None, jax.random.key(step), step))
  return out


class LargestRemainderTest(absltest.TestCase):

  def test_sums_and_proportions(self):
    np.testing.assert_array_equal(
        mixture.largest_remainder([0.9, 0.1], 16), [14, 2])
    np.testing.assert_array_equal(
        mixture.largest_remainder([1, 1, 1], 4).sum(), 4)
    np.testing.assert_array_equal(mixture.largest_remainder([0, 0], 3), [0, 0])


class MixtureTest(parameterized.TestCase):

  def test_post_filter_shares_equal_weights(self):
    # Plenty of mixed examples in both datasets: quotas are met exactly.
    ro, sampler, _ = scripted.make_rollout(
        [('a', 0.75, [0.5] * 64), ('b', 0.25, [0.5] * 64)],
        balance='post_filter', batch_size=8, round_size=8, max_rounds=20)
    for res in _run(ro, 5):
      self.assertEqual(res.metrics['rollout/groups_used/a'], 6)
      self.assertEqual(res.metrics['rollout/groups_used/b'], 2)
      self.assertAlmostEqual(res.metrics['data/batch_share/a'], 0.75)

  def test_pre_filter_drifts_toward_the_less_filtered_dataset(self):
    # 'easy' is mostly mastered (its groups are dropped), 'hard' is mixed:
    # with equal weights the batch fills with 'hard' groups.
    datasets = [('easy', 0.5, [0.97] * 64), ('hard', 0.5, [0.5] * 64)]
    pre, _, _ = scripted.make_rollout(datasets, balance='pre_filter',
                                      batch_size=8, round_size=8,
                                      max_rounds=30)
    shares = [r.metrics['data/batch_share/easy'] for r in _run(pre, 8)]
    self.assertLess(np.mean(shares), 0.35)
    post, _, _ = scripted.make_rollout(datasets, balance='post_filter',
                                       batch_size=8, round_size=8,
                                       max_rounds=30)
    shares = [r.metrics['data/batch_share/easy'] for r in _run(post, 8)]
    self.assertAlmostEqual(np.mean(shares), 0.5)

  def test_pre_filter_share_does_not_hang_on_the_datasets_order(self):
    # Rounds listed their prompts dataset by dataset, and the slots left
    # after the quotas go in arrival order: under surplus='drop' the
    # dataset listed first took more of them (0.34 of the batch listed
    # first, 0.003 listed second).
    shares = []
    for order in ((0, 1), (1, 0)):
      datasets = [('x', 0.2, [0.5] * 200), ('y', 0.8, [0.5] * 200)]
      ro, _, _ = scripted.make_rollout(
          [datasets[k] for k in order], batch_size=8, round_size=16,
          max_rounds=4, surplus='drop', seed=3)
      used = np.zeros(2)
      for r in _run(ro, 120):
        used += [r.metrics.get('rollout/groups_used/x', 0),
                 r.metrics.get('rollout/groups_used/y', 0)]
      shares.append(used[0] / used.sum())
    self.assertAlmostEqual(shares[0], shares[1], delta=0.035)
    self.assertAlmostEqual(shares[0], 0.2, delta=0.05)

  def test_floors_first_then_the_rest_by_weight(self):
    # Slots were taken one at a time from the dataset furthest above its
    # floor: 2 / 3 / 5, the weight-0.5 dataset below the weight-0.3 one.
    pol = snooze.PolicyConfig(policy='none', group_size=4)
    def quotas(weights, floors, batch):
      return mixture.MixtureSampler([
          (mixture.DatasetSpec(name=f'd{i}', weight=w, policy=pol,
                               min_fraction=f),
           scripted.make_examples(f'd{i}', 10))
          for i, (w, f) in enumerate(zip(weights, floors))],
          balance='post_filter', batch_size=batch, seed=0).quotas.tolist()
    self.assertEqual(quotas((0.5, 0.3, 0.2), (0, 0, 0.5), 10), [3, 2, 5])
    self.assertEqual(quotas((0.7, 0.3, 0), (0, 0, 0.2), 10), [6, 2, 2])
    self.assertEqual(quotas((0.25, 0.75), (0, 0), 2), [1, 1])
    self.assertEqual(quotas((0.5, 0.5), (0.5, 0.5), 10), [5, 5])

  def test_a_round_spreads_each_dataset_over_it(self):
    # pylint: disable=protected-access
    picked = [(0, 10), (0, 11), (1, 20), (1, 21), (1, 22), (1, 23)]
    self.assertEqual(mixture._interleaved(picked, np.array([0, 1])),
                     [(1, 20), (0, 10), (1, 21), (1, 22), (0, 11), (1, 23)])
    # Odd counts meet at the middle: the random rank decides, not the place
    # in data.datasets (the first listed won every tie, 0.21 of the batch
    # against 0.18 listed second).
    picked = [(0, 10), (1, 20), (1, 21), (1, 22)]
    self.assertEqual(mixture._interleaved(picked, np.array([1, 0])),
                     [(1, 20), (1, 21), (0, 10), (1, 22)])
    self.assertEqual(mixture._interleaved(picked, np.array([0, 1])),
                     [(1, 20), (0, 10), (1, 21), (1, 22)])

  def test_a_step_without_an_update_reports_no_batch_share(self):
    # Pass rates 0.5 and 0.97: one round of 8 prompts rarely yields the 8
    # informative groups a batch needs, so short_batch='wait' steps come.
    ro, _, _ = scripted.make_rollout(
        [('a', 0.5, [0.5] * 32), ('b', 0.5, [0.97] * 32)],
        batch_size=8, round_size=8, max_rounds=1)
    results = _run(ro, 12)
    waited = [r for r in results if r.batch is None]
    updated = [r for r in results if r.batch is not None]
    self.assertNotEmpty(waited)
    self.assertNotEmpty(updated)
    for r in waited:  # A share of no batch is undefined, not 0.
      self.assertNotIn('data/batch_share/a', r.metrics)
      self.assertNotIn('data/batch_share/b', r.metrics)
    for r in updated:
      self.assertAlmostEqual(r.metrics['data/batch_share/a']
                             + r.metrics['data/batch_share/b'], 1.0)

  def test_quota_handed_over_when_a_dataset_runs_out(self):
    # Under `filter`, 'done' is mastered: after its first epoch it offers
    # nothing, and its quota goes to 'live'.
    ro, sampler, _ = scripted.make_rollout(
        [('done', 0.5, [1.0] * 8), ('live', 0.5, [0.5] * 64)],
        policy='filter', balance='post_filter', batch_size=8, round_size=8,
        max_rounds=20)
    results = _run(ro, 4)
    last = results[-1].metrics
    self.assertEqual(last['rollout/groups_used'], 8)
    self.assertEqual(last['rollout/groups_used/live'], 8)
    self.assertEqual(last['data/handover_out/done'], 4)
    self.assertEqual(last['data/handover_in/live'], 4)
    self.assertEqual(last['data/filtered/done'], 8)
    self.assertEqual(last['data/exhausted/done'], 1.0)

  def test_min_fraction_reserves_a_floor(self):
    datasets = [('easy', 0.5, [0.97] * 64), ('hard', 0.5, [0.5] * 64)]
    ro, _, _ = scripted.make_rollout(
        datasets, balance='pre_filter', batch_size=8, round_size=8,
        max_rounds=40, min_fractions={'easy': 0.25})
    for res in _run(ro, 5):
      self.assertGreaterEqual(res.metrics['rollout/groups_used/easy'], 2)

  def test_min_fraction_floor_is_that_share_of_the_batch(self):
    # 0.07 * 100 and 0.56 * 100 are 7.000000000000001 and 56.00000000000001
    # in floats; their ceilings reserved 8 and 57 slots, and 0.44 + 0.56 of
    # a batch of 100 (44 + 57 floors) was refused.
    def sampler(balance, **fractions):
      return mixture.MixtureSampler(
          [(mixture.DatasetSpec(name=n, weight=1.0, min_fraction=f,
                                policy=snooze.PolicyConfig(group_size=2)),
            scripted.make_examples(n, 8)) for n, f in fractions.items()],
          balance=balance, batch_size=100, seed=0)
    for balance in mixture.BALANCES:
      np.testing.assert_array_equal(
          sampler(balance, a=0.07, b=0.0).floors, [7, 0])
      np.testing.assert_array_equal(
          sampler(balance, a=0.44, b=0.56).floors, [44, 56])
    np.testing.assert_array_equal(
        sampler('post_filter', a=0.07, b=0.0).quotas, [50, 50])
    np.testing.assert_array_equal(
        sampler('pre_filter', a=0.44, b=0.56).quotas, [44, 56])
    self.assertEqual(mixture.min_slots(0.3, 4), 2)  # a share is rounded up
    self.assertEqual(mixture.min_slots(0.55, 100), 55)
    with self.assertRaisesRegex(ValueError, 'exceed the batch of 100'):
      sampler('pre_filter', a=0.45, b=0.56)

  def test_post_filter_quotas_make_room_for_the_floors(self):
    def quotas(balance):
      return mixture.MixtureSampler(
          [(mixture.DatasetSpec(name=n, weight=w, min_fraction=f,
                                policy=snooze.PolicyConfig(group_size=2)),
            scripted.make_examples(n, 8))
           for n, w, f in (('a', 0.9, 0.0), ('b', 0.1, 0.3))],
          balance=balance, batch_size=10, seed=0).quotas.tolist()
    # round(0.9 * 10), round(0.1 * 10) = 9, 1; b's floor ceil(0.3 * 10) = 3
    # takes 2 of a's slots. pre_filter reserves the floor alone.
    self.assertEqual(quotas('post_filter'), [7, 3])
    self.assertEqual(quotas('pre_filter'), [0, 3])

  def test_post_filter_hands_over_the_slots_left_at_max_rounds(self):
    # 'b' is always right: never informative, yet never out of examples
    # (policy none), so only max_rounds ends its step. short_batch='train'
    # trains on what the rounds found.
    ro, _, gen = scripted.make_rollout(
        [('a', 0.5, [0.5] * 64), ('b', 0.5, [1.0] * 64)],
        balance='post_filter', batch_size=8, round_size=8, max_rounds=3,
        short_batch='train')
    m = ro.collect(None, jax.random.key(0), 0).metrics
    self.assertEqual(gen.calls, 3)
    self.assertEqual(m['data/quota/a'], 4)
    self.assertEqual(m['data/quota/b'], 4)
    self.assertEqual(m['data/exhausted/b'], 0.0)
    self.assertEqual(m['rollout/groups_used/b'], 0)
    self.assertGreaterEqual(m['rollout/groups_used/a'], 4)
    self.assertEqual(m['data/handover_out/b'], 4)
    self.assertEqual(m['data/handover_out/a'], 0)
    self.assertEqual(m['data/handover_in/a'], m['rollout/groups_used/a'] - 4)
    self.assertEqual(m['rollout/batch_short'], 8 - m['rollout/groups_used'])

  @parameterized.parameters('none', 'snooze')
  def test_a_mastered_dataset_hands_its_quota_over_under_wait(self, policy):
    # 'easy' is always right: under none or snooze it never runs out, and
    # the rounds asked it alone for its quota. Under short_batch='wait' no
    # step after the first trained again (every update skipped, for good).
    lines = []
    ro, sampler, _ = scripted.make_rollout(
        [('easy', 0.5, [1.0] * 8), ('hard', 0.5, [0.5] * 32)],
        policy=policy, balance='post_filter', batch_size=4, round_size=8,
        max_rounds=4)
    sampler._log = lines.append  # pylint: disable=protected-access
    results = _run(ro, 6)
    first = results[0].metrics
    self.assertEqual(first['data/stuck/easy'], 0.0)  # not yet, in step 0
    self.assertEqual(first['rollout/rounds'], 4)
    self.assertEqual(lines[0], "step 0: dataset 'easy' yielded no "
                     'informative group and still owes 2 of its 2 batch '
                     'slots: from the next step every dataset may fill '
                     'them, drawn by weight, until it yields one '
                     '(data/stuck)')
    for res in results[1:]:
      m = res.metrics
      self.assertEqual(m['data/stuck/easy'], 1.0)
      self.assertEqual(m['data/stuck/hard'], 0.0)
      self.assertEqual(m['rollout/groups_used'], 4)  # every step trains
      self.assertEqual(m['rollout/groups_used/hard'], 4)
      self.assertEqual(m['data/handover_out/easy'], 2)
      self.assertEqual(m['data/handover_in/hard'], 2)
      self.assertGreater(m['data/prompts_drawn/easy'], 0)  # asked still
    self.assertLen(lines, 1)

  def test_groups_of_one_partial_reward_teach_nothing(self):
    # A dataset whose every completion scores 0.1 (the format right, the
    # answer wrong, under a weighted verifier): its groups are dropped as
    # flat, yet it counted as yielding, was never stuck, and no step
    # trained again; the groups were in no count.
    exact = verifiers.get('exact_match')
    ro, _, _ = scripted.make_rollout(
        [('flat', 0.5, [0.0] * 8), ('hard', 0.5, [0.5] * 32)],
        balance='post_filter', batch_size=4, round_size=8, max_rounds=4,
        verifier=lambda text, ex: (0.1 if ex.dataset == 'flat'
                                   else exact(text, ex)))
    results = _run(ro, 5)
    first = results[0].metrics
    self.assertEqual(first['rollout/groups_flat/flat'], first[
        'rollout/prompts_generated/flat'])
    self.assertNotIn('rollout/groups_flat/hard', first)
    for res in results[1:]:
      self.assertEqual(res.metrics['data/stuck/flat'], 1.0)
      self.assertEqual(res.metrics['rollout/groups_used'], 4)

  def test_a_stuck_dataset_is_probed_once_a_step_when_streaming(self):
    # A streaming step draws a prompt or two at a time: a probe per draw
    # gave the stuck dataset (weight 0.25) every draw's first prompt, most
    # of the step's prompts, and `wait` steps went without an update.
    specs = [(mixture.DatasetSpec(name=n, weight=w,
                                  policy=snooze.PolicyConfig(group_size=2)),
              scripted.make_examples(n, 32))
             for n, w in (('easy', 0.25), ('hard', 0.75))]
    sampler = mixture.MixtureSampler(specs, balance='post_filter',
                                     batch_size=4, seed=0)
    sampler.start_step(0)
    drawn = sampler.next_prompts(8, np.array([1, 3]))
    sampler.observe(drawn, np.array(
        [[1.0, 1.0] if ex.dataset == 'easy' else [0.0, 1.0] for ex in drawn]))
    sampler.end_step(np.array([0, 3]))  # 'easy' owes 1, yielded nothing
    sampler.start_step(1)
    names = [ex.dataset for _ in range(16)
             for ex in sampler.next_prompts(1, np.array([1, 0]))]
    self.assertEqual(names.count('easy'), 1)
    self.assertEqual(sampler.metrics()['data/stuck/easy'], 1.0)

  def test_a_stuck_dataset_takes_its_quota_back_once_it_yields(self):
    ro, sampler, gen = scripted.make_rollout(
        [('easy', 0.5, [1.0] * 8), ('hard', 0.5, [0.5] * 32)],
        balance='post_filter', batch_size=4, round_size=8, max_rounds=4)
    lines = []
    sampler._log = lines.append  # pylint: disable=protected-access
    _run(ro, 2)
    for i in range(8):  # the model forgets: 'easy' teaches again
      gen.pass_rate[f'e{i}='] = 0.5
    results = _run(ro, 6, start=2)
    self.assertEqual(results[0].metrics['data/stuck/easy'], 1.0)
    self.assertEqual(lines[-1], "step 2: dataset 'easy' yields informative "
                     'groups again; its slots are its own again')
    for res in results[1:]:
      self.assertEqual(res.metrics['data/stuck/easy'], 0.0)
      self.assertEqual(res.metrics['rollout/groups_used/easy'], 2)

  def test_a_dataset_alone_is_never_stuck(self):
    # Its slots have no other dataset to go to: nothing changes, nothing
    # is said, no data/stuck metric.
    ro, sampler, _ = scripted.make_rollout(
        [('easy', 1.0, [1.0] * 8)], balance='post_filter', batch_size=4,
        round_size=8, max_rounds=2)
    lines = []
    sampler._log = lines.append  # pylint: disable=protected-access
    for res in _run(ro, 3):
      self.assertNotIn('data/stuck/easy', res.metrics)
      self.assertEqual(res.metrics['rollout/groups_used'], 0)
    self.assertEqual(lines, [])

  def test_a_floor_a_dataset_cannot_fill_does_not_pile_up_surplus(self):
    # pre_filter with a floor on an always-right dataset: every step ran
    # all its rounds, and the informative groups of the others beyond the
    # batch were carried, 17, 34, 51, ... groups in the queue.
    ro, _, _ = scripted.make_rollout(
        [('easy', 0.5, [1.0] * 8), ('hard', 0.5, [0.5] * 32)],
        policy='snooze', snooze_factor=2, balance='pre_filter',
        min_fractions={'easy': 0.5}, batch_size=4, round_size=8, max_rounds=8)
    results = _run(ro, 12)
    surplus = [r.metrics['rollout/surplus'] for r in results]
    self.assertEqual(results[0].metrics['rollout/rounds'], 8)
    self.assertLess(max(surplus[6:]), 8)  # the first step's queue drained
    for res in results:
      self.assertEqual(res.metrics['rollout/groups_used'], 4)

  def test_a_datasets_own_snooze_factor_wins(self):
    c = demo.get_config()
    c.sampler.update(policy='snooze', snooze_factor=4)
    c.rollout.update(group_size=2, easy_threshold=0.9, hard_threshold=0.1)
    c.data.datasets = [common.arithmetic_dataset('own', snooze_factor=2),
                       common.arithmetic_dataset('shared')]
    cfg = config_lib.from_config_dict(c)
    for entry, n in zip(cfg.data.datasets, (2, 4)):
      policy = loading.policy_config(cfg, entry)
      self.assertEqual((policy.policy, policy.snooze_factor), ('snooze', n))
      self.assertEqual((policy.group_size, policy.easy_threshold,
                        policy.hard_threshold), (2, 0.9, 0.1))
      table = snooze.SnoozeTable(4, policy, seed=0)
      table.observe(table.draw(4, step=0), np.ones((4, 2)), step=0)
      table.draw(4, step=1)  # Asleep N epochs, offered in epoch N + 1.
      self.assertEqual(table.counts()['epoch'], n + 1, entry.name)

  def test_snooze_saves_generation_against_none(self):
    rates = [1.0] * 48 + [0.5] * 16
    generated = {}
    for policy in ('none', 'snooze'):
      ro, _, _ = scripted.make_rollout([('d', 1.0, rates)], policy=policy,
                                       batch_size=4, round_size=8,
                                       max_rounds=50)
      results = _run(ro, 30)
      generated[policy] = results[-1].metrics['rollout/cum_prompts_generated']
      self.assertEqual(results[-1].metrics['rollout/cum_groups_used'], 120)
    self.assertLess(generated['snooze'], 0.7 * generated['none'])

  def test_draws_that_share_an_id_are_told_apart(self):
    # Exact duplicate records may share an id (GSM8K's ids hash the
    # record); each outcome still goes to the example drawn.
    examples = [Example(id='same', prompt=f'{i}+0=', answer=str(i),
                        dataset='d') for i in range(2)]
    spec = mixture.DatasetSpec(name='d', weight=1.0, policy=snooze
                               .PolicyConfig(policy='none', group_size=2))
    sampler = mixture.MixtureSampler([(spec, examples)], balance='pre_filter',
                                     batch_size=2, seed=0)
    drawn = sampler.next_prompts(2)
    sampler.observe([drawn[1]], np.ones((1, 2)))
    sampler.observe([drawn[0]], np.zeros((1, 2)))
    successes = sampler.tables[0].successes
    self.assertEqual(successes[examples.index(drawn[1])], 2)
    self.assertEqual(successes[examples.index(drawn[0])], 0)

  def test_datasets_walk_their_own_orders(self):
    # 'ab' and 'ca' have the same weighted sum of characters, which seeded
    # both walks alike: the same permutation, the same skips.
    policy = snooze.PolicyConfig(policy='snooze_prob', group_size=2)
    for names in (('ab', 'ca'), ('ca', 'ab')):
      sampler = mixture.MixtureSampler(
          [(mixture.DatasetSpec(name=n, weight=1.0, policy=policy),
            scripted.make_examples(n, 50)) for n in names],
          balance='pre_filter', batch_size=4, seed=0)
      a, c = (sampler.tables[names.index(n)] for n in ('ab', 'ca'))
      self.assertNotEqual(a.seed, c.seed)
      self.assertFalse((a.epoch_order(0) == c.epoch_order(0)).all())
      # Which one moves does not depend on the list's order.
      self.assertEqual((a.seed, c.seed), (293, (293 + 0x9E3779B9) % 2**31))

  def test_same_seed_same_decisions_and_exact_restore(self):
    datasets = [('a', 0.6, [0.9] * 40), ('b', 0.4, [0.5] * 30)]
    # Surplus is dropped: carried groups belong to the rollout, whose own
    # checkpointing is tested with the training loop.
    kw = dict(policy='snooze', balance='post_filter', batch_size=4,
              round_size=8, max_rounds=10, snooze_factor=2, surplus='drop')
    ro1, s1, g1 = scripted.make_rollout(datasets, **kw)
    _run(ro1, 3)
    state, rng_state = s1.get_state(), g1.rng.bit_generator.state
    seen = len(g1.prompts_seen)
    cont1 = [r.metrics for r in _run(ro1, 4, start=3)]

    ro2, s2, g2 = scripted.make_rollout(datasets, **kw)
    s2.set_state(state)
    g2.rng.bit_generator.state = rng_state
    cont2 = [r.metrics for r in _run(ro2, 4, start=3)]
    self.assertEqual(g1.prompts_seen[seen:], g2.prompts_seen)
    for m1, m2 in zip(cont1, cont2):
      for key in m1:
        if key.startswith(('data/', 'rollout/groups', 'rollout/prompts')):
          self.assertEqual(m1[key], m2[key], key)

    # The same seed makes the same decisions from the start.
    ro3, _, g3 = scripted.make_rollout(datasets, **kw)
    _run(ro3, 7)
    self.assertEqual(g1.prompts_seen, g3.prompts_seen)

  def test_a_stuck_dataset_restores_exactly(self):
    datasets = [('easy', 0.5, [1.0] * 8), ('hard', 0.5, [0.5] * 32)]
    kw = dict(balance='post_filter', batch_size=4, round_size=8,
              max_rounds=4, surplus='drop', short_batch='train')
    ro1, s1, g1 = scripted.make_rollout(datasets, **kw)
    _run(ro1, 2)
    self.assertEqual(sorted(s1.get_state()['stuck']), ['easy'])
    # Through a real checkpoint, which gives dicts back with sorted keys.
    ckpt = checkpoint_lib.Checkpointer(self.create_tempdir().full_path,
                                       every=1, max_to_keep=1)
    ckpt.save(2, {'w': np.zeros(2, np.float32)}, {'source': s1.get_state()},
              {'config': {}})
    state = ckpt.restore_data(2)['source']
    ckpt.close()
    rng_state, seen = g1.rng.bit_generator.state, len(g1.prompts_seen)
    cont1 = [r.metrics for r in _run(ro1, 3, start=2)]
    # Datasets in another order on the resume: 'stuck' is kept by name.
    ro2, s2, g2 = scripted.make_rollout(datasets[::-1], **kw)
    s2.set_state(state)
    g2.rng.bit_generator.state = rng_state
    cont2 = [r.metrics for r in _run(ro2, 3, start=2)]
    self.assertEqual(cont2[0]['data/stuck/easy'], 1.0)
    self.assertEqual([m['data/stuck/easy'] for m in cont1],
                     [m['data/stuck/easy'] for m in cont2])
    ro3, s3, g3 = scripted.make_rollout(datasets, **kw)
    s3.set_state(state)
    g3.rng.bit_generator.state = rng_state
    _run(ro3, 3, start=2)
    self.assertEqual(g1.prompts_seen[seen:], g3.prompts_seen)


class HeldRestoreTest(absltest.TestCase):

  def test_held_examples_restore_in_the_order_of_the_datasets(self):
    # rollout.in_flight='retry' admits the held examples first, in this
    # order. A checkpoint gives the held indices back keyed by dataset name
    # in sorted order ('alpha' before 'zeta'); the resumed run admitted
    # them in that order, and its steps differed from the run's that never
    # stopped.
    policy = snooze.PolicyConfig(policy='none', group_size=2)

    def sampler():
      return mixture.MixtureSampler(
          [(mixture.DatasetSpec(name=n, weight=1.0, policy=policy),
            scripted.make_examples(n, 20)) for n in ('zeta', 'alpha')],
          balance='pre_filter', batch_size=4, seed=0)

    before = sampler()
    before.start_step(1)
    drawn = before.next_prompts(8)
    self.assertEqual({ex.dataset for ex in drawn}, {'zeta', 'alpha'})
    before.hold(drawn)
    held = before.held()
    self.assertEqual(held[0].dataset, 'zeta')
    ckpt = checkpoint_lib.Checkpointer(self.create_tempdir().full_path,
                                       every=1, max_to_keep=1)
    ckpt.save(1, {'x': np.zeros(1)}, {'source': before.get_state()}, {})
    ckpt.wait()
    saved = ckpt.restore_data(1)['source']
    ckpt.close()
    self.assertEqual(list(saved['held']), ['alpha', 'zeta'])
    after = sampler()
    after.set_state(saved)
    self.assertEqual(after.held(), held)


if __name__ == '__main__':
  absltest.main()
