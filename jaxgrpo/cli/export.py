r"""Exports a run's trained params as a Hugging Face model directory.

    jaxgrpo-export --workdir=runs/smollm2 --out=exported/smollm2_grpo
    python -m jaxgrpo.cli.export --workdir=runs/smollm2 --out=DIR --step=100
    jaxgrpo-export --workdir=runs/smollm2_lora --out=DIR --peft

Writes config.json and safetensors weights (see `jaxgrpo.model.hf.export`)
from the run's latest (or `--step`) checkpoint, and the tokenizer next to
them: the source directory's tokenizer files when the run started from one
(`model.path` a directory), or tokenizer.json and tokenizer_config.json
(chat template included) built from a GGUF file's metadata. The result loads
with `model.path=DIR` here and with transformers' `from_pretrained`.

A LoRA run (model.lora.rank > 0) exports its base model, rebuilt from the
run's model, with the adapter merged into the weights; with `--peft` it
writes the adapter alone in PEFT's layout instead (adapter_config.json and
adapter_model.safetensors), for `peft.PeftModel.from_pretrained` on the base.
"""

import argparse
import importlib
import json
import os
import shutil
import sys

import jax

from jaxgrpo import checkpoint as checkpoint_lib
from jaxgrpo import errors
from jaxgrpo import model_spec
from jaxgrpo.model import decoder
from jaxgrpo.model import hf
from jaxgrpo.model import lora
from jaxgrpo.model import pretrained
from jaxgrpo.model.config import ModelConfig

_TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json',
                    'special_tokens_map.json', 'generation_config.json',
                    'chat_template.jinja')


def export_run(workdir: str, out: str, *, step: int | None = None,
               peft: bool = False) -> str:
  """Exports checkpoint `step` (latest: None) of `workdir` to `out`.

  Args:
    workdir: the run directory.
    out: the directory to write.
    step: the checkpoint's step; None: the latest.
    peft: a LoRA run's adapter alone, in PEFT's layout.

  Returns:
    The output directory.

  Raises:
    errors.UserError: no checkpoint, `peft` for a run without an adapter,
      or a model without a Hugging Face equivalent (a built-in preset
      exports too: a llama config).
  """
  directory = os.path.join(os.path.abspath(workdir), 'checkpoints')
  ckpt = checkpoint_lib.Checkpointer(directory, every=1, max_to_keep=1)
  try:
    step = ckpt.latest_step() if step is None else step
    if step is None:
      raise errors.UserError(f'--workdir {workdir}: no checkpoint in {directory}')
    meta = ckpt.read_meta(step)
  finally:
    ckpt.close()
  cfg = ModelConfig(**meta['model'])
  if model_spec.lora_section(meta) is not None:
    base, section, _, adapter = model_spec.load_adapter(
        os.path.abspath(workdir), step)
    if peft:
      return _write_peft(out, adapter, section, meta)
    params = lora.merge(base.params, adapter, alpha=section.alpha)
  elif peft:
    raise errors.UserError(f'--peft: the run in {workdir} trained every '
                           'weight (model.lora.rank = 0): it has no adapter')
  else:
    try:
      arrays = checkpoint_lib.load_state_arrays(directory, step)['params']
    except checkpoint_lib.DamagedError as e:
      raise errors.UserError(
          f'--workdir {workdir}: the checkpoint of step {step} is damaged '
          f'({e}); export an earlier one with --step') from None
    _, abstract = decoder.abstract_params(cfg)
    pure = jax.tree.map(
        lambda x: x['value'] if isinstance(x, dict) and 'value' in x else x,
        arrays, is_leaf=lambda x: isinstance(x, dict) and 'value' in x)
    params = _fill(abstract, pure)
  model_path = meta.get('config', {}).get('model', {}).get('path')
  extra = {}
  tokenizer = None
  if model_path:
    source = pretrained.resolve(model_path)
    tokenizer = pretrained.load_tokenizer(source, vocab_size=cfg.vocab_size)
    extra = {'bos_token_id': tokenizer.bos_id, 'eos_token_id': tokenizer.eos_id,
             'pad_token_id': tokenizer.pad_id}
  out_dir = hf.export(cfg, params, out, hf_config_extra=extra)
  if model_path and os.path.isdir(source):
    for name in _TOKENIZER_FILES:
      if os.path.exists(os.path.join(source, name)):
        shutil.copy(os.path.join(source, name), os.path.join(out_dir, name))
  elif tokenizer is not None:
    _write_tokenizer(tokenizer, str(out_dir))
  return str(out_dir)


def _write_peft(out: str, adapter, section: lora.LoraSection,
                meta: dict) -> str:
  """adapter_config.json and adapter_model.safetensors in `out`."""
  safetensors_numpy = importlib.import_module('safetensors.numpy')
  os.makedirs(out, exist_ok=True)
  model = meta.get('config', {}).get('model', {})
  config = lora.peft_config(adapter, section,
                            base_model=model.get('path') or model.get('preset'))
  with open(os.path.join(out, 'adapter_config.json'), 'w') as f:
    json.dump(config, f, indent=2)
  safetensors_numpy.save_file(lora.peft_tensors(adapter),
                              os.path.join(out, 'adapter_model.safetensors'),
                              metadata={'format': 'pt'})
  return out


def _fill(abstract, pure):
  """The abstract nnx.State with its leaves taken from nested dict `pure`."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  state = nnx.State(abstract)
  nnx.replace_by_pure_dict(state, pure)
  return state


def _write_tokenizer(tokenizer, out_dir: str) -> None:
  """tokenizer.json and tokenizer_config.json of an HFTokenizer."""
  backend = tokenizer.backend
  backend.save(os.path.join(out_dir, 'tokenizer.json'))
  config = {
      'tokenizer_class': 'PreTrainedTokenizerFast',
      'add_bos_token': tokenizer.add_bos,
      'eos_token': backend.id_to_token(tokenizer.eos_id),
      'pad_token': backend.id_to_token(tokenizer.pad_id),
      'clean_up_tokenization_spaces': False,
  }
  bos = tokenizer._template_tokens.get('bos_token')  # pylint: disable=protected-access
  if bos is not None:
    config['bos_token'] = bos
  if tokenizer.chat_template:
    config['chat_template'] = tokenizer.chat_template
  with open(os.path.join(out_dir, 'tokenizer_config.json'), 'w') as f:
    json.dump(config, f, indent=2)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog='jaxgrpo-export', description=__doc__.split('\n')[0])
  parser.add_argument('--workdir', required=True, help='the run directory')
  parser.add_argument('--out', required=True, help='directory to write')
  parser.add_argument('--step', type=int, default=None,
                      help='checkpoint step (default: the latest)')
  parser.add_argument('--peft', action='store_true',
                      help="a LoRA run: write the adapter alone, in PEFT's "
                      'layout, instead of merging it into the weights')
  args = parser.parse_args(argv)
  try:
    out = export_run(args.workdir, args.out, step=args.step, peft=args.peft)
  except (errors.UserError, ValueError) as e:
    print(f'jaxgrpo-export: error: {e}', file=sys.stderr)
    return 1
  print(f'exported {args.workdir} to {out}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
