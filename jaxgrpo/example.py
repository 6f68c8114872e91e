"""The unit of training data: one prompt with its verifiable ground truth.

Kept free of JAX so that verifier worker processes import it cheaply.
"""

from collections.abc import Mapping
import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Example:
  """One prompt with its verifiable ground truth.

  Attributes:
    id: stable example id, unique within its dataset.
    prompt: the prompt text given to the model.
    answer: the ground truth the verifier checks against (for several
      acceptable answers, the first; the others are in `meta['answers']`).
    dataset: name of the dataset the example belongs to.
    subset: optional label that metrics and evals report separately.
    meta: JSON-serialisable extras a verifier may read, e.g.
      `{'answers': [...], 'answerable': False}` for grounded QA.
  """

  id: str
  prompt: str
  answer: str
  dataset: str = 'default'
  subset: str = ''
  meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def shortest_answer(example: Example) -> str:
  """The shortest of `meta['answers']` (when given and not blank), else
  `answer`: what a warm start teaches and what a completion must fit."""
  answers = [a for a in example.meta.get('answers') or () if a.strip()]
  return min(answers, key=len) if answers else example.answer
