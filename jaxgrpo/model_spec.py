"""Models for inference, named by a checkpoint spec string.

A spec is one of

  * 'init': the model a run of the config starts from: the built-in
    `model.preset` initialised as `train.py` does from `seed` (before any
    warm start), or the pretrained model at `model.path`;
  * a run workdir (a directory holding `checkpoints/`): the params of its
    latest checkpoint, or of step STEP with `WORKDIR@STEP`; the model config
    and tokenizer are those the run trained with. A LoRA run's checkpoints
    hold its adapter: the base is rebuilt from the run's model (its
    `model.path`, or its preset from its seed) and the adapter attached, as
    the run computed it (merged into bfloat16 weights, most of a small
    update would round away; `lora.merge` merges it for an eager run);
  * a pretrained model `jaxgrpo.model.pretrained.load` reads: a Hugging Face
    directory, a .gguf file, or 'smollm2'; its tokenizer is set up per the
    config's model.chat_template and model.system_prompt.

Checkpoints are read without the optimizer state and without writing to
the run's directory, so a live training run may be read from. Params are
placed on the active mesh, as training places them.

Size: the three kinds of spec share their resolution (`name_of`, a step
removed meanwhile) and the checks of what a run's checkpoint holds.
"""

from collections.abc import Callable
import dataclasses
import os
from typing import Any

from flax import nnx
import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxgrpo import checkpoint as checkpoint_lib
from jaxgrpo import config_lib
from jaxgrpo import errors
from jaxgrpo import sharding
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.model import config as model_config
from jaxgrpo.model import decoder
from jaxgrpo.model import lora
from jaxgrpo.model import pretrained

INIT = 'init'
CHECKPOINTS = 'checkpoints'

Log = Callable[[str], None]


class ModelSpecError(errors.UserError):
  """A checkpoint spec names no model that can be loaded."""


class UnreadableError(ModelSpecError):
  """A run's checkpoint that a spec names rightly cannot be read: it is
  damaged, it was removed while it was read, or the run's model.path is
  gone. Not a mistake in the spec: the commands exit 1 for it, not 2."""


@dataclasses.dataclass(frozen=True)
class LoadedModel:
  """A model ready to sample from.

  Attributes:
    name: a spec that loads this same model again: 'init', an absolute
      workdir path with its step resolved (`/runs/warm@100`), or the
      pretrained model's absolute path (or 'smollm2').
    model_cfg: the decoder's config.
    graphdef: the decoder's graph definition.
    params: its parameters.
    tokenizer: the tokenizer prompts are encoded with (chat template
      applied where the model has one and the config asks for it).
  """

  name: str
  model_cfg: model_config.ModelConfig
  graphdef: nnx.GraphDef
  params: nnx.State
  tokenizer: tokenizer_lib.Tokenizer


@dataclasses.dataclass(frozen=True)
class _Resolved:
  kind: str  # 'init', 'run' or 'pretrained'
  path: str  # the workdir or model path ('' for init)
  step: int | None  # a run's checkpoint step


def _ignore(_: str) -> None:
  pass


def _split_step(spec: str) -> tuple[str, int | None]:
  """(path, step) of 'PATH@STEP'; (spec, None) without a step."""
  if os.path.exists(spec):
    return spec, None
  head, sep, tail = spec.rpartition('@')
  if not sep or not head:
    return spec, None
  if not tail.isdigit():
    raise ModelSpecError(f'checkpoint {spec!r}: {tail!r} after @ is not a '
                      'step number (use WORKDIR@STEP, e.g. runs/warm@100)')
  return head, int(tail)


def _resolve(spec: str) -> _Resolved:
  """What `spec` names, with a workdir's step checked (or the latest)."""
  if spec == INIT:
    return _Resolved(INIT, '', None)
  target, step = _split_step(spec)
  path = os.path.abspath(os.path.expanduser(target))
  directory = os.path.join(path, CHECKPOINTS)
  if os.path.isdir(directory):
    steps = checkpoint_lib.saved_steps(directory)
    if not steps:
      raise ModelSpecError(f'checkpoint {spec!r}: no checkpoint in {directory} '
                        '(the run saved none yet)')
    if step is not None and step not in steps:
      raise ModelSpecError(
          f'checkpoint {spec!r}: no step {step} in {directory} (steps '
          f'there: {", ".join(map(str, steps))})')
    return _Resolved('run', path, steps[-1] if step is None else step)
  if step is not None:
    raise ModelSpecError(
        f'checkpoint {spec!r}: {path} is not a run workdir (no '
        f'{CHECKPOINTS}/ in it), so @{step} names no checkpoint')
  if target == pretrained.SMOLLM2:
    return _Resolved('pretrained', target, None)
  if not os.path.exists(path):
    raise ModelSpecError(
        f"checkpoint {spec!r}: {path} does not exist (expected 'init', a "
        'run workdir, WORKDIR@STEP, a Hugging Face model directory, a '
        ".gguf file or 'smollm2')")
  if os.path.isdir(path) and not os.path.exists(
      os.path.join(path, 'config.json')):
    raise ModelSpecError(f'checkpoint {spec!r}: ' + (
        pretrained.peft_adapter(path) or f'{path} is neither a run workdir '
        f'(no {CHECKPOINTS}/ in it) nor a Hugging Face model directory (no '
        'config.json in it)'))
  return _Resolved('pretrained', path, None)


def name_of(spec: str) -> str:
  """The `LoadedModel.name` that `load(spec, ...)` gives, without loading it.

  Raises:
    ModelSpecError: as `load` does for a missing path or step.
  """
  resolved = _resolve(spec)
  if resolved.kind == 'run':
    return f'{resolved.path}@{resolved.step}'
  return resolved.path or spec


def load(spec: str, cfg: config_lib.Config, *, log: Log = _ignore) -> LoadedModel:
  """Loads the model `spec` names (see the module docstring).

  Args:
    spec: 'init', a run workdir, WORKDIR@STEP, or a pretrained model path.
    cfg: the config; 'init' builds its model, a pretrained spec takes its
      model.dtype, model.param_dtype, chat template and system prompt.
    log: receives a line about what was loaded.

  Returns:
    The policy, its params placed on the active mesh (`sharding.use_mesh`)
    as training places them, else on the default device.

  Raises:
    ModelSpecError: the spec names nothing loadable (a missing path, a workdir
      without checkpoints or without step STEP, an unreadable checkpoint).
    errors.ConfigError: the config's model section is invalid for 'init'.
  """
  resolved = _resolve(spec)
  if resolved.kind == INIT:
    if cfg.model.path:
      model = _load_pretrained(spec, cfg.model.path, cfg, log, name=INIT)
    else:
      model = _init(cfg, log)
  elif resolved.kind == 'run':
    return _load_run(spec, resolved.path, resolved.step, log)
  else:
    model = _load_pretrained(spec, resolved.path, cfg, log,
                             name=name_of(spec))
  return dataclasses.replace(model, params=_placed(model.params))


def _placed(params: nnx.State) -> nnx.State:
  """`params` on the active mesh, as training places them; without one,
  on the default device."""
  shardings = sharding.param_shardings(params)
  return jax.device_put(params) if shardings is None else sharding.shard(
      params, shardings)


def load_resolved(spec: str, name: str, cfg: config_lib.Config, *,
                  log: Log = _ignore) -> LoadedModel:
  """Loads `name`, what `name_of(spec)` gave earlier; a workdir `spec`
  (its latest step) whose step a run training there removed since loads
  its latest now, with a line to `log` (`checkpoint.read_latest`).

  Raises:
    ModelSpecError: as `load`.
  """
  workdir, step = _split_step(name)
  if step is None:
    return load(name, cfg, log=log)

  def moved(old: int, new: int) -> None:
    log(f'{workdir}@{old} was removed by the run training there: its '
        f'latest, {workdir}@{new}, is loaded instead')

  return checkpoint_lib.read_latest(
      os.path.join(workdir, CHECKPOINTS), step,
      lambda s: load(f'{workdir}@{s}', cfg, log=log),
      follow=_split_step(spec)[1] is None, moved=moved)


def _init(cfg: config_lib.Config, log: Log) -> LoadedModel:
  """The config's preset, initialised as train.py does."""
  tokenizer = tokenizer_lib.make_tokenizer(cfg.model.tokenizer)
  try:
    model_cfg = model_config.preset(
        cfg.model.preset, vocab_size=tokenizer.vocab_size,
        dtype=cfg.model.dtype, param_dtype=cfg.model.param_dtype)
  except ValueError as e:
    raise errors.ConfigError(f'model.preset: {e}') from None
  # The first of the four keys train.py splits from the seed inits params.
  init_rng = jax.random.split(jax.random.key(cfg.seed), 4)[0]
  graphdef, params = decoder.init_params(model_cfg, init_rng)
  log(f'init: preset {cfg.model.preset!r} initialised from seed {cfg.seed} '
      f'({model_config.param_count(model_cfg) / 1e6:.2f}M params)')
  return LoadedModel(name=INIT, model_cfg=model_cfg, graphdef=graphdef,
                params=params, tokenizer=tokenizer)


def _load_pretrained(spec: str, path: str, cfg: config_lib.Config, log: Log,
                     *, name: str) -> LoadedModel:
  """A pretrained model with its tokenizer set up per cfg.model."""
  # Imported here: build imports the model loaders and verifiers, which a
  # policy loaded from a workdir or preset does not need.
  from jaxgrpo import build  # pylint: disable=g-import-not-at-top
  model = cfg.model
  if model.tokenizer in ('char', 'byte'):  # The model's own is needed.
    model = dataclasses.replace(model, tokenizer='auto')
  try:
    loaded = build.load_pretrained(
        dataclasses.replace(cfg, model=dataclasses.replace(model, path=path)),
        log)
  except (errors.UserError, ValueError, OSError) as e:
    message = str(e)
    prefix = f'model.path={path!r}: '
    raise ModelSpecError(f'checkpoint {spec!r}: '
                      f'{message.removeprefix(prefix)}') from None
  return LoadedModel(name=name, model_cfg=loaded.cfg, graphdef=loaded.graphdef,
                params=loaded.params, tokenizer=loaded.tokenizer)


def _load_run(spec: str, workdir: str, step: int, log: Log) -> LoadedModel:
  """Checkpoint `step` of a run: its params, model config and tokenizer."""
  directory = os.path.join(workdir, CHECKPOINTS)
  where = f'checkpoint {spec!r} (step {step} in {directory})'
  manager = checkpoint_lib.reader(directory)
  try:
    meta = dict(manager.restore(
        step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta)
    if 'model' not in meta:
      raise UnreadableError(f'{where}: its metadata holds no model config')
    try:
      model_cfg = model_config.ModelConfig(**meta['model'])
    except (TypeError, ValueError) as e:
      raise UnreadableError(f'{where}: bad model config ({e})') from None
    section = lora_section(meta)
    if section is None:
      graphdef, state = decoder.abstract_params(model_cfg)
    else:
      base = run_base(meta, log, where)
      graphdef, state = lora.attach(base.graphdef, base.params, section,
                                    jax.random.key(0))
    _restore_params(manager, step, state, meta)
  except (ModelSpecError, errors.ConfigError):
    raise
  except Exception as e:  # pylint: disable=broad-except
    # Orbax reports missing or mismatched arrays with assorted types.
    if checkpoint_lib.removed(directory, step):
      raise UnreadableError(f'{where}: ' + checkpoint_lib.removed_message(
          directory, step)) from None
    if isinstance(e, checkpoint_lib.DamagedError):
      raise UnreadableError(f'{where}: {e}') from None
    raise UnreadableError(f'{where}: cannot read its params '
                         f'({checkpoint_lib.describe_damage(e)})') from None
  finally:
    manager.close()
  params = _placed(state)  # host arrays, each device given its shard
  if section is not None:  # As the run computed it: W x + B A x, not merged.
    params = nnx.merge_state(base.params, params)
  tokenizer = _run_tokenizer(where, meta.get('config', {}).get('model', {}),
                             model_cfg)
  log(f'loaded {workdir} step {step}: {model_cfg.num_layers} layers, '
      f'{model_config.param_count(model_cfg) / 1e6:.2f}M params')
  return LoadedModel(name=f'{workdir}@{step}', model_cfg=model_cfg,
                graphdef=graphdef, params=params, tokenizer=tokenizer)


def _restore_params(manager: ocp.CheckpointManager, step: int,
                    state: nnx.State, meta: dict[str, Any]) -> None:
  """Fills `state` (abstract or real) with the checkpoint's `params`,
  checked against the checksums in its `meta`.

  Raises:
    DamagedError: a param differs from its saved checksum.
  """
  # Train states hold each param as {'value': array}; only the params are
  # restored, not the optimizer state or the reference params.
  target = {'params': jax.tree.map(
      lambda x: {'value': jax.ShapeDtypeStruct(x.shape, x.dtype)},
      nnx.to_pure_dict(state))}
  restored = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.PyTreeRestore(
          item=target,
          restore_args=jax.tree.map(
              lambda _: ocp.RestoreArgs(restore_type=np.ndarray), target),
          partial_restore=True)))
  checkpoint_lib.verify(meta, state=restored.state)
  pure = jax.tree.map(lambda leaf: leaf['value'], restored.state['params'],
                      is_leaf=lambda x: isinstance(x, dict) and 'value' in x)
  nnx.replace_by_pure_dict(state, pure)


def lora_section(meta: dict[str, Any]) -> lora.LoraSection | None:
  """The model.lora settings a checkpoint's run trained with; None when it
  trained every weight."""
  section = meta.get('config', {}).get('model', {}).get('lora') or {}
  return lora.LoraSection(**section) if section.get('rank') else None


def run_base(meta: dict, log: Log = _ignore, where: str = '') -> LoadedModel:
  """The base a LoRA run's adapter sits on, rebuilt as the run built it (its
  `model.path`, or its preset from its seed), checked by `lora.check_base`."""
  base = load(INIT, _model_config(meta['config']), log=log)
  lora.check_base(meta, base.params, where, UnreadableError)
  return base


def _model_config(saved: dict[str, Any]) -> config_lib.Config:
  """The default config with a saved config's model section and seed, all
  that rebuilding its model reads. The rest is left out: it may hold keys
  of another version's schema, or names (a custom rl.advantage) that the
  run's own imports registered and this process has not."""
  c = config_lib.base_config()
  c.seed = saved.get('seed', c.seed)
  c.warmstart.enabled = False  # as under LoRA; the base reads none of it
  for key, value in saved.get('model', {}).items():
    if key == 'lora' and isinstance(value, dict):
      for name, setting in value.items():
        if name in c.model.lora:
          c.model.lora[name] = setting
    elif key in c.model:
      c.model[key] = value
  return config_lib.from_config_dict(c)


def load_adapter(workdir: str, step: int, log: Log = _ignore
                 ) -> tuple[LoadedModel, lora.LoraSection, nnx.GraphDef,
                            nnx.State]:
  """A LoRA run's checkpoint `step`: (base model, settings, adapted
  graphdef, adapter).

  Raises:
    ModelSpecError: the checkpoint is not a LoRA run's.
  """
  manager = checkpoint_lib.reader(os.path.join(workdir, CHECKPOINTS))
  try:
    meta = dict(manager.restore(
        step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta)
    section = lora_section(meta)
    if section is None:
      raise ModelSpecError(f'{workdir} step {step}: the run trained every '
                           'weight (model.lora.rank = 0): it has no adapter')
    base = run_base(meta, log, f'{workdir} step {step}')
    graphdef, adapter = lora.attach(base.graphdef, base.params, section,
                                    jax.random.key(0))
    _restore_params(manager, step, adapter, meta)
  except checkpoint_lib.DamagedError as e:
    raise UnreadableError(f'{workdir} step {step}: {e}') from None
  finally:
    manager.close()
  return base, section, graphdef, adapter


def _run_tokenizer(where: str, model: dict[str, Any],
                   model_cfg: model_config.ModelConfig):
  """The tokenizer a run trained with, from its saved model section."""
  path = model.get('path')
  if not path:
    try:
      return tokenizer_lib.make_tokenizer(model.get('tokenizer', 'auto'))
    except ValueError as e:
      raise UnreadableError(f'{where}: {e}') from None
  try:
    source = pretrained.resolve(path)
    if not os.path.exists(source):
      raise UnreadableError(
          f"{where}: the run's model.path {source} is missing (its "
          'tokenizer is needed)')
    tokenizer = pretrained.load_tokenizer(source,
                                          vocab_size=model_cfg.vocab_size)
    return tokenizer.with_prompts(chat=model.get('chat_template', True),
                                  system=model.get('system_prompt'))
  except ModelSpecError:
    raise
  except (errors.UserError, ValueError, OSError) as e:
    raise UnreadableError(f"{where}: the run's tokenizer ({path}): {e}"
                      ) from None
