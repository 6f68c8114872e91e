r"""Command line: measure pass rates (`run`) and stratify them (`report`).

  jaxgrpo-stratify run --config=configs/demo.py --checkpoint=runs/warm \
      [--checkpoint=smollm2 ...] --out=runs/strata [--k=8] \
      [--datasets=a,b] [--shard=0 --num_shards=2] [--chunk=256] [--seed=0] \
      [--batch=64] [--threshold=1.0] [--limit=N] [--quiet] \
      [--config.rollout.temperature=0.8 ...]
  jaxgrpo-stratify report --out=runs/strata [--bands=0.25,0.5,0.75] \
      [--checkpoint=TAG ...] [--no_plot]
  python -m jaxgrpo.stratify run ...

A checkpoint is 'init' (the config's model before any warm start), a run
workdir (its latest checkpoint) or WORKDIR@STEP, a Hugging Face model
directory, a .gguf file or 'smollm2' (see `jaxgrpo.model_spec`); its pass rates
go under a tag, e.g. 'warm-step100' (summary.json maps tags to specs).

`run` resumes where an earlier run with the same --out stopped. Mistakes
end with one line `jaxgrpo-stratify: error: ...` (exit code 2 for the
command line, the config and checkpoint specs, 1 otherwise: a checkpoint
that cannot be read), not a traceback.
"""

import argparse
import os
import sys

from jaxgrpo.cli import common
from jaxgrpo.stratify import bands

PROG = 'jaxgrpo-stratify'


def _parser() -> argparse.ArgumentParser:
  parser = common.Parser(prog=PROG, description=__doc__.split('\n')[0])
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
                   help='prompts per generator call at most (a smaller '
                   'dataset: its size)')
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


def _run(args: argparse.Namespace, extra: list[str]) -> int:
  # pylint: disable=g-import-not-at-top
  from jaxgrpo import config_lib
  from jaxgrpo import model_spec
  from jaxgrpo.stratify import runner
  overrides = common.config_overrides(extra)
  cfg = config_lib.from_config_dict(
      common.load_config(PROG, args.config, overrides))
  out = common.out_folder('--out', args.out)  # before the model loads
  datasets = None
  if args.datasets is not None:
    datasets = [d.strip() for d in args.datasets.split(',') if d.strip()]
  try:
    runner.run(
        cfg, args.checkpoint, out, k=args.k, datasets=datasets,
        seed=args.seed, threshold=args.threshold, chunk=args.chunk,
        batch=args.batch, shard=args.shard, num_shards=args.num_shards,
        limit=args.limit, config_file=' '.join([args.config, *overrides]),
        progress=not args.quiet)
  except model_spec.UnreadableError:
    raise  # exit 1: a damaged checkpoint, not a mistake in the spec
  except model_spec.ModelSpecError as e:  # as jaxgrpo-eval: exit 2
    raise common.UsageError(str(e)) from None
  return 0


def _report(args: argparse.Namespace) -> int:
  from jaxgrpo.stratify import report  # pylint: disable=g-import-not-at-top
  try:
    edges = tuple(float(e) for e in args.bands.split(',') if e.strip())
    bands.check_edges(edges)
  except ValueError as e:
    raise common.UsageError(f'--bands={args.bands}: {e}') from None
  report.report(os.path.expanduser(args.out), edges, plot=not args.no_plot,
                checkpoints=args.checkpoint)
  return 0


def main(argv: list[str] | None = None) -> int:
  """Runs the command line `argv` (default: sys.argv[1:]); the exit code."""
  argv = sys.argv[1:] if argv is None else list(argv)

  def body() -> int:
    args, extra = _parser().parse_known_args(argv)
    if args.command == 'run':
      # pylint: disable-next=g-import-not-at-top
      from jaxgrpo.generate import generator
      generator.refuse_x64()  # before the model loads
      return _run(args, extra)
    if extra:
      raise common.UsageError(f'unrecognized arguments: {" ".join(extra)}')
    return _report(args)

  return common.run_main(
      PROG, body, interrupted='interrupted; the parts written so far are '
      'kept: run the same command to resume')


def run_cli() -> None:
  """The `jaxgrpo-stratify` entry point."""
  common.exit_with(common.code_of(main))


if __name__ == '__main__':
  run_cli()
