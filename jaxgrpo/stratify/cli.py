r"""Command line: measure pass rates (`run`) and stratify them (`report`).

  jaxgrpo-stratify run --config=configs/demo.py --checkpoint=runs/warm \
      [--checkpoint=smollm2 ...] --out=runs/strata [--k=8] \
      [--datasets=a,b] [--shard=0 --num_shards=2] [--chunk=256] [--seed=0] \
      [--batch=64] [--threshold=1.0] [--limit=N] [--quiet] \
      [--config.rollout.temperature=0.8 ...]
  jaxgrpo-stratify report --out=runs/strata [--bands=0.25,0.5,0.75] \
      [--checkpoint=TAG ...] [--no_plot]
  python -m jaxgrpo.stratify run ...

A checkpoint is 'init' (the config's model as a run starts it), a run
workdir (its latest checkpoint) or WORKDIR@STEP, a Hugging Face model
directory, a .gguf file or 'smollm2' (see `jaxgrpo.policy`); its pass rates
go under a tag, e.g. 'warm-step100' (summary.json maps tags to specs).

`run` resumes where an earlier run with the same --out stopped. Mistakes
end with one line `jaxgrpo-stratify: error: ...` (exit code 2 for the
command line and the config, 1 otherwise), not a traceback.
"""

import argparse
import os
import sys

from absl import flags
import ml_collections
from ml_collections import config_flags

from jaxgrpo import errors
from jaxgrpo.stratify import bands

PROG = 'jaxgrpo-stratify'
_CONFIG_PREFIX = '--config.'


class _UsageError(Exception):
  """A mistake on the command line."""


class _Parser(argparse.ArgumentParser):

  def error(self, message: str):
    raise _UsageError(f'{message} (see {PROG} {self.prog.split()[-1]} --help)'
                      if self.prog != PROG else f'{message} (see --help)')


def _parser() -> argparse.ArgumentParser:
  parser = _Parser(prog=PROG, description=__doc__.split('\n')[0])
  commands = parser.add_subparsers(dest='command', required=True,
                                   metavar='{run,report}')
  run = commands.add_parser(
      'run', help='sample K completions per example and store pass rates')
  run.add_argument('--config', required=True,
                   help='config file (`path.py` or `path.py:args`); '
                   '--config.KEY=VALUE overrides a value')
  run.add_argument('--checkpoint', action='append', required=True,
                   help="'init', a run workdir, WORKDIR@STEP, a Hugging Face "
                   "directory, a .gguf file or 'smollm2' (repeatable)")
  run.add_argument('--out', required=True, help='output directory')
  run.add_argument('--k', type=int, default=None,
                   help='completions per example (default: '
                   'rollout.group_size)')
  run.add_argument('--datasets', default=None,
                   help='comma-separated dataset names (default: all)')
  run.add_argument('--shard', type=int, default=None,
                   help='this shard (default: jax.process_index())')
  run.add_argument('--num_shards', type=int, default=None,
                   help='number of shards (default: jax.process_count())')
  run.add_argument('--chunk', type=int, default=256,
                   help='examples per part file, the unit of resume')
  run.add_argument('--batch', type=int, default=64,
                   help='prompts per generator call')
  run.add_argument('--seed', type=int, default=None,
                   help="sampling seed (default: the config's seed)")
  run.add_argument('--threshold', type=float, default=None,
                   help='reward a completion needs to pass (default: '
                   'rollout.easy_threshold)')
  run.add_argument('--limit', type=int, default=None,
                   help='only the first N examples of each dataset')
  run.add_argument('--quiet', action='store_true', help='no progress bars')
  report = commands.add_parser(
      'report', help='strata tables, strata.json and pass_rates.png')
  report.add_argument('--out', required=True, help='output directory')
  report.add_argument('--bands', default='0.25,0.5,0.75',
                      help='comma-separated band edges inside (0, 1)')
  report.add_argument('--checkpoint', action='append', default=None,
                      help='checkpoint tag to report (repeatable; default: '
                      'all)')
  report.add_argument('--no_plot', action='store_true',
                      help='skip pass_rates.png')
  return parser


def _config_overrides(extra: list[str]) -> list[str]:
  """The --config.KEY[=]VALUE arguments; anything else is an error."""
  out, i = [], 0
  while i < len(extra):
    arg = extra[i]
    if not arg.startswith(_CONFIG_PREFIX):
      raise _UsageError(f'unrecognized arguments: {" ".join(extra[i:])}')
    out.append(arg)
    if ('=' not in arg and i + 1 < len(extra)
        and not extra[i + 1].startswith('--')):
      out.append(extra[i + 1])
      i += 1
    i += 1
  return out


def _one_line(e: Exception) -> str:
  """The message in one line; of a quoted traceback, its last line."""
  lines = [line.strip() for line in str(e).splitlines() if line.strip()]
  if any(line.startswith('Traceback') for line in lines):
    lines = [lines[0].rstrip(':') + ':', lines[-1]]
  return ' '.join(lines)[:500]


def load_config(config: str,
                overrides: list[str]) -> ml_collections.ConfigDict:
  """The ConfigDict of `--config` with `--config.KEY` overrides applied."""
  path = config.split(':', 1)[0]
  if not os.path.isfile(path):
    raise _UsageError(f'--config={config}: {path} is not a file')
  values = flags.FlagValues()
  argv = [PROG, f'--config={config}', *overrides]
  # config_flags finds the override flags in `sys_argv` when defined.
  holder = config_flags.DEFINE_config_file(
      'config', None, 'Config file.', flag_values=values, lock_config=True,
      sys_argv=argv)
  try:
    values(argv)
    result = holder.value
    if not isinstance(result, ml_collections.ConfigDict):
      result.to_dict()  # an unloadable file: raises its error
  except flags.Error as e:
    raise _UsageError(_one_line(e)) from None
  except (AttributeError, KeyError) as e:  # an override of an unknown key
    while e.args and isinstance(e.args[0], Exception):
      e = e.args[0]
    bad = [a.split('=')[0].lstrip('-') for a in overrides
           if a.startswith(_CONFIG_PREFIX)]
    hint = ' '.join(str(e.args[0] if e.args else e).split())
    raise _UsageError(f'unknown config key among {bad}: {hint}') from None
  except Exception as e:  # pylint: disable=broad-except
    raise _UsageError(f'cannot load --config={config}: {_one_line(e)}'
                      ) from None
  return result


def _run(args: argparse.Namespace, extra: list[str]) -> int:
  # pylint: disable=g-import-not-at-top
  from jaxgrpo import config_lib
  from jaxgrpo.stratify import runner
  overrides = _config_overrides(extra)
  cfg = config_lib.from_config_dict(load_config(args.config, overrides))
  datasets = None
  if args.datasets is not None:
    datasets = [d.strip() for d in args.datasets.split(',') if d.strip()]
  runner.run(
      cfg, args.checkpoint, args.out, k=args.k, datasets=datasets,
      seed=args.seed, threshold=args.threshold, chunk=args.chunk,
      batch=args.batch, shard=args.shard, num_shards=args.num_shards,
      limit=args.limit, config_file=' '.join([args.config, *overrides]),
      progress=not args.quiet)
  return 0


def _report(args: argparse.Namespace) -> int:
  from jaxgrpo.stratify import report  # pylint: disable=g-import-not-at-top
  try:
    edges = tuple(float(e) for e in args.bands.split(',') if e.strip())
    bands.check_edges(edges)
  except ValueError as e:
    raise _UsageError(f'--bands={args.bands}: {e}') from None
  report.report(args.out, edges, plot=not args.no_plot,
                checkpoints=args.checkpoint)
  return 0


def _fail(message: str, code: int) -> int:
  print(f'{PROG}: error: {message}', file=sys.stderr, flush=True)
  return code


def main(argv: list[str] | None = None) -> int:
  """Runs the command line `argv` (default: sys.argv[1:]); the exit code."""
  argv = sys.argv[1:] if argv is None else list(argv)
  try:
    args, extra = _parser().parse_known_args(argv)
    if args.command == 'run':
      return _run(args, extra)
    if extra:
      raise _UsageError(f'unrecognized arguments: {" ".join(extra)}')
    return _report(args)
  except (_UsageError, errors.ConfigError) as e:
    return _fail(str(e), 2)
  except errors.UserError as e:
    return _fail(str(e), 1)
  except KeyboardInterrupt:
    return _fail('interrupted; the parts written so far are kept: run the '
                 'same command to resume', 130)


if __name__ == '__main__':
  sys.exit(main())
