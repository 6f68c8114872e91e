"""A tiny Decoder with random params, built fast for learner tests."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo.model import config
from jaxgrpo.model import decoder


def random_model(vocab_size: int = 16):
  """The tiny Decoder's graphdef and random params."""
  # Filled from numpy: running the initializers op by op costs seconds on CPU.
  cfg = config.ModelConfig.tiny(vocab_size=vocab_size)
  graphdef, abstract = decoder.abstract_params(cfg)
  rng = np.random.default_rng(0)

  def fill(leaf):
    # Vectors are norm scales: keep them near 1 so activations do not vanish.
    mean = 1.0 if len(leaf.shape) == 1 else 0.0
    return jnp.asarray(rng.normal(mean, 0.1, leaf.shape), leaf.dtype)

  return graphdef, jax.tree.map(fill, abstract)
