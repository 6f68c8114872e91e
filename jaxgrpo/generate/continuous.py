"""Continuous batching: a fixed set of decode slots, refilled as rows end.

The static `Generator` decodes all R = B * G rows until the longest ends,
so with real completion lengths most rows idle most of the time.
`ContinuousGenerator` decodes S fixed slots instead: when a slot's sample
emits a stop token or reaches max_new_tokens, the slot takes the next
waiting sample (row order b * G + g). The loop is driven by the host:

  1. admission plan (host, numpy): the free slots, in increasing order,
     take the next waiting samples; prompts not yet prefilled are
     prefilled into a small prompt stash (`_prefill`, a few at a time);
  2. `_chunk` (one jitted call) copies each admitted sample's prompt keys
     and values from the stash into its slot, draws its first token from
     the stash's last-position logits, then decodes every slot for up to
     `chunk` steps (a while_loop that also stops once no slot is active);
  3. the host reads which slots are still active, `_flush` copies the
     finished slots' tokens to their rows of the output, and it repeats.

Design:
  * The G samples of a prompt share one prefill: the stash holds a prompt's
    keys and values until its G samples are all admitted, and each
    admission copies them into the sample's slot.
  * Slots keep their own cache positions: each slot writes its next key at
    its own column (`attention.update_cache` with a [S] index), so a slot's
    cache reads [prompt keys, generated keys] whatever the others do.
  * Shapes are static. Slot caches have P_max + T - 1 columns (P_max the
    input's prompt width); prompts are prefilled at the narrowest of the
    bucket widths (`buckets` below P_max, and P_max) holding their real
    tokens, `prefill_batch` prompts per call. Compilations per generator,
    mesh and (B, P_max) input: one `_init`, one `_chunk`, one `_flush` and
    one `_prefill` per bucket width used, so at most
    3 + len(widths(P_max)); `_chunk` and `_prefill` do not depend on B.
  * Per-sample keys (`generate.keys`): token t of row b * G + g draws with
    fold_in(fold_in(prompt_keys[b], g), t), whatever its slot or
    batch-mates, which is how the static generator draws when given
    `prompt_keys`; the two then agree (up to float summation order where
    the prompt widths differ, see tests/generate/test_continuous.py).
  * Under a mesh the slots are split over the batch axes (S is rounded up
    to a multiple of the batch devices), the stash is replicated, and the
    host's plan depends only on the inputs and the gathered `active` flags,
    so every process of a multi-process run makes the same decisions.
  * One host round trip per chunk: larger chunks sync less but leave a
    finished slot idle for up to `chunk - 1` steps.
"""

import dataclasses
import functools

import flax.struct
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo import multihost
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
    keys: [S, 2] uint32, key data of the sample's key.
    stop_at: [S] int32, forced stop length (0: none).
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
    keys: [S, 2] uint32, the sample's key data.
    stop_at: [S] int32, its forced stop length (0: none).
  """

  source: jax.Array
  row: jax.Array
  keys: jax.Array
  stop_at: jax.Array


@dataclasses.dataclass(frozen=True)
class EngineStats:
  """What a continuous `generate` did.

  Attributes:
    chunks: `_chunk` calls (host round trips).
    prefill_calls: `_prefill` calls.
    decode_steps: decode steps run over all chunks.
    busy_slot_steps: slot-steps that produced a token.
    slots: S.
  """

  chunks: int
  prefill_calls: int
  decode_steps: int
  busy_slot_steps: int
  slots: int

  @property
  def occupancy(self) -> float:
    """Share of slot-steps that produced a token."""
    return self.busy_slot_steps / max(self.decode_steps * self.slots, 1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ContinuousGenerator:
  """Samples like `generator`, decoding in `slots` continuously refilled slots.

  Hashable (a static jit argument). `generate` takes and returns what
  `Generator.generate` does, rows in the original order b * G + g.

  Attributes:
    generator: the model, sampling, T, G, stop and pad ids.
    slots: S, decode slots (rounded up to a multiple of the batch devices).
    chunk: decode steps per host round trip.
    buckets: prompt prefill widths; the input's width P is always one, and
      widths >= P are dropped.
    prefill_batch: prompts per prefill call.
  """

  generator: Generator
  slots: int = 64
  chunk: int = 8
  buckets: tuple[int, ...] = (32, 64, 128, 256, 512)
  prefill_batch: int = 1

  def __post_init__(self):
    for name in ('slots', 'chunk', 'prefill_batch'):
      if getattr(self, name) < 1:
        raise ValueError(
            f'ContinuousGenerator.{name} must be >= 1, got '
            f'{getattr(self, name)}')
    object.__setattr__(self, 'buckets',
                       tuple(sorted({int(b) for b in self.buckets})))
    if any(b < 1 for b in self.buckets):
      raise ValueError(
          f'ContinuousGenerator.buckets must be >= 1, got {self.buckets}')

  @property
  def num_samples(self) -> int:
    return self.generator.num_samples

  @property
  def max_new_tokens(self) -> int:
    return self.generator.max_new_tokens

  def widths(self, prompt_width: int) -> tuple[int, ...]:
    """Prefill widths for inputs of width P: the buckets below P, then P."""
    return tuple(b for b in self.buckets if b < prompt_width) + (
        prompt_width,)

  def generate(self, params: nnx.State, prompt_tokens_BP: jax.Array,
               prompt_mask_BP: jax.Array, rng: jax.Array,
               **kwargs) -> Completions:
    """Samples G completions per prompt; see `generate_with_stats`."""
    return self.generate_with_stats(params, prompt_tokens_BP, prompt_mask_BP,
                                    rng, **kwargs)[0]

  def generate_with_stats(
      self,
      params: nnx.State,
      prompt_tokens_BP: jax.Array,
      prompt_mask_BP: jax.Array,
      rng: jax.Array,
      *,
      prompt_keys: jax.Array | None = None,
      stop_at: jax.Array | None = None,
  ) -> tuple[Completions, EngineStats]:
    """Samples G completions per prompt in continuously refilled slots.

    Args:
      params: Decoder params.
      prompt_tokens_BP: int32 left-padded prompts, [B, P], the same on every
        process.
      prompt_mask_BP: bool, True on real prompt tokens, [B, P].
      rng: PRNG key; prompt b's key is fold_in(rng, b) unless `prompt_keys`.
      prompt_keys: [B] keys (`keys.prompt_keys`), for draws that depend on
        the examples rather than their rows.
      stop_at: [R] int32, force the stop token as each row's `stop_at`-th
        token (0: never); a testing and benchmarking aid.

    Returns:
      (Completions with R = B * G rows in order b * G + g and T columns,
      what the engine did).
    """
    gen = self.generator
    tokens_BP = np.asarray(_host(prompt_tokens_BP), np.int32)
    mask_BP = np.asarray(_host(prompt_mask_BP), bool)
    b, p = tokens_BP.shape
    g, t = gen.num_samples, gen.max_new_tokens
    r = b * g
    if stop_at is not None and not gen.stop_tokens:
      raise ValueError('ContinuousGenerator: stop_at needs stop_tokens')
    stop_R = (np.zeros(r, np.int32) if stop_at is None
              else np.asarray(_host(stop_at), np.int32).reshape(r))
    if prompt_keys is None:
      prompt_keys = keys_lib.row_prompt_keys(rng, b)
    keys_R = keys_lib.sample_keys(prompt_keys, g)
    if jnp.issubdtype(keys_R.dtype, jax.dtypes.prng_key):
      keys_R = jax.random.key_data(keys_R)
    keys_R = np.asarray(_host(keys_R), np.uint32)

    multiple = sharding.batch_multiple()
    n_slots = -(-self.slots // multiple) * multiple
    n_stash = -(-n_slots // g) + 1
    mesh = sharding.current()
    slots, stash = _init(self, mesh, p, n_slots, n_stash)
    out = _init_out(gen.pad_id, r, t)

    widths = self.widths(p)
    real_B = mask_BP.sum(axis=1)
    if real_B.min(initial=1) < 1:
      raise ValueError('ContinuousGenerator: every prompt needs a real token')
    width_B = np.array([min(w for w in widths if w >= n) for n in real_B])
    entry_of: dict[int, int] = {}  # prompt -> stash entry
    free_entries = list(range(n_stash))
    left_B = np.full(b, g)  # samples of each prompt not yet admitted
    free = list(range(n_slots))
    next_row = 0
    chunks = prefills = steps = busy = 0
    while True:
      rows = list(range(next_row, next_row + min(len(free), r - next_row)))
      next_row += len(rows)
      needed = sorted({row // g for row in rows} - set(entry_of))
      for i in range(0, len(needed), self.prefill_batch):
        group = needed[i:i + self.prefill_batch]
        for prompt in group:
          entry_of[prompt] = free_entries.pop(0)
        stash = self._prefill_group(params, stash, tokens_BP, mask_BP,
                                    width_B, group, entry_of)
        prefills += 1
      source = np.full(n_slots, -1, np.int32)
      row_S = np.full(n_slots, -1, np.int32)
      keys_S = np.zeros((n_slots,) + keys_R.shape[1:], np.uint32)
      stop_S = np.zeros(n_slots, np.int32)
      for slot, row in zip(free, rows):
        prompt = row // g
        source[slot], row_S[slot] = entry_of[prompt], row
        keys_S[slot], stop_S[slot] = keys_R[row], stop_R[row]
        left_B[prompt] -= 1
        if not left_B[prompt]:
          free_entries.append(entry_of.pop(prompt))
      admission = _replicated(Admission(
          source=source, row=row_S, keys=keys_S, stop_at=stop_S))
      slots, chunk_steps, chunk_busy = _chunk(self, mesh, params, slots,
                                              stash, admission)
      out = _flush(mesh, out, slots)
      active = _host(slots.active)
      chunks += 1
      steps += int(_host(chunk_steps))
      busy += int(_host(chunk_busy))
      free = [s for s in range(n_slots) if not active[s]]
      if next_row == r and not active.any():
        break
    stats = EngineStats(chunks=chunks, prefill_calls=prefills,
                        decode_steps=steps, busy_slot_steps=busy,
                        slots=n_slots)
    return _completions(out), stats

  def _prefill_group(self, params, stash, tokens_BP, mask_BP, width_B, group,
                     entry_of) -> Stash:
    """Prefills prompts `group` into their stash entries, at one width."""
    n_stash = stash.lengths.shape[0]
    w = int(max(width_B[i] for i in group))
    pad = self.prefill_batch - len(group)
    # Padding prompts (one real token) go to entry n_stash: dropped.
    tokens_AW = np.concatenate(
        [tokens_BP[group, -w:], np.zeros((pad, w), np.int32)])
    mask_AW = np.concatenate(
        [mask_BP[group, -w:], np.arange(w)[None].repeat(pad, 0) == w - 1])
    dest_A = np.array([entry_of[i] for i in group] + [n_stash] * pad,
                      np.int32)
    inputs = _replicated((tokens_AW, mask_AW, dest_A))
    return _prefill(self, sharding.current(), params, stash, *inputs)


def _host(x) -> np.ndarray:
  """`x` as a host array on every process."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    if x.sharding.is_fully_replicated:
      return np.asarray(x.addressable_data(0))
    return multihost.to_host(x)
  return np.asarray(x)


def _replicated(tree):
  """Host arrays placed replicated on the active mesh (as they are without)."""
  return sharding.shard(
      tree, jax.tree.map(lambda _: sharding.replicated(), tree)
      if sharding.active_mesh() is not None else None)


def _constrain(slots: Slots) -> Slots:
  """Slot rows on the batch axes, the cache by its logical axes."""
  rows = lambda x: sharding.constrain(x, ('batch',) + (None,) * (x.ndim - 1))
  cache = jax.tree.map(lambda c: sharding.constrain(c, attention.CACHE_AXES),
                       slots.cache)
  return jax.tree.map(rows, slots.replace(cache=None)).replace(cache=cache)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def _init(cg: ContinuousGenerator, mesh: sharding.MeshContext | None,
          prompt_width: int, n_slots: int, n_stash: int
          ) -> tuple[Slots, Stash]:
  gen = cg.generator
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
        keys=jnp.zeros((n_slots, 2), jnp.uint32),
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
def _init_out(pad_id: int, rows: int, t: int) -> Completions:
  return Completions(
      tokens=jnp.full((rows, t), pad_id, jnp.int32),
      logps=jnp.zeros((rows, t), jnp.float32),
      mask=jnp.zeros((rows, t), bool),
      lengths=jnp.zeros((rows,), jnp.int32),
  )


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=3)
def _prefill(
    cg: ContinuousGenerator,
    mesh: sharding.MeshContext | None,
    params: nnx.State,
    stash: Stash,
    tokens_AW: jax.Array,
    mask_AW: jax.Array,
    dest_A: jax.Array,
) -> Stash:
  """Prefills A prompts of width W into stash entries `dest_A` (Q: none)."""
  gen = cg.generator
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


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=3)
def _chunk(
    cg: ContinuousGenerator,
    mesh: sharding.MeshContext | None,
    params: nnx.State,
    slots: Slots,
    stash: Stash,
    admission: Admission,
) -> tuple[Slots, jax.Array, jax.Array]:
  """Admits samples, then decodes every slot for up to `cg.chunk` steps.

  Returns:
    (slots, decode steps run, slot-steps that produced a token).
  """
  with sharding.activate(mesh):
    slots = _admit(cg.generator, slots, stash, admission)
    return _decode(cg, params, slots)


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


def _decode(cg: ContinuousGenerator, params: nnx.State,
            slots: Slots) -> tuple[Slots, jax.Array, jax.Array]:
  gen = cg.generator
  model = nnx.merge(gen.graphdef, params)
  t = gen.max_new_tokens
  c = slots.key_mask.shape[1]
  column_T = jnp.arange(t)[None]
  column_C = jnp.arange(c)[None]

  def cond(carry):
    i, _, s = carry
    return (i < cg.chunk) & jnp.any(s.active)

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

  steps, busy, slots = jax.lax.while_loop(
      cond, body, (jnp.int32(0), jnp.int32(0), slots))
  return slots, steps, busy


@functools.partial(jax.jit, static_argnums=0, donate_argnums=1)
def _flush(mesh: sharding.MeshContext | None, out: Completions,
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
def _completions(out: Completions) -> Completions:
  t = out.tokens.shape[1]
  return out.replace(mask=jnp.arange(t)[None, :] < out.lengths[:, None])
