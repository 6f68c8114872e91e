"""Tests for Hugging Face config parsing, checkpoint loading and export.

Checkpoint directories are written with `hf.export` or by hand with
`safetensors.numpy`; nothing here needs torch or transformers (see
test_hf_parity.py for the comparison with transformers itself).
"""

import dataclasses
import importlib.util
import json
import math
import os
import shutil

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo.model import config
from jaxgrpo.model import decoder
from jaxgrpo.model import hf
from jaxgrpo.model import hf_config
from jaxgrpo.model import layers
from jaxgrpo.model import rope_scaling

_HAVE_SAFETENSORS = importlib.util.find_spec('safetensors') is not None
if _HAVE_SAFETENSORS:
  # pylint: disable-next=g-import-not-at-top
  from safetensors import numpy as st_numpy

_LLAMA = dict(
    model_type='llama',
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    rope_theta=500_000.0,
    tie_word_embeddings=True,
)
_YARN_SCALING = dict(
    rope_type='yarn', factor=4.0, original_max_position_embeddings=16)
_LLAMA3_SCALING = dict(
    rope_type='llama3',
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=8192,
)


def _flat(params: nnx.State) -> dict[str, np.ndarray]:
  return {
      '.'.join(map(str, path)): np.asarray(var.get_value())
      for path, var in nnx.to_flat_state(params)
  }


def _random_params(cfg: config.ModelConfig, seed: int = 0) -> nnx.State:
  """Params with every value random (norm scales and biases included)."""
  rng = np.random.default_rng(seed)
  _, abstract = decoder.abstract_params(cfg)
  return nnx.from_flat_state([
      (path, var.replace(jnp.asarray(
          rng.normal(size=var.shape).astype(var.dtype))))
      for path, var in nnx.to_flat_state(abstract)
  ])


def _cfg(**overrides) -> config.ModelConfig:
  return dataclasses.replace(
      config.ModelConfig.tiny(vocab_size=40), **(dict(mlp_dim=96) | overrides)
  )


class ConfigFromHFTest(parameterized.TestCase):

  def test_llama_with_legacy_rope_scaling(self):
    cfg = hf_config.from_hf(_LLAMA | dict(rope_scaling=_LLAMA3_SCALING))
    self.assertEqual(
        cfg,
        config.ModelConfig(
            vocab_size=128, num_layers=2, embed_dim=64, num_heads=4,
            num_kv_heads=2, head_dim=16, mlp_dim=96, rope_theta=500_000.0,
            norm_eps=1e-5, tie_embeddings=True,
            rope_scaling=config.RopeScaling(
                factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                original_max_position_embeddings=8192,
            ),
        ),
    )

  def test_rope_parameters_of_transformers_5(self):
    raw = dict(_LLAMA)
    del raw['rope_theta']
    raw['rope_parameters'] = dict(_LLAMA3_SCALING, rope_theta=1e6)
    cfg = hf_config.from_hf(raw)
    self.assertEqual(cfg.rope_theta, 1e6)
    self.assertEqual(cfg.rope_scaling.factor, 8.0)
    raw['rope_parameters'] = dict(rope_type='default', rope_theta=3.0)
    cfg = hf_config.from_hf(raw)
    self.assertEqual((cfg.rope_theta, cfg.rope_scaling), (3.0, None))

  def test_llama3_context_defaults_to_max_position_embeddings(self):
    scaling = dict(_LLAMA3_SCALING)
    del scaling['original_max_position_embeddings']
    cfg = hf_config.from_hf(
        _LLAMA | dict(rope_scaling=scaling, max_position_embeddings=512)
    )
    self.assertEqual(cfg.rope_scaling.original_max_position_embeddings, 512)

  def test_defaults(self):
    raw = {k: v for k, v in _LLAMA.items()
           if k not in ('num_key_value_heads', 'rope_theta',
                        'tie_word_embeddings', 'rms_norm_eps')}
    cfg = hf_config.from_hf(raw, dtype='bfloat16')
    self.assertEqual(
        (cfg.num_kv_heads, cfg.head_dim, cfg.rope_theta, cfg.norm_eps,
         cfg.tie_embeddings, cfg.dtype, cfg.param_dtype),
        (4, 16, 10_000.0, 1e-6, False, 'bfloat16', 'float32'),
    )

  @parameterized.parameters(
      ('qwen2', dict(use_sliding_window=False, sliding_window=4096),
       (True, False)),
      ('qwen3', dict(head_dim=32, attention_bias=False), (False, True)),
      ('mistral', dict(sliding_window=None), (False, False)),
  )
  def test_families(self, model_type, extra, bias_and_norm):
    cfg = hf_config.from_hf(_LLAMA | dict(model_type=model_type) | extra)
    self.assertEqual((cfg.qkv_bias, cfg.qk_norm), bias_and_norm)
    self.assertEqual(cfg.head_dim, extra.get('head_dim', 16))

  @parameterized.named_parameters(
      ('model_type', dict(model_type='gemma'), "model_type='gemma'"),
      ('missing_key', dict(hidden_size=None), "no 'hidden_size'"),
      ('rope_type', dict(rope_scaling=dict(rope_type='longrope', factor=4.0)),
       "rope_scaling.rope_type='longrope' is not supported; supported: "
       "'default', 'linear', 'dynamic', 'llama3', 'yarn'"),
      ('rope_legacy_type_key', dict(rope_scaling=dict(type='proportional')),
       "rope_type='proportional'"),
      ('rope_key_of_another_type',
       dict(rope_scaling=dict(_YARN_SCALING, low_freq_factor=1.0)),
       "rope_scaling of type 'yarn' has low_freq_factor, which transformers "
       'does not read for that type; it reads factor, '
       'original_max_position_embeddings, attention_factor, beta_fast, '
       'beta_slow, mscale, mscale_all_dim, truncate'),
      ('rope_unknown_key',
       dict(rope_parameters=dict(rope_type='linear', factor=2.0, foo=1)),
       "rope_parameters of type 'linear' has foo"),
      ('default_rope_with_factor',
       dict(rope_parameters=dict(rope_type='default', factor=2.0)),
       "rope_parameters of type 'default' has factor, which transformers "
       'does not read for that type; it reads rope_theta only'),
      ('linear_without_factor', dict(rope_scaling=dict(type='linear')),
       "rope_scaling of type 'linear' has no factor"),
      ('yarn_without_factor',
       dict(rope_scaling=dict(rope_type='yarn',
                              original_max_position_embeddings=16)),
       "rope_scaling of type 'yarn' has no factor"),
      ('yarn_without_context',
       dict(rope_scaling=dict(rope_type='yarn', factor=4.0)),
       "rope_scaling of type 'yarn' has no original_max_position_embeddings"),
      ('yarn_zero_attention_factor',
       dict(rope_scaling=dict(_YARN_SCALING, attention_factor=0.0)),
       'rope_scaling: YarnScaling.attention_factor must be > 0, got 0.0'),
      ('dynamic_without_length',
       dict(rope_scaling=dict(rope_type='dynamic', factor=2.0)),
       "rope_scaling of type 'dynamic' needs max_position_embeddings"),
      ('per_layer_rope',
       dict(rope_parameters=dict(full_attention=dict(rope_theta=1.0))),
       'rope_parameters='),
      ('llama3_without_factor',
       dict(rope_scaling=dict(rope_type='llama3', low_freq_factor=1.0,
                              high_freq_factor=4.0,
                              original_max_position_embeddings=64)),
       'no factor'),
      ('llama3_bad_factors',
       dict(rope_scaling=_LLAMA3_SCALING | dict(high_freq_factor=1.0)),
       'high_freq_factor'),
      ('partial_rotary', dict(partial_rotary_factor=0.5),
       'partial_rotary_factor=0.5'),
      ('llama_attention_bias', dict(attention_bias=True),
       'attention_bias=True'),
      ('mlp_bias', dict(mlp_bias=True), 'mlp_bias=True'),
      ('activation', dict(hidden_act='gelu'), "hidden_act='gelu'"),
      ('layer_types', dict(layer_types=['full_attention',
                                        'sliding_attention']),
       "layer_types has \\['sliding_attention'\\]"),
      ('mistral_window', dict(model_type='mistral', sliding_window=4096),
       'sliding_window=4096'),
      ('qwen2_window', dict(model_type='qwen2', use_sliding_window=True,
                            sliding_window=64, max_window_layers=1),
       'sliding_window=64'),
      ('qwen3_attention_bias', dict(model_type='qwen3', attention_bias=True),
       'attention_bias=True'),
      ('bad_shape', dict(num_key_value_heads=3), 'num_kv_heads'),
  )
  def test_unsupported_is_named(self, overrides, message):
    with self.assertRaisesRegex(hf_config.CheckpointError, message):
      hf_config.from_hf(_LLAMA | overrides)

  def test_inactive_qwen2_window_is_fine(self):
    cfg = hf_config.from_hf(_LLAMA | dict(
        model_type='qwen2', use_sliding_window=True, sliding_window=64,
        max_window_layers=2,
    ))
    self.assertTrue(cfg.qkv_bias)

  @parameterized.named_parameters(
      ('zero_heads', dict(num_attention_heads=0, head_dim=None),
       'num_attention_heads=0: must be a positive int'),
      # It said `ModelConfig.head_dim must be even for RoPE, got 7`.
      ('heads_do_not_divide', dict(hidden_size=30, num_attention_heads=4,
                                   head_dim=None),
       'hidden_size=30 is not a multiple of num_attention_heads=4, and no '
       'head_dim is given'),
      ('bool_size', dict(vocab_size=True), 'vocab_size=True: must be a'),
      ('theta_text', dict(rope_theta='abc'),
       "rope_theta='abc': must be a number"),
      ('theta_null', dict(rope_theta=None), 'rope_theta=None: must be a'),
      ('eps_text', dict(rms_norm_eps='1e-5'), "rms_norm_eps='1e-5'"),
      ('llama3_text_factor',
       dict(rope_scaling=_LLAMA3_SCALING | dict(factor='x')),
       "rope_scaling.factor='x': must be a number"),
      ('yarn_text_beta',
       dict(rope_scaling=dict(_YARN_SCALING, beta_fast='8')),
       "rope_scaling.beta_fast='8': must be a number"),
      ('yarn_text_truncate',
       dict(rope_scaling=dict(_YARN_SCALING, truncate='no')),
       "rope_scaling.truncate='no': must be true or false"),
      ('yarn_text_context',
       dict(rope_parameters=dict(_YARN_SCALING,
                                 original_max_position_embeddings='16')),
       "rope_parameters.original_max_position_embeddings='16': must be a "
       'number'),
      ('layer_types_int', dict(layer_types=3), 'layer_types=3: must be a'),
      ('qwen2_window_layers_text',
       dict(model_type='qwen2', use_sliding_window=True, sliding_window=4,
            max_window_layers='x'),
       "max_window_layers='x': must be an int"),
      # No check foresees it: the boundary still names file and error.
      ('unhashable_layer_types', dict(layer_types=[['full_attention']]),
       'malformed entry (TypeError: '),
  )
  def test_malformed_value_names_file_and_key(self, overrides, message):
    with self.assertRaises(hf_config.CheckpointError) as ctx:
      hf_config.from_hf(_LLAMA | overrides, source='/m/config.json')
    self.assertStartsWith(str(ctx.exception), '/m/config.json: ')
    self.assertIn(message, str(ctx.exception))

  def test_config_must_be_an_object(self):
    with self.assertRaisesRegex(
        hf_config.CheckpointError,
        '^/m/config.json is a JSON list; expected an object$'):
      hf_config.from_hf([_LLAMA], source='/m/config.json')

  @parameterized.named_parameters(
      ('llama3', _LLAMA3_SCALING, config.RopeScaling),
      ('yarn', _YARN_SCALING, rope_scaling.YarnScaling),
      ('dynamic', dict(rope_type='dynamic', factor=2.0),
       rope_scaling.DynamicScaling),
  )
  def test_scaled_config_is_hashable_and_json_round_trips(self, scaling,
                                                          kind):
    cfg = hf_config.from_hf(_LLAMA | dict(rope_scaling=scaling,
                                          max_position_embeddings=64))
    self.assertIsInstance(cfg.rope_scaling, kind)
    text = json.dumps(dataclasses.asdict(cfg))
    self.assertEqual(config.ModelConfig(**json.loads(text)), cfg)
    self.assertEqual(hash(config.ModelConfig(**json.loads(text))), hash(cfg))


class ScaledRopeFromHFTest(parameterized.TestCase):
  """Each rope_scaling entry is read as transformers reads it."""

  @parameterized.parameters('llama', 'qwen2', 'qwen3')
  def test_linear_is_the_linear_factor(self, model_type):
    cfg = hf_config.from_hf(_LLAMA | dict(
        model_type=model_type, rope_scaling=dict(type='linear', factor=2.5)))
    self.assertEqual((cfg.rope_linear_factor, cfg.rope_scaling), (2.5, None))
    self.assertEqual(hf_config.to_hf(cfg)['rope_scaling'],
                     dict(rope_type='linear', factor=2.5))

  def test_yarn_defaults(self):
    cfg = hf_config.from_hf(_LLAMA | dict(rope_scaling=_YARN_SCALING))
    self.assertEqual(cfg.rope_scaling, rope_scaling.YarnScaling(
        factor=4.0, original_max_position_embeddings=16, beta_fast=32.0,
        beta_slow=1.0, truncate=True,
        attention_factor=0.1 * math.log(4.0) + 1.0))

  def test_yarn_reads_every_key_as_transformers(self):
    raw = _LLAMA | dict(
        max_position_embeddings=96, original_max_position_embeddings=24,
        rope_parameters=dict(
            rope_type='yarn', rope_theta=1e4, factor=None,
            original_max_position_embeddings=16, beta_fast=0, beta_slow=2,
            mscale=0.8, mscale_all_dim=0.5, truncate=None))
    got = hf_config.from_hf(raw).rope_scaling
    # The top-level original length wins; a null factor is the ratio of
    # the lengths; a zero beta is its default; a null truncate is false.
    self.assertEqual(got.original_max_position_embeddings, 24)
    self.assertEqual(got.factor, 4.0)
    self.assertEqual((got.beta_fast, got.beta_slow, got.truncate),
                     (32.0, 2.0, False))
    self.assertAlmostEqual(got.attention_factor, (0.08 * math.log(4) + 1)
                           / (0.05 * math.log(4) + 1))
    raw['rope_parameters'] |= dict(attention_factor=1.5)
    self.assertEqual(hf_config.from_hf(raw).rope_scaling.attention_factor,
                     1.5)

  def test_dynamic_keeps_its_length(self):
    raw = _LLAMA | dict(max_position_embeddings=64,
                        rope_scaling=dict(rope_type='dynamic', factor=2.0))
    cfg = hf_config.from_hf(raw)
    self.assertEqual(cfg.rope_scaling, rope_scaling.DynamicScaling(
        factor=2.0, max_position_embeddings=64))
    written = hf_config.to_hf(cfg)
    self.assertEqual(written['rope_scaling'],
                     dict(rope_type='dynamic', factor=2.0))
    self.assertEqual(written['max_position_embeddings'], 64)

  def test_linear_factor_with_another_scaling_does_not_export(self):
    cfg = _cfg(rope_linear_factor=2.0, rope_scaling=rope_scaling.YarnScaling(
        factor=4.0, original_max_position_embeddings=16))
    with self.assertRaisesRegex(ValueError, "both a linear RoPE factor and "
                                "a 'yarn' rope_scaling"):
      hf_config.to_hf(cfg)


class RopeScalingTest(absltest.TestCase):

  def test_llama3_bands(self):
    scaling = config.RopeScaling(
        factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=64,
    )
    plain = np.asarray(layers.rope_frequencies(32, theta=10_000.0))
    scaled = np.asarray(
        layers.rope_frequencies(32, theta=10_000.0, scaling=scaling)
    )
    wavelen = 2 * np.pi / plain
    high, low = wavelen < 64 / 4, wavelen > 64 / 1
    medium = ~high & ~low
    self.assertTrue(high.any() and low.any() and medium.any())
    np.testing.assert_array_equal(scaled[high], plain[high])
    np.testing.assert_allclose(scaled[low], plain[low] / 8, rtol=1e-6)
    self.assertTrue(np.all(scaled[medium] < plain[medium]))
    self.assertTrue(np.all(scaled[medium] > plain[medium] / 8))
    # Longer wavelengths are stretched more, so the order is kept.
    self.assertTrue(np.all(np.diff(scaled) < 0))

  def test_apply_rope_uses_scaling(self):
    x = jax.random.normal(jax.random.key(0), (1, 3, 2, 32))
    positions = jnp.array([[0, 5, 900]])
    scaling = config.RopeScaling(
        factor=4.0, low_freq_factor=1.0, high_freq_factor=2.0,
        original_max_position_embeddings=16,
    )
    plain = layers.apply_rope(x, positions, theta=100.0)
    scaled = layers.apply_rope(x, positions, theta=100.0, scaling=scaling)
    np.testing.assert_allclose(scaled[:, 0], x[:, 0], rtol=1e-6)
    self.assertGreater(float(jnp.abs(scaled[:, 2] - plain[:, 2]).max()), 0.1)


@absltest.skipUnless(_HAVE_SAFETENSORS, 'pip install safetensors')
class RoundTripTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('llama_tied', dict(), 'llama', 'LlamaForCausalLM'),
      ('llama_untied_scaled',
       dict(tie_embeddings=False, rope_scaling=config.RopeScaling(
           factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
           original_max_position_embeddings=8192)),
       'llama', 'LlamaForCausalLM'),
      ('llama_linear', dict(rope_linear_factor=4.0), 'llama',
       'LlamaForCausalLM'),
      ('qwen2_yarn', dict(qkv_bias=True, rope_scaling=rope_scaling.YarnScaling(
          factor=4.0, original_max_position_embeddings=16, beta_fast=8.0,
          truncate=False, attention_factor=1.25)), 'qwen2',
       'Qwen2ForCausalLM'),
      ('qwen3_dynamic', dict(qk_norm=True,
                             rope_scaling=rope_scaling.DynamicScaling(
                                 factor=2.0, max_position_embeddings=48)),
       'qwen3', 'Qwen3ForCausalLM'),
      ('qwen2_bf16', dict(qkv_bias=True, param_dtype='bfloat16'), 'qwen2',
       'Qwen2ForCausalLM'),
      ('qwen3_untied', dict(qk_norm=True, tie_embeddings=False), 'qwen3',
       'Qwen3ForCausalLM'),
  )
  def test_export_then_load_is_exact(self, overrides, model_type, arch):
    cfg = _cfg(**overrides)
    graphdef, _ = decoder.abstract_params(cfg)
    params = _random_params(cfg, seed=1)
    out = hf.export(cfg, params, self.create_tempdir().full_path)
    self.assertEqual(sorted(os.listdir(out)),
                     ['config.json', 'model.safetensors'])
    written = json.loads((out / 'config.json').read_text())
    self.assertEqual((written['model_type'], written['architectures']),
                     (model_type, [arch]))
    self.assertEqual(written['torch_dtype'], cfg.param_dtype)

    loaded_cfg, loaded_graphdef, loaded = hf.load(out)
    self.assertEqual(loaded_cfg, cfg)
    self.assertEqual(loaded_graphdef, graphdef)
    want, got = _flat(params), _flat(loaded)
    self.assertEqual(sorted(got), sorted(want))
    for name, value in want.items():
      self.assertEqual(got[name].dtype, value.dtype, name)
      np.testing.assert_array_equal(got[name], value, err_msg=name)

  def test_hf_layout_is_out_by_in(self):
    cfg = _cfg(qkv_bias=True, tie_embeddings=False)
    params = _random_params(cfg, 2)
    out = hf.export(cfg, params, self.create_tempdir().full_path)
    tensors = st_numpy.load_file(out / 'model.safetensors')
    ours = _flat(params)
    x = np.random.default_rng(0).normal(size=(64,)).astype(np.float32)
    y = np.random.default_rng(1).normal(size=(4, 16)).astype(np.float32)
    pairs = (
        ('model.layers.1.self_attn.q_proj.weight', 'blocks.1.attn.q.w', x,
         np.einsum('D,DNH->NH', x, ours['blocks.1.attn.q.w'])),
        ('model.layers.0.self_attn.o_proj.weight', 'blocks.0.attn.o.w', y,
         np.einsum('NH,NHD->D', y, ours['blocks.0.attn.o.w'])),
        ('model.layers.0.mlp.up_proj.weight', 'blocks.0.mlp.up.w', x,
         x @ ours['blocks.0.mlp.up.w']),
        ('lm_head.weight', 'unembedding.w', x, x @ ours['unembedding.w']),
    )
    for name, _, inputs, expected in pairs:
      # A Hugging Face Linear computes inputs @ weight.T.
      np.testing.assert_allclose(
          tensors[name] @ inputs.reshape(-1), expected.reshape(-1),
          rtol=1e-5, atol=1e-5, err_msg=name,
      )
    np.testing.assert_array_equal(
        tensors['model.layers.0.self_attn.k_proj.bias'],
        ours['blocks.0.attn.k_bias.b'].reshape(-1),
    )

  def test_sharded_export_and_stale_files(self):
    cfg = _cfg(tie_embeddings=False)
    params = _random_params(cfg, 3)
    path = self.create_tempdir().full_path
    out = hf.export(cfg, params, path, max_shard_bytes=50_000)
    index = json.loads((out / hf._INDEX).read_text())
    shards = sorted(set(index['weight_map'].values()))
    self.assertGreater(len(shards), 2)
    self.assertEqual(shards[0], f'model-00001-of-{len(shards):05d}.safetensors')
    self.assertEqual(sorted(os.listdir(out)),
                     sorted(shards + ['config.json', hf._INDEX]))
    self.assertEqual(index['metadata']['total_size'],
                     sum(x.nbytes for x in _flat(params).values()))
    for shard in shards:
      self.assertLessEqual(os.path.getsize(out / shard), 50_000 + 4096)
    _, _, loaded = hf.load(out)
    np.testing.assert_array_equal(_flat(loaded)['unembedding.w'],
                                  _flat(params)['unembedding.w'])

    out = hf.export(cfg, params, path)
    self.assertEqual(sorted(os.listdir(out)),
                     ['config.json', 'model.safetensors'])

  def test_a_single_file_beside_a_stale_index_is_read_as_transformers_does(self):
    # A folder saved sharded, then whole: the index and shards stay beside
    # model.safetensors. transformers reads model.safetensors; this read
    # the index's shards, other weights, without a word.
    cfg = _cfg(tie_embeddings=False)
    path = self.create_tempdir().full_path
    hf.export(cfg, _random_params(cfg, 3), path, max_shard_bytes=50_000)
    whole = hf.export(cfg, _random_params(cfg, 4),
                      self.create_tempdir().full_path)
    shutil.copy(whole / hf._SINGLE, path)
    self.assertIn(hf._INDEX, os.listdir(path))
    _, _, loaded = hf.load(path)
    np.testing.assert_array_equal(
        _flat(loaded)['unembedding.w'],
        _flat(_random_params(cfg, 4))['unembedding.w'])

  def test_config_extra(self):
    cfg = _cfg()
    params = _random_params(cfg, 0)
    out = hf.export(
        cfg, params, self.create_tempdir().full_path,
        hf_config_extra=dict(eos_token_id=7, hidden_size=1, rope_parameters={},
                             max_position_embeddings=2048),
    )
    written = json.loads((out / 'config.json').read_text())
    self.assertEqual((written['eos_token_id'], written['hidden_size'],
                      written['max_position_embeddings']), (7, 64, 2048))
    self.assertNotIn('rope_parameters', written)

  def test_export_errors(self):
    cfg = _cfg()
    params = _random_params(cfg, 0)
    tmp = self.create_tempdir().full_path
    with self.assertRaisesRegex(ValueError, 'both q/k/v biases'):
      hf.export(_cfg(qkv_bias=True, qk_norm=True), params, tmp)
    with self.assertRaisesRegex(ValueError, 'unexpected.*unembedding'):
      untied = _random_params(_cfg(tie_embeddings=False))
      hf.export(cfg, untied, tmp)
    with self.assertRaisesRegex(
        ValueError, r'mlp.gate.w has shape \[64, 96\], .* \[64, 128\]'):
      hf.export(_cfg(mlp_dim=128), params, tmp)


@absltest.skipUnless(_HAVE_SAFETENSORS, 'pip install safetensors')
class LoadErrorTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.cfg = _cfg()
    self.params = _random_params(self.cfg)
    self.dir = hf.export(self.cfg, self.params,
                         self.create_tempdir().full_path)
    self.file = self.dir / 'model.safetensors'
    self.tensors = st_numpy.load_file(self.file)

  def _rewrite(self, tensors=None, **config_changes):
    if tensors is not None:
      st_numpy.save_file(tensors, self.file)
    if config_changes:
      path = self.dir / 'config.json'
      path.write_text(json.dumps(
          json.loads(path.read_text()) | config_changes
      ))

  def test_missing_config(self):
    os.remove(self.dir / 'config.json')
    with self.assertRaisesRegex(
        hf_config.CheckpointError, 'config.json not found'):
      hf.load(self.dir)

  def test_bad_config_names_dir_and_key(self):
    self._rewrite(model_type='phi3')
    with self.assertRaisesRegex(hf_config.CheckpointError,
                                f"{self.dir}.*model_type='phi3'"):
      hf.load(self.dir)

  def test_malformed_config_names_its_path(self):
    config_path = self.dir / 'config.json'
    config_path.write_text(json.dumps([json.loads(config_path.read_text())]))
    with self.assertRaisesRegex(hf_config.CheckpointError,
                                f'^{config_path} is a JSON list'):
      hf.load(self.dir)
    config_path.write_text(json.dumps(_LLAMA | dict(
        num_attention_heads=0)))
    with self.assertRaisesRegex(
        hf_config.CheckpointError,
        f'^{config_path}: num_attention_heads=0: must be a positive int$'):
      hf.load(self.dir)

  def test_weight_map_entries_must_be_file_names(self):
    os.rename(self.file, self.dir / 'model-00001-of-00001.safetensors')
    index = self.dir / hf._INDEX
    index.write_text(json.dumps({'weight_map': {'model.norm.weight': 5}}))
    with self.assertRaisesRegex(
        hf_config.CheckpointError,
        f"^{index}: weight_map\\['model.norm.weight'\\]=5: must be a file "
        'name'):
      hf.load(self.dir)

  def test_weights_must_be_floats(self):
    name = 'model.layers.0.mlp.up_proj.weight'
    self.tensors[name] = self.tensors[name].astype(np.int32)
    self._rewrite(self.tensors)
    with self.assertRaisesRegex(
        hf_config.CheckpointError,
        f"^{self.file}: tensor '{name}' has dtype I32; weights must be one "
        'of F16, BF16, F32, F64$'):
      hf.load(self.dir)

  def test_non_finite_weights_are_named(self):
    # Loaded without a word: the run then trained a model scoring 0.
    for dtype in (np.float32, np.float16):
      tensors = {k: v.astype(dtype) for k, v in self.tensors.items()}
      tensors['model.norm.weight'][0] = np.nan
      self._rewrite(tensors)
      with self.assertRaisesRegex(
          hf_config.CheckpointError,
          f"^{self.file}: tensor 'model.norm.weight' holds 1 NaN or "
          r'infinite values \(of 64\): the file is damaged$'):
        hf.load(self.dir)

  def test_float16_weights_load(self):
    self._rewrite({k: v.astype(np.float16) for k, v in self.tensors.items()})
    cfg, _, params = hf.load(self.dir)
    self.assertEqual(cfg.param_dtype, 'float32')
    np.testing.assert_allclose(
        _flat(params)['final_norm.scale'],
        self.tensors['model.norm.weight'], rtol=1e-3)

  def test_no_weights(self):
    os.remove(self.file)
    with self.assertRaisesRegex(
        hf_config.CheckpointError, 'no model.safetensors'):
      hf.load(self.dir)

  def test_missing_tensor(self):
    del self.tensors['model.layers.1.mlp.down_proj.weight']
    self._rewrite(self.tensors)
    with self.assertRaisesRegex(
        hf_config.CheckpointError,
        "'model.layers.1.mlp.down_proj.weight' is missing from "
        'model.safetensors'):
      hf.load(self.dir)

  def test_missing_tensor_in_shard_names_the_shard(self):
    out = hf.export(self.cfg, self.params, self.dir, max_shard_bytes=50_000)
    index = json.loads((out / hf._INDEX).read_text())
    name = 'model.layers.1.self_attn.v_proj.weight'
    shard = index['weight_map'][name]
    tensors = st_numpy.load_file(out / shard)
    del tensors[name]
    st_numpy.save_file(tensors, out / shard)
    with self.assertRaisesRegex(
        hf_config.CheckpointError, f"'{name}' is missing from {shard} "):
      hf.load(out)

  def test_shard_the_index_names_is_missing(self):
    out = hf.export(self.cfg, self.params, self.dir, max_shard_bytes=50_000)
    shard = sorted(json.loads((out / hf._INDEX).read_text())
                   ['weight_map'].values())[-1]
    os.remove(out / shard)
    with self.assertRaisesRegex(
        hf_config.CheckpointError,
        f'^{out / hf._INDEX} names {shard}, which is missing$'):
      hf.load(out)

  def test_unexpected_tensors_are_listed(self):
    self.tensors['model.layers.2.mlp.up_proj.weight'] = np.zeros(3)
    self.tensors['lm_head.bias'] = np.zeros(3)
    self._rewrite(self.tensors)
    with self.assertRaisesRegex(
        hf_config.CheckpointError,
        '2 tensors have no place.*lm_head.bias, '
        'model.layers.2.mlp.up_proj.weight'):
      hf.load(self.dir)

  def test_shape_mismatch(self):
    self._rewrite(intermediate_size=128)
    with self.assertRaisesRegex(
        hf_config.CheckpointError,
        r"model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' "
        r'has shape \[96, 64\], expected \[128, 64\]'):
      hf.load(self.dir)

  def test_tied_lm_head_must_equal_embedding(self):
    embedding = self.tensors['model.embed_tokens.weight']
    self.tensors['lm_head.weight'] = embedding.copy()
    self.tensors['model.layers.0.self_attn.rotary_emb.inv_freq'] = np.ones(8)
    self._rewrite(self.tensors)
    hf.load(self.dir)  # An equal copy (and a RoPE buffer) are fine.
    self.tensors['lm_head.weight'] = embedding + 1
    self._rewrite(self.tensors)
    with self.assertRaisesRegex(
        hf_config.CheckpointError, 'lm_head.weight differs'):
      hf.load(self.dir)

  def test_unsharded_files_without_index(self):
    os.rename(self.file, self.dir / 'weights.safetensors')
    cfg, _, params = hf.load(self.dir, param_dtype='bfloat16')
    self.assertEqual(cfg.param_dtype, 'bfloat16')
    self.assertEqual(_flat(params)['embedding'].dtype, jnp.bfloat16)

  def test_corrupt_file(self):
    self.file.write_bytes(b'not a safetensors file')
    with self.assertRaisesRegex(hf_config.CheckpointError,
                                'model.safetensors: unreadable'):
      hf.load(self.dir)


if __name__ == '__main__':
  absltest.main()
