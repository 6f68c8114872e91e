"""Verifiers that misbehave on purpose, importable by verifier workers."""

import dataclasses
import os
import re
import signal
import sys
import threading
import time

from jaxgrpo.verifiers import base

class Unreducible:
  """Pickling it raises ValueError, as an object's own code may."""

  def __reduce__(self):
    raise ValueError('cannot pickle this')


@dataclasses.dataclass(frozen=True)
class Flaky:
  """Scores by the completion's text: 'ok' 1, 'half' 0.5, 'true' True, and
  misbehaves on 'raise', 'big' (2.0), 'nan', 'sleep' (Python sleep), 'stuck'
  (blind to the timer signal, like a call stuck in C code), 'die' (the
  process exits), 'exit' (raises SystemExit(0)), 'ctrl-c' (raises
  KeyboardInterrupt), 'huge' (an int too large for a float), 'text'
  (returns the string '1'), 'unsendable' and 'unpicklable' (reward 1 with
  details that do not pickle: pickling raises ValueError, TypeError),
  'swallow' (sleeps in a bare `try: ... except: pass`, then returns 1)."""

  sleep_s: float = 30.0

  def __call__(self, completion, example):
    if completion == 'raise':
      raise RuntimeError('verifier bug')
    if completion == 'big':
      return 2.0
    if completion == 'nan':
      return float('nan')
    if completion == 'sleep':
      time.sleep(self.sleep_s)
    if completion == 'stuck':
      signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
      time.sleep(self.sleep_s)
    if completion == 'die':
      os._exit(3)
    if completion == 'half':
      return base.Verdict(0.5, {'why': 'half'})
    if completion == 'true':
      return True
    if completion == 'exit':
      raise SystemExit(0)
    if completion == 'ctrl-c':
      raise KeyboardInterrupt
    if completion == 'huge':
      return 10**400
    if completion == 'text':
      return '1'
    if completion == 'swallow':
      try:
        time.sleep(self.sleep_s)
      except:  # pylint: disable=bare-except  # noqa: E722
        pass
      return 1.0
    if completion == 'unsendable':
      return base.Verdict(1.0, {'why': Unreducible()})
    if completion == 'unpicklable':
      return base.Verdict(1.0, {'why': re.match('a', 'a')})
    return float(completion == 'ok')


# What `Leaky` holds on to in this process, as a verifier's cache might.
kept: list = []


@dataclasses.dataclass(frozen=True)
class Leaky:
  """Scores 1 and keeps what it used: 'memory' keeps `mib` MiB (written,
  so resident), 'files' keeps `files` open files; the details name the
  process that scored."""

  mib: int = 64
  files: int = 100

  def __call__(self, completion, example):
    del example
    if completion == 'memory':
      kept.append(b'\x01' * (self.mib << 20))
    if completion == 'files':
      kept.extend(open(os.devnull, 'rb') for _ in range(self.files))  # pylint: disable=consider-using-with
    return base.Verdict(1.0, {'pid': os.getpid()})


# Set by `Chatty` on 'wait' once it has printed; it then waits for `go`.
printing = threading.Event()
go = threading.Event()


@dataclasses.dataclass(frozen=True)
class Chatty:
  """Scores 1 and prints to stdout on the way: a line with print() and one
  with sys.stdout.write; on 'raw' a line to file descriptor 1 (as C code or
  a child process writes); on 'wait' it prints, sets `printing` and waits
  for `go`."""

  def __call__(self, completion, example):
    print(f'checking {example.id}: {completion}')
    sys.stdout.write('more\n')
    sys.stdout.flush()
    if completion == 'raw':
      os.write(1, b'raw line\n')
    if completion == 'wait':
      printing.set()
      go.wait(30)
    return 1.0


@base.register('starts_with_digit')
def starts_with_digit(completion, example):
  """An untrained model passes this about one time in five: mixed groups."""
  del example
  return float(completion[:1].isdigit())


@base.register('prints_digit')
def prints_digit(completion, example):
  """`starts_with_digit` that prints each completion, as one being debugged
  does: every call counts in `verify/printed`."""
  print(f'checking {example.id}: {completion!r}')
  return float(completion[:1].isdigit())


@base.register('leaks_files')
def leaks_files(completion, example):
  """`starts_with_digit` that leaves a twentieth of the open-file limit
  open per call: its worker holds 0.8 of the limit when they are counted,
  after 16 calls, and is replaced (`verify/workers_replaced`). For workers
  only (`verify.workers` > 0): the files stay open in whatever process
  scores."""
  del example
  import resource  # pylint: disable=g-import-not-at-top
  limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
  kept.extend(open(os.devnull, 'rb') for _ in range(limit // 20 + 1))  # pylint: disable=consider-using-with
  return float(completion[:1].isdigit())


@base.register('unreliable')
def unreliable(completion, example):
  """Sleeps on completions starting with '1', raises on '2', else 1.0."""
  del example
  if completion[:1] == '1':
    time.sleep(30)
  if completion[:1] == '2':
    raise ValueError('unreliable verifier')
  return 1.0


@base.register('fails_by_id')
def fails_by_id(completion, example):
  """`starts_with_digit`, but raises on examples whose id ends in '8' and
  sleeps 30 s on those ending in '0' (the demo's first held-out examples
  are arithmetic/258, arithmetic/260, arithmetic/261)."""
  if example.id.endswith('8'):
    raise ValueError('fails_by_id raises here')
  if example.id.endswith('0'):
    time.sleep(30)
  return float(completion[:1].isdigit())


def fails_on_wrong(completion, example):
  """`starts_with_digit`, but raises on a wrong answer (longer than the
  example's answer, as the scripted generator writes them) to an example
  whose id ends in '1' or '3': those examples have some calls fail."""
  if example.id[-1] in '13' and len(completion) > len(example.answer):
    raise ValueError('fails_on_wrong raises here')
  return float(completion[:1].isdigit())


def informative_demo_config():
  """The demo's 2-step runlocal config without a warm start, scored by
  `starts_with_digit`: an untrained model starts with a digit about as
  often as not, so groups are informative and every step updates."""
  from jaxgrpo.configs import demo  # pylint: disable=g-import-not-at-top
  c = demo.get_config('runlocal')
  c.warmstart.enabled = False
  c.data.datasets[0]['verifier'] = 'starts_with_digit'
  c.verify.imports = ('tests.flaky_verifiers',)
  c.verify.workers = 0
  return c


# What `AlarmAfterReturn` did on its latest call in this process: the
# opcode it fired the timer at (None: the call was scored before it).
alarm_fired_at: list[int | None] = [None]


@dataclasses.dataclass(frozen=True)
class AlarmAfterReturn:
  """Returns 1.0 and has the per-call timer fire right after: the completion
  'N' raises SIGALRM at the N-th bytecode that runs once this call has
  returned, until the scoring code (jaxgrpo/verifiers/base.py) hands the
  outcome back. It fires only while the scorer's handler is installed, as a
  real timer does (an armed timer's signal goes to that handler).

  Opcode tracing reaches every instruction of the window between the
  verifier returning and the timer being disarmed, where a real signal lands
  only at the interpreter's next check, so running N = 1, 2, ... is a
  deterministic stand-in for a timer that expires just as the call returns.
  """

  def __call__(self, completion, example):
    del example
    target = int(completion)
    scoring = sys._getframe(1)  # pylint: disable=protected-access
    frames = []
    while scoring.f_code.co_filename == base.__file__:
      frames.append(scoring)
      scoring = scoring.f_back
    stop = scoring  # the scorer's caller: the outcome has been handed back
    count = [0]
    alarm_fired_at[0] = None

    def done():
      sys.settrace(None)
      for f in frames:
        f.f_trace = None

    def local(frame, event, arg):
      del arg
      if frame is stop:
        done()
        return None
      frame.f_trace_opcodes = True
      if event != 'opcode':
        return local
      count[0] += 1
      if count[0] == target and (
          signal.getsignal(signal.SIGALRM) is base._on_alarm):  # pylint: disable=protected-access
        done()
        alarm_fired_at[0] = target
        signal.raise_signal(signal.SIGALRM)  # runs the handler here
      return local

    stop.f_trace = local
    for f in frames:
      f.f_trace, f.f_trace_opcodes = local, True
    sys.settrace(local)
    return 1.0
