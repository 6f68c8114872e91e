"""The metrics record (`metrics.jsonl`), console lines and the final summary.

Every step appends one JSON object to `WORKDIR/metrics.jsonl`. Console lines
average the steps since the last line with `clu.metrics` averages, so a noisy
per-step reward still reads as a trend.

A workdir on an object store (`gs://...`, anything with a scheme) cannot be
appended to: the file is kept in a local cache and copied over whole at each
`sync` (the training loop calls it with every checkpoint) and on `close`.
"""

from collections.abc import Callable, Mapping
import errno
import hashlib
import json
import math
import os
import tempfile
import time

from clu import metrics as clu_metrics
from etils import epath
import numpy as np

from jaxgrpo import records as records_lib
from jaxgrpo.reporting import console
from jaxgrpo.reporting import tensorboard as tensorboard_lib

METRICS = 'metrics.jsonl'

CONSOLE_KEYS = (
    ('reward/mean', 'reward', '{:.3f}'),
    ('rollout/efficiency', 'eff', '{:.2f}'),
    ('rollout/rounds', 'rounds', '{:.1f}'),
    ('train/loss', 'loss', '{:+.4f}'),
    ('train/clip_frac', 'clip', '{:.3f}'),
    ('perf/step_s', 's/step', '{:.2f}'),
)


def _jsonable(value):
  if isinstance(value, (np.generic, np.ndarray)):
    value = value.item() if np.ndim(value) == 0 else value.tolist()
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return value


class MetricsWriter:
  """Appends one JSON line per step to `metrics.jsonl`.

  On resume from step k the file is cut back to the lines of steps <= k, so
  steps recorded after the last checkpoint (and then redone) appear once; a
  fresh start passes k = -1 and starts an empty file. Nothing else is
  dropped unseen: a line that is not JSON (but the last, cut short by a
  crash) is copied to `metrics.jsonl.damaged`, and with `keep_earlier` (the
  trainer's) a file that a fresh start finds holding steps past 0 (an
  earlier run whose checkpoints are gone) is moved to
  `metrics.jsonl.replaced-<time>`; `notes` says so.

  `enabled=False` (processes other than 0 of a multi-process run) writes
  nothing. `tensorboard=True` also writes each step's scalars as TensorBoard
  events in WORKDIR/tensorboard (rebuilt from the kept lines at start),
  where tensorboardX can be imported; `self.tensorboard` says whether it is.
  Events that cannot be written turn TensorBoard off, with a line to
  `notice` (default: `notes`).
  """

  def __init__(self, workdir: str, *, resume_step: int = -1,
               enabled: bool = True, tensorboard: bool = False,
               keep_earlier: bool = False,
               notice: Callable[[str], None] | None = None):
    self.enabled = enabled
    self._keep_earlier = keep_earlier
    self.tensorboard = None
    self.remote = (epath.Path(workdir) / METRICS
                   if records_lib.is_remote(workdir) else None)
    if self.remote is None:
      self.path = os.path.join(workdir, METRICS)
    else:
      key = hashlib.sha256(str(self.remote).encode()).hexdigest()[:16]
      cache = os.path.join(tempfile.gettempdir(), 'jaxgrpo-metrics', key)
      self.path = os.path.join(cache, METRICS)
    self._file = None
    self.notes: list[str] = []  # what was kept aside, for the console
    self._notice = notice or self.notes.append  # what goes wrong later
    self._workdir = epath.Path(workdir)
    if not enabled:
      return
    os.makedirs(os.path.dirname(self.path), exist_ok=True)
    if self.remote is not None:
      # The object store holds the truth; the cache starts from it.
      data = self.remote.read_bytes() if self.remote.exists() else b''
      with open(self.path, 'wb') as f:
        f.write(data)
    kept = self._truncate_after(resume_step)
    self._file = open(self.path, 'a', encoding='utf-8')
    if tensorboard and tensorboard_lib.available():
      self._events(lambda: setattr(self, 'tensorboard', tensorboard_lib
                                   .EventWriter(workdir, kept)),
                   self.notes.append)
    elif self._dropped and tensorboard_lib.has_events(workdir):
      self._stale_events(kept)

  def _events(self, action: Callable[[], object],
              notice: Callable[[str], None] | None = None) -> None:
    """Runs a TensorBoard write; if the files cannot be written (a disk
    full, `tensorboard` a file), turns TensorBoard off with one notice:
    it is optional, and metrics.jsonl holds every value."""
    try:
      action()
    except OSError as e:
      self.tensorboard = None
      (notice or self._notice)(f'TensorBoard events cannot be written in '
             f'{self._workdir / "tensorboard"} ({e.strerror or e}): turned '
             f'off for this run; {METRICS} holds every value (`jaxgrpo-plot '
             '--tensorboard WORKDIR` writes the events later)')

  def _stale_events(self, kept: list[dict]) -> None:
    """An earlier run's events in WORKDIR/tensorboard hold steps this run
    drops, and this run writes none: they are rewritten from the kept
    records where tensorboardX is installed, else named."""
    logdir = self._workdir / tensorboard_lib.TENSORBOARD
    if not tensorboard_lib.available():
      self.notes.append(
          f'{logdir} holds events of steps {METRICS} no longer has, which '
          'TensorBoard shows, and this run adds none (tensorboardX is not '
          f'installed): {tensorboard_lib.INSTALL}, then `jaxgrpo-plot '
          f'--tensorboard {self._workdir}` rewrites them')
      return

    def rewrite():
      tensorboard_lib.write_all(str(self._workdir), kept)
      self.notes.append(
          f'{logdir}: rewritten from {METRICS} (its events held steps this '
          'run drops); this run adds none (tensorboard is off)')

    self._events(rewrite, self.notes.append)

  def _truncate_after(self, step: int) -> list[dict]:
    """Keeps the lines of steps <= `step`; returns their records (and
    counts those it drops in `self._dropped`)."""
    self._dropped = 0
    if not os.path.exists(self.path):
      return []
    # A damaged line may not be UTF-8: its bytes are kept as they are.
    with open(self.path, encoding='utf-8', errors='surrogateescape') as f:
      lines = f.readlines()
    parsed = [records_lib.record(line) for line in lines]
    # Not JSON, but for the last line unended: a crash cut that one short.
    damaged = [n for n, (line, record) in enumerate(zip(lines, parsed), 1)
               if record is None and line.endswith('\n')]
    if damaged:
      name = METRICS + '.damaged'
      self._keep_aside(name, [lines[n - 1] for n in damaged], append=True)
      self.notes.append(
          f'{METRICS}: {len(damaged)} line{"s" * (len(damaged) > 1)} not '
          f'JSON (line {", ".join(map(str, damaged[:5]))}'
          f'{", ..." * (len(damaged) > 5)}) left out, copied to '
          f'{self._workdir / name}')
    steps = [r.get('step', 0) for r in parsed if r is not None]
    if self._keep_earlier and step < 0 and steps and max(steps) > 0:
      name = f'{METRICS}.replaced-{time.strftime("%Y%m%d-%H%M%S")}'
      self._keep_aside(name, lines)
      self.notes.append(
          f'{METRICS} held steps of an earlier run with no checkpoint left '
          f'(up to step {max(steps)}): moved to {self._workdir / name}')
    records = [r for r in parsed if r is not None and r.get('step', 0) <= step]
    self._dropped = sum(r is not None for r in parsed) - len(records)
    tmp = self.path + '.tmp'
    with open(tmp, 'w', encoding='utf-8') as f:
      f.writelines(json.dumps(r) + '\n' for r in records)
    os.replace(tmp, self.path)
    return records

  def _keep_aside(self, name: str, lines: list[str], append: bool = False):
    """Writes `lines` to WORKDIR/`name` (after what it holds, `append`)."""
    path = self._workdir / name
    data = path.read_bytes() if append and path.exists() else b''
    path.write_bytes(data + ''.join(lines).encode('utf-8', 'surrogateescape'))

  def write(self, step: int, metrics: Mapping[str, object]) -> None:
    if self._file is None:
      return
    record = {'step': step, **{k: _jsonable(v) for k, v in metrics.items()}}
    self._file.write(json.dumps(record) + '\n')
    self._file.flush()
    if self.tensorboard is not None:
      self._events(lambda: self.tensorboard.write(step, record))

  def sync(self) -> None:
    """Copies the file to an object-store workdir (no-op for local ones)
    and flushes the TensorBoard events."""
    if self.tensorboard is not None:
      self._events(self.tensorboard.flush)
    if self._file is not None and self.remote is not None:
      with open(self.path, encoding='utf-8') as f:
        self.remote.write_text(f.read())

  def close(self) -> None:
    if self._file is not None:
      self.sync()
      self._file.close()
      self._file = None
    if self.tensorboard is not None:
      self._events(self.tensorboard.close)
      self.tensorboard = None


def read_metrics(workdir: str) -> list[dict]:
  """All records of a run's `metrics.jsonl`, in order; an unended last line
  (a run killed mid-write, or one writing now) is left out, and a run that
  has not written its first line yet (its lock or `checkpoints/` there) has
  none.

  Raises:
    FileNotFoundError: `workdir` holds no run.
    ValueError: another line is not a JSON object (named by file and line).
  """
  path = epath.Path(workdir) / METRICS
  if not path.exists():
    if records_lib.run_started(workdir):
      return []
    raise FileNotFoundError(errno.ENOENT, 'No such file or directory (and '
                            'no run started there)', str(path))
  # A damaged line that is not UTF-8 is named as any other.
  lines = path.read_bytes().decode('utf-8', 'replace').splitlines(
      keepends=True)
  out = []
  for n, line in enumerate(lines, 1):
    record = records_lib.record(line) if line.strip() else {}
    if record is None and (n < len(lines) or line.endswith('\n')):
      raise ValueError(f'{path}:{n}: not a JSON object: {line[:80]!r}')
    if record:
      out.append(record)
  return out


class ConsoleWindow:
  """Averages per-step metrics between console lines; the efficiency is
  the window's groups used over its prompts generated, not a mean of the
  steps' ratios (a step that trains on carried groups and generates none,
  or few, would weigh as much as one that generated many)."""

  def __init__(self):
    self._avg: dict[str, clu_metrics.Average] = {}
    self._used_generated = [0.0, 0.0]

  def add(self, metrics: Mapping[str, float]) -> None:
    if 'rollout/groups_used' in metrics:
      self._used_generated[0] += float(metrics['rollout/groups_used'])
      self._used_generated[1] += float(metrics['rollout/prompts_generated'])
    for key, _, _ in CONSOLE_KEYS:
      if key == 'rollout/efficiency':
        continue  # the window's sums (above)
      if key in metrics and math.isfinite(float(metrics[key])):
        value = clu_metrics.Average.from_model_output(
            np.asarray(float(metrics[key]), np.float32)
        )
        self._avg[key] = (
            self._avg[key].merge(value) if key in self._avg else value
        )

  def line(
      self, step: int, total_steps: int, latest: Mapping[str, float] = ()
  ) -> str:
    """The console line; `latest` (this step's metrics) adds, for a
    mixture, each dataset's batch share and its snoozed/filtered counts."""
    parts = [f'step {step:>{len(str(total_steps))}}/{total_steps}']
    used, generated = self._used_generated
    for key, label, fmt in CONSOLE_KEYS:
      if key == 'rollout/efficiency' and generated:
        parts.append(f'{label} {fmt.format(used / generated)}')
      elif key in self._avg:
        parts.append(f'{label} {fmt.format(float(self._avg[key].compute()))}')
    self._avg, self._used_generated = {}, [0.0, 0.0]
    latest = dict(latest)
    # Datasets only: strata ('data/batch_share/<dataset>/<stratum>') are
    # in metrics.jsonl.
    shares = {k.split('/')[2]: v for k, v in latest.items()
              if k.startswith('data/batch_share/') and k.count('/') == 2}
    if len(shares) > 1:
      parts.append('share ' + ' '.join(
          f'{console.shorten(name)}={v:.2f}'
          for name, v in sorted(shares.items())))
    for kind in ('snoozed', 'filtered'):
      counts = {k.rsplit('/', 1)[1]: v for k, v in latest.items()
                if k.startswith(f'data/{kind}/')}
      if any(counts.values()):
        parts.append(f'{kind} ' + ' '.join(
            f'{console.shorten(name)}={int(v)}'
            for name, v in sorted(counts.items())))
    return '  '.join(parts)


def format_table(rows: list[tuple[str, str]], title: str) -> str:
  """A two-column text table, padded by terminal columns (a CJK dataset
  name takes two per glyph)."""
  width = max(console.width(k) for k, _ in rows)
  lines = [title, '-' * (width + 2 + max(console.width(v) for _, v in rows))]
  lines += [f'{console.pad(k, width)}  {v}' for k, v in rows]
  return '\n'.join(lines)
