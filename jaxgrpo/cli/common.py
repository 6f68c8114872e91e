"""What the argparse commands share: one-line errors, exit codes, configs.

`jaxgrpo-eval`, `jaxgrpo-plot` and `jaxgrpo-stratify` end every mistake
with one line on stderr, `PROG: error: ...`, and an exit code: 2 for a
mistake in the command line or the config, 1 for anything found later
(a checkpoint that cannot be used, a file that cannot be read), 130 when
interrupted. `run_main` does that mapping; `load_config` reads `--config`
with its `--config.KEY=VALUE` overrides as `jaxgrpo-train` does.
"""

import argparse
from collections.abc import Callable
import logging
import os
import sys

from absl import flags
import ml_collections
from ml_collections import config_flags

from jaxgrpo import errors

CONFIG_PREFIX = '--config.'


class UsageError(Exception):
  """A mistake on the command line (exit code 2)."""


class Parser(argparse.ArgumentParser):
  """An ArgumentParser that raises UsageError instead of exiting."""

  def error(self, message: str):
    # A subcommand's parser is named 'PROG COMMAND'.
    where = f'{self.prog} --help' if ' ' in self.prog else '--help'
    raise UsageError(f'{message} (see {where})')


def fail(prog: str, message: str, code: int) -> int:
  """Prints `PROG: error: MESSAGE` on stderr; returns `code`."""
  print(f'{prog}: error: {message}', file=sys.stderr, flush=True)
  return code


def run_main(prog: str, body: Callable[[], int], *,
             interrupted: str = 'interrupted') -> int:
  """Runs `body` and turns the project's errors into one line and a code."""
  try:
    return body()
  except (UsageError, errors.ConfigError) as e:
    return fail(prog, str(e), 2)
  except (errors.UserError, OSError) as e:
    return fail(prog, str(e), 1)
  except KeyboardInterrupt:
    return fail(prog, interrupted, 130)


def config_overrides(extra: list[str]) -> list[str]:
  """The --config.KEY[=]VALUE arguments; anything else is an error."""
  out, i = [], 0
  while i < len(extra):
    arg = extra[i]
    if not arg.startswith(CONFIG_PREFIX):
      raise UsageError(f'unrecognized arguments: {" ".join(extra[i:])}')
    out.append(arg)
    if ('=' not in arg and i + 1 < len(extra)
        and not extra[i + 1].startswith('--')):
      out.append(extra[i + 1])
      i += 1
    i += 1
  return out


def unknown_key(e: Exception, argv: list[str]) -> str:
  """The message for an override of a key the config does not have.

  Args:
    e: the AttributeError or KeyError ml_collections raised (possibly
      wrapped in another exception).
    argv: the arguments, whose `--config.KEY` ones are named.
  """
  while e.args and isinstance(e.args[0], Exception):
    e = e.args[0]
  bad = [a.split('=')[0].lstrip('-') for a in argv
         if a.startswith(CONFIG_PREFIX)]
  # args[0], not str(e): a KeyError's str() is its quoted repr.
  hint = ' '.join(str(e.args[0] if e.args else e).split())
  return f'unknown config key among {bad}: {hint}'


def _one_line(e: Exception) -> str:
  """The message in one line; of a quoted traceback, its last line."""
  lines = [line.strip() for line in str(e).splitlines() if line.strip()]
  if any(line.startswith('Traceback') for line in lines):
    lines = [lines[0].rstrip(':') + ':', lines[-1]]
  return ' '.join(lines)[:500]


def shipped_config(path: str) -> str | None:
  """The config shipped with jaxgrpo that `configs/NAME.py` names, if any.

  From a clone, `configs/` is the repository's folder; anywhere else (an
  installed jaxgrpo, another working directory) `configs/demo.py` still
  names the demo config inside the package.
  """
  folder, name = os.path.split(os.path.normpath(path))
  if folder != 'configs' or not name.endswith('.py'):
    return None
  shipped = os.path.join(os.path.dirname(os.path.dirname(__file__)),
                         'configs', name)
  return shipped if os.path.isfile(shipped) else None


def load_config(prog: str, config: str,
                overrides: list[str]) -> ml_collections.ConfigDict:
  """The ConfigDict of `--config` with `--config.KEY` overrides applied.

  Raises:
    UsageError: the file does not exist or load, or an override names an
      unknown key or a bad value.
  """
  path, sep, arg = config.partition(':')
  if not os.path.isfile(path):
    shipped = shipped_config(path)
    if shipped is None:
      raise UsageError(f'--config={config}: {path} is not a file')
    config = shipped + sep + arg
  values = flags.FlagValues()
  argv = [prog, f'--config={config}', *overrides]
  # config_flags finds the override flags in `sys_argv` when defined.
  holder = config_flags.DEFINE_config_file(
      'config', None, 'Config file.', flag_values=values, lock_config=True,
      sys_argv=argv)
  absl_logger = logging.getLogger('absl')
  level = absl_logger.level
  absl_logger.setLevel(logging.ERROR)  # its warning repeats the error below
  try:
    values(argv)
    result = holder.value
    if not isinstance(result, ml_collections.ConfigDict) and hasattr(
        result, 'to_dict'):
      result.to_dict()  # an unloadable file: raises its error
  except flags.Error as e:
    raise UsageError(_one_line(e)) from None
  except AttributeError as e:
    if "has no attribute 'get_config'" in str(e):
      raise UsageError(f'--config={config}: {path} defines no get_config() '
                       '(it returns the ConfigDict)') from None
    raise UsageError(unknown_key(e, overrides)) from None
  except KeyError as e:  # an override of an unknown key
    raise UsageError(unknown_key(e, overrides)) from None
  except Exception as e:  # pylint: disable=broad-except
    raise UsageError(f'cannot load --config={config}: {_one_line(e)}'
                     ) from None
  finally:
    absl_logger.setLevel(level)
  if not isinstance(result, ml_collections.ConfigDict):
    raise UsageError(f'--config={config}: get_config() returned '
                     f'{type(result).__name__}, not an ml_collections '
                     'ConfigDict (e.g. configs.common.base_config(), edited)')
  return result
