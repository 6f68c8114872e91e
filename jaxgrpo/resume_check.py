"""Which settings may change when a run resumes from its checkpoint.

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
that a new setting is checked until it is declared safe. Dataset entries
are matched by name; what their records are (path, kind, fields, size) is
checked by their size and fingerprint (`checkpoint.check_resumable`), so
those keys are free here. docs/checkpoints.md has the same table.
"""

from collections.abc import Iterator, Mapping
import json
from typing import Any

from jaxgrpo import errors

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

# What a resume with a changed 'notice' key does, by section.
_EFFECT = {
    'optim': 'the optimizer steps from here on use the new values',
    'data': 'the mixture draws by the new values from here on',
    'curriculum': 'the new stages apply from here on',
}


def policy(key: str) -> str:
  """The policy of a flat key (`rollout.group_size`,
  `data.datasets[2].weight`): that of its longest listed prefix."""
  generic = key
  if key.startswith('data.datasets['):
    generic = 'data.datasets[]' + key[key.index(']') + 1:]
  parts = generic.split('.')
  for n in range(len(parts), 0, -1):
    found = POLICY.get('.'.join(parts[:n]))
    if found is not None:
      return found
  return REFUSE


def _plain(value: Any) -> Any:
  """The value as the checkpoint's JSON holds it (tuples become lists)."""
  return json.loads(json.dumps(value, default=str))


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
      for sub, v in value.items():
        yield f'{key}.{sub}', v
    else:
      yield key, value


def changes(saved: Mapping[str, Any],
            now: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
  """(key, saved value, this run's value) of every key whose value
  differs; keys one side lacks (a setting added since) are skipped, and so
  are datasets only one side has (`check_resumable` decides on those)."""
  saved, now = _plain(dict(saved)), _plain(dict(now))
  names = [d.get('name') for d in now.get('data', {}).get('datasets', [])]
  then = dict(_flat(saved, names))
  out = []
  for key, value in _flat(now, names):
    if key in then and then[key] != value:
      out.append((key, then[key], value))
  return out


def _show(key: str, a: Any, b: Any) -> str:
  def short(v):
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
  refused = sorted((c for c in found if policy(c[0]) == REFUSE),
                   key=lambda c: not c[0].startswith('model.'))
  if refused:
    shown = '; '.join(_show(*c) for c in refused[:3])
    more = f' (and {len(refused) - 3} more)' if len(refused) > 3 else ''
    if refused[0][0].startswith('model.'):
      raise errors.ResumeError(
          f'the {where} is for another model ({shown}{more}); use a new '
          '--workdir or the config it was trained with')
    raise errors.ResumeError(
        f'the {where} was trained with other settings: {shown}{more}; these '
        'cannot change on resume (docs/checkpoints.md, "What may change on '
        'resume"): use the values it was trained with, or a new --workdir')
  lines = []
  for key, a, b in found:
    if policy(key) == NOTICE:
      effect = _EFFECT[key.split('.')[0]]
      lines.append(f'resumed with a changed setting, {_show(key, a, b)}: '
                   f'{effect} (step {step + 1} on)')
  return lines
