r"""Template: GRPO on GSM8K from a Qwen2.5 checkpoint directory, for a TPU VM.

Give the Hugging Face checkpoint directory (config.json, *.safetensors,
tokenizer.json) and the folder holding GSM8K's train.jsonl and test.jsonl
(or that train.jsonl); nothing is downloaded:

  python -m jaxgrpo.main --workdir=runs/qwen25_gsm8k \
      --config=configs/qwen25_gsm8k.py:path=/data/Qwen2.5-0.5B-Instruct,gsm8k=/data/gsm8k

Add `,runlocal` to check the whole path first (model, files, chat
template, verifier, engine, checkpoints) in a 2-step run of 4 prompts x 4
samples of at most 32 new tokens (a short step updates too), evaluated on
16 held-out problems.
`path` is required (`--config.model.path=...` gives it too); without it
the run stops at once, naming `model.path`.

Prompts go through the model's chat template; the `math` verifier reads
`#### x`, `\boxed{x}` or "the answer is x". Params stay f32 and compute runs
in bf16; snoozing N=5 skips problems the model solves in every sample.
Completions of 50-512 tokens are decoded by the continuous engine in 256
slots and collected by streaming (a step ends at B informative groups),
which BENCHMARKS.md measures faster than static rounds at GSM8K's lengths;
groups still decoding then are retried at the next step.
"""

import os

from ml_collections import config_dict

from jaxgrpo import configs
from jaxgrpo.configs import common


def get_config(arg: str | None = None):
  args = common.parse_arg(arg, path='', gsm8k='', runlocal=False)
  c = common.base_config()
  c.model.path = args.path or config_dict.required_placeholder(str)
  c.model.dtype = 'bfloat16'
  c.warmstart.enabled = False
  gsm8k = os.path.expanduser(args.gsm8k or configs.shared_data('gsm8k'))
  # The folder, or its train.jsonl (as qa_mixture.py takes it).
  train = gsm8k if gsm8k.endswith('.jsonl') else os.path.join(
      gsm8k, 'train.jsonl')
  c.data.datasets = [
      dict(name='gsm8k', kind='gsm8k', path=train,
           eval_path=os.path.join(os.path.dirname(train), 'test.jsonl'),
           num_eval=1319,
           verifier='math'),
  ]
  c.sampler.policy = 'snooze'
  c.sampler.snooze_factor = 5
  c.rollout.batch_size = 64
  c.rollout.group_size = 16
  c.rollout.round_size = 'adaptive'
  c.rollout.max_round_size = 512
  c.rollout.max_prompt_len = 384
  c.rollout.long_prompts = 'truncate'
  c.rollout.max_new_tokens = 512
  c.rollout.temperature = 1.0
  c.rollout.engine = 'continuous'
  c.rollout.slots = 256
  c.rollout.collect = 'streaming'
  # Groups still decoding when a batch fills are dropped and their prompts
  # go first next step: every drawn problem is scored, updates on-policy.
  c.rollout.in_flight = 'retry'
  c.rl.loss_agg = 'seq_mean_token_mean'
  c.rl.num_minibatches = 4
  c.optim.learning_rate = 1e-6
  c.optim.warmup_steps = 20
  c.optim.weight_decay = 0.01
  c.total_steps = 500
  c.eval.every = 50
  c.eval.num_samples = 1
  c.eval.temperature = 0.0
  c.checkpoint.every = 25
  c.checkpoint.every_minutes = 15.0
  c.verify.workers = 8
  if args.runlocal:
    common.shrink_for_runlocal(c)
    # Short steps update too, so that the train step runs.
    c.rollout.update(max_new_tokens=32, slots=16, short_batch='train')
    c.verify.workers = 2
  return c
