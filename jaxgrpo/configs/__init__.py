"""Experiment configs: each file's `get_config(arg)` returns a ConfigDict.

`--config=configs/NAME.py[:ARG]` names one (from a clone, `configs/` links
here; from anywhere else, the command line finds the shipped file), and
`common.base_config()` holds every key with its default.
"""

import os


def shared_data(*parts: str) -> str:
  """A path in the shared data directory (GSM8K, SQuAD 2.0) that sits beside
  the repository as `../shared/data`: beside the clone this package runs
  from, else beside the working directory; the first when neither has it."""
  repo = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  paths = [os.path.normpath(os.path.join(root, '..', 'shared', 'data', *parts))
           for root in (repo, os.getcwd())]
  return next((p for p in paths if os.path.exists(p)), paths[0])
