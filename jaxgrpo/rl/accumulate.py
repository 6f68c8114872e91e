"""Dynamic sampling's bookkeeping: informative groups in hand until B.

An `Accumulator` lives for the run. Each step `start`s with the groups
carried from the last one, `add`s each round's informative groups (counted
per dataset, so the prompt source knows what it still owes) and `finish`es
by deciding what trains: B chosen groups, the surplus carried or dropped
(`rollout.surplus`), or, for a short step under `rollout.short_batch`
'wait', nothing, every group held for the next step. What the step did is
a `StepStats`, whose `to_metrics` is the one place the `rollout/*` metric
names are written. Under `rollout.in_flight='keep'` it also holds the
groups a streaming step left decoding (`Partial`), for the next step to
take up. The carried groups, the groups in flight and the running totals
are the rollout's part of a checkpoint (`get_state`).

Size: the accumulator and the stats it returns (`StepStats`) change
together: every count the bookkeeping keeps is a metric written here.
"""

from collections.abc import Callable, Sequence
import dataclasses
import json
from typing import Any

import numpy as np

from jaxgrpo.example import Example
from jaxgrpo.rl import rounds as rounds_lib

# A prompt source's `choose`: groups in hand -> (batch, surplus).
Choose = Callable[[Sequence[Any]], tuple[list, list]]


@dataclasses.dataclass(kw_only=True)
class Partial:
  """A group still decoding when its streaming step ended, kept in flight.

  Attributes:
    example: its prompt's example (drawn, not yet observed).
    prompt_tokens: [P] int32, left-padded prompt.
    prompt_mask: [P] bool.
    truncated: whether the prompt was cut to fit.
    keys: [G, 2] uint32, key data of its G sample keys.
    stop_at: [G] int32, forced lengths (0: none; benchmarks only).
    completion_tokens: [G, T] int32, the samples so far, pad-filled.
    old_logps: [G, T] float32, their sampling log-probs.
    lengths: [G] int32, tokens so far (0: never reached a slot).
    done: [G] bool, samples that ended.
    versions: [G, T] int32, the step whose params sampled each token (-1:
      none yet).
  """

  example: Example
  prompt_tokens: np.ndarray
  prompt_mask: np.ndarray
  truncated: bool
  keys: np.ndarray
  stop_at: np.ndarray
  completion_tokens: np.ndarray
  old_logps: np.ndarray
  lengths: np.ndarray
  done: np.ndarray
  versions: np.ndarray

  @property
  def tokens(self) -> int:
    """Completion tokens so far."""
    return int(self.lengths.sum())

  def oldest(self) -> int | None:
    """The step that sampled its oldest token (None: no token yet)."""
    v = self.versions[self.versions >= 0]
    return int(v.min()) if v.size else None


# The arrays of a Group or Partial a checkpoint holds, with their dtypes.
_GROUP_ARRAYS = {'prompt_tokens': np.int32, 'prompt_mask': bool,
                 'completion_tokens': np.int32, 'completion_mask': bool,
                 'old_logps': np.float32, 'rewards': np.float32}
_PARTIAL_ARRAYS = {'prompt_tokens': np.int32, 'prompt_mask': bool,
                   'truncated': bool, 'keys': np.uint32, 'stop_at': np.int32,
                   'completion_tokens': np.int32, 'old_logps': np.float32,
                   'lengths': np.int32, 'done': bool, 'versions': np.int32}


@dataclasses.dataclass(kw_only=True)
class StepStats:
  """What a step's collection did; per-dataset arrays follow `names`.

  Attributes:
    names: the prompt source's datasets.
    batch_size: B.
    rounds: generator calls.
    prompts_asked: prompts the rounds asked for (their sizes, summed).
    prompts_generated: [D] prompts generated per dataset.
    groups_used: [D] groups in the step's batch per dataset.
    truncated: [D] prompts cut to fit per dataset.
    tokens_generated: completion tokens generated.
    completions: completions scored (of groups that hold their tokens).
    completions_cut: those that reached T (`rollout.max_new_tokens`),
      cut there unless their last token is a stop token.
    tokens_used: completion tokens of the groups in the batch.
    tokens_wasted: tokens of groups still decoding when a streaming step
      ended, discarded.
    groups_discarded: those groups (their prompts drawn, never scored),
      kept groups expired included, and kept groups whose examples a
      remapped resume left out of the data.
    in_flight: `rollout.in_flight`; the partial_*, tokens_scored,
      tokens_resumed, tokens_in_flight and staleness metrics are written
      only under 'keep', groups_retried only under 'retry'.
    groups_retried: discarded groups whose examples the next step admits
      first ('retry').
    partial_kept: groups kept in flight at the step's end.
    partial_resumed: groups kept by the last step, taken up by this one.
    partial_expired: groups that would have been kept, discarded because
      their oldest token would be more than `max_staleness` steps old.
    tokens_scored: completion tokens of the groups scored.
    tokens_resumed: tokens the resumed groups carried in.
    tokens_in_flight: tokens of the groups kept at the step's end.
    staleness: [max, sum, count] over the tokens trained on of (this step
      - the step that sampled the token).
    slot_steps: decode slot-steps of a streaming step (steps x slots).
    busy_slot_steps: those that produced a token.
    groups_easy: groups dropped as too easy.
    groups_hard: groups dropped as too hard.
    carried_in: groups carried in from the last step.
    in_hand: informative groups in hand when the rounds ended.
    held: groups held for the next step (`short_batch` 'wait').
    surplus: groups beyond the batch (carried or dropped).
    cum_prompts_generated: prompts generated over the run.
    cum_groups_used: groups trained on over the run.
    reward_sums: [sum, count] of the rewards per dataset and per
      `<dataset>/<subset>`.
    verify_errors, verify_timeouts: verifier failures.
    verify_printed: verifier calls that printed to stdout.
    verify_workers_replaced: verifier workers replaced as their memory or
      open files grew.
    gen_s, verify_s: seconds generating and verifying.
  """

  names: list[str]
  batch_size: int
  rounds: int = 0
  prompts_asked: float = 0.0
  prompts_generated: np.ndarray
  groups_used: np.ndarray
  truncated: np.ndarray
  tokens_generated: float = 0.0
  completions: float = 0.0
  completions_cut: float = 0.0
  tokens_used: float = 0.0
  tokens_wasted: float = 0.0
  groups_discarded: int = 0
  in_flight: str = 'discard'
  groups_retried: int = 0
  partial_kept: int = 0
  partial_resumed: int = 0
  partial_expired: int = 0
  tokens_scored: float = 0.0
  tokens_resumed: float = 0.0
  tokens_in_flight: float = 0.0
  staleness: list[float] = dataclasses.field(
      default_factory=lambda: [0.0, 0.0, 0.0])
  slot_steps: int = 0
  busy_slot_steps: int = 0
  groups_easy: float = 0.0
  groups_hard: float = 0.0
  carried_in: int = 0
  in_hand: int = 0
  held: int = 0
  surplus: int = 0
  cum_prompts_generated: int = 0
  cum_groups_used: int = 0
  reward_sums: dict[str, list[float]] = dataclasses.field(
      default_factory=dict)
  verify_errors: float = 0.0
  verify_timeouts: float = 0.0
  verify_printed: float = 0.0
  verify_workers_replaced: float = 0.0
  gen_s: float = 0.0
  verify_s: float = 0.0

  @classmethod
  def empty(cls, names: Sequence[str], batch_size: int) -> 'StepStats':
    """Nothing done yet."""
    D = len(names)
    return cls(names=list(names), batch_size=batch_size,
               prompts_generated=np.zeros(D, np.int64),
               groups_used=np.zeros(D, np.int64), truncated=np.zeros(D))

  def to_metrics(self) -> dict[str, float]:
    """The step's metrics (docs/metrics.md), by name."""
    generated = int(self.prompts_generated.sum())
    used = int(self.groups_used.sum())
    B = self.batch_size
    metrics = {
        'rollout/prompts_generated': float(generated),
        'rollout/tokens_generated': self.tokens_generated,
        'rollout/tokens_used': self.tokens_used,
        'rollout/tokens_wasted': self.tokens_wasted,
        'rollout/groups_discarded': float(self.groups_discarded),
        'rollout/groups_used': float(used),
        'rollout/groups_easy': self.groups_easy,
        'rollout/groups_hard': self.groups_hard,
        'rollout/rounds': float(self.rounds),
        'rollout/round_size': (self.prompts_asked / self.rounds
                               if self.rounds else 0.0),
        'rollout/efficiency': used / generated if generated else 1.0,
        'rollout/cum_prompts_generated': float(self.cum_prompts_generated),
        'rollout/cum_groups_used': float(self.cum_groups_used),
        'rollout/batch_short': float(max(B - self.in_hand, 0)),
        'rollout/carried_in': float(self.carried_in),
        'rollout/held': float(self.held),
        'train/batch_fill': min(self.in_hand, B) / B,
        'rollout/surplus': float(self.surplus),
        'verify/errors': self.verify_errors,
        'verify/timeouts': self.verify_timeouts,
        'verify/printed': self.verify_printed,
        'verify/workers_replaced': self.verify_workers_replaced,
        'perf/verify_s': self.verify_s,
        'perf/gen_s': self.gen_s,
        'perf/gen_tokens_per_s': (
            self.tokens_generated / self.gen_s if self.gen_s else 0.0),
    }
    if self.in_flight == 'retry':
      metrics['rollout/groups_retried'] = float(self.groups_retried)
    if self.in_flight == 'keep':
      high, total, n = self.staleness
      metrics.update({
          'rollout/partial_kept': float(self.partial_kept),
          'rollout/partial_resumed': float(self.partial_resumed),
          'rollout/partial_expired': float(self.partial_expired),
          'rollout/tokens_scored': self.tokens_scored,
          'rollout/tokens_resumed': self.tokens_resumed,
          'rollout/tokens_in_flight': self.tokens_in_flight,
          'rollout/staleness_max': high,
          'rollout/staleness_mean': total / n if n else 0.0,
      })
    if self.completions:
      metrics['rollout/completions_cut'] = (
          self.completions_cut / self.completions)
    if self.slot_steps:
      metrics['rollout/slot_occupancy'] = (
          self.busy_slot_steps / self.slot_steps)
    by_dataset = [self.reward_sums[name] for name in self.names
                  if name in self.reward_sums]
    n_all = sum(c for _, c in by_dataset)
    if n_all:
      metrics['reward/mean'] = sum(s for s, _ in by_dataset) / n_all
      for key, (s, c) in sorted(self.reward_sums.items()):
        metrics[f'reward/mean/{key}'] = s / c
    for d, name in enumerate(self.names):
      metrics[f'rollout/prompts_generated/{name}'] = float(
          self.prompts_generated[d])
      metrics[f'rollout/groups_used/{name}'] = float(self.groups_used[d])
      if used:  # A step without an update has no batch to share.
        metrics[f'data/batch_share/{name}'] = int(self.groups_used[d]) / used
      metrics[f'data/truncated/{name}'] = float(self.truncated[d])
    return metrics


class Accumulator:
  """Informative groups in hand, carried between steps, counted per dataset.

  Attributes:
    carried: groups carried into the next step (surplus, or held).
    in_flight: groups a streaming step left decoding, kept for the next
      (`Partial`; `in_flight='keep'` only).
    cum_prompts_generated: prompts generated over the run.
    cum_groups_used: groups trained on over the run.
    groups: the step's groups in hand (between `start` and `finish`).
    counts: [D] of them per dataset.
    stats: the step's `StepStats` so far.
  """

  def __init__(self, names: Sequence[str], *, batch_size: int,
               short_batch: str, surplus: str, in_flight: str = 'discard'):
    self.names = list(names)
    self.in_flight_mode = in_flight
    self.in_flight: list[Partial] = []
    self.step = 0
    self.batch_size = batch_size
    self.short_batch = short_batch
    self.surplus = surplus
    self._index = {name: d for d, name in enumerate(self.names)}
    self.carried: list = []
    self.cum_prompts_generated = 0
    self.cum_groups_used = 0
    self.groups: list = []
    self.counts = np.zeros(len(self.names), np.int64)
    self.stats = StepStats.empty(self.names, batch_size)

  def start(self, step: int = 0) -> None:
    """Begins step `step` with the groups carried in."""
    self.step = step
    self.groups, self.carried = self.carried, []
    self.stats = StepStats.empty(self.names, self.batch_size)
    self.stats.in_flight = self.in_flight_mode
    self.stats.carried_in = len(self.groups)
    self.counts = np.zeros(len(self.names), np.int64)
    for g in self.groups:
      self.counts[self._index[g.example.dataset]] += 1

  def add(self, rnd: rounds_lib.Round, size: int,
          classified: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    """Takes a round of `size` prompts and its `rounds.classify` masks."""
    self.stats.rounds += 1
    self.stats.prompts_asked += float(size)
    self.add_groups(rnd, classified)

  def add_groups(
      self, rnd: rounds_lib.Round,
      classified: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    """Takes scored groups (a round's, or a streaming step's) and masks."""
    informative, easy, hard = classified
    s = self.stats
    new = [rnd.groups[r] for r in np.flatnonzero(informative)]
    self.groups.extend(new)
    for g in new:
      self.counts[self._index[g.example.dataset]] += 1
    s.groups_easy += float(easy.sum())
    s.groups_hard += float(hard.sum())
    s.gen_s += rnd.gen_s
    s.tokens_generated += rnd.gen_tokens
    s.verify_errors += rnd.verify_errors
    s.verify_timeouts += rnd.verify_timeouts
    s.verify_printed += rnd.verify_printed
    s.verify_workers_replaced += rnd.verify_workers_replaced
    s.verify_s += rnd.verify_s
    for g, row in zip(rnd.groups, rnd.rewards):
      mask = getattr(g, 'completion_mask', None)
      if mask is not None:  # [G, T]: a row valid at T - 1 reached T.
        s.completions += float(mask.shape[0])
        s.completions_cut += float(mask[:, -1].sum())
      ex = g.example
      s.prompts_generated[self._index[ex.dataset]] += 1
      for key in [ex.dataset] + ([f'{ex.dataset}/{ex.subset}']
                                 if ex.subset else []):
        sums = s.reward_sums.setdefault(key, [0.0, 0.0])
        sums[0] += float(row.sum())
        sums[1] += row.size
    if rnd.truncated is not None:
      for g, cut in zip(rnd.groups, rnd.truncated):
        s.truncated[self._index[g.example.dataset]] += float(cut)

  def finish(self, choose: Choose) -> tuple[list, StepStats]:
    """Ends the step: the groups to train on (none: no update) and stats.

    A step short of B groups under short_batch 'wait' holds them all for
    the next; otherwise `choose` picks the batch and the surplus is carried
    or dropped.
    """
    s = self.stats
    s.in_hand = len(self.groups)
    if s.in_hand < self.batch_size and self.short_batch == 'wait':
      # No update on a short batch: every group waits for the next step.
      groups, surplus, self.carried = [], [], self.groups
      s.held = len(self.carried)
    else:
      groups, surplus = choose(self.groups)
      if self.surplus == 'carry':
        self.carried = list(surplus)
    self.groups = []
    s.surplus = len(surplus)
    for g in groups:
      s.groups_used[self._index[g.example.dataset]] += 1
      s.tokens_used += float(getattr(g, 'tokens', 0))
      versions = getattr(g, 'versions', None)
      if versions is not None:
        stale = self.step - versions[g.completion_mask]
        s.staleness = [max(s.staleness[0], float(stale.max(initial=0))),
                       s.staleness[1] + float(stale.sum()),
                       s.staleness[2] + float(stale.size)]
    self.cum_prompts_generated += int(s.prompts_generated.sum())
    self.cum_groups_used += len(groups)
    s.cum_prompts_generated = self.cum_prompts_generated
    s.cum_groups_used = self.cum_groups_used
    return groups, s

  def get_state(self) -> dict:
    """Counters, the carried groups and those in flight, as numpy arrays.

    Groups are stacked (padded to one row when there are none: checkpoints
    hold no empty arrays) and their examples JSON-encoded as bytes, so a
    resumed run trains on exactly the groups it would have and takes up
    exactly the rollouts left in flight.
    """
    state = {
        'cum_prompts_generated': self.cum_prompts_generated,
        'cum_groups_used': self.cum_groups_used,
        'carried': _stack(self.carried, {
            **_GROUP_ARRAYS,
            **({'versions': np.int32} if self.in_flight_mode == 'keep'
               else {})}),
    }
    if self.in_flight_mode == 'keep':
      state['in_flight'] = _stack(self.in_flight, _PARTIAL_ARRAYS)
    return state

  def set_state(self, state: dict) -> None:
    """Restores `get_state`."""
    self.cum_prompts_generated = int(state['cum_prompts_generated'])
    self.cum_groups_used = int(state['cum_groups_used'])
    self.carried = _unstack(state['carried'], rounds_lib.Group)
    self.in_flight = _unstack(state.get('in_flight'), Partial)

  def drop_datasets(self, names: Sequence[str]) -> int:
    """Drops the carried and in-flight groups of datasets `names` (gone
    from the mixture on a resume); returns how many."""
    before = len(self.carried) + len(self.in_flight)
    self.carried = [g for g in self.carried if g.example.dataset not in names]
    self.in_flight = [p for p in self.in_flight
                      if p.example.dataset not in names]
    return before - len(self.carried) - len(self.in_flight)


def _stack(groups: Sequence[Any], arrays: dict[str, Any]) -> dict:
  """Groups' arrays stacked, their examples JSON-encoded as bytes."""
  examples = [dataclasses.asdict(g.example) for g in groups]
  out = {'count': len(groups),
         'examples': np.frombuffer(json.dumps(examples).encode(), np.uint8)}
  for name, dtype in arrays.items():
    out[name] = (np.stack([np.asarray(getattr(g, name)) for g in groups])
                 .astype(dtype) if groups else np.zeros((1,), dtype))
  return out


def _unstack(saved: dict | None, cls: type) -> list:
  """`_stack`'s groups back, as `cls` (Group or Partial)."""
  if saved is None:
    return []
  examples = json.loads(np.asarray(saved['examples'], np.uint8).tobytes())
  names = [f.name for f in dataclasses.fields(cls)
           if f.name != 'example' and f.name in saved]
  return [cls(example=Example(**examples[i]),
              **{n: np.asarray(saved[n][i]) for n in names})
          for i in range(int(saved['count']))]
