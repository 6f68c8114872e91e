"""The training loop: build, warm start, rollout, step, evaluate, checkpoint."""

from collections.abc import Callable
import dataclasses
import os
import time

import grain
import jax
import ml_collections
import numpy as np

from jaxgrpo import checkpoint as checkpoint_lib
from jaxgrpo import config_lib
from jaxgrpo import errors
from jaxgrpo import evaluate
from jaxgrpo import metrics as metrics_lib
from jaxgrpo import optimizer as optimizer_lib
from jaxgrpo import preemption
from jaxgrpo import train_state as train_state_lib
from jaxgrpo import train_step as train_step_lib
from jaxgrpo import verifiers
from jaxgrpo import warmstart
from jaxgrpo.data import arithmetic
from jaxgrpo.data import mixture
from jaxgrpo.data import screening
from jaxgrpo.data import snooze
from jaxgrpo.data import sources
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.generate import sampling as sampling_lib
from jaxgrpo.generate.sampler import Generator
from jaxgrpo.model import config as model_config
from jaxgrpo.model import decoder
from jaxgrpo.rl import rollout as rollout_lib
from jaxgrpo.typing import Example

Log = Callable[[str], None]


def _print(line: str) -> None:
  print(line, flush=True)


@dataclasses.dataclass(frozen=True)
class RunSummary:
  """What a finished run reports (also printed as a table)."""

  steps: int
  resumed_from: int | None
  stopped_by: str | None
  warmstart_steps: int
  warmstart_pass_rate: float | None
  eval_accuracy_start: float | None
  eval_accuracy_end: float | None
  reward_first: float | None
  reward_last: float | None
  cum_prompts_generated: int
  cum_groups_used: int
  seconds: float
  # name -> (held-out accuracy start, end, mean batch share, snoozed at the
  # end, filtered at the end)
  datasets: dict[str, tuple] = dataclasses.field(default_factory=dict)


def _check_lengths(
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


_PEEK = 20_000


def _peek(dataset) -> list[Example]:
  """The first examples of a dataset (length checks, warm start)."""
  return [dataset[i] for i in range(min(len(dataset), _PEEK))]


def _policy(cfg: config_lib.Config, entry) -> snooze.PolicyConfig:
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


def _load_dataset(
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
      name=entry.name, weight=entry.weight, policy=_policy(cfg, entry),
      min_fraction=entry.min_fraction, skipped_records=skipped,
      dropped_long=dropped)
  return spec, train, held_out


def _check_workdir(workdir: str) -> None:
  """Fails early, in one line, when the workdir cannot be written."""
  probe = os.path.join(workdir, '.jaxgrpo-write-test')
  try:
    os.makedirs(workdir, exist_ok=True)
    with open(probe, 'w') as f:
      f.write('ok')
    os.remove(probe)
  except OSError as e:
    raise errors.ConfigError(
        f'--workdir {workdir}: cannot write there ({e.strerror or e})'
    ) from None


def _save(ckpt, step, state, source, rollout, meta) -> None:
  """Starts a checkpoint save; a full disk or lost permission ends the run
  with a message (the previous checkpoint is complete and stays)."""
  try:
    ckpt.save(step, state, {'source': source.get_state(),
                            'rollout': rollout.get_state()}, meta)
  except OSError as e:
    raise errors.TrainingError(
        f'could not write the checkpoint of step {step} to {ckpt.directory} '
        f'({e.strerror or e}); free space or fix permissions, then run the '
        f'same command to resume from step {ckpt.latest_step()}') from None


def _mean_of(records: list[dict], key: str) -> float | None:
  values = [r[key] for r in records if key in r]
  return float(np.mean(values)) if values else None


def run(
    config: ml_collections.ConfigDict | config_lib.Config,
    workdir: str,
    *,
    log: Log = _print,
) -> RunSummary:
  """Trains per `config`, resuming from `workdir` when it holds a checkpoint.

  Args:
    config: the run's ConfigDict (validated here) or a validated Config.
    workdir: where checkpoints and `metrics.jsonl` go.
    log: receives progress lines.

  Returns:
    The run summary.
  """
  cfg = (
      config
      if isinstance(config, config_lib.Config)
      else config_lib.from_config_dict(config)
  )
  t_start = time.perf_counter()
  workdir = os.path.abspath(workdir)
  _check_workdir(workdir)

  # Data and reward.
  tokenizer = tokenizer_lib.CharTokenizer()
  datasets = [_load_dataset(cfg, entry, tokenizer)
              for entry in cfg.data.datasets]
  eval_examples = [ex for _, _, held_out in datasets for ex in held_out]
  _check_lengths(cfg, tokenizer, [ex for _, train, held_out in datasets
                                  for ex in _peek(train) + held_out])
  verify_by_dataset = {}
  for i, entry in enumerate(cfg.data.datasets):
    try:
      verify_by_dataset[entry.name] = verifiers.get(entry.verifier)
    except ValueError as e:
      raise errors.ConfigError(f'data.datasets[{i}].verifier: {e}') from None

  def verify(text: str, example: Example) -> float:
    return verify_by_dataset[example.dataset](text, example)

  # Model, generators, optimizer.
  try:
    model_cfg = model_config.preset(
        cfg.model.preset, vocab_size=tokenizer.vocab_size,
        dtype=cfg.model.dtype, param_dtype=cfg.model.param_dtype,
    )
  except ValueError as e:
    raise errors.ConfigError(f'model.preset: {e}') from None
  rng = jax.random.key(cfg.seed)
  init_rng, warm_rng, run_rng, eval_rng = jax.random.split(rng, 4)
  graphdef, params = decoder.init_params(model_cfg, init_rng)
  ro = cfg.rollout
  generator = Generator(
      graphdef=graphdef, model_cfg=model_cfg,
      sampling=sampling_lib.Sampling(
          temperature=ro.temperature, top_k=ro.top_k, top_p=ro.top_p),
      max_new_tokens=ro.max_new_tokens, num_samples=ro.group_size,
      stop_tokens=(tokenizer.eos_id,), pad_id=tokenizer.pad_id,
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
  step_fn = train_step_lib.make_train_step(
      graphdef=graphdef, optimizer=optimizer,
      loss_cfg=train_step_lib.LossConfig(
          eps_low=cfg.rl.eps_low, eps_high=cfg.rl.eps_high,
          loss_agg=cfg.rl.loss_agg, beta=cfg.rl.beta,
          temperature=ro.temperature, max_completion_len=ro.max_new_tokens,
      ),
      num_iterations=cfg.rl.num_iterations,
      num_minibatches=cfg.rl.num_minibatches,
  )

  source = mixture.MixtureSampler(
      [(spec, train) for spec, train, _ in datasets],
      balance=cfg.data.balance, batch_size=ro.batch_size, seed=cfg.seed,
  )
  rollout = rollout_lib.Rollout(
      rollout_lib.RolloutConfig(
          batch_size=ro.batch_size, group_size=ro.group_size,
          round_size=ro.round_size, max_round_size=ro.max_round_size,
          max_rounds=ro.max_rounds,
          surplus=ro.surplus, max_prompt_len=ro.max_prompt_len,
          long_prompts=ro.long_prompts,
          easy_threshold=ro.easy_threshold, hard_threshold=ro.hard_threshold,
          advantage=cfg.rl.advantage,
      ),
      source, tokenizer, generator, verify,
      verifier_name='/'.join(sorted({d.verifier for d in cfg.data.datasets})),
  )

  def run_eval(params, step: int) -> dict[str, float]:
    rewards = evaluate.sample_rewards(
        eval_generator, params, tokenizer, eval_examples, verify,
        jax.random.fold_in(eval_rng, step), max_prompt_len=ro.max_prompt_len,
        truncate=ro.long_prompts == 'truncate',
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
  latest = ckpt.latest_step()
  resumed_from = latest
  if latest is not None:
    checkpoint_lib.check_resumable(
        ckpt.read_meta(latest), step=latest, directory=ckpt.directory,
        model=meta['model'], datasets=meta['datasets'])
    target = train_state_lib.create_train_state(
        graphdef, params, optimizer, keep_reference=keep_reference)
    restored = ckpt.restore(latest, target)
    state = restored.state
    source.set_state(restored.data['source'])
    rollout.set_state(restored.data['rollout'])
    meta = {**restored.meta, **meta}
    log(f'resumed from {workdir} at step {latest}')
  else:
    if cfg.warmstart.enabled and cfg.warmstart.max_steps > 0:
      ws = cfg.warmstart
      log(f'warm start: supervised steps until the sampled pass rate reaches '
          f'{ws.target_pass_rate:.2f} (at most {ws.max_steps} steps)')
      warm_examples = [ex for _, train, _ in datasets for ex in _peek(train)]
      result = warmstart.warm_start(
          graphdef, params, tokenizer=tokenizer,
          train_examples=warm_examples, check_generator=generator,
          verify=verify, rng=warm_rng, max_steps=ws.max_steps,
          batch_size=ws.batch_size, learning_rate=ws.learning_rate,
          target_pass_rate=ws.target_pass_rate, check_every=ws.check_every,
          check_examples=ws.check_examples,
          max_prompt_len=ro.max_prompt_len,
          truncate_prompts=ro.long_prompts == 'truncate',
          seq_len=ro.max_prompt_len + ro.max_new_tokens, progress=log,
      )
      params = result.params
      meta['warmstart'] = {'steps': result.steps,
                           'pass_rate': result.pass_rate,
                           'seconds': result.seconds}
    state = train_state_lib.create_train_state(
        graphdef, params, optimizer, keep_reference=keep_reference)

  # A fresh start drops lines a run killed before its first checkpoint left.
  writer = metrics_lib.MetricsWriter(
      workdir, resume_step=-1 if latest is None else latest)
  start_step = latest or 0
  if latest is None:
    first = run_eval(state.params, 0)
    writer.write(0, first)
    log(f'step 0: held-out accuracy {first["eval/accuracy"]:.3f}')
    _save(ckpt, 0, state, source, rollout, meta)

  window = metrics_lib.ConsoleWindow()
  log(f'GRPO: {cfg.total_steps} steps of {ro.batch_size} prompts x '
      f'{ro.group_size} samples, model {cfg.model.preset} '
      f'({model_config.param_count(model_cfg) / 1e6:.2f}M params)')
  def _train_one_step(step: int) -> dict[str, float]:
    nonlocal state
    t0 = time.perf_counter()
    step_rng = jax.random.fold_in(run_rng, step)
    result = rollout.collect(state.params, jax.random.fold_in(step_rng, 0),
                             step)
    metrics = dict(result.metrics)
    if result.batch is not None:
      state, train_metrics = step_fn(
          state, result.batch, jax.random.fold_in(step_rng, 1))
      metrics.update(
          {k: float(v) for k, v in jax.device_get(train_metrics).items()})
    else:
      metrics['train/skipped'] = 1.0
      log(f'step {step}: no informative group in {ro.max_rounds} rounds; '
          'update skipped')
    metrics['perf/step_s'] = time.perf_counter() - t0
    if cfg.eval.every and (step % cfg.eval.every == 0
                           or step == cfg.total_steps):
      metrics.update(run_eval(state.params, step))
    return metrics

  nonfinite_run, stopped_by, step = 0, None, start_step
  last_save = time.monotonic()
  with preemption.StopRequest() as stop:
    for step in range(start_step + 1, cfg.total_steps + 1):
      metrics = _train_one_step(step)
      nonfinite_run = nonfinite_run + 1 if metrics.get('train/nonfinite') else 0
      writer.write(step, metrics)
      window.add(metrics)
      if step % cfg.log_every == 0 or step == cfg.total_steps:
        line = window.line(step, cfg.total_steps, metrics)
        if 'eval/accuracy' in metrics:
          line += f'  eval {metrics["eval/accuracy"]:.3f}'
        log(line)
      minutes = (time.monotonic() - last_save) / 60
      if (ckpt.should_save(step) or step == cfg.total_steps
          or stop.signal is not None
          or 0 < cfg.checkpoint.every_minutes <= minutes):
        _save(ckpt, step, state, source, rollout, meta)
        last_save = time.monotonic()
      if nonfinite_run >= cfg.rl.max_nonfinite_steps:
        ckpt.close()
        writer.close()
        raise errors.TrainingError(
            f'step {step}: NaN/inf loss or gradients in {nonfinite_run} steps '
            'in a row (those updates were skipped, so the params are the '
            f'last good ones, saved in {ckpt.directory}); lower '
            'optim.learning_rate or check the rewards, then resume')
      if stop.signal is not None:
        stopped_by = stop.signal
        log(f'{stop.signal} received: saved the checkpoint of step {step} in '
            f'{ckpt.directory} and stopped; run the same command to resume')
        break
  ckpt.close()
  writer.close()

  records = metrics_lib.read_metrics(workdir)
  train_records = [r for r in records if 'reward/mean' in r]
  window_len = max(1, len(train_records) // 10)
  evals = [r for r in records if 'eval/accuracy' in r]
  ws_meta = meta.get('warmstart', {})
  summary = RunSummary(
      steps=step,
      resumed_from=resumed_from,
      stopped_by=stopped_by,
      warmstart_steps=int(ws_meta.get('steps', 0)),
      warmstart_pass_rate=ws_meta.get('pass_rate'),
      eval_accuracy_start=evals[0]['eval/accuracy'] if evals else None,
      eval_accuracy_end=evals[-1]['eval/accuracy'] if evals else None,
      reward_first=_mean_of(train_records[:window_len], 'reward/mean'),
      reward_last=_mean_of(train_records[-window_len:], 'reward/mean'),
      cum_prompts_generated=rollout.cum_prompts_generated,
      cum_groups_used=rollout.cum_groups_used,
      seconds=time.perf_counter() - t_start,
      datasets={
          d.name: (
              evals[0].get(f'eval/accuracy/{d.name}') if evals else None,
              evals[-1].get(f'eval/accuracy/{d.name}') if evals else None,
              _mean_of(train_records, f'data/batch_share/{d.name}'),
              train_records[-1].get(f'data/snoozed/{d.name}')
              if train_records else None,
              train_records[-1].get(f'data/filtered/{d.name}')
              if train_records else None,
          )
          for d in cfg.data.datasets
      },
  )
  log(format_summary(summary, window_len))
  return summary


def format_summary(s: RunSummary, window: int) -> str:
  """The end-of-run table."""
  def fmt(x):
    return '-' if x is None else f'{x:.3f}'
  efficiency = (s.cum_groups_used / s.cum_prompts_generated
                if s.cum_prompts_generated else None)
  rows = [
      ('steps', str(s.steps)
       + (f' (resumed at {s.resumed_from})'
          if s.resumed_from is not None else '')
       + (f' (stopped by {s.stopped_by})' if s.stopped_by else '')),
      ('warm start steps', str(s.warmstart_steps)),
      ('held-out accuracy', f'{fmt(s.eval_accuracy_start)} -> '
                            f'{fmt(s.eval_accuracy_end)}'),
      (f'sampled reward (first/last {window} steps)',
       f'{fmt(s.reward_first)} -> {fmt(s.reward_last)}'),
      ('prompts generated', str(s.cum_prompts_generated)),
      ('groups used', str(s.cum_groups_used)),
      ('efficiency (used / generated)', fmt(efficiency)),
      ('wall time', f'{s.seconds:.1f}s'),
  ]
  if len(s.datasets) > 1 or any(
      (v[3] or 0) + (v[4] or 0) for v in s.datasets.values()):
    for name, (start, end, share, snoozed, filtered) in s.datasets.items():
      rows.append((
          f'{name}: accuracy, batch share',
          f'{fmt(start)} -> {fmt(end)}, {fmt(share)}'))
      rows.append((f'{name}: snoozed / filtered at the end',
                   f'{int(snoozed or 0)} / {int(filtered or 0)}'))
  return metrics_lib.format_table(rows, 'run summary')
