"""Reward functions, registered by name, and the scorer that runs them."""

from jaxgrpo.verifiers import base
from jaxgrpo.verifiers import exact  # noqa: F401  (registers exact_match)
from jaxgrpo.verifiers import format_check  # noqa: F401  (registers format)
from jaxgrpo.verifiers import math_answer  # noqa: F401  (registers math)
from jaxgrpo.verifiers import qa  # noqa: F401  (registers qa)

build = base.build
from_config = base.from_config
get = base.get
names = base.names
register = base.register
score_batch = base.score_batch
Verdict = base.Verdict
