"""Tests for the metrics record, TensorBoard events and console lines."""

import os
import sys
from unittest import mock

from absl.testing import absltest
import numpy as np

from jaxgrpo.reporting import console
from jaxgrpo.reporting import metrics as metrics_lib
from jaxgrpo.reporting import plot_panels
from jaxgrpo.reporting import tensorboard
from tests import tensorboard_events


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

  def test_a_run_before_its_first_line_has_no_records(self):
    # A notebook polls a run that holds its lock and checkpoints/ but has
    # not written metrics.jsonl yet: it raised FileNotFoundError.
    workdir = self.create_tempdir().full_path
    with self.assertRaisesRegex(FileNotFoundError, 'no run started there'):
      metrics_lib.read_metrics(workdir)
    os.mkdir(os.path.join(workdir, 'checkpoints'))
    self.assertEqual(metrics_lib.read_metrics(workdir), [])


  def _file(self, workdir: str, text: str) -> None:
    with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
      f.write(text)

  def test_lines_that_are_not_json_are_kept_aside_and_named(self):
    workdir = self.create_tempdir().full_path
    self._file(workdir, '{"step": 0, "a": 1}\n{"step": 1, "a"\n[3]\n'
               '{"step": 2, "a": 3}\n{"step": 3, "a": 4}\n{"step": 4, "cut')
    writer = metrics_lib.MetricsWriter(workdir, resume_step=3)
    writer.close()
    self.assertEqual([r['step'] for r in metrics_lib.read_metrics(workdir)],
                     [0, 2, 3])
    self.assertEqual(writer.notes, [
        f'metrics.jsonl: 2 lines not JSON (line 2, 3) left out, copied to '
        f'{workdir}/metrics.jsonl.damaged'])
    with open(os.path.join(workdir, 'metrics.jsonl.damaged')) as f:
      self.assertEqual(f.read(), '{"step": 1, "a"\n[3]\n')  # not the cut one

  def test_reading_leaves_out_a_cut_last_line_and_names_a_bad_one(self):
    # A run killed mid-write (or one writing now) ends in an unended line.
    workdir = self.create_tempdir().full_path
    self._file(workdir, '{"step": 0, "a": 1}\n\n{"step": 1, "a": 2}\n'
               '{"step": 2, "cu')
    self.assertEqual([r['step'] for r in metrics_lib.read_metrics(workdir)],
                     [0, 1])
    self._file(workdir, '{"step": 0, "a": 1}\n[3]\n{"step": 1, "a": 2}\n')
    with self.assertRaisesRegex(
        ValueError, f'^{workdir}/metrics.jsonl:2: not a JSON object'):
      metrics_lib.read_metrics(workdir)

  def test_a_line_that_is_not_utf8_is_a_damaged_line(self):
    # Bytes a disk fault left (a run writes ASCII): a UnicodeDecodeError
    # traceback in the resume, jaxgrpo-plot and summarize_run.py before.
    workdir = self.create_tempdir().full_path
    path = os.path.join(workdir, 'metrics.jsonl')
    with open(path, 'wb') as f:
      f.write(b'{"step": 0, "a": 1}\n\xff\xfe{"step"\n{"step": 1, "a": 2}\n')
    with self.assertRaisesRegex(ValueError, f'^{path}:2: not a JSON object'):
      metrics_lib.read_metrics(workdir)
    self.assertEqual([r['step'] for r in plot_panels.read_records(workdir)],
                     [0, 1])
    metrics_lib.MetricsWriter(workdir, resume_step=1).close()
    with open(path, 'ab') as f:
      f.write(b'\xff\n{"step": 2}\n')
    metrics_lib.MetricsWriter(workdir, resume_step=2).close()  # appends
    with open(path + '.damaged', 'rb') as f:
      self.assertEqual(f.read(), b'\xff\xfe{"step"\n\xff\n')
    self.assertEqual([r['step'] for r in metrics_lib.read_metrics(workdir)],
                     [0, 1, 2])

  def test_lines_json_itself_refuses_are_damaged_lines(self):
    # An integer of 5,000 digits, arrays nested 100,000 deep: a ValueError
    # or RecursionError traceback in the resume and every reader before.
    workdir = self.create_tempdir().full_path
    self._file(workdir, '{"step": 0}\n{"a": ' + '1' * 5000 + '}\n'
               + '[' * 100_000 + '\n{"step": 1}\n')
    with self.assertRaisesRegex(ValueError, 'metrics.jsonl:2: not a JSON'):
      metrics_lib.read_metrics(workdir)
    self.assertEqual([r['step'] for r in plot_panels.read_records(workdir)],
                     [0, 1])
    writer = metrics_lib.MetricsWriter(workdir, resume_step=1)
    writer.close()
    self.assertIn('2 lines not JSON (line 2, 3)', writer.notes[0])
    self.assertEqual([r['step'] for r in metrics_lib.read_metrics(workdir)],
                     [0, 1])

  def test_a_byte_order_mark_before_the_first_line_is_read_past(self):
    # A metrics.jsonl saved by a Windows editor (UTF-8 with BOM, CRLF):
    # its first line counted as damaged, set aside on resume.
    workdir = self.create_tempdir().full_path
    path = os.path.join(workdir, 'metrics.jsonl')
    with open(path, 'wb') as f:
      f.write(b'\xef\xbb\xbf{"step": 0, "a": 1}\r\n{"step": 1, "a": 2}\r\n'
              b'{"step": 2, "a": 3}\r\n')
    self.assertEqual([r['step'] for r in metrics_lib.read_metrics(workdir)],
                     [0, 1, 2])
    self.assertEqual([r['step'] for r in plot_panels.read_records(workdir)],
                     [0, 1, 2])
    writer = metrics_lib.MetricsWriter(workdir, resume_step=1)
    writer.close()
    self.assertEqual(writer.notes, [])
    self.assertFalse(os.path.exists(path + '.damaged'))
    self.assertEqual(metrics_lib.read_metrics(workdir),
                     [{'step': 0, 'a': 1}, {'step': 1, 'a': 2}])

  def test_a_fresh_start_keeps_an_earlier_runs_steps_aside(self):
    workdir = self.create_tempdir().full_path
    earlier = '{"step": 0, "a": 1}\n{"step": 7, "a": 2}\n'
    self._file(workdir, earlier)
    writer = metrics_lib.MetricsWriter(workdir, keep_earlier=True)
    writer.write(0, {'a': 5})
    writer.close()
    self.assertEqual(metrics_lib.read_metrics(workdir), [{'step': 0, 'a': 5}])
    aside = [n for n in os.listdir(workdir) if n.startswith(
        'metrics.jsonl.replaced-')]
    self.assertLen(aside, 1)
    with open(os.path.join(workdir, aside[0])) as f:
      self.assertEqual(f.read(), earlier)
    self.assertRegex(writer.notes[0], r'^metrics.jsonl held steps of an '
                     r'earlier run with no checkpoint left \(up to step 7\): '
                     r'moved to .*metrics.jsonl.replaced-')
    # A run killed before its first checkpoint wrote step 0 at most: redone.
    self._file(workdir, '{"step": 0, "a": 1}\n')
    writer = metrics_lib.MetricsWriter(workdir, keep_earlier=True)
    writer.close()
    self.assertEqual(writer.notes, [])
    self.assertEqual(metrics_lib.read_metrics(workdir), [])
    self.assertLen([n for n in os.listdir(workdir) if 'replaced' in n], 1)


class TensorBoardWhileTrainingTest(absltest.TestCase):

  def test_each_step_once_across_a_resume(self):
    """Steps 0-3, then a resume from step 1 that writes step 2 again."""
    if tensorboard_events.missing():
      self.skipTest(tensorboard_events.missing())
    workdir = self.create_tempdir().full_path
    logdir = os.path.join(workdir, 'tensorboard')
    os.makedirs(logdir)
    stale = os.path.join(logdir, 'events.out.tfevents.1.host')
    open(stale, 'w').close()
    writer = metrics_lib.MetricsWriter(workdir, tensorboard=True)
    self.assertEqual(str(writer.tensorboard.logdir), logdir)
    self.assertFalse(os.path.exists(stale))
    for step in range(4):
      writer.write(step, {'reward/mean': step / 10, 'eval/accuracy': 0.5,
                          'data/note': 'text', 'train/loss': float('nan')})
    writer.sync()  # with the checkpoint: the events are in the file
    first = tensorboard_events.scalars(logdir)
    writer.close()
    self.assertEqual(set(first), {'reward/mean', 'eval/accuracy',
                                  'train/loss'})
    self.assertEqual(first['reward/mean'],
                     [(s, float(np.float32(s / 10))) for s in range(4)])
    self.assertEqual(first['eval/accuracy'], [(s, 0.5) for s in range(4)])
    self.assertEqual([s for s, _ in first['train/loss']], [0, 1, 2, 3])
    self.assertTrue(all(np.isnan(v) for _, v in first['train/loss']))
    np.testing.assert_equal(tensorboard_events.scalars(logdir), first)  # closed

    writer = metrics_lib.MetricsWriter(workdir, resume_step=1,
                                       tensorboard=True)
    # The resumed run rebuilds the kept steps, then writes live.
    rebuilt = tensorboard_events.scalars(logdir)
    self.assertEqual(rebuilt['reward/mean'], first['reward/mean'][:2])
    writer.write(2, {'reward/mean': 0.9})
    writer.close()
    events = tensorboard_events.scalars(logdir)
    self.assertEqual(events['reward/mean'],
                     [(0, 0.0), (1, float(np.float32(0.1))),
                      (2, float(np.float32(0.9)))])
    self.assertEqual(events['eval/accuracy'], [(0, 0.5), (1, 0.5)])
    self.assertEqual([s for s, _ in events['train/loss']], [0, 1])

  def test_a_resume_that_writes_no_events_leaves_no_dropped_step_in_them(
      self):
    """Steps 0-3 with events, then a resume from step 1 with tensorboard
    off: TensorBoard went on showing steps 2 and 3, which the run redoes."""
    if tensorboard_events.missing():
      self.skipTest(tensorboard_events.missing())
    workdir = self.create_tempdir().full_path
    logdir = os.path.join(workdir, 'tensorboard')
    writer = metrics_lib.MetricsWriter(workdir, tensorboard=True)
    for step in range(4):
      writer.write(step, {'reward/mean': step / 10})
    writer.close()
    writer = metrics_lib.MetricsWriter(workdir, resume_step=1)
    self.assertEqual(writer.notes, [
        f'{logdir}: rewritten from metrics.jsonl (its events held steps this '
        'run drops); this run adds none (tensorboard is off)'])
    writer.write(2, {'reward/mean': 0.9})
    writer.close()
    kept = [(0, 0.0), (1, float(np.float32(0.1)))]
    self.assertEqual(tensorboard_events.scalars(logdir)['reward/mean'], kept)
    # A resume that drops no step leaves them as they are, and says nothing.
    writer = metrics_lib.MetricsWriter(workdir, resume_step=2)
    writer.close()
    self.assertEqual(writer.notes, [])
    # Without tensorboardX they cannot be rewritten: named.
    with mock.patch.dict(sys.modules, {'tensorboardX': None}):
      writer = metrics_lib.MetricsWriter(workdir, resume_step=0,
                                         tensorboard=True)
    writer.close()
    self.assertLen(writer.notes, 1)
    self.assertStartsWith(writer.notes[0], f'{logdir} holds events of steps '
                          'metrics.jsonl no longer has, which TensorBoard '
                          'shows, and this run adds none (tensorboardX is not '
                          "installed): pip install 'jaxgrpo[tensorboard]', "
                          f'then `jaxgrpo-plot --tensorboard {workdir}`')
    self.assertEqual(tensorboard_events.scalars(logdir)['reward/mean'], kept)

  def test_events_that_cannot_be_written_turn_tensorboard_off(self):
    if tensorboard_events.missing():
      self.skipTest(tensorboard_events.missing())
    workdir = self.create_tempdir().full_path
    with open(os.path.join(workdir, 'tensorboard'), 'w') as f:
      f.write('not a folder')
    writer = metrics_lib.MetricsWriter(workdir, tensorboard=True)
    self.assertIsNone(writer.tensorboard)
    self.assertLen(writer.notes, 1)
    self.assertStartsWith(writer.notes[0], 'TensorBoard events cannot be '
                          f'written in {workdir}/tensorboard (')
    self.assertIn('turned off for this run; metrics.jsonl holds every value',
                  writer.notes[0])
    writer.write(1, {'reward/mean': 0.5})
    writer.close()
    # Later (a disk that fills): one notice, and the run's metrics go on.
    workdir = self.create_tempdir().full_path
    notices = []
    writer = metrics_lib.MetricsWriter(workdir, tensorboard=True,
                                       notice=notices.append)
    with mock.patch.object(writer.tensorboard, 'flush', side_effect=OSError(
        28, 'No space left on device')):
      writer.write(1, {'reward/mean': 0.5})
      writer.sync()
    self.assertIsNone(writer.tensorboard)
    self.assertLen(notices, 1)
    self.assertIn('(No space left on device): turned off', notices[0])
    writer.write(2, {'reward/mean': 0.7})
    writer.close()
    self.assertEqual([r['step'] for r in metrics_lib.read_metrics(workdir)],
                     [1, 2])

  def test_without_tensorboardx_only_the_metrics_file(self):
    workdir = self.create_tempdir().full_path
    with mock.patch.dict(sys.modules, {'tensorboardX': None}):
      self.assertFalse(tensorboard.available())
      writer = metrics_lib.MetricsWriter(workdir, tensorboard=True)
      writer.write(0, {'reward/mean': 0.1})
      writer.close()
      with self.assertRaisesRegex(
          ImportError, r"tensorboardX: pip install 'jaxgrpo\[tensorboard\]'"):
        tensorboard.EventWriter(workdir)
    self.assertIsNone(writer.tensorboard)
    self.assertFalse(os.path.exists(os.path.join(workdir, 'tensorboard')))
    self.assertLen(metrics_lib.read_metrics(workdir), 1)

  def test_disabled_writes_no_events(self):
    workdir = self.create_tempdir().full_path
    for kwargs in ({}, {'enabled': False, 'tensorboard': True}):
      writer = metrics_lib.MetricsWriter(workdir, **kwargs)
      writer.write(0, {'reward/mean': 0.1})
      writer.close()
      self.assertIsNone(writer.tensorboard)
    self.assertFalse(os.path.exists(os.path.join(workdir, 'tensorboard')))


class ConsoleTest(absltest.TestCase):

  def test_averages_and_mixture_columns(self):
    window = metrics_lib.ConsoleWindow()
    window.add({'reward/mean': 0.2, 'rollout/efficiency': 0.5,
                'rollout/groups_used': 4.0, 'rollout/prompts_generated': 8.0})
    window.add({'reward/mean': 0.4, 'rollout/efficiency': 0.7,
                'rollout/groups_used': 8.0, 'rollout/prompts_generated': 12.0})
    line = window.line(10, 100, {'data/batch_share/a': 0.25,
                                 'data/batch_share/b': 0.75,
                                 'data/snoozed/a': 12.0,
                                 'data/snoozed/b': 0.0})
    self.assertIn('step  10/100', line)
    self.assertIn('reward 0.300', line)
    self.assertIn('eff 0.60', line)  # (4 + 8) / (8 + 12)
    self.assertIn('share a=0.25 b=0.75', line)
    self.assertIn('snoozed a=12 b=0', line)
    self.assertNotIn('filtered', line)

  def test_eff_is_the_windows_groups_used_over_its_prompts(self):
    # Steps that train on carried groups: 0 / 0 is 1.0 in metrics.jsonl
    # (the line showed 'eff 1.00'), and leaving those steps out averaged
    # 1 / 16 three times, 'eff 0.06', for 3 groups used of 48 generated
    # plus 7 more carried in: 10 / 48.
    window = metrics_lib.ConsoleWindow()
    step = lambda used, generated: {
        'rollout/groups_used': used, 'rollout/prompts_generated': generated,
        'rollout/efficiency': used / generated if generated else 1.0}
    nothing = step(0.0, 0.0)
    window.add(nothing)
    self.assertNotIn('eff', window.line(1, 10))
    for used, generated in ((1, 16), (1, 0), (1, 0), (1, 16), (1, 0),
                            (1, 0), (1, 0), (1, 16), (1, 0), (1, 0)):
      window.add(step(float(used), float(generated)))
    self.assertIn('eff 0.21', window.line(11, 20))
    # The bar: the run's efficiency so far, as the summary has it.
    self.assertEqual(console.postfix({
        'reward/mean': 0.5, 'rollout/cum_groups_used': 10.0,
        'rollout/cum_prompts_generated': 48.0}), 'reward 0.500 eff 0.208')
    self.assertEqual(console.postfix({'rollout/cum_groups_used': 0.0,
                                      'rollout/cum_prompts_generated': 0.0}),
                     '')


if __name__ == '__main__':
  absltest.main()
