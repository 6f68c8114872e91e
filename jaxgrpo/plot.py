r"""Figures of a run's `metrics.jsonl` (PNG), and its scalars for TensorBoard.

  jaxgrpo-plot runs/demo [--out=runs/demo/plots] [--window=20] [--tensorboard]
  python -m jaxgrpo.plot runs/demo

Writes, for the metrics the run recorded (a figure whose metrics are absent
is skipped):

  reward.png            sampled reward, overall and per dataset (and subset)
  prompts.png           prompts generated per step against the groups used
                        (B when the batch fills), and the cumulative ratio
  efficiency.png        groups used / prompts generated, per step and
                        cumulative
  batch_share.png       each dataset's share of the batch, and each stratum's
                        within its dataset when a curriculum sets strata
  snoozed_filtered.png  examples snoozed, filtered (and postponed) per dataset
  accuracy.png          held-out accuracy, overall, per dataset and subset

Per-step series are drawn as trailing means over `--window` steps (the raw
values faintly behind). matplotlib is imported only when plotting
(`pip install 'jaxgrpo[plots]'`); `--tensorboard` also writes every scalar
as TensorBoard event files under WORKDIR/tensorboard with clu's metric
writers (`pip install 'jaxgrpo[tensorboard]'`).
"""

import argparse
from collections.abc import Callable, Sequence
import dataclasses
import importlib
import json
import os
import sys

import numpy as np

from jaxgrpo import cli

PROG = 'jaxgrpo-plot'
PLOTS = 'plots'
INSTALL_PLOTS = "pip install 'jaxgrpo[plots]'"
INSTALL_TENSORBOARD = "pip install 'jaxgrpo[tensorboard]'"

Log = Callable[[str], None]
Records = Sequence[dict]


@dataclasses.dataclass(frozen=True)
class Line:
  """One curve: a label (None: not in the legend), x, y and its style."""

  label: str | None
  x: np.ndarray
  y: np.ndarray
  style: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Panel:
  """One subplot of a figure."""

  title: str
  ylabel: str
  lines: tuple[Line, ...]
  hlines: tuple[tuple[str, float], ...] = ()
  unit_range: bool = False  # values are shares or rates in [0, 1]


# ---------------------------------------------------------------------------
# Reading the records.


def _value(v: object) -> float | None:
  """A recorded scalar as a float ('nan' and 'inf' strings included)."""
  if isinstance(v, bool) or not isinstance(v, (int, float, str)):
    return None
  try:
    return float(v)
  except ValueError:
    return None


def read_records(workdir: str) -> list[dict]:
  """The run's metrics records; a line cut short (a live run, a crash) is
  left out.

  Raises:
    OSError: WORKDIR/metrics.jsonl cannot be read.
  """
  # Imported here: jaxgrpo.metrics imports clu and jax, which `--help` and
  # a missing workdir do not need.
  # pylint: disable-next=g-import-not-at-top
  from jaxgrpo import metrics as metrics_lib
  try:
    return metrics_lib.read_metrics(workdir)
  except json.JSONDecodeError:
    pass
  records = []
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    for line in f:
      try:
        record = json.loads(line)
      except json.JSONDecodeError:
        continue
      if isinstance(record, dict):
        records.append(record)
  return records


def series(records: Records, key: str) -> tuple[np.ndarray, np.ndarray]:
  """(steps, values) of the records holding `key`."""
  pairs = [(r.get('step', i), _value(r[key])) for i, r in enumerate(records)
           if key in r]
  pairs = [(s, v) for s, v in pairs if v is not None]
  if not pairs:
    return np.zeros(0), np.zeros(0)
  steps, values = zip(*pairs)
  return np.asarray(steps, np.float64), np.asarray(values, np.float64)


def smooth(y: np.ndarray, window: int) -> np.ndarray:
  """Trailing mean over `window` values (fewer at the start); NaNs are
  left out of the means."""
  y = np.asarray(y, np.float64)
  if window <= 1 or y.size == 0:
    return y
  ok = np.isfinite(y)
  sums = np.cumsum(np.insert(np.where(ok, y, 0.0), 0, 0.0))
  counts = np.cumsum(np.insert(ok.astype(np.float64), 0, 0.0))
  lo = np.maximum(np.arange(1, y.size + 1) - window, 0)
  n = counts[1:] - counts[lo]
  with np.errstate(invalid='ignore', divide='ignore'):
    return np.where(n > 0, (sums[1:] - sums[lo]) / np.maximum(n, 1), np.nan)


def _keys(records: Records, prefix: str, depth: int) -> list[str]:
  """Keys `prefix<a>` (depth 1) or `prefix<a>/<b>` (depth 2), sorted."""
  found = {k for r in records for k in r
           if k.startswith(prefix) and k[len(prefix):].count('/') == depth - 1}
  return sorted(found)


# ---------------------------------------------------------------------------
# The figures, as panels.

_DASHES = ('--', ':', '-.')


def _smoothed(label: str, x: np.ndarray, y: np.ndarray, window: int,
              **style) -> list[Line]:
  """The raw values faintly, then their trailing mean."""
  color = style.get('color')
  lines = []
  if window > 1:
    lines.append(Line(None, x, y, {'lw': 0.6, 'alpha': 0.25,
                                   **({'color': color} if color else {})}))
  lines.append(Line(label, x, smooth(y, window), {'lw': 1.3, **style}))
  return lines


def _per_dataset(records: Records, prefix: str, window: int,
                 marker: bool = False) -> list[Line]:
  """`prefix<dataset>` solid and `prefix<dataset>/<subset>` dashed in the
  dataset's colour."""
  lines = []
  datasets = _keys(records, prefix, 1)
  colors = {k[len(prefix):]: f'C{i + 1}' for i, k in enumerate(datasets)}
  for key in datasets:
    name = key[len(prefix):]
    x, y = series(records, key)
    style = {'color': colors[name], 'lw': 1.3}
    if marker:
      lines.append(Line(name, x, y, {**style, 'marker': 'o', 'ms': 3}))
    else:
      lines.append(Line(name, x, smooth(y, window), style))
    subsets = [k for k in _keys(records, prefix, 2)
               if k.startswith(f'{prefix}{name}/')]
    for j, sub in enumerate(subsets):
      x, y = series(records, sub)
      style = {'color': colors[name], 'lw': 1.0,
               'ls': _DASHES[j % len(_DASHES)]}
      if marker:
        style.update(marker='.', ms=4)
      lines.append(Line(sub[len(prefix):], x,
                        y if marker else smooth(y, window), style))
  return lines


def reward_panels(records: Records, window: int) -> list[Panel]:
  """reward/mean, and reward/mean/<dataset>[/<subset>], smoothed."""
  x, y = series(records, 'reward/mean')
  if not x.size:
    return []
  lines = _smoothed('all', x, y, window, color='C0')
  lines += _per_dataset(records, 'reward/mean/', window)
  return [Panel(f'sampled reward ({window}-step mean)', 'reward',
                tuple(lines), unit_range=True)]


def prompts_panels(records: Records, window: int) -> list[Panel]:
  """Prompts generated vs groups used per step; the cumulative ratio."""
  x, generated = series(records, 'rollout/prompts_generated')
  if not x.size:
    return []
  lines = _smoothed('prompts generated', x, generated, window, color='C0')
  xu, used = series(records, 'rollout/groups_used')
  if xu.size:
    lines.append(Line('groups used (B when the batch fills)', xu, used,
                      {'color': 'k', 'lw': 1.0, 'ls': '--'}))
  panels = [Panel(f'prompts per step ({window}-step mean)', 'prompts',
                  tuple(lines))]
  xr, ratio = cumulative_ratio(records, 'generated/used')
  if xr.size:
    panels.append(Panel(
        'cumulative prompts generated / groups used', 'prompts per group',
        (Line(None, xr, ratio, {'color': 'C0', 'lw': 1.3}),),
        hlines=(('optimal', 1.0),)))
  return panels


def cumulative_ratio(records: Records,
                     which: str) -> tuple[np.ndarray, np.ndarray]:
  """Steps and the cumulative generated/used (or used/generated) ratio:
  from the run's running totals, else summed from the per-step counts."""
  steps, gen, used = [], [], []
  sum_gen = sum_used = 0.0
  for r in records:
    g = _value(r.get('rollout/prompts_generated'))
    u = _value(r.get('rollout/groups_used'))
    if g is None or u is None:
      continue
    sum_gen += g
    sum_used += u
    cg = _value(r.get('rollout/cum_prompts_generated'))
    cu = _value(r.get('rollout/cum_groups_used'))
    steps.append(r.get('step', len(steps)))
    gen.append(sum_gen if cg is None else cg)
    used.append(sum_used if cu is None else cu)
  num, den = ((gen, used) if which == 'generated/used' else (used, gen))
  num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
  with np.errstate(invalid='ignore', divide='ignore'):
    ratio = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
  return np.asarray(steps, np.float64), ratio


def efficiency_panels(records: Records, window: int) -> list[Panel]:
  """rollout/efficiency smoothed, and cumulative used / generated."""
  x, eff = series(records, 'rollout/efficiency')
  xc, cum = cumulative_ratio(records, 'used/generated')
  if not x.size and not xc.size:
    return []
  lines = _smoothed(f'per step ({window}-step mean)', x, eff, window,
                    color='C0') if x.size else []
  if xc.size:
    lines.append(Line('cumulative', xc, cum, {'color': 'C3', 'lw': 1.3}))
  return [Panel('efficiency: groups used / prompts generated', 'efficiency',
                tuple(lines), unit_range=True)]


def batch_share_panels(records: Records, window: int) -> list[Panel]:
  """data/batch_share/<dataset>, then its strata, one panel each."""
  prefix = 'data/batch_share/'
  datasets = _keys(records, prefix, 1)
  if not datasets:
    return []
  def line(key: str, **style) -> Line:
    x, y = series(records, key)
    return Line(key.rsplit('/', 1)[1], x, smooth(y, window), style)
  panels = [Panel(f'batch share per dataset ({window}-step mean)', 'share',
                  tuple(line(k, color=f'C{i + 1}', lw=1.3)
                        for i, k in enumerate(datasets)), unit_range=True)]
  for key in datasets:
    strata = [k for k in _keys(records, prefix, 2) if k.startswith(f'{key}/')]
    if strata:
      panels.append(Panel(
          f'{key[len(prefix):]}: batch share per stratum ({window}-step '
          'mean)', 'share', tuple(line(k, lw=1.2) for k in strata),
          unit_range=True))
  return panels


def sampler_panels(records: Records, window: int) -> list[Panel]:
  """data/snoozed, data/filtered and data/postponed per dataset."""
  del window  # Counts of a state, not per-step samples: drawn as they are.
  kinds = (('snoozed', '-'), ('filtered', '--'), ('postponed', ':'))
  names = sorted({k.split('/')[2] for kind, _ in kinds
                  for k in _keys(records, f'data/{kind}/', 1)})
  lines = []
  for i, name in enumerate(names):
    for kind, ls in kinds:
      x, y = series(records, f'data/{kind}/{name}')
      if x.size:
        lines.append(Line(f'{name} {kind}', x, y,
                          {'color': f'C{i + 1}', 'ls': ls, 'lw': 1.2}))
  if not lines:
    return []
  return [Panel('examples snoozed, filtered, postponed', 'examples',
                tuple(lines))]


def accuracy_panels(records: Records, window: int) -> list[Panel]:
  """eval/accuracy, and eval/accuracy/<dataset>[/<subset>]."""
  x, y = series(records, 'eval/accuracy')
  if not x.size:
    return []
  lines = [Line('all', x, y, {'color': 'C0', 'lw': 1.5, 'marker': 'o',
                              'ms': 4})]
  lines += _per_dataset(records, 'eval/accuracy/', window, marker=True)
  return [Panel('held-out accuracy (mean@k)', 'accuracy', tuple(lines),
                unit_range=True)]


FIGURES: dict[str, Callable[[Records, int], list[Panel]]] = {
    'reward': reward_panels,
    'prompts': prompts_panels,
    'efficiency': efficiency_panels,
    'batch_share': batch_share_panels,
    'snoozed_filtered': sampler_panels,
    'accuracy': accuracy_panels,
}


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


def draw(path: str, title: str, panels: Sequence[Panel]) -> None:
  """Writes the panels side by side as a PNG at `path`.

  Uses matplotlib's object API, not pyplot: no global backend is switched
  (a notebook's inline plots keep working) and nothing is left open.
  """
  # pylint: disable=g-import-not-at-top
  from matplotlib import figure as figure_lib
  from matplotlib import ticker
  # pylint: enable=g-import-not-at-top
  fig = figure_lib.Figure(figsize=(5.0 * len(panels), 3.4), dpi=90)
  axes = fig.subplots(1, len(panels), squeeze=False)[0]
  for ax, panel in zip(axes, panels):
    for line in panel.lines:
      ax.plot(line.x, line.y, label=line.label, **line.style)
    for label, y in panel.hlines:
      ax.axhline(y, color='gray', ls=':', lw=1.0, label=label)
    if panel.unit_range:
      ax.set_ylim(-0.03, 1.03)
    ax.set_title(panel.title, fontsize=9)
    ax.set_xlabel('step', fontsize=8)
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.set_ylabel(panel.ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    if any(line.label for line in panel.lines) or panel.hlines:
      ax.legend(fontsize=6)
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  tmp = path + '.tmp'
  fig.savefig(tmp, format='png')
  os.replace(tmp, path)


def plot_run(workdir: str, out: str | None = None, window: int = 20, *,
             log: Log = cli.print_line) -> list[str]:
  """Writes the PNG figures of a run's metrics (module docstring).

  Never raises: without matplotlib, without metrics.jsonl, or with too few
  records for a figure, fewer figures (or none) are written; what went
  wrong goes to `log`.

  Args:
    workdir: the run's workdir, holding metrics.jsonl.
    out: directory of the PNGs (default: WORKDIR/plots).
    window: steps in the trailing mean of per-step series.
    log: receives a line about each problem.

  Returns:
    The paths written.
  """
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
  window = max(1, int(window))
  name = os.path.basename(os.path.abspath(workdir).rstrip('/'))
  paths = []
  for figure, make_panels in FIGURES.items():
    # A plot must not fail the run that calls this at its end.
    try:
      panels = drawable(make_panels(records, window))
      if panels:
        path = os.path.join(out, f'{figure}.png')
        draw(path, f'{name}: {figure.replace("_", " ")}', panels)
        paths.append(path)
    except Exception as e:  # pylint: disable=broad-except
      log(f'plot {figure!r} failed: {type(e).__name__}: {e}')
  return paths


# ---------------------------------------------------------------------------
# TensorBoard.


def write_tensorboard(workdir: str) -> str | None:
  """Writes every scalar of metrics.jsonl as TensorBoard events.

  The events go to WORKDIR/tensorboard through clu's writers
  (`jaxgrpo.tensorboard`); event files there from before (an earlier call,
  or the training run's own) are replaced, so each step appears once.

  Returns:
    The event directory, or None when clu's summary writer cannot be
    imported (it needs tensorflow: `pip install 'jaxgrpo[tensorboard]'`).

  Raises:
    OSError: metrics.jsonl cannot be read or the directory written.
  """
  # Imported here: it imports etils, which `--help` does not need.
  from jaxgrpo import tensorboard  # pylint: disable=g-import-not-at-top
  return tensorboard.write_all(workdir, read_records(workdir))


# ---------------------------------------------------------------------------
# Command line.


def _parser() -> argparse.ArgumentParser:
  parser = cli.Parser(prog=PROG, description=__doc__.split('\n')[0])
  parser.add_argument('workdir', help='a run workdir (holds metrics.jsonl)')
  parser.add_argument('--out', default=None,
                      help='directory of the PNGs (default: WORKDIR/plots)')
  parser.add_argument('--window', type=int, default=20,
                      help='steps in the trailing mean of per-step series')
  parser.add_argument('--tensorboard', action='store_true',
                      help='also write every scalar as TensorBoard events '
                      'under WORKDIR/tensorboard')
  return parser


def main(argv: list[str] | None = None) -> int:
  """Runs the command line `argv` (default: sys.argv[1:]); the exit code."""
  argv = sys.argv[1:] if argv is None else list(argv)
  try:
    args = _parser().parse_args(argv)
  except cli.UsageError as e:
    return cli.fail(PROG, str(e), 2)
  if args.window < 1:
    return cli.fail(PROG, f'--window={args.window}: must be >= 1', 2)
  path = os.path.join(args.workdir, 'metrics.jsonl')
  if not os.path.isfile(path):
    return cli.fail(PROG, f'{path}: no such file (WORKDIR is a run workdir: '
                    'where the run wrote metrics.jsonl)', 1)
  failed = []  # one error line each
  paths = plot_run(args.workdir, args.out, args.window, log=failed.append)
  for p in paths:
    print(p, flush=True)
  if not paths and not failed:
    failed.append(f'{path} holds no metrics to plot')
  if args.tensorboard:
    try:
      logdir = write_tensorboard(args.workdir)
    except OSError as e:
      return cli.fail(PROG, f'tensorboard: {e}', 1)
    if logdir is None:
      failed.append('--tensorboard needs tensorflow and tensorboard '
                    f'(clu writes the events with them): {INSTALL_TENSORBOARD}')
    else:
      print(f'{logdir} (tensorboard --logdir {logdir})', flush=True)
  for line in failed:
    cli.fail(PROG, line, 1)
  return 1 if failed else 0


if __name__ == '__main__':
  sys.exit(main())
