"""Several processes, one run: start-up, agreement checks, row ownership.

Every process runs the same program on the same config (multi-controller
JAX). The sampler is plain host code driven by the same seed and the same
rewards, so every process makes the same decisions; what differs is which
rows of a global batch each process touches:

  * `initialize` starts `jax.distributed` where the run spans processes:
    with an explicit coordinator, or where the platform says so (a
    multi-host TPU VM slice, SLURM with several tasks).
  * `owned_rows` says which rows of a batch-sharded array this process is
    responsible for (each row has exactly one owner, the lowest process
    index holding it), so that each process runs its verifiers on its own
    completions, and `sum_over_processes` gathers the results for all.
  * `check_agree` compares a digest of host state across processes and
    stops the run with the first differing process named (host drift);
    `check_same_run` compares the config and the data files' fingerprints
    at start, naming the keys that differ.
  * `agree_on_signal` and `agree_on_step` make every process act alike on
    what one process alone saw: a stop signal, the checkpoint it resumes.
  * `lost_contact` turns a collective's error when another process is gone
    into one line; `exit_now` ends a failed process without waiting at
    jax's shutdown barrier.

Single-process runs take the same path: every helper degenerates to the
identity and costs nothing.
"""

import collections
from collections.abc import Callable, Mapping
import hashlib
import os
import signal
import sys
import time
from typing import Any

import jax
from jax.experimental import multihost_utils
import numpy as np

from jaxgrpo import checks
from jaxgrpo import errors
from jaxgrpo.checks import field

Log = Callable[[str], None]

INITIALIZE = ('auto', 'always', 'never')


def _is_host_port(value) -> bool:
  """Whether `value` is 'host:port' with a host and a port number."""
  host, _, port = value.rpartition(':') if isinstance(value, str) else ('',) * 3
  return bool(host.strip()) and port.isdigit() and 0 < int(port) < 65536


class DistributedSection(checks.Section, name='distributed'):
  """The config's `distributed`: several processes in one run."""

  initialize: str = field(
      'auto', 'start `jax.distributed`: `auto` (when a coordinator is given, '
      'or the platform announces several processes: a multi-host TPU VM slice, '
      'SLURM, mpirun), `always` or `never` (see [Scale-out](scale-out.md))',
      checks.one_of(INITIALIZE))
  coordinator: str | None = field(
      None, "an explicit cluster (GPU nodes without a manager): process 0's "
      '`host:port`; with `num_processes` and `process_id`, all three or none',
      checks.rule(lambda c: c is None or _is_host_port(c),
                  "must be 'host:port' (process 0's host, a port in 1-65535),"
                  ' or None'))
  num_processes: int | None = field(
      None, 'an explicit cluster: the number of processes',
      checks.optional(checks.rule(lambda n: n >= 1, 'must be >= 1'),
                      'no cluster'))
  process_id: int | None = field(
      None, "an explicit cluster: this process's index")
  check_every: int = field(
      10, 'steps between checks that every process holds the same sampler '
      'state (a digest compared across processes; 0: never)',
      checks.rule(lambda n: n >= 0, 'must be >= 0 (0: no cross-process check)'))

  def _validate(self):
    given = {self.coordinator is None, self.num_processes is None,
             self.process_id is None}
    yield 'coordinator', len(given) == 1, (
        'distributed.coordinator, num_processes and process_id go together: '
        'give all three or none')
    if self.num_processes is not None:
      yield 'process_id', 0 <= self.process_id < self.num_processes, (
          f'must be in [0, {self.num_processes})')


class HostDriftError(errors.TrainingError):
  """Processes that must agree on host state do not."""


def _platform_is_multihost() -> bool:
  """Whether the environment announces a multi-process job."""
  hosts = os.environ.get('TPU_WORKER_HOSTNAMES', '')
  if len([h for h in hosts.split(',') if h.strip()]) > 1:
    return True
  if int(os.environ.get('SLURM_NTASKS', '1') or 1) > 1:
    return True
  # Open MPI / mpirun launches (jax's MPI cluster detection).
  return int(os.environ.get('OMPI_COMM_WORLD_SIZE', '1') or 1) > 1


def initialize(
    mode: str = 'auto',
    *,
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    log: Log = print,
) -> bool:
  """Starts jax.distributed when the run spans processes.

  Must run before anything touches a JAX device.

  Args:
    mode: 'auto' (start when a coordinator is given or the platform
      announces several processes), 'always' (start, letting JAX detect
      the cluster when no coordinator is given) or 'never'.
    coordinator: 'host:port' of process 0's coordinator service.
    num_processes: processes in the job (with `coordinator`).
    process_id: this process's index (with `coordinator`).
    log: receives one line when started.

  Returns:
    Whether jax.distributed was started here.
  """
  DistributedSection(initialize=mode, coordinator=coordinator,  # Checks.
                     num_processes=num_processes, process_id=process_id)
  if mode == 'never' or (mode == 'auto' and coordinator is None
                         and not _platform_is_multihost()):
    return False
  if jax.distributed.is_initialized():
    return False
  try:
    # Collectives between CPU processes (tests, CPU clusters); a no-op for
    # accelerators, which bring their own.
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  except (AttributeError, ValueError):
    pass
  kwargs = {}
  if coordinator is not None:
    kwargs = dict(coordinator_address=coordinator,
                  num_processes=num_processes, process_id=process_id)
  try:
    jax.distributed.initialize(**kwargs)
  except ValueError as e:  # 'always' where jax detects no cluster
    raise errors.ConfigError(
        f'distributed.initialize={mode!r}: jax finds no cluster to join ({e}); '
        'give distributed.coordinator, num_processes and process_id, or set '
        "distributed.initialize='never' for a single process") from None
  except RuntimeError as e:
    if 'Failed to start RPC server' in str(e) and process_id == 0:
      raise errors.ConfigError(
          f'distributed.coordinator={coordinator!r}: process 0 cannot serve '
          f'on port {coordinator.rsplit(":", 1)[1]} ({e}): another program, '
          "or another run's coordinator, holds it; give a free port (the "
          'same on every process)') from None
    raise errors.ConfigError(
        f'distributed: cannot start jax.distributed ({e}); check '
        'distributed.coordinator / num_processes / process_id, or set '
        "distributed.initialize='never' for a single process") from None
  # jax.devices() is global: every process sees every count, and stops.
  per = collections.Counter(d.process_index for d in jax.devices())
  if len(set(per.values())) > 1:
    counts = ', '.join(f'process {p}: {n}' for p, n in sorted(per.items()))
    raise errors.ConfigError(
        f'distributed: the processes drive different numbers of devices '
        f'({counts}); every process must drive as many (check '
        'CUDA_VISIBLE_DEVICES, JAX_LOCAL_DEVICE_IDS or XLA_FLAGS on each '
        'host)')
  log(f'jax.distributed: process {jax.process_index()} of '
      f'{jax.process_count()}, {jax.local_device_count()} local / '
      f'{jax.device_count()} global devices')
  return True


def is_main() -> bool:
  """Whether this is process 0 (the one that writes metrics and logs)."""
  return jax.process_index() == 0


def digest(tree: Any) -> bytes:
  """A SHA-256 of nested dicts / lists of arrays and scalars, key order
  independent, dtypes and shapes included."""
  h = hashlib.sha256()

  def visit(x, path: str) -> None:
    if isinstance(x, Mapping):
      for key in sorted(x, key=str):
        visit(x[key], f'{path}/{key}')
    elif isinstance(x, (list, tuple)):
      h.update(f'{path}:seq{len(x)};'.encode())
      for i, item in enumerate(x):
        visit(item, f'{path}[{i}]')
    elif x is None or isinstance(x, (str, bool, int, float)):
      h.update(f'{path}={x!r};'.encode())
    else:
      a = np.asarray(x)
      h.update(f'{path}:{a.dtype.str}{a.shape};'.encode())
      h.update(np.ascontiguousarray(a).tobytes())

  visit(tree, '')
  return h.digest()


def check_agree(value: bytes, *, what: str, step: int) -> None:
  """Raises HostDriftError unless every process passes the same digest.

  Every process must call this at the same point (it is a collective).
  """
  if jax.process_count() == 1:
    return
  mine = np.frombuffer(value, np.uint8)
  every = np.asarray(multihost_utils.process_allgather(mine))
  differ = [p for p in range(every.shape[0])
            if not np.array_equal(every[p], every[0])]
  if differ:
    raise HostDriftError(
        f'step {step}: {what} differs between process 0 '
        f'({every[0].tobytes().hex()[:12]}) and process {differ[0]} '
        f'({every[differ[0]].tobytes().hex()[:12]}) ({len(differ)} of '
        f'{every.shape[0]} processes differ): processes must run the same '
        'code, config and data files; check that every host reads '
        'identical files (paths, versions) and runs the same commit')


def _leaves(tree: Any, path: str = '') -> dict[str, Any]:
  """`tree`'s leaves by dotted path (`data.datasets[0].path`)."""
  if isinstance(tree, Mapping):
    out = {}
    for key in tree:
      out.update(_leaves(tree[key], f'{path}.{key}' if path else str(key)))
    return out
  if isinstance(tree, (list, tuple)) and tree:
    out = {}
    for i, item in enumerate(tree):
      out.update(_leaves(item, f'{path}[{i}]'))
    return out
  return {path: tree}


def check_same(tree: Any, *, what: str, hint: str) -> None:
  """Raises HostDriftError, naming the keys that differ, unless every
  process passes the same `tree` (nested dicts and lists, e.g. a config).

  Every process must call this at the same point (it is a collective).
  """
  if jax.process_count() == 1:
    return
  leaves = _leaves(tree)
  names = sorted(leaves)
  table = np.zeros((len(names), 32), np.uint8)
  for i, name in enumerate(names):
    table[i] = np.frombuffer(digest(leaves[name]), np.uint8)
  head = np.frombuffer(digest(names) + digest(table), np.uint8)
  every = np.asarray(multihost_utils.process_allgather(head))
  differ = [p for p in range(every.shape[0])
            if not np.array_equal(every[p], every[0])]
  if not differ:
    return
  p = differ[0]
  if not np.array_equal(every[p][:32], every[0][:32]):
    keys = 'other keys (the processes run different code)'
  else:  # the same keys: the tables have one shape, and can be gathered
    tables = np.asarray(multihost_utils.process_allgather(table))
    bad = [n for i, n in enumerate(names)
           if not np.array_equal(tables[p][i], tables[0][i])]
    keys = ', '.join(bad[:5]) + ', ...' * (len(bad) > 5)
  raise HostDriftError(
      f'{what} differs between process 0 and process {p} ({keys}; '
      f'{len(differ)} of {every.shape[0]} processes differ): {hint}')


def check_same_run(meta: Mapping[str, Any]) -> None:
  """Raises HostDriftError unless every process runs the same config on
  the same model and data files, as the checkpoint notes `meta` describe
  them (a collective). Only `distributed.initialize`, `coordinator` and
  `process_id` may differ (`check_every` decides which collectives run)."""
  config = dict(meta['config'])
  config['distributed'] = {k: v for k, v in config.get('distributed', {})
                           .items() if k not in ('initialize', 'coordinator',
                                                 'process_id')}
  check_same(
      {**meta, 'config': config}, what='the run (config, model or data)',
      hint='every process must run the same command on the same files; '
      'check the flags, the config file and that every host reads identical '
      'data files (paths, versions)')


def agree_on_step(step: int) -> list[int]:
  """Every process's `step` (in process order): a collective."""
  if jax.process_count() == 1:
    return [step]
  every = multihost_utils.process_allgather(np.asarray([step], np.int64))
  return [int(v) for v in np.asarray(every).reshape(-1)]


# Stop requests that are no signal, with codes past every signal's.
_REQUESTS = {'on_step': 1000}


def agree_on_signal(name: str | None) -> str | None:
  """The stop signal one process received (the lowest such process's), or
  its `on_step` callback's request to stop, on every process; None when
  none did. A collective, like `check_agree`."""
  if jax.process_count() == 1:
    return name
  code = _REQUESTS.get(name) or (signal.Signals[name].value if name else 0)
  every = np.asarray(multihost_utils.process_allgather(
      np.asarray([code], np.int32))).reshape(-1)
  got = [int(v) for v in every if v]
  names = {v: k for k, v in _REQUESTS.items()}
  return (names.get(got[0]) or signal.Signals(got[0]).name) if got else None


# What a collective or the coordination service raises when another
# process of the run is gone (killed, or exited on an error).
_LOST = ('Gloo', 'DEADLINE_EXCEEDED', 'heartbeat', 'Connection reset',
         'Connection closed', 'UNAVAILABLE', 'Barrier')


def lost_contact(e: BaseException) -> errors.TrainingError | None:
  """The one-line error for `e` when it says that another process of a
  multi-process run is gone; None for any other error."""
  text = ' '.join(str(e).split())
  if (not jax.distributed.is_initialized() or isinstance(e, errors.UserError)
      or not any(marker in text for marker in _LOST)):
    return None
  return errors.TrainingError(
      f'process {jax.process_index()} of {jax.process_count()}: lost contact '
      f'with the other processes ({type(e).__name__}: {text[:160]}): one of '
      'them failed, stopped or was killed (its log says why); run the same '
      'command on every host to resume from the last checkpoint')


# How long process 0, which hosts jax's coordination service, outlives a
# failure: processes that failed at the same point (a check every process
# makes) exit first, not aborted by their service client when it vanishes.
_COORDINATOR_GRACE_S = 5.0


def exit_now(code: int) -> None:
  """Ends a multi-process run that failed at once (streams flushed), not
  at jax's shutdown barrier, which waits up to 5 minutes for the other
  processes and then aborts; they see this one gone and stop too."""
  if code and jax.distributed.is_initialized():
    sys.stdout.flush()
    sys.stderr.flush()
    if jax.process_index() == 0:
      time.sleep(_COORDINATOR_GRACE_S)
    os._exit(code)  # pylint: disable=protected-access


def owned_rows(array: jax.Array) -> np.ndarray:
  """Sorted row indices of a row-sharded global array this process owns.

  A row held by devices of several processes (replication over the mesh)
  is owned by the lowest process index among them.
  """
  n = array.shape[0]
  owner = np.full(n, jax.process_count(), np.int64)
  for device, index in array.sharding.devices_indices_map(array.shape).items():
    rows = np.arange(n)[index[0] if index else slice(None)]
    owner[rows] = np.minimum(owner[rows], device.process_index)
  return np.flatnonzero(owner == jax.process_index())


def local_rows(array: jax.Array, rows: np.ndarray) -> np.ndarray:
  """The values of `rows` (each held by this process) as one numpy array."""
  out = None
  for shard in array.addressable_shards:
    index = shard.index[0] if shard.index else slice(None)
    held = np.arange(array.shape[0])[index]
    data = np.asarray(shard.data)
    if out is None:
      out = np.zeros((len(rows),) + data.shape[1:], data.dtype)
    take = np.isin(rows, held)
    out[take] = data[np.searchsorted(held, rows[take])]
  return out if out is not None else np.zeros((0,), array.dtype)


def to_host(array: jax.Array) -> np.ndarray:
  """The whole array on every process (gathered where not addressable)."""
  if getattr(array, 'is_fully_addressable', True):
    return np.asarray(array)
  return np.asarray(multihost_utils.process_allgather(array, tiled=True))


def sum_over_processes(x: np.ndarray) -> np.ndarray:
  """The elementwise sum of `x` over processes (identity for one)."""
  if jax.process_count() == 1:
    return np.asarray(x)
  every = np.asarray(multihost_utils.process_allgather(np.asarray(x)))
  return every.sum(axis=0).astype(np.asarray(x).dtype)
