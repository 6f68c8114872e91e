"""Checksums of a checkpoint's arrays, checked when it is read.

orbax and tensorstore find a checkpoint whose files are missing, cut short
or unparseable, but not one whose array bytes changed after they were
written (a flipped bit, a block of a file overwritten in place): that one
restores, and a run would train on from the damaged values. So every save
records a checksum of each array (`digests`), and every read compares
(`verify`).

A leaf's checksum is two sums, modulo 2^32, over its values' 32-bit words
w_i in row-major order (a 1- or 2-byte value is one word, an 8-byte value
two, low word first):

    sum_i w_i (2i + 1)        and        sum_i fmix32(w_i xor 0x9E3779B9 i)

(fmix32: MurmurHash3's finaliser). Sums modulo 2^32 are exact in any order,
so a jax.Array sharded over devices and processes (summed where it
lives) gives the same checksum as the same values
in host memory. One changed word always changes the first sum (its weight
is odd); random damage to several words keeps both sums with a chance of
about 1 in 2^64.
"""

from collections.abc import Mapping
from typing import Any

import jax
from jax import lax
import jax.numpy as jnp
from jax.experimental import multihost_utils
import numpy as np

_GOLDEN = 0x9E3779B9
_M1, _M2 = 0x85EBCA6B, 0xC2B2AE35
_CHUNK = 1 << 22  # words per host pass


def path_name(path: tuple[Any, ...]) -> str:
  """A pytree path as 'a/b/0/c', the same for a dataclass's fields, a
  dict's keys and a list's indices (so a train state and the nested dicts
  orbax restores without a target name a leaf alike)."""
  return '/'.join(str(getattr(k, 'key', getattr(k, 'name', getattr(
      k, 'idx', k)))) for k in path)


def _fmix(h, xp):
  h = h ^ (h >> xp.uint32(16))
  h = h * xp.uint32(_M1)
  h = h ^ (h >> xp.uint32(13))
  h = h * xp.uint32(_M2)
  return h ^ (h >> xp.uint32(16))


def _sums(words, index, xp):
  """The two sums of words at flat positions `index` (uint32 arrays)."""
  first = (words * (index * xp.uint32(2) + xp.uint32(1))).sum(dtype=xp.uint32)
  second = _fmix(words ^ (index * xp.uint32(_GOLDEN)), xp).sum(
      dtype=xp.uint32)
  return first, second


def _device_words(x: jax.Array) -> jax.Array:
  if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  if x.dtype == jnp.bool_:
    x = x.astype(jnp.uint8)
  size = x.dtype.itemsize
  if size == 8:  # [..., 2], low word first, as in host memory
    return lax.bitcast_convert_type(x, jnp.uint32)
  unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[size]
  return lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)


def _device_index(shape: tuple[int, ...]) -> jax.Array:
  """Each element's row-major position modulo 2^32, built from iotas so
  that it is sharded like the array (no flattening)."""
  index = jnp.zeros(shape, jnp.uint32)
  stride = 1
  for dim in reversed(range(len(shape))):
    index = index + lax.broadcasted_iota(jnp.uint32, shape, dim) * jnp.uint32(
        stride % 2**32)
    stride *= shape[dim]
  return index


@jax.jit
def _device_checksum(x: jax.Array) -> jax.Array:
  """[2] uint32: the two sums of one array. One program per shape, dtype
  and placement (a model's leaves share a few), not one for the whole
  tree, whose compilation would grow with the number of leaves."""
  words = _device_words(x)
  return jnp.stack(_sums(words, _device_index(words.shape), jnp))


def _host_words(x: np.ndarray) -> np.ndarray:
  """x's values as flat uint32 words (see the module docstring)."""
  x = np.ascontiguousarray(x).reshape(-1)
  if x.dtype == object:
    raise TypeError(f'cannot checksum an object array ({x[:3]!r}...)')
  size = x.dtype.itemsize
  if size in (1, 2):
    return x.view(np.uint8 if size == 1 else np.uint16).astype(np.uint32)
  if size % 4 == 0:  # 4- and 8-byte numbers; str arrays (UCS-4)
    return x.view(np.uint32)
  return x.view(np.uint8).astype(np.uint32)


def host_checksum(x: Any) -> tuple[int, int]:
  """The two sums of an array in host memory."""
  words = _host_words(np.asarray(x))
  first = second = np.uint32(0)
  with np.errstate(over='ignore'):
    for start in range(0, words.size, _CHUNK):
      chunk = words[start:start + _CHUNK]
      index = np.arange(start, start + chunk.size, dtype=np.uint64).astype(
          np.uint32)
      a, b = _sums(chunk, index, np)
      first, second = first + a, second + b
  return int(first), int(second)


def _hex(first: int, second: int) -> str:
  return f'{first:08x}{second:08x}'


def digests(tree: Any) -> dict[str, str]:
  """Each leaf's checksum (16 hex digits) by `path_name`. jax.Array
  leaves are summed where they live (on every process of a multi-process
  run, in the same order: each is a collective); others on the host."""
  out = {}
  for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if isinstance(x, jax.Array):
      # Awaited one by one: several sharded programs in flight at once can
      # starve the CPU backend's collectives of threads.
      value = _device_checksum(x)
      if not value.is_fully_addressable:  # several processes
        value = (value.addressable_data(0) if value.sharding
                 .is_fully_replicated else multihost_utils.process_allgather(
                     value, tiled=True))
      out[path_name(path)] = _hex(*(int(v) for v in np.asarray(value)))
    else:
      out[path_name(path)] = _hex(*host_checksum(x))
  return out


def mismatches(saved: Mapping[str, str], tree: Any) -> list[str]:
  """Paths of `tree`'s leaves whose checksum differs from `saved`'s;
  leaves `saved` has no checksum for are not compared."""
  now = digests(tree)
  return [path for path, value in now.items()
          if path in saved and saved[path] != value]
