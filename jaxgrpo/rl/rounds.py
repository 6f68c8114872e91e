"""Rounds: a round's prompts -> one scored group of G completions each.

A `Rollout` draws a round's prompts from its prompt source and hands them to
its round function, which returns a `Round`: one group per prompt, its G
rewards and what producing them cost. Training uses `ModelRound` (the
policy's completions, scored by the verifiers); the simulator plugs in its
own (`sim.standins.FastRound`, rewards drawn from a synthetic learner).
`classify` then sorts the groups into informative and degenerate ones.
"""

from collections.abc import Sequence
import dataclasses
from typing import Any, Protocol

import jax
import numpy as np

from jaxgrpo.data import snooze
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.example import Example
from jaxgrpo.generate.generator import Generator
from jaxgrpo.rl import scored as scored_lib
from jaxgrpo.typing import PyTree
from jaxgrpo.verifiers import pool as verifier_pool
from jaxgrpo.verifiers.base import ScoreStats


@dataclasses.dataclass
class Group:
  """One prompt's G completions, on the host."""

  example: Example
  prompt_tokens: np.ndarray  # [P]
  prompt_mask: np.ndarray  # [P]
  completion_tokens: np.ndarray  # [G, T]
  completion_mask: np.ndarray  # [G, T]
  old_logps: np.ndarray  # [G, T]
  rewards: np.ndarray  # [G]
  # [G, T] int32, the step whose params sampled each token (-1: padding);
  # kept only where rollouts span steps (`rollout.in_flight='keep'`).
  versions: np.ndarray | None = None

  @property
  def tokens(self) -> int:
    """Completion tokens of the group."""
    return int(self.completion_mask.sum())


@dataclasses.dataclass(frozen=True, kw_only=True)
class Round:
  """A round's R prompts, scored.

  Attributes:
    groups: one per prompt, in the prompts' order: `Group`s, or a round
      function's own (anything with `example` and `rewards`, and `tokens`
      where the group's tokens are counted).
    rewards: [R, G] the groups' rewards.
    gen_s: seconds generating.
    gen_tokens: completion tokens generated for the R prompts.
    verify_s: seconds verifying.
    verify_errors: completions whose verifier failed or scored out of range.
    verify_timeouts: completions whose verifier timed out.
    verify_printed: completions whose verifier printed to stdout.
    verify_workers_replaced: verifier workers replaced as their memory or
      open files grew.
    truncated: [R] bool, prompts cut to fit (`rollout.long_prompts`), or
      None when none can be.
  """

  groups: Sequence[Any]
  rewards: np.ndarray
  gen_s: float
  gen_tokens: float
  verify_s: float = 0.0
  verify_errors: float = 0.0
  verify_timeouts: float = 0.0
  verify_printed: float = 0.0
  verify_workers_replaced: float = 0.0
  truncated: np.ndarray | None = None


class RoundFn(Protocol):
  """Scores a round: `examples` (R <= `size` of them) -> a `Round`.

  `size` is the round's requested prompt count: a round short of examples
  (the datasets ran out) still generates `size` rows, padded.
  """

  def __call__(self, params: PyTree, rng: jax.Array,
               examples: Sequence[Any], size: int) -> Round:
    ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelRound:
  """The training round: the policy's G completions of each prompt, scored.

  Attributes:
    tokenizer: encodes the prompts, decodes the completions.
    generator: samples G = generator.num_samples completions per prompt.
    scorer: the verifiers.
    max_prompt_len: P, the padded prompt length.
    truncate: cut longer prompts (`rollout.long_prompts='truncate'`).
  """

  tokenizer: tokenizer_lib.Tokenizer
  generator: Generator
  scorer: verifier_pool.Scorer
  max_prompt_len: int
  truncate: bool = False

  def __call__(self, params: PyTree, rng: jax.Array,
               examples: Sequence[Example], size: int) -> Round:
    s = scored_lib.generate_and_score(
        self.generator, params, self.tokenizer, examples, self.scorer, rng,
        max_prompt_len=self.max_prompt_len, truncate=self.truncate,
        rows=size, gather=True)
    out, G = s.completions, self.generator.num_samples
    T = out.tokens.shape[1]
    groups = [
        Group(
            example=ex,
            prompt_tokens=s.prompt_tokens[r],
            prompt_mask=s.prompt_mask[r],
            completion_tokens=out.tokens[r * G:(r + 1) * G].reshape(G, T),
            completion_mask=out.mask[r * G:(r + 1) * G].reshape(G, T),
            old_logps=out.logps[r * G:(r + 1) * G].reshape(G, T),
            rewards=s.rewards[r],
        )
        for r, ex in enumerate(examples)
    ]
    return Round(
        groups=groups, rewards=s.rewards, gen_s=s.gen_s,
        gen_tokens=s.tokens_generated(), verify_s=s.verify_s,
        truncated=s.truncated[:len(examples)], **verify_counts(s.stats))


def verify_counts(stats: ScoreStats) -> dict[str, float]:
  """A `Round`'s verifier counts from the ScoreStats of its scoring."""
  return {'verify_errors': float(stats.errors + stats.out_of_range),
          'verify_timeouts': float(stats.timeouts),
          'verify_printed': float(stats.printed),
          'verify_workers_replaced': float(stats.workers_replaced)}


def classify(
    rewards_RG: np.ndarray, easy_threshold: float, hard_threshold: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Splits groups into (informative, too easy, too hard) boolean masks [R]
  (`snooze.group_kinds`, which the sampler counts by: a flat group is
  dropped too)."""
  return snooze.group_kinds(rewards_RG, easy_threshold, hard_threshold)[:3]
