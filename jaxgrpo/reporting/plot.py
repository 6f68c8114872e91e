r"""Figures of a run's `metrics.jsonl` (PNG), and its scalars for TensorBoard.

  jaxgrpo-plot runs/demo [--out=runs/demo/plots] [--window=20] [--tensorboard]

(the command line is `jaxgrpo.cli.plot`)

Writes, for the metrics the run recorded (a figure whose metrics are absent
is skipped, and a PNG of it already there removed):

  reward.png            sampled reward, overall and per dataset (and subset)
  prompts.png           prompts generated per step against the groups used
                        (B when the batch fills), and the cumulative ratio
  efficiency.png        groups used / prompts generated: per step, over
                        windows of steps (a ratio of sums) and cumulative
  batch_share.png       each dataset's share of the batch, and each of its
                        strata's share of the batch when a curriculum sets
                        strata (a dataset's strata add up to its share)
  snoozed_filtered.png  examples snoozed, filtered (and postponed) per dataset
  accuracy.png          held-out accuracy, overall, per dataset and subset

Per-step series are drawn as trailing means over `--window` steps (the raw
values faintly behind). matplotlib is imported only when plotting
(`pip install 'jaxgrpo[plots]'`); `--tensorboard` also writes every scalar
as TensorBoard event files under WORKDIR/tensorboard with tensorboardX
(`pip install 'jaxgrpo[tensorboard]'`).
"""

from collections.abc import Callable, Sequence
import dataclasses
import importlib
import os
import threading
from typing import Any
import warnings

import numpy as np

from jaxgrpo.reporting import console
from jaxgrpo.reporting import plot_panels
from jaxgrpo.reporting.plot_panels import Panel
from jaxgrpo.reporting.plot_panels import read_records

PLOTS = 'plots'
INSTALL_PLOTS = "pip install 'jaxgrpo[plots]'"
INSTALL_TENSORBOARD = "pip install 'jaxgrpo[tensorboard]'"

Log = Callable[[str], None]
Records = plot_panels.Records
FIGURES = plot_panels.FIGURES


# ---------------------------------------------------------------------------
# Drawing.


def have_matplotlib() -> bool:
  """Whether matplotlib can be imported."""
  try:
    importlib.import_module('matplotlib')
  except ImportError:
    return False
  return True


def drawable(panels: Sequence[Panel]) -> list[Panel]:
  """The panels without their curves that hold no finite value (e.g. a
  ratio to a count that stayed 0); panels left with no curve are dropped."""
  out = []
  for panel in panels:
    lines = tuple(line for line in panel.lines
                  if np.isfinite(np.asarray(line.y, np.float64)).any())
    if lines:
      out.append(dataclasses.replace(panel, lines=lines))
  return out


# Longest label a legend shows (a dataset may be named at any length: its
# legend covered the curves and pushed the panels out of the figure).
LABEL_CHARS = console.NAME_CHARS
shorten = console.shorten


def as_text(text: str, limit: int = LABEL_CHARS) -> str:
  """`text` shortened, as matplotlib shows it verbatim: '$' escaped (a
  label holding two, e.g. a subset 'cost $5 to $10', was read as math, and
  one that is no valid math failed its whole figure)."""
  return shorten(text, limit).replace('$', r'\$')


# Legend entries drawn inside a panel; more go beside it, in columns of at
# most LEGEND_ROWS (one column of 49 ran off the figure).
LEGEND_INSIDE = 8
LEGEND_ROWS = 20


def legend_entries(panel: Panel) -> int:
  """How many entries the panel's legend has."""
  return sum(bool(line.label) for line in panel.lines) + len(
      panel.hlines)


# Panels in a row of a figure; more wrap onto further rows (13 side by side,
# a curriculum's strata of 12 datasets, made a figure 65 inches wide).
PANELS_PER_ROW = 3


def layout(panels: Sequence[Panel]
           ) -> tuple[int, int, list[int], tuple[float, float]]:
  """The rows and columns of a figure's panels, the columns of each
  panel's legend beside it (0: inside it), and the figure's size (inches).
  """
  # A long legend (many datasets) goes beside its panel, not over it.
  beside = [-(-legend_entries(panel) // LEGEND_ROWS)
            if legend_entries(panel) > LEGEND_INSIDE else 0
            for panel in panels]
  ncols = min(len(panels), PANELS_PER_ROW)
  nrows = -(-len(panels) // ncols)
  width = sum(5.0 + 2.4 * max(beside[c::ncols]) for c in range(ncols))
  return nrows, ncols, beside, (width, 3.4 * nrows)


def unit_limits(panel: Panel) -> tuple[float, float]:
  """The y range of a panel of shares or rates: [0, 1] with a margin, or
  up to its largest value (a step's efficiency passes 1 when it trained
  on groups carried in)."""
  top = max([1.0] + [float(np.nanmax(line.y)) for line in panel.lines
                     if np.isfinite(np.asarray(line.y, float)).any()])
  return -0.03, top + 0.03


def draw(path: str, title: str, panels: Sequence[Panel]) -> None:
  """Writes the panels side by side (PANELS_PER_ROW to a row) as a PNG at
  `path`.

  Uses matplotlib's object API, not pyplot: no global backend is switched
  (a notebook's inline plots keep working) and nothing is left open.
  """
  # pylint: disable=g-import-not-at-top
  from matplotlib import figure as figure_lib
  from matplotlib import ticker
  # pylint: enable=g-import-not-at-top
  nrows, ncols, beside, size = layout(panels)
  fig = figure_lib.Figure(figsize=size, dpi=90)
  axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
  for ax in axes[len(panels):]:  # a last row not filled
    fig.delaxes(ax)
  for ax, panel, outside in zip(axes, panels, beside):
    for line in panel.lines:
      label = None if line.label is None else as_text(line.label)
      ax.plot(line.x, line.y, label=label, **line.style)
    for label, y in panel.hlines:
      ax.axhline(y, color='gray', ls=':', lw=1.0, label=label)
    if panel.unit_range:
      ax.set_ylim(*unit_limits(panel))
    ax.set_title(as_text(panel.title, 2 * LABEL_CHARS), fontsize=9)
    ax.set_xlabel('step', fontsize=8)
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.set_ylabel(panel.ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    if outside:
      ax.legend(fontsize=6, loc='upper left', bbox_to_anchor=(1.02, 1.0),
                ncol=outside)
    elif legend_entries(panel):
      ax.legend(fontsize=6)
  fig.suptitle(as_text(title, 2 * LABEL_CHARS), fontsize=10)
  # Its own temporary file: a run ending while jaxgrpo-plot draws the same
  # figure would otherwise write into one file, and rename it away from the
  # other.
  tmp = f'{path}.{os.getpid()}-{threading.get_ident()}.tmp'
  with warnings.catch_warnings():
    # A label the font lacks (a dataset named in CJK) is drawn as boxes:
    # matplotlib's warning per glyph would reach the run's stderr.
    warnings.filterwarnings('ignore', 'Glyph .* missing from font')
    # Labels too wide for the figure: drawn as they are, without a warning
    # to the run's stderr.
    warnings.filterwarnings('ignore', 'Tight layout not applied')
    # Over several rows, room is kept for the figure's title.
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / size[1]) if nrows > 1 else None)
    fig.savefig(tmp, format='png')
  os.replace(tmp, path)


def _arguments(workdir: Any, out: Any, window: Any
               ) -> tuple[str, str | None, int]:
  """`plot_run`'s arguments as it uses them; TypeError for a wrong type,
  naming the argument (an int taken as `out` was a TypeError from deep in
  os.makedirs)."""
  def path(name: str, value: Any) -> str:
    if not isinstance(value, (str, os.PathLike)):
      hint = (f' (for a trailing mean of {value} steps, pass '
              f'window={value})' if name == 'out' and isinstance(
                  value, (int, float)) and not isinstance(value, bool)
              else '')
      raise TypeError(f'plot_run: {name}={value!r} ({type(value).__name__}) '
                      f'is not a folder path (str or os.PathLike){hint}')
    return os.fspath(value)

  try:
    steps = max(1, int(window))
  except (TypeError, ValueError, OverflowError):
    raise TypeError(f'plot_run: window={window!r} is not a whole number of '
                    'steps') from None
  return (path('workdir', workdir),
          None if out is None else path('out', out), steps)


def plot_run(workdir: str, out: str | None = None, window: int = 20, *,
             log: Log = console.print_line) -> list[str]:
  """Writes the PNG figures of a run's metrics (module docstring).

  Never raises for what it reads, draws or writes: without matplotlib,
  without metrics.jsonl, or with too few records for a figure, fewer
  figures (or none) are written; what went wrong goes to `log`. A figure
  the records leave empty is removed from `out` when a PNG of it is there
  (drawn from other records). Only arguments of the wrong type raise,
  before anything is read.

  Args:
    workdir: the run's workdir, holding metrics.jsonl (str or os.PathLike).
    out: directory of the PNGs (str or os.PathLike; default: WORKDIR/plots).
    window: steps in the trailing mean of per-step series (a whole number).
    log: receives a line about each problem.

  Returns:
    The paths written.

  Raises:
    TypeError: `workdir` or `out` is no path, or `window` no number (a
      window given second, `plot_run(workdir, 10)`, is named as such).
  """
  workdir, out, window = _arguments(workdir, out, window)
  if not have_matplotlib():
    log(f'matplotlib is not installed: no plots ({INSTALL_PLOTS})')
    return []
  try:
    records = read_records(workdir)
    out = os.path.join(workdir, PLOTS) if out is None else out
    if records:
      os.makedirs(out, exist_ok=True)
  except OSError as e:
    log(f'no plots: {e}')
    return []
  name = os.path.basename(os.path.abspath(workdir).rstrip('/'))
  paths = []
  for figure, make_panels in FIGURES.items():
    # A plot must not fail the run that calls this at its end.
    try:
      panels = drawable(make_panels(records, window))
      path = os.path.join(out, f'{figure}.png')
      if panels:
        draw(path, f'{name}: {figure.replace("_", " ")}', panels)
        paths.append(path)
      elif os.path.isfile(path):
        # Drawn from other records (the run before a fresh start, another
        # run's --out): it would pass for this run's figure.
        os.remove(path)
    except Exception as e:  # pylint: disable=broad-except
      log(f'plot {figure!r} failed: {type(e).__name__}: {e}')
  return paths


# ---------------------------------------------------------------------------
# TensorBoard.


def write_tensorboard(workdir: str) -> str | None:
  """Writes every scalar of metrics.jsonl as TensorBoard events.

  The events go to WORKDIR/tensorboard through tensorboardX
  (`jaxgrpo.reporting.tensorboard`); event files there from before (an earlier call,
  or the training run's own) are replaced, so each step appears once.

  Returns:
    The event directory, or None when tensorboardX cannot be imported
    (`pip install 'jaxgrpo[tensorboard]'`).

  Raises:
    OSError: metrics.jsonl cannot be read or the directory written.
  """
  # Imported here: it imports etils, which `--help` does not need.
  from jaxgrpo.reporting import tensorboard  # pylint: disable=g-import-not-at-top
  return tensorboard.write_all(workdir, read_records(workdir))
