"""Shared config pieces: argument parsing and the default sections."""

import ml_collections

from jaxgrpo import config_lib


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """Parses `'model=demo,runlocal'` style config arguments.

  Each default's type decides how its value is read; a bare name sets a bool
  default to True. Unknown names are an error, so typos do not pass silently.

  Args:
    arg: the text after ':' in `--config=file.py:arg`, or None.
    **defaults: names and default values.

  Returns:
    A ConfigDict with every default, overridden by `arg`.
  """
  out = ml_collections.ConfigDict(defaults)
  for part in filter(None, (arg or '').split(',')):
    name, sep, value = part.partition('=')
    if name not in defaults:
      raise ValueError(
          f'config argument {name!r} is not one of {sorted(defaults)}'
      )
    kind = type(defaults[name])
    if kind is bool:
      out[name] = (not sep) or value.lower() in ('1', 'true', 'yes')
    else:
      out[name] = kind(value)
  return out


def arithmetic_dataset(name: str = 'arithmetic', **keys) -> dict:
  """A `data.datasets` entry for the built-in arithmetic task.

  Keys left out take their defaults (docs/configuration.md): 1-3 digit
  addition, 20,000 training and 256 held-out problems, weight 1.
  """
  return dict(name=name, kind='arithmetic', **keys)


def shrink_for_runlocal(c: ml_collections.ConfigDict) -> None:
  """Shrinks a config in place to a 2-step CPU smoke run."""
  c.total_steps = 2
  c.log_every = 1
  for entry in c.data.datasets:
    if entry.get('kind') == 'arithmetic':
      entry['num_train'] = min(entry.get('num_train', 256), 256)
    entry['num_eval'] = min(entry.get('num_eval', 16), 16)
  c.rollout.batch_size = 4
  c.rollout.group_size = 4
  c.rollout.round_size = 4
  c.rollout.max_rounds = 2
  c.warmstart.max_steps = 20
  c.warmstart.check_every = 10
  c.warmstart.check_examples = 8
  c.eval.every = 2
  c.eval.num_samples = 1
  c.checkpoint.every = 2


def base_config() -> ml_collections.ConfigDict:
  """Every section with its defaults (the schema of jaxgrpo/config_lib.py);
  experiment files override parts."""
  return config_lib.base_config()
