"""Device state and jitted steps of continuous batching.

`generate.continuous` drives these from the host: `init` builds S empty
slots and a Q-entry prompt stash, `prefill` runs A prompts of one bucket
width into stash entries, `chunk` admits samples into slots and decodes up
to a chunk of steps, `flush` copies finished slots to their output rows,
`resume` puts samples decoded part-way (by older params) back into slots,
`compact` keeps some slots and drops the rest.

Einsum letters / suffixes follow `jaxgrpo.typing`, plus S slots (here not
the cache length, which is C = P_max + T - 1), Q stash entries, A prompts
per prefill call and W their bucket width.

Size: the slots' device state and every jitted step that changes it,
which must agree on its layout (`Slots`, `Stash`), are kept together.
"""

import functools

import flax.struct
from flax import nnx
import jax
import jax.numpy as jnp

from jaxgrpo import sharding
from jaxgrpo.generate import keys as keys_lib
from jaxgrpo.generate.generator import Completions
from jaxgrpo.generate.generator import Generator
from jaxgrpo.model import attention

_STASH_AXES = (None,) + attention.CACHE_AXES[1:]


@flax.struct.dataclass(kw_only=True)
class Slots:
  """Decode state of S slots (C = P_max + T - 1 cache columns).

  Attributes:
    last_tokens: [S] int32, the token fed next.
    positions: [S] int32, RoPE position of `last_tokens`.
    cache_index: [S] int32, cache column for the key of `last_tokens`.
    key_mask: [S, C] bool, cache columns holding the slot's keys.
    cache: per-layer KV cache, dict(k=[S, C, K, H], v=[S, C, K, H]).
    tokens: [S, T] int32, the slot's sample so far, pad-filled.
    logps: [S, T] float32, their log-probs, zero-filled.
    lengths: [S] int32, tokens generated (the next column).
    active: [S] bool, still decoding.
    owner: [S] int32, output row of the slot's sample, -1 if none.
    keys: [S, K] uint32, key data of the sample's key.
    stop_at: [S] int32, forced length (0: none).
  """

  last_tokens: jax.Array
  positions: jax.Array
  cache_index: jax.Array
  key_mask: jax.Array
  cache: attention.Cache
  tokens: jax.Array
  logps: jax.Array
  lengths: jax.Array
  active: jax.Array
  owner: jax.Array
  keys: jax.Array
  stop_at: jax.Array


@flax.struct.dataclass(kw_only=True)
class Stash:
  """Prefilled prompts waiting for their samples' slots (Q entries).

  Attributes:
    cache: per-layer dict(k=[Q, P_max, K, H], v=...), a prompt of bucket
      width W in columns [0, W), left-padded.
    key_mask: [Q, P_max] bool, columns holding real prompt keys.
    logits: [Q, V] float32, logits after the prompt's last token.
    lengths: [Q] int32, real prompt tokens (the first token's position).
    width: [Q] int32, W (the first generated key's cache column).
  """

  cache: attention.Cache
  key_mask: jax.Array
  logits: jax.Array
  lengths: jax.Array
  width: jax.Array


@flax.struct.dataclass(kw_only=True)
class Admission:
  """Samples entering slots this chunk; -1 where a slot is not refilled.

  Attributes:
    source: [S] int32, stash entry of the sample's prompt, or -1.
    row: [S] int32, the sample's output row b * G + g.
    keys: [S, K] uint32, the sample's key data.
    stop_at: [S] int32, its forced stop length (0: none).
  """

  source: jax.Array
  row: jax.Array
  keys: jax.Array
  stop_at: jax.Array


@flax.struct.dataclass(kw_only=True)
class Resume:
  """Samples taken up part-way; a `slot` past the last row pads the call.

  Attributes:
    slot: [A] int32, the slot each sample goes to.
    prompt_tokens: [A, P_max] int32, its left-padded prompt.
    prompt_mask: [A, P_max] bool, True on real prompt tokens.
    tokens: [A, T] int32, its tokens so far, pad-filled.
    logps: [A, T] float32, their sampling log-probs, zero-filled.
    lengths: [A] int32, L, tokens so far (1 <= L < T).
    keys: [A, K] uint32, key data of the sample's key.
    stop_at: [A] int32, forced length (0: none).
  """

  slot: jax.Array
  prompt_tokens: jax.Array
  prompt_mask: jax.Array
  tokens: jax.Array
  logps: jax.Array
  lengths: jax.Array
  keys: jax.Array
  stop_at: jax.Array


def _constrain(slots: Slots) -> Slots:
  """Slot rows on the batch axes, the cache by its logical axes."""
  rows = lambda x: sharding.constrain(x, ('batch',) + (None,) * (x.ndim - 1))
  cache = jax.tree.map(lambda c: sharding.constrain(c, attention.CACHE_AXES),
                       slots.cache)
  return jax.tree.map(rows, slots.replace(cache=None)).replace(cache=cache)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def init(gen: Generator, mesh: sharding.MeshContext | None,
         prompt_width: int, n_slots: int, n_stash: int
         ) -> tuple[Slots, Stash]:
  """S empty slots and an empty Q-entry stash for prompts of width P."""
  cfg = gen.model_cfg
  t = gen.max_new_tokens
  c = prompt_width + t - 1
  with sharding.activate(mesh):
    zeros = lambda *shape: jnp.zeros(shape, jnp.int32)
    slots = _constrain(Slots(
        last_tokens=zeros(n_slots),
        positions=zeros(n_slots),
        cache_index=zeros(n_slots),
        key_mask=jnp.zeros((n_slots, c), bool),
        cache=attention.init_cache(cfg, n_slots, c),
        tokens=jnp.full((n_slots, t), gen.pad_id, jnp.int32),
        logps=jnp.zeros((n_slots, t), jnp.float32),
        lengths=zeros(n_slots),
        active=jnp.zeros((n_slots,), bool),
        owner=jnp.full((n_slots,), -1, jnp.int32),
        keys=jnp.zeros((n_slots, keys_lib.key_words()), jnp.uint32),
        stop_at=zeros(n_slots),
    ))
    cache = attention.init_cache(cfg, n_stash, prompt_width)
    stash = Stash(
        cache=jax.tree.map(lambda x: sharding.constrain(x, _STASH_AXES),
                           cache),
        key_mask=jnp.zeros((n_stash, prompt_width), bool),
        logits=jnp.zeros((n_stash, cfg.vocab_size), jnp.float32),
        lengths=zeros(n_stash),
        width=zeros(n_stash),
    )
  return slots, stash


@functools.partial(jax.jit, static_argnums=(1, 2))
def init_out(pad_id: int, rows: int, t: int) -> Completions:
  return Completions(
      tokens=jnp.full((rows, t), pad_id, jnp.int32),
      logps=jnp.zeros((rows, t), jnp.float32),
      mask=jnp.zeros((rows, t), bool),
      lengths=jnp.zeros((rows,), jnp.int32),
  )


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=3)
def prefill(
    gen: Generator,
    mesh: sharding.MeshContext | None,
    params: nnx.State,
    stash: Stash,
    tokens_AW: jax.Array,
    mask_AW: jax.Array,
    dest_A: jax.Array,
) -> Stash:
  """Prefills A prompts of width W into stash entries `dest_A` (Q: none)."""
  with sharding.activate(mesh):
    model = nnx.merge(gen.graphdef, params)
    a, w = tokens_AW.shape
    p = stash.key_mask.shape[1]
    real_AW = mask_AW.astype(bool)
    positions_AW = jnp.maximum(
        jnp.cumsum(real_AW, axis=1, dtype=jnp.int32) - 1, 0)
    mask_AWW = jnp.tril(jnp.ones((w, w), bool))[None] & real_AW[:, None, :]
    cache = attention.init_cache(gen.model_cfg, a, w)
    x_AWD, cache = model.backbone(
        model.embed(tokens_AW.astype(jnp.int32)), positions_AW, mask_AWW,
        cache, jnp.int32(0))
    logits_AV = model.unembed(x_AWD[:, -1:])[:, 0]
    put = lambda old, new: old.at[dest_A, :w].set(new, mode='drop')
    return stash.replace(
        cache=jax.tree.map(
            lambda old, new: sharding.constrain(put(old, new), _STASH_AXES),
            stash.cache, cache),
        key_mask=stash.key_mask.at[dest_A].set(
            jnp.pad(real_AW, ((0, 0), (0, p - w))), mode='drop'),
        logits=stash.logits.at[dest_A].set(logits_AV, mode='drop'),
        lengths=stash.lengths.at[dest_A].set(
            real_AW.sum(axis=1, dtype=jnp.int32), mode='drop'),
        width=stash.width.at[dest_A].set(w, mode='drop'),
    )


# Resumed samples are prefilled to one of RESUME_WIDTHS widths (tokens so
# far), steps of at least RESUME_MIN tokens up to T - 1 (`resume_width`).
RESUME_WIDTHS = 4
RESUME_MIN = 64


def resume_width(t: int, longest: int) -> int:
  """Generated columns `resume` prefills for samples of at most `longest`
  tokens so far, with T = t: the smallest of `attention.lengths_up_to(t -
  1, RESUME_WIDTHS, RESUME_MIN)` that holds the longest's first L - 1."""
  return next(
      w for w in attention.lengths_up_to(t - 1, RESUME_WIDTHS, RESUME_MIN)
      if w >= longest - 1)


@functools.partial(jax.jit, static_argnums=(0, 1, 2), donate_argnums=4)
def resume(
    gen: Generator,
    mesh: sharding.MeshContext | None,
    width: int,
    params: nnx.State,
    slots: Slots,
    rs: Resume,
) -> Slots:
  """Rebuilds A part-way samples' caches under `params` into their slots.

  Each sample's prompt and first L - 1 tokens are prefilled as one
  sequence of P_max + `width` columns (prompt in [0, P_max), token i at
  P_max + i; `width` >= L - 1 for every sample, from `resume_width`), so
  the slot's cache holds their keys and values under the current params
  (its columns past them empty); its token L - 1 is fed next, at column
  P_max + L - 1, and its token L draws with the key of column L, as if
  never stopped. Cost: one forward over P_max + `width` positions per
  sample; one compilation per width.
  """
  with sharding.activate(mesh):
    model = nnx.merge(gen.graphdef, params)
    a, p = rs.prompt_tokens.shape
    full = slots.key_mask.shape[1]
    c = p + width
    tokens_AC = jnp.concatenate([rs.prompt_tokens, rs.tokens[:, :width]], 1)
    real_AC = jnp.concatenate(
        [rs.prompt_mask.astype(bool),
         jnp.arange(width)[None] < rs.lengths[:, None] - 1], 1)
    positions_AC = jnp.maximum(
        jnp.cumsum(real_AC, axis=1, dtype=jnp.int32) - 1, 0)
    mask_ACC = jnp.tril(jnp.ones((c, c), bool))[None] & real_AC[:, None, :]
    _, cache = model.backbone(
        model.embed(tokens_AC.astype(jnp.int32)), positions_AC, mask_ACC,
        attention.init_cache(gen.model_cfg, a, c), jnp.int32(0))
    cache = jax.tree.map(
        lambda x: jnp.pad(x, ((0, 0), (0, full - c), (0, 0), (0, 0))), cache)
    real_AC = jnp.pad(real_AC, ((0, 0), (0, full - c)))
    put = lambda old, new: old.at[rs.slot].set(new, mode='drop')
    last_A = jnp.take_along_axis(rs.tokens, rs.lengths[:, None] - 1, 1)[:, 0]
    return _constrain(slots.replace(
        last_tokens=put(slots.last_tokens, last_A),
        positions=put(slots.positions, positions_AC[:, p - 1] + rs.lengths),
        cache_index=put(slots.cache_index, p - 1 + rs.lengths),
        key_mask=put(slots.key_mask, real_AC),
        cache=jax.tree.map(put, slots.cache, cache),
        tokens=put(slots.tokens, rs.tokens),
        logps=put(slots.logps, rs.logps),
        lengths=put(slots.lengths, rs.lengths),
        active=put(slots.active, jnp.ones((a,), bool)),
        owner=put(slots.owner, rs.slot),
        keys=put(slots.keys, rs.keys),
        stop_at=put(slots.stop_at, rs.stop_at),
    ))


@functools.partial(jax.jit, static_argnums=(0, 1, 2), donate_argnums=4)
def chunk(
    gen: Generator,
    steps: int,
    mesh: sharding.MeshContext | None,
    params: nnx.State,
    slots: Slots,
    stash: Stash,
    admission: Admission,
) -> tuple[Slots, jax.Array, jax.Array]:
  """Admits samples, then decodes every slot for up to `steps` steps.

  Returns:
    (slots, decode steps run, slot-steps that produced a token).
  """
  with sharding.activate(mesh):
    slots = _admit(gen, slots, stash, admission)
    return _decode(gen, steps, params, slots)


def _admit(gen: Generator, slots: Slots, stash: Stash,
           adm: Admission) -> Slots:
  """Refills the slots with `adm.source >= 0` and draws their first token."""
  t = gen.max_new_tokens
  p = stash.key_mask.shape[1]
  c = slots.key_mask.shape[1]
  new_S = adm.source >= 0
  q_S = jnp.maximum(adm.source, 0)

  def copy(slot_c, stash_c):
    head = jnp.where(new_S[:, None, None, None], stash_c[q_S], slot_c[:, :p])
    return jax.lax.dynamic_update_slice(slot_c, head, (0, 0, 0, 0))

  keys_S = jnp.where(new_S[:, None], adm.keys, slots.keys)
  stop_S = jnp.where(new_S, adm.stop_at, slots.stop_at)
  logits_SV = stash.logits[q_S]
  zeros_S = jnp.zeros(new_S.shape, jnp.int32)
  first_S = gen.draw(logits_SV, zeros_S, None,
                     jax.random.wrap_key_data(keys_S), stop_S)
  first_logp_S = gen.sampling.logps(logits_SV, first_S)
  column_T = jnp.arange(t)[None]
  renew = lambda new, old: jnp.where(
      new_S.reshape((-1,) + (1,) * (old.ndim - 1)), new, old)
  return _constrain(slots.replace(
      last_tokens=renew(first_S, slots.last_tokens),
      positions=renew(stash.lengths[q_S], slots.positions),
      cache_index=renew(stash.width[q_S], slots.cache_index),
      key_mask=renew(jnp.pad(stash.key_mask[q_S], ((0, 0), (0, c - p))),
                     slots.key_mask),
      cache=jax.tree.map(copy, slots.cache, stash.cache),
      tokens=renew(jnp.where(column_T == 0, first_S[:, None], gen.pad_id),
                   slots.tokens),
      logps=renew(jnp.where(column_T == 0, first_logp_S[:, None], 0.0),
                  slots.logps),
      lengths=renew(1, slots.lengths),
      active=renew(~gen._is_stop(first_S) & (t > 1), slots.active),
      owner=renew(adm.row, slots.owner),
      keys=keys_S,
      stop_at=stop_S,
  ))


def _decode(gen: Generator, steps: int, params: nnx.State,
            slots: Slots) -> tuple[Slots, jax.Array, jax.Array]:
  model = nnx.merge(gen.graphdef, params)
  t = gen.max_new_tokens
  c = slots.key_mask.shape[1]
  column_T = jnp.arange(t)[None]
  column_C = jnp.arange(c)[None]

  def cond(carry):
    i, _, s = carry
    return (i < steps) & jnp.any(s.active)

  def body(carry):
    i, busy, s = carry
    key_mask_SC = s.key_mask | (column_C == s.cache_index[:, None])
    logits_S1V, cache = model(
        s.last_tokens[:, None], s.positions[:, None], key_mask_SC[:, None, :],
        s.cache, s.cache_index)
    logits_SV = logits_S1V[:, 0]
    tokens_S = gen.draw(logits_SV, s.lengths, None,
                        jax.random.wrap_key_data(s.keys), s.stop_at)
    logps_S = gen.sampling.logps(logits_SV, tokens_S)
    write_ST = s.active[:, None] & (column_T == s.lengths[:, None])
    step_S = s.active.astype(jnp.int32)
    lengths_S = s.lengths + step_S
    done_S = gen._is_stop(tokens_S) | (lengths_S >= t)
    s = _constrain(s.replace(
        last_tokens=jnp.where(s.active, tokens_S, s.last_tokens),
        positions=s.positions + step_S,
        cache_index=s.cache_index + step_S,
        key_mask=key_mask_SC,
        cache=cache,
        tokens=jnp.where(write_ST, tokens_S[:, None], s.tokens),
        logps=jnp.where(write_ST, logps_S[:, None], s.logps),
        lengths=lengths_S,
        active=s.active & ~done_S,
    ))
    return i + 1, busy + step_S.sum(), s

  ran, busy, slots = jax.lax.while_loop(
      cond, body, (jnp.int32(0), jnp.int32(0), slots))
  return slots, ran, busy


@functools.partial(jax.jit, static_argnums=0)
def compact(mesh: sharding.MeshContext | None, slots: Slots,
            index: jax.Array) -> Slots:
  """Slots `index` ([S'] int32, in that order) as S' slots: a round's
  drain, once no sample waits, decodes its last rows in fewer slots. Each
  slot moves whole (cache, tokens, key, owner), so its sample continues as
  it would have."""
  with sharding.activate(mesh):
    return _constrain(jax.tree.map(lambda x: x[index], slots))


@functools.partial(jax.jit, static_argnums=0, donate_argnums=1)
def flush(mesh: sharding.MeshContext | None, out: Completions,
           slots: Slots) -> Completions:
  """Copies finished slots' samples to their output rows (idempotent)."""
  rows = out.lengths.shape[0]
  with sharding.activate(mesh):
    dest_S = jnp.where((slots.owner >= 0) & ~slots.active, slots.owner, rows)
    put = lambda old, new: sharding.constrain(
        old.at[dest_S].set(new, mode='drop'),
        ('batch',) + (None,) * (old.ndim - 1))
    return out.replace(
        tokens=put(out.tokens, slots.tokens),
        logps=put(out.logps, slots.logps),
        lengths=put(out.lengths, slots.lengths),
    )


@jax.jit
def completions(out: Completions) -> Completions:
  t = out.tokens.shape[1]
  return out.replace(mask=jnp.arange(t)[None, :] < out.lengths[:, None])

