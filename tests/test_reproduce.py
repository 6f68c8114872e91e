"""scripts/reproduce.py stays runnable: every experiment, a few steps."""

import json
import os
import sys

from absl.testing import absltest

from jaxgrpo import config_lib
from tests import test_train

sys.path.insert(0, os.path.join(test_train.REPO, 'scripts'))
import reproduce  # pylint: disable=g-import-not-at-top,wrong-import-position


class ReproduceTest(absltest.TestCase):

  def test_each_experiment_runs_and_summarizes(self):
    out = self.create_tempdir().full_path
    for experiment in reproduce.EXPERIMENTS:
      _, table = reproduce.variants(experiment, smoke=True)
      # Two variants each (the experiments share one code path); every
      # variant's config is checked below.
      only = list(table)[:2]
      summary = reproduce.run_experiment(
          experiment, seeds=[0], steps=2, out=out, smoke=True, only=only,
          log=lambda _: None)
      self.assertEqual(list(summary['variants']), only)
      for name, v in summary['variants'].items():
        self.assertEqual(v['mean']['steps'], 2, (experiment, name))
        self.assertGreater(v['mean']['prompts_generated'], 0)
      with open(os.path.join(out, f'{experiment}.json')) as f:
        self.assertEqual(json.load(f)['experiment'], experiment)
      if reproduce_has_plots():
        self.assertGreater(
            os.path.getsize(os.path.join(out, f'{experiment}.png')), 1000)

  def test_every_variant_config_is_valid(self):
    for experiment in reproduce.EXPERIMENTS:
      for smoke in (True, False):
        datasets, table = reproduce.variants(experiment, smoke=smoke)
        for name, overrides in table.items():
          c = reproduce._base(300, 0, smoke)  # pylint: disable=protected-access
          c.data.datasets = datasets
          for key, value in overrides.items():
            reproduce._set(c, key, value)  # pylint: disable=protected-access
          cfg = config_lib.from_config_dict(c)
          self.assertEqual(len(cfg.data.datasets), len(datasets),
                           (experiment, name))

  def test_unknown_variant_is_named(self):
    with self.assertRaisesRegex(ValueError, r"drift has no variant \['nope'\]"):
      reproduce.run_experiment('drift', seeds=[0], steps=1, out='/nonexistent',
                               only=['nope'])


def reproduce_has_plots() -> bool:
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    return False
  return True


if __name__ == '__main__':
  absltest.main()
