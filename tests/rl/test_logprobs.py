"""Tests for completion log-probs with prompts shared by their group."""

import dataclasses
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo.generate import generator as generator_lib
from jaxgrpo.generate.sampling import Sampling
from jaxgrpo.model import attention
from jaxgrpo.model import config
from jaxgrpo.model import decoder
from jaxgrpo.rl import logprobs
from jaxgrpo.typing import TrainBatch
from tests import tiny

jax.config.update('jax_numpy_rank_promotion', 'raise')

# (real prompt, real completion) per row; prompts are left-padded to P=4 and
# completions right-padded to T=4. Every row has 4 real tokens, so the rows
# can also be run together without any padding.
_ROWS = (
    ([5, 6, 7], [8]),
    ([1, 2], [9, 10]),
    ([3], [4, 11, 12]),
)
_P = _T = 4


def _batch() -> TrainBatch:
  prompt = np.zeros((len(_ROWS), _P), np.int32)
  prompt_mask = np.zeros((len(_ROWS), _P), bool)
  completion = np.zeros((len(_ROWS), _T), np.int32)
  completion_mask = np.zeros((len(_ROWS), _T), bool)
  for i, (p, c) in enumerate(_ROWS):
    prompt[i, _P - len(p) :] = p
    prompt_mask[i, _P - len(p) :] = True
    completion[i, : len(c)] = c
    completion_mask[i, : len(c)] = True
  return TrainBatch(
      prompt_tokens=jnp.asarray(prompt),
      prompt_mask=jnp.asarray(prompt_mask),
      completion_tokens=jnp.asarray(completion),
      completion_mask=jnp.asarray(completion_mask),
      old_logps=jnp.zeros((len(_ROWS), _T)),
      advantages=jnp.zeros((len(_ROWS),)),
  )


def _unpadded_logits(graphdef, params) -> np.ndarray:
  """[N, 4, V] float64 logits of every row, run without padding."""
  tokens = jnp.asarray([p + c for p, c in _ROWS], jnp.int32)
  n, length = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(length), (n, length))
  causal = jnp.tril(jnp.ones((length, length), bool))
  mask = jnp.broadcast_to(causal, (n, length, length))
  logits_RLV, _ = jax.jit(decoder.forward, static_argnums=0)(
      graphdef, params, tokens, positions, mask
  )
  return np.asarray(logits_RLV, np.float64)


class CompletionLogprobsTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.graphdef, cls.params = tiny.random_model()
    cls.logits = _unpadded_logits(cls.graphdef, cls.params)

  @parameterized.parameters(0.7, 0.0)
  def test_matches_unpadded_log_softmax(self, temperature):
    logps_RT, entropy_RT = jax.jit(
        logprobs.completion_logprobs, static_argnums=(0, 3)
    )(self.graphdef, self.params, _batch(), temperature)
    chex.assert_shape((logps_RT, entropy_RT), (len(_ROWS), _T))
    # Temperature 0 (greedy) scores under the plain softmax.
    logits_RLV = self.logits / (temperature or 1.0)
    logp_RLV = logits_RLV - np.log(
        np.exp(logits_RLV).sum(axis=-1, keepdims=True)
    )
    for i, (prompt, completion) in enumerate(_ROWS):
      for j, token in enumerate(completion):
        # Token j of the completion is predicted one position earlier.
        logp_V = logp_RLV[i, len(prompt) + j - 1]
        np.testing.assert_allclose(logps_RT[i, j], logp_V[token], atol=2e-5)
        np.testing.assert_allclose(
            entropy_RT[i, j], -(np.exp(logp_V) * logp_V).sum(), atol=2e-5
        )
      # Padding is zero.
      np.testing.assert_array_equal(logps_RT[i, len(completion) :], 0.0)
      np.testing.assert_array_equal(entropy_RT[i, len(completion) :], 0.0)

  def test_shared_prompt_equals_repeated_prompt(self):
    # Two groups of G=2: each prompt stored once must score exactly like the
    # same prompt repeated for every completion (groups of one).
    batch = _batch()
    rows = [0, 0, 2, 2]
    completions = np.asarray(batch.completion_tokens)[[0, 1, 1, 2]]
    comp_mask = completions > 0
    grouped = TrainBatch(
        prompt_tokens=batch.prompt_tokens[jnp.asarray([0, 2])],
        prompt_mask=batch.prompt_mask[jnp.asarray([0, 2])],
        completion_tokens=jnp.asarray(completions),
        completion_mask=jnp.asarray(comp_mask),
        old_logps=jnp.zeros((4, _T)),
        advantages=jnp.zeros((4,)),
    )
    repeated = grouped.replace(
        prompt_tokens=batch.prompt_tokens[jnp.asarray(rows)],
        prompt_mask=batch.prompt_mask[jnp.asarray(rows)],
    )
    fn = jax.jit(logprobs.completion_logprobs, static_argnums=(0, 3))
    got = fn(self.graphdef, self.params, grouped, 1.0)
    want = fn(self.graphdef, self.params, repeated, 1.0)
    np.testing.assert_allclose(got[0], want[0], atol=1e-5)
    np.testing.assert_allclose(got[1], want[1], atol=1e-5)
    self.assertTrue(np.all(np.asarray(got[0])[comp_mask] < 0))

  def test_xla_attention_form_gives_the_same_logprobs_and_gradients(self):
    # The learner's masks (left-padded prompts, a pad query seeing only
    # itself, completions over the shared prompt keys) through
    # jax.nn.dot_product_attention, as the 'cudnn' form takes them on a
    # GPU; float32 both ways, so float rounding apart.
    batch = _batch()

    def run(form):
      def loss(params):
        logps, entropy = logprobs.completion_logprobs(self.graphdef, params,
                                                      batch, 0.7)
        return logps.sum() + 0.1 * entropy.sum(), (logps, entropy)
      with mock.patch.object(attention, 'MULTI_TOKEN_ATTENTION', form):
        return jax.jit(jax.value_and_grad(loss, has_aux=True))(self.params)

    (_, want), want_grads = run('einsum')
    (_, got), got_grads = run('xla')
    for x, y in zip(got, want):
      np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)
    for x, y in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
      np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)

  def test_padding_tokens_change_nothing(self):
    # Prompt padding (left) and completion padding (right) hold whatever
    # ids: the log-probs, entropies and their gradients are the same.
    batch = _batch()
    dirty = batch.replace(
        prompt_tokens=jnp.where(batch.prompt_mask, batch.prompt_tokens, 13),
        completion_tokens=jnp.where(batch.completion_mask,
                                    batch.completion_tokens, 14))

    def run(b):
      def loss(params):
        logps, entropy = logprobs.completion_logprobs(self.graphdef, params,
                                                      b, 0.7)
        return logps.sum() + entropy.sum(), (logps, entropy)
      return jax.jit(jax.value_and_grad(loss, has_aux=True))(self.params)

    (_, want), want_grads = run(batch)
    (_, got), got_grads = run(dirty)
    chex.assert_trees_all_close(got, want, atol=1e-6)
    chex.assert_trees_all_close(got_grads, want_grads, atol=1e-6)

  def test_completions_must_fill_groups(self):
    batch = _batch()
    bad = batch.replace(prompt_tokens=batch.prompt_tokens[:2],
                        prompt_mask=batch.prompt_mask[:2])
    with self.assertRaisesRegex(ValueError, 'groups'):
      logprobs.completion_logprobs(self.graphdef, self.params, bad)


class SamplingLogprobsTest(parameterized.TestCase):
  """The learner's log-probs against the generator's, on its samples."""

  @parameterized.named_parameters(
      ('float32', 'float32', 2e-5),
      # The generator's cached decode and the learner's one pass round
      # differently in bfloat16 (2-3e-2 measured on this model).
      ('bfloat16', 'bfloat16', 6e-2),
  )
  def test_first_ratio_is_one(self, dtype, atol):
    cfg = dataclasses.replace(config.ModelConfig.tiny(vocab_size=16),
                              dtype=dtype)
    graphdef, _ = decoder.abstract_params(cfg)
    params = tiny.random_model()[1]
    batch = _batch()
    for sampling in (Sampling(temperature=0.7, top_k=5),
                     Sampling(temperature=1.3, top_p=0.8)):
      gen = generator_lib.Generator(
          graphdef=graphdef, model_cfg=cfg, sampling=sampling,
          max_new_tokens=6, num_samples=3, stop_tokens=(1,))
      out = gen.generate(params, batch.prompt_tokens, batch.prompt_mask,
                         jax.random.key(3))
      sampled = TrainBatch(
          prompt_tokens=batch.prompt_tokens, prompt_mask=batch.prompt_mask,
          completion_tokens=out.tokens, completion_mask=out.mask,
          old_logps=out.logps, advantages=jnp.zeros(9))
      logps, _ = jax.jit(logprobs.completion_logprobs,
                         static_argnums=(0, 3))(graphdef, params, sampled,
                                                sampling.temperature)
      mask = np.asarray(out.mask)
      self.assertGreater(mask.sum(), 9)
      np.testing.assert_allclose(np.asarray(logps)[mask],
                                 np.asarray(out.logps)[mask], atol=atol)
      np.testing.assert_array_equal(np.asarray(logps)[~mask], 0.0)


class ChunkedLogitsTest(absltest.TestCase):
  """Logits made in chunks of positions (`LOGITS_CHUNK_BYTES`)."""

  def _batch(self, b=2, g=2, p=3, t=7):
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, t + 1, b * g)
    return TrainBatch(
        prompt_tokens=jnp.asarray(rng.integers(1, 16, (b, p)), jnp.int32),
        prompt_mask=jnp.ones((b, p), bool),
        completion_tokens=jnp.asarray(rng.integers(1, 16, (b * g, t)),
                                      jnp.int32),
        completion_mask=jnp.asarray(np.arange(t)[None] < lengths[:, None]),
        old_logps=jnp.zeros((b * g, t)),
        advantages=jnp.asarray(rng.normal(size=b * g), jnp.float32),
    )

  def _run(self, chunk_bytes, graphdef, params, batch):
    """Log-probs, entropy and the gradient of a loss over both."""

    def loss(params):
      logps, entropy = logprobs.completion_logprobs(graphdef, params, batch,
                                                    0.7)
      return (logps * batch.advantages[:, None]).sum() + 0.1 * entropy.sum(), (
          logps, entropy)

    # A new function per call: the limit is read when it is traced.
    with mock.patch.object(logprobs, 'LOGITS_CHUNK_BYTES', chunk_bytes):
      (_, out), grads = jax.jit(lambda p: jax.value_and_grad(
          loss, has_aux=True)(p))(params)
    return out, grads

  def test_chunks_give_the_same_logprobs_and_gradients(self):
    graphdef, params = tiny.random_model()
    batch = self._batch()
    want, want_grads = self._run(2**40, graphdef, params, batch)
    # 4 rows x 16 tokens x 4 bytes = 256 bytes a position: chunks of 3
    # positions, the last one padded.
    got, got_grads = self._run(3 * 256, graphdef, params, batch)
    for x, y in zip(got, want):
      np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)
    # The tied embedding's gradient sums the chunks' parts in another
    # order: float32 rounding (measured up to 1.3e-6 on entries up to 3).
    for x, y in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
      np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)
    self.assertTrue(np.all(np.asarray(got[0])[np.asarray(
        batch.completion_mask)] < 0))

  def test_chunks_cut_the_memory_of_the_gradient(self):
    cfg = config.ModelConfig.tiny(vocab_size=4096)
    graphdef, params = decoder.abstract_params(cfg)
    batch = jax.eval_shape(lambda: self._batch(b=2, g=4, p=8, t=64))

    def temp_bytes(chunk_bytes):
      loss = lambda p, b: logprobs.completion_logprobs(
          graphdef, p, b)[0].sum()
      with mock.patch.object(logprobs, 'LOGITS_CHUNK_BYTES', chunk_bytes):
        compiled = jax.jit(jax.grad(loss)).lower(params, batch).compile()
      return compiled.memory_analysis().temp_size_in_bytes

    # The logits are 8 rows x 64 positions x 4096 x 4 bytes = 8 MiB;
    # chunks of 8 positions hold 1 MiB.
    whole, chunked = temp_bytes(2**40), temp_bytes(2**20)
    self.assertLess(chunked, 0.5 * whole)


if __name__ == '__main__':
  absltest.main()
