"""What a run shows on the console: progress bars, log lines, quiet mode.

A run talks through one `Console`:

  * `info` lines say what is happening (the mesh, memory, averaged step
    lines); quiet mode drops them.
  * `notice` lines need the user's attention (a resume, a skipped update, a
    stop signal, the final summary); they are always shown.
  * `bar` is a tqdm progress bar with rate and time left (training steps,
    warm-start steps, evaluation examples); while one is open, lines are
    written above it instead of through it. Bars are off unless asked for
    (`progress=True`; the command line turns them on on a terminal).

Processes other than 0 of a multi-process run show nothing.
"""

from collections.abc import Callable, Iterator
import contextlib
import sys
from typing import Any
import unicodedata

import tqdm

Log = Callable[[str], None]


def print_line(line: str) -> None:
  print(line, flush=True)


def width(text: str) -> int:
  """The terminal columns `text` takes: 2 for each East Asian wide or
  full-width character (CJK), 0 for combining marks and zero-width
  characters, 1 for the rest."""
  return sum(_columns(c) for c in text)


def _columns(c: str) -> int:
  if unicodedata.combining(c) or unicodedata.category(c) in ('Mn', 'Me',
                                                             'Cf'):
    return 0
  return 2 if unicodedata.east_asian_width(c) in ('W', 'F') else 1


# Longest dataset name a console line, the summary or a plot's legend
# shows (a name may be of any length: one of 200 characters pushed every
# value of the summary past column 200).
NAME_CHARS = 40


def shorten(text: str, limit: int = NAME_CHARS) -> str:
  """`text` cut to `limit` characters by '...' in its middle: its start
  and its end (a subset, 'snoozed') stay readable."""
  if len(text) <= limit:
    return text
  tail = (limit - 3) // 3
  return text[:limit - 3 - tail] + '...' + text[len(text) - tail:]


def pad(text: str, columns: int, *, right: bool = False) -> str:
  """`text` padded with spaces to `columns` terminal columns (`width`), on
  the right, or on the left with `right` (right-aligned)."""
  fill = ' ' * max(0, columns - width(text))
  return fill + text if right else text + fill


def format_seconds(seconds: float) -> str:
  """E.g. '45s', '12m05s', '3h02m'."""
  seconds = max(0, int(round(seconds)))
  if seconds < 60:
    return f'{seconds}s'
  minutes, seconds = divmod(seconds, 60)
  if minutes < 60:
    return f'{minutes}m{seconds:02d}s'
  hours, minutes = divmod(minutes, 60)
  return f'{hours}h{minutes:02d}m'


class _NoBar:
  """Stands in for a bar when bars are off."""

  n = 0

  def update(self, n: int = 1) -> None:
    self.n += n

  def set_postfix_str(self, text: str, refresh: bool = True) -> None:
    del text, refresh


class Console:
  """Routes a run's lines and bars (see the module docstring).

  Args:
    log: receives every shown line (print by default).
    progress: show progress bars (on stderr).
    quiet: drop `info` lines; show only notices.
    enabled: False shows nothing (processes other than 0).
  """

  def __init__(self, log: Log = print_line, *, progress: bool = False,
               quiet: bool = False, enabled: bool = True):
    self._log = log
    self.progress = progress
    self.quiet = quiet
    self.enabled = enabled
    self._bars: list[Any] = []

  def _emit(self, line: str) -> None:
    if not self.enabled:
      return
    if self._bars and self._log is print_line:
      tqdm.tqdm.write(line, file=sys.stdout)  # above the bars, not through
    else:
      self._log(line)

  def info(self, line: str) -> None:
    if not self.quiet:
      self._emit(line)

  def notice(self, line: str) -> None:
    self._emit(line)

  @contextlib.contextmanager
  def bar(self, total: int, *, desc: str, unit: str,
          initial: int = 0) -> Iterator[Any]:
    """A progress bar (a stand-in with the same methods when bars are off).

    A bar opened while another is open (evaluation during training) shows
    below it until it closes.
    """
    if not (self.progress and self.enabled):
      yield _NoBar()
      return
    bar = tqdm.tqdm(total=total, initial=initial, desc=desc, unit=unit,
                    dynamic_ncols=True, leave=False, file=sys.stderr,
                    position=len(self._bars))
    self._bars.append(bar)
    try:
      yield bar
    finally:
      self._bars.remove(bar)
      bar.close()


def postfix(metrics: dict[str, float]) -> str:
  """A step's headline numbers, for the progress bar: its reward, the
  run's efficiency so far (groups used / prompts generated, as the
  summary has it; a step's own ratio swings with the groups it carried
  in) and the held-out accuracy."""
  parts = []
  if 'reward/mean' in metrics:
    parts.append(f'reward {metrics["reward/mean"]:.3f}')
  if generated := metrics.get('rollout/cum_prompts_generated'):
    parts.append(f'eff {metrics["rollout/cum_groups_used"] / generated:.3f}')
  if 'eval/accuracy' in metrics:
    parts.append(f'eval {metrics["eval/accuracy"]:.3f}')
  return ' '.join(parts)


def eval_part(metrics: dict[str, float]) -> str:
  """`eval <accuracy>` of an evaluated step's console line, followed by the
  evaluation's verifier failures when it had any (`eval/verify/errors`,
  `eval/verify/timeouts`: those completions were scored 0, so the
  accuracy is lower than the model's): `eval 0.400 (verifier errors 2,
  timeouts 2: scored 0)`. Nothing is added when both are 0."""
  part = f'eval {metrics["eval/accuracy"]:.3f}'
  errors = int(metrics.get('eval/verify/errors', 0))
  timeouts = int(metrics.get('eval/verify/timeouts', 0))
  if errors or timeouts:
    part += f' (verifier errors {errors}, timeouts {timeouts}: scored 0)'
  return part


def explain_no_update(step: int, metrics: dict[str, float], ro,
                      console: Console, waiting: bool) -> None:
  """Says why a step took no update (a short batch only when it starts
  waiting, not on every step it goes on waiting)."""
  rounds = int(metrics.get('rollout/rounds', 0))
  held = int(metrics.get('rollout/held', 0))
  # A streaming step counts its draws, each of a few prompts.
  spent = (f'{rounds} rounds (rollout.max_rounds={ro.max_rounds})'
           if ro.collect == 'rounds' else
           f'{rounds} draws (at most rollout.max_rounds={ro.max_rounds} '
           "rounds' worth of prompts)")
  if metrics.get('train/completions_masked') == 1.0:
    console.notice(
        f'step {step}: every completion of the batch reached '
        f'rollout.max_new_tokens={ro.max_new_tokens} without a stop token; '
        "rl.cut_completions='mask' masks them all, update skipped")
  elif held:
    if not waiting:
      console.notice(
          f'step {step}: {held} of {ro.batch_size} informative groups after '
          f'{spent}; no update until the batch is full '
          "(rollout.short_batch='wait'; train/skipped counts the steps)")
  elif rounds:
    console.notice(f'step {step}: no informative group in {spent}; '
                   'update skipped')
  else:
    console.notice(
        f'step {step}: no dataset had a prompt to offer (every stratum '
        'postponed by the curriculum, or every example filtered); update '
        'skipped')
