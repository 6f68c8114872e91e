"""Mesh, logical axis rules and placement; the only module using jax.sharding.

Model code names axes logically (`('batch', 'length', 'embed')`); a rule table
maps each logical name to a mesh axis (or None, replicated). Without an active
mesh every helper here is the identity, so single-device runs pay nothing.
"""

from collections.abc import Iterator, Sequence
import contextlib
import contextvars
import dataclasses

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import numpy as np

LogicalAxes = Sequence[str | None]
Rules = Sequence[tuple[str, str | tuple[str, ...] | None]]

# Default logical -> mesh axis rules for the (data, fsdp, tensor) mesh.
DEFAULT_RULES: Rules = (
    ('batch', ('data', 'fsdp')),
    ('length', None),
    ('cache_length', None),
    ('embed', 'fsdp'),
    ('act_embed', None),
    ('heads', 'tensor'),
    ('kv_heads', 'tensor'),
    ('head_dim', None),
    ('mlp', 'tensor'),
    ('vocab', 'tensor'),
    ('norm', None),
)


@dataclasses.dataclass(frozen=True)
class MeshContext:
  mesh: Mesh
  rules: Rules


_ACTIVE: contextvars.ContextVar[MeshContext | None] = contextvars.ContextVar(
    'jaxgrpo_mesh', default=None
)


def make_mesh(
    data: int = -1, fsdp: int = 1, tensor: int = 1, devices=None
) -> Mesh:
  """Builds a (data, fsdp, tensor) mesh; -1 on `data` takes what is left."""
  devices = list(jax.devices() if devices is None else devices)
  if data == -1:
    if len(devices) % (fsdp * tensor):
      raise ValueError(
          f'mesh: {len(devices)} devices do not divide into fsdp={fsdp} x '
          f'tensor={tensor}'
      )
    data = len(devices) // (fsdp * tensor)
  if data * fsdp * tensor != len(devices):
    raise ValueError(
        f'mesh: data={data} x fsdp={fsdp} x tensor={tensor} != '
        f'{len(devices)} devices'
    )
  grid = np.asarray(devices).reshape(data, fsdp, tensor)
  return Mesh(grid, ('data', 'fsdp', 'tensor'))


@contextlib.contextmanager
def use_mesh(mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Iterator[None]:
  """Activates `mesh` and `rules` for `constrain` and `logical_sharding`."""
  token = _ACTIVE.set(MeshContext(mesh, tuple(rules)))
  try:
    yield
  finally:
    _ACTIVE.reset(token)


def logical_to_spec(axes: LogicalAxes, rules: Rules) -> PartitionSpec:
  """Maps logical axis names to a PartitionSpec; unknown names replicate."""
  table = dict(rules)
  used: set[str] = set()
  spec = []
  for name in axes:
    target = table.get(name) if name is not None else None
    parts = (target,) if isinstance(target, str) else tuple(target or ())
    # A mesh axis may shard only one array dimension.
    parts = tuple(p for p in parts if p not in used)
    used.update(parts)
    spec.append(parts[0] if len(parts) == 1 else (parts or None))
  return PartitionSpec(*spec)


def logical_sharding(axes: LogicalAxes) -> NamedSharding | None:
  """The NamedSharding for `axes` under the active mesh, or None."""
  ctx = _ACTIVE.get()
  if ctx is None:
    return None
  return NamedSharding(ctx.mesh, logical_to_spec(axes, ctx.rules))


def constrain(x: jax.Array, axes: LogicalAxes) -> jax.Array:
  """Constrains an activation's sharding by logical names (no mesh: no-op)."""
  sharding = logical_sharding(axes)
  if sharding is None:
    return x
  return jax.lax.with_sharding_constraint(x, sharding)
