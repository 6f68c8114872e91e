"""Optimizer: global-norm clipping, AdamW and learning-rate schedules.

Non-finite updates are skipped by the train step (`train_step.train_step`),
not here. `optax.apply_if_finite` would do the same job, but it runs the
optimizer inside a `lax.cond`, which XLA compiles apart from the gradient
computation: on the CPU the demo's weights then differ in the last bits from
the sixth step on and its 100-step run ends elsewhere. The train step's
select (`jnp.where` over params and state) keeps every run bit for bit what
it was.

Params stored in bfloat16 (`model.param_dtype`) train through
`low_precision`: float32 moments and stochastically rounded updates, so that
updates below a weight's rounding step are not lost.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

SCHEDULES = ('constant', 'cosine')


def make_schedule(
    *,
    learning_rate: float,
    warmup_steps: int,
    total_steps: int,
    schedule: str = 'constant',
) -> optax.Schedule:
  """Linear warmup from 0 to `learning_rate`, then constant or cosine to 0.

  Args:
    learning_rate: the peak learning rate.
    warmup_steps: length of the linear warmup, in optimizer updates; 0 skips
      it.
    total_steps: total optimizer updates; the cosine reaches 0 here.
    schedule: one of `SCHEDULES`.

  Returns:
    An optax schedule: update count -> learning rate.
  """
  if warmup_steps < 0 or total_steps < 0:
    raise ValueError(
        f'warmup_steps ({warmup_steps}) and total_steps ({total_steps}) must '
        'be non-negative'
    )
  if schedule == 'constant':
    return optax.join_schedules(
        [
            optax.linear_schedule(0.0, learning_rate, warmup_steps),
            optax.constant_schedule(learning_rate),
        ],
        [warmup_steps],
    )
  if schedule == 'cosine':
    if total_steps <= warmup_steps:
      raise ValueError(
          f'cosine schedule needs total_steps ({total_steps}) > warmup_steps '
          f'({warmup_steps})'
      )
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=learning_rate,
        warmup_steps=warmup_steps,
        decay_steps=total_steps,
        end_value=0.0,
    )
  raise ValueError(
      f'unknown schedule {schedule!r}; expected one of {SCHEDULES}'
  )


def _decay_mask(params: optax.Params) -> optax.Params:
  # Matrices decay; norm scales and biases do not, as is usual for LMs.
  return jax.tree.map(lambda p: p.ndim > 1, params)


class LowPrecisionState(NamedTuple):
  """`low_precision`'s state: the inner optimizer's (float32) and the count
  of updates, which picks each update's rounding noise."""
  inner: optax.OptState
  count: jax.Array


def _float32(tree):
  return jax.tree.map(lambda x: x.astype(jnp.float32), tree)


def stochastic_round(x: jax.Array, key: jax.Array) -> jax.Array:
  """float32 `x` rounded to bfloat16 up or down at random, with the
  probability that makes the mean exact (E[round(x)] = x).

  The 16 bits bfloat16 drops get uniform noise added before they are cut:
  the magnitude rounds up with probability (its dropped part) / 2^16.
  """
  bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
  noise = jax.random.bits(key, x.shape, jnp.uint32) & jnp.uint32(0xFFFF)
  cut = (bits + noise) & jnp.uint32(0xFFFF0000)
  return jax.lax.bitcast_convert_type(cut, jnp.float32).astype(jnp.bfloat16)


def low_precision(inner: optax.GradientTransformation, seed: int = 0
                  ) -> optax.GradientTransformation:
  """`inner` for params stored in bfloat16.

  With bfloat16 params, AdamW's moments and its additions are rounded to 8
  bits: an update below half a weight's rounding step (|w| / 256 or so)
  is lost, so at RL's learning rates (1e-6) nearly no weight moves, and the
  second moment stops growing once (1 - b2) g^2 falls below its step. Here
  `inner` sees float32 gradients and params (its moments are float32) and
  each bfloat16 param's new value is rounded stochastically, unbiased: a
  weight moves by one step with the probability its update asks for. The
  noise comes from `seed` and the update count in the state, so a resumed
  run rounds as an uninterrupted one. Float32 params pass as `inner` has
  them.
  """

  def init(params):
    return LowPrecisionState(inner.init(_float32(params)),
                             jnp.zeros((), jnp.uint32))

  def update(updates, state, params=None):
    if params is None:
      raise ValueError('low_precision needs the params')
    updates, inner_state = inner.update(_float32(updates), state.inner,
                                        _float32(params))
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(
        jax.random.fold_in(jax.random.key(seed), state.count), len(leaves))

    def rounded(p, u, key):  # float32: p + it is the rounded value exactly
      if p.dtype != jnp.bfloat16:
        return u
      p32 = p.astype(jnp.float32)
      return stochastic_round(p32 + u, key).astype(jnp.float32) - p32

    updates = jax.tree.unflatten(tree, [
        rounded(p, u, k) for p, u, k in zip(
            leaves, tree.flatten_up_to(updates), keys)])
    return updates, LowPrecisionState(inner_state, state.count + 1)

  return optax.GradientTransformation(init, update)


def make_optimizer(
    *,
    learning_rate: float,
    warmup_steps: int,
    total_steps: int,
    max_grad_norm: float | None,
    weight_decay: float = 0.0,
    b1: float = 0.9,
    b2: float = 0.999,
    schedule: str = 'constant',
    param_dtype: str = 'float32',
    seed: int = 0,
) -> optax.GradientTransformation:
  """Clip by global norm, then AdamW on a warmup schedule.

  Steps are optimizer updates: a train step makes num_iterations *
  num_minibatches of them.

  Args:
    learning_rate: the peak learning rate.
    warmup_steps: length of the linear warmup, in updates.
    total_steps: total updates (the end of the cosine decay).
    max_grad_norm: clip gradients to this global norm; None or 0 disables.
    weight_decay: decoupled weight decay of matrices (not of vectors).
    b1: Adam's first-moment decay.
    b2: Adam's second-moment decay.
    schedule: 'constant' or 'cosine' after the warmup.
    param_dtype: the params' dtype; 'bfloat16' trains through
      `low_precision` (float32 moments, stochastic rounding).
    seed: the rounding noise's seed (with bfloat16 params).

  Returns:
    The optax transformation.
  """
  lr_schedule = make_schedule(
      learning_rate=learning_rate,
      warmup_steps=warmup_steps,
      total_steps=total_steps,
      schedule=schedule,
  )
  adamw = optax.adamw(
      lr_schedule, b1=b1, b2=b2, weight_decay=weight_decay, mask=_decay_mask
  )
  if max_grad_norm:
    adamw = optax.chain(optax.clip_by_global_norm(max_grad_norm), adamw)
  return adamw if param_dtype == 'float32' else low_precision(adamw, seed)
