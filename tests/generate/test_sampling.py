"""Tests for token sampling strategies."""

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo.generate.sampling import Sampling

jax.config.update('jax_numpy_rank_promotion', 'raise')

_DRAWS = 2000


def _draws(sampling: Sampling, logits_BV: jax.Array) -> np.ndarray:
  """[draws, B] tokens from independent keys."""
  keys = jax.random.split(jax.random.key(0), _DRAWS)
  fn = jax.jit(jax.vmap(sampling.next_tokens, in_axes=(None, 0)))
  return np.asarray(fn(logits_BV, keys))


def _nucleus(logits_V: np.ndarray, top_k: int, top_p: float) -> set[int]:
  """Reference allowed set: top_k first, then the smallest top_p prefix."""
  order = np.argsort(-logits_V, kind='stable')
  if top_k:
    order = order[:top_k]
  probs = np.exp(logits_V[order] - logits_V[order].max())
  probs /= probs.sum()
  before = np.cumsum(probs) - probs
  return set(order[before < top_p].tolist())


class SamplingTest(chex.TestCase, parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.logits = jax.random.normal(jax.random.key(1), (3, 12)) * 2.0

  def test_greedy_is_argmax(self):
    tokens = Sampling(temperature=0.0).next_tokens(self.logits, None)
    chex.assert_type(tokens, jnp.int32)
    np.testing.assert_array_equal(tokens, np.argmax(self.logits, -1))

  def test_top1_is_argmax(self):
    draws = _draws(Sampling(temperature=1.0, top_k=1), self.logits)
    np.testing.assert_array_equal(
        draws, np.broadcast_to(np.argmax(self.logits, -1), draws.shape)
    )

  @parameterized.named_parameters(
      ('top_k', 3, 1.0),
      ('top_p', 0, 0.6),
      ('top_k_and_top_p', 5, 0.5),
  )
  def test_draws_stay_in_allowed_set(self, top_k, top_p):
    draws = _draws(Sampling(top_k=top_k, top_p=top_p), self.logits)
    for b in range(self.logits.shape[0]):
      allowed = _nucleus(np.asarray(self.logits[b]), top_k, top_p)
      seen = set(np.unique(draws[:, b]).tolist())
      self.assertLessEqual(seen, allowed)
      # Nothing allowed is cut off either (each has mass well above 1/2000).
      self.assertEqual(seen, allowed)

  def test_top_p_on_known_probs(self):
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.1, 0.05, 0.05]]))
    draws = _draws(Sampling(top_p=0.75), logits)
    self.assertEqual(set(np.unique(draws).tolist()), {0, 1})
    np.testing.assert_allclose((draws == 0).mean(), 0.5 / 0.8, atol=0.04)

  def test_temperature_sampling_follows_softmax(self):
    logits = jnp.log(jnp.array([[0.6, 0.25, 0.1, 0.05]]))
    draws = _draws(Sampling(temperature=2.0), logits)
    expected = jax.nn.softmax(logits[0] / 2.0)
    freq = np.bincount(draws[:, 0], minlength=4) / _DRAWS
    np.testing.assert_allclose(freq, expected, atol=0.04)

  @parameterized.parameters(0.0, 1.0, 0.7)
  def test_logps(self, temperature):
    sampling = Sampling(temperature=temperature, top_k=2)
    tokens = jnp.array([0, 5, 11], jnp.int32)
    scale = temperature or 1.0
    expected = jax.nn.log_softmax(self.logits / scale, axis=-1)[
        jnp.arange(3), tokens
    ]
    np.testing.assert_allclose(
        sampling.logps(self.logits, tokens), expected, atol=1e-6
    )

  @parameterized.parameters(
      (dict(temperature=-1.0), 'temperature'),
      # logits / T overflowed float32 under jit: log-probs of +-inf at
      # 1e-20, NaN and tokens other than greedy's at 1e-45.
      (dict(temperature=1e-20), 'temperature must be 0 \\(greedy\\) or >= '),
      (dict(top_k=-1), 'top_k'),
      (dict(top_k=True), 'top_k'),
      (dict(top_p=0.0), 'top_p'),
      (dict(top_p=1.5), 'top_p'),
  )
  def test_validation(self, kwargs, field):
    with self.assertRaisesRegex(ValueError, field):
      Sampling(**kwargs)

  def test_smallest_temperature_and_numpy_top_k(self):
    # At the floor the log-probs are finite under jit; a numpy top_k (it was
    # refused, where True was taken as 1) is the int it holds.
    sampling = Sampling(temperature=1e-6, top_k=np.int64(2))
    self.assertIs(type(sampling.top_k), int)
    logits = jnp.asarray([[30.0, -50.0, 10.0], [0.5, 0.25, -20.0]])
    logps = jax.jit(sampling.logps)(logits, jnp.asarray([0, 1]))
    self.assertTrue(np.isfinite(logps).all(), logps)


if __name__ == '__main__':
  absltest.main()
