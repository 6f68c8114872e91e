"""The snooze-aware mixture: which prompts each round offers, across datasets.

Each dataset keeps its own `SnoozeTable` (its epoch walk and per-example
state); this module decides how many prompts each dataset contributes to a
round and which of the collected informative groups make up the batch.

Balance modes:
  pre_filter: round slots are split across datasets by weight; dropped
    groups are replaced by fresh weighted draws, so a dataset whose groups
    are dropped more often shrinks in the batch (the drift the source text
    measures).
  post_filter: each dataset has a quota of B groups in the batch: its
    `min_fraction` floor, or its weight's share of what the floors leave
    (`_quotas`); rounds ask each dataset for prompts in proportion to what
    it still owes. A dataset that cannot fill its quota (it ran out of offered
    examples, or `max_rounds` was hit) hands its slots to the others, and
    the metrics count the hand-over.
`min_fraction` reserves ceil(min_fraction * B) slots of a dataset in either
mode, against starvation (`min_slots`).

A dataset stuck in debt: one that ended a step owing groups (its quota or
its floor) although it was asked, and yielded no informative group in it
(every group too easy or too hard: a dataset the model has mastered, under
`none` or `snooze`), is `stuck` in the next steps. Its unfilled slots are
open to every dataset, drawn for by weight (its own share included), so
the batch fills and the others take them over, where the rounds would ask
it alone, step after step, and a short batch under `wait` would never
train. It is asked still, one prompt a step at least; the first step in
which it yields an informative group (or pays what it owes) ends it.

Datasets with offline difficulty strata (`curriculum.Strata`) offer each
example with its stratum's weight at the current step (`curriculum`), and
report each stratum's batch share.

Size: one class, `MixtureSampler`, whose per-step protocol (draw, observe,
choose), quotas and saved state share the per-dataset tables and the
draws still pending.
"""

import collections
from collections.abc import Callable, Mapping, Sequence
import dataclasses
import logging
import math

import numpy as np

from jaxgrpo.data import curriculum as curriculum_lib
from jaxgrpo.data import snooze
from jaxgrpo.example import Example

_LOG = logging.getLogger(__name__)

BALANCES = ('pre_filter', 'post_filter')


@dataclasses.dataclass(frozen=True, kw_only=True)
class DatasetSpec:
  """One dataset of the mixture.

  Attributes:
    name: dataset name (metrics use it).
    weight: mixture weight; weights are normalised over the mixture.
    policy: the dataset's snooze policy settings.
    min_fraction: share of every batch reserved for this dataset.
    skipped_records: bad records left out when the dataset was loaded.
    dropped_long: examples left out when it was loaded because their prompt
      does not fit the context.
  """

  name: str
  weight: float
  policy: snooze.PolicyConfig
  min_fraction: float = 0.0
  skipped_records: int = 0
  dropped_long: int = 0


def largest_remainder(shares: np.ndarray, total: int) -> np.ndarray:
  """Integer counts summing to `total`, proportional to `shares`."""
  shares = np.asarray(shares, np.float64)
  if total <= 0 or shares.sum() <= 0:
    return np.zeros(len(shares), np.int64)
  exact = shares / shares.sum() * total
  counts = np.floor(exact).astype(np.int64)
  order = np.argsort(-(exact - counts), kind='stable')
  counts[order[:total - counts.sum()]] += 1
  return counts


def min_slots(fraction: float, batch_size: int) -> int:
  """Batch slots a `min_fraction` reserves: ceil(fraction * B), where a
  product within float rounding of a whole number is that number (0.07 *
  100 is 7.000000000000001 in floats: 7 slots, not 8)."""
  return math.ceil(round(fraction * batch_size, 9))


def floors(entries: Sequence, batch_size: int) -> dict[str, int]:
  """`min_slots` of each dataset entry (anything with `name` and
  `min_fraction`), by name."""
  return {e.name: min_slots(e.min_fraction, batch_size) for e in entries}


def _seed_of(seed: int, name: str) -> int:
  # Stable across processes (unlike hash()): each dataset gets its own walk.
  return (seed * 1_000_003 + sum((i + 1) * ord(c) for i, c in enumerate(name))) % 2**31


def _seeds_of(seed: int, names: Sequence[str]) -> dict[str, int]:
  """Each dataset's walk seed, distinct within the mixture.

  `_seed_of`'s weighted sum gives some names the same seed ('ab' and 'ca'),
  which made their walks the same: one permutation and one set of random
  skips for both. A later name (in sorted order, so the list's order does
  not matter) moves on to the next free seed.
  """
  out: dict[str, int] = {}
  for name in sorted(names):
    s = _seed_of(seed, name)
    while s in out.values():
      s = (s + 0x9E3779B9) % 2**31
    out[name] = s
  return out


def _interleaved(picked: list[tuple[int, int]],
                 rank: np.ndarray) -> list[tuple[int, int]]:
  """A round's (dataset, example) draws with each dataset's spread evenly
  over the round, in its own order: the k-th of a dataset's n at (k + 0.5)
  / n, ties (odd counts meet at 0.5) by `rank`, a random order of the
  datasets, so that none goes first by its place. Groups arrive in prompt
  order, and `choose` fills the slots left after the quotas in arrival
  order, so dataset-major rounds gave the datasets listed first the surplus
  slots (under `pre_filter` and
  `surplus='drop'` a dataset's batch share hung on its place in
  `data.datasets`)."""
  count = collections.Counter(d for d, _ in picked)
  seen = collections.Counter()
  keys = []
  for d, _ in picked:
    keys.append(((seen[d] + 0.5) / count[d], rank[d]))
    seen[d] += 1
  return [p for _, p in sorted(zip(keys, picked), key=lambda kp: kp[0])]


class MixtureSampler:
  """Offers prompts from several datasets and builds balanced batches.

  Implements the rollout's prompt-source protocol: `start_step`,
  `next_prompts`, `observe`, `batch_full` and `choose`.
  """

  def __init__(
      self,
      datasets: Sequence[tuple[DatasetSpec, Sequence[Example]]],
      *,
      balance: str,
      batch_size: int,
      seed: int,
      strata: Mapping[str, curriculum_lib.Strata] | None = None,
      curriculum: curriculum_lib.Curriculum | None = None,
      log: Callable[[str], None] = _LOG.info,
  ):
    if balance not in BALANCES:
      raise ValueError(f'balance must be one of {BALANCES}, got {balance!r}')
    if not datasets:
      raise ValueError('a mixture needs at least one dataset')
    names = [spec.name for spec, _ in datasets]
    if len(set(names)) != len(names):
      raise ValueError(f'dataset names must be unique, got {names}')
    self.specs = [spec for spec, _ in datasets]
    self.sources = [source for _, source in datasets]
    self.names = names
    self.balance = balance
    self.batch_size = batch_size
    self.seed = seed
    weights = np.array([s.weight for s in self.specs], np.float64)
    if (weights < 0).any() or weights.sum() <= 0:
      raise ValueError(f'mixture weights must be >= 0 with a positive sum: {weights}')
    self.weights = weights / weights.sum()
    seeds = _seeds_of(seed, names)
    self.tables = [
        snooze.SnoozeTable(len(src), spec.policy, seed=seeds[spec.name])
        for spec, src in datasets
    ]
    self.strata = dict(strata or {})
    unknown = sorted(set(self.strata) - set(names))
    if unknown:
      raise ValueError(f'strata for unknown datasets {unknown}')
    for d, name in enumerate(names):
      if name in self.strata:
        st = self.strata[name]
        self.tables[d].set_strata(st.index, len(st.names), st.prior)
    self.curriculum = curriculum or curriculum_lib.Curriculum(())
    self.curriculum.check_datasets(names, stratified=self.strata)
    self._log = log
    self._stage = None
    self._weights = {name: np.ones(len(st.names))
                     for name, st in self.strata.items()}
    self._stratum_used: dict[tuple[int, int], int] = {}
    self._chosen = 0
    self._closed = np.zeros(len(names), bool)
    self.floors = np.array(list(floors(self.specs, batch_size).values()),
                           np.int64)
    if self.floors.sum() > batch_size:
      raise ValueError(
          f'min_fraction floors {dict(zip(names, self.floors.tolist()))} '
          f'exceed the batch of {batch_size}')
    self.quotas = self._quotas()
    # A fixed sample per dataset for the adaptive round size's estimate.
    rng = np.random.default_rng([seed, 7])
    self._rate_samples = [
        rng.choice(len(src), size=min(len(src), 4096), replace=False)
        for src in self.sources
    ]
    self.step = 0
    self._round = 0
    # Drawn and not yet observed, in draw order: (dataset, index, example).
    self._pending: list[tuple[int, int, Example]] = []
    # Drawn in an earlier step and still in flight (`hold`): pending still.
    self._held: list[tuple[int, int, Example]] = []
    self._exhausted = np.zeros(len(names), bool)
    self._stuck = np.zeros(len(names), bool)  # `end_step`
    self._stuck_in_step = self._stuck.copy()  # as this step started
    self._step_counts: dict[str, np.ndarray] = {}
    self._unsaid: list[str] = []  # the stage's lines, said at its first use
    self.start_step(0, quiet=True)

  def _quotas(self) -> np.ndarray:
    """Batch slots per dataset: weights (post_filter) or floors (pre_filter)."""
    if self.balance == 'pre_filter':
      return self.floors.copy()
    # Floors first, then the rest by weight: a dataset whose share of what
    # is left is below its floor gets the floor, and the others split the
    # rest (slots were taken one at a time from the dataset furthest above
    # its floor: weights 0.5 / 0.3 / 0.2 of 10 with a floor of 5 on the last
    # gave 2 / 3 / 5, where the rest by weight is 3 / 2).
    fixed = np.zeros(len(self.weights), bool)
    while True:
      rest = self.batch_size - int(self.floors[fixed].sum())
      free = np.where(fixed, 0.0, self.weights)
      share = free / free.sum() * rest if free.sum() else free
      below = ~fixed & (share < self.floors)
      if not below.any():
        break
      fixed |= below
    quotas = np.where(fixed, self.floors, 0)
    return quotas + largest_remainder(free, rest) if free.sum() else quotas

  # The per-step protocol.

  def start_step(self, step: int, quiet: bool = False) -> None:
    """Resets the per-step counters; draws of this step are keyed by it.
    `quiet` (building, restoring): the curriculum stage in force is said at
    the next step or draw, not for a step the run does not take."""
    self.step = step
    self._round = 0
    self._apply_stage(step)
    if not quiet:
      self._say_stage()
    # A dataset whose strata all weigh 0 now has nothing to offer.
    self._exhausted[:] = self._closed
    self._stuck_in_step = self._stuck.copy()
    self._stratum_used, self._chosen = {}, 0
    # A streaming step's discarded groups teach nothing; held ones wait.
    self._pending = list(self._held)
    k = len(self.names)
    self._step_counts = {
        key: np.zeros(k, np.int64)
        for key in ('drawn', 'informative', 'easy', 'hard', 'flat',
                    'handover_out', 'handover_in')
    }

  def _apply_stage(self, step: int) -> None:
    """Sets the strata weights of the curriculum stage in force at `step`."""
    stage = self.curriculum.stage_at(step)
    if stage == self._stage:
      return
    self._unsaid = []
    for d, name in enumerate(self.names):
      st = self.strata.get(name)
      if st is None:
        continue
      weights = self.curriculum.weights(name, st.names, step)
      self.tables[d].set_stratum_weights(weights)
      self._weights[name] = weights
      self._closed[d] = self.tables[d].postponed() == self.tables[d].size
      if self._stage is not None or stage >= 0:
        named = ', '.join(f'{n} {w:g}' for n, w in zip(st.names, weights))
        self._unsaid.append(f'curriculum stage {stage}, dataset {name!r} '
                            f'strata weights: {named}')
      if self._closed[d]:
        self._unsaid.append(
            f'curriculum stage {stage} gives every example of dataset '
            f'{name!r} weight 0; it offers nothing until a later stage' + (
                ': the other datasets fill its batch slots'
                if len(self.names) > 1 else ''))
    self._stage = stage

  def _say_stage(self) -> None:
    for line in self._unsaid:
      self._log(f'step {self.step}: {line}')
    self._unsaid = []

  def _allocate(self, n: int, need: np.ndarray) -> np.ndarray:
    """Round slots per dataset before exhaustion is known."""
    open_ = ~self._exhausted
    weights = np.where(open_, self.weights, 0.0)
    # A stuck dataset is asked one prompt a step at least, weight 0 or not
    # (a streaming step draws a few prompts at a time), and what it owes is
    # drawn for by weight among every open one.
    stuck = open_ & self._stuck & (need > 0)
    probe = (stuck & (self._step_counts['drawn'] == 0)).astype(np.int64)
    probe *= n >= probe.sum()
    n -= int(probe.sum())
    owed = np.where(open_ & ~self._stuck, need, 0)
    if self.balance == 'post_filter':
      shared = int(need[stuck].sum())
      if owed.sum() + shared > 0:
        return probe + largest_remainder(owed + shared * (
            weights / weights.sum() if weights.sum() else 0.0), n)
      # Every quota is met or unreachable: draw by weight (the surplus may
      # still hand over to a dataset that ran short).
    rng = np.random.default_rng([self.seed, self.step, self._round])
    reserved = probe + largest_remainder(owed, min(n, int(owed.sum())))
    if weights.sum() == 0:
      return reserved
    return reserved + rng.multinomial(n - int((reserved - probe).sum()),
                                      weights / weights.sum())

  def next_prompts(self, n: int, need: np.ndarray | None = None) -> list[Example]:
    """Draws up to n prompts for one round.

    Args:
      n: round size.
      need: groups each dataset still owes this step (quota or floor minus
        informative groups collected); zeros when None.

    Returns:
      The round's examples (fewer than n only when every dataset is out of
      offered examples).
    """
    self._say_stage()  # a sampler used without start_step (tests, tools)
    need = np.zeros(len(self.names), np.int64) if need is None else need
    counts = self._allocate(n, need)
    picked: list[tuple[int, int]] = []
    while True:
      shortfall = 0
      for d, want in enumerate(counts):
        if want <= 0:
          continue
        held = np.array([i for hd, i, _ in self._held if hd == d], np.int64)
        got = self.tables[d].draw(int(want), self.step, held)
        picked.extend((d, int(i)) for i in got)
        if len(got) < want:
          if not self._exhausted[d]:
            _LOG.info('dataset %s offered only %d of %d prompts this round '
                         '(its epoch has no more active examples)',
                         self.names[d], len(got), want)
          self._exhausted[d] = True
          shortfall += int(want) - len(got)
      if shortfall == 0 or self._exhausted.all():
        break
      weights = np.where(self._exhausted, 0.0, self.weights)
      counts = largest_remainder(weights, shortfall)
    self._round += 1
    picked = _interleaved(picked, np.random.default_rng(
        [self.seed, self.step, self._round, 1]).permutation(len(self.names)))
    examples = [self._example(d, i) for d, i in picked]
    for (d, i), ex in zip(picked, examples):
      self._step_counts['drawn'][d] += 1
      self._pending.append((d, i, ex))
    return examples

  def _example(self, d: int, i: int) -> Example:
    ex = self.sources[d][i]
    st = self.strata.get(self.names[d])
    if st is None:
      return ex
    # The stratum travels with the example to `choose` (batch shares).
    return dataclasses.replace(
        ex, meta={**ex.meta, 'stratum': st.names[st.index[i]]})

  def observe(self, examples: Sequence[Example], rewards_RG: np.ndarray) -> None:
    """Feeds rewards [R, G] of drawn examples back to their tables.

    The examples are any of those drawn and not yet observed: a whole
    round, or the groups a streaming step scored since it last observed.
    """
    rewards_RG = np.asarray(rewards_RG, np.float32)
    picked = np.asarray([self._take_pending(ex) for ex in examples],
                        np.int64).reshape(-1, 2)
    for d, table in enumerate(self.tables):
      rows = np.flatnonzero(picked[:, 0] == d)
      if rows.size:
        table.observe(picked[rows, 1], rewards_RG[rows], self.step)
        pol = self.specs[d].policy
        kinds = snooze.group_kinds(rewards_RG[rows], pol.easy_threshold,
                                   pol.hard_threshold)  # as the rollout's
        for key, mask in zip(('informative', 'easy', 'hard', 'flat'), kinds):
          self._step_counts[key][d] += int(mask.sum())

  def hold(self, examples: Sequence[Example]) -> None:
    """Keeps drawn, unobserved `examples` pending past the step's end.

    A streaming step that keeps its unfinished groups in flight, or
    retries them (`rollout.in_flight` 'keep' or 'retry'), holds their
    examples: they stay pending in the next steps, to be observed once,
    when scored, and are not offered again meanwhile (`held` lists them
    for a retry). Each call replaces the last one's examples.
    """
    taken = set()
    for ex in examples:
      taken.add(self._pending_index(ex, taken))
    # By dataset, then draw order: the order a checkpoint restores.
    self._held = [self._pending[k] for k in
                  sorted(taken, key=lambda k: (self._pending[k][0], k))]

  def held(self) -> list[Example]:
    """The examples `hold` keeps pending, by dataset, then draw order."""
    return [ex for _, _, ex in self._held]

  def _pending_index(self, example: Example, skip=frozenset()) -> int:
    """Where the earliest unobserved draw of `example` is in `_pending`.

    An `Example` is matched by id (unique in its dataset): one restored
    from a checkpoint is a copy, its meta through JSON.
    """
    d = self.names.index(example.dataset)
    # The drawn example itself first, then an equal copy, then its id: two
    # examples that share an id (exact duplicate records) never swap.
    for same in (lambda drawn: drawn is example,
                 lambda drawn: drawn == example,
                 lambda drawn: isinstance(drawn, Example)
                 and drawn.id == example.id):
      for k, (pd, _, drawn) in enumerate(self._pending):
        if pd == d and k not in skip and same(drawn):
          return k
    raise ValueError(f'observe got {example!r}, which is not drawn or was '
                     'observed already')

  def _take_pending(self, example: Example) -> tuple[int, int]:
    """(dataset, index) of the earliest unobserved draw of `example`."""
    entry = self._pending.pop(self._pending_index(example))
    self._held = [h for h in self._held if h is not entry]
    return entry[0], entry[1]

  def dataset_index(self, name: str) -> int:
    return self.names.index(name)

  def need(self, counts: np.ndarray) -> np.ndarray:
    """Groups each dataset still owes, given informative counts so far."""
    return np.maximum(self.quotas - counts, 0)

  def batch_full(self, counts: np.ndarray) -> bool:
    """Whether groups with these per-dataset counts can fill the batch."""
    if counts.sum() < self.batch_size:
      return False
    owed = self.need(counts)
    # A dataset out of examples, or stuck, cannot pay what it owes; others
    # take over.
    return bool((owed[~self._exhausted & ~self._stuck] == 0).all())

  def end_step(self, counts: np.ndarray) -> None:
    """Ends the step's collection, with `counts` informative groups in hand
    per dataset: sets which datasets are stuck in the next steps (see the
    module's doc), and says when one turns stuck or pays again."""
    c, owed = self._step_counts, self.need(counts)
    # One dataset alone has no other to take its slots.
    stuck = ((owed > 0) & (c['informative'] == 0)
             & ((c['drawn'] > 0) | self._stuck) & ~self._exhausted
             & (len(self.names) > 1))
    # One closed by a curriculum stage is out of examples: said as such.
    for d in np.flatnonzero((stuck != self._stuck) & ~self._exhausted):
      name = self.names[d]
      self._log(
          f'step {self.step}: dataset {name!r} yielded no informative group '
          f'and still owes {owed[d]} of its {int(self.quotas[d])} batch slots: '
          'from the next step every dataset may fill them, drawn by weight, '
          'until it yields one (data/stuck)' if stuck[d] else
          f'step {self.step}: dataset {name!r} ' + (
              'yields informative groups again' if c['informative'][d]
              else 'owes nothing') + '; its slots are its own again')
    self._stuck = stuck

  def choose(self, groups: Sequence, key=lambda g: g.example.dataset):
    """Splits collected groups (arrival order) into (batch, surplus).

    Each dataset first gets up to its quota (post_filter) or floor; the
    remaining slots go to the other groups in arrival order. Slots a
    dataset could not fill are counted as handed over.
    """
    index = {name: d for d, name in enumerate(self.names)}
    taken = np.zeros(len(self.names), np.int64)
    chosen, rest = [], []
    for g in groups:
      d = index[key(g)]
      if taken[d] < self.quotas[d]:
        taken[d] += 1
        chosen.append(g)
      else:
        rest.append(g)
    free = self.batch_size - len(chosen)
    chosen.extend(rest[:free])
    surplus = rest[free:]
    for g in chosen if self.strata else ():
      d = index[key(g)]
      st = self.strata.get(self.names[d])
      meta = getattr(getattr(g, 'example', None), 'meta', None) or {}
      name = meta.get('stratum')
      if st is not None and name in st.names:
        s = st.names.index(name)
        self._stratum_used[d, s] = self._stratum_used.get((d, s), 0) + 1
    self._chosen = len(chosen)
    if self.balance == 'post_filter':
      short = np.maximum(self.quotas - taken, 0)
      extra = np.zeros(len(self.names), np.int64)
      for g in rest[:free]:
        extra[index[key(g)]] += 1
      self._step_counts['handover_out'] += short
      self._step_counts['handover_in'] += extra
      if short.sum():
        _LOG.info(
            'step %d: %s could not fill their quotas; %d slots handed to %s',
            self.step,
            {n: int(s) for n, s in zip(self.names, short) if s},
            int(extra.sum()),
            {n: int(e) for n, e in zip(self.names, extra) if e})
    return chosen, surplus

  def metrics(self) -> dict[str, float]:
    """Per-dataset sampler metrics for this step (`data/*`)."""
    out = {}
    c = self._step_counts
    for d, name in enumerate(self.names):
      counts = self.tables[d].counts()
      out[f'data/snoozed/{name}'] = float(counts['snoozed'])
      out[f'data/filtered/{name}'] = float(counts['filtered'])
      out[f'data/epoch/{name}'] = float(counts['epoch'])
      out[f'data/prompts_drawn/{name}'] = float(c['drawn'][d])
      out[f'rollout/groups_easy/{name}'] = float(c['easy'][d])
      out[f'rollout/groups_hard/{name}'] = float(c['hard'][d])
      if c['flat'][d]:  # partial rewards only: a key in the steps with any
        out[f'rollout/groups_flat/{name}'] = float(c['flat'][d])
      if self.balance == 'post_filter':
        out[f'data/quota/{name}'] = float(self.quotas[d])
        out[f'data/handover_out/{name}'] = float(c['handover_out'][d])
        out[f'data/handover_in/{name}'] = float(c['handover_in'][d])
      out[f'data/exhausted/{name}'] = float(self._exhausted[d])
      if self.quotas[d] and len(self.names) > 1:  # a mixture's, that owes
        out[f'data/stuck/{name}'] = float(self._stuck_in_step[d])
      # Constant over a run; logged with every step so each record of
      # metrics.jsonl says what the data left out.
      out[f'data/skipped_records/{name}'] = float(
          self.specs[d].skipped_records)
      out[f'data/dropped_long/{name}'] = float(self.specs[d].dropped_long)
      st = self.strata.get(name)
      if st is not None:
        table = self.tables[d]
        out[f'data/postponed/{name}'] = float(table.postponed())
        weights = self._weights[name]
        for s, stratum in enumerate(st.names):
          if self._chosen:  # None without a batch.
            out[f'data/batch_share/{name}/{stratum}'] = (
                self._stratum_used.get((d, s), 0) / self._chosen)
          out[f'data/stratum_weight/{name}/{stratum}'] = float(weights[s])
    if self.strata:
      out['data/curriculum_stage'] = float(self._stage)
    return out

  def informative_rate(self) -> float:
    """Predicted share of informative groups in the next round (by weight)."""
    rates = np.array([t.offered_informative_rate(sample) for t, sample
                      in zip(self.tables, self._rate_samples)])
    open_ = ~self._exhausted
    w = np.where(open_, self.weights, 0.0)
    return float((rates * w).sum() / w.sum()) if w.sum() else 0.0

  def get_state(self) -> dict:
    state = {
        'step': self.step,
        'tables': {name: t.get_state() for name, t in zip(self.names, self.tables)},
    }
    if self._stuck.any():  # from `end_step`, for the next steps
      state['stuck'] = {name: np.ones(1, np.int32) for name, stuck
                        in zip(self.names, self._stuck) if stuck}
    if self._held:  # indices of the examples held in flight, by dataset
      state['held'] = {
          name: np.array([i for hd, i, _ in self._held if hd == d], np.int64)
          for d, name in enumerate(self.names)
          if any(hd == d for hd, _, _ in self._held)}
    return state

  def set_state(
      self,
      state: dict,
      *,
      remap: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
  ) -> dict[str, dict[str, int]]:
    """Restores `get_state`; datasets in `remap` are matched by example id.

    Args:
      state: a `get_state` dict.
      remap: dataset name -> (saved id hashes, current id hashes) for the
        datasets that changed since the state was saved; a name absent
        from the saved state starts fresh.

    Returns:
      For each remapped dataset, the counts of `set_state_remapped` (a
      dataset new to the state: everything 'new').
    """
    remap = dict(remap or {})
    missing = sorted(set(self.names) - set(state['tables']) - set(remap))
    if missing:
      raise ValueError(f'sampler state has no dataset {missing[0]!r}')
    report = {}
    for name, table in zip(self.names, self.tables):
      if name not in remap:
        table.set_state(state['tables'][name])
      elif name in state['tables']:
        saved_ids, ids = remap[name]
        report[name] = table.set_state_remapped(
            state['tables'][name], saved_ids, ids)
      else:
        report[name] = {'kept': 0, 'new': table.size, 'removed': 0}
    # By name: a dataset added on a resume starts unstuck.
    self._stuck = np.array([name in state.get('stuck', {})
                            for name in self.names])
    self._held = []
    # In this run's dataset order, as `hold` keeps them: a checkpoint gives
    # its dicts back with their keys sorted, and a retry admits the held
    # examples in this order. A dataset left out on a resume (remap) is
    # not held.
    saved = state.get('held', {})
    for d, name in enumerate(self.names):
      held = saved.get(name, ())
      for i in np.asarray(held, np.int64).reshape(-1).tolist():
        if name in remap:  # matched by id hash; one removed is not held
          saved_ids, ids = remap[name]
          now = np.flatnonzero(np.asarray(ids) == np.asarray(saved_ids)[i])
          if not now.size:
            continue
          i = int(now[0])
        self._held.append((d, i, self._example(d, i)))
    self.start_step(int(state['step']), quiet=True)
    return report
