"""Grouped-query attention and its KV-cache layout.

Einsum letters follow `jaxgrpo.typing` (B batch, T query length, S key
length, D model, N query heads, K kv heads, H head dim), plus R = N // K, the
query heads sharing one kv head.

The cache of one layer is `dict(k=[B, S, K, H], v=[B, S, K, H])`; a model's
cache is a list of those, one per layer. Callers choose where new keys go
(`cache_index`) and which keys each query sees (`mask_BTS`), so prefill and
decode are the same code path.

Size: the cache layout and every form of attention that reads it (decode,
live-length reads, multi-token einsum or fused) are chosen by the same
settings at trace time and must agree on the masking.
"""

import functools

from flax import nnx
import jax
import jax.numpy as jnp

from jaxgrpo import sharding
from jaxgrpo.model import layers
from jaxgrpo.model.config import ModelConfig

LayerCache = dict[str, jax.Array]
Cache = list[LayerCache]

# Logical axes of a cache array [B, S, K, H] (see `jaxgrpo.sharding`).
CACHE_AXES = ('batch', 'cache_length', 'kv_heads', 'head_dim')

# Finite, so a query with every key masked (a pad row) gets a uniform softmax
# instead of NaNs that would leak into gradients.
_MASK_VALUE = -1e30
# How a decode step (one query per row) attends to the cache: 'broadcast'
# (products and sums over the cache in its stored layout, fastest on the CPU
# backend), 'einsum' (dot_generals, as the multi-token path; for GPU and
# TPU, whose matrix units take the grouped heads as one batched product), or
# 'auto': 'broadcast' on the CPU, 'einsum' elsewhere. Read at trace time;
# `jax.clear_caches()` after changing it.
DECODE_ATTENTION = 'auto'
# How a pass of several tokens per row (a prefill, the learner's prompt and
# completion passes) attends: 'einsum' (the scores [B, K, R, T, S] as
# dot_generals, masked and softmaxed in float32 as whole arrays), or
# `jax.nn.dot_product_attention` with implementation 'xla' or 'cudnn'.
# 'cudnn' is a fused kernel on NVIDIA GPUs that never writes the scores to
# memory; a layer it cannot take (float32, a logit softcap, an odd length
# or a head dim it has no kernel for) uses 'einsum'. Read at trace time.
MULTI_TOKEN_ATTENTION = 'einsum'
MULTI_TOKEN_FORMS = ('einsum', 'xla', 'cudnn')
# How a decode step reads an S-slot cache: only its first L slots, L the
# smallest of DECODE_LIVE_BUCKETS lengths in even steps up to S that holds
# every slot written so far (the later ones are masked anyway; one
# conditional per layer and step picks L), or all of it (1). On the CPU a
# step's time grows with the keys it reads, so 'auto' is 8 there; elsewhere
# a conditional in the decode loop is unmeasured and 'auto' is 1. Caches of
# at most LIVE_MIN slots are read whole. Read at trace time.
DECODE_LIVE_BUCKETS = 'auto'
LIVE_MIN = 64


def init_cache(
    cfg: ModelConfig,
    batch_size: int,
    length: int,
    dtype=None,
    *,
    window_rings: bool = False,
) -> Cache:
  """Zeroed KV cache for `length` positions.

  Args:
    cfg: model config.
    batch_size: B, rows of the cache.
    length: S, positions the cache holds.
    dtype: storage dtype; defaults to the compute dtype `cfg.dtype`.
    window_rings: sliding-window layers get a ring of `cfg.sliding_window`
      slots instead of S when that is shorter: slot a's key lives in ring
      entry a % W, overwritten once it leaves every later query's window.
      The caller still masks and indexes by the S absolute slots.

  Returns:
    A list (one entry per layer) of dict(k=[B, S, K, H], v=[B, S, K, H])
    (S = W on ring layers).
  """
  dtype = jnp.dtype(cfg.dtype if dtype is None else dtype)

  def zeros(i):
    s = length
    if window_rings and i in cfg.sliding_layers:
      s = min(length, cfg.sliding_window)
    shape = (batch_size, s, cfg.num_kv_heads, cfg.head_dim)
    return sharding.constrain(jnp.zeros(shape, dtype), CACHE_AXES)

  return [dict(k=zeros(i), v=zeros(i)) for i in range(cfg.num_layers)]


def _ring_inputs(
    ring: LayerCache,
    k_BTKH: jax.Array,
    v_BTKH: jax.Array,
    mask_BTS: jax.Array,
    index: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array, LayerCache]:
  """Keys, values and mask over a ring's L entries then the T new keys.

  Ring entry j holds the latest absolute slot a < index with a % L == j
  (none when a < 0); its mask is `mask_BTS` at a. The last min(T, L) new
  keys then overwrite their entries.

  Returns:
    (keys [B, L + T, K, H], values, mask [B, T, L + T], updated ring).
  """
  b, t = k_BTKH.shape[:2]
  length, s = ring['k'].shape[1], mask_BTS.shape[2]
  start_B1 = jnp.broadcast_to(jnp.asarray(index, jnp.int32), (b,))[:, None]
  j_1L = jnp.arange(length, dtype=jnp.int32)[None, :]
  held_BL = start_B1 - 1 - jnp.mod(start_B1 - 1 - j_1L, length)
  new_BT = start_B1 + jnp.arange(t, dtype=jnp.int32)[None, :]
  slots_BS = jnp.concatenate([held_BL, new_BT], axis=1)
  gather_BTS = jnp.broadcast_to(
      jnp.clip(slots_BS, 0, s - 1)[:, None, :], (b, t, length + t))
  mask = jnp.take_along_axis(mask_BTS, gather_BTS, axis=2)
  mask = mask & (slots_BS >= 0)[:, None, :]
  dtype = k_BTKH.dtype
  k = jnp.concatenate([ring['k'].astype(dtype), k_BTKH], axis=1)
  v = jnp.concatenate([ring['v'].astype(dtype), v_BTKH], axis=1)
  m = min(t, length)
  entries_BM = jnp.mod(new_BT[:, t - m:], length)
  write = jax.vmap(lambda c, x, i: c.at[i].set(x.astype(c.dtype)))
  ring = dict(
      k=sharding.constrain(
          write(ring['k'], k_BTKH[:, t - m:], entries_BM), CACHE_AXES),
      v=sharding.constrain(
          write(ring['v'], v_BTKH[:, t - m:], entries_BM), CACHE_AXES),
  )
  return k, v, mask, ring


def update_cache(
    cache: LayerCache, k_BTKH: jax.Array, v_BTKH: jax.Array, index: jax.Array
) -> LayerCache:
  """Writes T new keys/values into `cache` starting at slot `index`.

  `index` is an int32 scalar (every row writes at the same slot) or [B], one
  slot per row (rows of a continuous batch sit at different positions).
  """
  k_BTKH = k_BTKH.astype(cache['k'].dtype)
  v_BTKH = v_BTKH.astype(cache['v'].dtype)
  if jnp.ndim(index):
    write = jax.vmap(
        lambda c, x, i: jax.lax.dynamic_update_slice(c, x, (i, 0, 0)))
    k, v = write(cache['k'], k_BTKH, index), write(cache['v'], v_BTKH, index)
  else:
    start = (0, index, 0, 0)
    k = jax.lax.dynamic_update_slice(cache['k'], k_BTKH, start)
    v = jax.lax.dynamic_update_slice(cache['v'], v_BTKH, start)
  return dict(k=sharding.constrain(k, CACHE_AXES),
              v=sharding.constrain(v, CACHE_AXES))


def _softcap(logits: jax.Array, cap: float | None) -> jax.Array:
  """`cap * tanh(logits / cap)`, or `logits` when `cap` is None."""
  return logits if cap is None else cap * jnp.tanh(logits / cap)


def _decode_attention() -> str:
  if DECODE_ATTENTION == 'auto':
    return 'broadcast' if jax.default_backend() == 'cpu' else 'einsum'
  if DECODE_ATTENTION not in ('broadcast', 'einsum'):
    raise ValueError(f'attention.DECODE_ATTENTION must be auto, broadcast or '
                     f'einsum, got {DECODE_ATTENTION!r}')
  return DECODE_ATTENTION


def _attend_one_einsum(
    q_B1KRH: jax.Array,
    k_BSKH: jax.Array,
    v_BSKH: jax.Array,
    mask_B1S: jax.Array,
    softcap: float | None = None,
) -> jax.Array:
  """`_attend_one` as dot_generals, rounded as the multi-token path."""
  logits_BKRS = jnp.einsum('BKRH,BSKH->BKRS', q_B1KRH[:, 0], k_BSKH,
                           preferred_element_type=jnp.float32)
  logits_BKRS = _softcap(logits_BKRS, softcap)
  logits_BKRS = jnp.where(mask_B1S[:, :, None, :], logits_BKRS, _MASK_VALUE)
  probs_BKRS = jax.nn.softmax(logits_BKRS, axis=-1).astype(v_BSKH.dtype)
  out_BKRH = jnp.einsum('BKRS,BSKH->BKRH', probs_BKRS, v_BSKH)
  return out_BKRH[:, None]


def _attend_one(
    q_B1KRH: jax.Array,
    k_BSKH: jax.Array,
    v_BSKH: jax.Array,
    mask_B1S: jax.Array,
    softcap: float | None = None,
) -> jax.Array:
  """Attention of one query per row (a decode step), [B, 1, K, R, H].

  Written as broadcast products and sums over the cache in its stored
  [B, S, K, H] layout: as an einsum, XLA's CPU backend transposes every
  layer's whole cache at every step, which costs more than the math.
  """
  q_B1KRH = q_B1KRH.astype(jnp.float32)
  logits_BSKR = (
      q_B1KRH * k_BSKH[:, :, :, None, :].astype(jnp.float32)
  ).sum(axis=-1)
  logits_BSKR = _softcap(logits_BSKR, softcap)
  logits_BSKR = jnp.where(
      mask_B1S[:, 0, :, None, None], logits_BSKR, _MASK_VALUE
  )
  probs_BSKR = jax.nn.softmax(logits_BSKR, axis=1)
  out_BKRH = (
      probs_BSKR[..., None] * v_BSKH[:, :, :, None, :].astype(jnp.float32)
  ).sum(axis=1)
  return out_BKRH[:, None].astype(v_BSKH.dtype)


def lengths_up_to(t: int, n: int, minimum: int) -> tuple[int, ...]:
  """n lengths at most, up to t: multiples of a step (at least `minimum`,
  a multiple of 16 or of `minimum` below 16), then t itself; (t,) when
  n is 1 or t is at most `minimum`. The buckets of the live cache reads
  here, of resumed samples' prefills (`generate.slots.resume_width`) and
  of the learner's completions (`rl.rollout.train_lengths`)."""
  if n == 1 or t <= minimum:
    return (t,)
  align = min(16, minimum)
  step = -(-max(minimum, -(-t // n)) // align) * align
  return tuple(range(step, t, step)) + (t,)


def live_lengths(s: int) -> tuple[int, ...]:
  """The slot counts a decode step may read of an S-slot cache: multiples
  of a step (itself a multiple of 16, at least LIVE_MIN), then S
  (`lengths_up_to`)."""
  buckets = DECODE_LIVE_BUCKETS
  if buckets == 'auto':
    buckets = 8 if jax.default_backend() == 'cpu' else 1
  if not isinstance(buckets, int) or buckets < 1:
    raise ValueError('attention.DECODE_LIVE_BUCKETS must be auto or an int '
                     f'>= 1, got {buckets!r}')
  return lengths_up_to(s, buckets, LIVE_MIN)


def _attend_live(attend, q_B1KRH, k_BSKH, v_BSKH, mask_B1S, live):
  """`attend` over the first L cache slots only, L the smallest of
  `live_lengths(S)` that holds the `live` slots written so far.

  The slots past L are masked for every row, so the result is the same up
  to float rounding (the softmax and the weighted sum add the same terms
  over a shorter axis)."""
  sizes = live_lengths(k_BSKH.shape[1])
  if len(sizes) == 1:
    return attend(q_B1KRH, k_BSKH, v_BSKH, mask_B1S)
  branches = [functools.partial(
      lambda n, q, k, v, m: attend(q, k[:, :n], v[:, :n], m[:, :, :n]), n)
              for n in sizes]
  # lax.switch clamps an index past the last branch (live > S) to it.
  index = jnp.searchsorted(jnp.asarray(sizes, jnp.int32), live)
  return jax.lax.switch(index, branches, q_B1KRH, k_BSKH, v_BSKH, mask_B1S)


def _multi_token_form(q_BTNH: jax.Array, s: int,
                     softcap: float | None) -> str:
  """`MULTI_TOKEN_ATTENTION`, or 'einsum' where that form cannot take the
  layer."""
  form = MULTI_TOKEN_ATTENTION
  if form not in MULTI_TOKEN_FORMS:
    raise ValueError(f'attention.MULTI_TOKEN_ATTENTION must be one of '
                     f'{MULTI_TOKEN_FORMS}, got {form!r}')
  _, t, _, h = q_BTNH.shape
  if form != 'einsum' and softcap is not None:
    return 'einsum'
  if form == 'cudnn' and not (
      q_BTNH.dtype in (jnp.bfloat16, jnp.float16) and t % 2 == 0
      and s % 2 == 0 and h % 8 == 0 and h <= 128):
    return 'einsum'
  return form


def _attend_many(
    q_BTNH: jax.Array,
    k_BSKH: jax.Array,
    v_BSKH: jax.Array,
    mask_BTS: jax.Array,
    scale: float,
    softcap: float | None,
) -> jax.Array:
  """Attention of T queries per row to S keys, [B, T, N, H]."""
  b, t, n, h = q_BTNH.shape
  form = _multi_token_form(q_BTNH, k_BSKH.shape[1], softcap)
  if form != 'einsum':
    return jax.nn.dot_product_attention(
        q_BTNH, k_BSKH, v_BSKH, mask=mask_BTS[:, None], scale=scale,
        implementation=form)
  q_BTKRH = q_BTNH.reshape(b, t, k_BSKH.shape[2], -1, h) * scale
  logits_BKRTS = jnp.einsum(
      'BTKRH,BSKH->BKRTS', q_BTKRH, k_BSKH, preferred_element_type=jnp.float32)
  logits_BKRTS = _softcap(logits_BKRTS, softcap)
  logits_BKRTS = jnp.where(mask_BTS[:, None, None], logits_BKRTS, _MASK_VALUE)
  probs_BKRTS = jax.nn.softmax(logits_BKRTS, axis=-1).astype(v_BSKH.dtype)
  out_BTKRH = jnp.einsum('BKRTS,BSKH->BTKRH', probs_BKRTS, v_BSKH)
  return out_BTKRH.reshape(b, t, n, h)


class Attention(nnx.Module):
  """Multi-head attention with K <= N kv heads, RoPE, optional bias/q-k norm.

  A sliding-window layer (`sliding`) takes its RoPE base from
  `cfg.rope_local_theta` when that is set, with no frequency rescaling;
  its window itself is in the mask the caller passes.
  """

  def __init__(
      self, cfg: ModelConfig, *, sliding: bool = False, rngs: nnx.Rngs
  ):
    dtype, param_dtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
    d, n, k, h = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    if sliding and cfg.rope_local_theta is not None:
      self.rope_theta, self.rope_scaling = cfg.rope_local_theta, None
      self.rope_linear_factor = 1.0
    else:
      self.rope_theta, self.rope_scaling = cfg.rope_theta, cfg.rope_scaling
      self.rope_linear_factor = cfg.rope_linear_factor
    self.scale = (cfg.query_pre_attn_scalar or h) ** -0.5
    self.softcap = cfg.attn_logit_softcap
    self.num_kv_heads = k
    self.q = layers.Einsum((d, n, h), ('embed', 'heads', 'head_dim'), **kw)
    self.k = layers.Einsum((d, k, h), ('embed', 'kv_heads', 'head_dim'), **kw)
    self.v = layers.Einsum((d, k, h), ('embed', 'kv_heads', 'head_dim'), **kw)
    self.o = layers.Einsum(
        (n, h, d), ('heads', 'head_dim', 'embed'), in_axes=(0, 1), **kw
    )
    if cfg.qkv_bias:
      self.q_bias = layers.Bias((n, h), ('heads', 'head_dim'),
                                param_dtype=param_dtype)
      self.k_bias = layers.Bias((k, h), ('kv_heads', 'head_dim'),
                                param_dtype=param_dtype)
      self.v_bias = layers.Bias((k, h), ('kv_heads', 'head_dim'),
                                param_dtype=param_dtype)
    else:
      self.q_bias = self.k_bias = self.v_bias = None
    if cfg.qk_norm:
      norm = dict(eps=cfg.norm_eps, plus_one=cfg.norm_plus_one,
                  param_dtype=param_dtype)
      self.q_norm = layers.RMSNorm(h, **norm)
      self.k_norm = layers.RMSNorm(h, **norm)
    else:
      self.q_norm = self.k_norm = None

  def __call__(
      self,
      x_BTD: jax.Array,
      positions_BT: jax.Array,
      mask_BTS: jax.Array,
      cache: LayerCache | None = None,
      cache_index: jax.Array | None = None,
  ) -> tuple[jax.Array, LayerCache | None]:
    """Attends T queries to S keys.

    Args:
      x_BTD: normalized inputs, [B, T, D].
      positions_BT: RoPE positions of the T tokens, [B, T].
      mask_BTS: bool, True where query t may attend key s, [B, T, S]. S = T
        without a cache, else the cache length (the absolute slots, for a
        window ring shorter than S: see `init_cache`).
      cache: this layer's KV cache, or None.
      cache_index: int32 scalar, cache slot of the first of the T new keys,
        or [B], one per row.

    Returns:
      (outputs [B, T, D], updated cache or None).
    """
    q_BTNH = self.q('BTD,DNH->BTNH', x_BTD)
    k_BTKH = self.k('BTD,DKH->BTKH', x_BTD)
    v_BTKH = self.v('BTD,DKH->BTKH', x_BTD)
    if self.q_bias is not None:
      q_BTNH = self.q_bias(q_BTNH)
      k_BTKH = self.k_bias(k_BTKH)
      v_BTKH = self.v_bias(v_BTKH)
    if self.q_norm is not None:
      q_BTNH = self.q_norm(q_BTNH)
      k_BTKH = self.k_norm(k_BTKH)
    rope = dict(theta=self.rope_theta, scaling=self.rope_scaling,
                linear_factor=self.rope_linear_factor)
    q_BTNH = layers.apply_rope(q_BTNH, positions_BT, **rope)
    k_BTKH = layers.apply_rope(k_BTKH, positions_BT, **rope)

    if cache is None:
      k_BSKH, v_BSKH = k_BTKH, v_BTKH
    elif cache['k'].shape[1] != mask_BTS.shape[2]:  # a window ring
      k_BSKH, v_BSKH, mask_BTS, cache = _ring_inputs(
          cache, k_BTKH, v_BTKH, mask_BTS, cache_index)
    else:
      cache = update_cache(cache, k_BTKH, v_BTKH, cache_index)
      k_BSKH = cache['k'].astype(q_BTNH.dtype)
      v_BSKH = cache['v'].astype(q_BTNH.dtype)

    b, t, n, h = q_BTNH.shape
    if t == 1:
      q_BTKRH = q_BTNH.reshape(b, t, self.num_kv_heads, -1, h) * self.scale
      attend = (_attend_one if _decode_attention() == 'broadcast'
                else _attend_one_einsum)
      attend = functools.partial(attend, softcap=self.softcap)
      if cache is not None and k_BSKH.shape[1] == mask_BTS.shape[2]:
        out_BTKRH = _attend_live(attend, q_BTKRH, k_BSKH, v_BSKH, mask_BTS,
                                 jnp.max(cache_index) + 1)
      else:
        out_BTKRH = attend(q_BTKRH, k_BSKH, v_BSKH, mask_BTS)
      out_BTNH = out_BTKRH.reshape(b, t, n, h)
    else:
      out_BTNH = _attend_many(q_BTNH, k_BSKH, v_BSKH, mask_BTS, self.scale,
                              self.softcap)
    out_BTNH = sharding.constrain(
        out_BTNH, ('batch', 'length', 'heads', 'head_dim'))
    return self.o('BTNH,NHD->BTD', out_BTNH), cache
