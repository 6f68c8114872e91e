"""What every benchmark writes beside its figures: the commit it measured,
and its JSON file."""

import json
import os
import subprocess


def commit() -> str:
  """The short hash of the checkout the benchmark runs from."""
  return subprocess.run(['git', 'rev-parse', '--short', 'HEAD'],
                        capture_output=True, text=True,
                        cwd=os.path.dirname(os.path.abspath(__file__))
                        ).stdout.strip()


def write_json(path: str, result: dict, indent: int | None = 1) -> None:
  """Writes `result` to `path`, making its folder. The file is replaced
  whole, so a run stopped while writing leaves the last complete one.
  `indent=None` writes it on one line (long raw records)."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path + '.tmp', 'w') as f:
    json.dump(result, f, indent=indent)
  os.replace(path + '.tmp', path)
