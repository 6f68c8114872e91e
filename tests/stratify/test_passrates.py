"""The pass-rate file format: parts, pooling, duplicates, summary, errors."""

import json
import os
import re
import shutil

from absl.testing import absltest
import numpy as np

from jaxgrpo import errors
from jaxgrpo.stratify import passrates


def _write(out, tag, ids, passes, *, k=4, part=0, shard=0, num_shards=1,
           dataset='a', threshold=1.0):
  return passrates.write_part(
      out, dataset, tag, shard=shard, num_shards=num_shards, part=part,
      ids=ids, k=np.full(len(ids), k), passes=np.asarray(passes),
      mean_reward=np.asarray(passes) / k,
      info={'spec': f'runs/{tag}', 'policy': tag, 'k': k, 'seed': 0,
            'success_threshold': threshold, 'config': 'c.py', 'examples': 3,
            'num_shards': num_shards, 'chunk': 2})


class PassRatesTest(absltest.TestCase):

  def test_layout_and_columns(self):
    out = self.create_tempdir().full_path
    path = _write(out, 'm1', ['x', 'y'], [1, 4], part=3, shard=1,
                  num_shards=2)
    self.assertEqual(path, os.path.join(
        out, 'parts', 'a', 'm1', 'shard-00001-of-00002-part-00003.parquet'))
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
    table = pq.read_table(path)
    self.assertEqual(
        [(f.name, str(f.type)) for f in table.schema],
        [('id', 'string'), ('k', 'int32'), ('passes', 'int32'),
         ('mean_reward', 'float')])
    info = passrates.part_info(path)
    self.assertEqual((info['spec'], info['k'], info['rows']), ('runs/m1', 4, 2))

  def test_pools_checkpoints_and_counts_duplicates_once(self):
    out = self.create_tempdir().full_path
    _write(out, 'm1', ['x', 'y'], [1, 4])
    _write(out, 'm1', ['z'], [0], part=1)
    _write(out, 'm2', ['x', 'z'], [3, 2], k=8)
    # The same rows again, as a second part (e.g. copied by hand).
    first = passrates.list_parts(out, 'a', 'm1')[(0, 1, 0)]
    shutil.copy(first, first.replace('part-00000', 'part-00007'))
    # Unfinished writes never count.
    with open(first.replace('.parquet', '.parquet.abc.tmp'), 'w') as f:
      f.write('half a file')

    rates = passrates.read(out)['a']
    self.assertEqual(rates.ids, ['x', 'y', 'z'])
    np.testing.assert_array_equal(rates.trials, [12, 4, 12])
    np.testing.assert_array_equal(rates.passes, [4, 4, 2])
    np.testing.assert_allclose(rates.pass_rate, [4 / 12, 1.0, 2 / 12])
    # Trial-weighted: (4 * 1/4 + 8 * 3/8) / 12.
    np.testing.assert_allclose(rates.mean_reward, [4 / 12, 1.0, 2 / 12])
    self.assertEqual(rates.trials.dtype, np.int64)
    self.assertEqual(rates.mean_reward.dtype, np.float64)

    only = passrates.read(out, checkpoints=['m2'])['a']
    self.assertEqual(only.ids, ['x', 'z'])
    np.testing.assert_allclose(only.pass_rate, [3 / 8, 2 / 8])
    self.assertEqual(passrates.tags(out), ['m1', 'm2'])

  def test_tags_in_other_scripts_name_their_own_folders(self):
    out = self.create_tempdir().full_path
    _write(out, '数学-step3', ['x', 'y'], [1, 4])
    _write(out, '模型-step3', ['x', 'y'], [0, 2])
    self.assertEqual(passrates.tags(out), ['数学-step3', '模型-step3'])
    only = passrates.read(out, checkpoints=['模型-step3'])['a']
    np.testing.assert_array_equal(only.passes, [0, 2])
    summary = passrates.write_summary(out)
    self.assertEqual(summary['datasets']['a']['done'],
                     {'数学-step3': 2, '模型-step3': 2})

  def test_summary_from_the_parts(self):
    out = self.create_tempdir().full_path
    _write(out, 'm1', ['x', 'y'], [1, 4])
    _write(out, 'm1', ['x'], [1], dataset='b')
    summary = passrates.write_summary(out)
    self.assertEqual(summary['datasets'], {
        'a': {'examples': 3, 'done': {'m1': 2}},
        'b': {'examples': 3, 'done': {'m1': 1}}})
    m1 = summary['checkpoints']['m1']
    self.assertEqual((m1['spec'], m1['k'], m1['seed'], m1['config'],
                      m1['success_threshold']), ('runs/m1', 4, 0, 'c.py', 1.0))
    self.assertTrue(os.path.exists(os.path.join(out, passrates.SUMMARY)))

  def test_errors_name_the_directory(self):
    out = self.create_tempdir().full_path
    with self.assertRaisesRegex(errors.UserError, f'{out}: no pass rates'):
      passrates.read(out)
    with self.assertRaisesRegex(errors.UserError, 'no pass rates'):
      passrates.read(os.path.join(out, 'missing'))
    _write(out, 'm1', ['x'], [1])
    with self.assertRaisesRegex(errors.UserError,
                                f"{out}: no pass rates of checkpoint tag "
                                "'m9' \\(tags there: m1\\)"):
      passrates.read(out, checkpoints=['m9'])
    bad = os.path.join(out, 'parts', 'a', 'm1',
                       'shard-00000-of-00001-part-00001.parquet')
    with open(bad, 'w') as f:
      f.write('not parquet')
    with self.assertRaisesRegex(errors.UserError, f'{bad}: not a readable'):
      passrates.read(out)

  def test_rows_that_are_no_pass_rates_are_named(self):
    for k, passes in ((4, 5), (0, 0), (4, -1)):
      out = self.create_tempdir().full_path
      path = _write(out, 'm1', ['x', 'y'], [1, passes], k=k)
      with self.assertRaisesRegex(
          errors.UserError, f"^{path}: row . \\(id '.'\\) is no pass rate: "
          f'k={k}, passes='):
        passrates.read(out)

  def test_tags_of_other_thresholds_do_not_pool(self):
    # A pass at reward >= 0.5 and one at >= 1 are not the same event: the
    # pooled rates counted both as passes without a word.
    out = self.create_tempdir().full_path
    _write(out, 'm1', ['x', 'y'], [1, 4])
    _write(out, 'm2', ['x', 'y'], [3, 4], threshold=0.5)
    _write(out, 'm3', ['x', 'y'], [2, 4])
    with self.assertRaisesRegex(
        errors.UserError, f"^{out}: dataset 'a': checkpoint 'm1' counted a "
        "pass at reward >= 1, 'm2' at >= 0.5 .*do not pool; pick the tags "
        'of one threshold'):
      passrates.read(out)
    rates = passrates.read(out, checkpoints=['m1', 'm3'])['a']
    np.testing.assert_allclose(rates.pass_rate, [3 / 8, 1.0])
    self.assertLen(passrates.read(out, checkpoints=['m2'])['a'].ids, 2)

  def test_a_part_of_a_later_format_is_refused(self):
    out = self.create_tempdir().full_path
    path = _write(out, 'm1', ['x', 'y'], [1, 4])
    self.assertEqual(passrates.part_info(path)['format'], passrates.FORMAT)
    self.assertEqual(passrates.write_summary(out)['format'], passrates.FORMAT)
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
    table = pq.read_table(path)
    info = json.loads(table.schema.metadata[passrates.METADATA_KEY])
    for form in (passrates.FORMAT + 1, '2'):
      with self.subTest(format=form):
        pq.write_table(table.replace_schema_metadata(
            {passrates.METADATA_KEY: json.dumps({**info, 'format': form})}),
                       path)
        with self.assertRaisesRegex(
            errors.UserError, f'^{path}: written by a later jaxgrpo-stratify '
            rf"\(format {form!r}; this version reads format 1\)"):
          passrates.read(out)
    # Parts written before the format was recorded are format 1.
    del info['format']
    pq.write_table(table.replace_schema_metadata(
        {passrates.METADATA_KEY: json.dumps(info)}), path)
    self.assertEqual(passrates.read(out)['a'].ids, ['x', 'y'])

  def test_a_verify_description_that_is_not_counts_is_named(self):
    # A hand-edited all_failed of 'x' was read letter by letter, ids given
    # as numbers matched none, and a verify that is no dict raised a bare
    # AttributeError.
    out = self.create_tempdir().full_path
    path = _write(out, 'm1', ['x', 'y'], [1, 4])
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
    table = pq.read_table(path)
    info = json.loads(table.schema.metadata[passrates.METADATA_KEY])
    where = f"{path}: its jaxgrpo.stratify metadata's verify"
    for verify, message in (
        ('x', ' must be a dict of verifier counts, got '),
        ({'all_failed': 'x'}, r'\.all_failed must be a list of example ids, '
         "got 'x'"),
        ({'all_failed': [3]}, r'\.all_failed must be a list of example ids'),
        ({'errors': -1}, r'\.errors must be a count \(an int >= 0\), got -1'),
        ({'calls': '4'}, r"\.calls must be a count \(an int >= 0\), got '4'")):
      with self.subTest(verify=verify):
        pq.write_table(table.replace_schema_metadata(
            {passrates.METADATA_KEY: json.dumps({**info, 'verify': verify})}),
                       path)
        with self.assertRaisesRegex(errors.UserError,
                                    '^' + re.escape(where) + message):
          passrates.read(out)
    pq.write_table(table.replace_schema_metadata({
        passrates.METADATA_KEY: json.dumps({**info, 'verify': {
            'calls': 8, 'errors': 1, 'partly_failed': 1,
            'all_failed': ['x']}})}), path)
    self.assertEqual(passrates.read(out)['a'].failed, ('x',))

  def test_a_part_without_a_column_is_refused(self):
    # A part with 'k' named otherwise (another tool, another version): the
    # column was read as empty values, pooled into pass rates of -1e-19.
    out = self.create_tempdir().full_path
    path = _write(out, 'm1', ['x', 'y'], [1, 4])
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
    table = pq.read_table(path)
    pq.write_table(table.rename_columns(
        ['id', 'trials', 'passes', 'mean_reward']), path)
    with self.assertRaisesRegex(
        errors.UserError, f"^{path}: no values in column 'k' \\(a pass-rate "
        'part has the columns id, k, passes, mean_reward, each in every '
        'row\\)'):
      passrates.read(out)


if __name__ == '__main__':
  absltest.main()
