"""JSONL files as grain random-access sources (`JsonlSource`).

`jaxgrpo.data.sources` opens the datasets of kind 'jsonl' and 'gsm8k' with
it, and `jaxgrpo.data.tfds_builders` reads GSM8K's files with it; it imports
neither, so that `sources` can import the builders (to register them)
without an import cycle.
"""

import decimal
import json
import os
import re
from typing import Any

import numpy as np

from jaxgrpo import errors
from jaxgrpo.data import formats

# Bytes scanned per step when indexing a JSONL file; bounds the temporary
# memory of the scan independently of the file size.
_SCAN_BYTES = 1 << 24
# First read of a line; long lines are read again in growing pieces.
_READ_BYTES = 1 << 12
# The UTF-8 byte order mark some editors write first.
_BOM = b'\xef\xbb\xbf'
# Bytes that may start a line holding nothing but whitespace.
_SPACE = np.frombuffer(b' \t\r\x0b\x0c', np.uint8)

# Records ended by a bare CR (classic Mac OS line ends): '}' then '{' with
# a CR between, which no JSON value holds (objects need a comma between).
_CR_ENDS = re.compile(rb'\}[ \t]*\r\s*\{')

# Defined with the formats that raise it.
BadRecordError = formats.BadRecordError


class DuplicateKeyError(ValueError):
  """A JSON object that names a key twice."""


def _one_value_per_key(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
  out = dict(pairs)
  if len(out) < len(pairs):
    seen = set()
    for key, _ in pairs:
      if key in seen:
        raise DuplicateKeyError(
            f'the key {key!r} appears twice in one object (JSON readers '
            'keep either value); keep one')
      seen.add(key)
  return out


def loads(text: str) -> Any:
  """A record's JSON: its numbers as written (Decimals: '2.50', '0.00001';
  as floats, '2.5' and '1e-05'; `formats` writes a whole one as its int).

  Raises:
    DuplicateKeyError: an object names a key twice, which `json.loads`
      would read as its last value, silently.
  """
  return json.loads(text, parse_float=decimal.Decimal,
                    object_pairs_hook=_one_value_per_key)


# The first bytes of compressed files, and how to decompress them.
_COMPRESSED = ((b'\x1f\x8b', 'gzip', 'gunzip -k'), (b'BZh', 'bzip2', 'bunzip2 -k'),
               (b'\xfd7zXZ\x00', 'xz', 'unxz -k'),
               (b'\x28\xb5\x2f\xfd', 'zstd', 'unzstd'),
               (b'PK\x03\x04', 'zip', 'unzip'))


def check_not_compressed(path: str) -> None:
  """Raises ValueError when `path` is a compressed file (JSONL records are
  read by byte offset, from the file as it is), a Parquet file, or text in
  UTF-16 (as Windows PowerShell 5 writes files), not UTF-8."""
  with open(path, 'rb') as f:
    head = f.read(6)
  if head.startswith(b'PAR1'):
    raise ValueError(f"{path}: is a Parquet file; read it with kind='parquet'"
                     " (and format='gsm8k' or 'squad2' for those records)")
  if head[:2] in (b'\xff\xfe', b'\xfe\xff'):
    raise ValueError(
        f'{path}: is UTF-16 text (its first bytes are a UTF-16 byte order '
        'mark); save it as UTF-8 first (iconv -f UTF-16 -t UTF-8 '
        f'{path} > OUT)')
  for magic, kind, command in _COMPRESSED:
    if head.startswith(magic):
      raise ValueError(f'{path}: is {kind}-compressed; decompress it first '
                       f'({command} {path}) and give the decompressed file')


def _check_json_lines(path: str, first: bytes, lines: int) -> None:
  """Raises ValueError when a file is not JSON Lines: a CSV file (named
  `.csv` or `.tsv`), one JSON array of objects (`[{...}, {...}]`, as many
  datasets ship a `.json` file), or JSON indented over several lines. Its
  lines would each be a bad record, named 'invalid JSON' one by one (all
  of them skipped with on_bad_record=skip).

  Args:
    path: the file, for the message.
    first: its first non-blank line.
    lines: how many non-blank lines it has.
  """
  text = first.removeprefix(_BOM).strip()
  if _CR_ENDS.search(text):
    raise ValueError(f'{path}: {_cr_ends(path)}')
  suffix = os.path.splitext(path)[1].lower()
  if suffix in ('.csv', '.tsv') and not text.startswith(b'{'):
    sep = ', sep=chr(9)' if suffix == '.tsv' else ''
    raise ValueError(
        f'{path}: is CSV, not JSON Lines (one JSON object per line), and '
        'CSV is not read; write it as JSON Lines first: python -c "import '
        f"pandas; pandas.read_csv('{path}'{sep}).to_json('OUT.jsonl', "
        "orient='records', lines=True, force_ascii=False)\"")
  if text == b'{':
    what, command = ("JSON objects indented over several lines (its first "
                     "line is '{' alone)"), '.'
  elif text == b'[':
    what, command = ("a JSON array indented over several lines (its first "
                     "line is '[' alone)"), "'.[]'"
  elif re.match(rb'\[\s*\{', text) and (lines == 1
                                         or not text.endswith(b']')):
    what, command = 'a JSON array of objects', "'.[]'"
  else:
    return
  raise ValueError(
      f'{path}: holds {what}, not JSON Lines (one object per line); write '
      f'it as JSON Lines first: jq -c {command} {path} > OUT.jsonl')


def _cr_ends(path: str) -> str:
  return ('ends its lines with a bare CR (classic Mac OS line ends), so its '
          'records read as one line; convert them to newlines first: '
          f"tr '\\r' '\\n' < {path} > OUT.jsonl")


def _index_lines(path: str) -> tuple[np.ndarray, np.ndarray]:
  """Byte offsets of the non-blank lines of a file, and of its blank ones.

  Newlines are found with numpy over a memory map, one bounded piece at a
  time, so indexing costs about a second per GB and 8 bytes per record.
  """
  size = os.path.getsize(path)
  if size == 0:
    return np.zeros(0, np.int64), np.zeros(0, np.int64)
  check_not_compressed(path)
  data = np.memmap(path, np.uint8, mode='r')
  newlines = np.concatenate([
      np.flatnonzero(data[a:a + _SCAN_BYTES] == ord('\n')) + a
      for a in range(0, size, _SCAN_BYTES)
  ])
  starts = np.concatenate([[0], newlines + 1]).astype(np.int64)
  ends = np.concatenate([newlines, [size]]).astype(np.int64)
  if starts[-1] == size:  # the empty piece after a final newline is no line
    starts, ends = starts[:-1], ends[:-1]
  blank = starts == ends
  # A record starts with '{' (or '\ufeff'), so only lines that start with
  # whitespace need a full look; there are few of them.
  maybe = ~blank & np.isin(data[starts], _SPACE)
  maybe[0] |= bytes(data[:3]) == _BOM  # a BOM alone on the first line
  for i in np.flatnonzero(maybe):
    line = bytes(data[starts[i]:ends[i]])
    blank[i] = not (line[3:] if i == 0 and line[:3] == _BOM else line).strip()
  del data
  return starts[~blank], starts[blank]


def _signature(st: os.stat_result) -> tuple[int, int, int]:
  return st.st_ino, st.st_size, st.st_mtime_ns


class JsonlSource:
  """A grain RandomAccessDataSource over the JSON objects of a JSONL file.

  Construction reads the file once to index where each line starts;
  blank (or whitespace-only) lines are skipped and counted in
  `blank_lines`. Record i is read and parsed on access, so memory is 8 bytes
  per line however large the records are, and a record's line number (in
  errors) is found without reading the file. Reads use `os.pread`, which is
  thread-safe, and the source pickles (grain worker processes reopen it).

  Attributes:
    path: the JSONL file.
    blank_lines: number of blank lines skipped.
  """

  def __init__(self, path: str):
    self.path = os.fspath(path)
    self._starts, self._blank_starts = _index_lines(self.path)
    self.blank_lines = len(self._blank_starts)
    self._file = open(self.path, 'rb', buffering=0)
    self._read_as = _signature(os.fstat(self._file.fileno()))
    if len(self):
      _check_json_lines(self.path, self._line(0), len(self))

  def __getstate__(self) -> dict[str, Any]:
    return {k: v for k, v in self.__dict__.items() if k != '_file'}

  def __setstate__(self, state: dict[str, Any]) -> None:
    self.__dict__.update(state)
    self._file = open(self.path, 'rb', buffering=0)
    self._check_unchanged()

  def _check_unchanged(self) -> None:
    """Raises DataError when the file is no longer the one indexed: its
    records are read by the byte offsets found then, so a file rewritten
    during a run gave other records under the same ids, silently."""
    if _signature(os.fstat(self._file.fileno())) != self._read_as:
      raise errors.DataError(
          f'{self.path}: the file changed while the run read it (its size, '
          'time or inode); restore it, or start the run again, which reads '
          'it anew (checkpoint.on_dataset_change decides what a resume '
          'does with changed data)')

  def __len__(self) -> int:
    return len(self._starts)

  def __repr__(self) -> str:
    return (
        f'JsonlSource({self.path!r}, records={len(self)}, '
        f'blank_lines={self.blank_lines})'
    )

  def _offset(self, index: int) -> int:
    if not -len(self) <= index < len(self):
      raise IndexError(
          f'{self.path}: record {index} out of range ({len(self)} records)'
      )
    return int(self._starts[index])

  def describe(self, index: int) -> str:
    """`path:line` of record `index` (1-based line, blank lines counted)."""
    offset = self._offset(index)
    index %= len(self)
    blank = int(np.searchsorted(self._blank_starts, offset))
    return f'{self.path}:{index + blank + 1}'

  def _line(self, index: int) -> bytes:
    """The bytes of record `index`'s line, without its newline."""
    offset, fd = self._offset(index), self._file.fileno()
    self._check_unchanged()
    line = os.pread(fd, _READ_BYTES, offset)
    while b'\n' not in line:
      more = os.pread(fd, 2 * len(line), offset + len(line))
      if not more:
        break
      line += more
    return line.split(b'\n', 1)[0]

  def __getitem__(self, index: int) -> dict[str, Any]:
    line = self._line(index)
    try:
      record = loads(line.decode('utf-8-sig'))
    except DuplicateKeyError as e:
      raise BadRecordError(f'{self.describe(index)}: {e}') from None
    except UnicodeDecodeError as e:
      raise BadRecordError(
          f'{self.describe(index)}: not valid UTF-8 ({e})'
      ) from e
    except json.JSONDecodeError as e:
      # A file whose first line is fine may still end later ones with a CR.
      cr = f'; it {_cr_ends(self.path)}' if _CR_ENDS.search(line) else ''
      raise BadRecordError(
          f'{self.describe(index)}: invalid JSON: {e.msg} (column {e.colno})'
          f'{cr}') from e
    except (ValueError, RecursionError) as e:  # an integer of 4,300+ digits,
      # arrays nested past the recursion limit: valid JSON Python won't read
      raise BadRecordError(
          f'{self.describe(index)}: invalid JSON: {e}') from None
    if not isinstance(record, dict):
      raise BadRecordError(
          f'{self.describe(index)}: expected a JSON object, got '
          f'{type(record).__name__}'
      )
    return record
