"""Tests for RMSNorm, RoPE and the attention cache helpers."""

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo.model import attention
from jaxgrpo.model import config
from jaxgrpo.model import layers

jax.config.update('jax_numpy_rank_promotion', 'raise')


class LayersTest(chex.TestCase):

  def test_rms_norm_unit_rms(self):
    norm = layers.RMSNorm(8, eps=1e-6)
    x = jax.random.normal(jax.random.key(0), (2, 3, 8)) * 5.0
    y = norm(x.astype(jnp.bfloat16))
    chex.assert_type(y, jnp.bfloat16)
    rms = jnp.sqrt(jnp.mean(jnp.square(y.astype(jnp.float32)), -1))
    np.testing.assert_allclose(rms, 1.0, atol=1e-2)

  def test_rope_depends_on_relative_position_only(self):
    q = jax.random.normal(jax.random.key(0), (1, 1, 2, 16))
    k = jax.random.normal(jax.random.key(1), (1, 1, 2, 16))

    def score(pos_q, pos_k):
      rq = layers.apply_rope(q, jnp.array([[pos_q]]), theta=10_000.0)
      rk = layers.apply_rope(k, jnp.array([[pos_k]]), theta=10_000.0)
      return jnp.sum(rq * rk, axis=-1)

    np.testing.assert_allclose(score(7, 3), score(104, 100), atol=1e-4)
    np.testing.assert_allclose(score(0, 0), jnp.sum(q * k, -1), atol=1e-6)
    rotated = layers.apply_rope(q, jnp.array([[5]]), theta=10_000.0)
    np.testing.assert_allclose(
        jnp.linalg.norm(rotated, axis=-1), jnp.linalg.norm(q, axis=-1),
        rtol=1e-5,
    )

  def test_cache_layout_and_update(self):
    cfg = config.ModelConfig.tiny()
    cache = attention.init_cache(cfg, batch_size=3, length=10)
    self.assertLen(cache, cfg.num_layers)
    chex.assert_shape(cache[0]['k'], (3, 10, cfg.num_kv_heads, cfg.head_dim))
    chex.assert_type(cache[0]['v'], jnp.float32)
    new = jnp.ones((3, 2, cfg.num_kv_heads, cfg.head_dim))
    updated = attention.update_cache(cache[0], new, 2 * new, jnp.int32(4))
    written = jnp.abs(updated['v']).sum(axis=(0, 2, 3))
    np.testing.assert_array_equal(written > 0, np.arange(10) // 2 == 2)
    bf16 = attention.init_cache(cfg, 1, 4, dtype='bfloat16')
    chex.assert_type(bf16[1]['k'], jnp.bfloat16)


if __name__ == '__main__':
  absltest.main()
