"""Streaming dynamic sampling: prompts drawn as slots free, groups scored.

`rollout.collect='streaming'` replaces a step's rounds by one decoding
session (`generate.stream.SlotStream`) over the continuous engine's slots:

  * after every decode chunk, the prompt source is asked for enough
    prompts to fill the slots that are free (G samples each; the last one
    may wait a little for a slot);
  * a group is sent to the verifiers as soon as its G samples are done;
  * its rewards are applied `verify_overlap` chunks later: the prompt
    source observes it (the update a round's groups get, group by group),
    the accumulator takes it if it is informative, and the next prompts
    are drawn knowing it;
  * the step's collection ends when the source says the batch can be
    filled (B informative groups; per dataset under `post_filter`), or
    when its prompt budget (`max_rounds` rounds' worth) is spent and
    nothing is left decoding.

At the end, groups already done are scored and kept (informative ones
beyond B follow `rollout.surplus`); groups still decoding are discarded
and their tokens counted (`rollout/tokens_wasted`). Discarding, rather than
carrying partial rollouts into the next step, keeps every update on-policy
and leaves nothing in flight between steps, so a checkpoint needs no
decode state and resume stays exact. Partial rollouts are not implemented.

Verifiers overlap decoding: a finished group's scoring is handed to a
thread (which drives the `Scorer`'s worker processes) while the device
decodes the next chunks. The rewards are applied at a fixed chunk, waiting
for them if need be, so what is drawn, kept and trained on depends only on
the seed and the data, never on how fast a verifier answers. With
`verify_overlap=0` each chunk's groups are scored before decoding goes on.
Under several processes each verifies the groups it owns (by completion
order) and the rewards are summed at the apply point.
"""

import collections
from collections.abc import Callable, Sequence
from concurrent import futures
import dataclasses
import time
from typing import Any

import jax
import numpy as np

from jaxgrpo import multihost
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.example import Example
from jaxgrpo.generate import continuous
from jaxgrpo.generate import keys as keys_lib
from jaxgrpo.generate import stream as stream_lib
from jaxgrpo.rl import accumulate
from jaxgrpo.rl import rounds as rounds_lib
from jaxgrpo.typing import PyTree
from jaxgrpo.verifiers import pool as verifier_pool

# A benchmark hook: prompt tokens [N, P] -> forced lengths [N, G].
StopAt = Callable[[np.ndarray], np.ndarray]


@dataclasses.dataclass
class _Open:
  """A drawn prompt whose group is being decoded."""

  example: Example
  tokens: np.ndarray  # [P]
  mask: np.ndarray  # [P]
  truncated: bool
  samples: dict[int, stream_lib.Sample]


@dataclasses.dataclass
class _Scoring:
  """Groups sent to the verifiers, applied at chunk `due`."""

  due: int
  groups: list[rounds_lib.Group]
  owned: np.ndarray  # [n] bool, verified by this process
  truncated: np.ndarray  # [n] bool, prompts cut to fit
  result: Any  # a Future, or (rewards, stats)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelStream:
  """The policy's completions, streamed through the slots and scored.

  Attributes:
    tokenizer: encodes the prompts, decodes the completions.
    engine: the continuous engine (slots, chunk, buckets, generator).
    scorer: the verifiers.
    max_prompt_len: P, the padded prompt length.
    truncate: cut longer prompts (`rollout.long_prompts='truncate'`).
    verify_overlap: decode chunks between a group's completion and the
      application of its rewards (0: scored before decoding goes on).
    stop_at: forced completion lengths, a benchmarking aid; None samples
      freely.
  """

  tokenizer: tokenizer_lib.Tokenizer
  engine: continuous.ContinuousGenerator
  scorer: verifier_pool.Scorer
  max_prompt_len: int
  truncate: bool = False
  verify_overlap: int = 0
  stop_at: StopAt | None = None

  def __call__(self, params: PyTree, rng: jax.Array, source: Any,
               acc: accumulate.Accumulator, *, budget: int,
               classify: Callable[[np.ndarray], tuple]) -> None:
    """Collects one step's groups into `acc` (see the module docstring).

    Args:
      params: the policy's params.
      rng: the step's key.
      source: the prompt source (`rollout.PromptSource`).
      acc: the accumulator, started.
      budget: prompts the step may draw at most.
      classify: rewards [n, G] -> `rounds.classify` masks.
    """
    with futures.ThreadPoolExecutor(
        1, thread_name_prefix='jaxgrpo-verify') as pool:
      _Step(self, params, rng, source, acc, classify,
            pool if self.verify_overlap else None).run(budget)


class _Step:
  """One streaming step's state: the stream, open groups, pending scores."""

  def __init__(self, fn: ModelStream, params, rng, source, acc, classify,
               pool):
    self.fn, self.rng, self.source, self.acc = fn, rng, source, acc
    self.classify, self.pool = classify, pool
    self.stream = stream_lib.SlotStream(fn.engine, params, fn.max_prompt_len)
    self.open: dict[int, _Open] = {}
    self.scoring: collections.deque[_Scoring] = collections.deque()
    self.done_groups = 0  # groups completed, in order (ownership)
    self.drawn = 0
    self.out_of_prompts = False

  def run(self, budget: int) -> None:
    stats = self.acc.stats
    while True:
      self.apply(self.stream.chunks)
      if self.source.batch_full(self.acc.counts):
        break
      self.draw(budget)
      if self.stream.idle:
        if not self.scoring:
          break  # nothing decoding, nothing to draw
        self.apply(None)
        continue
      t0 = time.perf_counter()
      finished = self.stream.step()
      stats.gen_s += time.perf_counter() - t0
      self.finish_groups(finished)
    self.apply(None)
    wasted = sum(s.length for g in self.open.values()
                 for s in g.samples.values())
    wasted += sum(self.stream.in_flight().values())
    stats.tokens_wasted += float(wasted)
    stats.tokens_generated += float(wasted)
    stats.groups_discarded += len(self.open)
    stats.slot_steps += self.stream.decode_steps * self.stream.slots
    stats.busy_slot_steps += self.stream.busy_slot_steps

  def draw(self, budget: int) -> None:
    """Asks the source for prompts to fill the free slots."""
    g = self.fn.engine.num_samples
    want = min(-(-self.stream.free_slots // g), budget - self.drawn)
    if want <= 0 or self.out_of_prompts:
      return
    examples = self.source.next_prompts(
        want, self.source.need(self.acc.counts))
    if not examples:
      self.out_of_prompts = True  # no dataset has anything left this epoch
      return
    stats = self.acc.stats
    key = jax.random.fold_in(self.rng, stats.rounds)
    stats.rounds += 1
    stats.prompts_asked += float(want)
    self.drawn += len(examples)
    fn = self.fn
    tokens, mask, truncated = tokenizer_lib.encode_prompts(
        fn.tokenizer, [ex.prompt for ex in examples], fn.max_prompt_len,
        truncate=fn.truncate, names=[ex.id for ex in examples])
    ids = self.stream.add(
        tokens, mask, keys_lib.prompt_keys(key, [ex.id for ex in examples], 0),
        None if fn.stop_at is None else fn.stop_at(tokens))
    for pid, ex, t, m, cut in zip(ids, examples, tokens, mask, truncated):
      self.open[pid] = _Open(example=ex, tokens=t, mask=m,
                             truncated=bool(cut), samples={})

  def finish_groups(self, finished: Sequence[stream_lib.Sample]) -> None:
    """Sends the groups whose G samples are all done to the verifiers."""
    g = self.fn.engine.num_samples
    complete = []
    for sample in finished:
      group = self.open[sample.prompt]
      group.samples[sample.index] = sample
      if len(group.samples) == g:
        complete.append(self.open.pop(sample.prompt))
    if not complete:
      return
    groups = [_group(o, g) for o in complete]
    owned = ((self.done_groups + np.arange(len(groups)))
             % jax.process_count() == jax.process_index())
    self.done_groups += len(groups)
    texts, examples = [], []
    for grp in (grp for grp, mine in zip(groups, owned) if mine):
      texts += [self.fn.tokenizer.decode(row)
                for row in grp.completion_tokens]
      examples += [grp.example] * g
    result = None
    if texts and self.pool is None:
      t0 = time.perf_counter()
      result = self.fn.scorer.score(texts, examples)
      self.acc.stats.verify_s += time.perf_counter() - t0
    elif texts:
      result = self.pool.submit(self.fn.scorer.score, texts, examples)
    self.scoring.append(_Scoring(
        due=self.stream.chunks + self.fn.verify_overlap, groups=groups,
        owned=owned, truncated=np.array([o.truncated for o in complete]),
        result=result))

  def apply(self, chunk: int | None) -> None:
    """Applies the scores due by `chunk` (None: all), in completion order."""
    stats = self.acc.stats
    while self.scoring and (chunk is None or self.scoring[0].due <= chunk):
      item = self.scoring.popleft()
      t0 = time.perf_counter()
      result = item.result
      if isinstance(result, futures.Future):
        result = result.result()
      stats.verify_s += time.perf_counter() - t0
      g = self.fn.engine.num_samples
      rewards = np.zeros((len(item.groups), g), np.float32)
      counts = np.zeros(2, np.int64)  # verifier failures, timeouts
      if result is not None:
        part, part_stats = result
        rewards[item.owned] = part.reshape(-1, g)
        counts[:] = (part_stats.errors + part_stats.out_of_range,
                     part_stats.timeouts)
      if jax.process_count() > 1:
        rewards = multihost.sum_over_processes(rewards)
        counts = multihost.sum_over_processes(counts)
      for grp, row in zip(item.groups, rewards):
        grp.rewards = row
      self.source.observe([grp.example for grp in item.groups], rewards)
      self.acc.add_groups(rounds_lib.Round(
          groups=item.groups, rewards=rewards, gen_s=0.0,
          gen_tokens=float(sum(grp.completion_mask.sum()
                               for grp in item.groups)),
          verify_errors=float(counts[0]), verify_timeouts=float(counts[1]),
          truncated=item.truncated),
          self.classify(rewards))


def _group(o: _Open, g: int) -> rounds_lib.Group:
  """A finished prompt's group, rewards not yet known."""
  samples = [o.samples[k] for k in range(g)]
  t = samples[0].tokens.shape[0]
  lengths = np.array([s.length for s in samples])
  return rounds_lib.Group(
      example=o.example, prompt_tokens=o.tokens, prompt_mask=o.mask,
      completion_tokens=np.stack([s.tokens for s in samples]),
      completion_mask=np.arange(t)[None] < lengths[:, None],
      old_logps=np.stack([s.logps for s in samples]),
      rewards=np.zeros(g, np.float32))
