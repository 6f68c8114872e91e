"""How a run resumes: from which checkpoint, and with which settings.

`restore_or_start` resumes from the newest checkpoint that restores,
setting damaged ones aside, and checks this run's settings against the
checkpoint's with `resume_policy.check` (`resume_policy.check_settings`
does so before the run is built).
"""

from collections.abc import Callable, Mapping
import dataclasses
from typing import Any

import numpy as np

from jaxgrpo import checkpoint as checkpoint_lib
from jaxgrpo import errors
from jaxgrpo import multihost
from jaxgrpo import resume_policy
from jaxgrpo import sharding
from jaxgrpo.data import curriculum
from jaxgrpo.data import formats
from jaxgrpo.model import lora
from jaxgrpo.typing import PyTree


@dataclasses.dataclass(frozen=True)
class Start:
  """Where a run starts: from its latest checkpoint, or from scratch.

  Attributes:
    resumed_from: the checkpoint's step, or None on a fresh start.
    state: the restored train state, or None on a fresh start.
    meta: the run notes to save with each checkpoint (this run's, over the
      checkpoint's when resumed).
  """

  resumed_from: int | None
  state: PyTree | None
  meta: dict[str, Any]

  @property
  def step(self) -> int:
    """The last step done (0 on a fresh start)."""
    return self.resumed_from or 0


def restore_or_start(
    ckpt: checkpoint_lib.Checkpointer,
    target_state: PyTree,
    shardings: PyTree,
    *,
    meta: Mapping[str, Any],
    source: Any,
    rollout: Any,
    ids: Mapping[str, Any] | None,
    remap: bool,
    notice: Callable[[str], None],
    workdir: str,
    main: bool = True,
) -> Start:
  """Resumes from the newest checkpoint in `ckpt` that restores, if any.

  Checks that it fits this run (`checkpoint.check_resumable`, and this run's config
  against the saved one per `check`), restores the train state into
  `target_state`'s structure and placement, and sets the state of the
  prompt `source` (a MixtureSampler; the tables of changed datasets
  matched by example id when `remap`) and of `rollout`.

  A checkpoint that cannot be read (files truncated or missing, metadata
  that does not parse, an item missing, an empty folder, arrays that
  differ from their saved checksums) is passed over
  for the next older one; once one restores, the newer ones are set aside
  as `<step>.damaged-<time>` (on the main process; nothing is deleted)
  and named in a notice. When none restores, nothing is renamed. Over
  several processes, all must choose the same checkpoint (or none), else
  ResumeError names each one's choice before anything is set aside.

  Args:
    ckpt: the run's checkpointer.
    target_state: the abstract train state, with its shardings.
    shardings: where the restored state goes (`sharding.shard`).
    meta: this run's notes; 'model', 'datasets' and 'config' are checked.
    source: the prompt sampler (`get_state`/`set_state`).
    rollout: the rollout (`set_state`).
    ids: this run's example id hashes per dataset (when `remap`).
    remap: checkpoint.on_dataset_change == 'remap'.
    notice: receives the lines that need attention.
    workdir: the run's workdir (for the message).
    main: whether this is the main process (which sets damaged ones aside).

  Returns:
    The start; its state is None when there is no checkpoint.

  Raises:
    ResumeError: the checkpoint does not fit this run, or none restores.
  """
  steps = ckpt.all_steps()
  damaged, start = [], None
  for step in steps:
    try:
      saved_meta = ckpt.read_meta(step)
    except Exception as e:  # pylint: disable=broad-except
      damaged.append((step, checkpoint_lib.describe_damage(e)))
      continue
    start = _resume(ckpt, step, saved_meta, target_state, shardings,
                    meta=meta, source=source, rollout=rollout, ids=ids,
                    remap=remap, notice=notice, damaged=damaged)
    if start is not None:
      break
  _check_same_choice(ckpt, -1 if not steps else start.step if start else -2)
  if not steps:
    return Start(resumed_from=None, state=None, meta=dict(meta))
  if start is None:
    folders = ', '.join(f'{s} ({why})' for s, why in damaged)
    raise errors.ResumeError(
        f'no checkpoint in {ckpt.directory} can be restored: {folders}; move '
        'those folders out of it to start this run again from step 0, or use '
        'a new --workdir')
  for step, why in damaged:
    aside = ckpt.set_aside(step) if main else f'{step}'
    notice(f'the checkpoint of step {step} is damaged ({why}); set aside as '
           f'{aside}')
  notice(f'resumed from {workdir} at step {start.step}')
  return start


def _check_same_choice(ckpt: checkpoint_lib.Checkpointer, mine: int) -> None:
  """Raises ResumeError unless every process chose the same checkpoint
  (`mine`: its step, -1 for none there, -2 for none that restores); a
  collective, before anything is set aside."""
  every = multihost.agree_on_step(mine)
  if len(set(every)) == 1:
    return
  said = {-1: 'no checkpoint, a fresh start', -2: 'none restores'}
  chose = ', '.join(f'process {p}: {said.get(v, f"step {v}")}'
                    for p, v in enumerate(every))
  raise errors.ResumeError(
      f'the processes disagree on the checkpoint to resume from in '
      f'{ckpt.directory} ({chose}): every process must reach the same '
      'workdir (a shared file system or gs://) and read the same files; '
      'nothing was set aside')


def _by_position(entry: Mapping[str, Any] | None) -> str:
  """What a changed file's positional ids or held-out split mean for the
  remapped state: '; ...' clauses for the notice, or ''."""
  if not entry or entry.get('kind') == 'arithmetic':
    return ''
  fmt = entry.get('format') or formats.default_format(
      entry.get('kind', ''), entry.get('tfds_name'))
  clauses = []
  if fmt == 'fields' and not entry.get('id_field'):
    clauses.append('its ids are record positions (no id_field): a record '
                   'that moved took the state of the one that was there; '
                   'set id_field for ids that follow the records')
  if entry.get('holdout'):
    clauses.append(f'holdout={entry["holdout"]} holds out records by '
                   'position: the held-out set may have changed too, and may '
                   'hold records trained on before')
  return ''.join(f'; {c}' for c in clauses)


def _restore_sampler(restored, source: Any, rollout: Any, changed: list[str],
                     gone: list[str], ids: Mapping[str, Any] | None,
                     where: str) -> tuple[dict[str, Any], int]:
  """Sets the sampler's and the rollout's saved state, remapping the
  `changed` datasets by id and dropping the `gone` ones; (the remap's
  report, groups dropped)."""
  saved_ids = restored.data.get('ids', {})
  for name in changed:
    if name in restored.data['source']['tables'] and name not in saved_ids:
      raise errors.ResumeError(
          f'dataset {name!r} changed since the {where}, which holds no '
          'example ids to match its sampler state by (they are saved from '
          "the first run with checkpoint.on_dataset_change='remap'); "
          'restore the dataset or use a new --workdir')
  report = source.set_state(
      restored.data['source'],
      remap={name: (saved_ids.get(name), ids[name]) for name in changed})
  rollout.set_state(restored.data['rollout'])
  return report, rollout.accumulator.drop_datasets(gone) if gone else 0


def _resume(ckpt: checkpoint_lib.Checkpointer, step: int,
            saved_meta: Mapping[str, Any],
            target_state: PyTree, shardings: PyTree, *,
            meta: Mapping[str, Any], source: Any, rollout: Any,
            ids: Mapping[str, Any] | None, remap: bool,
            notice: Callable[[str], None],
            damaged: list[tuple[int, str]]) -> Start | None:
  """Resumes from step `step`; None (with the step added to `damaged`)
  when its files do not restore. Raises ResumeError when it does not fit
  this run."""
  where = f'checkpoint of step {step} in {ckpt.directory}'
  changed = checkpoint_lib.check_resumable(
      saved_meta, step=step, directory=ckpt.directory,
      model=meta['model'], datasets=meta['datasets'], remap=remap)
  changed_settings = resume_policy.check(
      saved_meta.get('config'), meta.get('config', {}), where=where,
      step=step)
  lora.check_base(dict(saved_meta), meta.get(lora.BASE), f'the {where}',
                  errors.ResumeError)
  try:
    restored = ckpt.restore(step, target_state)
    saved_ids = restored.data.get('ids', {})
    # Ids saved and read again: a dataset whose ids moved is remapped by id
    # even where its size and sampled records are as they were.
    changed += [name for name in saved_ids if name in (ids or {})
                and name not in changed
                and not np.array_equal(saved_ids[name], ids[name])]
    gone = sorted(set(restored.data['source']['tables']) - set(meta['datasets']))
    if step == 0 and (changed or gone):
      # A start point: no step drew from the sampler or carried a group,
      # so the fresh sampler and rollout built on this run's data stand.
      report, dropped = {}, 0
      notice(f'the {where} is a start point and its datasets differ from '
             f'this run\'s ({", ".join(map(repr, sorted(changed + gone)))}): '
             'the sampler starts afresh on the data as it is now')
      gone = []
    else:
      report, dropped = _restore_sampler(restored, source, rollout, changed,
                                         gone, ids, where)
  except errors.UserError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    damaged.append((step, checkpoint_lib.describe_damage(e)))
    return None
  entries = {d['name']: d for d in
             meta.get('config', {}).get('data', {}).get('datasets', ())}
  for name, counts in report.items():
    notice(f'dataset {name!r} changed: sampler state kept for '
           f'{counts["kept"]} examples by id, {counts["new"]} new, '
           f'{counts["removed"]} removed{_by_position(entries.get(name))}')
  if gone:
    notice(f'left out of this run: {", ".join(map(repr, gone))}, in the '
           f'{where}; their sampler state is dropped, with {dropped} groups '
           'carried or in flight for them')
  for line in changed_settings + curriculum.changes(
      saved_meta.get('strata'), meta.get('strata'), where=where):
    notice(line)
  state = sharding.shard(restored.state, shardings)
  return Start(resumed_from=step, state=state,
               meta={**restored.meta, **meta})
