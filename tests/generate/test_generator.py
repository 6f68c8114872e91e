"""Tests for KV-cache generation against teacher-forced forward passes."""

import dataclasses
import functools
import warnings

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo.generate import generator as generator_lib
from jaxgrpo.generate.sampling import Sampling
from jaxgrpo.model import config
from jaxgrpo.model import decoder

jax.config.update('jax_numpy_rank_promotion', 'raise')

# Real prompt tokens of different lengths, left-padded into one batch.
_PROMPTS = ([5, 9, 13, 7, 2], [11, 3], [8, 21, 30])
_P = 5
_T = 6


def _left_pad(prompts, length: int) -> tuple[jax.Array, jax.Array]:
  tokens = np.zeros((len(prompts), length), np.int32)
  mask = np.zeros((len(prompts), length), bool)
  for i, prompt in enumerate(prompts):
    tokens[i, length - len(prompt) :] = prompt
    mask[i, length - len(prompt) :] = True
  return jnp.asarray(tokens), jnp.asarray(mask)


@functools.partial(jax.jit, static_argnums=0)
def _completion_logits(graphdef, params, prompt_BP, prompt_mask_BP, tokens_BT,
                       mask_BT):
  """Logits predicting each completion token, from one full forward pass."""
  tokens_BL = jnp.concatenate([prompt_BP, tokens_BT], axis=1)
  valid_BL = jnp.concatenate([prompt_mask_BP, mask_BT], axis=1)
  positions_BL = jnp.maximum(jnp.cumsum(valid_BL, axis=1) - 1, 0)
  length = tokens_BL.shape[1]
  causal_LL = jnp.tril(jnp.ones((length, length), bool))
  mask_BLL = causal_LL[None] & valid_BL[:, None, :]
  logits_BLV, _ = decoder.forward(
      graphdef, params, tokens_BL, positions_BL, mask_BLL
  )
  p = prompt_BP.shape[1]
  return logits_BLV[:, p - 1 : -1]


class GeneratorTest(chex.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.cfg = config.ModelConfig.tiny()
    cls.graphdef, cls.params = decoder.init_params(cls.cfg, jax.random.key(0))
    cls.prompt, cls.prompt_mask = _left_pad(_PROMPTS, _P)
    cls.greedy_gen = cls.generator(Sampling(temperature=0.0))
    cls.greedy = cls.greedy_gen.generate(
        cls.params, cls.prompt, cls.prompt_mask, jax.random.key(0)
    )

  @classmethod
  def generator(cls, sampling: Sampling, **kwargs) -> generator_lib.Generator:
    return generator_lib.Generator(
        graphdef=cls.graphdef,
        model_cfg=cls.cfg,
        sampling=sampling,
        max_new_tokens=kwargs.pop('max_new_tokens', _T),
        **kwargs,
    )

  def generate(self, gen, prompt=None, prompt_mask=None, seed=0):
    return gen.generate(
        self.params,
        self.prompt if prompt is None else prompt,
        self.prompt_mask if prompt_mask is None else prompt_mask,
        jax.random.key(seed),
    )

  def test_output_shapes(self):
    out = self.greedy
    n = len(_PROMPTS)
    chex.assert_shape([out.tokens, out.logps, out.mask], (n, _T))
    chex.assert_shape(out.lengths, (n,))
    chex.assert_type([out.tokens, out.lengths], jnp.int32)
    chex.assert_type(out.logps, jnp.float32)
    chex.assert_type(out.mask, jnp.bool_)
    np.testing.assert_array_equal(out.lengths, _T)  # no stop tokens

  def test_greedy_matches_teacher_forcing(self):
    # One forward pass over prompt + completion gives, at every step, the
    # logits the greedy decoder saw; their argmax must be the next token.
    out = self.greedy
    logits = _completion_logits(self.graphdef, self.params, self.prompt,
                                self.prompt_mask, out.tokens, out.mask)
    np.testing.assert_array_equal(jnp.argmax(logits, -1), out.tokens)

  def test_top1_sampling_equals_greedy(self):
    out = self.generate(self.generator(Sampling(top_k=1)), seed=3)
    np.testing.assert_array_equal(out.tokens, self.greedy.tokens)
    # Temperature 1 scores like greedy: plain log-softmax.
    np.testing.assert_allclose(out.logps, self.greedy.logps, atol=1e-6)

  def test_padded_batch_matches_each_prompt_alone(self):
    for i, prompt in enumerate(_PROMPTS):
      tokens, mask = _left_pad([prompt], len(prompt))
      alone = self.generate(self.greedy_gen, tokens, mask)
      np.testing.assert_array_equal(
          alone.tokens[0], self.greedy.tokens[i], err_msg=f'prompt {i}'
      )
      np.testing.assert_allclose(
          alone.logps[0], self.greedy.logps[i], atol=1e-5
      )

  def test_logps_match_teacher_forcing_with_samples_per_prompt(self):
    g, temperature = 4, 0.7
    # Two frequent ids as stop tokens, so some rows end early.
    counts = np.bincount(np.asarray(self.greedy.tokens).ravel(), minlength=64)
    stops = tuple(int(t) for t in np.argsort(-counts)[:2])
    gen = self.generator(
        Sampling(temperature=temperature), num_samples=g, stop_tokens=stops
    )
    out = self.generate(gen, seed=1)
    n = len(_PROMPTS) * g
    chex.assert_shape(out.tokens, (n, _T))
    # Row b * G + g continues prompt b.
    prompt = jnp.repeat(self.prompt, g, axis=0)
    prompt_mask = jnp.repeat(self.prompt_mask, g, axis=0)
    logits = _completion_logits(self.graphdef, self.params, prompt,
                                prompt_mask, out.tokens, out.mask)
    expected = jnp.take_along_axis(
        jax.nn.log_softmax(logits / temperature, axis=-1),
        out.tokens[..., None], axis=-1,
    )[..., 0]
    np.testing.assert_allclose(
        out.logps, jnp.where(out.mask, expected, 0.0), atol=1e-5
    )
    # Samples of one prompt differ from each other.
    tokens = np.asarray(out.tokens).reshape(len(_PROMPTS), g, _T)
    for group in tokens:
      self.assertGreater(len({tuple(row) for row in group}), 1)

  def test_samples_per_prompt_layout_greedy(self):
    out = self.generate(self.generator(Sampling(temperature=0.0),
                                       num_samples=3))
    np.testing.assert_array_equal(
        out.tokens, np.repeat(self.greedy.tokens, 3, axis=0)
    )

  def test_stop_token_ends_row_then_pads(self):
    reference = np.asarray(self.greedy.tokens)
    stop = int(reference[0, 2])
    pad = self.cfg.vocab_size - 1
    gen = self.generator(Sampling(temperature=0.0), stop_tokens=(stop,),
                         pad_id=pad)
    out = self.generate(gen)
    for i, row in enumerate(reference):
      hits = np.flatnonzero(row == stop)
      length = int(hits[0]) + 1 if hits.size else _T
      self.assertEqual(int(out.lengths[i]), length)
      np.testing.assert_array_equal(out.mask[i], np.arange(_T) < length)
      np.testing.assert_array_equal(out.tokens[i, :length], row[:length])
      np.testing.assert_array_equal(out.tokens[i, length:], pad)
      np.testing.assert_allclose(
          out.logps[i, :length], self.greedy.logps[i, :length], atol=1e-6
      )
      np.testing.assert_array_equal(out.logps[i, length:], 0.0)
    self.assertLessEqual(int(out.lengths[0]), 3)

  def test_early_exit_when_all_rows_stop(self):
    # Every row's second token is a stop token, so all rows end by step 2.
    stops = tuple({int(t) for t in np.asarray(self.greedy.tokens[:, 1])})
    gen = self.generator(Sampling(temperature=0.0), stop_tokens=stops)
    state = gen.prefill(self.params, self.prompt, self.prompt_mask,
                        jax.random.key(0))
    state = gen.decode(self.params, state)
    self.assertLessEqual(int(state.step), 2)
    self.assertEqual(int(state.step), int(state.lengths.max()))
    self.assertTrue(bool(state.done.all()))

  def test_compiles_once_per_shape(self):
    gen = self.greedy_gen
    self.generate(gen)
    sizes = (generator_lib._prefill._cache_size(), generator_lib._decode._cache_size())
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter('always')
      # An equal, separately built generator shares the compiled code.
      self.generate(dataclasses.replace(gen), seed=5)
      self.generate(gen, seed=6)
    self.assertEqual(
        (generator_lib._prefill._cache_size(), generator_lib._decode._cache_size()), sizes
    )
    self.assertEmpty([w for w in caught if 'donat' in str(w.message)])

  def test_inputs_survive_donation(self):
    rng = jax.random.key(7)
    prompt, prompt_mask = jnp.array(self.prompt), jnp.array(self.prompt_mask)
    self.greedy_gen.generate(self.params, prompt, prompt_mask, rng)
    for x in (rng, prompt, prompt_mask, *jax.tree.leaves(self.params)):
      self.assertFalse(x.is_deleted())

  def test_validation(self):
    with self.assertRaisesRegex(ValueError, 'max_new_tokens'):
      self.generator(Sampling(), max_new_tokens=0)
    with self.assertRaisesRegex(ValueError, 'stop_tokens'):
      self.generator(Sampling(), stop_tokens=(self.cfg.vocab_size,))
    gen = self.generator(Sampling(), stop_tokens=[3, 4])
    self.assertEqual(gen.stop_tokens, (3, 4))
    hash(gen)


if __name__ == '__main__':
  absltest.main()
