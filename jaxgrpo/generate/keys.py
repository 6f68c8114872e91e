"""Per-sample PRNG keys: a sample's draws depend on which sample it is.

Token t of sample g of an example draws with

  fold_in(fold_in(prompt_key, g), t),
  prompt_key = fold_in(fold_in(fold_in(seed_key, id_hi), id_lo), epoch),

where (id_hi, id_lo) are the two 32-bit halves of the example id's BLAKE2b
hash. Nothing in it depends on the sample's row, slot or batch-mates, so
the static and continuous generators draw the same tokens for the same
sample, whatever the batch it lands in, and a resumed run redraws exactly.
An example offered twice in one call (a dataset smaller than the round)
is keyed apart by its `repeats` count, passed as the epoch.
"""

import collections
from collections.abc import Sequence
import hashlib

import jax
import jax.numpy as jnp
import numpy as np


def key_words() -> int:
  """uint32 words in a key's data under JAX's default PRNG implementation
  (2 for threefry, 4 for `rbg`): the per-sample key data that the
  continuous engine holds."""
  return jax.eval_shape(
      lambda: jax.random.key_data(jax.random.key(0))).shape[-1]


def sample_key_data(prompt_keys_N: jax.Array, g: int) -> jax.Array:
  """[N * G, K] uint32 key data of N prompts' G sample keys (`sample_keys`),
  K words a key of JAX's default PRNG implementation (`key_words`), with
  which the continuous engine rebuilds them.

  Raises:
    ValueError: keys of another implementation than the default.
  """
  if jnp.issubdtype(prompt_keys_N.dtype, jax.dtypes.prng_key):
    impl = str(jax.random.key_impl(prompt_keys_N))
    if impl != jax.config.jax_default_prng_impl:
      raise ValueError(
          f'prompt keys of the {impl!r} PRNG: the continuous engine draws '
          "with JAX's default implementation "
          f'({jax.config.jax_default_prng_impl!r}); make them with '
          'jax.random.key, or set jax_default_prng_impl')
  keys_R = sample_keys(prompt_keys_N, g)
  if jnp.issubdtype(keys_R.dtype, jax.dtypes.prng_key):
    keys_R = jax.random.key_data(keys_R)
  return keys_R


def id_hash(example_id: str) -> tuple[int, int]:
  """The example id's 64-bit BLAKE2b hash as two uint32 halves."""
  h = int.from_bytes(
      hashlib.blake2b(example_id.encode(), digest_size=8).digest(), 'little')
  return h >> 32, h & 0xFFFFFFFF


def prompt_keys(
    seed_key: jax.Array, example_ids: Sequence[str],
    epoch: int | Sequence[int]
) -> jax.Array:
  """One key per prompt from (seed, example id, epoch).

  Args:
    seed_key: the run's PRNG key (not folded with the step).
    example_ids: B example ids, one per prompt row.
    epoch: the examples' epoch, or B of them (a repeated example draws
      anew; `repeats` numbers the offers of one call).

  Returns:
    [B] keys.
  """
  halves = np.array([id_hash(i) for i in example_ids], np.uint32)
  halves = halves.reshape(len(example_ids), 2)
  epoch_B = np.broadcast_to(np.asarray(epoch, np.uint32), len(example_ids))
  fold = lambda hi, lo, e: jax.random.fold_in(
      jax.random.fold_in(jax.random.fold_in(seed_key, hi), lo), e)
  return jax.vmap(fold)(jnp.asarray(halves[:, 0]), jnp.asarray(halves[:, 1]),
                        jnp.asarray(epoch_B))


def repeats(example_ids: Sequence[str]) -> list[int]:
  """How often each id occurred before it in `example_ids` (0 for its
  first offer): as `prompt_keys`' epochs, they give an example that a draw
  offers twice other samples the second time, instead of the same ones."""
  seen = collections.Counter()
  out = []
  for i in example_ids:
    out.append(seen[i])
    seen[i] += 1
  return out


def row_prompt_keys(rng: jax.Array, num_prompts: int) -> jax.Array:
  """[B] keys fold_in(rng, b): per-sample keying without example ids.

  A prompt's draws then depend on its row b, not on the other prompts.
  """
  return jax.vmap(lambda b: jax.random.fold_in(rng, b))(
      jnp.arange(num_prompts, dtype=jnp.uint32))


def sample_keys(prompt_keys_B: jax.Array, num_samples: int) -> jax.Array:
  """[R] keys, row b * G + g = fold_in(prompt_keys_B[b], g)."""
  g_R = jnp.tile(jnp.arange(num_samples, dtype=jnp.uint32),
                 prompt_keys_B.shape[0])
  return jax.vmap(jax.random.fold_in)(
      jnp.repeat(prompt_keys_B, num_samples, axis=0), g_R)


def token_keys(sample_keys_R: jax.Array, columns_R: jax.Array) -> jax.Array:
  """[R] keys for each row's token at output column `columns_R[r]`."""
  return jax.vmap(jax.random.fold_in)(sample_keys_R,
                                      columns_R.astype(jnp.uint32))
