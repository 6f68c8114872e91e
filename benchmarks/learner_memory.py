r"""The learner's memory and time: `model.remat` and chunked logits, on real
model shapes.

For each model shape (random weights; SmolLM2-135M in float32 and
Qwen2.5-0.5B in bfloat16 by default) and each variant, named
`MODE[/whole]`:

  * MODE `none`: every activation of the differentiated forward pass is
    kept; `full`: each decoder block keeps only its inputs and is
    recomputed in the backward pass; `dots`: each block also keeps its
    matmul outputs; `full_plain`: `full` as `jax.checkpoint` alone does it,
    without the decoder's tie of the recomputation to the cotangent
    (`decoder._after_cotangent`), as `model.remat='full'` was before it;
  * `/whole`: the float32 logits [R, T, V] made in one piece, as before
    `rl.logprobs.LOGITS_CHUNK_BYTES`; without it, in chunks of positions
    (the default);

it compiles the GRPO train step as `train.py` does (state donated) for
abstract arrays (nothing is allocated) and reads XLA's memory analysis per
device: temp (activations and workspace) and total (arguments + outputs not
written into donated inputs + temp), with each variant's ratio to the
first (`none/whole`: neither change).

`--steps N` then times the step of the first shape on real (random)
weights at `--time-batch` (B x G x P x T), the variants alternated, and
compares each variant's first-step loss and gradient norm with the first's.

  python benchmarks/learner_memory.py --json benchmarks/results/learner_memory.json
  python benchmarks/learner_memory.py --presets smollm2_135m --steps 0
  python benchmarks/learner_memory.py --presets smollm2_135m --no-memory --time-batch 2,8,64,128
"""

import argparse
import contextlib
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax

from benchmarks import lora_memory
from benchmarks import record
from jaxgrpo import optimizer as optimizer_lib
from jaxgrpo import train_state as train_state_lib
from jaxgrpo import train_step as train_step_lib
from jaxgrpo.model import config as model_config
from jaxgrpo.model import decoder
from jaxgrpo.reporting import environment
from jaxgrpo.rl import logprobs

_MIB = 2**20
_DTYPES = {'smollm2_135m': 'float32', 'qwen2.5_0.5b': 'bfloat16'}


@contextlib.contextmanager
def _variant(name: str):
  """Sets up variant `name` (see the module docstring); yields its remat
  mode."""
  mode, _, whole = name.partition('/')
  # pylint: disable=protected-access
  tie, chunk = decoder._after_cotangent, logprobs.LOGITS_CHUNK_BYTES
  if mode == 'full_plain':
    decoder._after_cotangent = lambda fn: fn
  if whole:
    logprobs.LOGITS_CHUNK_BYTES = 2**62
  try:
    yield 'full' if mode == 'full_plain' else mode
  finally:
    decoder._after_cotangent, logprobs.LOGITS_CHUNK_BYTES = tie, chunk


def _step(graphdef, remat: str):
  optimizer = optimizer_lib.make_optimizer(
      learning_rate=1e-5, warmup_steps=0, total_steps=100, max_grad_norm=1.0)
  return optimizer, train_step_lib.make_train_step(
      graphdef=graphdef, optimizer=optimizer,
      loss_cfg=train_step_lib.LossConfig(), remat=remat)


def measure_memory(cfg, shape: tuple[int, int, int, int], mode: str) -> dict:
  """One mode's memory, compiled for abstract arrays."""
  graphdef, params = decoder.abstract_params(cfg)
  with _variant(mode) as remat:
    optimizer, fn = _step(graphdef, remat)
    state = train_state_lib.abstract_train_state(
        graphdef, params, optimizer, keep_reference=False)
    batch = jax.eval_shape(
        lambda: lora_memory.random_batch(*shape, cfg.vocab_size))
    t0 = time.perf_counter()
    use = train_step_lib.memory_use(fn, state, batch,
                                    jax.eval_shape(jax.random.key, 0))
  return {'variant': mode, 'temp_mib': use.temp / _MIB,
          'total_mib': use.total / _MIB,
          'compile_s': time.perf_counter() - t0}


def time_steps(cfg, shape, variants: list[str], steps: int) -> dict:
  """Median and best step seconds per variant, variants alternated; and
  each one's first-step loss and gradient norm against the first's."""
  graphdef, params = decoder.init_params(cfg, jax.random.key(0))
  batch = lora_memory.random_batch(*shape, cfg.vocab_size)
  runs, first = {}, {}
  for name in variants:
    with _variant(name) as remat:
      optimizer, fn = _step(graphdef, remat)
      state = train_state_lib.create_train_state(
          graphdef, jax.tree.map(lambda x: x.copy(), params), optimizer,
          keep_reference=False)
      state, metrics = fn(state, batch, jax.random.key(0))  # compiles
      first[name] = {k: float(metrics[f'train/{k}'])
                     for k in ('loss', 'grad_norm')}
    runs[name] = (fn, state)
  times = lora_memory.alternate(runs, batch, steps)
  base = first[variants[0]]
  return {name: {
      **times[name], **{f'first_{k}': v for k, v in first[name].items()},
      **{f'{k}_rel_diff': abs(first[name][k] - base[k]) / abs(base[k])
         for k in base}} for name in variants}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--presets', default='smollm2_135m,qwen2.5_0.5b')
  parser.add_argument(
      '--variants', default='none/whole,full_plain/whole,full/whole,none,'
      'full,dots', help='the first is the baseline of the ratios')
  parser.add_argument('--batch', default='4,8,128,256',
                      help='B,G,P,T of the memory measurement')
  parser.add_argument('--time-batch', default='2,4,64,128',
                      help='B,G,P,T of the timed steps')
  parser.add_argument('--steps', type=int, default=3,
                      help='timed steps per variant (0: memory only)')
  parser.add_argument('--no-memory', action='store_true',
                      help='only time the steps')
  parser.add_argument('--json', help='also write the results here')
  args = parser.parse_args(argv)
  variants = args.variants.split(',')
  shape = tuple(int(x) for x in args.batch.split(','))
  result = {
      'command': ' '.join(['python'] + sys.argv),
      'commit': record.commit(),
      'machine': {'platform': platform.platform(), 'cpu': environment.cpu_name(),
                  'cpus': os.cpu_count(),
                  'jax': jax.__version__, 'backend': jax.default_backend()},
      'logits_chunk_bytes': logprobs.LOGITS_CHUNK_BYTES,
      'batch': shape, 'memory': {}, 'time': None,
  }
  b, g, p, t = shape
  for name in [] if args.no_memory else args.presets.split(','):
    cfg = model_config.preset(name, dtype=_DTYPES.get(name, 'float32'),
                              param_dtype=_DTYPES.get(name, 'float32'))
    print(f'{name} ({cfg.dtype}), B={b} x G={g}, P={p}, T={t}: '
          f'train-step memory per device (MiB; ratios: {variants[0]} / this)',
          flush=True)
    rows = [measure_memory(cfg, shape, v) for v in variants]
    for row in rows:
      row['temp_ratio'] = rows[0]['temp_mib'] / row['temp_mib']
      row['total_ratio'] = rows[0]['total_mib'] / row['total_mib']
      print(f'  {row["variant"]:<16} temp {row["temp_mib"]:>9.1f} '
            f'({row["temp_ratio"]:5.2f}x)  total {row["total_mib"]:>9.1f} '
            f'({row["total_ratio"]:5.2f}x)', flush=True)
    result['memory'][name] = rows
  if args.steps:
    name = args.presets.split(',')[0]
    cfg = model_config.preset(name, dtype=_DTYPES.get(name, 'float32'),
                              param_dtype=_DTYPES.get(name, 'float32'))
    tshape = tuple(int(x) for x in args.time_batch.split(','))
    times = time_steps(cfg, tshape, variants, args.steps)
    result['time'] = {'preset': name, 'batch': tshape, 'variants': times}
    print(f'{name}, B,G,P,T = {tshape}: step seconds, {args.steps} steps per '
          'variant, alternated', flush=True)
    base = times[variants[0]]['median_s']
    for v, row in times.items():
      print(f'  {v:<16} median {row["median_s"]:.2f} s (best '
            f'{row["best_s"]:.2f}), {row["median_s"] / base:.2f}x the '
            f'first\'s; first step: loss {row["first_loss"]:.6g}, grad norm '
            f'{row["first_grad_norm"]:.6g} (relative differences '
            f'{row["loss_rel_diff"]:.1e}, {row["grad_norm_rel_diff"]:.1e})',
            flush=True)
  if args.json:
    record.write_json(args.json, result)
  return 0


if __name__ == '__main__':
  sys.exit(main())
