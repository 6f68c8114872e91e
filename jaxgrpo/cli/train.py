"""`jaxgrpo-train`: one training run.

  jaxgrpo-train --config=configs/demo.py --workdir=runs/demo \
      [--config.KEY=VALUE ...] [--progress=auto|on|off] [--quiet] [-v N]

`python -m jaxgrpo.main` runs the same command. The logic lives in
`jaxgrpo.train`, which notebooks and tests import directly. Mistakes in the
command line, the config or the data end with one line naming the key or
the file and exit code 2; a run that cannot go on (a resume that does not
match, no checkpoint that restores, a workdir in use, a streak of
non-finite updates, a full disk) ends with one line and exit code 1.
"""

import logging
import os
import sys

from absl import flags
from absl import logging as absl_logging

from jaxgrpo import checkpoint
from jaxgrpo import config_lib
from jaxgrpo import multihost
from jaxgrpo import preemption
from jaxgrpo import records
from jaxgrpo import train
from jaxgrpo.cli import common

PROG = 'jaxgrpo-train'
DEFAULT_CONFIG = 'configs/demo.py'


def _parser() -> common.Parser:
  parser = common.Parser(prog=PROG, description='One GRPO training run.')
  parser.add_argument(
      '--config', default=DEFAULT_CONFIG,
      help='config file (`path.py` or `path.py:args`); configs/NAME.py '
      'names a config shipped with jaxgrpo when no such file is here')
  parser.add_argument(
      '--workdir', default=None,
      help='run directory (required); a run resumes from its latest '
      'checkpoint there')
  parser.add_argument(
      '--progress', choices=('auto', 'on', 'off'), default='auto',
      help='progress bars with rate and time left (warm start, evaluation, '
      'training); auto: when stderr is a terminal')
  parser.add_argument(
      '--quiet', action='store_true',
      help='show only what needs attention (a resume, skipped updates, a '
      'stop signal) and the final summary; no progress bars')
  parser.add_argument(
      '-v', '--verbosity', type=int, default=None,
      help="libraries' log level: 0 shows their INFO records (orbax logs "
      'every save), which are hidden by default')
  return parser


def _quiet_libraries(record: logging.LogRecord) -> bool:
  """Drops orbax's and asyncio's error records (with their tracebacks):
  a failed save or a damaged checkpoint is reported in one line by the run
  itself. `-v N` shows them."""
  return not (record.name == 'asyncio' or 'orbax' in record.pathname)


def _quiet_closed_loops(hook):
  """`hook`, but silent on the read errors of a damaged checkpoint's
  abandoned restore, already reported in one line by the run (the 'Event
  loop is closed' errors of late tensorstore callbacks never reach it:
  `orbax_patch.quiet_late_callbacks`)."""

  def quiet(unraisable):
    code = getattr(unraisable.object, 'cr_code', None)  # a coroutine's
    if code is not None and 'orbax' in code.co_filename:
      return
    hook(unraisable)

  quiet.unquiet = hook
  return quiet


def _quiet_logs(on: bool) -> None:
  """Hides libraries' records and orbax's late errors (`on`), or shows
  them again; calling it again (a second run in one process) stacks
  nothing."""
  for name in ('absl', 'asyncio'):  # on the loggers: before any handler
    logger = logging.getLogger(name)
    (logger.addFilter if on else logger.removeFilter)(_quiet_libraries)
  unquiet = getattr(sys.unraisablehook, 'unquiet', None)
  if on and unquiet is None:
    sys.unraisablehook = _quiet_closed_loops(sys.unraisablehook)
  elif not on and unquiet is not None:
    sys.unraisablehook = unquiet


def _interrupted(workdir: str) -> str:
  """The line of a run ended by a second Ctrl-C (once the save it was
  making is complete) or a third (which abandons it): where running the
  command again resumes."""
  again = 'interrupted; run the same command to resume from'
  if records.is_remote(workdir):
    return f'{again} the last complete checkpoint'
  try:
    steps = checkpoint.saved_steps(os.path.join(workdir, 'checkpoints'))
  except Exception:  # pylint: disable=broad-except
    return f'{again} the last complete checkpoint'
  return (f'{again} step {steps[-1]}, the last complete checkpoint' if steps
          else 'interrupted before a checkpoint was complete; run the same '
          'command to start again')


def main(argv: list[str] | None = None) -> int:
  """Runs the command line `argv` (default: sys.argv[1:]); the exit code."""
  argv = sys.argv[1:] if argv is None else list(argv)

  def body() -> int:
    args, extra = _parser().parse_known_args(argv)
    overrides = common.config_overrides(extra)
    if not args.workdir:
      raise common.UsageError(
          '--workdir is required (checkpoints and metrics.jsonl go there)')
    config = common.load_config(PROG, args.config, overrides)
    cfg = config_lib.from_config_dict(config)
    # Libraries' INFO records (orbax logs every save) would bury the run's
    # own lines and bars. The command's flags are argparse's: absl is told
    # its own are parsed, so it logs without a warning about them.
    flags.FLAGS.mark_as_parsed()
    absl_logging.set_verbosity(
        absl_logging.WARNING if args.verbosity is None else args.verbosity)
    _quiet_logs(args.verbosity is None)
    progress = not args.quiet and (args.progress == 'on' or (
        args.progress == 'auto' and sys.stderr.isatty()))
    try:
      # A second Ctrl-C quits promptly, where the same line says where
      # the run resumes (a KeyboardInterrupt waited for the device).
      train.run(cfg, args.workdir, progress=progress, quiet=args.quiet,
                on_quit=lambda: common.fail(PROG, _interrupted(args.workdir),
                                            130))
    except preemption.Stopped as e:  # a clean stop, with nothing to save
      print(e, flush=True)
    except KeyboardInterrupt:  # a second Ctrl-C, which does not wait
      raise KeyboardInterrupt(_interrupted(args.workdir)) from None
    except Exception as e:  # pylint: disable=broad-except
      lost = multihost.lost_contact(e)  # another process is gone
      if lost is None:
        raise
      raise lost from None
    return 0

  return common.run_main(PROG, body)


def run_cli() -> None:
  """The `jaxgrpo-train` entry point."""
  code = common.code_of(main)
  multihost.exit_now(code)  # several processes: not at the shutdown barrier
  common.exit_with(code)


if __name__ == '__main__':
  run_cli()
