"""Tests for the orbax checkpointer."""

import asyncio
import gc
import logging
import os
import subprocess
import sys
import types

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import tensorstore as ts

from jaxgrpo import checkpoint
from jaxgrpo import orbax_patch
from jaxgrpo import optimizer as optimizer_lib
from jaxgrpo import train_state as train_state_lib


class CheckpointTest(absltest.TestCase):

  def test_round_trip_with_relative_directory(self):
    tmp = self.create_tempdir().full_path
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
      ckpt = checkpoint.Checkpointer('run/checkpoints', every=2, max_to_keep=2)
      state = {'w': jnp.arange(6.0).reshape(2, 3), 'step': jnp.int32(4)}
      data = {'source': {'epoch': 3, 'trials': np.arange(5, dtype=np.int32)}}
      ckpt.save(4, state, data, {'note': 'x'})
      ckpt.wait()
      self.assertEqual(ckpt.latest_step(), 4)
      target = jax.tree.map(jnp.zeros_like, state)
      restored = ckpt.restore(4, target)
      ckpt.close()
    finally:
      os.chdir(cwd)
    np.testing.assert_array_equal(restored.state['w'], state['w'])
    self.assertEqual(int(restored.data['source']['epoch']), 3)
    np.testing.assert_array_equal(restored.data['source']['trials'],
                                  np.arange(5))
    self.assertEqual(restored.meta, {'note': 'x'})
    self.assertTrue(ckpt.should_save(6))
    self.assertFalse(ckpt.should_save(5))

  def test_optimizer_state_with_skip_counters_restores(self):
    # Some earlier versions wrapped AdamW in optax.apply_if_finite, whose
    # state holds AdamW's inside skip counters.
    params = {'w': jnp.arange(6.0).reshape(2, 3)}
    optimizer = optimizer_lib.make_optimizer(
        learning_rate=0.1, warmup_steps=0, total_steps=10, max_grad_norm=1.0)
    state = train_state_lib.TrainState(
        step=jnp.zeros((), jnp.int32), params=params,
        opt_state=optimizer.init(params))
    updates, opt_state = optimizer.update({'w': jnp.ones((2, 3))},
                                          state.opt_state, params)
    state = state.replace(params=optax_apply(params, updates),
                          opt_state=opt_state)
    old = state.replace(opt_state=optax.ApplyIfFiniteState(
        notfinite_count=jnp.int32(0), last_finite=jnp.bool_(True),
        total_notfinite=jnp.int32(3), inner_state=state.opt_state))
    ckpt = checkpoint.Checkpointer(self.create_tempdir().full_path, every=1,
                                   max_to_keep=1)
    ckpt.save(1, old, {'x': np.zeros(1)}, {})
    ckpt.wait()
    target = train_state_lib.TrainState(
        step=jnp.zeros((), jnp.int32), params=params,
        opt_state=optimizer.init(params))
    restored = ckpt.restore(1, target).state
    ckpt.close()
    self.assertEqual(jax.tree.structure(restored.opt_state),
                     jax.tree.structure(target.opt_state))
    chex.assert_trees_all_equal(restored.opt_state,
                                jax.device_get(state.opt_state))
    chex.assert_trees_all_equal(restored.params, jax.device_get(state.params))
    # And a checkpoint of today's layout restores as saved.
    ckpt = checkpoint.Checkpointer(self.create_tempdir().full_path, every=1,
                                   max_to_keep=1)
    ckpt.save(1, state, {'x': np.zeros(1)}, {})
    ckpt.wait()
    restored = ckpt.restore(1, target).state
    ckpt.close()
    chex.assert_trees_all_equal(restored.opt_state,
                                jax.device_get(state.opt_state))

  def test_saves_leak_nothing(self):
    # tensorstore's collect_matching_metrics, which orbax called around each
    # item it saved, leaked what it returned: 24 lists per save, for ever.
    ckpt = checkpoint.Checkpointer(self.create_tempdir().full_path, every=1,
                                   max_to_keep=2)
    state = {'w': jnp.arange(6.0), 'step': jnp.int32(0)}
    data = {'source': {'trials': np.arange(5, dtype=np.int32)}}

    def lists_after_saves(steps):
      for step in steps:
        ckpt.save(step, state, data, {'note': 'x'})
        ckpt.wait()
      gc.collect()
      return sum(type(o) is list for o in gc.get_objects())

    # Orbax caches 32 paths, 2 a save: warmed up after 16 saves.
    before = lists_after_saves(range(17))
    after = lists_after_saves(range(17, 27))
    ckpt.close()
    self.assertLess(after - before, 10)  # 240 with the leak

  def test_raw_bytes_as_orbax_counted_them(self):
    self.assertEqual(orbax_patch.raw_bytes(), sum(
        v['value'] for m in ts.experimental_collect_matching_metrics(
            '/tensorstore/kvstore/') if m['name'].endswith('/bytes_written')
        for v in m['values']))
    path = self.create_tempdir().full_path
    before = orbax_patch.raw_bytes()
    store = ts.open({'driver': 'zarr', 'kvstore': {'driver': 'file',
                                                   'path': path}},
                    create=True, dtype=ts.float32, shape=[256]).result()
    store.write(np.ones(256, np.float32)).result()
    self.assertGreater(orbax_patch.raw_bytes(), before)

  def test_only_late_callbacks_to_a_closed_loop_are_dropped(self):
    # What tensorstore's threads do after orbax closed its loop: dropped.
    # The same error raised elsewhere, and other errors, are reported.
    loop = asyncio.new_event_loop()
    loop.close()
    def unraisable(call):
      try:
        call()
      except Exception as e:  # pylint: disable=broad-except
        return types.SimpleNamespace(exc_type=type(e), exc_value=e,
                                     exc_traceback=e.__traceback__,
                                     err_msg=None, object=None)
    def closed_elsewhere():
      raise RuntimeError('Event loop is closed')
    self.assertTrue(orbax_patch._late_callback(unraisable(  # pylint: disable=protected-access
        lambda: loop.call_soon_threadsafe(print))))
    for call in (closed_elsewhere, lambda: 1 / 0):
      self.assertFalse(orbax_patch._late_callback(unraisable(call)))  # pylint: disable=protected-access
    # jaxgrpo-train's main, run in this process by another test, wraps the
    # hook in its own (`unquiet`: the one it wrapped).
    hook = sys.unraisablehook
    while hasattr(hook, 'unquiet'):
      hook = hook.unquiet
    self.assertTrue(hook.drops_late_callbacks)

  def test_only_abandoned_tensorstore_reads_leave_asyncio_quiet(self):
    # Reads still in flight when a sibling's failure was raised end in
    # tasks no one awaits: asyncio logged each ('Task exception was never
    # retrieved', with its traceback) when the task was freed. Those are
    # dropped; any other task's error is still logged.
    def abandon(error):
      loop = asyncio.new_event_loop()
      async def read():
        raise error
      task = loop.create_task(read())
      loop.run_until_complete(asyncio.sleep(0))
      loop.close()
      del task
      gc.collect()
    # jaxgrpo-train's main, run in this process by another test, hides every
    # asyncio record for the command; here orbax_patch's filter acts alone.
    logger = logging.getLogger('asyncio')
    others = [f for f in logger.filters if f is not orbax_patch._keep]  # pylint: disable=protected-access
    for f in others:
      logger.removeFilter(f)
    self.addCleanup(lambda: [logger.addFilter(f) for f in others])
    with self.assertNoLogs('asyncio'):
      abandon(ValueError(
          'FAILED_PRECONDITION: Error reading "params.w/0.0" in OCDBT '
          'database at local file "/x/4/state/": Truncated Zstd-compressed '
          'stream; at byte 0'))
    for other in (ValueError('boom'), KeyError('FAILED_PRECONDITION: Error '
                                               'reading "a"')):
      with self.assertLogs('asyncio', 'ERROR') as logs:
        abandon(other)
      self.assertIn('Task exception was never retrieved', logs.output[0])

  def test_state_saved_over_more_devices_reads_here(self):
    # A run on 4 devices, read by jaxgrpo-export on 1: orbax refused it
    # without a target ("Topology mismatch detected").
    directory = self.create_tempdir().full_path
    script = '''
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from jaxgrpo import checkpoint
mesh = jax.make_mesh((2, 2), ("a", "b"))
w = jax.device_put(np.arange(24.0, dtype=np.float32).reshape(4, 6),
                   NamedSharding(mesh, P("a", "b")))
ckpt = checkpoint.Checkpointer(sys.argv[1], every=1, max_to_keep=1)
ckpt.save(3, {"params": {"w": w}}, {"x": np.zeros(1)}, {})
ckpt.close()
'''
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(
        [sys.executable, '-c', script, directory], cwd=repo,
        env={**os.environ, 'PYTHONPATH': repo}, capture_output=True,
        text=True, timeout=120)
    self.assertEqual(done.returncode, 0, done.stderr[-3000:])
    self.assertLess(jax.device_count(), 4)
    state = checkpoint.load_state_arrays(directory, 3)
    np.testing.assert_array_equal(
        state['params']['w'], np.arange(24.0, dtype=np.float32).reshape(4, 6))


def optax_apply(params, updates):
  return jax.tree.map(lambda p, u: p + u, params, updates)


if __name__ == '__main__':
  absltest.main()
