"""Llama 3.x RoPE scaling from llama.cpp's per-frequency factors.

A Llama 3.1/3.2 GGUF file stores its 'llama3' RoPE scaling as the tensor
`rope_freqs.weight`: one factor per rotary frequency, by which llama.cpp
divides that frequency (theta ** (-2 i / H) / factors[i]). Its converter
computes them from the Hugging Face `rope_scaling` entry as `RopeScaling`
rescales frequencies: 1 for short wavelengths, `factor` for long ones and
1 / ((1 - s) / factor + s) in the band between, s interpolating from 0 to 1.

`llama3_scaling` finds the `RopeScaling` that gives a file's factors, so the
decoder (and a Hugging Face export) applies the same frequencies. The
factors fix the scaling only up to a common multiple of
original_max_position_embeddings, low_freq_factor and high_freq_factor
(every frequency comes out the same), so it tries Llama 3.x's own values
(1, 4 and 8192) first and otherwise solves the band's two factors for a
context of 8192 from the interpolated factors.
"""

import math

import numpy as np

from jaxgrpo.model import layers
from jaxgrpo.model.config import RopeScaling

# llama.cpp's converter: original_max_position_embeddings unless the config
# says otherwise; Llama 3.x's low_freq_factor and high_freq_factor.
_CONTEXT = 8192
_LOW, _HIGH = 1.0, 4.0
# Factors are stored as float32; the ones a scaling gives must match this
# closely.
_RTOL = 1e-4


def _inv_freq(head_dim: int, theta: float,
              scaling: RopeScaling | None = None) -> np.ndarray:
  """The H / 2 rotary frequencies the decoder uses (`layers.rope_frequencies`),
  as float64."""
  return np.asarray(layers.rope_frequencies(head_dim, theta=theta,
                                            scaling=scaling), np.float64)


def factors_of(scaling: RopeScaling, head_dim: int,
               theta: float) -> np.ndarray:
  """The factors llama.cpp's converter writes for `scaling`: each plain
  frequency over the decoder's rescaled one (float64)."""
  return _inv_freq(head_dim, theta) / _inv_freq(head_dim, theta, scaling)


def _matches(scaling: RopeScaling, factors: np.ndarray, head_dim: int,
             theta: float) -> bool:
  return np.allclose(factors_of(scaling, head_dim, theta), factors,
                     rtol=_RTOL, atol=0)


def _solved(factors: np.ndarray, factor: float, head_dim: int,
            theta: float) -> RopeScaling | None:
  """The scaling with context 8192 whose band fits `factors`, or None when
  fewer than two factors lie inside the band (or they fit no band)."""
  inside = (factors > 1 + _RTOL) & (factors < factor * (1 - _RTOL))
  if inside.sum() < 2:
    return None
  x = _inv_freq(head_dim, theta)[inside] / (2 * math.pi)  # 1 / wavelength
  s = (1 / factors[inside] - 1 / factor) / (1 - 1 / factor)
  slope, intercept = np.polyfit(x, s, 1)
  if not slope > 0 or not intercept < 0:
    return None
  low = float(f'{-intercept * _CONTEXT / slope:.6g}')
  high = float(f'{low + _CONTEXT / slope:.6g}')
  try:
    return RopeScaling(factor=factor, low_freq_factor=low,
                       high_freq_factor=high,
                       original_max_position_embeddings=_CONTEXT)
  except ValueError:
    return None


def llama3_scaling(factors: np.ndarray, *, head_dim: int,
                   theta: float) -> RopeScaling | None:
  """The llama3 `RopeScaling` whose frequency factors are `factors`.

  Args:
    factors: llama.cpp's `rope_freqs.weight`, H / 2 values.
    head_dim: H, the rotated width of each head.
    theta: the RoPE base (`rope.freq_base`).

  Returns:
    The scaling, or None when every factor is 1 (plain RoPE).

  Raises:
    ValueError: `factors` has the wrong shape, or no llama3 scaling gives
      them (the message lists them).
  """
  factors = np.asarray(factors, np.float64)
  if factors.shape != (head_dim // 2,):
    raise ValueError(
        f'has shape {factors.shape}, expected ({head_dim // 2},): one factor '
        f'per rotary frequency of a {head_dim}-wide head'
    )
  if np.allclose(factors, 1.0, rtol=0, atol=_RTOL):
    return None
  factor = float(f'{factors.max():.6g}')
  if factor > 1 and np.all(np.isfinite(factors)):
    usual = RopeScaling(factor=factor, low_freq_factor=_LOW,
                        high_freq_factor=_HIGH,
                        original_max_position_embeddings=_CONTEXT)
    for scaling in (usual, _solved(factors, factor, head_dim, theta)):
      if scaling is not None and _matches(scaling, factors, head_dim, theta):
        return scaling
  shown = np.array2string(factors.astype(np.float32), precision=4,
                          threshold=12)
  raise ValueError(
      f'holds frequency factors {shown} that no llama3 RoPE scaling gives '
      '(1 for the short wavelengths, rising smoothly to one factor for the '
      'long ones); other RoPE scalings are not supported'
  )
