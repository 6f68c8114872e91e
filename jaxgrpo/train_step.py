"""Pure GRPO train step: several minibatch updates on one rollout batch."""

from collections.abc import Callable
import dataclasses
import functools

from flax import nnx
import jax
import jax.numpy as jnp
import optax

from jaxgrpo.rl import logprobs
from jaxgrpo.rl import loss as loss_lib
from jaxgrpo.train_state import TrainState
from jaxgrpo.typing import TrainBatch

Metrics = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LossConfig:
  """Settings of the GRPO objective (see `jaxgrpo.rl.loss.grpo_loss`).

  Attributes:
    eps_low: lower clip range of the importance ratio.
    eps_high: upper clip range; above `eps_low` is DAPO's clip-higher.
    loss_agg: one of `jaxgrpo.rl.loss.LOSS_AGGREGATIONS`.
    beta: weight of the KL penalty to the initial params; 0 keeps no
      reference copy.
    temperature: the sampling temperature, so that recomputed log-probs
      match the sampling-time ones (0 means greedy: plain softmax).
    max_completion_len: normalizer of the 'dr_grpo' aggregation; None uses
      the batch's completion length.
  """

  eps_low: float = 0.2
  eps_high: float = 0.28
  loss_agg: str = 'token_mean'
  beta: float = 0.0
  temperature: float = 1.0
  max_completion_len: int | None = None

  def __post_init__(self):
    if not 0.0 <= self.eps_low < 1.0:
      raise ValueError(f'eps_low must be in [0, 1), got {self.eps_low}')
    if self.eps_high < 0.0:
      raise ValueError(f'eps_high must be >= 0, got {self.eps_high}')
    if self.loss_agg not in loss_lib.LOSS_AGGREGATIONS:
      raise ValueError(
          f'unknown loss_agg {self.loss_agg!r}; expected one of '
          f'{loss_lib.LOSS_AGGREGATIONS}'
      )
    if self.beta < 0.0:
      raise ValueError(f'beta must be >= 0, got {self.beta}')
    if self.temperature < 0.0:
      raise ValueError(f'temperature must be >= 0, got {self.temperature}')
    if self.max_completion_len is not None and self.max_completion_len < 1:
      raise ValueError(
          f'max_completion_len must be positive, got {self.max_completion_len}'
      )


def _loss_fn(
    params: nnx.State,
    batch: TrainBatch,
    ref_logps_NT: jax.Array | None,
    *,
    graphdef: nnx.GraphDef,
    loss_cfg: LossConfig,
) -> tuple[jax.Array, Metrics]:
  logps_NT, entropy_NT = logprobs.completion_logprobs(
      graphdef, params, batch, loss_cfg.temperature
  )
  loss, aux = loss_lib.grpo_loss(
      logps_NT,
      batch.old_logps,
      batch.advantages,
      batch.completion_mask,
      eps_low=loss_cfg.eps_low,
      eps_high=loss_cfg.eps_high,
      loss_agg=loss_cfg.loss_agg,
      beta=loss_cfg.beta,
      ref_logps_NT=ref_logps_NT,
      max_completion_len=loss_cfg.max_completion_len,
  )
  mask_NT = batch.completion_mask.astype(jnp.float32)
  entropy = (entropy_NT * mask_NT).sum() / jnp.maximum(mask_NT.sum(), 1.0)
  aux['entropy'] = jax.lax.stop_gradient(entropy)
  return loss, aux


def _split_minibatches(batch: TrainBatch, num_minibatches: int) -> TrainBatch:
  """Leaves [X, ...] -> [num_minibatches, X / num_minibatches, ...].

  Prompts ([B, ...]) and completions ([B * G, ...], group-major) split at the
  same group boundaries, so chunk m holds whole groups with their prompts.
  """
  return jax.tree.map(
      lambda x: x.reshape(num_minibatches, -1, *x.shape[1:]), batch
  )


def _take_groups(
    batch: TrainBatch, ref_logps_NT: jax.Array | None, groups_M: jax.Array
) -> tuple[TrainBatch, jax.Array | None]:
  """The minibatch of the given prompt groups, with all their completions."""
  g = batch.advantages.shape[0] // batch.prompt_tokens.shape[0]
  rows = (groups_M[:, None] * g + jnp.arange(g)[None]).reshape(-1)
  minibatch = TrainBatch(
      prompt_tokens=batch.prompt_tokens[groups_M],
      prompt_mask=batch.prompt_mask[groups_M],
      completion_tokens=batch.completion_tokens[rows],
      completion_mask=batch.completion_mask[rows],
      old_logps=batch.old_logps[rows],
      advantages=batch.advantages[rows],
  )
  return minibatch, None if ref_logps_NT is None else ref_logps_NT[rows]


def _reference_logps(
    graphdef: nnx.GraphDef,
    ref_params: nnx.State,
    batch: TrainBatch,
    *,
    temperature: float,
    num_minibatches: int,
) -> jax.Array:
  """[N, T] log-probs under the reference, one minibatch at a time."""
  # Computed once per batch (the reference does not move between updates),
  # in minibatch-sized chunks so that peak memory matches an update's.
  chunks = _split_minibatches(batch, num_minibatches)
  logps_MBT = jax.lax.map(
      lambda mb: logprobs.completion_logprobs(
          graphdef, ref_params, mb, temperature
      )[0],
      chunks,
  )
  return jax.lax.stop_gradient(logps_MBT.reshape(-1, logps_MBT.shape[-1]))


def train_step(
    state: TrainState,
    batch: TrainBatch,
    rng: jax.Array,
    *,
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    loss_cfg: LossConfig,
    num_iterations: int,
    num_minibatches: int,
) -> tuple[TrainState, Metrics]:
  """Runs num_iterations passes of minibatch updates over one rollout batch.

  Each pass shuffles the B prompt groups (key `fold_in(rng, iteration)`) and
  splits them into `num_minibatches` minibatches of whole groups (a prompt is
  run once for all its completions), each giving one optimizer update.
  Every update uses `batch.old_logps`, the sampling-time log-probs, as the
  old policy of the clipped ratio.

  An update whose loss or gradients are not finite is skipped: params and
  optimizer state stay as they were, and `train/nonfinite` counts it, so a
  bad batch cannot poison the state (the loop decides when to give up).

  Args:
    state: the current TrainState; `state.ref_params` must be set when
      `loss_cfg.beta > 0`.
    batch: the rollout batch: B prompts, N = B * G completions.
    rng: key for the minibatch shuffles.
    graphdef: the Decoder's graph definition.
    optimizer: the optax transformation that `state.opt_state` belongs to.
    loss_cfg: the objective's settings.
    num_iterations: passes over the batch.
    num_minibatches: updates per pass; must divide B.

  Returns:
    The new state (step + 1) and scalar metrics averaged over the updates:
    train/loss, train/pg_loss, train/kl, train/clip_frac, train/entropy,
    train/grad_norm (before clipping), train/ratio_mean, train/nonfinite
    (share of updates skipped for a non-finite loss or gradient) and
    train/updates (the number of updates).
  """
  num_groups = batch.prompt_tokens.shape[0]
  if num_iterations < 1 or num_minibatches < 1:
    raise ValueError(
        f'num_iterations ({num_iterations}) and num_minibatches '
        f'({num_minibatches}) must be positive'
    )
  if num_groups % num_minibatches:
    raise ValueError(
        f'{num_groups} prompt groups do not split into {num_minibatches} '
        'minibatches'
    )
  ref_logps_NT = None
  if loss_cfg.beta > 0:
    if state.ref_params is None:
      raise ValueError('beta > 0 needs a TrainState with ref_params')
    ref_logps_NT = _reference_logps(
        graphdef,
        state.ref_params,
        batch,
        temperature=loss_cfg.temperature,
        num_minibatches=num_minibatches,
    )

  num_updates = num_iterations * num_minibatches
  orders_IB = jax.vmap(
      lambda i: jax.random.permutation(jax.random.fold_in(rng, i), num_groups)
  )(jnp.arange(num_iterations))
  groups_UM = orders_IB.reshape(num_updates, num_groups // num_minibatches)
  grad_fn = jax.value_and_grad(
      functools.partial(_loss_fn, graphdef=graphdef, loss_cfg=loss_cfg),
      has_aux=True,
  )

  def update(carry, groups_M):
    params, opt_state = carry
    mb_batch, mb_ref_logps = _take_groups(batch, ref_logps_NT, groups_M)
    (loss, aux), grads = grad_fn(params, mb_batch, mb_ref_logps)
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, new_opt_state = optimizer.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    keep = lambda new, old: jnp.where(finite, new, old)
    params = jax.tree.map(keep, new_params, params)
    opt_state = jax.tree.map(keep, new_opt_state, opt_state)
    metrics = {
        'train/loss': loss,
        'train/grad_norm': grad_norm,
        'train/nonfinite': 1.0 - finite.astype(jnp.float32),
        **{f'train/{name}': value for name, value in aux.items()},
    }
    return (params, opt_state), metrics

  (params, opt_state), metrics_U = jax.lax.scan(
      update, (state.params, state.opt_state), groups_UM
  )
  metrics = jax.tree.map(lambda x: x.astype(jnp.float32).mean(), metrics_U)
  metrics['train/updates'] = jnp.asarray(num_updates, jnp.int32)
  new_state = state.replace(
      step=state.step + 1, params=params, opt_state=opt_state
  )
  return new_state, metrics


def make_train_step(
    *,
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    loss_cfg: LossConfig,
    num_iterations: int = 1,
    num_minibatches: int = 1,
) -> Callable[[TrainState, TrainBatch, jax.Array], tuple[TrainState, Metrics]]:
  """`train_step` with its settings bound, jitted with the state donated.

  The state's buffers are reused for the new state. The batch is not
  donated: no output has its shapes, so XLA could not reuse its buffers.

  Args:
    graphdef: the Decoder's graph definition.
    optimizer: the optax transformation of the TrainState.
    loss_cfg: the objective's settings.
    num_iterations: passes over each rollout batch.
    num_minibatches: updates per pass.

  Returns:
    A jitted `fn(state, batch, rng) -> (state, metrics)`.
  """
  step_fn = functools.partial(
      train_step,
      graphdef=graphdef,
      optimizer=optimizer,
      loss_cfg=loss_cfg,
      num_iterations=num_iterations,
      num_minibatches=num_minibatches,
  )
  return jax.jit(step_fn, donate_argnames=('state',))
