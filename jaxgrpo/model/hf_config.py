"""Hugging Face config.json <-> `ModelConfig`.

`from_hf` reads the config of a Llama, Mistral (without sliding window),
Qwen2, Qwen3, Gemma 2 or Gemma 3 causal LM, or the text model of a Gemma 3
image-text model (`Gemma3ForConditionalGeneration`); `to_hf` writes the
entries that describe a `ModelConfig` to transformers. The weights are
`jaxgrpo.model.hf`'s.

Size: Gemma's entries (`_from_gemma`, `_to_gemma`) reuse the common RoPE
and shape entries (`_rope`, `_shape_entries`) in both directions, the
readers of each scaled RoPE type share `_rope`'s checks of the rope dict,
and every entry read goes through the same type check (`_get`).
"""

from __future__ import annotations

from collections.abc import Mapping
import dataclasses
from typing import Any

from jaxgrpo import errors
from jaxgrpo.model.config import ModelConfig
from jaxgrpo.model import rope_scaling
from jaxgrpo.model.rope_scaling import RopeScaling

ARCHITECTURES = {
    'llama': 'LlamaForCausalLM',
    'mistral': 'MistralForCausalLM',
    'qwen2': 'Qwen2ForCausalLM',
    'qwen3': 'Qwen3ForCausalLM',
    'gemma2': 'Gemma2ForCausalLM',
    'gemma3_text': 'Gemma3ForCausalLM',
}
GEMMA = ('gemma2', 'gemma3_text')
# Image-text models whose text model loads: model_type -> its text_config's.
MULTIMODAL = {'gemma3': 'gemma3_text'}
# The text_config entries transformers leaves out of such a config.json when
# they equal its defaults (Gemma3TextConfig's; gemma-3-4b-it states only its
# sizes, layers, window and RoPE scaling), where ours would differ or fail.
_TEXT_DEFAULTS = {
    'gemma3_text': dict(
        vocab_size=262_208, hidden_size=2304, intermediate_size=9216,
        num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
        head_dim=256, hidden_activation='gelu_pytorch_tanh',
        max_position_embeddings=131_072, query_pre_attn_scalar=256,
        sliding_window=4096),
}
# What transformers' Gemma2Config and Gemma3TextConfig take for entries a
# config.json leaves out, where ours would differ: a file that drops them
# loaded as another model (no softcaps, the head size as the query scale).
_GEMMA_DEFAULTS = {
    'gemma2': dict(query_pre_attn_scalar=256, sliding_window=4096,
                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
    'gemma3_text': dict(query_pre_attn_scalar=256, sliding_window=4096),
}
# config.json entries that `export` derives from the model; the same keys in
# `hf_config_extra` are dropped so they cannot contradict the weights.
DERIVED_KEYS = frozenset({
    'architectures', 'model_type', 'vocab_size', 'hidden_size',
    'intermediate_size', 'num_hidden_layers', 'num_attention_heads',
    'num_key_value_heads', 'head_dim', 'hidden_act', 'rms_norm_eps',
    'rope_theta', 'rope_scaling', 'rope_parameters', 'partial_rotary_factor',
    'original_max_position_embeddings', 'tie_word_embeddings',
    'attention_bias', 'mlp_bias', 'use_sliding_window', 'sliding_window',
    'max_window_layers', 'layer_types', 'torch_dtype', 'dtype',
    'transformers_version', 'hidden_activation', 'query_pre_attn_scalar',
    'attn_logit_softcapping', 'final_logit_softcapping', 'rope_local_base_freq',
    'sliding_window_pattern', 'use_bidirectional_attention',
})


class CheckpointError(errors.ConfigError):
  """A Hugging Face checkpoint is missing, unsupported or does not fit."""


# What a config.json value of a type no check below foresaw raises; `from_hf`
# turns it into a CheckpointError naming the file.
_MALFORMED = (TypeError, KeyError, AttributeError, ZeroDivisionError)
# The kinds of value `_check` accepts (never a bool, although it is an int).
_KINDS = {
    'a positive int': lambda v: isinstance(v, int) and v > 0,
    'an int': lambda v: isinstance(v, int),
    'a number': lambda v: isinstance(v, (int, float)),
    'a list': lambda v: isinstance(v, list),
    'an object': lambda v: isinstance(v, Mapping),
}
# Size entries read into ModelConfig: ours -> config.json key (all required).
_SIZES = dict(vocab_size='vocab_size', num_layers='num_hidden_layers',
              embed_dim='hidden_size', num_heads='num_attention_heads',
              mlp_dim='intermediate_size')


def _check(name: str, value: Any, kind: str) -> Any:
  """`value`, the config.json entry `name`, if it is `kind` (see `_KINDS`)."""
  if isinstance(value, bool) or not _KINDS[kind](value):
    raise CheckpointError(f'{name}={value!r}: must be {kind}')
  return value


def _get(config: Mapping[str, Any], key: str, kind: str, default: Any = None,
         *, where: str = '') -> Any:
  """`config[key]` checked to be `kind`, or `default` when absent.

  Null counts as absent only where `default` is None (optional entries such
  as head_dim); `where` names the dict holding `key` ('rope_scaling.').
  """
  value = config.get(key, default)
  if value is None and default is None:
    return None
  return _check(where + key, value, kind)


def _sizes(config: Mapping[str, Any]) -> dict[str, int]:
  """ModelConfig's size fields, from config.json entries of positive ints."""
  sizes = {ours: _check(key, config[key], 'a positive int')
           for ours, key in _SIZES.items()}
  heads = sizes['num_heads']
  sizes['num_kv_heads'] = (
      _get(config, 'num_key_value_heads', 'a positive int') or heads)
  head_dim = _get(config, 'head_dim', 'a positive int')
  if head_dim is None and sizes['embed_dim'] % heads:
    raise CheckpointError(
        f'hidden_size={sizes["embed_dim"]} is not a multiple of '
        f'num_attention_heads={heads}, and no head_dim is given')
  sizes['head_dim'] = head_dim or sizes['embed_dim'] // heads
  return sizes


# The entries of a rope dict that transformers reads for each RoPE type
# supported here, besides rope_type (or type), rope_theta and
# partial_rotary_factor; any other is refused by name. Each scaled type's
# reader (`_SCALINGS`) gives the ModelConfig fields it sets.
_ROPE_KEYS = {
    'default': (),
    'linear': ('factor',),
    'dynamic': ('factor',),
    'llama3': ('factor', 'low_freq_factor', 'high_freq_factor',
               'original_max_position_embeddings'),
    'yarn': ('factor', 'original_max_position_embeddings', 'attention_factor',
             'beta_fast', 'beta_slow', 'mscale', 'mscale_all_dim',
             'truncate'),
}
_ROPE_COMMON = frozenset({'rope_type', 'type', 'rope_theta',
                          'partial_rotary_factor'})


def _rope(config: Mapping[str, Any]) -> dict[str, Any]:
  """ModelConfig's RoPE fields from either config.json rope convention.

  transformers >= 5 writes one `rope_parameters` dict holding `rope_theta`;
  older checkpoints have a top-level `rope_theta` and `rope_scaling`. The
  fields are rope_theta and, for a scaled RoPE, rope_linear_factor
  ('linear') or rope_scaling ('llama3', 'yarn', 'dynamic').
  """
  key = 'rope_parameters'
  params = config.get(key)
  if not params:
    key = 'rope_scaling'
    params = config.get(key) or {}
  if not isinstance(params, Mapping) or any(
      isinstance(v, Mapping) for v in params.values()
  ):
    raise CheckpointError(
        f'{key}={params!r} is not supported: only one RoPE setting shared by '
        'every layer'
    )
  holder, where = (params, f'{key}.') if 'rope_theta' in params else (
      config, '')
  theta = float(_get(holder, 'rope_theta', 'a number', 10_000.0, where=where))
  partial = params.get(
      'partial_rotary_factor', config.get('partial_rotary_factor', 1.0)
  )
  if partial != 1.0:
    raise CheckpointError(
        f'partial_rotary_factor={partial!r} is not supported: RoPE must '
        'rotate the whole head'
    )
  rope_type = params.get('rope_type', params.get('type', 'default'))
  if rope_type not in _ROPE_KEYS:
    raise CheckpointError(
        f'{key}.rope_type={rope_type!r} is not supported; supported: '
        f'{", ".join(map(repr, _ROPE_KEYS))}'
    )
  unknown = sorted(set(params) - _ROPE_COMMON - set(_ROPE_KEYS[rope_type]))
  if unknown:
    raise CheckpointError(
        f'{key} of type {rope_type!r} has {", ".join(unknown)}, which '
        f'transformers does not read for that type; it reads '
        f'{", ".join(_ROPE_KEYS[rope_type]) or "rope_theta only"}'
    )
  if rope_type == 'default':
    return dict(rope_theta=theta)
  try:
    return dict(rope_theta=theta,
                **_SCALINGS[rope_type](config, params, key))
  except ValueError as e:  # a scaling class's own check
    if isinstance(e, CheckpointError):
      raise
    raise CheckpointError(f'{key}: {e}') from None


def _param(params: Mapping[str, Any], key: str, name: str,
           kind: str = 'a number', *, required: bool = False,
           rope_type: str = '') -> Any:
  """The entry `name` of the rope dict `key`, checked to be `kind` (None
  when absent or null, unless `required`)."""
  value = _get(params, name, kind, where=f'{key}.')
  if value is None and required:
    raise CheckpointError(f'{key} of type {rope_type!r} has no {name}')
  return value


def _context(config: Mapping[str, Any], params: Mapping[str, Any],
             key: str, rope_type: str) -> int | float:
  """original_max_position_embeddings as transformers reads it: a
  top-level value wins, then the rope dict's, then the model's maximum
  length."""
  name = 'original_max_position_embeddings'
  for holder, where in ((config, name), (params, f'{key}.{name}'),
                        (config, 'max_position_embeddings')):
    value = holder.get(where.rpartition('.')[2])
    if value is not None:
      return _check(where, value, 'a number')
  raise CheckpointError(f'{key} of type {rope_type!r} has no {name}')


def _linear(config, params, key) -> dict[str, Any]:
  """rope_linear_factor, the factor of a 'linear' RoPE."""
  del config
  factor = _param(params, key, 'factor', required=True, rope_type='linear')
  return dict(rope_linear_factor=float(factor))


def _dynamic(config, params, key) -> dict[str, Any]:
  """DynamicScaling's fields: its factor and the model's length."""
  factor = _param(params, key, 'factor', required=True, rope_type='dynamic')
  limit = _get(config, 'max_position_embeddings', 'a positive int')
  if limit is None:
    raise CheckpointError(
        f"{key} of type 'dynamic' needs max_position_embeddings, the length "
        'past which it rescales RoPE; config.json has none')
  return dict(rope_scaling=rope_scaling.DynamicScaling(
      factor=float(factor), max_position_embeddings=limit))


def _llama3(config, params, key) -> dict[str, Any]:
  """RopeScaling's fields, every one required."""
  fields = {name: _param(params, key, name, required=True, rope_type='llama3')
            for name in ('factor', 'low_freq_factor', 'high_freq_factor')}
  return dict(rope_scaling=RopeScaling(
      **fields, original_max_position_embeddings=_context(
          config, params, key, 'llama3')))


def _yarn(config, params, key) -> dict[str, Any]:
  """YarnScaling's fields, each read as transformers'
  `_compute_yarn_parameters` reads it."""
  if 'factor' not in params:
    raise CheckpointError(f"{key} of type 'yarn' has no factor")
  context = _context(config, params, key, 'yarn')
  factor = _param(params, key, 'factor')
  if factor is None:  # as transformers: the ratio of the two lengths
    factor = _get(config, 'max_position_embeddings', 'a positive int',
                  context) / context
  number = lambda name: _param(params, key, name)
  attention_factor = number('attention_factor')
  mscale, mscale_all_dim = number('mscale'), number('mscale_all_dim')
  if attention_factor is None and mscale and mscale_all_dim:
    attention_factor = (rope_scaling.yarn_mscale(factor, mscale)
                        / rope_scaling.yarn_mscale(factor, mscale_all_dim))
  truncate = params.get('truncate', True)
  if truncate not in (True, False, None):
    raise CheckpointError(
        f'{key}.truncate={truncate!r}: must be true or false')
  return dict(rope_scaling=rope_scaling.YarnScaling(
      factor=float(factor), original_max_position_embeddings=context,
      beta_fast=float(number('beta_fast') or 32),
      beta_slow=float(number('beta_slow') or 1),
      truncate=bool(truncate),
      attention_factor=(None if attention_factor is None
                        else float(attention_factor))))


_SCALINGS = dict(linear=_linear, dynamic=_dynamic, llama3=_llama3, yarn=_yarn)


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
  """The config of the causal LM in config.json: `config` itself, or an
  image-text model's `text_config` (see `MULTIMODAL`) with the defaults
  transformers leaves out filled in; the vision config is not read."""
  model_type = config.get('model_type')
  if model_type not in MULTIMODAL:
    return config
  text = _get(config, 'text_config', 'an object') or {}
  kind = MULTIMODAL[model_type]
  if text.get('model_type', kind) != kind:
    raise CheckpointError(
        f'text_config.model_type={text["model_type"]!r} is not supported in '
        f'a model_type {model_type!r} config; only {kind!r}')
  tied = config.get('tie_word_embeddings', True)
  return {**_TEXT_DEFAULTS[kind], 'tie_word_embeddings': tied, **text,
          'model_type': kind}


def _check_full_attention(config: Mapping[str, Any], model_type: str) -> None:
  """Raises if config.json turns on sliding-window attention anywhere."""
  layer_types = _get(config, 'layer_types', 'a list')
  if layer_types is not None:
    others = sorted(set(layer_types) - {'full_attention'})
    if others:
      raise CheckpointError(
          f'layer_types has {others}: only full attention is supported'
      )
    return
  window = config.get('sliding_window')
  if window is None:
    return
  if model_type == 'mistral' or (
      model_type in ('qwen2', 'qwen3')
      and config.get('use_sliding_window')
      and _get(config, 'max_window_layers', 'an int', 0)
      < config['num_hidden_layers']
  ):
    raise CheckpointError(
        f'sliding_window={window!r} is active (model_type {model_type!r}): '
        'only full attention is supported'
    )


def from_hf(
    config: Any,
    *,
    dtype: str = 'float32',
    param_dtype: str = 'float32',
    source: str = 'config.json',
) -> ModelConfig:
  """The ModelConfig of a Hugging Face `config.json`.

  Args:
    config: the parsed config.json of a llama, mistral, qwen2, qwen3,
      gemma2 or gemma3_text model, or of a gemma3 image-text model, whose
      text model it describes (see `text_config`).
    dtype: compute dtype of the decoder.
    param_dtype: storage dtype of its params.
    source: the file's path, which begins every error message.

  Raises:
    ValueError: an invalid `dtype` or `param_dtype`.
    CheckpointError: an unsupported model type or feature (RoPE types
      other than default, linear, dynamic, llama3 and yarn, an entry of
      the rope dict transformers does not read, sliding-window attention,
      attention biases outside Qwen2, MLP biases, a non-SiLU activation), a
      missing key or a value of the wrong type; the message names the
      file, the key and the value.
  """
  if not isinstance(config, Mapping):
    kind = {list: 'list', str: 'string', bool: 'boolean',
            type(None): 'null'}.get(type(config), 'number')
    raise CheckpointError(f'{source} is a JSON {kind}; expected an object')
  try:
    cfg = _from_config(config)
  except ValueError as e:  # CheckpointError, or a ModelConfig field's check.
    raise CheckpointError(f'{source}: {e}') from None
  except _MALFORMED as e:
    raise CheckpointError(
        f'{source}: malformed entry ({type(e).__name__}: {e})') from e
  return dataclasses.replace(cfg, dtype=dtype, param_dtype=param_dtype)


def _from_config(config: Mapping[str, Any]) -> ModelConfig:
  """`from_hf` of a config.json object; errors name only the key."""
  model_type = config.get('model_type')
  if model_type in MULTIMODAL:
    try:
      return _from_config(text_config(config))
    except ValueError as e:
      if str(e).startswith('text_config'):
        raise
      raise CheckpointError(f'text_config: {e}') from None
  if model_type not in ARCHITECTURES:
    raise CheckpointError(
        f'model_type={model_type!r} is not supported; supported: '
        f'{", ".join(ARCHITECTURES)}, and the text model of '
        f'{", ".join(MULTIMODAL)}'
    )
  for key in _SIZES.values():
    if config.get(key) is None:
      raise CheckpointError(f'has no {key!r} (model_type {model_type!r})')
  if model_type in GEMMA:
    return _from_gemma(config, model_type)
  act = config.get('hidden_act', 'silu')
  if act != 'silu':
    raise CheckpointError(
        f"hidden_act={act!r} is not supported; only 'silu'"
    )
  for key in ('mlp_bias',) + (() if model_type == 'qwen2' else
                              ('attention_bias',)):
    if config.get(key):
      raise CheckpointError(
          f'{key}={config[key]!r} is not supported for model_type '
          f'{model_type!r}'
      )
  _check_full_attention(config, model_type)
  return ModelConfig(
      **_sizes(config),
      **_rope(config),
      norm_eps=float(_get(config, 'rms_norm_eps', 'a number', 1e-6)),
      qkv_bias=model_type == 'qwen2',
      qk_norm=model_type == 'qwen3',
      tie_embeddings=bool(config.get('tie_word_embeddings', False)),
  )


def _gemma_rope(
    config: Mapping[str, Any], model_type: str
) -> dict[str, Any]:
  """ModelConfig RoPE fields of a Gemma 2 or Gemma 3 config.json."""
  params = _get(config, 'rope_parameters', 'an object') or {}
  if model_type == 'gemma2' or not any(
      isinstance(v, Mapping) for v in params.values()
  ):
    if model_type == 'gemma3_text':
      # Older Gemma 3 configs: rope_theta (+ rope_scaling) for global
      # layers, rope_local_base_freq for local ones.
      full_key, local_key = 'rope_scaling', 'rope_local_base_freq'
      full = dict(_get(config, 'rope_scaling', 'an object') or {},
                  rope_theta=_get(config, 'rope_theta', 'a number', 1e6))
      local = dict(rope_type='default', rope_theta=_get(
          config, 'rope_local_base_freq', 'a number', 1e4))
    else:
      rope = _rope(config)
      if len(rope) > 1:
        raise CheckpointError('RoPE scaling is not supported for gemma2')
      return rope
  else:
    full_key = 'rope_parameters.full_attention'
    local_key = 'rope_parameters.sliding_attention'
    full = params.get('full_attention') or {}
    local = params.get('sliding_attention') or {}
  out = dict(
      rope_theta=float(_get(full, 'rope_theta', 'a number', 1e6,
                            where=f'{full_key}.')),
      rope_local_theta=float(_get(local, 'rope_theta', 'a number', 1e4,
                                  where=f'{local_key}.')))
  if local.get('rope_type', 'default') != 'default':
    raise CheckpointError(
        f'sliding-attention RoPE {local!r} is not supported: only '
        "rope_type 'default'"
    )
  kind = full.get('rope_type', full.get('type', 'default'))
  if kind == 'linear':
    factor = _get(full, 'factor', 'a number', where=f'{full_key}.')
    if factor is None:
      raise CheckpointError(f"{full_key} of type 'linear' has no factor")
    out['rope_linear_factor'] = float(factor)
  elif kind != 'default':
    raise CheckpointError(
        f'full-attention RoPE {full!r} is not supported; supported '
        "rope_type: 'default', 'linear'"
    )
  return out


def _from_gemma(config: Mapping[str, Any], model_type: str) -> ModelConfig:
  """The ModelConfig of a Gemma 2 or Gemma 3 (text) config.json.

  Entries it leaves out take transformers' defaults (`_GEMMA_DEFAULTS`).
  Gemma 3 has no attention-logit softcap: transformers' Gemma 3 reads
  `attn_logit_softcapping` but does not apply it, so a config.json that
  sets it is refused rather than loaded as another model.
  """
  config = {**_GEMMA_DEFAULTS[model_type], **config}
  if model_type == 'gemma3_text' and config.get(
      'attn_logit_softcapping') is not None:
    raise CheckpointError(
        f'attn_logit_softcapping={config["attn_logit_softcapping"]!r} is not '
        "supported for model_type 'gemma3_text': transformers' Gemma 3 does "
        'not apply it (it uses q/k norms); set it to null to load the model '
        'transformers loads')
  act_key = ('hidden_activation' if config.get('hidden_activation')
             else 'hidden_act')  # the key the file holds
  act = config.get(act_key)
  if act not in ('gelu_pytorch_tanh', 'gelu_tanh'):
    raise CheckpointError(
        f"{act_key}={act!r} is not supported; only 'gelu_pytorch_tanh'")
  for key in ('attention_bias', 'use_bidirectional_attention'):
    if config.get(key):
      raise CheckpointError(
          f'{key}={config[key]!r} is not supported for model_type '
          f'{model_type!r}'
      )
  sizes = _sizes(config)
  n = sizes['num_layers']
  layer_types = _get(config, 'layer_types', 'a list')
  if layer_types is None:
    pattern = _get(config, 'sliding_window_pattern', 'a positive int',
                   2 if model_type == 'gemma2' else 6)
    layer_types = ['sliding_attention' if (i + 1) % pattern else
                   'full_attention' for i in range(n)]
  unknown = sorted(set(layer_types) - {'sliding_attention', 'full_attention'})
  if unknown or len(layer_types) != n:
    raise CheckpointError(
        f'layer_types={layer_types!r} is not supported: one of '
        "'sliding_attention', 'full_attention' per layer"
    )
  sliding = tuple(i for i, t in enumerate(layer_types)
                  if t == 'sliding_attention')
  number = lambda key, default=None: _get(config, key, 'a number', default)
  return ModelConfig(
      **sizes,
      norm_eps=float(number('rms_norm_eps', 1e-6)),
      qk_norm=model_type == 'gemma3_text',
      tie_embeddings=bool(config.get('tie_word_embeddings', True)),
      sliding_window=(_get(config, 'sliding_window', 'a positive int')
                      if sliding else None),
      sliding_layers=sliding,
      attn_logit_softcap=number('attn_logit_softcapping'),
      final_logit_softcap=number('final_logit_softcapping'),
      query_pre_attn_scalar=number('query_pre_attn_scalar',
                                   sizes['head_dim']),
      norm_plus_one=True,
      sandwich_norms=True,
      mlp_activation='gelu_tanh',
      scale_embeddings=True,
      **_gemma_rope(config, model_type),
  )


def _is_gemma(cfg: ModelConfig) -> bool:
  """Whether `cfg` has Gemma's layout; raises for a partial one."""
  marks = dict(norm_plus_one=cfg.norm_plus_one,
               sandwich_norms=cfg.sandwich_norms,
               mlp_activation=cfg.mlp_activation == 'gelu_tanh',
               scale_embeddings=cfg.scale_embeddings)
  gemma_only = (cfg.sliding_layers or cfg.attn_logit_softcap
                or cfg.final_logit_softcap or cfg.rope_local_theta
                or cfg.query_pre_attn_scalar)
  if all(marks.values()):
    if cfg.qkv_bias or cfg.rope_scaling is not None:
      raise ValueError(
          'export: Gemma has no q/k/v biases or llama3, yarn or dynamic RoPE '
          'scaling')
    return True
  if any(marks.values()) or gemma_only:
    raise ValueError(
        'export: no Hugging Face model type matches a partly Gemma config '
        f'({marks}); Gemma 2/3 need all of them')
  return False


def model_type_of(cfg: ModelConfig) -> str:
  """The Hugging Face model type that expresses `cfg`."""
  if _is_gemma(cfg):
    if not cfg.qk_norm and (
        cfg.rope_local_theta is not None or cfg.rope_linear_factor != 1.0):
      raise ValueError(
          'export: Gemma 2 (no q/k norms) has one RoPE for every layer')
    if cfg.qk_norm and cfg.attn_logit_softcap:
      raise ValueError(
          "export: transformers' Gemma 3 (q/k norms) applies no "
          'attention-logit softcap')
    return 'gemma3_text' if cfg.qk_norm else 'gemma2'
  if cfg.qkv_bias and cfg.qk_norm:
    raise ValueError(
        'export: no Hugging Face model type has both q/k/v biases (Qwen2) '
        'and q/k norms (Qwen3)'
    )
  return 'qwen2' if cfg.qkv_bias else 'qwen3' if cfg.qk_norm else 'llama'


def _shape_entries(cfg: ModelConfig, kind: str) -> dict[str, Any]:
  """The config.json entries every family writes: its type and sizes."""
  return {
      'architectures': [ARCHITECTURES[kind]],
      'model_type': kind,
      'vocab_size': cfg.vocab_size,
      'hidden_size': cfg.embed_dim,
      'intermediate_size': cfg.mlp_dim,
      'num_hidden_layers': cfg.num_layers,
      'num_attention_heads': cfg.num_heads,
      'num_key_value_heads': cfg.num_kv_heads,
      'head_dim': cfg.head_dim,
  }


def to_hf(
    cfg: ModelConfig, *, torch_dtype: str | None = None
) -> dict[str, Any]:
  """The config.json entries that describe `cfg` to transformers.

  Args:
    cfg: model config; q/k/v biases make it 'qwen2', q/k norms 'qwen3',
      neither 'llama'.
    torch_dtype: the weights' dtype name; defaults to `cfg.param_dtype`.

  Returns:
    The entries; a RoPE scaling is written as `rope_scaling` (a 'dynamic'
    one with its max_position_embeddings), which `from_hf` reads back.

  Raises:
    ValueError: `cfg` has both q/k/v biases and q/k norms, or both a
      linear RoPE factor and another rope_scaling.
  """
  kind = model_type_of(cfg)
  if kind in GEMMA:
    return _to_gemma(cfg, kind, torch_dtype)
  out = {
      **_shape_entries(cfg, kind),
      'hidden_act': 'silu',
      'rms_norm_eps': cfg.norm_eps,
      'rope_theta': cfg.rope_theta,
      'tie_word_embeddings': cfg.tie_embeddings,
      'torch_dtype': torch_dtype or cfg.param_dtype,
  }
  if kind != 'qwen2':
    out['attention_bias'] = False
  if kind == 'llama':
    out['mlp_bias'] = False
  else:
    out['use_sliding_window'] = False
  if cfg.rope_linear_factor != 1.0:
    if cfg.rope_scaling is not None:
      raise ValueError(
          'export: no Hugging Face model has both a linear RoPE factor '
          f'and a {cfg.rope_scaling.rope_type!r} rope_scaling')
    out['rope_scaling'] = dict(rope_type='linear',
                               factor=cfg.rope_linear_factor)
  elif cfg.rope_scaling is not None:
    out['rope_scaling'] = dataclasses.asdict(cfg.rope_scaling)
    if cfg.rope_scaling.rope_type == 'dynamic':
      out['max_position_embeddings'] = out['rope_scaling'].pop(
          'max_position_embeddings')
  return out


def _to_gemma(
    cfg: ModelConfig, kind: str, torch_dtype: str | None
) -> dict[str, Any]:
  """`to_hf` for a Gemma 2 or Gemma 3 (text) config."""
  out = {
      **_shape_entries(cfg, kind),
      'hidden_activation': 'gelu_pytorch_tanh',
      'rms_norm_eps': cfg.norm_eps,
      'tie_word_embeddings': cfg.tie_embeddings,
      'attention_bias': False,
      'query_pre_attn_scalar': cfg.query_pre_attn_scalar or cfg.head_dim,
      'attn_logit_softcapping': cfg.attn_logit_softcap,
      'final_logit_softcapping': cfg.final_logit_softcap,
      'sliding_window': cfg.sliding_window,
      'layer_types': [
          'sliding_attention' if i in cfg.sliding_layers else 'full_attention'
          for i in range(cfg.num_layers)
      ],
      'torch_dtype': torch_dtype or cfg.param_dtype,
  }
  # transformers 5 reads `rope_parameters`; the entries before it
  # (`rope_theta`, Gemma 3's `rope_local_base_freq` and `rope_scaling`) are
  # written too, for readers that know only those (transformers 4).
  out['rope_theta'] = cfg.rope_theta
  if kind == 'gemma2':
    out['rope_parameters'] = dict(rope_type='default',
                                  rope_theta=cfg.rope_theta)
  else:
    full = dict(rope_type='default', rope_theta=cfg.rope_theta)
    if cfg.rope_linear_factor != 1.0:
      full.update(rope_type='linear', factor=cfg.rope_linear_factor)
    local = dict(rope_type='default',
                 rope_theta=cfg.rope_local_theta or cfg.rope_theta)
    out['rope_parameters'] = dict(full_attention=full,
                                  sliding_attention=local)
    out['rope_local_base_freq'] = local['rope_theta']
    out['rope_scaling'] = (dict(rope_type='linear', factor=full['factor'])
                           if 'factor' in full else None)
  return out
