"""The GRPO loss against an independent NumPy reference, in edge cases.

Ragged completions (empty rows, rows truncated at T without a stop token),
both signs of the advantage, ratios on both sides of an asymmetric clip
range, and the k3 KL term: loss, gradient and metrics of every `loss_agg`
are recomputed here in float64 from their definitions.
"""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo.rl import loss as loss_lib

jax.config.update('jax_numpy_rank_promotion', 'raise')

_T = 6
# Completion lengths: empty (batch padding), one token, truncated at T
# (no stop token), and ragged lengths in between.
_LENGTHS = np.array([0, 1, _T, 3, _T, 2, 5, 0])
_ADV = np.array([0.0, 1.3, -0.7, 2.0, -1.5, 0.0, 0.4, 0.9])


def _case(seed: int):
  rng = np.random.default_rng(seed)
  r = len(_LENGTHS)
  mask = np.arange(_T)[None] < _LENGTHS[:, None]
  old = rng.uniform(-4.0, -0.1, (r, _T))
  # Ratios from 0.5 to 1.6: inside and outside [1 - 0.1, 1 + 0.3].
  logps = old + np.log(rng.uniform(0.5, 1.6, (r, _T)))
  ref = logps + rng.normal(0.0, 0.5, (r, _T))
  # Padding holds values that would overflow exp() if they leaked.
  logps[~mask], old[~mask], ref[~mask] = 80.0, -80.0, 200.0
  return logps, old, ref, mask


def _reference(logps, old, ref, adv, mask, *, eps_low, eps_high, loss_agg,
               beta, max_len):
  """(loss, dloss/dlogps, clip_frac, ratio_mean, kl) in float64."""
  m = mask.astype(np.float64)
  ratio = np.where(mask, np.exp(logps - old), 1.0)
  a = adv[:, None]
  unclipped = ratio * a
  clipped = np.clip(ratio, 1 - eps_low, 1 + eps_high) * a
  pg = -np.minimum(unclipped, clipped)
  # The gradient flows where the unclipped term is the minimum (ties:
  # ratio inside the range, where both are equal and the clip passes it).
  inside = (ratio >= 1 - eps_low) & (ratio <= 1 + eps_high)
  live = (unclipped <= clipped) | inside
  dpg = np.where(live, -ratio * a, 0.0)
  delta = np.where(mask, ref - logps, 0.0)
  kl = np.exp(delta) - delta - 1
  dkl = 1 - np.exp(delta)
  per_tok, dper_tok = pg + beta * kl, dpg + beta * dkl
  n_tok = max(m.sum(), 1.0)
  count = m.sum(axis=1, keepdims=True)
  # Sequences: rows with a token (empty rows are a short batch's padding).
  n_seq = max((count > 0).sum(), 1)
  if loss_agg == 'token_mean':
    w = m / n_tok
  elif loss_agg == 'seq_mean_token_mean':
    w = m / np.maximum(count, 1.0) / n_seq
  else:
    w = m / (n_seq * max_len)
  clip = ((a > 0) & (ratio > 1 + eps_high)) | ((a < 0) & (ratio < 1 - eps_low))
  return ((per_tok * w).sum(), dper_tok * w, (clip * m).sum() / n_tok,
          (ratio * m).sum() / n_tok, (kl * m).sum() / n_tok)


class LossReferenceTest(parameterized.TestCase):

  @parameterized.product(
      loss_agg=loss_lib.LOSS_AGGREGATIONS, beta=(0.0, 0.04), seed=(0, 1))
  def test_matches_numpy(self, loss_agg, beta, seed):
    logps, old, ref, mask = _case(seed)
    kwargs = dict(eps_low=0.1, eps_high=0.3, loss_agg=loss_agg, beta=beta)

    def fn(lp):
      return loss_lib.grpo_loss(
          lp, jnp.asarray(old, jnp.float32), jnp.asarray(_ADV, jnp.float32),
          jnp.asarray(mask), ref_logps_RT=jnp.asarray(ref, jnp.float32),
          max_completion_len=8, **kwargs)

    (loss, aux), grad = jax.jit(jax.value_and_grad(fn, has_aux=True))(
        jnp.asarray(logps, jnp.float32))
    want, want_grad, clip, ratio, kl = _reference(
        logps, old, ref, _ADV, mask, max_len=8, **kwargs)
    np.testing.assert_allclose(loss, want, rtol=2e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=2e-5, atol=1e-7)
    self.assertTrue(np.all(np.asarray(grad)[~mask] == 0.0))
    np.testing.assert_allclose(aux['clip_frac'], clip, rtol=1e-6)
    self.assertGreater(clip, 0.1)  # the case does clip, on both sides
    np.testing.assert_allclose(aux['ratio_mean'], ratio, rtol=1e-5)
    np.testing.assert_allclose(aux['kl'], kl if beta else 0.0, rtol=1e-5)
    if not beta:
      np.testing.assert_allclose(aux['pg_loss'], want, rtol=2e-5)

  @parameterized.parameters(*loss_lib.LOSS_AGGREGATIONS)
  def test_padding_rows_change_nothing(self, loss_agg):
    # A short batch is padded with empty groups; rollout.short_batch='train'
    # promises a full-size update and 'scale' (advantages x n / B) one
    # weighted as in a full batch. dr_grpo counted the padding rows as
    # sequences: 'train' was already scaled by n / B, 'scale' twice.
    logps, old, ref, mask = _case(2)
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    pad = lambda x: jnp.concatenate([jnp.asarray(x), jnp.zeros_like(x)])
    kwargs = dict(eps_low=0.2, eps_high=0.28, loss_agg=loss_agg, beta=0.1,
                  max_completion_len=8)
    args = [f32(logps), f32(old), f32(_ADV), jnp.asarray(mask)]
    want, want_aux = loss_lib.grpo_loss(*args, ref_logps_RT=f32(ref),
                                        **kwargs)
    got, got_aux = loss_lib.grpo_loss(*map(pad, args),
                                      ref_logps_RT=pad(f32(ref)), **kwargs)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for name, value in want_aux.items():
      np.testing.assert_allclose(got_aux[name], value, rtol=1e-6,
                                 err_msg=name)

  def test_all_padding_is_zero_not_nan(self):
    # A minibatch of padding groups only (a short batch's).
    zeros = jnp.zeros((4, _T))
    for loss_agg in loss_lib.LOSS_AGGREGATIONS:
      loss, aux = loss_lib.grpo_loss(
          zeros, zeros, jnp.zeros(4), jnp.zeros((4, _T), bool), eps_low=0.2,
          eps_high=0.28, loss_agg=loss_agg, beta=0.1, ref_logps_RT=zeros)
      self.assertEqual(float(loss), 0.0)
      for name, value in aux.items():
        self.assertTrue(np.isfinite(value), name)

  def test_clip_higher_is_asymmetric(self):
    # The same ratio above and below 1 by 0.25: clipped above only when
    # eps_high < 0.25, below only when eps_low < 0.25, and only on the side
    # the advantage's sign binds.
    ratios = jnp.array([[1.25, 0.75]] * 2)
    adv = jnp.array([1.0, -1.0])

    def clip_frac(eps_low, eps_high):
      _, aux = loss_lib.grpo_loss(
          jnp.log(ratios), jnp.zeros((2, 2)), adv, jnp.ones((2, 2), bool),
          eps_low=eps_low, eps_high=eps_high)
      return float(aux['clip_frac'])

    self.assertEqual(clip_frac(0.2, 0.28), 1 / 4)  # A<0 at 0.75 only
    self.assertEqual(clip_frac(0.3, 0.2), 1 / 4)  # A>0 at 1.25 only
    self.assertEqual(clip_frac(0.2, 0.2), 2 / 4)
    self.assertEqual(clip_frac(0.3, 0.3), 0.0)

  def test_dr_grpo_ignores_the_batch_length(self):
    # The normaliser is the configured T, not the batch's: padding columns
    # (which batch.assemble cuts off) leave the loss as it was.
    logps, old, _, mask = _case(0)
    pad = lambda x: jnp.pad(jnp.asarray(x), ((0, 0), (0, 4)))
    kwargs = dict(eps_low=0.2, eps_high=0.28, loss_agg='dr_grpo',
                  max_completion_len=16)
    adv = jnp.asarray(_ADV, jnp.float32)
    cut, _ = loss_lib.grpo_loss(jnp.asarray(logps, jnp.float32),
                                jnp.asarray(old, jnp.float32), adv,
                                jnp.asarray(mask), **kwargs)
    full, _ = loss_lib.grpo_loss(pad(logps.astype(np.float32)),
                                 pad(old.astype(np.float32)), adv, pad(mask),
                                 **kwargs)
    np.testing.assert_allclose(cut, full, rtol=1e-6)


if __name__ == '__main__':
  absltest.main()
