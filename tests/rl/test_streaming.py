"""Streaming dynamic sampling (`rl.streaming`) with a tiny model.

The verifier scores by a stable hash of the completion's text, with one
example in three always right and one always wrong, so some groups are
informative and some are not, the same on every run.
"""

import random
import time
import zlib

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

from jaxgrpo import multihost
from jaxgrpo.data import mixture
from jaxgrpo.data import snooze
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.example import Example
from jaxgrpo.generate import continuous
from jaxgrpo.generate.generator import Generator
from jaxgrpo.generate.sampling import Sampling
from jaxgrpo.model import config
from jaxgrpo.model import decoder
from jaxgrpo.rl import rollout as rollout_lib
from jaxgrpo.verifiers import pool as verifier_pool

G, B = 4, 4


def _hashed(text: str, example: Example) -> float:
  kind = int(example.id.rsplit('/', 1)[1]) % 3
  if kind:
    return float(kind == 1)
  return float(zlib.crc32(text.encode()) % 2)


def _sleepy(text: str, example: Example) -> float:
  time.sleep(random.random() * 0.02)  # answers in a random order
  return _hashed(text, example)


class _Recording(mixture.MixtureSampler):
  """A mixture that records what it hands out and what it observes."""

  def __init__(self, *args, **kwargs):
    self.drawn, self.observed = [], []
    super().__init__(*args, **kwargs)

  def next_prompts(self, n, need=None):
    out = super().next_prompts(n, need)
    self.drawn += [ex.id for ex in out]
    return out

  def observe(self, examples, rewards):
    self.observed += [(ex.id, tuple(r)) for ex, r in zip(examples, rewards)]
    super().observe(examples, rewards)


class StreamingTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tok = tokenizer_lib.CharTokenizer()
    cls.cfg = config.ModelConfig.tiny(cls.tok.vocab_size)
    cls.graphdef, cls.params = decoder.init_params(cls.cfg, jax.random.key(0))

  def _rollout(self, verifier=_hashed, overlap=1, slots=12, **kw):
    examples = {d: [Example(id=f'{d}/{i}', prompt=f'{i}+{d}=', answer='1',
                            dataset=d) for i in range(40)] for d in 'ab'}
    policy = snooze.PolicyConfig(policy='snooze', group_size=G)
    sampler = _Recording(
        [(mixture.DatasetSpec(name=d, weight=1.0, policy=policy), exs)
         for d, exs in examples.items()],
        balance='post_filter', batch_size=B, seed=0)
    cfg = rollout_lib.RolloutConfig(**{
        **dict(batch_size=B, group_size=G, round_size=4, max_rounds=8,
               max_prompt_len=8, collect='streaming', verify_overlap=overlap),
        **kw})
    gen = Generator(graphdef=self.graphdef, model_cfg=self.cfg,
                    sampling=Sampling(temperature=1.0), max_new_tokens=6,
                    num_samples=G, stop_tokens=(self.tok.eos_id,),
                    pad_id=self.tok.pad_id)
    engine = continuous.ContinuousGenerator(generator=gen, slots=slots,
                                            chunk=2, buckets=(4,))
    scorer = verifier_pool.Scorer(verifier)
    self.addCleanup(scorer.close)
    ro = rollout_lib.Rollout.for_model(cfg, sampler, self.tok, engine, scorer)
    return ro, sampler

  def _steps(self, ro, n=2):
    return [ro.collect(self.params, jax.random.key(step), step)
            for step in range(n)]

  def test_ends_at_b_informative_groups_and_counts_what_it_discards(self):
    ro, sampler = self._rollout()
    res = self._steps(ro, 1)[0]
    m = res.metrics
    self.assertLen(res.groups, B)
    # post_filter: each dataset fills its quota of B / 2.
    self.assertEqual(m['rollout/groups_used/a'], B / 2)
    self.assertEqual(m['rollout/groups_used/b'], B / 2)
    informative = [g for g in res.groups if np.ptp(g.rewards) > 0]
    self.assertLen(informative, B)
    # The sampler saw every scored group, each once, with its rewards.
    scored = int(m['rollout/prompts_generated'])
    self.assertLen(sampler.observed, scored)
    self.assertLen({i for i, _ in sampler.observed}, scored)
    for g in res.groups:
      self.assertIn((g.example.id, tuple(g.rewards)), sampler.observed)
    # What was drawn and not scored was in flight when the step ended.
    self.assertEqual(len(sampler.drawn) - scored,
                     m['rollout/groups_discarded'])
    self.assertGreater(m['rollout/groups_discarded'], 0)
    self.assertGreater(m['rollout/tokens_wasted'], 0)
    self.assertEqual(m['rollout/tokens_used'],
                     sum(g.completion_mask.sum() for g in res.groups))
    self.assertGreaterEqual(
        m['rollout/tokens_generated'],
        m['rollout/tokens_used'] + m['rollout/tokens_wasted'])
    self.assertBetween(m['rollout/slot_occupancy'], 0.1, 1.0)
    self.assertIsNotNone(res.batch)

  def test_budget_ends_a_step_without_informative_groups(self):
    ro, sampler = self._rollout(verifier=lambda t, ex: 1.0, max_rounds=2)
    res = self._steps(ro, 1)[0]
    self.assertEqual(res.groups, [])  # short_batch 'wait': no update
    self.assertEqual(len(sampler.drawn), 2 * 4)  # max_rounds x round_size
    self.assertEqual(res.metrics['rollout/groups_discarded'], 0)
    self.assertEqual(res.metrics['rollout/groups_easy'], 8)

  @parameterized.parameters(0, 1, 3)
  def test_same_groups_whatever_the_verifier_timing(self, overlap):
    runs = []
    for verifier in (_hashed, _sleepy, _sleepy):
      ro, sampler = self._rollout(verifier=verifier, overlap=overlap)
      results = self._steps(ro, 2)
      runs.append((
          [[(g.example.id, g.rewards.tolist(), g.completion_tokens.tolist())
            for g in r.groups] for r in results],
          [{k: v for k, v in r.metrics.items() if not k.startswith('perf/')}
           for r in results],
          sampler.observed,
          multihost.digest(sampler.get_state()),
          multihost.digest(ro.get_state())))
    self.assertEqual(runs[0], runs[1])
    self.assertEqual(runs[0], runs[2])

  def test_needs_the_continuous_engine(self):
    cfg = rollout_lib.RolloutConfig(
        batch_size=B, group_size=G, round_size=4, max_rounds=1,
        max_prompt_len=8, collect='streaming')
    with self.assertRaisesRegex(ValueError, 'rollout.engine=continuous'):
      rollout_lib.Rollout(cfg, None, None, pad_id=0)


if __name__ == '__main__':
  absltest.main()
