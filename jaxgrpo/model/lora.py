"""LoRA adapters on the decoder's projections, through qwix (`model.lora`).

`attach` hands the decoder to `qwix.apply_lora_to_model`, which intercepts
the matmuls of `Decoder.backbone` and gives each projection it matches a
pair of `nnx.LoRAParam`s beside its weight w: `w_lora_a` [fan_in, r] and
`w_lora_b` [r, fan_out], so the projection computes
x @ w + (x @ A @ B) * alpha / r. The base weights stay as they are; only the
adapter is trained, and the decoder without the adapter (the base graphdef
on the same base params) is the reference policy.

qwix finds the weight of a matmul by following the traced operand back to
the module's param (through its reshape and cast in `layers.contract`);
eagerly it can match a weight only by shape, which misses the reshaped
attention weights. So the adapters are created under a trace, and the
adapted decoder refuses to run outside one (`jax.jit`, as every caller in
jaxgrpo runs it).
"""

import functools
import hashlib
import json
import math
import re

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import qwix

from jaxgrpo import integrity
from jaxgrpo.checks import NON_NEGATIVE, POSITIVE, Section, field, rule
from jaxgrpo.errors import ConfigError

# Every projection of every block; the default of `model.lora.modules`.
ALL_PROJECTIONS = r'blocks/\d+/(attn/(q|k|v|o)|mlp/(gate|up|down))'

# A projection's module under blocks/i and its Hugging Face (PEFT) name under
# model.layers.i.
HF_NAMES = {
    ('attn', 'q'): 'self_attn.q_proj',
    ('attn', 'k'): 'self_attn.k_proj',
    ('attn', 'v'): 'self_attn.v_proj',
    ('attn', 'o'): 'self_attn.o_proj',
    ('mlp', 'gate'): 'mlp.gate_proj',
    ('mlp', 'up'): 'mlp.up_proj',
    ('mlp', 'down'): 'mlp.down_proj',
}

A_SUFFIX, B_SUFFIX = '_lora_a', '_lora_b'

# The key of a LoRA run's checkpoint metadata holding its base's checksum.
BASE = 'lora_base'


def _is_regex(pattern) -> bool:
  try:
    re.compile(pattern)
  except (re.error, TypeError):
    return False
  return bool(pattern)


class LoraSection(Section, name='model.lora'):
  rank: int = field(
      0, 'r: rank of the LoRA adapters (0: no adapter, every weight is '
      'trained); see [LoRA](models.md#lora)', NON_NEGATIVE)
  alpha: float = field(
      16.0, 'adapter scale: a projection adds (x @ A @ B) * alpha / rank',
      POSITIVE)
  modules: str = field(
      ALL_PROJECTIONS, 'regular expression matching whole module paths '
      '(`blocks/0/attn/q`, `blocks/3/mlp/down`): the projections that get '
      'an adapter (`attn/q|k|v|o`, `mlp/gate|up|down`)',
      rule(_is_regex, 'must be a regular expression'))

  def _validate(self):
    for key in ('alpha', 'modules'):  # read by nothing without adapters
      yield key, self.rank or getattr(self, key) == getattr(type(self), key), (
          'needs model.lora.rank > 0 (0: no adapter, every weight trained)')


def provider(lora: LoraSection) -> qwix.LoraProvider:
  """The qwix provider of `lora`'s adapters (A he-uniform, B zero)."""
  # disable_jit: jnp.matmul is itself jitted; qwix must see the dot_general
  # inside it in the caller's trace to tie it to the weight.
  return qwix.LoraProvider(module_path=lora.modules, rank=lora.rank,
                           alpha=lora.alpha, disable_jit=True)


def _adapt(graphdef: nnx.GraphDef, params: nnx.State, rng: jax.Array, *,
           lora: LoraSection) -> tuple[nnx.GraphDef, nnx.State]:
  """(graphdef, adapter) of the decoder with adapters; run under a trace."""
  model = nnx.merge(graphdef, params)
  cfg = model.cfg
  # One token is enough: qwix creates each adapter at its projection's
  # first call, with shapes from the weight alone.
  x_BTD = jnp.zeros((1, 1, cfg.embed_dim), jnp.dtype(cfg.dtype))
  adapted = qwix.apply_lora_to_model(
      model, provider(lora), x_BTD, jnp.zeros((1, 1), jnp.int32),
      jnp.ones((1, 1, 1), jnp.bool_), methods=('backbone',),
      rngs=nnx.Rngs(params=rng))
  adapted.__class__ = _traced_only(type(adapted))
  graphdef, adapter, _ = nnx.split(adapted, nnx.LoRAParam, ...)
  return graphdef, adapter


def _traced_only(cls: type) -> type:
  """`cls` whose backbone refuses to run outside a trace.

  Outside one, qwix cannot follow a reshaped weight back to its param, and
  the attention projections would run without their adapters.
  """

  def backbone(self, x_BTD, *args, **kwargs):
    if not isinstance(x_BTD, jax.core.Tracer):
      raise RuntimeError(
          'a LoRA-adapted decoder runs under jax.jit (as every jaxgrpo '
          'path does); merge the adapter (lora.merge) to run it eagerly')
    return cls.backbone(self, x_BTD, *args, **kwargs)

  return type(cls.__name__, (cls,), {'backbone': backbone})


def attach(
    graphdef: nnx.GraphDef, params: nnx.State, lora: LoraSection,
    rng: jax.Array,
) -> tuple[nnx.GraphDef, nnx.State]:
  """Gives the decoder LoRA adapters.

  Args:
    graphdef: the base decoder's graph definition.
    params: its params, not copied; abstract ones (ShapeDtypeStructs) give
      an abstract adapter, e.g. to size a train step.
    lora: rank, alpha and the projections to adapt.
    rng: key of the adapters' A init (B starts at zero, so the adapted
      decoder starts as the base).

  Returns:
    (graphdef, adapter): the adapted decoder's graph definition, which
    `nnx.merge(graphdef, params, adapter)` runs, and its `nnx.LoRAParam`s.

  Raises:
    ConfigError: `lora.modules` matches no projection.
  """
  fn = functools.partial(_adapt, graphdef, lora=lora)
  adapted_graphdef, adapter = nnx.eval_shape(fn, params, rng)
  _check(adapter, params, lora)
  if not any(isinstance(x, jax.ShapeDtypeStruct)
             for x in jax.tree.leaves(params)):
    adapter = jax.jit(lambda p, r: fn(p, r)[1])(params, rng)
  return adapted_graphdef, adapter


def _check(adapter: nnx.State, params: nnx.State, lora: LoraSection) -> None:
  """Refuses `lora.modules` matching no projection, and a rank above an
  adapted projection's smaller dimension (A @ B cannot exceed it)."""
  if not jax.tree.leaves(adapter):
    layers = {path[1] for path, _ in nnx.to_flat_state(params)
              if path[0] == 'blocks'}
    raise ConfigError(
        f'model.lora.modules={lora.modules!r}: matches no projection; it '
        'must match a whole module path, blocks/<i>/attn/(q|k|v|o) or '
        f'blocks/<i>/mlp/(gate|up|down) with i in 0..{max(layers, default=0)}'
        r' (e.g. blocks/\d+/attn/(q|v)); embeddings and norms take none')
  for path, (a, b) in pairs(adapter).items():
    if lora.rank > min(a.shape[0], b.shape[1]):
      raise ConfigError(
          f'model.lora.rank={lora.rank}: above the smaller dimension of '
          f"{'/'.join(map(str, path))} ({a.shape[0]} x {b.shape[1]}), where "
          'an adapter adds parameters but no rank; use a rank of at most '
          f'{min(a.shape[0], b.shape[1])}, or 0 to train every weight')


def base_checksum(params: nnx.State) -> str:
  """One checksum (16 hex digits) of the base params, whatever their
  sharding: of the checksums `integrity.digests` gives each array."""
  digests = json.dumps(integrity.digests(params), sort_keys=True)
  return hashlib.sha256(digests.encode()).hexdigest()[:16]


def check_base(saved: dict, now: str | nnx.State | None, where: str,
               error: type) -> None:
  """Raises `error` when the base a run rebuilt (its params `now`, or their
  `base_checksum`) is not the one the checkpoint's adapter (metadata
  `saved`) was trained on; a checkpoint written without the checksum
  passes."""
  then = saved.get(BASE)
  if then is None or now is None:
    return
  now = now if isinstance(now, str) else base_checksum(now)
  if then == now:
    return
  model = saved.get('config', {}).get('model', {})
  source = (f"model.path={model['path']!r}" if model.get('path') else
            f"model.preset={model.get('preset')!r} initialised from its seed "
            '(another jax or jaxgrpo version?)')
  raise error(
      f'{where}: its LoRA adapter was trained on another base model: '
      f'{source} now gives other weights (checksum {then} then, {now} now); '
      'the adapter is only valid on the base it was trained on: restore '
      'that model, or use a new --workdir')


def pairs(adapter: nnx.State) -> dict[tuple, tuple[jax.Array, jax.Array]]:
  """Module path (e.g. ('blocks', 0, 'attn', 'q')) -> (A, B) arrays."""
  flat = {path: var.get_value() for path, var in nnx.to_flat_state(adapter)}
  out = {}
  for path, a in flat.items():
    if str(path[-1]).endswith(A_SUFFIX):
      weight = str(path[-1])[:-len(A_SUFFIX)]
      out[path[:-1]] = (a, flat[path[:-1] + (weight + B_SUFFIX,)])
  return out


def delta(a: jax.Array, b: jax.Array, shape: tuple[int, ...], *,
          alpha: float) -> jax.Array:
  """(A @ B) * alpha / r in float32, shaped as the weight [in..., out...].

  The adapted matmul contracts the weight's leading (input) axes, which A
  spans flattened; B spans its trailing (output) axes flattened.
  """
  r = a.shape[-1]
  ab = jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32))
  return (ab * (alpha / r)).reshape(shape)


def merge(params: nnx.State, adapter: nnx.State, *, alpha: float
          ) -> nnx.State:
  """The base params with each adapter folded into its weight.

  `w + (A @ B) * alpha / r`, computed in float32 and stored in w's dtype:
  the base decoder on the result computes what the adapted one does (up to
  that rounding). `params` is not changed.
  """
  flat = {path: var.get_value() for path, var in nnx.to_flat_state(params)}
  for module, (a, b) in pairs(adapter).items():
    w = flat[module + ('w',)]
    flat[module + ('w',)] = (w.astype(jnp.float32) + delta(
        a, b, w.shape, alpha=alpha)).astype(w.dtype)
  out = jax.tree.map(lambda x: x, params)
  nnx.replace_by_pure_dict(out, _nest(flat))
  return out


def merge_loss(params: nnx.State, merged: nnx.State, adapter: nnx.State, *,
               alpha: float) -> float:
  """The share of the adapter's change that storing the merge in the
  weights' dtype lost: |(merged - w) - delta| / |delta| (Frobenius norms
  over every adapted weight); 0 when float32 keeps it, near 1 when the
  change is below the weights' rounding step (bfloat16 keeps 8 bits: a
  change of 0.1% of a weight is mostly lost)."""
  flat = {path: var.get_value() for path, var in nnx.to_flat_state(params)}
  new = {path: var.get_value() for path, var in nnx.to_flat_state(merged)}
  err = total = 0.0
  for module, (a, b) in pairs(adapter).items():
    w, d = flat[module + ('w',)], delta(a, b, flat[module + ('w',)].shape,
                                        alpha=alpha)
    kept = new[module + ('w',)].astype(jnp.float32) - w.astype(jnp.float32)
    err += float(jnp.sum(jnp.square(kept - d)))
    total += float(jnp.sum(jnp.square(d)))
  return math.sqrt(err / total) if total else 0.0


def _nest(flat: dict[tuple, jax.Array]) -> dict:
  out = {}
  for path, value in flat.items():
    node = out
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  return out


# Where transformers' model holds the decoder layers: a causal LM's, and an
# image-text model's (Gemma 3 4B and up; transformers 4.52 on) language model.
HF_LAYERS = 'model.layers'
HF_IMAGE_TEXT_LAYERS = 'model.language_model.layers'


def peft_tensors(adapter: nnx.State, layers: str = HF_LAYERS
                 ) -> dict[str, np.ndarray]:
  """The adapter as PEFT's adapter_model.safetensors holds it.

  Keys are `base_model.model.{layers}.{i}.{module}.lora_A.weight`
  [r, in_features] and `....lora_B.weight` [out_features, r], the weights
  of PEFT's `nn.Linear` pair, in the base projection's flattened input and
  output order (that of `jaxgrpo.model.hf`).
  """
  out = {}
  for path, (a, b) in pairs(adapter).items():
    name = f'base_model.model.{hf_module(path, layers)}'
    out[f'{name}.lora_A.weight'] = np.ascontiguousarray(np.asarray(a).T)
    out[f'{name}.lora_B.weight'] = np.ascontiguousarray(np.asarray(b).T)
  return out


def hf_module(path: tuple, layers: str = HF_LAYERS) -> str:
  """('blocks', 3, 'mlp', 'up') -> 'model.layers.3.mlp.up_proj'."""
  if path[0] != 'blocks' or tuple(path[2:]) not in HF_NAMES:
    raise ValueError(f'LoRA: no Hugging Face name for module {path}')
  return f'{layers}.{path[1]}.{HF_NAMES[tuple(path[2:])]}'


def peft_config(adapter: nnx.State, lora: LoraSection, *,
                base_model: str | None, num_layers: int | None = None,
                layers: str = HF_LAYERS) -> dict:
  """adapter_config.json of PEFT for `adapter`.

  `target_modules` lists the projections' short names when every layer
  (of the `num_layers`, when given) adapts the same ones in a causal LM,
  else each module's full name: PEFT adapts every module a short name
  matches (an image-text model's vision tower has q_proj too).
  """
  modules = [hf_module(path, layers) for path in pairs(adapter)]
  short = sorted({m.rsplit('.', 1)[1] for m in modules})
  blocks = {path[1] for path in pairs(adapter)}
  uniform = len(modules) == len(short) * len(blocks) and (
      num_layers is None or len(blocks) == num_layers) and layers == HF_LAYERS
  return {
      'peft_type': 'LORA',
      'task_type': 'CAUSAL_LM',
      'base_model_name_or_path': base_model,
      'r': lora.rank,
      'lora_alpha': lora.alpha,
      'lora_dropout': 0.0,
      'bias': 'none',
      'fan_in_fan_out': False,
      'use_rslora': False,
      'use_dora': False,
      'inference_mode': True,
      'target_modules': short if uniform else sorted(modules),
  }
