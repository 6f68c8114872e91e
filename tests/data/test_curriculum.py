"""Strata as sub-datasets of the mixture, and curriculum stages by step."""

import dataclasses
import os
from unittest import mock

from absl.testing import absltest
import numpy as np

from jaxgrpo import build
from jaxgrpo import config_lib
from jaxgrpo import errors
from jaxgrpo.configs import common
from jaxgrpo.data import curriculum
from jaxgrpo.data import mixture
from jaxgrpo.data import snooze
from jaxgrpo.data import sources
from jaxgrpo.stratify import passrates
from tests import scripted

EDGES = (0.25, 0.5, 0.75)
NAMES = curriculum.stratum_names(EDGES)


def _strata(index, prior=None):
  return curriculum.Strata(names=NAMES, index=np.asarray(index),
                           prior=prior)


def _sampler(n, index, stages=(), policy='none', prior=None, batch_size=8):
  examples = scripted.make_examples('a', n)
  spec = mixture.DatasetSpec(name='a', weight=1.0,
                             policy=snooze.PolicyConfig(policy=policy))
  return mixture.MixtureSampler(
      [(spec, examples)], balance='pre_filter', batch_size=batch_size,
      seed=0, strata={'a': _strata(index, prior)},
      curriculum=curriculum.Curriculum(
          [curriculum.Stage(s, w) for s, w in stages]))


class CurriculumTest(absltest.TestCase):

  def test_names(self):
    self.assertEqual(NAMES, ('too_hard', '0-0.25', '0.25-0.5', '0.5-0.75',
                             '0.75-1', 'too_easy', 'unrated'))

  def test_weights_by_step(self):
    c = curriculum.Curriculum([
        curriculum.Stage(10, {'too_hard': 1.0, 'too_easy': 0.0}),
        curriculum.Stage(0, {'too_hard': 0.0, 'b/too_easy': 2.0}),
    ])
    names = ('too_hard', 'too_easy')
    self.assertEqual(c.stage_at(0), 0)
    self.assertEqual(c.stage_at(9), 0)
    self.assertEqual(c.stage_at(10), 1)
    np.testing.assert_array_equal(c.weights('a', names, 5), [0.0, 1.0])
    np.testing.assert_array_equal(c.weights('b', names, 5), [0.0, 2.0])
    np.testing.assert_array_equal(c.weights('a', names, 10), [1.0, 0.0])
    late = curriculum.Curriculum([curriculum.Stage(3, {'too_hard': 0.0})])
    self.assertEqual(late.stage_at(2), -1)
    np.testing.assert_array_equal(late.weights('a', names, 2), [1.0, 1.0])

  def test_match_by_id(self):
    rates = passrates.PassRates(
        ids=['a/3', 'a/0', 'a/1', 'zzz'],
        trials=np.array([4, 4, 4, 4]), passes=np.array([4, 0, 1, 2]),
        mean_reward=np.array([1.0, 0.0, 0.4, 0.5]))
    ids = [f'a/{i}' for i in range(5)]
    strata, unknown = curriculum.match(rates, ids, EDGES, prior=True)
    self.assertEqual(unknown, 1)
    self.assertEqual([NAMES[i] for i in strata.index],
                     ['too_hard', '0.25-0.5', 'unrated', 'too_easy',
                      'unrated'])
    # The bands read pass rates; the prior is the mean reward, on the scale
    # of the weighted policy's history (a partial credit: 0.4, not 0.25).
    np.testing.assert_array_equal(strata.prior[[0, 1, 3]], [0.0, 0.4, 1.0])
    self.assertTrue(np.isnan(strata.prior[[2, 4]]).all())
    self.assertEqual(strata.counts()['unrated'], 2)

  def test_postponed_until_the_stage_then_offered(self):
    # Examples 0-9 too hard, 10-39 in a band; too hard weigh 0 until step 3.
    index = [0] * 10 + [2] * 30
    s = _sampler(40, index, stages=[(0, {'too_hard': 0.0}), (3, {})])
    seen = {0: set(), 1: set()}
    for step in range(6):
      s.start_step(step)
      got = s.next_prompts(16)
      stage = 0 if step < 3 else 1
      seen[stage].update(int(ex.id.split('/')[1]) for ex in got)
      self.assertTrue(all(ex.meta['stratum'] in NAMES for ex in got))
      metrics = s.metrics()
      self.assertEqual(metrics['data/curriculum_stage'], stage)
      self.assertEqual(metrics['data/postponed/a'], 10.0 if stage == 0 else 0)
      self.assertEqual(metrics['data/stratum_weight/a/too_hard'],
                       0.0 if stage == 0 else 1.0)
    self.assertFalse(seen[0] & set(range(10)))
    self.assertEqual(seen[0], set(range(10, 40)))
    # Postponed, not lost: every too-hard example comes back.
    self.assertLessEqual(set(range(10)), seen[1])

  def test_weights_set_each_stratum_share(self):
    # Two equal strata, weights 1 : 3 -> offers about 1 : 3.
    index = [1] * 500 + [3] * 500
    s = _sampler(1000, index, stages=[(0, {'0-0.25': 1.0, '0.5-0.75': 3.0})])
    got = s.next_prompts(400)
    low = sum(ex.meta['stratum'] == '0-0.25' for ex in got)
    self.assertAlmostEqual(low / len(got), 0.25, delta=0.06)
    counts = s.tables[0].counts()
    self.assertGreater(counts['skipped_curriculum'], 0)

  def test_batch_share_of_strata(self):
    index = [0] * 20 + [5] * 20
    s = _sampler(40, index)
    got = s.next_prompts(40)

    @dataclasses.dataclass
    class G:
      example: object
    chosen, _ = s.choose([G(ex) for ex in got])
    m = s.metrics()
    self.assertLen(chosen, 8)
    total = sum(m[f'data/batch_share/a/{n}'] for n in NAMES)
    self.assertAlmostEqual(total, 1.0)
    hard = sum(g.example.meta['stratum'] == 'too_hard' for g in chosen)
    self.assertAlmostEqual(m['data/batch_share/a/too_hard'], hard / 8)
    # The next step ends without choosing (short_batch='wait'): no batch,
    # so no shares, and its weights are still reported.
    s.start_step(1)
    s.next_prompts(8)
    m = s.metrics()
    self.assertFalse([k for k in m if k.startswith('data/batch_share/')])
    self.assertIn('data/stratum_weight/a/too_hard', m)

  def test_all_strata_postponed_closes_the_dataset(self):
    s = _sampler(10, [0] * 10, stages=[(0, {'too_hard': 0.0})])
    self.assertEqual(s.metrics()['data/exhausted/a'], 1.0)
    self.assertEqual(s.next_prompts(4), [])

  def test_prior_drives_the_weighted_policy(self):
    prior = np.array([1.0] * 10 + [0.5] * 10 + [np.nan] * 10)
    table = snooze.SnoozeTable(30, snooze.PolicyConfig(policy='weighted'),
                               seed=0)
    table.set_strata(np.zeros(30, int), 1, prior)
    p = table.informative_prob()
    self.assertAlmostEqual(p[0], 0.0)
    self.assertAlmostEqual(p[10], 1 - 2 * 0.5**8)
    self.assertAlmostEqual(p[25], p[10])  # unrated: the running mean (0.5)
    offered = np.zeros(30)
    for _ in range(200):
      for i in table.draw(30, 0):
        offered[i] += 1
    self.assertLess(offered[:10].mean(), offered[10:20].mean() * 0.2)

  def test_a_weight_key_of_an_unknown_dataset_is_refused(self):
    # 'b/too_hard' for a mixture of 'a' alone: a misspelt dataset name left
    # the stratum at weight 1 without a word.
    with self.assertRaisesRegex(
        errors.ConfigError, r"curriculum.stages\[1\].weights\['b/too_hard'\]: "
        r"no dataset 'b' in data.datasets \(a\)"):
      _sampler(10, [0] * 10, stages=[(0, {}), (5, {'b/too_hard': 0.0})])
    s = _sampler(10, [0] * 10, stages=[(0, {'a/too_hard': 0.0})])
    self.assertEqual(s.next_prompts(4), [])

  def test_a_weight_key_of_a_dataset_without_strata_is_refused(self):
    # A mixture of 'a' and 'b' with pass rates of 'a' alone: 'b/too_hard'
    # left every example of 'b' offered without a word.
    specs = [(mixture.DatasetSpec(name=n, weight=1.0,
                                  policy=snooze.PolicyConfig()),
              scripted.make_examples(n, 10)) for n in 'ab']
    stages = [curriculum.Stage(0, {'a/too_easy': 0.0, 'b/too_hard': 0.0})]
    with self.assertRaisesRegex(
        errors.ConfigError, r"curriculum.stages\[0\].weights\['b/too_hard'\]: "
        r"dataset 'b' has no strata: curriculum.strata has no pass rates of "
        r'it \(it has them of a\); measure it with jaxgrpo-stratify run '
        '--datasets=b'):
      mixture.MixtureSampler(
          specs, balance='pre_filter', batch_size=8, seed=0,
          strata={'a': _strata([0] * 10)},
          curriculum=curriculum.Curriculum(stages))

  def test_a_closed_dataset_of_a_mixture_hands_its_slots_over(self):
    specs = [(mixture.DatasetSpec(name=n, weight=1.0,
                                  policy=snooze.PolicyConfig()),
              scripted.make_examples(n, 10)) for n in 'ab']
    lines = []
    s = mixture.MixtureSampler(
        specs, balance='post_filter', batch_size=8, seed=0,
        strata={'a': _strata([0] * 10)}, log=lines.append,
        curriculum=curriculum.Curriculum(
            [curriculum.Stage(0, {'too_hard': 0.0})]))
    self.assertEqual({ex.dataset for ex in s.next_prompts(8)}, {'b'})
    self.assertIn("step 0: curriculum stage 0 gives every example of dataset "
                  "'a' weight 0; it offers nothing until a later stage: the "
                  'other datasets fill its batch slots', lines)

  def test_a_restored_sampler_says_the_stage_of_its_step(self):
    # Restored at step 5 (stage 1), it said stage 0's weights "at step 0"
    # first, a step the run did not take.
    def sampler(lines):
      examples = scripted.make_examples('a', 10)
      spec = mixture.DatasetSpec(name='a', weight=1.0,
                                 policy=snooze.PolicyConfig())
      return mixture.MixtureSampler(
          [(spec, examples)], balance='pre_filter', batch_size=4, seed=0,
          strata={'a': _strata([0] * 5 + [5] * 5)}, log=lines.append,
          curriculum=curriculum.Curriculum(
              [curriculum.Stage(0, {'too_hard': 0.0}),
               curriculum.Stage(4, {'too_easy': 0.0})]))

    first = []
    s = sampler(first)
    s.start_step(1)
    self.assertEqual(first, ["step 1: curriculum stage 0, dataset 'a' strata "
                             'weights: too_hard 0, 0-0.25 1, 0.25-0.5 1, '
                             '0.5-0.75 1, 0.75-1 1, too_easy 1, unrated 1'])
    s.start_step(5)
    state = s.get_state()
    lines = []
    restored = sampler(lines)
    restored.set_state(state)
    self.assertEqual(lines, [])
    restored.start_step(6)
    self.assertEqual(lines, [first[1].replace('step 5', 'step 6')])

  def test_strata_changed_since_a_checkpoint_are_named(self):
    # Pass rates completed (or measured again) between a checkpoint and its
    # resume moved examples to other strata without a word.
    then = curriculum.notes({'a': _strata([0, 2, 6])})
    self.assertEqual(then['a']['counts']['unrated'], 1)
    where = 'checkpoint of step 1 in W/checkpoints'
    self.assertEqual(curriculum.changes(
        then, curriculum.notes({'a': _strata([0, 2, 6])}), where=where), [])
    self.assertEqual(curriculum.changes(
        None, curriculum.notes({'a': _strata([0, 2, 2])}), where=where), [])
    self.assertEqual(curriculum.changes(
        then, curriculum.notes({'a': _strata([0, 2, 2])}), where=where),
        ["dataset 'a': its strata changed since the checkpoint of step 1 in "
         'W/checkpoints (the pass rates in curriculum.strata were measured '
         'again or completed): too_hard 1, 0.25-0.5 1, unrated 1 then, '
         'too_hard 1, 0.25-0.5 2 now; its examples are offered by the strata '
         'of now'])
    # Saved before examples whose every verifier call failed were left
    # unrated (no 'failed' noted), resumed with 1 such example unrated: the
    # reason was only 'measured again or completed'.
    older = {'a': {k: v for k, v in then['a'].items() if k != 'failed'}}
    now = curriculum.notes({'a': dataclasses.replace(
        _strata([0, 2, 6]), failed=1)})
    self.assertEqual(now['a']['failed'], 1)
    changed = curriculum.changes(
        older, curriculum.notes({'a': dataclasses.replace(
            _strata([6, 2, 6]), failed=1)}), where=where)
    self.assertEqual(changed, [
        "dataset 'a': its strata changed since the checkpoint of step 1 in "
        'W/checkpoints (the pass rates in curriculum.strata were measured '
        'again or completed, or because the 1 examples whose every verifier '
        'call failed are unrated now, where the version that saved it filed '
        'them too_hard): too_hard 1, 0.25-0.5 1, unrated 1 then, 0.25-0.5 1, '
        'unrated 2 now; its examples are offered by the strata of now'])
    # Saved by this version: measured again is the reason.
    self.assertNotIn('version', curriculum.changes(
        then, curriculum.notes({'a': dataclasses.replace(
            _strata([6, 2, 6]), failed=1)}), where=where)[0])
    # The same strata with other pass rates as the weighted policy's prior.
    prior = np.array([0.0, 0.3, np.nan])
    self.assertLen(curriculum.changes(
        curriculum.notes({'a': _strata([0, 2, 6], prior)}),
        curriculum.notes({'a': _strata([0, 2, 6], prior + 0.1)}),
        where=where), 1)

  def test_resume_after_a_stage_switch_draws_as_uninterrupted(self):
    # Resumed before, at or after a stage boundary (steps 3 and 5), the
    # sampler offers what the uninterrupted one offers, step by step.
    index = [0] * 10 + [2] * 20 + [5] * 10
    stages = [(0, {'too_hard': 0.0}), (3, {}), (5, {'0.25-0.5': 0.0})]

    def steps(sampler, first, last):
      out = {}
      for step in range(first, last + 1):
        sampler.start_step(step)
        out[step] = [ex.id for ex in sampler.next_prompts(12)]
        out[step, 'metrics'] = sampler.metrics()
      return out

    whole = steps(_sampler(40, index, stages=stages), 1, 7)
    self.assertEqual(whole[7, 'metrics']['data/curriculum_stage'], 2)
    for cut in range(1, 7):
      with self.subTest(saved_after_step=cut):
        first = _sampler(40, index, stages=stages)
        got = steps(first, 1, cut)
        resumed = _sampler(40, index, stages=stages)
        resumed.set_state(first.get_state())
        got.update(steps(resumed, cut + 1, 7))
        self.assertEqual(got, whole)

  def test_old_state_without_curriculum_counter_restores(self):
    table = snooze.SnoozeTable(8, snooze.PolicyConfig(), seed=0)
    state = table.get_state()
    del state['skipped_curriculum']
    table.set_state(state)
    self.assertEqual(table.counts()['skipped_curriculum'], 0)

  def test_bad_strata(self):
    table = snooze.SnoozeTable(4, snooze.PolicyConfig(), seed=0)
    with self.assertRaisesRegex(ValueError, 'one index per example'):
      table.set_strata(np.zeros(3, int), 2)
    with self.assertRaisesRegex(ValueError, r'in \[0, 2\)'):
      table.set_strata(np.array([0, 1, 2, 0]), 2)
    table.set_strata(np.zeros(4, int), 2)
    with self.assertRaisesRegex(ValueError, 'finite values >= 0'):
      table.set_stratum_weights([1.0, -1.0])


class ConfigTest(absltest.TestCase):

  def _config(self, **keys):
    c = common.base_config()
    for k, v in keys.items():
      c.curriculum[k] = v
    return c

  def test_defaults_and_valid_stages(self):
    cfg = config_lib.from_config_dict(self._config(
        strata='/tmp/s', stages=({'step': 0, 'weights': {'too_hard': 0.0}},
                                 {'step': 5, 'weights': {
                                     'arithmetic/too_easy': 0}})))
    self.assertEqual(cfg.curriculum.stages[1]['step'], 5)
    self.assertIsNone(config_lib.from_config_dict(
        common.base_config()).curriculum.strata)

  def test_numpy_numbers_in_stages_are_plain_numbers(self):
    cfg = config_lib.from_config_dict(self._config(strata='/tmp/s', stages=(
        {'step': np.int64(3), 'weights': {'too_hard': np.float32(0.5),
                                          'too_easy': np.int64(0)}},)))
    stage = cfg.curriculum.stages[0]
    self.assertEqual(stage, {'step': 3, 'weights': {'too_hard': 0.5,
                                                    'too_easy': 0}})
    self.assertIs(type(stage['step']), int)
    self.assertIs(type(stage['weights']['too_hard']), float)
    for bad, pattern in ((True, r'stages\[0\].step=True'),
                         (1.5, r'stages\[0\].step=1.5')):
      with self.assertRaisesRegex(errors.ConfigError, pattern):
        config_lib.from_config_dict(self._config(strata='/tmp/s', stages=(
            {'step': bad, 'weights': {}},)))
    with self.assertRaisesRegex(errors.ConfigError, r"\['too_hard'\]=True"):
      config_lib.from_config_dict(self._config(strata='/tmp/s', stages=(
          {'step': 0, 'weights': {'too_hard': True}},)))

  def test_errors_name_the_key(self):
    cases = [
        (dict(stages=({'step': 0, 'weights': {}},)),
         'curriculum.stages.*need curriculum.strata'),
        (dict(strata='s', stages=({'step': 0, 'weights': {'hardest': 0}},)),
         r"curriculum.stages\[0\].weights\['hardest'\]: unknown stratum"),
        (dict(strata='s', stages=({'step': 5, 'weights': {}},
                                  {'step': 5, 'weights': {}})),
         r'curriculum.stages\[1\].step=5'),
        (dict(strata='s', stages=({'step': 0, 'weights': {'too_hard': -1}},)),
         r"weights\['too_hard'\]=-1: must be a number >= 0"),
        (dict(strata='s', stages=({'step': 0},)),
         r"curriculum.stages\[0\].*'step' and 'weights'"),
        (dict(strata='s', stages=({'step': 0, 'weights': {'b/too_hard': 0}},)),
         "no dataset 'b' in data.datasets"),
        (dict(bands=(0.5, 0.25)), 'curriculum.bands'),
        (dict(bands=(0.25, 0.2500001)),
         r'curriculum.bands.*would give two strata the same name \(0.25\)'),
    ]
    for keys, pattern in cases:
      with self.subTest(keys=keys):
        with self.assertRaisesRegex(errors.ConfigError, pattern):
          config_lib.from_config_dict(self._config(**keys))

  def test_load_errors(self):
    with self.assertRaisesRegex(errors.ConfigError, 'curriculum.strata='):
      curriculum.load(self.create_tempdir().full_path, {'a': []}, edges=EDGES)

  def test_pass_rates_of_other_records_are_said_to_be(self):
    examples = scripted.make_examples('a', 4)
    out = self.create_tempdir().full_path
    passrates.write_part(
        out, 'a', 'm1', shard=0, num_shards=1, part=0,
        ids=[ex.id for ex in examples], k=np.full(4, 2),
        passes=np.array([0, 1, 2, 2]), mean_reward=np.array([0, .5, 1, 1]),
        info={'fingerprint': sources.fingerprint(examples)})
    lines = []
    curriculum.load(out, {'a': examples}, edges=EDGES, log=lines.append)
    self.assertFalse([l for l in lines if 'is not the one' in l], lines)
    # curriculum.strata='~/...' is the home folder's ('no pass rates there').
    with mock.patch.dict(os.environ, {'HOME': os.path.dirname(out)}):
      strata = curriculum.load(f'~/{os.path.basename(out)}',
                               {'a': examples}, edges=EDGES)
    self.assertEqual(list(strata), ['a'])
    lines = []
    curriculum.load(out, {'a': scripted.make_examples('a', 5)}, edges=EDGES,
                    log=lines.append)
    self.assertStartsWith(lines[0], "curriculum: dataset 'a' is not the one "
                          f'its pass rates in {out} were measured on')

  def test_pass_rates_of_an_unfinished_run_are_said_to_be(self):
    # A jaxgrpo-stratify run interrupted after its first part of two: the
    # examples it did not reach were 'unrated' without a word.
    examples = scripted.make_examples('a', 4)
    out = self.create_tempdir().full_path

    def write(part, members):
      passrates.write_part(
          out, 'a', 'm1', shard=0, num_shards=1, part=part,
          ids=[examples[i].id for i in members], k=np.full(2, 2),
          passes=np.array([0, 2]), mean_reward=np.array([0, 1]),
          info={'examples': 4, 'fingerprint': sources.fingerprint(examples)})

    write(0, [0, 1])
    lines = []
    curriculum.load(out, {'a': examples}, edges=EDGES, log=lines.append)
    self.assertEqual(
        lines[0], "curriculum: dataset 'a': checkpoint 'm1' has pass rates of "
        f'2 of the 4 examples its jaxgrpo-stratify run set out to measure in '
        f'{out} (interrupted, or shards not run yet); the others are unrated '
        'unless another checkpoint rated them: the same jaxgrpo-stratify run '
        'command finishes it')
    self.assertIn('unrated 2', lines[1])
    write(1, [2, 3])
    lines = []
    curriculum.load(out, {'a': examples}, edges=EDGES, log=lines.append)
    self.assertLen(lines, 1)
    self.assertNotIn('unrated', lines[0])

  def test_stages_after_the_last_step_are_said_to_never_apply(self):
    # configs/curriculum_demo.py with --config.total_steps=100: its stages
    # of steps 150 and 300 never started, the too-hard stayed postponed.
    examples = scripted.make_examples('arithmetic', 4)
    out = self.create_tempdir().full_path
    passrates.write_part(
        out, 'arithmetic', 'm1', shard=0, num_shards=1, part=0,
        ids=[ex.id for ex in examples], k=np.full(4, 2),
        passes=np.array([0, 1, 2, 2]), mean_reward=np.array([0, .5, 1, 1]),
        info={})
    c = self._config(strata=out, stages=(
        {'step': 0, 'weights': {'too_hard': 0.0}},
        {'step': 100, 'weights': {}}, {'step': 150, 'weights': {}}))
    c.total_steps = 100
    spec = mixture.DatasetSpec(name='arithmetic', weight=1.0,
                               policy=snooze.PolicyConfig())
    lines = []
    build._source(config_lib.from_config_dict(c),  # pylint: disable=protected-access
                  [(spec, examples, [])], lines.append)
    self.assertEqual(
        [l for l in lines if l.startswith('curriculum.stages')],
        ['curriculum.stages[2] starts at step 150, after the last step '
         '(total_steps=100): it never applies'])


if __name__ == '__main__':
  absltest.main()
