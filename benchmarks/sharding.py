r"""Cost of the mesh on forced CPU devices: GRPO train step and a generation round.

Each layout runs in its own subprocess, because the number of CPU devices
(`--xla_force_host_platform_device_count`) is fixed when jax is imported.
Every subprocess builds the same model, state and batch, places them as
`train.py` does (params and optimizer state by their logical axes, batch
rows over data x fsdp), compiles and warms up, then waits. The parent then
times `--steps` rounds; in each round every layout in turn runs one train
step and one generation round while the others wait, so a change in the
machine's load hits all layouts alike. The table gives medians and bests
and each row's ratio to the 1-device mesh; `none` is one device without a
mesh (the code path before meshes existed).

On a machine with fewer cores than forced devices no speed-up is possible:
the figures measure what partitioning costs (collectives, per-device
dispatch), not what it buys.

  python benchmarks/sharding.py
  python benchmarks/sharding.py --preset demo --steps 3 --layouts none 1,1,1 8,1,1
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_LAYOUTS = ('none', '1,1,1', '2,1,1', '4,1,1', '8,1,1', '1,8,1',
                   '2,2,2')


def _child(args) -> dict:
  """Measures one layout; runs in a subprocess with the devices forced."""
  # pylint: disable=g-import-not-at-top
  import contextlib
  import jax
  import numpy as np
  sys.path.insert(0, REPO)
  from jaxgrpo import optimizer as optimizer_lib
  from jaxgrpo import sharding
  from jaxgrpo import train_state as train_state_lib
  from jaxgrpo import train_step as train_step_lib
  from jaxgrpo.data import tokenizer as tokenizer_lib
  from jaxgrpo.generate import sampling as sampling_lib
  from jaxgrpo.generate.generator import Generator
  from jaxgrpo.model import config as model_config
  from jaxgrpo.model import decoder
  from jaxgrpo.typing import TrainBatch

  b, g, p, t = args.batch_size, args.group_size, args.prompt_len, args.new_tokens
  vocab = tokenizer_lib.make_tokenizer('char').vocab_size
  cfg = model_config.preset(args.preset, vocab_size=vocab)
  graphdef, params = decoder.init_params(cfg, jax.random.key(0))
  optimizer = optimizer_lib.make_optimizer(
      learning_rate=1e-4, warmup_steps=0, total_steps=100, max_grad_norm=1.0,
      weight_decay=0.0, schedule='constant')
  rng = np.random.default_rng(0)
  prompt_mask = np.arange(p)[None] >= rng.integers(0, p // 2, b)[:, None]
  batch = TrainBatch(
      prompt_tokens=rng.integers(1, vocab, (b, p)).astype(np.int32),
      prompt_mask=prompt_mask,
      completion_tokens=rng.integers(1, vocab, (b * g, t)).astype(np.int32),
      completion_mask=np.ones((b * g, t), bool),
      old_logps=-rng.uniform(1, 4, (b * g, t)).astype(np.float32),
      advantages=rng.normal(size=b * g).astype(np.float32),
  )

  if args.child == 'none':
    ctx = contextlib.nullcontext()
  else:
    ctx = sharding.use_mesh(sharding.make_mesh(
        *(int(n) for n in args.child.split(','))))
  with ctx:
    params = sharding.shard(params, sharding.param_shardings(params))
    state = train_state_lib.create_train_state(
        graphdef, params, optimizer, keep_reference=False)
    shardings = sharding.train_state_shardings(state)
    state = sharding.shard(state, shardings)
    step_fn = train_step_lib.make_train_step(
        graphdef=graphdef, optimizer=optimizer,
        loss_cfg=train_step_lib.LossConfig(max_completion_len=t),
        state_shardings=shardings,
        batch_shardings=sharding.batch_shardings(batch))
    key = sharding.shard(jax.random.key(1), sharding.replicated())
    t0 = time.perf_counter()
    use = train_step_lib.memory_use(step_fn, state, batch, key)
    compile_s = time.perf_counter() - t0
    gen = Generator(graphdef=graphdef, model_cfg=cfg,
                    sampling=sampling_lib.Sampling(temperature=1.0),
                    max_new_tokens=t, num_samples=g)
    rows = math.ceil(args.round_size / sharding.batch_multiple()) * (
        sharding.batch_multiple())
    prompts = rng.integers(1, vocab, (rows, p)).astype(np.int32)
    mask = np.ones((rows, p), bool)

    def step(i: int) -> float:
      nonlocal state
      t0 = time.perf_counter()
      state, metrics = step_fn(state, batch, jax.random.fold_in(key, i))
      jax.block_until_ready((state, metrics))
      return time.perf_counter() - t0

    def generate(i: int) -> float:
      t0 = time.perf_counter()
      jax.device_get(gen.generate(state.params, prompts, mask,
                                  jax.random.fold_in(key, 10_000 + i)))
      return time.perf_counter() - t0

    step(1_000_000), generate(1_000_000)  # Warm-up: the generator compiles.

    _send({'layout': args.child, 'devices': jax.device_count(),
           'compile_s': compile_s,
           'memory_bytes': None if use is None else use.total,
           'params': int(sum(x.size for x in jax.tree.leaves(params)))})
    for i, command in enumerate(sys.stdin):
      if command.strip() == 'quit':
        break
      _send({'step_s': step(i), 'gen_s': generate(i)})


def _send(message: dict) -> None:
  print(json.dumps(message), flush=True)


def _start(layout: str, args) -> tuple[subprocess.Popen, dict]:
  """Starts a layout's process; returns it once it has compiled."""
  devices = 1 if layout == 'none' else math.prod(
      int(n) for n in layout.split(','))
  env = dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS=(
      os.environ.get('XLA_FLAGS', '')
      + f' --xla_force_host_platform_device_count={devices}'))
  cmd = [sys.executable, os.path.abspath(__file__), '--child', layout,
         '--preset', args.preset,
         '--batch_size', str(args.batch_size), '--group_size',
         str(args.group_size), '--prompt_len', str(args.prompt_len),
         '--new_tokens', str(args.new_tokens), '--round_size',
         str(args.round_size)]
  proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True)
  return proc, _receive(proc, layout)


def _receive(proc: subprocess.Popen, layout: str) -> dict:
  line = proc.stdout.readline()
  if not line:
    raise SystemExit(f'layout {layout} failed (exit {proc.wait()}); see its '
                     'stderr above')
  return json.loads(line)


def _table(results: list[dict], args) -> str:
  base = next((r for r in results if r['layout'] == '1,1,1'), results[0])
  lines = [
      f'{args.preset} ({results[0]["params"] / 1e6:.2f}M params): train step '
      f'B={args.batch_size} x G={args.group_size}, P={args.prompt_len}, '
      f'T={args.new_tokens}; generation round {args.round_size} prompts x '
      f'{args.group_size} samples x {args.new_tokens} tokens; median and '
      f'best of {args.steps}; ratios to the '
      + ('1-device mesh' if base['layout'] == '1,1,1'
         else f'mesh {base["layout"]}') + ' (median / best)',
      '',
      '| mesh (data, fsdp, tensor) | devices | train step (median / best) | '
      'ratio | generation round (median / best) | ratio | '
      'step memory / device |',
      '| --- | --- | --- | --- | --- | --- | --- |',
  ]

  def cell(r, key):
    return (f'{r[key + "_s"] * 1e3:,.0f} / {r[key + "_best_s"] * 1e3:,.0f} ms',
            f'{r[key + "_s"] / base[key + "_s"]:.2f}x / '
            f'{r[key + "_best_s"] / base[key + "_best_s"]:.2f}x')

  for r in results:
    mem = ('n/a' if r['memory_bytes'] is None
           else f'{r["memory_bytes"] / 2**20:.1f} MiB')
    name = 'none (no mesh)' if r['layout'] == 'none' else r['layout']
    (step, step_ratio), (gen, gen_ratio) = cell(r, 'step'), cell(r, 'gen')
    lines.append(f'| {name} | {r["devices"]} | {step} | {step_ratio} | '
                 f'{gen} | {gen_ratio} | {mem} |')
  return '\n'.join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--preset', default='small_10m')
  parser.add_argument('--steps', type=int, default=7)
  parser.add_argument('--layouts', nargs='*', default=list(DEFAULT_LAYOUTS),
                      help="'none' or data,fsdp,tensor")
  parser.add_argument('--batch_size', type=int, default=16)
  parser.add_argument('--group_size', type=int, default=8)
  parser.add_argument('--prompt_len', type=int, default=12)
  parser.add_argument('--new_tokens', type=int, default=16)
  parser.add_argument('--round_size', type=int, default=16)
  parser.add_argument('--json', help='also write the results here')
  parser.add_argument('--child', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    _child(args)
    return
  procs, results = [], []
  try:
    # One at a time: a layout compiling must not slow another's timing.
    for layout in args.layouts:
      t0 = time.perf_counter()
      proc, info = _start(layout, args)
      procs.append(proc)
      results.append(dict(info, step=[], gen=[]))
      print(f'{layout}: ready in {time.perf_counter() - t0:.0f}s',
            file=sys.stderr, flush=True)
    for _ in range(args.steps):
      for proc, result in zip(procs, results):
        proc.stdin.write('run\n')
        proc.stdin.flush()
        times = _receive(proc, result['layout'])
        result['step'].append(times['step_s'])
        result['gen'].append(times['gen_s'])
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.stdin.write('quit\n')
        proc.stdin.flush()
        proc.wait()
  for r in results:
    for key in ('step', 'gen'):
      r[f'{key}_s'] = statistics.median(r[key])
      r[f'{key}_best_s'] = min(r[key])
  print(_table(results, args))
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(results, f, indent=1)


if __name__ == '__main__':
  main()
