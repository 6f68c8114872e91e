"""Exact-answer verifier: the completion, stripped, equals the ground truth."""

from jaxgrpo.example import Example
from jaxgrpo.verifiers import base


@base.register('exact_match')
def exact_match(completion: str, example: Example) -> float:
  """1.0 when the stripped completion equals the stripped answer, else 0.0."""
  return float(completion.strip() == example.answer.strip())
