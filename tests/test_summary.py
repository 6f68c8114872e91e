"""Tests for the end-of-run summary table and scripts/summarize_run.py."""

import contextlib
import io
import json
import os
import re
import sys

from absl.testing import absltest

from jaxgrpo.reporting import console
from jaxgrpo.reporting import metrics as metrics_lib
from jaxgrpo.reporting import summary as summary_lib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), 'scripts'))
import summarize_run  # pylint: disable=wrong-import-position


def _records():
  records = [{'step': 0, 'eval/accuracy': 0.25, 'eval/accuracy/a': 0.2,
              'eval/accuracy/b': 0.3}]
  for step in range(1, 11):
    records.append({
        'step': step, 'reward/mean': step / 20,
        'rollout/efficiency': 0.5, 'data/batch_share/a': 0.25,
        'data/batch_share/b': 0.75, 'data/snoozed/a': step,
        'data/filtered/a': 0, 'verify/errors': 1 if step == 3 else 0,
        'verify/timeouts': 2 if step == 4 else 0,
        'verify/printed': 4 if step in (2, 7) else 0,
        'verify/workers_replaced': 1 if step in (2, 7) else 0,
        'perf/step_s': 2.0, 'perf/gen_s': 1.0, 'perf/verify_s': 0.5,
        # A step without an update, as files written before its batch
        # shares were left out hold it: zeros, which the table skips.
        **({'train/skipped': 1.0, 'data/batch_share/a': 0.0,
            'data/batch_share/b': 0.0} if step in (5, 6) else {}),
    })
  records[-1].update({'eval/accuracy': 0.5, 'eval/accuracy/a': 0.4,
                      'eval/accuracy/b': 0.6})
  return records


class SummaryTest(absltest.TestCase):

  def test_table_rows(self):
    s = summary_lib.summarize(
        _records(), steps=10, resumed_from=None, stopped_by=None,
        warmstart={'steps': 40, 'pass_rate': 0.31},
        cum_prompts_generated=200, cum_groups_used=80, seconds=31.0,
        dataset_names=['a', 'b'], workdir='/runs/x')
    self.assertEqual((s.skipped_updates, s.verify_errors, s.verify_timeouts),
                     (2, 1, 2))
    self.assertEqual((s.verify_workers_replaced, s.verify_printed), (2, 8))
    self.assertEqual((s.step_seconds, s.gen_seconds, s.verify_seconds),
                     (20.0, 10.0, 5.0))
    table = summary_lib.format_summary(s)
    rows = dict(line.split('  ', 1) for line in table.splitlines()[2:])
    rows = {k.strip(): v.strip() for k, v in rows.items()}
    self.assertEqual(table.splitlines()[0], 'run summary')
    self.assertEqual(rows['steps'], '10')
    self.assertEqual(rows['warm start steps'], '40')
    self.assertEqual(rows['held-out accuracy'], '0.250 -> 0.500')
    # First and last tenth of the steps (1 step each).
    self.assertEqual(rows['sampled reward (first/last 1 step)'],
                     '0.050 -> 0.500')
    self.assertEqual(rows['efficiency (used / generated)'], '0.400')
    self.assertEqual(rows['updates skipped (short or empty batch)'], '2')
    self.assertEqual(rows['verifier errors / timeouts (scored 0)'], '1 / 2')
    self.assertEqual(rows['verifier workers replaced / calls that printed'],
                     '2 / 8')
    self.assertEqual(rows['time in GRPO steps'],
                     '20.0s: generation 50%, verifiers 25%, update and '
                     'sampler 25%')
    # Shares of the steps that trained.
    self.assertEqual(rows['a: accuracy, batch share'], '0.200 -> 0.400, 0.250')
    self.assertEqual(rows['a: snoozed / filtered at the end'], '10 / 0')
    self.assertEqual(rows['b: accuracy, batch share'], '0.300 -> 0.600, 0.750')
    self.assertEqual(rows['written to'], '/runs/x: metrics.jsonl, checkpoints/')

  def test_a_step_that_generated_nothing_counts(self):
    # A step whose batch was all carried in has no reward/mean; it was left
    # out of the steps, their time and the reward windows.
    records = _records()
    del records[3]['reward/mean']
    s = summary_lib.summarize(
        records, steps=10, resumed_from=None, stopped_by=None, warmstart={},
        cum_prompts_generated=200, cum_groups_used=80, seconds=31.0,
        dataset_names=['a', 'b'])
    self.assertEqual((s.window, s.step_seconds), (1, 20.0))
    self.assertEqual((s.verify_errors, s.verify_timeouts), (1, 2))

  def test_steps_that_offered_no_prompt_count_as_skipped(self):
    # A curriculum stage that postpones every stratum: the step records no
    # reward, and its skipped update was left out of the count.
    records = _records() + [
        {'step': step, 'train/skipped': 1.0, 'rollout/prompts_generated': 0.0,
         'data/batch_share/a': 0.0, 'data/snoozed/a': 0.0,
         'perf/step_s': 0.5} for step in (11, 12)]
    s = summary_lib.summarize(
        records, steps=12, resumed_from=None, stopped_by=None, warmstart={},
        cum_prompts_generated=200, cum_groups_used=80, seconds=31.0,
        dataset_names=['a', 'b'])
    self.assertEqual(s.skipped_updates, 4)
    self.assertEqual(s.step_seconds, 21.0)
    self.assertEqual((s.reward_first, s.reward_last), (0.05, 0.5))
    self.assertEqual(s.datasets['a'][3], 0.0)  # snoozed at the last step

  def test_no_row_for_verifier_workers_when_none_was_replaced_or_printed(self):
    # As in a metrics file written before these counts existed.
    records = [{k: v for k, v in r.items()
                if k not in ('verify/printed', 'verify/workers_replaced')}
               for r in _records()]
    s = summary_lib.summarize(
        records, steps=10, resumed_from=None, stopped_by=None, warmstart={},
        cum_prompts_generated=200, cum_groups_used=80, seconds=31.0,
        dataset_names=['a', 'b'])
    self.assertEqual((s.verify_workers_replaced, s.verify_printed), (0, 0))
    table = summary_lib.format_summary(s)
    self.assertIn('verifier errors / timeouts', table)
    self.assertNotIn('workers replaced', table)

  def test_evaluations_verifier_failures_are_summed_apart(self):
    # Evaluation scored them 0 and no metric or row counted them.
    records = _records()
    records[0].update({'eval/verify/errors': 1.0, 'eval/verify/timeouts': 0.0,
                       'eval/verify/printed': 3.0,
                       'eval/verify/workers_replaced': 0.0})
    records[-1].update({'eval/verify/errors': 2.0,
                        'eval/verify/timeouts': 1.0,
                        'eval/verify/printed': 0.0,
                        'eval/verify/workers_replaced': 1.0})
    s = summary_lib.summarize(
        records, steps=10, resumed_from=None, stopped_by=None, warmstart={},
        cum_prompts_generated=200, cum_groups_used=80, seconds=31.0,
        dataset_names=['a', 'b'])
    self.assertEqual((s.eval_verify_errors, s.eval_verify_timeouts,
                      s.eval_verify_printed, s.eval_verify_workers_replaced),
                     (3, 1, 3, 1))
    self.assertEqual((s.verify_errors, s.verify_timeouts), (1, 2))
    rows = dict(line.split('  ', 1) for line in
                summary_lib.format_summary(s).splitlines()[2:])
    rows = {k.strip(): v.strip() for k, v in rows.items()}
    self.assertEqual(rows['verifier errors / timeouts (scored 0)'], '1 / 2')
    self.assertEqual(rows['held-out eval: verifier errors / timeouts'],
                     '3 / 1')
    self.assertEqual(
        rows['held-out eval: workers replaced / calls that printed'], '1 / 3')
    # Evaluations without a failure: the errors row, 0 / 0, alone; a run
    # that never evaluated has neither.
    quiet = summary_lib.format_summary(summary_lib.summarize(
        _records(), steps=10, resumed_from=None, stopped_by=None,
        warmstart={}, cum_prompts_generated=200, cum_groups_used=80,
        seconds=31.0, dataset_names=['a', 'b']))
    self.assertRegex(quiet, r'held-out eval: verifier errors / timeouts +0 / 0')
    self.assertNotIn('held-out eval: workers', quiet)
    unevaluated = [{k: v for k, v in r.items() if not k.startswith('eval/')}
                   for r in _records()]
    self.assertNotIn('held-out eval', summary_lib.format_summary(
        summary_lib.summarize(
            unevaluated, steps=10, resumed_from=None, stopped_by=None,
            warmstart={}, cum_prompts_generated=200, cum_groups_used=80,
            seconds=31.0, dataset_names=['a', 'b'])))

  def test_the_warm_starts_verifier_failures_are_in_its_row(self):
    # Its pass-rate checks scored them 0 and the row showed the steps alone.
    def row(warmstart):
      s = summary_lib.summarize(
          _records(), steps=10, resumed_from=None, stopped_by=None,
          warmstart=warmstart, cum_prompts_generated=200, cum_groups_used=80,
          seconds=31.0, dataset_names=['a'])
      rows = dict(line.split('  ', 1) for line in
                  summary_lib.format_summary(s).splitlines()[2:])
      return {k.strip(): v.strip() for k, v in rows.items()}[
          'warm start steps']

    counts = {'errors': 3, 'timeouts': 1, 'printed': 0, 'workers_replaced': 0}
    self.assertEqual(row({'steps': 40, 'pass_rate': 0.0, 'verify': counts}),
                     '40 (its pass-rate checks: verifier errors / timeouts '
                     '3 / 1, scored 0)')
    zero = dict.fromkeys(counts, 0)
    self.assertEqual(row({'steps': 40, 'verify': zero}), '40')
    self.assertEqual(row({'steps': 40}), '40')  # a note before the counts

  def test_rows_line_up_with_wide_dataset_names(self):
    # A CJK glyph takes two terminal columns, a combining accent none.
    records = [{k.replace('/a', '/数学').replace('/b', '/cafe\u0301'): v
                for k, v in r.items()} for r in _records()]
    s = summary_lib.summarize(
        records, steps=10, resumed_from=None, stopped_by=None,
        warmstart={}, cum_prompts_generated=200, cum_groups_used=80,
        seconds=31.0, dataset_names=['数学', 'cafe\u0301'])
    rows = summary_lib.format_summary(s).splitlines()[2:]
    self.assertIn('数学: accuracy, batch share', '\n'.join(rows))
    # The column each value starts at.
    starts = {console.width(key) + len(gap) for key, gap in (
        re.match(r'(.*?\S)( {2,})\S', row).groups() for row in rows)}
    self.assertLen(starts, 1, rows)

  def test_a_long_dataset_name_is_cut_in_its_rows(self):
    # A name of 200 characters pushed every value past column 200, and the
    # console line's shares and counts as far.
    long = 'q' * 100 + '-' + 'z' * 99
    records = [{(k[:-1] + long if k.endswith('/a') else k): v
                for k, v in r.items()} for r in _records()]
    s = summary_lib.summarize(
        records, steps=10, resumed_from=None, stopped_by=None,
        warmstart={}, cum_prompts_generated=200, cum_groups_used=80,
        seconds=31.0, dataset_names=[long, 'b'])
    short = 'q' * 25 + '...' + 'z' * 12
    self.assertEqual(console.shorten(long), short)
    table = summary_lib.format_summary(s)
    self.assertIn(f'{short}: accuracy, batch share          0.200 -> 0.400, '
                  '0.250', table)
    self.assertIn(f'{short}: snoozed / filtered at the end  10 / 0', table)
    steps_row = table.splitlines()[2]
    self.assertStartsWith(steps_row, 'steps ')
    self.assertLess(steps_row.index('10'), 80, table)  # the values' column
    window = metrics_lib.ConsoleWindow()
    line = window.line(1, 10, {f'data/batch_share/{long}': 0.25,
                               'data/batch_share/b': 0.75,
                               f'data/snoozed/{long}': 12.0})
    self.assertEqual(line, f'step  1/10  share b=0.75 {short}=0.25  '
                     f'snoozed {short}=12')

  def test_a_last_evaluation_before_the_last_step_is_named(self):
    # eval.every=0 evaluates step 0 only: the table read '0.250 -> 0.250',
    # as if the trained model had been measured at the end.
    records = _records()
    for key in ('eval/accuracy', 'eval/accuracy/a', 'eval/accuracy/b'):
      del records[-1][key]
    records[5]['eval/accuracy'] = 0.375  # a run stopped between evaluations
    for evaluated, expected in (
        (records[:5] + records[6:], '0.250 -> 0.250 (at step 0, the last '
                                    'evaluated)'),
        (records, '0.250 -> 0.375 (at step 5, the last evaluated)')):
      s = summary_lib.summarize(
          evaluated, steps=10, resumed_from=None, stopped_by=None,
          warmstart={}, cum_prompts_generated=200, cum_groups_used=80,
          seconds=31.0, dataset_names=['a'])
      rows = dict(line.split('  ', 1) for line in
                  summary_lib.format_summary(s).splitlines()[2:])
      self.assertEqual(rows['held-out accuracy'].strip(), expected)

  def test_resumed_and_stopped_runs_say_so(self):
    s = summary_lib.summarize(
        [], steps=7, resumed_from=5, stopped_by='SIGTERM', warmstart={},
        cum_prompts_generated=0, cum_groups_used=0, seconds=1.0,
        dataset_names=['a'])
    table = summary_lib.format_summary(s)
    self.assertIn('7 (resumed at 5) (stopped by SIGTERM)', table)
    self.assertIn('held-out accuracy                       - -> -\n', table)
    self.assertNotIn('time in GRPO steps', table)

  def test_a_resumed_run_times_this_call_and_says_so(self):
    # Its steps before the resume count in 'time in GRPO steps' (20s), as
    # in every other row; the wall time is this call's (it read as if the
    # steps took longer than the run).
    s = summary_lib.summarize(
        _records(), steps=10, resumed_from=5, stopped_by=None, warmstart={},
        cum_prompts_generated=200, cum_groups_used=80, seconds=12.0,
        dataset_names=['a', 'b'])
    table = summary_lib.format_summary(s)
    self.assertRegex(table, r'\nwall time since the resume +12\.0s\n')
    self.assertRegex(table, r'\ntime in GRPO steps +20\.0s')


class SummarizeRunScriptTest(absltest.TestCase):

  def _main(self, *argv):
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      try:
        summarize_run.main(list(argv))
      except SystemExit as e:
        code = e.code
    return code, out.getvalue(), err.getvalue()

  def test_rows_and_a_line_cut_short(self):
    workdir = self.create_tempdir().full_path
    lines = [json.dumps({'step': s, 'reward/mean': 0.5,
                         'rollout/prompts_generated': 8,
                         'rollout/groups_used': 4, 'rollout/rounds': 1})
             for s in (1, 2)]
    with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
      f.write('\n'.join(lines) + '\n{"step": 3, "rew')  # a run killed
    code, out, _ = self._main(workdir, '--window', '1')
    self.assertEqual(code, 0)
    self.assertLen(out.splitlines(), 3)  # the header and two rows

  def test_a_step_that_generated_nothing_keeps_the_reward(self):
    # Its batch was all carried in, so it has no reward/mean; the window's
    # reward printed nan.
    workdir = self.create_tempdir().full_path
    records = [{'step': s, 'reward/mean': 0.5, 'rollout/prompts_generated': 8,
                'rollout/groups_used': 4, 'rollout/rounds': 1} for s in (1, 2)]
    del records[1]['reward/mean']
    with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
      f.write(''.join(json.dumps(r) + '\n' for r in records))
    code, out, _ = self._main(workdir, '--window', '2')
    self.assertEqual(code, 0)
    self.assertEqual(out.splitlines()[1].split()[1], '0.500')

  def test_values_that_are_no_numbers_are_left_out_and_named(self):
    # A hand-edited null raised a TypeError traceback.
    workdir = self.create_tempdir().full_path
    records = [{'step': s, 'reward/mean': 0.5, 'rollout/prompts_generated': 8,
                'rollout/groups_used': 4, 'rollout/rounds': 1,
                'eval/accuracy': 0.25} for s in (1, 2)]
    records[1].update({'reward/mean': None, 'rollout/prompts_generated': None,
                       'eval/accuracy': 'x'})
    with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
      f.write(''.join(json.dumps(r) + '\n' for r in records))
    code, out, err = self._main(workdir, '--window', '2')
    self.assertEqual(code, 0)
    self.assertEqual(err, 'summarize_run: 3 value(s) that are not numbers '
                     'left out (step 2: rollout/prompts_generated=None; '
                     "step 2: reward/mean=None; step 2: eval/accuracy='x')\n")
    # reward, generated/step, used/step over the steps that hold them; the
    # efficiency over step 1 alone, which holds both.
    self.assertEqual(out.splitlines()[1].split(),
                     ['1-2', '0.500', '8.0', '4.0', '0.50', '1.00', '0.250'])

  def test_a_run_stopped_at_step_0_says_so(self):
    # A warm start alone (total_steps=0) printed the table's header only.
    workdir = self.create_tempdir().full_path
    with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
      f.write(json.dumps({'step': 0, 'eval/accuracy': 0.25}) + '\n')
    code, out, _ = self._main(workdir)
    self.assertEqual(code, 0)
    self.assertEqual(out, f'{workdir}: no GRPO step in its metrics.jsonl yet '
                     '(held-out accuracy 0.250)\n')

  def test_a_run_before_its_first_step_says_so(self):
    # A run holds its lock and checkpoints/ before metrics.jsonl exists:
    # it exited 2, 'name a run workdir', like a folder holding no run.
    workdir = self.create_tempdir().full_path
    os.mkdir(os.path.join(workdir, 'checkpoints'))
    code, out, _ = self._main(workdir)
    self.assertEqual(code, 0)
    self.assertEqual(out,
                     f'{workdir}: no GRPO step in its metrics.jsonl yet\n')

  def test_mistakes_end_in_one_line(self):
    # Tracebacks before; --window=-1 printed an empty table.
    missing = os.path.join(self.create_tempdir().full_path, 'nope')
    code, _, err = self._main(missing)
    self.assertEqual(code, 2)
    self.assertIn(f'error: {missing}: cannot read its metrics.jsonl (No such '
                  'file or directory (and no run started there))', err)
    self.assertNotIn('Traceback', err)
    for window in ('0', '-1'):
      code, _, err = self._main(missing, '--window', window)
      self.assertEqual(code, 2)
      self.assertIn(f'error: --window={window}: must be >= 1', err)


if __name__ == '__main__':
  absltest.main()
