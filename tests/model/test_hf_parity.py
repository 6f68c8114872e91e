"""Parity of Hugging Face checkpoint loading and export with transformers.

Tiny randomly initialised Llama, Qwen2 and Qwen3 models built by
transformers are saved with `save_pretrained`, loaded with
`jaxgrpo.model.hf.load`, and must give the same logits (left-padded batches
included) and the same greedy continuations; `hf.export` must write
checkpoints transformers reads back unchanged.
"""

import importlib.util
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

_HAVE_HF = all(
    importlib.util.find_spec(m) for m in ('torch', 'transformers')
)
if _HAVE_HF:
  import torch
  import transformers

_SKIP = 'torch/transformers not installed: pip install torch transformers'

_SIZES = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    max_position_embeddings=256,
    bos_token_id=1,
    eos_token_id=None,
    pad_token_id=0,
)
# Long-wavelength, medium and short RoPE frequencies all occur at H=16 with
# this context, so each branch of the llama3 rescaling is exercised.
_LLAMA3_ROPE = dict(
    rope_type='llama3',
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=32,
)
_FAMILIES = (
    ('llama_tied', 'LlamaConfig', dict(tie_word_embeddings=True)),
    ('llama3_rope_untied', 'LlamaConfig',
     dict(tie_word_embeddings=False, rope_theta=500_000.0,
          rope_scaling=_LLAMA3_ROPE)),
    ('qwen2_tied', 'Qwen2Config',
     dict(tie_word_embeddings=True, rope_theta=1e6)),
    ('qwen3_untied', 'Qwen3Config', dict(tie_word_embeddings=False)),
)
# Left-padded prompts of different lengths (0 is the pad id).
_PROMPTS = ([5, 9, 13, 7, 2, 44, 100, 3, 17, 90, 61], [11, 3, 120, 8],
            [8])
_NEW_TOKENS = 32


def _hf_model(config_class: str, seed: int, **overrides):
  """A transformers causal LM with every weight random, norms included."""
  config = getattr(transformers, config_class)(**(_SIZES | overrides))
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(
      config, attn_implementation='eager'
  )
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith('norm.weight'):
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
      else:
        p.normal_(0.0, 0.15)
  model.generation_config.eos_token_id = None
  model.generation_config.pad_token_id = 0
  return model.eval()


def _left_pad(prompts) -> tuple[np.ndarray, np.ndarray]:
  length = max(map(len, prompts))
  tokens = np.zeros((len(prompts), length), np.int32)
  mask = np.zeros((len(prompts), length), bool)
  for i, prompt in enumerate(prompts):
    tokens[i, length - len(prompt):] = prompt
    mask[i, length - len(prompt):] = True
  return tokens, mask


def _positions(mask: np.ndarray) -> np.ndarray:
  # As jaxgrpo.generate.generator: the count of real tokens before each token.
  return np.maximum(np.cumsum(mask, axis=1) - 1, 0)


def _hf_logits(model, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
  with torch.no_grad():
    return model(
        input_ids=torch.from_numpy(tokens).long(),
        attention_mask=torch.from_numpy(mask).long(),
        position_ids=torch.from_numpy(_positions(mask)).long(),
    ).logits.numpy()


@jax.jit
def _causal_padded_mask(mask_BT: jax.Array) -> jax.Array:
  t = mask_BT.shape[1]
  return jnp.tril(jnp.ones((t, t), bool))[None] & mask_BT[:, None, :]


def _logits(graphdef, params, tokens: np.ndarray, mask: np.ndarray):
  logits, _ = jax.jit(decoder.forward, static_argnums=0)(
      graphdef, params, jnp.asarray(tokens), jnp.asarray(_positions(mask)),
      _causal_padded_mask(jnp.asarray(mask)),
  )
  return np.asarray(logits)


class TorchParityCase(parameterized.TestCase):
  """The left-padded prompts as `tokens` and `mask`; torch on one thread."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tokens, cls.mask = _left_pad(_PROMPTS)
    # Tiny models: torch's intra-op threads only contend with XLA's.
    cls._torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)

  @classmethod
  def tearDownClass(cls):
    torch.set_num_threads(cls._torch_threads)
    super().tearDownClass()


@absltest.skipUnless(_HAVE_HF, _SKIP)
class HFParityTest(TorchParityCase):

  def _max_diff(self, ours: np.ndarray, theirs: np.ndarray) -> float:
    # Left-pad positions attend to nothing; only real tokens are compared.
    return float(np.abs(ours - theirs)[self.mask].max())

  @parameterized.named_parameters(*_FAMILIES)
  def test_logits_generation_and_export(self, config_class, overrides):
    model = _hf_model(config_class, seed=len(overrides), **overrides)
    src = self.create_tempdir('src').full_path
    model.save_pretrained(src, safe_serialization=True)

    cfg, graphdef, params = hf.load(src)
    self.assertEqual(cfg.tie_embeddings, overrides['tie_word_embeddings'])
    self.assertEqual(cfg.rope_scaling is not None,
                     'rope_scaling' in overrides)
    theirs = _hf_logits(model, self.tokens, self.mask)
    ours = _logits(graphdef, params, self.tokens, self.mask)
    self.assertLess(self._max_diff(ours, theirs), 1e-4)

    with torch.no_grad():
      expected = model.generate(
          input_ids=torch.from_numpy(self.tokens).long(),
          attention_mask=torch.from_numpy(self.mask).long(),
          max_new_tokens=_NEW_TOKENS,
          min_new_tokens=_NEW_TOKENS,
          do_sample=False,
      )[:, self.tokens.shape[1]:].numpy()
    gen = generator_lib.Generator(
        graphdef=graphdef, model_cfg=cfg, sampling=Sampling(temperature=0.0),
        max_new_tokens=_NEW_TOKENS,
    )
    got = gen.generate(params, jnp.asarray(self.tokens),
                       jnp.asarray(self.mask), jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(got.tokens), expected)

    out = hf.export(cfg, params, self.create_tempdir('out').full_path)
    reread = transformers.AutoModelForCausalLM.from_pretrained(
        out, attn_implementation='eager'
    ).eval()
    self.assertEqual(type(reread), type(model))
    np.testing.assert_array_equal(
        _hf_logits(reread, self.tokens, self.mask), theirs
    )

  def test_sharded_bfloat16_round_trip(self):
    model = _hf_model('Qwen3Config', seed=7, tie_word_embeddings=True)
    model = model.to(torch.bfloat16)
    src = self.create_tempdir('src').full_path
    model.save_pretrained(src, safe_serialization=True, max_shard_size='40KB')
    self.assertTrue(os.path.exists(os.path.join(src, hf._INDEX)))

    cfg, graphdef, params = hf.load(src)
    self.assertEqual(cfg.param_dtype, 'bfloat16')
    self.assertEqual(
        {x.dtype for x in jax.tree.leaves(params)}, {jnp.dtype('bfloat16')}
    )
    # A float32 reference from the same weights (casting `model` itself would
    # keep its RoPE frequency buffer rounded to bfloat16).
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        src, dtype=torch.float32, attn_implementation='eager'
    ).eval()
    ours = _logits(graphdef, params, self.tokens, self.mask)
    theirs = _hf_logits(reference, self.tokens, self.mask)
    self.assertLess(self._max_diff(ours, theirs), 1e-4)

    out = hf.export(cfg, params, self.create_tempdir('out').full_path,
                    max_shard_bytes=40_000)
    self.assertGreater(len(os.listdir(out)), 3)
    reread = transformers.AutoModelForCausalLM.from_pretrained(out)
    expected = model.state_dict()
    got = reread.state_dict()
    self.assertEqual(sorted(got), sorted(expected))
    for name, tensor in expected.items():
      self.assertEqual(got[name].dtype, torch.bfloat16, name)
      self.assertTrue(torch.equal(got[name], tensor), name)


if __name__ == '__main__':
  absltest.main()
