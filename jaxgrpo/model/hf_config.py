"""Hugging Face config.json <-> `ModelConfig`.

`from_hf` reads the config of a Llama, Mistral (without sliding window),
Qwen2, Qwen3, Gemma 2 or Gemma 3 (text) causal LM; `to_hf` writes the
entries that describe a `ModelConfig` to transformers. The weights are
`jaxgrpo.model.hf`'s.

Size: Gemma's entries (`_from_gemma`, `_to_gemma`) reuse the common RoPE
and shape entries (`_rope`, `_shape_entries`) in both directions.
"""

from __future__ import annotations

from collections.abc import Mapping
import dataclasses
from typing import Any

from jaxgrpo import errors
from jaxgrpo.model.config import ModelConfig
from jaxgrpo.model.config import RopeScaling

ARCHITECTURES = {
    'llama': 'LlamaForCausalLM',
    'mistral': 'MistralForCausalLM',
    'qwen2': 'Qwen2ForCausalLM',
    'qwen3': 'Qwen3ForCausalLM',
    'gemma2': 'Gemma2ForCausalLM',
    'gemma3_text': 'Gemma3ForCausalLM',
}
GEMMA = ('gemma2', 'gemma3_text')
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


class CheckpointError(errors.UserError, ValueError):
  """A Hugging Face checkpoint is missing, unsupported or does not fit."""


def _rope(config: Mapping[str, Any]) -> tuple[float, RopeScaling | None]:
  """RoPE base and scaling from either config.json rope convention.

  transformers >= 5 writes one `rope_parameters` dict holding `rope_theta`;
  older checkpoints have a top-level `rope_theta` and `rope_scaling`.
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
        f'config.json {key}={params!r} is not supported: only one RoPE '
        'setting shared by every layer'
    )
  theta = float(params.get('rope_theta', config.get('rope_theta', 10_000.0)))
  partial = params.get(
      'partial_rotary_factor', config.get('partial_rotary_factor', 1.0)
  )
  if partial != 1.0:
    raise CheckpointError(
        f'config.json partial_rotary_factor={partial!r} is not supported: '
        'RoPE must rotate the whole head'
    )
  rope_type = params.get('rope_type', params.get('type', 'default'))
  if rope_type == 'default':
    return theta, None
  if rope_type != 'llama3':
    raise CheckpointError(
        f'config.json {key}.rope_type={rope_type!r} is not supported; '
        "supported: 'default', 'llama3'"
    )
  # As transformers: a top-level value wins, then the rope dict's, then the
  # model's maximum length.
  context = config.get(
      'original_max_position_embeddings',
      params.get(
          'original_max_position_embeddings',
          config.get('max_position_embeddings'),
      ),
  )
  fields = {name: params.get(name)
            for name in ('factor', 'low_freq_factor', 'high_freq_factor')}
  fields['original_max_position_embeddings'] = context
  for name, value in fields.items():
    if value is None:
      raise CheckpointError(f"config.json {key} of type 'llama3' has no {name}")
  try:
    return theta, RopeScaling(**fields)
  except ValueError as e:
    raise CheckpointError(f'config.json {key}: {e}') from None


def _check_full_attention(config: Mapping[str, Any], model_type: str) -> None:
  """Raises if config.json turns on sliding-window attention anywhere."""
  layer_types = config.get('layer_types')
  if layer_types is not None:
    others = sorted(set(layer_types) - {'full_attention'})
    if others:
      raise CheckpointError(
          f'config.json layer_types has {others}: only full attention is '
          'supported'
      )
    return
  window = config.get('sliding_window')
  if window is None:
    return
  if model_type == 'mistral' or (
      model_type in ('qwen2', 'qwen3')
      and config.get('use_sliding_window')
      and config.get('max_window_layers', 0) < config['num_hidden_layers']
  ):
    raise CheckpointError(
        f'config.json sliding_window={window!r} is active '
        f'(model_type {model_type!r}): only full attention is supported'
    )


def from_hf(
    config: Mapping[str, Any],
    *,
    dtype: str = 'float32',
    param_dtype: str = 'float32',
) -> ModelConfig:
  """The ModelConfig of a Hugging Face `config.json`.

  Args:
    config: the parsed config.json of a llama, mistral, qwen2, qwen3,
      gemma2 or gemma3_text model.
    dtype: compute dtype of the decoder.
    param_dtype: storage dtype of its params.

  Raises:
    ValueError: an invalid `dtype` or `param_dtype`.
    CheckpointError: an unsupported model type or feature (other RoPE
      types, sliding-window attention, attention biases outside Qwen2, MLP
      biases, a non-SiLU activation) or a missing key; the message names the
      config.json key and value.
  """
  model_type = config.get('model_type')
  if model_type not in ARCHITECTURES:
    raise CheckpointError(
        f'config.json model_type={model_type!r} is not supported; supported: '
        f'{", ".join(ARCHITECTURES)}'
    )
  for key in ('vocab_size', 'hidden_size', 'intermediate_size',
              'num_hidden_layers', 'num_attention_heads'):
    if config.get(key) is None:
      raise CheckpointError(
          f'config.json has no {key!r} (model_type {model_type!r})'
      )
  if model_type in GEMMA:
    return dataclasses.replace(
        _from_gemma(config, model_type), dtype=dtype, param_dtype=param_dtype
    )
  act = config.get('hidden_act', 'silu')
  if act != 'silu':
    raise CheckpointError(
        f"config.json hidden_act={act!r} is not supported; only 'silu'"
    )
  for key in ('mlp_bias',) + (() if model_type == 'qwen2' else
                              ('attention_bias',)):
    if config.get(key):
      raise CheckpointError(
          f'config.json {key}={config[key]!r} is not supported for '
          f'model_type {model_type!r}'
      )
  _check_full_attention(config, model_type)
  theta, scaling = _rope(config)
  heads = config['num_attention_heads']
  try:
    cfg = ModelConfig(
        vocab_size=config['vocab_size'],
        num_layers=config['num_hidden_layers'],
        embed_dim=config['hidden_size'],
        num_heads=heads,
        num_kv_heads=config.get('num_key_value_heads') or heads,
        head_dim=config.get('head_dim') or config['hidden_size'] // heads,
        mlp_dim=config['intermediate_size'],
        rope_theta=theta,
        rope_scaling=scaling,
        norm_eps=float(config.get('rms_norm_eps', 1e-6)),
        qkv_bias=model_type == 'qwen2',
        qk_norm=model_type == 'qwen3',
        tie_embeddings=bool(config.get('tie_word_embeddings', False)),
    )
  except ValueError as e:
    raise CheckpointError(f'config.json: {e}') from None
  return dataclasses.replace(cfg, dtype=dtype, param_dtype=param_dtype)


def _gemma_rope(
    config: Mapping[str, Any], model_type: str
) -> dict[str, Any]:
  """ModelConfig RoPE fields of a Gemma 2 or Gemma 3 config.json."""
  params = config.get('rope_parameters') or {}
  if model_type == 'gemma2' or not any(
      isinstance(v, Mapping) for v in params.values()
  ):
    if model_type == 'gemma3_text':
      # Older Gemma 3 configs: rope_theta (+ rope_scaling) for global
      # layers, rope_local_base_freq for local ones.
      scaling = config.get('rope_scaling') or {}
      full = dict(scaling, rope_theta=config.get('rope_theta', 1e6))
      local = dict(rope_type='default',
                   rope_theta=config.get('rope_local_base_freq', 1e4))
    else:
      theta, scaling = _rope(config)
      if scaling is not None:
        raise CheckpointError(
            'config.json: RoPE scaling is not supported for gemma2'
        )
      return dict(rope_theta=theta)
  else:
    full = params.get('full_attention') or {}
    local = params.get('sliding_attention') or {}
  out = dict(rope_theta=float(full.get('rope_theta', 1e6)),
             rope_local_theta=float(local.get('rope_theta', 1e4)))
  if local.get('rope_type', 'default') != 'default':
    raise CheckpointError(
        f'config.json sliding-attention RoPE {local!r} is not supported: '
        "only rope_type 'default'"
    )
  kind = full.get('rope_type', full.get('type', 'default'))
  if kind == 'linear':
    out['rope_linear_factor'] = float(full['factor'])
  elif kind != 'default':
    raise CheckpointError(
        f'config.json full-attention RoPE {full!r} is not supported; '
        "supported rope_type: 'default', 'linear'"
    )
  return out


def _from_gemma(config: Mapping[str, Any], model_type: str) -> ModelConfig:
  """The ModelConfig of a Gemma 2 or Gemma 3 (text) config.json."""
  act = config.get('hidden_activation') or config.get('hidden_act')
  if act not in ('gelu_pytorch_tanh', 'gelu_tanh'):
    raise CheckpointError(
        f'config.json hidden_activation={act!r} is not supported; only '
        "'gelu_pytorch_tanh'"
    )
  for key in ('attention_bias', 'use_bidirectional_attention'):
    if config.get(key):
      raise CheckpointError(
          f'config.json {key}={config[key]!r} is not supported for '
          f'model_type {model_type!r}'
      )
  n = config['num_hidden_layers']
  layer_types = config.get('layer_types')
  if layer_types is None:
    pattern = config.get('sliding_window_pattern',
                         2 if model_type == 'gemma2' else 6)
    layer_types = ['sliding_attention' if (i + 1) % pattern else
                   'full_attention' for i in range(n)]
  unknown = sorted(set(layer_types) - {'sliding_attention', 'full_attention'})
  if unknown or len(layer_types) != n:
    raise CheckpointError(
        f'config.json layer_types={layer_types!r} is not supported: one of '
        "'sliding_attention', 'full_attention' per layer"
    )
  sliding = tuple(i for i, t in enumerate(layer_types)
                  if t == 'sliding_attention')
  heads = config['num_attention_heads']
  head_dim = config.get('head_dim') or config['hidden_size'] // heads
  try:
    return ModelConfig(
        vocab_size=config['vocab_size'],
        num_layers=n,
        embed_dim=config['hidden_size'],
        num_heads=heads,
        num_kv_heads=config.get('num_key_value_heads') or heads,
        head_dim=head_dim,
        mlp_dim=config['intermediate_size'],
        norm_eps=float(config.get('rms_norm_eps', 1e-6)),
        qk_norm=model_type == 'gemma3_text',
        tie_embeddings=bool(config.get('tie_word_embeddings', True)),
        sliding_window=config.get('sliding_window') if sliding else None,
        sliding_layers=sliding,
        attn_logit_softcap=config.get('attn_logit_softcapping'),
        final_logit_softcap=config.get('final_logit_softcapping'),
        query_pre_attn_scalar=config.get('query_pre_attn_scalar', head_dim),
        norm_plus_one=True,
        sandwich_norms=True,
        mlp_activation='gelu_tanh',
        scale_embeddings=True,
        **_gemma_rope(config, model_type),
    )
  except ValueError as e:
    raise CheckpointError(f'config.json: {e}') from None


def _is_gemma(cfg: ModelConfig) -> bool:
  """Whether `cfg` has Gemma's layout; raises for a partial one."""
  marks = dict(norm_plus_one=cfg.norm_plus_one,
               sandwich_norms=cfg.sandwich_norms,
               mlp_activation=cfg.mlp_activation == 'gelu_tanh',
               scale_embeddings=cfg.scale_embeddings)
  gemma_only = (cfg.sliding_layers or cfg.attn_logit_softcap
                or cfg.final_logit_softcap or cfg.rope_local_theta
                or cfg.query_pre_attn_scalar or cfg.rope_linear_factor != 1.0)
  if all(marks.values()):
    if cfg.qkv_bias or cfg.rope_scaling is not None:
      raise ValueError(
          'export: Gemma has no q/k/v biases or llama3 RoPE scaling')
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

  Raises:
    ValueError: `cfg` has both q/k/v biases and q/k norms.
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
  if cfg.rope_scaling is not None:
    out['rope_scaling'] = dict(
        rope_type='llama3', **dataclasses.asdict(cfg.rope_scaling)
    )
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
  return out
