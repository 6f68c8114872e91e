"""Llama, Qwen2, Qwen3, Gemma 2 and Gemma 3 models from GGUF files.

GGUF is llama.cpp's single-file format: metadata (hyperparameters, the
tokenizer's vocabulary and merges, a chat template) followed by tensors,
often quantized. `load` dequantizes every tensor to float32 and places it in
the parameter tree of `jaxgrpo.model.decoder`. The tokenizer is rebuilt
from the same metadata by `jaxgrpo.model.gguf_tokenizer`, through this
module's reader and field lookup (`open_reader`, `_field`, `_typed`).

llama.cpp stores each row-major Hugging Face weight [out, in] as-is, except
that its converter reorders the rows of the query and key projections of
the 'llama' architecture so that rotary pairs are adjacent features
(2i, 2i + 1) instead of features i and i + H/2. The decoder uses the
half-split layout, so `load` undoes that reordering. 'qwen2' files keep
Hugging Face's order (llama.cpp rotates them NEOX-style, in halves) and add
q/k/v biases; 'qwen3' files keep that order too, with no biases but an
RMSNorm over each query and key head (`attn_q_norm`, `attn_k_norm`, stored
as Hugging Face's weights) and a head_dim of their own
(`qwen3.attention.key_length`: 128 on Qwen3-0.6B, whose 1024 features make
16 heads of 64). Llama 3.x's RoPE scaling arrives as the per-frequency factors
of `rope_freqs.weight`, read back as the llama3 `RopeScaling` that gives
them (`jaxgrpo.model.rope_factors`). 'gemma2' and 'gemma3' files (text
models; see `_gemma`) keep Hugging Face's q/k row order too, but store each
RMSNorm weight plus one, which `load` subtracts.

Size: the five architectures share one metadata reading (`_config`, with
Gemma's in `_gemma`) and one tensor mapping (`_slots`); the file's reader
and typed field lookup live here for the tokenizer's module too.
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

# general.architecture values: the ones whose q/k rows llama.cpp reorders
# (see above), those it stores as Hugging Face does, with q/k/v biases, and
# those in Hugging Face's order with per-head q/k norms instead (Qwen3:
# conversion/qwen.py, Qwen3Model, ggml-org/llama.cpp commit
# 2bbcf7fc93a460f04d5709756a48b2408443eecb, renames Qwen2Model's tensors and
# changes none; src/models/qwen3.cpp, commit
# cbcd6f98273b88bbc0e80ec4960d8c86827a4ca5, norms each head of Q and K
# before NEOX RoPE over all of key_length).
_PERMUTED, _BIASED, _QK_NORMED = ('llama',), ('qwen2',), ('qwen3',)
# Gemma 2 and Gemma 3 (text): Hugging Face's q/k order, (1 + w) norms.
_GEMMA = ('gemma2', 'gemma3')
_ARCHITECTURES = _PERMUTED + _BIASED + _QK_NORMED + _GEMMA
# Architectures llama.cpp writes for files that hold no causal LM the
# decoder models, and what to load instead.
_NOT_TEXT = {
    'clip': 'it is a vision projector (mmproj) file; model.path takes the '
            'text model\'s .gguf',
    'gemma3n': 'Gemma 3n (per-layer embeddings, AltUp) is not modelled',
    **{arch: f'{what} is not modelled (only dense Qwen3, \'qwen3\')'
       for arch, what in (
           ('qwen3moe', 'Qwen3 MoE (mixture-of-experts layers)'),
           ('qwen3vl', 'Qwen3-VL (multimodal RoPE sections, deepstack)'),
           ('qwen3vlmoe', 'Qwen3-VL MoE'),
           ('qwen3next', 'Qwen3-Next (linear attention, experts)'))},
}

_ROPE_FREQS = 'rope_freqs.weight'

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
    source: path or open reader of a 'llama', 'qwen2', 'qwen3', 'gemma2' or
      'gemma3' GGUF file.

  Returns:
    A float32 ModelConfig (q/k/v biases for 'qwen2', q/k norms for 'qwen3';
    llama3 RoPE scaling when such a file has `rope_freqs.weight`; Gemma's
    layout, local and global layers and softcaps as `_gemma` reads them,
    and q/k norms for 'gemma3'). The output projection is tied to the
    embedding when the file has no `output.weight`.

  Raises:
    GGUFError: another architecture (a vision projector, Gemma 3n, Qwen3
      MoE or VL), missing keys, values of the wrong type (the message
      names the key), or features the decoder does not model (partial
      rotary, a `rope.scaling.type` other than Gemma 3's linear one,
      frequency factors no llama3 scaling gives).
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
  """The file's `general.architecture`, one the decoder models, of a file
  that holds a causal LM (`_causal_lm`)."""
  arch = _field(reader, 'general.architecture')
  if arch in _NOT_TEXT:
    raise GGUFError(
        f"{_name(reader)}: general.architecture = {arch!r}: {_NOT_TEXT[arch]}")
  if arch not in _ARCHITECTURES:
    raise GGUFError(
        f'{_name(reader)}: architecture {arch!r} is not supported (only '
        f'{", ".join(map(repr, _ARCHITECTURES))})'
    )
  _causal_lm(reader, arch)
  return arch


# What llama.cpp's converter writes for a file of an architecture the
# decoder models that holds no causal LM: gguf-py's general.type other than
# 'model' (a LoRA adapter, an imatrix), `<arch>.pooling_type` for a model
# whose hidden states are pooled into one vector per text (llama.cpp's
# llama_pooling_type: none, mean, cls, last, rank; src/llama-model.cpp,
# llama_model::load_hparams, ggml-org/llama.cpp commit
# 00342301d01add50835550e8a916f12097d94517, reads it for 'qwen2' and
# 'qwen3', the gte-Qwen2, Qwen3-Embedding and Qwen3-Reranker files), and the
# labels and head of a classifier or reranker
# (`<arch>.classifier.output_labels`, tensor `cls.output.weight`).
_POOLING = ('none', 'mean', 'cls', 'last', 'rank')
_CLASSIFIER_TENSORS = ('cls.weight', 'cls.output.weight')
_NEED = 'model.path needs a causal language model (text generation)'


def _causal_lm(reader: gguf.GGUFReader, arch: str) -> None:
  """Refuses an embedding, reranker or adapter file (see `_POOLING`)."""
  name = _name(reader)
  kind = _field(reader, 'general.type', 'model')
  if kind != 'model':
    raise GGUFError(f'{name}: general.type = {kind!r}: the file holds no '
                    f"model (it would say 'model'); {_NEED}")
  key = f'{arch}.pooling_type'
  if key in reader.fields:
    pooling = _field(reader, key)
    what = (_POOLING[pooling] if isinstance(pooling, int)
            and 0 <= pooling < len(_POOLING) else 'unknown')
    model = 'a reranker' if what == 'rank' else 'an embedding model'
    raise GGUFError(
        f'{name}: {key} = {pooling!r} ({what}): {model} (Qwen3-Embedding, '
        f'Qwen3-Reranker), not a causal LM; {_NEED}')
  key = f'{arch}.classifier.output_labels'
  head = next((t.name for t in reader.tensors
               if t.name in _CLASSIFIER_TENSORS), None)
  if key in reader.fields or head is not None:
    where = f'metadata key {key!r}' if key in reader.fields else (
        f'tensor {head}')
    raise GGUFError(f'{name}: {where}: a classifier or reranker, not a '
                    f'causal LM; {_NEED}')


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
    # `<arch>.attention.sliding_window` is not read: llama.cpp reads it for
    # none of 'llama', 'qwen2' and 'qwen3' (src/llama-model.cpp,
    # llama_model::load_hparams, commit
    # 00342301d01add50835550e8a916f12097d94517) and attends to every
    # earlier position in them (src/models/qwen3.cpp: build_attn_inp_kv,
    # no sliding-window mask), so a window a file states is ignored there
    # and here.
    family = dict(rope_scaling=_rope_scaling(reader, arch, head_dim, theta),
                  qkv_bias=arch in _BIASED, qk_norm=arch in _QK_NORMED)
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
            "in Gemma 3's sliding-window graph")
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
  """Builds a decoder from a 'llama', 'qwen2', 'qwen3' or Gemma GGUF file.

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
    if bad := int(np.count_nonzero(~np.isfinite(w))):
      raise GGUFError(f'{name}: tensor {slot.tensor} holds {bad} NaN or '
                      f'infinite values (of {w.size}): the file is damaged')
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
