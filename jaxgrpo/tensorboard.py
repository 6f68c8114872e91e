"""TensorBoard event files of a run's metrics, through clu's writers.

Training writes every step's scalars to WORKDIR/tensorboard as it goes
(`EventWriter`), and `jaxgrpo-plot --tensorboard` rewrites them from
metrics.jsonl (`write_all`). Either way the folder is rebuilt from the
metrics file when it opens, so a resumed run, which cuts metrics.jsonl back
to its checkpoint, never shows a step twice.

clu's summary writer needs tensorflow (`pip install 'jaxgrpo[tensorboard]'`);
without it nothing is written and `available()` says so.
"""

from collections.abc import Iterable, Iterator, Mapping
import contextlib
import importlib
import logging
from types import ModuleType
from typing import Any

from etils import epath

from jaxgrpo import records as records_lib

TENSORBOARD = 'tensorboard'
INSTALL = "pip install 'jaxgrpo[tensorboard]'"


def _writers() -> ModuleType | None:
  try:
    return importlib.import_module('clu.metric_writers')
  except ImportError:
    return None


def available() -> bool:
  """Whether event files can be written here (clu with tensorflow)."""
  return _writers() is not None


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
  """The numeric values of a metrics record ('nan' / 'inf' strings too),
  without its step."""
  values = {key: records_lib.as_float(v) for key, v in record.items()
            if key != 'step'}
  return {key: v for key, v in values.items() if v is not None}


@contextlib.contextmanager
def _absl_muted() -> Iterator[None]:
  """clu's default writer also logs every scalar through absl at INFO."""
  absl_logger = logging.getLogger('absl')
  level = absl_logger.level
  absl_logger.setLevel(logging.WARNING)
  try:
    yield
  finally:
    absl_logger.setLevel(level)


class EventWriter:
  """Writes scalars per step to WORKDIR/tensorboard (see module docstring).

  Args:
    workdir: the run's directory (local or an object store such as gs://).
    records: the metrics records already in metrics.jsonl (written first,
      replacing event files there from before).

  Raises:
    ImportError: clu's summary writer cannot be imported.
  """

  def __init__(self, workdir: str, records: Iterable[Mapping[str, Any]] = ()):
    module = _writers()
    if module is None:
      raise ImportError(f'TensorBoard events need tensorflow: {INSTALL}')
    self.logdir = epath.Path(workdir) / TENSORBOARD
    self.logdir.mkdir(parents=True, exist_ok=True)
    for old in self.logdir.glob('events.out.tfevents.*'):
      old.unlink()
    with _absl_muted():
      self._writer = module.create_default_writer(
          str(self.logdir), just_logging=False, asynchronous=False)
    for i, record in enumerate(records):
      self.write(int(record.get('step', i)), record)
    self.flush()

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    values = scalars(metrics)
    if values:
      with _absl_muted():
        self._writer.write_scalars(step, values)

  def flush(self) -> None:
    self._writer.flush()

  def close(self) -> None:
    self._writer.flush()
    self._writer.close()


def write_all(workdir: str, records: Iterable[Mapping[str, Any]]
              ) -> str | None:
  """Rewrites WORKDIR/tensorboard from `records`; the folder, or None
  without tensorflow."""
  if not available():
    return None
  writer = EventWriter(workdir, records)
  writer.close()
  return str(writer.logdir)
