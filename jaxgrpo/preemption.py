"""SIGTERM / SIGINT handling: finish the step, checkpoint, exit cleanly.

A TPU VM gets SIGTERM shortly before it is preempted. Instead of dying
mid-step, the loop notices the request between steps, writes a final
checkpoint and returns; running the same command again resumes there. The
request is recorded from the moment the run holds its workdir: a signal
while it builds and compiles, or during the warm start (which is not
saved), stops it there with `Stopped`.

A second Ctrl-C stops sooner, without saving the step. Where the run owns
its process (the command line, `on_quit`), it quits promptly even while the
main thread waits for a device computation, which Python's own handlers
wait for: a thread reads the signals as they arrive (`signal.set_wakeup_fd`),
lets a checkpoint being written complete, and ends the process (status
130); a third Ctrl-C ends it at once. Elsewhere (a notebook) a second
Ctrl-C raises KeyboardInterrupt in the main thread.

Over several processes a signal may reach one of them only, or each at
another step: `agree` (and `check`) make every process act on the same
signal at the same point, so that all save the same step and stop.
"""

import contextlib
import os
import signal
import sys
import threading
from typing import Callable

from jaxgrpo import multihost


class Stopped(Exception):
  """A stop signal arrived before the run had anything new to save (while
  it started, or in its warm start); the message says what happened."""


# Exit status of a process ended by a second or third Ctrl-C (128 + SIGINT).
QUIT_STATUS = 130
# What a second and a third Ctrl-C do, where the run owns its process.
AGAIN = ('SIGINT again: quitting without saving the current step, once a '
         'checkpoint being written is complete (Ctrl-C again: quit at once)')
THIRD = ('SIGINT a third time: quitting at once; a checkpoint being written '
         'is left unfinished, in a temporary folder that the next start '
         'removes (never read as a checkpoint)')


def acknowledgement(name: str, done: bool = False,
                    quits: bool = False) -> str:
  """The line shown when signal `name` first arrives; `done`: after the
  run's last step, when nothing is left to stop; `quits`: a second Ctrl-C
  quits the process."""
  if done:
    return (f'{name} received after the last step: the run is complete, '
            'finishing its last checkpoint and summary')
  line = f'{name} received: stopping at the end of the current step'
  if name == 'SIGINT' and quits:
    line += (' (Ctrl-C again: quit without saving it, once a checkpoint '
             'being written is complete; a third time: at once)')
  elif name == 'SIGINT':
    line += ' (a second Ctrl-C stops at once, without saving it)'
  return line


class StopRequest:
  """Records SIGTERM/SIGINT while active; `.signal` names the first one."""

  def __init__(self, notice: Callable[[str], None] | None = None,
               on_quit: Callable[[], None] | None = None):
    """`notice` shows the lines that acknowledge signals (None: standard
    error). `on_quit` (a run that owns its process): at a second Ctrl-C,
    called on a thread of its own to let a checkpoint being written
    complete and say where the run resumes, after which the process exits
    with QUIT_STATUS; None: a second Ctrl-C raises KeyboardInterrupt."""
    self.signal: str | None = None
    # Set once the run's last step is done: a signal then stops nothing.
    self.done = False
    # Set at a second Ctrl-C under `on_quit`: no new save is to start.
    self.quitting = False
    self._previous = {}
    self._notice = notice
    self._quit = on_quit
    self._watch: tuple[int, int, threading.Thread, int] | None = None

  def _handle(self, signum, frame):
    del frame
    if self._watch is not None:
      return  # the watching thread acts on it (`_watched`)
    if self.signal is None:
      self.signal = signal.Signals(signum).name
      self._acknowledge(acknowledgement(self.signal, self.done))
    elif signum == signal.SIGINT:
      raise KeyboardInterrupt  # a second Ctrl-C stops at once

  def _watched(self, signum: int) -> None:
    """Acts on signal `signum` as it arrives (on the watching thread)."""
    if self.signal is None:
      self.signal = signal.Signals(signum).name
      self._acknowledge(acknowledgement(self.signal, self.done, quits=True))
    elif signum == signal.SIGINT and not self.quitting:
      self.quitting = True
      self._acknowledge(AGAIN)
      threading.Thread(target=self._quit_after, name='quit', daemon=True
                       ).start()
    elif signum == signal.SIGINT:
      self._acknowledge(THIRD)
      _exit()

  def _quit_after(self) -> None:
    try:
      self._quit()
    finally:
      _exit()

  def _read_signals(self, read_fd: int) -> None:
    """The watching thread: each byte the wakeup fd receives is a signal
    (0: the run is over)."""
    while True:
      try:
        received = os.read(read_fd, 64)
      except OSError:
        return
      for signum in received:
        if signum == 0:
          return
        if signum in (signal.SIGINT, signal.SIGTERM):
          self._watched(signum)
      if not received:
        return

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
      if self._quit is not None:
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        before = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        watcher = threading.Thread(target=self._read_signals,
                                   args=(read_fd,), name='signals',
                                   daemon=True)
        self._watch = (read_fd, write_fd, watcher, before)
        watcher.start()
      for sig in (signal.SIGTERM, signal.SIGINT):
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}
    if self._watch is not None:
      read_fd, write_fd, watcher, before = self._watch
      signal.set_wakeup_fd(before)
      os.write(write_fd, b'\0')
      watcher.join()
      os.close(read_fd)
      os.close(write_fd)
      self._watch = None


def _exit() -> None:
  """Ends the process at once with QUIT_STATUS, streams flushed (not
  waiting for a device computation in flight)."""
  for stream in (sys.stdout, sys.stderr):
    with contextlib.suppress(Exception):
      stream.flush()
  os._exit(QUIT_STATUS)  # pylint: disable=protected-access
