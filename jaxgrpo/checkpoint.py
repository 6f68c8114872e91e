"""Orbax checkpoints of the train state together with the data-side state.

One checkpoint holds three items: `state` (params, optimizer state, step,
reference params), `data` (the prompt source and rollout counters, as numpy
arrays, plus the run's RNG key) and `meta` (the resolved config and run
notes, as JSON). Saving is asynchronous; orbax writes to a temporary folder
and renames it when complete, so a crash mid-save never shadows the last
good checkpoint.
"""

from collections.abc import Mapping
import dataclasses
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxgrpo.typing import PyTree


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
    # Orbax's tensorstore paths must be absolute; users pass relative ones.
    self.directory = os.path.abspath(directory)
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            enable_async_checkpointing=True,
            create=True,
        ),
    )

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def should_save(self, step: int) -> bool:
    return self.every > 0 and step % self.every == 0

  def save(
      self,
      step: int,
      state: PyTree,
      data: Mapping[str, Any],
      meta: Mapping[str, Any],
  ) -> None:
    """Starts an asynchronous save of step `step` (waits for the previous)."""
    self.manager.save(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=ocp.args.StandardSave(_to_arrays(data)),
            meta=ocp.args.JsonSave(dict(meta)),
        ),
        force=True,
    )

  def restore(self, step: int, target_state: PyTree) -> Restored:
    """Restores step `step` into the structure of `target_state`."""
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target_state)
    out = self.manager.restore(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract),
            data=ocp.args.StandardRestore(),
            meta=ocp.args.JsonRestore(),
        ),
    )
    return Restored(step=step, state=out.state, data=dict(out.data),
                    meta=dict(out.meta))

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()
