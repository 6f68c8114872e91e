"""Optimizer: global-norm clipping, AdamW and learning-rate schedules.

Non-finite updates are skipped by the train step (`train_step.train_step`),
not here. `optax.apply_if_finite` would do the same job, but it runs the
optimizer inside a `lax.cond`, which XLA compiles apart from the gradient
computation: on the CPU the demo's weights then differ in the last bits from
the sixth step on and its 100-step run ends elsewhere. The train step's
select (`jnp.where` over params and state) keeps every run bit for bit what
it was.
"""

import jax
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
  if not max_grad_norm:
    return adamw
  return optax.chain(optax.clip_by_global_norm(max_grad_norm), adamw)
