"""Generate and score: examples -> prompts -> K completions each -> rewards.

Rollout rounds (`rl.rounds.ModelRound`) and evaluation (`evaluate`, and
through it stratification and the warm start's checks) share one sequence:
pad the examples by repetition to a fixed row count, encode their prompts,
sample K = generator.num_samples completions of each and score the real
rows' completions with the verifiers. A fixed row count keeps the compiled
generator to one shape; under a mesh it is rounded up to a multiple of the
batch devices, so the rows shard evenly. Padding rows are never scored,
and the continuous engine (whose decode steps take any row count)
decodes only those that round the examples up to a power of two.
"""

from collections.abc import Sequence
import dataclasses
import time

import jax
import numpy as np

from jaxgrpo import multihost
from jaxgrpo import scoring
from jaxgrpo import sharding
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.example import Example
from jaxgrpo.generate import continuous
from jaxgrpo.generate import keys
from jaxgrpo.generate.generator import Completions
from jaxgrpo.generate.generator import Generator
from jaxgrpo.typing import PyTree
from jaxgrpo.verifiers import base
from jaxgrpo.verifiers import pool as verifier_pool


@dataclasses.dataclass(frozen=True, kw_only=True)
class Scored:
  """K completions of each of E examples, scored.

  Row r of the prompts answers example r; rows E and on are the padding.

  Attributes:
    prompt_tokens: [E', P] int32, the left-padded prompts, E' >= E rows.
    prompt_mask: [E', P] bool, True on real prompt tokens.
    truncated: [E'] bool, prompts cut to fit P (`truncate`).
    completions: the E' * K completions (row r * K + k; a continuous
      engine decodes fewer padding rows: E rounded up to a power of two
      and the batch devices), gathered to the host on every process; None
      unless asked for (`gather`).
    rewards: [E, K] float32, the same on every process.
    stats: the verifiers' failures.
    failed: [E, K] bool, the completions whose verifier call failed (scored
      0; `scoring.score_rows`), the same on every process; None unless
      asked for (`failures`).
    gen_s: seconds generating (and gathering).
    verify_s: seconds decoding and verifying.
  """

  prompt_tokens: np.ndarray
  prompt_mask: np.ndarray
  truncated: np.ndarray
  completions: Completions | None
  rewards: np.ndarray
  stats: base.ScoreStats
  failed: np.ndarray | None
  gen_s: float
  verify_s: float

  def tokens_generated(self) -> float:
    """Completion tokens of the real rows (needs `completions`)."""
    rows = self.rewards.size
    return float(self.completions.mask[:rows].sum())


def padded_rows(rows: int) -> int:
  """`rows` rounded up to a multiple of the batch devices."""
  multiple = sharding.batch_multiple()
  return -(-rows // multiple) * multiple


def generate_and_score(
    generator: Generator,
    params: PyTree,
    tokenizer: tokenizer_lib.Tokenizer,
    examples: Sequence[Example],
    scorer: verifier_pool.Scorer,
    rng: jax.Array,
    *,
    max_prompt_len: int,
    truncate: bool = False,
    rows: int | None = None,
    gather: bool = False,
    failures: bool = False,
) -> Scored:
  """Samples and scores K = generator.num_samples completions per example.

  Args:
    generator: samples the completions (a `Generator`, a
      `ContinuousGenerator`, or a stand-in).
    params: the policy's params.
    tokenizer: encodes the prompts and decodes the completions.
    examples: E >= 1 examples.
    scorer: the verifiers.
    rng: the sampling key.
    max_prompt_len: P, the padded prompt length.
    truncate: cut longer prompts to their last tokens (BOS kept) instead
      of raising `PromptTooLongError`.
    rows: prompt rows to generate, >= E (default E); the examples are
      repeated to fill them, then to a multiple of the batch devices.
    gather: keep the completions, gathered to the host on every process
      (rollouts build their batch from them); otherwise each process only
      reads the rows it verifies.
    failures: mark the completions whose verifier call failed (`failed`;
      the scorer then hands back each call's outcome).

  Returns:
    The prompts, completions (with `gather`), rewards and timings.
  """
  n = len(examples)
  if not n:
    raise ValueError('generate_and_score needs at least one example')
  padded = list(examples)
  padded += [examples[i % n] for i in range(padded_rows(rows or n) - n)]
  tokens, mask, truncated = tokenizer_lib.encode_prompts(
      tokenizer, [ex.prompt for ex in padded], max_prompt_len,
      truncate=truncate, names=[ex.id for ex in padded],
  )
  t0 = time.perf_counter()
  if isinstance(generator, continuous.ContinuousGenerator):
    # Slots would decode each padding row in full (the static batch only
    # keeps its shape with them): the examples' rows go, rounded up to a
    # power of two (the output's few shapes) and the batch devices. A
    # sample's draws depend on (rng, its example's id and offer, its
    # index), not on its row, slot or batch-mates.
    m = min(len(padded), padded_rows(1 << (n - 1).bit_length()))
    offers = keys.repeats([ex.id for ex in examples])
    generated = generator.generate(
        params, tokens[:m], mask[:m], rng,
        prompt_keys=keys.prompt_keys(
            rng, [ex.id for ex in padded[:m]],
            [offers[i % n] for i in range(m)]))
  else:
    generated = generator.generate(params, tokens, mask, rng)
  # Every process holds every row (gathered across processes).
  host = jax.tree.map(multihost.to_host, generated) if gather else None
  gen_s = time.perf_counter() - t0
  k = generator.num_samples
  t0 = time.perf_counter()
  failed = np.zeros(n * k, bool) if failures else None
  rewards, stats = scoring.score_rows(
      scorer, tokenizer.decode, generated.tokens,
      [ex for ex in examples for _ in range(k)],
      on_host=None if host is None else host.tokens, failed=failed)
  verify_s = time.perf_counter() - t0
  return Scored(
      prompt_tokens=tokens, prompt_mask=mask, truncated=truncated,
      completions=host, rewards=rewards.reshape(n, k), stats=stats,
      failed=None if failed is None else failed.reshape(n, k), gen_s=gen_s,
      verify_s=verify_s)
