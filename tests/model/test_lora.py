"""LoRA adapters (jaxgrpo.model.lora): the math, the train step, PEFT names."""

import re

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import qwix

from jaxgrpo import errors
from jaxgrpo import optimizer as optimizer_lib
from jaxgrpo import train_state as train_state_lib
from jaxgrpo import train_step as train_step_lib
from jaxgrpo.model import config
from jaxgrpo.model import decoder
from jaxgrpo.model import layers
from jaxgrpo.model import lora
from jaxgrpo.rl import logprobs
from jaxgrpo.typing import TrainBatch
from tests import tiny

jax.config.update('jax_numpy_rank_promotion', 'raise')

_PROJECTIONS = ('attn/q', 'attn/k', 'attn/v', 'attn/o', 'mlp/gate', 'mlp/up',
                'mlp/down')


def _inputs(batch: int = 2, length: int = 5, vocab: int = 16):
  tokens = jax.random.randint(jax.random.key(3), (batch, length), 0, vocab)
  positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
  mask = jnp.broadcast_to(jnp.tril(jnp.ones((length, length), bool)),
                          (batch, length, length))
  return tokens, positions, mask


def _randomized(adapter: nnx.State, seed: int = 5) -> nnx.State:
  """The adapter with every entry random (B starts at zero)."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(
      lambda x: jnp.asarray(rng.normal(0, 0.05, x.shape), x.dtype), adapter)


class AdapterMathTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('q', 'BTD,DNH->BTNH', (8, 2, 4), (0,), (2, 3, 8)),
      ('o', 'BTNH,NHD->BTD', (2, 4, 8), (0, 1), (2, 3, 2, 4)),
      ('down', 'BTF,FD->BTD', (12, 8), (0,), (2, 3, 12)),
  )
  def test_adapter_adds_x_a_b_times_alpha_over_rank(self, eqn, shape, in_axes,
                                                    x_shape):
    rank, alpha = 3, 6.0
    section = lora.LoraSection(rank=rank, alpha=alpha, modules='.*')
    x = jax.random.normal(jax.random.key(0), x_shape)
    axes = ('a', 'b', 'c')[:len(shape)]

    @jax.jit
    def run(x, b_value):
      layer = layers.Einsum(shape, axes, in_axes=in_axes,
                            rngs=nnx.Rngs(params=0))
      adapted = qwix.apply_lora_to_model(
          layer, lora.provider(section), eqn, x, rngs=nnx.Rngs(params=1))
      adapted.w_lora_b.set_value(b_value)
      return (adapted(eqn, x), layer.w.get_value(),
              adapted.w_lora_a.get_value())

    fan_in = int(np.prod([shape[i] for i in in_axes]))
    b_value = jax.random.normal(jax.random.key(2), (rank, np.prod(shape) //
                                                    fan_in))
    y, w, a = run(x, b_value)
    self.assertEqual(a.shape, (fan_in, rank))
    x_flat = x.reshape(-1, fan_in)
    want = (jnp.einsum(eqn, x, w) + (x_flat @ a @ b_value).reshape(
        y.shape) * alpha / rank)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


class AttachTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.graphdef, cls.params = tiny.random_model()
    cls.section = lora.LoraSection(rank=4, alpha=8.0)
    cls.lora_graphdef, cls.adapter = lora.attach(
        cls.graphdef, cls.params, cls.section, jax.random.key(1))

  def test_every_projection_gets_an_adapter_sharded_by_logical_axes(self):
    cfg = config.ModelConfig.tiny(vocab_size=16)
    found = lora.pairs(self.adapter)
    self.assertEqual(
        sorted(found), sorted(('blocks', i, *p.split('/'))
                              for i in range(cfg.num_layers)
                              for p in _PROJECTIONS))
    n, h, d = cfg.num_heads, cfg.head_dim, cfg.embed_dim
    a, b = found[('blocks', 0, 'attn', 'q')]
    self.assertEqual((a.shape, b.shape), ((d, 4), (4, n * h)))
    a, b = found[('blocks', 1, 'attn', 'o')]
    self.assertEqual((a.shape, b.shape), ((n * h, 4), (4, d)))
    specs = nnx.get_partition_spec(self.adapter)
    q = specs['blocks'][0]['attn']['q']
    self.assertEqual(tuple(q['w_lora_a'].get_value()), ('embed', None))
    self.assertEqual(tuple(q['w_lora_b'].get_value()), (None, 'heads'))
    # B starts at zero: the adapted decoder starts as the base.
    self.assertFalse(any(np.any(b) for _, b in found.values()))

  def test_starts_as_the_base_and_merges_into_it(self):
    tokens, positions, mask = _inputs()
    run = jax.jit(lambda p, a: nnx.merge(self.lora_graphdef, p, a)(
        tokens, positions, mask)[0])
    base = jax.jit(lambda p: decoder.forward(self.graphdef, p, tokens,
                                             positions, mask)[0])
    np.testing.assert_allclose(run(self.params, self.adapter),
                               base(self.params), atol=1e-6)
    adapter = _randomized(self.adapter)
    adapted = run(self.params, adapter)
    self.assertGreater(float(jnp.abs(adapted - base(self.params)).max()), 0.1)
    merged = lora.merge(self.params, adapter, alpha=self.section.alpha)
    np.testing.assert_allclose(base(merged), adapted, atol=2e-5)

  def test_merge_loss_measures_what_rounding_took(self):
    alpha = self.section.alpha
    for scale, dtype, lo, hi in ((1.0, jnp.float32, 0.0, 1e-6),
                                 (1e-3, jnp.bfloat16, 0.5, 1.0),
                                 (1.0, jnp.bfloat16, 1e-3, 0.1)):
      params = jax.tree.map(lambda x, d=dtype: x.astype(d), self.params)
      adapter = jax.tree.map(lambda x, k=scale: x * k,
                             _randomized(self.adapter))
      merged = lora.merge(params, adapter, alpha=alpha)
      loss = lora.merge_loss(params, merged, adapter, alpha=alpha)
      with self.subTest(scale=scale, dtype=dtype):
        self.assertBetween(loss, lo, hi)
    self.assertEqual(lora.merge_loss(self.params, self.params, self.adapter,
                                     alpha=alpha), 0.0)  # B = 0: no change

  def test_runs_only_under_a_trace(self):
    # Eagerly qwix could not tie the reshaped q/k/v/o weights to their
    # adapters; the adapted decoder says so instead of leaving them out.
    with self.assertRaisesRegex(RuntimeError, 'runs under jax.jit'):
      nnx.merge(self.lora_graphdef, self.params, self.adapter)(*_inputs())

  def test_modules_pick_projections(self):
    section = lora.LoraSection(rank=2, modules=r'blocks/1/attn/(q|v)')
    _, adapter = lora.attach(self.graphdef, self.params, section,
                             jax.random.key(0))
    self.assertEqual(sorted(lora.pairs(adapter)),
                     [('blocks', 1, 'attn', 'q'), ('blocks', 1, 'attn', 'v')])
    with self.assertRaisesRegex(errors.ConfigError,
                                'model.lora.modules.*matches no projection'):
      lora.attach(self.graphdef, self.params,
                  lora.LoraSection(rank=2, modules='blocks/9/attn/q'),
                  jax.random.key(0))
    # qwix matches whole paths: a prefix or PEFT's names match nothing, and
    # the message says what a path looks like.
    for modules in ('blocks/0/attn', 'q_proj|v_proj', 'embedding'):
      with self.assertRaisesRegex(
          errors.ConfigError, re.escape(
              f'model.lora.modules={modules!r}: matches no projection; it '
              'must match a whole module path, blocks/<i>/attn/(q|k|v|o) or '
              'blocks/<i>/mlp/(gate|up|down) with i in 0..1')):
        lora.attach(self.graphdef, self.params,
                    lora.LoraSection(rank=2, modules=modules),
                    jax.random.key(0))
    with self.assertRaisesRegex(errors.ConfigError, 'model.lora.rank=-1'):
      lora.LoraSection(rank=-1)

  def test_rank_above_a_projections_smaller_dimension_is_refused(self):
    # k is [64, 2 x 16]: rank 33 gave an adapter of more parameters than
    # the weight, with no more rank than 32.
    with self.assertRaisesRegex(
        errors.ConfigError, re.escape(
            'model.lora.rank=33: above the smaller dimension of '
            'blocks/0/attn/k (64 x 32), where an adapter adds parameters but '
            'no rank; use a rank of at most 32, or 0 to train every weight')):
      lora.attach(self.graphdef, self.params, lora.LoraSection(rank=33),
                  jax.random.key(0))
    _, adapter = lora.attach(self.graphdef, self.params,
                             lora.LoraSection(rank=32), jax.random.key(0))
    self.assertEqual(lora.pairs(adapter)[('blocks', 0, 'attn', 'k')][0].shape,
                     (64, 32))

  def test_peft_layout(self):
    cfg = config.ModelConfig.tiny(vocab_size=16)
    tensors = lora.peft_tensors(self.adapter)
    self.assertLen(tensors, 2 * 7 * cfg.num_layers)
    d, f = cfg.embed_dim, cfg.mlp_dim
    qkv = cfg.num_heads * cfg.head_dim
    prefix = 'base_model.model.model.layers'
    want = {
        f'{prefix}.0.self_attn.q_proj.lora_A.weight': (4, d),
        f'{prefix}.0.self_attn.q_proj.lora_B.weight': (qkv, 4),
        f'{prefix}.1.self_attn.o_proj.lora_A.weight': (4, qkv),
        f'{prefix}.1.self_attn.o_proj.lora_B.weight': (d, 4),
        f'{prefix}.1.mlp.down_proj.lora_A.weight': (4, f),
        f'{prefix}.1.mlp.down_proj.lora_B.weight': (d, 4),
    }
    for key, shape in want.items():
      self.assertEqual(tensors[key].shape, shape, key)
    a, b = lora.pairs(self.adapter)[('blocks', 0, 'mlp', 'up')]
    np.testing.assert_array_equal(
        tensors[f'{prefix}.0.mlp.up_proj.lora_A.weight'], np.asarray(a).T)
    np.testing.assert_array_equal(
        tensors[f'{prefix}.0.mlp.up_proj.lora_B.weight'], np.asarray(b).T)
    peft = lora.peft_config(self.adapter, self.section, base_model='m')
    self.assertEqual(peft['target_modules'], sorted(
        ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj',
         'down_proj']))
    self.assertEqual((peft['r'], peft['lora_alpha'], peft['peft_type']),
                     (4, 8.0, 'LORA'))
    self.assertEqual(lora.peft_config(
        self.adapter, self.section, base_model='m',
        num_layers=cfg.num_layers)['target_modules'], peft['target_modules'])
    # The same projections of some layers only: short names would make
    # PEFT adapt them in every layer (adapters without saved weights).
    section = lora.LoraSection(rank=4, modules=r'blocks/0/attn/(q|v)')
    _, adapter = lora.attach(self.graphdef, self.params, section,
                             jax.random.key(1))
    peft = lora.peft_config(adapter, section, base_model='m',
                            num_layers=cfg.num_layers)
    self.assertEqual(peft['target_modules'], [
        'model.layers.0.self_attn.q_proj', 'model.layers.0.self_attn.v_proj'])


def _batch(graphdef, params) -> TrainBatch:
  rng = np.random.default_rng(0)
  prompt = rng.integers(1, 16, (2, 4)).astype(np.int32)
  completion = rng.integers(1, 16, (4, 4)).astype(np.int32)
  batch = TrainBatch(
      prompt_tokens=jnp.asarray(prompt),
      prompt_mask=jnp.ones((2, 4), bool),
      completion_tokens=jnp.asarray(completion),
      completion_mask=jnp.asarray(np.arange(4)[None] < np.array(
          [[4], [2], [3], [1]])),
      old_logps=jnp.zeros((4, 4)),
      advantages=jnp.asarray([1.0, -1.0, 0.5, -0.5]),
  )
  old, _ = jax.jit(logprobs.completion_logprobs, static_argnums=0)(
      graphdef, params, batch)
  return batch.replace(old_logps=old)


class LoraStepTest(absltest.TestCase):

  def test_step_changes_only_the_adapter(self):
    graphdef, params = tiny.random_model()
    section = lora.LoraSection(rank=4, alpha=8.0)
    lora_graphdef, adapter = lora.attach(graphdef, params, section,
                                         jax.random.key(1))
    optimizer = optimizer_lib.make_optimizer(
        learning_rate=1e-2, warmup_steps=0, total_steps=10, max_grad_norm=1.0)
    state = train_state_lib.create_train_state(
        lora_graphdef, adapter, optimizer, keep_reference=False,
        base=jax.tree.map(jnp.copy, params))
    self.assertIsNone(state.ref_params)
    # The optimizer holds the adapter's moments, nothing of the base.
    opt_leaves = {x.shape for x in jax.tree.leaves(state.opt_state)}
    self.assertEqual(opt_leaves - {()},
                     {x.shape for x in jax.tree.leaves(adapter)})
    batch = _batch(lora_graphdef, state.policy_params)
    step = train_step_lib.make_train_step(
        graphdef=lora_graphdef, optimizer=optimizer,
        loss_cfg=train_step_lib.LossConfig(beta=0.1), num_iterations=2,
        base_graphdef=graphdef)
    before = jax.device_get(state)
    new, metrics = step(state, batch, jax.random.key(0))
    new = jax.device_get(new)
    for x, y in zip(jax.tree.leaves(new.base), jax.tree.leaves(params)):
      np.testing.assert_array_equal(x, y)  # bitwise
    self.assertTrue(all(
        not np.array_equal(x, y) for x, y in zip(
            jax.tree.leaves(new.params), jax.tree.leaves(before.params))))
    # The first update starts from the base (B = 0): no KL; the second
    # sees the moved adapter against the base reference.
    self.assertGreater(float(metrics['train/kl']), 0.0)
    self.assertEqual(int(new.step), 1)

  def test_remat_keeps_the_adapter_gradients(self):
    # Under remat each block runs in a custom_vjp around jax.checkpoint
    # (decoder._after_cotangent); qwix must still find every projection's
    # adapter there, and the gradients must not change.
    graphdef, params = tiny.random_model()
    lora_graphdef, adapter = lora.attach(
        graphdef, params, lora.LoraSection(rank=4, alpha=8.0),
        jax.random.key(1))
    adapter = _randomized(adapter)
    batch = _batch(lora_graphdef, train_state_lib.policy_params(
        adapter, params))

    def grads(remat):
      loss = lambda a: logprobs.completion_logprobs(
          lora_graphdef, train_state_lib.policy_params(a, params), batch,
          remat=remat)[0].sum()
      return jax.jit(jax.grad(loss))(adapter)

    want = grads('none')
    self.assertTrue(all(np.abs(x).max() > 0 for x in jax.tree.leaves(want)))
    for remat in ('full', 'dots'):
      # The recomputed blocks fuse differently: float32 rounding (measured
      # up to 1.5e-7 on entries up to 0.37).
      for x, y in zip(jax.tree.leaves(grads(remat)), jax.tree.leaves(want)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


if __name__ == '__main__':
  absltest.main()
