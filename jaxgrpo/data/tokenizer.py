"""Tokenizers and batch encoding of prompts into left-padded arrays."""

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from jaxgrpo import errors


class Tokenizer(Protocol):
  """What the generator, learner and verifiers need from a tokenizer.

  `bos_id` is None for a model that starts prompts with no BOS (Qwen); with
  `add_bos` False a tokenizer keeps its BOS out of prompts too (see
  `adds_bos`). `stop_ids` are the tokens that end a completion: EOS and, for
  chat models, end-of-turn tokens such as <|im_end|>.
  """

  vocab_size: int
  pad_id: int
  bos_id: int | None
  eos_id: int
  add_bos: bool
  stop_ids: tuple[int, ...]

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
    self.add_bos = True
    self.stop_ids = (self.EOS,)

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
    self.add_bos = True
    self.stop_ids = (self.EOS,)

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

# The chat template of a model trained on prompts as they are: the BOS and
# the user's text, nothing around it (a system turn goes before it, on its
# own line).
PLAIN_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['content'] }}"
    "{% if not loop.last %}{{ '\\n' }}{% endif %}{% endfor %}")


def _byte_chars() -> list[str]:
  """The 256 printable characters that byte-level BPE writes bytes 0-255 as
  (GPT-2's table), in byte order."""
  kept = [*range(33, 127), *range(161, 173), *range(174, 256)]
  extra = iter(range(256, 512))
  return [chr(b if b in kept else next(extra)) for b in range(256)]


def to_hf(tokenizer: 'CharTokenizer | ByteTokenizer') -> Any:
  """A built-in tokenizer as an `HFTokenizer` with the same ids: what
  `jaxgrpo-export` writes next to a preset's weights, so that the export
  reads back (`model.path`, transformers). Its chat template is
  `PLAIN_TEMPLATE`: prompts as they were trained on.

  Needs the `tokenizers` package (the `hf` extra).
  """
  # pylint: disable=g-import-not-at-top
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers, processors
  from jaxgrpo.data import hf_tokenizer
  # ids PAD, BOS, EOS. The built-in tokenizers have no text for them, and
  # a special token's text is matched in what is encoded, so they are named
  # what no prompt holds: as '<s>' a byte run's '<s>' in a prompt became
  # its BOS id in the export.
  specials = ['<|jaxgrpo_pad|>', '<|jaxgrpo_bos|>', '<|jaxgrpo_eos|>']
  if isinstance(tokenizer, CharTokenizer):
    chars = list(tokenizer.alphabet)
    backend = tokenizers.Tokenizer(models.WordLevel(
        {c: i for i, c in enumerate(specials + chars)}, unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.Split(
        tokenizers.Regex('(?m).'), behavior='isolated')
    backend.decoder = decoders.Fuse()
  elif isinstance(tokenizer, ByteTokenizer):
    chars = _byte_chars()
    backend = tokenizers.Tokenizer(models.BPE(
        {c: i for i, c in enumerate(specials + chars)}, []))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(
        add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
  else:
    raise TypeError(f'not a built-in tokenizer: {tokenizer!r}')
  backend.add_special_tokens(specials)
  backend.post_processor = processors.TemplateProcessing(
      single=f'{specials[1]} $A', special_tokens=[(specials[1], tokenizer.BOS)])
  return hf_tokenizer.HFTokenizer(
      backend, bos_id=tokenizer.BOS, eos_id=tokenizer.EOS,
      pad_id=tokenizer.PAD, chat_template=PLAIN_TEMPLATE, add_bos=True,
      vocab_size=tokenizer.vocab_size,
      template_tokens=dict(zip(('pad_token', 'bos_token', 'eos_token'),
                               specials)),
      source=f'the built-in {type(tokenizer).__name__}')


def make_tokenizer(name: str) -> Tokenizer:
  """The built-in tokenizer `name`: 'char' (the arithmetic alphabet) or
  'byte' (any UTF-8 text); 'auto' (`model.tokenizer`'s default, for a
  preset) is 'char'."""
  if name in ('char', 'auto'):
    return CharTokenizer()
  if name == 'byte':
    return ByteTokenizer()
  raise ValueError(f'unknown tokenizer {name!r}; known: {TOKENIZERS}')


def adds_bos(tokenizer: Tokenizer) -> bool:
  """Whether prompts start with the tokenizer's BOS: it has one and its
  `add_bos` (True when absent) is on."""
  return (tokenizer.bos_id is not None
          and bool(getattr(tokenizer, 'add_bos', True)))


def _starts_with_bos(tokenizer: Tokenizer, ids: Sequence[int]) -> bool:
  return tokenizer.bos_id is not None and ids[:1] == [tokenizer.bos_id]


def left_truncate(ids: list[int], max_len: int, *,
                  keep_first: bool = True) -> list[int]:
  """`ids` cut to their last `max_len` tokens (the question usually ends a
  prompt); with `keep_first` (a BOS-first prompt), the first token and the
  last max_len - 1. Shorter ids are returned as is."""
  if len(ids) <= max_len:
    return ids
  if keep_first:
    return ids[:1] + ids[len(ids) - max_len + 1:]
  return ids[len(ids) - max_len:]


def prompt_ids(tokenizer: Tokenizer, text: str,
               max_len: int | None = None) -> list[int]:
  """The token ids a model sees for prompt `text`.

  BOS comes first when the tokenizer adds one (`adds_bos`) and the text does
  not already start with it; EOS comes last when its `add_eos` (False when
  absent) is on. With `max_len`, a longer prompt keeps its BOS, if any, and
  its last tokens.

  A tokenizer that applies a chat template (`chat`, set by
  `HFTokenizer.with_prompts`) turns the prompt into the text to encode
  first, and adds no BOS of its own: the template writes one (Llama 3's,
  Gemma's) or none (Qwen2's, ChatML's), as transformers'
  `apply_chat_template`. A longer chat prompt loses the start of the
  user's text instead: the template's tokens around it (BOS, system turn,
  user header, end of turn and generation prompt) are kept, unless they
  alone do not fit.

  Args:
    tokenizer: the tokenizer.
    text: the prompt.
    max_len: the most tokens to keep, or None to keep all.

  Returns:
    The prompt's token ids.
  """
  ids = _encode_prompt(tokenizer, text)
  if max_len is None or len(ids) <= max_len:
    return ids
  prompt_text = getattr(tokenizer, 'prompt_text', None)
  if prompt_text is not None and prompt_text(text) != text:
    start = _chat_cut(tokenizer, text, max_len)
    if start is not None:
      return _encode_prompt(tokenizer, text[start:])
  return left_truncate(ids, max_len,
                       keep_first=_starts_with_bos(tokenizer, ids))


def _encode_prompt(tokenizer: Tokenizer, text: str) -> list[int]:
  if getattr(tokenizer, 'chat', False):  # see HFTokenizer.with_prompts
    # The chat template writes the BOS, or none (Qwen2's): as transformers'
    # apply_chat_template, which encodes with add_special_tokens=False.
    return tokenizer.encode(tokenizer.prompt_text(text))
  ids = tokenizer.encode(text)
  if adds_bos(tokenizer) and not _starts_with_bos(tokenizer, ids):
    ids = [tokenizer.bos_id] + ids
  if getattr(tokenizer, 'add_eos', False):
    # A GGUF file's tokenizer.ggml.add_eos_token: llama.cpp appends the EOS
    # to what it encodes with special tokens, as transformers does.
    ids = ids + [tokenizer.eos_id]
  return ids


def _chat_cut(tokenizer: Tokenizer, text: str, max_len: int) -> int | None:
  """The fewest leading characters of `text` to cut for its chat prompt to
  fit `max_len` tokens, or None when the template's tokens alone do not fit.

  The kept end is found by doubling it, then bisecting, so that each try
  encodes a few times max_len characters rather than the whole text."""
  n = len(text)

  def fits(start: int) -> bool:
    return len(_encode_prompt(tokenizer, text[start:])) <= max_len

  if not fits(n):
    return None
  good, keep = n, max_len  # text[good:] fits.
  while keep < n and fits(n - keep):
    good, keep = n - keep, 2 * keep
  bad = max(n - keep, 0)  # text[bad:] does not fit (the whole text does not).
  while good - bad > 1:
    mid = (bad + good) // 2
    if fits(mid):
      good = mid
    else:
      bad = mid
  return good


def encode_prompts(
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    max_len: int,
    *,
    truncate: bool = False,
    names: Sequence[str] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Encodes prompts (`prompt_ids`: BOS first if any) into a left-padded batch.

  Args:
    tokenizer: the tokenizer.
    prompts: R prompt texts.
    max_len: P, the padded prompt length.
    truncate: a longer prompt is cut as `prompt_ids` cuts it (its BOS, if
      any, and its last tokens; a chat prompt's template around the end of
      the user's text) instead of raising.
    names: R example ids, to name a prompt that is too long.

  Returns:
    tokens [R, P] int32, mask [R, P] bool (True on real tokens) and
    truncated [R] bool (True where `truncate` cut the prompt).

  Raises:
    PromptTooLongError: a prompt needs more than `max_len` tokens and
      `truncate` is off.
    ValueError: a prompt has no tokens (an empty text and no BOS).
  """
  tokens = np.full((len(prompts), max_len), tokenizer.pad_id, np.int32)
  mask = np.zeros((len(prompts), max_len), bool)
  truncated = np.zeros(len(prompts), bool)
  for r, text in enumerate(prompts):
    ids = prompt_ids(tokenizer, text)
    what = f'example {names[r]}' if names else f'prompt {text[:40]!r}'
    if not ids:
      raise ValueError(f'{what} is empty and the tokenizer adds no BOS')
    if len(ids) > max_len:
      if not truncate:
        bos = ' (BOS included)' if _starts_with_bos(tokenizer, ids) else ''
        raise PromptTooLongError(
            f'{what} is {len(ids)} tokens{bos}, longer than '
            f'rollout.max_prompt_len={max_len}; raise it, or set '
            "rollout.long_prompts to 'truncate' or 'drop'"
        )
      ids = prompt_ids(tokenizer, text, max_len)
      truncated[r] = True
    tokens[r, max_len - len(ids):] = ids
    mask[r, max_len - len(ids):] = True
  return tokens, mask, truncated
