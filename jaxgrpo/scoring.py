"""Scores generated rows, each process verifying only the rows it owns.

Generation leaves its completions sharded over the batch devices. Every
process needs every reward (the sampler's decisions and the batch are
computed identically everywhere), but verifying is host work that should
not be repeated on every host: each process decodes and verifies the rows
it owns (`multihost.owned_rows`) and the rewards, zero elsewhere, are summed
over processes. One process owns every row, at no extra cost.
"""

from collections.abc import Callable, Sequence
import dataclasses

import jax
import numpy as np

from jaxgrpo import multihost
from jaxgrpo.example import Example
from jaxgrpo.verifiers import base
from jaxgrpo.verifiers import pool as verifier_pool


def score_rows(
    scorer: verifier_pool.Scorer,
    decode: Callable[[np.ndarray], str],
    tokens: jax.Array | np.ndarray,
    examples: Sequence[Example],
    *,
    on_host: np.ndarray | None = None,
    failed: np.ndarray | None = None,
) -> tuple[np.ndarray, base.ScoreStats]:
  """Rewards [N] of the first N = len(examples) rows of `tokens` [>= N, T].

  Row i answers examples[i]; rows past N (padding) are not scored. Returns
  the same rewards and failure counts on every process. `on_host` is the
  whole of `tokens` where the caller already gathered it to the host
  (rollouts do, to build the batch): the owned rows are read from it
  instead of being copied from the devices a second time. `failed`, when
  given, is an [N] bool array set True at the rows whose verifier call
  failed (raised, gave no reward in [0, 1] or timed out; scored 0), the
  same on every process.
  """
  n = len(examples)
  if isinstance(tokens, jax.Array):
    rows = multihost.owned_rows(tokens)
    rows = rows[rows < n]
    held = (multihost.local_rows(tokens, rows) if on_host is None
            else np.asarray(on_host)[rows])
  else:  # host rows (stand-in generators): all here
    rows, held = np.arange(n), np.asarray(tokens)[:n]
  texts = [decode(row) for row in held]
  if failed is None:
    part, stats = scorer.score(texts, [examples[i] for i in rows])
  else:
    part, stats, outcomes = scorer.score(
        texts, [examples[i] for i in rows], with_details=True)
    failed[:] = False
    failed[rows] = [out.kind != 'ok' for out in outcomes]
    if jax.process_count() > 1:
      failed[:] = multihost.sum_over_processes(failed.astype(np.int32)) > 0
  rewards = np.zeros(n, np.float32)
  rewards[rows] = part
  if jax.process_count() > 1:
    rewards = multihost.sum_over_processes(rewards)
  return rewards, summed(stats)


def summed(stats: base.ScoreStats) -> base.ScoreStats:
  """Each count of `stats` summed over processes (`stats` itself in one
  process); every process must call it, as `multihost.sum_over_processes`."""
  if jax.process_count() == 1:
    return stats
  counts = multihost.sum_over_processes(
      np.array(dataclasses.astuple(stats), np.int64))
  return base.ScoreStats(*(int(c) for c in counts))
