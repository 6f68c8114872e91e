"""Load-time screening of a dataset: bad records skipped, misfits dropped."""

from collections.abc import Callable, Sequence
import dataclasses
import logging

import grain
import numpy as np

from jaxgrpo.data import sources
from jaxgrpo.example import Example

_LOG = logging.getLogger(__name__)  # `jaxgrpo.*`: the CLIs show them

# Reasons quoted in the log per kind of removal; the counts cover the rest.
_SHOWN = 3


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScreenReport:
  """What a screening pass removed from one dataset.

  Attributes:
    name: the dataset.
    scanned: records read (all of them, unless `limit` ended the pass).
    kept: examples kept.
    skipped: bad records skipped.
    dropped: examples `reject` removed.
    skipped_first: why the first few were skipped, each naming its file
      and line (or record index).
    dropped_first: why the first few were dropped, each naming the example.
  """

  name: str
  scanned: int
  kept: int
  skipped: int
  dropped: int
  skipped_first: tuple[str, ...] = ()
  dropped_first: tuple[str, ...] = ()


class _Kept:
  """The kept examples of a dataset by position: a grain data source.

  It holds 8 bytes per kept example and reads each one from the screened
  dataset on access, so index-based ids stay those of the record's
  position in its file.
  """

  def __init__(self, ds: Sequence[Example], kept: np.ndarray):
    self._ds = ds
    self._kept = kept

  def __len__(self) -> int:
    return len(self._kept)

  def __getitem__(self, index: int) -> Example:
    return self._ds[int(self._kept[index])]

  def __repr__(self) -> str:
    return f'_Kept({len(self)} of {len(self._ds)})'


def screen(
    ds: Sequence[Example],
    *,
    name: str,
    skip_bad: bool = False,
    reject: Callable[[Example], str | None] | None = None,
    limit: int | None = None,
) -> tuple[grain.MapDataset, ScreenReport]:
  """Reads every example once; keeps those that load and that `reject` keeps.

  Each kind of removal is logged once, as a warning with its count and the
  first few reasons.

  Args:
    ds: the dataset, e.g. from `sources.make_dataset` (or a list).
    name: the dataset's name, for the log.
    skip_bad: skip records that raise `sources.BadRecordError` instead of
      raising.
    reject: why an example must go (it is dropped), or None to keep it.
    limit: stop once this many examples are kept (held-out sets).

  Returns:
    The kept examples as a MapDataset (element j is the j-th kept example,
    in file order) and the report.

  Raises:
    sources.BadRecordError: a bad record, unless `skip_bad`.
  """
  # A mask, not a list of ints: 1 byte per record on datasets of millions.
  keep = np.zeros(len(ds), bool)
  kept, skipped, dropped = 0, 0, 0
  skipped_first, dropped_first = [], []
  scanned = 0
  for index in range(len(ds)):
    if limit is not None and kept >= limit:
      break
    scanned += 1
    try:
      example = ds[index]
    except sources.BadRecordError as e:
      if not skip_bad:
        raise
      skipped += 1
      if len(skipped_first) < _SHOWN:
        skipped_first.append(str(e))
      continue
    why = reject(example) if reject else None
    if why:
      dropped += 1
      if len(dropped_first) < _SHOWN:
        dropped_first.append(why)
    else:
      keep[index] = True
      kept += 1
  report = ScreenReport(
      name=name, scanned=scanned, kept=kept, skipped=skipped,
      dropped=dropped, skipped_first=tuple(skipped_first),
      dropped_first=tuple(dropped_first),
  )
  for count, what, first in (
      (skipped, 'records skipped as bad', report.skipped_first),
      (dropped, 'examples dropped', report.dropped_first),
  ):
    if count:
      _LOG.warning(
          'dataset %s: %d of %d %s: %s%s', name, count, scanned, what,
          '; '.join(first), '; ...' if count > len(first) else '')
  source = _Kept(ds, np.flatnonzero(keep))
  return grain.MapDataset.source(source), report
