r"""Two built-in datasets of different difficulty, sampled with snoozing.

`easy` (1-2 digit sums without carries) is mastered first; `hard` (2-digit
sums with carries) later. In the regime of configs/demo.py (warm start to
a sampled pass rate of 0.8, rounds of 64 prompts), `snooze` puts easy
examples whose G samples are all right to sleep for N=3 epochs of their
dataset, and `post_filter` keeps each dataset's share of the batch at its
weight. The console shows the batch shares and how many examples of each
dataset are asleep. docs/results.md (section 4) runs the same pair under
plain dynamic sampling, pre_filter against post_filter.

  python -m jaxgrpo.main --config=configs/mixture_demo.py --workdir=runs/mixture
  python -m jaxgrpo.main --config=configs/mixture_demo.py:runlocal --workdir=/tmp/mix
  python -m jaxgrpo.main --config=configs/mixture_demo.py --workdir=runs/mix_pre \
      --config.data.balance=pre_filter --config.sampler.policy=none
"""

from jaxgrpo.configs import common
from jaxgrpo.configs import demo


def get_config(arg: str | None = None):
  args = common.parse_arg(arg, runlocal=False)
  c = common.base_config()
  demo.regime(c)
  c.total_steps = 150
  c.eval.every = 25
  c.data.balance = 'post_filter'
  c.data.datasets = [
      common.arithmetic_dataset(
          'easy', weight=0.5, min_digits=1, max_digits=2, carries='none',
          num_train=1000, num_eval=512, seed=1),
      common.arithmetic_dataset(
          'hard', weight=0.5, min_digits=2, max_digits=2,
          carries='required', num_train=1000, num_eval=512, seed=2),
  ]
  c.sampler.policy = 'snooze'
  c.sampler.snooze_factor = 3
  if args.runlocal:
    common.shrink_for_runlocal(c)
    # 20 warm-start steps leave every group too hard, so that neither step
    # took an update; 100 take the model to a sampled reward near 0.4.
    c.warmstart.max_steps = 100
  return c
