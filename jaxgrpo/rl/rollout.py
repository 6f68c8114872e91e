"""Rollouts with DAPO dynamic sampling: prompts -> G samples -> rewards -> batch.

A step collects B informative groups. Each round draws R prompts from the
prompt source and hands them to the round function, which returns G scored
completions of each (`rounds`: the policy's in training, a stand-in's in
the simulator); the degenerate groups (all rewards equal, or every reward
past the easy or hard threshold) are dropped: they have zero advantage and
teach nothing. Rounds repeat until B groups are in hand or `max_rounds` is
reached. A step left short by default takes no update and holds its groups
for the next step (`short_batch`), so every update sees B groups; the
metrics say so. Surplus groups from the last round are dropped or carried
to the next step. The groups in hand and carried, and what a step did, are
kept by an `accumulate.Accumulator`. With `collect='streaming'` the
rounds give way to one stream through the continuous engine's slots
(`rl.streaming`), ending at the same condition. `batch.assemble` stacks
the groups into the train batch.
"""

from collections.abc import Sequence
import dataclasses
import math
from typing import Protocol

import jax
import numpy as np

from jaxgrpo import checks
from jaxgrpo.checks import NON_NEGATIVE, POSITIVE, TEMPERATURE, field
from jaxgrpo.checks import in_range, one_of, rule
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.example import Example
from jaxgrpo.generate import continuous
from jaxgrpo.generate.generator import Generator
from jaxgrpo.rl import accumulate
from jaxgrpo.rl import batch as batch_lib
from jaxgrpo.rl import rounds as rounds_lib
from jaxgrpo.rl import streaming
from jaxgrpo.typing import PyTree, TrainBatch
from jaxgrpo.verifiers import pool as verifier_pool

SURPLUS = ('drop', 'carry')
# How a step collects its groups: rounds, or streamed through the slots.
COLLECT = ('rounds', 'streaming')
LONG_PROMPTS = ('error', 'truncate', 'drop')
# What a step does when collection ends with fewer than B informative groups.
SHORT_BATCH = ('wait', 'scale', 'train')

class RolloutSection(checks.Section, name='rollout'):
  """The config's `rollout`: how a step's batch is collected and its
  completions sampled."""

  batch_size: int = field(16, 'B: informative groups per step', POSITIVE)
  group_size: int = field(8, 'G: completions per prompt', rule(
      lambda g: g >= 2,
      'must be >= 2 (advantages compare completions in a group)'))
  round_size: int | str = field(
      16, 'R: prompts per generator call, or `adaptive` (sized from the '
      'pass-rate estimates to fill the batch in about one round, in powers of '
      'two up to `max_round_size`)', rule(
          lambda r: r == 'adaptive' or (isinstance(r, int) and r > 0),
          "must be a positive int or 'adaptive'"))
  max_round_size: int = field(256, 'cap of adaptive round sizes', POSITIVE)
  max_rounds: int = field(
      8, 'generator calls per step at most; then `short_batch` decides',
      POSITIVE)
  surplus: str = field(
      'carry', 'informative groups beyond B: `carry` to the next step or '
      '`drop` (DAPO)', one_of(SURPLUS))
  short_batch: str = field(
      'wait', "fewer than B informative groups when a step's rounds end: "
      '`wait` (no update; the groups wait for the next step, so every update '
      'has B), `scale` (update with advantages x n/B) or `train` (a full-size '
      'update anyway)', one_of(SHORT_BATCH))
  max_prompt_len: int = field(12, 'P: padded prompt length in tokens', POSITIVE)
  long_prompts: str = field(
      'error', 'a longer prompt: `error` (names the example), `truncate` (cut '
      "from the start, BOS kept; in a chat template, the user text's) or "
      '`drop` (left out when its dataset is loaded), both counted; see [Bad '
      'input](troubleshooting.md#bad-input)', one_of(LONG_PROMPTS))
  max_new_tokens: int = field(
      6, 'T: generated tokens at most', rule(lambda t: t >= 1, 'must be >= 1'))
  temperature: float = field(
      1.0, 'sampling temperature (0, greedy, trains nothing)', TEMPERATURE)
  top_k: int = field(0, 'top-k sampling (0: off; 1 is greedy)', NON_NEGATIVE)
  top_p: float = field(
      1.0, 'top-p sampling (1.0: off)', in_range(0.0, 1.0, '(]'))
  engine: str = field(
      'static', 'decoding a round: `static` (one batch until its longest row '
      'ends) or `continuous` (`slots` rows, each taking the next sample as '
      'its row stops, fewer as the round drains; keys per sample)', one_of(
          continuous.ENGINES))
  slots: int = field(64, 'decode slots of the `continuous` engine (as many '
                     'on every mesh)', POSITIVE)
  collect: str = field(
      'rounds', '`rounds` (generator calls of R prompts) or `streaming` (the '
      '`continuous` engine draws prompts as slots free up and stops at B '
      'informative groups; see [the sampler](sampler.md#streaming))',
      one_of(COLLECT))
  verify_overlap: int = field(
      2, '`streaming`: decode chunks a verification overlaps (0: none)',
      NON_NEGATIVE)
  in_flight: str = field(
      'discard', "`streaming`: groups still decoding when a step's batch is "
      'full are `discard`ed (tokens wasted, examples unscored this epoch), '
      'discarded and their prompts drawn first at the next step (`retry`), '
      'or kept (`keep`) as partial rollouts the next step decodes on from '
      'where they stopped, under its params (see [the '
      'sampler](sampler.md#streaming))', one_of(streaming.IN_FLIGHT))
  max_staleness: int = field(
      1, '`keep`: steps a kept rollout may lag; one whose oldest token would '
      'be older at the next step is discarded', NON_NEGATIVE)
  train_lengths: int = field(
      4, "N: the train batch's completion axis is cut to the shortest of N "
      'lengths up to T (steps >= 64) that fits its longest completion; at '
      'most N train-step compiles (1: always T)', POSITIVE)
  easy_threshold: float = field(
      1.0, 'a group is too easy when every reward is >= this')
  hard_threshold: float = field(
      0.0, 'a group is too hard when every reward is <= this')

  def _validate(self):
    yield 'easy_threshold', (
        0.0 <= self.hard_threshold < self.easy_threshold <= 1.0), (
            'needs 0 <= rollout.hard_threshold < easy_threshold <= 1')
    yield 'collect', self.collect == 'rounds' or self.engine == 'continuous', (
        "'streaming' needs rollout.engine='continuous'")
    yield 'in_flight', (self.in_flight == 'discard'
                        or self.collect == 'streaming'), (
                            "needs rollout.collect='streaming'")


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

  def hold(self, examples: Sequence[Example]) -> None:
    ...

  def held(self) -> list[Example]:
    ...

  def need(self, counts: np.ndarray) -> np.ndarray:
    ...

  def batch_full(self, counts: np.ndarray) -> bool:
    ...

  def end_step(self, counts: np.ndarray) -> None:
    ...

  def choose(self, groups: Sequence[rounds_lib.Group]) -> tuple[list, list]:
    ...

  def informative_rate(self) -> float:
    ...

  def metrics(self) -> dict[str, float]:
    ...


class RolloutConfig(RolloutSection):
  """What `Rollout` reads: the rollout section, the advantage estimator
  (`rl.advantage`, one of `advantages.estimator_names()`) and what the loss
  does with cut completions (`rl.cut_completions`, one of
  `batch.CUT_COMPLETIONS`).

  Rollouts sample (temperature > 0, top_k != 1): greedy completions of a
  prompt are all the same, and such a group teaches nothing. A short step
  under `short_batch='wait'` takes no update, so the policy does not
  change while its groups wait and they stay on-policy; `scale`
  weighs each group as it weighs in a full batch (under Adam this shrinks
  the step less than n / B). A prompt dropped as too long when its dataset
  was loaded that still reaches a round is an error.
  """

  advantage: str = 'grpo'
  cut_completions: str = 'train'

  def _validate(self):
    yield from super()._validate()
    same = ('the G completions of a prompt are then the same, so no group is '
            'informative and no update is ever taken')
    yield 'temperature', self.temperature > 0, f'greedy: {same}'
    yield 'top_k', self.top_k != 1, f'only the top token is drawn: {same}'

  @classmethod
  def from_section(cls, rollout: RolloutSection, advantage: str,
                   cut_completions: str = 'train') -> 'RolloutConfig':
    """From the config's rollout section, rl.advantage and
    rl.cut_completions."""
    return cls(advantage=advantage, cut_completions=cut_completions,
               **checks.values(rollout))


@dataclasses.dataclass
class RolloutResult:
  """A step's batch (None when it takes no update), groups and metrics."""

  batch: TrainBatch | None
  groups: list[rounds_lib.Group]
  metrics: dict[str, float]
  stats: accumulate.StepStats


class Rollout:
  """Collects a step's batch with dynamic sampling.

  Attributes:
    cfg: how the batch is collected.
    source: where prompts come from and outcomes go.
    round_fn: scores a round's prompts (`rounds.ModelRound` in training).
    stream_fn: collects a streaming step (`streaming.ModelStream`), used
      when `cfg.collect` is 'streaming'.
    pad_id: pads the train batch; None assembles no batch (the
      simulator's groups carry no tokens).
    stop_ids: the ids that end a completion: one that fills T with none
      last was cut (`batch.cut_rows`).
    accumulator: the groups in hand and carried, and the running totals.
  """

  def __init__(self, cfg: RolloutConfig, source: PromptSource,
               round_fn: rounds_lib.RoundFn, *, pad_id: int | None,
               stream_fn: streaming.ModelStream | None = None,
               stop_ids: Sequence[int] = ()):
    if cfg.collect == 'streaming' and stream_fn is None:
      raise ValueError("rollout.collect='streaming' needs the continuous "
                       'engine (rollout.engine=continuous)')
    self.cfg = cfg
    self.source = source
    self.round_fn = round_fn
    self.stream_fn = stream_fn
    self.pad_id = pad_id
    self.stop_ids = tuple(stop_ids)
    self.accumulator = accumulate.Accumulator(
        source.names, batch_size=cfg.batch_size,
        short_batch=cfg.short_batch, surplus=cfg.surplus,
        in_flight=cfg.in_flight)

  @classmethod
  def for_model(
      cls,
      cfg: RolloutConfig,
      source: PromptSource,
      tokenizer: tokenizer_lib.Tokenizer,
      generator: Generator,
      scorer: verifier_pool.Scorer,
      stop_at: streaming.StopAt | None = None,
  ) -> 'Rollout':
    """Rounds (or a stream) of the policy's completions, scored; batches.

    `stop_at` forces streamed completion lengths (benchmarks only).
    """
    if generator.num_samples != cfg.group_size:
      raise ValueError(
          f'generator makes {generator.num_samples} samples per prompt, '
          f'rollout.group_size is {cfg.group_size}'
      )
    round_fn = rounds_lib.ModelRound(
        tokenizer=tokenizer, generator=generator, scorer=scorer,
        max_prompt_len=cfg.max_prompt_len,
        truncate=cfg.long_prompts == 'truncate')
    stream_fn = None
    if isinstance(generator, continuous.ContinuousGenerator):
      stream_fn = streaming.ModelStream(
          tokenizer=tokenizer, engine=generator, scorer=scorer,
          max_prompt_len=cfg.max_prompt_len,
          truncate=cfg.long_prompts == 'truncate',
          verify_overlap=cfg.verify_overlap, stop_at=stop_at,
          in_flight=cfg.in_flight, max_staleness=cfg.max_staleness)
    return cls(cfg, source, round_fn, pad_id=tokenizer.pad_id,
               stream_fn=stream_fn, stop_ids=getattr(
                   tokenizer, 'stop_ids', (tokenizer.eos_id,)))

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

  def collect(
      self, params: PyTree, rng: jax.Array, step: int = 0
  ) -> RolloutResult:
    """Collects until the batch can be filled (or the budget is spent)."""
    cfg, source, acc = self.cfg, self.source, self.accumulator
    source.start_step(step)
    acc.start(step)
    if cfg.collect == 'streaming':
      per_round = (cfg.max_round_size if cfg.round_size == 'adaptive'
                   else cfg.round_size)
      self.stream_fn(params, rng, source, acc,
                     budget=cfg.max_rounds * per_round,
                     classify=self._classify, step=step)
    else:
      self._rounds(params, rng)
    source.end_step(acc.counts)
    groups, stats = acc.finish(source.choose)
    return self._finish(groups, stats)

  def _classify(self, rewards: np.ndarray) -> tuple:
    return rounds_lib.classify(rewards, self.cfg.easy_threshold,
                               self.cfg.hard_threshold)

  def _rounds(self, params: PyTree, rng: jax.Array) -> None:
    """Runs rounds until the batch can be filled (or max_rounds)."""
    cfg, source, acc = self.cfg, self.source, self.accumulator
    while (not source.batch_full(acc.counts)
           and acc.stats.rounds < cfg.max_rounds):
      key = jax.random.fold_in(rng, acc.stats.rounds)
      size = self.round_size(acc.counts)
      examples = source.next_prompts(size, source.need(acc.counts))
      if not examples:
        break  # no dataset has anything left to offer this epoch
      rnd = self.round_fn(params, key, examples, size)
      source.observe(examples, rnd.rewards)
      acc.add(rnd, size, self._classify(rnd.rewards))

  def _finish(self, groups: list, stats: accumulate.StepStats
              ) -> RolloutResult:
    cfg = self.cfg
    metrics = stats.to_metrics()
    metrics.update(self.source.metrics())
    batch = None
    if groups and self.pad_id is not None and cfg.cut_completions == 'mask':
      metrics['train/completions_masked'] = batch_lib.masked_share(
          groups, self.stop_ids)
    # Every completion masked: the step skips its update (nothing to learn).
    if (groups and self.pad_id is not None
        and metrics.get('train/completions_masked', 0.0) < 1.0):
      scale = (len(groups) / cfg.batch_size if cfg.short_batch == 'scale'
               else 1.0)
      batch = batch_lib.assemble(groups, cfg, self.pad_id, scale,
                                 self.stop_ids)
    return RolloutResult(batch=batch, groups=groups, metrics=metrics,
                         stats=stats)

  def get_state(self) -> dict:
    """The counters, carried groups and groups in flight
    (`Accumulator.get_state`)."""
    return self.accumulator.get_state()

  def set_state(self, state: dict) -> None:
    self.accumulator.set_state(state)
