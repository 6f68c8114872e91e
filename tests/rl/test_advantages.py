"""Tests for group-relative advantages."""

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo.rl import advantages

jax.config.update('jax_numpy_rank_promotion', 'raise')

# Three groups of G=4: balanced, one success in four, and degenerate.
_REWARDS = np.array(
    [[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]],
    np.float32,
)
_EPS = 1e-6
# By hand: group 1 has mean 1/2 and std 1/2; group 2 has mean 1/4 and
# std sqrt(3)/4; group 3 is degenerate.
_SQRT3 = np.sqrt(3.0)
_EXPECTED = {
    'grpo': [
        [0.5 / (0.5 + _EPS), -0.5 / (0.5 + _EPS)]
        + [-0.5 / (0.5 + _EPS), 0.5 / (0.5 + _EPS)],
        [-0.25 / (_SQRT3 / 4 + _EPS)] * 3 + [0.75 / (_SQRT3 / 4 + _EPS)],
        [0.0] * 4,
    ],
    'dr_grpo': [
        [0.5, -0.5, -0.5, 0.5],
        [-0.25, -0.25, -0.25, 0.75],
        [0.0] * 4,
    ],
    # r_j minus the mean of the three others.
    'rloo': [
        [1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3],
        [0 - 1 / 3, 0 - 1 / 3, 0 - 1 / 3, 1.0],
        [0.0] * 4,
    ],
}


class AdvantagesTest(parameterized.TestCase):

  @parameterized.parameters('grpo', 'dr_grpo', 'rloo')
  def test_hand_computed(self, method):
    adv_BG = advantages.compute_advantages(
        jnp.asarray(_REWARDS), method=method, eps=_EPS
    )
    chex.assert_shape(adv_BG, (3, 4))
    chex.assert_trees_all_close(
        adv_BG, np.asarray(_EXPECTED[method], np.float32), atol=1e-5
    )

  def test_grpo_balanced_pair_is_unit(self):
    adv_BG = advantages.compute_advantages(jnp.array([[0.0, 1.0]]), eps=0.0)
    chex.assert_trees_all_close(adv_BG, jnp.array([[-1.0, 1.0]]))

  @parameterized.parameters('grpo', 'dr_grpo', 'rloo')
  def test_degenerate_group_is_zero(self, method):
    rewards_BG = jnp.full((2, 5), 0.7)
    adv_BG = advantages.compute_advantages(rewards_BG, method=method)
    chex.assert_trees_all_equal(adv_BG, jnp.zeros((2, 5)))

  @parameterized.parameters('grpo', 'dr_grpo', 'rloo')
  def test_degenerate_group_is_exactly_zero_whatever_its_reward(self, method):
    # float32's mean of G equal rewards is not always the reward (0.4 * 3 / 3
    # is off by one ulp): grpo divided that ulp by std (~1e-8) + eps and gave
    # the three completions of an all-0.4 group advantages of 0.029.
    values = np.linspace(0.0, 1.0, 101, dtype=np.float32)
    for g in (2, 3, 5, 6, 7, 12):
      rewards_BG = jnp.asarray(np.repeat(values[:, None], g, axis=1))
      adv_BG = advantages.compute_advantages(rewards_BG, method=method)
      chex.assert_trees_all_equal(adv_BG, jnp.zeros((101, g)))

  def test_groups_of_two_and_nan_rewards(self):
    # A pair is +-1 under grpo whatever its gap (population std); a NaN
    # reward poisons its own group only.
    rewards_BG = jnp.array([[0.2, 0.9], [0.5, 0.5], [jnp.nan, 1.0]])
    adv = np.asarray(advantages.compute_advantages(rewards_BG))
    np.testing.assert_allclose(adv[:2], [[-1.0, 1.0], [0.0, 0.0]],
                               rtol=1e-5)
    self.assertTrue(np.isnan(adv[2]).all())
    for method, scale in (('dr_grpo', 1.0), ('rloo', 2.0)):
      adv = np.asarray(advantages.compute_advantages(rewards_BG,
                                                     method=method))
      np.testing.assert_allclose(adv[0], [-0.35 * scale, 0.35 * scale],
                                 rtol=1e-6)
      self.assertTrue(np.isnan(adv[2]).all())

  def test_rloo_is_leave_one_out(self):
    rewards_BG = jax.random.uniform(jax.random.key(0), (3, 6))
    adv_BG = advantages.compute_advantages(rewards_BG, method='rloo')
    r = np.asarray(rewards_BG)
    others = (r.sum(axis=1, keepdims=True) - r) / 5
    chex.assert_trees_all_close(adv_BG, r - others, atol=1e-6)

  def test_unknown_method_raises(self):
    with self.assertRaisesRegex(ValueError, 'unknown advantage method'):
      advantages.compute_advantages(jnp.zeros((2, 2)), method='ppo')

  def test_rloo_needs_two_samples(self):
    with self.assertRaisesRegex(ValueError, 'at least 2'):
      advantages.compute_advantages(jnp.zeros((2, 1)), method='rloo')

  def test_a_notebook_cell_run_again_replaces_its_estimator(self):
    # The same definition again (same module and name) replaces the old,
    # and the next call uses it, not the one traced before (it was `already
    # registered`); another definition under a taken name is refused.
    name = 'test_advantages_cell'
    # pylint: disable-next=protected-access
    self.addCleanup(advantages._ESTIMATORS.pop, name)
    rewards = jnp.ones((1, 2))
    for value in (1.0, 2.0):

      def cell(rewards_BG, eps, value=value):
        del eps
        return rewards_BG * 0 + value

      advantages.register_estimator(name)(cell)
      chex.assert_trees_all_close(
          advantages.compute_advantages(rewards, method=name),
          jnp.full((1, 2), value))

    def renamed(rewards_BG, eps):  # the cell edited: it was refused
      del eps
      return rewards_BG * 0 + 3.0

    advantages.register_estimator(name)(renamed)
    chex.assert_trees_all_close(
        advantages.compute_advantages(rewards, method=name),
        jnp.full((1, 2), 3.0))
    with self.assertRaisesRegex(ValueError, 'already registered'):
      advantages.register_estimator('grpo')(cell)

  def test_names(self):
    self.assertEqual(
        advantages.estimator_names(), ('dr_grpo', 'grpo', 'rloo')
    )


if __name__ == '__main__':
  absltest.main()
