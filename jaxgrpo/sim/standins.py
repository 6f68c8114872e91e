"""Stand-ins for the model side of a rollout: datasets, tokenizer, generator.

Two ways to run `Rollout.collect` against the synthetic learner:

  'rollout': the real `Rollout` and round (`Rollout.for_model`) with
    `SimTokenizer` and `SimGenerator`. A prompt 'k:i' (dataset code k,
    example index i) encodes as two tokens; the generator answers each of G
    completions right with the learner's pass rate as a one-token
    completion, which is decoded to text and scored by the real
    `exact_match` verifier in a `Scorer`.
  'fast': the real `Rollout` with `FastRound` as its round function, which
    skips the text: it draws the same rewards from the same random stream
    as a [R, G] array for lightweight `SimPrompt`s, and the same sampler,
    classification and `collect` loop take them. It gives the same metrics
    as 'rollout' (the tests check this) for a fraction of the cost per
    completion.

Datasets are lazy: `SimSource` and `IndexSource` make an example when it is
indexed, so a dataset of a million examples costs nothing until drawn.
"""

from collections.abc import Sequence
import dataclasses
import time
from typing import NamedTuple

import numpy as np

from jaxgrpo.example import Example
from jaxgrpo.generate.generator import Completions
from jaxgrpo.rl import rounds
from jaxgrpo.sim import learner as learner_lib

RIGHT, WRONG = 'right', 'wrong'


class SimSource:
  """A dataset of `size` synthetic `Example`s, each made when indexed.

  Example i of dataset code k has id '<name>/i', prompt 'k:i' (see
  `SimTokenizer`) and the answer `RIGHT`.
  """

  def __init__(self, name: str, size: int, code: int):
    self.name, self.size, self.code = name, int(size), int(code)

  def __len__(self) -> int:
    return self.size

  def __getitem__(self, i: int) -> Example:
    i = int(i)
    if not 0 <= i < self.size:
      raise IndexError(f'{self.name} has {self.size} examples, asked for {i}')
    return Example(id=f'{self.name}/{i}', prompt=f'{self.code}:{i}',
                   answer=RIGHT, dataset=self.name)


class SimPrompt(NamedTuple):
  """The fast engine's stand-in for an `Example`."""

  dataset: str
  code: int
  index: int
  subset: str = ''


class IndexSource(SimSource):
  """Like `SimSource`, but yields `SimPrompt`s (no text)."""

  def __getitem__(self, i: int) -> SimPrompt:
    i = int(i)
    if not 0 <= i < self.size:
      raise IndexError(f'{self.name} has {self.size} examples, asked for {i}')
    return SimPrompt(self.name, self.code, i)


def example_index(example: Example | SimPrompt) -> int:
  """The index of a simulated example in its dataset."""
  if isinstance(example, SimPrompt):
    return example.index
  return int(example.id.rsplit('/', 1)[1])


class SimTokenizer:
  """Prompt 'k:i' is the two tokens (FIRST + k, FIRST + i); a completion is
  one RIGHT or WRONG token and EOS."""

  PAD, EOS, RIGHT, WRONG, FIRST = 0, 1, 2, 3, 4
  vocab_size = 2**31 - 1
  pad_id, eos_id, bos_id, add_bos, stop_ids = PAD, EOS, None, False, (EOS,)

  def encode(self, text: str) -> list[int]:
    code, _, index = text.partition(':')
    try:
      return [self.FIRST + int(code), self.FIRST + int(index)]
    except ValueError:
      raise ValueError(
          f'simulated prompt {text!r} is not "<dataset code>:<index>"'
      ) from None

  def decode(self, ids: Sequence[int]) -> str:
    out = []
    for i in ids:
      i = int(i)
      if i == self.EOS:
        break
      out.append({self.RIGHT: RIGHT, self.WRONG: WRONG}.get(i, ''))
    return ''.join(out)


class SimGenerator:
  """Answers each completion right with the learner's current pass rate."""

  def __init__(self, learner: learner_lib.Learner, *, group_size: int,
               seed: int):
    self.learner = learner
    self.num_samples = group_size
    self.rng = np.random.default_rng([seed, 1])

  def pass_rates(self, codes: np.ndarray, index: np.ndarray) -> np.ndarray:
    p = np.empty(len(codes))
    for d in np.unique(codes):
      rows = codes == d
      p[rows] = self.learner.pass_rate(int(d), index[rows])
    return p

  def correct(self, p: np.ndarray, rows: int) -> np.ndarray:
    """[K, G] bool: which completions of K prompts of pass rates p are right.

    Draws [rows, G] uniforms (rows >= K: a round padded to its compiled
    size draws for the padding too), so both engines use the stream alike.
    """
    u = self.rng.random((rows, self.num_samples))[:len(p)]
    return u < p[:, None]

  def generate(self, params, tokens, mask, rng) -> Completions:
    """The `Generator` interface on `SimTokenizer` prompts [R, 2]."""
    del params, mask, rng
    tokens = np.asarray(tokens)
    codes = tokens[:, -2].astype(np.int64) - SimTokenizer.FIRST
    index = tokens[:, -1].astype(np.int64) - SimTokenizer.FIRST
    p_R = self.pass_rates(codes, index)
    ok = self.correct(p_R, len(tokens)).reshape(-1)
    p = np.repeat(p_R, self.num_samples)
    out = np.empty((ok.size, 2), np.int32)
    out[:, 0] = np.where(ok, SimTokenizer.RIGHT, SimTokenizer.WRONG)
    out[:, 1] = SimTokenizer.EOS
    logps = np.zeros(out.shape, np.float32)
    logps[:, 0] = np.log(np.maximum(np.where(ok, p, 1.0 - p), 1e-9))
    return Completions(tokens=out, logps=logps, mask=np.ones(out.shape, bool),
                       lengths=np.full(ok.size, 2, np.int32))


@dataclasses.dataclass
class SimGroup:
  """A group of the fast engine: its prompt and G rewards."""

  example: SimPrompt
  rewards: np.ndarray
  tokens: int = 0  # completion tokens (the stand-in generator writes 2 each)

  @property
  def completion_mask(self) -> np.ndarray:
    """[G, 2], as `SimGenerator.generate` writes them: an answer token and
    EOS, filling T = 2 (so `rollout/completions_cut` reads 1, as in the
    `rollout` engine)."""
    return np.ones((self.rewards.shape[0], 2), bool)


@dataclasses.dataclass(frozen=True)
class FastRound:
  """The fast engine's round function: no tokens, text or verifier calls.

  Draws each prompt's G rewards from `SimGenerator` (1.0 right, 0.0 wrong,
  as `exact_match` scores them) as one [R, G] array; the `Rollout` it is
  plugged into classifies them and runs dynamic sampling, surplus and the
  metrics unchanged. Its groups are `SimGroup`s, so no train batch is
  assembled.
  """

  generator: SimGenerator

  def __call__(self, params, rng, examples: Sequence[SimPrompt],
               size: int) -> rounds.Round:
    del params, rng
    gen, n = self.generator, len(examples)
    codes = np.fromiter((ex.code for ex in examples), np.int64, n)
    index = np.fromiter((ex.index for ex in examples), np.int64, n)
    t0 = time.perf_counter()
    rewards_RG = gen.correct(gen.pass_rates(codes, index),
                             size).astype(np.float32)
    gen_s = time.perf_counter() - t0
    return rounds.Round(
        groups=[SimGroup(ex, rewards_RG[r], 2 * gen.num_samples)
                for r, ex in enumerate(examples)],
        rewards=rewards_RG, gen_s=gen_s,
        gen_tokens=float(2 * n * gen.num_samples))
