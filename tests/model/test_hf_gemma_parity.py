"""Parity of Gemma 2 and Gemma 3 (text) checkpoints with transformers.

Tiny random Gemma2ForCausalLM and Gemma3ForCausalLM models, with a sliding
window shorter than the prompts and a left-padded batch, are saved, loaded
with `jaxgrpo.model.hf.load`, and must give transformers' logits on every
real position and its greedy continuations through the KV-cache generator
(whose local layers keep only the window's keys);
`hf.export` must write a checkpoint transformers reads back unchanged.
"""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo.generate import generator as generator_lib
from jaxgrpo.generate.sampling import Sampling
from jaxgrpo.model import hf
from tests.model import test_hf_parity as parity

# pylint: disable=g-import-not-at-top
if parity._HAVE_HF:
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


@absltest.skipUnless(parity._HAVE_HF, parity._SKIP)
class GemmaParityTest(parity.TorchParityCase):

  def _model(self, config_class, overrides):
    model = parity._hf_model(config_class, seed=3, **(_GEMMA | overrides))
    # Gemma norms scale by (1 + w): random w around zero.
    with torch.no_grad():
      for name, p in model.named_parameters():
        if name.endswith('norm.weight'):
          p.copy_(0.2 * torch.randn_like(p))
    return model

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


if __name__ == '__main__':
  absltest.main()
