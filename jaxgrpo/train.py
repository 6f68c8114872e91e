"""The training loop: build (`build.build_run`), resume or start
(`resume.restore_or_start`, else the warm start), then step, log,
evaluate, save, stop.

Size: the run's start, its steps and its end share one state (`_Loop`), and
`StepInfo`, what a notebook's `on_step` callback sees and how it stops the
run, belongs with the loop that calls it.
"""

from collections.abc import Callable
import contextlib
import dataclasses
import os
import reprlib
import time

import jax
import ml_collections

from jaxgrpo import build
from jaxgrpo import checkpoint as checkpoint_lib
from jaxgrpo import config_lib
from jaxgrpo import errors
from jaxgrpo import multihost
from jaxgrpo import preemption
from jaxgrpo import resume
from jaxgrpo import resume_policy
from jaxgrpo import sharding
from jaxgrpo import train_state as train_state_lib
from jaxgrpo import warmstart
from jaxgrpo import workdir as workdir_lib
from jaxgrpo.generate import generator as generator_lib
from jaxgrpo.model import config as model_config
from jaxgrpo.reporting import console as console_lib
from jaxgrpo.reporting import metrics as metrics_lib
from jaxgrpo.reporting import plot as plot_lib
from jaxgrpo.reporting import summary as summary_lib

Log = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class StepInfo:
  """What `run`'s `on_step` callback sees after each step.

  Attributes:
    step: the step just done.
    state: the train state after it (params, optimizer state); valid
      during the call only: the next step donates its buffers (copy what
      you keep, e.g. with jax.device_get).
    metrics: the step's metrics, as written to metrics.jsonl (a copy:
      changing it changes nothing of the run).
    sampler_state: returns the data-side state a checkpoint holds (the
      prompt sampler's per-example tables, the rollout counters and carried
      groups, as numpy arrays); called on demand, as it copies them.
    stop: asks the run to stop after this step, as a stop signal does: the
      step is saved, and `run` returns with `stopped_by='on_step'`; at the
      last step (`total_steps`) there is nothing left to stop: the run
      finishes as it would have, `stopped_by=None`.
  """

  step: int
  state: train_state_lib.TrainState
  metrics: dict[str, float]
  sampler_state: Callable[[], dict]
  stop: Callable[[], None]


def run(
    config: ml_collections.ConfigDict | config_lib.Config,
    workdir: str,
    *,
    log: Log = console_lib.print_line,
    on_step: Callable[[StepInfo], None] | None = None,
    progress: bool = False,
    quiet: bool = False,
    on_quit: Callable[[], None] | None = None,
) -> summary_lib.RunSummary:
  """Trains per `config`, resuming from `workdir` when it holds a checkpoint.

  Args:
    config: the run's ConfigDict, from `configs.common.base_config()`, or a
      dict of its keys (validated here), or a validated Config.
    workdir: where checkpoints and `metrics.jsonl` go.
    log: receives the lines the run shows.
    on_step: called after each step (and its checkpoint, when one is due)
      on every process, e.g. for custom logging or checks; `info.stop()`
      ends the run after the step, saved; an exception it raises ends it
      at once (the step unsaved unless a save was due); what it returns is
      not used (a value other than None is noticed once).
    progress: show progress bars with rate and time left (stderr) for the
      warm start, evaluation and training steps.
    quiet: show only what needs attention (a resume, skipped updates, a
      stop signal) and the final summary.
    on_quit: where the run owns its process (the command line): a second
      Ctrl-C then quits promptly, even while a device computation runs: a
      checkpoint being written completes, `on_quit()` (on a thread of its
      own) says where the run resumes, and the process exits with status
      130; a third Ctrl-C exits at once. None (a notebook): a second Ctrl-C
      raises KeyboardInterrupt once the main thread runs Python again.

  Returns:
    The run summary.

  Raises:
    preemption.Stopped: SIGTERM or SIGINT arrived while the run was starting
      or in its warm start, before it had anything new to save (in the
      GRPO steps a signal saves a checkpoint and returns instead).
  """
  cfg = (config if isinstance(config, config_lib.Config)
         else config_lib.from_config_dict(config))
  generator_lib.refuse_x64()
  # Closes what the run starts (verifier worker processes) however it ends.
  with contextlib.ExitStack() as resources:
    console = console_lib.Console(log, progress=progress, quiet=quiet)
    return _run(cfg, workdir, console, resources, on_step, on_quit)


def _run(
    cfg: config_lib.Config,
    workdir: str,
    console: console_lib.Console,
    resources: contextlib.ExitStack,
    on_step: Callable[[StepInfo], None] | None = None,
    on_quit: Callable[[], None] | None = None,
) -> summary_lib.RunSummary:
  """The body of `run`: build, resume or start, loop, summarize;
  `resources` closes what it opens."""
  t_start = time.perf_counter()
  d = cfg.distributed
  multihost.initialize(d.initialize, coordinator=d.coordinator,
                       num_processes=d.num_processes, process_id=d.process_id,
                       log=console.info)
  console.enabled = multihost.is_main()
  workdir = checkpoint_lib.absolute(workdir)
  workdir_lib.check(workdir)
  resources.enter_context(workdir_lib.lock(workdir))
  saving = []  # the run's checkpointer, once built

  def quit_now():
    """A second Ctrl-C: the save in progress completes first."""
    for ckpt in saving:
      ckpt.stop_saving()
    on_quit()

  stop = resources.enter_context(preemption.StopRequest(
      console.notice, on_quit=None if on_quit is None else quit_now))
  resume_policy.check_settings(os.path.join(workdir, 'checkpoints'),
                               config_lib.to_dict(cfg))
  parts = build.build_run(cfg, workdir, console, resources)
  saving.append(parts.ckpt)
  multihost.check_same_run(parts.meta)  # before anything diverges
  # Whatever ends the run, a save in progress completes (or fails) first.
  resources.callback(parts.ckpt.close_after_error)
  # A checkpoint holds no base params under an adapter: the run's are used.
  saved = lambda tree: None if tree is None else tree.replace(base=None)
  start = resume.restore_or_start(
      parts.ckpt, saved(parts.abstract_state), saved(parts.state_shardings),
      meta=parts.meta, source=parts.source, rollout=parts.rollout,
      ids=parts.ids, remap=cfg.checkpoint.on_dataset_change == 'remap',
      notice=console.notice, workdir=workdir, main=multihost.is_main())
  state, meta = start.state, start.meta
  stop.check('while the run was starting')
  if start.resumed_from is not None and start.step >= cfg.total_steps:
    console.notice(f'the checkpoint is at step {start.step} and total_steps='
                   f'{cfg.total_steps}: nothing is left to train (a larger '
                   '--config.total_steps trains on)')
  if state is None:
    state, meta = _fresh_state(cfg, parts, console, meta, stop)
  else:
    state = state.replace(base=parts.base)
  writer = _metrics_writer(cfg, workdir, start.resumed_from, console)
  # Closed however the run ends: a notebook keeps a failed run's frames.
  resources.callback(writer.close)
  if start.resumed_from is None:
    _first_eval(parts, state, meta, writer, console)
  loop = _Loop(cfg, parts, console, writer, state, meta, stop)
  step, stopped_by = loop.run(start.step, on_step)
  parts.ckpt.close()
  writer.close()
  return _finish(cfg, workdir, console, parts, meta, step=step,
                 resumed_from=start.resumed_from, stopped_by=stopped_by,
                 seconds=time.perf_counter() - t_start)


def _metrics_writer(cfg: config_lib.Config, workdir: str,
                   resumed_from: int | None,
                   console: console_lib.Console) -> metrics_lib.MetricsWriter:
  """The run's metrics.jsonl (and TensorBoard) writer, on the main process.

  A fresh start (`resumed_from` None) drops lines a run killed before its
  first checkpoint left; a resume drops those after its checkpoint. Lines
  that are not JSON, and an earlier run's steps that a fresh start finds,
  are kept aside with a notice.
  """
  writer = metrics_lib.MetricsWriter(
      workdir, resume_step=-1 if resumed_from is None else resumed_from,
      enabled=multihost.is_main(), tensorboard=cfg.tensorboard,
      keep_earlier=True, notice=console.notice)
  for note in writer.notes:
    console.notice(note)
  if writer.tensorboard is not None:
    console.info(f'TensorBoard events: {writer.tensorboard.logdir}')
  return writer


def _fresh_state(cfg: config_lib.Config, parts: build.Run,
                 console: console_lib.Console, meta: dict,
                 stop: preemption.StopRequest
                 ) -> tuple[train_state_lib.TrainState, dict]:
  """A fresh start's train state (after the warm start, when enabled) and
  the checkpoint notes (with the warm start's)."""
  params = parts.params
  if cfg.warmstart.enabled and cfg.warmstart.max_steps > 0:
    result = _warm_start(cfg, parts, console, stop)
    params = result.params
    meta = {**meta, 'warmstart': {'steps': result.steps,
                                  'pass_rate': result.pass_rate,
                                  'seconds': result.seconds,
                                  'verify': result.verify}}
  state = sharding.shard(
      train_state_lib.create_train_state(
          parts.graphdef, params, parts.optimizer,
          keep_reference=parts.keep_reference, base=parts.base),
      parts.state_shardings)
  return state, meta


def _warm_start(cfg: config_lib.Config, parts: build.Run,
                console: console_lib.Console,
                stop: preemption.StopRequest) -> warmstart.WarmStartResult:
  """Supervised steps until the sampled pass rate reaches the target."""
  ws, ro, log = cfg.warmstart, cfg.rollout, console.info
  log(f'warm start: supervised steps until the sampled pass rate reaches '
      f'{ws.target_pass_rate:.2f} (at most {ws.max_steps} steps)')
  with console.bar(ws.max_steps, desc='warm start', unit='step') as bar:

    def on_warm_step(step, rate):
      stop.check(f'in the warm start (step {step}; a warm start is not '
                 'saved, and starts again)')
      bar.update(1)
      if rate is not None:
        bar.set_postfix_str(f'pass rate {rate:.2f}')

    return warmstart.warm_start(
        parts.graphdef, parts.params, tokenizer=parts.tokenizer,
        train_examples=parts.warm_examples, check_generator=parts.generator,
        scorer=parts.scorer, rng=parts.warm_rng, max_steps=ws.max_steps,
        batch_size=ws.batch_size, learning_rate=ws.learning_rate,
        target_pass_rate=ws.target_pass_rate, check_every=ws.check_every,
        check_examples=ws.check_examples,
        max_prompt_len=ro.max_prompt_len,
        truncate_prompts=ro.long_prompts == 'truncate',
        seq_len=ro.max_prompt_len + ro.max_new_tokens, progress=log,
        on_step=on_warm_step, notice=console.notice,
    )


def _first_eval(parts: build.Run, state: train_state_lib.TrainState,
                meta: dict, writer: metrics_lib.MetricsWriter,
                console: console_lib.Console) -> None:
  """A fresh start's step 0: held-out accuracy, written and saved."""
  first = parts.evaluator(state.policy_params, 0)
  writer.write(0, first)
  if first:
    console.info('step 0: held-out accuracy '
                 + console_lib.eval_part(first).removeprefix('eval '))
  parts.save(0, state, meta)


class _Loop:
  """The GRPO steps of a run: step, log, evaluate, save, stop."""

  def __init__(self, cfg: config_lib.Config, parts: build.Run,
               console: console_lib.Console,
               writer: metrics_lib.MetricsWriter,
               state: train_state_lib.TrainState, meta: dict,
               stop: preemption.StopRequest):
    self.cfg, self.parts, self.console, self.stop = cfg, parts, console, stop
    self.writer, self.state, self.meta = writer, state, meta
    self.window = metrics_lib.ConsoleWindow()
    self.waiting = False  # whether the last step held a short batch
    # NaN/inf steps in a row, a checkpoint note: a resume goes on counting.
    self.nonfinite_run = int(meta.get('nonfinite_run', 0))
    self.start_step = self.loop_start = self.last_save = 0
    self.saved_step = -1  # the step of the last save started
    self.told_return = False  # whether on_step's return value was noticed

  def run(self, start_step: int,
          on_step: Callable[[StepInfo], None] | None) -> tuple[int, str | None]:
    """Steps from `start_step` to cfg.total_steps, or until a stop signal;
    returns the last step done and the signal that stopped it, if any."""
    cfg, parts, console = self.cfg, self.parts, self.console
    ro = cfg.rollout
    console.info(
        f'GRPO: {cfg.total_steps} steps of {ro.batch_size} prompts x '
        f'{ro.group_size} samples, model {parts.model_name} '
        f'({model_config.param_count(parts.model_cfg) / 1e6:.2f}M params)')
    step, self.start_step, stop = start_step, start_step, self.stop
    self.last_save = self.loop_start = time.monotonic()
    signal = self.stopped_by(step)
    if signal is not None:  # in the first evaluation: step 0 is saved
      console.notice(f'{signal} received: stopped at step {step}, whose '
                     'checkpoint is saved; run the same command to resume')
      return step, signal
    with console.bar(
        cfg.total_steps, initial=start_step, desc='GRPO', unit='step') as bar:
      for step in range(start_step + 1, cfg.total_steps + 1):
        metrics = self.step(step)
        self.check_hosts(step)
        self.log(step, metrics, bar)
        # Over several processes, a signal any one received stops all.
        self.save_if_due(step, stopping=stop.agree() is not None)
        if on_step is not None:
          self.call(on_step, step, metrics)
        self.check_finite(step, metrics)
        signal = self.stopped_by(step)
        if signal is not None:
          # One that came during on_step: the step is saved all the same.
          self.save_if_due(step, stopping=True)
          said = 'asked to stop' if signal == 'on_step' else 'received'
          console.notice(
              f'{signal} {said}: saved the checkpoint of step {step} in '
              f'{parts.ckpt.directory} and stopped; run the same command '
              'to resume')
          return step, signal
    return step, None

  def stopped_by(self, step: int) -> str | None:
    """The signal (or on_step's request) that stops the run after `step`,
    the same on every process; None while none came, and at the last step:
    every step ran, the last saved and evaluated, so the run is complete,
    not a stopped run to resume (a signal is noted, a request is not)."""
    signal = self.stop.agree()
    if step < self.cfg.total_steps:
      return signal
    self.stop.done = True  # one that comes later is acknowledged as such
    if signal not in (None, 'on_step'):
      self.console.notice(
          f'{signal} received at the last step ({step}): the run is '
          'complete, its last checkpoint saved; nothing is left to resume')
    return None

  def call(self, on_step: Callable[[StepInfo], None], step: int,
           metrics: dict[str, float]) -> None:
    """Calls `on_step` with a copy of the step's metrics; its `stop()`
    stops the run as a signal does, and a value it returns is noticed once
    (it was dropped unseen: a `return True` stopped nothing)."""
    returned = on_step(StepInfo(step, self.state, dict(metrics),
                                self.parts.data_state,
                                lambda: self.stop.request('on_step')))
    if returned is not None and not self.told_return:
      self.told_return = True
      self.console.notice(
          f'on_step returned {reprlib.repr(returned)} at step {step}: not '
          'used (call info.stop() to stop the run after the step, saved)')

  def step(self, step: int) -> dict[str, float]:
    """One GRPO step (rollout, update), with the evaluation when due;
    returns its metrics."""
    cfg, parts = self.cfg, self.parts
    t0 = time.perf_counter()
    step_rng = jax.random.fold_in(parts.run_rng, step)
    result = parts.rollout.collect(
        self.state.policy_params, jax.random.fold_in(step_rng, 0), step)
    metrics = dict(result.metrics)
    if result.batch is not None:
      # Placed here, not by jit: under a mesh spanning processes each
      # process fills only its own devices' rows.
      batch = sharding.shard(result.batch, parts.batch_shardings)
      self.state, train_metrics = parts.step_fn(
          self.state, batch, jax.random.fold_in(step_rng, 1))
      metrics.update(
          {k: float(v) for k, v in jax.device_get(train_metrics).items()})
      # A step without an update neither adds to the row nor ends it.
      self.nonfinite_run = (self.nonfinite_run + 1
                            if metrics.get('train/nonfinite') else 0)
      self.meta['nonfinite_run'] = self.nonfinite_run  # saved with the step
      if metrics.get('train/nonfinite'):
        updates = metrics['train/updates']
        self.console.notice(
            f'step {step}: NaN/inf loss or gradients: '
            f'{round(metrics["train/nonfinite"] * updates)} of {updates:g} '
            'updates skipped, the params kept (train/nonfinite; '
            f'{self.nonfinite_run} step(s) in a row, the run stops at '
            f'rl.max_nonfinite_steps={cfg.rl.max_nonfinite_steps})')
    else:
      metrics['train/skipped'] = 1.0
      console_lib.explain_no_update(step, metrics, cfg.rollout, self.console,
                                    self.waiting)
    self.waiting = bool(metrics.get('rollout/held'))
    metrics['perf/step_s'] = time.perf_counter() - t0
    if cfg.eval.every and (step % cfg.eval.every == 0
                           or step == cfg.total_steps):
      metrics.update(parts.evaluator(self.state.policy_params, step))
    return metrics

  def check_hosts(self, step: int) -> None:
    """Every distributed.check_every steps over several processes: host
    drift (different files or code on one host) stops the run."""
    every = self.cfg.distributed.check_every
    if every and jax.process_count() > 1 and step % every == 0:
      multihost.check_agree(multihost.digest(self.parts.data_state()),
                            what='sampler state', step=step)

  def log(self, step: int, metrics: dict[str, float], bar) -> None:
    """Writes the step's metrics; shows them every cfg.log_every steps."""
    cfg = self.cfg
    self.writer.write(step, metrics)
    self.window.add(metrics)
    bar.update(1)
    bar.set_postfix_str(console_lib.postfix(metrics), refresh=False)
    if step % cfg.log_every == 0 or step == cfg.total_steps:
      line = self.window.line(step, cfg.total_steps, metrics)
      if 'eval/accuracy' in metrics:
        line += '  ' + console_lib.eval_part(metrics)
      if step < cfg.total_steps:
        per_step = ((time.monotonic() - self.loop_start)
                    / (step - self.start_step))
        line += ('  eta ' + console_lib.format_seconds(
            per_step * (cfg.total_steps - step)))
      self.console.info(line)

  def save_if_due(self, step: int, stopping: bool) -> None:
    """Saves on checkpoint.every, at the last step, on a stop signal, or
    checkpoint.every_minutes after the last save."""
    cfg = self.cfg
    # A save that failed in the background stops the run at the next step.
    self.parts.ckpt.check_for_errors()
    minutes = (time.monotonic() - self.last_save) / 60
    if self.stop.quitting:  # a second Ctrl-C: no new save to cut short
      return
    if step != self.saved_step and (
        self.parts.ckpt.should_save(step) or step == cfg.total_steps
        or stopping or 0 < cfg.checkpoint.every_minutes <= minutes):
      self.parts.save(step, self.state, self.meta)
      self.saved_step = step
      # An object-store workdir gets the metrics with each save.
      self.writer.sync()
      self.last_save = time.monotonic()

  def check_finite(self, step: int, metrics: dict[str, float]) -> None:
    """Stops the run at a NaN/inf step that makes rl.max_nonfinite_steps
    in a row (counted by `step`)."""
    if (metrics.get('train/nonfinite')
        and self.nonfinite_run >= self.cfg.rl.max_nonfinite_steps):
      self.parts.ckpt.close()
      self.writer.close()
      raise errors.TrainingError(
          f'step {step}: NaN/inf loss or gradients in {self.nonfinite_run} '
          'steps in a row (those updates were skipped, so the params are the '
          f'last good ones, saved in {self.parts.ckpt.directory}); lower '
          'optim.learning_rate or check the rewards, then resume')


def _finish(cfg: config_lib.Config, workdir: str,
            console: console_lib.Console, parts: build.Run, meta: dict, *,
            step: int, resumed_from: int | None, stopped_by: str | None,
            seconds: float) -> summary_lib.RunSummary:
  """The run summary, shown; the plots drawn when cfg.plots."""
  summary = summary_lib.summarize(
      metrics_lib.read_metrics(workdir) if multihost.is_main() else [],
      steps=step,
      resumed_from=resumed_from, stopped_by=stopped_by,
      warmstart=meta.get('warmstart', {}),
      cum_prompts_generated=parts.rollout.accumulator.cum_prompts_generated,
      cum_groups_used=parts.rollout.accumulator.cum_groups_used,
      seconds=seconds,
      dataset_names=[d.name for d in cfg.data.datasets], workdir=workdir)
  console.notice(summary_lib.format_summary(summary))
  if cfg.plots and multihost.is_main():
    written = plot_lib.plot_run(workdir, log=lambda _: None)
    if written:
      console.info(f'plots: {len(written)} PNG{"s" * (len(written) > 1)} in '
                   f'{os.path.dirname(written[0])} (jaxgrpo-plot redraws them)')
  return summary
