r"""The default run: GRPO on built-in arithmetic with a tiny model, on a CPU.

A 0.50M-parameter decoder learns 1-2 digit sums without carries (2,000
training problems). A supervised warm start brings its sampled pass rate on
training prompts to 0.8; GRPO then masters the training problems within
100 steps while held-out accuracy (greedy, 1,024 problems that are not
training prompts) climbs. These are the settings of the `memorise`
experiment of docs/results.md (section 8): the training set is most of the
problem space, the model memorises it, and from then on almost every
dropped group is too easy, so the sampler's saving is at its largest. In
section 1's regime, where the model has to generalise, it is smaller
(docs/results.md, section 3). The sampler
snoozes a problem found too easy for N=3 epochs of the dataset instead of
generating it every epoch.

  python -m jaxgrpo.main --config=configs/demo.py --workdir=/tmp/jaxgrpo_demo
  python -m jaxgrpo.main --config=configs/demo.py:runlocal --workdir=/tmp/smoke
  jaxgrpo-train --workdir=/tmp/jaxgrpo_none --config.sampler.policy=none
"""

from jaxgrpo.configs import common


def regime(c) -> None:
  """The settings of docs/results.md's `memorise` experiment
  (scripts/reproduce.py)."""
  c.data.datasets = [common.arithmetic_dataset(
      'arithmetic', min_digits=1, max_digits=2, carries='none',
      num_train=2000, num_eval=1024)]
  c.warmstart.target_pass_rate = 0.8
  c.warmstart.check_examples = 128
  c.rollout.round_size = 64
  c.rollout.max_rounds = 128
  c.eval.temperature = 0.0
  c.eval.num_samples = 1


def get_config(arg: str | None = None):
  args = common.parse_arg(arg, runlocal=False)
  c = common.base_config()
  regime(c)
  c.total_steps = 100
  c.eval.every = 25
  c.sampler.policy = 'snooze'
  c.sampler.snooze_factor = 3
  if args.runlocal:
    common.shrink_for_runlocal(c)
  return c
