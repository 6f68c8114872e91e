"""Small PNG figures of simulated runs (matplotlib, Agg backend)."""

from collections.abc import Mapping, Sequence
import dataclasses

from jaxgrpo.reporting import plot_panels


@dataclasses.dataclass(frozen=True)
class Panel:
  """One subplot: named series over a shared x, optional reference lines.

  Attributes:
    title: the subplot's title.
    xlabel: x-axis label.
    ylabel: y-axis label.
    series: label -> (x, y).
    hlines: label -> y of a dashed horizontal reference line.
    logx: log-scale x axis.
    logy: log-scale y axis.
  """

  title: str
  xlabel: str
  ylabel: str
  series: Mapping[str, tuple[Sequence[float], Sequence[float]]]
  hlines: Mapping[str, float] = dataclasses.field(default_factory=dict)
  logx: bool = False
  logy: bool = False


def _import_pyplot():
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError(
        'plots need matplotlib: pip install "jaxgrpo[plots]"') from None
  matplotlib.use('Agg')
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  return pyplot


# Trailing moving average (shorter at the start), NaNs left out: the
# trainer's plots smooth the same way.
smooth = plot_panels.smooth


def save(path: str, title: str, panels: Sequence[Panel]) -> None:
  """Draws the panels side by side and writes a small PNG to `path`."""
  plt = _import_pyplot()
  fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.2),
                           dpi=72, squeeze=False)
  for ax, panel in zip(axes[0], panels):
    for label, (x, y) in panel.series.items():
      ax.plot(x, y, label=label, lw=1.2)
    for k, (label, y) in enumerate(panel.hlines.items()):
      ax.axhline(y, ls=('--', ':', '-.')[k % 3], lw=1.0,
                 color=('gray', 'black')[k % 2], label=label)
    if panel.logx:
      ax.set_xscale('log')
    if panel.logy:
      ax.set_yscale('log')
    ax.set_title(panel.title, fontsize=9)
    ax.set_xlabel(panel.xlabel, fontsize=8)
    ax.set_ylabel(panel.ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
