r"""What the checkpoint checksums cost: digests vs the save and the restore.

  python benchmarks/checkpoint_integrity.py --json benchmarks/results/checkpoint_integrity.json

For each preset, a random-init train state (params, AdamW state) is saved
and restored with `checkpoint.Checkpointer` (orbax, which now computes and
checks the checksums), and `integrity.digests` is timed alone on the same
state, in the same process, alternated, after one untimed round (the
digest program's compilation). It prints the seconds of each and the
digests' share of a save and of a restore.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import numpy as np
import optax

from benchmarks import record
from jaxgrpo import checkpoint as checkpoint_lib
from jaxgrpo import integrity
from jaxgrpo import train_state as train_state_lib
from jaxgrpo.model import config as model_config
from jaxgrpo.model import decoder


def _state(preset: str):
  cfg = model_config.preset(preset)
  graphdef, abstract = decoder.abstract_params(cfg)
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda a: jax.numpy.asarray(
      rng.normal(0, 0.02, a.shape).astype(np.float32), a.dtype), abstract)
  state = train_state_lib.create_train_state(
      graphdef, params, optax.adamw(1e-3), keep_reference=False)
  # Non-zero moments, as after a step.
  return state.replace(opt_state=jax.tree.map(
      lambda x: x + 1e-3 if x.ndim else x, state.opt_state))


def measure(preset: str, repeats: int) -> dict:
  state = _state(preset)
  nbytes = sum(x.nbytes for x in jax.tree.leaves(state))
  folder = tempfile.mkdtemp(prefix='integrity_')
  times = {'digests': [], 'save': [], 'restore': []}
  try:
    for rep in range(repeats + 1):  # the first round compiles
      t0 = time.perf_counter()
      integrity.digests(state)
      t1 = time.perf_counter()
      ckpt = checkpoint_lib.Checkpointer(folder, every=1, max_to_keep=1)
      ckpt.save(rep, state, {'x': np.arange(4)}, {'note': rep})
      ckpt.wait()
      t2 = time.perf_counter()
      restored = ckpt.restore(rep, state)
      jax.block_until_ready(restored.state)
      t3 = time.perf_counter()
      ckpt.close()
      if rep:
        times['digests'].append(t1 - t0)
        times['save'].append(t2 - t1)
        times['restore'].append(t3 - t2)
      print(f'  {preset}: digests {t1 - t0:.2f} s, save {t2 - t1:.2f} s, '
            f'restore {t3 - t2:.2f} s{"" if rep else " (compile)"}',
            flush=True)
  finally:
    shutil.rmtree(folder, ignore_errors=True)
  med = {k: statistics.median(v) for k, v in times.items()}
  return {'preset': preset, 'state_bytes': nbytes, 'seconds': times,
          'median_s': med,
          # Save and restore each compute the digests once.
          'share_of_save': med['digests'] / med['save'],
          'share_of_restore': med['digests'] / med['restore'],
          'digest_gb_per_s': nbytes / med['digests'] / 1e9}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--presets', default='small_10m,smollm2_135m')
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--json', help='also write the results here')
  args = parser.parse_args(argv)
  rows = [measure(p, args.repeats) for p in args.presets.split(',')]
  for r in rows:
    print(f'{r["preset"]}: state {r["state_bytes"] / 1e9:.2f} GB; digests '
          f'{r["median_s"]["digests"]:.2f} s ({r["digest_gb_per_s"]:.2f} '
          f'GB/s), save {r["median_s"]["save"]:.2f} s, restore '
          f'{r["median_s"]["restore"]:.2f} s: digests are '
          f'{r["share_of_save"]:.0%} of a save, {r["share_of_restore"]:.0%} '
          'of a restore')
  if args.json:
    record.write_json(args.json, {
        'command': ' '.join(sys.argv), 'commit': record.commit(),
        'jax': jax.__version__, 'backend': jax.default_backend(),
        'rows': rows})
  return 0


if __name__ == '__main__':
  sys.exit(main())
