"""Tests for the orbax checkpointer."""

import os

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo import checkpoint


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


if __name__ == '__main__':
  absltest.main()
