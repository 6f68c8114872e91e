"""Tokenizers and batch encoding of prompts into left-padded arrays."""

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from jaxgrpo import errors


class Tokenizer(Protocol):
  """What the generator, learner and verifiers need from a tokenizer."""

  vocab_size: int
  pad_id: int
  bos_id: int
  eos_id: int

  def encode(self, text: str) -> list[int]:
    ...

  def decode(self, ids: Sequence[int]) -> str:
    ...


class PromptTooLongError(errors.UserError, ValueError):
  """A prompt does not fit `max_prompt_len` tokens."""


class CharTokenizer:
  """A character-level tokenizer for the built-in synthetic tasks.

  Ids 0-2 are PAD, BOS and EOS; each character of `alphabet` gets one id after
  them. The vocabulary is padded to a multiple of 8 so the embedding table has
  a friendly shape.
  """

  PAD, BOS, EOS = 0, 1, 2

  def __init__(self, alphabet: str = '0123456789+-*=() ?,.abcdefghijklmnopqrstuvwxyz'):
    if len(set(alphabet)) != len(alphabet):
      raise ValueError(f'tokenizer alphabet has repeated characters: {alphabet!r}')
    self.alphabet = alphabet
    self._ids = {c: i + 3 for i, c in enumerate(alphabet)}
    self.vocab_size = -(-(len(alphabet) + 3) // 8) * 8
    self.pad_id, self.bos_id, self.eos_id = self.PAD, self.BOS, self.EOS

  def encode(self, text: str) -> list[int]:
    try:
      return [self._ids[c] for c in text]
    except KeyError as e:
      raise ValueError(
          f'character {e.args[0]!r} in {text!r} is not in the tokenizer '
          f'alphabet {self.alphabet!r}'
      ) from None

  def decode(self, ids: Sequence[int]) -> str:
    """Decodes up to the first EOS; PAD and BOS are dropped."""
    out = []
    for i in ids:
      i = int(i)
      if i == self.EOS:
        break
      if i >= 3 and i - 3 < len(self.alphabet):
        out.append(self.alphabet[i - 3])
    return ''.join(out)


class ByteTokenizer:
  """UTF-8 bytes as tokens: any text, for small models trained from scratch.

  Ids 0-2 are PAD, BOS and EOS; byte b is id b + 3. The vocabulary (259) is
  padded to 264, a multiple of 8. Decoding replaces a byte sequence cut in
  the middle of a character with U+FFFD.
  """

  PAD, BOS, EOS = 0, 1, 2

  def __init__(self):
    self.vocab_size = 264
    self.pad_id, self.bos_id, self.eos_id = self.PAD, self.BOS, self.EOS

  def encode(self, text: str) -> list[int]:
    return [b + 3 for b in text.encode('utf-8')]

  def decode(self, ids: Sequence[int]) -> str:
    """Decodes up to the first EOS; PAD, BOS and unused ids are dropped."""
    out = bytearray()
    for i in ids:
      i = int(i)
      if i == self.EOS:
        break
      if 3 <= i < 259:
        out.append(i - 3)
    return out.decode('utf-8', errors='replace')


TOKENIZERS = ('char', 'byte')


def make_tokenizer(name: str) -> Tokenizer:
  """The built-in tokenizer `name`: 'char' (the arithmetic alphabet) or
  'byte' (any UTF-8 text)."""
  if name == 'char':
    return CharTokenizer()
  if name == 'byte':
    return ByteTokenizer()
  raise ValueError(f'unknown tokenizer {name!r}; known: {TOKENIZERS}')


def left_truncate(ids: list[int], max_len: int) -> list[int]:
  """BOS-first `ids` cut to `max_len`: BOS and the last max_len - 1 tokens
  (the question usually ends a prompt). Shorter ids are returned as is."""
  if len(ids) <= max_len:
    return ids
  return ids[:1] + ids[len(ids) - max_len + 1:]


def encode_prompts(
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    max_len: int,
    *,
    truncate: bool = False,
    names: Sequence[str] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Encodes prompts (BOS first) into a left-padded batch.

  Args:
    tokenizer: the tokenizer.
    prompts: R prompt texts.
    max_len: P, the padded prompt length.
    truncate: a longer prompt keeps BOS and its last P - 1 tokens (the
      question usually ends a prompt) instead of raising.
    names: R example ids, to name a prompt that is too long.

  Returns:
    tokens [R, P] int32, mask [R, P] bool (True on real tokens) and
    truncated [R] bool (True where `truncate` cut the prompt).

  Raises:
    PromptTooLongError: a prompt needs more than `max_len` tokens and
      `truncate` is off.
  """
  tokens = np.full((len(prompts), max_len), tokenizer.pad_id, np.int32)
  mask = np.zeros((len(prompts), max_len), bool)
  truncated = np.zeros(len(prompts), bool)
  for r, text in enumerate(prompts):
    ids = [tokenizer.bos_id] + tokenizer.encode(text)
    if len(ids) > max_len:
      if not truncate:
        what = f'example {names[r]}' if names else f'prompt {text[:40]!r}'
        raise PromptTooLongError(
            f'{what} is {len(ids)} tokens (BOS included), longer than '
            f'rollout.max_prompt_len={max_len}; raise it, or set '
            "rollout.long_prompts to 'truncate' or 'drop'"
        )
      ids = left_truncate(ids, max_len)
      truncated[r] = True
    tokens[r, max_len - len(ids):] = ids
    mask[r, max_len - len(ids):] = True
  return tokens, mask, truncated
