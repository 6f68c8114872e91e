"""Tests for the console: quiet mode, progress bars, time formatting."""

import io
import sys
from unittest import mock

from absl.testing import absltest

from jaxgrpo.reporting import console as console_lib
from jaxgrpo.rl import rollout as rollout_lib


class ConsoleTest(absltest.TestCase):

  def test_quiet_keeps_only_notices(self):
    lines = []
    console = console_lib.Console(lines.append, quiet=True)
    console.info('mesh: ...')
    console.notice('resumed from /w at step 2')
    self.assertEqual(lines, ['resumed from /w at step 2'])

  def test_other_processes_show_nothing(self):
    lines, stderr = [], io.StringIO()
    with mock.patch.object(sys, 'stderr', stderr):
      console = console_lib.Console(lines.append, progress=True)
      console.enabled = False  # as train.run sets it once it knows
      console.info('a')
      console.notice('b')
      with console.bar(3, desc='x', unit='step') as bar:
        bar.update(3)
    self.assertEqual(lines, [])
    self.assertEqual(stderr.getvalue(), '')

  def test_bar_shows_rate_and_time_left_and_lines_go_above_it(self):
    stderr, stdout = io.StringIO(), io.StringIO()
    with mock.patch.object(sys, 'stderr', stderr), \
        mock.patch.object(sys, 'stdout', stdout):
      console = console_lib.Console(progress=True)
      with console.bar(4, desc='GRPO', unit='step', initial=1) as bar:
        for _ in range(3):
          bar.update(1)
          bar.set_postfix_str('reward 0.500')
          bar.refresh()
        console.info('step 4/4  reward 0.500')
    self.assertIn('GRPO', stderr.getvalue())
    self.assertRegex(stderr.getvalue(),
                     r'\d/4 \[[\d:]+<[\d:]+, +[\d.]+(s/step|step/s), '
                     r'reward 0.500\]')
    self.assertIn('step 4/4  reward 0.500', stdout.getvalue())

  def test_without_bars_nothing_reaches_stderr(self):
    stderr, lines = io.StringIO(), []
    with mock.patch.object(sys, 'stderr', stderr):
      console = console_lib.Console(lines.append)
      with console.bar(2, desc='eval', unit='ex') as bar:
        bar.update(2)
        console.info('done')
    self.assertEqual(stderr.getvalue(), '')
    self.assertEqual(lines, ['done'])
    self.assertEqual(bar.n, 2)

  def test_a_streaming_step_counts_draws_not_rounds(self):
    # A streaming step makes more draws than max_rounds: each is a few
    # prompts, and the budget is max_rounds rounds' worth of them.
    lines = []
    console = console_lib.Console(lines.append)
    metrics = {'rollout/rounds': 29.0, 'rollout/held': 1.0}
    for collect, spent in (
        ('rounds', '29 rounds (rollout.max_rounds=8)'),
        ('streaming', "29 draws (at most rollout.max_rounds=8 rounds' "
         'worth of prompts)')):
      ro = rollout_lib.RolloutSection(max_rounds=8, collect=collect,
                                      engine='continuous')
      console_lib.explain_no_update(3, metrics, ro, console, waiting=False)
      console_lib.explain_no_update(3, {'rollout/rounds': 29.0}, ro, console,
                                    waiting=False)
      self.assertEqual(lines[-2:], [
          f'step 3: 1 of 16 informative groups after {spent}; no update '
          "until the batch is full (rollout.short_batch='wait'; "
          'train/skipped counts the steps)',
          f'step 3: no informative group in {spent}; update skipped'])

  def test_eval_part_shows_verifier_failures_only_when_there_are_some(self):
    zero = {'eval/accuracy': 0.5, 'eval/verify/errors': 0.0,
            'eval/verify/timeouts': 0.0, 'eval/verify/printed': 3.0}
    self.assertEqual(console_lib.eval_part(zero), 'eval 0.500')
    self.assertEqual(console_lib.eval_part({'eval/accuracy': 0.5}),
                     'eval 0.500')  # metrics written before the counts
    self.assertEqual(
        console_lib.eval_part({**zero, 'eval/verify/timeouts': 1.0}),
        'eval 0.500 (verifier errors 0, timeouts 1: scored 0)')

  def test_width_counts_terminal_columns(self):
    # Wide and full-width glyphs take 2, combining marks and zero-width
    # characters 0, half-width katakana 1.
    for text, columns in (('abc', 3), ('数学', 4), ('e\u0301', 1),
                          ('ｱ', 1), ('Ａ', 2), ('a\u200bb', 2), ('', 0)):
      self.assertEqual(console_lib.width(text), columns, text)
    self.assertEqual(console_lib.pad('数学', 6), '数学  ')
    self.assertEqual(console_lib.pad('e\u0301', 3, right=True), '  e\u0301')
    self.assertEqual(console_lib.pad('数学数学', 3), '数学数学')

  def test_format_seconds(self):
    for seconds, text in ((0.4, '0s'), (45, '45s'), (725, '12m05s'),
                          (3 * 3600 + 125, '3h02m')):
      self.assertEqual(console_lib.format_seconds(seconds), text)


if __name__ == '__main__':
  absltest.main()
