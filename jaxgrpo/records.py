"""What the writers and the readers of a run's metrics records share.

`jaxgrpo.reporting.metrics` writes the records (and, through `jaxgrpo.reporting.tensorboard`,
their TensorBoard events); `jaxgrpo.reporting.plot_panels` reads them back. Both use
these helpers, which import nothing of jaxgrpo, so that neither side has to
import the other.
"""

import json


def is_remote(path: str) -> bool:
  """Whether `path` names an object store location (`gs://...`)."""
  return '://' in str(path)


def run_started(workdir: str) -> bool:
  """Whether a run has started in `workdir` (a folder or an object store
  location): it takes its lock and makes checkpoints/ before it writes its
  first metrics line."""
  # Here, not at the top: `jaxgrpo-plot --help` needs no etils.
  from etils import epath  # pylint: disable=g-import-not-at-top
  root = epath.Path(workdir)
  return any((root / name).exists() for name in ('.lock', 'checkpoints'))


def as_float(v: object) -> float | None:
  """A recorded scalar as a float ('nan' and 'inf' strings included)."""
  if isinstance(v, bool) or not isinstance(v, (int, float, str)):
    return None
  try:
    return float(v)
  except (ValueError, OverflowError):  # an integer past float's range too
    return None


def record(line: str) -> dict | None:
  """A metrics line's record; None for a line that is not a JSON object
  (cut short by a crash or a live write, or damaged). A UTF-8 byte order
  mark before it (the first line of a file saved by a Windows editor) is
  no part of the line."""
  try:
    value = json.loads(line.removeprefix('\ufeff'))
  except (ValueError, RecursionError):  # an integer of 5,000 digits too
    return None
  return value if isinstance(value, dict) else None
