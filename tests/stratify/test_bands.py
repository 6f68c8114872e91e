"""Strata names and assignment, and the report's tables and plot."""

import json
import os
import sys
from unittest import mock

from absl.testing import absltest
import numpy as np

from jaxgrpo import errors
from jaxgrpo.reporting import console
from jaxgrpo.stratify import bands
from jaxgrpo.stratify import passrates
from jaxgrpo.stratify import report


class BandsTest(absltest.TestCase):

  def test_names(self):
    self.assertEqual(
        bands.stratum_names(bands.DEFAULT_EDGES),
        ['too_hard', '0-0.25', '0.25-0.5', '0.5-0.75', '0.75-1', 'too_easy'])
    self.assertEqual(bands.stratum_names(()), ['too_hard', '0-1', 'too_easy'])
    self.assertEqual(bands.stratum_names([0.1]),
                     ['too_hard', '0-0.1', '0.1-1', 'too_easy'])

  def test_bad_edges(self):
    for edges in ((0.0, 0.5), (0.5, 1.0), (0.5, 0.25), (0.5, 0.5), (-0.1,),
                  (1.5,), (float('nan'),)):
      with self.subTest(edges=edges):
        with self.assertRaises(ValueError):
          bands.stratum_names(edges)
        with self.assertRaises(ValueError):
          bands.assign(np.array([0.5]), edges)

  def test_assign(self):
    rates = np.array([0.0, 1e-9, 0.1, 0.25, 0.49, 0.5, 0.75, 0.99, 1.0])
    np.testing.assert_array_equal(
        bands.assign(rates, bands.DEFAULT_EDGES),
        [0, 1, 1, 2, 2, 3, 4, 4, 5])
    np.testing.assert_array_equal(bands.assign(rates, ()),
                                  [0, 1, 1, 1, 1, 1, 1, 1, 2])
    self.assertEqual(bands.assign(np.zeros(0), (0.5,)).shape, (0,))
    self.assertEqual(bands.assign(np.zeros(3), (0.5,)).dtype, np.int64)
    for bad in (np.nan, -0.1, 1.5):
      with self.assertRaisesRegex(ValueError, 'must lie in'):
        bands.assign(np.array([0.5, bad]), (0.5,))


def _write(out, dataset, tag, passes, k=4):
  n = len(passes)
  passrates.write_part(
      out, dataset, tag, shard=0, num_shards=1, part=0,
      ids=[f'{dataset}/{i}' for i in range(n)], k=np.full(n, k),
      passes=np.asarray(passes), mean_reward=np.asarray(passes) / k,
      info={'spec': tag, 'policy': tag, 'k': k, 'examples': n})


class ReportTest(absltest.TestCase):

  def _out(self):
    out = self.create_tempdir().full_path
    _write(out, 'a', 'm1', [0, 0, 1, 2, 3, 4])  # 2 hard, 3 bands, 1 easy
    _write(out, 'a', 'm2', [4, 0, 4, 4, 4, 4])
    _write(out, 'b', 'm1', [1, 1])
    return out

  def test_tables_json_and_plot(self):
    out = self._out()
    lines = []
    result = report.report(out, log=lines.append)
    a = result['datasets']['a']
    self.assertEqual(a['checkpoints']['m1']['counts'], {
        'too_hard': 2, '0-0.25': 0, '0.25-0.5': 1, '0.5-0.75': 1,
        '0.75-1': 1, 'too_easy': 1})
    self.assertEqual(a['checkpoints']['m2']['counts']['too_easy'], 5)
    # Pooled per example: 4/8, 0/8, 5/8, 6/8, 7/8, 8/8 (a band holds its
    # lower edge: 0.5 is in 0.5-0.75).
    self.assertEqual(list(a['pooled']['counts'].values()), [1, 0, 0, 2, 2, 1])
    self.assertAlmostEqual(a['pooled']['shares']['0.75-1'], 2 / 6)
    self.assertEqual(list(result['datasets']['b']['checkpoints']), ['m1'])
    with open(os.path.join(out, report.STRATA_JSON)) as f:
      self.assertEqual(json.load(f), result)
    with open(os.path.join(out, report.PLOT), 'rb') as f:
      self.assertEqual(f.read(8), b'\x89PNG\r\n\x1a\n')
    self.assertTrue(any(line.startswith('pooled') for line in lines))
    self.assertTrue(os.path.exists(os.path.join(out, passrates.SUMMARY)))

  def test_a_run_not_finished_is_named(self):
    # Shard 1 of 2 done, shard 0 not run: the tables showed 2 examples with
    # pass rates, nothing said that 2 more were to come.
    out = self.create_tempdir().full_path
    passrates.write_part(
        out, 'a', 'm1', shard=1, num_shards=2, part=0, ids=['a/1', 'a/3'],
        k=np.full(2, 4), passes=np.array([1, 4]),
        mean_reward=np.array([0.25, 1.0]), info={'examples': 4})
    lines = []
    report.report(out, plot=False, log=lines.append)
    self.assertIn('checkpoint m1 has pass rates of 2 of the 4 examples of '
                  'dataset a that its jaxgrpo-stratify run set out to measure '
                  '(interrupted, or shards not run yet): the same '
                  'jaxgrpo-stratify run command finishes it', lines)
    lines = []
    report.report(self._out(), plot=False, log=lines.append)
    self.assertFalse([l for l in lines if 'set out to' in l], lines)

  def test_selected_tags_and_bands(self):
    out = self._out()
    result = report.report(out, (0.5,), plot=False, checkpoints=['m2'],
                           log=lambda _: None)
    self.assertEqual(result['strata'], ['too_hard', '0-0.5', '0.5-1',
                                        'too_easy'])
    self.assertEqual(list(result['datasets']), ['a'])
    self.assertEqual(result['datasets']['a']['pooled']['counts'],
                     {'too_hard': 1, '0-0.5': 0, '0.5-1': 0, 'too_easy': 5})
    self.assertIsNone(result['plot'])
    with self.assertRaisesRegex(errors.UserError, "tag 'm3'"):
      report.report(out, checkpoints=['m3'], log=lambda _: None)

  def test_tables_line_up_with_wide_tags(self):
    # A tag of CJK glyphs (a workdir named so) takes two columns each.
    out = self.create_tempdir().full_path
    _write(out, 'a', '実験-step3', [0, 1, 2])
    _write(out, 'a', 'm1', [4, 4, 1])
    lines = report.format_tables(report.report(out, plot=False,
                                               log=lambda _: None))
    table = lines[1:5]  # header, two tags, pooled
    self.assertLen({console.width(line) for line in table}, 1, table)
    # The mean column starts at one column.
    self.assertEqual({console.width(line[:line.index(' 0.') + 1])
                      for line in table[1:]}, {console.width('実験-step3') + 2})

  def test_without_matplotlib_the_plot_is_skipped_with_a_note(self):
    out = self._out()
    lines = []
    with mock.patch.dict(sys.modules, {'matplotlib': None}):
      result = report.report(out, log=lines.append)
    self.assertIsNone(result['plot'])
    self.assertTrue(any('matplotlib is not installed' in line
                        for line in lines))


if __name__ == '__main__':
  absltest.main()
