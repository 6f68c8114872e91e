"""Builds the mixture's datasets from their config entries, checked.

Each `data.datasets` entry becomes (mixture spec, training source, held-out
examples): the built-in arithmetic generator, or a grain source over JSONL,
ArrayRecord or TFDS records or a GSM8K / SQuAD 2.0 file as shipped, screened
for bad records and over-long prompts when the config asks for it. The
held-out examples come from eval_path / eval_split, or are `holdout` records
of the training file that training then never sees.
"""

import dataclasses
import logging
import os

import grain
import numpy as np

from jaxgrpo import checks
from jaxgrpo import config_lib
from jaxgrpo import errors
from jaxgrpo import example as example_lib
from jaxgrpo.data import arithmetic
from jaxgrpo.data import formats
from jaxgrpo.data import mixture
from jaxgrpo.data import screening
from jaxgrpo.data import snooze
from jaxgrpo.data import sources
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.example import Example

_LOG = logging.getLogger(__name__)  # `jaxgrpo.*`: the CLIs show them


def check_lengths(
    cfg: config_lib.Config,
    tokenizer: tokenizer_lib.Tokenizer,
    examples: list[Example],
) -> None:
  """Fails before compiling when prompts or answers cannot fit.

  A prompt longer than the context is an error only with
  rollout.long_prompts='error': 'truncate' cuts it when it is encoded (a
  warning gives the share of the examples checked that it cuts), and 'drop'
  left it out when its dataset was loaded.
  """
  # One encoding per prompt and answer: a text the tokenizer cannot encode
  # is named here, and the lengths serve both checks below.
  prompt_lengths, answer_lengths = [], []
  for ex in examples:
    what = 'prompt'
    try:
      prompt_lengths.append(len(tokenizer_lib.prompt_ids(tokenizer, ex.prompt)))
      what = 'answer'
      answer_lengths.append(answer_tokens(tokenizer, ex))
      if example_lib.shortest_answer(ex) != ex.answer:
        tokenizer.encode(ex.answer)
    except errors.UserError:
      raise  # e.g. a chat template that fails: its own message
    except ValueError as e:
      # A checkpoint's own tokenizer (jaxgrpo-eval), whatever the flag says.
      theirs = (cfg.model.tokenizer == 'byte'
                and not isinstance(tokenizer, tokenizer_lib.ByteTokenizer))
      raise errors.ConfigError(
          f'model.tokenizer={cfg.model.tokenizer!r}: the {what} of example '
          f'{ex.id} (dataset {ex.dataset!r}) cannot be encoded ({e}); ' + (
              "the checkpoint's own tokenizer is used, whatever "
              'model.tokenizer says: evaluate a model trained with '
              "model.tokenizer='byte'" if theirs else
              "model.tokenizer='byte' encodes any text")) from None
  max_len = cfg.rollout.max_prompt_len
  if cfg.rollout.long_prompts == 'error':
    longest = int(np.argmax(prompt_lengths))
    if prompt_lengths[longest] > max_len:
      raise errors.ConfigError(
          f'rollout.max_prompt_len={max_len}: example '
          f'{examples[longest].id} has a prompt of {prompt_lengths[longest]} '
          'tokens (BOS included; the longest checked); raise it, or set '
          "rollout.long_prompts to 'truncate' or 'drop'"
      )
  cut = np.array(prompt_lengths) > max_len
  if cfg.rollout.long_prompts == 'truncate' and cut.any():
    _LOG.warning(
        'rollout.max_prompt_len=%d: %d of the %d examples checked (%.1f%%) '
        'have longer prompts (up to %d tokens), which '
        "rollout.long_prompts='truncate' cuts from the start", max_len,
        int(cut.sum()), len(examples), 100 * cut.mean(), max(prompt_lengths))
  limit = cfg.rollout.max_new_tokens
  lengths = np.array(answer_lengths)
  too_long = lengths > limit
  if too_long.mean() > MAX_UNREACHABLE:
    need = int(np.quantile(lengths, 1.0 - MAX_UNREACHABLE, method='higher'))
    worst = examples[int(np.argmax(lengths))]
    raise errors.ConfigError(
        f'rollout.max_new_tokens={limit}: {int(too_long.sum())} of the '
        f'{len(examples)} examples checked have no answer that fits (EOS '
        f'included; the longest, {worst.id}, needs {lengths.max()} tokens), '
        f'so they could never be answered in full; raise it to {need} or '
        'more'
    )
  if too_long.any():
    _LOG.warning(
        'rollout.max_new_tokens=%d: %d of the %d examples checked (%.1f%%) '
        'have no answer that fits; they can score only 0 (under %.0f%% '
        'is allowed)', limit, int(too_long.sum()), len(examples),
        100 * too_long.mean(), 100 * MAX_UNREACHABLE)


def check_ids(examples: list[Example]) -> None:
  """Fails when two different examples of a dataset share an id.

  The sampler matches outcomes to draws, and checkpoint.on_dataset_change=
  'remap' matches state to examples, by id. Training and held-out examples
  are checked apart: those of an `eval_path` file may reuse the training
  file's ids (`<name>/<index>`, or verl's `extra_info.index`). (Equal
  examples may share one: GSM8K's ids hash question and final answer, so a
  duplicate record repeats its id harmlessly, its worked solution, which
  nothing trains on, the same or not: augmented data gives a question
  several.)
  """
  seen: dict[tuple[str, str], Example] = {}
  plain = lambda ex: dataclasses.replace(ex, meta={
      k: v for k, v in ex.meta.items() if k != 'solution'})
  for ex in examples:
    first = seen.setdefault((ex.dataset, ex.id), ex)
    if first is not ex and first != ex and plain(first) != plain(ex):
      raise errors.DataError(
          f'dataset {ex.dataset!r}: two different examples have the id '
          f'{ex.id!r} (prompts {first.prompt[:40]!r} and {ex.prompt[:40]!r});'
          ' ids must be unique in a dataset: check its id_field')


def held_out_overlap(trained: list[Example], held_out: list[Example],
                     checked_all: bool) -> list[str]:
  """Notices for held-out prompts that are training prompts too (an
  `eval_path` overlapping `path`, one file in two datasets of a mixture).

  Args:
    trained: the training examples read at the start, of every dataset.
    held_out: the held-out examples of every dataset.
    checked_all: whether `trained` holds every training example.

  Returns:
    One line per dataset whose held-out set shares prompts with training.
  """
  where = {}
  for ex in trained:
    where.setdefault(ex.prompt, ex)
  shared: dict[str, list[tuple[Example, Example]]] = {}
  for ex in held_out:
    if ex.prompt in where:
      shared.setdefault(ex.dataset, []).append((ex, where[ex.prompt]))
  lines = []
  for name, pairs in shared.items():
    total = sum(ex.dataset == name for ex in held_out)
    ex, twin = pairs[0]
    lines.append(
        f'dataset {name!r}: {len(pairs)} of its {total} held-out prompts '
        f'are training prompts too (e.g. {ex.id}, trained as {twin.id} of '
        f'dataset {twin.dataset!r}' + (
            '' if checked_all else
            f'; of the first {PEEK:,} training examples of each dataset') +
        '): its eval/accuracy counts them; give held-out records that '
        'training does not hold')
  return lines


# Share of examples whose every acceptable answer is longer than
# rollout.max_new_tokens that is tolerated (long-tailed QA answers).
MAX_UNREACHABLE = 0.05


def answer_tokens(tokenizer: tokenizer_lib.Tokenizer, example: Example) -> int:
  """Tokens of the example's shortest acceptable answer, EOS included."""
  return 1 + len(tokenizer.encode(example_lib.shortest_answer(example)))


PEEK = 20_000


def peek(dataset) -> list[Example]:
  """The first examples of a dataset (length checks, warm start)."""
  return [dataset[i] for i in range(min(len(dataset), PEEK))]


def policy_config(cfg: config_lib.Config, entry) -> snooze.PolicyConfig:
  """The snooze policy of one dataset entry (its own N, else the sampler's)."""
  ro = cfg.rollout
  return snooze.PolicyConfig(**{
      **checks.values(cfg.sampler),
      'snooze_factor': entry.snooze_factor or cfg.sampler.snooze_factor,
      'easy_threshold': ro.easy_threshold,
      'hard_threshold': ro.hard_threshold, 'group_size': ro.group_size})


def _record_format(entry) -> formats.RecordFormat:
  """The record format of a file or TFDS dataset entry."""
  name = entry.format or formats.default_format(entry.kind, entry.tfds_name)
  keys = {'prompt': entry.prompt_field, 'answer': entry.answer_field,
          'id': entry.id_field, 'subset': entry.subset_field}
  if name != 'fields':  # The config checked that the *_field keys are unset.
    keys = {}
  try:
    return formats.make_format(name, template=entry.template, **keys)
  except ValueError as e:
    raise errors.ConfigError(
        f'dataset {entry.name!r}: template={entry.template!r}: {e}') from e


def _file_error(cfg: config_lib.Config, entry, key: str, path: str,
                e: Exception) -> errors.DataError:
  """A dataset file that cannot be opened or holds no records, in one line
  naming the entry's key and the file."""
  if isinstance(e, OSError):
    why = e.strerror or str(e)
    why = 'no such file' if isinstance(e, FileNotFoundError) else why
    if e.filename and os.path.abspath(e.filename) != os.path.abspath(
        os.path.expanduser(path)):  # one of a glob's matches
      why = f'{e.filename}: {why}'
  elif 'has no records' in str(e):
    why = 'the file has no records'
  else:
    why = str(e)
  return errors.DataError(
      f'{_entry_key(cfg, entry)}.{key}={path!r} (dataset {entry.name!r}): '
      f'{why}')


class _Labelled:
  """A dataset whose bad records name the config entry they belong to
  (`data.datasets[1] (dataset 'qa'): FILE:LINE: ...`): one file may serve
  several entries, with different fields or templates."""

  def __init__(self, ds: grain.MapDataset, label: str, name: str):
    self._ds, self._label, self._name = ds, label, name

  def __len__(self) -> int:
    return len(self._ds)

  def __getitem__(self, index: int) -> Example:
    try:
      return self._ds[index]
    except sources.BadRecordError as e:
      # Messages that name the dataset already get the key alone.
      label = self._label
      if f'dataset {self._name!r}' not in str(e):
        label += f' (dataset {self._name!r})'
      raise sources.BadRecordError(f'{label}: {e}') from e

  def __repr__(self) -> str:
    return f'_Labelled({self._label}: {self._ds!r})'


def _entry_key(cfg: config_lib.Config, entry) -> str:
  """The config key of a dataset entry: 'data.datasets[1]'."""
  names = [d.name for d in cfg.data.datasets]
  return f'data.datasets[{names.index(entry.name)}]'


def _labelled(cfg: config_lib.Config, entry,
              ds: grain.MapDataset) -> grain.MapDataset:
  return grain.MapDataset.source(
      _Labelled(ds, _entry_key(cfg, entry), entry.name))


def load_dataset(
    cfg: config_lib.Config, entry, tokenizer: tokenizer_lib.Tokenizer
):
  """(mixture spec, training source, held-out examples) of one dataset.

  `on_bad_record='skip'` leaves bad records out, and
  rollout.long_prompts='drop' examples whose prompt does not fit the
  context: either reads every record once here, logs what it left out and
  counts it in the spec (the held-out set's removals are logged only).
  Otherwise records are read when first used, and a bad one raises there.
  With `holdout`, the held-out records are chosen by position before any
  screening, so the split does not depend on which records are bad.

  Length: one dispatch over the entry's kind, then the held-out split; each
  branch is a few lines.

  Raises:
    errors.ConfigError: `holdout` is not below the number of records, or
      the entry's field keys or template do not fit its record format.
  """
  if entry.kind == 'arithmetic':
    problems = arithmetic.ArithmeticSpec(
        min_digits=entry.min_digits, max_digits=entry.max_digits,
        ops=entry.ops, carries=entry.carries, seed=entry.seed,
        unanswerable=entry.unanswerable)
    try:
      train, held = arithmetic.split_train_eval(
          problems, entry.num_train, entry.num_eval, name=entry.name,
          template=entry.template)
    except ValueError as e:  # more problems than the digit range holds
      raise errors.ConfigError(
          f'{_entry_key(cfg, entry)}.num_eval={entry.num_eval} (dataset '
          f'{entry.name!r}): {e}') from None
    train = grain.MapDataset.source(train)
  else:
    record_format = _record_format(entry)
    if entry.kind == 'tfds':
      def load(split, key):
        try:
          return sources.make_dataset(
              'tfds', name=entry.name, record_format=record_format,
              tfds_name=entry.tfds_name, split=split, data_dir=entry.data_dir)
        except errors.UserError:
          raise
        except (OSError, ValueError) as e:  # one line naming the key
          if not isinstance(e, sources.TfdsSplitError):
            key, split = 'tfds_name', entry.tfds_name
          raise _file_error(cfg, entry, key, split, e) from None
      train = load(entry.split, 'split')
      held = load(entry.eval_split, 'eval_split') if entry.eval_split else None
    else:
      def load(path, key):
        try:
          return sources.make_dataset(entry.kind, name=entry.name, path=path,
                                      record_format=record_format)
        except sources.BadRecordError as e:  # a file read whole (SQuAD's)
          raise sources.BadRecordError(
              f'{_entry_key(cfg, entry)}.{key} (dataset {entry.name!r}): '
              f'{e}') from None
        except (OSError, ValueError) as e:
          raise _file_error(cfg, entry, key, path, e) from None
      train = load(entry.path, 'path')
      held = load(entry.eval_path, 'eval_path') if entry.eval_path else None
    train = _labelled(cfg, entry, train)
    held = _labelled(cfg, entry, held) if held is not None else None
    if entry.holdout:
      if entry.holdout >= len(train):
        raise errors.ConfigError(
            f'dataset {entry.name!r}: holdout={entry.holdout} must be less '
            f'than the number of its records ({len(train)})')
      train, held = sources.split_holdout(train, entry.holdout)

  max_len = cfg.rollout.max_prompt_len

  def too_long(example: Example) -> str | None:
    n = len(tokenizer_lib.prompt_ids(tokenizer, example.prompt))
    if n <= max_len:
      return None
    return (f'{example.id}: prompt of {n} tokens (BOS included) > '
            f'rollout.max_prompt_len={max_len}')

  skip_bad = entry.on_bad_record == 'skip'
  reject = too_long if cfg.rollout.long_prompts == 'drop' else None
  skipped = dropped = 0
  if skip_bad or reject:
    train, report = screening.screen(
        train, name=entry.name, skip_bad=skip_bad, reject=reject)
    skipped, dropped = report.skipped, report.dropped
    if not report.kept:
      raise errors.DataError(
          f'dataset {entry.name!r}: none of its {report.scanned} records is '
          f'left ({skipped} bad records skipped, {dropped} prompts longer '
          f'than rollout.max_prompt_len={max_len} dropped)')
    if held is not None:
      held, _ = screening.screen(
          held, name=f'{entry.name} (held-out)', skip_bad=skip_bad,
          reject=reject, limit=entry.num_eval)
  held_out = ([held[i] for i in range(min(len(held), entry.num_eval))]
              if held is not None else [])
  spec = mixture.DatasetSpec(
      name=entry.name, weight=entry.weight, policy=policy_config(cfg, entry),
      min_fraction=entry.min_fraction, skipped_records=skipped,
      dropped_long=dropped)
  return spec, train, held_out
