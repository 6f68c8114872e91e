"""Pretrained models' tokenizers: a `tokenizers.Tokenizer` and a chat template.

`HFTokenizer` gives a Hugging Face model directory (tokenizer.json,
tokenizer_config.json, chat_template.jinja, generation_config.json) or the
parts read from a GGUF file the interface of `tokenizer.Tokenizer`, and
renders prompts through the model's chat template as transformers'
`apply_chat_template(..., tokenize=False, add_generation_prompt=True)` does.

Unlike the built-in tokenizers, a model may add no BOS (Qwen, SmolLM2) and may
end a turn with a token other than its EOS (<|im_end|>, <|eot_id|>): `bos_id`
is None when the model adds none, and `stop_ids` lists every token that ends
a completion. The `tokenizers` and `jinja2` packages are needed only here.

Size: one class, `HFTokenizer`, and the chat template it compiles; the
two files it reads (a directory's or a GGUF file's parts) meet in its
constructor.
"""

from collections.abc import Mapping, Sequence
import copy
import datetime
import functools
import json
import logging
import os
from typing import Any

from jaxgrpo import errors

_LOG = logging.getLogger(__name__)

# Tokens that end a chat turn or a document in common model families; those
# in a vocabulary stop decoding along with its EOS.
END_TOKENS = (
    '<|im_end|>',  # ChatML: Qwen, SmolLM2.
    '<|endoftext|>',  # GPT-2, Qwen, SmolLM2.
    '<|eot_id|>',  # Llama 3.
    '<|eom_id|>',  # Llama 3.1 tool calls.
    '<|end_of_text|>',  # Llama 3.
    '<end_of_turn>',  # Gemma.
    '<|end|>',  # Phi-3.
)

class TokenizerFileError(errors.ConfigError):
  """A tokenizer file is missing, unreadable or names unknown tokens."""


class ChatTemplateError(errors.ConfigError):
  """A chat template is missing or fails to render a prompt."""


class HFTokenizer:
  """A pretrained model's tokenizer with the project's `Tokenizer` interface.

  Attributes:
    vocab_size: V, the embedding rows: the tokenizer's size, or more when the
      model pads its embedding table.
    pad_id: the pad token, else EOS.
    bos_id: the BOS the model puts before a prompt, or None when it adds none.
    add_bos: whether prompts start with `bos_id` (True exactly when it is
      set).
    eos_id: the end-of-sequence token.
    add_eos: whether a prompt encoded without the chat template ends with
      `eos_id` (a GGUF file's tokenizer.ggml.add_eos_token, a post-processor
      that appends it).
    stop_ids: EOS first, then the other end tokens: those the model's files
      name (generation_config.json's and config.json's eos_token_id, GGUF's
      eot and eom ids) and `END_TOKENS` in the vocabulary.
    chat_template: the Jinja chat template, or None.
    backend: the wrapped `tokenizers.Tokenizer`.
    source: where the tokenizer came from, for error messages.
  """

  def __init__(
      self,
      backend: Any,
      *,
      bos_id: int | None,
      eos_id: int,
      pad_id: int | None,
      chat_template: str | None,
      add_bos: bool,
      vocab_size: int | None = None,
      extra_stop_ids: Sequence[int] = (),
      template_tokens: Mapping[str, str] | None = None,
      source: str = 'tokenizer',
      add_eos: bool = False,
  ):
    """Wraps `backend`; see `from_parts` for the arguments.

    `extra_stop_ids` are more tokens that end a completion;
    `template_tokens` are the chat template's bos_token, eos_token, ...
    variables (by default the strings of `bos_id`, `eos_id` and `pad_id`).

    Raises:
      TokenizerFileError: an id is outside the vocabulary or `vocab_size`
        is smaller than the tokenizer.
    """
    self.backend = backend
    self.source = source
    size = 1 + max(backend.get_vocab(with_added_tokens=True).values(),
                   default=-1)
    if vocab_size is not None and vocab_size < size:
      raise TokenizerFileError(
          f'vocab_size={vocab_size} is smaller than the {size} tokens of '
          f'{source}'
      )
    self.vocab_size = size if vocab_size is None else vocab_size
    for name, i in (('bos', bos_id), ('eos', eos_id), ('pad', pad_id)):
      if i is not None and not 0 <= i < size:
        raise TokenizerFileError(
            f'{name} id {i} is outside the {size} tokens of {source}')
    self.eos_id = eos_id
    self.pad_id = eos_id if pad_id is None else pad_id
    self.add_bos = bool(add_bos) and bos_id is not None
    self.bos_id = bos_id if self.add_bos else None
    self.add_eos = bool(add_eos)
    stops = [eos_id, *extra_stop_ids]
    stops += [backend.token_to_id(t) for t in END_TOKENS]
    self.stop_ids = tuple(dict.fromkeys(
        int(i) for i in stops if i is not None and 0 <= i < self.vocab_size))
    self._stop_set = frozenset(self.stop_ids)
    self.chat_template = chat_template
    if template_tokens is None:
      template_tokens = {
          f'{name}_token': backend.id_to_token(i)
          for name, i in (('bos', bos_id), ('eos', eos_id), ('pad', pad_id))
          if i is not None
      }
    self._template_tokens = dict(template_tokens)
    self.chat = False
    self.system: str | None = None

  @classmethod
  def from_parts(
      cls,
      tokenizer: Any,
      *,
      bos_id: int | None,
      eos_id: int,
      pad_id: int | None,
      chat_template: str | None,
      add_bos: bool,
      vocab_size: int | None = None,
      extra_stop_ids: Sequence[int] = (),
      source: str = 'tokenizer',
      add_eos: bool = False,
  ) -> 'HFTokenizer':
    """A tokenizer built from parts, e.g. those stored in a GGUF file.

    Args:
      tokenizer: a `tokenizers.Tokenizer`.
      bos_id: the model's BOS token (also the template's bos_token when
        `add_bos` is off), or None.
      eos_id: the model's EOS token.
      pad_id: the pad token; None pads with EOS.
      chat_template: a Jinja chat template, or None.
      add_bos: whether the model puts `bos_id` before a prompt.
      vocab_size: the model's embedding rows, when more than the tokenizer's
        size.
      extra_stop_ids: more tokens that end a completion (a GGUF file's
        end-of-turn and end-of-message tokens).
      source: where the parts came from, for error messages.
      add_eos: whether the model puts `eos_id` after a prompt encoded
        without the chat template.

    Returns:
      The tokenizer.
    """
    return cls(tokenizer, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id,
               chat_template=chat_template, add_bos=add_bos,
               vocab_size=vocab_size, extra_stop_ids=extra_stop_ids,
               source=source, add_eos=add_eos)

  @classmethod
  def from_dir(cls, path: str | os.PathLike[str], *,
               vocab_size: int | None = None) -> 'HFTokenizer':
    """The tokenizer of a Hugging Face model directory.

    Reads tokenizer.json; tokenizer_config.json's bos_token, eos_token and
    pad_token (strings or AddedToken dicts; those it lacks from
    special_tokens_map.json, as transformers reads a legacy folder),
    add_bos_token and chat_template (a string, or a list of named templates
    of which 'default' is used); chat_template.jinja, which replaces the
    config's template, and chat_template.json, a processor's template
    where neither has one; and the eos_token_id (an int or a list) of
    generation_config.json and of config.json: every one ends a
    completion (transformers' generate stops at the first file's, or
    the second's where there is no first), and the first is the EOS where
    no file names an eos_token. The model adds
    BOS when tokenizer.json's post-processor puts it first, and the EOS
    when it puts it last, as in transformers 5; add_bos_token and
    add_eos_token count only where tokenizer.json has no post-processor.

    Length: its docstring lists the files and fields read; the code reads them
    in one pass.

    Args:
      path: the directory.
      vocab_size: the model's embedding rows, when more than the tokenizer's
        size.

    Returns:
      The tokenizer.

    Raises:
      TokenizerFileError: a file is missing or malformed, eos_token is
        missing or not in the vocabulary, or an eos_token_id is outside
        the model's ids.
      ImportError: the `tokenizers` package is not installed.
    """
    try:
      import tokenizers  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise ImportError(
          'reading a model tokenizer needs the tokenizers package: '
          'pip install tokenizers') from e
    path = os.fspath(path)
    tok_file = os.path.join(path, 'tokenizer.json')
    if not os.path.isfile(tok_file):
      raise TokenizerFileError(f'{tok_file} not found')
    try:
      backend = tokenizers.Tokenizer.from_file(tok_file)
    except Exception as e:  # The Rust errors have no common Python type.
      raise TokenizerFileError(f'cannot read {tok_file}: {e}') from e
    config_file = os.path.join(path, 'tokenizer_config.json')
    config = _read_json(config_file) if os.path.isfile(config_file) else {}
    # The special tokens: tokenizer_config.json's, else (as transformers
    # reads a legacy folder) special_tokens_map.json's.
    specials = {}
    for file in (os.path.join(path, 'special_tokens_map.json'), config_file):
      data = config if file == config_file else (
          _read_json(file) if os.path.isfile(file) else {})
      for key in ('bos_token', 'eos_token', 'unk_token', 'pad_token',
                  'sep_token', 'cls_token', 'mask_token'):  # the template's
        token = _token_string(data.get(key), file, key)
        if token is not None:
          specials[key] = token, file

    def token_id(key: str) -> int | None:
      if key not in specials:
        return None
      return backend.token_to_id(specials[key][0])

    # Every end token the model's files name: generation_config.json's
    # (what transformers' generate stops at) and config.json's (what it
    # stops at without a generation_config.json).
    bound = max(vocab_size or 0, 1 + max(
        backend.get_vocab(with_added_tokens=True).values(), default=-1))
    gen_stops, model_stops = (
        _eos_ids(os.path.join(path, name), bound, tok_file)
        for name in ('generation_config.json', 'config.json'))
    eos_id = token_id('eos_token')
    if 'eos_token' in specials and eos_id is None:
      token, file = specials['eos_token']
      raise TokenizerFileError(
          f'{file} names no eos_token in the vocabulary of {tok_file} '
          f'(eos_token={token!r})'
      )
    if eos_id is None:
      # No file names the token: the id transformers' generate stops at.
      model_eos = gen_stops or model_stops
      if not model_eos:
        raise TokenizerFileError(
            f'{path} names no end-of-sequence token: no eos_token in '
            'tokenizer_config.json or special_tokens_map.json, no '
            'eos_token_id in generation_config.json or config.json')
      eos_id = model_eos[0]
    bos_id = token_id('bos_token')
    # transformers 5 ignores add_bos_token next to a tokenizer.json, whose
    # post-processor adds the BOS or not; without one, the flag says.
    if backend.post_processor is not None:
      before, after = _post_processor_adds(backend)
      add_bos = bos_id is not None and before[:1] == [bos_id]
      add_eos = after[-1:] == [eos_id]
    else:
      add_bos = bool(config.get('add_bos_token', False))
      add_eos = bool(config.get('add_eos_token', False))
    if config.get('split_special_tokens'):
      _LOG.warning(
          '%s: split_special_tokens is not followed: special-token strings '
          'in a prompt are encoded as those tokens (transformers would split '
          'them, its chat template\'s own included)', config_file)
    template_tokens = {key: token for key, (token, _) in specials.items()}
    if 'eos_token' not in template_tokens:
      template_tokens['eos_token'] = backend.id_to_token(eos_id)
    return cls(
        backend, bos_id=bos_id, eos_id=eos_id, pad_id=token_id('pad_token'),
        # An empty one is none, as transformers takes it.
        chat_template=_chat_template(path, config, config_file) or None,
        add_bos=add_bos, vocab_size=vocab_size,
        extra_stop_ids=gen_stops + model_stops,
        template_tokens={k: v for k, v in template_tokens.items() if v},
        source=path, add_eos=add_eos,
    )

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, adding no BOS or EOS; special-token strings in the
    text (e.g. '<|im_start|>') become their ids."""
    return self.backend.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """`encode` for each text."""
    return [e.ids for e in self.backend.encode_batch(
        list(texts), add_special_tokens=False)]

  def _completion(self, ids: Sequence[int]) -> list[int]:
    out = []
    for i in ids:
      i = int(i)
      if i in self._stop_set:
        break
      if i != self.pad_id:
        out.append(i)
    return out

  def decode(self, ids: Sequence[int]) -> str:
    """Decodes up to the first stop token; PAD, BOS and other special tokens
    (and ids past the tokenizer's size) are dropped."""
    return self.backend.decode(self._completion(ids), skip_special_tokens=True)

  def decode_batch(self, ids: Sequence[Sequence[int]]) -> list[str]:
    """`decode` for each row of ids, e.g. a [R, T] array."""
    return self.backend.decode_batch(
        [self._completion(row) for row in ids], skip_special_tokens=True)

  def with_prompts(self, *, chat: bool,
                   system: str | None = None) -> 'HFTokenizer':
    """A copy whose `prompt_text` applies the chat template (`chat`) with
    an optional system message; what rollouts, evaluation and the warm
    start encode."""
    if chat and self.chat_template is None:
      raise ChatTemplateError(
          f'model.chat_template=True, but {self.source} has no chat '
          'template; set model.chat_template=False')
    if system is not None and not chat:
      raise ChatTemplateError(
          'model.system_prompt needs model.chat_template=True')
    if chat:  # a template that writes no user text trains on nothing
      probe = 'Probe 4217 of the chat template'
      rendered = self.format_prompt(probe, system=system)
      if probe not in rendered:
        raise ChatTemplateError(
            f"the chat template of {self.source} drops the user's message: "
            f'{probe!r} renders as {rendered!r}; fix the template or set '
            'model.chat_template=False')
    out = copy.copy(self)
    out.chat, out.system = bool(chat), system
    return out

  def prompt_text(self, prompt: str) -> str:
    """The text encoded for `prompt` (see `with_prompts`; default as is)."""
    if not getattr(self, 'chat', False):
      return prompt
    return self.format_prompt(prompt, system=self.system)

  def format_prompt(self, prompt: str, *, system: str | None = None,
                    chat: bool = True) -> str:
    """The text to encode for `prompt`: the model's chat template applied.

    With `chat`, renders [system message,] user message and the assistant
    header, as transformers' apply_chat_template(messages, tokenize=False,
    add_generation_prompt=True). The result may start with the BOS string
    (Llama 3); `tokenizer.prompt_ids` then adds no second one.

    Args:
      prompt: the user's message.
      system: an optional system message.
      chat: False returns `prompt` as is (a base model's completion).

    Returns:
      The prompt text.

    Raises:
      ChatTemplateError: there is no chat template, the template fails (e.g.
        its raise_exception), or `system` is given without `chat`.
    """
    if not chat:
      if system is not None:
        raise ChatTemplateError(
            'a system message needs the chat template (chat=True)')
      return prompt
    if self.chat_template is None:
      raise ChatTemplateError(
          f'{self.source} has no chat template; format prompts with '
          'chat=False')
    messages = [{'role': 'user', 'content': prompt}]
    if system is not None:
      messages.insert(0, {'role': 'system', 'content': system})
    try:
      import jinja2  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise ImportError(
          'chat templates need the jinja2 package: pip install jinja2') from e
    try:
      return _compile_template(self.chat_template).render(
          messages=messages, tools=None, documents=None,
          add_generation_prompt=True, **self._template_tokens)
    except Exception as e:  # A template is a program: it may raise anything.
      detail = e if isinstance(e, jinja2.TemplateError) else (
          f'{type(e).__name__}: {e}')
      if isinstance(e, jinja2.TemplateSyntaxError):
        detail = f'line {e.lineno}: {e.message}'
      raise ChatTemplateError(
          f'the chat template of {self.source} failed: {detail}') from e


def _read_json(file: str) -> dict[str, Any]:
  try:
    with open(file, encoding='utf-8') as f:
      data = json.load(f)
  except (OSError, ValueError) as e:
    raise TokenizerFileError(f'cannot read {file}: {e}') from e
  if not isinstance(data, dict):
    raise TokenizerFileError(f'{file} is not a JSON object')
  return data


def _eos_ids(file: str, bound: int, tok_file: str) -> list[int]:
  """The eos_token_id (an int or a list) of generation_config.json or
  config.json, as a list; empty when the file or the entry is absent.

  Raises:
    TokenizerFileError: an entry is not an int, or is outside the `bound`
      ids of the model (whose tokenizer is `tok_file`): the model would
      never stop there.
  """
  if not os.path.isfile(file):
    return []
  value = _read_json(file).get('eos_token_id')
  ids = [value] if isinstance(value, int) else value or []
  if not (isinstance(ids, list) and all(
      isinstance(i, int) and not isinstance(i, bool) for i in ids)):
    raise TokenizerFileError(
        f'{file}: eos_token_id must be an int or a list of ints, not '
        f'{value!r}')
  for i in ids:
    if not 0 <= i < bound:
      raise TokenizerFileError(
          f'{file}: eos_token_id {i} is outside the {bound} token ids of '
          f'the model ({tok_file}): no completion could stop there')
  return ids


def _token_string(value: Any, file: str, key: str) -> str | None:
  """A special token given as a string, an AddedToken dict or null."""
  if value is None or isinstance(value, str):
    return value
  if isinstance(value, dict) and isinstance(value.get('content'), str):
    return value['content']
  raise TokenizerFileError(
      f'{file}: {key} must be a string or an AddedToken dict with a '
      f'"content" string, not {value!r}'
  )


def backend_to_write(tokenizer: HFTokenizer) -> Any:
  """The `tokenizers.Tokenizer` to write as an export's tokenizer.json: the
  backend, or where the model adds a BOS or EOS that its post-processor
  does not (a GGUF file's tokenizer) a copy whose post-processor puts the
  BOS first and the EOS last, as transformers 5 reads it (it ignores
  add_bos_token and add_eos_token next to a tokenizer.json) and
  `HFTokenizer.from_dir` reads it back."""
  backend = tokenizer.backend
  add_eos = getattr(tokenizer, 'add_eos', False)
  if not tokenizer.add_bos and not add_eos:
    return backend
  bos = [tokenizer.bos_id] if tokenizer.add_bos else []
  eos = [tokenizer.eos_id] if add_eos else []
  if (backend.post_processor is not None
      and _post_processor_adds(backend) == (bos, eos)):
    return backend
  import tokenizers  # pylint: disable=g-import-not-at-top
  written = tokenizers.Tokenizer.from_str(backend.to_str())

  def sequence(text: str, type_id: int) -> list[str]:
    return [f'{piece}:{type_id}' for piece in (
        [backend.id_to_token(i) for i in bos] + [text]
        + [backend.id_to_token(i) for i in eos])]

  written.post_processor = tokenizers.processors.TemplateProcessing(
      single=sequence('$A', 0), pair=sequence('$A', 0) + sequence('$B', 1),
      special_tokens=sorted({(backend.id_to_token(i), i) for i in bos + eos}))
  return written


def _post_processor_adds(backend: Any) -> tuple[list[int], list[int]]:
  """The ids tokenizer.json's post-processor puts before and after text
  (all before where the text encodes as no ids)."""
  plain = backend.encode('a', add_special_tokens=False).ids
  special = backend.encode('a', add_special_tokens=True).ids
  for start in range(len(special) - len(plain) + 1 if plain else 0):
    if special[start:start + len(plain)] == plain:
      return special[:start], special[start + len(plain):]
  return special, []


def _chat_template(path: str, config: Mapping[str, Any],
                   config_file: str) -> str | None:
  """chat_template.jinja, else the config's template (or its 'default'),
  else chat_template.json's (a processor's)."""
  jinja_file = os.path.join(path, 'chat_template.jinja')
  if os.path.isfile(jinja_file):
    try:
      with open(jinja_file, encoding='utf-8') as f:
        return f.read()
    except (OSError, ValueError) as e:  # ValueError: not UTF-8.
      raise TokenizerFileError(f'cannot read {jinja_file}: {e}') from e
  template = config.get('chat_template')
  processor_file = os.path.join(path, 'chat_template.json')
  if template is None and os.path.isfile(processor_file):
    # An image-text model's processor template (gemma-3-4b-it and larger).
    template = _read_json(processor_file).get('chat_template')
    if not isinstance(template, str):
      raise TokenizerFileError(
          f'{processor_file}: chat_template must be a string')
  if template is None or isinstance(template, str):
    return template
  if isinstance(template, list):
    try:
      named = {t['name']: t['template'] for t in template}
    except (KeyError, TypeError):
      named = None
    if named is not None:
      if 'default' not in named:
        raise TokenizerFileError(
            f'{config_file}: chat_template has no "default" among the named '
            f'templates {sorted(named)}'
        )
      return named['default']
  raise TokenizerFileError(
      f'{config_file}: chat_template must be a string or a list of '
      '{"name", "template"} objects'
  )


@functools.lru_cache(maxsize=16)
def _compile_template(source: str) -> Any:
  """Compiles a chat template in the sandbox transformers renders it in."""
  # pylint: disable=g-import-not-at-top
  import jinja2
  from jinja2 import ext
  from jinja2 import sandbox
  # pylint: enable=g-import-not-at-top

  class GenerationTag(ext.Extension):
    """`{% generation %}...{% endgeneration %}` renders its body as is."""

    tags = frozenset({'generation'})

    def parse(self, parser):
      lineno = next(parser.stream).lineno
      body = parser.parse_statements(('name:endgeneration',), drop_needle=True)
      return jinja2.nodes.CallBlock(
          self.call_method('_body'), [], [], body).set_lineno(lineno)

    def _body(self, caller):
      return caller()

  def raise_exception(message):
    raise jinja2.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None,
             sort_keys=False):
    # Jinja's own filter escapes HTML characters, which templates never want.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)

  def strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)

  env = sandbox.ImmutableSandboxedEnvironment(
      trim_blocks=True, lstrip_blocks=True,
      extensions=[GenerationTag, ext.loopcontrols])
  env.filters['tojson'] = tojson
  env.globals['raise_exception'] = raise_exception
  env.globals['strftime_now'] = strftime_now
  return env.from_string(source)
