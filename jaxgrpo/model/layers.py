"""Decoder building blocks: RMSNorm, einsum projections, RoPE and SwiGLU.

Params carry logical axis names (`out_sharding` metadata) that
`jaxgrpo.sharding` maps to mesh axes; nothing here knows about meshes. Each
is made with `eager_sharding=False`, so that building a model needs no mesh
in any thread (flax's default is per thread), and flax's setting is left
as the user has it.
Einsum letters follow `jaxgrpo.typing`: B batch, T length, D model, N heads,
K kv heads, H head dim, F feed-forward, V vocab.
"""

from collections.abc import Sequence
import math

from flax import nnx
import jax
import jax.numpy as jnp

from jaxgrpo.model import rope_scaling
from jaxgrpo.sharding import LogicalAxes


class RMSNorm(nnx.Module):
  """Root-mean-square norm over the last axis, with a learned scale.

  The scale multiplies directly (initialized to one), as in Llama and Qwen
  checkpoints, or with `plus_one` as (1 + scale) (initialized to zero), as
  in Gemma's. Statistics are computed in float32 whatever the input dtype.
  """

  def __init__(
      self,
      dim: int,
      *,
      eps: float,
      plus_one: bool = False,
      param_dtype: jnp.dtype = jnp.float32,
  ):
    self.eps = eps
    self.plus_one = plus_one
    init = jnp.zeros if plus_one else jnp.ones
    self.scale = nnx.Param(init((dim,), param_dtype),
                           out_sharding=('norm',), eager_sharding=False)

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes `x` [..., dim]; returns the same shape and dtype."""
    x32 = x.astype(jnp.float32)
    ms = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    scale = self.scale[...].astype(jnp.float32)
    if self.plus_one:
      scale = 1.0 + scale
    scale = scale.reshape((1,) * (x.ndim - 1) + scale.shape)
    return (x32 * jax.lax.rsqrt(ms + self.eps) * scale).astype(x.dtype)


class Einsum(nnx.Module):
  """A weight of fixed shape applied with a caller-given einsum equation.

  Keeping the equation at the call site (`'BTD,DNH->BTNH'`) makes every
  projection's contraction readable where it is used.
  """

  def __init__(
      self,
      shape: Sequence[int],
      axes: LogicalAxes,
      *,
      in_axes: Sequence[int] = (0,),
      dtype: jnp.dtype = jnp.float32,
      param_dtype: jnp.dtype = jnp.float32,
      rngs: nnx.Rngs,
  ):
    """Creates the weight.

    Args:
      shape: weight shape.
      axes: logical name of each weight axis.
      in_axes: weight axes contracted with the input; they set the fan-in of
        the truncated-normal init.
      dtype: compute dtype the weight is cast to.
      param_dtype: storage dtype.
      rngs: init randomness.
    """
    if len(axes) != len(shape):
      raise ValueError(f'Einsum: axes {axes} do not match shape {shape}')
    out_axes = tuple(i for i in range(len(shape)) if i not in in_axes)
    init = jax.nn.initializers.variance_scaling(
        1.0, 'fan_in', 'truncated_normal', in_axis=in_axes, out_axis=out_axes
    )
    self.dtype = dtype
    self.w = nnx.Param(
        init(rngs.params(), tuple(shape), param_dtype),
        out_sharding=tuple(axes), eager_sharding=False,
    )

  def __call__(self, eqn: str, x: jax.Array) -> jax.Array:
    """Returns `einsum(eqn, x, w)` computed in the layer's dtype."""
    return contract(eqn, x.astype(self.dtype), self.w[...].astype(self.dtype))


def contract(
    eqn: str, x: jax.Array, w: jax.Array, preferred_element_type=None
) -> jax.Array:
  """`einsum(eqn, x, w)`, as one 2-D matmul for projection-shaped equations.

  When x's trailing axes contract with w's leading axes ('BTD,DNH->BTNH') or
  with its trailing axes ('BTD,VD->BTV'), the free axes of x are folded into
  rows first. XLA's CPU backend differentiates such 2-D matmuls several times
  faster than the same contraction over (B, T); on accelerators it is
  neutral. Other equations go to jnp.einsum unchanged.
  """
  inputs, out = eqn.split('->')
  xs, ws = inputs.split(',')
  shared = ''.join(c for c in xs if c in ws and c not in out)
  k = len(shared)
  if k and xs.endswith(shared):
    lead, fan_in = x.shape[:-k], math.prod(x.shape[-k:])
    x2 = x.reshape(-1, fan_in)
    if ws.startswith(shared) and out == xs[:-k] + ws[k:]:
      w2, w_out = w.reshape(fan_in, -1), w.shape[k:]
    elif ws.endswith(shared) and out == xs[:-k] + ws[:-k]:
      w2, w_out = w.reshape(-1, fan_in).T, w.shape[:-k]
    else:
      w2 = None
    if w2 is not None:
      y = jnp.matmul(x2, w2, preferred_element_type=preferred_element_type)
      return y.reshape(*lead, *w_out)
  return jnp.einsum(eqn, x, w, preferred_element_type=preferred_element_type)


class Bias(nnx.Module):
  """An additive bias over the trailing axes of an activation."""

  def __init__(
      self,
      shape: Sequence[int],
      axes: LogicalAxes,
      *,
      param_dtype: jnp.dtype = jnp.float32,
  ):
    self.b = nnx.Param(jnp.zeros(tuple(shape), param_dtype),
                       out_sharding=tuple(axes), eager_sharding=False)

  def __call__(self, x: jax.Array) -> jax.Array:
    b = self.b[...].astype(x.dtype)
    return x + b.reshape((1,) * (x.ndim - b.ndim) + b.shape)


def rope_frequencies(
    head_dim: int, *, theta: float,
    scaling: rope_scaling.Scaling | None = None
) -> jax.Array:
  """The head_dim / 2 rotary angular frequencies, float32.

  Args:
    head_dim: H, width of each head (even).
    theta: frequency base; frequency i is theta ** (-2 i / H).
    scaling: a rescaling of the frequencies, or None. 'llama3' follows
      Hugging Face's rope type: wavelengths above
      original_max_position_embeddings / low_freq_factor are stretched by
      `factor`, those below original_max_position_embeddings /
      high_freq_factor are kept and the band between is interpolated.
      'yarn' is `_yarn_frequencies`; 'dynamic' keeps the plain
      frequencies (those of every length within its
      max_position_embeddings).
  """
  half = head_dim // 2
  inv_freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
  if scaling is None or scaling.rope_type == 'dynamic':
    return inv_freq
  if scaling.rope_type == 'yarn':
    return _yarn_frequencies(head_dim, theta, scaling)
  context = scaling.original_max_position_embeddings
  low_freq_wavelen = context / scaling.low_freq_factor
  high_freq_wavelen = context / scaling.high_freq_factor
  wavelen = 2 * math.pi / inv_freq
  inv_freq = jnp.where(
      wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq
  )
  smooth = (context / wavelen - scaling.low_freq_factor) / (
      scaling.high_freq_factor - scaling.low_freq_factor
  )
  smoothed = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
  is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
  return jnp.where(is_medium, smoothed, inv_freq)


def _yarn_frequencies(head_dim: int, theta: float,
                      scaling: rope_scaling.YarnScaling) -> jax.Array:
  """YaRN's rotary frequencies, float32, computed as transformers does."""
  pos_freqs = theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32)
                        / head_dim)
  extrapolation = 1.0 / pos_freqs
  interpolation = 1.0 / (scaling.factor * pos_freqs)
  low, high = scaling.correction_range(head_dim, theta)
  if low == high:
    high += 0.001  # as transformers: no zero-width ramp
  ramp = jnp.clip(
      (jnp.arange(head_dim // 2, dtype=jnp.float32) - low) / (high - low),
      0, 1)
  keep = 1 - ramp
  return interpolation * (1 - keep) + extrapolation * keep


def apply_rope(
    x_BTNH: jax.Array,
    positions_BT: jax.Array,
    *,
    theta: float,
    scaling: rope_scaling.Scaling | None = None,
    linear_factor: float = 1.0,
) -> jax.Array:
  """Rotates each head by its token's position (rotary embedding).

  Uses the half-split layout of Hugging Face Llama/Qwen checkpoints: feature
  i pairs with feature i + H/2.

  Args:
    x_BTNH: queries or keys, [batch, length, heads, head_dim].
    positions_BT: int position of each token, [batch, length]. Left padding
      makes these differ per row, hence explicit positions.
    theta: frequency base.
    scaling: optional frequency rescaling (see `rope_frequencies`); a
      'yarn' one also multiplies cos and sin by its attention_factor.
    linear_factor: divides every frequency (a 'linear' rope_scaling).

  Returns:
    Rotated x, same shape and dtype.
  """
  inv_freq = rope_frequencies(x_BTNH.shape[-1], theta=theta, scaling=scaling)
  if linear_factor != 1.0:
    inv_freq = inv_freq / linear_factor
  angles_BTH = (
      positions_BT.astype(jnp.float32)[..., None] * inv_freq[None, None]
  )
  sin = jnp.sin(angles_BTH)[:, :, None, :]
  cos = jnp.cos(angles_BTH)[:, :, None, :]
  mscale = getattr(scaling, 'attention_factor', 1.0)
  if mscale != 1.0:
    sin, cos = sin * mscale, cos * mscale
  x1, x2 = jnp.split(x_BTNH.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BTNH.dtype)


_ACTIVATIONS = {
    'silu': jax.nn.silu,
    'gelu_tanh': lambda x: jax.nn.gelu(x, approximate=True),
}


class FeedForward(nnx.Module):
  """Gated feed-forward: down(act(gate(x)) * up(x)), SwiGLU or GeGLU."""

  def __init__(
      self,
      embed_dim: int,
      mlp_dim: int,
      *,
      activation: str = 'silu',
      dtype: jnp.dtype = jnp.float32,
      param_dtype: jnp.dtype = jnp.float32,
      rngs: nnx.Rngs,
  ):
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.activation = activation
    self.gate = Einsum((embed_dim, mlp_dim), ('embed', 'mlp'), **kw)
    self.up = Einsum((embed_dim, mlp_dim), ('embed', 'mlp'), **kw)
    self.down = Einsum((mlp_dim, embed_dim), ('mlp', 'embed'), **kw)

  def __call__(self, x_BTD: jax.Array) -> jax.Array:
    """Maps [B, T, D] to [B, T, D]."""
    act = _ACTIVATIONS[self.activation]
    h_BTF = act(self.gate('BTD,DF->BTF', x_BTD))
    h_BTF = h_BTF * self.up('BTD,DF->BTF', x_BTD)
    return self.down('BTF,FD->BTD', h_BTF)
