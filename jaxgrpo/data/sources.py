"""Datasets as grain MapDatasets of Example over random-access sources.

Size: every kind is opened here (a file or a glob's files, ArrayRecord
shards, a TFDS split, the arithmetic generator) behind the one record
mapping they share, with the held-out split and fingerprint of the result.
"""

from collections.abc import Callable, Iterable, Mapping
import dataclasses
import functools
import glob
import hashlib
import importlib
import json
import os
from typing import Any

import grain
import numpy as np

from jaxgrpo import errors
from jaxgrpo.data import arithmetic as arithmetic_lib
from jaxgrpo.data import formats
from jaxgrpo.data import jsonl
from jaxgrpo.data import parquet
from jaxgrpo.data import squad2_file
from jaxgrpo.example import Example

KINDS = ('jsonl', 'array_record', 'parquet', 'tfds', 'arithmetic', 'gsm8k',
         'squad2')

# Defined with the formats that raise it; most callers know it from here.
BadRecordError = formats.BadRecordError

# Defined in `jsonl` with its helpers; most callers know it from here.
JsonlSource = jsonl.JsonlSource

# The generic record format (see `formats`), the default of file kinds.
RecordFields = formats.RecordFields


@dataclasses.dataclass(frozen=True)
class _ToExample:
  """Maps (index, record) to an Example; a class so that grain can pickle it.

  `describe(index)` words where a record came from in errors. With `is_json`
  the records are JSON-encoded bytes (ArrayRecord).
  """

  record_format: formats.RecordFormat
  name: str
  size: int
  describe: Callable[[int], str]
  is_json: bool = False

  def __call__(self, index: int, record: Any) -> Example:
    index %= self.size  # grain wraps indices past the end; ids must too
    where = functools.partial(self.describe, index)
    if self.is_json:
      try:
        record = jsonl.loads(bytes(record).decode('utf-8'))
      except jsonl.DuplicateKeyError as e:
        raise BadRecordError(f'{where()}: {e}') from None
      except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadRecordError(f'{where()}: invalid JSON: {e}') from e
      if not isinstance(record, dict):
        raise BadRecordError(f'{where()}: expected a JSON object')
    return self.record_format.example(record, name=self.name, index=index,
                                      where=where)


def _describe_record(origin: str, index: int) -> str:
  return f'{origin}: record {index}'


def write_array_record(path: str, records: Iterable[Mapping[str, Any]]) -> int:
  """Writes records as JSON-encoded ArrayRecord entries, for random access.

  Args:
    path: output file.
    records: JSON-serializable dicts, e.g. the lines of a JSONL file.

  Returns:
    The number of records written.
  """
  # Imported here: array_record has no Windows build (grain skips it there).
  # pylint: disable-next=g-import-not-at-top
  from array_record.python import array_record_module

  # group_size:1 makes every record its own chunk: one read per access.
  writer = array_record_module.ArrayRecordWriter(
      os.fspath(path), 'group_size:1'
  )
  count = 0
  try:
    for count, record in enumerate(records, 1):
      if not isinstance(record, Mapping):
        raise ValueError(
            f'{path}: record {count - 1} is a {type(record).__name__}, not '
            'a dict'
        )
      try:
        data = json.dumps(dict(record), ensure_ascii=False)
      except TypeError as e:
        raise ValueError(f'{path}: record {count - 1}: {e}') from e
      writer.write(data.encode('utf-8'))
  finally:
    writer.close()
  return count


class TfdsSplitError(ValueError):
  """A TFDS split that the prepared dataset cannot serve."""


def _tfds_source(name: str, split: str, data_dir: str | None) -> Any:
  """A prepared TFDS split as a random-access source; never downloads."""
  # pylint: disable=g-import-not-at-top
  try:
    # Optional extra, and slow to import: only load it when asked for.
    import tensorflow_datasets as tfds
  except ImportError as e:
    raise ImportError(
        "kind='tfds' needs tensorflow_datasets: pip install 'jaxgrpo[tfds]'"
    ) from e
  # pylint: enable=g-import-not-at-top
  # Registers the local builders (jaxgrpo_gsm8k, jaxgrpo_squad2).
  importlib.import_module('jaxgrpo.data.tfds_builders')
  try:
    with errors.absl_warnings_muted():  # 'has no dataset_info.json': below
      builder = tfds.builder(name, data_dir=data_dir)
      prepared = builder.is_prepared()
  except (AssertionError, ValueError) as e:  # TFDS: unknown name or version
    raise ValueError(f'no such tfds dataset ({_first_line(e)})') from None
  if not prepared:
    local = formats.TFDS_BUILDERS.get(builder.name)
    how = (f'python -m jaxgrpo.data.tfds_builders {local} --manual_dir DIR '
           f'--data_dir {data_dir or "DIR"}' if local else
           "download_and_prepare(file_format='array_record')")
    raise ValueError(
        f'tfds dataset {name!r} is not prepared under {builder.data_dir}; '
        f'build it first with {how} (training never downloads)'
    )
  try:
    return builder.as_data_source(split=split)
  except ValueError as e:  # an unknown split, a bad slice, an empty one
    raise TfdsSplitError(f'tfds dataset {name!r} cannot serve this split '
                         f'({_first_line(e)})') from None


def _arithmetic_example(
    spec: arithmetic_lib.ArithmeticSpec, name: str, index: int
) -> Example:
  return arithmetic_lib.make_examples(spec, [index], name=name)[0]


def _open_source(kind: str, name: str, path: str | None,
                 tfds_name: str | None, split: str, data_dir: str | None,
                 record_format: formats.RecordFormat):
  """(record source, origin for messages, record describer) of a dataset
  read from files or TFDS; a Parquet file's columns are read only when
  `record_format` reads them."""
  if kind == 'tfds':
    if not tfds_name:
      raise ValueError(f'tfds dataset {name!r} needs tfds_name')
    source = _tfds_source(tfds_name, split, data_dir)
    origin = f'tfds {tfds_name} split {split!r}'
    return source, origin, functools.partial(_describe_record, origin)
  if not path:
    raise ValueError(f'{kind} dataset {name!r} needs a path')
  path = os.path.expanduser(path)
  if kind == 'parquet':
    source = parquet.ParquetSource(path, formats.fields_read(record_format))
    return source, path, source.describe
  paths = data_files(kind, path)
  if not paths:
    raise ValueError('no file matches the pattern')
  if kind in ('jsonl', 'gsm8k', 'squad2'):
    parts = [JsonlSource(p) if kind != 'squad2' else
             squad2_file.Squad2File(p) for p in paths]
    source = parts[0] if len(parts) == 1 else _Files(parts)
    return source, path, source.describe
  if not all(map(os.path.exists, paths)):
    raise FileNotFoundError(f'dataset {name!r}: no ArrayRecord file {path}')
  try:  # a shard each, so that messages name the shard and its record
    parts = [_ArrayRecords(grain.sources.ArrayRecordDataSource([p]), p)
             for p in paths]
  except RuntimeError as e:  # array_record's C++ reader raises RuntimeError
    raise ValueError(f'not a readable ArrayRecord file ({_first_line(e)})'
                     ) from None
  source = parts[0] if len(parts) == 1 else _Files(parts)
  return source, path, source.describe


def data_files(kind: str, path: str) -> list[str]:
  """The files a dataset of a file kind reads, in order: `path`, or a
  glob's sorted matches (an existing name is read as named); for `parquet`
  those of `parquet.find_files`."""
  path = os.path.expanduser(path)
  if kind == 'parquet':
    return parquet.find_files(path)
  if os.path.exists(path) or not glob.has_magic(path):
    return [path]
  files = sorted(glob.glob(path))
  parquet.check_one_split(parquet.glob_base(path), files)
  return files


def content_digest(files: Iterable[str]) -> str:
  """A digest of the bytes of `files`, in order (not their names: a moved
  file with the same bytes has the same digest); 16 hex digits. It reads
  every byte (about 1.7 GB/s here): what catches an edit that the sampled
  `fingerprint` misses."""
  digest = hashlib.sha256()
  for path in files:
    with open(path, 'rb') as f:
      part = hashlib.file_digest(f, 'sha256').hexdigest()
    digest.update(f'{os.path.getsize(path)}:{part}\n'.encode())
  return digest.hexdigest()[:16]


def _first_line(e: Exception) -> str:
  return str(e).strip().splitlines()[0][:300] if str(e).strip() else repr(e)


class _Files:
  """The records of several files (a glob's sorted matches) in order, as
  one random-access source."""

  def __init__(self, parts: list[Any]):
    self.parts = parts
    self._ends = np.cumsum([len(p) for p in parts])

  def __len__(self) -> int:
    return int(self._ends[-1])

  def _locate(self, index: int) -> tuple[Any, int]:
    if not -len(self) <= index < len(self):
      raise IndexError(f'record {index} out of range ({len(self)} records)')
    index %= len(self)
    k = int(np.searchsorted(self._ends, index, side='right'))
    return self.parts[k], index - (int(self._ends[k - 1]) if k else 0)

  def __getitem__(self, index: int) -> Any:
    part, i = self._locate(index)
    return part[i]

  def describe(self, index: int) -> str:
    part, i = self._locate(index)
    return part.describe(i)


@dataclasses.dataclass(frozen=True)
class _ArrayRecords:
  """An ArrayRecord shard whose read errors (a shard cut short) are bad
  records naming the record, not the C++ reader's RuntimeError."""

  source: Any
  path: str

  def describe(self, index: int) -> str:
    return _describe_record(self.path, index)

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, index: int) -> Any:
    try:
      return self.source[index]
    except RuntimeError as e:
      raise BadRecordError(f'{self.describe(index)}: cannot be '
                           f'read ({_first_line(e)})') from None


def make_dataset(
    kind: str,
    *,
    name: str,
    path: str | None = None,
    record_format: formats.RecordFormat | None = None,
    tfds_name: str | None = None,
    split: str = 'train',
    data_dir: str | None = None,
    arithmetic: arithmetic_lib.ArithmeticSpec | None = None,
    size: int | None = None,
) -> grain.MapDataset:
  """Builds one dataset as a grain MapDataset of Example, read by index.

  Records are fetched and converted on access (`ds[i]`). A bad record (not
  valid UTF-8 or JSON, not an object, or one its format rejects, e.g. a
  missing field or an empty prompt) raises BadRecordError naming the file
  and line (JSONL), the JSON path (SQuAD) or the record index;
  `screening.screen` reads every record once to skip such records instead.

  Length: its docstring documents nine arguments, most for one kind only; the
  code checks them, then opens the source and maps its records.

  Args:
    kind: 'jsonl', 'array_record' (JSON-encoded records, see
      `write_array_record`), 'parquet' (Parquet files or a Hugging Face
      dataset saved to disk, see `jaxgrpo.data.parquet`), 'tfds' (a
      prepared split; nothing is downloaded), 'gsm8k' (GSM8K's JSONL file
      as shipped), 'squad2' (a SQuAD 2.0 JSON file as shipped, one example
      per question) or 'arithmetic' (generated; see
      `jaxgrpo.data.arithmetic`).
    name: dataset name: Example.dataset and the prefix of index-based ids.
    path: the file, for every kind but 'tfds' and 'arithmetic' (a glob
      pattern reads its sorted matches in order; `~` is the home folder).
    record_format: how a record becomes an Example (`formats.RecordFields`,
      `Gsm8kFormat` or `Squad2Format`; not for 'arithmetic'). None: the
      kind's format (`formats.default_format`) with its default template;
      'gsm8k' and 'squad2' take only their own format.
    tfds_name: TFDS name, e.g. 'jaxgrpo_gsm8k' or 'name/config:1.0.0', for
      'tfds'.
    split: TFDS split, e.g. 'train' or 'train[:90%]', for 'tfds'.
    data_dir: TFDS data directory (None: the TFDS default), for 'tfds'.
    arithmetic: problems of an 'arithmetic' dataset (None: defaults).
    size: number of examples; required for 'arithmetic', otherwise keeps
      the first `size` records.

  Returns:
    A MapDataset whose element i is the Example of record i.
  """
  given = {
      'path': path, 'record_format': record_format, 'tfds_name': tfds_name,
      'data_dir': data_dir, 'arithmetic': arithmetic,
  }
  file_keys = {'path', 'record_format'}
  allowed = {
      'jsonl': file_keys,
      'array_record': file_keys,
      'parquet': file_keys,
      'gsm8k': file_keys,
      'squad2': file_keys,
      'tfds': {'tfds_name', 'record_format', 'data_dir'},
      'arithmetic': {'arithmetic'},
  }
  if kind not in allowed:
    raise ValueError(
        f'dataset {name!r}: kind must be one of {KINDS}, got {kind!r}'
    )
  extra = sorted(
      k for k, v in given.items() if v is not None and k not in allowed[kind]
  )
  if extra:
    raise ValueError(f'dataset {name!r}: {kind!r} does not take {extra}')
  if size is not None and size < 1:
    raise ValueError(f'dataset {name!r}: size must be positive, got {size}')
  if kind == 'arithmetic':
    if size is None:
      raise ValueError(f'arithmetic dataset {name!r} needs a size')
    spec = arithmetic or arithmetic_lib.ArithmeticSpec()
    return grain.MapDataset.range(size).map(
        functools.partial(_arithmetic_example, spec, name)
    )
  if record_format is None:
    record_format = formats.make_format(
        formats.default_format(kind, tfds_name))
  elif kind in ('gsm8k', 'squad2') and record_format.FORMAT != kind:
    raise ValueError(
        f'{kind} dataset {name!r} takes only the {kind!r} record format, '
        f'got {record_format.FORMAT!r}'
    )
  source, origin, describe = _open_source(kind, name, path, tfds_name,
                                          split, data_dir, record_format)
  if len(source) == 0:
    raise ValueError(f'dataset {name!r}: {origin} has no records')
  ds = grain.MapDataset.source(source)
  if size is not None:
    if size > len(ds):
      raise ValueError(
          f'dataset {name!r}: size {size} exceeds the {len(ds)} records '
          f'of {origin}'
      )
    ds = ds[:size]
  return ds.map_with_index(
      _ToExample(
          record_format=record_format,
          name=name,
          size=len(ds),
          describe=describe,
          is_json=kind == 'array_record',
      )
  )


class _Subset:
  """Some elements of a dataset, by position: a grain data source.

  Element j is `ds[indices[j]]`, so index-based ids stay those of the
  record's position in its file. It holds 8 bytes per element.
  """

  def __init__(self, ds: grain.MapDataset, indices: np.ndarray, what: str):
    self._ds = ds
    self._indices = indices
    self._what = what

  def __len__(self) -> int:
    return len(self._indices)

  def __getitem__(self, index: int) -> Example:
    return self._ds[int(self._indices[index])]

  def __repr__(self) -> str:
    return f'_Subset({self._what}: {len(self)} of {len(self._ds)})'


def holdout_indices(size: int, holdout: int) -> np.ndarray:
  """Positions of `holdout` of `size` records, spread evenly.

  Position i of the held-out set is record `i * size // holdout`.
  """
  if not 0 < holdout < size:
    raise ValueError(
        f'holdout must be in [1, {size - 1}] for {size} records, got {holdout}'
    )
  return np.arange(holdout, dtype=np.int64) * size // holdout


def split_holdout(
    ds: grain.MapDataset, holdout: int
) -> tuple[grain.MapDataset, grain.MapDataset]:
  """Splits a dataset into training and held-out examples, disjoint.

  The held-out examples are the records at `holdout_indices(len(ds),
  holdout)`, in file order; training keeps all the others, in file order.
  The split depends only on the size, so it is the same on every run.

  Args:
    ds: a dataset, e.g. from `make_dataset`.
    holdout: how many records to hold out, in [1, len(ds) - 1].

  Returns:
    (training examples, held-out examples) as MapDatasets.
  """
  held = holdout_indices(len(ds), holdout)
  keep = np.ones(len(ds), bool)
  keep[held] = False
  train = _Subset(ds, np.flatnonzero(keep), 'training')
  return (grain.MapDataset.source(train),
          grain.MapDataset.source(_Subset(ds, held, 'held out')))


def fingerprint(ds: grain.MapDataset) -> str:
  """A cheap, stable content fingerprint: the size and three records.

  It hashes the size and the first, middle and last elements, so it reads
  three records however large the dataset is. It catches a swapped or
  resized dataset, not every edit of a record in between (checkpoints also
  note the files' `content_digest`, which does).

  Args:
    ds: a dataset from `make_dataset` (any MapDataset with stable reprs).

  Returns:
    16 hex digits.
  """
  n = len(ds)
  digest = hashlib.sha256(f'size={n}'.encode())
  for i in sorted({0, n // 2, n - 1} if n else set()):
    digest.update(f'\n{i}:{ds[i]!r}'.encode())
  return digest.hexdigest()[:16]
