"""Orbax checkpoints of the train state together with the data-side state.

One checkpoint holds three items: `state` (params, optimizer state, step,
reference params), `data` (the prompt source and rollout counters, as numpy
arrays, plus the run's RNG key) and `meta` (the resolved config and run
notes, as JSON). Saving is asynchronous; orbax writes to a temporary folder
and renames it when complete, so a crash mid-save never shadows the last
good checkpoint.
"""

from collections.abc import Callable, Mapping
import dataclasses
import os
import time
from typing import Any

from etils import epath
import jax
import numpy as np
import optax
import orbax.checkpoint as ocp

from jaxgrpo import errors
from jaxgrpo import resume_check
from jaxgrpo import sharding
from jaxgrpo.typing import PyTree


def absolute(path: str) -> str:
  """An absolute local path (`~` expanded); object-store paths
  (`gs://...`) as given."""
  if '://' in str(path):
    return str(path)
  return os.path.abspath(os.path.expanduser(path))


@dataclasses.dataclass
class Restored:
  step: int
  state: PyTree
  data: dict[str, Any]
  meta: dict[str, Any]


def _to_arrays(tree: Mapping[str, Any]) -> dict[str, Any]:
  return jax.tree.map(np.asarray, dict(tree))


class Checkpointer:
  """Saves every `every` steps (and on demand); keeps `max_to_keep`."""

  def __init__(self, directory: str, *, every: int, max_to_keep: int):
    self.every = every
    self._confirmed = False  # whether a save of this process completed
    # Orbax's tensorstore paths must be absolute; users pass relative ones.
    self.directory = absolute(directory)
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            enable_async_checkpointing=True,
            create=True,
            # Folders of saves cut short by a crash are removed at start.
            cleanup_tmp_directories=True,
        ),
    )

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    """The steps of the checkpoints here, newest first."""
    return sorted(self.manager.all_steps(), reverse=True)

  def set_aside(self, step: int) -> str:
    """Renames step `step`'s folder to `<step>.damaged-<time>` (orbax no
    longer sees it; nothing is deleted); returns the new path."""
    folder = epath.Path(self.directory) / str(step)
    stamp = time.strftime('%Y%m%d-%H%M%S')
    target = folder.parent / f'{step}.damaged-{stamp}'
    n = 1
    while target.exists():
      n += 1
      target = folder.parent / f'{step}.damaged-{stamp}-{n}'
    folder.rename(target)
    self.manager.reload()
    return str(target)

  def check_for_errors(self) -> None:
    """Raises TrainingError if a finished asynchronous save failed."""
    try:
      self.manager.check_for_errors()
    except Exception as e:  # pylint: disable=broad-except
      if _is_write_failure(e):
        raise self._write_failed(e) from None
      raise

  def should_save(self, step: int) -> bool:
    return self.every > 0 and step % self.every == 0

  def _write_failed(self, e: Exception) -> errors.TrainingError:
    latest = self.manager.latest_step()
    resume = ('resume from the last complete checkpoint (step '
              f'{latest})' if latest is not None else 'start again')
    return errors.TrainingError(
        f'a checkpoint save to {self.directory} failed ({_reason(e)}); free '
        f'space or fix permissions, then run the same command to {resume}')

  def save(
      self,
      step: int,
      state: PyTree,
      data: Mapping[str, Any],
      meta: Mapping[str, Any],
  ) -> None:
    """Starts an asynchronous save of step `step` (waits for the previous).

    Raises:
      TrainingError: this or the previous save could not be written (disk
        full, permissions); the last complete checkpoint is untouched.
    """
    try:
      self.manager.save(
          step,
          args=ocp.args.Composite(
              state=ocp.args.StandardSave(state),
              data=ocp.args.StandardSave(_to_arrays(data)),
              meta=ocp.args.JsonSave(dict(meta)),
          ),
          force=True,
      )
    except Exception as e:  # pylint: disable=broad-except
      if _is_write_failure(e):
        raise self._write_failed(e) from None
      raise
    if not self._confirmed:
      # The first save of a start completes before training goes on, so
      # that a folder that cannot hold a checkpoint stops the run at once.
      self.wait()
      self._confirmed = True

  def read_meta(self, step: int) -> dict[str, Any]:
    """The JSON item of step `step` alone (cheap; checks before a restore)."""
    out = self.manager.restore(
        step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    return dict(out.meta)

  def restore(self, step: int, target_state: PyTree) -> Restored:
    """Restores step `step` into the structure of `target_state`.

    A checkpoint written before the optimizer skipped non-finite updates
    through `optax.apply_if_finite` holds AdamW's state without the skip
    counters around it; it is restored into the inner state, with the
    counters starting at zero.
    """
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target_state)
    unwrapped = (isinstance(getattr(abstract, 'opt_state', None),
                            optax.ApplyIfFiniteState)
                 and not self._has_skip_counters(step))
    if unwrapped:
      abstract = abstract.replace(opt_state=abstract.opt_state.inner_state)
    out = self.manager.restore(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract),
            data=ocp.args.StandardRestore(),
            meta=ocp.args.JsonRestore(),
        ),
    )
    state = out.state
    if unwrapped:
      state = state.replace(opt_state=optax.ApplyIfFiniteState(
          notfinite_count=np.zeros([], np.int32),
          last_finite=np.ones([], bool),
          total_notfinite=np.zeros([], np.int32),
          inner_state=state.opt_state))
    return Restored(step=step, state=state, data=dict(out.data),
                    meta=dict(out.meta))

  def _has_skip_counters(self, step: int) -> bool:
    """Whether step `step`'s optimizer state is an ApplyIfFiniteState."""
    path = epath.Path(self.directory) / str(step) / 'state'
    tree = ocp.StandardCheckpointHandler().metadata(path)
    opt_state = getattr(tree, 'tree', tree)['opt_state']
    return isinstance(opt_state, Mapping) and 'inner_state' in opt_state

  def restore_data(self, step: int) -> dict[str, Any]:
    """The data item of step `step` alone (sampler, rollout, example ids)."""
    out = self.manager.restore(
        step, args=ocp.args.Composite(data=ocp.args.StandardRestore()))
    return dict(out.data)

  def wait(self) -> None:
    try:
      self.manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      if _is_write_failure(e):
        raise self._write_failed(e) from None
      raise

  def close(self) -> None:
    self.wait()
    self.manager.close()


def _is_write_failure(e: Exception) -> bool:
  """Whether an error from a save means the files could not be written."""
  if isinstance(e, OSError):
    return True
  text = str(e)
  # tensorstore reports write errors as ValueError with the OS reason.
  return any(s in text for s in ('RESOURCE_EXHAUSTED', 'No space left',
                                 'Permission denied', 'Read-only file system'))


def _reason(e: Exception) -> str:
  if isinstance(e, OSError) and e.strerror:
    return e.strerror
  text = str(e)
  for reason in ('No space left on device', 'Permission denied',
                 'Read-only file system'):
    if reason in text:
      return reason
  return text.splitlines()[0][:200]


def load_state_arrays(directory: str, step: int | None = None) -> dict:
  """The train state of a checkpoint as nested numpy arrays, no target
  structure needed (inspection, comparisons). Latest step by default."""
  manager = ocp.CheckpointManager(absolute(directory))
  step = manager.latest_step() if step is None else step
  if step is None:
    raise errors.ResumeError(f'no checkpoint in {directory}')
  out = manager.restore(
      step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  manager.close()
  return jax.tree.map(np.asarray, out.state)


def check_settings(directory: str, config: Mapping[str, Any]) -> None:
  """Refuses, before the run is built, a resume with changed settings that
  `resume_check` does not allow: this run's `config` against that of the
  newest checkpoint in `directory` whose JSON item reads (cheap: nothing
  else is read). Nothing to check without a checkpoint.

  Raises:
    ResumeError: naming the keys that cannot change.
  """
  directory = absolute(directory)
  if not os.path.isdir(directory) and '://' not in directory:
    return
  manager = ocp.CheckpointManager(
      directory, options=ocp.CheckpointManagerOptions(create=False))
  try:
    for step in sorted(manager.all_steps(), reverse=True):
      try:
        meta = manager.restore(
            step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
      except Exception:  # pylint: disable=broad-except
        continue  # damaged: restore_or_start sets it aside or says so
      resume_check.check(
          meta.get('config'), config,
          where=f'checkpoint of step {step} in {directory}', step=step)
      return
  finally:
    manager.close()


def check_resumable(
    meta: Mapping[str, Any],
    *,
    step: int,
    directory: str,
    model: Mapping[str, Any],
    datasets: Mapping[str, Mapping[str, Any]],
    remap: bool = False,
) -> list[str]:
  """Fails with a clear message when a checkpoint does not fit this run.

  Args:
    meta: the checkpoint's JSON item.
    step: its step (for the message).
    directory: where it is (for the message).
    model: this run's model config as a dict.
    datasets: this run's datasets: name -> {'size', 'fingerprint'}.
    remap: datasets may differ (checkpoint.on_dataset_change='remap'): their
      sampler state is then matched by example id instead of failing.

  Returns:
    The names of this run's datasets that differ from the checkpoint's
    (added ones included); empty unless `remap`.

  Raises:
    ResumeError: naming the model fields or the dataset that differ.
  """
  where = f'checkpoint of step {step} in {directory}'
  saved_model = meta.get('model')
  # A key one side lacks counts as None (a field added later, e.g.
  # rope_scaling, whose default is None).
  diff = sorted(k for k in set(saved_model or {}) | set(model)
                if saved_model is not None
                and saved_model.get(k) != model.get(k))
  if diff:
    detail = ', '.join(f'{k}: {saved_model.get(k)!r} -> {model.get(k)!r}'
                       for k in diff[:4])
    raise errors.ResumeError(
        f'the {where} is for another model ({detail}); use a new --workdir '
        'or the config it was trained with')
  saved = meta.get('datasets')
  if saved is None:
    return []
  hint = ("; or set checkpoint.on_dataset_change='remap' to keep each "
          "example's sampler state by its stable id")
  if set(saved) != set(datasets) and not remap:
    raise errors.ResumeError(
        f'the {where} has datasets {sorted(saved)}, this run configures '
        f'{sorted(datasets)}; use a new --workdir to train another mixture'
        + hint)
  changed = []
  for name, now in datasets.items():
    then = saved.get(name)
    if then is None:
      changed.append(name)
      continue
    if then['size'] != now['size']:
      what = f'{then["size"]} examples then, {now["size"]} now'
    elif then['fingerprint'] != now['fingerprint']:
      what = 'same size, other records (fingerprint differs)'
    else:
      continue
    if not remap:
      raise errors.ResumeError(
          f'dataset {name!r} changed since the {where}: {what}' + hint)
    changed.append(name)
  return changed


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
    ckpt: Checkpointer,
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

  Checks that it fits this run (`check_resumable`, and this run's config
  against the saved one per `resume_check`), restores the train state into
  `target_state`'s structure and placement, and sets the state of the
  prompt `source` (a MixtureSampler; the tables of changed datasets
  matched by example id when `remap`) and of `rollout`.

  A checkpoint that cannot be read (files truncated or missing, metadata
  that does not parse, an item missing, an empty folder) is passed over
  for the next older one; once one restores, the newer ones are set aside
  as `<step>.damaged-<time>` (on the main process; nothing is deleted)
  and named in a notice. When none restores, nothing is renamed.

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
  if not steps:
    return Start(resumed_from=None, state=None, meta=dict(meta))
  damaged = []
  for step in steps:
    try:
      saved_meta = ckpt.read_meta(step)
    except Exception as e:  # pylint: disable=broad-except
      damaged.append((step, _damage(e)))
      continue
    start = _resume(ckpt, step, saved_meta, target_state, shardings,
                    meta=meta, source=source, rollout=rollout, ids=ids,
                    remap=remap, notice=notice, damaged=damaged)
    if start is not None:
      break
  else:
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


def _damage(e: Exception) -> str:
  """What is wrong with a checkpoint that does not restore, in brief."""
  text = ' '.join(str(e).split())
  if isinstance(e, KeyError) and 'was not found' in text:
    item = text.split('"')[1] if text.count('"') >= 2 else '?'
    return f'its {item!r} item is missing'
  if isinstance(e, FileNotFoundError):
    return f'a file is missing: {e.filename or text[:120]}'
  if isinstance(e, OSError) and e.strerror:
    return f'{e.strerror}: {e.filename}' if e.filename else e.strerror
  if type(e).__name__ == 'JSONDecodeError':
    return f'a metadata file is not valid JSON ({text[:80]})'
  if 'error while reading array' in text:
    return 'an array file cannot be read (truncated or missing)'
  for marker in ('DATA_LOSS', 'NOT_FOUND', 'does not exist'):
    if marker in text:
      return text[text.index(marker):][:120]
  return f'{type(e).__name__}: {text[:120]}'


def _resume(ckpt: Checkpointer, step: int, saved_meta: Mapping[str, Any],
            target_state: PyTree, shardings: PyTree, *,
            meta: Mapping[str, Any], source: Any, rollout: Any,
            ids: Mapping[str, Any] | None, remap: bool,
            notice: Callable[[str], None],
            damaged: list[tuple[int, str]]) -> Start | None:
  """Resumes from step `step`; None (with the step added to `damaged`)
  when its files do not restore. Raises ResumeError when it does not fit
  this run."""
  where = f'checkpoint of step {step} in {ckpt.directory}'
  changed = check_resumable(
      saved_meta, step=step, directory=ckpt.directory,
      model=meta['model'], datasets=meta['datasets'], remap=remap)
  changed_settings = resume_check.check(
      saved_meta.get('config'), meta.get('config', {}), where=where,
      step=step)
  try:
    restored = ckpt.restore(step, target_state)
    saved_ids = restored.data.get('ids', {})
    for name in changed:
      if (name in restored.data['source']['tables']
          and name not in saved_ids):
        raise errors.ResumeError(
            f'dataset {name!r} changed since the {where}, which holds no '
            'example ids to match its sampler state by (they are saved from '
            "the first run with checkpoint.on_dataset_change='remap'); "
            'restore the dataset or use a new --workdir')
    report = source.set_state(
        restored.data['source'],
        remap={name: (saved_ids.get(name), ids[name]) for name in changed})
    rollout.set_state(restored.data['rollout'])
  except errors.UserError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    damaged.append((step, _damage(e)))
    return None
  for name, counts in report.items():
    notice(f'dataset {name!r} changed: sampler state kept for '
           f'{counts["kept"]} examples by id, {counts["new"]} new, '
           f'{counts["removed"]} removed')
  for line in changed_settings:
    notice(line)
  state = sharding.shard(restored.state, shardings)
  return Start(resumed_from=step, state=state,
               meta={**restored.meta, **meta})
