"""Tests for the per-dataset snooze table, driven by scripted pass rates."""

import collections
import contextlib
import math
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import hypothesis
from hypothesis import strategies as st
import numpy as np

from jaxgrpo.data import snooze

ACTIVE, SNOOZED, FILTERED, EASY = (
    snooze.ACTIVE, snooze.SNOOZED, snooze.FILTERED, snooze.EASY)
_SETTINGS = hypothesis.settings(max_examples=25, deadline=None)


def _table(policy, size, *, seed=0, **kw):
  return snooze.SnoozeTable(size, snooze.PolicyConfig(policy=policy, **kw),
                            seed=seed)


def _pass_rates(size, seed):
  """A scripted per-example pass rate: a mix of easy, hard and middling."""
  rng = np.random.default_rng(seed)
  return rng.choice([0.0, 0.2, 0.5, 0.9, 1.0], size=size)


class _Sim:
  """Draws rounds and feeds back rewards from scripted pass rates."""

  def __init__(self, table, pass_rate, *, group_size=4, seed=0):
    self.table, self.pass_rate, self.g = table, pass_rate, group_size
    self.rng = np.random.default_rng(seed)
    self.reward_sum, self.reward_count = 0.0, 0

  def round(self, n, step):
    drawn = self.table.draw(n, step)
    rewards = (self.rng.random((drawn.size, self.g))
               < self.pass_rate[drawn, None]).astype(np.float64)
    self.table.observe(drawn, rewards, step)
    self.reward_sum += rewards.sum()
    self.reward_count += rewards.size
    return drawn, rewards


class _Reference:
  """A literal, per-example model of the policies (small tables only)."""

  def __init__(self, table):
    self.size, self.cfg, self.seed = table.size, table.cfg, table.seed
    self.order = table.epoch_order
    self.status = [ACTIVE] * self.size
    self.wake = [0] * self.size
    self.s, self.t = [0] * self.size, [0] * self.size
    self.epoch, self.pos = 0, 0
    self.drawn_in = {}
    self.skipped = collections.Counter()
    self.total_s, self.total_t = 0.0, 0

  def _skip(self, i, e):
    cfg = self.cfg
    u = float(snooze.uniform(self.seed, e, np.array([i]))[0])
    n = cfg.snooze_factor
    if self.status[i] == FILTERED:
      return 'skipped_filtered'
    if self.status[i] == SNOOZED and self.wake[i] > e:
      return 'skipped_snoozed'
    if self.status[i] == EASY and u < n / (n + 1):
      return 'skipped_snoozed'
    if cfg.policy == 'weighted':
      m = cfg.prior_mean
      if m is None:
        m = self.total_s / self.total_t if self.total_t else 0.5
      k, g = cfg.prior_strength, cfg.group_size
      p = (m * k + self.s[i]) / (k + self.t[i])
      if u >= max(cfg.w_min, 1 - p**g - (1 - p)**g):
        return 'skipped_weighted'
    return None

  def draw(self, n):
    cfg = self.cfg
    easy = cfg.snooze_factor if cfg.policy in ('snooze', 'snooze_prob') else 0
    max_empty = 1 + max(easy, cfg.snooze_hard_factor)
    budget = math.ceil(n / self.size) + max_empty
    touched, run, whole, offered = 1, 0, self.pos == 0, 0
    order, out = self.order(self.epoch), []
    while len(out) < n:
      if self.pos == self.size:
        run = run + 1 if whole and not offered else 0
        if run >= max_empty or touched >= budget:
          break
        self.epoch, self.pos = self.epoch + 1, 0
        order = self.order(self.epoch)
        touched, whole, offered = touched + 1, True, 0
      i = int(order[self.pos])
      self.pos += 1
      why = self._skip(i, self.epoch)
      if why:
        self.skipped[why] += 1
      else:
        out.append(i)
        offered += 1
        self.drawn_in[i] = self.epoch
    return out

  def observe(self, indices, rewards):
    cfg = self.cfg
    for i, row in zip(indices, rewards):
      total = float(np.clip(row, 0, 1).sum())
      self.s[i] += round(total)
      self.t[i] += len(row)
      self.total_s += total
      self.total_t += len(row)
      easy = all(r >= cfg.easy_threshold for r in row)
      hard = all(r <= cfg.hard_threshold for r in row)
      if self.status[i] == FILTERED:  # For good, whatever comes after.
        continue
      self.status[i] = ACTIVE
      if easy and cfg.policy == 'filter':
        self.status[i] = FILTERED
      elif easy and cfg.policy == 'snooze':
        self.status[i] = SNOOZED
        self.wake[i] = self.drawn_in[i] + cfg.snooze_factor + 1
      elif easy and cfg.policy == 'snooze_prob':
        self.status[i] = EASY
      if hard and cfg.snooze_hard_factor:
        self.status[i] = SNOOZED
        self.wake[i] = self.drawn_in[i] + cfg.snooze_hard_factor + 1


def _expected_offers(table, epoch, running_mean):
  """Indices the state says to offer in epoch, written out independently."""
  cfg, out = table.cfg, []
  n = cfg.snooze_factor
  for i in range(table.size):
    u = float(snooze.uniform(table.seed, epoch, np.array([i]))[0])
    st_ = table.status[i]
    if st_ == FILTERED or (st_ == SNOOZED and table.wake_epoch[i] > epoch):
      continue
    if st_ == EASY and u < n / (n + 1):
      continue
    if cfg.policy == 'weighted':
      k, g = cfg.prior_strength, cfg.group_size
      p = (running_mean * k + float(table.successes[i])) / (
          k + float(table.trials[i]))
      if u >= max(cfg.w_min, 1 - p**g - (1 - p)**g):
        continue
    out.append(i)
  return out


class SnoozeTableTest(parameterized.TestCase):

  @_SETTINGS
  @hypothesis.given(size=st.integers(1, 3000), seed=st.integers(0, 2**40),
                    epoch=st.integers(0, 10**6))
  def test_epoch_order_is_a_permutation(self, size, seed, epoch):
    order = _table('none', size, seed=seed).epoch_order(epoch)
    np.testing.assert_array_equal(np.sort(order), np.arange(size))

  def test_epoch_orders_are_reshuffled_and_roughly_uniform(self):
    table = _table('none', 8, seed=3)
    firsts = [table.epoch_order(e)[0] for e in range(2000)]
    hist = np.bincount(firsts, minlength=8)
    self.assertTrue(np.all(np.abs(hist - 250) < 60), hist)  # 4 sigma.
    big = _table('none', 1000, seed=3)
    self.assertFalse(np.array_equal(big.epoch_order(0), big.epoch_order(1)))
    other = _table('none', 1000, seed=4)
    self.assertFalse(np.array_equal(big.epoch_order(0), other.epoch_order(0)))

  @_SETTINGS
  @hypothesis.given(
      policy=st.sampled_from(snooze.POLICIES), size=st.integers(1, 40),
      round_size=st.integers(1, 50), n=st.integers(1, 4),
      hard=st.integers(0, 3), g=st.integers(1, 6), seed=st.integers(0, 999))
  def test_matches_literal_reference(self, policy, size, round_size, n, hard,
                                     g, seed):
    if policy in ('snooze_prob', 'weighted'):
      hard = 0  # Wake epochs differ by design there; see observe().
    table = _table(policy, size, seed=seed, snooze_factor=n,
                   snooze_hard_factor=hard, group_size=g)
    ref = _Reference(table)
    sim = _Sim(table, _pass_rates(size, seed), group_size=g, seed=seed)
    for step in range(20):
      drawn, rewards = sim.round(round_size, step)
      self.assertEqual(drawn.tolist(), ref.draw(round_size), f'round {step}')
      ref.observe(drawn.tolist(), rewards)
    np.testing.assert_array_equal(table.status, ref.status)
    sleeping = table.status == SNOOZED
    np.testing.assert_array_equal(table.wake_epoch[sleeping],
                                  np.array(ref.wake)[sleeping])
    np.testing.assert_array_equal(table.successes, ref.s)
    np.testing.assert_array_equal(table.trials, ref.t)
    counts = table.counts()
    self.assertEqual(counts['epoch'], ref.epoch)
    for key in ('skipped_snoozed', 'skipped_filtered', 'skipped_weighted'):
      self.assertEqual(counts[key], ref.skipped[key], key)

  @_SETTINGS
  @hypothesis.given(
      policy=st.sampled_from(snooze.POLICIES), size=st.integers(1, 60),
      n=st.integers(1, 4), hard=st.integers(0, 2), seed=st.integers(0, 999))
  def test_epoch_offers_exactly_the_examples_not_skipped(
      self, policy, size, n, hard, seed):
    table = _table(policy, size, seed=seed, snooze_factor=n,
                   snooze_hard_factor=hard)
    sim = _Sim(table, _pass_rates(size, seed), seed=seed)
    for step in range(6):
      sim.round(max(1, size // 3), step)
    # Start the next epoch from its beginning with the state frozen.
    state = table.get_state()
    epoch = int(state['epoch']) + 1
    state.update(epoch=np.int64(epoch), position=np.int64(0))
    table.set_state(state)
    mean = sim.reward_sum / sim.reward_count
    expected = _expected_offers(table, epoch, mean)
    got = table.draw(len(expected), step=7)
    self.assertCountEqual(got.tolist(), expected)  # None lost or repeated.
    rank = {int(i): r for r, i in enumerate(table.epoch_order(epoch))}
    self.assertEqual(got.tolist(), sorted(expected, key=rank.get))
    self.assertEqual(table.counts()['epoch'], epoch)
    if expected:
      self.assertTrue(np.all(table.last_step[got] == 7))
    # Nothing else was offerable in this epoch: the next offer is later.
    if table.draw(1, step=8).size:
      self.assertGreater(table.counts()['epoch'], epoch)

  @parameterized.parameters(1, 2, 4)
  def test_snooze_sleeps_exactly_n_epochs(self, n):
    rates = np.linspace(0.6, 1.0, 15)
    table = _table('snooze', 15, seed=n, snooze_factor=n)
    rng = np.random.default_rng(n)
    offers = []  # (epoch, index, too easy)
    for step in range(400):
      got = table.draw(1, step)
      self.assertLen(got, 1)
      rewards = (rng.random((1, 4)) < rates[got, None]).astype(float)
      # A draw rolls into a new epoch before it offers, so the table's epoch
      # after the call is the offer's epoch.
      offers.append((table.counts()['epoch'], int(got[0]), rewards.all()))
      table.observe(got, rewards, step)
    last_epoch = offers[-1][0]
    by_example = collections.defaultdict(list)
    for epoch, i, easy in offers:
      by_example[i].append((epoch, easy))
    checked = 0
    for history in by_example.values():
      for (e, easy), (e_next, _) in zip(history, history[1:]):
        self.assertEqual(e_next, e + n + 1 if easy else e + 1)
        checked += easy
      e, easy = history[-1]
      # Its next epoch is still being walked: it was not lost.
      self.assertLessEqual(last_epoch, e + n + 1 if easy else e + 1)
    self.assertGreater(checked, 10)

  def test_snooze_wakes_in_its_epoch_when_a_draw_crosses_epochs(self):
    table = _table('snooze', 10, seed=0, snooze_factor=2)
    first = table.draw(16, step=0)  # All of epoch 0, then 6 of epoch 1.
    self.assertEqual(table.counts()['epoch'], 1)
    table.observe(first, np.ones((16, 4)), step=0)
    in_epoch_1 = set(first[10:].tolist())
    self.assertLen(in_epoch_1, 6)
    self.assertEqual(table.draw(4, step=1).size, 4)  # Wakes after 2 empty.
    self.assertEqual(table.counts()['epoch'], 3)
    np.testing.assert_array_equal(
        table.wake_epoch, [4 if i in in_epoch_1 else 3 for i in range(10)])
    self.assertEqual(table.draw(6, step=2).size, 6)
    self.assertEqual(table.counts()['epoch'], 4)
    # Skipped: 4 in epoch 1, 10 in epoch 2, the 6 later sleepers in epoch 3.
    self.assertEqual(table.counts()['skipped_snoozed'], 4 + 10 + 6)

  def test_none_offers_every_example_every_epoch(self):
    table = _table('none', 4, snooze_factor=2)
    first = table.draw(4, step=0)  # All of epoch 0.
    table.observe(first, np.ones((4, 2)), step=0)  # Every group too easy.
    second = table.draw(4, step=1)
    self.assertCountEqual(second.tolist(), range(4))
    self.assertEqual(table.counts()['epoch'], 1)
    self.assertEqual(table.counts()['snoozed'], 0)
    self.assertEqual(table.counts()['skipped_snoozed'], 0)

  def test_too_hard_is_snoozed_only_with_snooze_hard_factor(self):
    for hard, epoch, skipped in ((0, 1, 0), (2, 3, 8)):
      table = _table('snooze', 4, snooze_factor=5, snooze_hard_factor=hard)
      first = table.draw(4, step=0)  # All of epoch 0.
      table.observe(first, np.zeros((4, 2)), step=0)  # All too hard.
      self.assertEqual(table.counts()['snoozed'], 4 if hard else 0)
      # Off: offered again in epoch 1. H = 2: asleep in epochs 1 and 2,
      # offered in epoch 3 (not N = 5, the too-easy side's).
      self.assertCountEqual(table.draw(4, step=1).tolist(), range(4))
      self.assertEqual(table.counts()['epoch'], epoch, hard)
      self.assertEqual(table.counts()['skipped_snoozed'], skipped, hard)

  def test_filter_never_offers_again_and_terminates(self):
    table = _table('filter', 50)
    drawn = table.draw(30, step=0)
    table.observe(drawn, np.ones((30, 8)), step=0)
    later = table.draw(100, step=1)
    self.assertEmpty(set(later.tolist()) & set(drawn.tolist()))
    self.assertLen(later, 60)  # 20 per epoch, within its epoch budget.
    table.observe(later, np.ones((later.size, 8)), step=1)
    self.assertEqual(table.counts()['filtered'], 50)
    epoch = table.counts()['epoch']
    self.assertEqual(table.draw(64, step=2).size, 0)
    # It stops at the end of the first whole epoch that offered nothing.
    self.assertEqual(table.counts()['epoch'], epoch + 1)
    self.assertEqual(table.position, 64)  # The walk covers 2^6 positions.
    self.assertEqual(table.draw(1, step=3).size, 0)

  def test_snooze_all_asleep_walks_until_they_wake(self):
    table = _table('snooze', 10, snooze_factor=3)
    drawn = table.draw(10, step=0)
    table.observe(drawn, np.ones((10, 4)), step=0)
    self.assertEqual(table.counts()['snoozed'], 10)
    got = table.draw(5, step=1)
    self.assertLen(got, 5)
    self.assertEqual(table.counts()['epoch'], 4)
    self.assertEqual(table.counts()['skipped_snoozed'], 30)

  def test_epochs_that_offer_nothing_are_walked_at_once(self):
    # One draw walked each of N empty epochs chunk by chunk: 18.5 s for
    # 20,000 examples at N = 10,000, tens of minutes at N near 2**20.
    table = _table('snooze', 20_000, snooze_factor=10_000)
    drawn = table.draw(20_000, step=0)
    table.observe(drawn, np.ones((drawn.size, 4)), step=0)
    with mock.patch.object(snooze.counter_random, 'feistel',
                           wraps=snooze.counter_random.feistel) as walked:
      got = table.draw(4, step=1)
    self.assertLen(got, 4)
    self.assertEqual(table.counts()['epoch'], 10_001)
    self.assertEqual(table.counts()['skipped_snoozed'], 10_000 * 20_000)
    self.assertLess(walked.call_count, 10)

  @_SETTINGS
  @hypothesis.given(
      policy=st.sampled_from(('none', 'filter', 'snooze')),
      size=st.integers(1, 30), n=st.integers(1, 40), hard=st.integers(0, 40),
      round_size=st.integers(1, 70), seed=st.integers(0, 999))
  def test_walked_at_once_as_one_by_one(self, policy, size, n, hard,
                                        round_size, seed):
    # The same offers, epochs, skip counts and state as the walk through
    # every epoch, including where a draw gives up (all filtered, or the
    # budget of epochs spent).
    def run(fast):
      table = _table(policy, size, seed=seed, snooze_factor=n,
                     snooze_hard_factor=hard, group_size=4)
      sim = _Sim(table, _pass_rates(size, seed), seed=seed)
      with mock.patch.object(snooze.SnoozeTable, '_quiet_epochs',
                             autospec=True, return_value=0) if not fast \
          else contextlib.nullcontext():
        rounds = [sim.round(round_size, step)[0].tolist()
                  for step in range(12)]
      return rounds, table.get_state()
    (fast, fast_state), (slow, slow_state) = run(True), run(False)
    self.assertEqual(fast, slow)
    self.assertEqual(sorted(fast_state), sorted(slow_state))
    for key in fast_state:
      np.testing.assert_array_equal(fast_state[key], slow_state[key], key)

  @parameterized.parameters(1, 3)
  def test_snooze_prob_sleeps_n_epochs_on_average(self, n):
    table = _table('snooze_prob', 400, seed=n, snooze_factor=n)
    drawn = table.draw(400, step=0)
    table.observe(drawn, np.ones((400, 2)), step=0)
    self.assertTrue(np.all(table.status == EASY))
    self.assertEqual(table.counts()['snoozed'], 400)
    first = {}  # Index -> epoch of its first offer after it was marked.
    for step in range(1, 5000):
      got = table.draw(1, step)
      if got.size and int(got[0]) not in first:
        first[int(got[0])] = table.counts()['epoch']
      if len(first) == 400:
        break
    self.assertLen(first, 400)
    sleeps = np.array(list(first.values())) - 1  # Marked easy in epoch 0.
    se = math.sqrt(n * (n + 1) / 400)
    self.assertAlmostEqual(sleeps.mean(), n, delta=4 * se)

  def test_weighted_offer_frequency_matches_weight(self):
    size, g = 400, 8
    table = _table('weighted', size, seed=1, group_size=g, prior_mean=0.5,
                   w_min=0.05)
    state = table.get_state()
    succ = np.repeat([0, 4, 8, 15, 16], size // 5)
    state.update(successes=succ.astype(np.uint16),
                 trials=np.full(size, 16, np.uint16))
    table.set_state(state)
    w = np.maximum(0.05, table.informative_prob())
    got = table.draw(size * 30, step=0)
    epochs = table.counts()['epoch'] + table.position / 512
    freq = np.bincount(got, minlength=size) / epochs
    for cls in range(5):
      rows = slice(cls * 80, (cls + 1) * 80)
      self.assertAlmostEqual(freq[rows].mean(), w[rows].mean(), delta=0.03)
    self.assertGreater(table.counts()['skipped_weighted'], 0)

  @_SETTINGS
  @hypothesis.given(policy=st.sampled_from(snooze.POLICIES),
                    seed=st.integers(0, 2**31), rounds=st.integers(1, 12))
  def test_same_seed_same_decisions(self, policy, seed, rounds):
    runs = []
    for _ in range(2):
      table = _table(policy, 37, seed=seed, snooze_factor=2)
      sim = _Sim(table, _pass_rates(37, seed), seed=seed)
      runs.append([sim.round(11, s)[0].tolist() for s in range(rounds)])
      runs[-1].append(table.get_state())
    self.assertEqual(runs[0][:-1], runs[1][:-1])
    for key, value in runs[0][-1].items():
      np.testing.assert_array_equal(value, runs[1][-1][key], err_msg=key)

  @_SETTINGS
  @hypothesis.given(
      policy=st.sampled_from(snooze.POLICIES), size=st.integers(1, 80),
      before=st.integers(0, 8), round_size=st.integers(1, 30),
      hard=st.integers(0, 2), seed=st.integers(0, 999))
  def test_restore_mid_epoch_continues_identically(
      self, policy, size, before, round_size, hard, seed):
    kw = dict(snooze_factor=2, snooze_hard_factor=hard)
    table = _table(policy, size, seed=seed, **kw)
    rates = _pass_rates(size, seed)
    sim = _Sim(table, rates, seed=seed)
    for step in range(before):
      sim.round(round_size, step)
    table.draw(max(1, size // 4), before)  # Mid-epoch, unobserved draw.
    state = table.get_state()
    sim_state = sim.rng.bit_generator.state
    after = [sim.round(round_size, s)[0].tolist()
             for s in range(before + 1, before + 9)]
    final = table.get_state()

    restored = _table(policy, size, seed=seed + 1, **kw)  # Seed comes back.
    restored.set_state(state)
    sim2 = _Sim(restored, rates)
    sim2.rng.bit_generator.state = sim_state
    again = [sim2.round(round_size, s)[0].tolist()
             for s in range(before + 1, before + 9)]
    self.assertEqual(after, again)
    for key, value in restored.get_state().items():
      np.testing.assert_array_equal(value, final[key], err_msg=key)

  def test_state_is_plain_numpy_and_a_copy(self):
    table = _table('snooze', 20)
    sim = _Sim(table, np.full(20, 1.0))
    sim.round(8, 0)
    state = table.get_state()
    for key, value in state.items():
      self.assertIsInstance(value, (np.ndarray, np.generic), key)
    before = state['status'].copy()
    sim.round(8, 1)
    np.testing.assert_array_equal(state['status'], before)

  def test_set_state_rejects_other_sizes_and_partial_states(self):
    state = _table('none', 7).get_state()
    with self.assertRaisesRegex(ValueError, '7 examples.*has 8'):
      _table('none', 8).set_state(state)
    del state['wake_epoch']
    with self.assertRaisesRegex(ValueError, 'wake_epoch'):
      _table('none', 7).set_state(state)

  def test_remap_by_id_keeps_each_examples_state(self):
    old_ids = [f'q{i}' for i in range(50)]
    table = _table('snooze', 50, snooze_factor=3)
    sim = _Sim(table, _pass_rates(50, 3), seed=3)
    for step in range(12):
      sim.round(16, step)
    state = table.get_state()
    # The new version: shuffled, 10 records removed, 7 added.
    rng = np.random.default_rng(0)
    new_ids = [old_ids[i] for i in rng.permutation(50)[:40]]
    new_ids += [f'new{i}' for i in range(7)]
    rng.shuffle(new_ids)
    remapped = _table('snooze', 47, snooze_factor=3, seed=99)
    counts = remapped.set_state_remapped(
        state, snooze.id_hashes(old_ids), snooze.id_hashes(new_ids))
    self.assertEqual(counts, {'kept': 40, 'new': 7, 'removed': 10})
    for j, example_id in enumerate(new_ids):
      if example_id.startswith('new'):
        self.assertEqual(remapped.status[j], ACTIVE)
        self.assertEqual(remapped.trials[j], 0)
        self.assertEqual(remapped.last_step[j], -1)
        continue
      i = old_ids.index(example_id)
      for key in ('status', 'wake_epoch', 'successes', 'trials', 'last_step'):
        self.assertEqual(getattr(remapped, key)[j], state[key][i],
                         (example_id, key))
    self.assertEqual(remapped.epoch, int(state['epoch']) + 1)
    self.assertEqual(remapped.position, 0)
    self.assertEqual(remapped.seed, int(state['seed']))
    self.assertNotEmpty(remapped.draw(8, 12))  # the walk goes on

  def test_id_hashes_are_stable(self):
    # A fixed value: a resume in another process or Python version must get
    # the same hash (BLAKE2b-64 of the UTF-8 id, little-endian).
    self.assertEqual(int(snooze.id_hashes(['a'])[0]),
                     int.from_bytes(bytes.fromhex('40f89e395b66422f'), 'little'))
    self.assertEqual(snooze.id_hashes(['a', 'b', 'a']).dtype, np.uint64)
    self.assertLen(set(snooze.id_hashes(f'q{i}' for i in range(1000))), 1000)

  def test_bytes_per_example(self):
    table = _table('weighted', 1000)
    self.assertLessEqual(table.bytes_per_example, 16)
    self.assertEqual(table.bytes_per_example, 13)

  def test_fractional_thresholds(self):
    table = _table('filter', 4, easy_threshold=0.75, hard_threshold=0.25,
                   snooze_hard_factor=1)
    rewards = np.array([[0.75, 0.8, 1.0],    # Too easy: every reward >= 0.75.
                        [0.7, 1.0, 1.0],     # One below: informative.
                        [0.25, 0.0, 0.1],    # Too hard: every reward <= 0.25.
                        [0.3, 0.0, 0.0]])    # One above: informative.
    table.observe(np.arange(4), rewards, step=0)
    np.testing.assert_array_equal(table.status,
                                  [FILTERED, ACTIVE, SNOOZED, ACTIVE])
    np.testing.assert_array_equal(table.successes, [3, 3, 0, 0])
    np.testing.assert_array_equal(table.trials, [3, 3, 3, 3])
    self.assertEqual(table.wake_epoch[2], 1)  # Not yet reached in epoch 0.

  def test_float32_rewards_meet_their_threshold(self):
    table = _table('filter', 2, easy_threshold=0.9, hard_threshold=0.1,
                   snooze_hard_factor=1)
    rewards = np.array([[0.9, 0.9], [0.1, 0.1]], np.float32)
    table.observe(np.arange(2), rewards, step=0)
    np.testing.assert_array_equal(table.status, [FILTERED, SNOOZED])

  def test_counts(self):
    table = _table('snooze', 30, snooze_factor=1)
    drawn = table.draw(10, step=0)
    table.observe(drawn, np.ones((10, 2)), step=0)
    counts = table.counts()
    self.assertEqual(counts, {
        'active': 20, 'snoozed': 10, 'filtered': 0, 'epoch': 0,
        'skipped_snoozed': 0, 'skipped_filtered': 0, 'skipped_weighted': 0,
        'skipped_curriculum': 0})
    self.assertTrue(all(type(v) is int for v in counts.values()))
    table.draw(20, step=1)  # The rest of epoch 0.
    # All 20 awake ones of epoch 1 (the 10 sleep through it), 1 of epoch 2.
    self.assertLen(table.draw(21, step=2), 21)
    counts = table.counts()
    self.assertEqual(counts['epoch'], 2)
    self.assertEqual(counts['skipped_snoozed'], 10)
    self.assertEqual(counts['snoozed'], 0)  # Due again in epoch 2.

  def test_repeated_index_last_outcome_wins(self):
    table = _table('snooze', 3, snooze_factor=2)
    drawn = table.draw(7, step=0)  # A dataset smaller than the round.
    rewards = np.ones((7, 2))
    last = {int(i): r for r, i in enumerate(drawn)}
    rewards[last[0]] = [0.0, 1.0]  # Example 0's last outcome is informative.
    table.observe(drawn, rewards, step=0)
    self.assertEqual(table.status[0], ACTIVE)
    self.assertEqual(table.status[1], SNOOZED)
    np.testing.assert_array_equal(table.trials,
                                  2 * np.bincount(drawn, minlength=3))

  def test_filter_a_too_easy_row_filters_whatever_comes_after(self):
    # DESIGN: under filter a too-easy example is never offered again, even
    # when a later row of the same round (a round past an epoch's end) or a
    # later round at the same step (two groups in flight) is informative.
    table = _table('filter', 3, snooze_hard_factor=2)
    drawn = table.draw(7, step=0)  # A dataset smaller than the round.
    rows = {int(i): [r for r, j in enumerate(drawn) if j == i]
            for i in set(drawn.tolist())}
    self.assertGreater(len(rows[0]), 1)
    rewards = np.full((7, 2), [0.0, 1.0])  # Informative, but:
    rewards[rows[0][0]] = [1.0, 1.0]  # example 0 too easy first,
    rewards[rows[1][0]] = [1.0, 1.0]  # example 1 too easy, then too hard.
    rewards[rows[1][-1]] = [0.0, 0.0]
    table.observe(drawn, rewards, step=0)
    np.testing.assert_array_equal(table.status, [FILTERED, FILTERED, ACTIVE])
    table.observe(np.array([0, 2, 2]), np.array([[0.0, 1.0], [1.0, 1.0],
                                                 [0.0, 0.0]]), step=0)
    np.testing.assert_array_equal(table.status, [FILTERED] * 3)
    self.assertNotIn(0, table.draw(3, step=1).tolist())  # All filtered.

  def test_counts_saturate_keeping_the_pass_rate(self):
    table = _table('none', 2)
    rewards = np.zeros((2, 40_000))
    rewards[0, :30_000] = 1.0
    table.observe(np.arange(2), rewards, step=0)
    table.observe(np.arange(2), rewards, step=1)
    self.assertTrue(np.all(table.trials <= 65535))
    self.assertEqual(table.trials[0], 40_000)
    self.assertAlmostEqual(table.successes[0] / table.trials[0], 0.75)

  def test_informative_prob(self):
    table = _table('weighted', 3, group_size=4, prior_strength=2.0)
    np.testing.assert_allclose(table.informative_prob(),
                               1 - 2 * 0.5**4)  # Prior mean 0.5 before data.
    table.observe(np.array([0, 1]), np.array([[1.0] * 4, [1, 0, 0, 0]]), 0)
    m = 5 / 8  # Running mean; example 2 has never been seen.
    p = (m * 2 + np.array([4, 1, 0])) / (2 + np.array([4, 4, 0]))
    np.testing.assert_allclose(table.informative_prob(),
                               1 - p**4 - (1 - p)**4)
    np.testing.assert_allclose(table.informative_prob(np.array([2, 0])),
                               (1 - p**4 - (1 - p)**4)[[2, 0]])
    failing = _table('weighted', 2, group_size=4)
    failing.observe(np.array([0]), np.zeros((1, 4)), 0)
    self.assertEqual(failing.informative_prob()[1], 0.0)  # Running mean 0.
    fixed = _table('weighted', 3, group_size=4, prior_mean=0.1)
    fixed.observe(np.array([0]), np.ones((1, 4)), 0)
    self.assertAlmostEqual(fixed.informative_prob()[2],
                           1 - 0.1**4 - 0.9**4)

  def test_partial_credit_pass_rate_is_the_mean_reward(self):
    # Groups of G=2 repeated 5000 times: mean rewards 0.2, 0.7, 0.25, 0.5.
    # Rounded to the nearest count, 0.1 + 0.3 read as 0 and 0.6 + 0.8 as 1
    # (and 0.5 as 0, half to even): pass rates 0, 0.5 and 0.
    groups = np.array([[0.1, 0.3], [0.6, 0.8], [0.25, 0.25], [1.0, 0.0]])
    reps = 5000
    idx = np.repeat(np.arange(4), reps)
    table = _table('weighted', 4, group_size=2, prior_mean=0.5)
    table.observe(idx, groups[idx], step=0)
    np.testing.assert_array_equal(table.trials, [2 * reps] * 4)
    rates = table.successes / table.trials
    # Within 5 standard errors of the mean reward (a sum's fraction f adds
    # variance f(1-f) per group); binary rewards are counted exactly.
    se = np.sqrt(np.array([0.24, 0.24, 0.25, 0.0]) * reps) / (2 * reps)
    np.testing.assert_array_less(np.abs(rates - [0.2, 0.7, 0.25, 0.5]),
                                 5 * se + 1e-12)
    self.assertEqual(table.successes[3], reps)
    p = (0.5 * 2 + table.successes.astype(float)) / (2 + 2 * reps)
    np.testing.assert_allclose(table.informative_prob(), 1 - p**2 - (1 - p)**2)
    self.assertAlmostEqual(table.informative_prob()[0], 1 - 0.2**2 - 0.8**2,
                           delta=0.02)
    # The rounding is keyed by the completions scored so far: the same
    # rounds give the same counts, also across a restore.
    halves = (idx[:idx.size // 2], idx[idx.size // 2:])
    tables = [_table('weighted', 4, group_size=2, prior_mean=0.5)
              for _ in range(3)]
    for step, half in enumerate(halves):
      tables[0].observe(half, groups[half], step)
    tables[1].observe(halves[0], groups[halves[0]], 0)
    tables[2].set_state(tables[1].get_state())
    tables[2].observe(halves[1], groups[halves[1]], 1)
    np.testing.assert_array_equal(tables[2].successes, tables[0].successes)

  @parameterized.parameters(
      dict(policy='snoze'), dict(snooze_factor=-1), dict(snooze_factor=0),
      dict(w_min=0.0),
      dict(easy_threshold=0.5, hard_threshold=0.5), dict(group_size=0),
      dict(w_min=1.5), dict(prior_strength=0.0), dict(prior_mean=1.2))
  def test_config_validation(self, **kw):
    with self.assertRaises(ValueError):
      snooze.PolicyConfig(**kw)

  @_SETTINGS
  @hypothesis.given(
      policy=st.sampled_from(snooze.POLICIES), size=st.integers(30, 200),
      sizes=st.lists(st.integers(0, 90), min_size=1, max_size=6),
      seed=st.integers(0, 999))
  def test_draws_do_not_depend_on_how_they_are_split(self, policy, size,
                                                     sizes, seed):
    table = _table(policy, size, seed=seed, snooze_factor=1)
    sim = _Sim(table, _pass_rates(size, seed), seed=seed)
    for step in range(4):
      sim.round(size // 2, step)
    state = table.get_state()
    pieces = [table.draw(k, step=9) for k in sizes]
    table.set_state(state)
    whole = table.draw(sum(sizes), step=9)
    if all(p.size == k for p, k in zip(pieces, sizes)) and (
        whole.size == sum(sizes)):
      np.testing.assert_array_equal(np.concatenate(pieces), whole)


if __name__ == '__main__':
  absltest.main()


class OfferedInformativeRateTest(absltest.TestCase):

  def test_asleep_examples_do_not_pull_the_rate_down(self):
    table = _table('filter', 8)
    idx = np.arange(8)
    # Examples 0-3 are mastered (filtered), 4-7 are at pass rate 0.5.
    rewards = np.array([[1.0] * 4] * 4 + [[1.0, 0.0, 1.0, 0.0]] * 4,
                       np.float32)
    table.observe(idx, rewards, step=0)
    rate = table.offered_informative_rate(idx)
    want = float(table.informative_prob(idx[4:]).mean())
    self.assertAlmostEqual(rate, want, places=6)
    self.assertGreater(rate, float(table.informative_prob(idx).mean()))
    # Nothing left to offer: the rate is 0, not NaN.
    table.observe(idx[4:], np.ones((4, 4), np.float32), step=1)
    self.assertEqual(table.offered_informative_rate(idx), 0.0)
