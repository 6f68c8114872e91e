"""Prompt files in the peers' formats: Parquet, and Hugging Face datasets.

`ParquetSource` is a grain RandomAccessDataSource over the rows of

  * a Parquet file, or several (a glob, or a folder of `*.parquet` shards,
    as verl's recipes and Hugging Face Hub datasets ship them);
  * a Hugging Face dataset saved with `Dataset.save_to_disk` (a folder of
    Arrow stream files, `data-00000-of-00001.arrow`, with its `state.json`).

Rows are read on access, never all at once: Parquet files are read one
row group at a time (the last few kept), and only the columns the record
format reads (`formats.fields_read`); Arrow files are memory-mapped.
Memory is bounded by the cached row groups, not the file size (a file
written as one row group, pyarrow's and pandas' default up to 1M rows, is
read whole at its first row). A row
becomes a plain dict (nested structs as dicts, lists as lists), which the
record formats (`formats.RecordFields`) turn into Examples; errors name the
file and the row (`train.parquet:row 12`, counted from 0 within the file).
"""

import bisect
import collections
import functools
import glob
import itertools
import json
import logging
import os
import re
import threading
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from jaxgrpo import errors
from jaxgrpo.data import formats

_LOG = logging.getLogger(__name__)

_CACHED_GROUPS = 4

# Floats narrower than Python's, and numpy's type of each.
_NARROW = {pa.float16(): np.float16, pa.float32(): np.float32}


class ParquetError(errors.UserError, ValueError):
  """Files that are missing, empty or not Parquet / Arrow."""


def find_files(path: str) -> list[str]:
  """The Parquet or Arrow files that `path` names, in a stable order.

  A path that exists is read as named, even where it holds glob characters
  (`data[1].parquet`); a folder among a glob's matches, such as Spark's
  `out.parquet/`, stands for the Parquet files under it.

  Raises:
    ParquetError: `path` names no such file.
  """
  if glob.has_magic(path) and not os.path.exists(path):
    files = _under_folders(sorted(glob.glob(path)))
    check_one_split(glob_base(path), files)
  elif os.path.isdir(path):
    state = os.path.join(path, 'state.json')
    _check_not_dataset_dict(path)
    if os.path.isfile(state):  # Dataset.save_to_disk
      files = [os.path.join(path, n) for n in _state_files(state)]
    else:
      files = _under_folders(sorted(glob.glob(
          os.path.join(path, '**', '*.parquet'), recursive=True)))
      # A datasets cache folder's `.map()` results (cache-*.arrow) repeat
      # its records: read, they doubled every one.
      files = files or [f for f in sorted(glob.glob(os.path.join(
          path, '*.arrow'))) if not os.path.basename(f).startswith('cache-')]
      check_one_split(path, files)
      _say_left_out(path, files)
  else:
    files = [path] if os.path.exists(path) else []
  if not files:
    raise ParquetError(f'{path}: no Parquet or Arrow file there')
  missing = [f for f in files if not os.path.isfile(f)]
  if missing:
    raise ParquetError(f'{path}: {missing[0]} is missing')
  return files


def _say_left_out(folder: str, files: list[str]) -> None:
  """Warns of the data files under `folder` that are not read (`.pq`
  beside `.parquet`, `.arrow` beside either, a cache's `cache-*.arrow`)."""
  left = [f for f in sorted(glob.glob(os.path.join(folder, '**', '*.*'),
                                      recursive=True))
          if f.endswith(('.parquet', '.pq', '.parq', '.arrow'))
          and f not in files]
  if left and files:
    _LOG.warning('%s: %d data file(s) there are not read, e.g. %s (read: '
                 '%d files, e.g. %s); name the files to read with a glob',
                 folder, len(left), left[0], len(files), files[0])


def _under_folders(paths: list[str]) -> list[str]:
  """`paths` with each folder replaced by the Parquet files under it, every
  file once."""
  out = []
  for p in paths:
    out += (sorted(glob.glob(os.path.join(p, '**', '*.parquet'),
                             recursive=True)) if os.path.isdir(p) else [p])
  out = [p for p in out if not os.path.isdir(p)]
  return list(dict.fromkeys(out))


def _state_files(state: str) -> list[str]:
  """The data file names listed by a `save_to_disk` folder's state.json."""
  try:
    with open(state, encoding='utf-8') as f:
      return [str(d['filename']) for d in json.load(f).get('_data_files', [])]
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    raise ParquetError(
        f'{state}: not the state.json of a save_to_disk folder (a '
        f'"_data_files" list of {{"filename": ...}} entries): '
        f'{type(e).__name__}: {e}') from None


def _check_not_dataset_dict(folder: str) -> None:
  """Raises ParquetError when `folder` is a `DatasetDict.save_to_disk`
  folder (`dataset_dict.json` and a folder per split): one split is read."""
  index = os.path.join(folder, 'dataset_dict.json')
  if not os.path.isfile(index):
    return
  try:
    with open(index, encoding='utf-8') as f:
      splits = [str(s) for s in json.load(f)['splits']]
  except (OSError, ValueError, KeyError, TypeError):
    splits = []
  splits = splits or ['train']
  train = next((s for s in splits if 'train' in s), splits[0])
  held = [s for s in splits if s != train]
  raise ParquetError(
      f'{folder}: is a DatasetDict saved with save_to_disk (splits: '
      f'{", ".join(splits)}); name one split\'s folder: '
      f'{os.path.join(folder, train)}' + (
          f', and give {os.path.join(folder, held[0])} as eval_path'
          if held else ''))


def _columns(file: pq.ParquetFile, fields: tuple[str, ...] | None
             ) -> list[str] | None:
  """The columns of `file` holding `fields` (a dotted field: that nested
  column alone), or None to read them all: when `fields` is None, or names
  a field the file lacks (so that the error lists every column)."""
  if fields is None:
    return None
  names = set(file.schema_arrow.names)
  paths = [file.schema.column(i).path for i in range(len(file.schema))]
  for key in fields:
    if key not in names and not any(
        p == key or p.startswith(key + '.') for p in paths):
      return None
  return list(fields)


_HELD_OUT_WORDS = frozenset({'test', 'validation', 'valid', 'val', 'dev',
                             'eval'})


def glob_base(pattern: str) -> str:
  """The folder a glob searches: its path up to the first part with a
  glob character."""
  parts = pattern.split(os.sep)
  keep = next((i for i, p in enumerate(parts) if glob.has_magic(p)),
              len(parts))
  return os.sep.join(parts[:keep]) or os.curdir


def check_one_split(folder: str, files: list[str]) -> None:
  """Raises ParquetError when a folder's files, or a glob's under it,
  hold training and held-out files (verl's train.parquet beside
  test.parquet, a Hub dataset's train-*.parquet beside test-*.parquet):
  read together, the held-out records would be trained on; pandas' and
  Spark's folders partitioned by a split column (`split=train/`,
  `split=test/`) too."""
  def words(f):
    return set(re.split(r'[/._=-]', f.lower()))
  train = [f for f in files if 'train' in words(os.path.relpath(f, folder))]
  held = [f for f in files
          if words(os.path.relpath(f, folder)) & _HELD_OUT_WORDS]
  if train and held:
    parts = os.path.relpath(train[0], folder).split(os.sep)
    where = [i for i, p in enumerate(parts[:-1]) if 'train' in words(p)]
    ones = (os.path.join(folder, *parts[:where[0] + 1]) if where else
            os.path.join(folder, *parts[:-1],
                         'train*' + os.path.splitext(train[0])[1]))
    raise ParquetError(
        f'{folder}: holds training and held-out files ({train[0]}, '
        f'{held[0]}); name the training ones ({ones}, or the file) and give '
        'the others as eval_path')


def _has_narrow(t: pa.DataType) -> bool:
  """Whether values of type `t` hold a float16 or float32 anywhere."""
  if t in _NARROW:
    return True
  if pa.types.is_struct(t):
    return any(_has_narrow(t.field(i).type) for i in range(t.num_fields))
  if pa.types.is_map(t):
    return _has_narrow(t.key_type) or _has_narrow(t.item_type)
  if (pa.types.is_list(t) or pa.types.is_large_list(t)
      or pa.types.is_fixed_size_list(t)):
    return _has_narrow(t.value_type)
  return False


def _as_written(value: Any, t: pa.DataType) -> Any:
  """`value` (of Arrow type `t`, as `to_pylist` gives it) with each float16
  or float32 as the shortest decimal that reads back to it: a float32
  column's 1.1 is 1.1, as pandas and numpy print it, not the
  1.100000023841858 that the same bits make as a Python float."""
  if value is None:
    return None
  if t in _NARROW:
    return formats.plain(_NARROW[t](value))
  if pa.types.is_struct(t):
    types = {t.field(i).name: t.field(i).type for i in range(t.num_fields)}
    return {k: _as_written(v, types[k]) for k, v in value.items()}
  if pa.types.is_map(t):
    return [(_as_written(k, t.key_type), _as_written(v, t.item_type))
            for k, v in value]
  if (pa.types.is_list(t) or pa.types.is_large_list(t)
      or pa.types.is_fixed_size_list(t)):
    return [_as_written(v, t.value_type) for v in value]
  return value


def _row(table: pa.Table, row: int) -> dict[str, Any]:
  """Row `row` of `table` as a dict of Python values (see `_as_written`)."""
  record = table.slice(row, 1).to_pylist()[0]
  for name, t in _narrow_columns(table.schema):
    record[name] = _as_written(record[name], t)
  return record


@functools.lru_cache(maxsize=64)
def _narrow_columns(schema: pa.Schema) -> tuple[tuple[str, pa.DataType], ...]:
  """(name, type) of the columns holding a float16 or float32."""
  return tuple((n, t) for n, t in zip(schema.names, schema.types)
               if _has_narrow(t))


def _read_arrow(path: str) -> pa.Table:
  """An Arrow IPC file's table, in the stream format (as `save_to_disk`
  writes it) or the file format."""
  try:
    with pa.memory_map(path) as source:
      return pa.ipc.open_stream(source).read_all()
  except pa.ArrowInvalid:
    with pa.memory_map(path) as source:
      return pa.ipc.open_file(source).read_all()


class _File:
  """One file's rows: Parquet row groups, or a memory-mapped Arrow table."""

  def __init__(self, path: str, fields: tuple[str, ...] | None):
    self.path = path
    arrow = path.endswith('.arrow')
    try:
      if arrow:
        self.table = _read_arrow(path)
        self.parquet, self.starts = None, [0]
        self.num_rows = self.table.num_rows
      else:
        self.table, self.parquet = None, pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as e:
      if getattr(e, 'errno', None):  # the file system's, not the format's
        raise ParquetError(
            f'{path}: cannot be read ({os.strerror(e.errno)})') from None
      raise ParquetError(f'{path}: not {"an Arrow" if arrow else "a Parquet"}'
                         f' file ({e})') from None
    names = (self.table.schema if arrow else self.parquet.schema_arrow).names
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # a row as a dict keeps the last: the others were lost
      raise ParquetError(f'{path}: the column {twice[0]!r} is there '
                         f'{names.count(twice[0])} times; rename all but one')
    if not arrow:
      self.columns = _columns(self.parquet, fields)
      meta = self.parquet.metadata
      sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
      # Running totals: a file of 100,000 one-row groups opens in 0.5 s.
      self.starts = [0, *itertools.accumulate(sizes[:-1])]
      self.num_rows = meta.num_rows


class ParquetSource:
  """A grain RandomAccessDataSource over the rows of Parquet / Arrow files.

  Attributes:
    path: what the config named (a file, a glob or a folder).
    files: the files read, in order.
    fields: the fields (dotted for nested ones) read of each row, or None
      for all; a Parquet file lacking one of them is read whole.
  """

  def __init__(self, path: str, fields: tuple[str, ...] | None = None):
    self.path = os.fspath(path)
    self.files = find_files(self.path)
    self.fields = fields
    self._open()

  def _open(self) -> None:
    self._files = [_File(f, self.fields) for f in self.files]
    self._starts = []
    total = 0
    for f in self._files:
      self._starts.append(total)
      total += f.num_rows
    self._len = total
    self._groups: collections.OrderedDict = collections.OrderedDict()
    self._unreadable: dict[tuple[int, int], str] = {}  # (file, group): why
    self._lock = threading.Lock()  # grain may read from several threads

  def __getstate__(self) -> dict[str, Any]:
    return {'path': self.path, 'files': self.files, 'fields': self.fields}

  def __setstate__(self, state: dict[str, Any]) -> None:
    self.__dict__.update(state)
    self._open()

  def __len__(self) -> int:
    return self._len

  def __repr__(self) -> str:
    return (f'ParquetSource({self.path!r}, files={len(self.files)}, '
            f'rows={len(self)})')

  def _locate(self, index: int) -> tuple[int, int]:
    """(file number, row within the file) of row `index`."""
    if not -len(self) <= index < len(self):
      raise IndexError(f'{self.path}: row {index} out of range ({len(self)} '
                       'rows)')
    index %= len(self)
    k = bisect.bisect_right(self._starts, index) - 1
    return k, index - self._starts[k]

  def describe(self, index: int) -> str:
    """`file:row N` of row `index` (N counted from 0 within the file)."""
    k, row = self._locate(index)
    return f'{self.files[k]}:row {row}'

  def _group(self, k: int, g: int) -> pa.Table:
    """Row group `g` of file `k`, read once (an LRU of `_CACHED_GROUPS`).

    Raises:
      formats.BadRecordError: the group cannot be read. The reason is kept,
        so that its other rows fail at once instead of each reading the
        group again (`on_bad_record='skip'` over a damaged group of a
        million rows).
    """
    key = (k, g)
    with self._lock:
      if key in self._unreadable:
        raise formats.BadRecordError(self._unreadable[key])
      if key not in self._groups:
        f = self._files[k]
        try:
          self._groups[key] = f.parquet.read_row_group(g, columns=f.columns)
        except (pa.ArrowException, OSError) as e:
          why = ' '.join(str(e).split())  # pyarrow's text spans lines
          self._unreadable[key] = f'its row group ({g}) cannot be read ({why})'
          raise formats.BadRecordError(self._unreadable[key]) from None
        if len(self._groups) > _CACHED_GROUPS:
          self._groups.popitem(last=False)
      self._groups.move_to_end(key)
      return self._groups[key]

  def __getitem__(self, index: int) -> dict[str, Any]:
    k, row = self._locate(index)
    f = self._files[k]
    if f.table is not None:
      return _row(f.table, row)
    g = bisect.bisect_right(f.starts, row) - 1
    try:
      group = self._group(k, g)
    except formats.BadRecordError as e:
      raise formats.BadRecordError(f'{self.describe(index)}: {e}') from None
    return _row(group, row - f.starts[g])
