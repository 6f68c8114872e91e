"""Parity of Gemma 2 and Gemma 3 (text) checkpoints with transformers.

Tiny random Gemma2ForCausalLM and Gemma3ForCausalLM models, with a sliding
window shorter than the prompts and a left-padded batch, are saved, loaded
with `jaxgrpo.model.hf.load`, and must give transformers' logits on every
real position and its greedy continuations through the KV-cache generator
(whose local layers keep only the window's keys);
`hf.export` must write a checkpoint transformers reads back unchanged.
The text model of a tiny Gemma3ForConditionalGeneration (an image-text
model, as gemma-3-4b-it and larger are) loads too, its vision tower left
out, and exports as the Gemma3ForCausalLM that computes its logits.
"""

import importlib.util
import json
import os


from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo.cli import export
from jaxgrpo.generate import generator as generator_lib
from jaxgrpo.generate.sampling import Sampling
from jaxgrpo.model import hf
from jaxgrpo.model import hf_config
from jaxgrpo.model import lora
from tests.model import test_hf_parity as parity

# pylint: disable=g-import-not-at-top
if parity._HAVE_HF:
  import safetensors
  from safetensors import numpy as st_numpy
  import torch
  import transformers

_GEMMA = dict(
    sliding_window=4,
    query_pre_attn_scalar=24,
    hidden_activation='gelu_pytorch_tanh',
)
_FAMILIES = (
    ('gemma2_softcap', 'Gemma2Config',
     dict(num_hidden_layers=3, attn_logit_softcapping=2.0,
          final_logit_softcapping=3.0, rope_theta=10_000.0,
          tie_word_embeddings=True)),
    ('gemma3_local_global', 'Gemma3TextConfig',
     dict(num_hidden_layers=4, sliding_window_pattern=2,
          rope_theta=1e6, rope_local_base_freq=100.0,
          rope_scaling=dict(rope_type='linear', factor=4.0),
          tie_word_embeddings=True)),
)


def tiny_gemma(config_class, **config):
  """A tiny random transformers Gemma model of `config` (seed 3). Gemma
  norms scale by (1 + w): their w are random around zero."""
  model = parity._hf_model(config_class, seed=3, **config)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith('norm.weight'):
        p.copy_(0.2 * torch.randn_like(p))
  return model


@absltest.skipUnless(parity._HAVE_HF, parity._SKIP)
class GemmaParityTest(parity.TorchParityCase):

  def _model(self, config_class, overrides):
    return tiny_gemma(config_class, **(_GEMMA | overrides))

  @parameterized.named_parameters(*_FAMILIES)
  def test_logits_generation_and_export(self, config_class, overrides):
    model = self._model(config_class, overrides)
    src = self.create_tempdir('src').full_path
    model.save_pretrained(src, safe_serialization=True)

    cfg, graphdef, params = hf.load(src)
    self.assertNotEmpty(cfg.sliding_layers)
    self.assertLess(cfg.sliding_window, self.tokens.shape[1])
    theirs = parity._hf_logits(model, self.tokens, self.mask)
    ours = parity._logits(graphdef, params, self.tokens, self.mask)
    diff = float(np.abs(ours - theirs)[self.mask].max())
    print(f'{self._testMethodName}: max abs logit diff {diff:.3g}')
    self.assertLess(diff, 1e-4)

    with torch.no_grad():
      expected = model.generate(
          input_ids=torch.from_numpy(self.tokens).long(),
          attention_mask=torch.from_numpy(self.mask).long(),
          max_new_tokens=parity._NEW_TOKENS,
          min_new_tokens=parity._NEW_TOKENS,
          do_sample=False,
      )[:, self.tokens.shape[1]:].numpy()
    gen = generator_lib.Generator(
        graphdef=graphdef, model_cfg=cfg, sampling=Sampling(temperature=0.0),
        max_new_tokens=parity._NEW_TOKENS,
    )
    got = gen.generate(params, jnp.asarray(self.tokens),
                       jnp.asarray(self.mask), jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(got.tokens), expected)
    # The local layers decoded from rings of W slots, the global ones from
    # every one of the P + T - 1.
    state = gen.prefill(params, jnp.asarray(self.tokens),
                        jnp.asarray(self.mask), jax.random.key(0))
    total = self.tokens.shape[1] + parity._NEW_TOKENS - 1
    self.assertEqual(
        [c['k'].shape[1] for c in state.cache],
        [cfg.sliding_window if i in cfg.sliding_layers else total
         for i in range(cfg.num_layers)])

    out = hf.export(cfg, params, self.create_tempdir('out').full_path)
    reread = transformers.AutoModelForCausalLM.from_pretrained(
        out, attn_implementation='eager'
    ).eval()
    self.assertEqual(type(reread), type(model))
    np.testing.assert_array_equal(
        parity._hf_logits(reread, self.tokens, self.mask), theirs
    )

  def test_left_out_entries_are_transformers_defaults(self):
    # What a config.json without them means is what transformers reads.
    # pylint: disable-next=protected-access
    for kind, defaults in hf_config._GEMMA_DEFAULTS.items():
      config_class = transformers.AutoConfig.for_model(kind).__class__
      made = config_class().to_dict()
      self.assertEqual(defaults, {k: made[k] for k in defaults}, kind)
    gemma3 = transformers.Gemma3TextConfig().to_dict()
    self.assertIsNone(gemma3['attn_logit_softcapping'])

  def test_text_model_of_an_image_text_model(self):
    text = dict(parity._SIZES, num_hidden_layers=4, sliding_window_pattern=2,
                rope_local_base_freq=100.0,
                rope_scaling=dict(rope_type='linear', factor=4.0),
                **_GEMMA)
    text['layer_types'] = ['sliding_attention', 'full_attention'] * 2
    config = transformers.Gemma3Config(
        text_config=text, mm_tokens_per_image=4, image_token_index=127,
        vision_config=dict(hidden_size=16, intermediate_size=32,
                           num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14))
    torch.manual_seed(5)
    model = transformers.Gemma3ForConditionalGeneration(config)
    with torch.no_grad():
      for name, p in model.named_parameters():
        if name.endswith('norm.weight'):
          p.copy_(0.2 * torch.randn_like(p))
        else:
          p.normal_(0.0, 0.15)
    model.eval()
    src = self.create_tempdir('src').full_path
    model.save_pretrained(src, safe_serialization=True)
    self.assertEqual(json.load(open(os.path.join(src, 'config.json')))
                     ['model_type'], 'gemma3')

    cfg, graphdef, params = hf.load(src)
    self.assertEqual((cfg.num_layers, cfg.sliding_layers,
                      cfg.rope_linear_factor), (4, (0, 2), 4.0))
    theirs = parity._hf_logits(model, self.tokens, self.mask)
    ours = parity._logits(graphdef, params, self.tokens, self.mask)
    diff = float(np.abs(ours - theirs)[self.mask].max())
    print(f'{self._testMethodName}: max abs logit diff {diff:.3g}')
    self.assertLess(diff, 1e-4)
    self.assertEqual(hf.context_length(src), 256)

    # transformers 4.52 to 4.57 stored the text model under
    # model.language_model. and the head as lm_head.
    with safetensors.safe_open(os.path.join(src, hf._SINGLE), 'np') as f:
      arrays = {k.replace('language_model.model.', 'model.language_model.')
                .replace('vision_tower.', 'model.vision_tower.'):
                f.get_tensor(k) for k in f.keys()}
    arrays['lm_head.weight'] = arrays[
        'model.language_model.embed_tokens.weight']
    st_numpy.save_file(arrays, os.path.join(src, hf._SINGLE))
    _, _, params_452 = hf.load(src)
    np.testing.assert_array_equal(
        parity._logits(graphdef, params_452, self.tokens, self.mask), ours)

    out = hf.export(cfg, params, self.create_tempdir('out').full_path)
    reread = transformers.AutoModelForCausalLM.from_pretrained(
        out, attn_implementation='eager').eval()
    self.assertIsInstance(reread, transformers.Gemma3ForCausalLM)
    self.assertLess(float(np.abs(
        parity._hf_logits(reread, self.tokens, self.mask) - theirs
    )[self.mask].max()), 1e-4)
    self._check_peft_adapter(src, model, graphdef, params)

  def _check_peft_adapter(self, src, model, graphdef, params):
    # A LoRA run's `jaxgrpo-export --peft` on this base names the layers
    # where transformers' image-text model holds them (its language model):
    # they were named as a causal LM's, which PEFT matched to nothing, and
    # the adapted model computed the base's logits.
    section = lora.LoraSection(rank=4, alpha=8.0)
    lora_graphdef, adapter = lora.attach(graphdef, params, section,
                                         jax.random.key(0))
    rng = np.random.default_rng(1)
    adapter = jax.tree.map(lambda x: jnp.asarray(
        rng.normal(0.0, 0.1, x.shape), x.dtype), adapter)
    out = self.create_tempdir('adapter').full_path
    export._write_peft(out, adapter, section, {
        'config': {'model': {'path': src}}, 'model': {'num_layers': 4}})
    with open(os.path.join(out, 'adapter_config.json')) as f:
      targets = json.load(f)['target_modules']
    self.assertIn('model.language_model.layers.3.mlp.down_proj', targets)
    self.assertLen(targets, 4 * 7)  # full names: not the vision tower's
    if importlib.util.find_spec('peft') is None:
      return
    import peft
    adapted = peft.PeftModel.from_pretrained(model, out).eval()
    ours = parity._logits(lora_graphdef, nnx.merge_state(params, adapter),
                          self.tokens, self.mask)
    self.assertLess(float(np.abs(
        parity._hf_logits(adapted, self.tokens, self.mask) - ours
    )[self.mask].max()), 1e-4)


if __name__ == '__main__':
  absltest.main()
