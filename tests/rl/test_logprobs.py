"""Tests for completion log-probs with prompts shared by their group."""

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

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

  def test_completions_must_fill_groups(self):
    batch = _batch()
    bad = batch.replace(prompt_tokens=batch.prompt_tokens[:2],
                        prompt_mask=batch.prompt_mask[:2])
    with self.assertRaisesRegex(ValueError, 'groups'):
      logprobs.completion_logprobs(self.graphdef, self.params, bad)


if __name__ == '__main__':
  absltest.main()
