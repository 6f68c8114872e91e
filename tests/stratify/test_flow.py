"""The docs/sampler.md flow at tiny size: stratify a run's checkpoint, then
train with a curriculum over the measured strata."""

import collections

from absl.testing import absltest
import numpy as np

from jaxgrpo import config_lib
from jaxgrpo import train
from jaxgrpo.data import curriculum
from jaxgrpo.reporting import metrics as metrics_lib
from jaxgrpo.stratify import passrates
from jaxgrpo.stratify import runner
from tests import test_train

DATASET = 'arithmetic'


def _config(**overrides):
  # 'starts_with_digit' gives an untrained model pass rates strewn over
  # (0, 1), so several strata are populated.
  c = test_train._config(**overrides)  # pylint: disable=protected-access
  c.data.datasets[0]['num_train'] = 48
  c.data.datasets[0]['num_eval'] = 4
  c.rollout.group_size = 4
  c.rollout.batch_size = 4
  c.rollout.round_size = 4
  return c


class StratifyThenTrainTest(absltest.TestCase):

  def test_stages_switch_at_their_steps(self):
    start = self.create_tempdir().full_path
    train.run(_config(total_steps=0), start, log=lambda _: None)
    strata_dir = self.create_tempdir().full_path
    counts = runner.run(config_lib.from_config_dict(_config()), [start],
                        strata_dir, k=4, progress=False, log=lambda _: None)
    self.assertEqual((counts.done, counts.resumed), (48, 0))
    rates = passrates.read(strata_dir)[DATASET]
    self.assertLen(rates.ids, 48)
    np.testing.assert_array_equal(rates.trials, 4)

    # Postpone the most populated stratum for steps 1-2, offer everything
    # at steps 3-4, then only that stratum from step 5 on.
    names = curriculum.stratum_names((0.25, 0.5, 0.75))
    per_stratum = collections.Counter(
        names[i] for i in
        curriculum.load(strata_dir, {DATASET: _Ids(rates.ids)},
                        edges=(0.25, 0.5, 0.75),
                        log=lambda _: None)[DATASET].index)
    big = per_stratum.most_common(1)[0][0]
    self.assertLess(per_stratum[big], 48, 'a single stratum: nothing to test')
    others = {n: 0.0 for n in names if n != big}
    c = _config(total_steps=6)
    # Every group of a step's batch is offered in that step: none carried
    # from the last step's surplus or held from a short one.
    c.rollout.surplus = 'drop'
    c.rollout.short_batch = 'train'
    c.curriculum.strata = strata_dir
    c.curriculum.stages = (
        {'step': 1, 'weights': {big: 0.0}},
        {'step': 3, 'weights': {}},
        {'step': 5, 'weights': others},
    )
    workdir = self.create_tempdir().full_path
    lines = []
    train.run(c, workdir, log=lines.append)
    self.assertTrue(any(line.startswith('curriculum: dataset') and
                        f'{big} {per_stratum[big]}' in line
                        for line in lines), lines)
    records = {r['step']: r for r in metrics_lib.read_metrics(workdir)
               if r['step'] > 0}
    self.assertEqual(sorted(records), [1, 2, 3, 4, 5, 6])
    stage = {s: records[s]['data/curriculum_stage'] for s in records}
    self.assertEqual(stage, {1: 0, 2: 0, 3: 1, 4: 1, 5: 2, 6: 2})
    for s, r in records.items():
      weight = r[f'data/stratum_weight/{DATASET}/{big}']
      self.assertEqual(weight, 0.0 if s < 3 else 1.0, s)
      share = r[f'data/batch_share/{DATASET}/{big}']
      shares = sum(r[f'data/batch_share/{DATASET}/{n}'] for n in names)
      if s < 3:
        self.assertEqual(share, 0.0, (s, r))
      if s >= 5:
        self.assertEqual(share, shares, (s, r))  # nothing else is offered
        for n in others:
          self.assertEqual(r[f'data/stratum_weight/{DATASET}/{n}'], 0.0)
      self.assertGreater(r['rollout/groups_used'], 0, s)
    self.assertGreater(
        sum(records[s][f'data/batch_share/{DATASET}/{big}'] for s in (3, 4)),
        0.0)


  def test_curriculum_demo_config_trains(self):
    from jaxgrpo.configs import curriculum_demo  # pylint: disable=g-import-not-at-top
    c = curriculum_demo.get_config('runlocal')
    c.warmstart.enabled = False
    c.data.datasets[0]['verifier'] = 'starts_with_digit'
    c.verify.imports = ('tests.flaky_verifiers',)
    c.curriculum.strata = self.create_tempdir().full_path
    runner.run(config_lib.from_config_dict(c), ['init'], c.curriculum.strata,
               k=4, progress=False, log=lambda _: None)
    workdir = self.create_tempdir().full_path
    lines = []
    summary = train.run(c, workdir, log=lines.append)
    self.assertEqual(summary.steps, 2)
    records = metrics_lib.read_metrics(workdir)
    self.assertEqual([r.get('data/curriculum_stage') for r in records[1:]],
                     [0.0, 1.0])
    self.assertEqual(records[1][f'data/stratum_weight/{DATASET}/too_hard'],
                     0.0)
    self.assertEqual(records[2][f'data/stratum_weight/{DATASET}/too_easy'],
                     0.0)
    self.assertTrue(any('curriculum stage 1' in line for line in lines))


class _Ids:
  """Stands for a dataset where only the ids are needed."""

  def __init__(self, ids):
    self._ids = list(ids)

  def __len__(self):
    return len(self._ids)

  def __getitem__(self, i):
    return collections.namedtuple('Ex', 'id')(self._ids[i])


if __name__ == '__main__':
  absltest.main()
