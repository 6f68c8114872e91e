"""Tests for the local TFDS builders of GSM8K and SQuAD 2.0."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

from absl.testing import absltest

from jaxgrpo import config_lib
from jaxgrpo import errors
from jaxgrpo.configs import demo
from jaxgrpo.data import loading
from jaxgrpo.data import sources
from jaxgrpo.data import tokenizer as tokenizer_lib

_HAS_TFDS = importlib.util.find_spec('tensorflow_datasets') is not None
_REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')
_DATA = os.path.join(_REPO, '..', 'shared', 'data')
_GSM8K = os.path.join(_DATA, 'gsm8k')
_SQUAD2 = os.path.join(_DATA, 'squad2')


def _all(ds) -> list:
  return [ds[i] for i in range(len(ds))]


@absltest.skipUnless(
    _HAS_TFDS,
    "tensorflow_datasets is not installed (pip install 'jaxgrpo[tfds]')")
class TfdsBuildersTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # pylint: disable-next=g-import-not-at-top
    from jaxgrpo.data import tfds_builders
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

    tfds.disable_progress_bar()
    cls.tfds = tfds
    cls.builders = tfds_builders
    cls.data_dir = tempfile.mkdtemp()
    cls.addClassCleanup(shutil.rmtree, cls.data_dir)
    for name, manual in (('gsm8k', _GSM8K), ('squad2', _SQUAD2)):
      if os.path.isdir(manual):
        tfds_builders.prepare(name, manual, cls.data_dir)

  def _needs(self, path):
    if not os.path.isdir(path):
      self.skipTest(f'real data not found: {os.path.normpath(path)}')

  def test_gsm8k_equals_the_jsonl_files(self):
    self._needs(_GSM8K)
    for split, count in (('test', 1319), ('train', 7473)):
      ds = sources.make_dataset('tfds', name='gsm8k', split=split,
                                tfds_name='jaxgrpo_gsm8k',
                                data_dir=self.data_dir)
      want = sources.make_dataset(
          'gsm8k', name='gsm8k', path=os.path.join(_GSM8K, f'{split}.jsonl'))
      self.assertLen(ds, count)
      if split == 'test':
        self.assertEqual(_all(ds), _all(want))
      else:  # every 10th record, for speed
        self.assertEqual([ds[i] for i in range(0, count, 10)],
                         [want[i] for i in range(0, count, 10)])

  def test_squad2_equals_the_json_file(self):
    self._needs(_SQUAD2)
    ds = sources.make_dataset('tfds', name='squad2', split='validation',
                              tfds_name='jaxgrpo_squad2:1.0.0',
                              data_dir=self.data_dir)
    want = sources.make_dataset(
        'squad2', name='squad2',
        path=os.path.join(_SQUAD2, 'cs224n-dev-v2.0.json'))
    self.assertLen(ds, 6078)
    self.assertEqual(_all(ds), _all(want))

  def test_random_access_through_tfds_data_source(self):
    self._needs(_SQUAD2)
    source = self.tfds.data_source('jaxgrpo_squad2', split='validation',
                                   data_dir=self.data_dir)
    self.assertLen(source, 6078)
    record = source[6077]
    self.assertEqual(record['id'], b'ddbccaa3c57fee6bb3af0c234')
    self.assertTrue(record['is_impossible'])
    self.assertEmpty(record['answers'])
    self.assertLen(source[0]['answers'], 4)  # duplicates kept, as shipped

  def test_loading_with_holdout(self):
    self._needs(_GSM8K)
    c = demo.get_config('runlocal')
    c.data.datasets = [dict(name='gsm8k', kind='tfds', split='test',
                            tfds_name='jaxgrpo_gsm8k',
                            data_dir=self.data_dir, holdout=50, num_eval=50)]
    cfg = config_lib.from_config_dict(c)
    _, ds, held = loading.load_dataset(cfg, cfg.data.datasets[0],
                                       tokenizer_lib.CharTokenizer())
    self.assertLen(ds, 1269)
    self.assertLen(held, 50)
    self.assertEqual(held[0].answer, '18')
    self.assertTrue(held[0].prompt.endswith('"#### <number>".'))
    self.assertEmpty({ds[i].id for i in range(len(ds))}
                     & {ex.id for ex in held})

  def test_a_split_or_name_tfds_cannot_serve_names_the_key(self):
    # Each was a TFDS traceback (ValueError, AssertionError) before.
    self._needs(_GSM8K)
    c = demo.get_config('runlocal')
    for keys, message in (
        (dict(eval_split='valid'), r"^data\.datasets\[0\]\.eval_split='valid' "
         r"\(dataset 'gsm8k'\): tfds dataset 'jaxgrpo_gsm8k' cannot serve "
         r"this split \(Unknown split 'valid'. Should be one of \['train', "
         r"'test'\]\.\)$"),
        (dict(split='train[:abc]'), r"\.split='train\[:abc\]' .* cannot "
         r'serve this split \(Error parsing split'),
        (dict(tfds_name='jaxgrpo_gsm8k:9.9.9'), r"\.tfds_name='jaxgrpo_gsm8k:"
         r"9.9.9' .*no such tfds dataset .*only: 1\.0\.0"),
        (dict(tfds_name='no_such_one'), r"\.tfds_name='no_such_one' .*no such "
         r'tfds dataset \(Dataset no_such_one not found\.\)$'),
        (dict(data_dir=self.create_tempdir().full_path), r"\.tfds_name="
         r"'jaxgrpo_gsm8k' .*is not prepared under .*tfds_builders gsm8k")):
      c.data.datasets = [dict(name='gsm8k', kind='tfds', **{
          'split': 'test', 'tfds_name': 'jaxgrpo_gsm8k',
          'data_dir': self.data_dir, **keys})]
      cfg = config_lib.from_config_dict(c)
      with self.subTest(keys=keys), self.assertRaisesRegex(
          errors.DataError, message):
        loading.load_dataset(cfg, cfg.data.datasets[0],
                             tokenizer_lib.CharTokenizer())

  def test_a_folder_not_prepared_gives_the_error_alone(self):
    # TFDS logged 'Variant folder ... has no dataset_info.json' on stderr
    # before the error (in a process that had not built the dataset yet).
    code = ('import sys; from jaxgrpo.data import sources\n'
            'try: sources._tfds_source("jaxgrpo_gsm8k", "test", sys.argv[1])\n'
            'except ValueError as e: print(e)')
    run = subprocess.run(
        [sys.executable, '-c', code, self.create_tempdir().full_path],
        capture_output=True, text=True, check=True, cwd=_REPO, timeout=300)
    self.assertIn("'jaxgrpo_gsm8k' is not prepared under", run.stdout)
    self.assertNotIn('dataset_info.json', run.stderr)

  def test_bad_record_stops_preparation_naming_file_and_line(self):
    manual = self.create_tempdir()
    manual.create_file('test.jsonl', content=(
        json.dumps({'question': 'q', 'answer': '#### 1'}) + '\n'
        + json.dumps({'question': 'q2', 'answer': 'no marker'}) + '\n'))
    path = os.path.join(manual.full_path, 'test.jsonl')
    with self.assertRaisesRegex(sources.BadRecordError,
                                f"{path}:2: .*no '#### <final answer>'"):
      self.builders.prepare('gsm8k', manual.full_path,
                            self.create_tempdir().full_path)

  def test_missing_files_are_named(self):
    manual = self.create_tempdir()
    for name, message in (('gsm8k', 'is missing or empty: Place train.jsonl'),
                          ('squad2', 'is missing or empty: Place a SQuAD')):
      with self.assertRaisesRegex(FileNotFoundError, message):
        self.builders.prepare(name, manual.full_path)
    manual.create_file('README.md', content='other files')
    for name, message in (('gsm8k', 'no train.jsonl or test.jsonl'),
                          ('squad2', r'no \.json file')):
      with self.assertRaisesRegex(FileNotFoundError, message):
        self.builders.prepare(name, manual.full_path,
                              self.create_tempdir().full_path)

  def test_command_line(self):
    self._needs(_SQUAD2)
    data_dir = self.create_tempdir().full_path
    out = subprocess.run(
        [sys.executable, '-m', 'jaxgrpo.data.tfds_builders', 'squad2',
         '--manual_dir', _SQUAD2, '--data_dir', data_dir],
        cwd=_REPO, capture_output=True, text=True, timeout=300, check=False)
    self.assertEqual(out.returncode, 0, msg=out.stderr[-2000:])
    self.assertIn('jaxgrpo_squad2 validation: 6078 examples', out.stdout)
    ds = sources.make_dataset('tfds', name='s', split='validation',
                              tfds_name='jaxgrpo_squad2', data_dir=data_dir)
    self.assertLen(ds, 6078)


if __name__ == '__main__':
  absltest.main()
