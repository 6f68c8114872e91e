"""clu's default writer where tensorflow is absent: records what it gets.

The real event files are checked where tensorflow is installed (the
`tensorboard` extra); these tests check what reaches the writer.
"""

import contextlib
import sys
import types
from unittest import mock


class RecordingWriter:
  """Stands for the writer `create_default_writer` returns."""

  def __init__(self, logdir, **kwargs):
    self.logdir, self.kwargs = logdir, kwargs
    self.scalars, self.flushes, self.closed = [], 0, False

  def write_scalars(self, step, scalars):
    self.scalars.append((step, dict(scalars)))

  def flush(self):
    self.flushes += 1

  def close(self):
    self.closed = True


@contextlib.contextmanager
def recording():
  """Within: `clu.metric_writers` makes RecordingWriters, listed in the
  yielded list as they are created."""
  writers = []

  def create_default_writer(logdir, **kwargs):
    writers.append(RecordingWriter(logdir, **kwargs))
    return writers[-1]

  fake = types.ModuleType('clu.metric_writers')
  fake.create_default_writer = create_default_writer
  with mock.patch.dict(sys.modules, {'clu.metric_writers': fake}):
    yield writers
