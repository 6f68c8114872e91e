"""Turns an ml-collections ConfigDict into validated, frozen dataclasses.

Library code never sees the ConfigDict: `train.py` calls `from_config_dict`
once, before anything is compiled, and passes the sections (or plain values)
on. Every check names the full config key it rejects. Defaults live in one
place, `configs/common.py:base_config`; the dataclasses here only declare and
check.
"""

import dataclasses
from typing import Any, ClassVar

import ml_collections

from jaxgrpo.errors import ConfigError

from jaxgrpo import multihost
from jaxgrpo import optimizer
from jaxgrpo.data import formats
from jaxgrpo.data import mixture
from jaxgrpo.data import sources
from jaxgrpo.data.snooze import POLICIES
from jaxgrpo.model import config as model_config
from jaxgrpo.model import decoder
from jaxgrpo.rl import advantages
from jaxgrpo.rl import loss
from jaxgrpo.rl import rollout

# Option lists live where they are implemented; these are only the
# config's own (read by train.py, build.py and data/loading.py).
TOKENIZERS = ('auto', 'char', 'byte', 'model')
ON_BAD_RECORD = ('error', 'skip')
ON_DATASET_CHANGE = ('error', 'remap')


class _Section:
  """Base for config sections: `_check` raises ConfigError naming the key."""

  SECTION: ClassVar[str] = ''

  def _check(self, ok: bool, key: str, message: str) -> None:
    if not ok:
      name = f'{self.SECTION}.{key}' if self.SECTION else key
      raise ConfigError(f'{name}={getattr(self, key)!r}: {message}')

  def _one_of(self, key: str, choices: tuple[str, ...]) -> None:
    self._check(getattr(self, key) in choices, key, f'must be one of {choices}')

  def _positive(self, *keys: str) -> None:
    for key in keys:
      self._check(getattr(self, key) > 0, key, 'must be > 0')

  def _non_negative(self, *keys: str) -> None:
    for key in keys:
      self._check(getattr(self, key) >= 0, key, 'must be >= 0')


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSection(_Section):
  SECTION: ClassVar[str] = 'model'
  preset: str
  path: str | None
  tokenizer: str
  chat_template: bool
  system_prompt: str | None
  dtype: str
  param_dtype: str
  remat: str

  def __post_init__(self):
    self._one_of('tokenizer', TOKENIZERS)
    self._one_of('remat', tuple(decoder.REMAT_POLICIES))
    self._check(self.path is None or bool(self.path), 'path',
                'must be a model directory, a .gguf file, smollm2, or None')
    self._check(self.path is not None or self.tokenizer != 'model',
                'tokenizer', "'model' needs model.path")
    self._one_of('dtype', model_config.DTYPES)
    self._one_of('param_dtype', model_config.DTYPES)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DatasetSection(_Section):
  """One entry of `data.datasets`; which keys apply depends on `kind`."""

  SECTION: ClassVar[str] = 'data.datasets[?]'
  name: str
  kind: str
  weight: float = 1.0
  min_fraction: float = 0.0
  snooze_factor: int | None = None
  verifier: str = 'exact_match'
  num_eval: int = 256
  # 'skip': a bad record (file kinds) is left out, counted and logged.
  on_bad_record: str = 'error'
  # kind='arithmetic'
  min_digits: int = 1
  max_digits: int = 3
  ops: str = '+'
  carries: str = 'any'
  num_train: int = 20_000
  seed: int = 0
  # False, True / 'missing' ('47+?=') or 'negative' ('23-57=', ops='-').
  unanswerable: bool | str = False
  # kind='jsonl' / 'array_record' / 'gsm8k' / 'squad2' (path) and 'tfds'
  # (tfds_name). 'gsm8k' is GSM8K's JSONL file and 'squad2' a SQuAD 2.0
  # JSON file, as shipped.
  path: str | None = None
  eval_path: str | None = None
  tfds_name: str | None = None
  split: str = 'train'
  eval_split: str | None = None
  data_dir: str | None = None
  # Held-out records taken from the training file, spread evenly over it,
  # when there is no eval_path / eval_split; training uses the others.
  holdout: int = 0
  # The record schema (one of FORMATS): None is the kind's own ('gsm8k',
  # 'squad2'), for 'tfds' that of a jaxgrpo_gsm8k / jaxgrpo_squad2 builder,
  # else 'fields': the *_field keys below name the record's fields.
  format: str | None = None
  prompt_field: str = 'prompt'
  answer_field: str = 'answer'
  id_field: str | None = None
  subset_field: str | None = None
  # The prompt's str.format template over the record's fields; None is the
  # format's default ('{prompt}' for 'fields').
  template: str | None = None

  FORMATS: ClassVar[tuple[str, ...]] = formats.FORMATS
  _FIELD_KEYS: ClassVar[dict[str, Any]] = {
      'prompt_field': 'prompt', 'answer_field': 'answer', 'id_field': None,
      'subset_field': None}

  def _check_format(self) -> None:
    self._check(self.format is None or self.format in self.FORMATS, 'format',
                f'must be one of {self.FORMATS} or None (the kind\'s own)')
    if self.kind in ('gsm8k', 'squad2'):
      self._check(self.format in (None, self.kind), 'format',
                  f'must be None or {self.kind!r} for kind={self.kind!r}')
    if self.format in ('gsm8k', 'squad2') or self.kind in ('gsm8k', 'squad2'):
      for key, default in self._FIELD_KEYS.items():
        self._check(getattr(self, key) == default, key,
                    "applies to format='fields' only")
    self._non_negative('holdout')
    if self.holdout:
      self._check(not self.eval_path and not self.eval_split, 'holdout',
                  'needs no eval_path or eval_split (they are the held-out '
                  'set)')

  def __post_init__(self):
    self._one_of('kind', sources.KINDS)
    self._check(bool(self.name) and '/' not in self.name, 'name',
                "must be non-empty without '/' (metric names use it)")
    self._check(self.weight >= 0, 'weight', 'must be >= 0')
    self._check(0.0 <= self.min_fraction <= 1.0, 'min_fraction',
                'must be in [0, 1]')
    self._check(self.snooze_factor is None or self.snooze_factor >= 1,
                'snooze_factor', 'must be >= 1 (or None: sampler default)')
    self._non_negative('num_eval')
    self._one_of('on_bad_record', ON_BAD_RECORD)
    if self.kind == 'arithmetic':
      self._check(1 <= self.min_digits <= 9, 'min_digits', 'must be in [1, 9]')
      self._check(self.min_digits <= self.max_digits <= 9, 'max_digits',
                  'must be in [min_digits, 9]')
      self._check(bool(self.ops) and set(self.ops) <= set('+-*'), 'ops',
                  "must be a non-empty string of '+', '-', '*'")
      self._one_of('carries', ('any', 'none', 'required'))
      self._check(self.unanswerable in (False, True, 'missing', 'negative'),
                  'unanswerable', "must be False, True, 'missing' or "
                  "'negative'")
      self._check(self.unanswerable != 'negative' or self.ops == '-',
                  'unanswerable', "'negative' needs ops='-'")
      self._positive('num_train')
      self._check(self.format is None, 'format',
                  "does not apply to kind='arithmetic'")
      if self.template is not None:
        try:
          self.template.format(expression='1+2', prompt='1+2=')
        except (KeyError, IndexError, ValueError) as e:
          self._check(False, 'template',
                      "an arithmetic template may name only {expression} "
                      f"and {{prompt}} ({type(e).__name__}: {e})")
      self._check(self.holdout == 0, 'holdout',
                  "does not apply to kind='arithmetic' (it has num_eval)")
      return
    if self.kind == 'tfds':
      self._check(bool(self.tfds_name), 'tfds_name', "is required for kind='tfds'")
    else:
      self._check(bool(self.path), 'path', f"is required for kind={self.kind!r}")
    self._check_format()


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataSection(_Section):
  SECTION: ClassVar[str] = 'data'
  balance: str
  datasets: tuple[DatasetSection, ...]

  def __post_init__(self):
    self._one_of('balance', mixture.BALANCES)
    self._check(len(self.datasets) > 0, 'datasets', 'needs at least one dataset')
    names = [d.name for d in self.datasets]
    self._check(len(set(names)) == len(names), 'datasets',
                f'dataset names must be unique, got {names}')
    self._check(sum(d.weight for d in self.datasets) > 0, 'datasets',
                'weights must have a positive sum')
    self._check(sum(d.min_fraction for d in self.datasets) <= 1.0, 'datasets',
                'min_fraction values must sum to at most 1')


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutSection(_Section):
  SECTION: ClassVar[str] = 'rollout'
  batch_size: int
  group_size: int
  round_size: int | str
  max_round_size: int
  max_rounds: int
  surplus: str
  short_batch: str
  max_prompt_len: int
  long_prompts: str
  max_new_tokens: int
  temperature: float
  top_k: int
  top_p: float
  easy_threshold: float
  hard_threshold: float

  def __post_init__(self):
    self._positive('batch_size', 'max_round_size', 'max_rounds',
                   'max_prompt_len')
    self._check(
        self.round_size == 'adaptive'
        or (isinstance(self.round_size, int) and self.round_size > 0),
        'round_size', "must be a positive int or 'adaptive'")
    self._check(self.group_size >= 2, 'group_size',
                'must be >= 2 (advantages compare completions in a group)')
    self._check(self.max_new_tokens >= 1, 'max_new_tokens', 'must be >= 1')
    self._one_of('surplus', rollout.SURPLUS)
    self._one_of('short_batch', rollout.SHORT_BATCH)
    self._one_of('long_prompts', rollout.LONG_PROMPTS)
    self._non_negative('temperature', 'top_k')
    self._check(0.0 < self.top_p <= 1.0, 'top_p', 'must be in (0, 1]')
    self._check(0.0 <= self.hard_threshold < self.easy_threshold <= 1.0,
                'easy_threshold',
                'needs 0 <= rollout.hard_threshold < easy_threshold <= 1')


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplerSection(_Section):
  SECTION: ClassVar[str] = 'sampler'
  policy: str
  snooze_factor: int
  snooze_hard_factor: int
  w_min: float
  prior_strength: float
  prior_mean: float | None

  def __post_init__(self):
    self._one_of('policy', POLICIES)
    self._check(self.snooze_factor >= 1, 'snooze_factor', 'must be >= 1')
    self._non_negative('snooze_hard_factor')
    self._check(0.0 < self.w_min <= 1.0, 'w_min', 'must be in (0, 1]')
    self._positive('prior_strength')
    self._check(self.prior_mean is None or 0.0 < self.prior_mean < 1.0,
                'prior_mean', 'must be in (0, 1) or None (running mean)')


@dataclasses.dataclass(frozen=True, kw_only=True)
class RLSection(_Section):
  SECTION: ClassVar[str] = 'rl'
  advantage: str
  loss_agg: str
  eps_low: float
  eps_high: float
  beta: float
  num_iterations: int
  num_minibatches: int
  max_nonfinite_steps: int

  def __post_init__(self):
    self._one_of('advantage', advantages.estimator_names())
    self._one_of('loss_agg', loss.LOSS_AGGREGATIONS)
    self._non_negative('eps_low', 'eps_high', 'beta')
    self._check(self.eps_low < 1.0, 'eps_low', 'must be < 1')
    self._positive('num_iterations', 'num_minibatches', 'max_nonfinite_steps')


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimSection(_Section):
  SECTION: ClassVar[str] = 'optim'
  learning_rate: float
  warmup_steps: int
  schedule: str
  max_grad_norm: float
  weight_decay: float

  def __post_init__(self):
    self._positive('learning_rate', 'max_grad_norm')
    self._non_negative('warmup_steps', 'weight_decay')
    self._one_of('schedule', optimizer.SCHEDULES)


@dataclasses.dataclass(frozen=True, kw_only=True)
class WarmStartSection(_Section):
  SECTION: ClassVar[str] = 'warmstart'
  enabled: bool
  max_steps: int
  batch_size: int
  learning_rate: float
  target_pass_rate: float
  check_every: int
  check_examples: int

  def __post_init__(self):
    self._non_negative('max_steps')
    self._positive('batch_size', 'learning_rate', 'check_every',
                   'check_examples')
    self._check(0.0 <= self.target_pass_rate <= 1.0, 'target_pass_rate',
                'must be in [0, 1]')


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalSection(_Section):
  SECTION: ClassVar[str] = 'eval'
  every: int
  num_samples: int
  temperature: float

  def __post_init__(self):
    self._non_negative('every', 'temperature')
    self._positive('num_samples')


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointSection(_Section):
  SECTION: ClassVar[str] = 'checkpoint'
  every: int
  every_minutes: float
  max_to_keep: int
  on_dataset_change: str

  def __post_init__(self):
    self._non_negative('every', 'every_minutes')
    self._positive('max_to_keep')
    self._one_of('on_dataset_change', ON_DATASET_CHANGE)


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifySection(_Section):
  SECTION: ClassVar[str] = 'verify'
  workers: int
  timeout_s: float
  imports: tuple[str, ...]

  def __post_init__(self):
    self._non_negative('workers', 'timeout_s')
    self._check(
        isinstance(self.imports, (list, tuple))
        and all(isinstance(m, str) and m for m in self.imports),
        'imports', 'must be a list of module names')
    object.__setattr__(self, 'imports', tuple(self.imports))


@dataclasses.dataclass(frozen=True, kw_only=True)
class CurriculumSection(_Section):
  """Offline strata and stages (see `jaxgrpo.data.curriculum`)."""

  SECTION: ClassVar[str] = 'curriculum'
  strata: str | None
  checkpoints: tuple[str, ...]
  bands: tuple[float, ...]
  prior: bool
  stages: tuple[dict[str, Any], ...]

  def __post_init__(self):
    # pylint: disable=g-import-not-at-top
    from jaxgrpo.data import curriculum
    self._check(self.strata is None or bool(self.strata), 'strata',
                'must be a jaxgrpo-stratify output directory or None')
    self._check(isinstance(self.checkpoints, (list, tuple)) and all(
        isinstance(t, str) and t for t in self.checkpoints), 'checkpoints',
                'must be a list of checkpoint tags (empty: all)')
    object.__setattr__(self, 'checkpoints', tuple(self.checkpoints))
    try:
      names = curriculum.stratum_names(tuple(self.bands))
    except (TypeError, ValueError) as e:
      self._check(False, 'bands', f'must be increasing edges in (0, 1) ({e})')
    object.__setattr__(self, 'bands', tuple(float(b) for b in self.bands))
    self._check(isinstance(self.stages, (list, tuple)), 'stages',
                "must be a list of {'step': S, 'weights': {...}} dicts")
    self._check(not self.stages or self.strata is not None, 'stages',
                'need curriculum.strata (a jaxgrpo-stratify output)')
    last = -1
    for i, stage in enumerate(self.stages):
      where = f'curriculum.stages[{i}]'
      if not isinstance(stage, dict) or set(stage) != {'step', 'weights'}:
        raise ConfigError(f"{where}={stage!r}: must be a dict with keys "
                          "'step' and 'weights'")
      step, weights = stage['step'], stage['weights']
      if not isinstance(step, int) or step <= last:
        raise ConfigError(f'{where}.step={step!r}: must be an int >= 0, '
                          'greater than the previous stage\'s')
      last = step
      if not isinstance(weights, dict):
        raise ConfigError(f'{where}.weights={weights!r}: must be a dict of '
                          'stratum name -> weight')
      for key, w in weights.items():
        stratum = str(key).rsplit('/', 1)[-1]
        if stratum not in names:
          raise ConfigError(
              f'{where}.weights[{key!r}]: unknown stratum {stratum!r} (with '
              f'curriculum.bands={tuple(self.bands)}: {", ".join(names)}; '
              "'dataset/stratum' for one dataset)")
        if not isinstance(w, (int, float)) or not 0 <= w < float('inf'):
          raise ConfigError(f'{where}.weights[{key!r}]={w!r}: must be a '
                            'number >= 0')
    object.__setattr__(self, 'stages', tuple(
        {'step': s['step'], 'weights': dict(s['weights'])}
        for s in self.stages))


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshSection(_Section):
  """The device mesh and how logical axes map onto it (`jaxgrpo.sharding`)."""

  SECTION: ClassVar[str] = 'mesh'
  data: int
  fsdp: int
  tensor: int
  rules: tuple[tuple[str, Any], ...]
  memory_limit_gib: float | None

  def __post_init__(self):
    self._check(self.data == -1 or self.data >= 1, 'data',
                'must be >= 1, or -1 (the devices left by fsdp and tensor)')
    self._positive('fsdp', 'tensor')
    self._check(self.memory_limit_gib is None or self.memory_limit_gib > 0,
                'memory_limit_gib',
                "must be > 0, or None (the device's own limit)")
    # pylint: disable=g-import-not-at-top
    from jaxgrpo import sharding
    logical = [name for name, _ in sharding.DEFAULT_RULES]
    shape = ("must be a list of (logical axis, mesh axis | tuple of mesh "
             "axes | None) pairs")
    self._check(isinstance(self.rules, (list, tuple)), 'rules', shape)
    rules = []
    for i, rule in enumerate(self.rules):
      where = f'mesh.rules[{i}]'
      if not isinstance(rule, (list, tuple)) or len(rule) != 2:
        raise ConfigError(f'{where}={rule!r}: {shape}')
      name, target = rule
      if name not in logical:
        raise ConfigError(f'{where}={tuple(rule)!r}: unknown logical axis '
                          f'{name!r} (one of {", ".join(logical)})')
      axes = (target,) if isinstance(target, str) else target
      if axes is not None and not (
          isinstance(axes, (list, tuple))
          and all(a in sharding.MESH_AXES for a in axes)
          and len(set(axes)) == len(axes)):
        raise ConfigError(f'{where}={tuple(rule)!r}: the target must be one '
                          f'of {sharding.MESH_AXES}, a tuple of distinct '
                          'ones, or None (replicated)')
      rules.append((name, target if axes is None or isinstance(target, str)
                    else tuple(target)))
    object.__setattr__(self, 'rules', tuple(rules))

  def shape(self, num_devices: int) -> tuple[int, int, int]:
    """(data, fsdp, tensor) on `num_devices` devices, -1 resolved.

    Raises:
      ConfigError: the mesh does not divide (or fill) the devices.
    """
    if self.data == -1:
      self._check(num_devices % (self.fsdp * self.tensor) == 0, 'fsdp',
                  f'mesh.fsdp x mesh.tensor = {self.fsdp * self.tensor} '
                  f'must divide the {num_devices} devices')
      return num_devices // (self.fsdp * self.tensor), self.fsdp, self.tensor
    self._check(self.data * self.fsdp * self.tensor == num_devices, 'data',
                f'mesh.data x fsdp x tensor = {self.data} x {self.fsdp} x '
                f'{self.tensor} must equal the {num_devices} devices (or set '
                'mesh.data=-1 to take the devices left)')
    return self.data, self.fsdp, self.tensor


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistributedSection(_Section):
  """Several processes in one run (`jaxgrpo.multihost`)."""

  SECTION: ClassVar[str] = 'distributed'
  initialize: str
  coordinator: str | None
  num_processes: int | None
  process_id: int | None
  check_every: int

  def __post_init__(self):
    self._one_of('initialize', multihost.INITIALIZE)
    self._check(self.coordinator is None or (
        isinstance(self.coordinator, str) and ':' in self.coordinator),
                'coordinator', "must be 'host:port' (process 0's host), or "
                'None')
    given = [self.coordinator is not None, self.num_processes is not None,
             self.process_id is not None]
    self._check(all(given) or not any(given), 'coordinator',
                'distributed.coordinator, num_processes and process_id go '
                'together: give all three or none')
    if self.num_processes is not None:
      self._check(self.num_processes >= 1, 'num_processes', 'must be >= 1')
      self._check(0 <= self.process_id < self.num_processes, 'process_id',
                  f'must be in [0, {self.num_processes})')
    self._check(self.check_every >= 0, 'check_every',
                'must be >= 0 (0: no cross-process check)')


_SECTIONS: dict[str, type[_Section]] = {
    'model': ModelSection,
    'data': DataSection,
    'rollout': RolloutSection,
    'sampler': SamplerSection,
    'rl': RLSection,
    'optim': OptimSection,
    'warmstart': WarmStartSection,
    'eval': EvalSection,
    'checkpoint': CheckpointSection,
    'verify': VerifySection,
    'curriculum': CurriculumSection,
    'mesh': MeshSection,
    'distributed': DistributedSection,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(_Section):
  """The whole run's configuration."""

  seed: int
  total_steps: int
  log_every: int
  plots: bool
  tensorboard: bool
  model: ModelSection
  data: DataSection
  rollout: RolloutSection
  sampler: SamplerSection
  rl: RLSection
  optim: OptimSection
  warmstart: WarmStartSection
  eval: EvalSection
  checkpoint: CheckpointSection
  verify: VerifySection
  curriculum: CurriculumSection
  mesh: MeshSection
  distributed: DistributedSection

  def __post_init__(self):
    self._check(self.total_steps >= 0, 'total_steps', 'must be >= 0')
    self._positive('log_every')
    # Minibatches hold whole groups: a prompt is run once for its G samples.
    self.rl._check(
        self.rollout.batch_size % self.rl.num_minibatches == 0,
        'num_minibatches',
        f'must divide rollout.batch_size = {self.rollout.batch_size} '
        '(minibatches hold whole groups)',
    )
    if self.mesh.data != -1:  # The batch check needs no device count.
      mesh_shape(self, self.mesh.data * self.mesh.fsdp * self.mesh.tensor)
    names = {d.name for d in self.data.datasets}
    for i, stage in enumerate(self.curriculum.stages):
      for key in stage['weights']:
        if '/' in key and key.rsplit('/', 1)[0] not in names:
          raise ConfigError(
              f'curriculum.stages[{i}].weights[{key!r}]: no dataset '
              f'{key.rsplit("/", 1)[0]!r} in data.datasets ({sorted(names)})')


def mesh_shape(cfg: Config, num_devices: int) -> tuple[int, int, int]:
  """The run's (data, fsdp, tensor) mesh on `num_devices` devices.

  Raises:
    ConfigError: naming the key, when the mesh does not fit the devices or
      the completions of a step do not split over its batch axes.
  """
  data, fsdp, tensor = cfg.mesh.shape(num_devices)
  rows = cfg.rollout.batch_size * cfg.rollout.group_size
  if rows % (data * fsdp):
    raise ConfigError(
        f'rollout.batch_size={cfg.rollout.batch_size}: batch_size x '
        f'group_size = {rows} completions must split evenly over mesh.data '
        f'x mesh.fsdp = {data} x {fsdp} = {data * fsdp} devices')
  return data, fsdp, tensor


def _fields(cls: type) -> set[str]:
  return {f.name for f in dataclasses.fields(cls)}


def _build(cls: type, values: dict[str, Any], where: str) -> Any:
  unknown = sorted(set(values) - _fields(cls))
  if unknown:
    known = ', '.join(sorted(_fields(cls)))
    raise ConfigError(
        f'unknown config key {where}{unknown[0]} (known in '
        f'{where.rstrip(".") or "the top level"}: {known})'
    )
  missing = sorted(_fields(cls) - set(values))
  if missing:
    raise ConfigError(f'config key {where}{missing[0]} is missing')
  return cls(**values)


def _build_data(values: dict[str, Any]) -> DataSection:
  values = dict(values)
  entries = values.get('datasets')
  if not isinstance(entries, (list, tuple)):
    raise ConfigError(f'data.datasets must be a list of dicts, got {entries!r}')
  built = []
  for i, entry in enumerate(entries):
    where = f'data.datasets[{i}].'
    if not isinstance(entry, dict):
      raise ConfigError(f'{where[:-1]} must be a dict, got {entry!r}')
    for key in ('name', 'kind'):
      if key not in entry:
        raise ConfigError(f'config key {where}{key} is missing')
    unknown = sorted(set(entry) - _fields(DatasetSection))
    if unknown:
      raise ConfigError(f'unknown config key {where}{unknown[0]} (dataset '
                        f'keys: {", ".join(sorted(_fields(DatasetSection)))})')
    try:
      built.append(DatasetSection(**entry))
    except ConfigError as e:
      raise ConfigError(str(e).replace('data.datasets[?]', where[:-1])) from None
  values['datasets'] = tuple(built)
  return _build(DataSection, values, 'data.')


def from_config_dict(cfg: ml_collections.ConfigDict | dict) -> Config:
  """Validates a ConfigDict and returns the frozen Config.

  Raises:
    ConfigError: naming the first unknown or invalid key.
  """
  values = cfg.to_dict() if isinstance(cfg, ml_collections.ConfigDict) else dict(cfg)
  top = {}
  for key, value in values.items():
    if key == 'data' and isinstance(value, dict):
      top[key] = _build_data(value)
    elif key in _SECTIONS:
      if not isinstance(value, dict):
        raise ConfigError(f'config key {key} must be a section, got {value!r}')
      top[key] = _build(_SECTIONS[key], value, f'{key}.')
    else:
      top[key] = value
  return _build(Config, top, '')


def to_dict(cfg: Config) -> dict[str, Any]:
  """The resolved config as plain data (for logs and checkpoints)."""
  return dataclasses.asdict(cfg)
