r"""Train-step memory and time under `model.remat`, on real model shapes.

For each model shape (random weights; SmolLM2-135M in float32 and
Qwen2.5-0.5B in bfloat16 by default) and each rematerialization mode

  * none: every activation of the differentiated forward pass is kept;
  * full: each decoder block keeps only its inputs and is recomputed in the
    backward pass;
  * dots: each block also keeps its matmul outputs;
  * full_plain: `full` as `jax.checkpoint` alone does it, without the
    decoder's tie of the recomputation to the cotangent
    (`decoder._after_cotangent`): what `model.remat='full'` was before;

it compiles the GRPO train step as `train.py` does (state donated) for
abstract arrays (nothing is allocated) and reads XLA's memory analysis per
device: temp (activations and workspace) and total (arguments + outputs not
written into donated inputs + temp), with each mode's ratio to `none`.

`--steps N` then times the step of the first shape on real (random)
weights at `--time-batch` (B x G x P x T), the modes alternated, and checks
that the gradients' effect matches: every mode's updated params against
none's after the first step.

  python benchmarks/remat_memory.py --json benchmarks/results/remat_memory.json
  python benchmarks/remat_memory.py --presets smollm2_135m --steps 0
"""

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import numpy as np

from jaxgrpo import optimizer as optimizer_lib
from jaxgrpo import train_state as train_state_lib
from jaxgrpo import train_step as train_step_lib
from jaxgrpo.model import config as model_config
from jaxgrpo.model import decoder
from jaxgrpo.typing import TrainBatch

_MIB = 2**20
_DTYPES = {'smollm2_135m': 'float32', 'qwen2.5_0.5b': 'bfloat16'}


@contextlib.contextmanager
def _mode(mode: str):
  """The decoder's remat setting for `mode`: `full_plain` is `full` with
  `jax.checkpoint` alone."""
  if mode != 'full_plain':
    yield mode
    return
  tie = decoder._after_cotangent  # pylint: disable=protected-access
  decoder._after_cotangent = lambda fn: fn  # pylint: disable=protected-access
  try:
    yield 'full'
  finally:
    decoder._after_cotangent = tie  # pylint: disable=protected-access


def _batch(b: int, g: int, p: int, t: int, vocab: int) -> TrainBatch:
  rng = np.random.default_rng(0)
  return TrainBatch(
      prompt_tokens=rng.integers(1, vocab, (b, p)).astype(np.int32),
      prompt_mask=np.ones((b, p), bool),
      completion_tokens=rng.integers(1, vocab, (b * g, t)).astype(np.int32),
      completion_mask=np.ones((b * g, t), bool),
      old_logps=-rng.uniform(1, 4, (b * g, t)).astype(np.float32),
      advantages=rng.normal(size=b * g).astype(np.float32),
  )


def _step(graphdef, remat: str):
  optimizer = optimizer_lib.make_optimizer(
      learning_rate=1e-5, warmup_steps=0, total_steps=100, max_grad_norm=1.0)
  return optimizer, train_step_lib.make_train_step(
      graphdef=graphdef, optimizer=optimizer,
      loss_cfg=train_step_lib.LossConfig(), remat=remat)


def measure_memory(cfg, shape: tuple[int, int, int, int], mode: str) -> dict:
  """One mode's memory, compiled for abstract arrays."""
  graphdef, params = decoder.abstract_params(cfg)
  with _mode(mode) as remat:
    optimizer, fn = _step(graphdef, remat)
    state = train_state_lib.abstract_train_state(
        graphdef, params, optimizer, keep_reference=False)
    batch = jax.eval_shape(lambda: _batch(*shape, cfg.vocab_size))
    t0 = time.perf_counter()
    use = train_step_lib.memory_use(fn, state, batch,
                                    jax.eval_shape(jax.random.key, 0))
  return {'mode': mode, 'temp_mib': use.temp / _MIB,
          'total_mib': use.total / _MIB,
          'compile_s': time.perf_counter() - t0}


def time_steps(cfg, shape, modes: list[str], steps: int) -> dict:
  """Median and best step seconds per mode, modes alternated; and each
  mode's largest param difference from `none` after one step."""
  graphdef, params = decoder.init_params(cfg, jax.random.key(0))
  batch = _batch(*shape, cfg.vocab_size)
  runs, first = {}, {}
  for mode in modes:
    with _mode(mode) as remat:
      optimizer, fn = _step(graphdef, remat)
      state = train_state_lib.create_train_state(
          graphdef, jax.tree.map(lambda x: x.copy(), params), optimizer,
          keep_reference=False)
      state, metrics = fn(state, batch, jax.random.key(0))  # compiles
      jax.block_until_ready(metrics)
    first[mode] = jax.device_get(state.params)
    runs[mode] = [fn, state, []]
  for i in range(steps):
    for mode in modes:
      fn, state, times = runs[mode]
      t0 = time.perf_counter()
      state, metrics = fn(state, batch, jax.random.key(i + 1))
      jax.block_until_ready((state, metrics))
      times.append(time.perf_counter() - t0)
      runs[mode][1] = state
  out = {}
  for mode, (_, _, times) in runs.items():
    diff = max(float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(
        b, np.float32)))) for a, b in zip(jax.tree.leaves(first[mode]),
                                          jax.tree.leaves(first['none'])))
    out[mode] = {'median_s': statistics.median(times), 'best_s': min(times),
                 'steps': len(times), 'max_param_diff_vs_none': diff}
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--presets', default='smollm2_135m,qwen2.5_0.5b')
  parser.add_argument('--modes', default='none,full,dots,full_plain')
  parser.add_argument('--batch', default='4,8,128,256',
                      help='B,G,P,T of the memory measurement')
  parser.add_argument('--time-batch', default='2,4,64,128',
                      help='B,G,P,T of the timed steps')
  parser.add_argument('--steps', type=int, default=3,
                      help='timed steps per mode (0: memory only)')
  parser.add_argument('--json', help='also write the results here')
  args = parser.parse_args(argv)
  modes = args.modes.split(',')
  if modes[0] != 'none':
    parser.error('--modes must start with none (the baseline of the ratios)')
  shape = tuple(int(x) for x in args.batch.split(','))
  result = {
      'command': ' '.join(['python'] + sys.argv),
      'commit': subprocess.run(['git', 'rev-parse', '--short', 'HEAD'],
                               capture_output=True, text=True,
                               cwd=os.path.dirname(__file__)).stdout.strip(),
      'machine': {'platform': platform.platform(), 'cpus': os.cpu_count(),
                  'jax': jax.__version__, 'backend': jax.default_backend()},
      'batch': shape, 'memory': {}, 'time': None,
  }
  b, g, p, t = shape
  for name in args.presets.split(','):
    cfg = model_config.preset(name, dtype=_DTYPES.get(name, 'float32'),
                              param_dtype=_DTYPES.get(name, 'float32'))
    print(f'{name} ({cfg.dtype}), B={b} x G={g}, P={p}, T={t}: '
          'train-step memory per device (MiB)', flush=True)
    rows = [measure_memory(cfg, shape, mode) for mode in modes]
    for row in rows:
      row['temp_ratio'] = rows[0]['temp_mib'] / row['temp_mib']
      row['total_ratio'] = rows[0]['total_mib'] / row['total_mib']
      print(f'  {row["mode"]:<10} temp {row["temp_mib"]:>9.1f} '
            f'(none / this: {row["temp_ratio"]:.2f}x)  total '
            f'{row["total_mib"]:>9.1f} ({row["total_ratio"]:.2f}x)', flush=True)
    result['memory'][name] = rows
  if args.steps:
    name = args.presets.split(',')[0]
    cfg = model_config.preset(name, dtype=_DTYPES.get(name, 'float32'),
                              param_dtype=_DTYPES.get(name, 'float32'))
    tshape = tuple(int(x) for x in args.time_batch.split(','))
    times = time_steps(cfg, tshape, modes, args.steps)
    result['time'] = {'preset': name, 'batch': tshape, 'modes': times}
    print(f'{name}, B,G,P,T = {tshape}: step seconds, {args.steps} steps per '
          'mode, alternated', flush=True)
    for mode, row in times.items():
      print(f'  {mode:<10} median {row["median_s"]:.2f} s (best '
            f'{row["best_s"]:.2f}), {row["median_s"] / times["none"]["median_s"]:.2f}x '
            f'none\'s; params after one step differ from none\'s by at most '
            f'{row["max_param_diff_vs_none"]:.1e}', flush=True)
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, 'w') as f:
      json.dump(result, f, indent=1)
  return 0


if __name__ == '__main__':
  sys.exit(main())
