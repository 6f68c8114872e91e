"""Tests for the metrics record, TensorBoard events and console lines."""

import importlib.util
import os
import sys
from unittest import mock

from absl.testing import absltest

from jaxgrpo import metrics as metrics_lib
from jaxgrpo import tensorboard
from tests import clu_writers


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


class TensorBoardWhileTrainingTest(absltest.TestCase):

  def _resumed_run(self, workdir):
    """Steps 0-3, then a resume from step 1 that writes step 2 again."""
    writer = metrics_lib.MetricsWriter(workdir, tensorboard=True)
    for step in range(4):
      writer.write(step, {'reward/mean': step / 10, 'eval/accuracy': 0.5,
                          'data/note': 'text', 'train/loss': float('nan')})
    writer.sync()
    writer.close()
    writer = metrics_lib.MetricsWriter(workdir, resume_step=1,
                                       tensorboard=True)
    writer.write(2, {'reward/mean': 0.9})
    writer.close()

  def test_each_step_once_across_a_resume(self):
    workdir = self.create_tempdir().full_path
    logdir = os.path.join(workdir, 'tensorboard')
    os.makedirs(logdir)
    stale = os.path.join(logdir, 'events.out.tfevents.1.host')
    open(stale, 'w').close()
    with clu_writers.recording() as writers:
      self._resumed_run(workdir)
    first, resumed = writers
    self.assertEqual(first.logdir, logdir)
    self.assertFalse(first.kwargs['just_logging'])
    self.assertFalse(os.path.exists(stale))
    self.assertEqual([s for s, _ in first.scalars], [0, 1, 2, 3])
    self.assertEqual(set(first.scalars[0][1]),
                     {'reward/mean', 'eval/accuracy', 'train/loss'})
    self.assertGreater(first.flushes, 1)  # flushed with the checkpoint
    # The resumed run rebuilds the kept steps, then writes live.
    self.assertEqual([s for s, _ in resumed.scalars], [0, 1, 2])
    self.assertEqual(resumed.scalars[2][1], {'reward/mean': 0.9})
    self.assertTrue(first.closed and resumed.closed)

  def test_without_tensorflow_only_the_metrics_file(self):
    workdir = self.create_tempdir().full_path
    with mock.patch.dict(sys.modules, {'clu.metric_writers': None}):
      self.assertFalse(tensorboard.available())
      writer = metrics_lib.MetricsWriter(workdir, tensorboard=True)
      writer.write(0, {'reward/mean': 0.1})
      writer.close()
    self.assertIsNone(writer.tensorboard)
    self.assertFalse(os.path.exists(os.path.join(workdir, 'tensorboard')))
    self.assertLen(metrics_lib.read_metrics(workdir), 1)

  def test_real_event_files(self):
    if importlib.util.find_spec('tensorflow') is None:
      self.skipTest("tensorflow is not installed (pip install "
                    "'jaxgrpo[tensorboard]')")
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    workdir = self.create_tempdir().full_path
    self._resumed_run(workdir)
    logdir = os.path.join(workdir, 'tensorboard')
    (events,) = [os.path.join(logdir, f) for f in os.listdir(logdir)]
    steps, values = {}, {}
    for event in tf.compat.v1.train.summary_iterator(events):
      for value in event.summary.value:
        steps.setdefault(value.tag, []).append(event.step)
        values[(value.tag, event.step)] = tf.make_ndarray(value.tensor)
    self.assertEqual(steps['reward/mean'], [0, 1, 2])
    self.assertAlmostEqual(float(values[('reward/mean', 2)]), 0.9, places=6)
    self.assertEqual(steps['eval/accuracy'], [0, 1])


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
