r"""Train-step memory and time: full fine-tuning vs LoRA, on real model shapes.

For each model shape (random weights; the shapes of SmolLM2-135M and
Qwen2.5-0.5B by default) and each of

  * full: every weight trained, AdamW over all of them;
  * lora: a rank-r adapter on every projection (`model.lora`), AdamW over
    the adapter only, the base frozen beside it;

with the KL penalty off (beta = 0) and on (beta > 0: full fine-tuning then
keeps a frozen copy of the initial weights, LoRA uses the base itself), it
compiles the GRPO train step as `train.py` does (state donated) and reads
XLA's memory analysis of it (per device: arguments, outputs not written
into donated inputs, temp), and counts the bytes of the trained params, the
optimizer state, the base and the reference copy in the train state.
Nothing is allocated for that: the step is compiled for abstract arrays.

Then it times the step with beta > 0 on real (random) weights, full and
LoRA alternated, where the full step's estimated memory fits in the memory
this machine has available (else that row says so).

  python benchmarks/lora_memory.py --json benchmarks/results/lora_memory.json
  python benchmarks/lora_memory.py --presets smollm2_135m --rank 8 --steps 2
  python benchmarks/lora_memory.py --presets smollm2_135m --no-memory --steps 3

Memory alone (`--steps 0`) may run with XLA's fast-compile flags
(`XLA_FLAGS='--xla_backend_optimization_level=0
--xla_llvm_disable_expensive_passes=true'`): they change the machine code,
not the buffers XLA assigns.
"""

import argparse
import json
import os
import statistics
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
from jaxgrpo.model import lora
from jaxgrpo.typing import TrainBatch

_BETA = 0.04
_MIB = 2**20


def _bytes(tree) -> int:
  return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
             for x in jax.tree.leaves(tree))


def random_batch(b: int, g: int, p: int, t: int, vocab: int) -> TrainBatch:
  """A full batch of B prompts of P random tokens and B x G completions of
  T, with random old log-probs and advantages (seed 0)."""
  rng = np.random.default_rng(0)
  return TrainBatch(
      prompt_tokens=rng.integers(1, vocab, (b, p)).astype(np.int32),
      prompt_mask=np.ones((b, p), bool),
      completion_tokens=rng.integers(1, vocab, (b * g, t)).astype(np.int32),
      completion_mask=np.ones((b * g, t), bool),
      old_logps=-rng.uniform(1, 4, (b * g, t)).astype(np.float32),
      advantages=rng.normal(size=b * g).astype(np.float32),
  )


def _parts(cfg, params, mode: str, rank: int, beta: float):
  """(policy graphdef, trained params, base, base graphdef, optimizer)."""
  graphdef, _ = decoder.abstract_params(cfg)
  optimizer = optimizer_lib.make_optimizer(
      learning_rate=1e-5, warmup_steps=0, total_steps=100, max_grad_norm=1.0)
  if mode == 'full':
    return graphdef, params, None, None, optimizer, beta > 0
  section = lora.LoraSection(rank=rank, alpha=2.0 * rank)
  lora_graphdef, adapter = lora.attach(graphdef, params, section,
                                       jax.random.key(1))
  return lora_graphdef, adapter, params, graphdef, optimizer, False


def _step_fn(graphdef, base_graphdef, optimizer, beta: float):
  return train_step_lib.make_train_step(
      graphdef=graphdef, optimizer=optimizer,
      loss_cfg=train_step_lib.LossConfig(beta=beta),
      base_graphdef=base_graphdef)


def measure_memory(cfg, args, mode: str, beta: float) -> dict:
  """Memory of one variant, compiled for abstract arrays."""
  _, abstract = decoder.abstract_params(cfg)
  graphdef, trained, base, base_graphdef, optimizer, keep = _parts(
      cfg, abstract, mode, args.rank, beta)
  state = train_state_lib.abstract_train_state(
      graphdef, trained, optimizer, keep_reference=keep, base=base)
  batch = jax.eval_shape(lambda: random_batch(
      args.batch_size, args.group_size, args.prompt_len, args.new_tokens,
      cfg.vocab_size))
  t0 = time.perf_counter()
  use = train_step_lib.memory_use(
      _step_fn(graphdef, base_graphdef, optimizer, beta), state, batch,
      jax.eval_shape(jax.random.key, 0))
  return {
      'mode': mode, 'beta': beta,
      'trained_params_mib': _bytes(state.params) / _MIB,
      'opt_state_mib': _bytes(state.opt_state) / _MIB,
      'base_mib': _bytes(state.base) / _MIB,
      'reference_copy_mib': _bytes(state.ref_params) / _MIB,
      'argument_mib': use.argument / _MIB,
      'output_mib': use.output / _MIB,
      'alias_mib': use.alias / _MIB,
      'temp_mib': use.temp / _MIB,
      'total_mib': use.total / _MIB,
      'compile_s': time.perf_counter() - t0,
  }


def _available_mib() -> float:
  with open('/proc/meminfo') as f:
    for line in f:
      if line.startswith('MemAvailable:'):
        return int(line.split()[1]) / 1024
  return float('inf')


def time_steps(cfg, args, modes: list[str]) -> dict:
  """Median and best step seconds per mode, modes alternated."""
  params = decoder.init_params(cfg, jax.random.key(0))[1]
  batch = random_batch(args.batch_size, args.group_size, args.prompt_len,
                       args.new_tokens, cfg.vocab_size)
  runs = {}
  for mode in modes:
    graphdef, trained, base, base_graphdef, optimizer, keep = _parts(
        cfg, params, mode, args.rank, _BETA)
    copy = lambda tree: jax.tree.map(lambda x: x.copy(), tree)
    state = train_state_lib.create_train_state(
        graphdef, copy(trained), optimizer, keep_reference=keep,
        base=None if base is None else copy(base))
    fn = _step_fn(graphdef, base_graphdef, optimizer, _BETA)
    state, metrics = fn(state, batch, jax.random.key(0))  # compile, warm up
    jax.block_until_ready(metrics)
    runs[mode] = (fn, state)
  return alternate(runs, batch, args.steps)


def alternate(runs: dict, batch: TrainBatch, steps: int) -> dict:
  """Times `steps` train steps of each of `runs` ({name: (step_fn, state)},
  compiled), the names in turn each step; their median and best seconds."""
  states = {name: state for name, (_, state) in runs.items()}
  times = {name: [] for name in runs}
  for i in range(steps):
    for name, (fn, _) in runs.items():
      t0 = time.perf_counter()
      states[name], metrics = fn(states[name], batch, jax.random.key(i + 1))
      jax.block_until_ready((states[name], metrics))
      times[name].append(time.perf_counter() - t0)
  return {name: {'median_s': statistics.median(t), 'best_s': min(t),
                 'steps': len(t)} for name, t in times.items()}


def _report_memory(cfg, args, result: dict) -> None:
  """Compiles the four variants; prints and records their memory."""
  print(f'  {"mode":<5} {"beta":>5} {"trained":>9} {"opt state":>10} '
        f'{"base":>9} {"ref copy":>9} {"arguments":>10} {"temp":>9} '
        f'{"total":>9}  (MiB per device)')
  for mode in ('full', 'lora'):
    for beta in (0.0, _BETA):
      m = measure_memory(cfg, args, mode, beta)
      result['memory'].append(m)
      print(f'  {mode:<5} {beta:>5} {m["trained_params_mib"]:>9.1f} '
            f'{m["opt_state_mib"]:>10.1f} {m["base_mib"]:>9.1f} '
            f'{m["reference_copy_mib"]:>9.1f} {m["argument_mib"]:>10.1f} '
            f'{m["temp_mib"]:>9.1f} {m["total_mib"]:>9.1f}')
  full, lora_m = result['memory'][1], result['memory'][3]
  result['opt_state_ratio'] = full['opt_state_mib'] / lora_m['opt_state_mib']
  result['total_ratio'] = full['total_mib'] / lora_m['total_mib']
  result['lora_reference_adds_mib'] = (
      result['memory'][3]['argument_mib'] - result['memory'][2]['argument_mib'])
  print(f'  optimizer state {result["opt_state_ratio"]:.0f}x smaller, step '
        f'memory {result["total_ratio"]:.2f}x smaller; the KL reference adds '
        f'{result["lora_reference_adds_mib"]:.1f} MiB of arguments under LoRA')


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--presets', nargs='*',
                      default=['smollm2_135m', 'qwen2.5_0.5b'])
  parser.add_argument('--rank', type=int, default=16)
  parser.add_argument('--dtype', default='float32',
                      help='param and compute dtype')
  parser.add_argument('--batch_size', type=int, default=4)
  parser.add_argument('--group_size', type=int, default=4)
  parser.add_argument('--prompt_len', type=int, default=32)
  parser.add_argument('--new_tokens', type=int, default=32)
  parser.add_argument('--steps', type=int, default=3,
                      help='timed steps per mode (0: memory only)')
  parser.add_argument('--memory', action=argparse.BooleanOptionalAction,
                      default=True, help='compile and report memory')
  parser.add_argument('--json', help='also write the results here')
  args = parser.parse_args(argv)
  out = {'args': vars(args), 'backend': jax.default_backend(),
         'jax': jax.__version__, 'models': {}}
  for name in args.presets:
    cfg = model_config.preset(name, dtype=args.dtype, param_dtype=args.dtype)
    result = {'params_m': model_config.param_count(cfg) / 1e6, 'memory': []}
    print(f'{name} ({result["params_m"]:.1f}M params, {args.dtype}), '
          f'B={args.batch_size} G={args.group_size} P={args.prompt_len} '
          f'T={args.new_tokens}, LoRA rank {args.rank} on every projection')
    if args.memory:
      _report_memory(cfg, args, result)
      need = result['memory'][1]['total_mib'] * 1.3
    else:
      need = 0.0
    have = _available_mib()
    if args.steps and need < have:
      result['time'] = time_steps(cfg, args, ['full', 'lora'])
      t = result['time']
      print(f'  step time (beta={_BETA}, median / best of {args.steps}): full '
            f'{t["full"]["median_s"]:.2f} / {t["full"]["best_s"]:.2f} s, '
            f'lora {t["lora"]["median_s"]:.2f} / {t["lora"]["best_s"]:.2f} s')
    elif args.steps:
      result['time'] = (f'not timed: the full step needs ~{need:.0f} MiB, '
                        f'{have:.0f} MiB available')
      print(f'  step time: {result["time"]}')
    out['models'][name] = result
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(out, f, indent=1)
  return 0


if __name__ == '__main__':
  sys.exit(main())
