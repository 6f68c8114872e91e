"""Llama, Qwen2, Gemma 2 and Gemma 3 models and tokenizers from GGUF files.

GGUF is llama.cpp's single-file format: metadata (hyperparameters, the
tokenizer's vocabulary and merges, a chat template) followed by tensors,
often quantized. `load` dequantizes every tensor to float32 and places it in
the parameter tree of `jaxgrpo.model.decoder`; `tokenizer_parts` rebuilds a
`tokenizers.Tokenizer` from the metadata: byte-level BPE ('gpt2': SmolLM2,
Qwen2, Llama 3) or SentencePiece ('llama': Llama 2, Mistral, TinyLlama).

llama.cpp stores each row-major Hugging Face weight [out, in] as-is, except
that its converter reorders the rows of the query and key projections of
the 'llama' architecture so that rotary pairs are adjacent features
(2i, 2i + 1) instead of features i and i + H/2. The decoder uses the
half-split layout, so `load` undoes that reordering. 'qwen2' files keep
Hugging Face's order (llama.cpp rotates them NEOX-style, in halves) and add
q/k/v biases. Llama 3.x's RoPE scaling arrives as the per-frequency factors
of `rope_freqs.weight`, read back as the llama3 `RopeScaling` that gives
them (`jaxgrpo.model.rope_factors`). 'gemma2' and 'gemma3' files (text
models; see `_gemma`) keep Hugging Face's q/k row order too, but store each
RMSNorm weight plus one, which `load` subtracts.

Size: the model and its tokenizer are read from one file's metadata
through the same reader and field lookup (`open_reader`, `_field`), and
the four architectures share one tensor mapping (`_slots`).
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import importlib
import os
from typing import TYPE_CHECKING, Any, Union

from flax import nnx
import jax
import numpy as np

from jaxgrpo import errors
from jaxgrpo.model import decoder
from jaxgrpo.model import rope_factors
from jaxgrpo.model.config import ModelConfig
from jaxgrpo.model.config import RopeScaling

if TYPE_CHECKING:
  import gguf
  import tokenizers

# general.architecture values: the ones whose q/k rows llama.cpp reorders
# (see above), and those it stores as Hugging Face does, with q/k/v biases.
_PERMUTED, _BIASED = ('llama',), ('qwen2',)
# Gemma 2 and Gemma 3 (text): Hugging Face's q/k order, (1 + w) norms.
_GEMMA = ('gemma2', 'gemma3')
_ARCHITECTURES = _PERMUTED + _BIASED + _GEMMA
# Architectures llama.cpp writes for files that hold no causal LM the
# decoder models, and what to load instead.
_NOT_TEXT = {
    'clip': 'it is a vision projector (mmproj) file; model.path takes the '
            'text model\'s .gguf',
    'gemma3n': 'Gemma 3n (per-layer embeddings, AltUp) is not modelled',
}

_ROPE_FREQS = 'rope_freqs.weight'

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
_UNKNOWN, _CONTROL, _USER_DEFINED, _BYTE = 2, 3, 4, 6
# tokenizer.ggml.model values: byte-level BPE and SentencePiece.
_TOKENIZER_MODELS = ('gpt2', 'llama')
_SPACE = '\u2581'  # SentencePiece's '▁', which stands for a space.

# tokenizer.ggml.pre values whose pre-tokenization is GPT-2's regex, and those
# that first split every digit on its own (llama.cpp's \p{N} rule).
_GPT2_PRE = ('default', 'gpt-2', 'gpt2')
_DIGIT_SPLIT_PRE = (
    'smollm', 'starcoder', 'refact', 'command-r', 'codeshell', 'exaone',
    'minerva',
)
# tokenizer.ggml.pre values that split text by their Hugging Face
# tokenizer's regex (llama.cpp's own copy of it) before byte-level BPE, and
# whether that tokenizer first applies Unicode NFC.
_LETTERS = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
            r'\p{N}%s| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+')
_REGEX_PRE = {
    'qwen2': (_LETTERS % '', True),  # Qwen2/2.5: digits one by one.
    # DeepSeek-R1-Distill-Qwen (1.5B to 32B): Qwen2.5's tokenizer with
    # DeepSeek's special tokens; llama.cpp reads the name as its QWEN2 type
    # (src/llama-vocab.cpp, commit 00ad355e009e83abf98f96a6ded7193b95763681).
    'deepseek-r1-qwen': (_LETTERS % '', True),
    'llama-bpe': (_LETTERS % '{1,3}', False),  # Llama 3.x: up to 3 digits.
}

# A file without tokenizer.ggml.add_bos_token (older Llama 2, Mistral and
# TinyLlama files) gets llama.cpp's default for its tokenizer, as in
# src/llama-vocab.cpp, llama_vocab::impl::load (ggml-org/llama.cpp, commit
# 00ad355e009e83abf98f96a6ded7193b95763681): a SentencePiece vocabulary
# ('llama') adds BOS; a byte-level BPE one ('gpt2') adds BOS only after
# these pre-tokenizers (Llama 3's 'llama-bpe' among them), none after others.
# Neither adds an EOS by default. A key the file holds decides.
_BOS_PRE = (
    'llama3', 'llama-v3', 'llama-bpe', 'falcon3', 'falcon-h1', 'pixtral',
    'midm-2.0', 'lfm2', 'jina-v5-nano', 'tekken', 'chameleon',
)


class GGUFError(errors.ConfigError):
  """A GGUF file is missing, unreadable, or holds an unsupported model."""


# A GGUF file's path, or the file already opened by `open_reader`.
Source = Union[str, os.PathLike, 'gguf.GGUFReader']


def _import(module: str) -> Any:
  try:
    return importlib.import_module(module)
  except ImportError as e:
    raise GGUFError(
        f'reading GGUF files needs the {module!r} package: pip install {module}'
    ) from e


def open_reader(source: Source) -> gguf.GGUFReader:
  """Opens a GGUF file (memory-mapped; tensors are read lazily).

  Args:
    source: a path, or an open `gguf.GGUFReader` (returned as is). Parsing
      the metadata of a 50k-token vocabulary takes seconds, so callers that
      need both the model and the tokenizer open the file once.

  Raises:
    GGUFError: the file does not exist or is not a valid GGUF file.
  """
  gguf_lib = _import('gguf')
  if isinstance(source, gguf_lib.GGUFReader):
    return source
  path = os.fspath(source)
  if not os.path.isfile(path):
    raise GGUFError(f'GGUF file {path} does not exist')
  try:
    return gguf_lib.GGUFReader(path)
  except Exception as e:  # The reader raises many types on bad bytes.
    raise GGUFError(
        f'{path} is not a valid GGUF file (truncated or corrupt?): '
        f'{type(e).__name__}: {e}'
    ) from e


def _name(reader: gguf.GGUFReader) -> str:
  return os.fspath(getattr(reader.data, 'filename', None) or '<GGUF file>')


_REQUIRED = object()


def _field(reader: gguf.GGUFReader, key: str, default: Any = _REQUIRED) -> Any:
  """The value of metadata `key`, or `default` when absent."""
  field = reader.fields.get(key)
  if field is None:
    if default is _REQUIRED:
      raise GGUFError(f'{_name(reader)}: metadata key {key!r} is missing')
    return default
  try:
    return field.contents()
  except Exception as e:
    raise GGUFError(
        f'{_name(reader)}: metadata key {key!r} is unreadable: {e}'
    ) from e


# The kinds of metadata value `_typed` accepts (never a bool for a number).
_KINDS = {
    'a positive int': lambda v: isinstance(v, int) and v > 0,
    'an int': lambda v: isinstance(v, int),
    'a number': lambda v: isinstance(v, (int, float)),
    'a string': lambda v: isinstance(v, str),
    'a list of strings': lambda v: (isinstance(v, list)
                                    and all(isinstance(x, str) for x in v)),
    'a list of ints': lambda v: (isinstance(v, list)
                                 and all(isinstance(x, int) for x in v)),
    'a list of numbers': lambda v: (isinstance(v, list) and all(
        isinstance(x, (int, float)) for x in v)),
}
# What metadata of a type no check foresaw raises; `config_from_gguf` turns it
# into a GGUFError naming the file.
_MALFORMED = (TypeError, KeyError, AttributeError, ZeroDivisionError)


def _typed(reader: gguf.GGUFReader, key: str, kind: str,
           default: Any = _REQUIRED) -> Any:
  """`_field(reader, key, default)`, checked to be `kind` (see `_KINDS`)."""
  value = _field(reader, key, default)
  if key in reader.fields and (
      isinstance(value, bool) or not _KINDS[kind](value)):
    raise GGUFError(
        f'{_name(reader)}: metadata key {key!r} = {value!r:.60}: must be '
        f'{kind}'
    )
  return value


def _float32(value: float) -> float:
  """A float32 metadata value as its shortest decimal (1e-05, not 9.99e-06)."""
  return float(str(np.float32(value)))


def config_from_gguf(source: Source) -> ModelConfig:
  """The decoder config described by a GGUF file's metadata.

  Args:
    source: path or open reader of a 'llama', 'qwen2', 'gemma2' or
      'gemma3' GGUF file.

  Returns:
    A float32 ModelConfig (q/k/v biases for 'qwen2'; llama3 RoPE scaling
    when a 'llama' or 'qwen2' file has `rope_freqs.weight`; Gemma's layout,
    local and global layers and softcaps as `_gemma` reads them, and q/k
    norms for 'gemma3'). The output projection is tied to the embedding
    when the file has no `output.weight`.

  Raises:
    GGUFError: another architecture (a vision projector, Gemma 3n), missing
      keys, values of the wrong type (the message names the key), or
      features the decoder does not model (partial rotary, a
      `rope.scaling.type` other than Gemma 3's linear one, frequency
      factors no llama3 scaling gives).
  """
  reader = open_reader(source)
  try:
    return _config(reader)
  except GGUFError:
    raise
  except ValueError as e:  # ModelConfig's own checks name the field.
    raise GGUFError(f'{_name(reader)}: invalid hyperparameters: {e}') from e
  except _MALFORMED as e:
    raise GGUFError(
        f'{_name(reader)}: malformed metadata ({type(e).__name__}: {e})'
    ) from e


def context_length(source: Source) -> int | None:
  """The context length the model was trained for (`llama.context_length`,
  `qwen2.context_length`), or None when the file does not say (a value that
  is not a positive int says nothing)."""
  try:
    reader = open_reader(source)
    arch = _field(reader, 'general.architecture')
    return _typed(reader, f'{arch}.context_length', 'a positive int', None)
  except GGUFError:
    return None


def _architecture(reader: gguf.GGUFReader) -> str:
  """The file's `general.architecture`, one the decoder models."""
  arch = _field(reader, 'general.architecture')
  if arch in _NOT_TEXT:
    raise GGUFError(
        f"{_name(reader)}: general.architecture = {arch!r}: {_NOT_TEXT[arch]}")
  if arch not in _ARCHITECTURES:
    raise GGUFError(
        f'{_name(reader)}: architecture {arch!r} is not supported (only '
        f'{", ".join(map(repr, _ARCHITECTURES))})'
    )
  return arch


def _rope_scaling(reader: gguf.GGUFReader, arch: str, head_dim: int,
                  theta: float) -> RopeScaling | None:
  """The llama3 RoPE scaling of the file's `rope_freqs.weight`, if any."""
  name, key = _name(reader), f'{arch}.rope.scaling.type'
  scaling = _field(reader, key, 'none')
  if scaling != 'none':
    raise GGUFError(
        f'{name}: {key} = {scaling!r} is not supported (only llama3 '
        f'frequency factors, rope_freqs.weight)'
    )
  tensor = next((t for t in reader.tensors if t.name == _ROPE_FREQS), None)
  if tensor is None:
    return None
  try:
    return rope_factors.llama3_scaling(
        _dequantize(reader, tensor), head_dim=head_dim, theta=theta)
  except ValueError as e:
    raise GGUFError(f'{name}: tensor {_ROPE_FREQS} {e}') from e


def _config(reader: gguf.GGUFReader) -> ModelConfig:
  """`config_from_gguf` of an open file."""
  name = _name(reader)
  arch = _architecture(reader)
  key = lambda suffix: f'{arch}.{suffix}'
  size = lambda suffix, default=_REQUIRED: _typed(
      reader, key(suffix), 'a positive int', default)
  embed_dim = size('embedding_length')
  num_heads = size('attention.head_count')
  head_dim = size('attention.key_length', embed_dim // num_heads)
  rope_dim = size('rope.dimension_count', head_dim)
  if rope_dim != head_dim:
    raise GGUFError(
        f'{name}: {key("rope.dimension_count")} = {rope_dim} rotates part of '
        f'each head (head_dim {head_dim}); only full rotary is supported'
    )
  tensor_names = {t.name for t in reader.tensors}
  tokens = _typed(reader, 'tokenizer.ggml.tokens', 'a list of strings', None)
  if tokens is not None:
    vocab_size = len(tokens)
  elif 'token_embd.weight' in tensor_names:
    embd = next(t for t in reader.tensors if t.name == 'token_embd.weight')
    vocab_size = int(embd.shape[-1])
  else:
    vocab_size = size('vocab_size')
  number = lambda suffix, default=_REQUIRED: _float32(
      _typed(reader, key(suffix), 'a number', default))
  theta = number('rope.freq_base', 10_000.0)
  num_layers = size('block_count')
  if arch in _GEMMA:
    family = _gemma(reader, arch, num_layers, embed_dim // num_heads, head_dim)
  else:
    family = dict(rope_scaling=_rope_scaling(reader, arch, head_dim, theta),
                  qkv_bias=arch in _BIASED)
  return ModelConfig(
      vocab_size=vocab_size,
      num_layers=num_layers,
      embed_dim=embed_dim,
      num_heads=num_heads,
      num_kv_heads=size('attention.head_count_kv', num_heads),
      head_dim=head_dim,
      mlp_dim=size('feed_forward_length'),
      rope_theta=theta,
      norm_eps=number('attention.layer_norm_rms_epsilon'),
      tie_embeddings='output.weight' not in tensor_names,
      **family,
  )


# What llama.cpp assumes of a Gemma file beyond its metadata, from
# src/llama-model.cpp, llama_model::load_hparams (ggml-org/llama.cpp, commit
# 00342301d01add50835550e8a916f12097d94517), src/llama-hparams.cpp
# set_swa_pattern (commit 01b77b5793989e0a1508a2fe3757d4e743a7bbd1) and the
# defaults of src/llama-hparams.h (commit
# 027d57567f8506fca217b6c2a840b461369cf950): every n-th layer global, the
# others local (Gemma 2: n = 2, layers 0, 2, 4, ... local; Gemma 3: n = 6,
# five local to one global), local layers of Gemma 3 on RoPE base 10000
# unscaled, Gemma 2's window 4096 and softcaps 50 (attention) and 30
# (output) where the file states none; the block count of the 27B models,
# whose attention scale is 1/sqrt(D / N) rather than 1/sqrt(H).
_GEMMA_PATTERN = {'gemma2': 2, 'gemma3': 6}
_GEMMA_27B_LAYERS = {'gemma2': 46, 'gemma3': 62}
_GEMMA3_LOCAL_THETA = 10_000.0


def _gemma(reader: gguf.GGUFReader, arch: str, num_layers: int,
           width_per_head: int, head_dim: int) -> dict[str, Any]:
  """The Gemma-only ModelConfig fields of a 'gemma2' or 'gemma3' file.

  llama.cpp's converter (conversion/gemma.py, Gemma2Model and Gemma3Model,
  ggml-org/llama.cpp commit 2bbcf7fc93a460f04d5709756a48b2408443eecb)
  writes the window, Gemma 2's softcaps and Gemma 3's global RoPE base
  and linear scaling (4B and larger: factor 8, global layers only); it
  writes no query_pre_attn_scalar, layer pattern or local RoPE base, which
  llama.cpp fixes per architecture (see `_GEMMA_PATTERN`).
  """
  name, key = _name(reader), lambda suffix: f'{arch}.{suffix}'
  number = lambda suffix, default=_REQUIRED: _typed(
      reader, key(suffix), 'a number', default)
  gemma3 = arch == 'gemma3'
  window = _typed(reader, key('attention.sliding_window'), 'a positive int',
                  _REQUIRED if gemma3 else 4096)
  pattern = _GEMMA_PATTERN[arch]
  fields = dict(
      sliding_window=window,
      sliding_layers=tuple(i for i in range(num_layers)
                           if i % pattern < pattern - 1),
      query_pre_attn_scalar=(width_per_head
                             if num_layers == _GEMMA_27B_LAYERS[arch]
                             else head_dim),
      qk_norm=gemma3, norm_plus_one=True, sandwich_norms=True,
      mlp_activation='gelu_tanh', scale_embeddings=True)
  scaling = _typed(reader, key('rope.scaling.type'), 'a string', 'none')
  if gemma3:
    for suffix in ('attn_logit_softcapping', 'final_logit_softcapping'):
      if key(suffix) in reader.fields:
        raise GGUFError(
            f'{name}: {key(suffix)} is not supported: llama.cpp ignores it '
            "in Gemma 3's sliding-window graph, transformers applies it")
    fields['rope_local_theta'] = _GEMMA3_LOCAL_THETA
    if scaling == 'linear':
      fields['rope_linear_factor'] = _float32(number('rope.scaling.factor'))
  else:
    fields['attn_logit_softcap'] = _float32(
        number('attn_logit_softcapping', 50.0))
    fields['final_logit_softcap'] = _float32(
        number('final_logit_softcapping', 30.0))
  if scaling not in ('none', 'linear') or scaling == 'linear' and not gemma3:
    raise GGUFError(
        f'{name}: {key("rope.scaling.type")} = {scaling!r} is not supported '
        f'for {arch} (only {"none or linear" if gemma3 else "none"})')
  return fields


def _unpermute_rows(w: np.ndarray, heads: int) -> np.ndarray:
  """Undoes llama.cpp's rotary row order: row 2i + j of a head -> j*H/2 + i."""
  rows, cols = w.shape
  half = rows // heads // 2
  return w.reshape(heads, half, 2, cols).swapaxes(1, 2).reshape(rows, cols)


@dataclasses.dataclass(frozen=True)
class _Slot:
  """Where one decoder param comes from.

  Attributes:
    tensor: GGUF tensor name.
    shape: its dequantized shape, [out, in] for matrices.
    convert: maps that array to the decoder param.
  """

  tensor: str
  shape: tuple[int, ...]
  convert: Callable[[np.ndarray], np.ndarray]


def _slots(cfg: ModelConfig, arch: str) -> dict[str, _Slot]:
  """Decoder param path ('blocks.0.attn.q.w') -> its GGUF source."""
  d, f, v = cfg.embed_dim, cfg.mlp_dim, cfg.vocab_size
  n, k, h = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  same, t = (lambda w: w), np.transpose
  if arch in _PERMUTED:
    rows = _unpermute_rows
  else:
    rows = lambda w, heads: w
  # Gemma's converter stores each RMSNorm weight w as 1 + w (the scale it
  # applies); the decoder's (1 + scale) norms hold w.
  norm = (lambda w: w - np.float32(1)) if cfg.norm_plus_one else same
  slots = {
      'embedding': _Slot('token_embd.weight', (v, d), same),
      'final_norm.scale': _Slot('output_norm.weight', (d,), norm),
  }
  if not cfg.tie_embeddings:
    slots['unembedding.w'] = _Slot('output.weight', (v, d), t)
  block = {  # param suffix: (tensor suffix, shape, convert)
      'attn_norm.scale': ('attn_norm', (d,), norm),
      'mlp_norm.scale': ('ffn_norm', (d,), norm),
      'attn.q.w': ('attn_q', (n * h, d),
                   lambda w: rows(w, n).T.reshape(d, n, h)),
      'attn.k.w': ('attn_k', (k * h, d),
                   lambda w: rows(w, k).T.reshape(d, k, h)),
      'attn.v.w': ('attn_v', (k * h, d), lambda w: w.T.reshape(d, k, h)),
      'attn.o.w': ('attn_output', (d, n * h), lambda w: w.T.reshape(n, h, d)),
      'mlp.gate.w': ('ffn_gate', (f, d), t),
      'mlp.up.w': ('ffn_up', (f, d), t),
      'mlp.down.w': ('ffn_down', (d, f), t),
  }
  biases = {  # param: (tensor, shape, convert), the tensor's full name
      f'attn.{p}_bias.b': (f'attn_{p}.bias', (m * h,),
                           lambda b, m=m: b.reshape(m, h))
      for p, m in (('q', n), ('k', k), ('v', k))
  } if cfg.qkv_bias else {}
  if cfg.sandwich_norms:  # Gemma's post-norms (the pre-FFN one is ffn_norm)
    block |= {'attn_post_norm.scale': ('post_attention_norm', (d,), norm),
              'mlp_post_norm.scale': ('post_ffw_norm', (d,), norm)}
  if cfg.qk_norm:
    block |= {f'attn.{p}_norm.scale': (f'attn_{p}_norm', (h,), norm)
              for p in 'qk'}
  block = {ours: (f'{theirs}.weight', shape, convert)
           for ours, (theirs, shape, convert) in block.items()} | biases
  for i in range(cfg.num_layers):
    for ours, (theirs, shape, convert) in block.items():
      slots[f'blocks.{i}.{ours}'] = _Slot(f'blk.{i}.{theirs}', shape, convert)
  return slots


def _dequantize(reader: gguf.GGUFReader, tensor: Any) -> np.ndarray:
  """One GGUF tensor as float32, rows first ([out, in] for matrices)."""
  qtype = tensor.tensor_type
  try:
    return _import('gguf').quants.dequantize(tensor.data, qtype)
  except NotImplementedError as e:
    raise GGUFError(
        f'{_name(reader)}: tensor {tensor.name} has quantization type '
        f'{qtype.name}, which cannot be dequantized'
    ) from e


def _param_path(path: tuple[Any, ...]) -> str:
  keys = []
  for entry in path:
    key = getattr(entry, 'key', getattr(entry, 'idx', None))
    if key is None:  # GetAttrKey('value') of the Param wrapper.
      continue
    keys.append(str(key))
  return '.'.join(keys)


def load(
    source: Source,
    *,
    dtype: str = 'float32',
    param_dtype: str | None = None,
) -> tuple[ModelConfig, nnx.GraphDef, nnx.State]:
  """Builds a decoder from a 'llama', 'qwen2', 'gemma2' or 'gemma3' GGUF file.

  Tensors are dequantized one at a time, transposed into the decoder's
  layout, cast to `param_dtype` and moved to the default device, so memory
  peaks near the final params plus one float32 tensor (SmolLM2-135M: 513 MiB
  of float32 params, about 0.7 GiB above the open reader at the peak).

  Args:
    source: path or open reader of the GGUF file.
    dtype: compute dtype of the decoder, 'float32' or 'bfloat16'.
    param_dtype: storage dtype of the params; defaults to `dtype`.

  Returns:
    (cfg, graphdef, params), ready for `decoder.forward`.

  Raises:
    GGUFError: unreadable file, unsupported architecture or quantization, a
      missing, mis-shaped or unexpected tensor.
  """
  reader = open_reader(source)
  name = _name(reader)
  cfg = dataclasses.replace(
      config_from_gguf(reader),
      dtype=dtype,
      param_dtype=param_dtype or dtype,
  )
  tensors = {t.name: t for t in reader.tensors}
  arch = _architecture(reader)
  slots = _slots(cfg, arch)
  unexpected = sorted(set(tensors) - {s.tensor for s in slots.values()}
                      - ({_ROPE_FREQS} if arch not in _GEMMA else set()))
  if unexpected:
    raise GGUFError(
        f'{name}: tensors {", ".join(unexpected[:5])} have no place in a '
        f'{cfg.num_layers}-layer {arch} decoder'
    )
  graphdef, abstract = decoder.abstract_params(cfg)

  def fill(path, leaf: jax.ShapeDtypeStruct) -> jax.Array:
    slot = slots[_param_path(path)]
    tensor = tensors.get(slot.tensor)
    if tensor is None:
      raise GGUFError(f'{name}: tensor {slot.tensor} is missing')
    w = _dequantize(reader, tensor)
    if w.shape != slot.shape:
      raise GGUFError(
          f'{name}: tensor {slot.tensor} has shape {w.shape} (rows, cols), '
          f'expected {slot.shape} from the metadata'
      )
    w = np.ascontiguousarray(slot.convert(w), dtype=leaf.dtype)
    assert w.shape == leaf.shape, (slot.tensor, w.shape, leaf.shape)
    return jax.device_put(w)

  params = jax.tree_util.tree_map_with_path(fill, abstract)
  return cfg, graphdef, params


def _pre_tokenizer(reader: gguf.GGUFReader, pre: str) -> Any:
  tk = _import('tokenizers')
  byte_level = tk.pre_tokenizers.ByteLevel(
      add_prefix_space=False, use_regex=True
  )
  if pre in _GPT2_PRE:
    return byte_level
  if pre in _DIGIT_SPLIT_PRE:
    return tk.pre_tokenizers.Sequence(
        [tk.pre_tokenizers.Digits(individual_digits=True), byte_level]
    )
  if pre in _REGEX_PRE:
    return tk.pre_tokenizers.Sequence([
        tk.pre_tokenizers.Split(tk.Regex(_REGEX_PRE[pre][0]),
                                behavior='isolated', invert=False),
        tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
  raise GGUFError(
      f'{_name(reader)}: tokenizer.ggml.pre = {pre!r} is not supported (known: '
      f'{", ".join(_GPT2_PRE + _DIGIT_SPLIT_PRE + tuple(_REGEX_PRE))})'
  )


def _adds_bos(reader: gguf.GGUFReader, model: str, pre: str) -> bool:
  """Whether prompts start with the BOS: the file's
  tokenizer.ggml.add_bos_token, else llama.cpp's default (see `_BOS_PRE`)."""
  key = 'tokenizer.ggml.add_bos_token'
  value = _field(reader, key, None)
  if value is None:
    return model == 'llama' or pre in _BOS_PRE
  if not isinstance(value, bool):
    raise GGUFError(
        f'{_name(reader)}: metadata key {key!r} = {value!r:.60}: must be a '
        'bool')
  return value


def _byte_level_bpe(reader: gguf.GGUFReader, vocab: dict[str, int],
                    pre: str) -> tokenizers.Tokenizer:
  """The 'gpt2' tokenizer: byte-level BPE with the file's merges and the
  pre-tokenizer `pre` names."""
  tk = _import('tokenizers')
  pairs = []
  for merge in _typed(reader, 'tokenizer.ggml.merges', 'a list of strings'):
    parts = merge.split(' ')
    if len(parts) != 2:
      raise GGUFError(f'{_name(reader)}: tokenizer.ggml.merges entry '
                      f'{merge!r} is not two tokens')
    pairs.append((parts[0], parts[1]))
  tokenizer = tk.Tokenizer(
      tk.models.BPE(vocab=vocab, merges=pairs, fuse_unk=False,
                    byte_fallback=False)
  )
  tokenizer.pre_tokenizer = _pre_tokenizer(reader, pre)
  if _REGEX_PRE.get(pre, ('', False))[1]:
    tokenizer.normalizer = tk.normalizers.NFC()
  tokenizer.decoder = tk.decoders.ByteLevel()
  return tokenizer


def _sentencepiece(reader: gguf.GGUFReader, vocab: dict[str, int],
                   tokens: list[str], types: list[int]) -> tokenizers.Tokenizer:
  """The 'llama' tokenizer: SentencePiece BPE, as llama.cpp's SPM tokenizer
  reads it and transformers' LlamaTokenizer builds it.

  llama.cpp merges the adjacent pair whose joined piece scores highest
  (tokenizer.ggml.scores), so the merges are every split of a piece into
  two pieces of the vocabulary, highest score first; characters outside the
  vocabulary become their UTF-8 byte tokens (<0x41>). A space is written
  '▁', and text (each stretch of it between special tokens) starts with one
  unless tokenizer.ggml.add_space_prefix is false (llama.cpp's default for
  this vocabulary is true).
  """
  tk = _import('tokenizers')
  name = _name(reader)
  scores = _typed(reader, 'tokenizer.ggml.scores', 'a list of numbers',
                  [0.0] * len(tokens))
  if len(scores) != len(tokens):
    raise GGUFError(f'{name}: tokenizer.ggml.scores has {len(scores)} '
                    f'entries for {len(tokens)} tokens')
  merges = []
  for i, piece in enumerate(tokens):
    if types[i] in (_UNKNOWN, _CONTROL, _BYTE):
      continue
    splits = [(piece[:k], piece[k:]) for k in range(1, len(piece))
              if piece[:k] in vocab and piece[k:] in vocab]
    splits.sort(key=lambda lr: (vocab[lr[0]], vocab[lr[1]]))
    merges += [(left, right, scores[i]) for left, right in splits]
  # Stable: pairs of equal key keep the order above, as transformers'.
  merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
  unknown = next((t for t, k in zip(tokens, types) if k == _UNKNOWN), None)
  tokenizer = tk.Tokenizer(tk.models.BPE(
      vocab=vocab, merges=[(left, right) for left, right, _ in merges],
      unk_token=unknown, fuse_unk=True, byte_fallback=True))
  key = 'tokenizer.ggml.add_space_prefix'
  prefix = _field(reader, key, True)
  if not isinstance(prefix, bool):
    raise GGUFError(f'{name}: metadata key {key!r} = {prefix!r:.60}: must be '
                    'a bool')
  # llama.cpp puts the space before every stretch of text, at the start and
  # after each special token, even one that starts with a space (as Llama
  # 2's own tokenizer.json does; transformers' GGUF reader only at the
  # start of a text that has none).
  tokenizer.normalizer = tk.normalizers.Sequence(
      ([tk.normalizers.Prepend(_SPACE)] if prefix else [])
      + [tk.normalizers.Replace(' ', _SPACE)])
  decoders = [tk.decoders.Replace(_SPACE, ' '), tk.decoders.ByteFallback(),
              tk.decoders.Fuse()]
  if prefix:
    decoders.append(tk.decoders.Strip(content=' ', left=1, right=0))
  tokenizer.decoder = tk.decoders.Sequence(decoders)
  return tokenizer


def tokenizer_parts(
    source: Source,
) -> tuple[tokenizers.Tokenizer, dict[str, Any]]:
  """A tokenizer and its special ids from GGUF metadata.

  The tokenizer is byte-level BPE for a 'gpt2' tokenizer model and
  SentencePiece BPE for a 'llama' one (`_sentencepiece`). It adds no BOS/EOS
  itself: `encode(text).ids` are the text's tokens. Control tokens (ChatML's
  `<|im_start|>`, `<|im_end|>`, SentencePiece's `<s>`, `</s>` and its
  unknown token `<unk>`) are special: each encodes as one id and
  `decode(..., skip_special_tokens=True)` drops them.

  Length: its docstring lists the GGUF metadata keys read; the code reads them
  in one pass.

  Args:
    source: path or open reader of a GGUF file with a 'gpt2' or 'llama'
      tokenizer.

  Returns:
    (tokenizer, info) with info keys 'eos_id' (an int), 'bos_id', 'pad_id'
    (ints, or None when the file names none), 'chat_template' (Jinja source or None),
    'add_bos' (whether the model expects a leading BOS: the file's
    tokenizer.ggml.add_bos_token, or where it has none llama.cpp's default
    for its tokenizer, see `_BOS_PRE`) and 'stop_ids' (the end-of-turn and
    end-of-message tokens, tokenizer.ggml.eot_token_id and eom_token_id,
    that also end a completion; empty when the file names none).

  Raises:
    GGUFError: no tokenizer or no EOS token id, another tokenizer model,
      or a 'gpt2' pre-tokenizer not modelled here.
  """
  tk = _import('tokenizers')
  reader = open_reader(source)
  name = _name(reader)
  model = _field(reader, 'tokenizer.ggml.model')
  if model not in _TOKENIZER_MODELS:
    raise GGUFError(
        f'{name}: tokenizer.ggml.model = {model!r} is not supported (only '
        "byte-level BPE, 'gpt2', and SentencePiece, 'llama')"
    )
  tokens = _typed(reader, 'tokenizer.ggml.tokens', 'a list of strings')
  types = _typed(reader, 'tokenizer.ggml.token_type', 'a list of ints',
                 [1] * len(tokens))
  if len(types) != len(tokens):
    raise GGUFError(
        f'{name}: tokenizer.ggml.token_type has {len(types)} entries for '
        f'{len(tokens)} tokens'
    )
  vocab = {}
  for i, token in enumerate(tokens):
    vocab.setdefault(token, i)  # A repeated token keeps its first id.
  pre = _field(reader, 'tokenizer.ggml.pre', 'default')
  if model == 'llama':
    tokenizer = _sentencepiece(reader, vocab, tokens, types)
    special = (_CONTROL, _UNKNOWN)
  else:
    tokenizer = _byte_level_bpe(reader, vocab, pre)
    special = (_CONTROL,)
  tokenizer.add_special_tokens([
      tk.AddedToken(tokens[i], special=True, normalized=False)
      for i, t in enumerate(types) if t in special
  ])
  tokenizer.add_tokens([
      tk.AddedToken(tokens[i], special=False, normalized=False)
      for i, t in enumerate(types) if t == _USER_DEFINED
  ])

  def token_id(key: str) -> int | None:
    value = _typed(reader, key, 'an int', None)
    if value is not None and not 0 <= value < len(tokens):
      raise GGUFError(
          f'{name}: {key} = {value} is outside the {len(tokens)}-token vocab'
      )
    return value

  eos_id = token_id('tokenizer.ggml.eos_token_id')
  if eos_id is None:
    raise GGUFError(
        f"{name}: metadata key 'tokenizer.ggml.eos_token_id' is missing: "
        'it names the token that ends a completion (and pads)')
  info = {
      'bos_id': token_id('tokenizer.ggml.bos_token_id'),
      'eos_id': eos_id,
      'pad_id': token_id('tokenizer.ggml.padding_token_id'),
      'chat_template': _typed(reader, 'tokenizer.chat_template', 'a string',
                              None),
      'add_bos': _adds_bos(reader, model, pre),
      # The end-of-turn (Llama 3's <|eot_id|>) and end-of-message
      # (<|eom_id|>) tokens newer files name; llama.cpp stops at them too.
      'stop_ids': tuple(i for i in map(token_id, (
          'tokenizer.ggml.eot_token_id', 'tokenizer.ggml.eom_token_id'))
                        if i is not None),
  }
  return tokenizer, info
