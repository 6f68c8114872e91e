"""`jaxgrpo-plot`: a run's figures (PNG) and TensorBoard events.

  jaxgrpo-plot runs/demo [--out=runs/demo/plots] [--window=20] [--tensorboard]
  python -m jaxgrpo.cli.plot runs/demo

What each figure shows: `jaxgrpo.reporting.plot`.
"""

import argparse
import os
import re
import sys

from jaxgrpo import records
from jaxgrpo.cli import common
from jaxgrpo.reporting import plot

PROG = 'jaxgrpo-plot'


def _parser() -> argparse.ArgumentParser:
  parser = common.Parser(prog=PROG, description=plot.__doc__.split('\n')[0])
  parser.add_argument('workdir', help='a run workdir (holds metrics.jsonl)')
  parser.add_argument('--out', default=None,
                      help='directory of the PNGs (default: WORKDIR/plots)')
  parser.add_argument('--window', type=int, default=20,
                      help='steps in the trailing mean of per-step series')
  parser.add_argument('--tensorboard', action='store_true',
                      help='also write every scalar as TensorBoard events '
                      'under WORKDIR/tensorboard')
  return parser


def _live_events(workdir: str) -> str | None:
  """The run training in `workdir` (its lock's holder) when it writes
  TensorBoard events there (a file named with its pid and host), which a
  rewrite would delete from under it; else None."""
  from jaxgrpo import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  held = workdir_lib.holder(workdir)
  found = re.match(r'pid (\d+) on (\S+),', held or '')
  logdir = os.path.join(workdir, 'tensorboard')
  if not found or not os.path.isdir(logdir):
    return None
  pid, host = found.groups()
  events = [name for name in os.listdir(logdir) if f'.{host}.{pid}.' in name]
  return held if events else None


def _ended_lines(path: str) -> tuple[bool, bool]:
  """Whether `path` holds an ended line that is not blank, and whether one
  of those is a metrics record (a last line without its newline is being
  written, or was cut short)."""
  ended = False
  with open(path, 'rb') as f:
    for line in f:
      text = line.decode('utf-8', 'replace')
      if text.endswith('\n') and text.strip():
        ended = True
        if records.record(text):
          return True, True
  return ended, False


def _nothing_to_plot(workdir: str) -> tuple[str, int] | None:
  """Why `workdir` holds no metrics to plot, with the exit code: 2 when it
  names no run workdir, 1 when the run's metrics are not there yet or
  cannot be read; None when its metrics.jsonl holds a record."""
  path = os.path.join(workdir, 'metrics.jsonl')
  where = '(WORKDIR is a run workdir: where the run writes metrics.jsonl)'
  if not os.path.isdir(workdir):
    what = 'is not a folder' if os.path.exists(workdir) else 'no such folder'
    return f'{workdir}: {what} {where}', 2
  if os.path.isdir(path):
    return f'{path}: is a folder {where}', 2
  if not os.path.exists(path) and not records.run_started(workdir):
    return f'{path}: no such file, and no run started in {workdir} {where}', 2
  try:
    ended, has_record = _ended_lines(path)
  except FileNotFoundError:
    ended, has_record = False, False
  except OSError as e:
    return f'{path}: cannot be read ({e.strerror or e})', 1
  if has_record:
    return None
  if ended:  # lines, none of them a record: damaged
    return f'{path} holds no metrics to plot', 1
  from jaxgrpo import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  held = workdir_lib.holder(workdir)
  run = (f'the run training in {workdir} ({held})' if held
         else f'the run in {workdir}')
  return (f'{path} holds no step yet: {run} may not have finished its first '
          'step; wait for it and plot again, or check that '
          f'{workdir} is the workdir you meant'), 1


def main(argv: list[str] | None = None) -> int:
  """Runs the command line `argv` (default: sys.argv[1:]); the exit code."""
  argv = sys.argv[1:] if argv is None else list(argv)
  try:
    args = _parser().parse_args(argv)
  except common.UsageError as e:
    return common.fail(PROG, str(e), 2)
  if args.window < 1:
    return common.fail(PROG, f'--window={args.window}: must be >= 1', 2)
  args.workdir = os.path.expanduser(args.workdir)  # as --workdir is
  if nothing := _nothing_to_plot(args.workdir):
    # Before anything is written: a failed call leaves no plots/ or
    # tensorboard/ folder behind.
    return common.fail(PROG, *nothing)
  path = os.path.join(args.workdir, 'metrics.jsonl')
  try:  # one line naming --out, not one failed write per figure
    if plot.have_matplotlib():  # else no folder is made: nothing is drawn
      out = common.out_folder(
          '--out', args.out or os.path.join(args.workdir, 'plots'))
      args.out = args.out and out  # '~/plots' is the home folder's
  except common.UsageError as e:
    return common.fail(PROG, str(e) if args.out else (
        f'{e} (the default --out: WORKDIR/plots); give --out=FOLDER'), 2)
  failed = []  # one error line each
  paths = plot.plot_run(args.workdir, args.out, args.window, log=failed.append)
  for p in paths:
    print(p, flush=True)
  if not paths and not failed:
    failed.append(f'{path} holds no metrics to plot')
  if args.tensorboard and (held := _live_events(args.workdir)):
    print(f'{os.path.join(args.workdir, "tensorboard")}: left as it is: the '
          f'run training in {args.workdir} ({held}) writes its events there '
          'as it goes (--tensorboard rewrites them after it ends)',
          flush=True)
  elif args.tensorboard:
    try:
      logdir = plot.write_tensorboard(args.workdir)
    except OSError as e:
      return common.fail(PROG, f'tensorboard: {e}', 1)
    if logdir is None:
      failed.append('--tensorboard needs tensorboardX (it writes the '
                    f'events): {plot.INSTALL_TENSORBOARD}')
    else:
      print(f'{logdir} (tensorboard --logdir {logdir})', flush=True)
  for line in failed:
    common.fail(PROG, line, 1)
  return 1 if failed else 0


def run_cli() -> None:
  """The `jaxgrpo-plot` entry point."""
  common.exit_with(common.code_of(main))


if __name__ == '__main__':
  run_cli()
