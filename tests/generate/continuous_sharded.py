"""Continuous generation on a 4-device CPU mesh against static without one.

Run by tests/generate/test_continuous.py in a subprocess, because the device
count is fixed when jax is imported:

  python tests/generate/continuous_sharded.py OUT.json

For each mesh layout it samples with `ContinuousGenerator` under the mesh
and with the static `Generator` (per-sample keys) without any mesh, and
writes the largest differences and the slots' placement to OUT.json. On
two layouts it also stops a `SlotStream` after two chunks and resumes its
unfinished samples in another (`slots.resume` under the mesh).
"""

import os
import sys

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '')
                           + ' --xla_force_host_platform_device_count=4')
os.environ['JAX_PLATFORMS'] = 'cpu'
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import dataclasses
import json

import jax
import numpy as np

from jaxgrpo import sharding
from jaxgrpo.generate import continuous
from jaxgrpo.generate import keys
from jaxgrpo.generate import stream as stream_lib
from jaxgrpo.generate.generator import Generator
from jaxgrpo.generate.sampling import Sampling
from jaxgrpo.model import config
from jaxgrpo.model import decoder

B, G, P, T = 5, 3, 9, 10


def main(out: str):
  cfg = config.ModelConfig.tiny()
  graphdef, params = decoder.init_params(cfg, jax.random.key(0))
  rng = np.random.default_rng(0)
  tokens = np.zeros((B, P), np.int32)
  mask = np.zeros((B, P), bool)
  for i, n in enumerate(rng.integers(1, P + 1, B)):
    tokens[i, P - n:] = rng.integers(2, cfg.vocab_size, n)
    mask[i, P - n:] = True
  stop_at = rng.integers(1, T + 3, B * G).astype(np.int32)
  prompt_keys = keys.prompt_keys(jax.random.key(3),
                                 [f'ex{i}' for i in range(B)], 0)
  report = {'devices': jax.device_count(), 'layouts': {}}
  for temperature in (0.0, 1.0):
    gen = Generator(graphdef=graphdef, model_cfg=cfg,
                    sampling=Sampling(temperature=temperature),
                    max_new_tokens=T, num_samples=G, stop_tokens=(1,))
    want = gen.generate(params, tokens, mask, jax.random.key(1),
                        prompt_keys=prompt_keys, stop_at=stop_at)
    cg = continuous.ContinuousGenerator(generator=gen, slots=6, chunk=3,
                                        buckets=(4,))
    for layout in ((4, 1, 1), (2, 1, 2), (1, 2, 2)):
      with sharding.use_mesh(sharding.make_mesh(*layout)):
        placed = sharding.shard(params, sharding.param_shardings(params))
        got, stats = cg.generate_with_stats(
            placed, tokens, mask, jax.random.key(1), prompt_keys=prompt_keys,
            stop_at=stop_at)
        row = dict(
            tokens_equal=bool((np.asarray(got.tokens)
                               == np.asarray(want.tokens)).all()),
            lengths_equal=bool((np.asarray(got.lengths)
                                == np.asarray(want.lengths)).all()),
            logps_max_diff=float(np.abs(np.asarray(got.logps)
                                        - np.asarray(want.logps)).max()),
            slots=stats.slots,
        )
        if layout != (1, 2, 2):
          # On (4, 1, 1) the 6 slots are 8 rows, 2 idle; resumed samples
          # go two a call, one call padded.
          tokens_R, resumed, quiet = _stop_and_resume(
              dataclasses.replace(cg, prefill_batch=layout[0] // 2), placed,
              tokens, mask, prompt_keys, stop_at)
          row.update(resumed=resumed, resumed_tokens_equal=bool(
              (tokens_R == np.asarray(want.tokens)).all()),
                     idle_rows_quiet=quiet)
      report['layouts'][f'{layout} T={temperature}'] = row
  with open(out, 'w') as f:
    json.dump(report, f, indent=1)


def _stop_and_resume(cg, params, tokens, mask, prompt_keys, stop_at):
  """A stream's samples, stopped after two chunks and resumed in another:
  ([R, T] tokens, samples resumed part-way, no slot row left decoding)."""
  stop = stop_at.reshape(B, G)
  first = stream_lib.SlotStream(cg, params, P)
  first.add(tokens, mask, prompt_keys, stop)
  done = {}
  for _ in range(2):
    done |= {s.prompt * G + s.index: s for s in first.step()}
  left = first.unfinished()
  keys_BG2 = stream_lib.sample_key_data(prompt_keys, G)
  second = stream_lib.SlotStream(cg, params, P)
  of_id = {}
  for b in sorted({s.prompt for s in left}):
    mine = {s.index: s for s in left if s.prompt == b}
    of_id[second.add_group(tokens[b], mask[b], keys_BG2[b], stop[b],
                           mine)] = b
  while not second.idle:
    done |= {of_id[s.prompt] * G + s.index: s for s in second.step()}
  return (np.stack([done[r].tokens for r in range(B * G)]),
          sum(1 for s in left if s.length),
          not continuous.host(second._state.active).any())  # pylint: disable=protected-access


if __name__ == '__main__':
  main(sys.argv[1])
