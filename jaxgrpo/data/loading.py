"""Builds the mixture's datasets from their config entries, checked.

Each `data.datasets` entry becomes (mixture spec, training source, held-out
examples): the built-in arithmetic generator, or a grain source over JSONL,
ArrayRecord or TFDS records, screened for bad records and over-long prompts
when the config asks for it.
"""

import grain
import numpy as np

from jaxgrpo import config_lib
from jaxgrpo import errors
from jaxgrpo.data import arithmetic
from jaxgrpo.data import mixture
from jaxgrpo.data import screening
from jaxgrpo.data import snooze
from jaxgrpo.data import sources
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.typing import Example


def check_lengths(
    cfg: config_lib.Config,
    tokenizer: tokenizer_lib.Tokenizer,
    examples: list[Example],
) -> None:
  """Fails before compiling when prompts or answers cannot fit.

  A prompt longer than the context is an error only with
  rollout.long_prompts='error': 'truncate' cuts it when it is encoded, and
  'drop' left it out when its dataset was loaded.
  """
  max_len = cfg.rollout.max_prompt_len
  if cfg.rollout.long_prompts == 'error':
    lengths = [1 + len(tokenizer.encode(ex.prompt)) for ex in examples]
    longest = int(np.argmax(lengths))
    if lengths[longest] > max_len:
      raise errors.ConfigError(
          f'rollout.max_prompt_len={max_len}: example '
          f'{examples[longest].id} has a prompt of {lengths[longest]} tokens '
          '(BOS included; the longest checked); raise it, or set '
          "rollout.long_prompts to 'truncate' or 'drop'"
      )
  answer_len = 1 + max(len(tokenizer.encode(ex.answer)) for ex in examples)
  if answer_len > cfg.rollout.max_new_tokens:
    raise errors.ConfigError(
        f'rollout.max_new_tokens={cfg.rollout.max_new_tokens}: the task has '
        f'answers of {answer_len} tokens (EOS included), which could never '
        'be generated in full; raise it'
    )


PEEK = 20_000


def peek(dataset) -> list[Example]:
  """The first examples of a dataset (length checks, warm start)."""
  return [dataset[i] for i in range(min(len(dataset), PEEK))]


def policy_config(cfg: config_lib.Config, entry) -> snooze.PolicyConfig:
  """The snooze policy of one dataset entry (its own N, else the sampler's)."""
  s = cfg.sampler
  return snooze.PolicyConfig(
      policy=s.policy,
      snooze_factor=entry.snooze_factor or s.snooze_factor,
      snooze_hard_factor=s.snooze_hard_factor,
      easy_threshold=cfg.rollout.easy_threshold,
      hard_threshold=cfg.rollout.hard_threshold,
      group_size=cfg.rollout.group_size,
      w_min=s.w_min,
      prior_strength=s.prior_strength,
      prior_mean=s.prior_mean,
  )


def load_dataset(
    cfg: config_lib.Config, entry, tokenizer: tokenizer_lib.Tokenizer
):
  """(mixture spec, training source, held-out examples) of one dataset.

  `on_bad_record='skip'` leaves bad records out, and
  rollout.long_prompts='drop' examples whose prompt does not fit the
  context: either reads every record once here, logs what it left out and
  counts it in the spec (the held-out set's removals are logged only).
  Otherwise records are read when first used, and a bad one raises there.
  """
  if entry.kind == 'arithmetic':
    problems = arithmetic.ArithmeticSpec(
        min_digits=entry.min_digits, max_digits=entry.max_digits,
        ops=entry.ops, carries=entry.carries, seed=entry.seed)
    train, held = arithmetic.split_train_eval(
        problems, entry.num_train, entry.num_eval, name=entry.name)
    train = grain.MapDataset.source(train)
  else:
    fields = sources.RecordFields(
        prompt=entry.prompt_field, answer=entry.answer_field,
        id=entry.id_field, subset=entry.subset_field, template=entry.template)
    if entry.kind == 'tfds':
      def load(split):
        return sources.make_dataset(
            'tfds', name=entry.name, fields=fields, tfds_name=entry.tfds_name,
            split=split, data_dir=entry.data_dir)
      train = load(entry.split)
      held = load(entry.eval_split) if entry.eval_split else None
    else:
      def load(path):
        return sources.make_dataset(entry.kind, name=entry.name, path=path,
                                    fields=fields)
      train = load(entry.path)
      held = load(entry.eval_path) if entry.eval_path else None

  max_len = cfg.rollout.max_prompt_len

  def too_long(example: Example) -> str | None:
    n = 1 + len(tokenizer.encode(example.prompt))
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
      raise errors.UserError(
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
