"""scripts/reproduce.py stays runnable: every experiment, a few steps."""

import json
import os
import sys

from absl.testing import absltest

from tests import test_train

sys.path.insert(0, os.path.join(test_train.REPO, 'scripts'))
import reproduce  # pylint: disable=g-import-not-at-top,wrong-import-position


class ReproduceTest(absltest.TestCase):

  def test_each_experiment_runs_and_summarizes(self):
    out = self.create_tempdir().full_path
    for experiment in reproduce.EXPERIMENTS:
      summary = reproduce.run_experiment(
          experiment, seeds=[0], steps=2, out=out, smoke=True,
          log=lambda _: None)
      _, table = reproduce.variants(experiment, smoke=True)
      self.assertEqual(set(summary['variants']), set(table))
      for name, v in summary['variants'].items():
        self.assertEqual(v['mean']['steps'], 2, (experiment, name))
        self.assertGreater(v['mean']['prompts_generated'], 0)
      with open(os.path.join(out, f'{experiment}.json')) as f:
        self.assertEqual(json.load(f)['experiment'], experiment)
      if reproduce_has_plots():
        self.assertGreater(
            os.path.getsize(os.path.join(out, f'{experiment}.png')), 1000)


def reproduce_has_plots() -> bool:
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    return False
  return True


if __name__ == '__main__':
  absltest.main()
