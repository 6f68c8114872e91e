"""TrainState pytree: step, params, optimizer state and frozen reference."""

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
    params: the policy's params.
    opt_state: the optax state of `params`.
    ref_params: a frozen copy of the initial params for the KL penalty, or
      None when no penalty is used (beta == 0) so no memory is spent on it.
  """

  step: jax.Array
  params: nnx.State
  opt_state: optax.OptState
  ref_params: nnx.State | None = None


def create_train_state(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    optimizer: optax.GradientTransformation,
    *,
    keep_reference: bool,
) -> TrainState:
  """Builds the initial TrainState.

  Args:
    graphdef: the Decoder's graph definition; `params` are checked against it
      so a mismatched tree fails here rather than inside the first step.
    params: the initial policy params.
    optimizer: the optax transformation that will update `params`.
    keep_reference: keep a frozen copy of `params` as the KL reference
      (needed only when beta > 0).

  Returns:
    A TrainState at step 0.
  """
  nnx.merge(graphdef, params)  # Raises if the trees do not match.
  # A real copy: the step donates `state`, and params and reference must not
  # share buffers.
  ref_params = jax.tree.map(jnp.copy, params) if keep_reference else None
  return TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=optimizer.init(params),
      ref_params=ref_params,
  )


def abstract_train_state(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    optimizer: optax.GradientTransformation,
    *,
    keep_reference: bool,
) -> TrainState:
  """The TrainState's shapes and dtypes, without allocating it.

  Args:
    graphdef: the Decoder's graph definition.
    params: params or their abstract version (e.g. from
      `jaxgrpo.model.decoder.abstract_params`).
    optimizer: the optax transformation that will update the params.
    keep_reference: as in `create_train_state`.

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
      params,
  )
