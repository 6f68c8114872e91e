"""SIGTERM / SIGINT handling: finish the step, checkpoint, exit cleanly.

A TPU VM gets SIGTERM shortly before it is preempted. Instead of dying
mid-step, the loop notices the request between steps, writes a final
checkpoint and returns; running the same command again resumes there. The
request is recorded from the moment the run holds its workdir: a signal
while it builds and compiles, or during the warm start (which is not
saved), stops it there with `Stopped`.

Over several processes a signal may reach one of them only, or each at
another step: `agree` (and `check`) make every process act on the same
signal at the same point, so that all save the same step and stop.
"""

import os
import signal
import threading
from typing import Callable

from jaxgrpo import multihost


class Stopped(Exception):
  """A stop signal arrived before the run had anything new to save (while
  it started, or in its warm start); the message says what happened."""


def acknowledgement(name: str, done: bool = False) -> str:
  """The line shown when signal `name` first arrives; `done`: after the
  run's last step, when nothing is left to stop."""
  if done:
    return (f'{name} received after the last step: the run is complete, '
            'finishing its last checkpoint and summary')
  line = f'{name} received: stopping at the end of the current step'
  if name == 'SIGINT':
    line += ' (a second Ctrl-C stops at once, without saving it)'
  return line


class StopRequest:
  """Records SIGTERM/SIGINT while active; `.signal` names the first one."""

  def __init__(self, notice: Callable[[str], None] | None = None):
    """`notice` shows the line that acknowledges the first signal (None:
    standard error)."""
    self.signal: str | None = None
    # Set once the run's last step is done: a signal then stops nothing.
    self.done = False
    self._previous = {}
    self._notice = notice

  def _handle(self, signum, frame):
    del frame
    if self.signal is None:
      self.signal = signal.Signals(signum).name
      self._acknowledge(acknowledgement(self.signal, self.done))
    elif signum == signal.SIGINT:
      raise KeyboardInterrupt  # a second Ctrl-C stops at once

  def _acknowledge(self, line: str) -> None:
    """Shows `line` from the handler; a handler that interrupted a write to
    the same stream (a reentrant call) falls back to a raw write."""
    try:
      if self._notice is None:
        raise RuntimeError('no notice')
      self._notice(line)
    except Exception:  # pylint: disable=broad-except
      try:
        os.write(2, (line + '\n').encode())
      except OSError:
        pass

  def request(self, name: str) -> None:
    """Records a stop asked for by the run's code (`'on_step'`), as a
    signal would be, unless a signal came first."""
    if self.signal is None:
      self.signal = name

  def agree(self) -> str | None:
    """The signal to act on now, the same on every process (a collective
    over several processes: each calls it at the same point); None while
    no process received one."""
    return multihost.agree_on_signal(self.signal)

  def check(self, when: str) -> None:
    """Raises Stopped if a signal arrived (at any process); `when` says
    where the run was."""
    name = self.agree()
    if name is not None:
      raise Stopped(f'{name} received {when}: stopped before anything '
                    'new was saved; run the same command to go on')

  def __enter__(self) -> 'StopRequest':
    # Handlers can only be set from the main thread (e.g. not in a notebook
    # worker); elsewhere signals keep their default behaviour.
    if threading.current_thread() is threading.main_thread():
      for sig in (signal.SIGTERM, signal.SIGINT):
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}
