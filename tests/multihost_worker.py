"""One process of a localhost jax.distributed job (run by test_multihost).

  python -m tests.multihost_worker MODE PROCESS_ID NUM_PROCESSES PORT OUT

Each process writes OUT/process-<id>.json with what the test compares.
"""

import json
import os
import sys


def primitives(out: dict) -> None:
  """Row ownership, gathering and the drift check across processes."""
  # pylint: disable=g-import-not-at-top
  import jax
  import numpy as np
  from jaxgrpo import multihost
  from jaxgrpo import sharding
  mesh = sharding.make_mesh(data=-1)
  with sharding.use_mesh(mesh):
    host = np.arange(8 * 3).reshape(8, 3)
    arr = sharding.to_global(host, sharding.batch_sharding(2))
  rows = multihost.owned_rows(arr)
  out['owned'] = rows.tolist()
  out['local_first_column'] = multihost.local_rows(arr, rows)[:, 0].tolist()
  out['to_host_sum'] = int(multihost.to_host(jax.jit(lambda x: 2 * x)(arr)).sum())
  v = np.zeros(8)
  v[rows] = rows + 1
  out['summed'] = multihost.sum_over_processes(v).tolist()
  multihost.check_agree(multihost.digest({'a': np.arange(3)}), what='same',
                        step=1)
  try:
    multihost.check_agree(
        multihost.digest({'a': np.arange(3) + jax.process_index()}),
        what='sampler state', step=2)
    out['drift_error'] = None
  except multihost.HostDriftError as e:
    out['drift_error'] = str(e)


def main(argv: list[str]) -> None:
  mode, pid, n, port, out_dir = argv[1:6]
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  # pylint: disable-next=g-import-not-at-top
  from jaxgrpo import multihost
  multihost.initialize('always', coordinator=f'localhost:{port}',
                       num_processes=int(n), process_id=int(pid),
                       log=lambda _: None)
  out = {}
  {'primitives': primitives}[mode](out)
  with open(os.path.join(out_dir, f'process-{pid}.json'), 'w') as f:
    json.dump(out, f)


if __name__ == '__main__':
  main(sys.argv)
