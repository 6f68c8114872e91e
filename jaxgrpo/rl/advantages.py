"""Group-relative advantages (GRPO, Dr. GRPO, RLOO) on [B, G] rewards."""

from collections.abc import Callable
import functools

import jax
import jax.numpy as jnp

from jaxgrpo.verifiers import base as verifier_base

# An estimator maps (rewards_BG, eps) to advantages_BG.
Estimator = Callable[[jax.Array, jax.Array], jax.Array]

_ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(name: str) -> Callable[[Estimator], Estimator]:
  """Registers an advantage estimator under `name` (a decorator).

  Registering the name again from the module that registered it (a
  notebook cell run again, a module reloaded, the function renamed or not)
  replaces it.
  """

  def register(fn: Estimator) -> Estimator:
    old = _ESTIMATORS.get(name)
    if old is not None and old is not fn:
      if not verifier_base.same_definition(old, fn):
        raise ValueError(
            f'advantage estimator {name!r} is already registered')
      compute_advantages.clear_cache()  # it traced the old one
    _ESTIMATORS[name] = fn
    return fn

  return register


def estimator_names() -> tuple[str, ...]:
  """Names accepted by `compute_advantages(method=...)`."""
  return tuple(sorted(_ESTIMATORS))


def _centered(rewards_BG: jax.Array) -> jax.Array:
  """r - mean(r) per group, exactly 0 where the group's rewards are equal.

  float32's mean of equal rewards can be off by an ulp (three 0.4s), which
  grpo's division by std + eps (~1e-6) would blow up to a few percent; the
  mean is taken of the differences to the group's first reward instead.
  """
  diff_BG = rewards_BG - rewards_BG[:, :1]
  return diff_BG - diff_BG.mean(axis=1, keepdims=True)


@register_estimator('grpo')
def _grpo(rewards_BG: jax.Array, eps: jax.Array) -> jax.Array:
  # Population std (ddof=0): a group of two rewards {0, 1} maps to -1, +1.
  std_B1 = rewards_BG.std(axis=1, keepdims=True)
  return _centered(rewards_BG) / (std_B1 + eps)


@register_estimator('dr_grpo')
def _dr_grpo(rewards_BG: jax.Array, eps: jax.Array) -> jax.Array:
  # Dr. GRPO drops the std division, which up-weights near-degenerate groups.
  del eps
  return _centered(rewards_BG)


@register_estimator('rloo')
def _rloo(rewards_BG: jax.Array, eps: jax.Array) -> jax.Array:
  # r_j - mean of the other G-1 rewards, which equals G/(G-1) * (r_j - mean).
  del eps
  num_samples = rewards_BG.shape[1]
  if num_samples < 2:
    raise ValueError('rloo needs at least 2 samples per prompt')
  return _centered(rewards_BG) * (num_samples / (num_samples - 1))


@functools.partial(jax.jit, static_argnames=('method',))
def compute_advantages(
    rewards_BG: jax.Array, method: str = 'grpo', eps: float = 1e-6
) -> jax.Array:
  """Advantage of each completion relative to its prompt's group.

  A group whose rewards are all equal gets exactly zero advantage under
  every built-in method.

  Args:
    rewards_BG: [B, G] rewards, G completions for each of B prompts.
    method: one of `estimator_names()`: 'grpo' ((r - mean) / (std + eps)),
      'dr_grpo' (r - mean) or 'rloo' (r - mean of the other G - 1 rewards).
    eps: added to the group std by 'grpo'; ignored by the other methods.

  Returns:
    [B, G] float32 advantages.

  Raises:
    ValueError: an unknown method, rewards not [B, G], or an estimator
      that returns no [B, G] array of floats (a registered one's mistake).
  """
  if method not in _ESTIMATORS:
    raise ValueError(
        f'unknown advantage method {method!r}; expected one of '
        f'{estimator_names()}'
    )
  if rewards_BG.ndim != 2:
    raise ValueError(f'rewards must be [B, G], got shape {rewards_BG.shape}')
  rewards_BG = rewards_BG.astype(jnp.float32)
  out = _ESTIMATORS[method](rewards_BG, jnp.asarray(eps, jnp.float32))
  shape, dtype = getattr(out, 'shape', None), getattr(out, 'dtype', None)
  if shape != rewards_BG.shape or not jnp.issubdtype(dtype, jnp.floating):
    raise ValueError(
        f'rl.advantage={method!r}: the estimator returned shape {shape} and '
        f'dtype {dtype}; it must return the [B, G] = '
        f'{tuple(rewards_BG.shape)} advantages as floats')
  return out
