"""Prompt files as verl and Hugging Face write them: Parquet and Arrow."""

import decimal
import errno
import json
import os
import re
import time
from unittest import mock

from absl.testing import absltest
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from jaxgrpo import config_lib
from jaxgrpo.configs import demo
from jaxgrpo.data import formats
from jaxgrpo.data import loading
from jaxgrpo.data import parquet
from jaxgrpo.data import sources
from jaxgrpo.data import tokenizer as tokenizer_lib

_SUFFIX = (" Let's think step by step and output the final answer after "
           '"####".')


def verl_rows(n: int, start: int = 0) -> list[dict]:
  """Rows in the layout of verl's examples/data_preprocess/gsm8k.py."""
  return [{
      'data_source': 'openai/gsm8k',
      'prompt': [{'role': 'user', 'content': f'{i}+{i + 1}=' + _SUFFIX}],
      'ability': 'math',
      'reward_model': {'style': 'rule', 'ground_truth': str(2 * i + 1)},
      'extra_info': {'split': 'train', 'index': i, 'answer': '...',
                     'question': f'{i}+{i + 1}='},
  } for i in range(start, start + n)]


def write_parquet(path: str, rows: list[dict], row_group_size: int = 4):
  pq.write_table(pa.Table.from_pylist(rows), path,
                 row_group_size=row_group_size)
  return path


def save_to_disk(folder: str, table) -> str:
  """`folder` as Dataset.save_to_disk writes it: Arrow stream files named
  in state.json."""
  name = 'data-00000-of-00001.arrow'
  os.makedirs(folder, exist_ok=True)
  with pa.OSFile(os.path.join(folder, name), 'wb') as sink:
    with pa.ipc.new_stream(sink, table.schema) as writer:
      writer.write_table(table)
  with open(os.path.join(folder, 'state.json'), 'w') as f:
    json.dump({'_data_files': [{'filename': name}]}, f)
  return folder


def verl_entry(path: str, **extra) -> dict:
  return dict(name='gsm8k', kind='parquet', path=path,
              prompt_field='prompt', answer_field='reward_model.ground_truth',
              id_field='extra_info.index', subset_field='data_source',
              **extra)


class ParquetSourceTest(absltest.TestCase):

  def test_rows_across_row_groups_and_shards(self):
    folder = self.create_tempdir().full_path
    write_parquet(os.path.join(folder, 'train-00000-of-00002.parquet'),
                  verl_rows(10))
    write_parquet(os.path.join(folder, 'train-00001-of-00002.parquet'),
                  verl_rows(7, start=10))
    source = parquet.ParquetSource(folder)
    self.assertLen(source, 17)
    self.assertEqual([source[i]['extra_info']['index'] for i in range(17)],
                     list(range(17)))
    self.assertEqual(source[-1]['reward_model']['ground_truth'], '33')
    self.assertEqual(source.describe(12),
                     f'{folder}/train-00001-of-00002.parquet:row 2')
    with self.assertRaises(IndexError):
      source[17]  # pylint: disable=pointless-statement

  def test_a_file_of_many_row_groups_opens_in_linear_time(self):
    # A writer that appends rows in small batches leaves one row group per
    # batch; their first rows were summed afresh for each group (quadratic:
    # 40,000 groups took 10 s to open, 100,000 took 66 s).
    path = os.path.join(self.create_tempdir().full_path, 'train.parquet')
    n = 40_000
    pq.write_table(pa.table({'prompt': [f'{i}+1=' for i in range(n)],
                             'answer': [str(i + 1) for i in range(n)]}),
                   path, row_group_size=1)
    start = time.perf_counter()
    source = parquet.ParquetSource(path)
    self.assertLess(time.perf_counter() - start, 2.5)
    self.assertLen(source, n)
    for row in (0, 1, 12_345, n - 1):
      self.assertEqual(source[row]['answer'], str(row + 1))

  def test_a_folder_of_training_and_held_out_files_is_refused(self):
    # verl writes train.parquet and test.parquet side by side; a Hub
    # dataset holds train-*.parquet and test-*.parquet shards.
    # pandas' to_parquet(partition_cols=['split']) and Spark's partitionBy
    # write split=train/ beside split=test/ (read together, unrefused).
    for names, ones in (
        (('train.parquet', 'test.parquet'), 'train*.parquet'),
        (('main/train-00000-of-00001.parquet',
          'main/validation-00000-of-00001.parquet'), 'main/train*.parquet'),
        (('split=train/part-0.parquet', 'split=test/part-0.parquet'),
         'split=train')):
      folder = self.create_tempdir().full_path
      for name in names:
        os.makedirs(os.path.dirname(os.path.join(folder, name)),
                    exist_ok=True)
        write_parquet(os.path.join(folder, name), verl_rows(3))
      with self.assertRaisesRegex(
          parquet.ParquetError,
          f'^{folder}: holds training and held-out files .*; name the '
          rf'training ones \({re.escape(os.path.join(folder, ones))}, or the '
          r'file\)'):
        parquet.ParquetSource(folder)
      train = os.path.join(folder, os.path.dirname(names[0]),
                           '' if '=' in names[0] else 'train*')
      self.assertLen(parquet.ParquetSource(train), 3)
      # A glob over the folder is refused alike (it trained on the test
      # split, where the folder was refused), a JSONL glob too.
      with self.assertRaisesRegex(parquet.ParquetError,
                                  'holds training and held-out files'):
        parquet.find_files(os.path.join(folder, '*'))
    folder = self.create_tempdir().full_path
    for name in ('train.jsonl', 'test.jsonl'):
      with open(os.path.join(folder, name), 'w') as f:
        f.write('{"prompt": "1+1=", "answer": "2"}\n')
    with self.assertRaisesRegex(
        parquet.ParquetError, rf'^{folder}: holds training and held-out '
        rf'files .*\({re.escape(os.path.join(folder, "train*.jsonl"))}, or'):
      sources.data_files('jsonl', os.path.join(folder, '*.jsonl'))
    self.assertLen(sources.data_files('jsonl',
                                      os.path.join(folder, 'tr*.jsonl')), 1)

  def test_data_files_a_folder_leaves_out_are_named(self):
    # '.pq' beside '.parquet' was left out, and a datasets cache folder's
    # cache-*.arrow (`.map()` results) read beside its data, in silence.
    folder = self.create_tempdir().full_path
    write_parquet(os.path.join(folder, 'a.parquet'), verl_rows(2))
    write_parquet(os.path.join(folder, 'b.pq'), verl_rows(1))
    with self.assertLogs('jaxgrpo.data.parquet', 'WARNING') as logs:
      self.assertLen(parquet.ParquetSource(folder), 2)
    self.assertIn(f"{folder}: 1 data file(s) there are not read, e.g. "
                  f"{os.path.join(folder, 'b.pq')}", logs.output[0])
    folder = self.create_tempdir().full_path
    table = pa.Table.from_pylist(verl_rows(3))
    for name in ('gsm8k-train.arrow', 'cache-0123abcd.arrow'):
      with pa.OSFile(os.path.join(folder, name), 'wb') as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
          writer.write_table(table)
    with self.assertLogs('jaxgrpo.data.parquet', 'WARNING'):
      self.assertLen(parquet.ParquetSource(folder), 3)

  def test_a_column_named_twice_is_refused(self):
    # pyarrow and Spark write such files; a row as a dict kept the last
    # column, the first's values lost without a word.
    path = os.path.join(self.create_tempdir().full_path, 'twice.parquet')
    pq.write_table(pa.table([['1+1='], ['A0'], ['B0']],
                            names=['prompt', 'answer', 'answer']), path)
    with self.assertRaisesRegex(
        parquet.ParquetError, rf"^{re.escape(path)}: the column 'answer' is "
        'there 2 times; rename all but one$'):
      parquet.ParquetSource(path)

  def test_hugging_face_save_to_disk_folder(self):
    folder = self.create_tempdir().full_path
    table = pa.Table.from_pylist(verl_rows(5))
    save_to_disk(folder, table)
    source = parquet.ParquetSource(folder)
    self.assertLen(source, 5)
    self.assertEqual(source[3]['prompt'][0]['role'], 'user')

  def test_a_damaged_state_json_is_named(self):
    for text in ('{"_data_files": [{"name": "x"}]}', '[1, 2]', '{"_data'):
      folder = self.create_tempdir().full_path
      save_to_disk(folder, pa.Table.from_pylist(verl_rows(2)))
      state = os.path.join(folder, 'state.json')
      with open(state, 'w') as f:
        f.write(text)
      with self.assertRaisesRegex(
          parquet.ParquetError,
          f'^{re.escape(state)}: not the state.json of a save_to_disk folder'):
        parquet.ParquetSource(folder)

  def test_spark_output_folders_are_read_as_their_parts(self):
    # Spark writes out.parquet/ as a folder of part files and _SUCCESS:
    # a folder or glob over it said "out.parquet is missing".
    folder = self.create_tempdir().full_path
    out = os.path.join(folder, 'spark', 'out.parquet')
    os.makedirs(out)
    for part in range(2):
      write_parquet(os.path.join(out, f'part-0000{part}-a.snappy.parquet'),
                    verl_rows(3))
    open(os.path.join(out, '_SUCCESS'), 'w').close()
    for path in (os.path.join(folder, 'spark'),
                 os.path.join(folder, 'spark', '*.parquet')):
      source = parquet.ParquetSource(path)
      self.assertEqual([os.path.basename(f) for f in source.files],
                       ['part-00000-a.snappy.parquet',
                        'part-00001-a.snappy.parquet'])
      self.assertLen(source, 6)

  def test_a_file_named_with_glob_characters_is_read_as_named(self):
    folder = self.create_tempdir().full_path
    named = write_parquet(os.path.join(folder, 'set[1].parquet'),
                          verl_rows(2))
    write_parquet(os.path.join(folder, 'set1.parquet'), verl_rows(5))
    self.assertEqual(parquet.ParquetSource(named).files, [named])
    self.assertLen(parquet.ParquetSource(named), 2)

  def test_a_hugging_face_dataset_dict_folder_names_its_splits(self):
    # DatasetDict.save_to_disk writes dataset_dict.json and a folder per
    # split: it said 'no Parquet or Arrow file there'.
    folder = self.create_tempdir().full_path
    table = pa.Table.from_pylist(verl_rows(5))
    for split in ('train', 'test'):
      save_to_disk(os.path.join(folder, split), table)
    with open(os.path.join(folder, 'dataset_dict.json'), 'w') as f:
      json.dump({'splits': ['train', 'test']}, f)
    with self.assertRaisesRegex(parquet.ParquetError, re.escape(
        f'{folder}: is a DatasetDict saved with save_to_disk (splits: train, '
        f"test); name one split's folder: {folder}/train, and give "
        f'{folder}/test as eval_path')):
      parquet.ParquetSource(folder)
    self.assertLen(parquet.ParquetSource(os.path.join(folder, 'train')), 5)

  def test_missing_and_broken_files_are_named(self):
    folder = self.create_tempdir().full_path
    with self.assertRaisesRegex(parquet.ParquetError,
                                'no Parquet or Arrow file there'):
      parquet.ParquetSource(os.path.join(folder, 'nope.parquet'))
    bad = os.path.join(folder, 'bad.parquet')
    with open(bad, 'w') as f:
      f.write('not parquet')
    with self.assertRaisesRegex(parquet.ParquetError,
                                f'{bad}: not a Parquet file'):
      parquet.ParquetSource(bad)
    # An Arrow file's error named neither the file nor its kind ('File is
    # too small: 8').
    bad = os.path.join(folder, 'bad.arrow')
    with open(bad, 'w') as f:
      f.write('garbage')
    with self.assertRaisesRegex(parquet.ParquetError, re.escape(
        f'{bad}: not an Arrow file (')):
      parquet.ParquetSource(bad)

  def test_a_file_that_cannot_be_opened_is_no_format_error(self):
    # A file the process may not read was 'not a Parquet file (... Permission
    # denied)'. Root reads any file, so there the open fails by injection.
    folder = self.create_tempdir().full_path
    for name in ('train.parquet', 'train.arrow'):
      path = os.path.join(folder, name)
      if name.endswith('.parquet'):
        write_parquet(path, verl_rows(3))
      else:
        with pa.OSFile(path, 'wb') as sink, pa.ipc.new_stream(
            sink, pa.Table.from_pylist(verl_rows(3)).schema) as writer:
          writer.write_table(pa.Table.from_pylist(verl_rows(3)))
      self.assertLen(parquet.ParquetSource(path), 3)
      expected = re.escape(f'{path}: cannot be read (Permission denied)')
      if os.geteuid():
        os.chmod(path, 0)
        with self.assertRaisesRegex(parquet.ParquetError, expected):
          parquet.ParquetSource(path)
        os.chmod(path, 0o644)
      denied = PermissionError(errno.EACCES, 'Permission denied', path)
      with mock.patch.object(pq, 'ParquetFile', side_effect=denied), \
          mock.patch.object(pa, 'memory_map', side_effect=denied):
        with self.assertRaisesRegex(parquet.ParquetError, expected):
          parquet.ParquetSource(path)

  def test_an_unreadable_row_group_is_a_bad_record_of_each_row(self):
    path = write_parquet(os.path.join(self.create_tempdir().full_path,
                                      'train.parquet'), verl_rows(10))
    chunk = pq.ParquetFile(path).metadata.row_group(1).column(0)
    start = chunk.data_page_offset
    with open(path, 'r+b') as f:  # the footer stays readable
      f.seek(start)
      f.write(b'\xff' * chunk.total_compressed_size)
    source = parquet.ParquetSource(path)
    reads = []
    file = source._files[0].parquet  # pylint: disable=protected-access
    read_row_group = file.read_row_group
    file.read_row_group = lambda g, **kw: (reads.append(g),
                                           read_row_group(g, **kw))[1]
    self.assertEqual(source[3]['extra_info']['index'], 3)
    for row in (4, 7, 5):
      with self.assertRaisesRegex(
          formats.BadRecordError,
          f'^{path}:row {row}: its row group \\(1\\) cannot be read'
          r' \([^\n]*\)$'):  # pyarrow's reason, on one line
        source[row]  # pylint: disable=pointless-statement
    self.assertEqual(source[8]['extra_info']['index'], 8)
    # A damaged group is tried once: its other rows fail without reading it
    # again (skipping a damaged group of a million rows takes seconds).
    self.assertEqual(reads, [0, 1, 2])

  def test_only_the_columns_the_format_reads_are_read(self):
    # verl's extra_info.answer (the worked solution) is no field of the
    # Example: left unread, a damaged page of it stops nothing.
    path = write_parquet(os.path.join(self.create_tempdir().full_path,
                                      'train.parquet'), verl_rows(10))
    meta = pq.ParquetFile(path).metadata.row_group(1)
    chunk = next(meta.column(i) for i in range(meta.num_columns)
                 if meta.column(i).path_in_schema == 'extra_info.answer')
    with open(path, 'r+b') as f:
      f.seek(chunk.data_page_offset)
      f.write(b'\xff' * chunk.total_compressed_size)
    fields = formats.fields_read(formats.RecordFields(
        prompt='prompt', answer='reward_model.ground_truth',
        id='extra_info.index', template='Q: {prompt} ({ability})'))
    self.assertEqual(fields, ('ability', 'extra_info.index', 'prompt',
                              'reward_model.ground_truth'))
    row = parquet.ParquetSource(path, fields)[5]
    self.assertEqual(row['extra_info'], {'index': 5})
    self.assertEqual(sorted(row), ['ability', 'extra_info', 'prompt',
                                   'reward_model'])
    # A field the file lacks: every column is read, so the error lists them.
    row = parquet.ParquetSource(path, ('prompt', 'answer'))[1]
    self.assertIn('data_source', row)
    source = parquet.ParquetSource(path, ('prompt', 'answer'))
    with self.assertRaisesRegex(formats.BadRecordError, 'cannot be read'):
      source[5]  # pylint: disable=pointless-statement
    self.assertIsNone(formats.fields_read(formats.make_format('squad2')))
    self.assertEqual(formats.fields_read(formats.make_format('gsm8k')),
                     ('answer', 'question'))


class VerlLayoutTest(absltest.TestCase):

  def _load(self, entry):
    c = demo.get_config('runlocal')
    c.data.datasets = [entry]
    cfg = config_lib.from_config_dict(c)
    return loading.load_dataset(cfg, cfg.data.datasets[0],
                                tokenizer_lib.CharTokenizer())

  def test_a_verl_gsm8k_file_trains_unchanged(self):
    folder = self.create_tempdir().full_path
    train = write_parquet(os.path.join(folder, 'train.parquet'),
                          verl_rows(40))
    test = write_parquet(os.path.join(folder, 'test.parquet'),
                         verl_rows(8, start=100))
    _, train_ds, eval_ds = self._load(verl_entry(
        train, eval_path=test, num_eval=8, verifier='math',
        template='{prompt}'))
    example = train_ds[5]
    self.assertEqual(example.prompt, '5+6=' + _SUFFIX)
    self.assertEqual(example.answer, '11')
    self.assertEqual(example.id, '5')
    self.assertEqual(example.subset, 'openai/gsm8k')
    self.assertLen(eval_ds, 8)
    self.assertEqual(eval_ds[0].id, '100')

  def test_bad_rows_name_the_file_and_row(self):
    rows = verl_rows(6)
    rows[4]['prompt'] = [{'role': 'system', 'content': 'Be brief.'},
                         {'role': 'user', 'content': '1+1='}]
    path = write_parquet(
        os.path.join(self.create_tempdir().full_path, 'train.parquet'), rows)
    ds = sources.make_dataset(
        'parquet', name='gsm8k', path=path,
        record_format=formats.RecordFields(
            prompt='prompt', answer='reward_model.ground_truth',
            id='extra_info.index'))
    self.assertEqual(ds[3].answer, '7')
    with self.assertRaisesRegex(
        formats.BadRecordError,
        rf"{path}:row 4: field 'prompt' holds chat messages with roles "
        r"\['system', 'user'\]"):
      ds[4]  # pylint: disable=pointless-statement
    ds = sources.make_dataset(
        'parquet', name='gsm8k', path=path,
        record_format=formats.RecordFields(prompt='prompt',
                                           answer='reward_model.score'))
    with self.assertRaisesRegex(formats.BadRecordError,
                                rf"{path}:row 0: record has no field "
                                r"'reward_model.score'"):
      ds[0]  # pylint: disable=pointless-statement

  def test_decimal_answers_are_numbers(self):
    path = os.path.join(self.create_tempdir().full_path, 'train.parquet')
    pq.write_table(pa.table({
        'prompt': ['a', 'b', 'c'],
        'answer': pa.array([decimal.Decimal('18.00'), decimal.Decimal('1.50'),
                            None], pa.decimal128(6, 2))}), path)
    ds = sources.make_dataset('parquet', name='q', path=path)
    self.assertEqual([ds[0].answer, ds[1].answer], ['18', '1.50'])
    with self.assertRaisesRegex(formats.BadRecordError,
                                "field 'answer' must be text or a number, "
                                'got NoneType'):
      ds[2]  # pylint: disable=pointless-statement

  def test_float32_values_are_the_numbers_written(self):
    # pandas' float32 columns (df.astype('float32')): 1.1 is stored as the
    # float32 nearest it, which a Python float spells 1.100000023841858.
    folder = self.create_tempdir().full_path
    path = os.path.join(folder, 'train.parquet')
    f32, f16 = pa.float32(), pa.float16()
    table = pa.table({
        'prompt': ['Add', 'b', 'c'],
        'answer': pa.array([1.1, 0.3, None], f32),
        'a': pa.array([0.1, 2.5, 1.0], f32),
        'b': pa.array([np.float16(0.2)] * 3, f16),
        'extra': pa.array([{'gold': 3.3, 'golds': [4.4]}] * 3, pa.struct(
            [('gold', f32), ('golds', pa.list_(f32))])),
    })
    pq.write_table(table, path)
    ds = sources.make_dataset('parquet', name='q', path=path,
                              record_format=formats.RecordFields(
                                  template='{prompt} {a} {b}'))
    self.assertEqual((ds[0].prompt, ds[0].answer),
                     ('Add 0.1 0.2', '1.1'))
    self.assertEqual(ds[1].answer, '0.3')
    with self.assertRaisesRegex(formats.BadRecordError, 'got NoneType'):
      ds[2]  # pylint: disable=pointless-statement
    ds = sources.make_dataset('parquet', name='q', path=path,
                              record_format=formats.RecordFields(
                                  answer='extra.gold'))
    self.assertEqual(ds[0].answer, '3.3')
    self.assertEqual(parquet.ParquetSource(path)[0]['extra'],
                     {'gold': 3.3, 'golds': [4.4]})
    # A Hugging Face dataset saved to disk (Arrow) alike.
    save_to_disk(folder, table)
    self.assertEqual(sources.make_dataset('parquet', name='q', path=folder)[0]
                     .answer, '1.1')

  def test_whole_floats_past_53_bits_are_the_integers_written(self):
    # A float64 (or float32) whole number from 2**53 on was written as
    # '1e+16' in prompts and answers; below it, 18.0 was already '18'.
    folder = self.create_tempdir().full_path
    path = os.path.join(folder, 'train.parquet')
    table = pa.table({
        'prompt': ['Add', 'b', 'c', 'd'],
        'answer': pa.array([1e16, 2.0**60, -9007199254740992.0, 18.0]),
        'a': pa.array([1e20, 2.0**53, 1.5e17, 18.0], pa.float32()),
        'b': pa.array([1e22, 2.5, 1e300, -0.0]),
    })
    pq.write_table(table, path)
    ds = sources.make_dataset('parquet', name='q', path=path,
                              record_format=formats.RecordFields(
                                  template='{prompt} {a} {b}'))
    self.assertEqual(
        [(ds[i].prompt, ds[i].answer) for i in range(3)],
        [('Add 100000000000000000000 10000000000000000000000',
          '10000000000000000'),
         # As repr and pandas print them: 1.152921504606847e+18, and the
         # float32 2**53 as 9.007199e+15.
         ('b 9007199000000000 2.5', '1152921504606847000'),
         ('c 150000000000000000 1' + '0' * 300, '-9007199254740992')])
    # In a template a whole float was printed as is ('d 18.0 -0.0').
    self.assertEqual((ds[3].prompt, ds[3].answer), ('d 18 0', '18'))
    # A Hugging Face dataset saved to disk (Arrow) alike.
    save_to_disk(folder, table)
    self.assertEqual(sources.make_dataset('parquet', name='q', path=folder)[0]
                     .answer, '10000000000000000')

  def test_a_field_named_in_another_case_is_suggested(self):
    path = write_parquet(
        os.path.join(self.create_tempdir().full_path, 'train.parquet'),
        [{'Question': '1+1=', 'Answer': 2}])
    ds = sources.make_dataset('parquet', name='q', path=path,
                              record_format=formats.RecordFields(
                                  prompt='question', answer='Answer'))
    with self.assertRaisesRegex(
        formats.BadRecordError,
        rf"^{path}:row 0: record has no field 'question' \(dataset 'q'; its "
        r"fields: Answer, Question; field names are case-sensitive: "
        r"'Question'\?\)$"):
      ds[0]  # pylint: disable=pointless-statement


  def test_a_null_or_misnamed_struct_on_a_dotted_field_is_named(self):
    # verl's reward_model null in a row: it said "record has no field
    # 'reward_model.ground_truth' (...; its fields: prompt, reward_model)",
    # listing the field it said was missing; a nested name in another case
    # had no suggestion.
    path = os.path.join(self.create_tempdir().full_path, 'train.parquet')
    pq.write_table(pa.table({
        'prompt': ['a', 'b', 'c'],
        'reward_model': pa.array(
            [{'Ground_truth': '1'}, None, {'Ground_truth': None}],
            pa.struct([('Ground_truth', pa.string())])),
        'extra_info': ['x', 'y', 'z']}), path)
    def answers_or_errors(answer):
      ds = sources.make_dataset('parquet', name='q', path=path,
                                record_format=formats.RecordFields(
                                    answer=answer))
      out = []
      for i in range(3):
        try:
          out.append(ds[i].answer)
        except formats.BadRecordError as e:
          out.append(str(e).split(': ', 1)[1])
      return out
    self.assertEqual(answers_or_errors('reward_model.Ground_truth'), [
        '1',
        "field 'reward_model.Ground_truth': 'reward_model' is null, not an "
        "object holding 'Ground_truth'",
        "field 'reward_model.Ground_truth' must be text or a number, got "
        'NoneType'])
    self.assertEqual(answers_or_errors('reward_model.ground_truth')[0], (
        "record has no field 'reward_model.ground_truth' (dataset 'q'; its "
        'fields: extra_info, prompt, reward_model; field names are '
        "case-sensitive: 'reward_model.Ground_truth'?)"))
    self.assertEqual(answers_or_errors('extra_info.index')[0], (
        "field 'extra_info.index': 'extra_info' is a str, not an object "
        "holding 'index'"))

if __name__ == '__main__':
  absltest.main()
