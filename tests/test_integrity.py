"""Checksums of checkpoint arrays (jaxgrpo/integrity.py)."""

import json
import os
import subprocess
import sys

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxgrpo import checkpoint as checkpoint_lib
from jaxgrpo import integrity
from jaxgrpo import train_state as train_state_lib
from tests import tiny

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _arrays() -> dict:
  rng = np.random.default_rng(0)
  return {
      'f32': rng.normal(size=(37, 5)).astype(np.float32),
      'bf16': np.asarray(jnp.asarray(rng.normal(size=(3, 4, 5)), jnp.bfloat16)),
      'i32': rng.integers(-9, 9, (6, 7)).astype(np.int32),
      'u8': np.arange(300).astype(np.uint8),
      'mask': rng.random(11) > 0.5,
      'scalar': np.float32(3.0),
      'empty': np.zeros((0, 4), np.float32),
  }


class ChecksumTest(parameterized.TestCase):

  def test_device_and_host_sums_agree(self):
    # Saved from device arrays, checked on host copies (and back).
    host = _arrays()
    on_device = jax.tree.map(jnp.asarray, host)
    self.assertEqual(integrity.digests(on_device), integrity.digests(host))
    self.assertLen(set(integrity.digests(host).values()), len(host))

  def test_host_sums_cover_eight_byte_and_text_arrays(self):
    # The data item holds int64 counters and id hashes.
    a = np.arange(10, dtype=np.int64) << 33
    b = a.copy()
    b[3] += 1 << 40  # the high word alone
    self.assertNotEqual(integrity.host_checksum(a), integrity.host_checksum(b))
    self.assertNotEqual(integrity.host_checksum(np.asarray(['ab', 'ac'])),
                        integrity.host_checksum(np.asarray(['ab', 'ad'])))

  @parameterized.parameters('f32', 'bf16', 'i32', 'u8', 'mask')
  def test_any_one_flipped_bit_changes_the_sum(self, name):
    x = _arrays()[name]
    raw = np.ascontiguousarray(x).view(np.uint8).reshape(-1)
    before = integrity.host_checksum(x)
    rng = np.random.default_rng(1)
    for position in rng.integers(0, raw.size, 20):
      for bit in (0, 7):
        flipped = raw.copy()
        flipped[position] ^= 1 << bit
        self.assertNotEqual(
            integrity.host_checksum(flipped.view(x.dtype).reshape(x.shape)),
            before, (name, position, bit))

  def test_words_swapped_change_the_sum(self):
    # Each word's position counts, not only the multiset of values.
    x = np.arange(8, dtype=np.uint32)
    y = x.copy()
    y[[2, 5]] = y[[5, 2]]
    self.assertNotEqual(integrity.host_checksum(x), integrity.host_checksum(y))

  def test_a_train_state_and_its_restored_dicts_name_leaves_alike(self):
    # Saved from a TrainState, checked against the nested dicts orbax
    # restores without a target (jaxgrpo-export, inspection).
    graphdef, params = tiny.random_model()
    state = train_state_lib.create_train_state(
        graphdef, params, optax.adamw(1e-3), keep_reference=True)
    saved = integrity.digests(state)
    workdir = self.create_tempdir().full_path
    ckpt = checkpoint_lib.Checkpointer(workdir, every=1, max_to_keep=1)
    ckpt.save(1, state, {'x': np.arange(3)}, {'note': 1})
    ckpt.close()
    raw = checkpoint_lib.load_state_arrays(workdir, 1)
    self.assertEqual(integrity.digests(raw), saved)
    self.assertIn('params/embedding/value', saved)


class VerifyTest(absltest.TestCase):

  def test_names_the_items_and_arrays_that_differ(self):
    state, data = {'w': np.ones(4, np.float32)}, {'table': np.arange(5)}
    meta = {checkpoint_lib.INTEGRITY: {'state': integrity.digests(state),
                                       'data': integrity.digests(data)}}
    checkpoint_lib.verify(meta, state=state, data=data)
    with self.assertRaisesRegex(
        checkpoint_lib.DamagedError,
        r'^1 array no longer matches the checksums saved with them '
        r'\(data/table\)'):
      checkpoint_lib.verify(meta, state=state, data={'table': np.arange(1, 6)})
    checkpoint_lib.verify({}, state={'w': np.zeros(4)})  # nothing saved

  def test_saves_without_changing_the_callers_meta(self):
    workdir = self.create_tempdir().full_path
    ckpt = checkpoint_lib.Checkpointer(workdir, every=1, max_to_keep=1)
    meta = {'config': {}, 'note': 1}
    ckpt.save(1, {'w': jnp.ones(3)}, {'t': np.arange(3)}, meta)
    ckpt.close()
    self.assertEqual(meta, {'config': {}, 'note': 1})
    ckpt = checkpoint_lib.Checkpointer(workdir, every=1, max_to_keep=1)
    restored = ckpt.restore(1, {'w': jnp.zeros(3)})
    ckpt.close()
    # The checksums stay inside.
    self.assertEqual(restored.meta, {'config': {}, 'note': 1})
    self.assertIn(checkpoint_lib.INTEGRITY, ckpt.read_meta(1))


class ShardedTest(absltest.TestCase):

  def test_sums_do_not_depend_on_the_sharding(self):
    # 8 CPU devices need a process of their own (fixed at jax's import).
    script = '''
import os, json, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from jaxgrpo import integrity
mesh = jax.make_mesh((2, 4), ("a", "b"))
x = np.random.default_rng(0).normal(size=(16, 24)).astype(np.float32)
out = {"host": integrity.digests({"x": x})["x"]}
for spec in (P(), P("a"), P("b", "a"), P(None, ("a", "b"))):
  y = jax.device_put(jnp.asarray(x, jnp.float32), NamedSharding(mesh, spec))
  out[str(spec)] = integrity.digests({"x": y})["x"]
json.dump(out, sys.stdout)
'''
    done = subprocess.run([sys.executable, '-c', script], cwd=REPO,
                          env={**os.environ, 'PYTHONPATH': REPO},
                          capture_output=True, text=True, timeout=120)
    self.assertEqual(done.returncode, 0, done.stderr[-3000:])
    sums = json.loads(done.stdout)
    self.assertLen(sums, 5)
    self.assertLen(set(sums.values()), 1, sums)


if __name__ == '__main__':
  absltest.main()
