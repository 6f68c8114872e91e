"""Exact-answer verifier: the completion, stripped, equals the ground truth."""

from jaxgrpo.example import Example
from jaxgrpo.verifiers import base


@base.register('exact_match')
def exact_match(completion: str, example: Example) -> float:
  """1.0 when the stripped completion equals the stripped answer, else 0.0.

  A blank answer is matched by nothing: an empty completion is no answer
  (files refuse such records; an Example built in code may hold one).
  """
  gold = example.answer.strip()
  return float(bool(gold) and completion.strip() == gold)
