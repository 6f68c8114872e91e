r"""Word problems and grounded QA with refusal, in one balanced mixture.

Two datasets, weight 0.5 each: GSM8K-format word problems scored by the
`math` verifier, and SQuAD 2.0 questions scored by the `qa` verifier (exact
match against any gold answer, or 1 for a refusal of an unanswerable one).
Rewards and held-out accuracy of SQuAD are also reported per subset
(`.../squad2/answerable`, `.../squad2/unanswerable`).

`post_filter` gives each dataset half of every batch, so the dataset whose
groups are dropped more often does not shrink in it; a dataset that cannot
fill its half hands the slots to the other (`data/handover_*`). `snooze`
skips mastered examples for N=5 epochs and then checks them again, so
refusals learned early are not forgotten the way `filter` forgets them
(docs/results.md, "Conflicting tasks").

By default the model is the tiny byte-level preset trained from scratch, on
`configs/data/word_problems.jsonl` (1,200 problems, 200 held out) and the
SQuAD 2.0 file in `../shared/data/squad2/`: 100 steps on a CPU that show
the mixture's machinery more than they teach. The model learns to refuse;
answers and word problems stay out of its reach (its warm start stops once
refusals alone reach the target pass rate). `path=` gives a pretrained
Hugging Face directory instead, with its tokenizer, the formats' own prompt
templates and accelerator sizes (the continuous engine in 256 slots,
streaming collection); point `gsm8k=` at GSM8K's own train.jsonl then.
Nothing is downloaded.

`:runlocal` is a 2-step smoke run of the pipeline: its 20-step warm start
leaves the model without reward, so both steps skip their update.

  python -m jaxgrpo.main --config=configs/qa_mixture.py --workdir=runs/qa_mix
  python -m jaxgrpo.main --config=configs/qa_mixture.py:runlocal --workdir=/tmp/qa
  python -m jaxgrpo.main --workdir=runs/qa_qwen \
      --config=configs/qa_mixture.py:path=/data/qwen,gsm8k=/data/gsm8k/train.jsonl \
      --config.mesh.fsdp=8
"""

import os

from jaxgrpo import configs
from jaxgrpo.configs import common

HERE = os.path.dirname(os.path.abspath(__file__))
WORD_PROBLEMS = os.path.join(HERE, 'data', 'word_problems.jsonl')
SQUAD2 = configs.shared_data('squad2', 'cs224n-dev-v2.0.json')


def get_config(arg: str | None = None):
  args = common.parse_arg(arg, runlocal=False, path='', gsm8k=WORD_PROBLEMS,
                          squad=SQUAD2, metric='exact')
  c = common.base_config()
  c.total_steps = 300
  c.data.balance = 'post_filter'
  word_problems = dict(name='word_problems', kind='gsm8k', path=args.gsm8k,
                       weight=0.5, holdout=200, num_eval=128,
                       verifier='math')
  squad = dict(name='squad2', kind='squad2', path=args.squad, weight=0.5,
               holdout=256, num_eval=256,
               verifier={'name': 'qa', 'metric': args.metric})
  c.sampler.policy = 'snooze'
  c.sampler.snooze_factor = 5
  c.rollout.long_prompts = 'truncate'  # left truncation keeps the question
  c.eval.every = 50
  if args.path:
    c.model.path = args.path
    c.model.dtype = 'bfloat16'
    c.warmstart.enabled = False
    c.rollout.batch_size = 64
    c.rollout.group_size = 16
    c.rollout.round_size = 'adaptive'
    c.rollout.max_round_size = 512
    c.rollout.max_prompt_len = 1024  # SQuAD contexts run to 629 words
    c.rollout.max_new_tokens = 512
    c.rollout.update(engine='continuous', slots=256, collect='streaming',
                     in_flight='retry')
    c.rl.loss_agg = 'seq_mean_token_mean'
    c.rl.num_minibatches = 4
    c.optim.learning_rate = 1e-6
    c.optim.warmup_steps = 20
    c.optim.weight_decay = 0.01
    c.eval.num_samples = 1
    c.eval.temperature = 0.0
    c.checkpoint.every = 25
    c.checkpoint.every_minutes = 15.0
    c.verify.workers = 8
  else:
    # Refusals are learned within ~50 steps and answers stay out of reach:
    # by step 100 almost every group scores all the same.
    c.total_steps = 100
    c.model.tokenizer = 'byte'
    # Short prompts for a small model: it answers right away, and reads the
    # end of the context (kept by left truncation) before the question.
    word_problems.update(template='{question}\n#### ',
                         verifier={'name': 'math', 'fallback': 'last_number'})
    squad.update(template='{context}\nQ: {question}\nA: ')
    c.rollout.max_prompt_len = 192
    c.rollout.max_new_tokens = 32
    c.warmstart.target_pass_rate = 0.2
  c.data.datasets = [word_problems, squad]
  if args.runlocal:
    common.shrink_for_runlocal(c)
  return c
