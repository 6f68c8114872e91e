"""Pure GRPO train step: several minibatch updates on one rollout batch.

The loss (`LossSection`, `LossConfig`), the minibatch loop (`train_step`),
its compiled form (`make_train_step`) and what the compiled step needs: the
batch's shapes (`abstract_batch`) and its memory (`memory_use`).

Size: those are one computation's parts; the shapes and the memory are read
from the same compiled function the loop runs.
"""

from collections.abc import Callable
import dataclasses
import functools

from flax import nnx
import jax
import jax.numpy as jnp
import optax

from jaxgrpo import checks
from jaxgrpo.checks import field
from jaxgrpo import sharding
from jaxgrpo.rl import logprobs
from jaxgrpo.rl import loss as loss_lib
from jaxgrpo import train_state as train_state_lib
from jaxgrpo.train_state import TrainState
from jaxgrpo.typing import TrainBatch

Metrics = dict[str, jax.Array]

class LossSection(checks.Section, name='rl'):
  """The settings of the GRPO objective in the config's `rl` section
  (`config_lib.RLSection` adds the rest)."""

  loss_agg: str = field(
      'token_mean', '`token_mean`, `seq_mean_token_mean`, or `dr_grpo` '
      '(constant normalizer)', checks.one_of(loss_lib.LOSS_AGGREGATIONS))
  eps_low: float = field(0.2, 'lower clip range of the importance ratio',
                         checks.in_range(0.0, 1.0, '[)'))
  eps_high: float = field(
      0.28, 'upper clip range of the importance ratio (clip-higher when '
      '`eps_high > eps_low`; inf: none)', checks.NON_NEGATIVE, inf=True)
  beta: float = field(
      0.0, 'KL (k3) weight to the initial policy; 0 keeps no reference copy',
      checks.NON_NEGATIVE)


class LossConfig(LossSection):
  """Settings of the GRPO objective (see `jaxgrpo.rl.loss.grpo_loss`).

  Attributes:
    temperature: the sampling temperature, so that recomputed log-probs
      match the sampling-time ones (0 means greedy: plain softmax).
    max_completion_len: normalizer of the 'dr_grpo' aggregation; None uses
      the batch's completion length, which `batch.assemble` cuts to the
      longest completion's (`rollout.train_lengths`): give T for a constant.
  """

  temperature: float = 1.0
  max_completion_len: int | None = None

  def __post_init__(self):
    super().__post_init__()  # the rl section's rules
    if self.temperature < 0.0:
      raise ValueError(f'temperature must be >= 0, got {self.temperature}')
    if self.max_completion_len is not None and self.max_completion_len < 1:
      raise ValueError(
          f'max_completion_len must be positive, got {self.max_completion_len}'
      )

  @classmethod
  def from_sections(cls, rl: LossSection, rollout) -> 'LossConfig':
    """From the config's rl section and the rollout section's temperature
    and T (the 'dr_grpo' normalizer)."""
    return cls(**checks.values(rl, LossSection),
               temperature=rollout.temperature,
               max_completion_len=rollout.max_new_tokens)


def _loss_fn(
    params: nnx.State,
    batch: TrainBatch,
    ref_logps_RT: jax.Array | None,
    base: nnx.State | None,
    *,
    graphdef: nnx.GraphDef,
    loss_cfg: LossConfig,
    remat: str,
) -> tuple[jax.Array, Metrics]:
  logps_RT, entropy_RT = logprobs.completion_logprobs(
      graphdef, train_state_lib.policy_params(params, base), batch,
      loss_cfg.temperature, remat=remat
  )
  loss, aux = loss_lib.grpo_loss(
      logps_RT,
      batch.old_logps,
      batch.advantages,
      batch.completion_mask,
      eps_low=loss_cfg.eps_low,
      eps_high=loss_cfg.eps_high,
      loss_agg=loss_cfg.loss_agg,
      beta=loss_cfg.beta,
      ref_logps_RT=ref_logps_RT,
      max_completion_len=loss_cfg.max_completion_len,
  )
  mask_RT = batch.completion_mask.astype(jnp.float32)
  entropy = (entropy_RT * mask_RT).sum() / jnp.maximum(mask_RT.sum(), 1.0)
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
    batch: TrainBatch, ref_logps_RT: jax.Array | None, groups_M: jax.Array
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
  return minibatch, None if ref_logps_RT is None else ref_logps_RT[rows]


def _reference_logps(
    graphdef: nnx.GraphDef,
    ref_params: nnx.State,
    batch: TrainBatch,
    *,
    temperature: float,
    num_minibatches: int,
) -> jax.Array:
  """[R, T] log-probs under the reference, one minibatch at a time."""
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


def _reference(
    state: TrainState, graphdef: nnx.GraphDef,
    base_graphdef: nnx.GraphDef | None,
) -> tuple[nnx.GraphDef, nnx.State]:
  """(graphdef, params) of the KL reference: the base decoder on the base
  params under an adapter, else the frozen copy of the initial params."""
  if state.base is not None:
    if base_graphdef is None:
      raise ValueError('beta > 0 under an adapter needs base_graphdef')
    return base_graphdef, state.base
  if state.ref_params is None:
    raise ValueError('beta > 0 needs a TrainState with ref_params')
  return graphdef, state.ref_params


def _shares(batch: TrainBatch, num_minibatches: int) -> jax.Array | None:
  """[B] each group's share of the batch's real groups times the number of
  minibatches (`_update`'s `share_M`); None for one minibatch, where the
  n / B the batch was scaled by is the minibatch's own."""
  if num_minibatches == 1:
    return None
  real_B = batch.prompt_mask.any(axis=1).astype(jnp.float32)  # no padding
  return real_B * num_minibatches / jnp.maximum(real_B.sum(), 1.0)


def _update(
    carry: tuple[nnx.State, optax.OptState],
    groups_M: jax.Array,
    *,
    batch: TrainBatch,
    ref_logps_RT: jax.Array | None,
    base: nnx.State | None,
    grad_fn: Callable,
    optimizer: optax.GradientTransformation,
    share_M: jax.Array | None = None,
) -> tuple[tuple[nnx.State, optax.OptState], tuple[Metrics, jax.Array]]:
  """One optimizer update on the minibatch of the groups `groups_M`.

  `share_M` (a short batch under `rollout.short_batch='scale'`, in several
  minibatches): each group's share of the real groups times the number of
  minibatches; the advantages, scaled by n / B for the whole batch, are
  scaled again by the minibatch's sum of it, so that its real groups weigh
  as groups of a full minibatch do whichever minibatch the shuffle put
  them in.

  It is skipped (params and optimizer state kept, a select) when the loss
  or gradients are not finite, or when the minibatch has no completion
  token (only a short batch's padding groups): a zero gradient would still
  move AdamW's params by its momentum and advance its count.

  Returns:
    The new (params, opt_state), and (the update's metrics, whether the
    minibatch had a token).
  """
  params, opt_state = carry
  mb_batch, mb_ref_logps = _take_groups(batch, ref_logps_RT, groups_M)
  if share_M is not None:
    mb_batch = mb_batch.replace(
        advantages=mb_batch.advantages * share_M[groups_M].sum())
  (loss, aux), grads = grad_fn(params, mb_batch, mb_ref_logps, base)
  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  used = mb_batch.completion_mask.any()
  updates, new_opt_state = optimizer.update(grads, opt_state, params)
  new_params = optax.apply_updates(params, updates)
  keep = lambda new, old: jnp.where(finite & used, new, old)
  params = jax.tree.map(keep, new_params, params)
  opt_state = jax.tree.map(keep, new_opt_state, opt_state)
  metrics = {
      'train/loss': loss,
      'train/grad_norm': grad_norm,
      'train/nonfinite': 1.0 - finite.astype(jnp.float32),
      **{f'train/{name}': value for name, value in aux.items()},
  }
  return (params, opt_state), (metrics, used)


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
    remat: str = 'none',
    base_graphdef: nnx.GraphDef | None = None,
    scale_short: bool = False,
) -> tuple[TrainState, Metrics]:
  """Runs num_iterations passes of minibatch updates over one rollout batch.

  Each pass shuffles the B prompt groups (key `fold_in(rng, iteration)`) and
  splits them into `num_minibatches` minibatches of whole groups (a prompt is
  run once for all its completions), each giving one optimizer update.
  Every update uses `batch.old_logps`, the sampling-time log-probs, as the
  old policy of the clipped ratio.

  An update whose loss or gradients are not finite is skipped: params and
  optimizer state stay as they were (a select, not a `lax.cond`: see
  `jaxgrpo.optimizer`), and `train/nonfinite` counts it, so a bad batch
  cannot poison the state (the loop decides when to give up). A minibatch
  without a completion token (a short batch's padding groups) takes no
  update and is left out of the metrics.

  Under a LoRA adapter (`state.base` set) only the adapter `state.params` is
  trained; the KL reference is the base decoder on `state.base`.

  Length: its docstring documents ten arguments and the metrics; the code is one
  loop of passes over minibatches.

  Args:
    state: the current TrainState; `state.ref_params` (or `state.base`) must
      be set when `loss_cfg.beta > 0`.
    batch: the rollout batch: B prompts, R = B * G completions.
    rng: key for the minibatch shuffles.
    graphdef: the policy's graph definition (with its adapters, if any).
    optimizer: the optax transformation that `state.opt_state` belongs to,
      made by `optimizer.make_optimizer`.
    loss_cfg: the objective's settings.
    num_iterations: passes over the batch.
    num_minibatches: updates per pass; must divide B.
    remat: rematerialization of each decoder block in the differentiated
      forward pass ('none', 'full' or 'dots'; see
      `jaxgrpo.model.decoder.REMAT_POLICIES`): less memory, more compute,
      the same result.
    base_graphdef: under an adapter, the decoder without it; else None.
    scale_short: the batch's advantages were scaled by n / B for its n
      real groups (`rollout.short_batch='scale'`); each minibatch then
      rescales its own by its real groups' share (`_update`).

  Returns:
    The new state (step + 1) and scalar metrics averaged over the updates
    taken with a finite loss and gradients (NaN when none was):
    train/loss, train/pg_loss, train/kl, train/clip_frac, train/entropy,
    train/grad_norm (before clipping), train/ratio_mean, train/nonfinite
    (share of updates skipped for a non-finite loss or gradient) and
    train/updates (the number of minibatches with a token).
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
  ref_logps_RT = None
  if loss_cfg.beta > 0:
    ref_logps_RT = _reference_logps(
        *_reference(state, graphdef, base_graphdef),
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
      functools.partial(_loss_fn, graphdef=graphdef, loss_cfg=loss_cfg,
                        remat=remat),
      has_aux=True,
  )

  update = functools.partial(
      _update, batch=batch, ref_logps_RT=ref_logps_RT, base=state.base,
      grad_fn=grad_fn, optimizer=optimizer,
      share_M=_shares(batch, num_minibatches) if scale_short else None)
  (params, opt_state), (metrics_U, used_U) = jax.lax.scan(
      update, (state.params, state.opt_state), groups_UM
  )
  # Means over the updates taken: a minibatch of padding groups has no
  # token to measure (its entropy and ratio would count as 0), and a
  # skipped non-finite one would make every mean NaN (NaN if all were).
  used_U = used_U.astype(jnp.float32)
  finite_U = used_U * (1.0 - metrics_U['train/nonfinite'])

  def mean(x_U, w_U):
    total = jnp.where(w_U > 0, x_U.astype(jnp.float32), 0.0).sum()
    out = total / jnp.maximum(w_U.sum(), 1.0)
    return jnp.where((w_U.sum() == 0) & (used_U.sum() > 0), jnp.nan, out)

  metrics = {name: mean(x_U, used_U if name == 'train/nonfinite' else finite_U)
             for name, x_U in metrics_U.items()}
  metrics['train/updates'] = used_U.sum().astype(jnp.int32)
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
    remat: str = 'none',
    base_graphdef: nnx.GraphDef | None = None,
    state_shardings: TrainState | None = None,
    batch_shardings: TrainBatch | None = None,
    scale_short: bool = False,
) -> Callable[[TrainState, TrainBatch, jax.Array], tuple[TrainState, Metrics]]:
  """`train_step` with its settings bound, jitted with the state donated.

  The state's buffers are reused for the new state. The batch is not
  donated: no output has its shapes, so XLA could not reuse its buffers.

  Activation constraints follow the mesh active when this is called (none
  outside `sharding.use_mesh`). With shardings (from `jaxgrpo.sharding`,
  under `use_mesh`) the step is compiled for them: the state comes in and goes out placed by
  `state_shardings`, the batch by `batch_shardings` (replicated when None),
  the rng and the metrics replicated. Call it with positional arguments,
  the state already placed (`sharding.shard`).

  Args:
    graphdef: the Decoder's graph definition.
    optimizer: the optax transformation of the TrainState.
    loss_cfg: the objective's settings.
    num_iterations: passes over each rollout batch.
    num_minibatches: updates per pass.
    remat: per-block rematerialization ('none', 'full', 'dots').
    base_graphdef: under a LoRA adapter, the decoder without it (see
      `train_step`).
    state_shardings: the TrainState's shardings
      (`sharding.train_state_shardings`), or None: unsharded.
    batch_shardings: the TrainBatch's shardings (`sharding.batch_shardings`).
    scale_short: `rollout.short_batch='scale'` (see `train_step`).

  Returns:
    A jitted `fn(state, batch, rng) -> (state, metrics)`.

  Raises:
    ValueError: shardings given outside `sharding.use_mesh`.
  """
  bound = functools.partial(
      train_step,
      graphdef=graphdef,
      optimizer=optimizer,
      loss_cfg=loss_cfg,
      num_iterations=num_iterations,
      num_minibatches=num_minibatches,
      remat=remat,
      base_graphdef=base_graphdef,
      scale_short=scale_short,
  )
  # Traced under the mesh (or none) active now, whenever it is first called.
  mesh = sharding.current()

  def step_fn(state, batch, rng):
    with sharding.activate(mesh):
      return bound(state, batch, rng)

  if state_shardings is None and batch_shardings is None:
    return jax.jit(step_fn, donate_argnames=('state',))
  replicated = sharding.replicated()
  if replicated is None:
    raise ValueError('make_train_step: shardings need an active mesh '
                     '(jaxgrpo.sharding.use_mesh)')
  state_in = replicated if state_shardings is None else state_shardings
  batch_in = replicated if batch_shardings is None else batch_shardings
  return jax.jit(
      step_fn,
      in_shardings=(state_in, batch_in, replicated),
      out_shardings=(state_in, replicated),
      donate_argnames=('state',),
  )


def abstract_batch(
    batch_size: int, group_size: int, prompt_len: int, completion_len: int
) -> TrainBatch:
  """The shapes and dtypes of a rollout TrainBatch (B, G, P, T), unallocated.

  They match `jaxgrpo.rl.rollout.Rollout`'s batches, so a step compiled for
  them (e.g. to read its memory use) is the one the loop runs.
  """
  b, n = batch_size, batch_size * group_size
  spec = jax.ShapeDtypeStruct
  return TrainBatch(
      prompt_tokens=spec((b, prompt_len), jnp.int32),
      prompt_mask=spec((b, prompt_len), jnp.bool_),
      completion_tokens=spec((n, completion_len), jnp.int32),
      completion_mask=spec((n, completion_len), jnp.bool_),
      old_logps=spec((n, completion_len), jnp.float32),
      advantages=spec((n,), jnp.float32),
  )


@dataclasses.dataclass(frozen=True)
class MemoryUse:
  """Bytes per device of a compiled step (XLA's memory analysis).

  Attributes:
    argument: inputs (state, batch, rng).
    output: outputs (new state, metrics).
    alias: outputs written into donated inputs (counted in both above).
    temp: scratch space: activations kept for the backward pass, gradients,
      optimizer temporaries.
  """

  argument: int
  output: int
  alias: int
  temp: int

  @property
  def total(self) -> int:
    """Peak estimate: inputs, outputs not aliasing them, and scratch."""
    return self.argument + self.output - self.alias + self.temp


def memory_use(
    step_fn, state: TrainState, batch: TrainBatch, rng: jax.Array
) -> MemoryUse | None:
  """Compiles `step_fn` (from `make_train_step`) for these arguments.

  The arguments may be abstract (jax.ShapeDtypeStruct, with shardings);
  nothing runs. jax caches the executable, so the loop's first call with
  arguments of the same shapes and shardings does not compile it again.

  Returns:
    Its memory use per device, or None where the backend reports none.
  """
  stats = step_fn.lower(state, batch, rng).compile().memory_analysis()
  if stats is None:
    return None
  return MemoryUse(
      argument=int(stats.argument_size_in_bytes),
      output=int(stats.output_size_in_bytes),
      alias=int(stats.alias_size_in_bytes),
      temp=int(stats.temp_size_in_bytes),
  )
