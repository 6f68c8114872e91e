"""A synthetic learner: per-task skills that training on informative groups
moves, and per-example pass rates derived from them.

Example i of a dataset of task t passes each completion with probability

    p_i = sigmoid(skill_t + d_i + m_i)

where d_i is the example's difficulty offset (drawn once from the dataset's
`Difficulty`; negative is harder) and m_i its memorisation offset (0 until
the example is trained on). After each step, with n_s the number of the
batch's informative groups of task s and B the batch size,

    skill_t += lr_t * sum_s M[s, t] * n_s / B
    m_i += lr_example            for each example i in the batch

M is the identity plus the interference entries: M[s, t] < 0 means training
on task s lowers task t's skill (e.g. learning to refuse unanswerable
questions makes the model refuse answerable ones too). So a full batch of
task t raises skill_t by lr_t, and a step that trains on fewer groups (the
batch came up short) learns less.

Held-out accuracy of a task is the mean of sigmoid(skill_t + d) over a
fixed sample of held-out difficulties drawn from the task's datasets (in
proportion to their sizes); memorisation does not carry over to it.
"""

from collections.abc import Mapping, Sequence
import dataclasses

import numpy as np
from scipy import special

DISTRIBUTIONS = ('normal', 'uniform')


@dataclasses.dataclass(frozen=True, kw_only=True)
class Difficulty:
  """Distribution of per-example difficulty offsets d (in logits).

  Attributes:
    kind: 'normal' (loc + scale * z) or 'uniform' (on [loc - scale,
      loc + scale]).
    loc: centre.
    scale: spread.
    quantiles: (lo, hi): only the part of the distribution between these
      quantiles, e.g. (0.5, 1.0) for the easier half.
  """

  kind: str = 'normal'
  loc: float = 0.0
  scale: float = 1.0
  quantiles: tuple[float, float] = (0.0, 1.0)

  def __post_init__(self):
    lo, hi = self.quantiles
    if self.kind not in DISTRIBUTIONS:
      raise ValueError(
          f'difficulty kind must be one of {DISTRIBUTIONS}, got {self.kind!r}')
    if not self.scale >= 0:
      raise ValueError(f'difficulty scale must be >= 0, got {self.scale}')
    if not 0.0 <= lo < hi <= 1.0:
      raise ValueError(
          f'difficulty quantiles must satisfy 0 <= lo < hi <= 1, got '
          f'{self.quantiles}')

  def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
    """[n] float32 offsets."""
    lo, hi = self.quantiles
    u = rng.uniform(lo, hi, size=n)
    if self.kind == 'normal':
      # Keep the tails finite: ndtri(0) is -inf.
      z = special.ndtri(np.clip(u, 1e-9, 1 - 1e-9))
    else:
      z = 2.0 * u - 1.0
    return (self.loc + self.scale * z).astype(np.float32)


def sigmoid(x: np.ndarray) -> np.ndarray:
  return special.expit(x)


class Learner:
  """Skills per task, difficulty and memorisation offsets per example.

  Args:
    tasks: task names.
    skill0: initial skill per task (absent: 0).
    lr: skill gained per full batch of a task, one value or per task.
    lr_example: memorisation offset gained by an example each time it is
      in a trained batch.
    interference: (from task, to task, coefficient) entries of M.
    batch_size: B.
  """

  def __init__(
      self,
      *,
      tasks: Sequence[str],
      skill0: Mapping[str, float],
      lr: float | Mapping[str, float],
      lr_example: float,
      interference: Sequence[tuple[str, str, float]],
      batch_size: int,
  ):
    self.tasks = list(tasks)
    index = {t: k for k, t in enumerate(self.tasks)}
    for name in skill0:
      if name not in index:
        raise ValueError(f'skill0 names unknown task {name!r}; tasks: '
                         f'{self.tasks}')
    self.skill = np.array([float(skill0.get(t, 0.0)) for t in self.tasks])
    if isinstance(lr, Mapping):
      unknown = sorted(set(lr) - set(index))
      if unknown:
        raise ValueError(f'lr names unknown tasks {unknown}; tasks: '
                         f'{self.tasks}')
      self.lr = np.array([float(lr.get(t, 0.0)) for t in self.tasks])
    else:
      self.lr = np.full(len(self.tasks), float(lr))
    self.lr_example = float(lr_example)
    self.mixing = np.eye(len(self.tasks))
    for src, dst, coef in interference:
      for name in (src, dst):
        if name not in index:
          raise ValueError(f'interference names unknown task {name!r}; '
                           f'tasks: {self.tasks}')
      if src == dst:
        raise ValueError(f'interference of task {src!r} on itself')
      self.mixing[index[src], index[dst]] = float(coef)
    self.batch_size = batch_size
    self.task_of: list[int] = []
    self.offsets: list[np.ndarray] = []
    self.memory: list[np.ndarray] = []
    self._heldout: list[list[np.ndarray]] = [[] for _ in self.tasks]

  def add_dataset(self, task: str, size: int, difficulty: Difficulty,
                  rng: np.random.Generator, heldout: int) -> int:
    """Adds a dataset of `size` examples; returns its index.

    `heldout` difficulties of the same distribution join the task's
    held-out sample.
    """
    if task not in self.tasks:
      raise ValueError(f'unknown task {task!r}; tasks: {self.tasks}')
    t = self.tasks.index(task)
    self.task_of.append(t)
    self.offsets.append(difficulty.sample(size, rng))
    self.memory.append(np.zeros(size, np.float32))
    self._heldout[t].append(difficulty.sample(heldout, rng))
    return len(self.offsets) - 1

  def pass_rate(self, dataset: int, indices: np.ndarray) -> np.ndarray:
    """[K] pass probabilities of examples `indices` of dataset `dataset`."""
    return sigmoid(self.skill[self.task_of[dataset]]
                   + self.offsets[dataset][indices]
                   + self.memory[dataset][indices])

  def train(self, used: Sequence[tuple[int, np.ndarray]]) -> None:
    """One step on a batch: `used` lists (dataset, example indices)."""
    groups = np.zeros(len(self.tasks))
    for d, idx in used:
      groups[self.task_of[d]] += len(idx)
      np.add.at(self.memory[d], idx, self.lr_example)
    self.skill += self.lr * (groups @ self.mixing) / self.batch_size

  def heldout_accuracy(self) -> dict[str, float]:
    """Mean pass rate of each task over its held-out difficulties."""
    out = {}
    for t, name in enumerate(self.tasks):
      if self._heldout[t]:
        d = np.concatenate(self._heldout[t])
        out[name] = float(sigmoid(self.skill[t] + d).mean())
    return out
