"""Decoder hyperparameters and named presets, from unit-test size to 8B."""

from collections.abc import Callable
import dataclasses

from jaxgrpo.model import rope_scaling as rope_scaling_lib
from jaxgrpo.model.rope_scaling import RopeScaling

DTYPES = ('float32', 'bfloat16')
MLP_ACTIVATIONS = ('silu', 'gelu_tanh')


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
  """Shape and numerics of a Llama-family decoder.

  Attributes:
    vocab_size: V, number of token ids.
    num_layers: number of decoder blocks.
    embed_dim: D, model width.
    num_heads: N, query heads.
    num_kv_heads: K, key/value heads (grouped-query attention; N % K == 0).
    head_dim: H, width of each head.
    mlp_dim: F, hidden width of the SwiGLU feed-forward.
    rope_theta: base of the rotary position frequencies.
    norm_eps: epsilon of every RMSNorm.
    qkv_bias: adds biases to the q/k/v projections (Qwen2).
    qk_norm: RMSNorm over head_dim on queries and keys before RoPE (Qwen3).
    rope_scaling: RoPE frequency rescaling of type 'llama3', 'yarn' or
      'dynamic' (see `jaxgrpo.model.rope_scaling`), or None for plain RoPE.
      A dict of a scaling's fields (as `dataclasses.asdict` writes it) is
      converted.
    tie_embeddings: the output projection reuses the input embedding.
    sliding_window: W, the keys a query sees on a sliding-window layer (its
      own and the W - 1 before it), or None.
    sliding_layers: indices of the layers that attend within
      `sliding_window` (Gemma 2/3's local layers); the others see every key.
    rope_local_theta: RoPE base of the sliding-window layers, or None for
      `rope_theta` (Gemma 3's rope_local_base_freq).
    rope_linear_factor: divides the RoPE frequencies of the full-attention
      layers (a 'linear' rope_scaling: Llama, Qwen, Gemma 3); 1.0 is none.
    attn_logit_softcap: caps attention logits at +-c with c * tanh(x / c)
      (Gemma 2), or None.
    final_logit_softcap: the same cap on the output logits, or None.
    query_pre_attn_scalar: attention logits are scaled by its -1/2 power;
      None is head_dim (Gemma's query_pre_attn_scalar).
    norm_plus_one: every RMSNorm multiplies by (1 + scale), scales
      initialized to zero (Gemma).
    sandwich_norms: also normalizes the attention and feed-forward outputs
      before each residual add (Gemma 2/3's post-norms).
    mlp_activation: the gate activation of the feed-forward, 'silu'
      (SwiGLU) or 'gelu_tanh' (GeGLU, Gemma).
    scale_embeddings: multiplies the input embeddings by sqrt(D), in the
      compute dtype (Gemma).
    dtype: compute dtype, 'float32' or 'bfloat16'. Softmax and logits are
      always float32.
    param_dtype: storage dtype of the parameters.
  """

  vocab_size: int
  num_layers: int
  embed_dim: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_dim: int
  rope_theta: float = 10_000.0
  norm_eps: float = 1e-6
  qkv_bias: bool = False
  qk_norm: bool = False
  rope_scaling: rope_scaling_lib.Scaling | None = None
  tie_embeddings: bool = True
  sliding_window: int | None = None
  sliding_layers: tuple[int, ...] = ()
  rope_local_theta: float | None = None
  rope_linear_factor: float = 1.0
  attn_logit_softcap: float | None = None
  final_logit_softcap: float | None = None
  query_pre_attn_scalar: float | None = None
  norm_plus_one: bool = False
  sandwich_norms: bool = False
  mlp_activation: str = 'silu'
  scale_embeddings: bool = False
  dtype: str = 'float32'
  param_dtype: str = 'float32'

  def __post_init__(self):
    for name in (
        'vocab_size',
        'num_layers',
        'embed_dim',
        'num_heads',
        'num_kv_heads',
        'head_dim',
        'mlp_dim',
    ):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(
            f'ModelConfig.{name} must be a positive int, got {value!r}'
        )
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f'ModelConfig.num_heads ({self.num_heads}) must be a multiple of '
          f'num_kv_heads ({self.num_kv_heads})'
      )
    if self.head_dim % 2:
      raise ValueError(
          f'ModelConfig.head_dim must be even for RoPE, got {self.head_dim}'
      )
    if not self.rope_theta > 0:
      raise ValueError(
          f'ModelConfig.rope_theta must be > 0, got {self.rope_theta!r}'
      )
    if not self.norm_eps > 0:
      raise ValueError(
          f'ModelConfig.norm_eps must be > 0, got {self.norm_eps!r}'
      )
    if isinstance(self.rope_scaling, dict):
      try:
        scaling = rope_scaling_lib.from_dict(self.rope_scaling)
      except ValueError as e:
        raise ValueError(
            f'ModelConfig.rope_scaling {self.rope_scaling!r}: {e}'
        ) from None
      object.__setattr__(self, 'rope_scaling', scaling)
    if not isinstance(self.rope_scaling,
                      (*rope_scaling_lib.SCALINGS.values(), type(None))):
      raise ValueError(
          'ModelConfig.rope_scaling must be a RopeScaling, YarnScaling, '
          f'DynamicScaling or None, got {self.rope_scaling!r}'
      )
    object.__setattr__(self, 'sliding_layers', tuple(self.sliding_layers))
    if any(not 0 <= i < self.num_layers for i in self.sliding_layers):
      raise ValueError(
          f'ModelConfig.sliding_layers {self.sliding_layers!r} must be layer '
          f'indices below num_layers ({self.num_layers})'
      )
    if self.sliding_layers and not (
        isinstance(self.sliding_window, int) and self.sliding_window > 0
    ):
      raise ValueError(
          'ModelConfig.sliding_window must be a positive int when '
          f'sliding_layers is set, got {self.sliding_window!r}'
      )
    for name in ('rope_local_theta', 'attn_logit_softcap',
                 'final_logit_softcap', 'query_pre_attn_scalar'):
      value = getattr(self, name)
      if value is not None and not value > 0:
        raise ValueError(f'ModelConfig.{name} must be > 0, got {value!r}')
    if not self.rope_linear_factor > 0:
      raise ValueError(
          'ModelConfig.rope_linear_factor must be > 0, got '
          f'{self.rope_linear_factor!r}'
      )
    if self.mlp_activation not in MLP_ACTIVATIONS:
      raise ValueError(
          f'ModelConfig.mlp_activation must be one of {MLP_ACTIVATIONS}, got '
          f'{self.mlp_activation!r}'
      )
    for name in ('dtype', 'param_dtype'):
      if getattr(self, name) not in DTYPES:
        raise ValueError(
            f'ModelConfig.{name} must be one of {DTYPES}, got '
            f'{getattr(self, name)!r}'
        )

  @classmethod
  def tiny(cls, vocab_size: int = 64) -> 'ModelConfig':
    """A 2-layer, D=64 decoder for unit tests."""
    return cls(
        vocab_size=vocab_size,
        num_layers=2,
        embed_dim=64,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        mlp_dim=128,
    )


def _demo() -> ModelConfig:
  return ModelConfig(
      vocab_size=32,
      num_layers=2,
      embed_dim=128,
      num_heads=4,
      num_kv_heads=2,
      head_dim=32,
      mlp_dim=512,
  )


def _small_10m() -> ModelConfig:
  return ModelConfig(
      vocab_size=32,
      num_layers=6,
      embed_dim=384,
      num_heads=6,
      num_kv_heads=2,
      head_dim=64,
      mlp_dim=1024,
  )


def _smollm2_135m() -> ModelConfig:
  return ModelConfig(
      vocab_size=49_152,
      num_layers=30,
      embed_dim=576,
      num_heads=9,
      num_kv_heads=3,
      head_dim=64,
      mlp_dim=1536,
      rope_theta=100_000.0,
      norm_eps=1e-5,
  )


def _qwen25_05b() -> ModelConfig:
  return ModelConfig(
      vocab_size=151_936,
      num_layers=24,
      embed_dim=896,
      num_heads=14,
      num_kv_heads=2,
      head_dim=64,
      mlp_dim=4864,
      rope_theta=1_000_000.0,
      norm_eps=1e-6,
      qkv_bias=True,
  )


def _qwen3_06b() -> ModelConfig:
  return ModelConfig(
      vocab_size=151_936,
      num_layers=28,
      embed_dim=1024,
      num_heads=16,
      num_kv_heads=8,
      head_dim=128,
      mlp_dim=3072,
      rope_theta=1_000_000.0,
      norm_eps=1e-6,
      qk_norm=True,
  )


def _llama32_1b() -> ModelConfig:
  return ModelConfig(
      vocab_size=128_256,
      num_layers=16,
      embed_dim=2048,
      num_heads=32,
      num_kv_heads=8,
      head_dim=64,
      mlp_dim=8192,
      rope_theta=500_000.0,
      rope_scaling=RopeScaling(
          factor=32.0,
          low_freq_factor=1.0,
          high_freq_factor=4.0,
          original_max_position_embeddings=8192,
      ),
      norm_eps=1e-5,
  )


def _llama3_8b() -> ModelConfig:
  return ModelConfig(
      vocab_size=128_256,
      num_layers=32,
      embed_dim=4096,
      num_heads=32,
      num_kv_heads=8,
      head_dim=128,
      mlp_dim=14_336,
      rope_theta=500_000.0,
      norm_eps=1e-5,
      tie_embeddings=False,
  )


def _gemma(**fields) -> ModelConfig:
  """Gemma 2/3's shared layout: (1 + w) RMSNorms before and after attention
  and the feed-forward, GeGLU, scaled and tied embeddings."""
  return ModelConfig(
      norm_eps=1e-6, norm_plus_one=True, sandwich_norms=True,
      mlp_activation='gelu_tanh', scale_embeddings=True, tie_embeddings=True,
      **fields)


def _gemma2_2b() -> ModelConfig:
  # Local (4,096-key window) and global layers alternate, local first.
  return _gemma(
      vocab_size=256_000, num_layers=26, embed_dim=2304, num_heads=8,
      num_kv_heads=4, head_dim=256, mlp_dim=9216, rope_theta=10_000.0,
      sliding_window=4096, sliding_layers=tuple(range(0, 26, 2)),
      attn_logit_softcap=50.0, final_logit_softcap=30.0,
      query_pre_attn_scalar=256)


def _gemma3_1b() -> ModelConfig:
  # Five local layers (512-key window, RoPE base 10k) to each global one.
  return _gemma(
      vocab_size=262_144, num_layers=26, embed_dim=1152, num_heads=4,
      num_kv_heads=1, head_dim=256, mlp_dim=6912, rope_theta=1_000_000.0,
      rope_local_theta=10_000.0, sliding_window=512,
      sliding_layers=tuple(i for i in range(26) if (i + 1) % 6),
      qk_norm=True, query_pre_attn_scalar=256)


_PRESETS: dict[str, Callable[[], ModelConfig]] = {
    'tiny': ModelConfig.tiny,
    'demo': _demo,
    'small_10m': _small_10m,
    'smollm2_135m': _smollm2_135m,
    'qwen2.5_0.5b': _qwen25_05b,
    'qwen3_0.6b': _qwen3_06b,
    'llama3.2_1b': _llama32_1b,
    'llama3_8b': _llama3_8b,
    'gemma2_2b': _gemma2_2b,
    'gemma3_1b': _gemma3_1b,
}

PRESET_NAMES: tuple[str, ...] = tuple(_PRESETS)


def preset(name: str, **overrides) -> ModelConfig:
  """Returns the named config with `overrides` applied (and validated).

  Args:
    name: one of `PRESET_NAMES`.
    **overrides: ModelConfig fields to replace, e.g. `dtype='bfloat16'`.

  Raises:
    ValueError: for an unknown name or an invalid override.
  """
  if name not in _PRESETS:
    raise ValueError(
        f'unknown model preset {name!r}; known: {", ".join(PRESET_NAMES)}'
    )
  return dataclasses.replace(_PRESETS[name](), **overrides)


def param_count(cfg: ModelConfig) -> int:
  """Number of parameters of a Decoder built from `cfg`."""
  d, f, h = cfg.embed_dim, cfg.mlp_dim, cfg.head_dim
  n, k = cfg.num_heads, cfg.num_kv_heads
  attention = d * n * h * 2 + d * k * h * 2
  if cfg.qkv_bias:
    attention += n * h + 2 * k * h
  if cfg.qk_norm:
    attention += 2 * h
  block = attention + 3 * d * f + (4 if cfg.sandwich_norms else 2) * d
  embeddings = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2)
  return cfg.num_layers * block + embeddings + d
