"""Gemma 2 / Gemma 3 config.json <-> ModelConfig, without transformers."""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized

from jaxgrpo.model import config as model_config
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

  def test_left_out_entries_take_transformers_defaults(self):
    # A config.json without them loaded as another model: no softcaps and
    # the head size (16) as the query scale, where transformers reads
    # Gemma2Config's 50 / 30 and 256 (logits 4.7 apart).
    trimmed = {k: v for k, v in _BASE.items()
               if k not in ('query_pre_attn_scalar', 'sliding_window')}
    g2 = hf_config.from_hf(trimmed | dict(model_type='gemma2'))
    self.assertEqual((g2.attn_logit_softcap, g2.final_logit_softcap,
                      g2.query_pre_attn_scalar, g2.sliding_window),
                     (50.0, 30.0, 256, 4096))
    # Stated as null, a softcap stays off.
    g2 = hf_config.from_hf(trimmed | dict(
        model_type='gemma2', attn_logit_softcapping=None))
    self.assertIsNone(g2.attn_logit_softcap)
    g3 = hf_config.from_hf(trimmed | dict(model_type='gemma3_text'))
    self.assertEqual((g3.attn_logit_softcap, g3.final_logit_softcap,
                      g3.query_pre_attn_scalar, g3.sliding_window),
                     (None, None, 256, 4096))

  def test_gemma3_attention_softcap_is_refused(self):
    # transformers' Gemma 3 reads the key but does not apply it: loaded, the
    # logits were 1.0 from transformers', and its export carried it on.
    with self.assertRaisesRegex(
        CheckpointError, r"attn_logit_softcapping=3\.0 is not supported for "
        "model_type 'gemma3_text': transformers' Gemma 3 does not apply it"):
      hf_config.from_hf(_BASE | dict(model_type='gemma3_text',
                                     attn_logit_softcapping=3.0))
    cfg = hf_config.from_hf(_BASE | dict(model_type='gemma3_text'))
    with self.assertRaisesRegex(ValueError, 'applies no attention-logit'):
      hf_config.to_hf(dataclasses.replace(cfg, attn_logit_softcap=3.0))

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
    # The export states them in both forms: a reader that knows only the
    # older entries (transformers 4) kept the defaults, losing factor 8.
    self.assertEqual(
        (out['rope_theta'], out['rope_local_base_freq'], out['rope_scaling']),
        (1e6, 1e4, dict(rope_type='linear', factor=8.0)))
    old_form = {k: v for k, v in out.items() if k != 'rope_parameters'}
    self.assertEqual(hf_config.from_hf(old_form), cfg)

  def test_presets_are_the_published_configs(self):
    # The config.json values of google/gemma-2-2b and google/gemma-3-1b-pt,
    # and their published parameter counts.
    gemma2_2b = dict(
        model_type='gemma2', vocab_size=256_000, hidden_size=2304,
        intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, rms_norm_eps=1e-6,
        hidden_activation='gelu_pytorch_tanh', query_pre_attn_scalar=256,
        sliding_window=4096, attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0, rope_theta=10_000.0)
    gemma3_1b = dict(
        model_type='gemma3_text', vocab_size=262_144, hidden_size=1152,
        intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, rms_norm_eps=1e-6,
        hidden_activation='gelu_pytorch_tanh', query_pre_attn_scalar=256,
        sliding_window=512, sliding_window_pattern=6, rope_theta=1_000_000,
        rope_local_base_freq=10_000, rope_scaling=None,
        attn_logit_softcapping=None, final_logit_softcapping=None)
    for name, published, params in (('gemma2_2b', gemma2_2b, 2_614_341_888),
                                    ('gemma3_1b', gemma3_1b, 999_885_952)):
      cfg = model_config.preset(name)
      self.assertEqual(cfg, hf_config.from_hf(published), name)
      self.assertEqual(model_config.param_count(cfg), params, name)

  def test_image_text_model_reads_its_text_config(self):
    # google/gemma-3-4b-it's config.json (vision_config shortened): its
    # text_config states only what differs from transformers' defaults.
    published = dict(
        architectures=['Gemma3ForConditionalGeneration'], model_type='gemma3',
        boi_token_index=255_999, eoi_token_index=256_000,
        eos_token_id=[1, 106], image_token_index=262_144,
        mm_tokens_per_image=256, torch_dtype='bfloat16',
        text_config=dict(
            hidden_size=2560, intermediate_size=10240,
            model_type='gemma3_text', num_hidden_layers=34,
            rope_scaling=dict(factor=8.0, rope_type='linear'),
            sliding_window=1024),
        vision_config=dict(model_type='siglip_vision_model',
                           hidden_size=1152, image_size=896))
    cfg = hf_config.from_hf(published)
    self.assertEqual(
        (cfg.vocab_size, cfg.embed_dim, cfg.mlp_dim, cfg.num_layers,
         cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
         cfg.query_pre_attn_scalar, cfg.sliding_window, cfg.rope_theta,
         cfg.rope_local_theta, cfg.rope_linear_factor, cfg.tie_embeddings),
        (262_208, 2560, 10240, 34, 8, 4, 256, 256, 1024, 1e6, 1e4, 8.0,
         True))
    self.assertEqual(cfg.sliding_layers,
                     tuple(i for i in range(34) if (i + 1) % 6))
    self.assertEqual(
        hf_config.text_config(published)['max_position_embeddings'], 131_072)
    self.assertTrue(cfg.qk_norm and cfg.scale_embeddings)

  @parameterized.named_parameters(
      ('text_model_type', dict(model_type='llama'),
       "text_config.model_type='llama' is not supported in a model_type "
       "'gemma3' config; only 'gemma3_text'"),
      ('text_value', dict(num_attention_heads=0),
       'text_config: num_attention_heads=0: must be a positive int'),
      ('text_feature', dict(use_bidirectional_attention=True),
       'text_config: use_bidirectional_attention=True is not supported'),
  )
  def test_image_text_model_errors_name_the_text_config(self, text, message):
    with self.assertRaises(CheckpointError) as ctx:
      hf_config.from_hf(dict(model_type='gemma3', text_config=_BASE | text),
                        source='/g/config.json')
    self.assertStartsWith(str(ctx.exception), f'/g/config.json: {message}')

  @parameterized.named_parameters(
      ('activation', dict(hidden_activation='relu'),
       "config.json: hidden_activation='relu' is not"),
      # A file with hidden_act only: the message named hidden_activation.
      ('act_only', dict(hidden_activation=None, hidden_act='silu'),
       "config.json: hidden_act='silu' is not supported"),
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

  @parameterized.named_parameters(
      ('zero_pattern', dict(model_type='gemma2', sliding_window_pattern=0),
       'sliding_window_pattern=0: must be a positive int'),
      ('linear_without_factor',
       dict(rope_scaling=dict(rope_type='linear')),
       "rope_scaling of type 'linear' has no factor"),
      ('text_linear_factor',
       dict(rope_scaling=dict(rope_type='linear', factor='8')),
       "rope_scaling.factor='8': must be a number"),
      ('text_full_theta', dict(rope_parameters=dict(
          full_attention=dict(rope_theta='1e6'),
          sliding_attention=dict(rope_theta=1e4))),
       "rope_parameters.full_attention.rope_theta='1e6': must be a number"),
      ('text_softcap', dict(final_logit_softcapping='30'),
       "final_logit_softcapping='30': must be a number"),
  )
  def test_malformed_value_names_file_and_key(self, overrides, message):
    with self.assertRaises(CheckpointError) as ctx:
      hf_config.from_hf(_BASE | dict(model_type='gemma3_text') | overrides,
                        source='/g/config.json')
    self.assertEqual(str(ctx.exception), f'/g/config.json: {message}')

  def test_partly_gemma_config_does_not_export(self):
    cfg = hf_config.from_hf(_BASE | dict(model_type='gemma2'))
    with self.assertRaisesRegex(ValueError, 'partly Gemma'):
      hf_config.to_hf(dataclasses.replace(cfg, sandwich_norms=False))


if __name__ == '__main__':
  absltest.main()
