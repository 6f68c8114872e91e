"""Mesh, logical axis rules and placement; the only module using jax.sharding.

Model code names axes logically (`('batch', 'length', 'embed')`); a rule table
maps each logical name to mesh axes (or None, replicated). Without an active
mesh every helper here returns None or is the identity, so single-device runs
take the same code path and pay nothing.

A dimension whose size a rule's mesh axes do not divide keeps the leading
axes that do (or is replicated): a 6-head model on `tensor=4` replicates its
heads, a prompt pass of 4 rows on 8 batch devices replicates its rows.

Size: it is the one module that uses jax.sharding, so that every
placement rule (params, batches, caches, the train state) is read here.
"""

from collections.abc import Iterator, Sequence
import contextlib
import contextvars
import dataclasses

from flax import nnx
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import numpy as np

from jaxgrpo import checks
from jaxgrpo.checks import field
from jaxgrpo.typing import PyTree

LogicalAxes = Sequence[str | None]
Rules = Sequence[tuple[str, str | tuple[str, ...] | None]]

MESH_AXES = ('data', 'fsdp', 'tensor')
# Rows of a batch (prompts, completions) are split over these mesh axes.
BATCH_AXES = ('data', 'fsdp')

# Default logical -> mesh axis rules for the (data, fsdp, tensor) mesh.
DEFAULT_RULES: Rules = (
    ('batch', BATCH_AXES),
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
  """A mesh with its logical rules; hashable, so usable as a jit static."""

  mesh: Mesh
  rules: Rules


_ACTIVE: contextvars.ContextVar[MeshContext | None] = contextvars.ContextVar(
    'jaxgrpo_mesh', default=None
)


_PAIRS = ('must be a list of (logical axis, mesh axis | tuple of mesh axes | '
          'None) pairs')


class MeshSection(checks.Section, name='mesh'):
  """The config's `mesh`: the device mesh and how logical axes map onto it."""

  data: int = field(
      -1, 'devices the batch rows split over, with `fsdp`; -1 takes the '
      'devices `fsdp` and `tensor` leave. `data` x `fsdp` x `tensor` must '
      'equal the device count, and `rollout.batch_size` x `group_size` must be '
      'a multiple of `data` x `fsdp` (see [Scale-out](scale-out.md))',
      checks.rule(lambda d: d == -1 or d >= 1,
                  'must be >= 1, or -1 (the devices left by fsdp and tensor)'))
  fsdp: int = field(
      1, 'devices the batch rows, params and optimizer state (their `embed` '
      'axis) split over', checks.POSITIVE)
  tensor: int = field(
      1, 'devices params and optimizer state split over by heads, mlp and '
      'vocab', checks.POSITIVE)
  rules: Rules = field(
      (), '`(logical axis, target)` pairs overriding the default rules of '
      '`jaxgrpo/sharding.py` (`DEFAULT_RULES`); a target is a mesh axis, a '
      "tuple of mesh axes or None (replicated), e.g. `(('vocab', None),)`",
      checks.rule(lambda r: isinstance(r, (list, tuple)), _PAIRS))
  memory_limit_gib: float | None = field(
      None, 'memory per device the train step must fit, checked (and logged '
      'with argument / output / temp bytes) after compiling it, before the '
      "first step; None: the device's own limit (none on CPU: no check)",
      checks.optional(checks.POSITIVE, "the device's own limit"))

  def _validate(self):
    logical = [name for name, _ in DEFAULT_RULES]
    rules = []
    for i, pair in enumerate(self.rules):
      at = f'mesh.rules[{i}]'
      pair = tuple(pair) if isinstance(pair, (list, tuple)) else pair
      if not isinstance(pair, tuple) or len(pair) != 2:
        checks.fail(at, pair, _PAIRS)
      name, target = pair
      if name not in logical:
        checks.fail(at, pair, f'unknown logical axis {name!r} (one of '
                    f'{", ".join(logical)})')
      axes = (target,) if isinstance(target, str) else target
      if axes is not None and not (
          isinstance(axes, (list, tuple)) and all(a in MESH_AXES for a in axes)
          and len(set(axes)) == len(axes)):
        checks.fail(at, pair, f'the target must be one of {MESH_AXES}, a '
                    'tuple of distinct ones, or None (replicated)')
      rules.append((name, _as_target(target)))
    object.__setattr__(self, 'rules', tuple(rules))
    return iter(())


def mesh_shape(num_devices: int, data: int = -1, fsdp: int = 1,
               tensor: int = 1) -> tuple[int, int, int]:
  """(data, fsdp, tensor) on `num_devices` devices; -1 on `data` takes what
  fsdp and tensor leave.

  Raises:
    ConfigError: naming mesh.fsdp or mesh.data, when they do not fit.
  """
  if data == -1 and num_devices % (fsdp * tensor):
    checks.fail('mesh.fsdp', fsdp, f'mesh.fsdp x mesh.tensor = '
                f'{fsdp * tensor} must divide the {num_devices} devices')
  if data != -1 and data * fsdp * tensor != num_devices:
    checks.fail('mesh.data', data, f'mesh.data x fsdp x tensor = {data} x '
                f'{fsdp} x {tensor} must equal the {num_devices} devices (or '
                'set mesh.data=-1 to take the devices left)')
  return (num_devices // (fsdp * tensor) if data == -1 else data), fsdp, tensor


def make_mesh(
    data: int = -1, fsdp: int = 1, tensor: int = 1, devices=None
) -> Mesh:
  """Builds a (data, fsdp, tensor) mesh; -1 on `data` takes what is left."""
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(len(devices), data, fsdp, tensor)
  return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def merge_rules(overrides: Rules = (), base: Rules = DEFAULT_RULES) -> Rules:
  """`base` with each logical name in `overrides` remapped (or added).

  Args:
    overrides: (logical name, mesh axis | tuple of mesh axes | None) pairs.
    base: the rules they override.

  Returns:
    The merged rules, `base`'s order first, then new names.
  """
  table = {name: _as_target(target) for name, target in base}
  table.update({name: _as_target(target) for name, target in overrides})
  return tuple(table.items())


def _as_target(target) -> str | tuple[str, ...] | None:
  if target is None or isinstance(target, str):
    return target
  return tuple(target)


@contextlib.contextmanager
def use_mesh(mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Iterator[None]:
  """Activates `mesh` and `rules` for placement and `constrain`."""
  rules = tuple((name, _as_target(target)) for name, target in rules)
  with activate(MeshContext(mesh, rules)):
    yield


@contextlib.contextmanager
def activate(context: MeshContext | None) -> Iterator[None]:
  """Makes `context` (None: no mesh) the active one.

  jit caches know nothing of the active context, yet `constrain` reads it
  while tracing. A jitted function that constrains takes `current()` as a
  static (hashable) argument and traces under `activate(it)`, so that each
  placement gets its own trace; see `generate.generator`.
  """
  token = _ACTIVE.set(context)
  try:
    yield
  finally:
    _ACTIVE.reset(token)


def current() -> MeshContext | None:
  """The active mesh and rules (hashable), or None."""
  return _ACTIVE.get()


def active_mesh() -> Mesh | None:
  """The mesh of the innermost `use_mesh`, or None."""
  ctx = _ACTIVE.get()
  return None if ctx is None else ctx.mesh


def batch_multiple() -> int:
  """Devices the batch rows are split over (data x fsdp; 1 without a mesh).

  Callers pad row counts to a multiple of this so rows shard evenly.
  """
  mesh = active_mesh()
  if mesh is None:
    return 1
  return int(np.prod([mesh.shape[a] for a in BATCH_AXES]))


def logical_to_spec(
    axes: LogicalAxes, rules: Rules, shape: Sequence[int] | None = None,
    mesh: Mesh | None = None,
) -> PartitionSpec:
  """Maps logical axis names to a PartitionSpec; unknown names replicate.

  Args:
    axes: one logical name (or None) per array dimension.
    rules: logical name -> mesh axes.
    shape: the array's shape; with `mesh`, each dimension keeps only the
      leading mesh axes whose sizes divide it.
    mesh: the mesh, for `shape`.
  """
  table = dict(rules)
  used: set[str] = set()
  spec = []
  for i, name in enumerate(axes):
    target = table.get(name) if name is not None else None
    parts = (target,) if isinstance(target, str) else tuple(target or ())
    # A mesh axis may shard only one array dimension.
    parts = tuple(p for p in parts if p not in used)
    if shape is not None and mesh is not None:
      kept, size = [], 1
      for p in parts:
        if shape[i] % (size * mesh.shape[p]):
          break
        kept.append(p)
        size *= mesh.shape[p]
      parts = tuple(kept)
    used.update(parts)
    spec.append(parts[0] if len(parts) == 1 else (parts or None))
  return PartitionSpec(*spec)


def logical_sharding(
    axes: LogicalAxes, shape: Sequence[int] | None = None
) -> NamedSharding | None:
  """The NamedSharding for `axes` (fitted to `shape`) under the active mesh.

  Returns None without a mesh.
  """
  ctx = _ACTIVE.get()
  if ctx is None:
    return None
  return NamedSharding(
      ctx.mesh, logical_to_spec(axes, ctx.rules, shape, ctx.mesh)
  )


def constrain(x: jax.Array, axes: LogicalAxes) -> jax.Array:
  """Constrains an activation's sharding by logical names (no mesh: no-op)."""
  sharding = logical_sharding(axes, x.shape)
  if sharding is None:
    return x
  return jax.lax.with_sharding_constraint(x, sharding)


def replicated() -> NamedSharding | None:
  """A fully replicated sharding on the active mesh, or None."""
  mesh = active_mesh()
  return None if mesh is None else NamedSharding(mesh, PartitionSpec())


def batch_sharding(ndim: int, rows: int | None = None) -> NamedSharding | None:
  """Leading dimension on the batch axes (data, fsdp), the rest replicated.

  Args:
    ndim: the array's rank.
    rows: its leading dimension; when given, only batch axes that divide it
      are used (None: the caller guarantees divisibility).

  Returns:
    The sharding, or None without a mesh.
  """
  shape = None if rows is None else (rows,) + (1,) * (ndim - 1)
  return logical_sharding(('batch',) + (None,) * (ndim - 1), shape)


def batch_shardings(tree: PyTree) -> PyTree | None:
  """`batch_sharding` of every array (or ShapeDtypeStruct) leaf of `tree`."""
  if active_mesh() is None:
    return None
  return jax.tree.map(lambda x: batch_sharding(x.ndim, x.shape[0]), tree)


def param_shardings(tree: PyTree) -> PyTree | None:
  """Shardings of params (or any tree holding them) from their metadata.

  Each `nnx.Variable` carries logical axis names (`out_sharding`); nnx reads
  them (`nnx.get_partition_spec`) and the active rules map them to mesh
  axes, fitted to each array's shape. Other array leaves are replicated.
  Works on real and abstract (ShapeDtypeStruct) trees alike.

  Args:
    tree: an nnx State of params, or a pytree containing such States.

  Returns:
    The same tree with a NamedSharding per leaf, or None without a mesh.
  """
  ctx = _ACTIVE.get()
  if ctx is None:
    return None
  specs = nnx.get_partition_spec(tree)

  def place(x, spec: PartitionSpec) -> NamedSharding:
    return NamedSharding(
        ctx.mesh,
        logical_to_spec(tuple(spec), ctx.rules, x.shape, ctx.mesh)
        if len(spec) else PartitionSpec(),
    )

  return jax.tree.map(place, tree, specs)


def train_state_shardings(state: PyTree) -> PyTree | None:
  """Shardings of a TrainState (real or abstract), or None without a mesh.

  Params and ref_params are placed by their logical axes; the optimizer's
  moments are nnx States of the same Variables (optax maps over the params),
  so they carry the same axes and follow their params; the step and the
  optimizer's counters are replicated.
  """
  return param_shardings(state)


def with_shardings(abstract: PyTree, shardings: PyTree | None) -> PyTree:
  """ShapeDtypeStructs of `abstract` carrying `shardings` (identity if None).

  E.g. a checkpoint restore target that restores straight onto the mesh.
  """
  if shardings is None:
    return abstract
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      abstract, shardings,
  )


def shard(tree: PyTree, shardings: PyTree | None) -> PyTree:
  """Places `tree` per `shardings`; None: unchanged.

  Where a sharding spans processes, a leaf held whole by this process (a
  host array, or a local device array from init or load) fills only this
  process's shards (`to_global`): every process passes the same values.
  Arrays already spread over the processes are resharded.
  """
  if shardings is None:
    return tree

  def place(x, s):
    if s.is_fully_addressable or (
        isinstance(x, jax.Array) and not x.is_fully_addressable):
      return jax.device_put(x, s)
    return to_global(np.asarray(x), s)

  return jax.tree.map(place, tree, shardings)


def device_memory_limit() -> int | None:
  """Bytes each device may hold (`memory_stats()['bytes_limit']`), or None.

  The smallest over the active mesh's local devices (all local devices
  without a mesh); None where the backend reports no limit (CPU).
  """
  mesh = active_mesh()
  devices = jax.local_devices() if mesh is None else [
      d for d in mesh.devices.flat if d.process_index == jax.process_index()]
  limits = []
  for device in devices:
    try:
      stats = device.memory_stats()
    except (NotImplementedError, RuntimeError):
      stats = None
    if not stats or 'bytes_limit' not in stats:
      return None
    limits.append(int(stats['bytes_limit']))
  return min(limits) if limits else None


def to_global(x: np.ndarray, sharding: NamedSharding | None) -> jax.Array:
  """A host array as a jax.Array laid out per `sharding`.

  Every process passes the same `x`; each fills only its own devices'
  shards, so this works when the mesh spans processes (where device_put of
  a host array to non-addressable devices cannot). No sharding: the array
  on the default device.
  """
  if sharding is None:
    return jax.numpy.asarray(x)
  x = np.asarray(x)
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])
