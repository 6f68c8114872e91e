"""TensorBoard event files of a run's metrics, written with tensorboardX.

Training writes every step's scalars to WORKDIR/tensorboard as it goes
(`EventWriter`), and `jaxgrpo-plot --tensorboard` rewrites them from
metrics.jsonl (`write_all`). Either way the folder is rebuilt from the
metrics file when it opens, so a resumed run, which cuts metrics.jsonl back
to its checkpoint, never shows a step twice. A resumed run that writes no
events (`tensorboard=False`) rewrites an earlier run's from the kept
records, so that they hold no step it drops.

Each scalar is one event, as `tf.summary.scalar` writes it: the metric's key
as the tag, the step, and the value as a float32 tensor marked for the
`scalars` plugin. The events are tensorboardX's protocol buffers, framed as
TFRecords here and written synchronously: once `flush` returns they are in
the file (on an object store the file is rewritten whole at each flush).

tensorboardX needs protobuf, not tensorflow (`pip install
'jaxgrpo[tensorboard]'`); without it nothing is written and `available()`
says so. Viewing the events takes TensorBoard itself (`pip install
tensorboard`), here or on any other machine.
"""

from collections.abc import Iterable, Mapping
import dataclasses
import importlib
import importlib.util
import io
import itertools
import os
import socket
import struct
import sys
import time
import types
from typing import Any, BinaryIO, Callable

from etils import epath
import numpy as np

from jaxgrpo import records as records_lib

TENSORBOARD = 'tensorboard'
INSTALL = "pip install 'jaxgrpo[tensorboard]'"

# The first event of every event file.
FILE_VERSION = 'brain.Event:2'
# What TensorBoard's scalar dashboard looks for in a summary's metadata.
SCALARS_PLUGIN = 'scalars'

# Numbers the event files this process opens, as TensorFlow's writer does.
_SERIAL = itertools.count()


@dataclasses.dataclass(frozen=True)
class _Protos:
  """The parts of tensorboardX that the writer uses."""

  event_pb2: Any
  summary_pb2: Any
  tensor_pb2: Any
  tensor_shape_pb2: Any
  types_pb2: Any
  masked_crc32c: Callable[[bytes], int]


_PROTOS = ('event_pb2', 'summary_pb2', 'tensor_pb2', 'tensor_shape_pb2',
           'types_pb2')


def _import_parts(names: list[str], package: str = 'tensorboardX') -> list:
  """The modules `package.NAME` for each of `names`, imported without
  running the package's own __init__, which imports its SummaryWriter and
  with it torch, where torch is installed (a second or more at each start,
  for modules that need neither). A package already imported is used as
  it is."""
  names = [f'{package}.{name}' for name in names]
  if package in sys.modules:
    importlib.import_module(package)  # None there: taken out, as if missing
    return [importlib.import_module(name) for name in names]
  spec = importlib.util.find_spec(package)
  if spec is None or not spec.submodule_search_locations:
    raise ImportError(f'no package {package}')
  # A bare package module stands in while the parts import; a later
  # `import tensorboardX` runs the real __init__ over the same parts.
  stand_in = types.ModuleType(package)
  stand_in.__path__ = list(spec.submodule_search_locations)
  stand_in.__spec__ = spec
  sys.modules[package] = stand_in
  try:
    return [importlib.import_module(name) for name in names]
  finally:
    if sys.modules.get(package) is stand_in:
      del sys.modules[package]


def _protos() -> _Protos | None:
  try:
    *proto, record_writer = _import_parts(
        [f'proto.{name}' for name in _PROTOS] + ['record_writer'])
  except ImportError:
    return None
  return _Protos(**dict(zip(_PROTOS, proto)),
                 masked_crc32c=record_writer.masked_crc32c)


def available() -> bool:
  """Whether event files can be written here (tensorboardX installed)."""
  return _protos() is not None


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
  """The numeric values of a metrics record ('nan' / 'inf' strings too),
  without its step."""
  values = {key: records_lib.as_float(v) for key, v in record.items()
            if key != 'step'}
  return {key: v for key, v in values.items() if v is not None}


def _event_file_name() -> str:
  """A new event file's name, in TensorFlow's pattern (TensorBoard reads
  the files whose names hold 'tfevents')."""
  return (f'events.out.tfevents.{int(time.time()):010d}.'
          f'{socket.gethostname()}.{os.getpid()}.{next(_SERIAL)}.v2')


class _RecordFile:
  """Appends TFRecords (length, checksums, data) to a file; a file on an
  object store is kept in memory and rewritten whole at each flush."""

  def __init__(self, path: epath.Path, masked_crc32c: Callable[[bytes], int]):
    self.path = path
    self._crc = masked_crc32c
    self._remote = records_lib.is_remote(path)
    self._file: BinaryIO = (io.BytesIO() if self._remote
                            else open(os.fspath(path), 'wb'))

  def append(self, data: bytes) -> None:
    header = struct.pack('<Q', len(data))
    self._file.write(header + struct.pack('<I', self._crc(header)) + data
                     + struct.pack('<I', self._crc(data)))

  def flush(self) -> None:
    if self._remote:
      self.path.write_bytes(self._file.getvalue())
    else:
      self._file.flush()
      os.fsync(self._file.fileno())

  def close(self) -> None:
    if not self._file.closed:
      self.flush()
      self._file.close()


class EventWriter:
  """Writes scalars per step to WORKDIR/tensorboard (see module docstring).

  Args:
    workdir: the run's directory (local or an object store such as gs://).
    records: the metrics records already in metrics.jsonl (written first,
      replacing event files there from before).

  Raises:
    ImportError: tensorboardX cannot be imported.
  """

  def __init__(self, workdir: str, records: Iterable[Mapping[str, Any]] = ()):
    protos = _protos()
    if protos is None:
      raise ImportError(f'TensorBoard events need tensorboardX: {INSTALL}')
    self._pb = protos
    self._metadata = protos.summary_pb2.SummaryMetadata(
        plugin_data=protos.summary_pb2.SummaryMetadata.PluginData(
            plugin_name=SCALARS_PLUGIN))
    self.logdir = epath.Path(workdir) / TENSORBOARD
    self.logdir.mkdir(parents=True, exist_ok=True)
    for old in self.logdir.glob('events.out.tfevents.*'):
      old.unlink()
    self._file = _RecordFile(self.logdir / _event_file_name(),
                             protos.masked_crc32c)
    self._append(protos.event_pb2.Event(wall_time=time.time(),
                                        file_version=FILE_VERSION))
    for i, record in enumerate(records):
      self.write(int(record.get('step', i)), record)
    self.flush()

  def _append(self, event: Any) -> None:
    self._file.append(event.SerializeToString())

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    values = scalars(metrics)
    if not values:
      return
    pb = self._pb
    with np.errstate(over='ignore'):  # beyond float32: inf, as tf.cast does
      as_f32 = np.asarray(list(values.values()), np.float64).astype('<f4')
    wall_time = time.time()
    for tag, value in zip(values, as_f32):
      tensor = pb.tensor_pb2.TensorProto(
          dtype=pb.types_pb2.DT_FLOAT,
          tensor_shape=pb.tensor_shape_pb2.TensorShapeProto(),
          tensor_content=value.tobytes())
      summary = pb.summary_pb2.Summary(value=[pb.summary_pb2.Summary.Value(
          tag=tag, tensor=tensor, metadata=self._metadata)])
      self._append(pb.event_pb2.Event(wall_time=wall_time, step=step,
                                      summary=summary))

  def flush(self) -> None:
    self._file.flush()

  def close(self) -> None:
    self._file.close()


def has_events(workdir: str) -> bool:
  """Whether WORKDIR/tensorboard holds event files."""
  logdir = epath.Path(workdir) / TENSORBOARD
  return logdir.is_dir() and any(logdir.glob('events.out.tfevents.*'))


def write_all(workdir: str, records: Iterable[Mapping[str, Any]]
              ) -> str | None:
  """Rewrites WORKDIR/tensorboard from `records`; the folder, or None
  without tensorboardX."""
  if not available():
    return None
  writer = EventWriter(workdir, records)
  writer.close()
  return str(writer.logdir)
