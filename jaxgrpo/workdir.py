"""The run's workdir: checked at start, and held by one run at a time.

`check` fails in one line when the workdir is a file, lies in another
run's checkpoints, or cannot be written.
`lock` takes an exclusive `fcntl.flock` on `WORKDIR/.lock` (process 0 of a
run; process i of a multi-process run locks `.lock.<i>`, so the processes
of one run do not block each other while a second run's are refused). The
file holds the holder's pid, host and start time for the message a second
run prints. The kernel releases the lock when its process ends, however it
ends, so a killed run never blocks the next one; the file stays.
"""

from collections.abc import Iterator
import contextlib
import datetime
import errno
import fcntl
import os
import socket

from etils import epath
import jax

from jaxgrpo import errors


def owning_run(path: str) -> str | None:
  """The workdir of the run whose `checkpoints/` folder is or holds `path`
  (a local path), or None. Such a folder is not the user's: the run's
  checkpoint rotation deletes step folders with all they hold."""
  if '://' in str(path):
    return None
  here = os.path.realpath(os.path.expanduser(os.fspath(path)))
  while (parent := os.path.dirname(here)) != here:
    if os.path.basename(here) == 'checkpoints' and any(
        os.path.isfile(os.path.join(parent, name))
        for name in ('.lock', 'metrics.jsonl')):
      return parent
    here = parent
  return None


def check(workdir: str) -> None:
  """Fails early, in one line, when the workdir cannot be written.

  Writes and removes a probe file in it and in its `checkpoints/` folder
  (created when missing), so that a folder orbax could not save into
  stops the run before anything is computed.

  Raises:
    ConfigError: it is a file, it lies in another run's checkpoints, or
      it or its checkpoint folder cannot be created or written.
  """
  path = epath.Path(workdir)
  if owner := owning_run(workdir):
    raise errors.ConfigError(
        f"--workdir {workdir}: it is inside the checkpoints of the run in "
        f'{owner}, whose checkpoint rotation would delete it; choose another '
        'folder')
  if path.is_file():
    raise errors.ConfigError(
        f'--workdir {workdir} is a file, not a folder; name a folder (it is '
        'created if missing)')
  if (path / 'checkpoints').is_file():
    raise errors.ConfigError(
        f'--workdir {workdir}: {path / "checkpoints"} is a file, not a '
        'folder; move it away (checkpoints are saved there)')
  for name in ('metrics.jsonl', '.lock'):
    if (path / name).exists() and not (path / name).is_file():
      raise errors.ConfigError(
          f'--workdir {workdir}: {path / name} is not a file; move it away '
          '(the run writes it)')
  for folder, what in ((path, 'cannot write there'),
                       (path / 'checkpoints', 'cannot write checkpoints in '
                        f'{path / "checkpoints"}')):
    # Named by process: two runs started at once each probe their own.
    probe = folder / (f'.jaxgrpo-write-test-{socket.gethostname()}-'
                      f'{os.getpid()}')
    try:
      folder.mkdir(parents=True, exist_ok=True)
      probe.write_text('ok')
      probe.unlink()
    except OSError as e:
      raise errors.ConfigError(
          f'--workdir {workdir}: {what} ({e.strerror or e}); fix its '
          'permissions or use another --workdir') from None


def lock_path(workdir: str, process_index: int) -> str:
  name = '.lock' if process_index == 0 else f'.lock.{process_index}'
  return os.path.join(workdir, name)


@contextlib.contextmanager
def lock(workdir: str, process_index: int | None = None) -> Iterator[None]:
  """Holds the workdir's lock for this process while in the context.

  Object-store workdirs (`gs://...`) and file systems without flock are
  not locked.

  Raises:
    UserError: another run holds the lock; the message names its pid, host
      and start time.
  """
  if '://' in workdir:
    yield
    return
  index = jax.process_index() if process_index is None else process_index
  path = lock_path(workdir, index)
  with open(path, 'a+', encoding='utf-8') as f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      if e.errno not in (errno.EAGAIN, errno.EACCES):
        yield  # e.g. ENOLCK on a network file system: run unlocked
        return
      f.seek(0)
      holder = ' '.join(f.read().split()) or 'unknown'
      raise errors.UserError(
          f'--workdir {workdir} is in use by another run ({holder}); wait '
          'for it to end, stop it, or use another --workdir') from None
    started = datetime.datetime.now().isoformat(timespec='seconds')
    f.seek(0)
    f.truncate()
    f.write(f'pid {os.getpid()} on {socket.gethostname()}, started '
            f'{started}\n')
    f.flush()
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def holder(workdir: str) -> str | None:
  """The run training in `workdir` now, as its lock file names it ('pid N
  on HOST, started ...'); None when no run holds the lock (or it cannot be
  told: an object store, a file system without flock).

  Probes with a shared lock, released at once (a run starting in that
  instant would find the workdir in use).
  """
  try:
    with open(lock_path(workdir, 0), encoding='utf-8') as f:
      try:
        fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
      except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
          return ' '.join(f.read().split()) or 'unknown'
        return None
      fcntl.flock(f, fcntl.LOCK_UN)
  except OSError:  # no lock file: no run started there
    return None
  return None
