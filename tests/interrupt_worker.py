"""A run whose main thread is busy in a device computation at a Ctrl-C
(run by test_resume).

  python -m tests.interrupt_worker WORKDIR

Step 1's `on_step` sends the process SIGINT (the first Ctrl-C: stop at the
end of the step), prints `busy` and waits for a jitted computation that
takes minutes, as a large model's step does; the test sends the second
Ctrl-C. `on_quit` prints `quit: <steps saved>`.
"""

import os
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo import checkpoint
from jaxgrpo import train
from tests import test_train


@jax.jit
def minutes_of_work(x):
  """A computation that takes minutes, as a large model's step does (the
  sweep's Ctrl-C test in test_reproduce waits on it too)."""
  return jax.lax.fori_loop(0, 1_000_000, lambda i, a: jnp.tanh(a @ a), x)


def output_within(proc: subprocess.Popen, seconds: float) -> tuple[str, str]:
  """`proc`'s (stdout, stderr) once it exits, killed after `seconds`."""
  try:
    return proc.communicate(timeout=seconds)
  except subprocess.TimeoutExpired:
    proc.kill()
    return proc.communicate()


def main(workdir: str) -> None:
  def on_step(info):
    if info.step == 1:
      os.kill(os.getpid(), signal.SIGINT)
      busy = minutes_of_work(jnp.full((256, 256), 1e-3))
      print('busy', flush=True)
      np.asarray(busy)  # Python's handlers run once this returns
      print('the computation ended', flush=True)

  def on_quit():
    steps = checkpoint.saved_steps(os.path.join(workdir, 'checkpoints'))
    print(f'quit: {steps}', flush=True)

  train.run(test_train._config(  # pylint: disable=protected-access
      total_steps=3, **{'eval.every': 0, 'checkpoint.every': 1}),
            workdir, on_step=on_step, on_quit=on_quit)


if __name__ == '__main__':
  main(sys.argv[1])
