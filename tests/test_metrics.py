"""Tests for the metrics record and console lines."""

import os

from absl.testing import absltest

from jaxgrpo import metrics as metrics_lib


class MetricsWriterTest(absltest.TestCase):

  def test_resume_cuts_back_and_fresh_start_empties(self):
    workdir = self.create_tempdir().full_path
    writer = metrics_lib.MetricsWriter(workdir)
    for step in range(4):
      writer.write(step, {'reward/mean': step / 10, 'x': float('nan')})
    writer.close()
    with open(os.path.join(workdir, 'metrics.jsonl'), 'a') as f:
      f.write('{"step": 4, "cut sh')  # a line cut short by a crash
    writer = metrics_lib.MetricsWriter(workdir, resume_step=1)
    writer.write(2, {'reward/mean': 0.5})
    writer.close()
    records = metrics_lib.read_metrics(workdir)
    self.assertEqual([r['step'] for r in records], [0, 1, 2])
    self.assertEqual(records[2]['reward/mean'], 0.5)
    self.assertEqual(records[0]['x'], 'nan')
    metrics_lib.MetricsWriter(workdir, resume_step=-1).close()
    self.assertEqual(metrics_lib.read_metrics(workdir), [])


class ConsoleTest(absltest.TestCase):

  def test_averages_and_mixture_columns(self):
    window = metrics_lib.ConsoleWindow()
    window.add({'reward/mean': 0.2, 'rollout/efficiency': 0.5})
    window.add({'reward/mean': 0.4, 'rollout/efficiency': 0.7})
    line = window.line(10, 100, {'data/batch_share/a': 0.25,
                                 'data/batch_share/b': 0.75,
                                 'data/snoozed/a': 12.0,
                                 'data/snoozed/b': 0.0})
    self.assertIn('step  10/100', line)
    self.assertIn('reward 0.300', line)
    self.assertIn('eff 0.60', line)
    self.assertIn('share a=0.25 b=0.75', line)
    self.assertIn('snoozed a=12 b=0', line)
    self.assertNotIn('filtered', line)


if __name__ == '__main__':
  absltest.main()
