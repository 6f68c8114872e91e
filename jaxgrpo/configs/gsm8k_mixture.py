r"""A mixture of the built-in arithmetic task and a GSM8K-format file.

The second dataset is read by the GSM8K reader and scored by the `math`
verifier (final-answer extraction and numeric normalisation), the first by
exact match. By default the file is `configs/data/word_problems.jsonl`:
1,200 arithmetic word problems in GSM8K's format that the tiny model can
learn on a CPU (200 of them held out). Point `gsm8k=` at GSM8K's own
`train.jsonl` to train on it (a model trained from scratch will not solve
it; the run shows the plumbing, the rewards stay near 0). Prompts are bytes
(`model.tokenizer='byte'`), so any text fits.

`:runlocal` is a 2-step smoke run of the pipeline: its 20-step warm start
leaves the model without reward, so both steps skip their update.

  python -m jaxgrpo.main --config=configs/gsm8k_mixture.py --workdir=runs/gsm8k_mix
  python -m jaxgrpo.main --config=configs/gsm8k_mixture.py:runlocal --workdir=/tmp/gm
  python -m jaxgrpo.main --workdir=runs/gsm8k_real \
      --config=configs/gsm8k_mixture.py:gsm8k=../shared/data/gsm8k/train.jsonl
"""

import os

from jaxgrpo.configs import common

WORD_PROBLEMS = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                             'data', 'word_problems.jsonl')


def get_config(arg: str | None = None):
  args = common.parse_arg(arg, runlocal=False, gsm8k=WORD_PROBLEMS)
  c = common.base_config()
  c.total_steps = 300
  c.model.tokenizer = 'byte'
  c.data.balance = 'post_filter'
  c.data.datasets = [
      common.arithmetic_dataset('arithmetic', weight=0.5, num_train=2000,
                                num_eval=128),
      dict(name='gsm8k', kind='gsm8k', path=args.gsm8k, weight=0.5,
           holdout=200, num_eval=128,
           # The tiny model answers with the number right away.
           template='{question}\n#### ',
           verifier={'name': 'math', 'fallback': 'last_number'}),
  ]
  c.sampler.policy = 'snooze'
  c.rollout.max_prompt_len = 80
  c.rollout.long_prompts = 'truncate'  # GSM8K's own questions run longer
  c.rollout.max_new_tokens = 8
  c.eval.every = 50
  if args.runlocal:
    common.shrink_for_runlocal(c)
  return c
