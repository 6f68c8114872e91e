"""Tokenizers from GGUF metadata (`tokenizer_parts`).

A GGUF file holds its tokenizer as metadata: the vocabulary with each
token's type, BPE merges or SentencePiece scores, the pre-tokenizer's name,
the special token ids and a chat template. `tokenizer_parts` rebuilds a
`tokenizers.Tokenizer` from them as llama.cpp reads them: byte-level BPE
('gpt2': SmolLM2, Qwen2, DeepSeek-R1-Distill-Qwen, Llama 3) or SentencePiece
('llama': Llama 2, Mistral, TinyLlama, Gemma). The model's weights are read
by `jaxgrpo.model.gguf`, through the same reader and field lookup.

Size: both tokenizer models llama.cpp reads (byte-level BPE with the
regexes of its pre-tokenizers, SentencePiece with its merge order) and the
special-token rules they share read one file's metadata in one pass.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
from typing import TYPE_CHECKING, Any

from jaxgrpo.model import gguf as gguf_file

if TYPE_CHECKING:
  import gguf
  import tokenizers

# pylint: disable=protected-access  # gguf's reader and field lookup

_LOG = logging.getLogger(__name__)  # `jaxgrpo.*`: the CLIs show it

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
_UNKNOWN, _CONTROL, _USER_DEFINED, _BYTE = 2, 3, 4, 6
# tokenizer.ggml.model values: byte-level BPE and SentencePiece.
_TOKENIZER_MODELS = ('gpt2', 'llama')
_SPACE = '\u2581'  # SentencePiece's '▁', which stands for a space.

# tokenizer.ggml.pre values whose pre-tokenization is GPT-2's regex, and those
# that first split every digit on its own (llama.cpp's \p{N} rule).
_GPT2_PRE = ('default', 'gpt-2', 'gpt2')
_DIGIT_SPLIT_PRE = (
    'smollm', 'starcoder', 'refact', 'command-r', 'codeshell', 'exaone',
    'minerva',
)
# tokenizer.ggml.pre values that split text by their Hugging Face
# tokenizer's regexes (llama.cpp's own copies of them), each regex the
# pieces of the one before, before byte-level BPE, and whether that
# tokenizer first applies Unicode NFC.
_LETTERS = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
            r'\p{N}%s| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+')
# DeepSeek-V3's: groups of up to three digits, runs of CJK ideographs and
# kana, then words, punctuation and spaces (llama.cpp's DEEPSEEK3_LLM type,
# llm_tokenizer_bpe in src/llama-vocab.cpp, the commit below).
_DEEPSEEK3 = (
    r'\p{N}{1,3}',
    '[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+',
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|"""
    r'[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|'
    r'\s*[\r\n]+|\s+(?!\S)|\s+',
)
_REGEX_PRE = {
    'qwen2': ((_LETTERS % '',), True),  # Qwen2/2.5: digits one by one.
    # DeepSeek-R1-Distill-Qwen (1.5B to 32B): Qwen2.5's tokenizer with
    # DeepSeek's special tokens; llama.cpp reads the name as its QWEN2 type
    # (src/llama-vocab.cpp, commit 00ad355e009e83abf98f96a6ded7193b95763681).
    'deepseek-r1-qwen': ((_LETTERS % '',), True),
    'llama-bpe': ((_LETTERS % '{1,3}',), False),  # Llama 3.x: up to 3 digits.
    # DeepSeek-V3 and R1, and the Qwen3 model that shares their tokenizer
    # (DeepSeek-R1-0528-Qwen3-8B); no normalization, as in llama.cpp.
    'deepseek-v3': (_DEEPSEEK3, False),
}

# A file without tokenizer.ggml.add_bos_token (older Llama 2, Mistral and
# TinyLlama files) gets llama.cpp's default for its tokenizer, as in
# src/llama-vocab.cpp, llama_vocab::impl::load (ggml-org/llama.cpp, commit
# 00ad355e009e83abf98f96a6ded7193b95763681): a SentencePiece vocabulary
# ('llama') adds BOS; a byte-level BPE one ('gpt2') adds BOS only after
# these pre-tokenizers (Llama 3's 'llama-bpe' among them), none after others.
# Neither adds an EOS by default. A key the file holds decides.
_BOS_PRE = (
    'llama3', 'llama-v3', 'llama-bpe', 'falcon3', 'falcon-h1', 'pixtral',
    'midm-2.0', 'lfm2', 'jina-v5-nano', 'tekken', 'chameleon',
)


def _pre_tokenizer(reader: gguf.GGUFReader, pre: str) -> Any:
  tk = gguf_file._import('tokenizers')
  byte_level = tk.pre_tokenizers.ByteLevel(
      add_prefix_space=False, use_regex=True
  )
  if pre in _GPT2_PRE:
    return byte_level
  if pre in _DIGIT_SPLIT_PRE:
    return tk.pre_tokenizers.Sequence(
        [tk.pre_tokenizers.Digits(individual_digits=True), byte_level]
    )
  if pre in _REGEX_PRE:
    return tk.pre_tokenizers.Sequence([
        *(tk.pre_tokenizers.Split(tk.Regex(regex), behavior='isolated',
                                  invert=False)
          for regex in _REGEX_PRE[pre][0]),
        tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
  raise gguf_file.GGUFError(
      f'{gguf_file._name(reader)}: tokenizer.ggml.pre = {pre!r} is not supported (known: '
      f'{", ".join(_GPT2_PRE + _DIGIT_SPLIT_PRE + tuple(_REGEX_PRE))})'
  )


def _flag(reader: gguf.GGUFReader, key: str, default: bool) -> bool:
  """The bool metadata `key`, or `default` where the file has none."""
  value = gguf_file._field(reader, key, None)
  if value is None:
    return default
  if not isinstance(value, bool):
    raise gguf_file.GGUFError(
        f'{gguf_file._name(reader)}: metadata key {key!r} = {value!r:.60}: '
        'must be a bool')
  return value


# The special ids llama.cpp assumes where a file names none, per
# tokenizer.ggml.model (llama_vocab::impl::load, src/llama-vocab.cpp,
# commit 00ad355e009e83abf98f96a6ded7193b95763681): SentencePiece BOS 1 and
# EOS 2, byte-level BPE 11 for both. A default outside the vocabulary is
# dropped there, and a vocabulary that must add the token but has none is
# refused (check_add_special_token: "... is true, but ... is not set").
_DEFAULT_IDS = {'llama': {'bos': 1, 'eos': 2}, 'gpt2': {'bos': 11, 'eos': 11}}


def _byte_level_bpe(reader: gguf.GGUFReader, vocab: dict[str, int],
                    pre: str) -> tokenizers.Tokenizer:
  """The 'gpt2' tokenizer: byte-level BPE with the file's merges and the
  pre-tokenizer `pre` names."""
  tk = gguf_file._import('tokenizers')
  pairs = []
  for merge in gguf_file._typed(reader, 'tokenizer.ggml.merges', 'a list of strings'):
    parts = merge.split(' ')
    if len(parts) != 2:
      raise gguf_file.GGUFError(f'{gguf_file._name(reader)}: tokenizer.ggml.merges entry '
                      f'{merge!r} is not two tokens')
    pairs.append((parts[0], parts[1]))
  tokenizer = tk.Tokenizer(
      tk.models.BPE(vocab=vocab, merges=pairs, fuse_unk=False,
                    byte_fallback=False)
  )
  tokenizer.pre_tokenizer = _pre_tokenizer(reader, pre)
  if _REGEX_PRE.get(pre, ('', False))[1]:
    tokenizer.normalizer = tk.normalizers.NFC()
  tokenizer.decoder = tk.decoders.ByteLevel()
  return tokenizer


# The most "left of" pairs among merges of one score that `_leftmost_first`
# orders (a vocabulary whose pieces all score alike, as gguf-py's
# LlamaHfVocab writes -1000 for each, has millions).
_MAX_TIE_PAIRS = 1_000_000


def _leftmost_first(tied: list[tuple[str, str, float]],
                    name: str) -> list[tuple[str, str, float]]:
  """Merges of one score in the order that llama.cpp applies them.

  llama.cpp's SentencePiece tokenizer (llm_tokenizer_spm_session,
  src/llama-vocab.cpp, ggml-org/llama.cpp commit
  00ad355e009e83abf98f96a6ded7193b95763681) pops the highest-scoring
  adjacent pair, and of pairs of equal score the leftmost
  (llm_bigram_spm::comparator: by score, then by left symbol). Two such
  pairs compete only where they overlap, X = (p, q) just left of
  Y = (q, r): so X goes before Y in the merge list, whose order
  `tokenizers` follows. Merges no overlap orders keep their order in
  `tied`. A cycle (X = (a, b) and Y = (b, a)) has no such order: llama.cpp
  merges 'aba' as ab + a, 'bab' as ba + b; a warning says so.
  """
  by_left = collections.defaultdict(list)
  for j, (left, _, _) in enumerate(tied):
    by_left[left].append(j)
  after = lambda j: [k for k in by_left.get(tied[j][1], ()) if k != j]
  pairs = sum(len(by_left.get(right, ())) for _, right, _ in tied)
  if len(tied) < 2 or not pairs:
    return tied
  if pairs > _MAX_TIE_PAIRS:
    _LOG.warning(
        '%s: tokenizer.ggml.scores gives %d merges the score %g: they are '
        "not put in llama.cpp's leftmost-first order (too many overlaps), "
        'so text where they meet may encode otherwise than in llama.cpp',
        name, len(tied), tied[0][2])
    return tied
  before = [0] * len(tied)  # how many merges must go first
  for j in range(len(tied)):
    for k in after(j):
      before[k] += 1
  ready = [j for j in range(len(tied)) if not before[j]]
  heapq.heapify(ready)
  order = []
  while ready:
    j = heapq.heappop(ready)
    order.append(j)
    for k in after(j):
      before[k] -= 1
      if not before[k]:
        heapq.heappush(ready, k)
  rest = [j for j in range(len(tied)) if before[j]]
  order += rest
  # Runs of one character (Gemma's spaces and newlines, user-defined pieces
  # of score 0) cycle too, but merge to the same pieces in either order.
  rest = [j for j in rest if len(set(tied[j][0] + tied[j][1])) > 1]
  # A merge whose piece another merge of the score takes apart again
  # ('b' + '▁' -> 'b▁', then 'b▁' + 'a') competes, through it, with
  # merges it does not overlap ('a' + 'a'), which no order of the list
  # follows everywhere either.
  made = {left + right for left, right, _ in tied}
  chained = [j for j in order if (tied[j][0] in made or tied[j][1] in made)
             and len(set(tied[j][0] + tied[j][1])) > 1]
  for merges, how in ((rest, 'overlap one another both ways'),
                      ([] if rest else chained,
                       'build on pieces other merges of that score make')):
    if merges:
      example = ' and '.join(f'{tied[j][0]!r} + {tied[j][1]!r}'
                             for j in merges[:2])
      _LOG.warning(
          '%s: tokenizer.ggml.scores gives %d merges of score %g that %s '
          '(%s): llama.cpp merges the leftmost of two first, as the pieces '
          'form, which no merge order follows everywhere, so text where '
          'they meet may encode otherwise than in llama.cpp', name,
          len(merges), tied[0][2], how, example)
  return [tied[j] for j in order]


def _sentencepiece(reader: gguf.GGUFReader, vocab: dict[str, int],
                   tokens: list[str], types: list[int]) -> tokenizers.Tokenizer:
  """The 'llama' tokenizer: SentencePiece BPE, as llama.cpp's SPM tokenizer
  reads it and transformers' LlamaTokenizer builds it.

  llama.cpp merges the adjacent pair whose joined piece scores highest
  (tokenizer.ggml.scores), so the merges are every split of a piece into
  two pieces of the vocabulary, highest score first; characters outside the
  vocabulary become their UTF-8 byte tokens (<0x41>). A space is written
  '▁', and text (each stretch of it between special tokens) starts with one
  unless tokenizer.ggml.add_space_prefix is false (llama.cpp's default for
  this vocabulary is true).
  """
  tk = gguf_file._import('tokenizers')
  name = gguf_file._name(reader)
  scores = gguf_file._typed(reader, 'tokenizer.ggml.scores', 'a list of numbers',
                  [0.0] * len(tokens))
  if len(scores) != len(tokens):
    raise gguf_file.GGUFError(f'{name}: tokenizer.ggml.scores has {len(scores)} '
                    f'entries for {len(tokens)} tokens')
  merges = []
  for i, piece in enumerate(tokens):
    if types[i] in (_UNKNOWN, _CONTROL, _BYTE):
      continue
    splits = [(piece[:k], piece[k:]) for k in range(1, len(piece))
              if piece[:k] in vocab and piece[k:] in vocab]
    splits.sort(key=lambda lr: (vocab[lr[0]], vocab[lr[1]]))
    merges += [(left, right, scores[i]) for left, right in splits]
  # Stable: pairs of equal key keep the order above, as transformers'.
  merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
  merges = [m for _, tied in itertools.groupby(merges, key=lambda m: m[2])
            for m in _leftmost_first(list(tied), name)]
  unknown = next((t for t, k in zip(tokens, types) if k == _UNKNOWN), None)
  tokenizer = tk.Tokenizer(tk.models.BPE(
      vocab=vocab, merges=[(left, right) for left, right, _ in merges],
      unk_token=unknown, fuse_unk=True, byte_fallback=True))
  key = 'tokenizer.ggml.add_space_prefix'
  prefix = gguf_file._field(reader, key, True)
  if not isinstance(prefix, bool):
    raise gguf_file.GGUFError(f'{name}: metadata key {key!r} = {prefix!r:.60}: must be '
                    'a bool')
  # llama.cpp puts the space before every stretch of text, at the start and
  # after each special token, even one that starts with a space (as Llama
  # 2's own tokenizer.json does; transformers' GGUF reader only at the
  # start of a text that has none).
  tokenizer.normalizer = tk.normalizers.Sequence(
      ([tk.normalizers.Prepend(_SPACE)] if prefix else [])
      + [tk.normalizers.Replace(' ', _SPACE)])
  decoders = [tk.decoders.Replace(_SPACE, ' '), tk.decoders.ByteFallback(),
              tk.decoders.Fuse()]
  if prefix:
    decoders.append(tk.decoders.Strip(content=' ', left=1, right=0))
  tokenizer.decoder = tk.decoders.Sequence(decoders)
  return tokenizer


def _token_id(reader: gguf.GGUFReader, key: str, size: int) -> int | None:
  """The token id metadata `key` names, or None; one of the `size` ids."""
  value = gguf_file._typed(reader, key, 'an int', None)
  if value is not None and not 0 <= value < size:
    raise gguf_file.GGUFError(
        f'{gguf_file._name(reader)}: {key} = {value} is outside the '
        f'{size}-token vocab')
  return value


def _ends(reader: gguf.GGUFReader, model: str, pre: str,
          tokens: list[str]) -> dict[str, Any]:
  """The BOS and EOS of a vocabulary of `tokens` and whether prompts get
  them: `tokenizer_parts`' 'bos_id', 'eos_id', 'add_bos' and 'add_eos'.

  A file without tokenizer.ggml.add_bos_token gets llama.cpp's default
  (see `_BOS_PRE`); add_eos_token is false where absent. Where it is
  true, llama_vocab::impl::tokenize (src/llama-vocab.cpp, the commit of
  `_BOS_PRE`) appends the EOS to a text it encodes with add_special, after
  the text and whatever it ends with, SentencePiece and BPE alike. A BOS
  or EOS the file does not name is llama.cpp's default id (`_DEFAULT_IDS`),
  added or not: the chat template's bos_token is the default BOS's text
  there too, and completions end at the default EOS (with a warning that
  names it, since a 'gpt2' vocabulary's id 11 is an ordinary token).
  """
  name, size = gguf_file._name(reader), len(tokens)
  adds = {'bos': _flag(reader, 'tokenizer.ggml.add_bos_token',
                       model == 'llama' or pre in _BOS_PRE),
          'eos': _flag(reader, 'tokenizer.ggml.add_eos_token', False)}

  def special_id(kind: str) -> int | None:
    key = f'tokenizer.ggml.{kind}_token_id'
    value = _token_id(reader, key, size)
    if value is not None:
      return value
    default = _DEFAULT_IDS[model][kind]
    if default >= size and not adds[kind]:
      return None
    if default >= size:
      flag = f'tokenizer.ggml.add_{kind}_token'
      said = '' if flag in reader.fields else (
          " (llama.cpp's default for this vocabulary)")
      raise gguf_file.GGUFError(
          f'{name}: {flag} is true{said}, but metadata key {key!r} is '
          f"missing and llama.cpp's default {kind.upper()} id for a "
          f'{model!r} vocabulary, {default}, is outside the {size}-token '
          'vocab')
    return default

  eos_id = special_id('eos')
  if eos_id is None:
    raise gguf_file.GGUFError(
        f"{name}: metadata key 'tokenizer.ggml.eos_token_id' is missing: "
        'it names the token that ends a completion (and pads), and '
        f"llama.cpp's default for a {model!r} vocabulary, "
        f'{_DEFAULT_IDS[model]["eos"]}, is outside the {size}-token vocab')
  if 'tokenizer.ggml.eos_token_id' not in reader.fields:
    _LOG.warning(
        '%s names no EOS (metadata key tokenizer.ggml.eos_token_id): '
        "completions end at llama.cpp's default for a %r vocabulary, id "
        '%d (%r), as they do under llama.cpp', name, model, eos_id,
        tokens[eos_id])
  return {'bos_id': special_id('bos'), 'eos_id': eos_id,
          'add_bos': adds['bos'], 'add_eos': adds['eos']}


def tokenizer_parts(
    source: gguf_file.Source,
) -> tuple[tokenizers.Tokenizer, dict[str, Any]]:
  """A tokenizer and its special ids from GGUF metadata.

  The tokenizer is byte-level BPE for a 'gpt2' tokenizer model and
  SentencePiece BPE for a 'llama' one (`_sentencepiece`). It adds no BOS/EOS
  itself: `encode(text).ids` are the text's tokens. Control tokens (ChatML's
  `<|im_start|>`, `<|im_end|>`, SentencePiece's `<s>`, `</s>` and its
  unknown token `<unk>`) are special: each encodes as one id and
  `decode(..., skip_special_tokens=True)` drops them.

  Length: its docstring lists the GGUF metadata keys read; the code reads them
  in one pass.

  Args:
    source: path or open reader of a GGUF file with a 'gpt2' or 'llama'
      tokenizer.

  Returns:
    (tokenizer, info) with info keys 'eos_id' (an int), 'bos_id', 'pad_id'
    (ints, or None when the file names none; a BOS or EOS the file does
    not name is llama.cpp's default id where the vocabulary has it, see
    `_DEFAULT_IDS`),
    'chat_template' (Jinja source or None),
    'add_bos' (whether the model expects a leading BOS: the file's
    tokenizer.ggml.add_bos_token, or where it has none llama.cpp's default
    for its tokenizer, see `_BOS_PRE`), 'add_eos' (whether it appends the
    EOS where it adds special tokens: tokenizer.ggml.add_eos_token, false
    where absent, as llama.cpp) and 'stop_ids' (the end-of-turn and
    end-of-message tokens, tokenizer.ggml.eot_token_id and eom_token_id,
    that also end a completion; empty when the file names none).

  Raises:
    gguf_file.GGUFError: no tokenizer, no EOS token id (named or default),
      another tokenizer model,
      a 'gpt2' pre-tokenizer not modelled here, an add_bos_token or
      add_eos_token that is not a bool, or a BOS or EOS to add that the file
      does not name and whose default id is outside the vocabulary.
  """
  tk = gguf_file._import('tokenizers')
  reader = gguf_file.open_reader(source)
  name = gguf_file._name(reader)
  model = gguf_file._field(reader, 'tokenizer.ggml.model')
  if model not in _TOKENIZER_MODELS:
    raise gguf_file.GGUFError(
        f'{name}: tokenizer.ggml.model = {model!r} is not supported (only '
        "byte-level BPE, 'gpt2', and SentencePiece, 'llama')"
    )
  tokens = gguf_file._typed(reader, 'tokenizer.ggml.tokens', 'a list of strings')
  types = gguf_file._typed(reader, 'tokenizer.ggml.token_type', 'a list of ints',
                 [1] * len(tokens))
  if len(types) != len(tokens):
    raise gguf_file.GGUFError(
        f'{name}: tokenizer.ggml.token_type has {len(types)} entries for '
        f'{len(tokens)} tokens'
    )
  vocab = {}
  for i, token in enumerate(tokens):
    vocab.setdefault(token, i)  # A repeated token keeps its first id.
  pre = gguf_file._field(reader, 'tokenizer.ggml.pre', 'default')
  if model == 'llama':
    tokenizer = _sentencepiece(reader, vocab, tokens, types)
    special = (_CONTROL, _UNKNOWN)
  else:
    tokenizer = _byte_level_bpe(reader, vocab, pre)
    special = (_CONTROL,)
  tokenizer.add_special_tokens([
      tk.AddedToken(tokens[i], special=True, normalized=False)
      for i, t in enumerate(types) if t in special
  ])
  tokenizer.add_tokens([
      tk.AddedToken(tokens[i], special=False, normalized=False)
      for i, t in enumerate(types) if t == _USER_DEFINED
  ])

  token_id = lambda key: _token_id(reader, key, len(tokens))
  ends = _ends(reader, model, pre, tokens)
  info = {
      **ends,  # bos_id, eos_id, add_bos, add_eos
      'pad_id': token_id('tokenizer.ggml.padding_token_id'),
      'chat_template': gguf_file._typed(reader, 'tokenizer.chat_template', 'a string',
                              None),
      # The end-of-turn (Llama 3's <|eot_id|>) and end-of-message
      # (<|eom_id|>) tokens newer files name; llama.cpp stops at them too.
      'stop_ids': tuple(i for i in map(token_id, (
          'tokenizer.ggml.eot_token_id', 'tokenizer.ggml.eom_token_id'))
                        if i is not None),
  }
  return tokenizer, info
