"""Gemma 2 / Gemma 3 config.json <-> ModelConfig, without transformers."""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized

from jaxgrpo.model import hf_config
from jaxgrpo.model.hf_config import CheckpointError

_BASE = dict(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
    num_attention_heads=2, num_key_value_heads=1, head_dim=16,
    hidden_activation='gelu_pytorch_tanh', query_pre_attn_scalar=16,
    sliding_window=8,
)


class GemmaConfigTest(parameterized.TestCase):

  def test_gemma2_defaults_alternate_layers(self):
    cfg = hf_config.from_hf(_BASE | dict(
        model_type='gemma2', attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0, rope_theta=10_000.0))
    self.assertEqual(cfg.sliding_layers, (0, 2, 4))
    self.assertEqual((cfg.attn_logit_softcap, cfg.final_logit_softcap),
                     (50.0, 30.0))
    self.assertTrue(cfg.tie_embeddings and cfg.norm_plus_one
                    and cfg.sandwich_norms and cfg.scale_embeddings)
    self.assertFalse(cfg.qk_norm)
    self.assertEqual(hf_config.from_hf(hf_config.to_hf(cfg)), cfg)

  def test_gemma3_legacy_rope_keys(self):
    cfg = hf_config.from_hf(_BASE | dict(
        model_type='gemma3_text', rope_theta=1e6, rope_local_base_freq=1e4,
        rope_scaling=dict(rope_type='linear', factor=8.0)))
    self.assertEqual(cfg.sliding_layers, (0, 1, 2, 3, 4))
    self.assertEqual(
        (cfg.rope_theta, cfg.rope_local_theta, cfg.rope_linear_factor),
        (1e6, 1e4, 8.0))
    self.assertTrue(cfg.qk_norm)
    out = hf_config.to_hf(cfg)
    self.assertEqual(out['architectures'], ['Gemma3ForCausalLM'])
    self.assertEqual(hf_config.from_hf(out), cfg)

  @parameterized.named_parameters(
      ('activation', dict(hidden_activation='relu'), 'hidden_activation'),
      ('bidirectional', dict(use_bidirectional_attention=True),
       'use_bidirectional_attention'),
      ('layer_types', dict(layer_types=['chunked_attention'] * 6),
       'layer_types'),
      ('local_rope', dict(rope_parameters=dict(
          full_attention=dict(rope_type='default', rope_theta=1e6),
          sliding_attention=dict(rope_type='yarn', rope_theta=1e4))),
       'sliding-attention RoPE'),
  )
  def test_unsupported_is_named(self, overrides, key):
    with self.assertRaisesRegex(CheckpointError, key):
      hf_config.from_hf(_BASE | dict(model_type='gemma3_text') | overrides)

  def test_partly_gemma_config_does_not_export(self):
    cfg = hf_config.from_hf(_BASE | dict(model_type='gemma2'))
    with self.assertRaisesRegex(ValueError, 'partly Gemma'):
      hf_config.to_hf(dataclasses.replace(cfg, sandwich_norms=False))


if __name__ == '__main__':
  absltest.main()
