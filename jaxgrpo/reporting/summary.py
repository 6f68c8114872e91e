"""The end-of-run summary: computed from metrics.jsonl, printed as a table."""

from collections.abc import Sequence
import dataclasses

import numpy as np

from jaxgrpo.reporting import console
from jaxgrpo.reporting import metrics as metrics_lib


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
  window: int = 1  # steps averaged for reward_first / reward_last
  skipped_updates: int = 0
  # Updates skipped for a NaN/inf loss or gradient (`train/nonfinite` x
  # `train/updates` of each step).
  nonfinite_updates: int = 0
  verify_errors: int = 0
  verify_timeouts: int = 0
  # Verifier calls that printed to stdout; verifier workers replaced as their
  # memory or open files grew (0 from metrics written before these counts).
  verify_printed: int = 0
  verify_workers_replaced: int = 0
  # The same counts over the held-out evaluations (`eval/verify/*`; 0 from
  # metrics written before these counts).
  eval_verify_errors: int = 0
  eval_verify_timeouts: int = 0
  eval_verify_printed: int = 0
  eval_verify_workers_replaced: int = 0
  # The warm start's pass-rate checks' verifier errors and timeouts (its
  # checkpoint note's `verify`; 0 without one, or from a note written
  # before these counts).
  warmstart_verify_errors: int = 0
  warmstart_verify_timeouts: int = 0
  # Seconds summed over the steps of the run, those before a resume
  # included: whole steps, generation, verification and held-out evaluation
  # (`seconds` is the wall time of this call only).
  step_seconds: float = 0.0
  gen_seconds: float = 0.0
  verify_seconds: float = 0.0
  workdir: str | None = None
  eval_step_end: int | None = None  # the step of eval_accuracy_end


def _sum_of(records: list[dict], key: str) -> float:
  return float(sum(float(r[key]) for r in records if key in r))


def _mean_of(records: list[dict], key: str) -> float | None:
  values = [r[key] for r in records if key in r]
  return float(np.mean(values)) if values else None


def summarize(
    records: list[dict],
    *,
    steps: int,
    resumed_from: int | None,
    stopped_by: str | None,
    warmstart: dict,
    cum_prompts_generated: int,
    cum_groups_used: int,
    seconds: float,
    dataset_names: Sequence[str],
    workdir: str | None = None,
) -> RunSummary:
  """Summarizes a run from its metrics records (first and last tenth)."""
  # Every GRPO step (each times itself); one that offered no prompt (a
  # curriculum stage that postpones every stratum) records no reward.
  train_records = [r for r in records
                   if 'perf/step_s' in r or 'reward/mean' in r]
  rewarded = [r for r in train_records if 'reward/mean' in r]
  window = max(1, len(rewarded) // 10)
  evals = [r for r in records if 'eval/accuracy' in r]
  last = train_records[-1] if train_records else {}
  # A batch share is a share of the steps that trained (a step without an
  # update writes zeros).
  updated = [r for r in train_records if not r.get('train/skipped')]
  return RunSummary(
      steps=steps,
      resumed_from=resumed_from,
      stopped_by=stopped_by,
      warmstart_steps=int(warmstart.get('steps', 0)),
      warmstart_pass_rate=warmstart.get('pass_rate'),
      eval_accuracy_start=evals[0]['eval/accuracy'] if evals else None,
      eval_accuracy_end=evals[-1]['eval/accuracy'] if evals else None,
      reward_first=_mean_of(rewarded[:window], 'reward/mean'),
      reward_last=_mean_of(rewarded[-window:], 'reward/mean'),
      cum_prompts_generated=cum_prompts_generated,
      cum_groups_used=cum_groups_used,
      seconds=seconds,
      datasets={
          name: (
              evals[0].get(f'eval/accuracy/{name}') if evals else None,
              evals[-1].get(f'eval/accuracy/{name}') if evals else None,
              _mean_of(updated, f'data/batch_share/{name}'),
              last.get(f'data/snoozed/{name}'),
              last.get(f'data/filtered/{name}'),
          )
          for name in dataset_names
      },
      window=window,
      skipped_updates=int(_sum_of(train_records, 'train/skipped')),
      nonfinite_updates=round(sum(
          float(r.get('train/nonfinite', 0.0))
          * float(r.get('train/updates', 0.0)) for r in train_records)),
      verify_errors=int(_sum_of(train_records, 'verify/errors')),
      verify_timeouts=int(_sum_of(train_records, 'verify/timeouts')),
      verify_printed=int(_sum_of(train_records, 'verify/printed')),
      verify_workers_replaced=int(
          _sum_of(train_records, 'verify/workers_replaced')),
      eval_verify_errors=int(_sum_of(evals, 'eval/verify/errors')),
      eval_verify_timeouts=int(_sum_of(evals, 'eval/verify/timeouts')),
      eval_verify_printed=int(_sum_of(evals, 'eval/verify/printed')),
      eval_verify_workers_replaced=int(
          _sum_of(evals, 'eval/verify/workers_replaced')),
      warmstart_verify_errors=int(
          warmstart.get('verify', {}).get('errors', 0)),
      warmstart_verify_timeouts=int(
          warmstart.get('verify', {}).get('timeouts', 0)),
      step_seconds=_sum_of(train_records, 'perf/step_s'),
      gen_seconds=_sum_of(train_records, 'perf/gen_s'),
      verify_seconds=_sum_of(train_records, 'perf/verify_s'),
      workdir=workdir,
      eval_step_end=evals[-1].get('step') if evals else None,
  )


def format_summary(s: RunSummary) -> str:
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
      ('warm start steps', str(s.warmstart_steps) + (
          f' (its pass-rate checks: verifier errors / timeouts '
          f'{s.warmstart_verify_errors} / {s.warmstart_verify_timeouts}, '
          'scored 0)' if s.warmstart_verify_errors
          or s.warmstart_verify_timeouts else '')),
      # The last evaluation may come before the last step (eval.every=0:
      # step 0 only; a stop between evaluations).
      ('held-out accuracy', f'{fmt(s.eval_accuracy_start)} -> '
                            f'{fmt(s.eval_accuracy_end)}' + (
                                f' (at step {s.eval_step_end}, the last '
                                'evaluated)' if s.eval_step_end is not None
                                and s.eval_step_end < s.steps else '')),
      (f'sampled reward (first/last {s.window} step{"s" * (s.window > 1)})',
       f'{fmt(s.reward_first)} -> {fmt(s.reward_last)}'),
      ('prompts generated', str(s.cum_prompts_generated)),
      ('groups used', str(s.cum_groups_used)),
      ('efficiency (used / generated)', fmt(efficiency)),
      ('updates skipped (short or empty batch)', str(s.skipped_updates)),
      ('verifier errors / timeouts (scored 0)',
       f'{s.verify_errors} / {s.verify_timeouts}'),
  ]
  if s.nonfinite_updates:  # a row only when it happened
    rows.insert(-1, ('updates skipped (NaN/inf loss or gradients)',
                     str(s.nonfinite_updates)))
  if s.verify_workers_replaced or s.verify_printed:
    # A verifier that leaks memory or open files, or prints: a row only
    # when it happened.
    rows.append(('verifier workers replaced / calls that printed',
                 f'{s.verify_workers_replaced} / {s.verify_printed}'))
  if s.eval_accuracy_start is not None:  # the run evaluated: the same rows
    rows.append(('held-out eval: verifier errors / timeouts',
                 f'{s.eval_verify_errors} / {s.eval_verify_timeouts}'))
    if s.eval_verify_workers_replaced or s.eval_verify_printed:
      rows.append(('held-out eval: workers replaced / calls that printed',
                   f'{s.eval_verify_workers_replaced} / '
                   f'{s.eval_verify_printed}'))
  rows += [
      # A resumed run's other rows count from step 0; its time from the
      # resume (the GRPO steps before it may take longer than that).
      ('wall time' + (' since the resume' if s.resumed_from is not None
                      else ''), f'{s.seconds:.1f}s'),
  ]
  if s.step_seconds > 0:
    rest = max(0.0, s.step_seconds - s.gen_seconds - s.verify_seconds)
    rows.append(('time in GRPO steps', (
        f'{s.step_seconds:.1f}s: generation {s.gen_seconds / s.step_seconds:.0%}'
        f', verifiers {s.verify_seconds / s.step_seconds:.0%}, update and '
        f'sampler {rest / s.step_seconds:.0%}')))
  if len(s.datasets) > 1 or any(
      (v[3] or 0) + (v[4] or 0) for v in s.datasets.values()):
    for full, (start, end, share, snoozed, filtered) in s.datasets.items():
      name = console.shorten(full)
      rows.append((
          f'{name}: accuracy, batch share',
          f'{fmt(start)} -> {fmt(end)}, {fmt(share)}'))
      rows.append((f'{name}: snoozed / filtered at the end',
                   f'{int(snoozed or 0)} / {int(filtered or 0)}'))
  if s.workdir:
    rows.append(('written to', f'{s.workdir}: metrics.jsonl, checkpoints/'))
  return metrics_lib.format_table(rows, 'run summary')
