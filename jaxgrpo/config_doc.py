"""The configuration reference table, generated from `configs/common.py`.

Every key of `base_config()` has one row here, with its meaning; the
defaults come from the config code itself, so the table of
`docs/configuration.md` (between the `config-reference` markers) cannot drift
from it. `tests/test_config_doc.py` fails when a key has no row or the table
is stale:

  python -m jaxgrpo.config_doc            # print the table
  python -m jaxgrpo.config_doc --write    # rewrite the table in the page
"""

import argparse
import os
import sys

# (keys, meaning): keys that share a row, in the order of the table.
ROWS: tuple[tuple[tuple[str, ...], str], ...] = (
    (('seed',),
     'seeds init, warm start, rollouts and prompt order'),
    (('total_steps',),
     'GRPO steps (optimizer batches)'),
    (('log_every',),
     'steps per console line'),
    (('plots',),
     'write PNG plots of `metrics.jsonl` to `WORKDIR/plots` when the run ends (needs matplotlib; `jaxgrpo-plot WORKDIR` draws them any time)'),
    (('tensorboard',),
     "also write each step's scalars as TensorBoard events to `WORKDIR/tensorboard` while training (needs the `tensorboard` extra: tensorboardX; skipped without it)"),
    (('model.preset',),
     '`tiny`, `demo`, `small_10m`, or a real size (`smollm2_135m`, `qwen2.5_0.5b`, `qwen3_0.6b`, `llama3.2_1b`, `llama3_8b`)'),
    (('model.path',),
     'a pretrained model: a Hugging Face directory, a `.gguf` file or `smollm2` (see [Pretrained models](models.md)); `preset` is then unused'),
    (('model.tokenizer',),
     "`auto` (the model's own with `model.path`, else `char`), `char` (the arithmetic alphabet), `byte` (UTF-8 bytes: any text, for presets) or `model`"),
    (('model.chat_template', 'model.system_prompt'),
     "with the model's tokenizer: wrap prompts in its chat template, with an optional system turn"),
    (('model.dtype', 'model.param_dtype'),
     'compute / storage dtype (`float32` or `bfloat16`)'),
    (('model.remat',),
     "recompute activations of each decoder block in the learner's backward pass: `none`, `full` (keep only block inputs) or `dots` (also keep matmul outputs without batch dims); less memory, more compute, same results; generation never recomputes"),
    (('data.balance',),
     'how a mixture fills the batch: `pre_filter` or `post_filter` (see [the sampler](sampler.md))'),
    (('data.datasets',),
     'list of dataset entries (below)'),
    (('rollout.batch_size',),
     'B: informative groups per step'),
    (('rollout.group_size',),
     'G: completions per prompt'),
    (('rollout.round_size',),
     'R: prompts per generator call, or `adaptive`'),
    (('rollout.max_round_size',),
     'cap of adaptive round sizes'),
    (('rollout.max_rounds',),
     'generator calls per step at most; then `short_batch` decides'),
    (('rollout.surplus',),
     'informative groups beyond B: `carry` to the next step or `drop` (DAPO)'),
    (('rollout.short_batch',),
     'fewer than B informative groups when a step\'s rounds end: `wait` (no update; the groups wait for the next step, so every update has B), `scale` (update with advantages x n/B) or `train` (a full-size update anyway)'),
    (('rollout.max_prompt_len',),
     'P: padded prompt length in tokens'),
    (('rollout.long_prompts',),
     'a longer prompt: `error` (names the example), `truncate` (BOS and its last P - 1 tokens) or `drop` (left out when its dataset is loaded); see [Bad input](troubleshooting.md#bad-input)'),
    (('rollout.max_new_tokens',),
     'T: generated tokens at most'),
    (('rollout.temperature', 'rollout.top_k', 'rollout.top_p'),
     'sampling (0 temperature is greedy; 0 / 1.0 turn top-k / top-p off)'),
    (('rollout.easy_threshold', 'rollout.hard_threshold'),
     'a group is too easy (too hard) when every reward is >= (<=) this'),
    (('sampler.policy',),
     '`none`, `filter`, `snooze`, `snooze_prob` or `weighted` (see [the sampler](sampler.md))'),
    (('sampler.snooze_factor',),
     'N: epochs a too-easy example sleeps (mean sleep for `snooze_prob`)'),
    (('sampler.snooze_hard_factor',),
     '> 0 snoozes too-hard examples for that many epochs'),
    (('sampler.w_min', 'sampler.prior_strength', 'sampler.prior_mean'),
     "`weighted`: weight floor; Beta prior strength and mean (None: the dataset's running mean)"),
    (('rl.advantage',),
     '`grpo` (r - mean) / (std + eps), `dr_grpo` r - mean, `rloo` leave-one-out'),
    (('rl.loss_agg',),
     '`token_mean`, `seq_mean_token_mean`, or `dr_grpo` (constant normalizer)'),
    (('rl.eps_low', 'rl.eps_high'),
     'clip range of the importance ratio (clip-higher when `eps_high > eps_low`)'),
    (('rl.beta',),
     'KL (k3) weight to the initial policy; 0 keeps no reference copy'),
    (('rl.num_iterations', 'rl.num_minibatches'),
     'passes over a rollout batch, and updates per pass'),
    (('optim.learning_rate', 'optim.warmup_steps', 'optim.schedule'),
     'AdamW on a linear warmup, then constant or cosine'),
    (('optim.max_grad_norm', 'optim.weight_decay'),
     'global-norm clipping; decoupled decay of matrices'),
    (('warmstart.enabled',),
     'run the supervised warm start on a fresh run'),
    (('warmstart.max_steps', 'warmstart.batch_size', 'warmstart.learning_rate'),
     'its budget and optimizer'),
    (('warmstart.target_pass_rate',),
     'stop once the sampled pass rate reaches this'),
    (('warmstart.check_every', 'warmstart.check_examples'),
     'how often and on how many prompts the pass rate is measured'),
    (('eval.every', 'eval.num_samples', 'eval.temperature'),
     'held-out evaluation: mean reward of k samples per problem'),
    (('checkpoint.every', 'checkpoint.max_to_keep'),
     'checkpoint interval in steps (and always at the end); how many to keep'),
    (('checkpoint.every_minutes',),
     'also save when this many minutes passed since the last save (0: off)'),
    (('checkpoint.on_dataset_change',),
     'resuming after a dataset changed: `error`, or `remap` (keep sampler state by example id; see [Checkpoints](checkpoints.md))'),
    (('verify.workers',),
     "verifier worker processes (0: verify in the trainer's process)"),
    (('verify.timeout_s',),
     'per-call limit; past it the completion scores 0 and counts in `verify/timeouts` (0: no limit)'),
    (('verify.imports',),
     'modules imported first, and in every worker, to register your verifiers'),
    (('rl.max_nonfinite_steps',),
     'stop after this many steps in a row with a skipped NaN/inf update'),
    (('curriculum.strata',),
     'a `jaxgrpo-stratify` output directory: per-example pass rates that put each example in a stratum (see [Stratification and curriculum](sampler.md#stratification-and-curriculum))'),
    (('curriculum.bands',),
     'band edges in (0, 1) between the `too_hard` (pass rate 0) and `too_easy` (pass rate 1) strata'),
    (('curriculum.checkpoints',),
     'checkpoint tags whose pass rates are pooled (empty: all measured)'),
    (('curriculum.prior',),
     "the pass rates as each example's prior mean for the `weighted` policy"),
    (('curriculum.stages',),
     "`({'step': S, 'weights': {stratum or 'dataset/stratum': w}}, ...)`: per-stratum weights from step S on (unnamed: 1; 0 postpones)"),
    (('mesh.data', 'mesh.fsdp', 'mesh.tensor'),
     'device mesh: batch rows split over `data` x `fsdp`; params and optimizer state over `fsdp` (their `embed` axis) and `tensor` (heads, mlp, vocab); -1 on `data` takes the devices left. Their product must equal the device count, and `rollout.batch_size` x `group_size` must be a multiple of `data` x `fsdp`'),
    (('mesh.rules',),
     "`(logical axis, target)` pairs overriding the default rules of `jaxgrpo/sharding.py` (`DEFAULT_RULES`); a target is a mesh axis, a tuple of mesh axes or None (replicated), e.g. `(('vocab', None),)`"),
    (('mesh.memory_limit_gib',),
     "memory per device the train step must fit, checked (and logged with argument / output / temp bytes) after compiling it, before the first step; None: the device's own limit (none on CPU: no check)"),
    (('distributed.initialize',),
     "start `jax.distributed`: `auto` (when a coordinator is given, or the platform announces several processes: a multi-host TPU VM slice, SLURM, mpirun), `always` or `never`"),
    (('distributed.coordinator', 'distributed.num_processes',
      'distributed.process_id'),
     "an explicit cluster: process 0's `host:port`, the number of processes and this process's index (all three or none)"),
    (('distributed.check_every',),
     'steps between checks that every process holds the same sampler state (a digest compared across processes; 0: never)'),
)

START = '<!-- config-reference:start (python -m jaxgrpo.config_doc --write) -->'
END = '<!-- config-reference:end -->'
README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'docs', 'configuration.md')  # the page with the table


def _leaves(config, prefix: str = '') -> dict[str, object]:
  """Flat 'section.key' -> default of a ConfigDict, in definition order."""
  out = {}
  for key, value in config.items():
    name = f'{prefix}{key}'
    if hasattr(value, 'items') and key != 'datasets':
      out.update(_leaves(value, name + '.'))
    else:
      out[name] = value
  return out


def defaults() -> dict[str, object]:
  """Every key of `configs.common.base_config()` with its default."""
  from configs import common  # pylint: disable=g-import-not-at-top
  return _leaves(common.base_config())


def _show(value) -> str:
  if isinstance(value, str):
    return f'`{value}`'
  if isinstance(value, (list, tuple)) and not value:
    return '`()`'
  if isinstance(value, list):
    return 'one arithmetic dataset' if len(value) == 1 else f'{len(value)} datasets'
  return str(value)


def check_rows(keys: dict[str, object]) -> None:
  """Raises ValueError unless every key has exactly one row, and every row
  names real keys."""
  seen: dict[str, int] = {}
  for i, (names, _) in enumerate(ROWS):
    for name in names:
      if name not in keys:
        raise ValueError(f'config_doc.ROWS[{i}] names {name!r}, which '
                         'configs/common.py:base_config does not define')
      if name in seen:
        raise ValueError(f'{name!r} is in rows {seen[name]} and {i}')
      seen[name] = i
  missing = [k for k in keys if k not in seen]
  if missing:
    raise ValueError(f'config keys without a row in jaxgrpo/config_doc.py '
                     f'ROWS: {missing}; add their meaning there')


def table() -> str:
  """The markdown table: one row per ROWS entry, in ROWS order."""
  keys = defaults()
  check_rows(keys)
  lines = ['| key | default | meaning |', '| --- | --- | --- |']
  for names, meaning in ROWS:
    key = ', '.join(f'`{n}`' for n in names)
    default = ', '.join(_show(keys[n]) for n in names)
    lines.append(f'| {key} | {default} | {meaning} |')
  return '\n'.join(lines)


def replace_in(text: str, new_table: str) -> str:
  """`text` with the table between the markers replaced."""
  if START not in text or END not in text:
    raise ValueError(f'the page has no {START!r} ... {END!r} markers')
  head, rest = text.split(START, 1)
  _, tail = rest.split(END, 1)
  return f'{head}{START}\n{new_table}\n{END}{tail}'


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog='python -m jaxgrpo.config_doc')
  parser.add_argument('--write', action='store_true',
                      help='rewrite the table in docs/configuration.md')
  parser.add_argument('--readme', default=README)
  args = parser.parse_args(argv)
  try:
    new_table = table()
  except ValueError as e:
    print(f'config_doc: error: {e}', file=sys.stderr)
    return 1
  if not args.write:
    print(new_table)
    return 0
  with open(args.readme, encoding='utf-8') as f:
    text = f.read()
  with open(args.readme, 'w', encoding='utf-8') as f:
    f.write(replace_in(text, new_table))
  print(f'wrote the configuration table of {args.readme}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
