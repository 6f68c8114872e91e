"""A training run's parts, built from its validated config.

`build_run` builds them all, as one `Run`: the mesh, data, verifiers,
model, optimizer, compiled train step, prompt sampler, rollout, evaluator
and checkpointer; `jaxgrpo.train` runs the loop over them. Each builder
turns config mistakes into a ConfigError naming the key: the verifiers and
their worker pool, a pretrained model, the device mesh, and the compiled
train step's memory check. `jaxgrpo-eval` and `jaxgrpo-stratify` reuse the
scorer and the model loader.

Size: every part of a run is built here, in the order it depends on the
others, each builder beside the config keys it reads and the errors it
raises for them.
"""

from collections.abc import Callable
import contextlib
import dataclasses
import logging
import math
import os
import threading
import time
from typing import Any

import jax
import numpy as np
import optax

from jaxgrpo import checkpoint as checkpoint_lib
from jaxgrpo import config_lib
from jaxgrpo import errors
from jaxgrpo import evaluate
from jaxgrpo import optimizer as optimizer_lib
from jaxgrpo import sharding
from jaxgrpo import train_state as train_state_lib
from jaxgrpo import train_step as train_step_lib
from jaxgrpo import verifiers
from jaxgrpo import warmstart
from jaxgrpo.data import curriculum as curriculum_lib
from jaxgrpo.data import loading
from jaxgrpo.data import mixture
from jaxgrpo.data import snooze
from jaxgrpo.data import sources
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.example import Example
from jaxgrpo.generate import continuous
from jaxgrpo.generate import sampling as sampling_lib
from jaxgrpo.generate.generator import Generator
from jaxgrpo.model import attention
from jaxgrpo.model import config as model_config
from jaxgrpo.model import decoder
from jaxgrpo.model import lora as lora_lib
from jaxgrpo.model import pretrained
from jaxgrpo.reporting import console as console_lib
from jaxgrpo.rl import advantages
from jaxgrpo.rl import rollout as rollout_lib
from jaxgrpo.typing import PyTree, TrainBatch
from jaxgrpo.verifiers import pool as verifier_pool

Log = Callable[[str], None]


def built_verifiers(cfg: config_lib.Config) -> tuple[dict, dict]:
  """(verifier, short name) of each dataset, by name; ConfigError names
  the entry's verifier key (an unknown name, a bad option)."""
  verifier_pool.import_modules(cfg.verify.imports)  # (done: a no-op)
  built, names = {}, {}
  for i, entry in enumerate(cfg.data.datasets):
    key = f'data.datasets[{i}].verifier'
    try:
      built[entry.name] = verifiers.from_config(entry.verifier, key)
    except ValueError as e:
      raise errors.ConfigError(str(e)) from None
    names[entry.name] = _verifier_name(entry.verifier)
  return built, names


def _check_estimator(cfg: config_lib.Config) -> None:
  """Runs `rl.advantage` on a [B, G] batch of rewards once, before
  anything loads: a registered estimator that fails or returns the wrong
  shape or type is told now, not at the first informative step."""
  rewards = np.linspace(0.0, 1.0, cfg.rollout.batch_size
                        * cfg.rollout.group_size, dtype=np.float32)
  try:
    advantages.compute_advantages(rewards.reshape(
        cfg.rollout.batch_size, cfg.rollout.group_size), cfg.rl.advantage)
  except Exception as e:  # pylint: disable=broad-except
    raise errors.ConfigError(
        str(e) if str(e).startswith('rl.advantage=') else
        f'rl.advantage={cfg.rl.advantage!r}: the estimator fails on [B, G] '
        f'rewards ({type(e).__name__}: {e})') from None


def build_scorer(cfg: config_lib.Config,
                 verifiers: tuple[dict, dict] | None = None
                 ) -> verifier_pool.Scorer:
  """Each dataset's verifier (`verifiers`, when `built_verifiers` made them
  already), scored per cfg.verify; errors name the key."""
  built, names = verifiers or built_verifiers(cfg)
  try:
    scorer = verifier_pool.Scorer(
        built, workers=cfg.verify.workers, timeout_s=cfg.verify.timeout_s,
        imports=cfg.verify.imports, names=names)
  except errors.ConfigError:
    raise  # names its key (verify.imports, when a worker cannot import it)
  except ValueError as e:
    raise errors.ConfigError(f'verify.workers={cfg.verify.workers}: {e}') from None
  if (scorer.limited_on_main_thread_only
      and threading.current_thread() is not threading.main_thread()):
    logging.getLogger('jaxgrpo').warning(
        'verify.timeout_s=%g is not enforced: with verify.workers=0 the '
        'verifiers run in this thread, and only the main thread has a timer; '
        'set verify.workers >= 1 (or run from the main thread)',
        cfg.verify.timeout_s)
  return scorer


def load_pretrained(cfg: config_lib.Config, log: Log):
  """The model at model.path with its tokenizer, set up per cfg.model."""
  if cfg.model.tokenizer in ('char', 'byte'):
    raise errors.ConfigError(
        f'model.tokenizer={cfg.model.tokenizer!r} does not fit the pretrained '
        f'model.path={cfg.model.path!r}; use \'auto\' (its own tokenizer)')
  t0 = time.perf_counter()
  model = pretrained.load(cfg.model.path, dtype=cfg.model.dtype,
                          param_dtype=cfg.model.param_dtype)
  try:
    tokenizer = model.tokenizer.with_prompts(
        chat=cfg.model.chat_template, system=cfg.model.system_prompt)
  except ValueError as e:
    raise errors.ConfigError(str(e)) from None
  log(f'loaded {model.source}: {model.cfg.num_layers} layers, '
      f'{model_config.param_count(model.cfg) / 1e6:.1f}M params, vocab '
      f'{model.cfg.vocab_size}, in {time.perf_counter() - t0:.1f}s')
  _check_positions(cfg, model, log)
  return dataclasses.replace(model, tokenizer=tokenizer)


def _check_positions(cfg: config_lib.Config, model, log: Log) -> None:
  """Stops a run whose prompts and completions pass a 'dynamic' RoPE's
  max_position_embeddings; says when they pass the positions the model was
  trained for (a 'yarn' RoPE's factor times its original length, when
  longer than max_position_embeddings: the Qwen model cards leave that as
  it was)."""
  ro = cfg.rollout
  length = ro.max_prompt_len + ro.max_new_tokens
  what = 'rollout.max_prompt_len + rollout.max_new_tokens'
  scaling = model.cfg.rope_scaling
  kind = scaling.rope_type if scaling is not None else None
  if kind == 'dynamic':
    try:
      scaling.check_length(length, what)
    except ValueError as e:
      raise errors.ConfigError(f'model.path={cfg.model.path!r}: {e}') from None
  context, reach = model.context, 'the model was trained for'
  if kind == 'yarn':
    extended = int(scaling.factor * scaling.original_max_position_embeddings)
    if extended > (context or 0):
      context, reach = extended, (
          'its yarn rope_scaling reaches (factor x '
          'original_max_position_embeddings)')
  if context and length > context:
    log(f'{what} = {length:,} positions, more than the {context:,} {reach}: '
        'positions past them are extrapolated, which usually degrades what '
        'it writes there')


def enter_mesh(
    cfg: config_lib.Config, log: Log, resources: contextlib.ExitStack
) -> None:
  """Builds cfg.mesh over every device and activates it for the run.

  One device gets a 1-device mesh: the same code path, at no measurable
  cost.
  """
  devices = jax.devices()
  shape = config_lib.mesh_shape(cfg, len(devices))
  resources.enter_context(sharding.use_mesh(
      sharding.make_mesh(*shape, devices=devices),
      sharding.merge_rules(cfg.mesh.rules)))
  if len(devices) > 1:
    log(f'mesh: data={shape[0]} fsdp={shape[1]} tensor={shape[2]} over '
        f'{len(devices)} {devices[0].platform} devices')


def _size(n: float) -> str:
  for unit in ('B', 'KiB', 'MiB', 'GiB'):
    if n < 1024 or unit == 'GiB':
      return f'{n:.1f} {unit}' if unit != 'B' else f'{int(n)} B'
    n /= 1024
  raise AssertionError('unreachable')


def check_memory(
    cfg: config_lib.Config,
    step_fn: Callable,
    state: train_state_lib.TrainState,
    batch: TrainBatch,
    log: Log,
) -> None:
  """Compiles the train step, logs its memory per device, checks the limit.

  Raises:
    ConfigError: it needs more than mesh.memory_limit_gib (or the device's
      own limit), with what to change.
  """
  # Typed as the loop's keys are (uncommitted), so that the loop's first
  # call finds this executable in jax's cache instead of compiling again.
  rng = jax.eval_shape(jax.random.key, 0)
  use = train_step_lib.memory_use(step_fn, state, batch, rng)
  if use is None:
    log('train step memory: not reported by this backend; not checked')
    return
  limit, where = _memory_limit(cfg)
  log(f'train step memory per device: arguments {_size(use.argument)}, '
      f'outputs {_size(use.output)} ({_size(use.alias)} in donated inputs), '
      f'temp {_size(use.temp)}, total {_size(use.total)}'
      + (f' of {_size(limit)}' if limit else ' (no device limit known)'))
  if limit and use.total > limit:
    ro, rl = cfg.rollout, cfg.rl
    raise errors.ConfigError(
        f'the train step needs {_size(use.total)} per device (arguments '
        f'{_size(use.argument)}, temp {_size(use.temp)}), more than '
        f'{_size(limit)} ({where}); shard params and optimizer state over '
        f'more devices (mesh.fsdp={cfg.mesh.fsdp}), recompute activations '
        f"(model.remat={cfg.model.remat!r}: 'dots' or 'full'), store params "
        f"in bfloat16 (model.param_dtype={cfg.model.param_dtype!r}), or "
        f'train on fewer completions at once (lower rollout.batch_size='
        f'{ro.batch_size}, or raise rl.num_minibatches={rl.num_minibatches})')


def _memory_limit(cfg: config_lib.Config) -> tuple[int | None, str]:
  """(bytes, where it comes from) of a device's memory; None: unknown."""
  gib = cfg.mesh.memory_limit_gib
  if gib:
    return int(gib * 2**30), f'mesh.memory_limit_gib={gib}'
  return sharding.device_memory_limit(), "the device's limit"


def check_kv_cache(cfg: config_lib.Config,
                   model_cfg: model_config.ModelConfig, log: Log) -> None:
  """Logs the rollout's KV cache per device (`kv_cache`).

  Raises:
    ConfigError: the cache alone needs more than a device's memory
      (mesh.memory_limit_gib, or the device's own limit), with what to
      change.
  """
  ro = cfg.rollout
  cache_bytes, rows, positions = kv_cache(cfg, model_cfg)
  limit, where = _memory_limit(cfg)
  log(f'rollout KV cache per device: {_size(cache_bytes)} ({rows} rows x '
      f'{positions} positions x {model_cfg.num_layers} layers, keys and '
      f'values in {model_cfg.dtype}; rollout.engine={ro.engine!r})')
  if limit and cache_bytes > limit:
    rows_from = (f'rollout.slots={ro.slots}' if ro.engine == 'continuous'
                 else f'rollout.round_size={ro.round_size!r}' + (
                     f' (max_round_size={ro.max_round_size})'
                     if ro.round_size == 'adaptive' else '')
                 + f' x rollout.group_size={ro.group_size}')
    raise errors.ConfigError(
        f'the rollout KV cache alone needs {_size(cache_bytes)} per device, '
        f'more than {_size(limit)} ({where}): {rows} rows from {rows_from}, '
        f'of {positions} positions (rollout.max_prompt_len={ro.max_prompt_len}'
        f' + rollout.max_new_tokens={ro.max_new_tokens} - 1); lower them, '
        f'compute in bfloat16 (model.dtype={model_cfg.dtype!r}), or split '
        f'the rows over more devices (mesh.data={cfg.mesh.data})')


def kv_cache(cfg: config_lib.Config,
             model_cfg: model_config.ModelConfig) -> tuple[int, int, int]:
  """(bytes per device, rows, positions) of the rollout's KV cache.

  The static engine holds rollout.round_size (max_round_size when
  adaptive) x group_size rows, the continuous engine rollout.slots, each
  of max_prompt_len + max_new_tokens - 1 positions (a sliding-window layer
  of the static engine keeps its window), every layer's keys and values;
  each device holds its shard as the cache's logical axes place it under
  the active mesh and its `mesh.rules` (by default the rows over the batch
  devices, the KV heads over `tensor`).
  """
  ro = cfg.rollout
  multiple = sharding.batch_multiple()
  positions = ro.max_prompt_len + ro.max_new_tokens - 1
  if ro.engine == 'static':
    prompts = (ro.max_round_size if ro.round_size == 'adaptive'
               else ro.round_size)
    rows = -(-prompts // multiple) * multiple * ro.group_size
  else:
    rows = continuous.padded_slots(ro.slots, multiple)
  cache = jax.eval_shape(lambda: attention.init_cache(
      model_cfg, rows, positions, window_rings=ro.engine == 'static'))
  per_device = 0
  for x in jax.tree.leaves(cache):
    placed = sharding.logical_sharding(attention.CACHE_AXES, x.shape)
    shape = x.shape if placed is None else placed.shard_shape(x.shape)
    per_device += math.prod(shape) * x.dtype.itemsize
  return per_device, rows, positions


def _verifier_name(value) -> str:
  """A short name of a verifier config value, for log lines."""
  if isinstance(value, str):
    return value
  if isinstance(value, dict):
    if 'parts' in value:
      return '+'.join(_verifier_name(p) for p in value['parts'])
    return str(value.get('name', '?'))
  if isinstance(value, (list, tuple)):
    return '+'.join(_verifier_name(p) for p in value)
  return str(value)


@dataclasses.dataclass(frozen=True)
class Run:
  """A training run's parts (`build_run`).

  Attributes:
    tokenizer: the model's tokenizer (its own for a pretrained model).
    model_cfg: the model's architecture.
    model_name: model.path, or the preset's name.
    graphdef: the policy's structure (nnx graphdef; adapted under model.lora).
    params: the initial trained params, placed on the mesh (a fresh start
      begins from them, after the warm start if any): the model's, or
      under model.lora its adapter.
    base: under model.lora, the base params (the first step consumes them).
    base_graphdef: under model.lora, the base model (the KL reference).
    generator: samples a rollout's completions.
    optimizer: the optax optimizer.
    keep_reference: whether the state keeps reference params (rl.beta > 0).
    abstract_state: the train state's shapes and shardings (restore target).
    state_shardings: where the train state lives.
    batch_shardings: where a train batch lives.
    step_fn: the compiled train step: (state, batch, rng) -> (state, metrics).
    head_examples: the first examples of each training set.
    warm_examples: those the warm start trains on: of the datasets GRPO
      draws from (`warmstart.drawn_examples`).
    scorer: each dataset's verifier.
    source: the prompt sampler over the datasets (mixture and curriculum).
    rollout: collects a step's batch of informative groups.
    evaluator: held-out accuracy of params at a step.
    ckpt: the checkpointer of workdir/checkpoints.
    meta: the notes each checkpoint holds (config, model, datasets).
    ids: example id hashes per dataset, saved for
      checkpoint.on_dataset_change='remap'; None otherwise.
    warm_rng: the warm start's key.
    run_rng: the GRPO steps' key (folded with the step).
  """

  tokenizer: Any
  model_cfg: model_config.ModelConfig
  model_name: str
  graphdef: Any
  params: PyTree
  base: PyTree | None
  base_graphdef: Any
  generator: Generator
  optimizer: optax.GradientTransformation
  keep_reference: bool
  abstract_state: train_state_lib.TrainState
  state_shardings: PyTree
  batch_shardings: PyTree
  step_fn: Callable
  head_examples: list[Example]
  warm_examples: list[Example]
  scorer: verifier_pool.Scorer
  source: mixture.MixtureSampler
  rollout: rollout_lib.Rollout
  evaluator: evaluate.Evaluator
  ckpt: checkpoint_lib.Checkpointer
  meta: dict[str, Any]
  ids: dict[str, Any] | None
  warm_rng: jax.Array
  run_rng: jax.Array

  def data_state(self) -> dict:
    """The data-side state a checkpoint holds: the sampler's per-example
    tables and the rollout counters and carried groups (numpy arrays)."""
    return {'source': self.source.get_state(),
            'rollout': self.rollout.get_state()}

  def save(self, step: int, state: train_state_lib.TrainState,
           meta: dict[str, Any]) -> None:
    """Starts the save of step `step`: `state`, the data side, `meta`."""
    data = self.data_state()
    if self.ids:
      data['ids'] = self.ids
    # Base weights under an adapter are not saved: a resume rebuilds them.
    self.ckpt.save(step, state.replace(base=None), data, meta)


def build_run(
    cfg: config_lib.Config,
    workdir: str,
    console: console_lib.Console,
    resources: contextlib.ExitStack,
) -> Run:
  """Builds every part of a run; `resources` closes what they open.

  Enters the mesh, loads the data and the model, compiles the train step
  (checking its memory), and builds the sampler, rollout, evaluator and
  checkpointer. Nothing is restored here (`resume.restore_or_start` does
  that); the workdir is checked and locked before (`jaxgrpo.workdir`).

  Length: it is the list of a run's parts, built in dependency order; each part
  is built by a function of its own.

  Raises:
    ConfigError: naming the config key at fault.
  """
  log = console.info
  # Checks the rollouts' settings and the verifiers before anything loads.
  rollout_cfg = rollout_lib.RolloutConfig.from_section(
      cfg.rollout, cfg.rl.advantage, cfg.rl.cut_completions)
  verifiers = built_verifiers(cfg)
  _check_estimator(cfg)
  enter_mesh(cfg, log, resources)
  init_rng, warm_rng, run_rng, eval_rng = jax.random.split(
      jax.random.key(cfg.seed), 4)
  pretrained_model = load_pretrained(cfg, log) if cfg.model.path else None
  if pretrained_model is not None:
    tokenizer = pretrained_model.tokenizer
  else:
    tokenizer = tokenizer_lib.make_tokenizer(cfg.model.tokenizer)
  datasets = [loading.load_dataset(cfg, entry, tokenizer)
              for entry in cfg.data.datasets]
  eval_examples = [ex for _, _, held_out in datasets for ex in held_out]
  for entry, (_, _, held_out) in zip(cfg.data.datasets, datasets):
    if not held_out:
      screened = entry.num_eval and (entry.kind == 'arithmetic' or any(
          (entry.eval_path, entry.eval_split, entry.holdout)))
      console.notice(
          f'dataset {entry.name!r} has no held-out examples (' + (
              'each was dropped as too long or skipped as a bad record'
              if screened else 'num_eval=0, or a file without eval_path, '
              'eval_split or holdout') + '): it is not evaluated')
  # The first examples of each training set: checked here, and what the
  # warm start trains on (read once: records may come from large files).
  head_examples = [ex for _, train, _ in datasets for ex in loading.peek(train)]
  loading.check_lengths(cfg, tokenizer, head_examples + eval_examples)
  # Apart: an eval_path file's ids may repeat the training file's (index
  # ids, or verl's extra_info.index, both count from 0).
  loading.check_ids(head_examples)
  loading.check_ids(eval_examples)
  for line in loading.held_out_overlap(
      head_examples, eval_examples,
      checked_all=len(head_examples) == sum(len(d[1]) for d in datasets)):
    console.notice(line)
  # The prompt sampler, strata read: a missing curriculum.strata is told
  # before the model loads and the step compiles.
  source = _source(cfg, datasets, log)
  scorer = resources.enter_context(build_scorer(cfg, verifiers))
  model_cfg, graphdef, params, model_name = _model(
      cfg, pretrained_model, tokenizer, init_rng)
  base_graphdef = base = None
  if cfg.model.lora.rank:
    base_graphdef, base = graphdef, params
    graphdef, params = lora_lib.attach(graphdef, params, cfg.model.lora,
                                       jax.random.fold_in(init_rng, 1))
    params = sharding.shard(params, sharding.param_shardings(params))
  ro = cfg.rollout
  generator = _generator(cfg, graphdef, model_cfg, tokenizer)
  eval_generator = dataclasses.replace(
      generator, num_samples=cfg.eval.num_samples,
      sampling=sampling_lib.Sampling(temperature=cfg.eval.temperature),
  )
  optimizer = _optimizer(cfg)
  keep_reference = cfg.rl.beta > 0 and base is None
  # The state's placement, and a restore target that lands on it.
  abstract_state = train_state_lib.abstract_train_state(
      graphdef, params, optimizer, keep_reference=keep_reference, base=base)
  state_shardings = sharding.train_state_shardings(abstract_state)
  abstract_state = sharding.with_shardings(abstract_state, state_shardings)
  batch_spec = train_step_lib.abstract_batch(
      ro.batch_size, ro.group_size, ro.max_prompt_len, ro.max_new_tokens)
  batch_shardings = sharding.batch_shardings(batch_spec)
  step_fn = _step_fn(cfg, graphdef, optimizer, state_shardings,
                     batch_shardings, base_graphdef)
  # Placed as the loop's batches are: the loop's first step then finds the
  # executable compiled here instead of compiling the step again.
  check_memory(cfg, step_fn, abstract_state,
               sharding.with_shardings(batch_spec, batch_shardings), log)
  check_kv_cache(cfg, model_cfg, log)
  rollout = rollout_lib.Rollout.for_model(
      rollout_cfg, source, tokenizer, generator if ro.engine == 'static' else
      continuous.ContinuousGenerator(generator=generator, slots=ro.slots),
      scorer,
  )
  evaluator = evaluate.Evaluator(
      eval_generator, tokenizer, eval_examples, scorer, eval_rng,
      max_prompt_len=ro.max_prompt_len,
      truncate=ro.long_prompts == 'truncate', console=console,
      threshold=ro.easy_threshold)
  ckpt = checkpoint_lib.Checkpointer(
      os.path.join(workdir, 'checkpoints'),
      every=cfg.checkpoint.every, max_to_keep=cfg.checkpoint.max_to_keep,
  )
  return Run(
      tokenizer=tokenizer, model_cfg=model_cfg, model_name=model_name,
      graphdef=graphdef, params=params, base=base,
      base_graphdef=base_graphdef, generator=generator,
      optimizer=optimizer, keep_reference=keep_reference,
      abstract_state=abstract_state, state_shardings=state_shardings,
      batch_shardings=batch_shardings, step_fn=step_fn,
      head_examples=head_examples, scorer=scorer, source=source,
      warm_examples=warmstart.drawn_examples(head_examples, cfg.data.datasets),
      rollout=rollout, evaluator=evaluator, ckpt=ckpt,
      meta=_meta(cfg, model_cfg, datasets, source, base),
      ids=_ids(cfg, datasets),
      warm_rng=warm_rng, run_rng=run_rng,
  )


def _model(cfg: config_lib.Config, pretrained_model, tokenizer,
           init_rng: jax.Array):
  """(model_cfg, graphdef, params placed on the mesh, model name)."""
  if pretrained_model is not None:
    model_cfg = pretrained_model.cfg
    graphdef, params = pretrained_model.graphdef, pretrained_model.params
    model_name = cfg.model.path
  else:
    try:
      model_cfg = model_config.preset(
          cfg.model.preset, vocab_size=tokenizer.vocab_size,
          dtype=cfg.model.dtype, param_dtype=cfg.model.param_dtype,
      )
    except ValueError as e:
      raise errors.ConfigError(f'model.preset: {e}') from None
    graphdef, params = decoder.init_params(model_cfg, init_rng)
    model_name = cfg.model.preset
  params = sharding.shard(params, sharding.param_shardings(params))
  return model_cfg, graphdef, params, model_name


def _generator(cfg: config_lib.Config, graphdef, model_cfg,
               tokenizer) -> Generator:
  """The rollout's sampler: rollout.group_size completions per prompt."""
  ro = cfg.rollout
  return Generator(
      graphdef=graphdef, model_cfg=model_cfg,
      sampling=sampling_lib.Sampling(
          temperature=ro.temperature, top_k=ro.top_k, top_p=ro.top_p),
      max_new_tokens=ro.max_new_tokens, num_samples=ro.group_size,
      stop_tokens=tuple(getattr(tokenizer, 'stop_ids', (tokenizer.eos_id,))),
      pad_id=tokenizer.pad_id,
  )


def _optimizer(cfg: config_lib.Config) -> optax.GradientTransformation:
  """The optimizer per cfg.optim, its schedule over every update."""
  num_updates = cfg.total_steps * cfg.rl.num_iterations * cfg.rl.num_minibatches
  return optimizer_lib.make_optimizer(
      learning_rate=cfg.optim.learning_rate,
      warmup_steps=cfg.optim.warmup_steps,
      total_steps=max(num_updates, cfg.optim.warmup_steps + 1),
      max_grad_norm=cfg.optim.max_grad_norm,
      weight_decay=cfg.optim.weight_decay,
      schedule=cfg.optim.schedule,
      param_dtype=cfg.model.param_dtype,
      seed=cfg.seed,
  )


def _step_fn(cfg: config_lib.Config, graphdef, optimizer, state_shardings,
             batch_shardings, base_graphdef) -> Callable:
  """The jitted train step per cfg.rl (loss, iterations, minibatches)."""
  return train_step_lib.make_train_step(
      graphdef=graphdef, optimizer=optimizer,
      loss_cfg=train_step_lib.LossConfig.from_sections(cfg.rl, cfg.rollout),
      num_iterations=cfg.rl.num_iterations,
      num_minibatches=cfg.rl.num_minibatches,
      remat=cfg.model.remat,
      base_graphdef=base_graphdef,
      state_shardings=state_shardings,
      batch_shardings=batch_shardings,
      scale_short=cfg.rollout.short_batch == 'scale',
  )


def _source(cfg: config_lib.Config, datasets,
            log: Log) -> mixture.MixtureSampler:
  """The prompt sampler: the mixture per cfg.data, the curriculum per
  cfg.curriculum (its strata loaded when configured)."""
  cur = cfg.curriculum
  strata = curriculum_lib.load(
      cur.strata, {spec.name: train for spec, train, _ in datasets},
      edges=cur.bands, checkpoints=cur.checkpoints, prior=cur.prior,
      log=log) if cur.strata else None
  for i, stage in enumerate(cur.stages):
    if stage['step'] > cfg.total_steps:
      log(f"curriculum.stages[{i}] starts at step {stage['step']}, after the "
          f'last step (total_steps={cfg.total_steps}): it never applies')
  return mixture.MixtureSampler(
      [(spec, train) for spec, train, _ in datasets],
      balance=cfg.data.balance, batch_size=cfg.rollout.batch_size,
      seed=cfg.seed, strata=strata,
      curriculum=curriculum_lib.Curriculum(
          [curriculum_lib.Stage(s['step'], s['weights'])
           for s in cur.stages]),
      log=log,
  )


def _meta(cfg: config_lib.Config, model_cfg, datasets,
          source: mixture.MixtureSampler, base) -> dict[str, Any]:
  """What each checkpoint notes: the config, the model, each dataset's
  size, fingerprint and files' digest, a LoRA run's base's checksum (a
  resume checks all of these), and the strata's counts and fingerprints (a
  resume says where they changed)."""
  return {
      **({'strata': curriculum_lib.notes(source.strata)}
         if source.strata else {}),
      'config': config_lib.to_dict(cfg),
      'model': dataclasses.asdict(model_cfg),
      'datasets': {spec.name: {'size': len(train),
                               'fingerprint': sources.fingerprint(train),
                               **_content(entry)}
                   for entry, (spec, train, _) in zip(cfg.data.datasets,
                                                      datasets)},
      **({} if base is None else {lora_lib.BASE: lora_lib.base_checksum(base)}),
  }


def _content(entry) -> dict[str, str]:
  """{'content': the digest of the bytes of the files a file kind's entry
  trains from} (a resume compares it: an edit that leaves the size and the
  sampled records alone changes it), or {} for `arithmetic` and `tfds`."""
  if entry.kind in ('arithmetic', 'tfds'):
    return {}
  return {'content': sources.content_digest(
      sources.data_files(entry.kind, entry.path))}


def _ids(cfg: config_lib.Config, datasets) -> dict[str, Any] | None:
  """Hashes of every example id (8 bytes each), saved so that a resume
  with a changed dataset can match sampler state by id; None unless
  checkpoint.on_dataset_change='remap'."""
  if cfg.checkpoint.on_dataset_change != 'remap':
    return None
  out = {}
  for spec, train, _ in datasets:
    out[spec.name] = snooze.id_hashes(train[i].id for i in range(len(train)))
    if len(set(out[spec.name].tolist())) < len(train):  # ids repeat
      loading.check_ids([train[i] for i in range(len(train))])
  return out
