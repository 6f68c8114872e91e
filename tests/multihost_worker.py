"""One process of a localhost jax.distributed job (run by test_multihost).

  python -m tests.multihost_worker MODE PROCESS_ID NUM_PROCESSES PORT OUT \
      [OVERRIDES]

Each process writes OUT/process-<id>.json with what the test compares.
MODE `train_one_process` runs the `train` job in one process over
NUM_PROCESSES forced CPU devices instead, for comparison. OVERRIDES, a JSON
object of dotted config keys and values (e.g. {"rollout.slots": 6}), is
applied to the `train` job's config after its own settings. MODE
`uneven_devices` starts process 0 on 3 CPU devices and the others on 1.
"""

import json
import os
import sys
import types


def primitives(out: dict) -> None:
  """Row ownership, gathering and the drift check across processes."""
  # pylint: disable=g-import-not-at-top
  import jax
  import numpy as np
  from jaxgrpo import errors
  from jaxgrpo import multihost
  from jaxgrpo import preemption
  from jaxgrpo import resume
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
  # A signal that reached one process only stops every process.
  stop = preemption.StopRequest()
  out['no_signal'] = stop.agree()
  stop.signal = 'SIGTERM' if jax.process_index() == 1 else None
  out['agreed_signal'] = stop.agree()
  # An on_step callback's stop on one process (info.stop()) stops every one.
  asked = preemption.StopRequest()
  if jax.process_index() == 0:
    asked.request('on_step')
  out['agreed_request'] = asked.agree()
  try:
    stop.check('while testing')
  except preemption.Stopped as e:
    out['stopped'] = str(e)
  # A config key that differs is named; the chosen checkpoints compared.
  config = {'config': {'seed': jax.process_index(), 'distributed': {
      'process_id': jax.process_index()}}, 'datasets': {'d': 1}}
  multihost.check_same_run({**config, 'config': {'distributed': {
      'process_id': jax.process_index()}}})
  try:
    multihost.check_same_run(config)
  except multihost.HostDriftError as e:
    out['run_differs'] = str(e)
  # Which collectives run: a process checking at other steps stopped with
  # a false 'sampler state differs', the other in a gloo abort.
  try:
    multihost.check_same_run({'config': {'distributed': {
        'process_id': jax.process_index(),
        'check_every': 10 * (1 + jax.process_index())}}})
  except multihost.HostDriftError as e:
    out['check_every_differs'] = str(e)
  out['lost'] = str(multihost.lost_contact(ValueError(
      'UNKNOWN: Gloo AllGather failed: [pair.cc:538] Read error: Connection '
      'reset by peer')))
  out['not_lost'] = multihost.lost_contact(ValueError('a bug'))
  try:  # process 0 would resume from step 4, process 1 from step 2
    resume._check_same_choice(  # pylint: disable=protected-access
        types.SimpleNamespace(directory='W'), 4 - 2 * jax.process_index())
  except errors.ResumeError as e:
    out['resume_differs'] = str(e)


def train(out: dict, workdir: str, overrides: dict) -> None:
  """Two GRPO steps of the demo's runlocal config, all processes together,
  then a resume for a third."""
  # pylint: disable=g-import-not-at-top
  import jax
  from jaxgrpo import multihost
  from jaxgrpo import train as train_lib
  from tests import flaky_verifiers
  c = flaky_verifiers.informative_demo_config()  # every step updates
  c.total_steps = 2
  c.distributed.check_every = 1
  c.rollout.round_size = 3  # padded to the 2 batch devices
  c.plots = False
  c.update_from_flattened_dict(overrides)
  lines, steps = [], []

  def on_step(info) -> None:
    params = jax.tree.map(multihost.to_host, info.state.params)
    steps.append({
        'step': info.step,
        'loss': info.metrics.get('train/loss'),
        'reward': info.metrics.get('reward/mean'),
        'prompts': info.metrics.get('rollout/prompts_generated'),
        'discarded': info.metrics.get('rollout/groups_discarded'),
        'occupancy': info.metrics.get('rollout/slot_occupancy'),
        'params': multihost.digest(params).hex(),
        'sampler': multihost.digest(info.sampler_state()).hex(),
    })

  summary = train_lib.run(c, workdir, log=lines.append, on_step=on_step)
  # Resuming restores each process's part of the checkpoint.
  c.total_steps = 3
  resumed = train_lib.run(c, workdir, log=lines.append, on_step=on_step)
  out['resumed_from'] = resumed.resumed_from
  out['steps_seen'] = steps
  out['log'] = lines
  out['steps'] = summary.steps
  out['prompts_generated'] = summary.cum_prompts_generated


def main(argv: list[str]) -> None:
  mode, pid, n, port, out_dir = argv[1:6]
  overrides = json.loads(argv[6]) if len(argv) > 6 else {}
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  out = {}
  if mode == 'train_one_process':
    # The same job in one process over as many devices.
    os.environ['XLA_FLAGS'] = f'--xla_force_host_platform_device_count={n}'
    mode = 'train'
  else:
    if mode == 'uneven_devices' and pid == '0':  # 3 devices, the other 1
      os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=3'
    # pylint: disable-next=g-import-not-at-top
    from jaxgrpo import errors, multihost
    try:
      multihost.initialize('always', coordinator=f'localhost:{port}',
                           num_processes=int(n), process_id=int(pid),
                           log=lambda _: None)
    except errors.ConfigError as e:
      out['error'] = str(e)
  if mode == 'train' and isinstance(overrides, list):
    # Several jobs one after the other, in the same processes.
    out['jobs'] = []
    for i, job in enumerate(overrides):
      out['jobs'].append({})
      train(out['jobs'][-1], os.path.join(out_dir, f'workdir{i}'), job)
  elif mode == 'train':
    train(out, os.path.join(out_dir, 'workdir'), overrides)
  elif mode == 'primitives':
    primitives(out)
  with open(os.path.join(out_dir, f'process-{pid}.json'), 'w') as f:
    json.dump(out, f)


if __name__ == '__main__':
  main(sys.argv)
