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
beyond B follow `rollout.surplus`). Groups still decoding are, by
`rollout.in_flight`:

  * 'discard' (the default): dropped and their tokens counted
    (`rollout/tokens_wasted`). Every update is then on-policy, and
    nothing is in flight between steps. Their examples go unobserved for
    the epoch; and a group is in flight at the end in proportion to how
    long it decodes, so these lean toward prompts with long completions
    (BENCHMARKS.md measures it).
  * 'retry': dropped the same way, but their examples stay pending in the
    prompt source (`hold`) and the next step admits them before it draws
    any prompt, with the sample keys of a fresh draw (the old keys were
    selected for being slow). Updates stay on-policy, and every drawn
    example is scored; `rollout/groups_retried` counts them.
  * 'keep': kept as partial rollouts (`accumulate.Partial`, host numpy:
    the prompt, its samples so far with their sampling log-probs, which
    are done, the sample keys, and the step whose params sampled each
    token). The next step takes them up before it draws any prompt: each
    part-way sample's cache is rebuilt under the new params by one
    prefill of its prompt and tokens so far (`slots.resume`), and it
    decodes on from where it stopped, token t drawn with the key of
    position t; samples that never reached a slot start afresh. The
    re-prefill costs a forward over P + W positions per sample, W the
    smallest of `slots.RESUME_WIDTHS` widths up to T - 1 that holds the
    call's longest sample (one compilation per width), in calls of
    `prefill_batch` samples, and no decode step. The old
    cache is not kept: the old params computed it, and it would hold
    device memory between steps and have to be checkpointed. A
    completed group is scored like
    any other, and the learner's importance ratio is against the stored
    log-probs, those of the params that sampled each token. A group
    whose oldest token would be more than `rollout.max_staleness` steps
    old at the next step is discarded instead (`rollout/partial_expired`,
    its tokens wasted). Kept groups' examples stay pending in the prompt
    source (`hold`): not drawn again, observed once, when scored. They
    are part of the checkpoint (`Accumulator.get_state`), so resume
    stays exact.

Token accounting, per step: tokens_generated + tokens_resumed =
tokens_scored + tokens_in_flight + tokens_wasted (`docs/metrics.md`; the
resumed and in-flight terms are 0 under 'discard').

Verifiers overlap decoding: a finished group's scoring is handed to a
thread (which drives the `Scorer`'s worker processes) while the device
decodes the next chunks. The rewards are applied at a fixed chunk, waiting
for them if need be, so what is drawn, kept and trained on depends only on
the seed and the data, never on how fast a verifier answers. With
`verify_overlap=0` each chunk's groups are scored before decoding goes on.
Under several processes each verifies the groups it owns (by completion
order) and the rewards are summed at the apply point.

Size: a sixth of it is this description of the modes; the rest is one
step's state machine (`_Step`) and the stream that drives it.
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
from jaxgrpo import scoring
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.example import Example
from jaxgrpo.generate import continuous
from jaxgrpo.generate import keys as keys_lib
from jaxgrpo.generate import stream as stream_lib
from jaxgrpo.rl import accumulate
from jaxgrpo.rl import rounds as rounds_lib
from jaxgrpo.typing import PyTree
from jaxgrpo.verifiers import pool as verifier_pool
from jaxgrpo.verifiers.base import ScoreStats

# A benchmark hook: prompt tokens [N, P] -> forced lengths [N, G].
StopAt = Callable[[np.ndarray], np.ndarray]


# rollout.in_flight: what a streaming step does with unfinished groups.
IN_FLIGHT = ('discard', 'retry', 'keep')


@dataclasses.dataclass
class _Open:
  """A drawn prompt whose group is being decoded."""

  example: Example
  tokens: np.ndarray  # [P]
  mask: np.ndarray  # [P]
  truncated: bool
  samples: dict[int, stream_lib.Sample]
  keys: np.ndarray  # [G, 2] sample key data
  stop_at: np.ndarray  # [G]
  kept: accumulate.Partial | None = None  # taken up from the last step


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
    in_flight: 'discard', 'retry' or 'keep' the groups still decoding at
      the end.
    max_staleness: 'keep': steps a kept group's oldest token may lag.
  """

  tokenizer: tokenizer_lib.Tokenizer
  engine: continuous.ContinuousGenerator
  scorer: verifier_pool.Scorer
  max_prompt_len: int
  truncate: bool = False
  verify_overlap: int = 0
  stop_at: StopAt | None = None
  in_flight: str = 'discard'
  max_staleness: int = 1

  def __call__(self, params: PyTree, rng: jax.Array, source: Any,
               acc: accumulate.Accumulator, *, budget: int,
               classify: Callable[[np.ndarray], tuple],
               step: int = 0) -> None:
    """Collects one step's groups into `acc` (see the module docstring).

    Args:
      params: the policy's params.
      rng: the step's key.
      source: the prompt source (`rollout.PromptSource`).
      acc: the accumulator, started; its `in_flight` groups are taken up.
      budget: prompts the step may draw at most.
      classify: rewards [n, G] -> `rounds.classify` masks.
      step: the train step, the version of `params`.
    """
    # Scored on this thread where only it can time a call out
    # (verify.workers=0 with verify.timeout_s): no overlap then.
    overlap = (self.verify_overlap
               and not self.scorer.limited_on_main_thread_only)
    with futures.ThreadPoolExecutor(
        1, thread_name_prefix='jaxgrpo-verify') as pool:
      _Step(self, params, rng, source, acc, classify,
            pool if overlap else None, step).run(budget)


class _Step:
  """One streaming step's state: the stream, open groups, pending scores."""

  def __init__(self, fn: ModelStream, params, rng, source, acc, classify,
               pool, step):
    self.fn, self.rng, self.source, self.acc = fn, rng, source, acc
    self.classify, self.pool, self.step = classify, pool, step
    self.keep = fn.in_flight == 'keep'
    self.stream = stream_lib.SlotStream(fn.engine, params, fn.max_prompt_len)
    self.open: dict[int, _Open] = {}
    self.scoring: collections.deque[_Scoring] = collections.deque()
    self.done_groups = 0  # groups completed, in order (ownership)
    self.drawn = 0
    self.out_of_prompts = False

  def run(self, budget: int) -> None:
    stats = self.acc.stats
    self.take_up()
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
    if self.keep:
      self.keep_unfinished()
    else:
      wasted = sum(s.length for g in self.open.values()
                   for s in g.samples.values())
      wasted += sum(self.stream.in_flight().values())
      stats.tokens_wasted += float(wasted)
      stats.tokens_generated += float(wasted)
      stats.groups_discarded += len(self.open)
      if self.fn.in_flight == 'retry':
        self.source.hold([o.example for o in self.open.values()])
        stats.groups_retried = len(self.open)
    stats.slot_steps += self.stream.decode_steps * self.stream.slots
    stats.busy_slot_steps += self.stream.busy_slot_steps

  def take_up(self) -> None:
    """Queues the groups the last step kept in flight, or the examples it
    left to retry, before any draw."""
    stats = self.acc.stats
    if self.fn.in_flight == 'retry':
      self.admit(self.source.held())
    held = collections.Counter((ex.dataset, ex.id)
                               for ex in self.source.held())
    for kept in self.acc.in_flight:
      key = (kept.example.dataset, kept.example.id)
      if not held[key]:
        # Gone from the data on a resume (checkpoint.on_dataset_change=
        # 'remap'): the source holds it no longer and cannot observe it.
        stats.groups_discarded += 1
        continue
      held[key] -= 1
      samples = [stream_lib.Sample(
          prompt=-1, index=g, tokens=kept.completion_tokens[g],
          logps=kept.old_logps[g], length=int(n))
                 for g, n in enumerate(kept.lengths)]
      pid = self.stream.add_group(
          kept.prompt_tokens, kept.prompt_mask, kept.keys, kept.stop_at,
          {s.index: s for s in samples if not kept.done[s.index]})
      done = {s.index: dataclasses.replace(s, prompt=pid)
              for s in samples if kept.done[s.index]}
      self.open[pid] = _Open(
          example=kept.example, tokens=kept.prompt_tokens,
          mask=kept.prompt_mask, truncated=bool(kept.truncated),
          samples=done, keys=kept.keys, stop_at=kept.stop_at, kept=kept)
      stats.partial_resumed += 1
      stats.tokens_resumed += float(kept.tokens)
    self.acc.in_flight = []

  def keep_unfinished(self) -> None:
    """Keeps the groups still open for the next step, or expires them."""
    stats, g = self.acc.stats, self.fn.engine.num_samples
    left = collections.defaultdict(dict)  # id -> index -> Sample so far
    for sample in self.stream.unfinished():
      left[sample.prompt][sample.index] = sample
    kept, wasted = [], 0
    for pid, o in self.open.items():
      samples = [{**o.samples, **left[pid]}[k] for k in range(g)]
      part = accumulate.Partial(
          example=o.example, prompt_tokens=o.tokens, prompt_mask=o.mask,
          truncated=o.truncated, keys=o.keys, stop_at=o.stop_at,
          completion_tokens=np.stack([s.tokens for s in samples]),
          old_logps=np.stack([s.logps for s in samples]),
          lengths=np.array([s.length for s in samples], np.int32),
          done=np.array([k in o.samples for k in range(g)]),
          versions=np.stack([_versions(o, s, self.step) for s in samples]))
      oldest = part.oldest()
      if oldest is not None and self.step + 1 - oldest > self.fn.max_staleness:
        stats.partial_expired += 1
        wasted += part.tokens
      else:
        kept.append(part)
    self.acc.in_flight = kept
    self.source.hold([part.example for part in kept])
    stats.partial_kept = len(kept)
    stats.groups_discarded += stats.partial_expired
    stats.tokens_wasted += float(wasted)
    stats.tokens_in_flight = float(sum(part.tokens for part in kept))
    stats.tokens_generated += (wasted + stats.tokens_in_flight
                               - stats.tokens_resumed)

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
    self.admit(examples, want)

  def admit(self, examples: Sequence[Example], asked: int = 0) -> None:
    """Queues drawn examples' groups, with the sample keys of this draw."""
    if not examples:
      return
    stats = self.acc.stats
    key = jax.random.fold_in(self.rng, stats.rounds)
    stats.rounds += 1
    stats.prompts_asked += float(asked or len(examples))
    self.drawn += len(examples)
    fn = self.fn
    tokens, mask, truncated = tokenizer_lib.encode_prompts(
        fn.tokenizer, [ex.prompt for ex in examples], fn.max_prompt_len,
        truncate=fn.truncate, names=[ex.id for ex in examples])
    ids = [ex.id for ex in examples]
    keys_NG2 = stream_lib.sample_key_data(
        keys_lib.prompt_keys(key, ids, keys_lib.repeats(ids)),
        fn.engine.num_samples)
    stop_NG = (np.zeros(keys_NG2.shape[:2], np.int32) if fn.stop_at is None
               else np.asarray(fn.stop_at(tokens), np.int32))
    for ex, t, m, cut, keys_G2, stop_G in zip(examples, tokens, mask,
                                              truncated, keys_NG2, stop_NG):
      pid = self.stream.add_group(
          t, m, keys_G2, stop_G, dict.fromkeys(range(fn.engine.num_samples)))
      self.open[pid] = _Open(example=ex, tokens=t, mask=m,
                             truncated=bool(cut), samples={}, keys=keys_G2,
                             stop_at=stop_G)

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
    for grp, o in zip(groups, complete):
      self.acc.stats.tokens_scored += float(grp.tokens)
      if self.keep:
        grp.versions = np.stack([_versions(o, o.samples[k], self.step)
                                 for k in range(g)])
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
      part_stats = ScoreStats()
      if result is not None:
        part, part_stats = result
        rewards[item.owned] = part.reshape(-1, g)
      if jax.process_count() > 1:
        rewards = multihost.sum_over_processes(rewards)
      part_stats = scoring.summed(part_stats)
      for grp, row in zip(item.groups, rewards):
        grp.rewards = row
      self.source.observe([grp.example for grp in item.groups], rewards)
      self.acc.add_groups(rounds_lib.Round(
          groups=item.groups, rewards=rewards, gen_s=0.0,
          gen_tokens=float(sum(grp.completion_mask.sum()
                               for grp in item.groups)),
          truncated=item.truncated, **rounds_lib.verify_counts(part_stats)),
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


def _versions(o: _Open, sample: stream_lib.Sample, step: int) -> np.ndarray:
  """[T] the step that sampled each of `sample`'s tokens (-1: none): the
  kept group's own for the tokens it carried in, `step` for the rest."""
  column = np.arange(sample.tokens.shape[0])
  versions = np.full(column.shape, step, np.int32)
  if o.kept is not None:
    before = o.kept.lengths[sample.index]
    versions = np.where(column < before, o.kept.versions[sample.index],
                        versions)
  return np.where(column < sample.length, versions, -1).astype(np.int32)
