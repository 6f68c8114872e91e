"""Scores completions with each dataset's verifier, in worker processes.

`Scorer` owns one verifier per dataset and scores a batch either in the
calling process (`workers=0`) or in a pool of worker processes, each call
limited to `timeout_s`. Inside a worker a SIGALRM timer stops Python code
that runs too long; a call stuck where a signal cannot reach it (C code, a
regex backtracking) is ended by the parent, which kills the worker after a
grace period, scores that completion 0 and starts a new worker. Either way
the completion is counted as a timeout and the batch completes.

Workers are started with the 'forkserver' method where it exists (else
'spawn'): never by forking the trainer, whose JAX runtime threads do not
survive a fork. They import only `jaxgrpo.verifiers` and what the verifiers
need (no JAX), plus the modules named in `imports`, which is how verifiers
registered by user code reach them; the main module, which imports JAX, is
re-run in them only when a verifier is defined there (`_main_left_out`);
one defined in a notebook, whose main module cannot run again, is sent by
value (`_dumps`). A pool starts all its workers, then waits for each to
report that it has (or a ConfigError naming the module).

What a worker writes to stdout goes to stderr (`_stdout_to_stderr`): the
trainer's stdout, which it shares, holds only the trainer's lines.

After each call a worker reads its memory and, every few calls, counts
its open files (`_Health`): one that grew by more than `MAX_GROWTH_BYTES`
since its first call, or holds half the files it may, sends what it scored
and ends, and the parent gives the rest of its chunk to a new worker.

Workers ignore SIGINT and SIGTERM: a signal to the whole process group (Ctrl-C,
`timeout`, a scheduler) is the trainer's to act on. One that dies anyway (the
OOM killer, which on Linux they ask to take them first, so that a verifier
leaking memory costs a worker and not the trainer) is replaced when the
parent next finds its pipe closed. SIGTERM
does end the forkserver, after which multiprocessing takes its workers for
dead: `_Worker.kill` asks the pipe.

Size: one class, `Scorer`, and the worker processes it owns; their start,
timeouts, deaths and replacement are one protocol over the same pipes.
"""

from collections.abc import Mapping, Sequence
import contextlib
import importlib
import importlib.util
import multiprocessing
from multiprocessing import connection
from multiprocessing import reduction
from multiprocessing import spawn
import os
import pickle
import signal
import sys
import time
import traceback
from typing import Any

import numpy as np

from jaxgrpo import errors
from jaxgrpo.example import Example
from jaxgrpo.verifiers import base

# Extra time the parent allows past `timeout_s` before it kills a worker: the
# worker's own timer normally answers first.
_GRACE_S = 1.0
# How long a new worker may take to import `imports` and load the verifiers.
_START_S = 300.0
# A worker whose resident memory grows by more than this since its first
# call is replaced once that call returns (`_Health`): a verifier keeping
# something per call (a cache without bound, a list it appends to) costs a
# worker restart, long before the machine's memory runs out.
MAX_GROWTH_BYTES = 1 << 30
# A worker's open files are counted after every this many calls (a count
# costs as much as a small verifier's call): a verifier would have to leave
# 1/32 of the open-file limit open per call to run out between two counts.
_FILES_EVERY = 16


def _worker_main(conn, progress, payload: bytes, imports: Sequence[str],
                 timeout_s: float | None) -> None:
  """Worker loop: score chunks of (slot, key, text, example), reply per chunk.

  It first reports on `conn` that it started (None) or why it could not.
  Before each call it writes the call's start time and
  position in the chunk to `progress` (shared memory), so the parent can
  tell which call hangs without a message per completion.
  """
  # The trainer owns stopping: a signal sent to the whole process group
  # (Ctrl-C, `timeout`, a scheduler) must not end its workers mid-batch.
  # They end when their pipe closes or the parent kills them.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  _first_to_kill()
  _stdout_to_stderr()
  verifiers, failure = _load(payload, imports)
  try:
    conn.send(failure)
  except (EOFError, OSError):
    return
  if failure is not None:
    return
  base.enter_worker()
  health = _Health()
  while True:
    try:
      chunk = conn.recv()
    except (EOFError, OSError):
      return
    if chunk is None:
      return
    results, worn = [], None
    for k, (slot, key, text, example) in enumerate(chunk):
      progress[1] = time.monotonic()  # the time first: see score_batch's timeout check
      progress[0] = k
      results.append((slot, base.score_one(verifiers[key], text, example,
                                           timeout_s)))
      worn = health.worn()
      if worn:  # the rest of the chunk goes to a new worker
        worn = f'{worn}, after example {example.id}'
        break
    try:
      conn.send_bytes(_encode(results, worn))
    except (EOFError, OSError):
      return
    if worn:
      return


def _encode(results: list[tuple[int, base.Outcome]],
            worn: str | None = None) -> bytes:
  """A chunk's results and `worn` (why the worker must be replaced, or
  None) pickled for the parent (`Connection.recv` reads them). Details that
  do not pickle (a lambda, a regex match, an object whose `__reduce__`
  raises, nesting too deep) are replaced, for that completion only, by
  {'unsent': why}; its reward still counts.
  """
  try:
    return reduction.ForkingPickler.dumps((results, worn))
  except Exception:  # pylint: disable=broad-except
    pass  # pickling runs the objects' own code: it may raise anything
  sendable = []
  for slot, out in results:
    try:
      reduction.ForkingPickler.dumps(out)
    except Exception as e:  # pylint: disable=broad-except
      out = out._replace(details={
          'unsent': f'details could not be sent back: {base.short_repr(e)}'})
    sendable.append((slot, out))
  return reduction.ForkingPickler.dumps((sendable, worn))


class _Health:
  """A worker's resident memory, read after each call, and its open files,
  counted after every `_FILES_EVERY`-th (about 1 µs a call, from /proc: on
  Linux; elsewhere nothing is read).

  `worn` says why the worker should be replaced: its memory grew by more
  than `MAX_GROWTH_BYTES` since its first call, or it holds more than half
  the open files it may (`RLIMIT_NOFILE`). A verifier that leaks either
  then costs a worker restart, not the machine's memory or, once the
  files run out, every later call raising 'Too many open files'.
  """

  def __init__(self):
    self._statm = None
    with contextlib.suppress(OSError):
      self._statm = os.open('/proc/self/statm', os.O_RDONLY)
    if self._statm is None:
      return
    import resource  # pylint: disable=g-import-not-at-top  # not on Windows
    self._page = os.sysconf('SC_PAGE_SIZE')
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    self._files = None if soft == resource.RLIM_INFINITY else soft
    self._first: int | None = None  # resident bytes after the first call
    self._calls = 0

  def worn(self) -> str | None:
    """Why the worker should be replaced now, or None."""
    if self._statm is None:
      return None
    try:
      rss = int(os.pread(self._statm, 128, 0).split()[1]) * self._page
    except (OSError, ValueError, IndexError):  # a verifier closed it
      self._statm = None
      return None
    if self._first is None:
      self._first = rss
    elif rss - self._first > MAX_GROWTH_BYTES:
      return (f'its memory grew by {_gib(rss - self._first)} since its '
              f'first call, to {_gib(rss)} (more than '
              f'{_gib(MAX_GROWTH_BYTES)}: a verifier keeps memory between '
              'calls)')
    self._calls += 1
    if self._files is not None and not self._calls % _FILES_EVERY:
      try:
        held = len(os.listdir('/proc/self/fd')) - 1  # listdir's own
      except OSError as e:  # EMFILE: none left to list them with
        return f'it cannot open a file ({e.strerror})'
      if held > self._files // 2:
        return (f'it holds {held} open files, more than half of its limit '
                f'{self._files} (a verifier leaves files open)')
    return None


def _gib(n: int) -> str:
  return f'{n / (1 << 30):.2f} GiB'


def _stdout_to_stderr() -> None:
  """Sends what this worker writes to stdout to stderr: `print` in a
  verifier or a module it imports, C code and child processes (file
  descriptor 1) alike. The trainer's stdout, which the worker shares, holds
  only the trainer's lines (`jaxgrpo-eval`'s table, kept by `> file`)."""
  with contextlib.suppress(OSError, ValueError, AttributeError):
    sys.stdout.flush()
  with contextlib.suppress(OSError):
    os.dup2(2, 1)
  sys.stdout = sys.stderr


def _first_to_kill() -> None:
  """Asks Linux's OOM killer to end this worker before any other process:
  a verifier that leaks memory costs a worker, which the parent replaces,
  not the trainer (whose memory it would otherwise pick as the largest)."""
  with contextlib.suppress(OSError):  # not Linux; any process may raise it
    with open('/proc/self/oom_score_adj', 'w') as f:
      f.write('1000')


# The source file's (mtime, size) of each module of `verify.imports` when
# `import_modules` last imported it.
_IMPORTED: dict[str, tuple[int, int] | None] = {}


def _stamp(module) -> tuple[int, int] | None:
  """(mtime in ns, size) of a module's source file; None without one."""
  path = getattr(module, '__file__', None) or ''
  try:
    st = os.stat(path) if path.endswith('.py') else None
  except OSError:
    return None
  return st and (st.st_mtime_ns, st.st_size)


def _edited_since_import(name: str) -> bool:
  """Whether the source of an imported module changed after its import: as
  `import_modules` last saw it, or else as its bytecode cache records it
  (the timestamp and size that Python writes when it compiles a source;
  without one, under PYTHONDONTWRITEBYTECODE, a module first imported by
  hand is taken as its file)."""
  module = sys.modules.get(name)
  now = _stamp(module)
  if module is None or now is None:
    return False
  if name in _IMPORTED:
    return _IMPORTED[name] != now
  try:
    with open(importlib.util.cache_from_source(module.__file__), 'rb') as f:
      header = f.read(16)
  except (OSError, ValueError, NotImplementedError):
    return False
  flags, mtime, size = (int.from_bytes(header[i:i + 4], 'little')
                        for i in (4, 8, 12))
  return len(header) == 16 and flags == 0 and (mtime, size) != (
      now[0] // 10**9 & 0xFFFFFFFF, now[1] & 0xFFFFFFFF)


def import_modules(imports: Sequence[str]) -> None:
  """Imports `verify.imports`: the modules that register verifiers (or
  advantage estimators), before anything looks their names up. A module
  imported before whose file has changed since (edited between two runs of
  a notebook) is imported again, as the worker processes, which start
  afresh, import it: the verifiers the trainer calls with `verify.workers=0`
  are the file's.

  Raises:
    errors.ConfigError: naming the module and where its code failed (a
      SyntaxError, a name registered twice, an error of its own).
  """
  for i, module in enumerate(imports):
    try:
      if _edited_since_import(module):
        importlib.reload(sys.modules[module])
      importlib.import_module(module)
      _IMPORTED[module] = _stamp(sys.modules[module])
    except Exception as e:  # pylint: disable=broad-except
      at = ''
      if isinstance(e, SyntaxError):
        at = f' at {e.filename}:{e.lineno}'
      elif not isinstance(e, ImportError):
        frame = traceback.extract_tb(e.__traceback__)[-1]
        at = f' at {frame.filename}:{frame.lineno}'
      raise errors.ConfigError(
          f'verify.imports[{i}]={module!r}: cannot import it '
          f'({type(e).__name__}: {e}{at})') from None


def _load(payload: bytes, imports: Sequence[str]):
  """Imports `imports`, then unpickles the verifiers: (verifiers, None), or
  (None, why not, as the one line of a ConfigError)."""
  where, hint = 'verify.imports', ''
  try:
    for i, module in enumerate(imports):
      where = f'verify.imports[{i}]={module!r}: cannot import it'
      importlib.import_module(module)
    where = f'verify.imports={list(imports)}: cannot load the verifiers'
    hint = '; name the modules that define them in verify.imports'
    return pickle.loads(payload), None
  except BaseException as e:  # pylint: disable=broad-except
    error = ' '.join(f'{type(e).__name__}: {e}'.split())[:500]
    return None, f'{where} in the verifier workers ({error}){hint}'


def _await_start(workers: Sequence['_Worker'], imports: Sequence[str]):
  """Waits until every worker has reported its start.

  Raises:
    errors.ConfigError: a worker could not import `imports` (as
      verify.imports) or load the verifiers, or did not start in time.
    errors.UserError: a worker exited before it could report.
  """
  deadline = time.monotonic() + _START_S
  waiting = {w.conn: w for w in workers}
  while waiting:
    ready = connection.wait(
        list(waiting), timeout=max(0.0, deadline - time.monotonic()))
    if not ready:
      raise errors.ConfigError(
          f'verify.imports={list(imports)}: the verifier workers did not '
          f'start within {_START_S:.0f} s')
    for conn in ready:
      w = waiting.pop(conn)
      try:
        failure = conn.recv()
      except (EOFError, OSError):
        w.process.join(timeout=1.0)
        raise errors.UserError(
            'a verifier worker exited while starting (exit code '
            f'{w.process.exitcode}); its error is printed above') from None
      if failure is not None:
        raise errors.ConfigError(failure)


@contextlib.contextmanager
def _main_left_out(leave_out: bool):
  """Starts processes without re-running the main module in them, when
  `leave_out` (the verifiers do not come from it).

  A 'forkserver' or 'spawn' child runs the parent's `__main__` as
  `__mp_main__` so that objects defined there unpickle. The trainer's main
  module (`python -m jaxgrpo.main`, the `jaxgrpo-train` script, a user's
  training script) imports JAX: about 150 MB and a second of start-up in
  every worker, for nothing.
  """
  if not leave_out:
    yield
    return
  prepare = spawn.get_preparation_data

  def without_main(name):
    data = prepare(name)
    data.pop('init_main_from_name', None)
    data.pop('init_main_from_path', None)
    return data

  spawn.get_preparation_data = without_main
  try:
    yield
  finally:
    spawn.get_preparation_data = prepare


def _main_runs_again() -> bool:
  """Whether a worker can run the main module again (by name, or from its
  file); not that of a notebook, `python -c` or an interactive session."""
  main = sys.modules['__main__']
  path = getattr(main, '__file__', None)
  return (getattr(getattr(main, '__spec__', None), 'name', None) is not None
          or (path is not None and os.path.isfile(path)))


def _dumps(verifiers) -> tuple[bytes, bool]:
  """The verifiers pickled for the workers, and whether the workers may
  leave the main module out (`_main_left_out`).

  Where the main module cannot run again in a worker (a notebook), those
  defined in it (or lambdas) are pickled by value, with cloudpickle (a
  dependency of grain); the workers then import what they use.
  """
  try:
    payload = pickle.dumps(verifiers)
    if b'__main__' not in payload:
      return payload, True
    if _main_runs_again():
      return payload, False  # re-run in each worker, as `__mp_main__`
  except (pickle.PicklingError, TypeError, AttributeError):
    if _main_runs_again():
      raise
  import cloudpickle  # pylint: disable=g-import-not-at-top
  return cloudpickle.dumps(verifiers), True


class _Worker:
  """One worker process, its pipe and the chunk it is working on."""

  def __init__(self, ctx, payload, imports, timeout_s, leave_main):
    parent, child = ctx.Pipe()
    self.progress = ctx.RawArray('d', 2)  # [position in chunk, start time]
    self.process = ctx.Process(
        target=_worker_main,
        args=(child, self.progress, payload, tuple(imports), timeout_s),
        daemon=True, name='jaxgrpo-verifier')
    with _main_left_out(leave_main):
      self.process.start()
    child.close()
    self.conn = parent
    self.pending: list[int] = []  # slots of the chunk being scored

  def send(self, items: list[tuple[int, str, str, Example]]) -> bool:
    """Hands `items` to the worker; False if it has died (none are sent)."""
    self.pending = [slot for slot, _, _, _ in items]
    self.progress[1] = time.monotonic()
    self.progress[0] = 0
    try:
      self.conn.send(items)
    except (EOFError, OSError):  # BrokenPipeError: the worker has died
      return False
    return True

  def current(self) -> tuple[int, float]:
    """(position in the chunk, start time) of the call in progress."""
    return int(self.progress[0]), float(self.progress[1])

  def kill(self) -> None:
    """Kills the process (if it has not exited) and waits for it."""
    if self.process.exitcode is None:
      self.process.kill()
    elif not self.conn.poll():  # it holds its end: alive, forkserver gone
      with contextlib.suppress(ProcessLookupError):
        os.kill(self.process.pid, signal.SIGKILL)
    self.process.join()
    self.conn.close()


class Scorer:
  """Verifies completions with their dataset's verifier.

  Use as a context manager (or call `close`) so that worker processes end.

  Args:
    verifiers: dataset name -> verifier (`base.from_config` builds them),
      or one verifier for every dataset.
    workers: worker processes; 0 scores in the calling process (timeouts then
      only stop Python code, on the main thread).
    timeout_s: per-call limit in seconds (None or 0: none).
    imports: modules to import in each worker before unpickling the
      verifiers (where user-defined verifiers are registered).
    names: dataset name -> verifier name, for log messages.
  """

  @property
  def limited_on_main_thread_only(self) -> bool:
    """Whether `timeout_s` holds only for calls from the main thread: it
    scores in this process (no workers), whose SIGALRM timer a thread
    cannot use, so a call from a thread could run for ever."""
    return not self._workers and self.timeout_s is not None

  def __init__(
      self,
      verifiers: Mapping[str, base.VerifyFn] | base.VerifyFn,
      *,
      workers: int = 0,
      timeout_s: float | None = None,
      imports: Sequence[str] = (),
      names: Mapping[str, str] | None = None,
  ):
    if workers < 0:
      raise ValueError(f'workers must be >= 0, got {workers}')
    self._shared = not isinstance(verifiers, Mapping)
    self.verifiers = {None: verifiers} if self._shared else dict(verifiers)
    self.timeout_s = timeout_s if timeout_s and timeout_s > 0 else None
    self.names = dict(names or {})
    self.imports = tuple(imports)
    self.restarts = 0
    self.worn = 0  # workers replaced as their memory or files grew
    self.printed = 0  # calls that printed to stdout (sent to stderr)
    self._workers: list[_Worker] = []
    base.forget_logged()  # a new run logs each failure kind again
    if workers:
      try:
        self._payload, self._leave_main = _dumps(self.verifiers)
      except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise ValueError(
            'verifiers must pickle to run in worker processes (define them '
            'at module level, or set verify.workers=0): '
            f'{e}') from e
      methods = multiprocessing.get_all_start_methods()
      self._ctx = multiprocessing.get_context(
          'forkserver' if 'forkserver' in methods else 'spawn')
      # Started together, then awaited: they import in parallel.
      self._workers = [self._new_worker() for _ in range(workers)]
      try:
        _await_start(self._workers, self.imports)
      except BaseException:
        self.close()
        raise

  def _new_worker(self) -> _Worker:
    return _Worker(self._ctx, self._payload, self.imports, self.timeout_s,
                   self._leave_main)

  def _restart(self, w: _Worker) -> _Worker:
    """Kills `w` and puts a started new worker in its place."""
    w.kill()
    self.restarts += 1
    fresh = self._new_worker()
    self._workers[self._workers.index(w)] = fresh
    _await_start([fresh], self.imports)
    return fresh

  @property
  def workers(self) -> int:
    return len(self._workers)

  def __enter__(self) -> 'Scorer':
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def close(self) -> None:
    """Stops the workers (idempotent)."""
    for w in self._workers:
      try:
        w.conn.send(None)
      except (OSError, ValueError):
        pass
    for w in self._workers:
      w.process.join(timeout=2.0)
      w.kill()
    self._workers = []

  def __del__(self):
    try:
      self.close()
    except Exception:  # pylint: disable=broad-except
      pass

  def _verifier(self, example: Example) -> base.VerifyFn:
    return self.verifiers[None if self._shared else example.dataset]

  def score(
      self,
      completions: Sequence[str],
      examples: Sequence[Example],
      *,
      with_details: bool = False,
  ) -> Any:
    """Scores each completion against its example.

    Args:
      completions: N completion texts.
      examples: the N examples they answer.
      with_details: also return each completion's Outcome.

    Returns:
      rewards [N] float32 in [0, 1] and ScoreStats (failures scored 0 and
      counted; the calls that printed and the workers replaced during this
      call), plus the N outcomes when `with_details`.
    """
    if len(completions) != len(examples):
      raise ValueError(
          f'{len(completions)} completions for {len(examples)} examples')
    unknown = sorted({ex.dataset for ex in examples} - set(self.verifiers))
    if unknown and not self._shared:
      raise ValueError(
          f'no verifier for dataset(s) {unknown}; known: '
          f'{sorted(self.verifiers)}')
    worn = self.worn
    if self._workers:
      outcomes = self._score_pool(completions, examples)
    else:
      outcomes = [
          base.score_one(self._verifier(ex), text, ex, self.timeout_s)
          for text, ex in zip(completions, examples)]
    by_dataset: dict[str, list[int]] = {}
    for i, ex in enumerate(examples):
      by_dataset.setdefault(ex.dataset, []).append(i)
    rewards = np.zeros(len(outcomes), np.float32)
    stats = base.ScoreStats(workers_replaced=self.worn - worn)
    for dataset, rows in by_dataset.items():
      part, part_stats = base.tally(
          [outcomes[i] for i in rows], [examples[i] for i in rows],
          self.names.get(dataset, dataset))
      rewards[rows] = part
      stats.add(part_stats)
    self.printed += stats.printed
    if with_details:
      return rewards, stats, outcomes
    return rewards, stats

  def _score_pool(self, completions, examples) -> list[base.Outcome]:
    n = len(completions)
    outcomes: list[base.Outcome | None] = [None] * n
    # Chunks of a few hundred keep the per-message cost small and every
    # worker busy to the end; a killed worker's unanswered items are sent
    # again, so a chunk also bounds the work a hang throws away.
    size = max(1, min(256, -(-n // (4 * len(self._workers)))))
    todo = list(range(n))
    todo.reverse()  # pop() from the end hands out slots in order

    def feed(w: _Worker) -> None:
      chunk = []
      while todo and len(chunk) < size:
        i = todo.pop()
        key = None if self._shared else examples[i].dataset
        chunk.append((i, key, completions[i], examples[i]))
      if chunk and not w.send(chunk):
        replace(w)
        base.log_once('restart', 'pool', 'a verifier worker had died while '
                      f'idle (exit code {w.process.exitcode}); started a '
                      'new one')

    def replace(w: _Worker, hung: int | None = None, kind: str = '',
                message: str = ''):
      """Ends a worker: scores its current call 0, requeues the others."""
      rest = list(w.pending)
      if hung is not None and 0 <= hung < len(rest):
        outcomes[rest.pop(hung)] = base.Outcome(0.0, kind, message)
      todo.extend(reversed(rest))
      feed(self._restart(w))

    for w in self._workers:
      feed(w)
    limit = None if self.timeout_s is None else self.timeout_s + _GRACE_S
    while any(w.pending for w in self._workers):
      busy = [w for w in self._workers if w.pending]
      wait_s = None
      if limit is not None:
        now = time.monotonic()
        wait_s = max(0.0, min(w.current()[1] + limit - now for w in busy))
      ready = connection.wait([w.conn for w in busy], timeout=wait_s)
      for w in busy:
        if w.conn not in ready:
          continue
        try:
          results, worn = w.conn.recv()
        except (EOFError, OSError):
          w.process.join(timeout=1.0)  # its pipe closes before it is reaped
          code = w.process.exitcode
          replace(w, w.current()[0], 'error',
                  f'the verifier worker died (exit code {code})')
          continue
        for slot, out in results:
          outcomes[slot] = out
        w.pending = w.pending[len(results):]
        if worn:  # it ends: the chunk's rest goes to a new worker
          self.worn += 1
          dataset = examples[results[-1][0]].dataset
          base.log_once('worn', 'pool', (
              'a verifier worker was replaced: '
              f'{worn} (dataset {dataset}, verifier '
              f'{self.names.get(dataset, dataset)})'))
          replace(w)
          continue
        feed(w)
      if limit is not None:
        now = time.monotonic()
        for w in list(self._workers):
          position, since = w.current()
          # A reply already waiting is read first: the worker answered.
          if w.pending and now - since > limit and not w.conn.poll():
            replace(w, position, 'timeout',
                    f'took longer than {self.timeout_s} s and did not stop; '
                    'its worker process was killed')
    return outcomes  # type: ignore[return-value]

