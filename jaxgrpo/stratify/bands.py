"""Difficulty strata: pass rates split into too hard, bands and too easy.

An example that no sampled completion solved (pass rate 0) is 'too_hard',
one that every completion solved (pass rate 1) is 'too_easy'; the others
fall in the band [lo, hi) of the edges that holds their rate. With edges
(0.25, 0.5, 0.75) the strata are

    too_hard, 0-0.25, 0.25-0.5, 0.5-0.75, 0.75-1, too_easy

where '0-0.25' holds rates in (0, 0.25) and '0.75-1' rates in [0.75, 1).
"""

from collections.abc import Sequence

import numpy as np

TOO_HARD = 'too_hard'
TOO_EASY = 'too_easy'
DEFAULT_EDGES = (0.25, 0.5, 0.75)


def check_edges(edges: Sequence[float]) -> tuple[float, ...]:
  """The edges as floats, checked.

  Raises:
    ValueError: an edge is not inside (0, 1), the edges do not strictly
      increase, or two are too close to name their strata apart.
  """
  out = tuple(float(e) for e in edges)
  for e in out:
    if not 0.0 < e < 1.0:
      raise ValueError(f'band edges {out}: {e:g} is not inside (0, 1)')
  if any(a >= b for a, b in zip(out, out[1:])):
    raise ValueError(f'band edges {out} must strictly increase')
  for a, b in zip(out, out[1:]):
    if f'{a:g}' == f'{b:g}':  # the names show 6 significant digits
      raise ValueError(f'band edges {out}: {a!r} and {b!r} would give two '
                       f'strata the same name ({a:g}); make them differ in '
                       'the first 6 significant digits')
  return out


def stratum_names(edges: Sequence[float]) -> list[str]:
  """['too_hard', one 'lo-hi' name per band over [0, *edges, 1], 'too_easy'].

  Args:
    edges: band edges strictly increasing inside (0, 1); () gives the one
      band '0-1'.

  Raises:
    ValueError: bad edges (see `check_edges`).
  """
  bounds = (0.0, *check_edges(edges), 1.0)
  bands = [f'{lo:g}-{hi:g}' for lo, hi in zip(bounds, bounds[1:])]
  return [TOO_HARD, *bands, TOO_EASY]


def assign(pass_rate: np.ndarray, edges: Sequence[float]) -> np.ndarray:
  """Stratum of each pass rate, as an index into `stratum_names(edges)`.

  Args:
    pass_rate: [E] pass rates in [0, 1].
    edges: band edges (see `stratum_names`).

  Returns:
    [E] int64: 0 (too_hard) where the rate is 0, len(edges) + 2 (too_easy)
    where it is 1, else 1 + the band with lo <= rate < hi.

  Raises:
    ValueError: bad edges, or a rate outside [0, 1] (NaN included).
  """
  bounds = np.asarray(check_edges(edges), np.float64)
  rate = np.asarray(pass_rate, np.float64)
  bad = ~((rate >= 0.0) & (rate <= 1.0))
  if bad.any():
    raise ValueError(
        f'pass rates must lie in [0, 1]; got {rate[bad][0]!r} (at index '
        f'{int(np.flatnonzero(bad)[0])})')
  index = 1 + np.searchsorted(bounds, rate, side='right')
  index[rate == 0.0] = 0
  index[rate == 1.0] = len(bounds) + 2
  return index.astype(np.int64)
