"""Per-token log-probs and entropy of completions under given params."""

from flax import nnx
import jax
import jax.numpy as jnp

from jaxgrpo.model import attention
from jaxgrpo.typing import TrainBatch

# The learner's float32 logits [R, T, V] are its largest arrays: 4.6 GiB for
# 32 completions of 256 tokens over Qwen2.5's 151,936-token vocabulary, with
# several more of that size (log-softmax, its exp, their cotangents) in the
# backward pass. Above this many bytes they are made in chunks of
# completion positions, each recomputed in the backward pass, so that one
# chunk's exist at a time (`token_logprobs`). Read at trace time.
LOGITS_CHUNK_BYTES = 256 * 2**20


def completion_logprobs(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    batch: TrainBatch,
    temperature: float = 1.0,
    remat: str = 'none',
) -> tuple[jax.Array, jax.Array]:
  """Log-probs and entropy of each completion token.

  Each of the B prompts is run once, filling a KV cache that its G
  completions then attend to, exactly as at sampling time; gradients from all
  G completions flow back into the shared prompt pass. Compared with running
  every (prompt, completion) row in full this saves (G - 1) * B * P tokens of
  forward and backward work, the same answer up to float rounding.

  The distribution is softmax(logits / temperature), the one the tokens were
  sampled from (plain softmax when `temperature` is 0, i.e. greedy), so the
  result is comparable with the sampling-time `batch.old_logps`.

  Length: its docstring explains the shared prompt pass the code takes apart in
  steps; split, the steps would pass the same seven arrays along.

  Args:
    graphdef: the Decoder's graph definition.
    params: the Decoder's params.
    batch: a TrainBatch with [B, P] left-padded prompts and [B * G, T]
      right-padded completions.
    temperature: sampling temperature; a Python float.
    remat: rematerialization of each decoder block ('none', 'full',
      'dots'; see `decoder.REMAT_POLICIES`), for memory when differentiated.

  Returns:
    logps_RT: [R, T] float32 log-prob of each completion token; 0 on padding.
    entropy_RT: [R, T] float32 entropy of the next-token distribution at each
      completion position; 0 on padding.
  """
  b, p = batch.prompt_tokens.shape
  n, t = batch.completion_tokens.shape
  if n % b:
    raise ValueError(f'{n} completions do not split into {b} prompt groups')
  g = n // b
  model = nnx.merge(graphdef, params)

  # Prompt pass: positions count real tokens; a pad query sees only itself,
  # so its (unused) softmax is never empty and cannot put NaNs in gradients.
  real_BP = batch.prompt_mask.astype(bool)
  positions_BP = jnp.maximum(jnp.cumsum(real_BP, axis=1, dtype=jnp.int32) - 1,
                             0)
  causal_PP = jnp.tril(jnp.ones((p, p), bool))
  mask_BPP = causal_PP[None] & (real_BP[:, None, :] | jnp.eye(p, dtype=bool)[None])
  cache = attention.init_cache(model.cfg, b, p)
  x_BPD, cache = model.backbone(
      model.embed(batch.prompt_tokens.astype(jnp.int32)), positions_BP,
      mask_BPP, cache, jnp.int32(0), remat=remat,
  )

  # Completion pass over the prompt keys shared by the group (slots [0, P))
  # and its own causal keys (slots [P, P + T)).
  cache = jax.tree.map(
      lambda c: jnp.pad(jnp.repeat(c, g, axis=0),
                        ((0, 0), (0, t), (0, 0), (0, 0))),
      cache,
  )
  prompt_len_R = jnp.repeat(real_BP.sum(axis=1, dtype=jnp.int32), g)
  positions_RT = prompt_len_R[:, None] + jnp.arange(t, dtype=jnp.int32)[None]
  key_valid_RS = jnp.concatenate(
      [jnp.repeat(real_BP, g, axis=0), jnp.ones((n, t), bool)], axis=1)
  causal_TS = jnp.concatenate(
      [jnp.ones((t, p), bool), jnp.tril(jnp.ones((t, t), bool))], axis=1)
  mask_RTS = causal_TS[None] & key_valid_RS[:, None, :]
  x_RTD, _ = model.backbone(
      model.embed(batch.completion_tokens.astype(jnp.int32)), positions_RT,
      mask_RTS, cache, jnp.int32(p), remat=remat,
  )

  # Token t is predicted from the state before it: for t = 0 that is the
  # prompt's last token (column P - 1 under left padding).
  last_N1D = jnp.repeat(x_BPD[:, -1:], g, axis=0)
  h_RTD = jnp.concatenate([last_N1D, x_RTD[:, :-1]], axis=1)
  logps_RT, entropy_RT = token_logprobs(
      model.unembed, h_RTD, batch.completion_tokens.astype(jnp.int32),
      temperature, model.cfg.vocab_size)
  valid_RT = batch.completion_mask.astype(bool)
  return (
      jnp.where(valid_RT, logps_RT, 0.0),
      jnp.where(valid_RT, entropy_RT, 0.0),
  )


def _logprobs(unembed, h_RTD, tokens_RT, temperature):
  """(log-prob of each token, entropy) [R, T] from the hidden states."""
  logits_RTV = unembed(h_RTD).astype(jnp.float32)
  if temperature > 0:
    logits_RTV = logits_RTV / temperature
  logp_RTV = jax.nn.log_softmax(logits_RTV, axis=-1)
  logps_RT = jnp.take_along_axis(logp_RTV, tokens_RT[..., None], axis=-1)[
      ..., 0]
  entropy_RT = -(jnp.exp(logp_RTV) * logp_RTV).sum(axis=-1)
  return logps_RT, entropy_RT


def token_logprobs(
    unembed,
    h_RTD: jax.Array,
    tokens_RT: jax.Array,
    temperature: float,
    vocab_size: int,
) -> tuple[jax.Array, jax.Array]:
  """Log-prob and entropy [R, T] of each token from the states before it.

  Where the float32 logits [R, T, V] would take more than
  `LOGITS_CHUNK_BYTES`, they are made for chunks of positions in turn (a
  `lax.map` over chunks of every row's positions, so rows keep their
  sharding), each under `jax.checkpoint`: the backward pass recomputes a
  chunk's logits instead of keeping all of them. Below it, one pass over
  all positions, as it always was.

  Args:
    unembed: hidden states [B, T, D] -> float32 logits [B, T, V]
      (`Decoder.unembed`).
    h_RTD: the hidden state before each token, [R, T, D].
    tokens_RT: int32 tokens, [R, T].
    temperature: the sampling temperature (0: plain softmax).
    vocab_size: V.
  """
  r, t, d = h_RTD.shape
  chunk = max(1, LOGITS_CHUNK_BYTES // (4 * r * vocab_size))
  if chunk >= t:
    return _logprobs(unembed, h_RTD, tokens_RT, temperature)
  num = -(-t // chunk)
  pad = num * chunk - t
  h_CRKD = jnp.pad(h_RTD, ((0, 0), (0, pad), (0, 0))).reshape(
      r, num, chunk, d).swapaxes(0, 1)
  tokens_CRK = jnp.pad(tokens_RT, ((0, 0), (0, pad))).reshape(
      r, num, chunk).swapaxes(0, 1)
  # Inside a loop the recomputation cannot merge with the forward pass.
  one = jax.checkpoint(
      lambda x: _logprobs(unembed, x[0], x[1], temperature),
      prevent_cse=False)
  logps_CRK, entropy_CRK = jax.lax.map(one, (h_CRKD, tokens_CRK))
  unchunk = lambda x: x.swapaxes(0, 1).reshape(r, num * chunk)[:, :t]
  return unchunk(logps_CRK), unchunk(entropy_CRK)
