r"""Decode time when a step reads only the live part of the KV cache.

A decode step attends to the cache's slots written so far; the rest are
masked. `attention.DECODE_LIVE_BUCKETS` lets a step read only the first L
slots (L the smallest of a few fixed lengths that holds the written ones)
instead of all P + T. This times the static generator's decode loop (the
prefill apart) both ways, in the same process, the variants alternated:

  python benchmarks/decode_live.py --json benchmarks/results/decode_live.json

for random-init models of each preset's shape (f32), prompts of P tokens
and T new tokens without a stop token, so every step runs. It prints each
variant's ms per decode step and the ratio whole / live (above 1: live
reads are faster), and checks that both variants drew the same tokens
(they sample from the same keys; the log-probs may differ in the last bits).
"""

import argparse
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import numpy as np

from benchmarks import record
from jaxgrpo.generate import generator as generator_lib
from jaxgrpo.generate.generator import Generator
from jaxgrpo.generate.sampling import Sampling
from jaxgrpo.model import attention
from jaxgrpo.model import config as model_config
from jaxgrpo.model import decoder
from jaxgrpo.reporting import environment

VARIANTS = {'whole': 1, 'live': 'auto'}


def _decoders(cfg, graphdef, new_tokens: int, group: int) -> dict:
  """Per variant: (setting, Generator, decode function). Each variant's
  decode loop is its own jitted function, traced once under its setting
  (which is read at trace time), so the variants can alternate without
  recompiling."""
  gen = Generator(graphdef=graphdef, model_cfg=cfg,
                  sampling=Sampling(temperature=1.0),
                  max_new_tokens=new_tokens, num_samples=group)
  return {name: (buckets, gen, jax.jit(
      lambda p, s: generator_lib._decode_body(gen, p, s),  # pylint: disable=protected-access
      donate_argnums=1)) for name, buckets in VARIANTS.items()}


def measure(preset: str, rows: int, prompt_len: int, new_tokens: int,
            repeats: int, group: int = 8) -> dict:
  cfg = model_config.preset(preset)
  graphdef, params = decoder.init_params(cfg, jax.random.key(0))
  rng = np.random.default_rng(0)
  tokens = rng.integers(2, cfg.vocab_size, (rows // group, prompt_len)).astype(
      np.int32)
  mask = np.ones_like(tokens, bool)
  variants = _decoders(cfg, graphdef, new_tokens, group)
  times = {name: [] for name in VARIANTS}
  drawn = {}
  for rep in range(repeats + 1):  # the first round compiles
    for name, (buckets, gen, decode) in variants.items():
      attention.DECODE_LIVE_BUCKETS = buckets  # read when `decode` traces
      state = gen.prefill(params, tokens, mask, jax.random.key(rep))
      jax.block_until_ready(state)
      t0 = time.perf_counter()
      state = decode(params, state)
      jax.block_until_ready(state)
      dt = time.perf_counter() - t0
      if rep:
        times[name].append(dt)
      drawn[name] = np.asarray(state.tokens)
      print(f'  {preset} {name}: {1e3 * dt / (new_tokens - 1):.1f} ms/step'
            f'{"" if rep else " (compile)"}', flush=True)
  attention.DECODE_LIVE_BUCKETS = 'auto'
  steps = new_tokens - 1
  ms = {name: 1e3 * statistics.median(t) / steps for name, t in times.items()}
  return {
      'preset': preset, 'rows': rows, 'prompt_len': prompt_len,
      'new_tokens': new_tokens, 'cache_slots': prompt_len + new_tokens,
      'read_lengths': attention.live_lengths(prompt_len + new_tokens),
      'seconds': times, 'ms_per_step': ms,
      'ratio_whole_over_live': ms['whole'] / ms['live'],
      'tokens_equal': float(np.mean(drawn['whole'] == drawn['live'])),
  }


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--presets', default='small_10m,smollm2_135m')
  parser.add_argument('--rows', default='32,16',
                      help='rows decoded at once, per preset')
  parser.add_argument('--prompt-len', type=int, default=128)
  parser.add_argument('--new-tokens', type=int, default=512)
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--json', help='also write the results here')
  args = parser.parse_args(argv)
  presets = args.presets.split(',')
  rows = [int(r) for r in args.rows.split(',')]
  if len(rows) != len(presets):
    parser.error('--rows needs one count per preset')
  result = {
      'command': ' '.join(['python'] + sys.argv),
      'commit': record.commit(),
      'machine': {'platform': platform.platform(), 'cpu': environment.cpu_name(),
                  'cores': os.cpu_count(),
                  'jax': jax.__version__, 'backend': jax.default_backend()},
      'runs': [],
  }
  for preset, n in zip(presets, rows):
    run = measure(preset, n, args.prompt_len, args.new_tokens, args.repeats)
    result['runs'].append(run)
    print(f'{preset}, {n} rows, {run["cache_slots"]} cache slots: whole '
          f'{run["ms_per_step"]["whole"]:.1f} ms/step, live '
          f'{run["ms_per_step"]["live"]:.1f} ms/step: '
          f'{run["ratio_whole_over_live"]:.2f}x; tokens equal '
          f'{run["tokens_equal"]:.1%}', flush=True)
    if args.json:
      record.write_json(args.json, result)
  return 0


if __name__ == '__main__':
  sys.exit(main())
