"""Stops what orbax and tensorstore leak: memory per save, noise at exit.

Each orbax save (and restore) of arrays asks tensorstore how many bytes its
kvstores wrote (read), before and after, for orbax's throughput log lines
(`tensorstore_utils.get_tensorstore_raw_bytes`). It reads them with
`tensorstore.experimental_collect_matching_metrics`, which (tensorstore
0.1.86) leaks a reference to each value it returns: about 12 KB and 24
Python objects per save of a run, never freed, so a run of days that saves
often grows for as long as it runs. `install` points orbax at `raw_bytes`,
the same number read from tensorstore's Prometheus text export, which
frees what it returns.

A read that fails midway (a damaged checkpoint: jaxgrpo-eval, -export,
-stratify) or a save that fails leaves tensorstore reads or writes in
flight, each to report to an asyncio loop that orbax has closed by then:
Python printed a `RuntimeError: Event loop is closed` traceback for each
(dozens, after the command's one error line). `quiet_late_callbacks`
drops exactly those; the failure itself is raised where it happened. Reads
that fail too, after the first failure was raised, end in asyncio tasks
whose errors nobody retrieves: asyncio logged a `Task exception was never
retrieved` traceback for each, at random (when the task is freed);
`quiet_abandoned_reads` drops those records.
"""

import logging
import re
import sys
import traceback

import tensorstore as ts

try:  # A private module: an orbax without it keeps its own reader.
  from orbax.checkpoint._src.serialization import tensorstore_utils
except ImportError:  # pragma: no cover
  tensorstore_utils = None

_PREFIX = '/tensorstore/kvstore/'


def raw_bytes(direction=None) -> int:
  """The bytes tensorstore's kvstores wrote, or read for a `direction` whose
  value is 'read' (orbax's `IoDirection`), since the process started."""
  suffix = ('_bytes_read' if getattr(direction, 'value', direction) == 'read'
            else '_bytes_written')
  total = 0
  try:  # only orbax's log lines read it: a format it cannot parse is 0
    for line in ts.experimental_collect_prometheus_format_metrics(_PREFIX):
      if line.startswith('#') or ' ' not in line:
        continue
      name, value = line.rsplit(' ', 1)
      if name.split('{', 1)[0].endswith(suffix):
        total += int(float(value))
  except Exception:  # pylint: disable=broad-except
    return 0
  return total


def install() -> None:
  """Makes orbax read the kvstore byte counts with `raw_bytes`; does nothing
  where orbax or tensorstore lack the functions involved."""
  if (tensorstore_utils is not None
      and hasattr(tensorstore_utils, 'get_tensorstore_raw_bytes')
      and hasattr(ts, 'experimental_collect_prometheus_format_metrics')):
    tensorstore_utils.get_tensorstore_raw_bytes = raw_bytes


def _late_callback(unraisable) -> bool:
  """Whether an unraisable error is a callback from another thread that
  tried to hand its result to a closed asyncio loop: work whose awaiting
  code was already gone, so nothing was waiting for what it carried."""
  value = unraisable.exc_value
  if not (isinstance(value, RuntimeError)
          and str(value) == 'Event loop is closed'):
    return False
  frames = traceback.extract_tb(unraisable.exc_traceback)
  return any(frame.name == 'call_soon_threadsafe' for frame in frames)


def quiet_late_callbacks() -> None:
  """Drops `_late_callback` errors before `sys.unraisablehook` sees them;
  everything else reaches it as before. Installed once per process."""
  hook = sys.unraisablehook
  if getattr(hook, 'drops_late_callbacks', False):
    return

  def quiet(unraisable):
    if not _late_callback(unraisable):
      hook(unraisable)

  quiet.drops_late_callbacks = True
  sys.unraisablehook = quiet


# tensorstore's errors: a status code, then what failed.
_TENSORSTORE_IO = re.compile(r'^[A-Z_]+: Error (reading|writing|opening) ')


def _abandoned_read(record: logging.LogRecord) -> bool:
  """Whether an asyncio record reports a tensorstore read or write that
  failed in a task no one awaited any more (its sibling's failure was
  raised)."""
  exc = record.exc_info[1] if record.exc_info else None
  return (str(record.msg).startswith('Task exception was never retrieved')
          and isinstance(exc, ValueError)
          and _TENSORSTORE_IO.match(str(exc)) is not None)


def _keep(record: logging.LogRecord) -> bool:
  return not _abandoned_read(record)


def quiet_abandoned_reads() -> None:
  """Drops `_abandoned_read` records of the asyncio logger; every other
  record reaches its handlers as before. Installed once per process."""
  logger = logging.getLogger('asyncio')
  if _keep not in logger.filters:
    logger.addFilter(_keep)
