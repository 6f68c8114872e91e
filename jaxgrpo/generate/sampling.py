"""Token sampling: temperature, top-k and top-p (nucleus), greedy at 0."""

import dataclasses
import numbers

import jax
import jax.numpy as jnp

from jaxgrpo.checks import MIN_TEMPERATURE


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sampling:
  """How the next token is drawn from the logits.

  Frozen and hashable, so a strategy is a static jit argument and its
  branches are resolved at trace time.

  Attributes:
    temperature: softmax temperature; 0 means greedy (argmax).
    top_k: keep only the k most likely tokens; 0 turns it off.
    top_p: keep the smallest set of most likely tokens whose probability
      reaches top_p (applied after top_k); 1.0 turns it off.
  """

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    if not (self.temperature == 0 or self.temperature >= MIN_TEMPERATURE):
      raise ValueError(
          f'Sampling.temperature must be 0 (greedy) or >= {MIN_TEMPERATURE:g}, '
          f'got {self.temperature!r}'
      )
    if (not isinstance(self.top_k, numbers.Integral)
        or isinstance(self.top_k, bool) or self.top_k < 0):
      raise ValueError(
          f'Sampling.top_k must be an int >= 0, got {self.top_k!r}'
      )
    object.__setattr__(self, 'top_k', int(self.top_k))  # np.int64(5): 5
    if not 0 < self.top_p <= 1:
      raise ValueError(f'Sampling.top_p must be in (0, 1], got {self.top_p!r}')

  @property
  def greedy(self) -> bool:
    return self.temperature == 0

  def next_tokens(self, logits_BV: jax.Array, rng: jax.Array) -> jax.Array:
    """Draws one token per row.

    Args:
      logits_BV: unnormalized log-probs, [B, V].
      rng: PRNG key (unused when greedy).

    Returns:
      int32 token ids, [B].
    """
    if self.greedy:
      return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
    logits_BV = logits_BV.astype(jnp.float32) / self.temperature
    vocab = logits_BV.shape[-1]
    top_k = min(self.top_k, vocab) if self.top_k else 0
    if not top_k and self.top_p >= 1:
      return jax.random.categorical(rng, logits_BV, axis=-1).astype(jnp.int32)
    # Candidates sorted by decreasing logit: the k best, or the whole
    # vocabulary when only top-p truncates.
    logits_BC, ids_BC = jax.lax.top_k(logits_BV, top_k or vocab)
    if self.top_p < 1:
      probs_BC = jax.nn.softmax(logits_BC, axis=-1)
      mass_before_BC = jnp.cumsum(probs_BC, axis=-1) - probs_BC
      # The first candidate always survives (its preceding mass is 0).
      logits_BC = jnp.where(mass_before_BC < self.top_p, logits_BC, -jnp.inf)
    choice_B = jax.random.categorical(rng, logits_BC, axis=-1)
    return jnp.take_along_axis(ids_BC, choice_B[:, None], axis=-1)[:, 0]

  def next_tokens_per_row(
      self, logits_BV: jax.Array, keys_B: jax.Array
  ) -> jax.Array:
    """Draws one token per row, row b with its own key `keys_B[b]`.

    A row's token then depends on its logits and key only, not on its
    batch-mates or its place in the batch.

    Args:
      logits_BV: unnormalized log-probs, [B, V].
      keys_B: [B] PRNG keys (unused when greedy).

    Returns:
      int32 token ids, [B].
    """
    if self.greedy:
      return self.next_tokens(logits_BV, keys_B)
    return jax.vmap(lambda l_V, k: self.next_tokens(l_V[None], k)[0])(
        logits_BV, keys_B)

  def logps(self, logits_BV: jax.Array, tokens_B: jax.Array) -> jax.Array:
    """Log-prob of `tokens_B` under softmax(logits / temperature).

    Uses the plain softmax when greedy, and ignores top-k/top-p truncation,
    matching how the learner scores completions.

    Args:
      logits_BV: unnormalized log-probs, [B, V].
      tokens_B: int token ids, [B].

    Returns:
      float32 log-probs, [B].
    """
    logits_BV = logits_BV.astype(jnp.float32)
    if not self.greedy:
      logits_BV = logits_BV / self.temperature
    picked_B = jnp.take_along_axis(logits_BV, tokens_B[:, None], axis=-1)[:, 0]
    return picked_B - jax.nn.logsumexp(logits_BV, axis=-1)
