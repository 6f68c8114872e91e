r"""Command line: pass@1, mean@k and pass@k of checkpoints on held-out data.

  jaxgrpo-eval --config=configs/demo.py --checkpoint=runs/demo \
      [--checkpoint=init ...] [--datasets=a,b] [--k=4] [--temperature=1.0] \
      [--split=eval|train] [--limit=N] [--seed=0] [--batch=64] \
      [--json=PATH] [--quiet] [--config.KEY=VALUE ...]
  python -m jaxgrpo.cli.evaluate ...

A checkpoint is 'init' (the config's model before any warm start), a run
workdir (its latest checkpoint) or WORKDIR@STEP, a Hugging Face model
directory, a .gguf file or 'smollm2' (see `jaxgrpo.model_spec`). Each is
evaluated on the examples of the config's datasets, loaded as training
loads them: the held-out sets (`--split=eval`) or the training sets
(`--split=train`), the first `--limit` of each. k completions per example
are sampled with the project's generator (`--temperature`, default
eval.temperature; 0 is greedy, and then one completion is drawn, the k
being identical) and scored by each dataset's verifiers. With a completion
succeeding when its reward is >= rollout.easy_threshold:

  pass@1  share of examples whose first completion succeeds
  mean@k  mean reward of all k completions (the training run's held-out
          accuracy, eval/accuracy, for k = eval.num_samples)
  pass@k  share of examples with at least one success among k

are reported overall ('all'), per dataset and per subset, in a table and,
with --json, a file. Verifier calls that raised, returned no reward in
[0, 1] or timed out (scored 0), printed to stdout, and verifier workers
replaced are counted per checkpoint, as training's `verify/*`: in the file
('verify') and, when any, in a line under the table. Every checkpoint
samples with the same keys. Mistakes
end with one line `jaxgrpo-eval: error: ...` (exit code 2 for the command
line, the config and checkpoint specs, 1 otherwise: a checkpoint that
cannot be read, once the others' results are out). It runs on the config's
mesh (`mesh.*`), as training does.

Size: the Python API (`evaluate_checkpoints`, its table and its checks of
every spec and dataset before any model loads) and the command line around
it, which share their arguments' meaning.
"""

import argparse
import collections
from collections.abc import Callable, Sequence
import contextlib
import dataclasses
import json
import os
import sys
import time
from typing import Any, TYPE_CHECKING

from jaxgrpo import checks
from jaxgrpo import errors
from jaxgrpo.cli import common
from jaxgrpo.reporting import console

if TYPE_CHECKING:
  # The modules behind these import jax; `--help` and mistakes on the
  # command line should not wait for it.
  # pylint: disable=g-bad-import-order
  import ml_collections
  from jaxgrpo import config_lib

PROG = 'jaxgrpo-eval'
SPLITS = ('eval', 'train')
METRICS = ('pass@1', 'mean@k', 'pass@k')

Log = Callable[[str], None]


def _check(cfg: 'config_lib.Config', specs: Sequence[str],
           datasets: Sequence[str] | None, k: int | None,
           temperature: float | None, split: str, limit: int | None,
           batch: int) -> list[str]:
  """The dataset names to evaluate; a bad argument raises ConfigError."""
  for name, value in (('specs', specs), ('datasets', datasets)):
    if isinstance(value, (str, os.PathLike)):  # one, not its characters
      raise errors.ConfigError(f'{name}={value!r}: give a list ([{value!r}])')
  if not specs:
    raise errors.ConfigError('--checkpoint: give at least one')
  for name, value, low in (('k', k, 1), ('limit', limit, 1),
                           ('batch', batch, 1)):
    if value is not None and (isinstance(value, bool)
                              or not isinstance(value, int) or value < low):
      raise errors.ConfigError(f'--{name}={value}: must be an int >= {low}')
  if temperature is not None and (checks.TEMPERATURE(temperature)
                                  or temperature == float('inf')):
    raise errors.ConfigError(f'--temperature={temperature}: must be 0 or '
                             f'>= {checks.MIN_TEMPERATURE:g}, finite')
  if split not in SPLITS:
    raise errors.ConfigError(
        f'--split={split!r}: must be one of {", ".join(SPLITS)}')
  # pylint: disable-next=g-import-not-at-top
  from jaxgrpo.stratify import runner as runner_lib
  return runner_lib.select_datasets(cfg, datasets)


def _examples(cfg, tokenizer, selected: list[str], split: str,
              limit: int | None, log: Log) -> list[tuple[int, list]]:
  """(dataset index, examples) of each selected dataset with examples in
  `split` (the first `limit`), their prompt lengths checked.

  Raises:
    errors.ConfigError: no selected dataset has examples there.
  """
  from jaxgrpo.data import loading  # pylint: disable=g-import-not-at-top
  loaded = []
  for index, entry in enumerate(cfg.data.datasets):
    if entry.name not in selected:
      continue
    _, train_set, held_out = loading.load_dataset(cfg, entry, tokenizer)
    source = held_out if split == 'eval' else train_set
    n = len(source) if limit is None else min(limit, len(source))
    members = [source[i] for i in range(n)]
    if not members:
      log(f'dataset {entry.name!r} has no {split} examples: skipped')
      continue
    loaded.append((index, members))
  if not loaded:
    raise errors.ConfigError(
        f'--split={split}: the datasets {", ".join(selected)} have no '
        'examples there' + (' (set num_eval, eval_path or holdout in '
                            'their entries)' if split == 'eval' else ''))
  loading.check_lengths(
      cfg, tokenizer, [ex for _, members in loaded for ex in members])
  return loaded


def evaluate_checkpoints(
    cfg: 'config_lib.Config | ml_collections.ConfigDict',
    specs: Sequence[str],
    *,
    datasets: Sequence[str] | None = None,
    k: int | None = None,
    temperature: float | None = None,
    split: str = 'eval',
    limit: int | None = None,
    seed: int | None = None,
    batch: int = 64,
    progress: bool = True,
    keep_going: bool = False,
    log: Log = console.print_line,
) -> dict[str, Any]:
  """Evaluates each checkpoint on the config's datasets (module docstring).

  Length: its signature and docstring hold eleven arguments; the code resolves
  the defaults, then evaluates each checkpoint in turn.

  Args:
    cfg: the config (a `config_lib.Config`, or a ConfigDict validated
      here): datasets, verifiers, rollout.max_new_tokens and
      rollout.easy_threshold.
    specs: checkpoint specs (see `jaxgrpo.model_spec`).
    datasets: names of the datasets to evaluate (default: all).
    k: completions per example (default: eval.num_samples).
    temperature: sampling temperature, 0 greedy (default:
      eval.temperature); no top-k or top-p, as in the training run's eval.
    split: 'eval' (held-out examples) or 'train'.
    limit: only the first `limit` examples of each dataset.
    seed: the sampling seed (default: the config's seed).
    batch: prompts per generator call.
    progress: show a progress bar per checkpoint.
    keep_going: a checkpoint whose files cannot be read gets an entry
      {'spec', 'name', 'tag', 'error'} and the others are evaluated
      (default: UnreadableError at once).
    log: receives progress lines.

  Returns:
    A JSON-serialisable dict: the settings ('split', 'k', 'temperature',
    'threshold', 'seed', 'limit', 'datasets') and 'checkpoints', one entry
    per spec in order: {'spec', 'name', 'tag', 'seconds', 'metrics',
    'verify'}, metrics mapping 'all', each dataset and each
    '<dataset>/<subset>' to {'examples', 'pass@1', 'mean@k', 'pass@k'},
    verify holding the verifiers' {'errors', 'timeouts', 'printed',
    'workers_replaced'} (`evaluate.verify_counts`).

  Raises:
    errors.ConfigError: a bad argument or dataset name.
    model_spec.ModelSpecError: a spec names no loadable model (a damaged
      checkpoint: UnreadableError, unless `keep_going`).
    errors.UserError: a dataset cannot be loaded or has a bad record.
  """
  # pylint: disable=g-import-not-at-top
  import jax
  from jaxgrpo import config_lib
  from jaxgrpo import model_spec
  from jaxgrpo import build
  from jaxgrpo.stratify import runner
  # pylint: enable=g-import-not-at-top
  if not isinstance(cfg, config_lib.Config):
    cfg = config_lib.from_config_dict(cfg)
  selected = _check(cfg, specs, datasets, k, temperature, split, limit, batch)
  temperature = cfg.eval.temperature if temperature is None else temperature
  k = cfg.eval.num_samples if k is None else k
  if temperature == 0 and k > 1:
    log(f'temperature 0 is greedy: its {k} completions would be identical, '
        'so one is drawn per example')
    k = 1
  seed = cfg.seed if seed is None else seed
  threshold = cfg.rollout.easy_threshold
  # Every spec is checked before any model loads; a workdir's latest step
  # is resolved once, here.
  names = [model_spec.name_of(spec) for spec in specs]
  result = {
      'split': split, 'k': k, 'temperature': temperature,
      'threshold': threshold, 'seed': seed, 'limit': limit,
      'datasets': selected, 'checkpoints': [],
  }
  key = jax.random.key(seed)
  with contextlib.ExitStack() as resources:
    # The config's mesh, as training uses it: a model trained over several
    # devices because it needs them is evaluated over them too (in one
    # process: over several, each would evaluate alone).
    if jax.process_count() == 1:
      build.enter_mesh(cfg, log, resources)
    scorer = resources.enter_context(build.build_scorer(cfg))
    for spec, name in zip(specs, names):
      t0 = time.perf_counter()
      try:
        model = model_spec.load_resolved(spec, name, cfg, log=log)
      except model_spec.UnreadableError as e:
        if not keep_going:
          raise
        result['checkpoints'].append({'spec': spec, 'name': name,
                                      'tag': runner.tag_of(name),
                                      'error': str(e)})
        log(f'{spec}: cannot be evaluated ({e}); going on with the others')
        continue
      loaded = _examples(cfg, model.tokenizer, selected, split, limit, log)
      tag = runner.tag_of(model.name)
      metrics, verify = _scores(cfg, model, scorer, loaded, k=k, key=key,
                                temperature=temperature, batch=batch,
                                tag=tag, progress=progress)
      result['checkpoints'].append({
          'spec': spec, 'name': model.name, 'tag': tag,
          'seconds': round(time.perf_counter() - t0, 3), 'metrics': metrics,
          'verify': verify})
  return _distinct_tags(result)


def _scores(cfg, model, scorer, loaded, *, k: int, key, temperature: float,
            batch: int, tag: str, progress: bool) -> tuple[dict, dict]:
  """(metrics, verifier counts) of `model` on the `loaded` examples: k
  completions each at `temperature`, `batch` prompts a generator call."""
  # pylint: disable=g-import-not-at-top
  import tqdm
  from jaxgrpo import evaluate
  from jaxgrpo.generate import sampling as sampling_lib
  from jaxgrpo.stratify import runner
  from jaxgrpo.verifiers import base
  # pylint: enable=g-import-not-at-top
  generator = dataclasses.replace(
      runner.make_generator(cfg, model, k),
      sampling=sampling_lib.Sampling(temperature=temperature))
  stats = base.ScoreStats()
  with tqdm.tqdm(total=sum(len(m) for _, m in loaded), desc=tag, unit='ex',
                 disable=not progress, dynamic_ncols=True) as bar:
    metrics = evaluate.evaluate_model(
        generator, model.params, model.tokenizer, scorer, loaded,
        key=key, threshold=cfg.rollout.easy_threshold,
        max_prompt_len=cfg.rollout.max_prompt_len,
        truncate=cfg.rollout.long_prompts == 'truncate',
        batch=min(batch, max(len(m) for _, m in loaded)), bar=bar,
        stats=stats)
  return metrics, evaluate.verify_counts(stats)


def _distinct_tags(result: dict[str, Any]) -> dict[str, Any]:
  """Tags two checkpoints share (`a/demo@3`, `b/demo@3`) get their place
  on the command line, `demo-step3 #1` and `#2`, so no two rows look alike
  (each entry's `spec` and `name` say which is which)."""
  entries = result['checkpoints']
  counts = collections.Counter(e['tag'] for e in entries)
  for i, e in enumerate(entries):
    if counts[e['tag']] > 1:
      e['tag'] = f"{e['tag']} #{i + 1}"
  return result


def format_table(result: dict[str, Any]) -> list[str]:
  """One row per checkpoint x group; 'all' only with several datasets;
  no pass@k column for k = 1, where it is pass@1."""
  k = result['k']
  names = METRICS if k > 1 else METRICS[:2]
  header = ('checkpoint', 'dataset', 'examples', 'pass@1', f'mean@{k}',
            f'pass@{k}')[:3 + len(names)]
  rows = []
  for entry in result['checkpoints']:
    groups = entry.get('metrics', {})  # none for an unreadable one
    several = sum('/' not in g for g in groups if g != 'all') > 1
    for group, m in groups.items():
      if group == 'all' and not several:
        continue
      rows.append((entry['tag'], group, str(m['examples']),
                   *(f'{m[name]:.3f}' for name in names)))
  # Padded by terminal columns: a CJK dataset name takes two per glyph.
  widths = [max(console.width(r[i]) for r in [header, *rows])
            for i in range(len(header))]
  def line(row):
    return '  '.join(
        console.pad(v, w, right=i >= 2)
        for i, (v, w) in enumerate(zip(row, widths))).rstrip()
  return [line(header), *map(line, rows)]


def format_verify(result: dict[str, Any]) -> list[str]:
  """A line per checkpoint whose verifiers failed, printed or lost a
  worker (the run summary's rows); none for the others."""
  lines = []
  for entry in result['checkpoints']:
    v = entry.get('verify') or {}
    if any(v.values()):
      lines.append(
          f"{entry['tag']}: verifier errors / timeouts {v['errors']} / "
          f"{v['timeouts']} (scored 0), workers replaced / calls that "
          f"printed {v['workers_replaced']} / {v['printed']}")
  return lines


# ---------------------------------------------------------------------------
# Command line.


def _parser() -> argparse.ArgumentParser:
  parser = common.Parser(prog=PROG, description=__doc__.split('\n')[0],
                   epilog='Overrides: --config.KEY=VALUE (any config key).')
  parser.add_argument('--config', required=True,
                      help='config file (`path.py` or `path.py:args`); '
                      '--config.KEY=VALUE overrides a value')
  parser.add_argument('--checkpoint', action='append', required=True,
                      help="'init', a run workdir, WORKDIR@STEP, a Hugging "
                      "Face directory, a .gguf file or 'smollm2' "
                      '(repeatable)')
  parser.add_argument('--datasets', default=None,
                      help='comma-separated dataset names (default: all)')
  parser.add_argument('--k', type=int, default=None,
                      help='completions per example (default: '
                      'eval.num_samples)')
  parser.add_argument('--temperature', type=float, default=None,
                      help='sampling temperature, 0 greedy (default: '
                      'eval.temperature)')
  parser.add_argument('--split', default='eval', choices=SPLITS,
                      help='held-out (eval) or training (train) examples')
  parser.add_argument('--limit', type=int, default=None,
                      help='only the first N examples of each dataset')
  parser.add_argument('--seed', type=int, default=None,
                      help="sampling seed (default: the config's seed)")
  parser.add_argument('--batch', type=int, default=64,
                      help='prompts per generator call at most (a smaller '
                      'dataset: its size)')
  parser.add_argument('--json', default=None,
                      help='also write the results to this JSON file')
  parser.add_argument('--quiet', action='store_true',
                      help='no progress bar or loading lines')
  return parser


def _write_json(path: str, result: dict[str, Any]) -> None:
  tmp = f'{path}.tmp'
  try:
    with open(tmp, 'w', encoding='utf-8') as f:
      f.write(json.dumps(result, indent=2) + '\n')
    os.replace(tmp, path)
  except OSError as e:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise OSError(f'--json={path}: cannot write it ({e.strerror or e})'
                  ) from None


def main(argv: list[str] | None = None) -> int:
  """Runs the command line `argv` (default: sys.argv[1:]); the exit code."""
  argv = sys.argv[1:] if argv is None else list(argv)

  def body() -> int:
    args, extra = _parser().parse_known_args(argv)
    overrides = common.config_overrides(extra)
    if args.json:  # before any model loads
      args.json = common.out_file('--json', args.json)
    config = common.load_config(PROG, args.config, overrides)
    # pylint: disable=g-import-not-at-top
    from jaxgrpo import config_lib
    from jaxgrpo import model_spec
    from jaxgrpo.generate import generator
    # pylint: enable=g-import-not-at-top
    cfg = config_lib.from_config_dict(config)
    generator.refuse_x64()  # before the model loads
    datasets = None if args.datasets is None else [
        d.strip() for d in args.datasets.split(',') if d.strip()]
    try:
      result = evaluate_checkpoints(
          cfg, args.checkpoint, datasets=datasets, k=args.k,
          temperature=args.temperature, split=args.split, limit=args.limit,
          seed=args.seed, batch=args.batch, progress=not args.quiet,
          keep_going=True,
          log=(lambda _: None) if args.quiet else console.print_line)
    except model_spec.ModelSpecError as e:
      raise common.UsageError(str(e)) from None
    result['config'] = ' '.join([args.config, *overrides])
    for line in format_table(result) + format_verify(result):
      print(line, flush=True)
    if args.json:
      _write_json(args.json, result)
      print(f'wrote {args.json}', flush=True)
    unread = [e['error'] for e in result['checkpoints'] if 'error' in e]
    if unread:  # exit 1, once the others' results are out
      raise model_spec.UnreadableError('; '.join(unread))
    return 0

  return common.run_main(PROG, body)


def run_cli() -> None:
  """The `jaxgrpo-eval` entry point."""
  common.exit_with(common.code_of(main))


if __name__ == '__main__':
  run_cli()
