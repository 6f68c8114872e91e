"""Qwen3 GGUF files load as the Hugging Face models they were converted from.

Tiny random Qwen3ForCausalLM models (a head_dim of 32 where hidden / heads
is 16, as Qwen3-0.6B has 128 where 1024 / 16 is 64; tied and untied
embeddings) are written as GGUF files the way llama.cpp's converter writes
them (conversion/qwen.py, Qwen3Model on Qwen2Model on TextModel,
ggml-org/llama.cpp commit 2bbcf7fc93a460f04d5709756a48b2408443eecb):
tensors renamed by gguf-py's own name map and otherwise untouched (no q/k
row reordering, q/k norm weights as they are), lm_head left out when tied,
`qwen3.attention.key_length` for head_dim, and the byte-level BPE
vocabulary of a Qwen2 tokenizer. jaxgrpo must build from them the config
and params its Hugging Face loader builds from the model's own folder, give
transformers' logits, train from them and export a folder transformers
reads back as the run's model.
"""

import importlib.util
import os

os.environ.setdefault('HF_HUB_OFFLINE', '1')

# pylint: disable=g-import-not-at-top
from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

from jaxgrpo import model_spec
from jaxgrpo import train
from jaxgrpo.cli import export as export_cli
from jaxgrpo.model import gguf as gguf_loader
from jaxgrpo.model import hf
from jaxgrpo.model import pretrained
from jaxgrpo.model.config import ModelConfig
from tests.model import test_gguf
from tests.model import test_gguf_parity as gguf_parity
from tests.model import test_hf_parity as parity
from tests.model import test_pretrained as pretrained_test

_HAVE_LIBS = all(importlib.util.find_spec(m) for m in (
    'torch', 'transformers', 'gguf', 'tokenizers'))
if _HAVE_LIBS:
  import gguf
  import torch
  import transformers

_SKIP = ('torch/transformers/gguf not installed: pip install torch '
         'transformers gguf tokenizers')

# head_dim 32 is not hidden_size / num_attention_heads (16).
_QWEN3 = dict(parity._SIZES, vocab_size=gguf_parity._VOCAB, hidden_size=64,
              num_attention_heads=4, num_key_value_heads=2, head_dim=32,
              rope_theta=1e6)


def _model(tied: bool, seed: int = 3):
  """A tiny random transformers Qwen3ForCausalLM, q/k norms random too."""
  return parity._hf_model('Qwen3Config', seed=seed,
                          **(_QWEN3 | dict(tie_word_embeddings=tied)))


def _convert(model, path: str, quantize: str | None = None,
             window: int | None = None) -> str:
  """Writes `model` as convert_hf_to_gguf.py's Qwen3Model would (float32
  tensors; with `quantize`, matrices of that type and norms float32, as
  llama.cpp quantizes; with `window`, a qwen3.attention.sliding_window)."""
  c = model.config
  w = gguf.GGUFWriter(path, 'qwen3')
  w.add_context_length(c.max_position_embeddings)
  w.add_embedding_length(c.hidden_size)
  w.add_block_count(c.num_hidden_layers)
  w.add_feed_forward_length(c.intermediate_size)
  w.add_head_count(c.num_attention_heads)
  w.add_head_count_kv(c.num_key_value_heads)
  w.add_rope_freq_base(_QWEN3['rope_theta'])
  w.add_layer_norm_rms_eps(c.rms_norm_eps)
  w.add_key_length(c.head_dim)
  w.add_value_length(c.head_dim)
  if window is not None:
    w.add_sliding_window(window)
  gguf_parity._add_vocab(w, gguf_parity._qwen2_tokenizer(), c.vocab_size)  # pylint: disable=protected-access
  names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3,
                                   c.num_hidden_layers)
  test_gguf.write_tensors(w, (
      (names.get_name(name, try_suffixes=('.weight',)), value.float().numpy())
      for name, value in model.state_dict().items()
      # a tied checkpoint holds no lm_head
      if not (name == 'lm_head.weight' and c.tie_word_embeddings)), quantize)
  return path


@absltest.skipUnless(_HAVE_LIBS, _SKIP)
class Qwen3GGUFTest(parity.TorchParityCase):

  def path(self, name: str = 'model.gguf') -> str:
    return os.path.join(self.create_tempdir().full_path, name)

  def assert_logits_match(self, theirs, graphdef, params):
    ours = parity._logits(graphdef, params, self.tokens, self.mask)
    diff = float(np.abs(ours - theirs)[self.mask].max())
    print(f'{self._testMethodName}: max abs logit diff {diff:.3g}')
    self.assertLess(diff, 1e-4)

  @parameterized.named_parameters(('tied', True), ('untied', False))
  def test_the_hugging_face_models_config_params_and_logits(self, tied):
    model = _model(tied)
    path = _convert(model, self.path())
    cfg, graphdef, params = gguf_loader.load(path)
    self.assertEqual((cfg.head_dim, cfg.qk_norm, cfg.qkv_bias,
                      cfg.tie_embeddings, cfg.rope_theta), (32, True, False,
                                                            tied, 1e6))
    # What the Hugging Face loader builds from the model's own folder.
    folder = self.create_tempdir('hf').full_path
    model.save_pretrained(folder)
    hf_cfg, _, hf_params = hf.load(folder)
    self.assertEqual(cfg, hf_cfg)
    for (where, ours), theirs in zip(
        jax.tree_util.tree_leaves_with_path(params),
        jax.tree.leaves(hf_params)):
      np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs),
                                    err_msg=jax.tree_util.keystr(where))
    self.assertEqual(gguf_loader.context_length(path), 256)
    self.assert_logits_match(parity._hf_logits(model, self.tokens, self.mask),
                             graphdef, params)

  def test_a_sliding_window_key_is_ignored_as_llama_cpp_ignores_it(self):
    # llama.cpp reads no qwen3.attention.sliding_window and attends to
    # every earlier position: so does the file's model here, with prompts
    # longer than the window (the transformers model it came from attends
    # to all of them too: use_sliding_window is off in Qwen3's configs).
    model = _model(tied=True, seed=6)
    plain = gguf_loader.config_from_gguf(_convert(model, self.path()))
    window = 2
    self.assertGreater(self.tokens.shape[1], window)
    path = _convert(model, self.path(), window=window)
    self.assertEqual(gguf_loader.open_reader(path).fields[
        'qwen3.attention.sliding_window'].contents(), window)
    cfg, graphdef, params = gguf_loader.load(path)
    self.assertEqual(cfg, plain)
    self.assertIsNone(cfg.sliding_window)
    self.assert_logits_match(parity._hf_logits(model, self.tokens, self.mask),
                             graphdef, params)

  def test_q8_0_file(self):
    # Qwen3-0.6B-Q8_0.gguf's layout: Q8_0 matrices, float32 norms. The file
    # holds the model whose matrices are their Q8_0 rounding.
    model = _model(tied=True, seed=4)
    path = _convert(model, self.path(), quantize='Q8_0')
    q8_0 = gguf.GGMLQuantizationType.Q8_0
    with torch.no_grad():
      for p in model.parameters():
        if p.ndim == 2:
          p.copy_(torch.from_numpy(gguf.quants.dequantize(
              gguf.quants.quantize(p.numpy(), q8_0), q8_0)))
    _, graphdef, params = gguf_loader.load(path)
    self.assert_logits_match(parity._hf_logits(model, self.tokens, self.mask),
                             graphdef, params)

  def test_a_run_from_a_qwen3_file_exports_what_it_trained(self):
    path = _convert(_model(tied=True, seed=5), self.path())
    c = pretrained_test._config(path)
    # The replies of a random model are random bytes: about half hold a
    # letter, so the groups' rewards are mixed and the steps update.
    c.data.datasets[0]['verifier'] = {'name': 'format', 'regex': r'[a-z]'}
    c.rollout.short_batch = 'train'
    c.rollout.max_prompt_len = 64  # most characters are byte tokens here
    c.optim.learning_rate = 1e-2
    c.optim.warmup_steps = 0  # the first update moves the weights
    workdir = self.create_tempdir('run').full_path
    train.run(c, workdir, log=lambda _: None)
    run = model_spec.load(f'{workdir}@2', pretrained_test._config(path))
    first = pretrained.load(path)
    self.assertGreater(max(  # training moved the weights
        float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(
            jax.tree.leaves(first.params), jax.tree.leaves(run.params))), 0)

    out = self.create_tempdir('out').full_path
    export_cli.export_run(workdir, out, log=lambda _: None)
    reread = transformers.AutoModelForCausalLM.from_pretrained(
        out, attn_implementation='eager').eval()
    self.assertIsInstance(reread, transformers.Qwen3ForCausalLM)
    self.assertEqual((reread.config.head_dim,
                      reread.config.max_position_embeddings), (32, 256))
    self.assert_logits_match(
        parity._hf_logits(reread, self.tokens, self.mask), run.graphdef,
        run.params)

  @parameterized.named_parameters(
      ('moe', 'qwen3moe', 'Qwen3 MoE'),
      ('vl', 'qwen3vl', 'Qwen3-VL'),
      ('next', 'qwen3next', 'Qwen3-Next'))
  def test_other_qwen3_architectures_are_refused(self, arch, what):
    path = test_gguf._write_gguf(self.path(), ModelConfig.tiny(), {},
                                 arch=arch)
    with self.assertRaisesRegex(
        gguf_loader.GGUFError, f"^{path}: general.architecture = '{arch}': "
        f"{what} .*is not modelled \\(only dense Qwen3, 'qwen3'\\)"):
      pretrained.load(path)


if __name__ == '__main__':
  absltest.main()
