"""Simulated runs: the real sampler and rollout against a synthetic learner.

`run(spec)` builds a `MixtureSampler` over lazy synthetic datasets and a
`Rollout` whose model side is a stand-in (see `standins`): each completion
is right with the learner's current pass rate for its example. Everything
else (dynamic sampling, the snooze tables, balance, surplus carry,
classification, the metrics) is the training code path itself. After each
step the learner trains on the step's informative groups.

The per-step cost does not grow with the dataset size: examples are made on
demand, and the only per-example arrays are the snooze tables' and the
learner's offsets (numpy).
"""

from collections.abc import Mapping
import dataclasses
import time

import jax
import numpy as np

from jaxgrpo import verifiers
from jaxgrpo.data import mixture
from jaxgrpo.data import snooze
from jaxgrpo.reporting import metrics as metrics_lib
from jaxgrpo.rl import rollout as rollout_lib
from jaxgrpo.sim import learner as learner_lib
from jaxgrpo.sim import standins
from jaxgrpo.verifiers import pool as verifier_pool

ENGINES = ('rollout', 'fast')


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimDataset:
  """One synthetic dataset of the mixture.

  Attributes:
    name: dataset name (metrics use it).
    size: number of examples.
    weight: mixture weight.
    task: the learner's task for its examples (default: the name).
    difficulty: distribution of the examples' difficulty offsets.
    snooze_factor: overrides the run's N for this dataset.
  """

  name: str
  size: int
  weight: float = 1.0
  task: str = ''
  difficulty: learner_lib.Difficulty = learner_lib.Difficulty()
  snooze_factor: int | None = None

  @property
  def task_name(self) -> str:
    return self.task or self.name


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimSpec:
  """A simulated training run.

  Attributes:
    datasets: the mixture.
    policy: sampler policy (see `jaxgrpo.data.snooze`).
    snooze_factor: N.
    snooze_hard_factor: > 0 snoozes too-hard examples that many epochs.
    balance: 'pre_filter' or 'post_filter'.
    batch_size: B, groups per step.
    group_size: G, completions per prompt.
    round_size: R, prompts per generator call, or 'adaptive'.
    max_rounds: most generator calls per step.
    surplus: 'carry' or 'drop'.
    short_batch: 'wait', 'scale' or 'train' (see `RolloutConfig`); the
      learner trains on the groups of the step's update ('scale' trains on
      them unscaled: the learner has no step size to scale).
    steps: optimizer steps.
    skill0: initial skill per task (absent: 0).
    lr: skill gained per full batch of a task, one value or per task.
    lr_example: memorisation gained by an example per trained batch.
    interference: (from task, to task, coefficient) entries; coefficient
      c < 0 means a full batch of `from` changes `to`'s skill by c times
      `to`'s lr.
    heldout_size: held-out difficulties per task.
    seed: seeds the difficulties, the sampler and the generator.
    engine: 'rollout' (the real Rollout, text and verifier included) or
      'fast' (the same collect loop with vectorized rounds); see `standins`.
  """

  datasets: tuple[SimDataset, ...]
  policy: str = 'none'
  snooze_factor: int = 5
  snooze_hard_factor: int = 0
  balance: str = 'pre_filter'
  batch_size: int = 64
  group_size: int = 8
  round_size: int | str = 64
  max_rounds: int = 32
  surplus: str = 'carry'
  short_batch: str = 'wait'
  steps: int = 100
  skill0: Mapping[str, float] = dataclasses.field(default_factory=dict)
  lr: float | Mapping[str, float] = 0.01
  lr_example: float = 0.25
  interference: tuple[tuple[str, str, float], ...] = ()
  heldout_size: int = 4000
  seed: int = 0
  engine: str = 'rollout'

  def __post_init__(self):
    if self.engine not in ENGINES:
      raise ValueError(f'engine must be one of {ENGINES}, got {self.engine!r}')
    if not self.datasets:
      raise ValueError('SimSpec needs at least one dataset')
    for ds in self.datasets:
      if ds.size < 1:
        raise ValueError(f'dataset {ds.name!r} needs size >= 1, got {ds.size}')
    if self.steps < 0 or self.batch_size < 1 or self.group_size < 2:
      raise ValueError(
          f'SimSpec needs steps >= 0, batch_size >= 1 and group_size >= 2; '
          f'got {self.steps}, {self.batch_size}, {self.group_size}')

  @property
  def tasks(self) -> list[str]:
    return list(dict.fromkeys(ds.task_name for ds in self.datasets))


@dataclasses.dataclass
class Simulation:
  """The parts of a simulated run, for stepping it by hand."""

  spec: SimSpec
  learner: learner_lib.Learner
  sampler: mixture.MixtureSampler
  rollout: rollout_lib.Rollout
  generator: standins.SimGenerator
  sample: list[np.ndarray]  # a fixed sample of training indices per dataset
  calls: int = 0  # generator calls so far

  def step(self, step: int, key: jax.Array) -> dict[str, float]:
    """Collects a batch, trains the learner on it; returns the metrics."""
    t0 = time.perf_counter()
    res = self.rollout.collect(None, jax.random.fold_in(key, step), step)
    used: dict[int, list[int]] = {}
    for g in res.groups:
      d = self.sampler.dataset_index(g.example.dataset)
      used.setdefault(d, []).append(standins.example_index(g.example))
    self.learner.train([(d, np.asarray(i, np.int64))
                        for d, i in used.items()])
    m = dict(res.metrics)
    self.calls += int(m['rollout/rounds'])
    m['sim/cum_generator_calls'] = float(self.calls)
    for task, acc in self.learner.heldout_accuracy().items():
      m[f'sim/accuracy/{task}'] = acc
    for t, task in enumerate(self.learner.tasks):
      m[f'sim/skill/{task}'] = float(self.learner.skill[t])
    for d, name in enumerate(self.sampler.names):
      m[f'sim/train_pass/{name}'] = float(
          self.learner.pass_rate(d, self.sample[d]).mean())
    m['perf/step_s'] = time.perf_counter() - t0
    return m


def build(spec: SimSpec) -> Simulation:
  """Builds the learner, sampler, stand-in generator and real Rollout."""
  rng = np.random.default_rng([spec.seed, 0])
  tasks = spec.tasks
  learner = learner_lib.Learner(
      tasks=tasks, skill0=spec.skill0, lr=spec.lr, lr_example=spec.lr_example,
      interference=spec.interference, batch_size=spec.batch_size)
  task_sizes = {t: 0 for t in tasks}
  for ds in spec.datasets:
    task_sizes[ds.task_name] += ds.size
  entries, sample = [], []
  for code, ds in enumerate(spec.datasets):
    heldout = max(1, round(spec.heldout_size * ds.size
                           / task_sizes[ds.task_name]))
    learner.add_dataset(ds.task_name, ds.size, ds.difficulty, rng, heldout)
    sample.append(rng.integers(0, ds.size, min(ds.size, 4096)))
    policy = snooze.PolicyConfig(
        policy=spec.policy,
        snooze_factor=(spec.snooze_factor if ds.snooze_factor is None
                       else ds.snooze_factor),
        snooze_hard_factor=spec.snooze_hard_factor,
        group_size=spec.group_size)
    source = (standins.SimSource if spec.engine == 'rollout'
              else standins.IndexSource)(ds.name, ds.size, code)
    entries.append((mixture.DatasetSpec(name=ds.name, weight=ds.weight,
                                        policy=policy), source))
  sampler = mixture.MixtureSampler(entries, balance=spec.balance,
                                   batch_size=spec.batch_size, seed=spec.seed)
  generator = standins.SimGenerator(learner, group_size=spec.group_size,
                                    seed=spec.seed)
  cfg = rollout_lib.RolloutConfig(
      batch_size=spec.batch_size, group_size=spec.group_size,
      round_size=spec.round_size, max_rounds=spec.max_rounds,
      surplus=spec.surplus, short_batch=spec.short_batch, max_prompt_len=2)
  if spec.engine == 'rollout':
    rollout = rollout_lib.Rollout.for_model(
        cfg, sampler, standins.SimTokenizer(), generator,
        verifier_pool.Scorer(verifiers.get('exact_match')))
  else:
    rollout = rollout_lib.Rollout(cfg, sampler, standins.FastRound(generator),
                                  pad_id=None)
  return Simulation(spec=spec, learner=learner, sampler=sampler,
                    rollout=rollout, generator=generator, sample=sample)


def run(spec: SimSpec, workdir: str | None = None) -> list[dict]:
  """Runs `spec.steps` steps; returns one metrics dict per step.

  Each dict has 'step' and the training metric names (rollout/*, data/*,
  reward/*) plus sim/accuracy/<task> (held-out, after the step's update),
  sim/skill/<task>, sim/train_pass/<dataset> and sim/cum_generator_calls.
  With `workdir`, the records are also written to WORKDIR/metrics.jsonl.
  """
  sim = build(spec)
  key = jax.random.key(spec.seed)
  writer = metrics_lib.MetricsWriter(workdir) if workdir else None
  records = []
  try:
    for step in range(spec.steps):
      m = sim.step(step, key)
      records.append({'step': step, **m})
      if writer:
        writer.write(step, m)
  finally:
    if writer:
      writer.close()
  return records
