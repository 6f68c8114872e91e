"""The folder `jaxgrpo-export` writes: checked, then written whole or not at
all.

An export is written into a new folder inside `--out` and its files renamed
into place once all are written, so a write that fails (disk full) or is
interrupted leaves `--out` as it was, and the files of an earlier export
there are replaced, none of another model's left beside this one's.
"""

from collections.abc import Iterator
import contextlib
import os
import shutil
import tempfile

from jaxgrpo import errors
from jaxgrpo import model_spec
from jaxgrpo.cli import common
from jaxgrpo.model import hf

# What a Hugging Face model folder holds of its tokenizer (copied).
TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json',
                   'special_tokens_map.json', 'generation_config.json',
                   'chat_template.jinja')
# What an export writes besides the weights, in one layout or the other.
_EXPORT_FILES = ('config.json', 'adapter_config.json',
                 'adapter_model.safetensors', *TOKENIZER_FILES)
# The folder in --out an export is written into before it replaces the
# earlier one's files.
STAGE_PREFIX = '.jaxgrpo-export-'


def out_dir(out: str, source: str | None, workdir: str) -> str:
  """`out` as an absolute folder, made if missing, after checking that
  writing there loses nothing of the run's."""
  path = os.path.abspath(os.path.expanduser(out))
  real = os.path.realpath(path)
  if source and os.path.isdir(source) and real == os.path.realpath(source):
    raise common.UsageError(
        f"--out={out}: it is the run's model.path, the model the run started "
        'from; exporting there would overwrite it: choose another folder')
  checkpoints = os.path.realpath(os.path.join(workdir, model_spec.CHECKPOINTS))
  if real == checkpoints or real.startswith(checkpoints + os.sep):
    raise common.UsageError(f'--out={out}: it is inside the run\'s '
                            'checkpoints; choose another folder')
  return common.out_folder('--out', out)


@contextlib.contextmanager
def made(out: str, source: str | None, workdir: str) -> Iterator[str]:
  """`out_dir(out, source, workdir)`; the folders it made are removed
  again, if still empty, when the export then fails (a damaged checkpoint):
  a refused export leaves no empty `--out` behind."""
  path, new = os.path.abspath(os.path.expanduser(out)), []
  while not os.path.lexists(path):
    new.append(path)  # deepest first
    path = os.path.dirname(path)
  try:
    yield out_dir(out, source, workdir)
  except BaseException:
    for folder in new:
      try:
        os.rmdir(folder)
      except OSError:  # not empty, or never made
        break
    raise


@contextlib.contextmanager
def staged(out: str) -> Iterator[str]:
  """A new folder in `out` to write the export into. Once it is written,
  its files replace an earlier export's in `out` (renamed in, the config
  last); a write that fails (disk full) or is interrupted removes it and
  leaves `out` as it was: never part of an export beside what it replaces.

  Raises:
    errors.UserError: the export could not be written in `out`.
  """
  def failed(e: BaseException) -> errors.UserError:
    reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
    return errors.UserError(
        f'--out={out}: the export could not be written there ({reason}); '
        'nothing of it was left there, and an earlier export there is kept')

  try:
    stage = tempfile.mkdtemp(prefix=STAGE_PREFIX, dir=out)
  except OSError as e:
    raise failed(e) from None
  try:
    try:
      yield stage
    except (ValueError, errors.UserError):  # named already
      raise
    except Exception as e:  # pylint: disable=broad-except
      # OSError, and safetensors' and tokenizers' own errors for one.
      raise failed(e) from None
    clear(out, keep=stage)
    configs = ('config.json', 'adapter_config.json')
    for name in sorted(os.listdir(stage), key=lambda n: n in configs):
      os.replace(os.path.join(stage, name), os.path.join(out, name))
  finally:
    shutil.rmtree(stage, ignore_errors=True)


def clear(out: str, keep: str) -> None:
  """Removes the files of an earlier export from `out`, so that none of
  another model's (a chat template, generation settings, an adapter or
  merged weights) is read with this one's, and the folders that exports
  killed midway left (all but `keep`); other files stay."""
  for name in os.listdir(out):
    path = os.path.join(out, name)
    if os.path.isfile(path) and (name in _EXPORT_FILES
                                 or hf.WEIGHT_FILES.fullmatch(name)):
      os.remove(path)
    elif (name.startswith(STAGE_PREFIX) and os.path.isdir(path)
          and path != keep):
      shutil.rmtree(path, ignore_errors=True)
