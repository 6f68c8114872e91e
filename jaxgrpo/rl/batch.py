"""A step's groups -> the train batch: stacked, advantages, cut completions.

`assemble` stacks the groups a rollout step collected into a `TrainBatch`,
computes their group-relative advantages, masks the completions cut at T
when `rl.cut_completions='mask'` (DAPO's overlong filtering) and cuts the
completion axis to the lengths in use (`rollout.train_lengths`).
"""

from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxgrpo.model import attention
from jaxgrpo.rl import advantages as advantages_lib
from jaxgrpo.rl import rounds as rounds_lib
from jaxgrpo.typing import TrainBatch

# What the loss does with a completion cut at T (`rollout.max_new_tokens`)
# without a stop token: trains on it as it stands, or masks it out (DAPO's
# overlong filtering): its tokens count as padding in every aggregation.
CUT_COMPLETIONS = ('train', 'mask')

# The shortest step between the completion lengths of train batches.
TRAIN_LENGTH_MIN = 64


def train_lengths(t: int, n: int) -> tuple[int, ...]:
  """The completion lengths a train batch may have (`rollout.train_lengths`
  = n, T = t): multiples of a step (a multiple of 16, at least
  TRAIN_LENGTH_MIN), then T."""
  return attention.lengths_up_to(t, n, TRAIN_LENGTH_MIN)


def cut_rows(tokens: np.ndarray, mask: np.ndarray,
             stop_ids: Sequence[int]) -> np.ndarray:
  """[...] whether each completion ([..., T] tokens and mask) was cut: it
  fills T and its last token is no stop token."""
  return mask[..., -1] & ~np.isin(tokens[..., -1], np.asarray(stop_ids, int))


def masked_share(groups: Sequence[rounds_lib.Group],
                 stop_ids: Sequence[int]) -> float:
  """The share of the groups' completions that `cut_completions='mask'`
  masks out of the loss (`train/completions_masked`)."""
  cut = sum(int(cut_rows(g.completion_tokens, g.completion_mask,
                         stop_ids).sum()) for g in groups)
  return cut / sum(g.completion_mask.shape[0] for g in groups)


def assemble(groups: Sequence[rounds_lib.Group], cfg: Any, pad_id: int,
             scale: float = 1.0, stop_ids: Sequence[int] = ()) -> TrainBatch:
  """Stacks groups into a batch of B prompts, B * G completions.

  A short step is padded with empty groups (no valid completion tokens, zero
  advantage), so the jitted train step keeps its shape and the padding adds
  nothing to the loss; `scale` multiplies the advantages (short_batch
  'scale'). The advantages are computed over every completion of a group;
  then under `cfg.cut_completions='mask'` the completions cut at T without a
  stop token (`cut_rows`) lose their mask: they weigh nothing and count in
  no normalizer, as padding, while their rewards still shaped the others'
  advantages. The completion axis is cut after the last valid token of any
  completion, rounded up to one of `train_lengths(T, cfg.train_lengths)`:
  only padding is cut, which every loss and metric masks out.

  Args:
    groups: at most B groups of G completions, padded to T.
    cfg: the rollout's `RolloutConfig` (batch_size, group_size, advantage,
      train_lengths, cut_completions).
    pad_id: pads the prompts and completions.
    scale: multiplies the advantages.
    stop_ids: the ids that end a completion (a cut completion's last token
      is none of them).

  Raises:
    ValueError: `cfg.cut_completions` not one of `CUT_COMPLETIONS`.
  """
  if cfg.cut_completions not in CUT_COMPLETIONS:
    raise ValueError(f'rl.cut_completions={cfg.cut_completions!r}: must be '
                     f'one of {CUT_COMPLETIONS}')
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
  if cfg.cut_completions == 'mask':
    comp_mask &= ~cut_rows(comp_tokens, comp_mask, stop_ids)[..., None]
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
