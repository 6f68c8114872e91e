"""Batched generation with a KV cache: prefill once, decode in a while_loop.

Prompts arrive left-padded, so every row's last prompt token sits at column
P - 1 and every decode step writes one cache slot shared by all rows. Each
prompt is prefilled once; its cache is then repeated G times (row b * G + g)
and the G samples are decoded together.

Einsum letters / suffixes follow `jaxgrpo.typing`: B prompts, P prompt
length, R = B * G sequences, T generated length, S cache length, V vocab.

By default token t of every row draws with fold_in(rng, t), so a row's
draws depend on its place in the batch. Given per-prompt keys
(`jaxgrpo.generate.keys`), row b * G + g draws with
fold_in(fold_in(prompt_keys[b], g), t) instead: per-sample keys, the keying
of `generate.continuous`, so the two agree sample by sample.

Under a mesh (`jaxgrpo.sharding.use_mesh`) the params stay as placed, prompt
and sequence rows are split over the batch axes and the KV cache is
constrained by its logical axes; the decode state is still donated.

Size: the static engine's prefill and decode loop share its decode state
(`SamplingState`), and the continuous engine (`slots`) runs the same
`Generator`'s model, sampling and keys.
"""

import dataclasses
import functools

import flax.struct
from flax import nnx
import jax
import jax.numpy as jnp

from jaxgrpo import errors
from jaxgrpo import sharding
from jaxgrpo.generate import keys as keys_lib
from jaxgrpo.generate.sampling import Sampling
from jaxgrpo.model import attention
from jaxgrpo.model.config import ModelConfig


@flax.struct.dataclass(kw_only=True)
class Completions:
  """Generated continuations, prompt-major (row b * G + g).

  Attributes:
    tokens: [R, T] int32, generated ids; pad_id after the stop token.
    logps: [R, T] float32, log-prob of each generated token at sampling time
      (0 on padding).
    mask: [R, T] bool, True on generated tokens, the stop token included.
    lengths: [R] int32, generated tokens per row (stop token included).
  """

  tokens: jax.Array
  logps: jax.Array
  mask: jax.Array
  lengths: jax.Array


@flax.struct.dataclass(kw_only=True)
class SamplingState:
  """Decode loop carry. `step` tokens of every row are already sampled.

  Attributes:
    step: int32 scalar, tokens generated so far (the next column to fill).
    cache_index: int32 scalar, cache slot for the key of `last_tokens`.
    last_tokens: [R] int32, most recent sampled token, fed next.
    positions: [R] int32, RoPE position of `last_tokens`.
    key_mask: [R, S] bool, cache slots holding real keys.
    cache: per-layer KV cache, each dict(k=[R, S, K, H], v=[R, S, K, H]).
    tokens: [R, T] int32 output buffer, pad-filled.
    logps: [R, T] float32 output buffer, zero-filled.
    lengths: [R] int32, generated tokens per row so far.
    done: [R] bool, rows that emitted a stop token.
    rng: PRNG key; step t draws with fold_in(rng, t).
    sample_keys: [R] per-sample keys (step t of row r draws with
      fold_in(sample_keys[r], t)), or None to draw from `rng`.
    stop_at: [R] int32, the length at which each row's stop token is forced
      (stop tokens are not drawn before; 0: sample freely), or None.
  """

  step: jax.Array
  cache_index: jax.Array
  last_tokens: jax.Array
  positions: jax.Array
  key_mask: jax.Array
  cache: attention.Cache
  tokens: jax.Array
  logps: jax.Array
  lengths: jax.Array
  done: jax.Array
  rng: jax.Array
  sample_keys: jax.Array | None = None
  stop_at: jax.Array | None = None


def refuse_x64() -> None:
  """Raises where JAX computes in 64 bits: the model, caches and keys are
  32-bit, and jax_enable_x64 makes Python ints int64 beside them.

  Raises:
    errors.ConfigError: jax_enable_x64 is on.
  """
  if jax.config.jax_enable_x64:
    raise errors.ConfigError(
        'jax_enable_x64 is on (JAX_ENABLE_X64 or jax.config.update): jaxgrpo '
        'computes in 32 bits (its caches, positions and keys are int32); '
        'turn it off for the process that trains, evaluates or generates')


@dataclasses.dataclass(frozen=True, kw_only=True)
class Generator:
  """Samples `num_samples` completions per prompt with a KV cache.

  Frozen and hashable: it is the static argument of the jitted prefill and
  decode functions, so each (B, P) input shape compiles once per generator
  (and per active mesh).

  Attributes:
    graphdef: Decoder graph definition (from `decoder.init_params`).
    model_cfg: the Decoder's config.
    sampling: token sampling strategy.
    max_new_tokens: T, generated tokens per row at most.
    num_samples: G, completions per prompt.
    stop_tokens: ids that end a completion (kept, then padding).
    pad_id: id written after a completion ends.
  """

  graphdef: nnx.GraphDef
  model_cfg: ModelConfig
  sampling: Sampling
  max_new_tokens: int
  num_samples: int = 1
  stop_tokens: tuple[int, ...] = ()
  pad_id: int = 0

  def __post_init__(self):
    refuse_x64()
    if self.max_new_tokens < 1:
      raise ValueError(
          f'Generator.max_new_tokens must be >= 1, got {self.max_new_tokens}'
      )
    if self.num_samples < 1:
      raise ValueError(
          f'Generator.num_samples must be >= 1, got {self.num_samples}'
      )
    # A list would make the generator unhashable, hence unusable by jit.
    object.__setattr__(
        self, 'stop_tokens', tuple(int(t) for t in self.stop_tokens)
    )
    vocab = self.model_cfg.vocab_size
    for name, ids in (('stop_tokens', self.stop_tokens),
                      ('pad_id', (self.pad_id,))):
      if any(not 0 <= int(i) < vocab for i in ids):
        raise ValueError(
            f'Generator.{name} {ids} must be ids in [0, {vocab})'
        )
    # jit hashes its static arguments on every call, and hashing a GraphDef
    # walks the whole model graph; hash once instead.
    object.__setattr__(
        self, '_hash', hash(tuple(getattr(self, f.name)
                                  for f in dataclasses.fields(self)))
    )

  def __hash__(self) -> int:
    return self._hash

  def check_length(self, prompt_width: int) -> None:
    """Raises ValueError where prompts `prompt_width` wide and
    max_new_tokens reach past the positions the model's RoPE is right for
    (a 'dynamic' rope_scaling's max_position_embeddings)."""
    scaling = self.model_cfg.rope_scaling
    if scaling is not None and scaling.rope_type == 'dynamic':
      scaling.check_length(prompt_width + self.max_new_tokens,
                           'Generator: prompt width + max_new_tokens')

  def prefill(
      self,
      params: nnx.State,
      prompt_tokens_BP: jax.Array,
      prompt_mask_BP: jax.Array,
      rng: jax.Array,
      *,
      prompt_keys: jax.Array | None = None,
      stop_at: jax.Array | None = None,
  ) -> SamplingState:
    """Runs the prompts and samples the first token of every sequence.

    Args:
      params: Decoder params.
      prompt_tokens_BP: int32 left-padded prompts, [B, P].
      prompt_mask_BP: bool, True on real prompt tokens, [B, P]. Every prompt
        needs at least one real token.
      rng: PRNG key (unused with `prompt_keys`).
      prompt_keys: [B] keys (`keys.prompt_keys`): draw with per-sample keys.
      stop_at: [R] int32, each row's length: its first stop token is forced
        as its `stop_at`-th token and never drawn before (0: sample freely).
        A testing and benchmarking aid: it gives a random model chosen
        completion lengths.

    Returns:
      The decode state for R = B * G sequences.
    """
    # Rows on the batch axes; B should be a multiple of
    # `sharding.batch_multiple()` (otherwise the rows are replicated).
    rows = sharding.batch_sharding(2, prompt_tokens_BP.shape[0])
    if rows is not None:
      prompt_tokens_BP, prompt_mask_BP = sharding.shard(
          (prompt_tokens_BP, prompt_mask_BP), (rows, rows))
    if stop_at is not None and not self.stop_tokens:
      raise ValueError('Generator: stop_at needs stop_tokens')
    self.check_length(prompt_tokens_BP.shape[1])
    sample_keys = None
    if prompt_keys is not None:
      sample_keys = keys_lib.sample_keys(prompt_keys, self.num_samples)
    if stop_at is not None:
      stop_at = jnp.asarray(stop_at, jnp.int32)
    return _prefill(self, sharding.current(), params, prompt_tokens_BP,
                    prompt_mask_BP, rng, sample_keys, stop_at)

  def decode(self, params: nnx.State, state: SamplingState) -> SamplingState:
    """Decodes until every row stopped or T tokens exist.

    `state` is donated (its cache is updated in place): do not reuse it.
    """
    return _decode(self, sharding.current(), params, state)

  def generate(
      self,
      params: nnx.State,
      prompt_tokens_BP: jax.Array,
      prompt_mask_BP: jax.Array,
      rng: jax.Array,
      *,
      prompt_keys: jax.Array | None = None,
      stop_at: jax.Array | None = None,
  ) -> Completions:
    """Samples G completions per prompt; see `prefill` for arguments.

    Returns:
      Completions with R = B * G rows, row b * G + g the g-th sample of
      prompt b, and T = max_new_tokens columns.
    """
    state = self.prefill(params, prompt_tokens_BP, prompt_mask_BP, rng,
                         prompt_keys=prompt_keys, stop_at=stop_at)
    return _completions(self.decode(params, state))

  def draw(
      self,
      logits_RV: jax.Array,
      columns_R: jax.Array,
      rng: jax.Array,
      sample_keys_R: jax.Array | None,
      stop_at_R: jax.Array | None,
  ) -> jax.Array:
    """Tokens at output columns `columns_R`.

    Without `sample_keys_R` every row draws with fold_in(rng, column) (the
    columns are then all equal); with them row r draws with
    fold_in(sample_keys_R[r], columns_R[r]). A row with stop_at_R > 0 never
    draws a stop token and gets the first one at column stop_at_R - 1.
    Without stop tokens every row samples freely (the continuous engine
    passes zeros).
    """
    if not self.stop_tokens:
      stop_at_R = None
    if stop_at_R is not None:
      is_stop_V = self._is_stop(jnp.arange(logits_RV.shape[-1]))
      logits_RV = jnp.where((stop_at_R > 0)[:, None] & is_stop_V[None],
                            -jnp.inf, logits_RV)
    if sample_keys_R is None:
      tokens_R = self.sampling.next_tokens(
          logits_RV, jax.random.fold_in(rng, columns_R[0]))
    else:
      tokens_R = self.sampling.next_tokens_per_row(
          logits_RV, keys_lib.token_keys(sample_keys_R, columns_R))
    if stop_at_R is not None:
      tokens_R = jnp.where(columns_R + 1 == stop_at_R, self.stop_tokens[0],
                           tokens_R)
    return tokens_R

  def _is_stop(self, tokens_R: jax.Array) -> jax.Array:
    is_stop_R = jnp.zeros(tokens_R.shape, bool)
    for stop in self.stop_tokens:
      is_stop_R = is_stop_R | (tokens_R == stop)
    return is_stop_R


def _constrain(state: SamplingState) -> SamplingState:
  """Rows of the decode state on the batch axes, the cache by its axes."""
  rows = lambda x: sharding.constrain(x, ('batch',) + (None,) * (x.ndim - 1))
  return state.replace(
      last_tokens=rows(state.last_tokens),
      positions=rows(state.positions),
      key_mask=rows(state.key_mask),
      cache=jax.tree.map(
          lambda c: sharding.constrain(c, attention.CACHE_AXES), state.cache),
      tokens=rows(state.tokens),
      logps=rows(state.logps),
      lengths=rows(state.lengths),
      done=rows(state.done),
  )


# The active mesh context is a static argument: a generator traced under one
# placement (or none) is traced again under another.
@functools.partial(jax.jit, static_argnums=(0, 1))
def _prefill(
    gen: Generator,
    mesh: sharding.MeshContext | None,
    params: nnx.State,
    prompt_tokens_BP: jax.Array,
    prompt_mask_BP: jax.Array,
    rng: jax.Array,
    sample_keys_R: jax.Array | None,
    stop_at_R: jax.Array | None,
) -> SamplingState:
  with sharding.activate(mesh):
    return _prefill_body(gen, params, prompt_tokens_BP, prompt_mask_BP, rng,
                         sample_keys_R, stop_at_R)


def _prefill_body(
    gen: Generator,
    params: nnx.State,
    prompt_tokens_BP: jax.Array,
    prompt_mask_BP: jax.Array,
    rng: jax.Array,
    sample_keys_R: jax.Array | None = None,
    stop_at_R: jax.Array | None = None,
) -> SamplingState:
  model = nnx.merge(gen.graphdef, params)
  b, p = prompt_tokens_BP.shape
  g, t = gen.num_samples, gen.max_new_tokens
  real_BP = prompt_mask_BP.astype(bool)
  positions_BP = jnp.maximum(jnp.cumsum(real_BP, axis=1, dtype=jnp.int32) - 1,
                             0)
  causal_PP = jnp.tril(jnp.ones((p, p), bool))
  mask_BPP = causal_PP[None] & real_BP[:, None, :]
  cfg = gen.model_cfg
  # Sliding-window layers keep a ring of W slots when the sequence outgrows
  # the window, so the cache is made at its final length S = P + T - 1.
  rings = bool(cfg.sliding_layers) and p + t - 1 > cfg.sliding_window
  if rings:
    cache = attention.init_cache(cfg, b, p + t - 1, window_rings=True)
    mask_BPP = jnp.pad(mask_BPP, ((0, 0), (0, 0), (0, t - 1)))
  else:
    cache = attention.init_cache(cfg, b, p)
  x_BPD, cache = model.backbone(
      model.embed(prompt_tokens_BP.astype(jnp.int32)),
      positions_BP,
      mask_BPP,
      cache,
      jnp.int32(0),
  )
  # Left padding puts every prompt's last token at column P - 1; the vocab
  # projection is needed there only.
  logits_RV = jnp.repeat(model.unembed(x_BPD[:, -1:])[:, 0], g, axis=0)

  # The last sampled token never needs a key, so T - 1 extra slots suffice.
  grow = ((0, 0), (0, 0 if rings else t - 1), (0, 0), (0, 0))
  cache = jax.tree.map(lambda c: jnp.pad(jnp.repeat(c, g, axis=0), grow),
                       cache)
  key_mask_RS = jnp.pad(jnp.repeat(real_BP, g, axis=0), ((0, 0), (0, t - 1)))
  prompt_lengths_R = jnp.repeat(jnp.sum(real_BP, axis=1, dtype=jnp.int32), g)

  n = b * g
  tokens_R = gen.draw(logits_RV, jnp.zeros((n,), jnp.int32), rng,
                      sample_keys_R, stop_at_R)
  return _constrain(SamplingState(
      step=jnp.int32(1),
      cache_index=jnp.int32(p),
      last_tokens=tokens_R,
      positions=prompt_lengths_R,
      key_mask=key_mask_RS,
      cache=cache,
      tokens=jnp.full((n, t), gen.pad_id, jnp.int32).at[:, 0].set(tokens_R),
      logps=jnp.zeros((n, t), jnp.float32).at[:, 0].set(
          gen.sampling.logps(logits_RV, tokens_R)
      ),
      lengths=jnp.ones((n,), jnp.int32),
      done=gen._is_stop(tokens_R),
      rng=rng,
      sample_keys=sample_keys_R,
      stop_at=stop_at_R,
  ))


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=3)
def _decode(
    gen: Generator,
    mesh: sharding.MeshContext | None,
    params: nnx.State,
    state: SamplingState,
) -> SamplingState:
  with sharding.activate(mesh):
    return _decode_body(gen, params, state)


def _decode_body(
    gen: Generator, params: nnx.State, state: SamplingState
) -> SamplingState:
  model = nnx.merge(gen.graphdef, params)
  n = state.last_tokens.shape[0]

  def cond(s: SamplingState) -> jax.Array:
    return (s.step < gen.max_new_tokens) & ~jnp.all(s.done)

  def body(s: SamplingState) -> SamplingState:
    # Only the new slot changes, so the key mask is updated, not rebuilt.
    key_mask_RS = jax.lax.dynamic_update_slice(
        s.key_mask, jnp.ones((n, 1), bool), (0, s.cache_index)
    )
    logits_N1V, cache = model(
        s.last_tokens[:, None],
        s.positions[:, None],
        key_mask_RS[:, None, :],
        s.cache,
        s.cache_index,
    )
    logits_RV = logits_N1V[:, 0]
    tokens_R = gen.draw(logits_RV, jnp.full((n,), s.step), s.rng,
                        s.sample_keys, s.stop_at)
    logps_R = jnp.where(s.done, 0.0, gen.sampling.logps(logits_RV, tokens_R))
    tokens_R = jnp.where(s.done, gen.pad_id, tokens_R)
    column = (0, s.step)
    return _constrain(s.replace(
        step=s.step + 1,
        cache_index=s.cache_index + 1,
        last_tokens=tokens_R,
        positions=s.positions + 1,
        key_mask=key_mask_RS,
        cache=cache,
        tokens=jax.lax.dynamic_update_slice(s.tokens, tokens_R[:, None],
                                            column),
        logps=jax.lax.dynamic_update_slice(s.logps, logps_R[:, None], column),
        lengths=s.lengths + (~s.done).astype(jnp.int32),
        done=s.done | gen._is_stop(tokens_R),
    ))

  return jax.lax.while_loop(cond, body, state)


@jax.jit
def _completions(state: SamplingState) -> Completions:
  t = state.tokens.shape[1]
  return Completions(
      tokens=state.tokens,
      logps=state.logps,
      mask=jnp.arange(t)[None, :] < state.lengths[:, None],
      lengths=state.lengths,
  )
