"""GGUF files converted from Hugging Face models give transformers' logits.

Tiny random Qwen2 and Llama 3.x (llama3 RoPE scaling) models built by
transformers are written as GGUF files the way llama.cpp's
convert_hf_to_gguf.py writes them: Hugging Face's [out, in] weights under
llama.cpp's tensor names, the q/k rows of 'llama' reordered into rotary
pairs (those of 'qwen2' kept), q/k/v biases as `blk.N.attn_q.bias`, the
llama3 scaling as the per-frequency factors of `rope_freqs.weight`, and the
byte-level BPE vocabulary of a transformers `Qwen2Tokenizer` with its
token types. jaxgrpo's loader must give the logits transformers gives on the
original model, and its tokenizer the same ids.
"""

import importlib.util
import json
import math
import os

os.environ.setdefault('HF_HUB_OFFLINE', '1')

# pylint: disable=g-import-not-at-top
from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from jaxgrpo.cli import export as export_cli
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.model import gguf as gguf_loader
from jaxgrpo.model import gguf_tokenizer
from jaxgrpo.model import hf
from jaxgrpo.model import pretrained
from jaxgrpo.model.config import RopeScaling
from tests.model import test_gguf
from tests.model import test_hf_parity

_HAVE_LIBS = all(importlib.util.find_spec(m) for m in (
    'torch', 'transformers', 'gguf', 'tokenizers'))
if _HAVE_LIBS:
  import gguf
  import torch
  import transformers
  from transformers.convert_slow_tokenizer import bytes_to_unicode

_SKIP = ('torch/transformers/gguf not installed: pip install torch '
         'transformers gguf tokenizers')

_VOCAB = 320  # The model's; the tokenizer's 271 ids are padded as llama.cpp.
_SPECIALS = ['<|endoftext|>', '<|im_start|>', '<|im_end|>']
_MERGES = ['H e', 'l l', 'He ll', 'Hell o', 'Ġ w', 'o r', 'Ġw or', 'l d',
           'Ġwor ld', '1 2']
_CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + "
    "m['content'] + '<|im_end|>\\n' }}{% endfor %}"
)
# Llama 3.x's rope_scaling, with a wide interpolated band (wavelengths 128
# to 8192 at H = 32) so that short prompts see it.
_LLAMA3_ROPE = dict(rope_type='llama3', factor=32.0, low_freq_factor=1.0,
                    high_freq_factor=64.0,
                    original_max_position_embeddings=8192)
_SIZES = dict(test_hf_parity._SIZES, vocab_size=_VOCAB, hidden_size=128,
              head_dim=32)


def _qwen2_tokenizer():
  """A transformers Qwen2Tokenizer: every byte, a few merges, ChatML."""
  chars = list(bytes_to_unicode().values())
  vocab = {c: i for i, c in enumerate(chars)}
  for merge in _MERGES:
    vocab[merge.replace(' ', '')] = len(vocab)
  tokenizer = transformers.Qwen2Tokenizer(
      vocab=vocab, merges=[tuple(m.split(' ')) for m in _MERGES],
      eos_token='<|im_end|>', pad_token='<|endoftext|>')
  tokenizer.add_special_tokens({'additional_special_tokens': _SPECIALS[1:]})
  return tokenizer


def _add_vocab(w, tokenizer, size: int) -> None:
  """convert_hf_to_gguf.py's get_vocab_base and SpecialVocab for Qwen2."""
  reverse = {i: t for t, i in tokenizer.get_vocab().items()}
  added = tokenizer.added_tokens_decoder
  tokens, types = [], []
  for i in range(size):
    if i not in reverse:
      tokens.append(f'[PAD{i}]')
      types.append(gguf.TokenType.UNUSED)
      continue
    tokens.append(reverse[i])
    if i in added:
      special = added[i].special or (reverse[i].startswith('<|')
                                     and reverse[i].endswith('|>'))
      types.append(gguf.TokenType.CONTROL if special
                   else gguf.TokenType.USER_DEFINED)
    else:
      types.append(gguf.TokenType.NORMAL)
  merges = json.loads(tokenizer.backend_tokenizer.to_str())['model']['merges']
  w.add_tokenizer_model('gpt2')
  w.add_tokenizer_pre('qwen2')
  w.add_token_list(tokens)
  w.add_token_types(types)
  w.add_token_merges([m if isinstance(m, str) else ' '.join(m)
                      for m in merges])
  w.add_eos_token_id(tokenizer.convert_tokens_to_ids('<|im_end|>'))
  w.add_pad_token_id(tokenizer.convert_tokens_to_ids('<|endoftext|>'))
  w.add_bos_token_id(tokenizer.convert_tokens_to_ids('<|endoftext|>'))
  w.add_add_bos_token(False)
  w.add_chat_template(_CHATML)


def _rope_freqs(head_dim: int, theta: float, scaling: dict) -> np.ndarray:
  """convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors."""
  freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32)
                           / head_dim))
  factor = scaling['factor']
  low, high = scaling['low_freq_factor'], scaling['high_freq_factor']
  old_context_len = 8192  # hparams' original_max_position_embeddings.
  factors = []
  for freq in freqs:
    wavelen = 2 * math.pi / freq
    if wavelen < old_context_len / high:
      factors.append(1)
    elif wavelen > old_context_len / low:
      factors.append(factor)
    else:
      smooth = (old_context_len / wavelen - low) / (high - low)
      factors.append(1 / ((1 - smooth) / factor + smooth))
  return torch.tensor(factors, dtype=torch.float32).numpy()


_NAMES = {  # Hugging Face suffix: llama.cpp's, in block N.
    'input_layernorm.weight': 'attn_norm.weight',
    'post_attention_layernorm.weight': 'ffn_norm.weight',
    'self_attn.o_proj.weight': 'attn_output.weight',
    'mlp.gate_proj.weight': 'ffn_gate.weight',
    'mlp.up_proj.weight': 'ffn_up.weight',
    'mlp.down_proj.weight': 'ffn_down.weight',
    **{f'self_attn.{p}_proj.{kind}': f'attn_{p}.{kind}'
       for p in 'qkv' for kind in ('weight', 'bias')},
}


def _tensors(model, arch: str, sizes: dict) -> dict[str, np.ndarray]:
  """The model's weights under llama.cpp's names and in its row order."""
  n, k = sizes['num_attention_heads'], sizes['num_key_value_heads']
  out = {}
  for name, value in model.state_dict().items():
    value = value.float().numpy()
    if name == 'lm_head.weight':
      if not model.config.tie_word_embeddings:
        out['output.weight'] = value
    elif name == 'model.embed_tokens.weight':
      out['token_embd.weight'] = value
    elif name == 'model.norm.weight':
      out['output_norm.weight'] = value
    else:
      _, _, i, suffix = name.split('.', 3)
      if arch == 'llama' and suffix in ('self_attn.q_proj.weight',
                                        'self_attn.k_proj.weight'):
        value = test_gguf._llama_cpp_permute(value, n if 'q_' in suffix else k)
      out[f'blk.{i}.{_NAMES[suffix]}'] = value
  return out


def _convert(model, path: str, arch: str, sizes: dict, *,
             tokenizer=None, rope_freqs=None, extra=None) -> str:
  """Writes `model` as convert_hf_to_gguf.py would (float32 tensors)."""
  w = gguf.GGUFWriter(path, arch)
  w.add_context_length(sizes['max_position_embeddings'])
  w.add_embedding_length(sizes['hidden_size'])
  w.add_block_count(sizes['num_hidden_layers'])
  w.add_feed_forward_length(sizes['intermediate_size'])
  w.add_head_count(sizes['num_attention_heads'])
  w.add_head_count_kv(sizes['num_key_value_heads'])
  w.add_key_length(sizes['head_dim'])
  w.add_value_length(sizes['head_dim'])
  w.add_rope_freq_base(sizes['rope_theta'])
  w.add_layer_norm_rms_eps(sizes['rms_norm_eps'])
  if arch == 'llama':
    w.add_vocab_size(sizes['vocab_size'])
    w.add_rope_dimension_count(sizes['head_dim'])
  for key, (value, vtype) in (extra or {}).items():
    w.add_key_value(key, value, vtype)
  if tokenizer is not None:
    _add_vocab(w, tokenizer, sizes['vocab_size'])
  tensors = _tensors(model, arch, sizes)
  if rope_freqs is not None:
    tensors['rope_freqs.weight'] = rope_freqs
  test_gguf.write_tensors(w, tensors.items())
  return path


@absltest.skipUnless(_HAVE_LIBS, _SKIP)
class GGUFParityTest(test_hf_parity.TorchParityCase):

  def path(self, name: str = 'model.gguf') -> str:
    return os.path.join(self.create_tempdir().full_path, name)

  def assert_logits_match(self, model, graphdef, params):
    theirs = test_hf_parity._hf_logits(model, self.tokens, self.mask)
    ours = test_hf_parity._logits(graphdef, params, self.tokens, self.mask)
    diff = float(np.abs(ours - theirs)[self.mask].max())
    self.assertLess(diff, 1e-4)
    return theirs

  def test_qwen2_model_and_tokenizer(self):
    sizes = dict(_SIZES, rope_theta=1e6, tie_word_embeddings=True)
    model = test_hf_parity._hf_model('Qwen2Config', seed=3, **sizes)
    tokenizer = _qwen2_tokenizer()
    path = _convert(model, self.path(), 'qwen2', sizes, tokenizer=tokenizer)

    cfg, graphdef, params = gguf_loader.load(path)
    self.assertTrue(cfg.qkv_bias)
    self.assertTrue(cfg.tie_embeddings)
    self.assertIsNone(cfg.rope_scaling)
    self.assertEqual(gguf_loader.context_length(path), 256)
    self.assert_logits_match(model, graphdef, params)
    # transformers' own GGUF loader reads the file as the same model, so
    # the file is laid out as llama.cpp's (its q/k rows not reordered).
    again = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path),
        attn_implementation='eager').eval()
    self.assert_logits_match(again, graphdef, params)

    ours, info = gguf_tokenizer.tokenizer_parts(path)
    for text in ('Hello world', "<|im_start|>user\nHe's 12345 world<|im_end|>"
                 '\n<|im_start|>assistant\n', 'cafe\u0301  naïve 🚀\r\n\n\ttabs',
                 "HELLO'S 1 2 12 <|endoftext|>"):
      expected = tokenizer(text, add_special_tokens=False)['input_ids']
      self.assertEqual(ours.encode(text).ids, expected, text)
      self.assertEqual(ours.decode(expected, skip_special_tokens=False),
                       tokenizer.decode(expected))
    ids = ours.encode('<|im_start|>Hello 12<|im_end|>').ids
    self.assertEqual(ours.id_to_token(ids[0]), '<|im_start|>')
    self.assertEqual(ids[-1], info['eos_id'])
    self.assertEqual(ours.decode(ids), 'Hello 12')
    pad, eos = tokenizer.convert_tokens_to_ids(['<|endoftext|>',
                                                '<|im_end|>'])
    self.assertEqual(info, dict(bos_id=pad, eos_id=eos, pad_id=pad,
                                chat_template=_CHATML, add_bos=False,
                                add_eos=False, stop_ids=()))

  def test_sentencepiece_tokenizer_encodes_as_transformers_gguf_reader(self):
    # An older Llama 2-style file, without tokenizer.ggml.add_bos_token:
    # transformers' GGUF reader puts a BOS first, as llama.cpp does, and
    # both read the text into the same pieces, but for the space llama.cpp
    # puts before text that starts with one or follows a special token.
    path = test_gguf.write_spm_gguf(self.path('spm.gguf'))
    theirs = transformers.AutoTokenizer.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path))
    ours = pretrained.load_tokenizer(path)
    out = self.create_tempdir('out').full_path
    export_cli._write_tokenizer(ours, out)  # pylint: disable=protected-access
    exported = transformers.AutoTokenizer.from_pretrained(out)
    for text, same in (('hello world', True), ('hello  world\n', True),
                       ('h\xe9llo 🚀', True), ('', True),
                       (' hello', False), ('hello</s>world', False)):
      ids = tokenizer_lib.prompt_ids(ours, text)
      self.assertEqual(ids[:1], [1])
      self.assertEqual(theirs(text)['input_ids'] == ids, same, text)
      # The export reads back in transformers as the run encoded.
      self.assertEqual(exported(text)['input_ids'], ids, text)
      self.assertEqual(ours.backend.decode(ids),
                       theirs.decode(ids, skip_special_tokens=True))

  def test_llama3_rope_freqs(self):
    sizes = dict(_SIZES, rope_theta=10_000.0, tie_word_embeddings=False,
                 rope_scaling=_LLAMA3_ROPE, max_position_embeddings=32768)
    model = test_hf_parity._hf_model('LlamaConfig', seed=4, **sizes)
    freqs = _rope_freqs(32, 10_000.0, _LLAMA3_ROPE)
    self.assertTrue(np.any((freqs > 1) & (freqs < 32)))  # The band is seen.
    path = _convert(model, self.path(), 'llama', sizes, rope_freqs=freqs)

    cfg, graphdef, params = gguf_loader.load(path)
    self.assertEqual(cfg.rope_scaling, RopeScaling(
        factor=32.0, low_freq_factor=1.0, high_freq_factor=64.0,
        original_max_position_embeddings=8192))
    theirs = self.assert_logits_match(model, graphdef, params)
    # Plain RoPE on the same weights is visibly off: the scaling matters.
    plain = test_hf_parity._hf_model(
        'LlamaConfig', seed=4, **dict(sizes, rope_scaling=None))
    self.assertGreater(float(np.abs(
        test_hf_parity._hf_logits(plain, self.tokens, self.mask) - theirs
    )[self.mask].max()), 1e-2)

    # A Hugging Face export keeps the scaling and the weights.
    out = hf.export(cfg, params, self.create_tempdir('out').full_path)
    reread = transformers.AutoModelForCausalLM.from_pretrained(
        out, attn_implementation='eager').eval()
    np.testing.assert_allclose(
        test_hf_parity._hf_logits(reread, self.tokens, self.mask), theirs,
        atol=1e-4)

  @parameterized.named_parameters(('llama_3_2', 64, 32.0),
                                  ('llama_3_1', 128, 8.0))
  def test_llama3_factors_read_back_as_its_parameters(self, head_dim, factor):
    scaling = dict(factor=factor, low_freq_factor=1.0, high_freq_factor=4.0)
    sizes = dict(_SIZES, head_dim=head_dim, num_attention_heads=128 // head_dim,
                 num_key_value_heads=1, rope_theta=500_000.0,
                 tie_word_embeddings=True)
    model = test_hf_parity._hf_model('LlamaConfig', seed=5, **sizes)
    path = _convert(model, self.path(), 'llama', sizes,
                    rope_freqs=_rope_freqs(head_dim, 500_000.0, scaling))
    self.assertEqual(
        gguf_loader.config_from_gguf(path).rope_scaling,
        RopeScaling(original_max_position_embeddings=8192, **scaling))

  def test_qwen2_export_keeps_biases(self):
    sizes = dict(_SIZES, rope_theta=1e6, tie_word_embeddings=True)
    model = test_hf_parity._hf_model('Qwen2Config', seed=6, **sizes)
    tokenizer = _qwen2_tokenizer()
    path = _convert(model, self.path(), 'qwen2', sizes, tokenizer=tokenizer)
    loaded = pretrained.load(path)
    self.assertEqual(loaded.context, 256)
    theirs = self.assert_logits_match(model, loaded.graphdef, loaded.params)
    out = hf.export(loaded.cfg, loaded.params,
                    self.create_tempdir('out').full_path)
    export_cli._write_tokenizer(loaded.tokenizer, out)  # pylint: disable=protected-access
    reread = transformers.AutoModelForCausalLM.from_pretrained(
        out, attn_implementation='eager').eval()
    self.assertEqual(type(reread), type(model))
    np.testing.assert_allclose(
        test_hf_parity._hf_logits(reread, self.tokens, self.mask), theirs,
        atol=1e-4)
    # generate stops where jaxgrpo's generator does: at EOS and at the end
    # of a turn (config.json's EOS alone left <|im_end|> out).
    self.assertLen(loaded.tokenizer.stop_ids, 2)
    self.assertEqual(reread.generation_config.eos_token_id,
                     list(loaded.tokenizer.stop_ids))
    text = "<|im_start|>user\ncafe\u0301 He's 12 world<|im_end|>"
    self.assertEqual(
        transformers.AutoTokenizer.from_pretrained(out)(
            text, add_special_tokens=False)['input_ids'],
        tokenizer(text, add_special_tokens=False)['input_ids'])

  def test_factors_no_llama3_scaling_gives(self):
    sizes = dict(_SIZES, rope_theta=10_000.0, tie_word_embeddings=True)
    model = test_hf_parity._hf_model('LlamaConfig', seed=7, **sizes)
    freqs = _rope_freqs(32, 10_000.0, _LLAMA3_ROPE)
    for bad in (freqs[::-1].copy(), np.full(16, 0.5, np.float32),
                np.ones(8, np.float32)):
      path = _convert(model, self.path(), 'llama', sizes, rope_freqs=bad)
      with self.assertRaisesRegex(gguf_loader.GGUFError,
                                  f'^{path}: tensor rope_freqs.weight '):
        gguf_loader.load(path)

  def test_other_rope_scaling_types_are_refused(self):
    sizes = dict(_SIZES, rope_theta=1e6, tie_word_embeddings=True)
    model = test_hf_parity._hf_model('Qwen2Config', seed=8, **sizes)
    extra = {'qwen2.rope.scaling.type': ('yarn', gguf.GGUFValueType.STRING),
             'qwen2.rope.scaling.factor': (4.0, gguf.GGUFValueType.FLOAT32)}
    path = _convert(model, self.path(), 'qwen2', sizes, extra=extra)
    with self.assertRaisesRegex(
        gguf_loader.GGUFError, f"^{path}: qwen2.rope.scaling.type = 'yarn' "
        'is not supported'):
      gguf_loader.load(path)


if __name__ == '__main__':
  absltest.main()
