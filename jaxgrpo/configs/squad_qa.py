r"""Grounded QA with refusal on SQuAD 2.0: answer from the context, or refuse.

Reads the SQuAD 2.0 JSON file as shipped (`../shared/data/squad2/` holds
the CS224N half of the official dev set: 2,910 answerable and 3,168
unanswerable questions) and scores with the `qa` verifier: an answerable
question earns normalised exact match (`metric=f1` for token F1) against
any gold answer, an unanswerable one earns 1 only for a refusal such as
"unanswerable". Rewards and held-out accuracy are reported per subset
(`.../squad2/answerable`, `.../squad2/unanswerable`).

The tiny byte-level model trained from scratch learns to refuse long before
it learns to answer, which is the conflict the sampler's balancing is for;
give it a real checkpoint for real answers.

  python -m jaxgrpo.main --config=configs/squad_qa.py --workdir=runs/squad
  python -m jaxgrpo.main --config=configs/squad_qa.py:runlocal --workdir=/tmp/sq
  python -m jaxgrpo.main --config=configs/squad_qa.py:path=/data/train-v2.0.json,metric=f1 \
      --workdir=runs/squad_f1
"""

from jaxgrpo import configs
from jaxgrpo.configs import common

SQUAD2 = configs.shared_data('squad2', 'cs224n-dev-v2.0.json')


def get_config(arg: str | None = None):
  args = common.parse_arg(arg, runlocal=False, path=SQUAD2, metric='exact')
  c = common.base_config()
  c.total_steps = 200
  c.model.tokenizer = 'byte'
  c.data.datasets = [
      dict(name='squad2', kind='squad2', path=args.path, holdout=256,
           num_eval=256,
           # Short prompts for a small model: the question, then the
           # context's end (left truncation keeps the end).
           template='{context}\nQ: {question}\nA: ',
           verifier={'name': 'qa', 'metric': args.metric}),
  ]
  c.sampler.policy = 'snooze'
  c.rollout.max_prompt_len = 192
  c.rollout.long_prompts = 'truncate'
  c.rollout.max_new_tokens = 32
  c.eval.every = 50
  c.warmstart.target_pass_rate = 0.2
  if args.runlocal:
    common.shrink_for_runlocal(c)
  return c
