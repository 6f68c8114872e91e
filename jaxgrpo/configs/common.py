"""Shared config pieces: the default config, arguments and datasets."""

import ml_collections

from jaxgrpo import config_lib

# Every setting's default, from the schema (config_lib); configs edit parts.
base_config = config_lib.base_config
_BOOLS = ('true', '1', 'yes', 'on', 'false', '0', 'no', 'off')  # 4 true


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """Parses `'model=demo,runlocal'`, the text after ':' in
  `--config=file.py:arg`, into a ConfigDict of `defaults` overridden.

  Each default's type decides how its value is read; a bare name sets a bool
  default to True. Unknown names are an error, so typos do not pass silently.
  """
  out = ml_collections.ConfigDict(defaults)
  for part in filter(None, (arg or '').split(',')):
    name, sep, value = part.partition('=')
    if name not in defaults:
      raise ValueError(
          f'config argument {name!r} is not one of {sorted(defaults)}')
    kind = str if defaults[name] is None else type(defaults[name])  # a path
    try:
      if kind is bool and sep and value.lower() not in _BOOLS:
        raise ValueError
      out[name] = ((not sep or value.lower() in _BOOLS[:4]) if kind is bool
                   else kind(value))
    except ValueError:
      raise ValueError(f'config argument {name}={value!r}: {name} takes ' + (
          '/'.join(_BOOLS) if kind is bool
          else {int: 'an int'}.get(kind, f'a {kind.__name__}'))) from None
  return out


def arithmetic_dataset(name: str = 'arithmetic', **keys) -> dict:
  """A `data.datasets` entry for the built-in arithmetic task; keys left out
  take their defaults (docs/configuration.md): 1-3 digit addition, 20,000
  training and 256 held-out problems, weight 1."""
  return dict(name=name, kind='arithmetic', **keys)


def shrink_for_runlocal(c: ml_collections.ConfigDict) -> None:
  """Shrinks a config in place to a 2-step CPU smoke run."""
  c.update(total_steps=2, log_every=1)
  for entry in c.data.datasets:
    if entry.get('kind') == 'arithmetic':
      entry['num_train'] = min(entry.get('num_train', 256), 256)
    entry['num_eval'] = min(entry.get('num_eval', 16), 16)
  c.rollout.update(batch_size=4, group_size=4, round_size=4, max_rounds=2)
  c.warmstart.update(max_steps=20, check_every=10, check_examples=8)
  c.eval.update(every=2, num_samples=1)
  c.checkpoint.every = 2
