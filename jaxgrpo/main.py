"""Command line: `python -m jaxgrpo.main --config=configs/demo.py --workdir=DIR`.

Kept short on purpose: the logic lives in `jaxgrpo.train`, which notebooks
and tests import directly. Mistakes in the command line or the config end
with one line naming the key, not a traceback.
"""

import os
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

import configs
from jaxgrpo import cli
from jaxgrpo import config_lib
from jaxgrpo import errors
from jaxgrpo import train

_DEFAULT_CONFIG = os.path.join(os.path.dirname(configs.__file__), 'demo.py')
_CONFIG = config_flags.DEFINE_config_file(
    'config', _DEFAULT_CONFIG, 'Config file (`path.py` or `path.py:args`).',
    lock_config=True)
_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Run directory; resumes from its latest checkpoint.')
_PROGRESS = flags.DEFINE_enum(
    'progress', 'auto', ['auto', 'on', 'off'],
    'Progress bars with rate and time left (warm start, evaluation, '
    'training); auto: when stderr is a terminal.')
_QUIET = flags.DEFINE_bool(
    'quiet', False, 'Show only what needs attention (a resume, skipped '
    'updates, a stop signal) and the final summary; no progress bars.')


def _fail(message: str, code: int = 2) -> None:
  sys.exit(cli.fail('jaxgrpo-train', message, code))


def _parse_flags(argv: list[str]) -> list[str]:
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    _fail(str(e).splitlines()[0])
  except (AttributeError, KeyError) as e:  # an override of an unknown key
    _fail(cli.unknown_key(e, argv[1:]))
  except Exception as e:  # pylint: disable=broad-except
    _fail(f'cannot load --config: {e}')
  return []


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    _fail(f'unexpected arguments {argv[1:]}')
  if not flags.FLAGS['verbosity'].present:
    # Libraries' INFO records (orbax logs every save) would bury the run's
    # own lines and bars; -v 0 (or --verbosity=0) shows them.
    logging.set_verbosity(logging.WARNING)
  if not _WORKDIR.value:
    _fail('--workdir is required (checkpoints and metrics.jsonl go there)')
  try:
    cfg = config_lib.from_config_dict(_CONFIG.value)
  except errors.ConfigError as e:
    _fail(str(e))
  try:
    progress = (_PROGRESS.value == 'on' or (
        _PROGRESS.value == 'auto' and sys.stderr.isatty())) and not _QUIET.value
    train.run(cfg, _WORKDIR.value, progress=progress, quiet=_QUIET.value)
  except errors.ConfigError as e:
    _fail(str(e))
  except errors.UserError as e:  # resume mismatch, NaN streak, disk full
    _fail(str(e), code=1)


def run_cli() -> None:
  app.run(main, flags_parser=_parse_flags)


if __name__ == '__main__':
  run_cli()
