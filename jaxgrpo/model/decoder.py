"""Llama-family and Gemma decoder: (tokens, positions, mask, cache) -> (logits, cache).

Einsum letters follow `jaxgrpo.typing`: B batch, T query length, S key length,
D model, V vocab.
"""

import functools

from flax import nnx
import jax
import jax.numpy as jnp

from jaxgrpo import sharding
from jaxgrpo.model import attention
from jaxgrpo.model import layers
from jaxgrpo.model.config import ModelConfig

_ACT_AXES = ('batch', 'length', 'act_embed')
# The dtype of the logits' cotangent in the lm_head's backward pass when the
# compute dtype is below float32: 'compute' (the two backward matmuls run in
# that dtype, accumulating in float32, as the forward does) or 'float32'
# (the float32 cotangent meets the weights: on a GPU two TF32 matmuls, 14% of
# a Qwen2.5-0.5B train step on an H200). The forward's float32 logits are the
# same either way. Read at trace time.
LOGITS_COTANGENT = 'compute'


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _logits_low_precision_grad(eqn: str, x: jax.Array, w: jax.Array):
  return layers.contract(eqn, x, w, preferred_element_type=jnp.float32)


def _logits_fwd(eqn, x, w):
  return _logits_low_precision_grad(eqn, x, w), (x, w)


def _logits_bwd(eqn, residuals, ct):
  x, w = residuals
  _, vjp = jax.vjp(lambda x, w: layers.contract(eqn, x, w), x, w)
  return vjp(ct.astype(jnp.result_type(x, w)))


_logits_low_precision_grad.defvjp(_logits_fwd, _logits_bwd)


def _logits(eqn: str, x: jax.Array, w: jax.Array) -> jax.Array:
  """float32 logits `eqn(x, w)`; see `LOGITS_COTANGENT` for the backward."""
  if LOGITS_COTANGENT not in ('compute', 'float32'):
    raise ValueError(f'decoder.LOGITS_COTANGENT must be compute or float32, '
                     f'got {LOGITS_COTANGENT!r}')
  if LOGITS_COTANGENT == 'compute' and jnp.result_type(x, w) != jnp.float32:
    return _logits_low_precision_grad(eqn, x, w)
  return layers.contract(eqn, x, w, preferred_element_type=jnp.float32)

# Rematerialization of each block in a differentiated forward pass (the
# `jax.checkpoint` policy; 'none' is no checkpoint: every activation is kept
# for the backward pass). 'full' keeps only each block's inputs and
# recomputes the rest; 'dots' also keeps the outputs of matmuls without
# batch dimensions (the projections), recomputing element-wise work and
# attention.
REMAT_POLICIES = {
    'none': None,
    'full': jax.checkpoint_policies.nothing_saveable,
    'dots': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _norm(cfg: ModelConfig) -> layers.RMSNorm:
  return layers.RMSNorm(
      cfg.embed_dim, eps=cfg.norm_eps, plus_one=cfg.norm_plus_one,
      param_dtype=jnp.dtype(cfg.param_dtype),
  )


def _window_mask(
    mask_BTS: jax.Array, cache_index: jax.Array | None, window: int
) -> jax.Array:
  """`mask_BTS` narrowed to keys fewer than `window` slots before the query.

  Query t sits in slot t without a cache, else in slot cache_index + t
  (cache_index a scalar or [B]); key s in slot s. A row's real tokens fill
  consecutive slots, so slot distance is position distance, as in
  transformers' sliding-window masks.
  """
  b, t, s = mask_BTS.shape
  start_B = jnp.zeros((b,), jnp.int32)
  if cache_index is not None:
    start_B = jnp.broadcast_to(jnp.asarray(cache_index, jnp.int32), (b,))
  q_BT = start_B[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
  k_S = jnp.arange(s, dtype=jnp.int32)
  return mask_BTS & (q_BT[:, :, None] - k_S[None, None, :] < window)


class Block(nnx.Module):
  """Pre-norm transformer block: attention then gated MLP, each residual.

  With `cfg.sandwich_norms` each branch's output is normalized too before
  its residual add (Gemma 2/3).
  """

  def __init__(
      self, cfg: ModelConfig, *, sliding: bool = False, rngs: nnx.Rngs
  ):
    self.sliding = sliding
    self.attn_norm = _norm(cfg)
    self.attn = attention.Attention(cfg, sliding=sliding, rngs=rngs)
    self.mlp_norm = _norm(cfg)
    if cfg.sandwich_norms:
      self.attn_post_norm, self.mlp_post_norm = _norm(cfg), _norm(cfg)
    else:
      self.attn_post_norm = self.mlp_post_norm = None
    self.mlp = layers.FeedForward(
        cfg.embed_dim,
        cfg.mlp_dim,
        activation=cfg.mlp_activation,
        dtype=jnp.dtype(cfg.dtype),
        param_dtype=jnp.dtype(cfg.param_dtype),
        rngs=rngs,
    )

  def __call__(
      self,
      x_BTD: jax.Array,
      positions_BT: jax.Array,
      mask_BTS: jax.Array,
      cache: attention.LayerCache | None,
      cache_index: jax.Array | None,
  ) -> tuple[jax.Array, attention.LayerCache | None]:
    h_BTD, cache = self.attn(
        self.attn_norm(x_BTD), positions_BT, mask_BTS, cache, cache_index
    )
    if self.attn_post_norm is not None:
      h_BTD = self.attn_post_norm(h_BTD)
    x_BTD = sharding.constrain(x_BTD + h_BTD, _ACT_AXES)
    h_BTD = self.mlp(self.mlp_norm(x_BTD))
    if self.mlp_post_norm is not None:
      h_BTD = self.mlp_post_norm(h_BTD)
    x_BTD = x_BTD + h_BTD
    return sharding.constrain(x_BTD, _ACT_AXES), cache


class Decoder(nnx.Module):
  """Decoder-only transformer (Llama, Qwen2, Qwen3, SmolLM2, Gemma 2/3).

  `__call__` is `unembed(backbone(embed(tokens), ...))`; the pieces are public
  so a caller can take logits at a few positions only (sampling) or
  differentiate with respect to the input embeddings (tests).
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg  # static: callers size KV caches from it
    self.dtype = jnp.dtype(cfg.dtype)
    param_dtype = jnp.dtype(cfg.param_dtype)
    init = jax.nn.initializers.variance_scaling(
        1.0, 'fan_in', 'normal', in_axis=1, out_axis=0
    )
    self.embedding = nnx.Param(
        init(rngs.params(), (cfg.vocab_size, cfg.embed_dim), param_dtype),
        out_sharding=('vocab', 'embed'), eager_sharding=False,
    )
    self.blocks = nnx.List([
        Block(cfg, sliding=i in cfg.sliding_layers, rngs=rngs)
        for i in range(cfg.num_layers)
    ])
    self.final_norm = _norm(cfg)
    if cfg.tie_embeddings:
      self.unembedding = None
    else:
      self.unembedding = layers.Einsum(
          (cfg.embed_dim, cfg.vocab_size),
          ('embed', 'vocab'),
          dtype=self.dtype,
          param_dtype=param_dtype,
          rngs=rngs,
      )

  def embed(self, tokens_BT: jax.Array) -> jax.Array:
    """Token ids [B, T] -> embeddings [B, T, D] in the compute dtype."""
    # The table is gathered over its 'embed' shards first (as every weight
    # is for use): a lookup into a table sharded on the looked-up rows'
    # width would leave activations sharded on D.
    table_VD = sharding.constrain(self.embedding[...], ('vocab', None))
    x_BTD = jnp.take(table_VD, tokens_BT, axis=0).astype(self.dtype)
    if self.cfg.scale_embeddings:
      x_BTD = x_BTD * jnp.asarray(self.cfg.embed_dim**0.5, self.dtype)
    return sharding.constrain(x_BTD, _ACT_AXES)

  def backbone(
      self,
      x_BTD: jax.Array,
      positions_BT: jax.Array,
      mask_BTS: jax.Array,
      cache: attention.Cache | None = None,
      cache_index: jax.Array | None = None,
      *,
      remat: str = 'none',
  ) -> tuple[jax.Array, attention.Cache | None]:
    """Runs every block and the final norm; see `__call__` for arguments.

    `remat` ('none', 'full' or 'dots'; see REMAT_POLICIES) checkpoints each
    block for a learner's backward pass; it changes memory, not results.
    """
    if remat not in REMAT_POLICIES:
      raise ValueError(
          f'Decoder: remat must be one of {tuple(REMAT_POLICIES)}, got '
          f'{remat!r}')
    new_cache = None if cache is None else []
    local_BTS = None
    if self.cfg.sliding_layers:
      local_BTS = _window_mask(
          mask_BTS, None if cache is None else cache_index,
          self.cfg.sliding_window,
      )
    for i, block in enumerate(self.blocks):
      run = block if remat == 'none' else _checkpointed(block, remat)
      x_BTD, layer_cache = run(
          x_BTD,
          positions_BT,
          local_BTS if block.sliding else mask_BTS,
          None if cache is None else cache[i],
          cache_index,
      )
      if new_cache is not None:
        new_cache.append(layer_cache)
    return self.final_norm(x_BTD), new_cache

  def unembed(self, x_BTD: jax.Array) -> jax.Array:
    """Final hidden states [B, T, D] -> float32 logits [B, T, V]."""
    if self.unembedding is None:
      w_VD = self.embedding[...].astype(self.dtype)
      logits_BTV = _logits('BTD,VD->BTV', x_BTD, w_VD)
    else:
      w_DV = self.unembedding.w[...].astype(self.dtype)
      logits_BTV = _logits('BTD,DV->BTV', x_BTD, w_DV)
    cap = self.cfg.final_logit_softcap
    return logits_BTV if cap is None else cap * jnp.tanh(logits_BTV / cap)

  def __call__(
      self,
      tokens_BT: jax.Array,
      positions_BT: jax.Array,
      mask_BTS: jax.Array,
      cache: attention.Cache | None = None,
      cache_index: jax.Array | None = None,
  ) -> tuple[jax.Array, attention.Cache | None]:
    """Computes next-token logits for T tokens.

    Args:
      tokens_BT: int32 token ids, [B, T].
      positions_BT: int32 RoPE positions, [B, T] (count of real tokens before
        each token under left padding).
      mask_BTS: bool, True where query t may attend key s, [B, T, S]; S = T
        without a cache, else the cache length.
      cache: per-layer KV cache from `attention.init_cache`, or None.
      cache_index: int32 scalar, the cache slot where the T new keys/values
        are written, or [B], one slot per row; required with a cache.

    Returns:
      (logits [B, T, V] float32, updated cache or None).
    """
    if cache is not None and cache_index is None:
      raise ValueError('Decoder: cache_index is required with a cache')
    x_BTD, cache = self.backbone(
        self.embed(tokens_BT), positions_BT, mask_BTS, cache, cache_index
    )
    return self.unembed(x_BTD), cache


def _checkpointed(block: Block, remat: str):
  """`block` as a function whose activations are rematerialized."""
  graphdef, state = nnx.split(block)
  run = jax.checkpoint(
      lambda state, *args: nnx.merge(graphdef, state)(*args),
      policy=REMAT_POLICIES[remat],
  )
  return functools.partial(_after_cotangent(run), state)


def _after_cotangent(fn):
  """`fn` (a `jax.checkpoint`ed function) whose recomputation waits for the
  backward pass.

  `jax.checkpoint` keeps its recomputation apart from the forward pass with
  optimization barriers, which XLA's CPU backend removes: its common-
  subexpression elimination then merges the recomputation back into the
  forward pass, and every activation is kept after all (a 4-layer
  SmolLM2-shaped learner pass took the same memory with and without remat).
  Here the backward pass adds to each saved float residual a zero computed
  from the incoming cotangent: the recomputation then reads values that
  exist only once the backward pass reaches the block, so it can neither
  run early nor be merged. r + 0 is r, bit for bit (the zero is finite even
  where the cotangent is not), so gradients are unchanged.
  """

  @jax.custom_vjp
  def call(*args):
    return fn(*args)

  def call_fwd(*args):
    return jax.vjp(fn, *args)

  def call_bwd(vjp_fn, cotangent):
    first = jax.tree.leaves(cotangent)[0].ravel()[0].astype(jnp.float32)
    zero = jnp.where(jnp.isfinite(first), first, 0.0) * 0.0
    tie = lambda r: (r + zero.astype(r.dtype)
                     if jnp.issubdtype(r.dtype, jnp.inexact) else r)
    return jax.tree.map(tie, vjp_fn)(cotangent)

  call.defvjp(call_fwd, call_bwd)
  return call


def init_params(
    cfg: ModelConfig, rng: jax.Array
) -> tuple[nnx.GraphDef, nnx.State]:
  """Builds a Decoder with fresh weights and splits it.

  Args:
    cfg: model config.
    rng: PRNG key for the initializers.

  Returns:
    (graphdef, params): the static structure and the parameter State.
  """
  return nnx.split(Decoder(cfg, rngs=nnx.Rngs(params=rng)))


def abstract_params(cfg: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
  """Like `init_params` but with ShapeDtypeStructs, allocating nothing."""
  model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(params=0)))
  return nnx.split(model)


def forward(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    tokens_BT: jax.Array,
    positions_BT: jax.Array,
    mask_BTS: jax.Array,
    cache: attention.Cache | None = None,
    cache_index: jax.Array | None = None,
) -> tuple[jax.Array, attention.Cache | None]:
  """Pure functional `Decoder.__call__`; see there for arguments."""
  model = nnx.merge(graphdef, params)
  return model(tokens_BT, positions_BT, mask_BTS, cache, cache_index)
