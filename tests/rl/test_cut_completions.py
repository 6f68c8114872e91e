"""DAPO's overlong filtering: completions cut at T are masked out of the loss
(`rl.cut_completions='mask'`), as if their tokens were padding."""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np
import optax

from jaxgrpo import train_state as train_state_lib
from jaxgrpo import train_step as train_step_lib
from jaxgrpo.reporting import console as console_lib
from jaxgrpo.rl import batch as batch_lib
from jaxgrpo.rl import loss as loss_lib
from jaxgrpo.rl import rollout as rollout_lib
from jaxgrpo.rl import rounds
from tests import scripted
from tests import tiny
from tests.rl.test_rollout import G, _groups

# The stop id of these tests: `_groups` draws completion tokens from 2..15,
# so a completion of T tokens is cut unless its last token is set to STOP.
STOP = 1


def _cfg(mode, train_lengths=1, b=2):
  return rollout_lib.RolloutConfig(batch_size=b, group_size=G,
                                   train_lengths=train_lengths,
                                   cut_completions=mode)


def _both(groups, train_lengths=1):
  """The groups' batches under 'mask' and under 'train' (the default)."""
  return tuple(batch_lib.assemble(groups, _cfg(mode, train_lengths), 0,
                                  stop_ids=(STOP,))
               for mode in ('mask', 'train'))


class AssembleTest(absltest.TestCase):

  def test_masks_the_cut_completions_and_keeps_their_advantages(self):
    groups = _groups(2, 8, [[8, 3, 8, 1], [5, 8, 2, 7]])
    # The third completion fills T with a stop token: finished, not cut.
    groups[0].completion_tokens[2, -1] = STOP
    masked, kept = _both(groups)
    cut = np.isin(np.arange(2 * G), [0, 5])
    self.assertTrue(kept.completion_mask[cut].any(axis=1).all())
    self.assertFalse(masked.completion_mask[cut].any())
    np.testing.assert_array_equal(masked.completion_mask[~cut],
                                  kept.completion_mask[~cut])
    # Advantages over the whole group: the cut completions' rewards count.
    self.assertTrue(np.abs(kept.advantages[cut]).min() > 0)
    for name in ('advantages', 'completion_tokens', 'old_logps',
                 'prompt_tokens', 'prompt_mask'):
      np.testing.assert_array_equal(getattr(masked, name),
                                    getattr(kept, name), name)
    self.assertEqual(batch_lib.masked_share(groups, (STOP,)), 2 / 8)
    self.assertEqual(rollout_lib.RolloutConfig().cut_completions, 'train')

  def test_the_axis_fits_the_longest_trained_completion(self):
    # T = 160: the two completions of 160 tokens are cut. Masked, the
    # longest left is 70 tokens, which fits 128 of (64, 128, 160).
    groups = _groups(2, 160, [[160, 5, 70, 1], [30, 160, 9, 2]])
    masked, kept = _both(groups, train_lengths=4)
    self.assertEqual(kept.completion_mask.shape, (2 * G, 160))
    self.assertEqual(masked.completion_mask.shape, (2 * G, 128))
    expected = kept.completion_mask.copy()
    expected[[0, 5]] = False
    self.assertFalse(expected[:, 128:].any())  # only masked tokens cut
    np.testing.assert_array_equal(masked.completion_mask, expected[:, :128])

  def test_unknown_mode_names_the_key(self):
    with self.assertRaisesRegex(ValueError, r"rl.cut_completions='drop'"):
      batch_lib.assemble(_groups(1, 4, [[4] * G]), _cfg('drop'), 0)


class LossTest(parameterized.TestCase):

  @parameterized.product(
      loss_agg=loss_lib.LOSS_AGGREGATIONS, beta=[0.0, 0.1],
      # The second: every completion of the first group is cut.
      lengths=[[[8, 3, 6, 1], [5, 8, 8, 7]], [[8] * G, [5, 8, 2, 7]]])
  def test_masked_batch_is_the_batch_without_its_cut_completions(
      self, loss_agg, beta, lengths):
    # The loss and its gradient wrt the log-probs are those of the same
    # batch with the cut rows removed (zero on the cut rows), for every
    # aggregation: each normalizer counts valid tokens or rows holding
    # one, and dr_grpo's T is a constant. The gradient wrt the params is
    # that gradient through the log-probs, so it is the same too.
    groups = _groups(2, 8, lengths, seed=2)
    masked, kept = _both(groups)
    cut = kept.completion_mask[:, -1]
    rng = np.random.default_rng(0)
    noise = lambda: rng.normal(0.0, 0.3, kept.old_logps.shape)
    logps = (kept.old_logps + noise()).astype(np.float32)
    ref = (kept.old_logps + noise()).astype(np.float32)

    def loss(batch, rows, logps_RT):
      return loss_lib.grpo_loss(
          logps_RT, batch.old_logps[rows], batch.advantages[rows],
          batch.completion_mask[rows], eps_low=0.2, eps_high=0.28,
          loss_agg=loss_agg, beta=beta, ref_logps_RT=ref[rows],
          max_completion_len=8)

    everything = np.ones(2 * G, bool)
    grad = jax.value_and_grad(loss, argnums=2, has_aux=True)
    (value, aux), grads = grad(masked, everything, logps)
    (value_w, aux_w), grads_w = grad(kept, ~cut, logps[~cut])
    np.testing.assert_allclose(value, value_w, rtol=1e-6)
    for k in aux:
      np.testing.assert_allclose(aux[k], aux_w[k], rtol=1e-6, err_msg=k)
    np.testing.assert_allclose(grads[~cut], grads_w, rtol=1e-6, atol=1e-9)
    self.assertFalse(np.asarray(grads[cut]).any())
    # Trained on (the default), the cut completions change the loss.
    self.assertGreater(abs(float(loss(kept, everything, logps)[0] - value)),
                       1e-4)

  def test_a_minibatch_of_masked_groups_takes_no_update(self):
    # Every completion of the first group is cut; in minibatches of one
    # group, only the other group's takes an update.
    graphdef, params = tiny.random_model()
    masked, _ = _both(_groups(2, 8, [[8] * G, [5, 8, 2, 7]], seed=1))
    optimizer = optax.adamw(1e-3)
    state = train_state_lib.create_train_state(
        graphdef, params, optimizer, keep_reference=False)
    step_fn = train_step_lib.make_train_step(
        graphdef=graphdef, optimizer=optimizer,
        loss_cfg=train_step_lib.LossConfig(max_completion_len=8),
        num_minibatches=2)
    _, metrics = step_fn(state, jax.tree.map(np.asarray, masked),
                         jax.random.key(0))
    self.assertEqual(int(metrics['train/updates']), 1)
    for k, v in metrics.items():
      self.assertTrue(np.isfinite(v), k)


class _TokenRound:
  """A round function whose groups carry tokens: completion i of every
  prompt has `lengths[i]` of T tokens, rewards 1, 0, 0, ..."""

  def __init__(self, t, lengths):
    self.t, self.lengths = t, lengths

  def __call__(self, params, rng, examples, size):
    del params, rng, size
    groups = [dataclasses.replace(g, example=ex, rewards=np.eye(G)[0])
              for ex, g in zip(examples, _groups(len(examples), self.t,
                                                 [self.lengths] * len(
                                                     examples)))]
    return rounds.Round(groups=groups,
                        rewards=np.stack([g.rewards for g in groups]),
                        gen_s=0.0, gen_tokens=0.0)


class RolloutTest(absltest.TestCase):

  def _collect(self, mode, lengths):
    ro, sampler, _ = scripted.make_rollout([('d', 1.0, [0.5] * 4)],
                                           batch_size=2, group_size=G)
    cfg = dataclasses.replace(ro.cfg, cut_completions=mode)
    plugged = rollout_lib.Rollout(cfg, sampler, _TokenRound(6, lengths),
                                  pad_id=0, stop_ids=(STOP,))
    return plugged.collect(None, jax.random.key(0))

  def test_the_share_is_logged_and_a_batch_all_cut_skips_its_update(self):
    res = self._collect('mask', [6, 2, 6, 3])
    self.assertEqual(res.metrics['train/completions_masked'], 0.5)
    self.assertFalse(res.batch.completion_mask[::2].any())
    res = self._collect('train', [6, 2, 6, 3])
    self.assertNotIn('train/completions_masked', res.metrics)
    self.assertTrue(res.batch.completion_mask[::2].all())
    # Every completion cut: no update, and the console says why.
    res = self._collect('mask', [6] * G)
    self.assertIsNone(res.batch)
    self.assertEqual(res.metrics['train/completions_masked'], 1.0)
    lines = []
    console_lib.explain_no_update(
        3, res.metrics, rollout_lib.RolloutSection(max_new_tokens=6),
        console_lib.Console(lines.append), waiting=False)
    self.assertEqual(lines, [
        'step 3: every completion of the batch reached '
        'rollout.max_new_tokens=6 without a stop token; '
        "rl.cut_completions='mask' masks them all, update skipped"])


if __name__ == '__main__':
  absltest.main()
