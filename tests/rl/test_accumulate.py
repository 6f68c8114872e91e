"""Tests for dynamic sampling's bookkeeping: StepStats and the Accumulator."""

import dataclasses

from absl.testing import absltest
import numpy as np

from jaxgrpo.example import Example
from jaxgrpo.rl import accumulate
from jaxgrpo.rl import rounds

G = 4


class StepStatsTest(absltest.TestCase):

  def test_to_metrics_names_and_values(self):
    stats = accumulate.StepStats(
        names=['a', 'b'], batch_size=4, rounds=2, prompts_asked=16.0,
        prompts_generated=np.array([6, 2]), groups_used=np.array([3, 1]),
        truncated=np.array([1.0, 0.0]), tokens_generated=100.0,
        groups_easy=2.0, groups_hard=1.0, carried_in=1, in_hand=5, held=0,
        surplus=1, cum_prompts_generated=40, cum_groups_used=12,
        reward_sums={'b': [4.0, 8.0], 'a': [3.0, 24.0], 'a/x': [1.0, 8.0]},
        verify_errors=1.0, verify_timeouts=0.0, gen_s=2.0, verify_s=0.5,
        tokens_used=40.0, tokens_wasted=12.0, groups_discarded=2,
        slot_steps=80, busy_slot_steps=60)
    self.assertEqual(stats.to_metrics(), {
        'rollout/prompts_generated': 8.0,
        'rollout/tokens_generated': 100.0,
        'rollout/tokens_used': 40.0,
        'rollout/tokens_wasted': 12.0,
        'rollout/groups_discarded': 2.0,
        'rollout/groups_used': 4.0,
        'rollout/groups_easy': 2.0,
        'rollout/groups_hard': 1.0,
        'rollout/rounds': 2.0,
        'rollout/round_size': 8.0,
        'rollout/efficiency': 0.5,
        'rollout/cum_prompts_generated': 40.0,
        'rollout/cum_groups_used': 12.0,
        'rollout/batch_short': 0.0,
        'rollout/carried_in': 1.0,
        'rollout/held': 0.0,
        'train/batch_fill': 1.0,
        'rollout/surplus': 1.0,
        'verify/errors': 1.0,
        'verify/timeouts': 0.0,
        'verify/printed': 0.0,
        'verify/workers_replaced': 0.0,
        'perf/verify_s': 0.5,
        'perf/gen_s': 2.0,
        'perf/gen_tokens_per_s': 50.0,
        'rollout/slot_occupancy': 0.75,
        # Over the datasets' rewards; a subset's are in its dataset's too.
        'reward/mean': 7.0 / 32.0,
        'reward/mean/a': 0.125,
        'reward/mean/a/x': 0.125,
        'reward/mean/b': 0.5,
        'rollout/prompts_generated/a': 6.0,
        'rollout/groups_used/a': 3.0,
        'data/batch_share/a': 0.75,
        'data/truncated/a': 1.0,
        'rollout/prompts_generated/b': 2.0,
        'rollout/groups_used/b': 1.0,
        'data/batch_share/b': 0.25,
        'data/truncated/b': 0.0,
    })

  def test_a_step_without_rounds(self):
    m = accumulate.StepStats.empty(['a'], batch_size=4).to_metrics()
    self.assertEqual(m['rollout/round_size'], 0.0)
    self.assertEqual(m['rollout/efficiency'], 1.0)
    self.assertEqual(m['rollout/batch_short'], 4.0)
    self.assertEqual(m['train/batch_fill'], 0.0)
    self.assertEqual(m['perf/gen_tokens_per_s'], 0.0)
    self.assertNotIn('data/batch_share/a', m)  # no batch: no share
    self.assertNotIn('reward/mean', m)


def _group(dataset: str, i: int, rewards) -> rounds.Group:
  return rounds.Group(
      example=Example(id=f'{dataset}/{i}', prompt=f'{i}=', answer='1',
                      dataset=dataset),
      prompt_tokens=np.full(3, i, np.int32), prompt_mask=np.ones(3, bool),
      completion_tokens=np.full((G, 2), i, np.int32),
      completion_mask=np.ones((G, 2), bool),
      old_logps=np.full((G, 2), -0.5, np.float32),
      rewards=np.asarray(rewards, np.float32))


def _round(groups, truncated=None) -> rounds.Round:
  return rounds.Round(
      groups=groups, rewards=np.stack([g.rewards for g in groups]),
      gen_s=1.0, gen_tokens=8.0 * len(groups), verify_s=0.25,
      verify_errors=1.0, truncated=truncated)


def _add(acc, groups, size, truncated=None):
  rnd = _round(groups, truncated)
  acc.add(rnd, size, rounds.classify(rnd.rewards, 1.0, 0.0))


def _first(n):
  return lambda groups: (list(groups[:n]), list(groups[n:]))


MIXED, RIGHT, WRONG = [1, 0, 1, 0], [1] * G, [0] * G


class AccumulatorTest(absltest.TestCase):

  def _accumulator(self, **kw):
    kw = {'batch_size': 2, 'short_batch': 'wait', 'surplus': 'carry', **kw}
    return accumulate.Accumulator(['a', 'b'], **kw)

  def test_groups_of_datasets_left_out_are_dropped(self):
    acc = self._accumulator()
    acc.carried = [_group('a', 0, MIXED), _group('b', 1, MIXED),
                   _group('b', 2, MIXED)]
    restored = self._accumulator()
    restored.set_state(acc.get_state())
    self.assertEqual(restored.drop_datasets(['b']), 2)
    self.assertEqual([g.example.id for g in restored.carried], ['a/0'])
    self.assertEqual(restored.drop_datasets(['b']), 0)

  def test_counts_informative_groups_per_dataset(self):
    acc = self._accumulator()
    acc.start()
    _add(acc, [_group('a', 0, MIXED), _group('a', 1, RIGHT),
               _group('b', 0, WRONG), _group('b', 1, MIXED)], size=4,
         truncated=np.array([True, False, True, True]))
    np.testing.assert_array_equal(acc.counts, [1, 1])
    groups, stats = acc.finish(_first(1))
    self.assertEqual([g.example.id for g in groups], ['a/0'])
    self.assertEqual([g.example.id for g in acc.carried], ['b/1'])
    self.assertEqual(stats.rounds, 1)
    self.assertEqual((stats.groups_easy, stats.groups_hard), (1.0, 1.0))
    np.testing.assert_array_equal(stats.prompts_generated, [2, 2])
    np.testing.assert_array_equal(stats.groups_used, [1, 0])
    np.testing.assert_array_equal(stats.truncated, [1.0, 2.0])
    self.assertEqual((stats.in_hand, stats.surplus, stats.held), (2, 1, 0))
    self.assertEqual(stats.reward_sums, {'a': [6.0, 8.0], 'b': [2.0, 8.0]})
    self.assertEqual((stats.tokens_generated, stats.verify_errors),
                     (32.0, 1.0))
    self.assertEqual((acc.cum_prompts_generated, acc.cum_groups_used), (4, 1))

  def test_share_of_completions_cut_at_max_new_tokens(self):
    # GSM8K lengths: T = 256, completions ending at their first token, in
    # the middle, at T (the last column a stop token, or cut there).
    def group(dataset, i, lengths):
      g = _group(dataset, i, MIXED)
      mask = np.arange(256)[None] < np.asarray(lengths)[:, None]
      return dataclasses.replace(
          g, completion_tokens=np.where(mask, 5, 0).astype(np.int32),
          completion_mask=mask, old_logps=np.where(mask, -0.5, 0.0))
    acc = self._accumulator(batch_size=4)
    acc.start()
    _add(acc, [group('a', 0, [1, 100, 256, 255]),
               group('b', 0, [256, 256, 3, 40])], size=2)
    _add(acc, [group('a', 1, [7, 7, 7, 256])], size=1)
    _, stats = acc.finish(_first(3))
    self.assertEqual((stats.completions, stats.completions_cut), (12.0, 4.0))
    self.assertEqual(stats.to_metrics()['rollout/completions_cut'], 4 / 12)
    # No completion scored (a batch all carried in): no share.
    acc.start()
    self.assertNotIn('rollout/completions_cut',
                     acc.finish(_first(3))[1].to_metrics())

  def test_verifier_prints_and_replaced_workers_are_summed_per_step(self):
    acc = self._accumulator()
    acc.start()
    for printed, replaced in ((3.0, 1.0), (2.0, 0.0)):
      rnd = dataclasses.replace(
          _round([_group('a', 0, MIXED)]), verify_printed=printed,
          verify_workers_replaced=replaced)
      acc.add(rnd, 1, rounds.classify(rnd.rewards, 1.0, 0.0))
    metrics = acc.finish(_first(2))[1].to_metrics()
    self.assertEqual((metrics['verify/printed'],
                      metrics['verify/workers_replaced']), (5.0, 1.0))
    # The next step starts from 0, and shows the zeros: every step has
    # both, so a chart of either drops back to 0 between events.
    acc.start()
    _add(acc, [_group('a', 1, MIXED)], size=1)
    metrics = acc.finish(_first(2))[1].to_metrics()
    self.assertEqual((metrics['verify/printed'],
                      metrics['verify/workers_replaced']), (0.0, 0.0))

  def test_carried_groups_start_the_next_step(self):
    acc = self._accumulator(batch_size=1)
    acc.start()
    _add(acc, [_group('a', 0, MIXED), _group('b', 0, MIXED)], size=2)
    acc.finish(_first(1))
    acc.start()
    self.assertEqual(acc.stats.carried_in, 1)
    np.testing.assert_array_equal(acc.counts, [0, 1])
    groups, stats = acc.finish(_first(1))
    self.assertEqual([g.example.id for g in groups], ['b/0'])
    self.assertEqual(stats.rounds, 0)
    self.assertEqual(acc.cum_groups_used, 2)

  def test_surplus_drop(self):
    acc = self._accumulator(batch_size=1, surplus='drop')
    acc.start()
    _add(acc, [_group('a', 0, MIXED), _group('a', 1, MIXED)], size=2)
    _, stats = acc.finish(_first(1))
    self.assertEqual(stats.surplus, 1)
    self.assertEmpty(acc.carried)

  def test_short_step_waits_and_holds_every_group(self):
    acc = self._accumulator(batch_size=3)
    acc.start()
    _add(acc, [_group('a', 0, MIXED), _group('b', 0, MIXED)], size=2)
    groups, stats = acc.finish(_first(3))
    self.assertEmpty(groups)
    self.assertEqual((stats.held, stats.in_hand), (2, 2))
    self.assertLen(acc.carried, 2)
    self.assertEqual(stats.to_metrics()['train/batch_fill'], 2 / 3)

  def test_short_step_trains_unless_waiting(self):
    for mode in ('scale', 'train'):
      acc = self._accumulator(batch_size=3, short_batch=mode)
      acc.start()
      _add(acc, [_group('a', 0, MIXED), _group('b', 0, MIXED)], size=2)
      groups, stats = acc.finish(_first(3))
      self.assertLen(groups, 2)
      self.assertEqual((stats.held, stats.to_metrics()['rollout/batch_short']),
                       (0, 1.0))

  def test_state_keeps_its_layout_and_round_trips(self):
    acc = self._accumulator(batch_size=3)
    acc.start()
    _add(acc, [_group('a', 0, MIXED), _group('b', 5, [0, 0, 1, 1])], size=2)
    acc.finish(_first(3))  # short: both held
    state = acc.get_state()
    self.assertEqual(set(state), {'cum_prompts_generated', 'cum_groups_used',
                                  'carried'})
    self.assertEqual(set(state['carried']), {
        'count', 'examples', 'prompt_tokens', 'prompt_mask',
        'completion_tokens', 'completion_mask', 'old_logps', 'rewards'})
    self.assertEqual(state['carried']['completion_tokens'].shape, (2, G, 2))
    twin = self._accumulator(batch_size=3)
    twin.set_state(state)
    self.assertEqual(twin.cum_prompts_generated, 2)
    for a, b in zip(acc.carried, twin.carried, strict=True):
      for field in dataclasses.fields(rounds.Group):
        np.testing.assert_array_equal(getattr(a, field.name),
                                      getattr(b, field.name))
    # No carried groups: one row of padding (checkpoints hold no empty
    # arrays), restored as none.
    empty = self._accumulator().get_state()
    self.assertEqual(empty['carried']['rewards'].shape, (1,))
    twin.set_state(empty)
    self.assertEmpty(twin.carried)


  def test_staleness_of_the_trained_tokens(self):
    # Kept rollouts: each token's version is the step that sampled it.
    acc = self._accumulator(batch_size=2, in_flight='keep')
    acc.start(7)
    old, new = _group('a', 0, MIXED), _group('b', 0, MIXED)
    old.versions = np.array([[5, 6], [5, 7], [6, 7], [7, -1]], np.int32)
    old.completion_mask[3, 1] = False
    new.versions = np.full((G, 2), 7, np.int32)
    _add(acc, [old, new], size=2)
    _, stats = acc.finish(_first(2))
    m = stats.to_metrics()
    # 7 - [5, 6, 5, 7, 6, 7, 7] and eight zeros, over 15 tokens.
    self.assertEqual(m['rollout/staleness_max'], 2.0)
    self.assertEqual(m['rollout/staleness_mean'], 6.0 / 15)
    self.assertIn('rollout/partial_kept', m)
    self.assertNotIn('rollout/partial_kept',
                     self._accumulator().stats.to_metrics())

  def test_groups_in_flight_round_trip(self):
    acc = self._accumulator(in_flight='keep')
    part = accumulate.Partial(
        example=Example(id='a/3', prompt='3=', answer='1', dataset='a',
                        meta={'stratum': 'x'}),
        prompt_tokens=np.arange(3, dtype=np.int32),
        prompt_mask=np.ones(3, bool), truncated=True,
        keys=np.arange(2 * G, dtype=np.uint32).reshape(G, 2),
        stop_at=np.zeros(G, np.int32),
        completion_tokens=np.full((G, 2), 4, np.int32),
        old_logps=np.full((G, 2), -0.25, np.float32),
        lengths=np.array([2, 1, 0, 2], np.int32),
        done=np.array([True, False, False, False]),
        versions=np.array([[3, 3], [3, -1], [-1, -1], [2, 3]], np.int32))
    acc.in_flight = [part]
    self.assertEqual((part.tokens, part.oldest()), (5, 2))
    twin = self._accumulator(in_flight='keep')
    twin.set_state(acc.get_state())
    (back,) = twin.in_flight
    self.assertEqual(back.example, part.example)
    for field in dataclasses.fields(accumulate.Partial):
      np.testing.assert_array_equal(getattr(back, field.name),
                                    getattr(part, field.name))
    twin.set_state(self._accumulator(in_flight='keep').get_state())
    self.assertEmpty(twin.in_flight)


if __name__ == '__main__':
  absltest.main()
