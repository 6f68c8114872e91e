"""The training loop: build, warm start, rollout, step, evaluate, checkpoint."""

from collections.abc import Callable
import contextlib
import dataclasses
import os
import time

import jax
import ml_collections

from jaxgrpo import build
from jaxgrpo import checkpoint as checkpoint_lib
from jaxgrpo import config_lib
from jaxgrpo import console as console_lib
from jaxgrpo import errors
from jaxgrpo import evaluate
from jaxgrpo import metrics as metrics_lib
from jaxgrpo import multihost
from jaxgrpo import optimizer as optimizer_lib
from jaxgrpo import plot as plot_lib
from jaxgrpo import preemption
from jaxgrpo import sharding
from jaxgrpo import summary as summary_lib
from jaxgrpo import train_state as train_state_lib
from jaxgrpo import train_step as train_step_lib
from jaxgrpo import warmstart
from jaxgrpo.data import curriculum as curriculum_lib
from jaxgrpo.data import loading
from jaxgrpo.data import mixture
from jaxgrpo.data import snooze
from jaxgrpo.data import sources
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.generate import sampling as sampling_lib
from jaxgrpo.generate.sampler import Generator
from jaxgrpo.model import config as model_config
from jaxgrpo.model import decoder
from jaxgrpo.rl import rollout as rollout_lib

Log = Callable[[str], None]


def _sampler_state(source: mixture.MixtureSampler,
                   rollout: rollout_lib.Rollout) -> dict:
  """The data-side state a checkpoint holds: the sampler's per-example
  tables and the rollout counters and carried groups (numpy arrays)."""
  return {'source': source.get_state(), 'rollout': rollout.get_state()}


def _save(ckpt, step, state, source, rollout, meta, ids=None,
          writer=None) -> None:
  data = _sampler_state(source, rollout)
  if ids:
    data['ids'] = ids
  ckpt.save(step, state, data, meta)
  if writer is not None:
    writer.sync()  # an object-store workdir gets the metrics with each save


@dataclasses.dataclass(frozen=True)
class StepInfo:
  """What `run`'s `on_step` callback sees after each step.

  Attributes:
    step: the step just done.
    state: the train state after it (params, optimizer state); valid
      during the call only: the next step donates its buffers (copy what
      you keep, e.g. with jax.device_get).
    metrics: the step's metrics, as written to metrics.jsonl.
  """

  step: int
  state: train_state_lib.TrainState
  metrics: dict[str, float]
  _source: mixture.MixtureSampler
  _rollout: rollout_lib.Rollout

  def sampler_state(self) -> dict:
    """The data-side state a checkpoint holds (see `_sampler_state`)."""
    return _sampler_state(self._source, self._rollout)


def run(
    config: ml_collections.ConfigDict | config_lib.Config,
    workdir: str,
    *,
    log: Log = console_lib.print_line,
    on_step: Callable[[StepInfo], None] | None = None,
    progress: bool = False,
    quiet: bool = False,
) -> summary_lib.RunSummary:
  """Trains per `config`, resuming from `workdir` when it holds a checkpoint.

  Args:
    config: the run's ConfigDict (validated here) or a validated Config.
    workdir: where checkpoints and `metrics.jsonl` go.
    log: receives the lines the run shows.
    on_step: called after each step (and its checkpoint, when one is due)
      on every process, e.g. for custom logging or checks; an exception it
      raises ends the run.
    progress: show progress bars with rate and time left (stderr) for the
      warm start, evaluation and training steps.
    quiet: show only what needs attention (a resume, skipped updates, a
      stop signal) and the final summary.

  Returns:
    The run summary.
  """
  cfg = (
      config
      if isinstance(config, config_lib.Config)
      else config_lib.from_config_dict(config)
  )
  # Closes what the run starts (verifier worker processes) however it ends.
  with contextlib.ExitStack() as resources:
    console = console_lib.Console(log, progress=progress, quiet=quiet)
    return _run(cfg, workdir, console, resources, on_step)


def _postfix(metrics: dict[str, float]) -> str:
  """A step's headline numbers, for the progress bar."""
  parts = []
  for key, label in (('reward/mean', 'reward'), ('rollout/efficiency', 'eff'),
                     ('eval/accuracy', 'eval')):
    if key in metrics:
      parts.append(f'{label} {metrics[key]:.3f}')
  return ' '.join(parts)


def _explain_no_update(step: int, metrics: dict[str, float], ro,
                       console: console_lib.Console, waiting: bool) -> None:
  """Says why a step took no update (a short batch only when it starts
  waiting, not on every step it goes on waiting)."""
  rounds = int(metrics.get('rollout/rounds', 0))
  held = int(metrics.get('rollout/held', 0))
  if held:
    if not waiting:
      console.notice(
          f'step {step}: {held} of {ro.batch_size} informative groups after '
          f'{rounds} rounds (rollout.max_rounds={ro.max_rounds}); no update '
          "until the batch is full (rollout.short_batch='wait'; train/skipped "
          'counts the steps)')
  elif rounds:
    console.notice(f'step {step}: no informative group in {rounds} rounds; '
                   'update skipped')
  else:
    console.notice(
        f'step {step}: no dataset had a prompt to offer (every stratum '
        'postponed by the curriculum, or every example filtered); update '
        'skipped')


def _run(
    cfg: config_lib.Config,
    workdir: str,
    console: console_lib.Console,
    resources: contextlib.ExitStack,
    on_step: Callable[[StepInfo], None] | None = None,
) -> summary_lib.RunSummary:
  """The body of `run`; `resources` closes what it opens."""
  t_start = time.perf_counter()
  d = cfg.distributed
  multihost.initialize(d.initialize, coordinator=d.coordinator,
                       num_processes=d.num_processes, process_id=d.process_id,
                       log=console.info)
  console.enabled = multihost.is_main()
  log = console.info
  workdir = checkpoint_lib.absolute(workdir)
  build.check_workdir(workdir)
  build.enter_mesh(cfg, log, resources)

  # Data and reward.
  rng = jax.random.key(cfg.seed)
  init_rng, warm_rng, run_rng, eval_rng = jax.random.split(rng, 4)
  pretrained_model = build.load_pretrained(cfg, log) if cfg.model.path else None
  if pretrained_model is not None:
    tokenizer = pretrained_model.tokenizer
  else:
    tokenizer = tokenizer_lib.make_tokenizer(
        'char' if cfg.model.tokenizer == 'auto' else cfg.model.tokenizer)
  datasets = [loading.load_dataset(cfg, entry, tokenizer)
              for entry in cfg.data.datasets]
  eval_examples = [ex for _, _, held_out in datasets for ex in held_out]
  # The first examples of each training set: checked here, and what the
  # warm start trains on (read once: records may come from large files).
  head_examples = [ex for _, train, _ in datasets for ex in loading.peek(train)]
  loading.check_lengths(cfg, tokenizer, head_examples + eval_examples)
  scorer = resources.enter_context(build.build_scorer(cfg))

  # Model, generators, optimizer.
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
  ro = cfg.rollout
  generator = Generator(
      graphdef=graphdef, model_cfg=model_cfg,
      sampling=sampling_lib.Sampling(
          temperature=ro.temperature, top_k=ro.top_k, top_p=ro.top_p),
      max_new_tokens=ro.max_new_tokens, num_samples=ro.group_size,
      stop_tokens=tuple(getattr(tokenizer, 'stop_ids', (tokenizer.eos_id,))),
      pad_id=tokenizer.pad_id,
  )
  eval_generator = dataclasses.replace(
      generator, num_samples=cfg.eval.num_samples,
      sampling=sampling_lib.Sampling(temperature=cfg.eval.temperature),
  )
  num_updates = cfg.total_steps * cfg.rl.num_iterations * cfg.rl.num_minibatches
  optimizer = optimizer_lib.make_optimizer(
      learning_rate=cfg.optim.learning_rate,
      warmup_steps=cfg.optim.warmup_steps,
      total_steps=max(num_updates, cfg.optim.warmup_steps + 1),
      max_grad_norm=cfg.optim.max_grad_norm,
      weight_decay=cfg.optim.weight_decay,
      schedule=cfg.optim.schedule,
  )
  keep_reference = cfg.rl.beta > 0
  # The state's placement, and a restore target that lands on it.
  abstract_state = train_state_lib.abstract_train_state(
      graphdef, params, optimizer, keep_reference=keep_reference)
  state_shardings = sharding.train_state_shardings(abstract_state)
  abstract_state = sharding.with_shardings(abstract_state, state_shardings)
  batch_spec = train_step_lib.abstract_batch(
      ro.batch_size, ro.group_size, ro.max_prompt_len, ro.max_new_tokens)
  batch_shardings = sharding.batch_shardings(batch_spec)
  step_fn = train_step_lib.make_train_step(
      graphdef=graphdef, optimizer=optimizer,
      loss_cfg=train_step_lib.LossConfig(
          **{key: getattr(cfg.rl, key) for key in train_step_lib.RULES},
          temperature=ro.temperature, max_completion_len=ro.max_new_tokens,
      ),
      num_iterations=cfg.rl.num_iterations,
      num_minibatches=cfg.rl.num_minibatches,
      remat=cfg.model.remat,
      state_shardings=state_shardings,
      batch_shardings=batch_shardings,
  )
  build.check_memory(cfg, step_fn, abstract_state, batch_spec, log)

  cur = cfg.curriculum
  strata = curriculum_lib.load(
      cur.strata, {spec.name: train for spec, train, _ in datasets},
      edges=cur.bands, checkpoints=cur.checkpoints, prior=cur.prior,
      log=log) if cur.strata else None
  source = mixture.MixtureSampler(
      [(spec, train) for spec, train, _ in datasets],
      balance=cfg.data.balance, batch_size=ro.batch_size, seed=cfg.seed,
      strata=strata,
      curriculum=curriculum_lib.Curriculum(
          [curriculum_lib.Stage(s['step'], s['weights'])
           for s in cur.stages]),
      log=log,
  )
  rollout = rollout_lib.Rollout(
      rollout_lib.RolloutConfig.from_section(ro, cfg.rl.advantage),
      source, tokenizer, generator, scorer,
  )

  def run_eval(params, step: int) -> dict[str, float]:
    with console.bar(len(eval_examples), desc=f'eval (step {step})',
                     unit='ex') as bar:
      rewards = evaluate.sample_rewards(
          eval_generator, params, tokenizer, eval_examples, scorer,
          jax.random.fold_in(eval_rng, step),
          max_prompt_len=ro.max_prompt_len,
          truncate=ro.long_prompts == 'truncate', on_chunk=bar.update,
      )
    return evaluate.accuracy_metrics(eval_examples, rewards)

  # Resume, or start (with the warm start) from scratch.
  ckpt = checkpoint_lib.Checkpointer(
      os.path.join(workdir, 'checkpoints'),
      every=cfg.checkpoint.every, max_to_keep=cfg.checkpoint.max_to_keep,
  )
  meta = {
      'config': config_lib.to_dict(cfg),
      'model': dataclasses.asdict(model_cfg),
      'datasets': {spec.name: {'size': len(train),
                               'fingerprint': sources.fingerprint(train)}
                   for spec, train, _ in datasets},
  }
  remap = cfg.checkpoint.on_dataset_change == 'remap'
  # Hashes of every example id (8 bytes each), saved so that a resume with
  # a changed dataset can match sampler state by id.
  ids = ({spec.name: snooze.id_hashes(train[i].id for i in range(len(train)))
          for spec, train, _ in datasets} if remap else None)
  latest = ckpt.latest_step()
  resumed_from = latest
  if latest is not None:
    changed = checkpoint_lib.check_resumable(
        ckpt.read_meta(latest), step=latest, directory=ckpt.directory,
        model=meta['model'], datasets=meta['datasets'], remap=remap)
    restored = ckpt.restore(latest, abstract_state)
    state = sharding.shard(restored.state, state_shardings)
    saved_ids = restored.data.get('ids', {})
    for name in changed:
      if name in restored.data['source']['tables'] and name not in saved_ids:
        raise errors.ResumeError(
            f'dataset {name!r} changed since the checkpoint of step {latest} '
            f'in {ckpt.directory}, which holds no example ids to match its '
            "sampler state by (they are saved from the first run with "
            "checkpoint.on_dataset_change='remap'); restore the dataset or "
            'use a new --workdir')
    report = source.set_state(
        restored.data['source'],
        remap={name: (saved_ids.get(name), ids[name]) for name in changed})
    for name, counts in report.items():
      console.notice(
          f'dataset {name!r} changed: sampler state kept for '
          f'{counts["kept"]} examples by id, {counts["new"]} new, '
          f'{counts["removed"]} removed')
    rollout.set_state(restored.data['rollout'])
    meta = {**restored.meta, **meta}
    console.notice(f'resumed from {workdir} at step {latest}')
  else:
    if cfg.warmstart.enabled and cfg.warmstart.max_steps > 0:
      ws = cfg.warmstart
      log(f'warm start: supervised steps until the sampled pass rate reaches '
          f'{ws.target_pass_rate:.2f} (at most {ws.max_steps} steps)')
      with console.bar(ws.max_steps, desc='warm start', unit='step') as bar:

        def on_warm_step(_, rate):
          bar.update(1)
          if rate is not None:
            bar.set_postfix_str(f'pass rate {rate:.2f}')

        result = warmstart.warm_start(
            graphdef, params, tokenizer=tokenizer,
            train_examples=head_examples, check_generator=generator,
            scorer=scorer, rng=warm_rng, max_steps=ws.max_steps,
            batch_size=ws.batch_size, learning_rate=ws.learning_rate,
            target_pass_rate=ws.target_pass_rate, check_every=ws.check_every,
            check_examples=ws.check_examples,
            max_prompt_len=ro.max_prompt_len,
            truncate_prompts=ro.long_prompts == 'truncate',
            seq_len=ro.max_prompt_len + ro.max_new_tokens, progress=log,
            on_step=on_warm_step,
        )
      params = result.params
      meta['warmstart'] = {'steps': result.steps,
                           'pass_rate': result.pass_rate,
                           'seconds': result.seconds}
    state = sharding.shard(
        train_state_lib.create_train_state(
            graphdef, params, optimizer, keep_reference=keep_reference),
        state_shardings)

  # A fresh start drops lines a run killed before its first checkpoint left.
  writer = metrics_lib.MetricsWriter(
      workdir, resume_step=-1 if latest is None else latest,
      enabled=multihost.is_main(), tensorboard=cfg.tensorboard)
  if writer.tensorboard is not None:
    log(f'TensorBoard events: {writer.tensorboard.logdir}')
  start_step = latest or 0
  if latest is None:
    first = run_eval(state.params, 0)
    writer.write(0, first)
    log(f'step 0: held-out accuracy {first["eval/accuracy"]:.3f}')
    _save(ckpt, 0, state, source, rollout, meta, ids)

  window = metrics_lib.ConsoleWindow()
  log(f'GRPO: {cfg.total_steps} steps of {ro.batch_size} prompts x '
      f'{ro.group_size} samples, model {model_name} '
      f'({model_config.param_count(model_cfg) / 1e6:.2f}M params)')
  waiting = False  # whether the last step held a short batch

  def _train_one_step(step: int) -> dict[str, float]:
    nonlocal state, waiting
    t0 = time.perf_counter()
    step_rng = jax.random.fold_in(run_rng, step)
    result = rollout.collect(state.params, jax.random.fold_in(step_rng, 0),
                             step)
    metrics = dict(result.metrics)
    if result.batch is not None:
      # Placed here, not by jit: under a mesh spanning processes each
      # process fills only its own devices' rows.
      batch = sharding.shard(result.batch, batch_shardings)
      state, train_metrics = step_fn(
          state, batch, jax.random.fold_in(step_rng, 1))
      metrics.update(
          {k: float(v) for k, v in jax.device_get(train_metrics).items()})
    else:
      metrics['train/skipped'] = 1.0
      _explain_no_update(step, metrics, ro, console, waiting)
    waiting = bool(metrics.get('rollout/held'))
    metrics['perf/step_s'] = time.perf_counter() - t0
    if cfg.eval.every and (step % cfg.eval.every == 0
                           or step == cfg.total_steps):
      metrics.update(run_eval(state.params, step))
    return metrics

  nonfinite_run, stopped_by, step = 0, None, start_step
  last_save = loop_start = time.monotonic()
  with preemption.StopRequest() as stop, console.bar(
      cfg.total_steps, initial=start_step, desc='GRPO', unit='step') as bar:
    for step in range(start_step + 1, cfg.total_steps + 1):
      metrics = _train_one_step(step)
      nonfinite_run = (nonfinite_run + 1 if metrics.get('train/nonfinite')
                       else 0)
      every = cfg.distributed.check_every
      if every and jax.process_count() > 1 and step % every == 0:
        # Host drift (different files or code on one host) stops the run.
        multihost.check_agree(
            multihost.digest(_sampler_state(source, rollout)),
            what='sampler state', step=step)
      writer.write(step, metrics)
      window.add(metrics)
      bar.update(1)
      bar.set_postfix_str(_postfix(metrics), refresh=False)
      if step % cfg.log_every == 0 or step == cfg.total_steps:
        line = window.line(step, cfg.total_steps, metrics)
        if 'eval/accuracy' in metrics:
          line += f'  eval {metrics["eval/accuracy"]:.3f}'
        if step < cfg.total_steps:
          per_step = (time.monotonic() - loop_start) / (step - start_step)
          line += ('  eta ' + console_lib.format_seconds(
              per_step * (cfg.total_steps - step)))
        log(line)
      minutes = (time.monotonic() - last_save) / 60
      if (ckpt.should_save(step) or step == cfg.total_steps
          or stop.signal is not None
          or 0 < cfg.checkpoint.every_minutes <= minutes):
        _save(ckpt, step, state, source, rollout, meta, ids, writer)
        last_save = time.monotonic()
      if on_step is not None:
        on_step(StepInfo(step, state, metrics, source, rollout))
      if nonfinite_run >= cfg.rl.max_nonfinite_steps:
        ckpt.close()
        writer.close()
        raise errors.TrainingError(
            f'step {step}: NaN/inf loss or gradients in {nonfinite_run} '
            'steps in a row (those updates were skipped, so the params are the '
            f'last good ones, saved in {ckpt.directory}); lower '
            'optim.learning_rate or check the rewards, then resume')
      if stop.signal is not None:
        stopped_by = stop.signal
        console.notice(
            f'{stop.signal} received: saved the checkpoint of step {step} '
            f'in {ckpt.directory} and stopped; run the same command to resume')
        break
  ckpt.close()
  writer.close()

  summary = summary_lib.summarize(
      metrics_lib.read_metrics(workdir) if multihost.is_main() else [],
      steps=step,
      resumed_from=resumed_from, stopped_by=stopped_by,
      warmstart=meta.get('warmstart', {}),
      cum_prompts_generated=rollout.cum_prompts_generated,
      cum_groups_used=rollout.cum_groups_used,
      seconds=time.perf_counter() - t_start,
      dataset_names=[d.name for d in cfg.data.datasets], workdir=workdir)
  console.notice(summary_lib.format_summary(summary))
  if cfg.plots and multihost.is_main():
    written = plot_lib.plot_run(workdir, log=lambda _: None)
    if written:
      log(f'plots: {len(written)} PNGs in {os.path.dirname(written[0])} '
          '(jaxgrpo-plot redraws them)')
  return summary
