"""GRPO clipped surrogate with an optional KL penalty, on arrays."""

import jax
import jax.numpy as jnp

# How per-token losses are reduced to a scalar:
#   token_mean: sum over all valid tokens / number of valid tokens (DAPO), so
#     every token weighs the same and long completions are not diluted.
#   seq_mean_token_mean: mean over sequences of each sequence's token mean
#     (the original GRPO), so every completion weighs the same.
#   dr_grpo: sum over valid tokens / (num_sequences * max_completion_len), a
#     normalizer that does not depend on the lengths, removing their bias
#     (Dr. GRPO); padding rows are not sequences.
LOSS_AGGREGATIONS = ('token_mean', 'seq_mean_token_mean', 'dr_grpo')


def _token_mean(x_RT: jax.Array, mask_RT: jax.Array) -> jax.Array:
  return (x_RT * mask_RT).sum() / jnp.maximum(mask_RT.sum(), 1.0)


def _aggregate(
    x_RT: jax.Array,
    mask_RT: jax.Array,
    loss_agg: str,
    max_completion_len: int,
) -> jax.Array:
  """Reduces per-token values to a scalar; `mask_RT` is float 0/1."""
  if loss_agg == 'token_mean':
    return _token_mean(x_RT, mask_RT)
  # Rows without a valid token (a short batch's padding groups) do not
  # count as sequences: padding changes no aggregation.
  count_R = mask_RT.sum(axis=1)
  num_seqs = jnp.maximum((count_R > 0).sum().astype(x_RT.dtype), 1.0)
  if loss_agg == 'seq_mean_token_mean':
    seq_mean_R = (x_RT * mask_RT).sum(axis=1) / jnp.maximum(count_R, 1.0)
    return seq_mean_R.sum() / num_seqs
  if loss_agg == 'dr_grpo':
    return (x_RT * mask_RT).sum() / (num_seqs * max_completion_len)
  raise ValueError(
      f'unknown loss_agg {loss_agg!r}; expected one of {LOSS_AGGREGATIONS}'
  )


def grpo_loss(
    logps_RT: jax.Array,
    old_logps_RT: jax.Array,
    advantages_R: jax.Array,
    mask_RT: jax.Array,
    *,
    eps_low: float,
    eps_high: float,
    loss_agg: str = 'token_mean',
    beta: float = 0.0,
    ref_logps_RT: jax.Array | None = None,
    max_completion_len: int | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """PPO clipped surrogate with asymmetric clipping and a k3 KL penalty.

  The ratio exp(logp - old_logp) is clipped to [1 - eps_low, 1 + eps_high];
  a larger `eps_high` (DAPO's clip-higher) leaves more room to raise the
  probability of unlikely tokens. With `beta > 0` the per-token loss adds
  `beta * (exp(ref - logp) - (ref - logp) - 1)`, an unbiased, non-negative
  estimate of KL(policy || reference). `beta` is a Python float: the KL
  branch is chosen while tracing.

  Length: its docstring documents ten arguments and the formula; the code
  is short.

  Args:
    logps_RT: [R, T] log-probs of the completion tokens under the policy
      being optimized (differentiated).
    old_logps_RT: [R, T] log-probs at sampling time.
    advantages_R: [R] advantage of each completion.
    mask_RT: [R, T] bool, True on valid completion tokens.
    eps_low: lower clip range of the ratio.
    eps_high: upper clip range of the ratio.
    loss_agg: one of `LOSS_AGGREGATIONS`.
    beta: KL penalty weight; 0 disables the KL term.
    ref_logps_RT: [R, T] log-probs under the reference policy; required when
      `beta > 0`.
    max_completion_len: normalizer of 'dr_grpo'; defaults to T.

  Returns:
    (loss, aux): the scalar loss and scalars 'pg_loss' (the clipped surrogate
    alone, aggregated like the loss), 'kl' (token mean of the k3 estimate; 0
    when `beta == 0`), 'clip_frac' (share of valid tokens whose gradient is
    cut by clipping) and 'ratio_mean' (token mean of the ratio).
  """
  if loss_agg not in LOSS_AGGREGATIONS:
    raise ValueError(
        f'unknown loss_agg {loss_agg!r}; expected one of {LOSS_AGGREGATIONS}'
    )
  if max_completion_len is None:
    max_completion_len = logps_RT.shape[1]
  valid_RT = mask_RT.astype(bool)
  mask_RT = mask_RT.astype(jnp.float32)
  adv_N1 = jax.lax.stop_gradient(advantages_R)[:, None]

  # Padding may hold arbitrary log-probs; zeroing the exponent there keeps an
  # overflow out of the masked sums (0 * inf would be NaN).
  log_ratio_RT = logps_RT - jax.lax.stop_gradient(old_logps_RT)
  ratio_RT = jnp.exp(jnp.where(valid_RT, log_ratio_RT, 0.0))
  clipped_ratio_RT = jnp.clip(ratio_RT, 1.0 - eps_low, 1.0 + eps_high)
  pg_loss_RT = -jnp.minimum(ratio_RT * adv_N1, clipped_ratio_RT * adv_N1)
  # Clipping is active where min() picks the clipped term and it is constant.
  clipped_RT = ((adv_N1 > 0) & (ratio_RT > 1.0 + eps_high)) | (
      (adv_N1 < 0) & (ratio_RT < 1.0 - eps_low)
  )

  loss_RT = pg_loss_RT
  if beta > 0:
    if ref_logps_RT is None:
      raise ValueError('beta > 0 needs ref_logps_RT')
    delta_RT = jax.lax.stop_gradient(ref_logps_RT) - logps_RT
    delta_RT = jnp.where(valid_RT, delta_RT, 0.0)
    kl_RT = jnp.exp(delta_RT) - delta_RT - 1.0
    loss_RT = loss_RT + beta * kl_RT
    kl = _token_mean(kl_RT, mask_RT)
  else:
    kl = jnp.zeros((), jnp.float32)

  loss = _aggregate(loss_RT, mask_RT, loss_agg, max_completion_len)
  aux = {
      'pg_loss': _aggregate(pg_loss_RT, mask_RT, loss_agg, max_completion_len),
      'kl': kl,
      'clip_frac': _token_mean(clipped_RT.astype(jnp.float32), mask_RT),
      'ratio_mean': _token_mean(ratio_RT, mask_RT),
  }
  aux = jax.tree.map(jax.lax.stop_gradient, aux)
  return loss, aux
