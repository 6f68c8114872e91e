"""RoPE frequency rescalings of Hugging Face checkpoints.

Each class holds the entries of one `rope_scaling` type of a Llama-family
config.json, computed as transformers' `modeling_rope_utils` does:
'llama3' (`RopeScaling`), 'yarn' (`YarnScaling`) and 'dynamic'
(`DynamicScaling`). A 'linear' rescaling is `ModelConfig.rope_linear_factor`.
Every class has a `rope_type` field naming its type, so the dict
`dataclasses.asdict` writes (a checkpoint's model config) reads back with
`from_dict`.
"""

from __future__ import annotations

from collections.abc import Mapping
import dataclasses
import math
from typing import Any


def _check_type(obj: Any, expected: str) -> None:
  if obj.rope_type != expected:
    raise ValueError(
        f'{type(obj).__name__}.rope_type must be {expected!r}, got '
        f'{obj.rope_type!r}')


def _check_positive(obj: Any, *names: str) -> None:
  for name in names:
    value = getattr(obj, name)
    if isinstance(value, bool) or not value > 0:
      raise ValueError(
          f'{type(obj).__name__}.{name} must be > 0, got {value!r}')


@dataclasses.dataclass(frozen=True, kw_only=True)
class RopeScaling:
  """Llama 3.x ('llama3') rescaling of the RoPE frequencies.

  Frequencies whose wavelength exceeds `original_max_position_embeddings /
  low_freq_factor` are divided by `factor`; those shorter than
  `original_max_position_embeddings / high_freq_factor` are kept; the ones
  between are interpolated smoothly. The fields are the ones of a Hugging
  Face `rope_scaling` entry of type 'llama3'.
  """

  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_position_embeddings: int
  rope_type: str = 'llama3'

  def __post_init__(self):
    _check_type(self, 'llama3')
    _check_positive(self, 'factor', 'low_freq_factor',
                    'original_max_position_embeddings')
    if not self.high_freq_factor > self.low_freq_factor:
      raise ValueError(
          f'RopeScaling.high_freq_factor ({self.high_freq_factor!r}) must '
          f'exceed low_freq_factor ({self.low_freq_factor!r})'
      )


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
  """YaRN's attention scale for a context `scale` times longer."""
  return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class YarnScaling:
  """YaRN ('yarn'): frequencies blended between extrapolation and `factor`
  interpolation, and cos/sin scaled by `attention_factor`.

  Frequency dimensions below the one that turns `beta_fast` times within
  `original_max_position_embeddings` keep their frequency; those above the
  one that turns `beta_slow` times are divided by `factor`; a linear ramp
  blends the ones between (`truncate` rounds the two dimensions outward).
  `attention_factor` multiplies the rotated queries and keys; None is
  `yarn_mscale(factor)`.
  """

  factor: float
  original_max_position_embeddings: int
  beta_fast: float = 32.0
  beta_slow: float = 1.0
  truncate: bool = True
  attention_factor: float | None = None
  rope_type: str = 'yarn'

  def __post_init__(self):
    _check_type(self, 'yarn')
    if self.attention_factor is None:
      object.__setattr__(self, 'attention_factor', yarn_mscale(self.factor))
    _check_positive(self, 'factor', 'original_max_position_embeddings',
                    'beta_fast', 'beta_slow', 'attention_factor')
    if not isinstance(self.truncate, bool):
      raise ValueError(
          f'YarnScaling.truncate must be true or false, got '
          f'{self.truncate!r}')

  def correction_range(self, head_dim: int,
                       theta: float) -> tuple[float, float]:
    """The frequency dimensions where the ramp starts and ends."""
    def dim(rotations):
      return (head_dim * math.log(self.original_max_position_embeddings
                                  / (rotations * 2 * math.pi))
              / (2 * math.log(theta)))
    low, high = dim(self.beta_fast), dim(self.beta_slow)
    if self.truncate:
      low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, head_dim - 1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DynamicScaling:
  """Dynamic NTK ('dynamic'): transformers raises the RoPE base once a
  sequence reaches past `max_position_embeddings` positions, by `factor`.

  Within `max_position_embeddings` its frequencies are the plain ones; past
  it transformers' frequencies depend on the longest sequence the model has
  seen so far, which jaxgrpo does not reproduce, so a run must stay within
  it (`check_length`).
  """

  factor: float
  max_position_embeddings: int
  rope_type: str = 'dynamic'

  def __post_init__(self):
    _check_type(self, 'dynamic')
    _check_positive(self, 'factor', 'max_position_embeddings')

  def check_length(self, length: int, what: str) -> None:
    """Raises ValueError when `length` positions (`what`) pass the limit."""
    if length > self.max_position_embeddings:
      raise ValueError(
          f'{what} = {length:,} positions, more than the model\'s '
          f'max_position_embeddings={self.max_position_embeddings:,}: its '
          f"rope_scaling of type 'dynamic' (factor {self.factor}) rescales "
          'RoPE past that length, which is not supported; keep them within '
          'it')


SCALINGS = {cls.rope_type: cls
            for cls in (RopeScaling, YarnScaling, DynamicScaling)}
Scaling = RopeScaling | YarnScaling | DynamicScaling


def from_dict(entries: Mapping[str, Any]) -> Scaling:
  """The scaling `dataclasses.asdict` wrote as `entries` (no `rope_type`:
  'llama3', as written before the other types existed).

  Raises:
    ValueError: an unknown rope_type, or entries that do not fit it.
  """
  rope_type = entries.get('rope_type', 'llama3')
  if rope_type not in SCALINGS:
    raise ValueError(f'rope_type={rope_type!r} is not one of {list(SCALINGS)}')
  try:
    return SCALINGS[rope_type](**entries)
  except TypeError as e:
    raise ValueError(str(e)) from None
