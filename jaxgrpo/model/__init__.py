"""Llama-family decoder: config, layers, attention and the model."""

from flax import nnx as _nnx

# Params carry logical axis names from creation; they are bound to a mesh only
# when `jaxgrpo.sharding` places them, so creating a model needs no mesh.
_nnx.use_eager_sharding(False)
