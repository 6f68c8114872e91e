"""What each figure of `jaxgrpo-plot` shows, computed from metrics records.

A figure is a list of panels; a panel holds curves (`Line`), reference lines
and a title, computed here from a run's `metrics.jsonl` records without
matplotlib (`jaxgrpo.reporting.plot` draws them). `FIGURES` names every figure and the
function that makes its panels; a figure whose metrics a run did not record
comes out empty and is skipped.
"""

from collections.abc import Callable, Sequence
import colorsys
import dataclasses
import os

import numpy as np

from jaxgrpo.records import as_float, record

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
  unit_range: bool = False  # shares or rates: drawn on [0, 1] (or above)


# ---------------------------------------------------------------------------
# Reading the records.


def read_records(workdir: str) -> list[dict]:
  """The run's metrics records; a line cut short (a live run, a crash) or
  that is no JSON object is left out.

  Raises:
    OSError: WORKDIR/metrics.jsonl cannot be read.
  """
  # Imported here: jaxgrpo.reporting.metrics imports clu and jax, which `--help` and
  # a missing workdir do not need.
  # pylint: disable-next=g-import-not-at-top
  from jaxgrpo.reporting import metrics as metrics_lib
  try:
    return metrics_lib.read_metrics(workdir)
  except ValueError:  # a damaged line: the others are drawn
    pass
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8',
            errors='replace') as f:
    return [r for r in map(record, f) if r is not None]


def series(records: Records, key: str) -> tuple[np.ndarray, np.ndarray]:
  """(steps, values) of the records holding `key`."""
  pairs = [(r.get('step', i), as_float(r[key])) for i, r in enumerate(records)
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
  """Keys `prefix<a>` (depth 1) or `prefix<a>/<b>` (depth 2), sorted; <b>
  may hold '/' (a subset label such as verl's `data_source`,
  'openai/gsm8k')."""
  found = {k for r in records for k in r if k.startswith(prefix)
           and ('/' in k[len(prefix):]) == (depth == 2)}
  return sorted(found)


# ---------------------------------------------------------------------------
# The figures, as panels.

_DASHES = ('--', ':', '-.')
# Datasets' colours past nine: matplotlib's 'tab20' without its two blues
# ('C0' draws the overall curve), then evenly spaced hues.
_TAB20 = ('#ff7f0e', '#ffbb78', '#2ca02c', '#98df8a', '#d62728', '#ff9896',
          '#9467bd', '#c5b0d5', '#8c564b', '#c49c94', '#e377c2', '#f7b6d2',
          '#7f7f7f', '#c7c7c7', '#bcbd22', '#dbdb8d', '#17becf', '#9edae5')


def dataset_colors(n: int) -> list[str]:
  """`n` distinct colours, none 'C0': 'C1'..'C9' for up to nine datasets
  (matplotlib's 'CN' colours repeat after ten: a tenth dataset was drawn in
  the overall curve's colour); more take other palettes."""
  if n <= 9:
    return [f'C{i + 1}' for i in range(n)]
  if n <= len(_TAB20):
    return list(_TAB20[:n])
  return ['#%02x%02x%02x' % tuple(round(255 * c) for c in colorsys.hsv_to_rgb(
      i / n, 0.8, 0.9 if i % 2 else 0.6)) for i in range(n)]


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
  colors = dict(zip((k[len(prefix):] for k in datasets),
                    dataset_colors(len(datasets))))
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


def _counts(records: Records) -> tuple[list, np.ndarray, np.ndarray, tuple]:
  """Steps, prompts generated and groups used, of the records holding
  both, and the run's running totals of each (None where not recorded)."""
  steps, gen, used, cum_gen, cum_used = [], [], [], [], []
  for r in records:
    g = as_float(r.get('rollout/prompts_generated'))
    u = as_float(r.get('rollout/groups_used'))
    if g is None or u is None:
      continue
    steps.append(r.get('step', len(steps)))
    gen.append(g)
    used.append(u)
    cum_gen.append(as_float(r.get('rollout/cum_prompts_generated')))
    cum_used.append(as_float(r.get('rollout/cum_groups_used')))
  return steps, np.asarray(gen, np.float64), np.asarray(used, np.float64), (
      cum_gen, cum_used)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
  with np.errstate(invalid='ignore', divide='ignore'):
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def cumulative_ratio(records: Records,
                     which: str) -> tuple[np.ndarray, np.ndarray]:
  """Steps and the cumulative generated/used (or used/generated) ratio:
  from the run's running totals, else summed from the per-step counts."""
  steps, gen, used, (cum_gen, cum_used) = _counts(records)
  gen = [s if c is None else c for s, c in zip(np.cumsum(gen), cum_gen)]
  used = [s if c is None else c for s, c in zip(np.cumsum(used), cum_used)]
  num, den = ((gen, used) if which == 'generated/used' else (used, gen))
  return np.asarray(steps, np.float64), _ratio(
      np.asarray(num, np.float64), np.asarray(den, np.float64))


def window_efficiency(records: Records,
                      window: int) -> tuple[np.ndarray, np.ndarray]:
  """Steps and groups used / prompts generated over the trailing `window`
  steps: a ratio of sums, as the console line and the summary have it. A
  step's own ratio (`rollout/efficiency`) is 1 when it trained on carried
  groups alone (0 / 0), and above 1 when it used more than it generated;
  a mean of those misstates what the generation bought."""
  steps, gen, used, _ = _counts(records)
  window = max(window, 1)
  sums = lambda y: np.convolve(y, np.ones(window))[:len(y)] if y.size else y
  return np.asarray(steps, np.float64), _ratio(sums(used), sums(gen))


def efficiency_panels(records: Records, window: int) -> list[Panel]:
  """Groups used / prompts generated: per step (where it generated),
  over trailing windows of steps, and cumulative."""
  x, eff = window_efficiency(records, 1)
  xw, windowed = window_efficiency(records, window)
  xc, cum = cumulative_ratio(records, 'used/generated')
  if not x.size:
    return []
  lines = [Line(f'{window}-step windows', xw, windowed,
                {'lw': 1.3, 'color': 'C0'}),
           Line('cumulative', xc, cum, {'color': 'C3', 'lw': 1.3})]
  if window > 1:
    lines.insert(0, Line(None, x, eff, {'lw': 0.6, 'alpha': 0.25,
                                        'color': 'C0'}))
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
                  tuple(line(k, color=c, lw=1.3) for k, c in zip(
                      datasets, dataset_colors(len(datasets)))),
                  unit_range=True)]
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
  for name, color in zip(names, dataset_colors(len(names))):
    for kind, ls in kinds:
      x, y = series(records, f'data/{kind}/{name}')
      if x.size:
        lines.append(Line(f'{name} {kind}', x, y,
                          {'color': color, 'ls': ls, 'lw': 1.2}))
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
