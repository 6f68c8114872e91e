"""The config's dataset entry: the keys of one `data.datasets` dict.

Which keys apply depends on `kind` and the record format; their defaults
and help text make the dataset keys' table of docs/configuration.md
(`jaxgrpo.config_doc`).
"""

from jaxgrpo import checks
from jaxgrpo.checks import field
from jaxgrpo.data import arithmetic as arithmetic_lib
from jaxgrpo.data import formats
from jaxgrpo.data import snooze
from jaxgrpo.data import sources


# The keys of one kind of entry, refused on the others (set to other than
# their defaults) so that a key under the wrong kind does not pass unused.
_KIND_KEYS = {
    'arithmetic': ('min_digits', 'max_digits', 'ops', 'carries', 'num_train',
                   'seed', 'unanswerable'),
    'tfds': ('tfds_name', 'split', 'eval_split', 'data_dir'),
    'file': ('path', 'eval_path'),
}


class DatasetSection(checks.Section, name='data.datasets[?]'):
  """One entry of the config's `data.datasets`; which keys apply depends on
  `kind` (docs/configuration.md#dataset-entries)."""

  name: str = field(
      help="unique, without '/' (metric names use it)",
      check=checks.rule(lambda n: bool(n) and '/' not in n, (
          "must be non-empty without '/' (metric names use it)")))
  kind: str = field(help='where the examples come from',
                    check=checks.one_of(sources.KINDS))
  weight: float = field(
      1.0, "the dataset's share of the mixture", checks.rule(
          lambda w: 0 <= w < float('inf'), 'must be a finite number >= 0'))
  min_fraction: float = field(
      0.0, 'share of each batch it keeps at least (see [the sampler]'
      '(sampler.md))', checks.in_range(0.0, 1.0))
  snooze_factor: int | None = field(
      None, "its own `sampler.snooze_factor` (None: the sampler's)",
      checks.optional(snooze.SNOOZE_FACTOR, "the sampler's"))
  verifier: str | dict | list | tuple = field(
      'exact_match', 'a verifier name, a dict with options or a list to '
      'combine (see [Verifiers](data.md#verifiers))')
  num_eval: int = field(256, 'held-out examples evaluated',
                        checks.NON_NEGATIVE)
  on_bad_record: str = field(
      'error', 'a bad record of a file: `error`, or `skip` (left out, '
      'counted and logged; see [Bad input](troubleshooting.md#bad-input))',
      checks.one_of(('error', 'skip')))
  min_digits: int = field(1, '`arithmetic`: fewest operand digits')
  max_digits: int = field(3, '`arithmetic`: most operand digits')
  ops: str = field('+', '`arithmetic`: operators to draw from, any of `+-*`')
  carries: str = field(
      'any', '`arithmetic`: `any`, `none` (no carry or borrow) or `required`')
  num_train: int = field(20_000, '`arithmetic`: training problems (held-out '
                         'ones share no prompt with them)', checks.POSITIVE)
  seed: int = field(0, '`arithmetic`: seed of the problems')
  unanswerable: bool | str = field(
      False, "`arithmetic`: `True` or `'missing'` ('47+?='), `'negative'` "
      "('23-57=', with `ops='-'`): problems whose answer is a refusal")
  path: str | None = field(
      None, 'file kinds: a JSONL file, ArrayRecord shards of JSON records, '
      'for `parquet` a Parquet file, a folder of shards or a Hugging Face '
      'dataset saved with `save_to_disk`, for `gsm8k` and `squad2` the file '
      'as shipped; a glob reads its sorted matches in order (a file that '
      'exists is read as named, `[` or `*` in its name or not)')
  eval_path: str | None = field(None, 'file kinds: the held-out file')
  tfds_name: str | None = field(None, '`tfds`: the dataset name')
  split: str = field('train', '`tfds`: the training split')
  eval_split: str | None = field(None, '`tfds`: the held-out split')
  data_dir: str | None = field(
      None, '`tfds`: a prepared local dataset (nothing is downloaded)')
  holdout: int = field(
      0, 'all but `arithmetic`: records held out of the training data, '
      'spread over it, when there is no `eval_path` or `eval_split` (the '
      'first `num_eval` of them are evaluated)')
  format: str | None = field(
      None, "the record format: None (the kind's own; for `tfds` that of a "
      '`jaxgrpo_gsm8k` / `jaxgrpo_squad2` builder), `fields`, `gsm8k` or '
      '`squad2`')
  prompt_field: str = field('prompt', "`fields`: the prompt's field")
  answer_field: str = field('answer', "`fields`: the answer's field")
  id_field: str | None = field(
      None, '`fields`: a stable example id (None: `<name>/<index>`)')
  subset_field: str | None = field(
      None, "`fields`: the field of the example's subset in metrics")
  template: str | None = field(
      None, "the prompt text, formatted with the record's fields (None: the "
      "format's own; `fields`: `'{prompt}'`; `arithmetic`: `{expression}`, "
      '`{prompt}`)')

  def _validate(self):
    group = self.kind if self.kind in ('arithmetic', 'tfds') else 'file'
    for other, keys in _KIND_KEYS.items():
      for key in keys if other != group else ():
        yield key, getattr(self, key) == getattr(type(self), key), (
            f'does not apply to kind={self.kind!r}')
    for key in ('template', 'prompt_field', 'answer_field', 'id_field',
                'subset_field'):  # '' failed every record as a bad one
      yield key, getattr(self, key) is None or getattr(self, key).strip(), (
          'must not be blank')
    if self.kind == 'arithmetic':
      yield from arithmetic_lib.spec_checks(self)
      yield 'format', self.format is None, "does not apply to kind='arithmetic'"
      try:
        (self.template or '').format(expression='1+2', prompt='1+2=')
      except (KeyError, IndexError, ValueError) as e:
        yield 'template', False, ('an arithmetic template may name only '
                                  '{expression} and {prompt} '
                                  f'({type(e).__name__}: {e})')
      yield 'holdout', self.holdout == 0, (
          "does not apply to kind='arithmetic' (it has num_eval)")
      return
    required = 'tfds_name' if self.kind == 'tfds' else 'path'
    yield required, getattr(self, required), (
        f'is required for kind={self.kind!r}')
    yield 'format', self.format in (None, *formats.FORMATS), (
        f"must be one of {formats.FORMATS} or None (the kind's own)")
    own = self.kind in ('gsm8k', 'squad2')
    yield 'format', not own or self.format in (None, self.kind), (
        f'must be None or {self.kind!r} for kind={self.kind!r}')
    fmt = self.format or formats.default_format(self.kind, self.tfds_name)
    if fmt != 'fields':
      for key in ('prompt_field', 'answer_field', 'id_field', 'subset_field'):
        yield key, getattr(self, key) == getattr(type(self), key), (
            "applies to format='fields' only")
    yield 'holdout', self.holdout >= 0, 'must be >= 0'
    yield 'holdout', not self.holdout or not (
        self.eval_path or self.eval_split), (
            'needs no eval_path or eval_split (they are the held-out set)')
