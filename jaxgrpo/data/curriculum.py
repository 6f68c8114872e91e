"""Offline difficulty strata as sub-datasets of the mixture, and a curriculum.

`jaxgrpo-stratify` measures each training example's pass rate under one or
more baseline models. Matched to a run's examples by stable id, the rates put
every example of a dataset in a stratum: 'too_hard' (pass rate 0), one band
per interval of `bands` ('0-0.25', '0.25-0.5', ...), 'too_easy' (pass rate
1), or 'unrated' (no pass rate in the files: not measured, or every
verifier call of theirs failed, which measured the verifier). Each stratum
behaves as a sub-dataset with a weight: an example is offered with its
stratum's weight relative to the largest (see
`snooze.SnoozeTable.set_strata`), so weight 0 postpones a stratum and the
dataset's share of the mixture is kept. Its batch share is reported as
`data/batch_share/<dataset>/<stratum>`.

A curriculum is a list of stages, each `{'step': S, 'weights': {...}}`: from
step S until the next stage, each named stratum gets its weight (keys are a
stratum name for every dataset, or 'dataset/stratum' for one dataset, which
wins); strata not named weigh 1, as do all before the first stage. E.g.
postpone the too-hard until step 200 and drop the too-easy from step 400:

    stages = (
        {'step': 0, 'weights': {'too_hard': 0.0}},
        {'step': 200, 'weights': {}},
        {'step': 400, 'weights': {'too_easy': 0.0}},
    )

The mean rewards measured (the pass rates, for rewards of 0 and 1) also
seed the `weighted` policy's prior, example by example: its history sums
rewards, so a partly right completion counts in both as the same fraction.
"""

from collections.abc import Collection, Mapping, Sequence
import dataclasses
import hashlib
import logging
import os
from typing import Any

import numpy as np

from jaxgrpo import checks
from jaxgrpo import errors
from jaxgrpo.checks import field
from jaxgrpo.data import snooze
from jaxgrpo.data import sources
from jaxgrpo.stratify import bands as bands_lib
from jaxgrpo.stratify import passrates

_LOG = logging.getLogger(__name__)

UNRATED = 'unrated'


def stratum_names(edges: Sequence[float]) -> tuple[str, ...]:
  """Every stratum name for these band edges, 'unrated' last."""
  return tuple(bands_lib.stratum_names(edges)) + (UNRATED,)


class CurriculumSection(checks.Section, name='curriculum'):
  """The config's `curriculum`: offline strata and stages."""

  strata: str | None = field(
      None, 'a `jaxgrpo-stratify` output directory: per-example pass rates '
      'that put each example in a stratum (see [Stratification and '
      'curriculum](sampler.md#stratification-and-curriculum)); None: no strata',
      checks.rule(lambda s: s is None or bool(s),
                  'must be a jaxgrpo-stratify output directory or None'))
  checkpoints: tuple[str, ...] = field(
      (), 'checkpoint tags whose pass rates are pooled (empty: all measured)',
      checks.names('must be a list of checkpoint tags (empty: all)'))
  bands: tuple[float, ...] = field(
      (0.25, 0.5, 0.75), 'band edges in (0, 1) between the `too_hard` (pass '
      'rate 0) and `too_easy` (pass rate 1) strata; examples without a pass '
      'rate are `unrated`')
  prior: bool = field(
      True, "each example's measured mean reward (its pass rate, for 0/1 "
      'rewards) as its prior mean for the `weighted` policy')
  stages: tuple[dict[str, Any], ...] = field(
      (), "`({'step': S, 'weights': {stratum or 'dataset/stratum': w}}, ...)`: "
      'per-stratum weights (relative to the largest) from step S on (unnamed: '
      '1; 0 postpones)', checks.rule(lambda s: isinstance(s, (list, tuple)), (
          "must be a list of {'step': S, 'weights': {...}} dicts")))

  def _validate(self):
    try:
      names = stratum_names(tuple(self.bands))
    except (TypeError, ValueError) as e:
      yield 'bands', False, f'must be increasing edges in (0, 1) ({e})'
    object.__setattr__(self, 'bands', tuple(float(b) for b in self.bands))
    yield 'stages', not self.stages or self.strata is not None, (
        'need curriculum.strata (a jaxgrpo-stratify output)')
    last, stages = -1, []
    for i, stage in enumerate(self.stages):
      at = f'curriculum.stages[{i}]'
      if not isinstance(stage, dict) or set(stage) != {'step', 'weights'}:
        checks.fail(at, stage, "must be a dict with keys 'step' and 'weights'")
      step, weights = checks.plain(stage['step'], int), stage['weights']
      if checks.type_error(step, int) or step <= last:
        checks.fail(f'{at}.step', step, 'must be an int >= 0, greater than '
                    "the previous stage's")
      last = step
      if not isinstance(weights, dict):
        checks.fail(f'{at}.weights', weights,
                    'must be a dict of stratum name -> weight')
      stages.append({'step': step, 'weights': dict(weights)})
      for key, w in weights.items():
        stratum = str(key).rsplit('/', 1)[-1]
        if stratum not in names:
          raise errors.ConfigError(
              f'{at}.weights[{key!r}]: unknown stratum {stratum!r} (with '
              f'curriculum.bands={self.bands}: {", ".join(names)}; '
              "'dataset/stratum' for one dataset)")
        stages[-1]['weights'][key] = w = checks.plain(w, float)
        if checks.type_error(w, float) or not 0 <= w < float('inf'):
          checks.fail(f'{at}.weights[{key!r}]', w, 'must be a number >= 0')
    object.__setattr__(self, 'stages', tuple(stages))


@dataclasses.dataclass(frozen=True)
class Stage:
  step: int
  weights: Mapping[str, float]


@dataclasses.dataclass(frozen=True, eq=False)
class Strata:
  """The strata of one dataset's training examples.

  Attributes:
    names: stratum names (`stratum_names`).
    index: [size] stratum index of each example.
    prior: [size] mean reward of each example (its pass rate, for rewards
      of 0 and 1), NaN where unrated; None when it is not to be used as
      the weighted policy's prior (whose history sums rewards too).
  """

  names: tuple[str, ...]
  index: np.ndarray
  prior: np.ndarray | None
  failed: int = 0  # examples unrated: every verifier call of theirs failed

  def counts(self) -> dict[str, int]:
    n = np.bincount(self.index, minlength=len(self.names))
    return dict(zip(self.names, n.tolist()))

  def fingerprint(self) -> str:
    """A hash of each example's stratum and prior."""
    h = hashlib.sha256(np.asarray(self.index, np.int64).tobytes())
    if self.prior is not None:
      h.update(np.asarray(self.prior, np.float64).tobytes())
    return h.hexdigest()[:16]


def notes(strata: Mapping[str, Strata]) -> dict[str, dict[str, Any]]:
  """What a checkpoint notes of each dataset's strata (`changes` reads it)."""
  return {name: {'counts': st.counts(), 'fingerprint': st.fingerprint(),
                 'failed': st.failed}
          for name, st in strata.items()}


def changes(then: Mapping[str, Any] | None, now: Mapping[str, Any] | None,
            *, where: str) -> list[str]:
  """A line for each dataset whose `notes` differ from those of `where`, a
  checkpoint (none noted: nothing to compare). A checkpoint noted before
  examples whose every verifier call failed were left unrated has no
  'failed': where such examples are unrated now, that is a reason too."""
  out = []
  for name, st in (now or {}).items():
    was = (then or {}).get(name)
    if was and was.get('fingerprint') != st['fingerprint']:
      why = ('the pass rates in curriculum.strata were measured again or '
             'completed')
      if 'failed' not in was and st.get('failed'):
        why += (f', or because the {st["failed"]} examples whose every '
                f'verifier call failed are {UNRATED} now, where the version '
                f'that saved it filed them {bands_lib.TOO_HARD}')
      out.append(
          f'dataset {name!r}: its strata changed since the {where} ({why}): '
          f'{_listed(was["counts"])} then, '
          f'{_listed(st["counts"])} now; its examples are offered by the '
          'strata of now')
  return out


def _listed(counts: Mapping[str, int]) -> str:
  return ', '.join(f'{k} {v}' for k, v in counts.items() if v)


class Curriculum:
  """Per-stratum weights by step (module docstring)."""

  def __init__(self, stages: Sequence[Stage]):
    self.stages = tuple(sorted(stages, key=lambda s: s.step))

  def check_datasets(self, names: Sequence[str],
                     stratified: Collection[str] | None = None) -> None:
    """Refuses a 'dataset/stratum' weight key of a dataset not in `names`,
    or not in `stratified` (the datasets with pass rates) when given.

    Raises:
      errors.ConfigError: naming the key (a misspelt dataset, or one that
        was not measured, left its stratum at weight 1 without a word).
    """
    for i, stage in enumerate(self.stages):
      for key in stage.weights:
        dataset = str(key).rsplit('/', 1)[0] if '/' in str(key) else None
        at = f'curriculum.stages[{i}].weights[{key!r}]'
        if dataset is not None and dataset not in names:
          raise errors.ConfigError(
              f'{at}: no dataset {dataset!r} in data.datasets '
              f'({", ".join(names)})')
        if dataset is not None and stratified is not None and (
            dataset not in stratified):
          raise errors.ConfigError(
              f'{at}: dataset {dataset!r} has no strata: curriculum.strata '
              f'has no pass rates of it (it has them of '
              f'{", ".join(sorted(stratified)) or "no dataset of the run"}); '
              f'measure it with jaxgrpo-stratify run --datasets={dataset}')

  def stage_at(self, step: int) -> int:
    """Index of the stage in force at `step`; -1 before the first."""
    at = -1
    for i, stage in enumerate(self.stages):
      if stage.step <= step:
        at = i
    return at

  def weights(self, dataset: str, names: Sequence[str],
              step: int) -> np.ndarray:
    """[len(names)] weights of a dataset's strata at `step`."""
    out = np.ones(len(names))
    at = self.stage_at(step)
    if at < 0:
      return out
    given = self.stages[at].weights
    for i, name in enumerate(names):
      for key in (name, f'{dataset}/{name}'):  # The dataset's own wins.
        if key in given:
          out[i] = float(given[key])
    return out


def match(rates: passrates.PassRates, ids: Sequence[str],
          edges: Sequence[float], *, prior: bool) -> tuple[Strata, int]:
  """Strata of the examples with these ids (by index), from pass rates.

  Returns:
    (strata, number of pass-rate rows whose id is not among `ids`).
  """
  names = stratum_names(edges)
  have = snooze.id_hashes(rates.ids)
  want = snooze.id_hashes(ids)
  order = np.argsort(have, kind='stable')
  sorted_have = have[order]
  at = np.minimum(np.searchsorted(sorted_have, want), max(len(have) - 1, 0))
  found = (sorted_have[at] == want) if len(have) else np.zeros(len(ids), bool)
  rate, mean = np.full(len(ids), np.nan), np.full(len(ids), np.nan)
  rate[found] = rates.pass_rate[order[at[found]]]
  mean[found] = rates.mean_reward[order[at[found]]]
  index = np.full(len(ids), len(names) - 1, np.int64)
  index[found] = bands_lib.assign(rate[found], edges)
  unknown = int((~np.isin(have, want)).sum())
  return Strata(names=names, index=index,
                prior=mean if prior else None), unknown


def _log_failed(log, path: str, name: str, failed: Sequence[str],
                ids: Sequence[str]) -> int:
  """Says how many of the dataset's examples (`ids`) are unrated because
  their every verifier call failed (`PassRates.failed`), naming a few;
  returns how many."""
  named = set(failed)
  failed = [i for i in ids if i in named]
  if failed:
    log(f'curriculum: dataset {name!r}: {len(failed)} examples whose every '
        f'verifier call failed in {path} are {UNRATED}, not '
        f'{bands_lib.TOO_HARD} ({", ".join(failed[:5])}'
        + (', ...' if len(failed) > 5 else '') + '): fix the verifier and '
        'measure them again (jaxgrpo-stratify run into another --out)')
  return len(failed)


def load(
    path: str,
    datasets: Mapping[str, Sequence],
    *,
    edges: Sequence[float],
    checkpoints: Sequence[str] = (),
    prior: bool = True,
    log=_LOG.info,
) -> dict[str, Strata]:
  """Strata of the datasets that have pass rates in `path`.

  Args:
    path: a `jaxgrpo-stratify` output directory.
    datasets: dataset name -> training examples (indexable, `.id` each).
    edges: band edges (`curriculum.bands`).
    checkpoints: tags whose pass rates are pooled; empty: all.
    prior: keep the mean rewards as the weighted policy's prior.
    log: where to report what was matched (and how many examples are
      unrated because every verifier call of theirs failed).

  Raises:
    errors.ConfigError: no dataset of the run has pass rates in `path`.
  """
  path = os.path.expanduser(path)  # '~/strata', as the shell would
  try:
    table = passrates.read(path, checkpoints=list(checkpoints) or None)
  except errors.UserError as e:
    raise errors.ConfigError(f'curriculum.strata={path!r}: {e}') from None
  out = {}
  for name, examples in datasets.items():
    if name not in table:
      log(f'curriculum: dataset {name!r} has no pass rates in {path}; '
          'it is not stratified')
      continue
    measured = passrates.fingerprints(path, name)
    if measured and sources.fingerprint(examples) not in measured:
      log(f'curriculum: dataset {name!r} is not the one its pass rates in '
          f'{path} were measured on (its records differ): they are matched '
          'by example id, which is only right where ids name the same '
          'problems (built-in arithmetic ids are positions); measure it '
          'again with jaxgrpo-stratify run')
    for tag in checkpoints or passrates.layout(path)[name]:
      rows, want = passrates.coverage(path, name, tag)
      if rows < want:
        log(f'curriculum: dataset {name!r}: checkpoint {tag!r} has pass '
            f'rates of {rows} of the {want} examples its jaxgrpo-stratify run '
            f'set out to measure in {path} (interrupted, or shards not run '
            'yet); the others are unrated unless another checkpoint rated '
            'them: the same jaxgrpo-stratify run command finishes it')
    ids = [examples[i].id for i in range(len(examples))]
    strata, unknown = match(table[name], ids, edges, prior=prior)
    strata = dataclasses.replace(strata, failed=_log_failed(
        log, path, name, table[name].failed, ids))
    counts = strata.counts()
    log(f'curriculum: dataset {name!r} strata {_listed(counts)}'
        + (f'; {unknown} pass rates for ids not in the dataset'
           if unknown else ''))
    out[name] = strata
  if not out:
    raise errors.ConfigError(
        f'curriculum.strata={path!r}: none of the datasets '
        f'{sorted(datasets)} has pass rates there (it has {sorted(table)})')
  return out
