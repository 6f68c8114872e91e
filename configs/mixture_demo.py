r"""Two built-in datasets of different difficulty, sampled with snoozing.

`easy` (1-2 digit addition without carries) is mastered early; `hard`
(3-digit addition with carries) stays mixed for long. With `snooze`, easy
examples whose G samples are all right sleep for N=5 epochs of their dataset
instead of being regenerated every epoch, and `post_filter` keeps each
dataset's share of the batch at its weight. The console shows the batch
shares and how many examples of each dataset are asleep.

  python -m jaxgrpo.main --config=configs/mixture_demo.py --workdir=runs/mixture
  python -m jaxgrpo.main --config=configs/mixture_demo.py:runlocal --workdir=/tmp/mix
  python -m jaxgrpo.main --config=configs/mixture_demo.py --workdir=runs/mix_pre \
      --config.data.balance=pre_filter --config.sampler.policy=none
"""

from configs import common


def get_config(arg: str | None = None):
  args = common.parse_arg(arg, runlocal=False)
  c = common.base_config()
  c.total_steps = 300
  # Small datasets so that each sees many epochs within the run: snoozing
  # counts in epochs of the example's own dataset.
  c.data.balance = 'post_filter'
  c.data.datasets = [
      common.arithmetic_dataset(
          'easy', weight=0.5, min_digits=1, max_digits=2, carries='none',
          num_train=400, num_eval=128, seed=1),
      common.arithmetic_dataset(
          'hard', weight=0.5, min_digits=3, max_digits=3, carries='required',
          num_train=400, num_eval=128, seed=2),
  ]
  c.sampler.policy = 'snooze'
  c.sampler.snooze_factor = 5
  c.eval.every = 100
  if args.runlocal:
    common.shrink_for_runlocal(c)
  return c
