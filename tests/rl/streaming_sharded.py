"""A streaming train run on a 4-device CPU mesh (data=4), slots=6.

Run by tests/rl/test_streaming.py in a subprocess, because the device count
is fixed when jax is imported:

  python tests/rl/streaming_sharded.py WORKDIR

The test runs `config()` again on one device and compares the metrics: the
slot rows are padded from 6 to 8 on the mesh, and the two idle rows must
change nothing that is collected.
"""

import os
import sys

if __name__ == '__main__':
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '')
                             + ' --xla_force_host_platform_device_count=4')
  os.environ['JAX_PLATFORMS'] = 'cpu'
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from tests import flaky_verifiers


def config(data: int = 1):
  """The demo's 2-step run, streamed through 6 slots on `data` devices."""
  c = flaky_verifiers.informative_demo_config()
  c.plots = False
  c.mesh.data = data
  c.rollout.update(engine='continuous', collect='streaming', slots=6,
                   max_rounds=4, surplus='drop')  # every step streams
  return c


def main(workdir: str) -> None:
  from jaxgrpo import train
  train.run(config(data=4), workdir, log=print)


if __name__ == '__main__':
  main(sys.argv[1])
