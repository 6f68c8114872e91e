"""Tests for ModelConfig validation and presets."""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized

from jaxgrpo.model import config
from jaxgrpo.model import rope_scaling


class ModelConfigTest(parameterized.TestCase):

  def test_tiny(self):
    cfg = config.ModelConfig.tiny(vocab_size=40)
    self.assertEqual((cfg.num_layers, cfg.embed_dim, cfg.vocab_size),
                     (2, 64, 40))

  @parameterized.parameters(
      (dict(num_layers=0), 'num_layers'),
      (dict(embed_dim=-4), 'embed_dim'),
      (dict(vocab_size=3.5), 'vocab_size'),
      (dict(num_heads=4, num_kv_heads=3), 'num_kv_heads'),
      (dict(head_dim=15), 'head_dim'),
      (dict(rope_theta=0.0), 'rope_theta'),
      (dict(norm_eps=0.0), 'norm_eps'),
      (dict(dtype='float16'), 'dtype'),
      (dict(param_dtype='int8'), 'param_dtype'),
      (dict(sliding_layers=(0,)), 'sliding_window'),
      (dict(sliding_window=4, sliding_layers=(2,)), 'sliding_layers'),
      (dict(attn_logit_softcap=0.0), 'attn_logit_softcap'),
      (dict(rope_linear_factor=0.0), 'rope_linear_factor'),
      (dict(mlp_activation='relu'), 'mlp_activation'),
  )
  def test_invalid_field_is_named(self, overrides, field):
    with self.assertRaisesRegex(ValueError, f'ModelConfig.*{field}'):
      dataclasses.replace(config.ModelConfig.tiny(), **overrides)

  def test_rope_scaling_dicts_read_back_by_their_type(self):
    llama3 = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                  original_max_position_embeddings=64)
    # As checkpoints written before other types existed hold it.
    cfg = dataclasses.replace(config.ModelConfig.tiny(), rope_scaling=llama3)
    self.assertEqual(cfg.rope_scaling, config.RopeScaling(**llama3))
    yarn = dict(rope_type='yarn', factor=4.0,
                original_max_position_embeddings=16)
    cfg = dataclasses.replace(cfg, rope_scaling=yarn)
    self.assertEqual(cfg.rope_scaling.attention_factor,
                     rope_scaling.yarn_mscale(4.0))
    for bad, message in (
        (dict(rope_type='ntk', factor=2.0), "rope_type='ntk' is not one of"),
        (dict(rope_type='dynamic', factor=2.0),
         "missing 1 required keyword-only argument: "
         "'max_position_embeddings'"),
        (dict(llama3, rope_type='yarn'), 'unexpected keyword argument'),
        (dict(yarn, truncate='no'), 'YarnScaling.truncate must be true or '
         "false, got 'no'"),
    ):
      with self.assertRaisesRegex(ValueError,
                                  f'ModelConfig.rope_scaling .*{message}'):
        dataclasses.replace(cfg, rope_scaling=bad)

  def test_preset_overrides(self):
    cfg = config.preset('demo', vocab_size=48, dtype='bfloat16')
    self.assertEqual((cfg.vocab_size, cfg.dtype, cfg.embed_dim),
                     (48, 'bfloat16', 128))

  def test_unknown_preset_lists_names(self):
    with self.assertRaisesRegex(ValueError, 'llama3_8b'):
      config.preset('gpt5')

  def test_presets_are_valid_and_hashable(self):
    for name in config.PRESET_NAMES:
      hash(config.preset(name))

  def test_public_shapes(self):
    qwen3 = config.preset('qwen3_0.6b')
    self.assertTrue(qwen3.qk_norm and not qwen3.qkv_bias)
    self.assertEqual(qwen3.num_heads * qwen3.head_dim, 2048)
    self.assertTrue(config.preset('qwen2.5_0.5b').qkv_bias)
    self.assertFalse(config.preset('llama3_8b').tie_embeddings)
    self.assertEqual(config.preset('smollm2_135m').rope_theta, 100_000.0)


if __name__ == '__main__':
  absltest.main()
