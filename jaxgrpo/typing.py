"""Shared types: pytree aliases, the train batch and the dimension legend.

Dimension legend used in array suffixes and einsum strings across jaxgrpo:
  B batch (prompts, or sequences where stated)  T query / completion length
  S key (cache) length   P prompt length   L full sequence length (P + T)
  D model width   N query heads   K key/value heads   H head dim
  R completions (rows), B * G: row b * G + g is the g-th sample of prompt b
  F feed-forward width   V vocabulary   G generations per prompt
"""

from typing import Any

import flax.struct
import jax

from jaxgrpo.example import Example  # noqa: F401  (re-exported)

PyTree = Any
PRNGKey = jax.Array
Array = jax.Array


@flax.struct.dataclass
class TrainBatch:
  """One optimizer batch: B prompts and their R = B * G completions.

  Each prompt is stored once; completion row b * G + g is the g-th sample of
  prompt b. The learner runs each prompt through the model once and shares
  its keys and values with the prompt's G completions.

  Attributes:
    prompt_tokens: [B, P] int32, left-padded prompts.
    prompt_mask: [B, P] bool, True on real prompt tokens.
    completion_tokens: [R, T] int32, right-padded completions.
    completion_mask: [R, T] bool, True on generated tokens (the stop token
      included, padding after it excluded).
    old_logps: [R, T] float32, per-token log-probs at sampling time (the old
      policy of the clipped ratio).
    advantages: [R] float32, group-relative advantage of each completion.
  """

  prompt_tokens: jax.Array
  prompt_mask: jax.Array
  completion_tokens: jax.Array
  completion_mask: jax.Array
  old_logps: jax.Array
  advantages: jax.Array
