"""An in-memory prompt source: every example offered once per seeded epoch."""

from collections.abc import Sequence

import numpy as np

from jaxgrpo.typing import Example


class EpochSource:
  """Offers examples in a fresh seeded permutation each epoch.

  This is plain dynamic sampling's view of a dataset (policy `none`): no
  example is ever skipped. It records per-example trials and successes from
  the rollout feedback so the run can report them. Its whole state is a few
  integers and two count arrays, restored exactly by `set_state`.
  """

  def __init__(self, examples: Sequence[Example], *, seed: int):
    if not examples:
      raise ValueError('a prompt source needs at least one example')
    self.examples = list(examples)
    self._index = {ex.id: i for i, ex in enumerate(self.examples)}
    if len(self._index) != len(self.examples):
      raise ValueError('example ids must be unique within a prompt source')
    self.seed = seed
    self.epoch = 0
    self.position = 0
    self.trials = np.zeros(len(self.examples), np.int32)
    self.successes = np.zeros(len(self.examples), np.float32)
    self._order = self._permutation(0)

  def _permutation(self, epoch: int) -> np.ndarray:
    rng = np.random.default_rng([self.seed, epoch])
    return rng.permutation(len(self.examples))

  def next_prompts(self, n: int) -> list[Example]:
    """The next `n` examples, crossing into new epochs as needed."""
    out = []
    while len(out) < n:
      if self.position == len(self._order):
        self.epoch += 1
        self.position = 0
        self._order = self._permutation(self.epoch)
      take = self._order[self.position:self.position + n - len(out)]
      self.position += len(take)
      out.extend(self.examples[i] for i in take)
    return out

  def observe(self, examples: Sequence[Example], rewards: np.ndarray) -> None:
    """Records a round's outcomes; rewards is [R, G]."""
    for ex, row in zip(examples, rewards):
      i = self._index[ex.id]
      self.trials[i] += row.size
      self.successes[i] += float(row.sum())

  def get_state(self) -> dict[str, np.ndarray | int]:
    return {
        'seed': self.seed,
        'epoch': self.epoch,
        'position': self.position,
        'num_examples': len(self.examples),
        'trials': self.trials.copy(),
        'successes': self.successes.copy(),
    }

  def set_state(self, state: dict) -> None:
    if int(state['num_examples']) != len(self.examples):
      raise ValueError(
          f'prompt source state is for {int(state["num_examples"])} examples, '
          f'this source has {len(self.examples)}'
      )
    self.seed = int(state['seed'])
    self.epoch = int(state['epoch'])
    self.position = int(state['position'])
    self.trials = np.asarray(state['trials'], np.int32).copy()
    self.successes = np.asarray(state['successes'], np.float32).copy()
    self._order = self._permutation(self.epoch)
