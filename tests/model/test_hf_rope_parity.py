"""Parity of scaled RoPE ('linear', 'yarn', 'dynamic') with transformers.

Tiny random Llama, Qwen2 and Qwen3 models whose RoPE was trained for 16
positions run left-padded sequences of 40 and 23 tokens, so the rescaled
frequencies (and YaRN's scale of cos and sin) decide the logits past
position 16. jaxgrpo's logits must match transformers', greedy decoding
through the KV cache must give the same 16 tokens, and the export
must write a config.json from which transformers and `hf.load` both read
the same model back. A 'dynamic' rescaling is plain RoPE within
max_position_embeddings and is refused past it.
"""

import dataclasses
import json
import os

os.environ.setdefault('HF_HUB_OFFLINE', '1')

# pylint: disable=g-import-not-at-top
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo.generate import generator as generator_lib
from jaxgrpo.generate.sampling import Sampling
from jaxgrpo.model import decoder
from jaxgrpo.model import hf
from jaxgrpo.model import hf_config
from jaxgrpo.model import layers
from jaxgrpo.model import rope_scaling
from tests.model import test_hf_parity as parity

if parity._HAVE_HF:  # pylint: disable=protected-access
  import torch
  import transformers
  from transformers import modeling_rope_utils

_SKIP = parity._SKIP  # pylint: disable=protected-access
_TOLERANCE = 1e-4
_YARN = dict(rope_type='yarn', factor=4.0, original_max_position_embeddings=16)
_CASES = (
    ('llama_linear', 'LlamaConfig', dict(rope_type='linear', factor=4.0)),
    ('qwen2_linear_legacy_type', 'Qwen2Config',
     dict(type='linear', factor=2.5)),
    ('llama_yarn', 'LlamaConfig', _YARN),
    ('qwen2_yarn_mscale_untruncated', 'Qwen2Config',
     dict(_YARN, factor=8.0, beta_fast=8, beta_slow=0.5, mscale=1.0,
          mscale_all_dim=0.5, truncate=False)),
    ('qwen3_yarn_attention_factor', 'Qwen3Config',
     dict(_YARN, attention_factor=1.3)),
    ('llama_dynamic', 'LlamaConfig', dict(rope_type='dynamic', factor=2.0)),
    ('qwen2_dynamic', 'Qwen2Config', dict(rope_type='dynamic', factor=3.0)),
)
# A RoPE base of 100 puts YaRN's ramp inside the 8 frequencies of H=16.
_MODEL = dict(rope_theta=100.0, max_position_embeddings=64,
              tie_word_embeddings=False)
_NEW_TOKENS = 16
_RNG = np.random.default_rng(0)
_PROMPTS = (_RNG.integers(1, 128, 40).tolist(),
            _RNG.integers(1, 128, 23).tolist())


@absltest.skipUnless(parity._HAVE_HF, _SKIP)  # pylint: disable=protected-access
class ScaledRopeParityTest(parity.TorchParityCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tokens, cls.mask = parity._left_pad(_PROMPTS)  # pylint: disable=protected-access

  def _max_diff(self, ours, theirs, first=0):
    """Largest difference over real tokens from position `first` on."""
    late = self.mask & (parity._positions(self.mask) >= first)  # pylint: disable=protected-access
    return float(np.abs(ours - theirs)[late].max())

  @parameterized.named_parameters(*_CASES)
  def test_logits_and_export_match_transformers(self, config_class, rope):
    model = parity._hf_model(  # pylint: disable=protected-access
        config_class, seed=len(rope), rope_scaling=dict(rope), **_MODEL)
    src = self.create_tempdir('src').full_path
    model.save_pretrained(src, safe_serialization=True)
    cfg, graphdef, params = hf.load(src)
    kind = rope.get('rope_type', rope.get('type'))
    if kind == 'linear':
      self.assertEqual((cfg.rope_linear_factor, cfg.rope_scaling),
                       (rope['factor'], None))
    else:
      self.assertEqual(cfg.rope_scaling.rope_type, kind)

    theirs = parity._hf_logits(model, self.tokens, self.mask)  # pylint: disable=protected-access
    ours = parity._logits(graphdef, params, self.tokens, self.mask)  # pylint: disable=protected-access
    diff = self._max_diff(ours, theirs)
    self.assertLess(diff, _TOLERANCE)
    print(f'{self.id()}: max |logit difference| {diff:.2e}')
    if kind != 'dynamic':  # past position 16 the scaling matters
      plain = dataclasses.replace(cfg, rope_scaling=None,
                                  rope_linear_factor=1.0)
      plain_graphdef, _ = decoder.abstract_params(plain)
      unscaled = parity._logits(plain_graphdef, params, self.tokens,  # pylint: disable=protected-access
                                self.mask)
      self.assertGreater(self._max_diff(unscaled, theirs, first=16), 0.05)

    # Greedy decoding through the KV cache, to position 56.
    with torch.no_grad():
      expected = model.generate(
          input_ids=torch.from_numpy(self.tokens).long(),
          attention_mask=torch.from_numpy(self.mask).long(),
          max_new_tokens=_NEW_TOKENS, min_new_tokens=_NEW_TOKENS,
          do_sample=False)[:, self.tokens.shape[1]:].numpy()
    gen = generator_lib.Generator(
        graphdef=graphdef, model_cfg=cfg, sampling=Sampling(temperature=0.0),
        max_new_tokens=_NEW_TOKENS)
    got = gen.generate(params, jnp.asarray(self.tokens),
                       jnp.asarray(self.mask), jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(got.tokens), expected)

    out = hf.export(cfg, params, self.create_tempdir('out').full_path)
    written = json.loads((out / 'config.json').read_text())
    self.assertEqual(written['rope_scaling']['rope_type'], kind)
    self.assertEqual(hf.load(out)[0], cfg)
    reread = transformers.AutoModelForCausalLM.from_pretrained(
        out, attn_implementation='eager').eval()
    np.testing.assert_array_equal(
        parity._hf_logits(reread, self.tokens, self.mask), theirs)  # pylint: disable=protected-access

  def test_dynamic_past_its_length_differs_and_is_refused(self):
    rope = dict(rope_type='dynamic', factor=2.0)
    model = parity._hf_model(  # pylint: disable=protected-access
        'LlamaConfig', seed=3, rope_scaling=rope,
        **(_MODEL | dict(max_position_embeddings=32)))
    src = self.create_tempdir('src').full_path
    model.save_pretrained(src, safe_serialization=True)
    cfg, graphdef, params = hf.load(src)
    # Past 32 positions transformers raises the RoPE base (by an amount that
    # depends on the longest sequence it has run), which plain RoPE is not.
    theirs = parity._hf_logits(model, self.tokens, self.mask)  # pylint: disable=protected-access
    ours = parity._logits(graphdef, params, self.tokens, self.mask)  # pylint: disable=protected-access
    self.assertGreater(self._max_diff(ours, theirs), 0.05)
    gen = generator_lib.Generator(
        graphdef=graphdef, model_cfg=cfg, sampling=Sampling(temperature=0.0),
        max_new_tokens=8)
    with self.assertRaisesRegex(
        ValueError, 'prompt width \\+ max_new_tokens = 48 positions, more '
        "than the model's max_position_embeddings=32: its rope_scaling of "
        "type 'dynamic'"):
      gen.generate(params, jnp.asarray(self.tokens), jnp.asarray(self.mask),
                   jax.random.key(0))


@absltest.skipUnless(parity._HAVE_HF, _SKIP)  # pylint: disable=protected-access
class YarnFrequenciesTest(parameterized.TestCase):
  """YaRN's frequencies and scale at real model sizes, as transformers."""

  @parameterized.named_parameters(
      # What the Qwen2.5 and Qwen3 model cards tell users to add.
      ('qwen_card', dict(factor=4.0, original_max_position_embeddings=32768),
       1e6, 128),
      ('untruncated_mscale',
       dict(factor=16.0, original_max_position_embeddings=4096,
            beta_fast=16, beta_slow=2, mscale=0.707, mscale_all_dim=1.0,
            truncate=False), 1e4, 64),
  )
  def test_matches_transformers(self, rope, theta, head_dim):
    config = transformers.Qwen2Config(
        hidden_size=head_dim * 4, num_attention_heads=4, num_key_value_heads=4,
        head_dim=head_dim,
        max_position_embeddings=131072, rope_theta=theta,
        rope_scaling=dict(rope, rope_type='yarn'))
    inv_freq, attention_factor = modeling_rope_utils.ROPE_INIT_FUNCTIONS[
        'yarn'](config, 'cpu')
    src = self.create_tempdir().full_path
    config.save_pretrained(src)
    with open(os.path.join(src, 'config.json')) as f:
      raw = json.load(f)
    scaling = hf_config.from_hf(
        raw | dict(vocab_size=8, intermediate_size=8, num_hidden_layers=1)
    ).rope_scaling
    self.assertIsInstance(scaling, rope_scaling.YarnScaling)
    self.assertAlmostEqual(scaling.attention_factor, attention_factor,
                           places=12)
    ours = np.asarray(layers.rope_frequencies(head_dim, theta=theta,
                                              scaling=scaling))
    np.testing.assert_allclose(ours, inv_freq.numpy(), rtol=2e-7)
    plain = np.asarray(layers.rope_frequencies(head_dim, theta=theta))
    # Some frequencies are kept, some divided by factor, some blended.
    kept = np.isclose(ours, plain, rtol=1e-6)
    divided = np.isclose(ours, plain / rope['factor'], rtol=1e-6)
    self.assertTrue(kept.any() and divided.any() and (~kept & ~divided).any())


if __name__ == '__main__':
  absltest.main()
