"""Tests for the simulator: the real sampler driven by a synthetic learner."""

import dataclasses
import importlib.util
import json
import os
import time

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from jaxgrpo.data import mixture
from jaxgrpo.example import Example
from jaxgrpo.reporting import metrics as metrics_lib
from jaxgrpo.rl import rollout as rollout_lib
from jaxgrpo.rl import rounds
from jaxgrpo.sim import __main__ as cli
from jaxgrpo.sim import engine
from jaxgrpo.sim import experiments
from jaxgrpo.sim import learner as learner_lib
from jaxgrpo.sim import plots
from jaxgrpo.sim import report
from jaxgrpo.sim import standins

_HAS_MPL = importlib.util.find_spec('matplotlib') is not None
_NO_MPL = 'matplotlib not installed: pip install "jaxgrpo[plots]"'


def _spec(size=200, **kw):
  kw = {'steps': 20, 'batch_size': 8, 'round_size': 8, 'group_size': 8,
        'max_rounds': 16, **kw}
  return engine.SimSpec(
      datasets=(engine.SimDataset(
          name='math', size=size,
          difficulty=learner_lib.Difficulty(scale=3.0)),), **kw)


def _total(records, key):
  return sum(r[key] for r in records)


class LearnerTest(absltest.TestCase):

  def test_difficulty_quantiles_split_the_distribution(self):
    rng = np.random.default_rng(0)
    d = learner_lib.Difficulty(scale=2.0)
    easy = dataclasses.replace(d, quantiles=(0.5, 1.0)).sample(5000, rng)
    hard = dataclasses.replace(d, quantiles=(0.0, 0.5)).sample(5000, rng)
    self.assertGreater(easy.min(), -1e-6)
    self.assertLess(hard.max(), 1e-6)
    self.assertAlmostEqual(float(np.concatenate([easy, hard]).std()), 2.0,
                           delta=0.1)
    u = learner_lib.Difficulty(kind='uniform', loc=1.0, scale=0.5).sample(
        1000, rng)
    self.assertTrue(((u >= 0.5) & (u <= 1.5)).all())

  def test_bad_settings_are_named(self):
    with self.assertRaisesRegex(ValueError, 'kind'):
      learner_lib.Difficulty(kind='beta')
    with self.assertRaisesRegex(ValueError, 'quantiles'):
      learner_lib.Difficulty(quantiles=(0.5, 0.5))
    with self.assertRaisesRegex(ValueError, "unknown task 'c'"):
      learner_lib.Learner(tasks=['a', 'b'], skill0={}, lr=0.1, lr_example=0,
                          interference=[('a', 'c', -1.0)], batch_size=4)
    with self.assertRaisesRegex(ValueError, 'engine'):
      _spec(engine='gpu')

  def test_training_and_interference(self):
    lrn = learner_lib.Learner(
        tasks=['ans', 'unans'], skill0={'ans': 1.0}, lr=0.1, lr_example=0.5,
        interference=[('unans', 'ans', -0.5)], batch_size=4)
    rng = np.random.default_rng(0)
    lrn.add_dataset('ans', 10, learner_lib.Difficulty(), rng, heldout=100)
    lrn.add_dataset('unans', 10, learner_lib.Difficulty(), rng, heldout=100)
    before = lrn.pass_rate(0, np.arange(10))
    # Two answerable groups (example 3 twice) and two unanswerable.
    lrn.train([(0, np.array([3, 3])), (1, np.array([0, 1]))])
    # ans: 0.1 * (2 - 0.5 * 2) / 4; unans: 0.1 * 2 / 4.
    np.testing.assert_allclose(lrn.skill, [1.025, 0.05])
    self.assertAlmostEqual(float(lrn.memory[0][3]), 1.0)
    after = lrn.pass_rate(0, np.arange(10))
    self.assertTrue((after > before).all())
    acc = lrn.heldout_accuracy()
    self.assertEqual(set(acc), {'ans', 'unans'})
    # Only unanswerable training: the answerable skill falls.
    lrn.train([(1, np.arange(4))])
    self.assertLess(lrn.heldout_accuracy()['ans'], acc['ans'])


class StandInTest(absltest.TestCase):

  def test_lazy_sources(self):
    src = standins.SimSource('math', 10**9, code=3)
    self.assertLen(src, 10**9)
    ex = src[123456789]
    self.assertIsInstance(ex, Example)
    self.assertEqual((ex.id, ex.prompt, ex.dataset), ('math/123456789',
                                                      '3:123456789', 'math'))
    self.assertEqual(standins.example_index(ex), 123456789)
    with self.assertRaises(IndexError):
      src[10**9]
    fast = standins.IndexSource('math', 10, code=1)[4]
    self.assertEqual((fast.dataset, fast.code, fast.index), ('math', 1, 4))
    self.assertEqual(standins.SimTokenizer().encode(ex.prompt),
                     [7, 123456789 + 4])

  def test_generator_follows_pass_rates(self):
    lrn = learner_lib.Learner(tasks=['t'], skill0={}, lr=0.0, lr_example=0.0,
                              interference=[], batch_size=1)
    lrn.add_dataset('t', 2, learner_lib.Difficulty(kind='uniform', scale=0.0),
                    np.random.default_rng(0), heldout=1)
    lrn.offsets[0][:] = [-50.0, 50.0]  # never / always right
    gen = standins.SimGenerator(lrn, group_size=4, seed=0)
    tok = standins.SimTokenizer()
    tokens = np.array([tok.encode('0:0'), tok.encode('0:1')], np.int32)
    out = gen.generate(None, tokens, None, None)
    texts = [tok.decode(row) for row in out.tokens]
    self.assertEqual(texts, [standins.WRONG] * 4 + [standins.RIGHT] * 4)


class RunTest(parameterized.TestCase):

  def test_uses_the_real_sampler_and_rollout(self):
    sim = engine.build(_spec())
    self.assertIsInstance(sim.sampler, mixture.MixtureSampler)
    self.assertIs(type(sim.rollout), rollout_lib.Rollout)
    self.assertIsInstance(sim.rollout.round_fn, rounds.ModelRound)
    fast = engine.build(_spec(engine='fast')).rollout
    self.assertIs(type(fast), rollout_lib.Rollout)
    self.assertIsInstance(fast.round_fn, standins.FastRound)

  @parameterized.parameters('rollout', 'fast')
  def test_snooze_tables_are_driven(self, eng):
    # A strong learner on a small set: many groups come out too easy.
    kw = dict(skill0={'math': 3.0}, engine=eng)
    none = engine.run(_spec(policy='none', **kw))
    snoozed = engine.run(_spec(policy='snooze', **kw))
    filtered = engine.run(_spec(policy='filter', **kw))
    self.assertEqual(_total(none, 'data/snoozed/math'), 0)
    self.assertEqual(_total(none, 'data/filtered/math'), 0)
    self.assertGreater(snoozed[-1]['data/snoozed/math'], 0)
    self.assertEqual(_total(snoozed, 'data/filtered/math'), 0)
    self.assertGreater(filtered[-1]['data/filtered/math'], 0)
    for r in none:
      self.assertEqual(r['rollout/groups_used'], 8)  # B informative groups
      for key in ('rollout/prompts_generated', 'rollout/efficiency',
                  'reward/mean', 'data/batch_share/math',
                  'sim/accuracy/math', 'sim/cum_generator_calls'):
        self.assertIn(key, r)

  def test_engines_give_identical_metrics(self):
    datasets = (
        engine.SimDataset(name='a', size=300, weight=0.7),
        engine.SimDataset(name='b', size=50, weight=0.3,
                          difficulty=learner_lib.Difficulty(loc=1.0)),
    )
    spec = engine.SimSpec(datasets=datasets, policy='snooze_prob',
                          snooze_factor=2, balance='post_filter',
                          batch_size=8, round_size='adaptive', max_rounds=6,
                          steps=25, skill0={'a': 1.0}, lr=0.05,
                          interference=(('b', 'a', -0.3),), seed=3)
    slow = engine.run(spec)
    fast = engine.run(dataclasses.replace(spec, engine='fast'))
    for r_slow, r_fast in zip(slow, fast, strict=True):
      keys = {k for k in r_slow if not k.startswith(('perf/', 'verify/'))}
      self.assertEqual(keys, {k for k in r_fast
                              if not k.startswith(('perf/', 'verify/'))})
      for k in keys:
        self.assertEqual(r_slow[k], r_fast[k], (r_slow['step'], k))

  def test_learner_improves_with_steps(self):
    records = engine.run(_spec(steps=30, lr=0.05, engine='fast'))
    acc = [r['sim/accuracy/math'] for r in records]
    self.assertGreater(acc[-1], acc[0] + 0.05)
    self.assertTrue(all(b >= a for a, b in zip(acc, acc[1:])))

  def test_filter_generates_fewer_prompts_on_a_mastered_set(self):
    kw = dict(steps=40, skill0={'math': 3.0}, engine='fast')
    none = engine.run(_spec(policy='none', **kw))
    filtered = engine.run(_spec(policy='filter', **kw))
    self.assertLess(filtered[-1]['rollout/cum_prompts_generated'],
                    0.8 * none[-1]['rollout/cum_prompts_generated'])
    # Both trained on full batches, so the learner is equally good.
    self.assertEqual(none[-1]['rollout/cum_groups_used'],
                     filtered[-1]['rollout/cum_groups_used'])

  def test_conflict_filter_degrades_the_majority(self):
    # The conflict experiment's mixture at a sixth of its size and batch.
    spec = dataclasses.replace(
        experiments.conflict_spec(1000, 400, 'fast'), batch_size=16,
        round_size=16)

    def answerable(policy, s=spec):
      records = engine.run(dataclasses.replace(s, policy=policy))
      acc = np.array([r['sim/accuracy/answerable'] for r in records])
      share = [r.get('data/batch_share/unanswerable', np.nan)
               for r in records]  # absent on a step without an update
      return acc, np.nanmax(plots.smooth(share, 25))

    none, none_share = answerable('none')
    filt, filt_share = answerable('filter')
    # Filtering fills the batch with the minority task...
    self.assertGreater(filt_share, 0.5)
    self.assertLess(none_share, 0.5)
    # ...and the majority's accuracy falls from its peak; under none it
    # keeps rising.
    self.assertLess(filt[-1], none[-1])
    self.assertGreater(filt.max() - filt[-1], 0.005)
    self.assertAlmostEqual(none.max(), none[-1])
    # Without interference the filtered run stalls but does not fall.
    calm, _ = answerable('filter', dataclasses.replace(spec, interference=()))
    self.assertLess(calm.max() - calm[-1], 1e-3)

  def test_million_examples_run_in_seconds(self):
    spec = _spec(size=1_000_000, steps=20, batch_size=64, round_size=64)
    t0 = time.perf_counter()
    records = engine.run(spec)
    wall = time.perf_counter() - t0
    self.assertLen(records, 20)
    self.assertLess(wall, 15.0)  # about 0.5 s on a 2-core CPU

  def test_writes_metrics_jsonl(self):
    workdir = self.create_tempdir().full_path
    records = engine.run(_spec(steps=3), workdir=workdir)
    self.assertEqual(metrics_lib.read_metrics(workdir), json.loads(
        json.dumps(records)))


class ReportTest(absltest.TestCase):

  def test_a_metric_absent_at_a_step_is_left_out_not_zero(self):
    # Seed 0 takes no update at step 1, so it has no batch share there.
    runs = [[{'s': 0.5}, {}, {'s': 0.5}], [{'s': 0.3}, {'s': 0.7}, {}]]
    np.testing.assert_allclose(report.mean(runs, 's'), [0.4, 0.7, 0.5])
    self.assertTrue(np.isnan(report.mean([[{}]], 's')).all())
    self.assertAlmostEqual(report.part(np.array([np.nan, 0.2] * 10),
                                       'first'), 0.2)
    np.testing.assert_allclose(plots.smooth([1.0, np.nan, 0.0], 2),
                               [1.0, 1.0, 0.0])


@absltest.skipUnless(_HAS_MPL, _NO_MPL)
class ExperimentsTest(parameterized.TestCase):

  @parameterized.parameters(*experiments.EXPERIMENTS)
  def test_runs_at_tiny_size(self, name):
    out = self.create_tempdir().full_path
    record = experiments.EXPERIMENTS[name](out, size=120, seeds=1, steps=3)
    with open(os.path.join(out, f'{name}.json'), encoding='utf-8') as f:
      self.assertEqual(json.load(f)['results'], json.loads(
          json.dumps(record['results'])))
    png = os.path.join(out, f'{name}.png')
    with open(png, 'rb') as f:
      self.assertEqual(f.read(8), b'\x89PNG\r\n\x1a\n')
    self.assertLess(os.path.getsize(png), 100_000)

  def test_cli(self):
    out = self.create_tempdir().full_path
    self.assertEqual(cli.main(['efficiency', '--out', out, '--size', '100',
                               '--seeds', '2', '--steps', '3',
                               '--workers', '1', '--engine', 'fast']), 0)
    with open(os.path.join(out, 'efficiency.json'), encoding='utf-8') as f:
      record = json.load(f)
    self.assertEqual(record['seeds'], 2)
    self.assertEqual(set(record['results']),
                     {label for label, _ in experiments.EFFICIENCY_POLICIES})
    self.assertAlmostEqual(
        record['results']['none']['saving_prompts_vs_none'], 1.0)


if __name__ == '__main__':
  absltest.main()
