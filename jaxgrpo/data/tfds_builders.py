r"""Local TFDS builders of GSM8K and SQuAD 2.0 from the files as shipped.

They read the files from a manual directory and never download. Prepare
them once, as ArrayRecord (random access, what `tfds.data_source` reads):

  python -m jaxgrpo.data.tfds_builders gsm8k \
      --manual_dir ../shared/data/gsm8k --data_dir DIR
  python -m jaxgrpo.data.tfds_builders squad2 \
      --manual_dir ../shared/data/squad2 --data_dir DIR

then train with a `data.datasets` entry such as
`dict(name='gsm8k', kind='tfds', tfds_name='jaxgrpo_gsm8k', data_dir=DIR)`
(split 'train', eval_split 'test'); the record format follows from the
builder's name. `jaxgrpo.data.sources` imports this module before looking a
builder up, which registers both names.

The examples keep every field their format reads, in file order, so they
become the same Examples (ids included) as the JSONL / JSON files read
directly. Preparation checks every record with its format and stops at the
first bad one, naming its file and line or JSON path.
"""

import argparse
from collections.abc import Iterator, Sequence
import functools
import os
import sys
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from jaxgrpo.data import formats
from jaxgrpo.data import jsonl
from jaxgrpo.data import squad2_file

# Run as `python -m`, this file is `__main__` and must not register the
# builders a second time: the CLI uses those of the imported module.
_REGISTER = __name__ != '__main__'


class _LocalBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """A builder of local files: nothing to download, so no checksums file."""

  # TFDS looks for a checksums file next to the builder's code; finding that
  # code needs a package (importlib_resources) that TFDS does not require.
  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> None:  # pytype: disable=signature-mismatch
    return None


class JaxgrpoGsm8k(_LocalBuilder, skip_registration=not _REGISTER):
  """GSM8K: `train` and `test` splits from train.jsonl and test.jsonl."""

  name = 'jaxgrpo_gsm8k'
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'GSM8K records {question, answer} as shipped.'}
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      'Place train.jsonl and/or test.jsonl of openai/grade-school-math '
      '(grade_school_math/data/) in the manual dir; each present file '
      'becomes the split of its name.'
  )

  def _info(self) -> tfds.core.DatasetInfo:
    text = tfds.features.Text()
    return tfds.core.DatasetInfo(
        builder=self,
        description='Grade school math word problems with worked solutions '
        "ending in '#### <final answer>'.",
        features=tfds.features.FeaturesDict(
            {'question': text, 'answer': text}),
        homepage='https://github.com/openai/grade-school-math',
        disable_shuffling=True,  # file order, as in the JSONL file
    )

  def _split_generators(self, dl_manager):
    splits = {}
    for split in ('train', 'test'):
      path = os.path.join(os.fspath(dl_manager.manual_dir), f'{split}.jsonl')
      if os.path.exists(path):
        splits[split] = self._generate_examples(path)
    if not splits:
      raise FileNotFoundError(
          f'{dl_manager.manual_dir}: no train.jsonl or test.jsonl '
          f'({self.MANUAL_DOWNLOAD_INSTRUCTIONS})'
      )
    return splits

  def _generate_examples(self, path: str) -> Iterator[tuple[int, Any]]:
    source, check = jsonl.JsonlSource(path), formats.Gsm8kFormat()
    for i in range(len(source)):
      record = source[i]
      check.example(record, name=self.name, index=i,
                    where=functools.partial(source.describe, i))
      yield i, {'question': record['question'], 'answer': record['answer']}


class JaxgrpoSquad2(_LocalBuilder, skip_registration=not _REGISTER):
  """SQuAD 2.0: one example per question, from the JSON file as shipped.

  A file whose name contains 'train' (e.g. train-v2.0.json) becomes the
  `train` split, any other .json file (e.g. dev-v2.0.json or
  cs224n-dev-v2.0.json) the `validation` split.
  """

  name = 'jaxgrpo_squad2'
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'SQuAD 2.0 questions, flattened, in file order.'}
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      'Place a SQuAD 2.0 JSON file (dev-v2.0.json, or train-v2.0.json for '
      'the train split) in the manual dir.'
  )

  def _info(self) -> tfds.core.DatasetInfo:
    text = tfds.features.Text()
    return tfds.core.DatasetInfo(
        builder=self,
        description='Reading comprehension questions, about half of them '
        'unanswerable from their context.',
        features=tfds.features.FeaturesDict({
            'id': text,
            'title': text,
            'context': text,
            'question': text,
            'answers': tfds.features.Sequence(text),
            'is_impossible': tfds.features.Scalar(np.bool_),
        }),
        homepage='https://rajpurkar.github.io/SQuAD-explorer/',
        disable_shuffling=True,  # file order, as in the JSON file
    )

  def _split_generators(self, dl_manager):
    manual = os.fspath(dl_manager.manual_dir)
    files = sorted(f for f in os.listdir(manual) if f.endswith('.json'))
    splits = {}
    for file in files:
      split = 'train' if 'train' in file.lower() else 'validation'
      if split in splits:
        raise ValueError(
            f'{manual}: two .json files for the {split!r} split '
            f'({", ".join(files)}); keep one'
        )
      splits[split] = self._generate_examples(os.path.join(manual, file))
    if not splits:
      raise FileNotFoundError(
          f'{manual}: no .json file ({self.MANUAL_DOWNLOAD_INSTRUCTIONS})'
      )
    return splits

  def _generate_examples(self, path: str) -> Iterator[tuple[int, Any]]:
    source, check = squad2_file.Squad2File(path), formats.Squad2Format()
    for i in range(len(source)):
      record = source[i]
      check.example(record, name=self.name, index=i,
                    where=functools.partial(source.describe, i))
      yield i, squad2_file.squad2_features(record)


BUILDERS = {'gsm8k': JaxgrpoGsm8k, 'squad2': JaxgrpoSquad2}


def prepare(
    dataset: str, manual_dir: str, data_dir: str | None = None
) -> tfds.core.DatasetBuilder:
  """Prepares a builder's splits as ArrayRecord files, offline.

  Args:
    dataset: 'gsm8k' or 'squad2'.
    manual_dir: directory holding the files as shipped.
    data_dir: TFDS data directory (None: the TFDS default).

  Returns:
    The prepared builder (`builder.as_data_source(split)` reads it).
  """
  if dataset not in BUILDERS:
    raise ValueError(f'dataset must be one of {sorted(BUILDERS)}, '
                     f'got {dataset!r}')
  builder_cls = BUILDERS[dataset]
  if not os.path.isdir(manual_dir) or not os.listdir(manual_dir):
    raise FileNotFoundError(
        f'manual_dir {manual_dir} is missing or empty: '
        f'{builder_cls.MANUAL_DOWNLOAD_INSTRUCTIONS}')
  builder = builder_cls(data_dir=data_dir, file_format='array_record')
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(
          manual_dir=os.path.abspath(manual_dir)))
  return builder


def main(argv: Sequence[str] | None = None) -> int:
  """The command line; see the module docstring."""
  parser = argparse.ArgumentParser(
      prog='python -m jaxgrpo.data.tfds_builders',
      description='Prepares jaxgrpo_gsm8k / jaxgrpo_squad2 as ArrayRecord.')
  parser.add_argument('dataset', choices=sorted(BUILDERS))
  parser.add_argument('--manual_dir', required=True,
                      help='directory holding the files as shipped')
  parser.add_argument('--data_dir', default=None,
                      help='TFDS data directory (default: the TFDS default)')
  args = parser.parse_args(argv)
  try:
    builder = prepare(args.dataset, args.manual_dir, args.data_dir)
  except (OSError, ValueError) as e:
    print(f'tfds_builders: error: {e}', file=sys.stderr)
    return 1
  for split, info in builder.info.splits.items():
    print(f'{builder.name} {split}: {info.num_examples} examples in '
          f'{builder.data_dir}')
  return 0


if __name__ == '__main__':
  # pylint: disable-next=g-import-not-at-top,import-self
  from jaxgrpo.data import tfds_builders
  sys.exit(tfds_builders.main())
