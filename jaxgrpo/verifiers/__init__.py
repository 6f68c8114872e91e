"""Reward functions, registered by name."""

from jaxgrpo.verifiers import base
from jaxgrpo.verifiers import exact  # noqa: F401  (registers exact_match)

get = base.get
score_batch = base.score_batch
