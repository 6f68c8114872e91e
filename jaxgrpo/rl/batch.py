"""A step's groups -> the train batch: stacked, with their advantages.

`assemble` stacks the groups a rollout step collected into a `TrainBatch`,
computes their group-relative advantages and cuts the completion axis to
the lengths in use (`rollout.train_lengths`).
"""

from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxgrpo.model import attention
from jaxgrpo.rl import advantages as advantages_lib
from jaxgrpo.rl import rounds as rounds_lib
from jaxgrpo.typing import TrainBatch

# The shortest step between the completion lengths of train batches.
TRAIN_LENGTH_MIN = 64


def train_lengths(t: int, n: int) -> tuple[int, ...]:
  """The completion lengths a train batch may have (`rollout.train_lengths`
  = n, T = t): multiples of a step (a multiple of 16, at least
  TRAIN_LENGTH_MIN), then T."""
  return attention.lengths_up_to(t, n, TRAIN_LENGTH_MIN)


def assemble(groups: Sequence[rounds_lib.Group], cfg: Any, pad_id: int,
             scale: float = 1.0) -> TrainBatch:
  """Stacks groups into a batch of B prompts, B * G completions.

  A short step is padded with empty groups (no valid completion tokens, zero
  advantage), so the jitted train step keeps its shape and the padding adds
  nothing to the loss; `scale` multiplies the advantages (short_batch
  'scale'). The completion axis is cut after the last valid token of any
  completion, rounded up to one of `train_lengths(T, cfg.train_lengths)`:
  only padding is cut, which every loss and metric masks out. `cfg` is the
  rollout's `RolloutConfig` (batch_size, group_size, advantage,
  train_lengths).
  """
  G, B = cfg.group_size, cfg.batch_size
  P = groups[0].prompt_tokens.shape[0]
  T = groups[0].completion_tokens.shape[1]
  rewards = np.zeros((B, G), np.float32)
  prompt_tokens = np.full((B, P), pad_id, np.int32)
  prompt_mask = np.zeros((B, P), bool)
  comp_tokens = np.full((B, G, T), pad_id, np.int32)
  comp_mask = np.zeros((B, G, T), bool)
  old_logps = np.zeros((B, G, T), np.float32)
  for b, g in enumerate(groups):
    rewards[b] = g.rewards
    prompt_tokens[b], prompt_mask[b] = g.prompt_tokens, g.prompt_mask
    comp_tokens[b], comp_mask[b] = g.completion_tokens, g.completion_mask
    old_logps[b] = g.old_logps
  adv = np.array(
      advantages_lib.compute_advantages(rewards, method=cfg.advantage)
  )
  adv[len(groups):] = 0.0
  adv *= scale
  valid = np.flatnonzero(comp_mask.any(axis=(0, 1)))
  longest = int(valid[-1]) + 1 if valid.size else 1
  t = next(n for n in train_lengths(T, cfg.train_lengths) if n >= longest)
  return TrainBatch(
      prompt_tokens=prompt_tokens,
      prompt_mask=prompt_mask,
      completion_tokens=comp_tokens[..., :t].reshape(B * G, t),
      completion_mask=comp_mask[..., :t].reshape(B * G, t),
      old_logps=old_logps[..., :t].reshape(B * G, t),
      advantages=adv.reshape(B * G).astype(np.float32),
  )
