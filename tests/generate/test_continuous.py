"""Tests for continuous batching against the static generator.

Tolerance. With the same per-sample keys both paths draw every token from
the same key, so tokens, lengths and masks must be equal. The logits they
draw from may differ in the last bits: the slots batch different rows
together than the static batch does (XLA's CPU matmuls may round a row
differently at another batch size) and a prompt is prefilled at its bucket
width, not the full width (the attention sums the same terms in another
order). Measured differences are below 2e-6 on log-probs of about -4, a
few float32 ulps; the tests allow 1e-5. A token could flip only at a
near-tie of two logits, which these fixed seeds do not hit; where the
slots batch exactly the static rows at the full width (slots == R, one
bucket, all prompts in one prefill) the outputs are bit-identical, and
that is asserted exactly.
"""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import warnings

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

from jaxgrpo import sharding
from jaxgrpo.generate import continuous
from jaxgrpo.generate import keys
from jaxgrpo.generate import slots as slots_lib
from jaxgrpo.generate.generator import Generator
from jaxgrpo.generate.sampling import Sampling
from jaxgrpo.model import config
from jaxgrpo.model import decoder
from tests import forced_devices

jax.config.update('jax_numpy_rank_promotion', 'raise')

B, G, P, T = 5, 3, 9, 12
_STOP = 1
_ATOL = 1e-5


def _prompts(vocab: int, seed: int = 0, b: int = B):
  """Left-padded prompts of 1..P real tokens."""
  rng = np.random.default_rng(seed)
  tokens = np.zeros((b, P), np.int32)
  mask = np.zeros((b, P), bool)
  for i, n in enumerate(rng.integers(1, P + 1, b)):
    tokens[i, P - n:] = rng.integers(2, vocab, n)
    mask[i, P - n:] = True
  return tokens, mask


class ContinuousTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.cfg = config.ModelConfig.tiny()
    cls.graphdef, cls.params = decoder.init_params(cls.cfg, jax.random.key(0))
    cls.tokens, cls.mask = _prompts(cls.cfg.vocab_size)
    cls.ids = [f'example-{i}' for i in range(B)]
    cls.prompt_keys = keys.prompt_keys(jax.random.key(3), cls.ids, epoch=2)
    # Very different lengths: 1 (stop first), short, long, never forced (T).
    cls.stop_at = np.array([1, 2, 12, 0, 5, 3, 7, 1, 11, 0, 4, 9, 2, 6, 13],
                           np.int32)

  def generator(self, temperature: float, **kwargs) -> Generator:
    return Generator(
        graphdef=self.graphdef, model_cfg=self.cfg,
        sampling=Sampling(temperature=temperature, **kwargs),
        max_new_tokens=T, num_samples=G, stop_tokens=(_STOP,))

  def static(self, gen: Generator):
    return gen.generate(self.params, self.tokens, self.mask,
                        jax.random.key(1), prompt_keys=self.prompt_keys,
                        stop_at=self.stop_at)

  def continuous(self, gen: Generator, **kwargs):
    cg = continuous.ContinuousGenerator(generator=gen, **kwargs)
    return cg.generate_with_stats(
        self.params, self.tokens, self.mask, jax.random.key(1),
        prompt_keys=self.prompt_keys, stop_at=self.stop_at)

  def assert_same(self, got, want, atol: float = _ATOL):
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.lengths, want.lengths)
    np.testing.assert_array_equal(got.mask, want.mask)
    np.testing.assert_allclose(got.logps, want.logps, rtol=0, atol=atol)

  @parameterized.product(
      sampling=[dict(temperature=0.0), dict(temperature=1.0),
                dict(temperature=0.7, top_k=5, top_p=0.9)],
      engine=[dict(slots=4, chunk=3, buckets=(4,)),
              dict(slots=1, chunk=1, buckets=()),
              dict(slots=7, chunk=4, buckets=(2, 4, 8), prefill_batch=3)],
  )
  def test_matches_static_with_per_sample_keys(self, sampling, engine):
    gen = self.generator(**sampling)
    want = self.static(gen)
    got, stats = self.continuous(gen, **engine)
    self.assert_same(got, want)
    # Rows told a length end there (or at T); the others end on their own.
    told = self.stop_at > 0
    np.testing.assert_array_equal(np.asarray(got.lengths)[told],
                                  np.minimum(self.stop_at, T)[told])
    self.assertGreater(stats.occupancy, 0.0)
    self.assertLessEqual(stats.occupancy, 1.0)
    # Every token but each sample's first is one busy slot-step.
    self.assertEqual(stats.busy_slot_steps,
                     int(np.asarray(got.lengths).sum()) - B * G)

  def test_sliding_window_matches_static(self):
    # Gemma-style local layers: a window shorter than the prompts, so both
    # engines must narrow the keys of their cache slots alike.
    cfg = config.preset('tiny', sliding_window=3, sliding_layers=(0,),
                        rope_local_theta=100.0, attn_logit_softcap=5.0,
                        norm_plus_one=True, sandwich_norms=True)
    graphdef, params = decoder.init_params(cfg, jax.random.key(0))
    gen = Generator(graphdef=graphdef, model_cfg=cfg,
                    sampling=Sampling(temperature=1.0), max_new_tokens=T,
                    num_samples=G, stop_tokens=(_STOP,))
    args = (params, self.tokens, self.mask, jax.random.key(1))
    kw = dict(prompt_keys=self.prompt_keys, stop_at=self.stop_at)
    want = gen.generate(*args, **kw)
    got, _ = continuous.ContinuousGenerator(
        generator=gen, slots=4, chunk=3, buckets=(4,)).generate_with_stats(
            *args, **kw)
    self.assert_same(got, want)

  def test_gsm8k_lengths_with_two_stop_ids(self):
    # T = 256, stop tokens as a Hugging Face generation_config's eos list
    # (EOS and end of turn): completions ending at their first token, in
    # the middle, at T exactly, cut at T (1000: never forced, stop tokens
    # never drawn), or free (0). Both engines end a row at either id, pad
    # it after, and agree sample by sample.
    t, stops = 256, (_STOP, 2)
    gen = dataclasses.replace(self.generator(1.0), max_new_tokens=t,
                              stop_tokens=stops)
    stop_at = np.array([1, 100, 1000, 0, 256, 255, 2, 1000, 17, 0, 1000, 128,
                        0, 0, 0], np.int32)
    kw = dict(prompt_keys=self.prompt_keys, stop_at=stop_at)
    args = (self.params, self.tokens, self.mask, jax.random.key(1))
    want = gen.generate(*args, **kw)
    got, _ = continuous.ContinuousGenerator(
        generator=gen, slots=5, chunk=16, buckets=(4, 8)).generate_with_stats(
            *args, **kw)
    self.assert_same(got, want)
    tokens, lengths = np.asarray(want.tokens), np.asarray(want.lengths)
    told = (stop_at > 0) & (stop_at <= t)
    np.testing.assert_array_equal(lengths[told], stop_at[told])
    np.testing.assert_array_equal(lengths[stop_at > t], t)
    ends = set()
    for row, n in zip(tokens, lengths):
      stopped = np.isin(row[:n], stops)
      self.assertFalse(stopped[:-1].any())  # nothing after a stop token
      self.assertTrue((row[n:] == 0).all())  # padding after it
      if n < t:
        self.assertTrue(stopped[-1])
        ends.add(int(row[n - 1]))
    self.assertEqual(ends, set(stops))  # the free rows stop at either id
    self.assertFalse(np.asarray(want.logps)[~np.asarray(want.mask)].any())

  def test_a_generator_without_stop_tokens_decodes_every_row_to_t(self):
    # No stop token (a model without EOS): every sample runs T tokens, as
    # in the static engine (the continuous one raised IndexError).
    gen = dataclasses.replace(self.generator(1.0), stop_tokens=())
    args = (self.params, self.tokens, self.mask, jax.random.key(1))
    want = gen.generate(*args, prompt_keys=self.prompt_keys)
    got = continuous.ContinuousGenerator(generator=gen, slots=4).generate(
        *args, prompt_keys=self.prompt_keys)
    self.assert_same(got, want)
    np.testing.assert_array_equal(got.lengths, T)

  def test_bit_identical_when_slots_batch_the_static_rows(self):
    gen = self.generator(1.0)
    got, _ = self.continuous(gen, slots=B * G, chunk=T, buckets=(),
                             prefill_batch=B)
    self.assert_same(got, self.static(gen), atol=0.0)

  def test_independent_of_slot_count_and_chunk(self):
    gen = self.generator(1.0)
    first, _ = self.continuous(gen, slots=2, chunk=1)
    for slots, chunk in ((5, 2), (16, 6)):
      got, _ = self.continuous(gen, slots=slots, chunk=chunk)
      self.assert_same(got, first)

  def test_independent_of_batch_mates(self):
    gen = self.generator(1.0)
    full, _ = self.continuous(gen, slots=4)
    # Prompts 3 and 1 alone, in another order, with their own keys.
    pick = [3, 1]
    rows = np.array([b * G + g for b in pick for g in range(G)])
    cg = continuous.ContinuousGenerator(generator=gen, slots=3)
    alone = cg.generate(
        self.params, self.tokens[pick], self.mask[pick], jax.random.key(9),
        prompt_keys=keys.prompt_keys(jax.random.key(3),
                                     [self.ids[b] for b in pick], epoch=2),
        stop_at=self.stop_at[rows])
    self.assert_same(alone, jax.tree.map(lambda x: np.asarray(x)[rows], full))

  def test_other_epoch_draws_anew(self):
    gen = self.generator(1.0)
    cg = continuous.ContinuousGenerator(generator=gen, slots=4)
    run = lambda epoch: cg.generate(
        self.params, self.tokens, self.mask, jax.random.key(1),
        prompt_keys=keys.prompt_keys(jax.random.key(3), self.ids, epoch))
    self.assertFalse(np.array_equal(run(0).tokens, run(1).tokens))
    np.testing.assert_array_equal(run(0).tokens, run(0).tokens)

  def test_without_prompt_keys_rows_key_by_index(self):
    gen = self.generator(1.0)
    cg = continuous.ContinuousGenerator(generator=gen, slots=4)
    rng = jax.random.key(4)
    got = cg.generate(self.params, self.tokens, self.mask, rng)
    want = gen.generate(self.params, self.tokens, self.mask, rng,
                        prompt_keys=keys.row_prompt_keys(rng, B))
    self.assert_same(got, want)

  def test_compiles_a_bounded_number_of_times(self):
    # A generator no other test builds, so its compilations are all new.
    gen = dataclasses.replace(self.generator(1.0), max_new_tokens=T - 1)
    fns = (slots_lib.init, slots_lib.chunk, slots_lib.flush,
           slots_lib.prefill, slots_lib.compact)

    def compilations(shrink: bool) -> list[int]:
      cg = continuous.ContinuousGenerator(generator=gen, slots=4, chunk=2,
                                          buckets=(2, 4), shrink=shrink)
      before = [f._cache_size() for f in fns]
      with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        for seed in range(3):
          tokens, mask = _prompts(self.cfg.vocab_size, seed=seed)
          cg.generate(self.params, tokens, mask, jax.random.key(seed))
        # Another batch size reuses the chunk and prefill programs.
        tokens, mask = _prompts(self.cfg.vocab_size, seed=5, b=2)
        cg.generate(self.params, tokens, mask, jax.random.key(0))
      self.assertEmpty([w for w in caught if 'donat' in str(w.message)])
      self.assertEqual(cg.widths(P), (2, 4, P))
      return [f._cache_size() - n for f, n in zip(fns, before)]

    new = compilations(shrink=False)
    # init once per (P, slots); chunk once; flush once per row count R;
    # prefill once per width used (here 2, 4 and P = 9); no compact.
    self.assertEqual(new[:3], [1, 1, 2])
    self.assertLessEqual(new[3], 3)
    self.assertEqual(new[4], 0)
    # Narrowing the drain adds the widths 2 and 1 of 4 slots: chunk for
    # each, flush for each and row count, compact for 4 -> 2 and 2 -> 1;
    # init and prefill are the programs above.
    new = compilations(shrink=True)
    self.assertEqual(new[0], 0)
    self.assertEqual(new[1], 2)
    self.assertLessEqual(new[2], 4)
    self.assertEqual(new[3], 0)
    self.assertEqual(new[4], 2)

  def test_drain_narrows_the_slots_with_the_same_samples(self):
    gen = self.generator(1.0)
    wide, wide_stats = self.continuous(gen, slots=8, chunk=2, shrink=False)
    got, stats = self.continuous(gen, slots=8, chunk=2)
    self.assert_same(got, wide)
    # The same tokens decoded in the same steps, on fewer slot-steps.
    self.assertEqual(stats.busy_slot_steps, wide_stats.busy_slot_steps)
    self.assertEqual(stats.decode_steps, wide_stats.decode_steps)
    self.assertEqual(wide_stats.slot_steps, wide_stats.decode_steps * 8)
    self.assertLess(stats.slot_steps, wide_stats.slot_steps)
    self.assertGreater(stats.occupancy, wide_stats.occupancy)

  def test_drain_width(self):
    # Halved while half still holds the active samples and splits over the
    # batch devices.
    self.assertEqual(continuous.drain_width(32, 16, 1), 16)
    self.assertEqual(continuous.drain_width(32, 17, 1), 32)
    self.assertEqual(continuous.drain_width(32, 3, 1), 4)
    self.assertEqual(continuous.drain_width(32, 0, 1), 1)
    self.assertEqual(continuous.drain_width(32, 1, 4), 4)
    self.assertEqual(continuous.drain_width(12, 2, 4), 12)  # 6: not 4's
    self.assertEqual(continuous.drain_width(7, 1, 1), 7)

  def test_rbg_default_prng(self):
    # Under JAX_DEFAULT_PRNG_IMPL=rbg (4-word keys) the slots held 2-word
    # keys: `Incompatible shapes for broadcasting` at the first rollout.
    # rbg's draws depend on the batch (vmap), so only the run is checked.
    script = textwrap.dedent('''
        import jax, numpy as np
        from jaxgrpo.generate import continuous, keys
        from jaxgrpo.generate.generator import Generator
        from jaxgrpo.generate.sampling import Sampling
        from jaxgrpo.model import config, decoder
        cfg = config.ModelConfig.tiny()
        graphdef, params = decoder.init_params(cfg, jax.random.key(0))
        gen = Generator(graphdef=graphdef, model_cfg=cfg, sampling=Sampling(),
                        max_new_tokens=4, num_samples=2, stop_tokens=(1,),
                        pad_id=0)
        tokens = np.array([[0, 5, 6], [7, 8, 9]], np.int32)
        pk = keys.prompt_keys(jax.random.key(5), ['a', 'b'], 0)
        out = continuous.ContinuousGenerator(generator=gen, slots=3).generate(
            params, tokens, tokens > 0, jax.random.key(9), prompt_keys=pk)
        print(keys.key_words(), np.asarray(out.tokens).shape)
        try:
          keys.prompt_keys(jax.random.key(5, impl='threefry2x32'), ['a'], 0)
          continuous.ContinuousGenerator(generator=gen, slots=3).generate(
              params, tokens[:1], tokens[:1] > 0, jax.random.key(9),
              prompt_keys=keys.prompt_keys(
                  jax.random.key(5, impl='threefry2x32'), ['a'], 0))
        except ValueError as e:
          print(e)
        ''')
    out = subprocess.run(
        [sys.executable, '-c', script], capture_output=True, text=True,
        env={**os.environ, 'JAX_DEFAULT_PRNG_IMPL': 'rbg'}, check=False,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))))
    self.assertEqual(out.returncode, 0, out.stderr[-2000:])
    lines = out.stdout.splitlines()
    self.assertEqual(lines[0], '4 (4, 4)')
    self.assertIn("prompt keys of the 'threefry2x32' PRNG: the continuous "
                  "engine draws with JAX's default implementation ('rbg')",
                  lines[1])

  def test_one_device_mesh(self):
    gen = self.generator(1.0)
    want, _ = self.continuous(gen, slots=4)
    with sharding.use_mesh(sharding.make_mesh(devices=jax.devices()[:1])):
      placed = sharding.shard(self.params,
                              sharding.param_shardings(self.params))
      got = continuous.ContinuousGenerator(generator=gen, slots=4).generate(
          placed, self.tokens, self.mask, jax.random.key(1),
          prompt_keys=self.prompt_keys, stop_at=self.stop_at)
    self.assert_same(got, want)

  def test_four_device_meshes(self):
    """Rows over the batch axes (and heads over tensor) on forced devices."""
    out = os.path.join(self.create_tempdir().full_path, 'out.json')
    forced_devices.run(self, 'tests/generate/continuous_sharded.py', out)
    with open(out) as f:
      report = json.load(f)
    self.assertEqual(report['devices'], 4)
    self.assertLen(report['layouts'], 6)
    for name, row in report['layouts'].items():
      with self.subTest(name):
        self.assertTrue(row['tokens_equal'])
        self.assertTrue(row['lengths_equal'])
        self.assertLess(row['logps_max_diff'], _ATOL)
    for temperature in (0.0, 1.0):
      for layout in ('(2, 1, 2)', '(4, 1, 1)'):
        row = report['layouts'][f'{layout} T={temperature}']
        self.assertGreater(row['resumed'], 0)
        self.assertTrue(row['resumed_tokens_equal'])
        self.assertTrue(row['idle_rows_quiet'])
    # 6 slots decode on 4 batch devices too (2 idle rows pad them to 8).
    self.assertEqual(report['layouts']['(4, 1, 1) T=0.0']['slots'], 6)

  def test_validation(self):
    gen = self.generator(0.0)
    for bad in (dict(slots=0), dict(chunk=0), dict(prefill_batch=0),
                dict(buckets=(0,))):
      with self.assertRaisesRegex(ValueError, 'ContinuousGenerator'):
        continuous.ContinuousGenerator(generator=gen, **bad)
    no_stop = dataclasses.replace(gen, stop_tokens=())
    with self.assertRaisesRegex(ValueError, 'stop_at needs stop_tokens'):
      continuous.ContinuousGenerator(generator=no_stop).generate(
          self.params, self.tokens, self.mask, jax.random.key(0),
          stop_at=self.stop_at)


class StaticPerSampleKeysTest(parameterized.TestCase):
  """The static generator's opt-in keying: rows ignore their batch-mates."""

  def test_rows_independent_of_batch_mates(self):
    cfg = config.ModelConfig.tiny()
    graphdef, params = decoder.init_params(cfg, jax.random.key(0))
    tokens, mask = _prompts(cfg.vocab_size)
    gen = Generator(graphdef=graphdef, model_cfg=cfg,
                    sampling=Sampling(temperature=1.0), max_new_tokens=T,
                    num_samples=G)
    ids = [f'e{i}' for i in range(B)]
    seed = jax.random.key(5)
    full = gen.generate(params, tokens, mask, jax.random.key(0),
                        prompt_keys=keys.prompt_keys(seed, ids, 0))
    pick = [4, 0]
    part = gen.generate(params, tokens[pick], mask[pick], jax.random.key(1),
                        prompt_keys=keys.prompt_keys(
                            seed, [ids[b] for b in pick], 0))
    rows = np.array([b * G + g for b in pick for g in range(G)])
    np.testing.assert_array_equal(part.tokens, np.asarray(full.tokens)[rows])
    np.testing.assert_allclose(part.logps, np.asarray(full.logps)[rows],
                               rtol=0, atol=_ATOL)


if __name__ == '__main__':
  absltest.main()
