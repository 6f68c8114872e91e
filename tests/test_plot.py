"""Figures of a run's metrics (PNG) and its TensorBoard events."""

import contextlib
import io
import json
import os
import pathlib
import socket
import subprocess
import sys
import threading
from unittest import mock
import warnings

from absl.testing import absltest
import numpy as np

from jaxgrpo import workdir as workdir_lib
from jaxgrpo.cli import plot as plot_cli
from jaxgrpo.reporting import metrics as metrics_lib
from jaxgrpo.reporting import plot
from jaxgrpo.reporting import plot_panels
from tests import tensorboard_events

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'
ALL_FIGURES = ('reward', 'prompts', 'efficiency', 'batch_share',
               'snoozed_filtered', 'accuracy')


def _write_run(workdir: str, steps: int = 40, eval_every: int = 10) -> None:
  """A metrics.jsonl as a two-dataset run with subsets and strata writes
  (the keys test_train checks in a real run's records)."""
  rng = np.random.default_rng(0)
  writer = metrics_lib.MetricsWriter(workdir)

  def evaluation(step):
    acc = min(1.0, 0.2 + step / 100)
    return {'eval/accuracy': acc, 'eval/pass_at_k': min(1.0, 2 * acc),
            'eval/accuracy/arith': acc, 'eval/accuracy/arith/1d': acc + 0.1,
            'eval/accuracy/arith/2d': acc - 0.1, 'eval/accuracy/qa': acc / 2,
            'eval/accuracy/qa/answerable': acc / 3,
            'eval/accuracy/qa/unanswerable': acc}

  writer.write(0, evaluation(0))
  cum_gen = cum_used = 0.0
  for step in range(1, steps + 1):
    generated = float(16 + rng.integers(0, 32))
    cum_gen += generated
    cum_used += 16
    share = float(rng.uniform(0.4, 0.8))
    metrics = {
        'reward/mean': float(rng.uniform(0, 1)),
        'reward/mean/arith': float(rng.uniform(0, 1)),
        'reward/mean/arith/1d': float(rng.uniform(0, 1)),
        'reward/mean/qa': float(rng.uniform(0, 1)),
        'rollout/prompts_generated': generated,
        'rollout/groups_used': 16.0,
        'rollout/efficiency': 16 / generated,
        'rollout/cum_prompts_generated': cum_gen,
        'rollout/cum_groups_used': cum_used,
        'rollout/prompts_generated/arith': generated / 2,
        'data/batch_share/arith': share,
        'data/batch_share/qa': 1 - share,
        'data/batch_share/arith/too_hard': 0.0,
        'data/batch_share/arith/0-0.5': share / 2,
        'data/batch_share/arith/0.5-1': share / 2,
        'data/snoozed/arith': float(step), 'data/snoozed/qa': 0.0,
        'data/filtered/arith': 0.0, 'data/filtered/qa': float(step // 2),
        'data/postponed/arith': 3.0,
        'train/loss': float('nan') if step == 3 else 0.01,
        'perf/step_s': 0.1,
    }
    if step % eval_every == 0:
      metrics.update(evaluation(step))
    writer.write(step, metrics)
  writer.close()


def _check_png(test, path):
  test.assertTrue(os.path.isfile(path), path)
  with open(path, 'rb') as f:
    head = f.read(8)
  test.assertEqual(head, PNG_SIGNATURE, path)
  test.assertGreater(os.path.getsize(path), 1024, path)


def _main(*argv):
  """(exit code, stdout, stderr) of plot_cli.main(argv)."""
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = plot_cli.main(list(argv))
  return code, out.getvalue(), err.getvalue()


class PlotRunTest(absltest.TestCase):

  def test_every_figure_of_a_mixture_run(self):
    workdir = self.create_tempdir().full_path
    _write_run(workdir)
    problems = []
    paths = plot.plot_run(workdir, window=5, log=problems.append)
    self.assertEmpty(problems)
    self.assertEqual(
        paths, [os.path.join(workdir, 'plots', f'{name}.png')
                for name in ALL_FIGURES])
    for path in paths:
      _check_png(self, path)
    # The batch-share figure has a panel for the strata of 'arith'.
    panels = plot_panels.batch_share_panels(metrics_lib.read_metrics(workdir), 5)
    self.assertLen(panels, 2)
    self.assertEqual([line.label for line in panels[1].lines],
                     ['0-0.5', '0.5-1', 'too_hard'])
    # Accuracy: overall, each dataset and each subset, at the eval steps.
    (panel,) = plot_panels.accuracy_panels(metrics_lib.read_metrics(workdir), 5)
    self.assertEqual(
        [line.label for line in panel.lines],
        ['all', 'arith', 'arith/1d', 'arith/2d', 'qa', 'qa/answerable',
         'qa/unanswerable'])
    np.testing.assert_array_equal(panel.lines[0].x, [0, 10, 20, 30, 40])

  def test_a_subset_label_with_a_slash_is_drawn(self):
    # verl's Parquet files label rows 'openai/gsm8k' (subset_field=
    # 'data_source'); such subsets were left out of reward.png and
    # accuracy.png.
    records = [{'step': s, 'eval/accuracy': 0.5, 'eval/accuracy/gsm8k': 0.5,
                'eval/accuracy/gsm8k/openai/gsm8k': 0.5,
                'reward/mean': 0.25, 'reward/mean/gsm8k': 0.25,
                'reward/mean/gsm8k/openai/gsm8k': 0.25} for s in (1, 2)]
    (panel,) = plot_panels.accuracy_panels(records, 1)
    self.assertEqual([line.label for line in panel.lines],
                     ['all', 'gsm8k', 'gsm8k/openai/gsm8k'])
    (panel,) = plot_panels.reward_panels(records, 1)
    self.assertIn('gsm8k/openai/gsm8k', [line.label for line in panel.lines])

  def test_a_dataset_named_in_glyphs_the_font_lacks_warns_nothing(self):
    # The run draws its plots at its end: a warning per missing glyph went
    # to its stderr.
    workdir = self.create_tempdir().full_path
    with open(os.path.join(workdir, 'metrics.jsonl'), 'w',
              encoding='utf-8') as f:
      for step in (1, 2):
        f.write(json.dumps({'step': step, 'reward/mean': 0.5,
                            'reward/mean/数学': 0.5}) + '\n')
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter('always')
      paths = plot.plot_run(workdir, window=1)
    self.assertLen(paths, 1)
    self.assertEqual([str(w.message) for w in caught], [])

  def test_many_datasets_and_long_names_keep_the_legend_readable(self):
    # Twelve datasets: the tenth was drawn in the overall curve's colour
    # ('C10' is 'C0') and the eleventh and twelfth in the first two's. A
    # 200-character name: its legend covered the curves, and matplotlib's
    # 'Tight layout not applied' warning reached the run's stderr.
    from matplotlib import figure  # pylint: disable=g-import-not-at-top
    from matplotlib import colors  # pylint: disable=g-import-not-at-top
    names = [f'set {i}' for i in range(11)] + ['x' * 200]
    records = [{'step': s, 'reward/mean': 0.5,
                **{f'reward/mean/{n}': 0.5 for n in names},
                **{f'data/snoozed/{n}': s for n in names}} for s in (1, 2)]
    (panel,) = plot_panels.reward_panels(records, 1)
    rgb = [colors.to_hex(line.style['color']) for line in panel.lines
           if line.label]
    self.assertLen(rgb, 13)
    self.assertLen(set(rgb), 13)  # 'all' and each dataset its own colour
    for n in (1, 9, 10, 18, 19, 40):
      hexes = [colors.to_hex(c) for c in plot_panels.dataset_colors(n)]
      self.assertLen(set(hexes + [colors.to_hex('C0')]), n + 1)
    workdir = self.create_tempdir().full_path
    with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
      f.writelines(json.dumps(r) + '\n' for r in records)
    drawn = []
    save = figure.Figure.savefig

    def keep(fig, *args, **kwargs):
      drawn.append(fig)
      save(fig, *args, **kwargs)

    with warnings.catch_warnings(record=True) as caught, mock.patch.object(
        figure.Figure, 'savefig', keep):
      warnings.simplefilter('always')
      paths = plot.plot_run(workdir, window=1)
    self.assertEqual([str(w.message) for w in caught], [])
    self.assertEqual([os.path.basename(p) for p in paths],
                     ['reward.png', 'snoozed_filtered.png'])
    for fig in drawn:
      (ax,) = fig.axes
      legend = ax.get_legend()
      # Beside the panel, not over its curves.
      self.assertGreater(legend.get_window_extent().x0,
                         ax.get_window_extent().x1)
      labels = [t.get_text() for t in legend.get_texts()]
      self.assertLessEqual(max(map(len, labels)), plot.LABEL_CHARS)
    self.assertIn('x' * 25 + '...' + 'x' * 12,
                  [t.get_text() for t in drawn[0].axes[0].get_legend()
                   .get_texts()])
    self.assertIn('x' * 25 + '...' + 'x' * 4 + ' snoozed',
                  [t.get_text() for t in drawn[1].axes[0].get_legend()
                   .get_texts()])

  def test_a_figure_of_other_records_is_not_left_beside_the_new_ones(self):
    # A fresh start in a workdir whose earlier run drew every figure (its
    # metrics.jsonl kept aside), now without evaluation: the earlier run's
    # accuracy.png and the others stayed beside this run's reward.png.
    workdir = self.create_tempdir().full_path
    _write_run(workdir, steps=3, eval_every=2)
    out = os.path.join(workdir, 'plots')
    self.assertLen(plot.plot_run(workdir, window=1), len(ALL_FIGURES))
    open(os.path.join(out, 'mine.png'), 'w').close()  # not a figure: kept
    with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
      for step in (1, 2):
        f.write(json.dumps({'step': step, 'reward/mean': 0.5}) + '\n')
    problems = []
    paths = plot.plot_run(workdir, window=1, log=problems.append)
    self.assertEqual(paths, [os.path.join(out, 'reward.png')])
    self.assertEqual(sorted(os.listdir(out)), ['mine.png', 'reward.png'])
    self.assertEmpty(problems)

  def test_a_legend_of_49_entries_stays_in_the_figure(self):
    # Twelve datasets of three subsets each: one column of 49 entries ran
    # off the figure's bottom and right edges.
    from matplotlib import figure  # pylint: disable=g-import-not-at-top
    x = np.arange(3.0)
    panel = plot_panels.Panel('accuracy', 'y', tuple(
        plot_panels.Line(f'dataset{i:02d}', x, x) for i in range(49)))
    drawn = []
    save = figure.Figure.savefig

    def keep(fig, *args, **kwargs):
      drawn.append(fig)
      save(fig, *args, **kwargs)

    path = os.path.join(self.create_tempdir().full_path, 'accuracy.png')
    with mock.patch.object(figure.Figure, 'savefig', keep):
      plot.draw(path, 'run', [panel])
    _check_png(self, path)
    (fig,) = drawn
    box = fig.axes[0].get_legend().get_window_extent()
    self.assertLen(fig.axes[0].get_legend().get_texts(), 49)
    self.assertGreaterEqual(box.y0, 0)
    self.assertLessEqual(box.x1, fig.bbox.width)

  def test_many_panels_wrap_onto_rows(self):
    # A curriculum's strata of 12 datasets: 13 batch-share panels side by
    # side made a figure 65 inches (5,850 pixels) wide.
    from matplotlib import figure  # pylint: disable=g-import-not-at-top
    x = np.arange(3.0)
    def panel(n):
      return plot_panels.Panel('p', 'y', tuple(
          plot_panels.Line(f's{i}', x, x) for i in range(n)))
    drawn = []
    save = figure.Figure.savefig

    def keep(fig, *args, **kwargs):
      drawn.append(fig)
      save(fig, *args, **kwargs)

    path = os.path.join(self.create_tempdir().full_path, 'batch_share.png')
    with mock.patch.object(figure.Figure, 'savefig', keep):
      plot.draw(path, 'run', [panel(12)] + [panel(3)] * 12)
    _check_png(self, path)
    (fig,) = drawn
    self.assertLen(fig.axes, 13)
    np.testing.assert_allclose(fig.get_size_inches(), (3 * 5.0 + 2.4, 5 * 3.4))
    self.assertEqual(plot.layout([panel(1), panel(12)]),
                     (1, 2, [0, 1], (5.0 + 7.4, 3.4)))  # one row as before

  def test_labels_with_dollar_signs_are_drawn_as_written(self):
    # matplotlib reads text between two '$' as math: a subset label from
    # the data ('$\frac$') failed the whole reward figure, and 'cost $5 to
    # $10' was drawn as 'cost 5 to 10' with '5 to ' in italics.
    from matplotlib import figure  # pylint: disable=g-import-not-at-top
    workdir = self.create_tempdir().full_path + '/run$1$'
    os.makedirs(workdir)
    with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
      for step in (1, 2):
        f.write(json.dumps({'step': step, 'reward/mean': 0.5,
                            'reward/mean/cost $5 to $10': 0.5,
                            'reward/mean/qa': 0.5,
                            'reward/mean/qa/$\\frac$': 0.5}) + '\n')
    drawn = []
    save = figure.Figure.savefig

    def keep(fig, *args, **kwargs):
      drawn.append(fig)
      save(fig, *args, **kwargs)

    problems = []
    with mock.patch.object(figure.Figure, 'savefig', keep):
      paths = plot.plot_run(workdir, window=1, log=problems.append)
    self.assertEmpty(problems)
    self.assertEqual([os.path.basename(p) for p in paths], ['reward.png'])
    (ax,) = drawn[0].axes
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    self.assertEqual(labels, ['all', r'cost \$5 to \$10', 'qa',
                              r'qa/\$\frac\$'])
    self.assertEqual(drawn[0].get_suptitle(), r'run\$1\$: reward')

  def test_two_draws_of_one_figure_at_once(self):
    # A run that ends while jaxgrpo-plot draws its figures: the second
    # rename found the shared temporary file gone (FileNotFoundError).
    from matplotlib import figure  # pylint: disable=g-import-not-at-top
    out = self.create_tempdir().full_path
    panel = plot_panels.Panel('t', 'y', (plot_panels.Line(
        None, np.arange(3.0), np.arange(3.0)),))
    both_saved = threading.Barrier(2, timeout=30)
    save = figure.Figure.savefig

    def save_then_wait(fig, *args, **kwargs):
      save(fig, *args, **kwargs)
      both_saved.wait()

    errors = []
    def draw():
      try:
        plot.draw(os.path.join(out, 'reward.png'), 'run', [panel])
      except OSError as e:
        errors.append(e)

    with mock.patch.object(figure.Figure, 'savefig', save_then_wait):
      threads = [threading.Thread(target=draw) for _ in range(2)]
      for t in threads:
        t.start()
      for t in threads:
        t.join()
    self.assertEqual(errors, [])
    self.assertEqual(os.listdir(out), ['reward.png'])
    _check_png(self, os.path.join(out, 'reward.png'))

  def test_cumulative_ratio_and_smoothing(self):
    records = [{'step': 0, 'eval/accuracy': 0.1}] + [
        {'step': s, 'rollout/prompts_generated': g, 'rollout/groups_used': 4.0,
         'rollout/efficiency': 4.0 / g}
        for s, g in ((1, 8.0), (2, 4.0), (3, 12.0))]
    steps, ratio = plot_panels.cumulative_ratio(records, 'generated/used')
    np.testing.assert_array_equal(steps, [1, 2, 3])
    np.testing.assert_allclose(ratio, [8 / 4, 12 / 8, 24 / 12])
    np.testing.assert_allclose(plot_panels.smooth([1.0, 3.0, np.nan, 5.0], 2),
                               [1.0, 2.0, 3.0, 5.0])
    np.testing.assert_allclose(plot_panels.smooth([1.0, 3.0], 1), [1.0, 3.0])

  def test_efficiency_over_windows_is_a_ratio_of_sums(self):
    # One round of 16 a step trains a batch of 1; the groups it found
    # beyond that wait, and steps without generation train on them. The
    # per-step ratios [1/16, 1, 1, 1/16, ...] averaged 0.53-0.73 (each
    # 0 / 0 counted as 1.0); the run used 10 groups of 48 generated.
    used_generated = [(1, 16), (1, 0), (1, 0), (1, 16), (1, 0), (1, 0),
                      (1, 0), (1, 16), (1, 0), (4, 0)]
    records = [{'step': s, 'rollout/groups_used': float(u),
                'rollout/prompts_generated': float(g),
                'rollout/efficiency': u / g if g else 1.0}
               for s, (u, g) in enumerate(used_generated, 1)]
    steps, windowed = plot_panels.window_efficiency(records, 10)
    np.testing.assert_array_equal(steps, range(1, 11))
    self.assertAlmostEqual(windowed[-1], 13 / 48)
    self.assertAlmostEqual(windowed[2], 3 / 16)
    (panel,) = plot_panels.efficiency_panels(records, 10)
    raw = panel.lines[0].y  # a step's own ratio, where it generated
    self.assertTrue(np.isnan(raw[1]))
    self.assertAlmostEqual(raw[0], 1 / 16)
    # A window of steps that used more than they generated passes 1: the
    # axis grows to show it (it was cut at 1).
    records[-1]['rollout/prompts_generated'] = 2.0
    (panel,) = plot_panels.efficiency_panels(records, 1)
    self.assertAlmostEqual(panel.lines[0].y[-1], 2.0)
    self.assertEqual(plot.unit_limits(panel), (-0.03, 2.03))
    path = os.path.join(self.create_tempdir().full_path, 'efficiency.png')
    plot.draw(path, 'efficiency', [panel])
    _check_png(self, path)

  def test_step_zero_only_writes_the_accuracy_figure(self):
    workdir = self.create_tempdir().full_path
    writer = metrics_lib.MetricsWriter(workdir)
    writer.write(0, {'eval/accuracy': 0.25, 'eval/accuracy/arith': 0.25,
                     'eval/accuracy/arith/1d': 0.5, 'eval/pass_at_k': 0.5})
    writer.close()
    problems = []
    paths = plot.plot_run(workdir, log=problems.append)
    self.assertEqual(paths, [os.path.join(workdir, 'plots', 'accuracy.png')])
    _check_png(self, paths[0])
    self.assertEmpty(problems)

  def test_few_steps_missing_keys_and_bad_lines_never_raise(self):
    workdir = self.create_tempdir().full_path
    problems = []
    # No metrics.jsonl at all.
    self.assertEqual(plot.plot_run(workdir, log=problems.append), [])
    self.assertLen(problems, 1)
    # One step, odd values, and a line cut short by a crash.
    with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
      f.write('{"step": 1, "reward/mean": "nan", "rollout/prompts_generated": '
              '8.0, "rollout/groups_used": 0.0, "data/batch_share/a": null, '
              '"data/snoozed/a": "text"}\n{"step": 2, "rew')
    problems = []
    paths = plot.plot_run(workdir, out=os.path.join(workdir, 'figs'),
                          log=problems.append)
    self.assertEmpty(problems)
    # The efficiency is 0 with no groups used; the NaN reward draws nothing,
    # and neither does the ratio to 0 groups used.
    self.assertEqual([os.path.basename(p) for p in paths],
                     ['prompts.png', 'efficiency.png'])
    for path in paths:
      _check_png(self, path)
    # Empty file.
    open(os.path.join(workdir, 'metrics.jsonl'), 'w').close()
    self.assertEqual(plot.plot_run(workdir), [])
    # Lines that are JSON but no object (not a run's file): left out.
    with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
      f.write('[1, 2]\n"x"\n3\n')
    problems = []
    self.assertEqual(plot.plot_run(workdir, log=problems.append), [])
    self.assertEmpty(problems)

  def test_a_failing_figure_is_logged_not_raised(self):
    workdir = self.create_tempdir().full_path
    _write_run(workdir, steps=3, eval_every=2)
    problems = []
    with mock.patch.dict(plot.FIGURES, reward=mock.Mock(
        side_effect=RuntimeError('boom'))):
      paths = plot.plot_run(workdir, log=problems.append)
    self.assertLen(paths, len(ALL_FIGURES) - 1)
    self.assertEqual(problems, ["plot 'reward' failed: RuntimeError: boom"])

  def test_an_argument_of_the_wrong_type_is_named(self):
    # `plot_run(workdir, 10)` took the 10 as the output folder: a TypeError
    # from os.makedirs that named neither the argument nor the function.
    workdir = self.create_tempdir().full_path
    _write_run(workdir, steps=3, eval_every=2)
    for args, message in (
        ((workdir, 10), 'plot_run: out=10 (int) is not a folder path (str or '
                        'os.PathLike) (for a trailing mean of 10 steps, pass '
                        'window=10)'),
        ((workdir, None, 'ten'),
         "plot_run: window='ten' is not a whole number of steps"),
        ((None,), 'plot_run: workdir=None (NoneType) is not a folder path '
                  '(str or os.PathLike)'),
    ):
      with self.assertRaises(TypeError) as raised:
        plot.plot_run(*args, log=self.fail)
      self.assertEqual(str(raised.exception), message)
    self.assertFalse(os.path.exists(os.path.join(workdir, 'plots')))
    # A path object, and a window given as a float, are taken as before.
    paths = plot.plot_run(pathlib.Path(workdir), pathlib.Path(workdir) / 'f',
                          2.0, log=self.fail)
    self.assertLen(paths, len(ALL_FIGURES))

  def test_without_matplotlib(self):
    workdir = self.create_tempdir().full_path
    _write_run(workdir, steps=2)
    problems = []
    with mock.patch.dict(sys.modules, {'matplotlib': None}):
      self.assertEqual(plot.plot_run(workdir, log=problems.append), [])
      code, stdout, stderr = _main(workdir)
    self.assertEqual(problems, ['matplotlib is not installed: no plots '
                                "(pip install 'jaxgrpo[plots]')"])
    self.assertEqual(code, 1)
    self.assertEqual(stdout, '')
    self.assertEqual(stderr.splitlines(), [
        "jaxgrpo-plot: error: matplotlib is not installed: no plots "
        "(pip install 'jaxgrpo[plots]')"])
    self.assertFalse(os.path.exists(os.path.join(workdir, 'plots')))

class CommandLineTest(absltest.TestCase):

  def test_writes_and_prints_the_paths(self):
    workdir = self.create_tempdir().full_path
    out = os.path.join(self.create_tempdir().full_path, 'figures')
    _write_run(workdir, steps=12, eval_every=4)
    code, stdout, stderr = _main(workdir, '--out', out, '--window', '3')
    self.assertEqual(code, 0, stderr)
    self.assertEqual(stdout.splitlines(),
                     [os.path.join(out, f'{n}.png') for n in ALL_FIGURES])

  def test_home_relative_paths_are_in_the_home_folder(self):
    # '--out=~/figures' (bash leaves a ~ after '=' alone) drew into
    # ./~/figures and made an empty ~/figures; a workdir '~/run' was no
    # such folder.
    home = self.create_tempdir().full_path
    cwd = self.create_tempdir().full_path
    _write_run(os.path.join(home, 'run'), steps=4, eval_every=2)
    before = os.getcwd()
    os.chdir(cwd)
    try:
      with mock.patch.dict(os.environ, {'HOME': home}):
        code, stdout, stderr = _main('~/run', '--out=~/figures')
    finally:
      os.chdir(before)
    self.assertEqual(code, 0, stderr)
    self.assertEqual(os.listdir(cwd), [])
    self.assertEqual(stdout.splitlines()[0],
                     os.path.join(home, 'figures', f'{ALL_FIGURES[0]}.png'))

  def test_mistakes_end_with_one_line(self):
    empty = self.create_tempdir().full_path
    with_records = self.create_tempdir().full_path
    _write_run(with_records, steps=2)
    blank = self.create_tempdir().full_path
    open(os.path.join(blank, 'metrics.jsonl'), 'w').close()
    folder = self.create_tempdir().full_path
    os.mkdir(os.path.join(folder, 'metrics.jsonl'))
    no_objects = self.create_tempdir().full_path
    with open(os.path.join(no_objects, 'metrics.jsonl'), 'w') as f:
      f.write('[1]\n"x"\n')
    # Mistakes in the input exit 2, as jaxgrpo-export and summarize_run.py
    # do for a folder that is no run workdir; a run's state, 1.
    cases = (
        ((empty,), 2, 'metrics.jsonl: no such file, and no run started in'),
        ((os.path.join(empty, 'nope'),), 2, 'nope: no such folder'),
        ((folder,), 2, 'metrics.jsonl: is a folder'),
        ((with_records, '--window=0'), 2, '--window=0: must be >= 1'),
        ((with_records, '--bogus'), 2, 'unrecognized arguments'),
        ((), 2, 'required: workdir'),
        ((blank,), 1, 'holds no step yet'),
        ((no_objects,), 1, 'holds no metrics to plot'),
        # It said `no plots: [Errno 17] File exists`, naming no flag.
        ((with_records, f'--out={with_records}/metrics.jsonl'), 2,
         f'--out={with_records}/metrics.jsonl: {with_records}/metrics.jsonl '
         'is a file; name a folder'),
    )
    for argv, want, pattern in cases:
      with self.subTest(argv=argv):
        code, _, stderr = _main(*argv)
        self.assertEqual(code, want, stderr)
        lines = stderr.splitlines()
        self.assertLen(lines, 1, stderr)
        self.assertStartsWith(lines[0], 'jaxgrpo-plot: error: ')
        self.assertIn(pattern, lines[0])

  def test_a_run_before_its_first_step_is_told_and_left_alone(self):
    # A run starting (checkpoints/ and its lock, no metrics.jsonl yet), one
    # whose first line is being written, one that stopped before a step.
    starting = self.create_tempdir().full_path
    os.mkdir(os.path.join(starting, 'checkpoints'))
    writing = self.create_tempdir().full_path
    with open(os.path.join(writing, 'metrics.jsonl'), 'w') as f:
      f.write('{"step": 1, "reward/me')
    stopped = self.create_tempdir().full_path
    open(os.path.join(stopped, 'metrics.jsonl'), 'w').close()
    for workdir, training in ((starting, True), (writing, True),
                              (stopped, False)):
      with self.subTest(workdir=workdir), contextlib.ExitStack() as stack:
        if training:
          stack.enter_context(workdir_lib.lock(workdir, process_index=0))
        before = sorted(os.listdir(workdir))
        code, stdout, stderr = _main(workdir, '--tensorboard')
        self.assertEqual((code, stdout), (1, ''))
        path = os.path.join(workdir, 'metrics.jsonl')
        run = (f'the run training in {workdir} (pid {os.getpid()} on '
               f'{socket.gethostname()}, started ' if training
               else f'the run in {workdir} may')
        self.assertStartsWith(
            stderr, f'jaxgrpo-plot: error: {path} holds no step yet: {run}')
        self.assertEndsWith(
            stderr, 'may not have finished its first step; wait for it and '
            f'plot again, or check that {workdir} is the workdir you meant\n')
        self.assertLen(stderr.splitlines(), 1)
        # Nothing written: no tensorboard/ nor plots/ folder.
        self.assertEqual(sorted(os.listdir(workdir)), before)

  def test_a_closed_pipe_ends_it_quietly(self):
    # `jaxgrpo-plot W | head -1` ended in a BrokenPipeError traceback. The
    # reader is gone before the first path is printed.
    workdir = self.create_tempdir().full_path
    _write_run(workdir, steps=3)
    read, write = os.pipe()
    os.close(read)
    proc = subprocess.run([sys.executable, '-m', 'jaxgrpo.cli.plot', workdir],
                          cwd=REPO, stdout=write, stderr=subprocess.PIPE,
                          text=True, timeout=120)
    os.close(write)
    self.assertEqual((proc.returncode, proc.stderr), (141, ''))

  def test_python_dash_m_help(self):
    proc = subprocess.run([sys.executable, '-m', 'jaxgrpo.cli.plot', '--help'],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    self.assertEqual(proc.returncode, 0, proc.stderr)
    self.assertIn('usage: jaxgrpo-plot', proc.stdout)


class TensorBoardTest(absltest.TestCase):

  def test_the_writer_imports_neither_torch_nor_tensorboardx_writers(self):
    # tensorboardX's __init__ imports its SummaryWriter, and with it torch
    # where torch is installed: two seconds at every training start. The
    # writer needs only the protos; tensorboardX itself still imports whole
    # afterwards.
    if tensorboard_events.missing():
      self.skipTest(tensorboard_events.missing())
    script = (
        'import sys\n'
        'from jaxgrpo.reporting import tensorboard\n'
        'assert tensorboard.available()\n'
        "print(sorted(m for m in ('torch', 'tensorboardX', "
        "'tensorboardX.writer') if m in sys.modules))\n"
        'import tensorboardX\n'
        'print(tensorboardX.SummaryWriter.__name__)\n')
    done = subprocess.run([sys.executable, '-c', script], capture_output=True,
                          text=True, timeout=120, cwd=REPO,
                          env={**os.environ, 'PYTHONPATH': REPO})
    self.assertEqual(done.returncode, 0, done.stderr[-3000:])
    self.assertEqual(done.stdout.splitlines(), ['[]', 'SummaryWriter'])

  def test_every_scalar_of_every_step(self):
    if tensorboard_events.missing():
      self.skipTest(tensorboard_events.missing())
    workdir = self.create_tempdir().full_path
    _write_run(workdir, steps=3, eval_every=2)
    logdir = os.path.join(workdir, 'tensorboard')
    os.makedirs(logdir)
    stale = os.path.join(logdir, 'events.out.tfevents.1.host')
    open(stale, 'w').close()
    self.assertEqual(plot.write_tensorboard(workdir), logdir)
    self.assertFalse(os.path.exists(stale))  # a rerun replaces the events
    events = tensorboard_events.scalars(logdir)
    self.assertEqual([s for s, _ in events['reward/mean']], [1, 2, 3])
    self.assertEqual([s for s, _ in events['eval/accuracy']], [0, 2])
    by_step = {}
    for tag, points in events.items():
      for step, value in points:
        by_step.setdefault(step, {})[tag] = value
    records = metrics_lib.read_metrics(workdir)
    self.assertEqual(sorted(by_step), [r['step'] for r in records])
    for record in records:
      expected = {k: float(np.float32(float(v))) for k, v in record.items()
                  if k != 'step'}
      np.testing.assert_equal(by_step[record['step']], expected)
    self.assertTrue(np.isnan(by_step[3]['train/loss']))

  def test_the_events_of_a_run_training_there_are_left(self):
    # The run appends to its open event file: deleting it would lose every
    # event from then on (written to a file no longer in the folder).
    if tensorboard_events.missing():
      self.skipTest(tensorboard_events.missing())
    workdir = self.create_tempdir().full_path
    _write_run(workdir, steps=3)
    logdir = os.path.join(workdir, 'tensorboard')
    os.makedirs(logdir)
    other = os.path.join(logdir, 'events.out.tfevents.1.otherhost.1.0.v2')
    open(other, 'w').close()
    with workdir_lib.lock(workdir, process_index=0):
      code, stdout, _ = _main(workdir, '--tensorboard')
      self.assertEqual(code, 0)
      # A run that writes no events (tensorboard=False): rewritten.
      self.assertFalse(os.path.exists(other))
      own = os.path.join(logdir, f'events.out.tfevents.1.'
                         f'{socket.gethostname()}.{os.getpid()}.0.v2')
      open(own, 'w').close()
      code, stdout, _ = _main(workdir, '--tensorboard')
      self.assertEqual(code, 0)
      self.assertTrue(os.path.exists(own))
      self.assertIn(f'{logdir}: left as it is: the run training in {workdir} '
                    f'(pid {os.getpid()} on {socket.gethostname()}, started ',
                    stdout)
    self.assertIsNone(workdir_lib.holder(workdir))
    self.assertEqual(_main(workdir, '--tensorboard')[0], 0)  # after it ends
    self.assertFalse(os.path.exists(own))

  def test_an_integer_past_floats_range_is_left_out(self):
    # A damaged count (400 digits): an OverflowError traceback before.
    if tensorboard_events.missing():
      self.skipTest(tensorboard_events.missing())
    workdir = self.create_tempdir().full_path
    with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
      f.write('{"step": 1, "reward/mean": ' + '9' * 400 + '}\n'
              '{"step": 2, "reward/mean": 0.5}\n')
    code, _, stderr = _main(workdir, '--tensorboard', '--window=1')
    self.assertEqual((code, stderr), (0, ''))
    events = tensorboard_events.scalars(os.path.join(workdir, 'tensorboard'))
    self.assertEqual(events['reward/mean'], [(2, 0.5)])

  def test_without_tensorboardx_names_the_extra(self):
    workdir = self.create_tempdir().full_path
    _write_run(workdir, steps=2)
    with mock.patch.dict(sys.modules, {'tensorboardX': None}):
      self.assertIsNone(plot.write_tensorboard(workdir))
      code, stdout, stderr = _main(workdir, '--tensorboard')
    self.assertEqual(code, 1)
    self.assertLen(stdout.splitlines(), len(ALL_FIGURES))  # PNGs still made
    self.assertEqual(stderr.splitlines(), [
        'jaxgrpo-plot: error: --tensorboard needs tensorboardX (it writes '
        "the events): pip install 'jaxgrpo[tensorboard]'"])
    self.assertFalse(os.path.exists(os.path.join(workdir, 'tensorboard')))


if __name__ == '__main__':
  absltest.main()
