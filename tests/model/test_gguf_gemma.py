"""Gemma 2 and Gemma 3 GGUF files give transformers' logits.

Tiny random Gemma2ForCausalLM and Gemma3ForCausalLM models (a sliding
window shorter than the prompts, so local and global layers differ; Gemma
2's softcaps; Gemma 3's q/k norms and the linear RoPE scaling of its 4B and
larger models) are written as GGUF files the way llama.cpp's converter
writes them (conversion/gemma.py, Gemma2Model and Gemma3Model, ggml-org/
llama.cpp commit 2bbcf7fc93a460f04d5709756a48b2408443eecb): tensors renamed
by gguf-py's own name map, lm_head left out, every `*norm.weight` plus one,
Gemma 3's embedding cut to its tokenizer's vocabulary, only the metadata
keys that converter writes, and a Gemma SentencePiece vocabulary. jaxgrpo
must read them as the models they came from, and export them as Hugging
Face folders transformers reads back with the same logits.
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
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.model import gguf as gguf_loader
from jaxgrpo.model import hf
from jaxgrpo.model import pretrained
from jaxgrpo.model.config import ModelConfig
from tests.model import test_gguf
from tests.model import test_hf_gemma_parity as gemma_parity
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

# A Gemma SentencePiece vocabulary as the converter writes it: <pad>, <eos>,
# <bos>, <unk>, the turn markers, the 256 byte tokens, then pieces by
# falling score. The model's embedding has 8 more (padding) rows, which
# Gemma 3's converter cuts (gemma-3: 262,208 rows, 262,144 tokens).
_SPECIALS = ['<pad>', '<eos>', '<bos>', '<unk>', '<start_of_turn>',
             '<end_of_turn>']
_PIECES = ['\u2581', 'h', 'e', 'l', 'o', 'w', 'r', 'd', 'u', 's',
           'll', 'he', 'llo', 'hello', '\u2581w', 'or', 'ld', 'us', 'er',
           'user', '\u2581hello']
_TOKENS = (_SPECIALS + [f'<0x{b:02X}>' for b in range(256)] + _PIECES)
_TYPES = [3, 3, 3, 2, 3, 3] + [6] * 256 + [1] * len(_PIECES)
_SCORES = [0.0] * 262 + [-float(i) for i in range(len(_PIECES))]
_MODEL_VOCAB = len(_TOKENS) + 8
_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ '<start_of_turn>' + "
             "m['role'] + '\\n' + m['content'] + '<end_of_turn>\\n' }}"
             '{% endfor %}')

_GEMMA = dict(parity._SIZES, vocab_size=_MODEL_VOCAB, sliding_window=4,
              hidden_activation='gelu_pytorch_tanh', tie_word_embeddings=True,
              query_pre_attn_scalar=16)  # head_dim: llama.cpp's scale
_GEMMA3_LINEAR = 8.0  # gemma-3-4b and larger: global layers only
_FAMILIES = {
    # Layers 0 and 2 local, as llama.cpp's Gemma 2 pattern.
    'gemma2': ('Gemma2Config', gguf.MODEL_ARCH.GEMMA2 if _HAVE_LIBS else None,
               dict(num_hidden_layers=3, attn_logit_softcapping=2.0,
                    final_logit_softcapping=3.0, rope_theta=10_000.0)),
    # Five local layers to one global (layer 5), as llama.cpp's Gemma 3.
    'gemma3': ('Gemma3TextConfig',
               gguf.MODEL_ARCH.GEMMA3 if _HAVE_LIBS else None,
               dict(num_hidden_layers=7, sliding_window_pattern=6,
                    rope_theta=1e6, rope_local_base_freq=10_000.0,
                    rope_scaling=dict(rope_type='linear',
                                      factor=_GEMMA3_LINEAR))),
}


def _model(arch: str):
  """A tiny random transformers model of `arch`, norms w around zero."""
  config_class, _, overrides = _FAMILIES[arch]
  return gemma_parity.tiny_gemma(config_class, **(_GEMMA | overrides))


def _add_vocab(w) -> None:
  """What `_set_vocab_sentencepiece` and SpecialVocab write for Gemma."""
  w.add_tokenizer_model('llama')
  w.add_tokenizer_pre('default')
  w.add_token_list(_TOKENS)
  w.add_token_scores(_SCORES)
  w.add_token_types(_TYPES)
  w.add_bos_token_id(2)
  w.add_eos_token_id(1)
  w.add_unk_token_id(3)
  w.add_pad_token_id(0)
  w.add_add_bos_token(True)
  w.add_add_eos_token(False)
  w.add_chat_template(_TEMPLATE)
  w.add_add_space_prefix(False)


def _convert(model, path: str, arch: str, quantize: str | None = None,
             **metadata) -> str:
  """Writes `model` as convert_hf_to_gguf.py's Gemma2Model or Gemma3Model
  would (float32 tensors; with `quantize`, matrices of that type and norms
  float32, as llama.cpp quantizes); `metadata` adds keys by (value,
  type)."""
  _, gguf_arch, overrides = _FAMILIES[arch]
  c = _GEMMA | overrides
  w = gguf.GGUFWriter(path, arch)
  w.add_context_length(c['max_position_embeddings'])
  w.add_embedding_length(c['hidden_size'])
  w.add_block_count(c['num_hidden_layers'])
  w.add_feed_forward_length(c['intermediate_size'])
  w.add_head_count(c['num_attention_heads'])
  w.add_head_count_kv(c['num_key_value_heads'])
  w.add_layer_norm_rms_eps(c['rms_norm_eps'])
  w.add_key_length(c['head_dim'])
  w.add_value_length(c['head_dim'])
  w.add_sliding_window(c['sliding_window'])
  if arch == 'gemma2':
    w.add_attn_logit_softcapping(c['attn_logit_softcapping'])
    w.add_final_logit_softcapping(c['final_logit_softcapping'])
  else:
    w.add_rope_freq_base(c['rope_theta'])
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(c['rope_scaling']['factor'])
  for key, (value, vtype) in metadata.items():
    w.add_key_value(key, value, vtype)
  _add_vocab(w)
  names = gguf.get_tensor_name_map(gguf_arch, c['num_hidden_layers'])

  def converted():
    for name, value in model.state_dict().items():
      if name == 'lm_head.weight':  # tied: the converter skips it
        continue
      value = value.float().numpy()
      if name.endswith('embed_tokens.weight'):
        value = value[:len(_TOKENS)]
      if name.endswith('norm.weight'):
        value = value + np.float32(1)
      yield names.get_name(name, try_suffixes=('.weight',)), value

  test_gguf.write_tensors(w, converted(), quantize)
  return path


@absltest.skipUnless(_HAVE_LIBS, _SKIP)
class GemmaGGUFTest(parity.TorchParityCase):

  def path(self, name: str = 'model.gguf') -> str:
    return os.path.join(self.create_tempdir().full_path, name)

  def assert_logits_match(self, theirs, graphdef, params):
    ours = parity._logits(graphdef, params, self.tokens, self.mask)
    self.assertEqual(ours.shape[-1], len(_TOKENS))
    diff = float(np.abs(ours - theirs[..., :len(_TOKENS)])[self.mask].max())
    print(f'{self._testMethodName}: max abs logit diff {diff:.3g}')
    self.assertLess(diff, 1e-4)

  @parameterized.parameters('gemma2', 'gemma3')
  def test_logits_and_export(self, arch):
    model = _model(arch)
    path = _convert(model, self.path(), arch)
    loaded = pretrained.load(path)
    cfg = loaded.cfg
    self.assertLess(cfg.sliding_window, self.tokens.shape[1])
    if arch == 'gemma2':
      self.assertEqual(cfg.sliding_layers, (0, 2))
      self.assertEqual((cfg.attn_logit_softcap, cfg.final_logit_softcap),
                       (2.0, 3.0))
    else:
      self.assertEqual(cfg.sliding_layers, (0, 1, 2, 3, 4, 6))
      self.assertEqual((cfg.rope_theta, cfg.rope_local_theta,
                        cfg.rope_linear_factor), (1e6, 1e4, _GEMMA3_LINEAR))
      self.assertTrue(cfg.qk_norm)
    self.assertEqual(loaded.context, 256)
    theirs = parity._hf_logits(model, self.tokens, self.mask)
    self.assert_logits_match(theirs, loaded.graphdef, loaded.params)

    # The Hugging Face folder jaxgrpo-export writes reads back in
    # transformers as the same model, with the tokenizer the run used.
    out = hf.export(cfg, loaded.params, self.create_tempdir('out').full_path)
    export_cli._write_tokenizer(loaded.tokenizer, out)  # pylint: disable=protected-access
    reread = transformers.AutoModelForCausalLM.from_pretrained(
        out, attn_implementation='eager').eval()
    self.assertIsInstance(reread, type(model))
    self.assert_logits_match(
        parity._hf_logits(reread, self.tokens, self.mask), loaded.graphdef,
        loaded.params)
    text = '<start_of_turn>user\nhello world<end_of_turn>'
    self.assertEqual(
        transformers.AutoTokenizer.from_pretrained(out)(text)['input_ids'],
        tokenizer_lib.prompt_ids(loaded.tokenizer, text))

  def test_q8_0_file(self):
    # gemma-3-1b-it-Q8_0.gguf's layout: Q8_0 matrices, float32 norms. The
    # file holds the model whose matrices are their Q8_0 rounding.
    model = _model('gemma3')
    path = _convert(model, self.path(), 'gemma3', quantize='Q8_0')
    q8_0 = gguf.GGMLQuantizationType.Q8_0
    with torch.no_grad():
      for p in model.parameters():
        if p.ndim == 2:
          p.copy_(torch.from_numpy(gguf.quants.dequantize(
              gguf.quants.quantize(p.numpy(), q8_0), q8_0)))
    _, graphdef, params = gguf_loader.load(path)
    self.assert_logits_match(parity._hf_logits(model, self.tokens, self.mask),
                             graphdef, params)

  def test_a_run_from_a_gemma3_file_exports_what_it_trained(self):
    path = _convert(_model('gemma3'), self.path(), 'gemma3')
    c = pretrained_test._config(path)
    # Most of this vocabulary is byte tokens: about half of the replies
    # hold a letter, so the groups' rewards are mixed and the steps update.
    c.data.datasets[0]['verifier'] = {'name': 'format', 'regex': r'[a-z]'}
    c.rollout.short_batch = 'train'
    c.rollout.max_prompt_len = 64  # digits and '?' are byte tokens here
    c.rollout.max_new_tokens = 6  # past the window of 4
    c.optim.learning_rate = 1e-2
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
    self.assertIsInstance(reread, transformers.Gemma3ForCausalLM)
    self.assertEqual(reread.config.max_position_embeddings, 256)
    self.assert_logits_match(
        parity._hf_logits(reread, self.tokens, self.mask), run.graphdef,
        run.params)

  def test_gemma2_softcaps_default_to_llama_cpps(self):
    # An older Gemma 2 file without the softcapping keys: llama.cpp's
    # defaults (src/llama-hparams.h) are Gemma 2's own, 50 and 30.
    path = test_gguf._write_gguf(
        self.path(), ModelConfig.tiny(), {}, arch='gemma2')
    cfg = gguf_loader.config_from_gguf(path)
    self.assertEqual((cfg.attn_logit_softcap, cfg.final_logit_softcap,
                      cfg.sliding_window, cfg.query_pre_attn_scalar),
                     (50.0, 30.0, 4096, 16))

  @parameterized.parameters(('gemma2', 46), ('gemma3', 62))
  def test_27b_attention_scale(self, arch, layers):
    # llama.cpp scales the 27B models' queries by 1/sqrt(D / N), which is
    # their query_pre_attn_scalar (144, 168), not 1/sqrt(H); it knows them
    # by their block count.
    uint = gguf.GGUFValueType.UINT32
    metadata = {f'{arch}.attention.key_length': (16, uint)}
    if arch == 'gemma3':
      metadata['gemma3.attention.sliding_window'] = (4, uint)
    for num_layers, scalar in ((layers, 24), (layers - 2, 16)):
      cfg = ModelConfig(vocab_size=64, num_layers=num_layers, embed_dim=96,
                        num_heads=4, num_kv_heads=2, head_dim=16, mlp_dim=32)
      path = test_gguf._write_gguf(self.path(), cfg, {}, arch=arch,
                                   metadata=metadata)
      self.assertEqual(
          gguf_loader.config_from_gguf(path).query_pre_attn_scalar, scalar)

  def test_gemma_tokenizer_adds_bos_and_no_space_prefix(self):
    path = _convert(_model('gemma3'), self.path(), 'gemma3')
    tok = pretrained.load_tokenizer(path)
    text = '<start_of_turn>user\nhello world<end_of_turn>'
    ids = tokenizer_lib.prompt_ids(tok, text)
    self.assertEqual([_TOKENS[i] for i in ids],
                     ['<bos>', '<start_of_turn>', 'user', '<0x0A>', 'hello',
                      '\u2581w', 'or', 'ld', '<end_of_turn>'])
    self.assertEqual((tok.bos_id, tok.eos_id, tok.pad_id), (2, 1, 0))
    # Replies end at <end_of_turn> too, where llama.cpp stops Gemma (the
    # file names only <eos>); an export's generation_config.json says so.
    self.assertEqual(tok.stop_ids, (1, 5))
    out = self.create_tempdir().full_path
    export_cli._write_tokenizer(tok, out)  # pylint: disable=protected-access
    self.assertEqual(transformers.GenerationConfig.from_pretrained(
        out).eos_token_id, [1, 5])
    self.assertEqual(tok.decode(ids), 'user\nhello world')

  @parameterized.named_parameters(
      ('gemma3n', 'gemma3n', {}, "general.architecture = 'gemma3n': Gemma 3n"),
      ('mmproj', 'clip', {}, "general.architecture = 'clip': it is a vision "
       'projector'),
      ('gemma3_no_window', 'gemma3', {},
       "metadata key 'gemma3.attention.sliding_window' is missing"),
      ('gemma3_yarn', 'gemma3', {
          'gemma3.attention.sliding_window': 4,
          'gemma3.rope.scaling.type': 'yarn'},
       "gemma3.rope.scaling.type = 'yarn' is not supported for gemma3"),
      ('gemma2_linear', 'gemma2', {'gemma2.rope.scaling.type': 'linear'},
       "gemma2.rope.scaling.type = 'linear' is not supported for gemma2"),
      ('gemma3_softcap', 'gemma3', {
          'gemma3.attention.sliding_window': 4,
          'gemma3.final_logit_softcapping': 30.0},
       'gemma3.final_logit_softcapping is not supported'),
  )
  def test_unsupported_variants_are_refused(self, arch, metadata, message):
    types = {int: gguf.GGUFValueType.UINT32, str: gguf.GGUFValueType.STRING,
             float: gguf.GGUFValueType.FLOAT32}
    path = test_gguf._write_gguf(
        self.path(), ModelConfig.tiny(), {}, arch=arch,
        metadata={k: (v, types[type(v)]) for k, v in metadata.items()})
    with self.assertRaisesRegex(gguf_loader.GGUFError,
                                f'^{path}: .*{message}'):
      pretrained.load(path)


if __name__ == '__main__':
  absltest.main()
