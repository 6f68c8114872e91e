"""Tests for `SlotStream`: prompts added while it decodes.

Samples draw with per-sample keys, so each sample must equal the static
generator's (tolerance as in test_continuous: equal tokens, log-probs
within 1e-5), whenever its prompt was added and whatever slot it took.
"""

from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

from jaxgrpo.generate import continuous
from jaxgrpo.generate import keys
from jaxgrpo.generate import slots as slots_lib
from jaxgrpo.generate import stream as stream_lib
from jaxgrpo.generate.generator import Generator
from jaxgrpo.generate.sampling import Sampling
from jaxgrpo.model import config
from jaxgrpo.model import decoder
from tests.generate import test_continuous as tc


class SlotStreamTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.cfg = config.ModelConfig.tiny()
    self.graphdef, self.params = decoder.init_params(self.cfg,
                                                     jax.random.key(0))
    self.tokens, self.mask = tc._prompts(self.cfg.vocab_size)
    ids = [f'example-{i}' for i in range(tc.B)]
    self.prompt_keys = keys.prompt_keys(jax.random.key(3), ids, epoch=2)
    self.stop_at = np.array([1, 2, 12, 0, 5, 3, 7, 1, 11, 0, 4, 9, 2, 6, 13],
                            np.int32)

  def generator(self, temperature: float) -> Generator:
    return Generator(
        graphdef=self.graphdef, model_cfg=self.cfg,
        sampling=Sampling(temperature=temperature), max_new_tokens=tc.T,
        num_samples=tc.G, stop_tokens=(tc._STOP,))

  def static(self, gen: Generator):
    return gen.generate(self.params, self.tokens, self.mask,
                        jax.random.key(1), prompt_keys=self.prompt_keys,
                        stop_at=self.stop_at)

  def test_matches_static_with_prompts_added_late(self):
    gen = self.generator(1.0)
    want = self.static(gen)
    engine = continuous.ContinuousGenerator(
        generator=gen, slots=4, chunk=3, buckets=(4,))
    s = stream_lib.SlotStream(engine, self.params, tc.P)
    stop = self.stop_at.reshape(tc.B, tc.G)
    ids = s.add(self.tokens[:2], self.mask[:2], self.prompt_keys[:2], stop[:2])
    done = {}
    while not s.idle or len(ids) < tc.B:
      if len(ids) < tc.B and s.chunks >= 2:
        k = len(ids)
        ids += s.add(self.tokens[k:k + 1], self.mask[k:k + 1],
                     self.prompt_keys[k:k + 1], stop[k:k + 1])
      for sample in s.step():
        done[sample.prompt * tc.G + sample.index] = sample
      self.assertLessEqual(s.free_slots, s.slots)
    self.assertEqual(ids, list(range(tc.B)))
    self.assertEqual(sorted(done), list(range(tc.B * tc.G)))
    tokens = np.stack([done[r].tokens for r in range(tc.B * tc.G)])
    lengths = np.array([done[r].length for r in range(tc.B * tc.G)])
    logps = np.stack([done[r].logps for r in range(tc.B * tc.G)])
    np.testing.assert_array_equal(tokens, want.tokens)
    np.testing.assert_array_equal(lengths, want.lengths)
    np.testing.assert_allclose(logps, want.logps, rtol=0, atol=tc._ATOL)
    self.assertEqual(s.busy_slot_steps + tc.B * tc.G, int(lengths.sum()))
    self.assertEqual(s.in_flight(), {})

  @parameterized.parameters((0.0, 64), (1.0, 64), (0.0, 4), (1.0, 4))
  def test_resumed_samples_match_an_uninterrupted_decode(self, temperature,
                                                         resume_min):
    # A session stopped after two chunks hands its unfinished samples to a
    # new session (same params), which rebuilds their caches and decodes
    # on: every sample equals the static generator's, the resumed ones
    # included, since token t draws with the key of position t. With
    # steps of 4 tokens (T = 12: widths 4, 8, 11) the caches are rebuilt
    # from prefills of the tokens so far, not of T - 1 columns.
    widths = []
    width_of = slots_lib.resume_width

    def recorded(t, longest):
      widths.append(width_of(t, longest))
      return widths[-1]

    self.enter_context(mock.patch.object(slots_lib, 'RESUME_MIN', resume_min))
    self.enter_context(mock.patch.object(slots_lib, 'resume_width', recorded))
    gen = self.generator(temperature)
    want = self.static(gen)
    engine = continuous.ContinuousGenerator(
        generator=gen, slots=4, chunk=3, buckets=(4,), prefill_batch=2)
    stop = self.stop_at.reshape(tc.B, tc.G)
    first = stream_lib.SlotStream(engine, self.params, tc.P)
    first.add(self.tokens, self.mask, self.prompt_keys, stop)
    done = {}
    for _ in range(2):
      for sample in first.step():
        done[sample.prompt * tc.G + sample.index] = sample
    left = first.unfinished()
    lengths = [s.length for s in left]
    self.assertLen(left, tc.B * tc.G - len(done))
    self.assertTrue(any(0 < n < tc.T for n in lengths), lengths)
    self.assertIn(0, lengths)  # some never reached a slot
    keys_R = np.asarray(jax.random.key_data(
        keys.sample_keys(self.prompt_keys, tc.G))).reshape(tc.B, tc.G, -1)
    second = stream_lib.SlotStream(engine, self.params, tc.P)
    of_id = {}
    for b in sorted({s.prompt for s in left}):
      mine = {s.index: s for s in left if s.prompt == b}
      of_id[second.add_group(self.tokens[b], self.mask[b], keys_R[b],
                             stop[b], mine)] = b
    self.assertEqual(second.free_slots, second.slots - len(left))
    while not second.idle:
      for sample in second.step():
        done[of_id[sample.prompt] * tc.G + sample.index] = sample
    self.assertEqual(sorted(done), list(range(tc.B * tc.G)))
    rows = range(tc.B * tc.G)
    np.testing.assert_array_equal(
        np.stack([done[r].tokens for r in rows]), want.tokens)
    np.testing.assert_array_equal(
        np.array([done[r].length for r in rows]), want.lengths)
    np.testing.assert_allclose(np.stack([done[r].logps for r in rows]),
                               want.logps, rtol=0, atol=tc._ATOL)
    # Each sample draws its first token at admission, once (a resumed one
    # does not again); every other token is a busy slot-step of a session.
    self.assertEqual(first.busy_slot_steps + second.busy_slot_steps
                     + tc.B * tc.G, int(want.lengths.sum()))
    self.assertEqual(second.unfinished(), [])
    self.assertNotEmpty(widths)
    if resume_min == 64:
      self.assertEqual(set(widths), {tc.T - 1})
    else:
      self.assertLess(min(widths), tc.T - 1, widths)

  def test_groups_of_a_few_samples_wait_for_stash_entries(self):
    # Kept groups come back with some of their G samples: a slot-full of
    # them spans more prompts than the stash has entries (S / G + 1), so
    # admission waits for entries instead of running out of them.
    gen = self.generator(1.0)
    want = self.static(gen)
    engine = continuous.ContinuousGenerator(
        generator=gen, slots=tc.G, chunk=3, buckets=(4,))
    keys_R = np.asarray(jax.random.key_data(
        keys.sample_keys(self.prompt_keys, tc.G))).reshape(tc.B, tc.G, -1)
    stop = self.stop_at.reshape(tc.B, tc.G)
    s = stream_lib.SlotStream(engine, self.params, tc.P)
    row_of = {}
    for b in range(tc.B):
      g = b % tc.G
      pid = s.add_group(self.tokens[b], self.mask[b], keys_R[b], stop[b],
                        {g: None})
      row_of[pid] = b * tc.G + g
    done = {}
    while not s.idle:
      for sample in s.step():
        done[row_of[sample.prompt]] = sample
    self.assertEqual(sorted(done), sorted(row_of.values()))
    for row, sample in done.items():
      np.testing.assert_array_equal(sample.tokens, want.tokens[row])
      self.assertEqual(sample.length, want.lengths[row])


if __name__ == '__main__':
  absltest.main()
