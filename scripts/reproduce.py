r"""Real GRPO runs that test the sampler's claims on a CPU, and their report.

  python scripts/reproduce.py run regime --seeds 0-4 &   # one process per
  python scripts/reproduce.py run regime --seeds 0-4     # core: they share runs
  python scripts/reproduce.py status
  python scripts/reproduce.py report        # docs/results.md + figures, seconds

`run` trains every variant of an experiment for each seed. Every variant of
a seed starts from the same warm-started weights (the warm start runs once
per seed and its step-0 checkpoint is copied), so variants differ only in the
sampler. A sweep resumes: a finished run's metrics are in
`docs/results/data/<experiment>/<variant>_s<seed>.jsonl.gz` and are not run
again; an unfinished one resumes from its own checkpoint in
`--work/<experiment>/<variant>_s<seed>/` (saved every 25 steps). Each data
file starts with a header record naming the commit, the command and the
config that made it. Several processes may run the same sweep (one per
core): each claims the next run no live process holds, so they share the
runs however long each takes, and share warm starts through a lock.
`--shard k/n` instead gives a process every n-th run.

`report` (scripts/results_report.py) reads only the committed data files and
writes every table between the markers of docs/results.md and every figure
under docs/results/; `tests/test_results.py` fails when they disagree.

Experiments:
  regime       the main comparison, in a regime like the source's: a model
               that masters most of its data, so late in training most
               degenerate groups are too easy. Every policy.
  long         the regime's runs continued to 300 steps, past mastery.
  memorise     the same policies where the training set is most of the
               problem space (1-2 digit sums): the model memorises it, and
               held-out accuracy lags.
  short_batch  the earlier small regime (1,000 problems, at most 8 rounds of
               16 prompts a step) under filter: short steps trained on
               anyway (`train`) against `wait` and `scale`.
  drift        an easy and a hard dataset at equal weights under plain
               dynamic sampling: batch shares, pre_filter vs post_filter.
  warm         the regime with a longer warm start (sampled pass rate 0.9
               on 512 training prompts), so seeds start closer together and
               higher on held-out problems.
  broad        warm on 10,000 training problems instead of 3,000, 250 steps:
               the main regime (sections 1 and 3 of docs/results.md).
  size1000     the regime on 1,000 training problems; size500 on 500:
               none against N = 3, to see where snoozing saves before
               the target (each problem seen often by then).
  replica      the regime again, every policy, at a later commit and in
               another environment (each data file's header names its
               packages and CPU): do its findings hold when run again? Its
               `filter` drops an example found too easy even when another
               group of it at the same step is informative (the earlier
               `filter` runs let the last group scored decide).
  replica_long replica's runs continued to 300 steps, as `long` continues
               the regime's (from their step-150 checkpoints).
  replica_broad  broad (the main regime) run again in the same way as
               replica, every policy on seeds 0-4, its `filter` under the
               fixed rule.
  replica_memorise  memorise run again in the same way as replica,
               `none` and `weighted` on 10 seeds: does `weighted`'s saving
               to the target hold?
  replica2_memorise  memorise's `none`, `weighted` and `filter` run
               again on seeds 0-4 on a third machine: does `weighted`'s
               saving to the target hold there too? And `filter` under the
               fixed rule. `none` and `weighted` on seeds 5-9 were added
               later, to test that saving on seeds chosen in advance, and
               then N = 3 (the demo's policy) on seeds 0-9.
  group4_memorise, group16_memorise  replica2_memorise's settings at
               G = 4 and G = 16 completions per prompt (8 there), `none`,
               N = 3 and `weighted` on seeds 0-4, on the same machine: how do
               the savings and the accuracy cost depend on G? Then `none`
               and `weighted` on seeds 5-9, to test a claim fixed in
               advance: `weighted` saves less to the target than at G = 8;
               then N = 3 there: its cost in accuracy is G = 8's.
  conflict     answerable (90%) and unanswerable (10%, the right answer is
               the refusal 'none') subtractions, '57-23=' vs '23-57=':
               per-subset accuracy and the minority's batch share.
  replica_conflict  conflict's policies run again in the same way as
               replica: its `filter` under the fixed rule, and its snooze
               variants (added later, on the same seeds): does the longest
               snooze cost accuracy on the majority task there too? Then
               `none`, N = 2 and N = 5 on seeds 5-9, fixed in advance,
               then N = 3 and `snooze_prob` there too.
  replica_short_batch  short_batch run again in the same way, every
               variant: its `filter` under the fixed rule.

The runs of one experiment must come from one environment (CPU and
packages: XLA's float results depend on both, so a warm start made
elsewhere differs and pairs by seed no longer hold): `run` refuses to add
to an experiment whose data files in --data (docs/results/data by
default) were made in another (`--mixed-environments` overrides).
"""

import argparse
import contextlib
import dataclasses
import fcntl
import gzip
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, 'scripts'))

# pylint: disable=g-import-not-at-top,wrong-import-position
from jaxgrpo import train
from jaxgrpo.configs import common
from jaxgrpo.configs import mixture_demo
from jaxgrpo.reporting import environment as environment_lib
from jaxgrpo.reporting import metrics as metrics_lib

DATA = os.path.join(REPO, 'docs', 'results', 'data')
WORK = os.path.join(REPO, 'runs', 'reproduce')
# Pages whose `<!-- results:NAME -->` blocks the report writes.
DOCS = (os.path.join(REPO, 'docs', 'results.md'), os.path.join(REPO, 'README.md'))
CHECKPOINT_EVERY = 25
# Metrics kept in the data files (prefixes); the rest of metrics.jsonl
# (per-dataset timings, constant counters) is left out to keep them small.
KEEP = ('rollout/', 'data/batch_share/', 'data/snoozed/', 'data/filtered/',
        'data/epoch/', 'eval/accuracy', 'reward/mean', 'train/batch_fill',
        'train/skipped', 'train/loss', 'train/entropy', 'perf/gen_s',
        'perf/step_s', 'perf/verify_s')


@dataclasses.dataclass(frozen=True)
class Experiment:
  """An experiment: shared settings, datasets and named variants."""

  name: str
  steps: int
  settings: dict  # config key -> value, for every variant
  datasets: list
  variants: dict  # variant -> {config key: value}


def _snooze(n, **extra):
  return {'sampler.policy': 'snooze', 'sampler.snooze_factor': n, **extra}


POLICIES = {
    'none': {'sampler.policy': 'none'},
    'filter': {'sampler.policy': 'filter'},
    'snooze1': _snooze(1),
    'snooze2': _snooze(2),
    'snooze3': _snooze(3),
    'snooze5': _snooze(5),
    'snooze_prob5': {'sampler.policy': 'snooze_prob',
                     'sampler.snooze_factor': 5},
    'weighted': {'sampler.policy': 'weighted'},
    # Too-hard examples snoozed as well as too-easy ones.
    'snooze5_hard5': _snooze(5, **{'sampler.snooze_hard_factor': 5}),
}


def experiments() -> dict[str, Experiment]:
  """Every experiment, at full size."""
  # The main regime: 1-3 digit sums without carries (3,000 training
  # problems of the 166,375 carry-free pairs, so the model cannot get by on
  # memorising them). The warm start takes the model to a sampled pass rate
  # of 0.8 on its training prompts (held-out greedy accuracy 0.46-0.67);
  # over 150 GRPO steps held-out accuracy (greedy, on 1,024 problems none of
  # which is a training prompt) climbs with the training reward. Late in
  # the run nearly every degenerate group is too easy. Rounds of 64 prompts,
  # up to 128 a step.
  settings = {
      'warmstart.target_pass_rate': 0.8,
      'warmstart.check_examples': 128,
      'rollout.round_size': 64,
      'rollout.max_rounds': 128,
      'eval.every': 7,
      'eval.temperature': 0.0,
      'eval.num_samples': 1,
  }
  regime = Experiment(
      name='regime', steps=150, settings=dict(settings),
      datasets=[common.arithmetic_dataset(
          'arithmetic', min_digits=1, max_digits=3, carries='none',
          num_train=3000, num_eval=1024)],
      variants=dict(POLICIES))
  # The same runs continued to 300 steps, past mastery of the training set
  # (the learning rate is constant, so a 300-step run's first 150 steps are
  # the 150-step run's). The committed runs were continued from their
  # step-150 checkpoints, so they hold one more evaluation, at step 150.
  long = dataclasses.replace(regime, name='long', steps=300)
  # The regime with a longer, less noisy warm start: the pass rate is
  # measured on 512 training prompts and must reach 0.9, so the seeds start
  # closer together and higher on held-out problems.
  warm = dataclasses.replace(
      regime, name='warm',
      settings={**regime.settings, 'warmstart.target_pass_rate': 0.9,
                'warmstart.check_examples': 512})
  # The warm regime on a training set of 10,000 problems: the model sees
  # more of the rule's instances, so held-out accuracy should no longer
  # stall below 0.8 on the seeds that generalise least from 3,000. 250
  # steps, so that the larger set is still passed over at least 5 times.
  # Late in these runs fewer than 1 group in 500 is informative, so the
  # round cap is 1,024 rounds (65,536 prompts), not 128: under 128, 51 late
  # steps of two seeds ran short. The main regime of docs/results.md, with
  # every policy.
  broad = dataclasses.replace(
      warm, name='broad', steps=250,
      settings={**warm.settings, 'rollout.max_rounds': 1024},
      datasets=[common.arithmetic_dataset(
          'arithmetic', min_digits=1, max_digits=3, carries='none',
          num_train=10000, num_eval=1024)])
  # The first regime tried: 1-2 digit sums without carries, 2,000 of the
  # 3,025 such problems for training. The model memorises its training
  # problems faster than it generalises, held-out accuracy stalls below 0.8
  # on 3 of 5 seeds, and `none` hits the round cap late in some runs.
  memorise = Experiment(
      name='memorise', steps=150, settings=dict(settings),
      datasets=[common.arithmetic_dataset(
          'arithmetic', min_digits=1, max_digits=2, carries='none',
          num_train=2000, num_eval=1024)],
      variants=dict(POLICIES))
  # The regime of the earlier results: 1,000 problems, rounds of 16, at
  # most 8 a step, so steps under filter run short.
  short_batch = Experiment(
      name='short_batch', steps=400,
      settings={'eval.every': 20, 'eval.temperature': 0.0,
                'eval.num_samples': 1},
      datasets=[common.arithmetic_dataset(
          'arithmetic', min_digits=1, max_digits=2, carries='none',
          num_train=1000, num_eval=1024)],
      variants={
          'filter_train': {'sampler.policy': 'filter',
                           'rollout.short_batch': 'train'},
          'filter_wait': {'sampler.policy': 'filter',
                          'rollout.short_batch': 'wait'},
          'filter_scale': {'sampler.policy': 'filter',
                           'rollout.short_batch': 'scale'},
          'none_train': {'sampler.policy': 'none',
                         'rollout.short_batch': 'train'},
          'none_wait': {'sampler.policy': 'none',
                        'rollout.short_batch': 'wait'},
      })
  drift = Experiment(
      name='drift', steps=150,
      settings=dict(regime.settings),
      # The mixture demo's pair: 1-2 digit sums without carries (easy) and
      # 2-digit sums with carries (hard), 1,000 training problems each.
      datasets=[dict(d) for d in mixture_demo.get_config().data.datasets],
      variants={
          'pre_filter': {'sampler.policy': 'none', 'data.balance': 'pre_filter'},
          'post_filter': {'sampler.policy': 'none',
                          'data.balance': 'post_filter'},
      })
  # Examples of mixed difficulty, as in GSM8K: the drift experiment's easy
  # and hard datasets under the sampler's policies (pre_filter). The easy
  # one yields too-easy groups from the first steps while the hard one is
  # still being learned, so, unlike in the regime, the waste comes before
  # the target rather than after it.
  mixed = dataclasses.replace(
      drift, name='mixed',
      variants={k: POLICIES[k] for k in
                ('none', 'snooze2', 'snooze3', 'weighted')})
  # Answerable subtractions without borrows ('57-23=') against ones whose
  # result would be negative ('23-57=', answer 'none'); warm-started as in
  # the regime, so the model learns both sides within the run.
  conflict = Experiment(
      name='conflict', steps=150,
      settings=dict(regime.settings),
      datasets=[
          common.arithmetic_dataset(
              'answerable', weight=0.9, min_digits=1, max_digits=2, ops='-',
              carries='none', num_train=2000, num_eval=768, seed=3),
          common.arithmetic_dataset(
              'unanswerable', weight=0.1, min_digits=1, max_digits=2,
              ops='-', num_train=500, num_eval=256, seed=4,
              unanswerable='negative'),
      ],
      variants={k: POLICIES[k] for k in
                ('none', 'filter', 'snooze2', 'snooze3', 'snooze5',
                 'snooze_prob5')})
  # The regime on smaller training sets (1,000 and 500 of the carry-free
  # pairs), everything else unchanged: the smaller the set, the more often
  # each problem comes round before `none` reaches its target, which is
  # when snoozing can act; and the more the model memorises rather than
  # generalises. `none` against N = 3.
  sizes = [dataclasses.replace(
      regime, name=f'size{n}',
      datasets=[common.arithmetic_dataset(
          'arithmetic', min_digits=1, max_digits=3, carries='none',
          num_train=n, num_eval=1024)],
      variants={k: POLICIES[k] for k in ('none', 'snooze3')})
           for n in (1000, 500)]
  # The regime run again in another environment; see the module docstring.
  replica = dataclasses.replace(regime, name='replica')
  replica_long = dataclasses.replace(long, name='replica_long')
  replica_broad = dataclasses.replace(broad, name='replica_broad')
  replica_conflict = dataclasses.replace(
      conflict, name='replica_conflict')
  replica_memorise = dataclasses.replace(
      memorise, name='replica_memorise',
      variants={k: POLICIES[k] for k in ('none', 'weighted')})
  replica_short_batch = dataclasses.replace(short_batch,
                                            name='replica_short_batch')
  replica2_memorise = dataclasses.replace(
      memorise, name='replica2_memorise',
      variants={k: POLICIES[k] for k in ('none', 'weighted', 'filter',
                                         'snooze3')})
  # replica2_memorise's settings (and machine) at other group sizes, G = 4
  # and G = 16 against its G = 8: `none`, N = 3 and `weighted`.
  groups = [dataclasses.replace(
      memorise, name=f'group{g}_memorise',
      settings={**memorise.settings, 'rollout.group_size': g},
      variants={k: POLICIES[k] for k in ('none', 'snooze3', 'weighted')})
            for g in (4, 16)]
  return {e.name: e for e in (regime, replica, long, replica_long, warm,
                              broad, replica_broad, memorise,
                              replica_memorise, replica2_memorise, *groups,
                              short_batch, replica_short_batch, drift,
                              mixed, conflict, replica_conflict, *sizes)}


def smoke(experiment: Experiment) -> Experiment:
  """The same experiment at a few steps of a tiny size (for the tests)."""
  datasets = []
  for entry in experiment.datasets:
    entry = dict(entry)
    entry['num_train'] = min(entry.get('num_train', 256), 256)
    entry['num_eval'] = min(entry.get('num_eval', 16), 16)
    datasets.append(entry)
  return dataclasses.replace(experiment, steps=2, datasets=datasets)


def config(experiment: Experiment, variant: str, seed: int, *,
           is_smoke: bool = False):
  """The ConfigDict of one run (steps 0 for the shared warm start)."""
  c = common.base_config()
  c.seed = seed
  c.total_steps = experiment.steps
  c.log_every = 50
  c.checkpoint.every = CHECKPOINT_EVERY
  c.checkpoint.max_to_keep = 1
  c.verify.workers = 0  # exact_match cannot hang; keep the runs lean
  c.plots = False
  c.tensorboard = False
  c.data.datasets = [dict(d) for d in experiment.datasets]
  overrides = {**experiment.settings,
               **(experiment.variants[variant] if variant else {})}
  for key, value in overrides.items():
    section, _, name = key.rpartition('.')
    (c[section] if section else c)[name] = value
  if is_smoke:
    common.shrink_for_runlocal(c)
    c.total_steps = experiment.steps
    c.eval.every = experiment.steps
    c.data.datasets = [dict(d) for d in experiment.datasets]
  return c


def commit() -> str:
  """HEAD's commit, with '+dirty' when tracked files differ from it."""
  try:
    head = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=REPO, check=True,
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(['git', 'status', '--porcelain', '-uno'], cwd=REPO,
                           check=True, capture_output=True, text=True).stdout
  except (OSError, subprocess.CalledProcessError):
    return 'unknown'
  return head + ('+dirty' if dirty.strip() else '')


def data_path(data: str, experiment: str, run: str) -> str:
  return os.path.join(data, experiment, f'{run}.jsonl.gz')


def _round(value):
  if isinstance(value, float):
    return float(f'{value:.6g}')
  return value


def export(records: list[dict], header: dict, path: str) -> None:
  """Writes a run's kept metrics, after its header, as gzipped JSONL."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = path + '.tmp'
  # mtime=0: the same records give the same bytes.
  with open(tmp, 'wb') as raw, gzip.GzipFile(fileobj=raw, mode='wb',
                                             mtime=0) as f:
    f.write((json.dumps({'header': header}) + '\n').encode())
    for r in records:
      kept = {k: _round(v) for k, v in r.items()
              if k == 'step' or k.startswith(KEEP)}
      f.write((json.dumps(kept, separators=(',', ':')) + '\n').encode())
  os.replace(tmp, path)


def read_run(path: str) -> tuple[dict, list[dict]]:
  """(header, records) of a data file.

  Raises:
    SystemExit: naming the file, when it is cut short, not gzip, or holds
      no header.
  """
  try:
    with gzip.open(path, 'rt', encoding='utf-8') as f:
      lines = [json.loads(line) for line in f if line.strip()]
    return lines[0]['header'], lines[1:]
  except (OSError, EOFError, ValueError, IndexError, KeyError, TypeError) as e:
    raise SystemExit(f'{path}: a damaged data file ({type(e).__name__}: {e}); '
                     'restore it (git checkout) or delete it to run it again'
                     ) from None


@contextlib.contextmanager
def _lock(path: str):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def claim(path: str):
  """True while this process holds run `path`'s claim; False at once when a
  live process holds it (the claim goes with that process, killed or not)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      yield False
      return
    try:
      yield True
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def _warm_start(experiment: Experiment, seed: int, work: str,
                is_smoke: bool, log) -> tuple[str, dict]:
  """The seed's shared warm start (made once; shards wait on a lock)."""
  start = os.path.join(work, experiment.name, f'_warm_s{seed}')
  # A warm start made under other settings (the experiment was changed
  # since) is made again, not copied into runs it does not belong to.
  made_by = json.loads(json.dumps({
      'settings': experiment.settings, 'datasets': experiment.datasets,
      'seed': seed, 'smoke': is_smoke}))
  with _lock(start + '.lock'):
    info_path = os.path.join(start, 'warmstart.json')
    if os.path.exists(info_path):
      with open(info_path) as f:
        if json.load(f).get('config') != made_by:
          log(f'{experiment.name}: the warm start for seed {seed} was made '
              'under other settings; making it again')
          os.remove(info_path)
    if not os.path.exists(info_path):
      shutil.rmtree(start, ignore_errors=True)
      c = config(experiment, '', seed, is_smoke=is_smoke)
      c.total_steps = 0
      t0 = time.perf_counter()
      summary = train.run(c, start, log=lambda _: None)
      info = {'seconds': time.perf_counter() - t0,
              'steps': summary.warmstart_steps,
              'pass_rate': summary.warmstart_pass_rate,
              'eval_accuracy': summary.eval_accuracy_start,
              'environment': environment_lib.environment(),
              'config': made_by}
      with open(info_path, 'w') as f:
        json.dump(info, f)
      log(f'{experiment.name}: warm start for seed {seed} in '
          f'{info["seconds"]:.0f}s')
    with open(info_path) as f:
      info = json.load(f)
  del info['config']  # the header has the settings
  return start, info


def _json_or_none(path: str):
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def run_one(experiment: Experiment, variant: str, seed: int, *, work: str,
            data: str, command: str, is_smoke: bool = False,
            code: str | None = None, log=print) -> str:
  """Runs (or resumes) one run and writes its data file; returns its path."""
  name = f'{variant}_s{seed}'
  out = data_path(data, experiment.name, name)
  if os.path.exists(out):
    return out
  start, warm = _warm_start(experiment, seed, work, is_smoke, log)
  workdir = os.path.join(work, experiment.name, name)
  # The warm start a run was copied from, beside its workdir: a run begun
  # from a warm start since made again (under other settings) starts over
  # from the new one, where it resumed its old checkpoints under a header
  # that named the new warm start.
  made_from = workdir + '.warmstart.json'
  fresh = not os.path.exists(os.path.join(workdir, 'checkpoints'))
  if not fresh and _json_or_none(made_from) != warm:
    log(f'{experiment.name}: {name} was begun from another warm start; '
        'starting it again from this one')
    fresh = True
  if fresh:
    shutil.rmtree(workdir, ignore_errors=True)
    shutil.copytree(start, workdir, ignore=shutil.ignore_patterns('warmstart.json'))
    with open(made_from, 'w') as f:
      json.dump(warm, f)
  c = config(experiment, variant, seed, is_smoke=is_smoke)
  t0 = time.perf_counter()
  # A second Ctrl-C quits promptly, even mid-computation (exit status 130);
  # the run resumes from its last checkpoint when the sweep runs again.
  summary = train.run(c, workdir, log=lambda _: None, on_quit=lambda: print(
      f'{experiment.name}: {name} interrupted; run the sweep again to '
      'resume it from its last checkpoint', file=sys.stderr, flush=True))
  seconds = time.perf_counter() - t0
  if summary.stopped_by:
    # A stop signal: the run saved its checkpoint and resumes next time.
    raise SystemExit(f'{experiment.name}: {name} stopped by '
                     f'{summary.stopped_by}; run the sweep again to resume')
  records = metrics_lib.read_metrics(workdir)
  if not records or records[-1]['step'] != experiment.steps:
    raise RuntimeError(f'{workdir}: the run ended at step '
                       f'{records[-1]["step"] if records else None}, not '
                       f'{experiment.steps}')
  header = {
      'experiment': experiment.name, 'variant': variant, 'seed': seed,
      'commit': code or commit(), 'command': command,
      'overrides': {**experiment.settings, **experiment.variants[variant]},
      'datasets': experiment.datasets, 'steps': experiment.steps,
      'warmstart': warm, 'seconds_last_leg': seconds,
      # The packages and machine that made the run: the same commit and
      # settings give the same numbers only where these are the same
      # (docs/results.md#reproducing-a-run).
      'environment': environment_lib.environment(),
      'batch_size': c.rollout.batch_size, 'group_size': c.rollout.group_size,
  }
  export(records, header, out)
  log(f'{experiment.name}: {name} done in {seconds:.0f}s -> {out}')
  return out


# What must match for runs to pair: the rest of `environment()` (the core
# count) does not change XLA's results.
ENVIRONMENT_KEYS = ('packages', 'python', 'cpu')


def _made_in(env: dict | None) -> dict:
  """The part of an `environment()` that must match for runs to pair."""
  return {k: (env or {}).get(k) for k in ENVIRONMENT_KEYS}


def _runs_made_in(folder: str) -> list[tuple[str, dict]]:
  """(path, `_made_in` of its header) of each data file in `folder`."""
  names = sorted(os.listdir(folder)) if os.path.isdir(folder) else ()
  return [(path, _made_in(read_run(path)[0].get('environment')))
          for path in (os.path.join(folder, n) for n in names
                       if n.endswith('.jsonl.gz'))]


def other_environments(experiment: str, folders) -> list[tuple[str, dict]]:
  """(path, environment) of the data files of `experiment` in `folders`
  made in an environment other than this process's."""
  here = _made_in(environment_lib.environment())
  return [(path, made)
          for folder in dict.fromkeys(os.path.abspath(f) for f in folders)
          for path, made in _runs_made_in(os.path.join(folder, experiment))
          if made != here]


def check_environment(experiment: str, folders) -> None:
  """Raises SystemExit naming a data file of `experiment` made in another
  environment, with both environments."""
  if other := other_environments(experiment, folders):
    path, made = other[0]
    made = (made if any(made.values()) else
            'made before runs recorded their environment')
    raise SystemExit(
        f'{experiment}: {len(other)} of its runs were made in another '
        f'environment, e.g. {path}: {made}; this machine is '
        f'{_made_in(environment_lib.environment())}. XLA\'s results differ '
        'between them (a warm start too), so runs made here would not pair '
        'with those by seed: run the experiment where they were made, run '
        'it whole here into another --data folder, or pass '
        '--mixed-environments')


def status_lines(data: str) -> list[str]:
  """Per experiment, its finished runs and the CPUs that made them, with
  '(this machine)' on this machine's, which alone may add runs to it."""
  here = _made_in(environment_lib.environment())
  lines = []
  for name, e in experiments().items():
    runs = _runs_made_in(os.path.join(data, name))
    made = {}
    for _, env in runs:
      cpu = (env['cpu'] or 'not recorded') + ' (this machine)' * (env == here)
      made[cpu] = made.get(cpu, 0) + 1
    where = '; '.join(f'{n} on {cpu}' for cpu, n in made.items())
    lines.append(f'{name}: {len(runs)} runs of {len(e.variants)} variants'
                 + (f' ({where})' if where else ''))
  return lines


def plan(experiment: Experiment, seeds, only=None) -> list[tuple[str, int]]:
  """The (variant, seed) runs of a sweep, seed-major."""
  names = list(experiment.variants)
  if only:
    unknown = sorted(set(only) - set(names))
    if unknown:
      raise ValueError(f'--variants: {experiment.name} has no variant '
                       f'{unknown}; it has {names}')
    names = [n for n in names if n in only]
  return [(n, s) for s in seeds for n in names]


def _seeds(text: str) -> list[int]:
  """'0-4' or '0,2' as seeds; ValueError for none or a malformed part."""
  out = []
  try:
    for part in text.split(','):
      lo, _, hi = part.partition('-')
      out.extend(range(int(lo), int(hi or lo) + 1))
  except ValueError:
    raise ValueError(f'--seeds={text}: give seeds as 0-4 or 0,2') from None
  if not out:
    raise ValueError(f'--seeds={text}: names no seed')
  return out


def _shard(text: str) -> tuple[int, int]:
  """'k/n' as (k, n), 0 <= k < n; ValueError otherwise."""
  try:
    k, n = (int(x) for x in text.split('/'))
  except ValueError:
    k = n = 0
  if not 0 <= k < n:
    raise ValueError(f'--shard={text}: give k/n with 0 <= k < n (k counts '
                     'from 0: 0/2 and 1/2)')
  return k, n


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  sub = parser.add_subparsers(dest='command', required=True)
  run_p = sub.add_parser('run', help='run (or resume) a sweep')
  run_p.add_argument('experiment', choices=list(experiments()))
  run_p.add_argument('--seeds', default='0-4', help='e.g. 0-4 or 0,2')
  run_p.add_argument('--variants', default='',
                     help='comma-separated variant names (default: all)')
  run_p.add_argument('--shard', default='0/1', help='k/n: every n-th run')
  run_p.add_argument('--work', default=None, help=f'default: {WORK}')
  run_p.add_argument('--data', default=None,
                     help=f'default: {DATA}; with --smoke, under --work')
  run_p.add_argument('--smoke', action='store_true',
                     help='tiny sizes and 2 steps (keeps this working); '
                     'never into the committed data')
  run_p.add_argument('--mixed-environments', action='store_true',
                     help='add runs to an experiment whose runs were made '
                     'on another CPU or with other packages')
  status_p = sub.add_parser('status', help='finished runs per experiment')
  status_p.add_argument('--data', default=DATA)
  report_p = sub.add_parser('report', help='docs/results.md from the data')
  report_p.add_argument('--data', default=DATA)
  report_p.add_argument('--docs', nargs='+', default=DOCS)
  report_p.add_argument('--figures', default=os.path.join(REPO, 'docs',
                                                          'results'))
  report_p.add_argument('--no-figures', action='store_true')
  args = parser.parse_args(argv)
  if args.command == 'report':
    import results_report
    results_report.write_report(args.data, args.docs,
                                None if args.no_figures else args.figures)
    return
  if args.command == 'status':
    for line in status_lines(args.data):
      print(line)
    return
  experiment = experiments()[args.experiment]
  if args.smoke:
    experiment = smoke(experiment)
  args.work = args.work or (os.path.join(WORK, 'smoke') if args.smoke
                            else WORK)
  args.data = args.data or (os.path.join(args.work, 'data') if args.smoke
                            else DATA)
  if args.smoke and os.path.abspath(args.data) == DATA:
    parser.error(f'--smoke --data={args.data}: smoke runs never go into the '
                 'committed data; name another folder')
  try:
    k, n = _shard(args.shard)
    runs = plan(experiment, _seeds(args.seeds),
                [v for v in args.variants.split(',') if v])[k::n]
  except ValueError as e:
    parser.error(str(e))
  if not args.mixed_environments:  # runs pair within the --data they join
    check_environment(experiment.name, (args.data,))
  command = 'python scripts/reproduce.py ' + shlex.join(
      argv if argv is not None else sys.argv[1:])
  t0 = time.perf_counter()
  code = commit()  # the code this process imported
  done = ran = 0
  for variant, seed in runs:
    name = f'{variant}_s{seed}'
    if os.path.exists(data_path(args.data, experiment.name, name)):
      done += 1
      continue
    with claim(os.path.join(args.work, experiment.name, name + '.claim')
               ) as mine:
      if not mine:
        print(f'{experiment.name}: {name} is being run by another process; '
              'next')
        continue
      run_one(experiment, variant, seed, work=args.work, data=args.data,
              command=command, is_smoke=args.smoke, code=code)
      ran += 1
  left = len(runs) - done - ran
  print(f'{experiment.name}: {ran} runs made in '
        f'{time.perf_counter() - t0:.0f}s, {done} already done'
        + (f', {left} left to other processes' if left else ''))


if __name__ == '__main__':
  main()
