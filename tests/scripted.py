"""A scripted generator: each prompt is answered right with a fixed probability.

It stands in for the model in sampler and rollout tests, so their accounting
is exact and fast: no network, just per-example pass rates.
"""

import numpy as np

from jaxgrpo import verifiers
from jaxgrpo.data import mixture
from jaxgrpo.data import snooze
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.example import Example
from jaxgrpo.generate.generator import Completions
from jaxgrpo.rl import rollout as rollout_lib
from jaxgrpo.verifiers import pool as verifier_pool

T = 6


class ScriptedGenerator:
  """Answers prompt p correctly with probability `pass_rate[p]`."""

  def __init__(self, tokenizer, examples, pass_rate, *, group_size, seed=0):
    self.num_samples = group_size
    self.tok = tokenizer
    self.answers = {ex.prompt: ex.answer for ex in examples}
    self.pass_rate = pass_rate
    self.rng = np.random.default_rng(seed)
    self.calls = 0
    self.prompts_seen = []
    self.round_sizes = []

  def generate(self, params, tokens, mask, rng):
    del params, mask, rng
    self.calls += 1
    self.round_sizes.append(len(tokens))
    rows = []
    for row in tokens:
      prompt = self.tok.decode(row)
      self.prompts_seen.append(prompt)
      for _ in range(self.num_samples):
        ok = self.rng.random() < self.pass_rate[prompt]
        text = self.answers[prompt] if ok else self.answers[prompt] + '9'
        rows.append(self.tok.encode(text) + [self.tok.eos_id])
    out = np.zeros((len(rows), T), np.int32)
    m = np.zeros((len(rows), T), bool)
    for i, r in enumerate(rows):
      out[i, :len(r)] = r
      m[i, :len(r)] = True
    return Completions(
        tokens=out, logps=np.where(m, -0.5, 0.0).astype(np.float32), mask=m,
        lengths=m.sum(1).astype(np.int32))


def make_examples(name: str, n: int) -> list[Example]:
  return [Example(id=f'{name}/{i}', prompt=f'{name[0]}{i}=', answer=str(i),
                  dataset=name) for i in range(n)]


def make_rollout(datasets, *, policy='none', balance='pre_filter',
                 batch_size=4, group_size=4, round_size=8, max_rounds=4,
                 surplus='carry', snooze_factor=5, seed=0, gen_seed=0,
                 min_fractions=None, max_round_size=256, short_batch='wait',
                 verifier=None):
  """A Rollout over a MixtureSampler of scripted datasets.

  Args:
    datasets: list of (name, weight, pass rates per example).
    others: as in RolloutConfig / PolicyConfig.
    verifier: scores (completion, example) (default: exact_match).

  Returns:
    (rollout, sampler, generator).
  """
  tok = tokenizer_lib.CharTokenizer(
      alphabet='0123456789=abcdefghijklmnopqrstuvwxyz')
  entries, all_examples, rates = [], [], {}
  for k, (name, weight, pass_rates) in enumerate(datasets):
    examples = make_examples(name, len(pass_rates))
    policy_cfg = snooze.PolicyConfig(
        policy=policy, snooze_factor=snooze_factor, group_size=group_size)
    spec = mixture.DatasetSpec(
        name=name, weight=weight, policy=policy_cfg,
        min_fraction=(min_fractions or {}).get(name, 0.0))
    entries.append((spec, examples))
    all_examples += examples
    rates.update({ex.prompt: r for ex, r in zip(examples, pass_rates)})
  sampler = mixture.MixtureSampler(entries, balance=balance,
                                   batch_size=batch_size, seed=seed)
  gen = ScriptedGenerator(tok, all_examples, rates, group_size=group_size,
                          seed=gen_seed)
  cfg = rollout_lib.RolloutConfig(
      batch_size=batch_size, group_size=group_size, round_size=round_size,
      max_rounds=max_rounds, surplus=surplus, max_prompt_len=8,
      max_round_size=max_round_size, short_batch=short_batch)
  ro = rollout_lib.Rollout.for_model(
      cfg, sampler, tok, gen,
      verifier_pool.Scorer(verifier or verifiers.get('exact_match')))
  return ro, sampler, gen
