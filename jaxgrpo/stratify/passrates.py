"""Per-example pass rates on disk: Parquet parts and a JSON summary.

An output directory OUT holds

    OUT/summary.json
    OUT/parts/<dataset>/<tag>/shard-<i:05d>-of-<n:05d>-part-<c:05d>.parquet

Each part holds the examples of chunk c of shard i (of n) of a dataset's
training examples, sampled under the checkpoint labelled <tag>, with columns

    id           string   the example's stable id
    k            int32    completions scored: sampled, less those whose
                          verifier call failed (all K when every call failed)
    passes       int32    completions whose reward reached the threshold
    mean_reward  float32  mean reward of the k completions

and, in its schema metadata (key `jaxgrpo.stratify`), JSON describing how it
was made: the checkpoint spec, K, seed, threshold, sampling settings, config
file, dataset size and fingerprint, sharding and chunking, its verifier
calls and failures (`verify`: counts, the number of examples where some
calls failed, and the ids of the examples whose every call failed) and its
`format` (`FORMAT`; none: 1), which readers of an older one refuse. Parts
are written to a `*.tmp` file and renamed, so a part that reads is
complete; the summary is rebuilt from the parts alone (`write_summary`).

Readers need only numpy and pyarrow: `read` pools the rates of any selection
of checkpoints, keyed by dataset. A row whose every verifier call failed (in
its part's `verify.all_failed`) measured the verifier, not the model: `read`
leaves it out, so such an example has no pass rate from that checkpoint
(`PassRates.failed` names those that have none from any).

Size: the one definition of the format: its writer, the checks that every
reader makes (format, columns, rows, thresholds) and the readers that pool
and summarise it, so that reading pass rates needs this module alone.
"""

from collections.abc import Callable, Mapping, Sequence
import dataclasses
import itertools
import json
import os
import re
from typing import Any
import unicodedata
import uuid

import numpy as np

from jaxgrpo import errors

SUMMARY = 'summary.json'
PARTS = 'parts'
METADATA_KEY = b'jaxgrpo.stratify'
FORMAT = 1  # of the parts and summary; raised when their meaning changes
_PART = re.compile(r'^shard-(\d{5,})-of-(\d{5,})-part-(\d{5,})\.parquet$')


def _arrow():
  """(pyarrow, pyarrow.parquet); imported on use, so that training, which
  imports this module, needs pyarrow only when it reads pass rates."""
  try:
    # pylint: disable=g-import-not-at-top
    import pyarrow
    import pyarrow.parquet
  except ImportError:
    raise errors.UserError(
        'pass-rate files are Parquet: pip install pyarrow') from None
  return pyarrow, pyarrow.parquet


def schema():
  """The pyarrow schema of a part file."""
  pa, _ = _arrow()
  return pa.schema([
      ('id', pa.string()),
      ('k', pa.int32()),
      ('passes', pa.int32()),
      ('mean_reward', pa.float32()),
  ])


@dataclasses.dataclass(frozen=True)
class PassRates:
  """Pass rates of one dataset's examples, pooled over checkpoints.

  Attributes:
    ids: [E] example ids, sorted.
    trials: [E] int64, completions scored (summed over checkpoints): those
      whose verifier call failed do not count.
    passes: [E] int64, completions that passed (summed).
    mean_reward: [E] float64, mean reward per completion (trial-weighted).
    failed: sorted ids of the examples whose every verifier call failed
      under each pooled checkpoint that measured them: they have no row
      (their pass rate of 0 would measure the verifier, not the model).
  """

  ids: list[str]
  trials: np.ndarray
  passes: np.ndarray
  mean_reward: np.ndarray
  failed: tuple[str, ...] = ()

  @property
  def pass_rate(self) -> np.ndarray:
    """[E] float64, passes / trials."""
    return np.asarray(self.passes, np.float64) / np.asarray(self.trials)


def part_name(shard: int, num_shards: int, part: int) -> str:
  return f'shard-{shard:05d}-of-{num_shards:05d}-part-{part:05d}.parquet'


def tag_dir(out_dir: str, dataset: str, tag: str) -> str:
  return os.path.join(out_dir, PARTS, dataset, tag)


def _kept(char: str) -> bool:
  """Letters and digits of any script, the marks that combine with them (an
  accent, a Devanagari vowel sign) and `._+-`."""
  return (char.isalnum() or char in '._+-'
          or unicodedata.category(char).startswith('M'))


def file_name(label: str) -> str:
  """`label` as one file name component (a tag's folder): each run of the
  characters `_kept` leaves out (a space, `/`, `:`, an emoji) is one
  `_`; no leading dot. '数学-step3' stays as it is: a file name may hold any
  letters, and two workdirs named in another script keep distinct tags."""
  runs = itertools.groupby(label, _kept)
  out = ''.join(''.join(chars) if kept else '_' for kept, chars in runs)
  return out.lstrip('.')


def atomic_write(path: str, write: Callable[[str], None]) -> None:
  """Calls `write(tmp)` on a unique `*.tmp` path, then renames it to `path`.

  A process killed midway leaves at most the tmp file, which no reader
  takes for a result.
  """
  tmp = f'{path}.{uuid.uuid4().hex[:8]}.tmp'
  try:
    write(tmp)
    with open(tmp, 'rb') as f:
      os.fsync(f.fileno())
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def write_part(
    out_dir: str,
    dataset: str,
    tag: str,
    *,
    shard: int,
    num_shards: int,
    part: int,
    ids: Sequence[str],
    k: np.ndarray,
    passes: np.ndarray,
    mean_reward: np.ndarray,
    info: Mapping[str, Any],
) -> str:
  """Writes one part atomically and returns its path.

  Args:
    out_dir: the output directory.
    dataset: dataset name.
    tag: checkpoint tag.
    shard: this shard's index.
    num_shards: number of shards.
    part: chunk index within the shard.
    ids: [E] example ids.
    k: [E] completions scored per example (sampled, less failed calls).
    passes: [E] completions that passed.
    mean_reward: [E] mean reward per example.
    info: JSON-serialisable description stored in the schema metadata.
  """
  pa, pq = _arrow()
  directory = tag_dir(out_dir, dataset, tag)
  os.makedirs(directory, exist_ok=True)
  table = pa.table({
      'id': pa.array(list(ids), pa.string()),
      'k': pa.array(np.asarray(k, np.int32)),
      'passes': pa.array(np.asarray(passes, np.int32)),
      'mean_reward': pa.array(np.asarray(mean_reward, np.float32)),
  }, schema=schema().with_metadata(
      {METADATA_KEY: json.dumps({'format': FORMAT, **info})}))
  path = os.path.join(directory, part_name(shard, num_shards, part))
  atomic_write(path, lambda tmp: pq.write_table(table, tmp))
  return path


def list_parts(out_dir: str, dataset: str,
               tag: str) -> dict[tuple[int, int, int], str]:
  """(shard, num_shards, part) -> path of each complete part file."""
  directory = tag_dir(out_dir, dataset, tag)
  out = {}
  for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else ():
    match = _PART.match(name)
    if match:
      out[tuple(int(g) for g in match.groups())] = os.path.join(directory, name)
  return out


def part_info(path: str) -> dict[str, Any]:
  """The JSON description stored with a part, and its row count as 'rows'.

  Raises:
    errors.UserError: the file is not a readable part.
  """
  pa, pq = _arrow()
  try:
    meta = pq.read_metadata(path)
    info = json.loads((meta.schema.to_arrow_schema().metadata or {})
                      .get(METADATA_KEY, b'{}'))
  except (OSError, pa.ArrowException, ValueError) as e:
    raise errors.UserError(f'{path}: not a readable pass-rate part ({e})'
                           ) from None
  form = info.get('format', 1)
  if not isinstance(form, int) or form > FORMAT:
    raise errors.UserError(
        f'{path}: written by a later jaxgrpo-stratify (format '
        f'{form!r}; this version reads format {FORMAT}): read it '
        'with that version, or measure again with this one')
  _check_verify(path, info.get('verify'))
  return {**info, 'rows': meta.num_rows}


def _check_verify(path: str, verify: Any) -> None:
  """Raises UserError naming the key when a part's `verify` description
  is not what `write_part` writes: a dict of counts (ints >= 0) and
  `all_failed`, a list of example ids. Parts written before the counts
  have none."""
  if verify is None:
    return
  where = f'{path}: its {METADATA_KEY.decode()} metadata\'s verify'
  if not isinstance(verify, dict):
    raise errors.UserError(f'{where} must be a dict of verifier counts, got '
                           f'{verify!r}')
  for key, value in verify.items():
    if key == 'all_failed':
      if not isinstance(value, list) or not all(
          isinstance(i, str) for i in value):
        raise errors.UserError(f'{where}.all_failed must be a list of '
                               f'example ids, got {value!r}')
    elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
      raise errors.UserError(f'{where}.{key} must be a count (an int >= 0), '
                             f'got {value!r}')


def layout(out_dir: str) -> dict[str, list[str]]:
  """Dataset -> sorted tags with at least one part in `out_dir`."""
  root = os.path.join(out_dir, PARTS)
  out = {}
  for dataset in sorted(os.listdir(root)) if os.path.isdir(root) else ():
    tags = [t for t in sorted(os.listdir(os.path.join(root, dataset)))
            if list_parts(out_dir, dataset, t)]
    if tags:
      out[dataset] = tags
  return out


def fingerprints(out_dir: str, dataset: str) -> set[str]:
  """The fingerprints of the records `dataset`'s parts were measured on."""
  infos = [part_info(path) for tag in layout(out_dir).get(dataset, ())
           for path in list_parts(out_dir, dataset, tag).values()]
  return {str(info['fingerprint']) for info in infos if 'fingerprint' in info}


def coverage(out_dir: str, dataset: str, tag: str) -> tuple[int, int]:
  """(rows, examples): the pass rates that `tag`'s parts of `dataset` hold,
  and the examples its `jaxgrpo-stratify run` set out to measure (fewer
  rows: that run was interrupted, or some of its shards have not run)."""
  infos = [part_info(path)
           for path in list_parts(out_dir, dataset, tag).values()]
  return (sum(info['rows'] for info in infos),
          max((int(info.get('examples', 0)) for info in infos), default=0))


def tags(out_dir: str) -> list[str]:
  """Every checkpoint tag with pass rates in `out_dir`, sorted."""
  return sorted({t for ts in layout(out_dir).values() for t in ts})


def _read_tag(out_dir: str, dataset: str, tag: str):
  """((ids, k, passes, mean_reward) of one tag, each id once (the first),
  the pass threshold its first part was measured with, the ids left out
  because their part names them in `verify.all_failed`)."""
  pa, pq = _arrow()
  tables, infos, failed = [], [], []
  for path in list_parts(out_dir, dataset, tag).values():
    infos.append(part_info(path))  # its format checked
    try:
      tables.append(pq.read_table(path, schema=schema()))
    except (OSError, pa.ArrowException) as e:
      raise errors.UserError(
          f'{path}: not a readable pass-rate part ({e})') from None
    _check_rows(path, tables[-1])
    # Parts written before the verifier counts have no `verify`.
    named = {str(i) for i in
             (infos[-1].get('verify') or {}).get('all_failed') or ()}
    failed.append(np.isin(np.asarray(tables[-1]['id'].to_pylist(), object),
                          list(named)))
  table = pa.concat_tables(tables)
  ids = np.asarray(table['id'].to_pylist(), dtype=object)
  failed = np.concatenate(failed)
  _, first = np.unique(ids[~failed], return_index=True)
  keep = np.flatnonzero(~failed)[np.sort(first)]
  return (ids[keep], table['k'].to_numpy()[keep],
          table['passes'].to_numpy()[keep],
          table['mean_reward'].to_numpy()[keep]), infos[0].get(
              'success_threshold'), set(ids[failed].tolist())


def _check_rows(path: str, table) -> None:
  """Raises UserError naming the first row of a part that is no pass rate:
  k < 1, passes outside [0, k] or a mean reward outside [0, 1]; or a column
  the file lacks (read as empty)."""
  empty = [c for c in table.column_names if table[c].null_count]
  if empty:
    raise errors.UserError(
        f'{path}: no values in column {empty[0]!r} (a pass-rate part has '
        f'the columns {", ".join(table.column_names)}, each in every row)')
  k, passes = table['k'].to_numpy(), table['passes'].to_numpy()
  reward = table['mean_reward'].to_numpy().astype(np.float64)
  bad = np.flatnonzero((k < 1) | (passes < 0) | (passes > k)
                       | ~((reward >= 0) & (reward <= 1)))
  if bad.size:
    i = int(bad[0])
    raise errors.UserError(
        f'{path}: row {i} (id {table["id"][i].as_py()!r}) is no pass rate: '
        f'k={k[i]}, passes={passes[i]}, mean_reward={reward[i]:g} (needs k '
        '>= 1, 0 <= passes <= k and a mean reward in [0, 1])')


def _check_thresholds(out_dir: str, dataset: str,
                      pooled: Mapping[str, float | None]) -> None:
  """Raises UserError when two of the `pooled` tags (tag -> threshold)
  counted a pass at different rewards (`jaxgrpo-stratify run
  --threshold`)."""
  first = {}  # threshold -> the first tag measured with it
  for tag, threshold in pooled.items():
    first.setdefault(threshold, tag)
  first.pop(None, None)
  if len(first) > 1:
    (x, one), (y, other) = list(first.items())[:2]
    raise errors.UserError(
        f'{out_dir}: dataset {dataset!r}: checkpoint {one!r} counted a pass '
        f'at reward >= {x:g}, {other!r} at >= {y:g} (jaxgrpo-stratify run '
        '--threshold): their pass rates do not pool; pick the tags of one '
        'threshold (curriculum.checkpoints, jaxgrpo-stratify report '
        '--checkpoint) or measure again')


def _no_pass_rates(out_dir: str) -> errors.UserError:
  return errors.UserError(
      f'{out_dir}: no pass rates there (no {PARTS}/<dataset>/<tag>/'
      '*.parquet files); write them with `jaxgrpo-stratify run '
      f'--out={out_dir}`')


def read(
    out_dir: str, *, checkpoints: Sequence[str] | None = None
) -> dict[str, PassRates]:
  """Pass rates per dataset, pooled over the selected checkpoint tags.

  Rows repeated for the same (tag, id) count once. Rows whose every
  verifier call failed (their part's `verify.all_failed`) are left out:
  such an example keeps the rates of the other checkpoints, or has none
  (`PassRates.failed`).

  Args:
    out_dir: a `jaxgrpo-stratify` output directory.
    checkpoints: tags to pool (see `tags`); None: all.

  Returns:
    Dataset name -> its pass rates (datasets that any selected tag has).

  Raises:
    errors.UserError: `out_dir` holds no pass rates, or not for a selected
      tag.
  """
  found = layout(out_dir)
  if not found:
    raise _no_pass_rates(out_dir)
  known = sorted({t for ts in found.values() for t in ts})
  selected = known if checkpoints is None else list(dict.fromkeys(checkpoints))
  unknown = [t for t in selected if t not in known]
  if unknown or not selected:
    what = (f'no pass rates of checkpoint tag {unknown[0]!r}' if unknown
            else 'an empty selection of checkpoint tags')
    raise errors.UserError(
        f'{out_dir}: {what} (tags there: {", ".join(known)})')
  out = {}
  for dataset, dataset_tags in found.items():
    parts = {t: _read_tag(out_dir, dataset, t) for t in selected
             if t in dataset_tags}
    if not parts:
      continue
    _check_thresholds(out_dir, dataset, {
        t: threshold for t, (_, threshold, _) in parts.items()})
    ids, k, passes, reward = (
        np.concatenate(x) for x in zip(*(rows for rows, _, _ in
                                         parts.values())))
    unique, inverse = np.unique(ids, return_inverse=True)
    n = len(unique)
    k = k.astype(np.int64)
    trials = np.bincount(inverse, weights=k, minlength=n).astype(np.int64)
    reward_sum = np.bincount(inverse, weights=reward.astype(np.float64) * k,
                             minlength=n)
    out[dataset] = PassRates(
        ids=[str(i) for i in unique],
        trials=trials,
        passes=np.bincount(inverse, weights=passes.astype(np.int64),
                           minlength=n).astype(np.int64),
        mean_reward=reward_sum / np.maximum(trials, 1),
        failed=tuple(sorted(
            set().union(*(f for _, _, f in parts.values()))
            - set(unique.tolist()))))
  return out


# Keys of a part's description that describe its checkpoint tag as a whole.
TAG_KEYS = ('spec', 'policy', 'weights', 'config', 'k', 'seed',
            'success_threshold', 'sampling')


def _add_verify(total: dict[str, Any], part: Mapping[str, Any] | None
                ) -> None:
  """Adds a part's `verify` description (its verifier calls, their counts
  and the ids of the examples whose every call failed) to `total`."""
  if not part:
    return
  for key, value in part.items():
    if key == 'all_failed':
      total['all_failed'] = sorted({*total.get('all_failed', ()), *value})
    else:
      total[key] = total.get(key, 0) + int(value)


def summarize(out_dir: str) -> dict[str, Any]:
  """The summary of `out_dir`'s parts (see `write_summary`)."""
  _, pq = _arrow()
  found = layout(out_dir)
  if not found:
    raise _no_pass_rates(out_dir)
  checkpoints, datasets = {}, {}
  for dataset, dataset_tags in found.items():
    entry = {'examples': 0, 'done': {}}
    for tag in dataset_tags:
      paths = list_parts(out_dir, dataset, tag)
      info = part_info(next(iter(paths.values())))
      checkpoints.setdefault(tag, {key: info.get(key) for key in TAG_KEYS})
      checkpoints[tag].setdefault('datasets', {})[dataset] = {
          'num_shards': info.get('num_shards'), 'chunk': info.get('chunk')}
      ids, verify = set(), {}
      for path in paths.values():
        ids.update(pq.read_table(path, columns=['id'])['id'].to_pylist())
        described = part_info(path)
        entry['examples'] = max(entry['examples'],
                                int(described.get('examples', 0)))
        _add_verify(verify, described.get('verify'))
      entry['done'][tag] = len(ids)
      if verify:  # parts written before the counts have none
        entry.setdefault('verify', {})[tag] = verify
    datasets[dataset] = entry
  return {'format': FORMAT, 'checkpoints': dict(sorted(checkpoints.items())),
          'datasets': datasets}


def write_summary(out_dir: str) -> dict[str, Any]:
  """Rebuilds `OUT/summary.json` from the part files and returns it.

  The summary maps each checkpoint tag to its spec, K, seed, success
  threshold and config file, and each dataset to its number of examples,
  the examples done per tag and, per tag, its verifier counts (`verify`:
  calls, errors, timeouts, printed, workers_replaced, partly_failed (the
  examples where some calls failed: their rates count the others), and
  `all_failed`,
  the ids of the examples whose every call failed, whose pass rate of 0
  measures the verifier). Any process may rewrite it at any time.
  """
  summary = summarize(out_dir)

  def write(tmp: str) -> None:
    with open(tmp, 'w') as f:
      json.dump(summary, f, indent=2)
      f.write('\n')

  atomic_write(os.path.join(out_dir, SUMMARY), write)
  return summary
