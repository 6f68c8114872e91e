"""Reads back the event files that `jaxgrpo.reporting.tensorboard` writes.

Independently of the writer: the TFRecord framing and both checksums of
every record are checked here (CRC-32C, computed in this file), and the
records are parsed with tensorboardX's `Event` protocol buffer. Where
TensorBoard itself is installed, `scalars` also reads the file with
TensorBoard's own loader and checks that it sees the same events.
"""

import importlib
import importlib.util
import os
import struct

import numpy as np


def missing() -> str | None:
  """Why event files cannot be written and read here, or None."""
  if importlib.util.find_spec('tensorboardX') is None:
    return ("tensorboardX is not installed (pip install "
            "'jaxgrpo[tensorboard]')")
  return None


def _crc32c_table() -> list[int]:
  table = []
  for byte in range(256):
    crc = byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    table.append(crc)
  return table


_TABLE = _crc32c_table()


def _masked_crc32c(data: bytes) -> int:
  crc = 0xFFFFFFFF
  for byte in data:
    crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  crc ^= 0xFFFFFFFF
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def event_file(logdir: str) -> str:
  """The only event file in `logdir` (asserted)."""
  names = os.listdir(logdir)
  if len(names) != 1 or not names[0].startswith('events.out.tfevents.'):
    raise AssertionError(f'{logdir}: expected one event file, found {names}')
  return os.path.join(logdir, names[0])


def records(path: str) -> list[bytes]:
  """The TFRecords of a file, each checksum checked."""
  with open(path, 'rb') as f:
    data = f.read()
  out, pos = [], 0
  while pos < len(data):
    header = data[pos:pos + 8]
    (length,) = struct.unpack('<Q', header)
    (header_crc,) = struct.unpack('<I', data[pos + 8:pos + 12])
    body = data[pos + 12:pos + 12 + length]
    (body_crc,) = struct.unpack('<I', data[pos + 12 + length:pos + 16 + length])
    if (len(body) != length or header_crc != _masked_crc32c(header)
        or body_crc != _masked_crc32c(body)):
      raise AssertionError(f'{path}: bad record at byte {pos}')
    out.append(body)
    pos += 16 + length
  return out


def events(path: str) -> list:
  """The file's `Event` protocol buffers, in order."""
  event_pb2 = importlib.import_module('tensorboardX.proto.event_pb2')
  return [event_pb2.Event.FromString(r) for r in records(path)]


def scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
  """tag -> [(step, value)] of the only event file in `logdir`, in file
  order; asserts that each value is a float32 scalar tensor for the
  `scalars` plugin, one per event, after a file_version event."""
  path = event_file(logdir)
  first, *rest = events(path)
  if first.file_version != 'brain.Event:2':
    raise AssertionError(f'{path}: starts with {first}')
  found = {}
  for event in rest:
    (value,) = event.summary.value
    tensor = value.tensor
    if (value.metadata.plugin_data.plugin_name != 'scalars'
        or tensor.dtype != 1 or tensor.tensor_shape.dim  # 1: DT_FLOAT
        or len(tensor.tensor_content) != 4):
      raise AssertionError(f'{path}: not a float32 scalar: {event}')
    (number,) = np.frombuffer(tensor.tensor_content, '<f4')
    found.setdefault(value.tag, []).append((event.step, float(number)))
  _check_with_tensorboard(path, found)
  return found


def _check_with_tensorboard(path: str, found: dict) -> None:
  """Where TensorBoard is installed: its loader sees the same scalars."""
  if importlib.util.find_spec('tensorboard') is None:
    return
  # pylint: disable-next=g-import-not-at-top
  from tensorboard.backend.event_processing import event_file_loader
  from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top
  seen = {}
  for event in event_file_loader.EventFileLoader(path).Load():
    for value in event.summary.value:
      array = tensor_util.make_ndarray(value.tensor)
      seen.setdefault(value.tag, []).append((event.step, float(array)))
  if set(seen) != set(found) or not all(
      np.array_equal(seen[t], found[t], equal_nan=True) for t in found):
    raise AssertionError(f'{path}: TensorBoard reads {seen}, not {found}')
