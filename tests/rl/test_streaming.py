"""Streaming dynamic sampling (`rl.streaming`) with a tiny model.

The verifier scores by a stable hash of the completion's text, with one
example in three always right and one always wrong, so some groups are
informative and some are not, the same on every run.
"""

import collections
import random
import time
from unittest import mock
import zlib

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

from jaxgrpo import multihost
from jaxgrpo import train
from jaxgrpo.data import mixture
from jaxgrpo.data import snooze
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.example import Example
from jaxgrpo.generate import continuous
from jaxgrpo.generate import stream as stream_lib
from jaxgrpo.generate.generator import Generator
from jaxgrpo.generate.sampling import Sampling
from jaxgrpo.model import config
from jaxgrpo.model import decoder
from jaxgrpo.reporting import metrics as metrics_lib
from jaxgrpo.rl import accumulate
from jaxgrpo.rl import rollout as rollout_lib
from jaxgrpo.verifiers import pool as verifier_pool
from tests import forced_devices
from tests.rl import streaming_sharded

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

  def observe(self, examples, rewards):
    self.observed += [(ex.id, tuple(r)) for ex, r in zip(examples, rewards)]
    self.held_ids -= collections.Counter(ex.id for ex in examples)
    super().observe(examples, rewards)

  held_ids = collections.Counter()  # ids kept in flight, not yet observed
  drawn_while_held = 0

  def hold(self, examples):
    self.held_ids = collections.Counter(ex.id for ex in examples)
    super().hold(examples)

  def next_prompts(self, n, need=None):
    out = super().next_prompts(n, need)
    self.drawn += [ex.id for ex in out]
    self.drawn_while_held += sum(ex.id in self.held_ids for ex in out)
    return out


class _RecordingAccumulator(accumulate.Accumulator):
  """An accumulator that records every group scored."""

  scored: list

  def add_groups(self, rnd, classified):
    self.scored = getattr(self, 'scored', []) + list(rnd.groups)
    super().add_groups(rnd, classified)


class StreamingTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tok = tokenizer_lib.CharTokenizer()
    cls.cfg = config.ModelConfig.tiny(cls.tok.vocab_size)
    cls.graphdef, cls.params = decoder.init_params(cls.cfg, jax.random.key(0))

  def _rollout(self, verifier=_hashed, overlap=1, slots=12, size=40,
               temperature=1.0, stop_at=None, leave_out=(), **kw):
    examples = {d: [Example(id=f'{d}/{i}', prompt=f'{i}+{d}=', answer='1',
                            dataset=d) for i in range(size)
                    if f'{d}/{i}' not in leave_out] for d in 'ab'}
    policy = snooze.PolicyConfig(policy='snooze', group_size=G)
    sampler = _Recording(
        [(mixture.DatasetSpec(name=d, weight=1.0, policy=policy), exs)
         for d, exs in examples.items()],
        balance='post_filter', batch_size=B, seed=0)
    cfg = rollout_lib.RolloutConfig(**{
        **dict(batch_size=B, group_size=G, round_size=4, max_rounds=8,
               max_prompt_len=8, engine='continuous', collect='streaming',
               verify_overlap=overlap),
        **kw})
    gen = Generator(graphdef=self.graphdef, model_cfg=self.cfg,
                    sampling=Sampling(temperature=temperature),
                    max_new_tokens=6,
                    num_samples=G, stop_tokens=(self.tok.eos_id,),
                    pad_id=self.tok.pad_id)
    engine = continuous.ContinuousGenerator(generator=gen, slots=slots,
                                            chunk=2, buckets=(4,))
    scorer = verifier_pool.Scorer(verifier)
    self.addCleanup(scorer.close)
    ro = rollout_lib.Rollout.for_model(cfg, sampler, self.tok, engine, scorer,
                                       stop_at=stop_at)
    ro.accumulator = _RecordingAccumulator(
        sampler.names, batch_size=B, short_batch=cfg.short_batch,
        surplus=cfg.surplus, in_flight=cfg.in_flight)
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

  def _check_tokens(self, metrics):
    # Every token is scored, kept in flight or wasted; resumed ones were
    # generated by an earlier step.
    for m in metrics:
      self.assertEqual(
          m['rollout/tokens_generated'] + m['rollout/tokens_resumed'],
          m['rollout/tokens_scored'] + m['rollout/tokens_in_flight']
          + m['rollout/tokens_wasted'])
    for before, after in zip(metrics, metrics[1:]):
      self.assertEqual(after['rollout/partial_resumed'],
                       before['rollout/partial_kept'])
      self.assertEqual(after['rollout/tokens_resumed'],
                       before['rollout/tokens_in_flight'])

  @parameterized.parameters(0.0, 1.0)
  def test_kept_groups_continue_as_if_never_stopped(self, temperature):
    # Params do not change between the steps: every sample the steps took
    # up part-way ends with the tokens of an uninterrupted decode with its
    # keys (the engine draws token t with the key of position t).
    # Forced lengths make greedy groups differ within, so some inform.
    stop_at = lambda tokens: np.tile([0, 3, 0, 5], (len(tokens), 1))
    ro, sampler = self._rollout(in_flight='keep', max_staleness=8,
                                temperature=temperature, stop_at=stop_at)
    kept, metrics = {}, []
    for step in range(4):
      res = ro.collect(self.params, jax.random.key(step), step)
      metrics.append(res.metrics)
      kept |= {(step, p.example.id): p for p in ro.accumulator.in_flight}
    self._check_tokens(metrics)
    self.assertGreater(metrics[0]['rollout/partial_kept'], 0)
    self.assertEqual(metrics[0]['rollout/tokens_wasted'], 0)
    self.assertEqual(sum(m['rollout/groups_discarded'] for m in metrics), 0)
    self.assertGreater(max(m['rollout/staleness_max'] for m in metrics), 0)
    scored = {g.example.id: g for g in ro.accumulator.scored}
    engine = ro.stream_fn.engine
    compared = 0
    for (_, ex_id), part in kept.items():
      group = scored.get(ex_id)
      if group is None or not (0 < part.lengths).any():
        continue
      # The tokens kept are the start of the finished samples.
      for g in range(G):
        n = part.lengths[g]
        np.testing.assert_array_equal(group.completion_tokens[g, :n],
                                      part.completion_tokens[g, :n])
        np.testing.assert_array_equal(group.old_logps[g, :n],
                                      part.old_logps[g, :n])
      fresh = stream_lib.SlotStream(engine, self.params, 8)
      fresh.add_group(part.prompt_tokens, part.prompt_mask, part.keys,
                      part.stop_at, dict.fromkeys(range(G)))
      done = {}
      while not fresh.idle:
        done |= {s.index: s for s in fresh.step()}
      np.testing.assert_array_equal(
          group.completion_tokens, np.stack([done[g].tokens for g in range(G)]))
      np.testing.assert_allclose(
          group.old_logps, np.stack([done[g].logps for g in range(G)]),
          rtol=0, atol=1e-5)
      compared += 1
    self.assertGreater(compared, 0)
    # The sampler observed each draw once, when scored; what it has not
    # observed is in flight; nothing in flight was drawn again.
    observed = collections.Counter(i for i, _ in sampler.observed)
    in_flight = collections.Counter(
        p.example.id for p in ro.accumulator.in_flight)
    self.assertEqual(collections.Counter(sampler.drawn),
                     observed + in_flight)
    self.assertEqual(sampler.drawn_while_held, 0)

  def test_retried_examples_go_first_and_every_draw_is_scored(self):
    # in_flight='retry': the groups in flight at a step's end are dropped
    # (tokens wasted), and the next step admits their examples before it
    # draws, with fresh sample keys; no drawn example goes unscored.
    ro, sampler = self._rollout(in_flight='retry')
    admitted = []
    add_group = stream_lib.SlotStream.add_group

    def recording(stream, tokens, mask, keys, stop_at, samples):
      admitted.append((tokens.tobytes(), keys.tobytes()))
      return add_group(stream, tokens, mask, keys, stop_at, samples)

    metrics, retried = [], []
    with mock.patch.object(stream_lib.SlotStream, 'add_group', recording):
      for step in range(4):
        before = len(admitted)
        metrics.append(ro.collect(self.params, jax.random.key(step),
                                  step).metrics)
        retried.append([ex.id for ex in sampler.held()])
        m = metrics[-1]
        self.assertEqual(m['rollout/groups_retried'], len(retried[-1]))
        self.assertEqual(m['rollout/groups_retried'],
                         m['rollout/groups_discarded'])
        self.assertNotIn('rollout/partial_kept', m)
        if step:  # the last step's retries were this step's first groups
          firsts = admitted[before:before + len(retried[-2])]
          self.assertEqual(
              [t for t, _ in firsts],
              [self._prompt(i) for i in retried[-2]])
          # Fresh keys: none of them was admitted with its old ones.
          self.assertEmpty({k for _, k in firsts}
                           & {k for _, k in admitted[:before]})
    self.assertGreater(sum(m['rollout/groups_retried'] for m in metrics), 0)
    self.assertGreater(metrics[0]['rollout/tokens_wasted'], 0)
    self.assertEqual(sampler.drawn_while_held, 0)
    # Every draw was observed once, or waits to be retried.
    observed = collections.Counter(i for i, _ in sampler.observed)
    self.assertEqual(collections.Counter(sampler.drawn),
                     observed + collections.Counter(retried[-1]))

  def _prompt(self, example_id: str) -> bytes:
    i, d = example_id.split('/')[1], example_id.split('/')[0]
    tokens, _, _ = tokenizer_lib.encode_prompts(self.tok, [f'{i}+{d}='], 8)
    return tokens[0].tobytes()

  def test_small_datasets_do_not_redraw_what_is_in_flight(self):
    # Eight examples a dataset: the sampler walks into new epochs while
    # groups of the last are still in flight.
    ro, sampler = self._rollout(size=8, in_flight='keep', max_staleness=8)
    metrics = [ro.collect(self.params, jax.random.key(step), step).metrics
               for step in range(5)]
    self._check_tokens(metrics)
    self.assertGreater(sum(m['rollout/partial_kept'] for m in metrics), 0)
    self.assertGreater(len(sampler.drawn), 16)  # past one epoch
    self.assertEqual(sampler.drawn_while_held, 0)
    observed = collections.Counter(i for i, _ in sampler.observed)
    in_flight = collections.Counter(
        p.example.id for p in ro.accumulator.in_flight)
    self.assertEqual(collections.Counter(sampler.drawn),
                     observed + in_flight)

  def test_an_example_drawn_twice_at_once_is_sampled_twice(self):
    # One example a dataset: a draw for three prompts offers one twice.
    # Samples are keyed by example, so the offers must be keyed apart.
    ro, sampler = self._rollout(size=1)
    ro.collect(self.params, jax.random.key(0), 0)
    self.assertLess(len(set(sampler.drawn)), len(sampler.drawn))
    completions = [g.completion_tokens.tobytes()
                   for g in ro.accumulator.scored]
    self.assertGreater(len(completions), 2)
    self.assertLen(set(completions), len(completions))

  def test_staleness_cap_expires_kept_groups(self):
    # max_staleness 0: a group with a token sampled this step cannot wait
    # for the next; only groups that never reached a slot are kept.
    ro, sampler = self._rollout(in_flight='keep', max_staleness=0)
    metrics = []
    for step in range(3):
      metrics.append(ro.collect(self.params, jax.random.key(step),
                                step).metrics)
      for part in ro.accumulator.in_flight:
        self.assertEqual(part.tokens, 0)
    self._check_tokens(metrics)
    expired = sum(m['rollout/partial_expired'] for m in metrics)
    self.assertGreater(expired, 0)
    self.assertEqual(expired,
                     sum(m['rollout/groups_discarded'] for m in metrics))
    self.assertGreater(metrics[0]['rollout/tokens_wasted'], 0)
    # Expired groups are never observed; the rest are, or are in flight.
    observed = collections.Counter(i for i, _ in sampler.observed)
    in_flight = collections.Counter(
        p.example.id for p in ro.accumulator.in_flight)
    self.assertEqual(len(sampler.drawn),
                     sum(observed.values()) + sum(in_flight.values())
                     + expired)

  @parameterized.parameters('keep', 'retry')
  def test_groups_in_flight_survive_a_checkpoint(self, in_flight):
    # A rollout restored from another's state (the sampler's and its own)
    # goes on exactly as the original does: what 'keep' keeps is in the
    # rollout's state, what 'retry' retries in the sampler's.
    kw = dict(in_flight=in_flight, max_staleness=8)
    runs = []
    for restore in (False, True):
      ro, sampler = self._rollout(**kw)
      ro.collect(self.params, jax.random.key(0), 0)
      if restore:
        state = (jax.tree.map(np.array, sampler.get_state()),
                 jax.tree.map(np.array, ro.get_state()))
        self.assertIn('held', state[0])
        self.assertNotEmpty(state[0]['held'])
        if in_flight == 'keep':
          self.assertGreater(int(state[1]['in_flight']['count']), 0)
        else:
          self.assertNotIn('in_flight', state[1])
        ro, sampler = self._rollout(**kw)
        sampler.set_state(state[0])
        ro.set_state(state[1])
      results = [ro.collect(self.params, jax.random.key(step), step)
                 for step in (1, 2)]
      runs.append((
          [[(g.example.id, g.rewards.tolist(), g.completion_tokens.tolist(),
             g.old_logps.tolist(), getattr(g, 'versions', None) is not None
             and g.versions.tolist()) for g in r.groups]
           for r in results],
          [{k: v for k, v in r.metrics.items() if not k.startswith('perf/')}
           for r in results],
          multihost.digest(sampler.get_state()),
          multihost.digest(ro.get_state())))
    self.assertEqual(runs[0], runs[1])

  def test_kept_groups_of_examples_gone_on_a_remap_are_discarded(self):
    # A resume under checkpoint.on_dataset_change='remap' drops the examples
    # no longer in the data from what the sampler holds; their kept groups
    # can no longer be observed, so the next step discards them (it raised
    # in the sampler's `observe` when such a group was scored).
    kw = dict(in_flight='keep', max_staleness=8)
    ro, sampler = self._rollout(**kw)
    ro.collect(self.params, jax.random.key(0), 0)
    state = (sampler.get_state(), ro.get_state())
    kept = [p.example.id for p in ro.accumulator.in_flight]
    self.assertGreater(len(kept), 1)
    ro, sampler = self._rollout(leave_out=kept[:1], **kw)
    old = [f'{d}/{i}' for d in 'ab' for i in range(40)]
    sampler.set_state(state[0], remap={d: (
        snooze.id_hashes([i for i in old if i.startswith(d)]),
        snooze.id_hashes([ex.id for ex in src]))
        for d, src in zip(sampler.names, sampler.sources)})
    ro.set_state(state[1])
    metrics = [ro.collect(self.params, jax.random.key(step), step).metrics
               for step in (1, 2)]
    self._check_tokens(metrics)
    self.assertEqual(metrics[0]['rollout/partial_resumed'], len(kept) - 1)
    self.assertGreaterEqual(metrics[0]['rollout/groups_discarded'], 1)
    self.assertNotIn(kept[0], [i for i, _ in sampler.observed])

  def test_needs_the_continuous_engine(self):
    cfg = rollout_lib.RolloutConfig(
        batch_size=B, group_size=G, round_size=4, max_rounds=1,
        max_prompt_len=8, engine='continuous', collect='streaming')
    with self.assertRaisesRegex(ValueError, 'rollout.engine=continuous'):
      rollout_lib.Rollout(cfg, None, None, pad_id=0)

  @parameterized.parameters('retry', 'keep')
  def test_in_flight_choices_need_streaming(self, choice):
    with self.assertRaisesRegex(
        ValueError, f"rollout.in_flight='{choice}': needs "
        "rollout.collect='streaming'"):
      rollout_lib.RolloutConfig(batch_size=B, group_size=G, round_size=4,
                                max_prompt_len=8, in_flight=choice)


class StreamingOnAMeshTest(absltest.TestCase):

  def test_slots_not_a_multiple_of_the_devices_collect_the_same(self):
    """slots=6 on data=4 pads the slot rows to 8 with idle ones: the run
    draws, samples, scores and trains as on one device (6 slots)."""
    meshed = self.create_tempdir().full_path
    proc = forced_devices.run(self, 'tests/rl/streaming_sharded.py', meshed)
    self.assertIn('mesh: data=4 fsdp=1 tensor=1 over 4 cpu devices',
                  proc.stdout)
    one = self.create_tempdir().full_path
    train.run(streaming_sharded.config(), one, log=lambda _: None)
    runs = [metrics_lib.read_metrics(w) for w in (meshed, one)]
    self.assertEqual([r['step'] for r in runs[0]],
                     [r['step'] for r in runs[1]])
    trained = 0
    for got, want in zip(*runs):
      self.assertEqual(sorted(got), sorted(want))
      trained += 'train/loss' in want
      for key, value in want.items():
        if key.startswith(('rollout/', 'data/', 'reward')):
          self.assertEqual(got[key], value, key)
        elif key.startswith(('train/', 'eval/')):
          self.assertAlmostEqual(got[key], value, delta=1e-5, msg=key)
    self.assertGreater(trained, 0)
    for record in runs[1][1:]:  # every step streamed through the slots
      self.assertIn('rollout/slot_occupancy', record)


if __name__ == '__main__':
  absltest.main()
