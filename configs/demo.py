r"""The default run: GRPO on built-in arithmetic with a tiny model, on a CPU.

A 0.50M-parameter decoder learns `a+b` with 1-3 digit operands. A short
supervised warm start brings its pass rates into the mixed range where GRPO
has signal; GRPO then raises the reward within a few minutes on 2 CPU cores.

  python -m jaxgrpo.main --config=configs/demo.py --workdir=/tmp/jaxgrpo_demo
  python -m jaxgrpo.main --config=configs/demo.py:runlocal --workdir=/tmp/smoke
  jaxgrpo-train --workdir=/tmp/jaxgrpo_demo --config.rollout.group_size=4
"""

from configs import common


def get_config(arg: str | None = None):
  args = common.parse_arg(arg, runlocal=False)
  c = common.base_config()
  c.total_steps = 500
  c.eval.every = 100
  if args.runlocal:
    common.shrink_for_runlocal(c)
  return c
