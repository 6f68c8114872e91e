"""Held-out accuracy: mean@k of sampled completions, overall and per subset.

Evaluation scores with the training run's verifiers and counts their
failures as a training step does (`verify_metrics`: `eval/verify/errors`,
`eval/verify/timeouts`, ...), next to the accuracy they lower.
"""

from collections import defaultdict
from collections.abc import Callable, Sequence
import dataclasses
from typing import Any

import jax
import numpy as np

from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.example import Example
from jaxgrpo.generate.generator import Generator
from jaxgrpo.reporting import console as console_lib
from jaxgrpo.rl import rounds as rounds_lib
from jaxgrpo.rl import scored as scored_lib
from jaxgrpo.typing import PyTree
from jaxgrpo.verifiers import base
from jaxgrpo.verifiers import pool as verifier_pool

# Prompts per generator call at most: every call of an evaluation has this
# size, or the number of held-out examples where they are fewer.
_CHUNK = 64


def sample_rewards(
    generator: Generator,
    params: PyTree,
    tokenizer: tokenizer_lib.Tokenizer,
    examples: Sequence[Example],
    scorer: verifier_pool.Scorer,
    rng: jax.Array,
    *,
    max_prompt_len: int,
    truncate: bool = False,
    chunk_size: int = _CHUNK,
    on_chunk: Callable[[int], None] | None = None,
    stats: base.ScoreStats | None = None,
    failed: np.ndarray | None = None,
) -> np.ndarray:
  """Rewards [E, k] of k = generator.num_samples completions per example.

  Examples go through `scored.generate_and_score` in chunks of one fixed
  size (the last padded by repetition), so evaluation compiles once; under
  a mesh the size is rounded up to a multiple of the batch devices, so rows
  shard evenly (the padding rows' completions are dropped). With
  `truncate`, prompts longer than `max_prompt_len` are cut as in rollouts;
  otherwise they raise `PromptTooLongError`. `on_chunk` receives the number
  of examples each chunk finished (a progress bar's `update`); `stats`,
  when given, gets the verifiers' failure counts added (the same on every
  process); `failed`, when given, an [E, k] bool array, is set True where
  a completion's verifier call failed (`scored.Scored.failed`).
  """
  out = np.zeros((len(examples), generator.num_samples), np.float32)
  for start in range(0, len(examples), chunk_size):
    chunk = examples[start:start + chunk_size]
    scored = scored_lib.generate_and_score(
        generator, params, tokenizer, chunk, scorer,
        jax.random.fold_in(rng, start), max_prompt_len=max_prompt_len,
        truncate=truncate, rows=chunk_size, failures=failed is not None)
    out[start:start + len(chunk)] = scored.rewards
    if stats is not None:
      stats.add(scored.stats)
    if failed is not None:
      failed[start:start + len(chunk)] = scored.failed
    if on_chunk is not None:
      on_chunk(len(chunk))
  return out


def accuracy_metrics(
    examples: Sequence[Example], rewards_EK: np.ndarray, prefix: str = 'eval',
    threshold: float = 1.0,
) -> dict[str, float]:
  """`{prefix}/accuracy/<dataset>` and per-subset `.../<dataset>/<subset>`.

  Also `{prefix}/accuracy` over all examples and `{prefix}/pass_at_k`, the
  share of examples with a completion whose reward is >= `threshold`
  (`rollout.easy_threshold`, as `jaxgrpo-eval` counts a success): a partial
  reward (`qa` with `metric='f1'`, a weighted format part) is no pass.
  """
  per_example = rewards_EK.mean(axis=1)
  groups: dict[str, list[float]] = defaultdict(list)
  for ex, acc in zip(examples, per_example):
    groups[ex.dataset].append(acc)
    if ex.subset:
      groups[f'{ex.dataset}/{ex.subset}'].append(acc)
  metrics = {f'{prefix}/accuracy/{k}': float(np.mean(v)) for k, v in sorted(groups.items())}
  metrics[f'{prefix}/accuracy'] = float(per_example.mean())
  metrics[f'{prefix}/pass_at_k'] = float(
      (rewards_EK.max(axis=1) >= threshold).mean())
  return metrics


def verify_counts(stats: base.ScoreStats) -> dict[str, int]:
  """`errors` (calls that raised or returned no reward in [0, 1]),
  `timeouts`, `printed` and `workers_replaced`, counted as a training
  step's `verify/*` (`rounds.verify_counts`)."""
  return {name.removeprefix('verify_'): int(count)
          for name, count in rounds_lib.verify_counts(stats).items()}


def verify_metrics(
    stats: base.ScoreStats, prefix: str = 'eval') -> dict[str, float]:
  """`{prefix}/verify/errors`, `.../timeouts`, `.../printed` and
  `.../workers_replaced` of an evaluation (`verify_counts`), 0 included."""
  return {f'{prefix}/verify/{name}': float(count)
          for name, count in verify_counts(stats).items()}


def pass_metrics(rewards_EK: np.ndarray, threshold: float) -> dict[str, float]:
  """pass@1, mean@k and pass@k of k rewards per example.

  Args:
    rewards_EK: rewards of k completions per example, [E, k], E >= 1.
    threshold: a completion succeeds when its reward is >= this.

  Returns:
    `examples` (E); `pass@1`, the share of examples whose first completion
    succeeds; `mean@k`, the mean reward over all E * k completions; and
    `pass@k`, the share of examples with at least one success in k.
  """
  rewards_EK = np.asarray(rewards_EK, np.float64)
  success_EK = rewards_EK >= threshold
  return {
      'examples': int(rewards_EK.shape[0]),
      'pass@1': float(success_EK[:, 0].mean()),
      'mean@k': float(rewards_EK.mean()),
      'pass@k': float(success_EK.any(axis=1).mean()),
  }


def grouped_pass_metrics(
    examples: Sequence[Example], rewards_EK: np.ndarray, threshold: float
) -> dict[str, dict[str, float]]:
  """`pass_metrics` over all examples ('all'), per dataset and per subset.

  Keys are 'all', then each dataset name and its `<dataset>/<subset>`s,
  sorted.
  """
  rows: dict[str, list[int]] = defaultdict(list)
  for i, ex in enumerate(examples):
    rows[ex.dataset].append(i)
    if ex.subset:
      rows[f'{ex.dataset}/{ex.subset}'].append(i)
  rewards_EK = np.asarray(rewards_EK)
  out = {'all': pass_metrics(rewards_EK, threshold)}
  for group, index in sorted(rows.items()):
    out[group] = pass_metrics(rewards_EK[index], threshold)
  return out


@dataclasses.dataclass(frozen=True)
class Evaluator:
  """Held-out accuracy of params: `evaluator(params, step)` -> metrics.

  Samples cfg.eval.num_samples completions of each held-out example (at
  cfg.eval.temperature, a key folded from `rng` and the step) and returns
  `accuracy_metrics` (eval/accuracy, ...) and `verify_metrics`
  (eval/verify/errors, ...), with a progress bar; no metrics when no
  dataset holds examples out. A greedy generator draws one
  completion per example, whatever its num_samples: the k would be the
  same, and so would every metric.
  """

  generator: Generator
  tokenizer: Any
  examples: list[Example]
  scorer: verifier_pool.Scorer
  rng: jax.Array
  max_prompt_len: int
  truncate: bool
  console: console_lib.Console
  threshold: float = 1.0  # a completion passes at this reward or more

  def __post_init__(self):
    k = self.generator.num_samples
    if self.generator.sampling.greedy and k > 1 and self.examples:
      self.console.info(f'eval.temperature=0 is greedy: its eval.num_samples='
                        f'{k} completions would be identical, so one is drawn '
                        'per example')
      object.__setattr__(self, 'generator',
                         dataclasses.replace(self.generator, num_samples=1))

  def __call__(self, params: PyTree, step: int) -> dict[str, float]:
    if not self.examples:  # no dataset holds examples out: nothing to report
      return {}
    stats = base.ScoreStats()
    with self.console.bar(len(self.examples), desc=f'eval (step {step})',
                          unit='ex') as bar:
      rewards = sample_rewards(
          self.generator, params, self.tokenizer, self.examples, self.scorer,
          jax.random.fold_in(self.rng, step),
          max_prompt_len=self.max_prompt_len,
          truncate=self.truncate, on_chunk=bar.update, stats=stats,
          # 16 held-out examples are one call of 16 prompts, not 64 (48 of
          # them padding), as in jaxgrpo-eval.
          chunk_size=min(_CHUNK, len(self.examples)),
      )
    return {**accuracy_metrics(self.examples, rewards,
                               threshold=self.threshold),
            **verify_metrics(stats)}


def evaluate_model(
    generator: Generator,
    params: PyTree,
    tokenizer: tokenizer_lib.Tokenizer,
    scorer: verifier_pool.Scorer,
    datasets: Sequence[tuple[int, Sequence[Example]]],
    *,
    key: jax.Array,
    threshold: float,
    max_prompt_len: int,
    truncate: bool = False,
    batch: int = 64,
    bar: Any = None,
    stats: base.ScoreStats | None = None,
) -> dict[str, dict[str, float]]:
  """pass@1, mean@k and pass@k of one model (`grouped_pass_metrics`), as
  jaxgrpo-eval reports them.

  Args:
    generator: samples `generator.num_samples` = k completions per prompt
      (a `Generator`, or a stand-in with `generate(params, tokens, mask,
      rng)`).
    params: the model params passed to the generator.
    tokenizer: encodes prompts and decodes completions.
    scorer: scores completions against their examples.
    datasets: (config index, examples) of each dataset; the examples of
      index d are sampled in chunks of `batch`, chunk c with the key
      fold_in(fold_in(key, d), c).
    key: the sampling key.
    threshold: a completion succeeds when its reward is >= this.
    max_prompt_len: P, the padded prompt length.
    truncate: cut longer prompts as rollouts do instead of failing.
    batch: prompts per generator call (every call has this size).
    bar: a tqdm bar advanced by the examples done, or None.
    stats: when given, the verifiers' failure counts are added to it.

  Returns:
    Group ('all', '<dataset>', '<dataset>/<subset>') -> metrics.
  """
  examples, rewards = [], []
  for index, members in datasets:
    dataset_key = jax.random.fold_in(key, index)
    for c, start in enumerate(range(0, len(members), batch)):
      chunk = list(members[start:start + batch])
      if bar is not None:
        bar.set_postfix_str(chunk[0].dataset, refresh=False)
      rewards.append(sample_rewards(
          generator, params, tokenizer, chunk, scorer,
          jax.random.fold_in(dataset_key, c), max_prompt_len=max_prompt_len,
          truncate=truncate, chunk_size=batch, stats=stats))
      examples += chunk
      if bar is not None:
        bar.update(len(chunk))
  return grouped_pass_metrics(examples, np.concatenate(rewards), threshold)
