"""Tests for the GRPO clipped surrogate and its KL penalty."""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo.rl import loss as loss_lib

jax.config.update('jax_numpy_rank_promotion', 'raise')

_EPS_LOW, _EPS_HIGH = 0.2, 0.28
# Two completions of up to 3 tokens; the second has one padding token.
_OLD_LOGPS = np.array([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]], np.float32)
_RATIOS = np.array([[1.5, 0.5, 1.1], [0.5, 1.5, 0.9]], np.float32)
_LOGPS = _OLD_LOGPS + np.log(_RATIOS)
_ADV = np.array([1.0, -2.0], np.float32)
_MASK = np.array([[True, True, True], [True, True, False]])
# Per-token -min(ratio * A, clip(ratio) * A), by hand:
#   A=+1: 1.5 clips to 1.28 (active); 0.5 and 1.1 are not clipped.
#   A=-2: 0.5 clips to 0.8 (active): -min(-1.0, -1.6) = 1.6;
#         1.5 is not clipped: -min(-3.0, -2.56) = 3.0.
_PG_ROWS = ([-1.28, -0.5, -1.1], [1.6, 3.0])
_PG_SUM = sum(map(sum, _PG_ROWS))  # 1.72
# ref - logp per token: k3 = e^d - d - 1 is 0 at d=0, 2 - ln2 - 1 at ln2 and
# 1/2 + ln2 - 1 at -ln2; the padding token's 5.0 must be ignored.
_LN2 = np.log(2.0)
_DELTA = np.array([[0.0, _LN2, -_LN2], [_LN2, 0.0, 5.0]], np.float32)
_K3_UP, _K3_DOWN = 1.0 - _LN2, _LN2 - 0.5
_KL_ROWS = ([0.0, _K3_UP, _K3_DOWN], [_K3_UP, 0.0])


def _loss(loss_agg, **kwargs):
  return loss_lib.grpo_loss(
      jnp.asarray(_LOGPS),
      jnp.asarray(_OLD_LOGPS),
      jnp.asarray(_ADV),
      jnp.asarray(_MASK),
      eps_low=_EPS_LOW,
      eps_high=_EPS_HIGH,
      loss_agg=loss_agg,
      **kwargs,
  )


class GrpoLossTest(chex.TestCase, parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(
      ('token_mean', 'token_mean', {}, _PG_SUM / 5),
      (
          'seq_mean_token_mean',
          'seq_mean_token_mean',
          {},
          (sum(_PG_ROWS[0]) / 3 + sum(_PG_ROWS[1]) / 2) / 2,
      ),
      ('dr_grpo_default_len', 'dr_grpo', {}, _PG_SUM / (2 * 3)),
      ('dr_grpo', 'dr_grpo', {'max_completion_len': 8}, _PG_SUM / (2 * 8)),
  )
  def test_aggregations(self, loss_agg, kwargs, expected):
    fn = self.variant(functools.partial(_loss, loss_agg, **kwargs))
    loss, aux = fn()
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    np.testing.assert_allclose(aux['pg_loss'], expected, rtol=1e-6)
    np.testing.assert_allclose(aux['clip_frac'], 2 / 5, rtol=1e-6)
    np.testing.assert_allclose(
        aux['ratio_mean'], (1.5 + 0.5 + 1.1 + 0.5 + 1.5) / 5, rtol=1e-6
    )
    self.assertEqual(float(aux['kl']), 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters('token_mean', 'seq_mean_token_mean')
  def test_kl_penalty(self, loss_agg):
    beta = 0.1
    fn = self.variant(
        functools.partial(
            _loss,
            loss_agg,
            beta=beta,
            ref_logps_RT=jnp.asarray(_LOGPS + _DELTA),
        )
    )
    loss, aux = fn()
    kl_mean = sum(map(sum, _KL_ROWS)) / 5
    if loss_agg == 'token_mean':
      expected = (_PG_SUM + beta * sum(map(sum, _KL_ROWS))) / 5
    else:
      expected = 0.5 * sum(
          (sum(pg) + beta * sum(kl)) / len(pg)
          for pg, kl in zip(_PG_ROWS, _KL_ROWS)
      )
    np.testing.assert_allclose(aux['kl'], kl_mean, rtol=1e-5)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)

  def test_gradient_is_cut_where_clipped(self):
    def loss_of(logps_RT):
      return loss_lib.grpo_loss(
          logps_RT,
          jnp.asarray(_OLD_LOGPS),
          jnp.asarray(_ADV),
          jnp.asarray(_MASK),
          eps_low=_EPS_LOW,
          eps_high=_EPS_HIGH,
      )[0]

    grad_RT = jax.grad(loss_of)(jnp.asarray(_LOGPS))
    # d/dlogp of -ratio * A / 5 is -ratio * A / 5 where not clipped.
    expected = np.array(
        [[0.0, -0.5 / 5, -1.1 / 5], [0.0, 2.0 * 1.5 / 5, 0.0]], np.float32
    )
    np.testing.assert_allclose(grad_RT, expected, rtol=1e-5, atol=1e-7)

  def test_clip_frac_counts_both_sides(self):
    # Positive advantage clipped above, negative clipped below; a ratio
    # outside the range on the side that does not bind is not counted.
    ratios = jnp.array([[2.0, 0.1, 1.0, 1.0], [2.0, 0.1, 1.0, 1.0]])
    _, aux = loss_lib.grpo_loss(
        jnp.log(ratios),
        jnp.zeros((2, 4)),
        jnp.array([1.0, -1.0]),
        jnp.array([[True] * 4, [True, True, True, False]]),
        eps_low=0.2,
        eps_high=0.2,
    )
    np.testing.assert_allclose(aux['clip_frac'], 2 / 7, rtol=1e-6)

  def test_padding_values_do_not_leak(self):
    # Values that would overflow exp() on the padding token.
    ref_logps = jnp.asarray(_LOGPS + _DELTA)
    kwargs = dict(eps_low=_EPS_LOW, eps_high=_EPS_HIGH, beta=0.1)
    args = (jnp.asarray(_OLD_LOGPS), jnp.asarray(_ADV), jnp.asarray(_MASK))
    clean = loss_lib.grpo_loss(
        jnp.asarray(_LOGPS), *args, ref_logps_RT=ref_logps, **kwargs
    )
    dirty = loss_lib.grpo_loss(
        jnp.asarray(_LOGPS).at[1, 2].set(1e4),
        *args,
        ref_logps_RT=ref_logps.at[1, 2].set(3e4),
        **kwargs,
    )
    chex.assert_tree_all_finite(dirty)
    chex.assert_trees_all_close(dirty, clean)

  def test_beta_without_reference_raises(self):
    with self.assertRaisesRegex(ValueError, 'ref_logps_RT'):
      _loss('token_mean', beta=0.1)

  def test_unknown_aggregation_raises(self):
    with self.assertRaisesRegex(ValueError, 'unknown loss_agg'):
      _loss('sum')


if __name__ == '__main__':
  absltest.main()
