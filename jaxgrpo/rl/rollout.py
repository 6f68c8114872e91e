"""Rollouts with DAPO dynamic sampling: prompts -> G samples -> rewards -> batch.

A step collects B informative groups. Each round draws R prompts from the
prompt source, generates G completions for each, scores them and drops the
degenerate groups (all rewards equal, or every reward past the easy or hard
threshold): they have zero advantage and teach nothing. Rounds repeat until B
groups are in hand or `max_rounds` is reached. A step left short by default
takes no update and holds its groups for the next step (`short_batch`), so
every update sees B groups; the metrics say so. Surplus groups from the last
round are dropped or carried to the next step.
"""

from collections import defaultdict
from collections.abc import Sequence
import dataclasses
import json
import math
import time
from typing import Protocol

import jax
import numpy as np

from jaxgrpo import checks
from jaxgrpo import multihost
from jaxgrpo import scoring
from jaxgrpo import sharding
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.example import Example
from jaxgrpo.generate.generator import Generator
from jaxgrpo.rl import advantages as advantages_lib
from jaxgrpo.typing import PyTree, TrainBatch
from jaxgrpo.verifiers import pool as verifier_pool

SURPLUS = ('drop', 'carry')
LONG_PROMPTS = ('error', 'truncate', 'drop')
# What a step does when collection ends with fewer than B informative groups.
SHORT_BATCH = ('wait', 'scale', 'train')
# The rules of the settings RolloutConfig checks (config_lib's too).
RULES: dict[str, checks.Rule] = {
    'round_size': checks.rule(
        lambda r: r == 'adaptive' or (isinstance(r, int) and r > 0),
        "must be a positive int or 'adaptive'"),
    'surplus': checks.one_of(SURPLUS),
    'short_batch': checks.one_of(SHORT_BATCH),
    'long_prompts': checks.one_of(LONG_PROMPTS),
}


class PromptSource(Protocol):
  """Where rollouts get prompts and send outcomes (`MixtureSampler`)."""

  names: list[str]
  batch_size: int

  def start_step(self, step: int) -> None:
    ...

  def next_prompts(self, n: int, need: np.ndarray) -> list[Example]:
    ...

  def observe(self, examples: Sequence[Example], rewards: np.ndarray) -> None:
    ...

  def need(self, counts: np.ndarray) -> np.ndarray:
    ...

  def batch_full(self, counts: np.ndarray) -> bool:
    ...

  def choose(self, groups: Sequence['Group']) -> tuple[list, list]:
    ...

  def informative_rate(self) -> float:
    ...

  def metrics(self) -> dict[str, float]:
    ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutConfig:
  """How a step's batch is collected.

  Attributes:
    batch_size: B, informative groups per optimizer step.
    group_size: G, completions per prompt.
    round_size: R, prompts per generator call, or 'adaptive': sized from
      the sampler's predicted share of informative groups to fill the batch
      in about one round, rounded up to a power of two (so the generator
      compiles for few shapes) and capped at `max_round_size`.
    max_round_size: cap of adaptive round sizes.
    max_rounds: most generator calls per step.
    surplus: 'drop' or 'carry' informative groups beyond B.
    short_batch: what a step does when its collection ends (max_rounds
      reached, or no dataset has a prompt left to offer) with fewer than B
      informative groups. 'wait': no update; the groups are held and the
      next step's rounds add to them, so every update is on exactly B
      groups. The policy does not change while they wait, so held groups
      stay on-policy. 'scale': update on the short batch with its
      advantages scaled by n / B, so each group weighs what it weighs in a
      full batch (under Adam this shrinks the step less than n / B).
      'train': a full-size update on whatever it has.
    max_prompt_len: P, padded prompt length in tokens.
    long_prompts: a prompt longer than P is an error ('error'), keeps BOS
      and its last P - 1 tokens ('truncate', counted in
      `data/truncated/<dataset>`), or was removed from its dataset when it
      was loaded ('drop'; one reaching a round is an error).
    easy_threshold: a group is too easy when every reward is >= this.
    hard_threshold: a group is too hard when every reward is <= this.
    advantage: one of `advantages.estimator_names()`.
  """

  batch_size: int
  group_size: int
  round_size: int | str
  max_rounds: int
  max_round_size: int = 256
  surplus: str = 'carry'
  short_batch: str = 'wait'
  max_prompt_len: int
  long_prompts: str = 'error'
  easy_threshold: float = 1.0
  hard_threshold: float = 0.0
  advantage: str = 'grpo'

  def __post_init__(self):
    checks.check(self, RULES, 'rollout')

  @classmethod
  def from_section(cls, rollout, advantage: str) -> 'RolloutConfig':
    """From the config's rollout section and rl.advantage."""
    return cls(advantage=advantage, **{
        f.name: getattr(rollout, f.name) for f in dataclasses.fields(cls)
        if f.name != 'advantage'})


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


def classify(
    rewards_RG: np.ndarray, easy_threshold: float, hard_threshold: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Splits groups into (informative, too easy, too hard) boolean masks [R].

  A group of equal rewards that is neither easy nor hard (e.g. all 0.5) is
  dropped too: its advantages are all zero.
  """
  easy = (rewards_RG >= easy_threshold).all(axis=1)
  hard = (rewards_RG <= hard_threshold).all(axis=1) & ~easy
  flat = np.ptp(rewards_RG, axis=1) <= 1e-6
  informative = ~(easy | hard | flat)
  return informative, easy, hard


@dataclasses.dataclass
class RolloutResult:
  """A step's batch (None when no group was informative) and its metrics."""

  batch: TrainBatch | None
  groups: list[Group]
  metrics: dict[str, float]


class Rollout:
  """Collects a step's batch with dynamic sampling."""

  def __init__(
      self,
      cfg: RolloutConfig,
      source: PromptSource,
      tokenizer: tokenizer_lib.Tokenizer,
      generator: Generator,
      scorer: verifier_pool.Scorer,
  ):
    if generator.num_samples != cfg.group_size:
      raise ValueError(
          f'generator makes {generator.num_samples} samples per prompt, '
          f'rollout.group_size is {cfg.group_size}'
      )
    self.cfg = cfg
    self.source = source
    self.tokenizer = tokenizer
    self.generator = generator
    self.scorer = scorer
    self.carried: list[Group] = []
    self.cum_prompts_generated = 0
    self.cum_groups_used = 0

  def round_size(self, counts: np.ndarray) -> int:
    """Prompts for the next round, given informative groups in hand."""
    cfg = self.cfg
    if cfg.round_size != 'adaptive':
      return cfg.round_size
    owed = max(cfg.batch_size - int(counts.sum()),
               int(self.source.need(counts).sum()), 1)
    # A small margin over the expected need trades a few surplus groups
    # (carried or dropped) for fewer generator calls.
    rate = max(self.source.informative_rate(), 1.0 / cfg.max_round_size)
    want = math.ceil(1.25 * owed / rate)
    return min(cfg.max_round_size, 1 << max(3, (want - 1).bit_length()))

  def _round(
      self, params: PyTree, rng: jax.Array, size: int, need: np.ndarray
  ) -> tuple[list[Group], np.ndarray, list[Example], dict[str, float]]:
    cfg = self.cfg
    examples = self.source.next_prompts(size, need)
    if not examples:
      return [], np.zeros((0, cfg.group_size), np.float32), [], {}
    # A short round (datasets ran out of offered examples) is padded by
    # repetition to the compiled shape, and every round to a multiple of
    # the batch devices so its rows shard evenly; the padding is never
    # scored.
    multiple = sharding.batch_multiple()
    padded = examples + [examples[i % len(examples)]
                         for i in range(-(-size // multiple) * multiple
                                        - len(examples))]
    tokens, mask, truncated = tokenizer_lib.encode_prompts(
        self.tokenizer, [ex.prompt for ex in padded], cfg.max_prompt_len,
        truncate=cfg.long_prompts == 'truncate',
        names=[ex.id for ex in padded],
    )
    t0 = time.perf_counter()
    generated = self.generator.generate(params, tokens, mask, rng)
    # Every process holds every row (gathered across processes) to build
    # the same batch.
    out = jax.tree.map(multihost.to_host, generated)
    gen_s = time.perf_counter() - t0
    G = cfg.group_size
    repeated = [ex for ex in examples for _ in range(G)]
    t0 = time.perf_counter()
    rewards, stats = scoring.score_rows(
        self.scorer, self.tokenizer.decode, generated.tokens, repeated,
        on_host=out.tokens)
    verify_s = time.perf_counter() - t0
    rewards_RG = rewards.reshape(len(examples), G)
    self.source.observe(examples, rewards_RG)
    informative, easy, hard = classify(
        rewards_RG, cfg.easy_threshold, cfg.hard_threshold
    )
    T = out.tokens.shape[1]
    groups = [
        Group(
            example=examples[r],
            prompt_tokens=tokens[r],
            prompt_mask=mask[r],
            completion_tokens=out.tokens[r * G:(r + 1) * G].reshape(G, T),
            completion_mask=out.mask[r * G:(r + 1) * G].reshape(G, T),
            old_logps=out.logps[r * G:(r + 1) * G].reshape(G, T),
            rewards=rewards_RG[r],
        )
        for r in np.flatnonzero(informative)
    ]
    info = {
        'easy': float(easy.sum()),
        'hard': float(hard.sum()),
        'gen_s': gen_s,
        'gen_tokens': float(out.mask[:len(examples) * G].sum()),
        'verify_errors': float(stats.errors + stats.out_of_range),
        'verify_timeouts': float(stats.timeouts),
        'verify_s': verify_s,
        'round_size': float(size),
    }
    for ex, cut in zip(examples, truncated):
      info[f'truncated/{ex.dataset}'] = (
          info.get(f'truncated/{ex.dataset}', 0.0) + float(cut))
    return groups, rewards_RG, examples, info

  def collect(
      self, params: PyTree, rng: jax.Array, step: int = 0
  ) -> RolloutResult:
    """Runs rounds until the batch can be filled (or max_rounds)."""
    cfg = self.cfg
    source = self.source
    source.start_step(step)
    index = {name: d for d, name in enumerate(source.names)}
    groups, self.carried = self.carried, []
    carried_in = len(groups)
    counts = np.zeros(len(source.names), np.int64)
    for g in groups:
      counts[index[g.example.dataset]] += 1
    rounds = 0
    generated = np.zeros(len(source.names), np.int64)
    totals: dict[str, float] = defaultdict(float)
    reward_sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    while not source.batch_full(counts) and rounds < cfg.max_rounds:
      new, rewards_RG, examples, info = self._round(
          params, jax.random.fold_in(rng, rounds), self.round_size(counts),
          source.need(counts),
      )
      if not examples:
        break  # no dataset has anything left to offer this epoch
      rounds += 1
      groups.extend(new)
      for g in new:
        counts[index[g.example.dataset]] += 1
      for key, value in info.items():
        totals[key] += value
      for ex, row in zip(examples, rewards_RG):
        generated[index[ex.dataset]] += 1
        keys = [ex.dataset] + ([f'{ex.dataset}/{ex.subset}'] if ex.subset
                               else [])
        for key in keys:
          reward_sums[key][0] += float(row.sum())
          reward_sums[key][1] += row.size
    in_hand = len(groups)
    held: list[Group] = []
    if in_hand < cfg.batch_size and cfg.short_batch == 'wait':
      # No update on a short batch: every group waits for the next step.
      held, groups, surplus = groups, [], []
      self.carried = list(held)
    else:
      groups, surplus = source.choose(groups)
      if cfg.surplus == 'carry':
        self.carried = list(surplus)

    total_generated = int(generated.sum())
    self.cum_prompts_generated += total_generated
    self.cum_groups_used += len(groups)
    metrics = {
        'rollout/prompts_generated': float(total_generated),
        'rollout/tokens_generated': totals['gen_tokens'],
        'rollout/groups_used': float(len(groups)),
        'rollout/groups_easy': totals['easy'],
        'rollout/groups_hard': totals['hard'],
        'rollout/rounds': float(rounds),
        'rollout/round_size': totals['round_size'] / rounds if rounds else 0.0,
        'rollout/efficiency': (
            len(groups) / total_generated if total_generated else 1.0),
        'rollout/cum_prompts_generated': float(self.cum_prompts_generated),
        'rollout/cum_groups_used': float(self.cum_groups_used),
        'rollout/batch_short': float(max(cfg.batch_size - in_hand, 0)),
        'rollout/carried_in': float(carried_in),
        'rollout/held': float(len(held)),
        'train/batch_fill': min(in_hand, cfg.batch_size) / cfg.batch_size,
        'rollout/surplus': float(len(surplus)),
        'verify/errors': totals['verify_errors'],
        'verify/timeouts': totals['verify_timeouts'],
        'perf/verify_s': totals['verify_s'],
        'perf/gen_s': totals['gen_s'],
        'perf/gen_tokens_per_s': (
            totals['gen_tokens'] / totals['gen_s'] if totals['gen_s'] else 0.0
        ),
    }
    totals_by_dataset = [reward_sums[name] for name in source.names
                         if name in reward_sums]
    n_all = sum(c for _, c in totals_by_dataset)
    if n_all:
      metrics['reward/mean'] = sum(s for s, _ in totals_by_dataset) / n_all
      for name, (s, c) in sorted(reward_sums.items()):
        metrics[f'reward/mean/{name}'] = s / c
    used = defaultdict(int)
    for g in groups:
      used[g.example.dataset] += 1
    for d, name in enumerate(source.names):
      metrics[f'rollout/prompts_generated/{name}'] = float(generated[d])
      metrics[f'rollout/groups_used/{name}'] = float(used[name])
      metrics[f'data/batch_share/{name}'] = (
          used[name] / len(groups) if groups else 0.0)
      metrics[f'data/truncated/{name}'] = totals[f'truncated/{name}']
    metrics.update(source.metrics())
    scale = (len(groups) / cfg.batch_size if cfg.short_batch == 'scale'
             else 1.0)
    batch = self._assemble(groups, scale) if groups else None
    return RolloutResult(batch=batch, groups=groups, metrics=metrics)

  def _assemble(self, groups: list[Group], scale: float = 1.0) -> TrainBatch:
    """Stacks groups into a fixed-shape batch of B prompts, B * G completions.

    A short step is padded with empty groups (no valid completion tokens, zero
    advantage), so the jitted train step keeps one shape and the padding adds
    nothing to the loss; `scale` multiplies the advantages (short_batch
    'scale').
    """
    cfg = self.cfg
    G, B = cfg.group_size, cfg.batch_size
    P = groups[0].prompt_tokens.shape[0]
    T = groups[0].completion_tokens.shape[1]
    rewards = np.zeros((B, G), np.float32)
    prompt_tokens = np.full((B, P), self.tokenizer.pad_id, np.int32)
    prompt_mask = np.zeros((B, P), bool)
    comp_tokens = np.full((B, G, T), self.tokenizer.pad_id, np.int32)
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
    return TrainBatch(
        prompt_tokens=prompt_tokens,
        prompt_mask=prompt_mask,
        completion_tokens=comp_tokens.reshape(B * G, T),
        completion_mask=comp_mask.reshape(B * G, T),
        old_logps=old_logps.reshape(B * G, T),
        advantages=adv.reshape(B * G).astype(np.float32),
    )

  def get_state(self) -> dict:
    """Counters and the carried surplus groups, as numpy arrays.

    Carried groups are stacked (padded to one row when there are none:
    checkpoints hold no empty arrays) and their examples JSON-encoded as
    bytes, so a resumed run trains on exactly the groups it would have.
    """
    def stack(field, dtype):
      if not self.carried:
        return np.zeros((1,), dtype)
      return np.stack([getattr(g, field) for g in self.carried]).astype(dtype)

    examples = [dataclasses.asdict(g.example) for g in self.carried]
    return {
        'cum_prompts_generated': self.cum_prompts_generated,
        'cum_groups_used': self.cum_groups_used,
        'carried': {
            'count': len(self.carried),
            'examples': np.frombuffer(json.dumps(examples).encode(), np.uint8),
            'prompt_tokens': stack('prompt_tokens', np.int32),
            'prompt_mask': stack('prompt_mask', bool),
            'completion_tokens': stack('completion_tokens', np.int32),
            'completion_mask': stack('completion_mask', bool),
            'old_logps': stack('old_logps', np.float32),
            'rewards': stack('rewards', np.float32),
        },
    }

  def set_state(self, state: dict) -> None:
    self.cum_prompts_generated = int(state['cum_prompts_generated'])
    self.cum_groups_used = int(state['cum_groups_used'])
    carried = state['carried']
    examples = json.loads(np.asarray(carried['examples'], np.uint8).tobytes())
    self.carried = [
        Group(
            example=Example(**examples[i]),
            prompt_tokens=np.asarray(carried['prompt_tokens'][i]),
            prompt_mask=np.asarray(carried['prompt_mask'][i]),
            completion_tokens=np.asarray(carried['completion_tokens'][i]),
            completion_mask=np.asarray(carried['completion_mask'][i]),
            old_logps=np.asarray(carried['old_logps'][i]),
            rewards=np.asarray(carried['rewards'][i]),
        )
        for i in range(int(carried['count']))
    ]
