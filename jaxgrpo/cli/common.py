"""What the argparse commands share: one-line errors, exit codes, configs.

`jaxgrpo-eval`, `jaxgrpo-plot` and `jaxgrpo-stratify` end every mistake
with one line on stderr, `PROG: error: ...`, and an exit code: 2 for a
mistake in the command line or the config, 1 for anything found later
(a checkpoint that cannot be used, a file that cannot be read), 130 when
interrupted. `run_main` does that mapping; `load_config` reads `--config`
with its `--config.KEY=VALUE` overrides as `jaxgrpo-train` does;
`out_folder` checks an `--out` before anything is loaded.

Size: most of it is `load_config`, which turns each way ml_collections
fails (an unknown key, a typed override, a required placeholder, a file
that raises) into one line naming the flag, and applies what it cannot.
"""

import argparse
import ast
from collections.abc import Callable
import dataclasses
import logging
import os
import re
import sys
import tempfile
import traceback
import typing
from typing import Any

from absl import flags
import ml_collections
from ml_collections import config_dict
from ml_collections import config_flags

from jaxgrpo import errors

CONFIG_PREFIX = '--config.'
# The arguments that name a file or folder (or a checkpoint spec) in the
# commands: none may be empty.
PATHS = ('workdir', 'out', 'config', 'checkpoint', 'json')


class UsageError(Exception):
  """A mistake on the command line (exit code 2)."""


class Parser(argparse.ArgumentParser):
  """An ArgumentParser that raises UsageError instead of exiting, and
  refuses an empty path (`--out=`, `--out="$UNSET"`; `PATHS`): it would
  stand for the current folder."""

  def error(self, message: str):
    # A subcommand's parser is named 'PROG COMMAND'.
    where = f'{self.prog} --help' if ' ' in self.prog else '--help'
    raise UsageError(f'{message} (see {where})')

  def parse_known_args(self, args=None, namespace=None):
    parsed, extra = super().parse_known_args(args, namespace)
    for action in self._actions:
      if action.dest not in PATHS:
        continue
      value = getattr(parsed, action.dest, None)
      values = value if isinstance(value, list) else [value]
      if any(isinstance(v, str) and not v.strip() for v in values):
        name = '/'.join(action.option_strings) or action.dest
        self.error(f'argument {name}: the value is empty (an unset shell '
                   'variable?)')
    return parsed, extra


def out_folder(flag: str, out: str) -> str:
  """`out`, the folder a command writes (`--out`), as an absolute path,
  made if missing; checked before anything is loaded or computed.

  Raises:
    UsageError: naming `flag` and the reason: `out` is a file, lies in a
      run's checkpoints (whose rotation would delete it), or cannot be
      written (a read-only file system, permissions).
  """
  # pylint: disable-next=g-import-not-at-top
  from jaxgrpo import workdir as workdir_lib
  path = os.path.abspath(os.path.expanduser(out))
  if owner := workdir_lib.owning_run(path):
    raise UsageError(f"{flag}={out}: it is inside the checkpoints of the run "
                     f'in {owner}, whose checkpoint rotation would delete it; '
                     'choose another folder')
  if os.path.exists(path) and not os.path.isdir(path):
    raise UsageError(f'{flag}={out}: {path} is a file; name a folder (it is '
                     'created if missing)')
  try:
    os.makedirs(path, exist_ok=True)
    with tempfile.TemporaryFile(dir=path):  # read-only, permissions, quota
      pass
  except OSError as e:
    raise UsageError(
        f'{flag}={out}: cannot write there ({e.strerror or e})') from None
  return path


def out_file(flag: str, out: str) -> str:
  """`out`, a file a command writes (`--json`), as an absolute path, its
  folder made if missing; checked before anything is loaded or computed.

  Raises:
    UsageError: naming `flag` and the reason: `out` is a folder, a run's
      own file (its `metrics.jsonl` or lock) or in its checkpoints, or
      cannot be written there.
  """
  # pylint: disable-next=g-import-not-at-top
  from jaxgrpo import workdir as workdir_lib
  path = os.path.abspath(os.path.expanduser(out))
  folder, name = os.path.split(path)
  if os.path.isdir(path):
    raise UsageError(f'{flag}={out}: is a folder; name a file')
  if owner := workdir_lib.owning_run(folder):
    raise UsageError(f"{flag}={out}: it is inside the checkpoints of the run "
                     f'in {owner}, whose checkpoint rotation would delete it; '
                     'name a file elsewhere')
  if (name == 'metrics.jsonl' or re.fullmatch(r'\.lock(\.\d+)?', name)) and any(
      os.path.exists(os.path.join(folder, f))
      for f in ('metrics.jsonl', '.lock', 'checkpoints')):
    raise UsageError(f"{flag}={out}: it is the run's own {name} in {folder}; "
                     'name another file')
  try:
    os.makedirs(folder, exist_ok=True)
    if not os.access(folder, os.W_OK | os.X_OK):
      raise PermissionError(13, 'Permission denied')
  except OSError as e:
    raise UsageError(
        f'{flag}={out}: cannot write there ({e.strerror or e})') from None
  return path


def fail(prog: str, message: str, code: int) -> int:
  """Prints `PROG: error: MESSAGE` on stderr; returns `code`."""
  print(f'{prog}: error: {message}', file=sys.stderr, flush=True)
  return code


class _Warnings(logging.Formatter):
  """`PROG: warning: ...`, as the error line reads."""

  def __init__(self, prog: str):
    super().__init__()
    self.prog = prog

  def format(self, record: logging.LogRecord) -> str:
    return f'{self.prog}: {record.levelname.lower()}: {record.getMessage()}'


def run_main(prog: str, body: Callable[[], int], *,
             interrupted: str = 'interrupted') -> int:
  """Runs `body` and turns the project's errors into one line and a code;
  the project's warnings (records skipped, a verifier that raised) read
  `PROG: warning: ...` on stderr meanwhile."""
  logger = logging.getLogger('jaxgrpo')
  handler = logging.StreamHandler(sys.stderr)
  handler.setLevel(logging.WARNING)
  handler.setFormatter(_Warnings(prog))
  logger.addHandler(handler)
  propagate, logger.propagate = logger.propagate, False
  try:
    return body()
  except (UsageError, errors.ConfigError) as e:
    return fail(prog, str(e), 2)
  except BrokenPipeError:
    raise  # stdout closed by its reader: `code_of` ends quietly
  except (errors.UserError, OSError) as e:
    return fail(prog, str(e), 1)
  except KeyboardInterrupt as e:  # its message, where the command gave one
    return fail(prog, str(e) or interrupted, 130)
  finally:
    logger.removeHandler(handler)
    logger.propagate = propagate


def code_of(main: Callable[[], int]) -> int:
  """The exit code of a command's `main`. Output cut short by a closed
  pipe (`jaxgrpo-plot W | head -1`) ends it quietly with 141 (128 +
  SIGPIPE), as a shell tool's does, not with a BrokenPipeError traceback."""
  try:
    code = main()
    sys.stdout.flush()
    return code
  except BrokenPipeError:
    # Nothing more reaches the closed pipe, at exit either.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 141


def exit_with(code: int) -> None:
  """Ends a command with `code`. After an interrupt (130) the process ends
  at once, streams flushed: XLA's threads, stopped mid-computation, could
  crash the interpreter's teardown (a segfault after the error line, 1
  interrupted jaxgrpo-eval in 5)."""
  if code == 130:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # pylint: disable=protected-access
  sys.exit(code)


def _flags(args: list[str]):
  """(index, flag, its value or None, the arguments it spans) of each
  `--flag=VALUE`, `--flag VALUE` or bare `--flag` in `args`."""
  i = 0
  while i < len(args):
    flag, sep, value = args[i].partition('=')
    if sep:
      yield i, flag, value, args[i:i + 1]
    elif i + 1 < len(args) and not args[i + 1].startswith('--'):
      yield i, flag, args[i + 1], args[i:i + 2]
      i += 1
    else:
      yield i, flag, None, args[i:i + 1]
    i += 1


def config_overrides(extra: list[str]) -> list[str]:
  """The --config.KEY[=]VALUE arguments; anything else is an error."""
  out = []
  for i, flag, _, spanned in _flags(extra):
    if not flag.startswith(CONFIG_PREFIX):
      raise UsageError(f'unrecognized arguments: {" ".join(extra[i:])}')
    out += spanned
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


def _where_in(path: str, e: BaseException) -> str:
  """' (FILE:LINE)', the last line of the config file `path` that the
  error passed through, or '' (an error raised outside it)."""
  real = os.path.realpath(path)
  lines = [frame.lineno for frame in traceback.extract_tb(e.__traceback__)
           if os.path.realpath(frame.filename) == real]
  return f' ({path}:{lines[-1]})' if lines else ''


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


# A dataset entry's key, which ml_collections cannot override when the
# entry's dict leaves it out (at its default).
_ENTRY_KEY = re.compile(r'data\.datasets\[(-?\d+)\]\.(\w+)')


def _field_of(key: str) -> Any:
  """The schema's field of a config key (`model.path`, or a dataset entry's
  as `data.datasets[0].template`); None when the schema has no such key."""
  # pylint: disable=g-import-not-at-top
  from jaxgrpo import checks, config_lib
  from jaxgrpo.data import entry
  cls, path = config_lib.Config, key.split('.')
  if _ENTRY_KEY.fullmatch(key):
    cls, path = entry.DatasetSection, path[2:]
  for name in path:
    f = {f.name: f for f in dataclasses.fields(cls)}.get(name)
    if f is None or name == path[-1]:
      return f
    if not (isinstance(f.type, type) and issubclass(f.type, checks.Section)):
      return None
    cls = f.type
  return None


def _literal(text: str) -> Any:
  """`text` as a Python literal (true/false as bools), else the text."""
  try:
    return ast.literal_eval(
        text.capitalize() if text in ('true', 'false') else text)
  except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
    return text


# A bool key's words, as a config argument reads them (absl knows only
# true/false/t/f/1/0).
_BOOL_WORDS = {**dict.fromkeys(('true', 't', '1', 'yes', 'on'), True),
               **dict.fromkeys(('false', 'f', '0', 'no', 'off'), False)}


def _value_of(key: str, text: str) -> Any:
  """An override's text as the value of the schema's field `key`: None for
  `None` where the key may be None, else of the field's type where the
  text reads as one (`1e3` and `100.0` as ints where the key is an int; the
  config's check names anything else)."""
  # pylint: disable-next=g-import-not-at-top
  from jaxgrpo import checks
  f = _field_of(key)
  kinds = (typing.get_args(f.type) or (f.type,)) if f else ()
  if text == 'None' and type(None) in kinds:
    return None
  if set(kinds) <= {str, type(None)}:  # a string, as ml_collections reads it
    return text
  value = _literal(text)
  if f and f.type == tuple[str, ...] and not isinstance(value, (list, tuple)):
    # 'json,os' and '(a, b)': names, as the shell leaves them unquoted
    return tuple(n.strip(' \'"') for n in text.strip(' ()[]').split(',')
                 if n.strip(' \'"'))
  if bool in kinds and text.strip().lower() in _BOOL_WORDS:
    return _BOOL_WORDS[text.strip().lower()]
  if float in kinds and text.strip().lower().lstrip('+-') in ('nan', 'inf'):
    value = float(text)  # refused or read as no limit by the key's check
  if (float in kinds and isinstance(value, int)
      and not isinstance(value, bool)):
    value = float(value)
  value = checks.plain(value, f.type)
  return value if checks.type_error(value, f.type) is None else text


def _apply_later(config: ml_collections.ConfigDict,
                 later: list[tuple[str, str]]) -> None:
  """Applies the overrides that ml_collections cannot: `None` for a key that
  may be None, an int written as a float (`1e3`), `data.datasets` as a
  list, and a dataset entry's key that its dict leaves out."""
  for key, text in later:
    where = f'{CONFIG_PREFIX}{key}={text}'
    if key == 'data.datasets':
      value = _literal(text)
      if not isinstance(value, (list, tuple)):
        raise UsageError(f"{where}: expected a list of dataset dicts, e.g. "
                         "\"[{'name': 'a', 'kind': 'arithmetic'}]\"")
      config.data.datasets = list(value)
    elif match := _ENTRY_KEY.fullmatch(key):
      entries = config.data.datasets
      index = int(match.group(1))
      if not isinstance(entries, list) or not 0 <= index < len(entries):
        count = len(entries) if isinstance(entries, list) else 0
        raise UsageError(f'{where}: the config has {count} dataset'
                         f'{"s" * (count != 1)} (data.datasets[0] to '
                         f'[{count - 1}])')
      if isinstance(entries[index], ml_collections.ConfigDict):
        entries[index] = entries[index].to_dict()
      if not isinstance(entries[index], dict):
        raise UsageError(f'{where}: data.datasets[{index}] is no dict')
      entries[index][match.group(2)] = _value_of(key, text)
    else:  # None, for a key that may be None; an int written as 1e3
      *parents, name = key.split('.')
      section = config
      for part in parents:
        section = section[part]
      section[name] = _value_of(key, text)


def load_config(prog: str, config: str,
                overrides: list[str]) -> ml_collections.ConfigDict:
  """The ConfigDict of `--config` with `--config.KEY` overrides applied.

  ml_collections applies most overrides; `--config.KEY=None` of a key that
  may be None (it read the string 'None'), an int key given `1e3` or
  `100.0` (it refused them), `--config.data.datasets=[...]`
  (a list it cannot parse), a dataset entry's key,
  `--config.data.datasets[0].KEY=VALUE` (it knows only the keys that the
  entry's dict names), and a key the file leaves a
  `config_dict.required_placeholder` (it cannot type one, nor lock a config
  holding one unset), are applied here, after them, in their order. A key
  given twice takes its last value, whichever of the two applies it, and a
  list key (a tuple) both lists joined, as ml_collections joins them.

  Raises:
    UsageError: the file does not exist or load, an override names an
      unknown key or a bad value, or a required placeholder is not given.
  """

  from jaxgrpo import config_lib  # pylint: disable=g-import-not-at-top

  def split(required):
    kept, later = [], []
    flags = list(_flags(overrides))
    last = {flag: i for i, flag, _, _ in flags}  # a key given twice: its last
    joined = {}  # a list key given twice: both lists, as ml_collections joins
    for i, flag, text, args in flags:
      key = flag[len(CONFIG_PREFIX):]
      value = None if text is None else _value_of(key, text)
      f = _field_of(key)
      if isinstance(value, (list, tuple)) and f and (
          typing.get_origin(f.type) is tuple):
        joined[key] = joined.get(key, ()) + tuple(value)
        if last[flag] == i:
          later.append((key, repr(joined[key])))
        continue
      if last[flag] != i:
        continue
      if type(value) is str and f and f.type is bool:
        raise UsageError(f'{flag}={text}: {key} takes true or false (also '
                         '1/0, yes/no, on/off)')
      if text is not None and (
          key == 'data.datasets' or _ENTRY_KEY.fullmatch(key)
          or key in required or (text == 'None' and value is None)
          or type(value) is bool
          or (type(value) is int and not re.fullmatch(r'[-+]?\d+', text))):
        later.append((key, text))
      else:
        kept += args
    return kept, later

  kept, later = split(())
  try:
    result = _load(prog, config, kept)
  except config_dict.RequiredValueError:  # from locking the config
    kept, later = split(config_lib.unset_keys(_load(prog, config, [], lock=False)))
    result = _load(prog, config, kept, lock=False)
  _apply_later(result, later)
  if unset := config_lib.unset_keys(result):
    raise UsageError(
        f'--config={config}: {", ".join(unset)} must be given '
        f'(config_dict.required_placeholder), e.g. --config.{unset[0]}=VALUE')
  return result


# The module name config_flags gives a --config file (its flag's name, then
# `_config`).
_CONFIG_MODULE = 'config_config'


def _load(prog: str, config: str, overrides: list[str],
          lock: bool = True) -> ml_collections.ConfigDict:
  """`load_config` with the overrides that ml_collections applies; `lock`:
  locked, as ml_collections locks it (which reads every reference)."""
  path, sep, arg = config.partition(':')
  if not os.path.isfile(path):
    shipped = shipped_config(path)
    if os.path.isfile(home := os.path.expanduser(path)):  # '~/c.py'
      shipped = home
    if shipped is None:
      raise UsageError(f'--config={config}: {path} is not a file')
    config = shipped + sep + arg
  values = flags.FlagValues()
  argv = [prog, f'--config={config}', *overrides]
  # config_flags loads the file as module `config_config` with
  # `SourceFileLoader.load_module`, which runs it over the module of the
  # file loaded before, if any, in this process: a file without a
  # get_config() then returned the earlier file's config.
  sys.modules.pop(_CONFIG_MODULE, None)
  # config_flags finds the override flags in `sys_argv` when defined.
  holder = config_flags.DEFINE_config_file(
      'config', None, 'Config file.', flag_values=values, lock_config=lock,
      sys_argv=argv)
  # Its warnings repeat the errors below.
  with errors.absl_warnings_muted():
    try:
      values(argv)
      result = holder.value
      if not isinstance(result, ml_collections.ConfigDict) and hasattr(
          result, 'to_dict'):
        result.to_dict()  # an unloadable file: raises its error
    except flags.Error as e:
      if found := re.search(r'Type <class .dict.> of field config\.(\S+) is '
                            'not supported for overriding', str(e)):
        raise UsageError(
            f'--config.{found[1]}: a dict cannot be given whole; set its keys '
            f'one by one (--config.{found[1]}.KEY=VALUE), or give the whole '
            'list (--config.data.datasets="[{...}, ...]")') from None
      raise UsageError(_one_line(e)) from None
    except AttributeError as e:
      if "has no attribute 'get_config'" in str(e):
        raise UsageError(f'--config={config}: {path} defines no get_config() '
                         '(it returns the ConfigDict)') from None
      raise UsageError(unknown_key(e, overrides)) from None
    except config_dict.RequiredValueError:
      raise
    except KeyError as e:  # an override of an unknown key
      raise UsageError(unknown_key(e, overrides)) from None
    except Exception as e:  # pylint: disable=broad-except
      raise UsageError(f'cannot load --config={config}: {_one_line(e)}'
                       f'{_where_in(path, e)}') from None
  if not isinstance(result, ml_collections.ConfigDict):
    raise UsageError(f'--config={config}: get_config() returned '
                     f'{type(result).__name__}, not an ml_collections '
                     'ConfigDict (e.g. configs.common.base_config(), edited)')
  return result
