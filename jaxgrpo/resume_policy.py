"""Which settings may change when a run resumes (`check`, `check_settings`).

A checkpoint holds the resolved config it was written with. A resume
compares it with this run's, key by key, under `POLICY`:

- 'refuse': the key shapes the saved state (carried groups, the sampler's
  tables, the optimizer state) or what the run means (how prompts are
  drawn, sampled and scored into advantages); a change stops the resume
  with a line naming the key, both values and what to do.
- 'notice': a deliberate adjustment of a run (a lower learning rate after
  NaN steps, mixture weights); accepted, with a line saying what changes.
- 'free': how long, how often, where and how fast the run goes (steps,
  logging, evaluation, checkpoints, verifier workers, the mesh); accepted
  silently.

The longest key prefix listed decides; a key listed nowhere is refused, so
that a new setting is checked until it is declared safe. A key the
checkpoint lacks is a setting added since it was written: its run ran with
the setting's default (settings are added with defaults that keep the
earlier behaviour), so it counts as holding that default (`_Default`); a
key only the checkpoint holds (a setting since removed) is skipped. A
setting that only one mode reads is free while that mode is off on both
sides (`USED_ONLY_WHEN`). Dataset entries are matched by name; what their
records are (path, kind, fields, size) is checked by their size and
fingerprint (`checkpoint.check_resumable`), so those keys are free here.
docs/checkpoints.md has the same table.
"""

from collections.abc import Iterator, Mapping
import dataclasses
import functools
import os
from typing import Any

import orbax.checkpoint as ocp

from jaxgrpo import checkpoint as checkpoint_lib
from jaxgrpo import config_lib
from jaxgrpo import errors
from jaxgrpo.data import entry as entry_lib
from jaxgrpo.model import pretrained

REFUSE, NOTICE, FREE = 'refuse', 'notice', 'free'

POLICY = {
    'seed': REFUSE,
    'total_steps': FREE,
    'log_every': FREE,
    'plots': FREE,
    'tensorboard': FREE,
    'model': REFUSE,
    'model.remat': FREE,
    'data.balance': REFUSE,
    'data.datasets[]': FREE,
    'data.datasets[].weight': NOTICE,
    'data.datasets[].min_fraction': NOTICE,
    'data.datasets[].snooze_factor': REFUSE,
    'data.datasets[].verifier': NOTICE,
    'rollout': REFUSE,
    'rollout.train_lengths': FREE,
    'sampler': REFUSE,
    'rl': REFUSE,
    'rl.max_nonfinite_steps': FREE,
    'optim': NOTICE,
    'warmstart': FREE,
    'eval': FREE,
    'checkpoint': FREE,
    'verify': FREE,
    'curriculum': REFUSE,
    'curriculum.stages': NOTICE,
    'mesh': FREE,
    'distributed': FREE,
}

# A checkpoint of step 0 is a start point (a shared warm start, say): no
# GRPO step taken, no groups carried, the sampler's tables untouched. The
# data side may then change freely (policies compared from one start);
# the model, the seed and the objective may not.
FREE_AT_START = ('sampler', 'rollout', 'data', 'curriculum')

# Settings that only one mode reads: while the mode is off in both the
# checkpoint's config and this run's, a change computes nothing different
# and is free. (The mode itself is a 'refuse' key.) A setting that two
# modes read lists both, and is free while each is off on both sides.
_SNOOZING = ('snooze', 'snooze_prob')
# The Beta prior of a prompt's pass rate: the `weighted` policy offers by
# it, and adaptive round sizes are sized by it under every policy.
_PRIOR = (('sampler', 'policy', ('weighted',)),
          ('rollout', 'round_size', ('adaptive',)))
USED_ONLY_WHEN = {
    'rollout.slots': ('rollout', 'engine', ('continuous',)),
    'rollout.verify_overlap': ('rollout', 'collect', ('streaming',)),
    'rollout.max_staleness': ('rollout', 'in_flight', ('keep',)),
    'rollout.max_round_size': ('rollout', 'round_size', ('adaptive',)),
    'sampler.w_min': ('sampler', 'policy', ('weighted',)),
    'sampler.snooze_factor': ('sampler', 'policy', _SNOOZING),
    'sampler.prior_mean': _PRIOR,
    'sampler.prior_strength': _PRIOR,
    'data.datasets[].snooze_factor': ('sampler', 'policy', _SNOOZING),
}

# What a resume with a changed 'notice' key does (longest listed prefix).
_EFFECT = {
    'optim': 'the optimizer steps from here on use the new values',
    'data': 'the mixture draws by the new values from here on',
    'data.datasets[].verifier': ('completions are scored by the new verifier '
                                 'from here on'),
    'curriculum': 'the new stages apply from here on',
    # Free, but under a cosine schedule it moves the learning rate.
    'total_steps': 'the cosine learning-rate schedule spans the new total',
}


class _Default:
  """The value of a key a checkpoint lacks: the default of a setting added
  after it was written, which its run ran with."""

  def __init__(self, value: Any):
    self.value = value


@functools.cache
def _defaults() -> dict[str, Any]:
  """Every setting's default as a checkpoint saves it, by generic flat key
  (`rl.cut_completions`, `data.datasets[].on_bad_record`); a dataset
  entry's required keys (`name`, `kind`) have none. Read once: the schema's
  defaults do not change while the process runs (callers do not mutate it)."""
  out = {key: value for key, value, _, _ in config_lib.settings()
         if key != 'data.datasets'}
  for key, value, _, _ in config_lib.settings(entry_lib.DatasetSection):
    if value is not dataclasses.MISSING:
      out[f'data.datasets[].{key}'] = value
  return checkpoint_lib.as_saved(out)


def _generic(key: str) -> str:
  """A flat key with its dataset entry's index left out
  (`data.datasets[2].weight` -> `data.datasets[].weight`)."""
  if key.startswith('data.datasets['):
    return 'data.datasets[]' + key[key.index(']') + 1:]
  return key


def _longest(table: Mapping[str, str], key: str, default: str) -> str:
  """The entry of `table` for the longest listed prefix of flat key `key`
  (`rollout.group_size`, `data.datasets[2].weight`)."""
  parts = _generic(key).split('.')
  for n in range(len(parts), 0, -1):
    found = table.get('.'.join(parts[:n]))
    if found is not None:
      return found
  return default


def policy(key: str) -> str:
  """The policy of a flat key: that of its longest listed prefix."""
  return _longest(POLICY, key, REFUSE)


def _unused(key: str, *configs: Mapping[str, Any]) -> bool:
  """Whether no config of `configs` reads `key` (`USED_ONLY_WHEN`); a
  config without the mode's key (one written before the mode existed) ran
  with the mode's default."""
  generic = _generic(key)
  if generic not in USED_ONLY_WHEN:
    return False
  modes = USED_ONLY_WHEN[generic]
  if isinstance(modes[0], str):  # one mode
    modes = (modes,)
  defaults = _defaults()
  return all(
      c.get(section, {}).get(mode, defaults[f'{section}.{mode}']) not in values
      for section, mode, values in modes for c in configs)


def _flat(config: Mapping[str, Any],
          names: list[str]) -> Iterator[tuple[str, Any]]:
  """(flat key, value) pairs; dataset entries keyed by their index in
  `names` (this run's datasets), or by name when absent from it."""
  for key, value in config.items():
    if key == 'data':
      for sub, v in value.items():
        if sub != 'datasets':
          yield f'data.{sub}', v
      for entry in value.get('datasets', []):
        name = entry.get('name')
        where = names.index(name) if name in names else repr(name)
        for sub, v in entry.items():
          yield f'data.datasets[{where}].{sub}', v
    elif isinstance(value, Mapping):
      yield from _nested(key, value)
    else:
      yield key, value


def _nested(prefix: str, section: Mapping[str, Any]
            ) -> Iterator[tuple[str, Any]]:
  """A section's flat keys, those of its subsections (model.lora) too."""
  for key, value in section.items():
    if isinstance(value, Mapping):
      yield from _nested(f'{prefix}.{key}', value)
    else:
      yield f'{prefix}.{key}', value


def _absolute_model_path(config: dict[str, Any]) -> dict[str, Any]:
  """`config` with its model.path absolute, as runs save it now (earlier
  ones saved a relative path as given, resolved from the current folder)."""
  model = config.get('model')
  if isinstance(model, Mapping) and isinstance(model.get('path'), str):
    config['model'] = {**model, 'path': pretrained.absolute(model['path'])}
  return config


def changes(saved: Mapping[str, Any],
            now: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
  """(key, saved value, this run's value) of every key whose value
  differs. A key the checkpoint lacks (a setting added since) counts as its
  default, given as a `_Default`; one without a default, or that this run
  lacks (a setting since removed), is skipped, and so are datasets only one
  side has (`check_resumable` decides on those)."""
  saved = _absolute_model_path(checkpoint_lib.as_saved(dict(saved)))
  now = checkpoint_lib.as_saved(dict(now))
  names = [d.get('name') for d in now.get('data', {}).get('datasets', [])]
  saved_names = {d.get('name')
                 for d in saved.get('data', {}).get('datasets', [])}
  # The key prefixes of this run's dataset entries the checkpoint has.
  kept = tuple(f'data.datasets[{i}].' for i, name in enumerate(names)
               if name in saved_names)
  then, defaults = dict(_flat(saved, names)), _defaults()
  out = []
  for key, value in _flat(now, names):
    if key in then:
      if then[key] != value:
        out.append((key, then[key], value))
    elif (default := defaults.get(_generic(key), value)) != value and (
        not key.startswith('data.datasets[') or key.startswith(kept)):
      out.append((key, _Default(default), value))
  return out


def _reordered(saved: Mapping[str, Any], now: Mapping[str, Any],
               step: int) -> list[str]:
  """The notice of datasets listed in another order: state is matched by
  name, but the mixture draws over its datasets in list order."""
  order = lambda config: [d.get('name') for d in config.get('data', {}).get(
      'datasets', [])]
  then, here = order(saved), order(now)
  both = set(then) & set(here)  # the order of the datasets on both sides
  then, here = [n for n in then if n in both], [n for n in here if n in both]
  if then == here:
    return []
  return [f'resumed with data.datasets in another order, {then} -> {here}: '
          'each keeps its sampler state (matched by name), but the mixture '
          'draws over the datasets in list order, so the draws differ from '
          f'a run in the old order (step {step + 1} on)']


def _show(key: str, a: Any, b: Any) -> str:
  def short(v):
    if isinstance(v, _Default):
      return f'(not saved: {short(v.value)}, its default)'
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + '...'
  return f'{key}: {short(a)} -> {short(b)}'


def check(saved: Mapping[str, Any] | None, now: Mapping[str, Any], *,
          where: str, step: int) -> list[str]:
  """Checks this run's config `now` against the checkpoint's `saved`.

  Args:
    saved: the config the checkpoint was written with (None in checkpoints
      older than this check: nothing is compared).
    now: this run's config (`config_lib.to_dict`).
    where: the checkpoint, for the message.
    step: its step, for the notice.

  Returns:
    Lines to show for the accepted 'notice' changes (none if nothing of
    note changed).

  Raises:
    ResumeError: a 'refuse' key changed; the message names the keys.
  """
  if not saved:
    return []
  found = changes(saved, now)
  if step == 0:
    found = [c for c in found if c[0].split('.')[0] not in FREE_AT_START]
  found = [c for c in found if not _unused(c[0], saved, now)]
  refused = sorted((c for c in found if policy(c[0]) == REFUSE),
                   key=lambda c: not c[0].startswith('model.'))
  if refused:
    shown = '; '.join(_show(*c) for c in refused[:3])
    more = f' (and {len(refused) - 3} more)' if len(refused) > 3 else ''
    note = ''
    if any(isinstance(c[1], _Default) for c in refused[:3]):
      note = (' (a value not saved is the default of a setting added after '
              'the checkpoint was written: its run was trained with it)')
    if refused[0][0].startswith('model.'):
      raise errors.ResumeError(
          f'the {where} is for another model ({shown}{more}){note}; use a new '
          '--workdir or the config it was trained with')
    raise errors.ResumeError(
        f'the {where} was trained with other settings: {shown}{more}{note}; '
        'these cannot change on resume (docs/checkpoints.md, "What may change '
        'on resume"): use the values it was trained with, or a new --workdir')
  lines = [] if step == 0 else _reordered(saved, now, step)
  cosine = now.get('optim', {}).get('schedule') == 'cosine'
  for key, a, b in found:
    if policy(key) == NOTICE or (key == 'total_steps' and cosine):
      effect = _longest(_EFFECT, key, '')
      lines.append(f'resumed with a changed setting, {_show(key, a, b)}: '
                   f'{effect} (step {step + 1} on)')
  return lines


def check_settings(directory: str, config: Mapping[str, Any]) -> None:
  """Refuses, before the run is built, a resume with changed settings that
  `check` does not allow: this run's `config` against that of the
  newest checkpoint in `directory` whose JSON item reads (cheap: nothing
  else is read). Nothing to check without a checkpoint.

  Raises:
    ResumeError: naming the keys that cannot change.
  """
  directory = checkpoint_lib.absolute(directory)
  if not os.path.isdir(directory) and '://' not in directory:
    return
  manager = checkpoint_lib.reader(directory)
  try:
    for step in sorted(manager.all_steps(), reverse=True):
      try:
        meta = manager.restore(
            step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
      except Exception:  # pylint: disable=broad-except
        continue  # damaged: restore_or_start sets it aside or says so
      check(
          meta.get('config'), config,
          where=f'checkpoint of step {step} in {directory}', step=step)
      return
  finally:
    manager.close()
