"""Hugging Face config.json <-> `ModelConfig`.

`from_hf` reads the config of a Llama, Mistral (without sliding
window), Qwen2 or Qwen3 causal LM; `to_hf` writes the entries that
describe a `ModelConfig` to transformers. The weights are `jaxgrpo.model.hf`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
import dataclasses
import math
from typing import Any

from jaxgrpo import errors
from jaxgrpo.model.config import ModelConfig
from jaxgrpo.model.config import RopeScaling

ARCHITECTURES = {
    'llama': 'LlamaForCausalLM',
    'mistral': 'MistralForCausalLM',
    'qwen2': 'Qwen2ForCausalLM',
    'qwen3': 'Qwen3ForCausalLM',
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
    'transformers_version',
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
    config: the parsed config.json of a llama, mistral, qwen2 or qwen3
      model.
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


def model_type_of(cfg: ModelConfig) -> str:
  """The Hugging Face model type that expresses `cfg`."""
  if cfg.qkv_bias and cfg.qk_norm:
    raise ValueError(
        'export: no Hugging Face model type has both q/k/v biases (Qwen2) '
        'and q/k norms (Qwen3)'
    )
  return 'qwen2' if cfg.qkv_bias else 'qwen3' if cfg.qk_norm else 'llama'


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
  out = {
      'architectures': [ARCHITECTURES[kind]],
      'model_type': kind,
      'vocab_size': cfg.vocab_size,
      'hidden_size': cfg.embed_dim,
      'intermediate_size': cfg.mlp_dim,
      'num_hidden_layers': cfg.num_layers,
      'num_attention_heads': cfg.num_heads,
      'num_key_value_heads': cfg.num_kv_heads,
      'head_dim': cfg.head_dim,
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
