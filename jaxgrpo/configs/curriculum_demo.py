r"""GRPO with an offline difficulty curriculum over stratified data.

Before training, `jaxgrpo-stratify` measures each training problem's pass
rate under the demo's warm-started model (docs/sampler.md "Stratification
and curriculum"); this config reads the result from `curriculum.strata` and
trains with three stages:

  steps 0-149    problems the starting model never solves (too_hard) are
                 postponed; every other stratum is offered as usual;
  steps 150-299  everything is offered;
  steps 300-     problems the starting model always solved (too_easy) are
                 dropped.

The `weighted` policy starts each problem's pass-rate estimate from its
measured rate. Each stratum's batch share is in metrics.jsonl as
`data/batch_share/arithmetic/<stratum>`.

  python -m jaxgrpo.main --config=configs/curriculum_demo.py:measure \
      --workdir=runs/warm --config.total_steps=0
  jaxgrpo-stratify run --config=configs/curriculum_demo.py:measure \
      --checkpoint=runs/warm --out=runs/strata --k=8
  python -m jaxgrpo.main --config=configs/curriculum_demo.py \
      --config.curriculum.strata=runs/strata --workdir=runs/curriculum
  python -m jaxgrpo.main --config=configs/curriculum_demo.py:runlocal ...

`:measure` is the same run without strata or stages: the model and data that
steps 1 and 2 measure (20,000 1-3 digit sums, warm start to a sampled pass
rate of 0.3); `:measure,runlocal` is its 2-step CPU smoke run.
"""

from jaxgrpo.configs import common


def get_config(arg: str | None = None):
  args = common.parse_arg(arg, runlocal=False, measure=False)
  c = common.base_config()
  c.total_steps = 500
  c.eval.every = 100
  c.sampler.policy = 'weighted'
  c.curriculum.strata = 'runs/strata'
  c.curriculum.stages = (
      {'step': 0, 'weights': {'too_hard': 0.0}},
      {'step': 150, 'weights': {}},
      {'step': 300, 'weights': {'too_easy': 0.0}},
  )
  if args.measure:
    c.curriculum.strata = None
    c.curriculum.stages = ()
  if args.runlocal:
    common.shrink_for_runlocal(c)
    if not args.measure:  # `measure,runlocal`: a small run to measure
      # A stage per step of the 2-step run.
      c.curriculum.stages = (
          {'step': 1, 'weights': {'too_hard': 0.0}},
          {'step': 2, 'weights': {'too_easy': 0.0}},
      )
  return c
