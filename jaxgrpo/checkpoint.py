"""Orbax checkpoints of the train state together with the data-side state.

One checkpoint holds three items: `state` (params, optimizer state, step,
reference params), `data` (the prompt source and rollout counters, as numpy
arrays, plus the run's RNG key) and `meta` (the resolved config and run
notes, as JSON, with a checksum of every array of the other two:
`jaxgrpo.integrity`). Saving is asynchronous; orbax writes to a temporary
folder and renames it when complete, so a crash mid-save never shadows the
last good checkpoint. Reading checks the checksums: an array whose bytes
changed after they were written raises `DamagedError`, like a file that is
missing or cut short raises orbax's errors.

Size: saving, restoring and the readers that need no run (`reader`,
`read_meta`, `load_state_arrays`) share one item layout and one set of
damage checks.
"""

from collections.abc import Callable, Mapping, Sequence
import contextlib
import dataclasses
import json
import os
import threading
import time
from typing import Any, TypeVar
import warnings

from etils import epath
import jax
import numpy as np
import optax
import orbax.checkpoint as ocp

from jaxgrpo import errors
from jaxgrpo import integrity
from jaxgrpo import orbax_patch
from jaxgrpo.model.config import ModelConfig
from jaxgrpo.typing import PyTree

T = TypeVar('T')

# A read of a damaged checkpoint that orbax abandons midway can leave its
# per-array read coroutines unawaited; Python then warns on stderr when they
# are collected. The damage is reported (and the folder set aside) by
# `Checkpointer`; the warning is only noise.
warnings.filterwarnings(
    'ignore', message="coroutine '_read_array_index_and_device_put' was never "
    'awaited', category=RuntimeWarning)
# Each save leaked memory through tensorstore's metric reader, and a failed
# read or save printed dozens of 'Event loop is closed' tracebacks
# (orbax_patch).
orbax_patch.install()
orbax_patch.quiet_late_callbacks()
orbax_patch.quiet_abandoned_reads()


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


# The key of a checkpoint's JSON item that holds its arrays' checksums.
INTEGRITY = 'integrity'
# The step a checkpoint was saved at, in its JSON item: a resume compares it
# with the folder's name (`check_resumable`).
STEP = 'step'


class DamagedError(Exception):
  """A checkpoint's arrays differ from the checksums saved with them."""


def verify(meta: Mapping[str, Any], **items: Any) -> None:
  """Checks each restored item (`state=...`, `data=...`) against the
  checksums in `meta`; checkpoints written without them pass unchecked.

  Raises:
    DamagedError: naming the arrays that differ.
  """
  saved = meta.get(INTEGRITY) or {}
  bad = [f'{name}/{path}' for name, tree in items.items()
         for path in integrity.mismatches(saved.get(name, {}), tree)]
  if bad:
    named = ', '.join(bad[:3]) + ', ...' * (len(bad) > 3)
    raise DamagedError(
        f'{len(bad)} array{"s" * (len(bad) > 1)} no longer '
        f'match{"es" * (len(bad) == 1)} the checksums saved with them '
        f'({named}): their files changed after they were written')


class Checkpointer:
  """Saves every `every` steps (and on demand); keeps `max_to_keep`."""

  def __init__(self, directory: str, *, every: int, max_to_keep: int):
    self.every = every
    self._confirmed = False  # whether a save of this process completed
    # Held while a save starts, and for good by `stop_saving`.
    self._starting = threading.Lock()
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
    with self._starting:
      self._save(step, state, data, meta)

  def _save(self, step: int, state: PyTree, data: Mapping[str, Any],
            meta: Mapping[str, Any]) -> None:
    data = _to_arrays(data)
    meta = {**meta, STEP: step,
            INTEGRITY: {'state': integrity.digests(state),
                        'data': integrity.digests(data)}}
    try:
      self.manager.save(
          step,
          args=ocp.args.Composite(
              state=ocp.args.StandardSave(state),
              data=ocp.args.StandardSave(data),
              meta=ocp.args.JsonSave(meta),
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

  def stop_saving(self) -> None:
    """Lets the save in progress complete, one being started included, and
    starts no other (for another thread that ends the process: a save it
    cut short would leave a temporary folder); a failed save is left to the
    next start."""
    self._starting.acquire()  # pylint: disable=consider-using-with
    with contextlib.suppress(Exception):
      self.wait()

  def read_meta(self, step: int) -> dict[str, Any]:
    """The JSON item of step `step` alone (cheap; checks before a restore).

    Raises:
      DamagedError: it holds no config (`checked_meta`).
    """
    out = self.manager.restore(
        step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    return checked_meta(out.meta)

  def restore(self, step: int, target_state: PyTree) -> Restored:
    """Restores step `step` into the structure of `target_state`.

    A checkpoint whose optimizer state is wrapped in skip counters
    (`optax.ApplyIfFiniteState`, as some earlier versions wrote) is restored
    into the plain AdamW state it wraps; the counters are dropped (the train
    step counts skipped updates in `train/nonfinite`).

    Raises:
      DamagedError: an array differs from its saved checksum.
    """
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target_state)
    wrapped = (hasattr(abstract, 'opt_state')
               and not isinstance(abstract.opt_state, optax.ApplyIfFiniteState)
               and self._has_skip_counters(step))
    if wrapped:
      zero = jax.ShapeDtypeStruct((), np.int32)
      abstract = abstract.replace(opt_state=optax.ApplyIfFiniteState(
          notfinite_count=zero,
          last_finite=jax.ShapeDtypeStruct((), np.bool_),
          total_notfinite=zero,
          inner_state=abstract.opt_state))
    out = self.manager.restore(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract),
            data=ocp.args.StandardRestore(),
            meta=ocp.args.JsonRestore(),
        ),
    )
    meta = dict(out.meta)
    # Skip counters predate the checksums: such a state has none to compare.
    verify(meta, **({} if wrapped else {'state': out.state}), data=out.data)
    meta.pop(INTEGRITY, None)
    meta.pop(STEP, None)  # Restored.step
    state = out.state
    if wrapped:
      state = state.replace(opt_state=state.opt_state.inner_state)
    return Restored(step=step, state=state, data=dict(out.data), meta=meta)

  def _has_skip_counters(self, step: int) -> bool:
    """Whether step `step`'s optimizer state is an ApplyIfFiniteState."""
    path = epath.Path(self.directory) / str(step) / 'state'
    tree = ocp.StandardCheckpointHandler().metadata(path)
    opt_state = getattr(tree, 'tree', tree)['opt_state']
    return isinstance(opt_state, Mapping) and 'inner_state' in opt_state

  def restore_data(self, step: int) -> dict[str, Any]:
    """The data item of step `step` alone (sampler, rollout, example ids).

    Raises:
      DamagedError: an array differs from its saved checksum.
    """
    out = self.manager.restore(
        step, args=ocp.args.Composite(data=ocp.args.StandardRestore(),
                                      meta=ocp.args.JsonRestore()))
    verify(out.meta, data=out.data)
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

  def close_after_error(self) -> None:
    """`close` when a run ends in an error, which its caller reports: a
    save in progress completes first (or fails, a lesser error, not raised).
    """
    try:
      self.close()
    except Exception:  # pylint: disable=broad-except
      pass


def describe_damage(e: Exception) -> str:
  """What is wrong with a checkpoint that does not restore, in brief."""
  text = ' '.join(str(e).split())
  if isinstance(e, DamagedError):
    return text
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
  if 'Error reading' in text:  # tensorstore, of an array cut short
    return 'an array file cannot be read (truncated or missing)'
  return f'{type(e).__name__}: {text[:120]}'


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


# Listings of a checkpoint folder tried while a run removes step folders.
_LISTINGS = 5


def reader(directory: str) -> ocp.CheckpointManager:
  """A manager that only reads the checkpoints in `directory`.

  One that may write would create the folder, and remove the temporary
  folders of a save in progress by a run still training there. Orbax warns
  that the directory is read-only, as asked; those lines are muted.
  """
  with errors.absl_warnings_muted():
    for attempt in range(_LISTINGS):
      try:
        return ocp.CheckpointManager(
            absolute(directory),
            options=ocp.CheckpointManagerOptions(read_only=True, create=False))
      except FileNotFoundError:
        # A run training there removed a step folder while orbax listed
        # them (it keeps checkpoint.max_to_keep): list them again.
        if attempt == _LISTINGS - 1:
          raise


def removed(directory: str, step: int, wait_s: float = 1.0) -> bool:
  """Whether checkpoint `step` in `directory` is gone or going: its folder
  is missing now, or `wait_s` later (a run training there removes all but
  its latest checkpoint.max_to_keep as it saves, one file at a time). A
  reader that failed asks, to tell that from damage."""
  if not _has_step(directory, step):
    return True
  time.sleep(wait_s)
  return not _has_step(directory, step)


def _has_step(directory: str, step: int) -> bool:
  """Whether checkpoint `step`'s folder is in `directory` now."""
  return os.path.isdir(os.path.join(absolute(directory), str(step)))


def removed_message(directory: str, step: int) -> str:
  """What to say of checkpoint `step`, removed while it was read."""
  steps = saved_steps(directory)
  return (f'it was removed while it was read: the run training there keeps '
          f'its latest checkpoint.max_to_keep checkpoints (steps there now: '
          f'{", ".join(map(str, steps)) or "none"}); name one of those, or '
          'the workdir alone for its latest')


def read_latest(directory: str, step: int, read: Callable[[int], T], *,
                follow: bool, moved: Callable[[int, int], None]) -> T:
  """`read(step)`; with `follow` (`step` was the latest when resolved, not
  a step the user named), a checkpoint that the run training there
  removed while it was read (its folder gone) is replaced by the latest
  now, up to 4 times, each time calling `moved(old_step, new_step)`.

  The readers wait for a failing checkpoint's folder to go before they
  raise (`removed`), so a folder still here means damage: re-raised.
  """
  for _ in range(_LISTINGS - 1):
    try:
      return read(step)
    except Exception:  # pylint: disable=broad-except
      if not follow or _has_step(directory, step):
        raise
      steps = saved_steps(directory)
      if not steps or steps[-1] == step:
        raise
      moved(step, steps[-1])
      step = steps[-1]
  return read(step)


def saved_steps(directory: str) -> list[int]:
  """The steps of the checkpoints in `directory`, ascending, read only; []
  when it does not exist."""
  if not os.path.isdir(directory):
    return []
  manager = reader(directory)
  try:
    return sorted(manager.all_steps())
  finally:
    manager.close()


def read_meta(directory: str, step: int) -> dict[str, Any]:
  """The JSON item of checkpoint `step` in `directory`, read only.

  Raises:
    DamagedError: it holds no config (`checked_meta`).
  """
  manager = reader(directory)
  try:
    return checked_meta(manager.restore(
        step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta)
  finally:
    manager.close()


def checked_meta(meta: Any) -> dict[str, Any]:
  """A checkpoint's JSON item, as a dict.

  Raises:
    DamagedError: it is no dict holding a `config`, which every checkpoint
      a run writes holds: without it nothing could be checked against this
      run's settings, and the arrays' checksums would be gone too.
  """
  if not isinstance(meta, Mapping) or 'config' not in meta:
    raise DamagedError(
        'its notes (meta/metadata) hold no config, which every checkpoint '
        'holds: the file was replaced or edited')
  return dict(meta)


def load_state_arrays(directory: str, step: int | None = None,
                      checked: Sequence[str] | None = None) -> dict:
  """The train state of a checkpoint as nested numpy arrays, no target
  structure needed (inspection, comparisons, jaxgrpo-export). Latest step
  by default. It reads on any devices, whatever mesh the run saved from.
  `checked` names the parts compared with their checksums (`('params',)`
  for an export, which an optimizer moment changed on disk does not
  touch); all by default.

  Raises:
    ResumeError: there is no checkpoint.
    DamagedError: an array differs from its saved checksum.
  """
  if not os.path.isdir(directory):
    raise errors.ResumeError(f'no checkpoint in {directory}')
  manager = reader(directory)
  try:
    step = manager.latest_step() if step is None else step
    if step is None:
      raise errors.ResumeError(f'no checkpoint in {directory}')
    # Without a target orbax places arrays as saved, and refuses a
    # checkpoint of more devices than this process has; as numpy arrays
    # they read anywhere.
    tree = ocp.StandardCheckpointHandler().metadata(
        epath.Path(absolute(directory)) / str(step) / 'state')
    as_numpy = jax.tree.map(
        lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
        getattr(tree, 'tree', tree))
    out = manager.restore(
        step, args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(restore_args=as_numpy),
            meta=ocp.args.JsonRestore()))
  finally:
    manager.close()
  state = jax.tree.map(np.asarray, out.state)
  verify(out.meta, state=state if checked is None else
         {k: state[k] for k in checked})
  return state


def as_saved(value: Any) -> Any:
  """`value` as a checkpoint's JSON holds it (tuples become lists)."""
  return json.loads(json.dumps(value, default=str))


def _check_step(meta: Mapping[str, Any], step: int, directory: str) -> None:
  """Raises ResumeError when the checkpoint in folder `step` was saved at
  another step (its folder renamed or copied by hand); one saved before the
  step was noted is taken at its folder's word."""
  saved = meta.get(STEP, step)
  if saved != step:
    raise errors.ResumeError(
        f'the folder {os.path.join(directory, str(step))} holds the '
        f'checkpoint of step {saved} (saved with it): a step folder renamed '
        'or copied under another number would resume at the wrong step; '
        f'rename it back to {saved}, or to train a new run from its weights, '
        'write them out with jaxgrpo-export and give the folder as model.path')


def _check_model(saved_model: Mapping[str, Any] | None,
                 model: Mapping[str, Any], where: str) -> None:
  """Raises ResumeError naming the model fields that differ from those the
  checkpoint was saved with (none noted: not compared)."""
  # Compared as the checkpoint's JSON holds them (tuples as lists). A key
  # the checkpoint lacks is a field added since, whose default keeps the
  # earlier behaviour: it counts as its default, whatever that is.
  now = as_saved(dict(model))
  defaults = as_saved({f.name: f.default
                       for f in dataclasses.fields(ModelConfig)
                       if f.default is not dataclasses.MISSING})
  diff = sorted(k for k in set(saved_model or {}) | set(now)
                if saved_model is not None
                and saved_model.get(k, defaults.get(k)) != now.get(k))
  if diff:
    detail = ', '.join(f'{k}: {saved_model.get(k, defaults.get(k))!r} -> '
                       f'{now.get(k)!r}'
                       for k in diff[:4])
    raise errors.ResumeError(
        f'the {where} is for another model ({detail}); use a new --workdir '
        'or the config it was trained with')


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
    datasets: this run's datasets: name -> {'size', 'fingerprint'} and,
      for file kinds, 'content' (`sources.content_digest`).
    remap: datasets may differ (checkpoint.on_dataset_change='remap'): their
      sampler state is then matched by example id instead of failing.

  Returns:
    The names of this run's datasets that differ from the checkpoint's
    (added ones included); empty unless `remap`.

  Raises:
    ResumeError: naming the model fields or the dataset that differ, or
      the step the checkpoint was saved at where its folder names another.
  """
  where = f'checkpoint of step {step} in {directory}'
  _check_step(meta, step, directory)
  _check_model(meta.get('model'), model, where)
  saved = meta.get('datasets')
  if saved is None:
    return []
  hint = ("; or set checkpoint.on_dataset_change='remap' to keep each "
          "example's sampler state by its stable id")
  # A start point (step 0, `resume_policy.FREE_AT_START`): the data may
  # change, the sampler starting afresh (`resume.restore_or_start`).
  remap = remap or step == 0
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
    elif then.get('content', now.get('content')) != now.get('content'):
      # Noted since a version after the fingerprint: compared when saved.
      what = "same size, its files' bytes changed (records edited or moved)"
    else:
      continue
    if not remap:
      raise errors.ResumeError(
          f'dataset {name!r} changed since the {where}: {what}' + hint)
    changed.append(name)
  return changed
