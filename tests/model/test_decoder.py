"""Tests for the decoder: shapes, causality, caching, variants, presets."""

import threading
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import chex
import flax
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxgrpo.model import attention
from jaxgrpo.model import config
from jaxgrpo.model import decoder

jax.config.update('jax_numpy_rank_promotion', 'raise')

_B, _T = 2, 6
# Eager mode compiles every op separately; one jit per shape is faster.
_forward = jax.jit(decoder.forward, static_argnums=0)


def _fresh_forward():
  """`decoder.forward` jitted anew, to read a module setting that is read
  at trace time: jax keeps a function's traces by the function, so a new
  jax.jit of `decoder.forward` itself would reuse the old trace."""
  return jax.jit(lambda *args: decoder.forward(*args), static_argnums=0)  # pylint: disable=unnecessary-lambda


def _causal_inputs(batch: int = _B, length: int = _T):
  tokens = jax.random.randint(jax.random.key(1), (batch, length), 0, 64)
  positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
  mask = jnp.broadcast_to(
      jnp.tril(jnp.ones((length, length), bool)), (batch, length, length)
  )
  return tokens, positions, mask


def _num_params(params: nnx.State) -> int:
  return sum(x.size for x in jax.tree.leaves(params))


class DecoderTest(chex.TestCase, parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.cfg = config.ModelConfig.tiny()
    cls.graphdef, cls.params = decoder.init_params(cls.cfg, jax.random.key(0))

  @chex.variants(with_jit=True, without_jit=True)
  def test_shapes_and_dtypes(self):
    tokens, positions, mask = _causal_inputs()
    fn = self.variant(decoder.forward, static_argnums=0)
    logits, cache = fn(self.graphdef, self.params, tokens, positions, mask)
    chex.assert_shape(logits, (_B, _T, self.cfg.vocab_size))
    chex.assert_type(logits, jnp.float32)
    chex.assert_tree_all_finite(logits)
    self.assertIsNone(cache)

  def test_param_count_matches_config(self):
    self.assertEqual(_num_params(self.params), config.param_count(self.cfg))

  def test_params_carry_logical_axes(self):
    model = nnx.merge(self.graphdef, self.params)
    self.assertEqual(model.embedding.out_sharding, ('vocab', 'embed'))
    q = model.blocks[0].attn.q.w
    self.assertEqual(q.out_sharding, ('embed', 'heads', 'head_dim'))
    self.assertEqual(model.blocks[0].mlp.down.w.out_sharding, ('mlp', 'embed'))

  def test_builds_in_any_thread_and_leaves_flax_setting_alone(self):
    # A notebook that trains in a thread of its own: flax's eager sharding
    # setting is per thread, and on by default there (it raised 'An auto
    # mesh context or metadata is required').
    built = {}

    def build():
      try:
        built['params'] = decoder.init_params(self.cfg, jax.random.key(0))[1]
        built['abstract'] = decoder.abstract_params(self.cfg)[1]
      except Exception as e:  # pylint: disable=broad-except
        built['error'] = e

    thread = threading.Thread(target=build)
    thread.start()
    thread.join()
    self.assertNotIn('error', built)
    chex.assert_trees_all_equal(built['params'], self.params)
    self.assertEqual(nnx.using_eager_sharding(),
                     flax.config.flax_always_shard_variable)

  def test_optax_accepts_params(self):
    opt_state = optax.adam(1e-3).init(self.params)
    chex.assert_trees_all_equal_shapes(opt_state[0].mu, self.params)

  def test_causality_via_gradients(self):
    tokens, positions, mask = _causal_inputs(batch=1)
    model = nnx.merge(self.graphdef, self.params)
    x_BTD = model.embed(tokens)
    t = 2

    def logits_at_t(x_BTD):
      h_BTD, _ = model.backbone(x_BTD, positions, mask)
      return model.unembed(h_BTD)[0, t].sum()

    grad_TD = jax.jit(jax.grad(logits_at_t))(x_BTD)[0]
    influence_T = np.asarray(jnp.abs(grad_TD).sum(-1))
    np.testing.assert_array_equal(influence_T[t + 1 :], 0.0)
    self.assertTrue(np.all(influence_T[: t + 1] > 0))

  def test_cached_decode_matches_full_forward(self):
    tokens, positions, mask = _causal_inputs()
    full, _ = _forward(self.graphdef, self.params, tokens, positions, mask)
    length = _T + 2  # spare slots must stay invisible
    cache = attention.init_cache(self.cfg, _B, length)
    prefix = _T - 2
    # Query i sees cache slots 0..i.
    key_mask = jnp.arange(length)[None, None] <= jnp.arange(_T)[None, :, None]
    key_mask = jnp.broadcast_to(key_mask, (_B, _T, length))
    logits, cache = _forward(
        self.graphdef, self.params, tokens[:, :prefix], positions[:, :prefix],
        key_mask[:, :prefix], cache, jnp.int32(0),
    )
    steps = [logits]
    for i in range(prefix, _T):
      logits, cache = _forward(
          self.graphdef, self.params, tokens[:, i : i + 1],
          positions[:, i : i + 1], key_mask[:, i : i + 1], cache, jnp.int32(i),
      )
      steps.append(logits)
    chex.assert_shape(cache[0]['k'], (_B, length, 2, 16))
    np.testing.assert_allclose(
        jnp.concatenate(steps, axis=1), full, atol=1e-5, rtol=1e-5
    )

  @parameterized.parameters('broadcast', 'einsum')
  def test_decode_attention_forms_match_full_forward(self, form):
    # attention.DECODE_ATTENTION is read at trace time: a fresh jit per form.
    tokens, positions, mask = _causal_inputs()
    full, _ = _forward(self.graphdef, self.params, tokens, positions, mask)
    forward = _fresh_forward()
    cache = attention.init_cache(self.cfg, _B, _T)
    steps = []
    old, attention.DECODE_ATTENTION = attention.DECODE_ATTENTION, form
    try:
      for i in range(_T):
        key_mask = jnp.broadcast_to(jnp.arange(_T) <= i, (_B, 1, _T))
        logits, cache = forward(
            self.graphdef, self.params, tokens[:, i:i + 1],
            positions[:, i:i + 1], key_mask, cache, jnp.int32(i))
        steps.append(logits)
    finally:
      attention.DECODE_ATTENTION = old
    np.testing.assert_allclose(
        jnp.concatenate(steps, axis=1), full, atol=1e-5, rtol=1e-5)

  def test_decode_attention_form_is_checked(self):
    old, attention.DECODE_ATTENTION = attention.DECODE_ATTENTION, 'flash'
    try:
      with self.assertRaisesRegex(ValueError, 'DECODE_ATTENTION'):
        _fresh_forward()(
            self.graphdef, self.params, *(x[:, :1] for x in
                                          _causal_inputs()[:2]),
            jnp.ones((_B, 1, _T), bool), attention.init_cache(self.cfg, _B, _T),
            jnp.int32(0))
    finally:
      attention.DECODE_ATTENTION = old

  def _with_form(self, form, fn, *args, trace=jax.jit):
    """trace(fn)(*args) with attention.MULTI_TOKEN_ATTENTION = form, traced
    anew (the form is read at trace time; see `_fresh_forward`)."""
    old, attention.MULTI_TOKEN_ATTENTION = attention.MULTI_TOKEN_ATTENTION, form
    try:
      return trace(lambda *a: fn(*a))(*args)  # pylint: disable=unnecessary-lambda
    finally:
      attention.MULTI_TOKEN_ATTENTION = old

  def test_multi_token_xla_form_matches_einsum(self):
    # jax.nn.dot_product_attention's XLA form against ours, with a prefill
    # into a longer cache (S != T, a padded key and the spare slots masked),
    # forward and gradients; both in float32, so a tolerance of float
    # rounding.
    tokens, positions, _ = _causal_inputs()
    length = _T + 2
    key_mask = jnp.arange(length)[None, None] <= jnp.arange(_T)[None, :, None]
    key_mask = key_mask & (jnp.arange(length) != 1)[None, None]  # a pad key
    key_mask = key_mask | jnp.eye(_T, length, dtype=bool)[None]  # sees itself
    key_mask = jnp.broadcast_to(key_mask, (_B, _T, length))
    cache = attention.init_cache(self.cfg, _B, length)

    def loss(params):
      logits, new_cache = decoder.forward(self.graphdef, params, tokens,
                                          positions, key_mask, cache,
                                          jnp.int32(0))
      return jax.nn.log_softmax(logits)[..., 5].sum(), (logits, new_cache)

    grad = jax.value_and_grad(loss, has_aux=True)
    (_, (ref, ref_cache)), ref_g = self._with_form('einsum', grad, self.params)
    (_, (out, out_cache)), out_g = self._with_form('xla', grad, self.params)
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=2e-5)
    chex.assert_trees_all_close(out_cache, ref_cache, atol=1e-6)
    for a, b in zip(jax.tree.leaves(out_g), jax.tree.leaves(ref_g)):
      np.testing.assert_allclose(a, b, atol=1e-4 * (float(jnp.abs(b).max())
                                                    + 1e-6))
    # The two forms are different programs, not one taken twice.
    jaxpr = lambda form: str(self._with_form(
        form, lambda p: loss(p)[0], self.params, trace=jax.make_jaxpr))
    self.assertNotEqual(jaxpr('xla'), jaxpr('einsum'))

  def test_cudnn_form_falls_back_where_it_has_no_kernel(self):
    # float32 has no cuDNN kernel: the 'cudnn' form traces the einsum form
    # (on any backend), bit for bit.
    tokens, positions, mask = _causal_inputs()
    fn = lambda p: decoder.forward(self.graphdef, p, tokens, positions,
                                   mask)[0]
    chex.assert_trees_all_equal(self._with_form('cudnn', fn, self.params),
                                self._with_form('einsum', fn, self.params))
    form = attention._multi_token_form  # pylint: disable=protected-access
    q = jnp.zeros((1, 4, 4, 16), jnp.bfloat16)
    with mock.patch.object(attention, 'MULTI_TOKEN_ATTENTION', 'cudnn'):
      self.assertEqual(form(q, 6, None), 'cudnn')
      # A softcap, odd lengths, float32, a head dim without a kernel.
      for q_, s, cap in ((q, 6, 5.0), (q, 7, None), (q[:, :3], 6, None),
                         (q.astype(jnp.float32), 6, None),
                         (jnp.zeros((1, 4, 4, 12), jnp.bfloat16), 6, None)):
        self.assertEqual(form(q_, s, cap), 'einsum')

  def test_multi_token_form_is_checked(self):
    tokens, positions, mask = _causal_inputs()
    with self.assertRaisesRegex(ValueError, 'MULTI_TOKEN_ATTENTION'):
      self._with_form('flash', lambda p: decoder.forward(
          self.graphdef, p, tokens, positions, mask)[0], self.params)

  def test_live_lengths(self):
    lengths = attention.live_lengths
    with mock.patch.object(attention, 'DECODE_LIVE_BUCKETS', 8):
      self.assertEqual(lengths(64), (64,))  # at most LIVE_MIN: whole
      self.assertEqual(lengths(200), (64, 128, 192, 200))
      self.assertEqual(lengths(640), tuple(range(80, 641, 80)))
      self.assertEqual(lengths(1000), tuple(range(128, 1000, 128)) + (1000,))
    with mock.patch.object(attention, 'DECODE_LIVE_BUCKETS', 1):
      self.assertEqual(lengths(640), (640,))
    with mock.patch.object(attention, 'DECODE_LIVE_BUCKETS', 'auto'):
      self.assertLen(lengths(640), 8)  # these tests run on the CPU
    with mock.patch.object(attention, 'DECODE_LIVE_BUCKETS', 0):
      with self.assertRaisesRegex(ValueError, 'DECODE_LIVE_BUCKETS'):
        lengths(640)

  @parameterized.named_parameters(('scalar_index', False),
                                  ('per_row_index', True))
  def test_live_reads_match_whole_reads(self, per_row):
    # 130 tokens decoded one at a time into a 200-slot cache, so that the
    # steps read 64, 128 and 192 slots of it; per row, the second row sits
    # 7 slots later (its first 7 slots never written, masked), so a step
    # reads what the furthest row needs. The same logits as reading the
    # whole cache up to float rounding, and as the full forward pass.
    length, total, shift = 200, 130, 7 if per_row else 0
    tokens, positions, mask = _causal_inputs(length=total)
    full, _ = _forward(self.graphdef, self.params, tokens, positions, mask)
    offset = jnp.asarray([0, shift], jnp.int32)
    slots = jnp.arange(length)

    def decode(buckets):
      forward = _fresh_forward()
      cache = attention.init_cache(self.cfg, _B, length)
      steps = []
      with mock.patch.object(attention, 'DECODE_LIVE_BUCKETS', buckets):
        for i in range(total):
          index = offset + i if per_row else jnp.int32(i)
          seen = ((slots[None] >= offset[:, None])
                  & (slots[None] <= (offset + i)[:, None]))
          logits, cache = forward(
              self.graphdef, self.params, tokens[:, i:i + 1],
              positions[:, i:i + 1], seen[:, None], cache, index)
          steps.append(logits)
        jaxpr = str(jax.make_jaxpr(
            lambda *a: decoder.forward(self.graphdef, *a))(
                self.params, tokens[:, :1], positions[:, :1], seen[:, None],
                cache, index))
      return jnp.concatenate(steps, axis=1), jaxpr

    live, live_jaxpr = decode(8)
    whole, whole_jaxpr = decode(1)
    self.assertTrue('cond[' in live_jaxpr)  # the switch of read lengths
    self.assertFalse('cond[' in whole_jaxpr)
    np.testing.assert_allclose(live, whole, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(live, full, atol=1e-5, rtol=1e-5)

  def test_cache_requires_index(self):
    tokens, positions, mask = _causal_inputs()
    with self.assertRaisesRegex(ValueError, 'cache_index'):
      decoder.forward(
          self.graphdef, self.params, tokens, positions, mask,
          attention.init_cache(self.cfg, _B, _T),
      )

  def test_bfloat16_close_to_float32(self):
    cfg16 = config.preset('tiny', dtype='bfloat16')
    graphdef16, params16 = decoder.init_params(cfg16, jax.random.key(0))
    chex.assert_trees_all_equal(params16, self.params)  # f32 storage
    tokens, positions, mask = _causal_inputs()
    ref, _ = _forward(self.graphdef, self.params, tokens, positions, mask)
    out, _ = _forward(graphdef16, params16, tokens, positions, mask)
    chex.assert_type(out, jnp.float32)
    scale = float(jnp.abs(ref).max())
    np.testing.assert_allclose(out, ref, atol=0.05 * scale)
    self.assertGreater(float(jnp.abs(out - ref).max()), 0.0)  # really bf16

  @parameterized.parameters(True, False)
  def test_bfloat16_logits_cotangent(self, tied):
    # decoder.LOGITS_COTANGENT is read at trace time: a fresh jit per value.
    cfg16 = config.preset('tiny', dtype='bfloat16', tie_embeddings=tied)
    graphdef16, params16 = decoder.init_params(cfg16, jax.random.key(0))
    tokens, positions, mask = _causal_inputs()

    def loss(params):
      logits, _ = decoder.forward(graphdef16, params, tokens, positions, mask)
      return jax.nn.log_softmax(logits)[..., 3].mean(), logits

    results = {}
    old = decoder.LOGITS_COTANGENT
    try:
      for mode in ('compute', 'float32'):
        decoder.LOGITS_COTANGENT = mode
        results[mode] = jax.jit(jax.value_and_grad(loss, has_aux=True))(
            params16)
    finally:
      decoder.LOGITS_COTANGENT = old
    (_, low_logits), low = results['compute']
    (_, ref_logits), ref = results['float32']
    chex.assert_trees_all_equal(low_logits, ref_logits)  # same forward
    for g_low, g_ref in zip(jax.tree.leaves(low), jax.tree.leaves(ref)):
      scale = float(jnp.abs(g_ref).max()) + 1e-12
      np.testing.assert_allclose(g_low, g_ref, atol=0.02 * scale)
    diff = max(float(jnp.abs(a - b).max())
               for a, b in zip(jax.tree.leaves(low), jax.tree.leaves(ref)))
    self.assertGreater(diff, 0.0)  # the backward really ran in bfloat16

  @parameterized.named_parameters(
      ('qkv_bias', dict(qkv_bias=True), ('blocks', 0, 'attn', 'q_bias', 'b')),
      ('qk_norm', dict(qk_norm=True), ('blocks', 0, 'attn', 'k_norm', 'scale')),
      ('untied', dict(tie_embeddings=False), ('unembedding', 'w')),
      ('sandwich_norms', dict(sandwich_norms=True),
       ('blocks', 0, 'mlp_post_norm', 'scale')),
  )
  def test_variant_switch(self, overrides, path):
    cfg = config.preset('tiny', **overrides)
    graphdef, params = decoder.init_params(cfg, jax.random.key(0))
    self.assertEqual(_num_params(params), config.param_count(cfg))
    self.assertGreater(_num_params(params), _num_params(self.params))
    tokens, positions, mask = _causal_inputs()
    ref, _ = _forward(graphdef, params, tokens, positions, mask)
    # The new parameter is used: perturbing it moves the logits.
    flat = nnx.to_flat_state(params)
    flat = [
        (k, v.replace(v[...] + 0.5) if k == path else v) for k, v in flat
    ]
    out, _ = _forward(
        graphdef, nnx.from_flat_state(flat), tokens, positions, mask
    )
    self.assertGreater(float(jnp.abs(out - ref).max()), 1e-3)


_GEMMA_LIKE = dict(
    sliding_window=3, sliding_layers=(0,), rope_local_theta=100.0,
    rope_linear_factor=2.0, attn_logit_softcap=5.0, final_logit_softcap=8.0,
    query_pre_attn_scalar=24.0, norm_plus_one=True, sandwich_norms=True,
    mlp_activation='gelu_tanh', scale_embeddings=True, qk_norm=True,
)


class SlidingWindowTest(parameterized.TestCase):
  """Gemma-style options: the window, and cached decoding under it."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.cfg = config.preset('tiny', **_GEMMA_LIKE)
    cls.graphdef, cls.params = decoder.init_params(cls.cfg, jax.random.key(2))

  def test_param_count(self):
    self.assertEqual(_num_params(self.params), config.param_count(self.cfg))

  def test_window_changes_only_far_queries(self):
    tokens, positions, mask = _causal_inputs()
    windowed, _ = _forward(self.graphdef, self.params, tokens, positions, mask)
    wide = config.preset('tiny', **(_GEMMA_LIKE | dict(sliding_window=_T)))
    graphdef, _ = decoder.init_params(wide, jax.random.key(2))
    full, _ = _forward(graphdef, self.params, tokens, positions, mask)
    w = self.cfg.sliding_window
    np.testing.assert_array_equal(windowed[:, :w], full[:, :w])
    self.assertGreater(float(jnp.abs(windowed[:, w:] - full[:, w:]).max()),
                       1e-3)

  def _prefill_then_step(self, cache, length: int, prefix: int,
                         per_row: bool):
    """Logits [B, T, V] of a prefill of `prefix` tokens into `cache`, then
    one token at a time (the cache index a scalar, or one per row), and
    the final cache."""
    tokens, positions, _ = _causal_inputs()
    key_mask = jnp.arange(length)[None, None] <= jnp.arange(_T)[None, :, None]
    key_mask = jnp.broadcast_to(key_mask, (_B, _T, length))
    logits, cache = _forward(
        self.graphdef, self.params, tokens[:, :prefix], positions[:, :prefix],
        key_mask[:, :prefix], cache, jnp.int32(0),
    )
    steps = [logits]
    for i in range(prefix, _T):
      index = jnp.full((_B,), i, jnp.int32) if per_row else jnp.int32(i)
      logits, cache = _forward(
          self.graphdef, self.params, tokens[:, i : i + 1],
          positions[:, i : i + 1], key_mask[:, i : i + 1], cache, index,
      )
      steps.append(logits)
    return jnp.concatenate(steps, axis=1), cache

  @parameterized.named_parameters(('scalar_index', False),
                                  ('per_row_index', True))
  def test_cached_decode_matches_full_forward(self, per_row):
    tokens, positions, mask = _causal_inputs()
    full, _ = _forward(self.graphdef, self.params, tokens, positions, mask)
    length = _T + 2
    cache = attention.init_cache(self.cfg, _B, length)
    logits, _ = self._prefill_then_step(cache, length, 2, per_row)
    np.testing.assert_allclose(logits, full, atol=1e-5, rtol=1e-5)

  @parameterized.named_parameters(('scalar_index', False),
                                  ('per_row_index', True))
  def test_window_ring_matches_full_forward(self, per_row):
    # The local layer keeps W = 3 ring slots; a prefill of 4 tokens (more
    # than the ring), then one token at a time.
    tokens, positions, mask = _causal_inputs()
    full, _ = _forward(self.graphdef, self.params, tokens, positions, mask)
    length = _T + 2
    cache = attention.init_cache(self.cfg, _B, length, window_rings=True)
    self.assertEqual([c['k'].shape[1] for c in cache], [3, length])
    logits, cache = self._prefill_then_step(cache, length, 4, per_row)
    self.assertEqual(cache[0]['k'].shape[1], 3)
    np.testing.assert_allclose(logits, full, atol=1e-5, rtol=1e-5)


# Public parameter counts (embeddings included once when tied).
_PUBLIC_COUNTS = {
    'demo': 0.5e6,
    'small_10m': 9.5e6,
    'smollm2_135m': 134.5e6,
    'qwen2.5_0.5b': 494e6,
    'qwen3_0.6b': 596e6,
    'llama3.2_1b': 1.24e9,
    'llama3_8b': 8.03e9,
}


class PresetTest(parameterized.TestCase):

  @parameterized.parameters(*_PUBLIC_COUNTS)
  def test_abstract_params(self, name):
    cfg = config.preset(name)
    _, params = decoder.abstract_params(cfg)
    leaves = jax.tree.leaves(params)
    self.assertTrue(all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves))
    count = sum(x.size for x in leaves)
    self.assertEqual(count, config.param_count(cfg))
    self.assertAlmostEqual(count / _PUBLIC_COUNTS[name], 1.0, delta=0.01)

  def test_abstract_forward(self):
    cfg = config.preset('smollm2_135m')
    graphdef, params = decoder.abstract_params(cfg)
    tokens = jax.ShapeDtypeStruct((2, 8), jnp.int32)
    mask = jax.ShapeDtypeStruct((2, 8, 8), jnp.bool_)
    logits, _ = jax.eval_shape(
        lambda p, t, m: decoder.forward(graphdef, p, t, t, m),
        params, tokens, mask,
    )
    self.assertEqual(logits.shape, (2, 8, cfg.vocab_size))
    self.assertEqual(logits.dtype, jnp.float32)


if __name__ == '__main__':
  absltest.main()
