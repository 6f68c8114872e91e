r"""Exports a run's trained params as a Hugging Face model directory.

    jaxgrpo-export --workdir=runs/smollm2 --out=exported/smollm2_grpo
    python -m jaxgrpo.cli.export --workdir=runs/smollm2 --out=DIR --step=100
    jaxgrpo-export --workdir=runs/smollm2_lora --out=DIR --peft

Writes config.json and safetensors weights (see `jaxgrpo.model.hf.export`)
from the run's latest (or `--step`) checkpoint, and the tokenizer next to
them: the source directory's tokenizer files when the run started from one
(`model.path` a directory), or tokenizer.json and tokenizer_config.json
(chat template included) built from a GGUF file's metadata, or for a
built-in preset its `char` or `byte` tokenizer with the same ids (and a
chat template that leaves prompts as they are, as the run saw them). The
result loads with `model.path=DIR` here and with transformers'
`from_pretrained`. The files of an earlier export to DIR are replaced
(other files stay), so none of another model's is read with this one; the
export is written in a folder inside DIR first, so one that fails midway
(disk full) leaves DIR as it was.

A LoRA run (model.lora.rank > 0) exports its base model, rebuilt from the
run's model, with the adapter merged into the weights; with `--peft` it
writes the adapter alone in PEFT's layout instead (adapter_config.json and
adapter_model.safetensors), for `peft.PeftModel.from_pretrained` on the base.
"""

from collections.abc import Callable, Iterator
import contextlib
import importlib
import json
import os
import shutil
import sys

import jax
import jax.numpy as jnp

from jaxgrpo import checkpoint as checkpoint_lib
from jaxgrpo import errors
from jaxgrpo import model_spec
from jaxgrpo.cli import common
from jaxgrpo.cli import export_out
from jaxgrpo.data import hf_tokenizer
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.model import decoder
from jaxgrpo.model import hf
from jaxgrpo.model import hf_config
from jaxgrpo.model import config as model_config
from jaxgrpo.model import lora
from jaxgrpo.model import pretrained
from jaxgrpo.model.config import ModelConfig

PROG = 'jaxgrpo-export'


def export_run(workdir: str, out: str, *, step: int | None = None,
               peft: bool = False, dtype: str | None = None,
               log: Callable[[str], None] = print) -> str:
  """Exports checkpoint `step` (latest: None) of `workdir` to `out`.

  The workdir is only read: a run may still be training there.

  Args:
    workdir: the run directory.
    out: the directory to write (created if missing).
    step: the checkpoint's step; None: the latest (the latest again if
      the run training there removes it while it is read).
    peft: a LoRA run's adapter alone, in PEFT's layout.
    dtype: the weights' dtype in the export ('float32', 'bfloat16'); None:
      the run's `model.param_dtype`. A LoRA adapter is merged in float32
      and stored in it; below float32, `log` gets the share of the
      adapter's change that rounding lost.
    log: receives that line, and one for a latest checkpoint replaced.

  Returns:
    The output directory.

  Raises:
    common.UsageError: `workdir` holds no checkpoint (of `step`), `out`
      cannot be written or is the run's own model.path (checked before
      anything is written), or `dtype` is given with `peft`.
    errors.UserError: a damaged checkpoint, `peft` for a run without an
      adapter, a run whose model.path is gone, a model without a Hugging
      Face equivalent (a built-in preset exports too: a llama config), or
      files that could not be written (disk full: `out` is left as it was).
  """
  if peft and dtype is not None:
    raise common.UsageError('--dtype: a --peft export writes the adapter as '
                            'trained; --dtype sets the merged weights\' dtype')
  workdir = os.path.abspath(os.path.expanduser(workdir))
  directory, latest = _checkpoint(workdir, step)

  def moved(old: int, new: int) -> None:
    log(f'--workdir {workdir}: the checkpoint of step {old} was removed by '
        f'the run training there: its latest, step {new}, is exported '
        'instead')

  return checkpoint_lib.read_latest(
      directory, latest,
      lambda s: _export(workdir, directory, s, out, peft=peft, dtype=dtype,
                        log=log),
      follow=step is None, moved=moved)


def _export(workdir: str, directory: str, step: int, out: str, *, peft: bool,
            dtype: str | None, log: Callable[[str], None]) -> str:
  """`export_run` of checkpoint `step`, read before anything is written."""
  with _reading(workdir, directory, step):
    meta = checkpoint_lib.read_meta(directory, step)
  model_path = meta.get('config', {}).get('model', {}).get('path')
  source = pretrained.resolve(model_path) if model_path else None
  if source and not os.path.exists(source):
    raise errors.UserError(f"--workdir {workdir}: the run's model.path "
                           f'{source} is missing (its tokenizer is needed)')
  with export_out.made(out, source, workdir) as out:
    return _write(workdir, directory, step, out, meta, source, peft=peft,
                  dtype=dtype, log=log)


def _write(workdir: str, directory: str, step: int, out: str, meta: dict,
           source: str | None, *, peft: bool, dtype: str | None,
           log: Callable[[str], None]) -> str:
  """`_export` into the folder `out`, once checked: the params read, then
  the files written."""
  cfg = ModelConfig(**meta['model'])
  if model_spec.lora_section(meta) is not None:
    with _reading(workdir, directory, step):
      base, section, _, adapter = model_spec.load_adapter(workdir, step)
    if peft:
      with export_out.staged(out) as stage:
        _write_peft(stage, adapter, section, meta)
      return out
    params = _merged(base.params, adapter, section.alpha, dtype, log)
  elif peft:
    raise errors.UserError(f'--peft: the run in {workdir} trained every '
                           'weight (model.lora.rank = 0): it has no adapter')
  else:
    params = _cast(_trained(workdir, directory, step, cfg), dtype)
  if source:
    tokenizer = pretrained.load_tokenizer(source, vocab_size=cfg.vocab_size)
  else:  # a preset's built-in tokenizer, with the same ids
    tokenizer = tokenizer_lib.to_hf(tokenizer_lib.make_tokenizer(
        meta.get('config', {}).get('model', {}).get('tokenizer', 'auto')))
  extra = {'bos_token_id': tokenizer.bos_id,
           'eos_token_id': _eos_token_id(tokenizer),
           'pad_token_id': tokenizer.pad_id}
  context = pretrained.context_length(source) if source else None
  if context is not None:  # else transformers' default for the family
    extra['max_position_embeddings'] = context
  with export_out.staged(out) as stage:
    hf.export(cfg, params, stage, hf_config_extra=extra)
    if source and os.path.isdir(source):
      for name in export_out.TOKENIZER_FILES:
        if os.path.exists(os.path.join(source, name)):
          shutil.copy(os.path.join(source, name), os.path.join(stage, name))
      _keep_template(tokenizer, stage)
      _keep_stops(tokenizer, stage)
    else:
      _write_tokenizer(tokenizer, stage)
  return out


def _checkpoint(workdir: str, step: int | None) -> tuple[str, int]:
  """(checkpoints folder, step) of the run in `workdir`, read only."""
  if not os.path.isdir(workdir):
    raise common.UsageError(
        f'--workdir {workdir}: ' + ('is a file, not a run workdir'
                                    if os.path.exists(workdir) else
                                    'no such folder'))
  directory = os.path.join(workdir, model_spec.CHECKPOINTS)
  steps = checkpoint_lib.saved_steps(directory)
  if not steps:
    raise common.UsageError(f'--workdir {workdir}: no checkpoint in '
                            f'{directory}' + _inside_a_run(workdir))
  if step is not None and step not in steps:
    raise common.UsageError(
        f'--step={step}: no checkpoint of step {step} in {directory} (steps '
        f'there: {", ".join(map(str, steps))})')
  return directory, steps[-1] if step is None else step


def _inside_a_run(folder: str) -> str:
  """What to pass instead of `folder` when it is a run's checkpoints
  folder or one checkpoint's folder in it ('' otherwise)."""
  parent, name = os.path.split(folder)
  if checkpoint_lib.saved_steps(folder):
    return (f': it is the checkpoints folder of the run in {parent}; pass '
            f'--workdir={parent}')
  if name.isdigit() and int(name) in checkpoint_lib.saved_steps(parent):
    run = os.path.dirname(parent)
    return (f': it is the checkpoint of step {int(name)} of the run in {run}; '
            f'pass --workdir={run} --step={int(name)}')
  return ''


@contextlib.contextmanager
def _reading(workdir: str, directory: str, step: int) -> Iterator[None]:
  """Names a failed read of checkpoint `step`: removed meanwhile by a run
  training in `workdir`, or damaged."""
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except
    where = f'--workdir {workdir}: the checkpoint of step {step}'
    if checkpoint_lib.removed(directory, step):
      raise errors.UserError(f'{where}: ' + checkpoint_lib.removed_message(
          directory, step)) from None
    if isinstance(e, errors.UserError):  # named already (a LoRA base)
      raise
    earlier = [s for s in checkpoint_lib.saved_steps(directory) if s < step]
    raise errors.UserError(
        f'{where} is damaged ({checkpoint_lib.describe_damage(e)}); ' + (
            'export an earlier one with --step (steps there: '
            f'{", ".join(map(str, earlier))})' if earlier else
            'no earlier checkpoint is there to export')) from None


def _write_peft(out: str, adapter, section: lora.LoraSection,
                meta: dict) -> str:
  """adapter_config.json and adapter_model.safetensors in `out`."""
  safetensors_numpy = importlib.import_module('safetensors.numpy')
  os.makedirs(out, exist_ok=True)
  model = meta.get('config', {}).get('model', {})
  layers = _peft_layers(model.get('path'))
  config = lora.peft_config(adapter, section,
                            base_model=model.get('path') or model.get('preset'),
                            num_layers=meta['model']['num_layers'],
                            layers=layers)
  with open(os.path.join(out, 'adapter_config.json'), 'w') as f:
    json.dump(config, f, indent=2)
  path = os.path.join(out, 'adapter_model.safetensors')
  safetensors_numpy.save_file(lora.peft_tensors(adapter, layers), path,
                              metadata={'format': 'pt'})
  # safetensors creates its files owner-only; give it the usual mode.
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(path, 0o666 & ~umask)
  return out


def _peft_layers(path: str | None) -> str:
  """Where the base at `path` holds its decoder layers in transformers: in
  the language model of an image-text model (`hf_config.MULTIMODAL`)."""
  try:
    with open(os.path.join(pretrained.resolve(path), 'config.json')) as f:
      model_type = json.load(f).get('model_type')
  except (OSError, TypeError, ValueError, AttributeError):
    return lora.HF_LAYERS  # a preset, a GGUF file: a causal LM
  return (lora.HF_IMAGE_TEXT_LAYERS if model_type in hf_config.MULTIMODAL
          else lora.HF_LAYERS)


def _merged(params, adapter, alpha: float, dtype: str | None, log):
  """The base `params` (in `dtype`) with the adapter merged; `log` gets the
  share of its change that rounding below float32 lost."""
  params = _cast(params, dtype)
  merged = lora.merge(params, adapter, alpha=alpha)
  dtype = str(jax.tree.leaves(merged)[0].dtype)
  if dtype == 'float32':  # the merge's own precision: nothing lost
    return merged
  loss = lora.merge_loss(params, merged, adapter, alpha=alpha)
  if loss:  # 0: B = 0, nothing to lose
    log(f'merged the adapter into {dtype} weights: rounding lost {loss:.1%}'
        " of its change (its norm); --dtype=float32 keeps all of it, and "
        '--peft writes the adapter apart')
  return merged


def _trained(workdir: str, directory: str, step: int, cfg: ModelConfig):
  """The params of a run that trained every weight, from its checkpoint."""
  with _reading(workdir, directory, step):
    arrays = checkpoint_lib.load_state_arrays(
        directory, step, checked=('params',))['params']
  _, abstract = decoder.abstract_params(cfg)
  pure = jax.tree.map(
      lambda x: x['value'] if isinstance(x, dict) and 'value' in x else x,
      arrays, is_leaf=lambda x: isinstance(x, dict) and 'value' in x)
  return _fill(abstract, pure)


def _cast(params, dtype: str | None):
  return params if dtype is None else jax.tree.map(
      lambda x: x.astype(jnp.dtype(dtype)), params)


def _fill(abstract, pure):
  """The abstract nnx.State with its leaves taken from nested dict `pure`."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  state = nnx.State(abstract)
  nnx.replace_by_pure_dict(state, pure)
  return state


def _keep_template(tokenizer, out_dir: str) -> None:
  """Writes the run's chat template as chat_template.jinja where the files
  copied hold none that transformers' tokenizer reads (an image-text
  model's template is its processor's chat_template.json)."""
  if tokenizer.chat_template is None or os.path.exists(
      os.path.join(out_dir, 'chat_template.jinja')):
    return
  config = os.path.join(out_dir, 'tokenizer_config.json')
  if os.path.exists(config):
    with open(config, encoding='utf-8') as f:
      if json.load(f).get('chat_template') is not None:
        return
  with open(os.path.join(out_dir, 'chat_template.jinja'), 'w',
            encoding='utf-8') as f:
    f.write(tokenizer.chat_template)


def _keep_stops(tokenizer, out_dir: str) -> None:
  """Sets the `eos_token_id` of a generation_config.json copied from the
  source to every token the run's completions stopped at: transformers'
  `generate` reads that file's list, not config.json's, and the run also
  stopped at the end tokens config.json and the vocabulary name."""
  file = os.path.join(out_dir, 'generation_config.json')
  if not os.path.exists(file):
    return
  with open(file, encoding='utf-8') as f:
    generation = json.load(f)
  generation['eos_token_id'] = _eos_token_id(tokenizer)
  with open(file, 'w', encoding='utf-8') as f:
    json.dump(generation, f, indent=2)


def _eos_token_id(tokenizer) -> int | list[int]:
  """A Hugging Face config's `eos_token_id`: every token the run's
  completions stop at (EOS first) where there are several, else the EOS;
  transformers' generate stops on the list."""
  stops = list(getattr(tokenizer, 'stop_ids', ()))
  return stops if len(stops) > 1 else tokenizer.eos_id


def _write_tokenizer(tokenizer, out_dir: str) -> None:
  """tokenizer.json and tokenizer_config.json of an HFTokenizer, and
  generation_config.json naming every token a completion stops at, so
  that transformers' `generate` stops where jaxgrpo's generator does."""
  backend = tokenizer.backend
  hf_tokenizer.backend_to_write(tokenizer).save(
      os.path.join(out_dir, 'tokenizer.json'))
  config = {
      'tokenizer_class': 'PreTrainedTokenizerFast',
      'add_bos_token': tokenizer.add_bos,
      'eos_token': backend.id_to_token(tokenizer.eos_id),
      'pad_token': backend.id_to_token(tokenizer.pad_id),
      'clean_up_tokenization_spaces': False,
  }
  if getattr(tokenizer, 'add_eos', False):
    config['add_eos_token'] = True
  bos = tokenizer._template_tokens.get('bos_token')  # pylint: disable=protected-access
  if bos is not None:
    config['bos_token'] = bos
  if tokenizer.chat_template:
    config['chat_template'] = tokenizer.chat_template
  with open(os.path.join(out_dir, 'tokenizer_config.json'), 'w') as f:
    json.dump(config, f, indent=2)
  generation = {'eos_token_id': _eos_token_id(tokenizer),
                'pad_token_id': tokenizer.pad_id}
  if tokenizer.bos_id is not None:
    generation['bos_token_id'] = tokenizer.bos_id
  with open(os.path.join(out_dir, 'generation_config.json'), 'w') as f:
    json.dump(generation, f, indent=2)


def main(argv: list[str] | None = None) -> int:
  """Runs the command line `argv` (default: sys.argv[1:]); the exit code:
  2 for a mistake in the arguments, 1 when the export fails otherwise."""
  parser = common.Parser(prog=PROG, description=__doc__.split('\n')[0])
  parser.add_argument('--workdir', required=True, help='the run directory')
  parser.add_argument('--out', required=True,
                      help='directory to write (created if missing)')
  parser.add_argument('--step', type=int, default=None,
                      help='checkpoint step (default: the latest)')
  parser.add_argument('--peft', action='store_true',
                      help="a LoRA run: write the adapter alone, in PEFT's "
                      'layout, instead of merging it into the weights')
  parser.add_argument('--dtype', choices=model_config.DTYPES, default=None,
                      help="the weights' dtype (default: the run's "
                      'model.param_dtype)')

  def body() -> int:
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
      out = export_run(args.workdir, args.out, step=args.step, peft=args.peft,
                       dtype=args.dtype)
    except errors.UserError:
      raise
    except ValueError as e:  # a model without a Hugging Face equivalent
      raise errors.UserError(str(e)) from None
    print(f'exported {args.workdir} to {out}')
    return 0

  return common.run_main(PROG, body)


def run_cli() -> None:
  """The `jaxgrpo-export` entry point."""
  common.exit_with(common.code_of(main))


if __name__ == '__main__':
  run_cli()
