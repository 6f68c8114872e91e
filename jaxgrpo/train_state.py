"""TrainState pytree: step, params, optimizer state, frozen reference or base."""

import functools

from flax import nnx
import flax.struct
import jax
import jax.numpy as jnp
import optax


@flax.struct.dataclass
class TrainState:
  """Everything the learner carries between steps, as one pytree.

  Attributes:
    step: int32 scalar, number of train steps (rollout batches) done; the
      optimizer counts its own updates inside `opt_state`.
    params: the trained params: the policy's, or its LoRA adapter alone
      when `base` is set.
    opt_state: the optax state of `params`.
    ref_params: a frozen copy of the initial params for the KL penalty, or
      None when no penalty is used (beta == 0) so no memory is spent on it,
      and under an adapter, whose reference is `base`.
    base: under a LoRA adapter, the frozen base params (not trained, not in
      the optimizer state, not saved in checkpoints: a resume rebuilds them
      from the run's model); None in full fine-tuning.
  """

  step: jax.Array
  params: nnx.State
  opt_state: optax.OptState
  ref_params: nnx.State | None = None
  base: nnx.State | None = None

  @property
  def policy_params(self) -> nnx.State:
    """The params the policy's graphdef runs: `params`, with `base` under
    an adapter (the same arrays, not a copy)."""
    return policy_params(self.params, self.base)


def policy_params(params: nnx.State, base: nnx.State | None) -> nnx.State:
  """`params`, or the base params with the adapter `params` beside them."""
  return params if base is None else nnx.merge_state(base, params)


def create_train_state(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    optimizer: optax.GradientTransformation,
    *,
    keep_reference: bool,
    base: nnx.State | None = None,
) -> TrainState:
  """Builds the initial TrainState.

  Args:
    graphdef: the Decoder's graph definition; `params` are checked against it
      so a mismatched tree fails here rather than inside the first step.
    params: the initial trained params: the policy's, or a LoRA adapter
      (`jaxgrpo.model.lora.attach`) with `base`.
    optimizer: the optax transformation that will update `params`.
    keep_reference: keep a frozen copy of `params` as the KL reference
      (needed only when beta > 0; never with `base`, the reference then).
    base: the frozen base params under an adapter, or None.

  Returns:
    A TrainState at step 0.
  """
  if keep_reference and base is not None:
    raise ValueError('create_train_state: under an adapter the reference is '
                     'the base; keep_reference must be False')
  nnx.merge(graphdef, policy_params(params, base))  # Raises on a mismatch.
  # A real copy: the step donates `state`, and params and reference must not
  # share buffers.
  ref_params = jax.tree.map(jnp.copy, params) if keep_reference else None
  return TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=optimizer.init(params),
      ref_params=ref_params,
      base=base,
  )


def abstract_train_state(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    optimizer: optax.GradientTransformation,
    *,
    keep_reference: bool,
    base: nnx.State | None = None,
) -> TrainState:
  """The TrainState's shapes and dtypes, without allocating it.

  Args:
    graphdef: the Decoder's graph definition.
    params: params or their abstract version (e.g. from
      `jaxgrpo.model.decoder.abstract_params`).
    optimizer: the optax transformation that will update the params.
    keep_reference: as in `create_train_state`.
    base: as in `create_train_state` (real or abstract).

  Returns:
    A TrainState of jax.ShapeDtypeStruct leaves, e.g. a checkpoint restore
    target.
  """
  return jax.eval_shape(
      functools.partial(
          create_train_state,
          graphdef,
          optimizer=optimizer,
          keep_reference=keep_reference,
      ),
      params, base=base,
  )
