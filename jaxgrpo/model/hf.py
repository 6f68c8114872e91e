"""Hugging Face checkpoints (config.json + safetensors) in and out.

`load` reads the directory that transformers' `save_pretrained` writes for a
Llama, Mistral (without sliding window), Qwen2, Qwen3, Gemma 2 or Gemma 3
causal LM, or the text model of a Gemma 3 image-text model (its vision tower
left out), into the parameter tree of `jaxgrpo.model.decoder`;
`export` writes such a directory back, one that `load` and transformers'
`AutoModelForCausalLM` both read.

Size: `load` and `export` are the two directions of one mapping of names and
layouts, kept side by side so that a change to one shows in the other.

Hugging Face Linear weights are [out, in]; the decoder stores input axes
first and splits heads:

  q_proj, k_proj, v_proj [N*H, D] <-> attn.q/k/v.w [D, N, H]
  o_proj [D, N*H]                 <-> attn.o.w [N, H, D]
  gate_proj, up_proj [F, D]       <-> mlp.gate/up.w [D, F]
  down_proj [D, F]                <-> mlp.down.w [F, D]
  lm_head [V, D]                  <-> unembedding.w [D, V]
  q/k/v_proj.bias [N*H]           <-> attn.q/k/v_bias.b [N, H]

The embedding and every norm scale are copied as they are (Gemma's
post_attention_layernorm is attn_post_norm, pre_feedforward_layernorm
mlp_norm, post_feedforward_layernorm mlp_post_norm).
"""

from __future__ import annotations

from collections.abc import Mapping
import dataclasses
import json
import math
import os
import pathlib
import re
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo.model import decoder
from jaxgrpo.model import hf_config
from jaxgrpo.model.config import ModelConfig
from jaxgrpo.model.hf_config import CheckpointError

_CONFIG = 'config.json'
_SINGLE = 'model.safetensors'
_INDEX = 'model.safetensors.index.json'
_SHARD = 'model-{:05d}-of-{:05d}.safetensors'
# The weight files an export writes (and replaces).
WEIGHT_FILES = re.compile(
    r'model(-\d{5}-of-\d{5})?\.safetensors(\.index\.json)?'
)
_SAFETENSORS_DTYPES = {'F32': 'float32', 'BF16': 'bfloat16'}
# The safetensors dtypes a weight may have: floats that NumPy reads.
_FLOAT_DTYPES = ('F16', 'BF16', 'F32', 'F64')
# The text model of an image-text checkpoint (hf_config.MULTIMODAL): where
# transformers stores the causal LM's tensors (before 4.52 and from 5 on;
# 4.52 to 4.57), and the prefixes of the parts left out (vision tower,
# projector).
_TEXT_LAYOUTS = {
    'gemma3': ({'model.': 'language_model.model.',
                'lm_head.': 'language_model.lm_head.'},
               {'model.': 'model.language_model.', 'lm_head.': 'lm_head.'}),
}
_LEFT_OUT = {
    'gemma3': ('vision_tower.', 'multi_modal_projector.',
               'model.vision_tower.', 'model.multi_modal_projector.'),
}


def _safetensors() -> Any:
  try:
    import safetensors  # pylint: disable=g-import-not-at-top
    import safetensors.numpy  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise CheckpointError(
        'reading and writing Hugging Face checkpoints needs the '
        "'safetensors' package: pip install safetensors"
    ) from e
  return safetensors


@dataclasses.dataclass(frozen=True)
class _Tensor:
  """One decoder param and the Hugging Face tensor it is stored as.

  Attributes:
    path: the param's path in the decoder's State.
    name: the Hugging Face tensor name.
    shape: the param's shape.
    in_axes: for a Linear weight, how many leading param axes are inputs
      (the HF tensor is the transposed [out, in] matrix); 0 for a tensor
      stored in the same order, merely reshaped.
  """

  path: tuple[str | int, ...]
  name: str
  shape: tuple[int, ...]
  in_axes: int = 0

  @property
  def hf_shape(self) -> tuple[int, ...]:
    if self.in_axes:
      k = self.in_axes
      return (math.prod(self.shape[k:]), math.prod(self.shape[:k]))
    if self.name.endswith('.bias'):
      return (math.prod(self.shape),)
    return self.shape

  def to_decoder(self, w: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """HF layout -> param layout in `dtype`, copying only when needed."""
    w = np.asarray(w.T if self.in_axes else w, dtype=dtype, order='C')
    return w.reshape(self.shape)

  def to_hf(self, w: np.ndarray) -> np.ndarray:
    """Param layout -> HF layout (C-contiguous, dtype kept)."""
    if self.in_axes:
      w = w.reshape(self.hf_shape[::-1]).T
    return np.ascontiguousarray(w).reshape(self.hf_shape)


def _tensors(cfg: ModelConfig) -> list[_Tensor]:
  """Every decoder param of `cfg` with its Hugging Face tensor."""
  d, f, v = cfg.embed_dim, cfg.mlp_dim, cfg.vocab_size
  n, k, h = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  mlp_norm = ('pre_feedforward_layernorm.weight' if cfg.sandwich_norms
              else 'post_attention_layernorm.weight')
  # (path under blocks.i, name under model.layers.i., shape, in_axes)
  block = [
      (('attn', 'q', 'w'), 'self_attn.q_proj.weight', (d, n, h), 1),
      (('attn', 'k', 'w'), 'self_attn.k_proj.weight', (d, k, h), 1),
      (('attn', 'v', 'w'), 'self_attn.v_proj.weight', (d, k, h), 1),
      (('attn', 'o', 'w'), 'self_attn.o_proj.weight', (n, h, d), 2),
      (('attn_norm', 'scale'), 'input_layernorm.weight', (d,), 0),
      (('mlp_norm', 'scale'), mlp_norm, (d,), 0),
      (('mlp', 'gate', 'w'), 'mlp.gate_proj.weight', (d, f), 1),
      (('mlp', 'up', 'w'), 'mlp.up_proj.weight', (d, f), 1),
      (('mlp', 'down', 'w'), 'mlp.down_proj.weight', (f, d), 1),
  ]
  if cfg.sandwich_norms:  # Gemma: post-norms on both branches
    block += [
        (('attn_post_norm', 'scale'), 'post_attention_layernorm.weight',
         (d,), 0),
        (('mlp_post_norm', 'scale'), 'post_feedforward_layernorm.weight',
         (d,), 0),
    ]
  if cfg.qkv_bias:
    block += [
        (('attn', f'{p}_bias', 'b'), f'self_attn.{p}_proj.bias', (m, h), 0)
        for p, m in (('q', n), ('k', k), ('v', k))
    ]
  if cfg.qk_norm:
    block += [
        (('attn', f'{p}_norm', 'scale'), f'self_attn.{p}_norm.weight', (h,), 0)
        for p in 'qk'
    ]
  out = [_Tensor(('embedding',), 'model.embed_tokens.weight', (v, d))]
  for i in range(cfg.num_layers):
    out += [
        _Tensor(('blocks', i) + path, f'model.layers.{i}.{name}', shape, axes)
        for path, name, shape, axes in block
    ]
  out.append(_Tensor(('final_norm', 'scale'), 'model.norm.weight', (d,)))
  if not cfg.tie_embeddings:
    out.append(_Tensor(('unembedding', 'w'), 'lm_head.weight', (d, v), 1))
  return out


def _in_layout(name: str, layout: Mapping[str, str]) -> str:
  """A causal LM's tensor name as `layout` (see `_TEXT_LAYOUTS`) stores it."""
  for ours, theirs in layout.items():
    if name.startswith(ours):
      return theirs + name[len(ours):]
  return name


def _text_model(
    model_type: Any, tensors: list[_Tensor], stored: Mapping[str, Any]
) -> tuple[list[_Tensor], str, tuple[str, ...]]:
  """(`tensors` named as the checkpoint stores them, the lm_head's name,
  the prefixes of tensors left out) for a config.json of `model_type`."""
  if model_type not in _TEXT_LAYOUTS:
    return tensors, 'lm_head.weight', ()
  layouts = _TEXT_LAYOUTS[model_type]
  layout = next((x for x in layouts if _in_layout(tensors[0].name, x)
                 in stored), layouts[0])
  tensors = [dataclasses.replace(t, name=_in_layout(t.name, layout))
             for t in tensors]
  return (tensors, _in_layout('lm_head.weight', layout),
          _LEFT_OUT[model_type])


def _first(names: list[str], count: int = 5) -> str:
  return ', '.join(names[:count]) + (', ...' if len(names) > count else '')


@dataclasses.dataclass(frozen=True)
class _Stored:
  """Where and how a checkpoint stores one tensor (from the file headers)."""

  file: str
  shape: tuple[int, ...]
  dtype: str  # safetensors code, e.g. 'BF16'


def _read_headers(
    model_dir: pathlib.Path,
) -> tuple[dict[str, _Stored], dict[str, str] | None, list[str]]:
  """Reads only the safetensors headers of a checkpoint directory.

  Returns:
    (tensor name -> _Stored, the index's weight_map or None, the weight
    files in reading order).
  """
  st = _safetensors()
  index_path = model_dir / _INDEX
  weight_map = None
  # As transformers: model.safetensors first, an index (perhaps one left
  # from an earlier sharded save) only without it.
  if (model_dir / _SINGLE).is_file():
    files = [_SINGLE]
  elif index_path.is_file():
    try:
      weight_map = dict(json.loads(index_path.read_text())['weight_map'])
    except (ValueError, KeyError, TypeError) as e:
      raise CheckpointError(
          f'{index_path}: not a JSON object with a weight_map ({e!r})'
      ) from None
    for key, file in weight_map.items():
      if not isinstance(file, str):
        raise CheckpointError(
            f'{index_path}: weight_map[{key!r}]={file!r}: must be a file '
            'name (a string)'
        )
    files = sorted(set(weight_map.values()))
  else:
    files = sorted(p.name for p in model_dir.glob('*.safetensors'))
    if not files:
      raise CheckpointError(
          f'{model_dir} has no {_SINGLE}, {_INDEX} or other *.safetensors '
          'weights'
      )
  stored = {}
  for name in files:
    path = model_dir / name
    if not path.is_file():
      raise CheckpointError(f'{index_path} names {name}, which is missing')
    try:
      with st.safe_open(path, framework='numpy') as f:
        for key in f.keys():
          tensor = f.get_slice(key)
          stored[key] = _Stored(
              name, tuple(tensor.get_shape()), tensor.get_dtype()
          )
    except (OSError, st.SafetensorError) as e:
      error = CheckpointError(f'{path}: unreadable safetensors file ({e})')
      raise error from None
  return stored, weight_map, files


def _check_tensors(
    model_dir: pathlib.Path,
    cfg: ModelConfig,
    expected: list[_Tensor],
    stored: Mapping[str, _Stored],
    weight_map: Mapping[str, str] | None,
    head: str = 'lm_head.weight',
    left_out: tuple[str, ...] = (),
) -> None:
  """Raises unless `stored` holds exactly `expected`, HF-shaped floats
  (besides a tied lm_head `head` and tensors under the `left_out`
  prefixes)."""
  missing = [t.name for t in expected if t.name not in stored]
  if missing:
    name = missing[0]
    if weight_map is None:
      where = ', '.join(sorted({s.file for s in stored.values()}))
    elif name in weight_map:
      where = f'{weight_map[name]} (the file {_INDEX} names for it)'
    else:
      where = f'{_INDEX} (it has no entry) and the files it names'
    more = ''
    if len(missing) > 1:
      more = f' ({len(missing)} missing in all: {_first(missing)})'
    raise CheckpointError(
        f'{model_dir}: tensor {name!r} is missing from {where}{more}'
    )
  known = {t.name for t in expected}
  if cfg.tie_embeddings:
    known.add(head)  # Tolerated if equal to the embedding.
  unexpected = sorted(
      n for n in stored
      if n not in known and not n.endswith('.rotary_emb.inv_freq')
      and not n.startswith(left_out)
  )
  if unexpected:
    raise CheckpointError(
        f'{model_dir}: {len(unexpected)} tensors have no place in the '
        f'{cfg.num_layers}-layer decoder config.json describes: '
        f'{_first(unexpected)}'
    )
  shapes = {t.name: t.hf_shape for t in expected}
  shapes[head] = (cfg.vocab_size, cfg.embed_dim)
  for name, want in shapes.items():
    if name not in stored:
      continue
    where = model_dir / stored[name].file
    if stored[name].shape != want:
      raise CheckpointError(
          f'{where}: tensor {name!r} has shape {list(stored[name].shape)}, '
          f'expected {list(want)} from config.json'
      )
    if stored[name].dtype not in _FLOAT_DTYPES:
      raise CheckpointError(
          f'{where}: tensor {name!r} has dtype {stored[name].dtype}; '
          f'weights must be one of {", ".join(_FLOAT_DTYPES)}'
      )


def load(
    model_dir: str | os.PathLike[str],
    *,
    dtype: str = 'float32',
    param_dtype: str | None = None,
) -> tuple[ModelConfig, nnx.GraphDef, nnx.State]:
  """Builds a decoder from a Hugging Face checkpoint directory.

  Reads config.json and either `model.safetensors` or the shards named by
  `model.safetensors.index.json`, one file at a time. Each tensor is read,
  transposed into the decoder's layout and cast in one copy, then moved to
  the default device, so host memory peaks at the params loaded so far plus
  three copies of the largest tensor (as stored, converted, on device),
  never two copies of the whole model.

  Length: its docstring documents the accepted layouts; the code is one mapping
  from Hugging Face's tensor names to our params.

  Args:
    model_dir: the directory `save_pretrained` wrote.
    dtype: compute dtype of the decoder, 'float32' or 'bfloat16'.
    param_dtype: storage dtype of the params; by default the checkpoint's
      ('bfloat16' for a bfloat16 checkpoint, else 'float32').

  Returns:
    (cfg, graphdef, params), ready for `decoder.forward` and
    `jaxgrpo.generate.generator.Generator`.

  Raises:
    CheckpointError: a missing config.json or weight file, an unsupported
      or malformed config (see `hf_config.from_hf`), a missing, unexpected
      or mis-shaped tensor, a weight of a non-float dtype, or an lm_head
      that differs from tied embeddings.
  """
  model_dir = pathlib.Path(model_dir)
  config_path = model_dir / _CONFIG
  if not config_path.is_file():
    raise CheckpointError(
        f'{config_path} not found: a Hugging Face checkpoint directory holds '
        'config.json and *.safetensors weights'
    )
  try:
    raw_config = json.loads(config_path.read_text())
  except (OSError, ValueError) as e:
    raise CheckpointError(f'{config_path}: unreadable JSON ({e})') from None
  cfg = hf_config.from_hf(raw_config, dtype=dtype,
                          param_dtype=param_dtype or 'float32',
                          source=os.fspath(config_path))
  stored, weight_map, files = _read_headers(model_dir)
  tensors, head, left_out = _text_model(
      raw_config.get('model_type'), _tensors(cfg), stored)
  _check_tensors(model_dir, cfg, tensors, stored, weight_map, head, left_out)
  if param_dtype is None:
    stored_dtype = stored[tensors[0].name].dtype
    cfg = dataclasses.replace(
        cfg, param_dtype=_SAFETENSORS_DTYPES.get(stored_dtype, 'float32')
    )
  graphdef, abstract = decoder.abstract_params(cfg)
  np_dtype = np.dtype(jnp.dtype(cfg.param_dtype))

  st = _safetensors()
  arrays = {}
  for file in files:
    group = [t for t in tensors if stored[t.name].file == file]
    if not group:
      continue
    with st.safe_open(model_dir / file, framework='numpy') as f:
      for t in group:
        raw = f.get_tensor(t.name)
        if bad := int(np.count_nonzero(~np.isfinite(raw))):
          raise CheckpointError(
              f'{model_dir / file}: tensor {t.name!r} holds {bad} NaN or '
              f'infinite values (of {raw.size}): the file is damaged')
        arrays[t.path] = jnp.asarray(t.to_decoder(raw, np_dtype))
  if cfg.tie_embeddings and head in stored:
    with st.safe_open(model_dir / stored[head].file, framework='numpy') as f:
      tied = f.get_tensor(head).astype(np_dtype)
    if not np.array_equal(tied, np.asarray(arrays[('embedding',)])):
      raise CheckpointError(
          f'{model_dir}: config.json has tie_word_embeddings=true but '
          f'{head} differs from {tensors[0].name}'
      )
    del tied
  params = nnx.from_flat_state([
      (path, var.replace(arrays.pop(path)))
      for path, var in nnx.to_flat_state(abstract)
  ])
  return cfg, graphdef, params


def context_length(model_dir: str | os.PathLike[str]) -> int | None:
  """The positions the model was trained for (config.json's
  `max_position_embeddings`, an image-text model's text_config's), or None
  when it does not say (a value that is not a positive int says nothing)."""
  try:
    value = hf_config.text_config(json.loads(
        (pathlib.Path(model_dir) / _CONFIG).read_text())).get(
            'max_position_embeddings')
  except (OSError, ValueError, AttributeError):
    return None
  ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
  return value if ok else None


def export(
    cfg: ModelConfig,
    params: nnx.State,
    out_dir: str | os.PathLike[str],
    *,
    hf_config_extra: Mapping[str, Any] | None = None,
    max_shard_bytes: int = 5 * 10**9,
) -> pathlib.Path:
  """Writes decoder params as a Hugging Face checkpoint directory.

  Writes config.json (see `hf_config.to_hf`) and the weights in their own dtype,
  as `model.safetensors` or, past `max_shard_bytes`, as numbered shards with
  `model.safetensors.index.json`, the layout of `save_pretrained`. Stale
  weight files of an earlier export to the same directory are removed. Host
  memory holds one shard's tensors at a time besides the params.

  Length: one mapping from our params to Hugging Face's tensor names and config,
  which reads best in one place beside `load`.

  Args:
    cfg: the params' model config.
    params: decoder params (from `decoder.init_params`, `load`, training).
    out_dir: directory to write; created if needed.
    hf_config_extra: more config.json entries, e.g. the source checkpoint's
      bos/eos_token_id or max_position_embeddings. Entries that describe
      the architecture, RoPE or dtype always come from `cfg` and `params`;
      the same keys here are ignored.
    max_shard_bytes: largest size of one weight file (a larger single
      tensor gets a file of its own).

  Returns:
    The output directory.

  Raises:
    ValueError: `params` does not match `cfg`, or `cfg` has no Hugging Face
      equivalent.
  """
  if max_shard_bytes <= 0:
    raise ValueError(f'export: max_shard_bytes must be > 0, got '
                     f'{max_shard_bytes}')
  # Fails early for a config transformers cannot express.
  hf_config.model_type_of(cfg)
  tensors = _tensors(cfg)
  flat = {path: var.get_value() for path, var in nnx.to_flat_state(params)}
  fmt = lambda path: '.'.join(map(str, path))
  missing = [fmt(t.path) for t in tensors if t.path not in flat]
  unexpected = sorted(map(fmt, set(flat) - {t.path for t in tensors}))
  if missing or unexpected:
    raise ValueError(
        f'export: params do not match the model config: missing '
        f'{missing[:5]}, unexpected {unexpected[:5]}'
    )
  for t in tensors:
    if tuple(flat[t.path].shape) != t.shape:
      raise ValueError(
          f'export: param {fmt(t.path)} has shape '
          f'{list(flat[t.path].shape)}, the model config expects '
          f'{list(t.shape)}'
      )
  config = {
      k: v for k, v in (hf_config_extra or {}).items()
      if k not in hf_config.DERIVED_KEYS
  }
  config.update(hf_config.to_hf(
      cfg, torch_dtype=str(np.dtype(flat[('embedding',)].dtype))
  ))

  shards, size = [[]], 0
  for t in tensors:
    nbytes = math.prod(t.shape) * flat[t.path].dtype.itemsize
    if shards[-1] and size + nbytes > max_shard_bytes:
      shards.append([])
      size = 0
    shards[-1].append(t)
    size += nbytes
  names = [_SINGLE] if len(shards) == 1 else [
      _SHARD.format(i + 1, len(shards)) for i in range(len(shards))
  ]

  st = _safetensors()
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  for old in out_dir.iterdir():
    if WEIGHT_FILES.fullmatch(old.name):
      old.unlink()
  weight_map, total = {}, 0
  umask = os.umask(0)
  os.umask(umask)
  for name, shard in zip(names, shards):
    arrays = {
        t.name: t.to_hf(np.asarray(jax.device_get(flat[t.path])))
        for t in shard
    }
    st.numpy.save_file(arrays, out_dir / name, metadata={'format': 'pt'})
    # safetensors creates its files owner-only; give them the usual mode.
    os.chmod(out_dir / name, 0o666 & ~umask)
    weight_map.update(dict.fromkeys(arrays, name))
    total += sum(a.nbytes for a in arrays.values())
    del arrays
  if len(shards) > 1:
    index = dict(metadata=dict(total_size=total), weight_map=weight_map)
    (out_dir / _INDEX).write_text(json.dumps(index, indent=2) + '\n')
  (out_dir / _CONFIG).write_text(
      json.dumps(config, indent=2, sort_keys=True) + '\n'
  )
  return out_dir
