"""Tests for the train step, train state and optimizer."""

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxgrpo import optimizer as optimizer_lib
from jaxgrpo import train_state as train_state_lib
from jaxgrpo import train_step as train_step_lib
from jaxgrpo.model import config
from jaxgrpo.model import decoder
from jaxgrpo.rl import logprobs
from jaxgrpo.rl import loss as loss_lib
from jaxgrpo.typing import TrainBatch
from tests import tiny

jax.config.update('jax_numpy_rank_promotion', 'raise')

_N, _P, _T = 4, 4, 4
_ADVANTAGES = np.array([1.0, -1.0, 1.0, -1.0], np.float32)
_logps_fn = jax.jit(logprobs.completion_logprobs, static_argnums=0)


def _fixed_batch(graphdef, params) -> TrainBatch:
  """Two prompts x two completions; old log-probs from `params` itself."""
  prompt = np.array([[0, 3, 4, 5], [0, 0, 6, 7]], np.int32)
  completion = np.array(
      [[8, 9, 10, 0], [11, 12, 0, 0], [13, 14, 15, 1], [2, 8, 0, 0]],
      np.int32,
  )
  batch = TrainBatch(
      prompt_tokens=jnp.asarray(prompt),
      prompt_mask=jnp.asarray(prompt > 0),
      completion_tokens=jnp.asarray(completion),
      completion_mask=jnp.asarray(completion > 0),
      old_logps=jnp.zeros((_N, _T)),
      advantages=jnp.asarray(_ADVANTAGES),
  )
  old_logps, _ = _logps_fn(graphdef, params, batch)
  return batch.replace(old_logps=old_logps)


def _copy(tree):
  # The step donates its state and batch; tests keep their own copies.
  return jax.tree.map(jnp.copy, tree)


def _update_counts(opt_state) -> list[int]:
  found = optax.tree_utils.tree_get_all_with_path(opt_state, 'count')
  return [int(count) for _, count in found]


class TrainStepTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.graphdef, cls.params = tiny.random_model()
    cls.batch = _fixed_batch(cls.graphdef, cls.params)
    cls.optimizer = optimizer_lib.make_optimizer(
        learning_rate=3e-3, warmup_steps=0, total_steps=100, max_grad_norm=1.0
    )

  def _state(self, keep_reference=False):
    return train_state_lib.create_train_state(
        self.graphdef,
        _copy(self.params),
        self.optimizer,
        keep_reference=keep_reference,
    )

  def _step_fn(self, loss_cfg, num_iterations, num_minibatches):
    return train_step_lib.make_train_step(
        graphdef=self.graphdef,
        optimizer=self.optimizer,
        loss_cfg=loss_cfg,
        num_iterations=num_iterations,
        num_minibatches=num_minibatches,
    )

  def test_updates_move_logps_with_advantages(self):
    # Two passes of two minibatches: four updates in one step.
    step_fn = self._step_fn(train_step_lib.LossConfig(), 2, 2)
    state, metrics = step_fn(
        self._state(), _copy(self.batch), jax.random.key(1)
    )
    self.assertEqual(int(state.step), 1)
    self.assertEqual(int(metrics['train/updates']), 4)
    self.assertEqual(_update_counts(state.opt_state), [4, 4])
    # Finite with left-padded prompts: padding never reaches the gradients.
    chex.assert_tree_all_finite(metrics)
    self.assertGreater(float(metrics['train/grad_norm']), 0.0)
    self.assertEqual(float(metrics['train/kl']), 0.0)

    new_logps, _ = _logps_fn(self.graphdef, state.params, self.batch)
    gain_N = np.asarray(new_logps - self.batch.old_logps).sum(axis=1)
    self.assertGreater(gain_N[_ADVANTAGES > 0].sum(), 0.0)
    self.assertLess(gain_N[_ADVANTAGES < 0].sum(), 0.0)

  def test_reference_is_frozen_and_kl_starts_at_zero(self):
    step_fn = self._step_fn(train_step_lib.LossConfig(beta=0.05), 1, 1)
    state = self._state(keep_reference=True)
    state, metrics = step_fn(state, _copy(self.batch), jax.random.key(1))
    # One update from the reference params: policy == reference.
    np.testing.assert_allclose(metrics['train/kl'], 0.0, atol=1e-6)
    np.testing.assert_allclose(metrics['train/ratio_mean'], 1.0, atol=1e-5)
    self.assertEqual(float(metrics['train/clip_frac']), 0.0)
    chex.assert_trees_all_equal(state.ref_params, self.params)

    state, metrics = step_fn(state, _copy(self.batch), jax.random.key(2))
    self.assertGreater(float(metrics['train/kl']), 0.0)
    chex.assert_trees_all_equal(state.ref_params, self.params)
    with self.assertRaises(AssertionError):
      chex.assert_trees_all_close(state.params, self.params)

  def test_nonfinite_update_is_skipped(self):
    step_fn = self._step_fn(train_step_lib.LossConfig(), 1, 2)
    bad = self.batch.replace(
        advantages=self.batch.advantages.at[0].set(jnp.nan))
    state, metrics = step_fn(self._state(), _copy(bad), jax.random.key(1))
    # The minibatch holding the NaN row is skipped, the other applied.
    self.assertAlmostEqual(float(metrics['train/nonfinite']), 0.5)
    self.assertEqual(int(metrics['train/updates']), 2)
    chex.assert_tree_all_finite(state.params)
    # The step's statistics are the applied update's, not NaN.
    chex.assert_tree_all_finite(metrics)
    good = bad.replace(advantages=bad.advantages.at[0].set(0.0))
    _, ok = step_fn(self._state(), _copy(good), jax.random.key(1))
    self.assertNotAlmostEqual(float(ok['train/loss']),
                              float(metrics['train/loss']))
    step_fn = self._step_fn(train_step_lib.LossConfig(), 1, 1)
    state, metrics = step_fn(self._state(), _copy(bad), jax.random.key(1))
    self.assertEqual(float(metrics['train/nonfinite']), 1.0)
    self.assertTrue(np.isnan(metrics['train/loss']))
    chex.assert_trees_all_equal(state.params, self.params)
    # AdamW's state is kept too, its count included: the skipped update
    # leaves no trace but the metric.
    chex.assert_trees_all_equal(state.opt_state, self._state().opt_state)

  def test_matches_a_plain_loop_over_passes_and_minibatches(self):
    # Two passes of two minibatches with the KL term, written out: each
    # pass shuffles the groups with fold_in(rng, pass); every update scores
    # its minibatch against the sampling-time log-probs (never recomputed
    # between updates) and the reference's, taken once from the initial
    # params; the metrics are the updates' means.
    cfg = train_step_lib.LossConfig(beta=0.05, eps_low=0.1, eps_high=0.3,
                                    temperature=0.7)
    logps_fn = jax.jit(logprobs.completion_logprobs, static_argnums=(0, 3))
    batch = self.batch.replace(old_logps=logps_fn(
        self.graphdef, self.params, self.batch, 0.7)[0])
    rng = jax.random.key(5)
    got, metrics = self._step_fn(cfg, 2, 2)(
        self._state(keep_reference=True), _copy(batch), rng)

    def loss(params, mb, ref):
      logps, entropy = logprobs.completion_logprobs(self.graphdef, params,
                                                    mb, 0.7)
      value, aux = loss_lib.grpo_loss(
          logps, mb.old_logps, mb.advantages, mb.completion_mask,
          eps_low=0.1, eps_high=0.3, beta=0.05, ref_logps_RT=ref)
      aux['entropy'] = entropy.sum() / mb.completion_mask.sum()
      return value, dict(aux, loss=value)

    grad_fn = jax.jit(jax.value_and_grad(loss, has_aux=True))
    ref_RT = batch.old_logps
    params, opt_state = _copy(self.params), self.optimizer.init(self.params)
    updates_metrics = []
    for i in range(2):
      order = np.asarray(jax.random.permutation(jax.random.fold_in(rng, i),
                                                2))
      for group in order:
        rows = np.arange(2 * group, 2 * group + 2)
        mb = TrainBatch(
            prompt_tokens=batch.prompt_tokens[group:group + 1],
            prompt_mask=batch.prompt_mask[group:group + 1],
            **{k: getattr(batch, k)[rows] for k in (
                'completion_tokens', 'completion_mask', 'old_logps',
                'advantages')})
        (_, aux), grads = grad_fn(params, mb, ref_RT[rows])
        updates_metrics.append(dict(aux, grad_norm=optax.tree.norm(grads)))
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    # The first update is on-policy: its ratio is 1, whatever the temperature.
    self.assertAlmostEqual(float(updates_metrics[0]['ratio_mean']), 1.0,
                           delta=1e-6)
    self.assertAlmostEqual(float(updates_metrics[0]['kl']), 0.0, delta=1e-9)
    for name in updates_metrics[0]:
      want = np.mean([float(m[name]) for m in updates_metrics])
      np.testing.assert_allclose(metrics[f'train/{name}'], want, rtol=1e-5,
                                 atol=1e-7, err_msg=name)
    chex.assert_trees_all_close(got.params, params, atol=2e-6)
    self.assertEqual(_update_counts(got.opt_state), [4, 4])

  def test_minibatches_of_padding_groups_take_no_update(self):
    # A short batch (short_batch 'train' or 'scale') is padded with empty
    # groups; a minibatch of them only has nothing to learn from. Padded to
    # 4 groups in 4 minibatches, the step must equal the 2 real groups'
    # in 2 minibatches, taken in the same order: before, the empty
    # minibatches still moved AdamW's params (its momentum), advanced its
    # count to 4, and their entropy and ratio of 0 halved those metrics.
    empty = lambda x: jnp.zeros_like(x)
    padded = jax.tree.map(lambda x: jnp.concatenate([x, empty(x)]),
                          self.batch)
    order = lambda seed, n: [int(g) for g in jax.random.permutation(
        jax.random.fold_in(jax.random.key(seed), 0), n) if g < 2]
    seed = next(s for s in range(100) if order(s, 4) == order(0, 2))
    want, want_metrics = self._step_fn(train_step_lib.LossConfig(), 1, 2)(
        self._state(), _copy(self.batch), jax.random.key(0))
    got, metrics = self._step_fn(train_step_lib.LossConfig(), 1, 4)(
        self._state(), _copy(padded), jax.random.key(seed))
    self.assertEqual(_update_counts(got.opt_state), [2, 2])
    chex.assert_trees_all_close(got.params, want.params, atol=1e-6)
    self.assertEqual(int(metrics['train/updates']), 2)
    for name, value in want_metrics.items():
      np.testing.assert_allclose(metrics[name], value, rtol=1e-5,
                                 atol=1e-7, err_msg=name)

  @parameterized.parameters('token_mean', 'seq_mean_token_mean', 'dr_grpo')
  def test_a_scaled_short_batch_weighs_the_same_whatever_the_shuffle(
      self, loss_agg):
    # short_batch='scale': 2 real groups of B = 4 in 2 minibatches. Where
    # the shuffle put both in one minibatch they weighed half what they
    # weighed split one per minibatch (each normalizer counts its own real
    # rows); now both weigh as groups of a full minibatch: together, the
    # update is the 2 groups' own full-batch update.
    sgd = optax.sgd(1e-3)
    loss_cfg = train_step_lib.LossConfig(loss_agg=loss_agg,
                                         max_completion_len=_T)
    padded = jax.tree.map(lambda x: jnp.concatenate([x, jnp.zeros_like(x)]),
                          self.batch)
    padded = padded.replace(advantages=padded.advantages * 2 / 4)

    def delta(batch, seed, minibatches, scale_short):
      state = train_state_lib.create_train_state(
          self.graphdef, _copy(self.params), sgd, keep_reference=False)
      new, _ = train_step_lib.make_train_step(
          graphdef=self.graphdef, optimizer=sgd, loss_cfg=loss_cfg,
          num_minibatches=minibatches, scale_short=scale_short)(
              state, _copy(batch), jax.random.key(seed))
      return jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b),
                          new.params, self.params)

    def together(seed):
      order = jax.random.permutation(jax.random.fold_in(
          jax.random.key(seed), 0), 4)
      return {int(g) for g in order[:2]} in ({0, 1}, {2, 3})

    same = next(s for s in range(50) if together(s))
    apart = next(s for s in range(50) if not together(s))
    full = delta(self.batch, 0, 1, False)
    chex.assert_trees_all_close(delta(padded, same, 2, True), full,
                                rtol=1e-5, atol=1e-10)
    norm = lambda tree: float(optax.tree.norm(tree))
    split = delta(padded, apart, 2, True)
    # Two updates, the second from where the first moved the params; a
    # group alone under token_mean weighs by its own tokens (5 and 6 here),
    # not the pair's 11. Otherwise it weighs as in the full minibatch.
    self.assertAlmostEqual(norm(split) / norm(full), 1.0, delta=(
        0.15 if loss_agg == 'token_mean' else 0.02))
    cosine = optax.tree.vdot(split, full) / (norm(split) * norm(full))
    self.assertGreater(float(cosine), 0.99)
    # Not scaled per minibatch, the two shuffles gave updates 2x apart.
    self.assertAlmostEqual(norm(delta(padded, apart, 2, False))
                           / norm(delta(padded, same, 2, False)), 2.0,
                           delta=0.15)

  def test_nonfinite_update_keeps_the_rounding_count(self):
    # With bfloat16 params the optimizer also counts updates (it picks each
    # update's rounding noise); a skipped update leaves that count too.
    opt = optimizer_lib.make_optimizer(
        learning_rate=3e-3, warmup_steps=0, total_steps=100,
        max_grad_norm=1.0, param_dtype='bfloat16')
    state = train_state_lib.create_train_state(
        self.graphdef, _copy(self.params), opt, keep_reference=False)
    before = _copy(state.opt_state)
    step_fn = train_step_lib.make_train_step(
        graphdef=self.graphdef, optimizer=opt,
        loss_cfg=train_step_lib.LossConfig(), num_iterations=3,
        num_minibatches=1)
    bad = self.batch.replace(
        advantages=self.batch.advantages.at[3].set(jnp.inf))
    state, metrics = step_fn(state, _copy(bad), jax.random.key(1))
    self.assertEqual(float(metrics['train/nonfinite']), 1.0)
    self.assertEqual(int(metrics['train/updates']), 3)
    chex.assert_trees_all_equal(state.opt_state, before)
    chex.assert_trees_all_equal(state.params, self.params)

  def test_beta_needs_reference(self):
    with self.assertRaisesRegex(ValueError, 'ref_params'):
      train_step_lib.train_step(
          self._state(keep_reference=False),
          self.batch,
          jax.random.key(0),
          graphdef=self.graphdef,
          optimizer=self.optimizer,
          loss_cfg=train_step_lib.LossConfig(beta=0.1),
          num_iterations=1,
          num_minibatches=1,
      )

  def test_minibatches_must_divide_batch(self):
    with self.assertRaisesRegex(ValueError, 'minibatches'):
      train_step_lib.train_step(
          self._state(),
          self.batch,
          jax.random.key(0),
          graphdef=self.graphdef,
          optimizer=self.optimizer,
          loss_cfg=train_step_lib.LossConfig(),
          num_iterations=1,
          num_minibatches=3,
      )

  @parameterized.parameters(
      {'eps_low': 1.0},
      {'eps_high': -0.1},
      {'loss_agg': 'sum'},
      {'beta': -1.0},
      {'temperature': -1.0},
      {'max_completion_len': 0},
  )
  def test_loss_config_validates(self, **kwargs):
    with self.assertRaises(ValueError):
      train_step_lib.LossConfig(**kwargs)


class TrainStateTest(absltest.TestCase):

  def test_abstract_state(self):
    cfg = config.ModelConfig.tiny(vocab_size=16)
    graphdef, params = decoder.abstract_params(cfg)
    opt = optimizer_lib.make_optimizer(
        learning_rate=1e-3, warmup_steps=1, total_steps=10, max_grad_norm=1.0
    )
    without = train_state_lib.abstract_train_state(
        graphdef, params, opt, keep_reference=False
    )
    self.assertIsNone(without.ref_params)
    with_ref = train_state_lib.abstract_train_state(
        graphdef, params, opt, keep_reference=True
    )
    chex.assert_trees_all_equal_shapes_and_dtypes(with_ref.ref_params, params)
    self.assertEqual(with_ref.step.shape, ())

  def test_reference_is_a_copy(self):
    graphdef, params = tiny.random_model()
    state = train_state_lib.create_train_state(
        graphdef, params, optax.sgd(0.1), keep_reference=True
    )
    chex.assert_trees_all_equal(state.ref_params, params)
    for ref, param in zip(
        jax.tree.leaves(state.ref_params), jax.tree.leaves(params)
    ):
      self.assertNotEqual(
          ref.unsafe_buffer_pointer(), param.unsafe_buffer_pointer()
      )


class OptimizerTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('constant', 'constant', 4, {0: 0.0, 1: 0.25, 2: 0.5, 4: 1.0, 99: 1.0}),
      ('constant_no_warmup', 'constant', 0, {0: 1.0, 50: 1.0}),
      # Cosine over updates 2..10: half way (update 6) is at half the peak.
      ('cosine', 'cosine', 2, {0: 0.0, 1: 0.5, 2: 1.0, 6: 0.5, 10: 0.0}),
  )
  def test_schedule(self, schedule, warmup_steps, expected):
    lr = optimizer_lib.make_schedule(
        learning_rate=1e-3,
        warmup_steps=warmup_steps,
        total_steps=10,
        schedule=schedule,
    )
    for count, fraction in expected.items():
      np.testing.assert_allclose(
          lr(count), 1e-3 * fraction, atol=1e-9, err_msg=f'update {count}'
      )

  def test_first_update_uses_warmup(self):
    params = {'w': jnp.ones((2, 2))}
    opt = optimizer_lib.make_optimizer(
        learning_rate=1e-3, warmup_steps=2, total_steps=10, max_grad_norm=1.0
    )
    update = jax.jit(opt.update)
    opt_state = opt.init(params)
    grads = {'w': jnp.full((2, 2), 10.0)}
    updates, opt_state = update(grads, opt_state, params)
    # The warmup starts at 0: the first update does not move the params.
    chex.assert_trees_all_equal(updates, {'w': jnp.zeros((2, 2))})
    updates, _ = update(grads, opt_state, params)
    # Adam's first steps move each weight by about the learning rate.
    np.testing.assert_allclose(updates['w'], -0.5e-3, rtol=1e-3)

  def test_weight_decay_skips_vectors(self):
    params = {'w': jnp.ones((2, 2)), 'b': jnp.ones((2,))}
    opt = optimizer_lib.make_optimizer(
        learning_rate=1.0,
        warmup_steps=0,
        total_steps=10,
        max_grad_norm=None,
        weight_decay=0.5,
    )
    zero = jax.tree.map(jnp.zeros_like, params)
    updates, _ = jax.jit(opt.update)(zero, opt.init(params), params)
    np.testing.assert_allclose(updates['w'], -0.5)
    np.testing.assert_allclose(updates['b'], 0.0)

  def _descend(self, param_dtype, steps=1000):
    """1024 weights at 1.0 after `steps` AdamW updates of about 1e-4 each
    (a constant gradient), as the train step applies them."""
    opt = optimizer_lib.make_optimizer(
        learning_rate=1e-4, warmup_steps=0, total_steps=steps,
        max_grad_norm=1.0, param_dtype=param_dtype, seed=3)
    params = {'w': jnp.ones((1024,), jnp.dtype(param_dtype))}
    grads = jax.tree.map(jnp.ones_like, params)

    def step(carry, _):
      params, state = carry
      updates, state = opt.update(grads, state, params)
      return (optax.apply_updates(params, updates), state), None

    (params, state), _ = jax.jit(lambda c: jax.lax.scan(
        step, c, None, length=steps))((params, opt.init(params)))
    return params['w'], state

  def test_bfloat16_params_keep_updates_below_their_rounding_step(self):
    # 1e-4 is 1/78 of bfloat16's step at 1.0 (2^-7): plain AdamW on
    # bfloat16 params rounded every update away and nothing moved.
    want, _ = self._descend('float32')
    np.testing.assert_allclose(want, 0.9, atol=1e-4)
    got, state = self._descend('bfloat16')
    self.assertEqual(got.dtype, jnp.bfloat16)
    self.assertAlmostEqual(float(got.astype(jnp.float32).mean()), 0.9,
                           delta=0.003)
    self.assertGreater(len(np.unique(np.asarray(got, np.float32))), 1)
    moments = [x for x in jax.tree.leaves(state.inner) if x.ndim]
    self.assertTrue(all(x.dtype == jnp.float32 for x in moments), moments)
    self.assertEqual(int(state.count), 1000)
    # The noise is a function of the seed and the count: the same again.
    np.testing.assert_array_equal(got, self._descend('bfloat16')[0])
    plain = optax.adamw(1e-4)
    p = {'w': jnp.ones((4,), jnp.bfloat16)}
    u, _ = plain.update(jax.tree.map(jnp.ones_like, p), plain.init(p), p)
    np.testing.assert_array_equal(optax.apply_updates(p, u)['w'], 1.0)

  def test_stochastic_round_is_unbiased_and_exact_on_bfloat16_values(self):
    x = jnp.full((100_000,), 1.0 + 2.0**-9, jnp.float32)  # 1/4 of a step
    r = optimizer_lib.stochastic_round(x, jax.random.key(0))
    self.assertEqual(set(np.unique(np.asarray(r, np.float32))),
                     {1.0, 1.0 + 2.0**-7})
    self.assertAlmostEqual(float(jnp.mean(r.astype(jnp.float32) == 1.0)),
                           0.75, delta=0.01)
    exact = jnp.asarray([-3.5, 0.0, 1.0, 2.0**-20], jnp.bfloat16)
    np.testing.assert_array_equal(optimizer_lib.stochastic_round(
        exact.astype(jnp.float32), jax.random.key(1)), exact)
    neg = optimizer_lib.stochastic_round(-x, jax.random.key(2))
    self.assertAlmostEqual(float(neg.astype(jnp.float32).mean()),
                           -float(x[0]), delta=1e-4)

  def test_unknown_schedule_raises(self):
    with self.assertRaisesRegex(ValueError, 'unknown schedule'):
      optimizer_lib.make_schedule(
          learning_rate=1.0, warmup_steps=0, total_steps=1, schedule='step'
      )


if __name__ == '__main__':
  absltest.main()
