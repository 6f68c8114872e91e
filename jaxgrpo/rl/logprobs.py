"""Per-token log-probs and entropy of completions under given params."""

from flax import nnx
import jax
import jax.numpy as jnp

from jaxgrpo.typing import TrainBatch


def full_sequence_inputs(
    batch: TrainBatch,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Builds decoder inputs for prompt and completion as one sequence.

  The layout matches what the generator saw: positions count the real tokens
  before each token, and no query attends to padding.

  Args:
    batch: a TrainBatch with [N, P] prompts and [N, T] completions.

  Returns:
    tokens_NL: [N, P + T] int32, prompt then completion.
    positions_NL: [N, P + T] int32, number of real tokens before each token.
    mask_NLL: [N, P + T, P + T] bool, True where query l may attend key s.
  """
  tokens_NL = jnp.concatenate(
      [batch.prompt_tokens, batch.completion_tokens], axis=1
  ).astype(jnp.int32)
  valid_NL = jnp.concatenate(
      [batch.prompt_mask, batch.completion_mask], axis=1
  ).astype(bool)
  positions_NL = jnp.maximum(jnp.cumsum(valid_NL, axis=1) - 1, 0)
  length = tokens_NL.shape[1]
  causal_LL = jnp.tril(jnp.ones((length, length), bool))
  # Each query also sees itself, so padding queries (whose outputs are never
  # used) keep a non-empty softmax and cannot put NaNs into the gradients.
  # Real queries are unaffected: they are valid keys of themselves.
  self_LL = jnp.eye(length, dtype=bool)
  mask_NLL = causal_LL[None] & (valid_NL[:, None, :] | self_LL[None])
  return tokens_NL, positions_NL.astype(jnp.int32), mask_NLL


def completion_logprobs(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    batch: TrainBatch,
    temperature: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
  """Log-probs and entropy of each completion token, in one forward pass.

  The distribution is softmax(logits / temperature), the one the tokens were
  sampled from (plain softmax when `temperature` is 0, i.e. greedy), so the
  result is comparable with the sampling-time `batch.old_logps`.

  Args:
    graphdef: the Decoder's graph definition.
    params: the Decoder's params.
    batch: a TrainBatch with [N, P] left-padded prompts and [N, T]
      right-padded completions.
    temperature: sampling temperature; a Python float.

  Returns:
    logps_NT: [N, T] float32 log-prob of each completion token; 0 on padding.
    entropy_NT: [N, T] float32 entropy of the next-token distribution at each
      completion position; 0 on padding.
  """
  prompt_len = batch.prompt_tokens.shape[1]
  completion_len = batch.completion_tokens.shape[1]
  tokens_NL, positions_NL, mask_NLL = full_sequence_inputs(batch)
  model = nnx.merge(graphdef, params)
  x_NLD, _ = model.backbone(model.embed(tokens_NL), positions_NL, mask_NLL)
  # Completion token t is predicted at index P + t - 1. Unembedding only those
  # positions keeps the [.., V] logits (the largest activation for real
  # vocabularies) off the prompt.
  x_NTD = x_NLD[:, prompt_len - 1 : prompt_len + completion_len - 1]
  logits_NTV = model.unembed(x_NTD).astype(jnp.float32)
  if temperature > 0:
    logits_NTV = logits_NTV / temperature
  logp_NTV = jax.nn.log_softmax(logits_NTV, axis=-1)
  logps_NT = jnp.take_along_axis(
      logp_NTV, batch.completion_tokens[..., None].astype(jnp.int32), axis=-1
  )[..., 0]
  entropy_NT = -(jnp.exp(logp_NTV) * logp_NTV).sum(axis=-1)
  valid_NT = batch.completion_mask.astype(bool)
  return (
      jnp.where(valid_NT, logps_NT, 0.0),
      jnp.where(valid_NT, entropy_NT, 0.0),
  )
