r"""Generation throughput and GRPO step time, jaxgrpo side by side with tunix.

For each model config (`tiny`: the demo's 0.5M shape; `small_10m`: ~9.5M
params) this runs, in one invocation:

  * jaxgrpo's Generator on B=16 prompts x G=8 samples, prompt length 8,
    temperature 1.0, no stop token (every row decodes max_new_tokens);
  * jaxgrpo's jitted train_step on the resulting 128 sequences (GRPO, beta 0,
    one iteration, one minibatch, token_mean, clip eps 0.2, Adam after
    global-norm clipping);
  * the same workload through google-tunix (benchmarks/tunix_baseline.py, run
    by the python of its own virtual environment, see that file);

and prints the ratios jaxgrpo / tunix. It also prints the train step's
achieved FLOP/s (XLA's own flop count of the compiled step / median step
time) as a fraction of a jitted f32 matmul's FLOP/s measured in the same run.

  python benchmarks/grpo_vs_tunix.py --configs tiny,small_10m \
      --tunix-python .venv-tunix/bin/python

Times are over --repeats calls after one compile call each; ratios are given
for medians and for best-of-N (the shared 2-core machines this was measured
on show run-to-run swings that best-of-N filters out).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo import optimizer as optimizer_lib
from jaxgrpo import train_state as train_state_lib
from jaxgrpo import train_step as train_step_lib
from jaxgrpo.generate import sampling
from jaxgrpo.generate.generator import Generator
from jaxgrpo.model import config as model_config
from jaxgrpo.model import decoder
from jaxgrpo.reporting import environment
from jaxgrpo.typing import TrainBatch

_CONFIGS = {
    'tiny': ('demo', 8),  # preset, max_new_tokens
    'small_10m': ('small_10m', 32),
}
_B, _G, _P, _VOCAB = 16, 8, 8, 32


def _times(fn, repeats):
  """(median, min) wall time of `fn` over `repeats` calls."""
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return statistics.median(times), min(times)


def matmul_flops_per_s(n=1024, repeats=10):
  """Best-of-`repeats` FLOP/s of a jitted f32 [n, n] x [n, n] matmul."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  mm = jax.jit(jnp.matmul)
  jax.block_until_ready(mm(a, b))
  return 2 * n**3 / _times(lambda: mm(a, b), repeats)[1]


def bench_jaxgrpo(name, repeats):
  preset, max_new = _CONFIGS[name]
  cfg = model_config.preset(preset, vocab_size=_VOCAB)
  graphdef, params = decoder.init_params(cfg, jax.random.key(0))
  gen = Generator(graphdef=graphdef, model_cfg=cfg,
                  sampling=sampling.Sampling(temperature=1.0),
                  max_new_tokens=max_new, num_samples=_G, stop_tokens=(),
                  pad_id=0)
  rng = np.random.default_rng(0)
  prompts = rng.integers(3, _VOCAB, size=(_B, _P)).astype(np.int32)
  prompts[:, 0] = 1  # BOS
  mask = np.ones((_B, _P), bool)
  t0 = time.perf_counter()
  out = jax.block_until_ready(gen.generate(params, prompts, mask,
                                           jax.random.key(1)))
  gen_compile = time.perf_counter() - t0
  keys = iter(range(2, 10_000))
  gen_s, gen_min_s = _times(
      lambda: gen.generate(params, prompts, mask, jax.random.key(next(keys))),
      repeats)
  tokens = _B * _G * max_new

  optimizer = optimizer_lib.make_optimizer(
      learning_rate=1e-5, warmup_steps=0, total_steps=1000, max_grad_norm=1.0)
  state = train_state_lib.create_train_state(graphdef, params, optimizer,
                                             keep_reference=False)
  step = train_step_lib.make_train_step(
      graphdef=graphdef, optimizer=optimizer,
      loss_cfg=train_step_lib.LossConfig(eps_low=0.2, eps_high=0.2,
                                         loss_agg='token_mean', beta=0.0,
                                         temperature=1.0),
      num_iterations=1, num_minibatches=1)
  out = jax.device_get(out)
  batch = TrainBatch(
      prompt_tokens=prompts, prompt_mask=mask,
      completion_tokens=out.tokens, completion_mask=out.mask,
      old_logps=out.logps,
      advantages=rng.standard_normal(_B * _G).astype(np.float32))
  key = jax.random.key(7)
  compiled = step.lower(state, batch, key).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  flops = float(cost.get('flops', 0.0))
  t0 = time.perf_counter()
  state, _ = jax.block_until_ready(step(state, batch, key))
  step_compile = time.perf_counter() - t0
  holder = {'state': state}

  def one_step():
    holder['state'], metrics = step(holder['state'], batch, key)
    return metrics

  step_s, step_min_s = _times(one_step, repeats)
  return {
      'params': model_config.param_count(cfg),
      'generated_tokens': tokens,
      'generation_tokens_per_s': tokens / gen_s,
      'generation_best_tokens_per_s': tokens / gen_min_s,
      'generation_first_call_s': gen_compile,
      'grpo_update_s': step_s,
      'grpo_update_min_s': step_min_s,
      'grpo_update_first_call_s': step_compile,
      'train_step_flops': flops,
  }


def bench_tunix(name, python, repeats):
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, 'tunix.json')
    here = os.path.dirname(os.path.abspath(__file__))
    subprocess.run(
        [python, os.path.join(here, 'tunix_baseline.py'), '--config', name,
         '--json', path, '--repeats', str(repeats), '--learner-steps', '0'],
        check=True, stdout=subprocess.DEVNULL)
    with open(path) as f:
      return json.load(f)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--configs', default='tiny,small_10m')
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--tunix-python', default='.venv-tunix/bin/python',
                      help='python of the environment with google-tunix; '
                      "'' skips the tunix side")
  parser.add_argument('--json', help='also write the results here')
  args = parser.parse_args()
  results = {'jax': jax.__version__, 'backend': jax.default_backend(),
             'cpu_count': os.cpu_count(), 'cpu': environment.cpu_name(),
             'configs': {}}
  for name in args.configs.split(','):
    mm = matmul_flops_per_s()
    ours = bench_jaxgrpo(name, args.repeats)
    # Best step against the best matmul: both as free of interference as
    # the run allows.
    achieved = ours['train_step_flops'] / ours['grpo_update_min_s']
    row = {'jaxgrpo': ours, 'matmul_flops_per_s': mm,
           'train_step_flops_per_s': achieved,
           'train_step_fraction_of_matmul': achieved / mm}
    print(f'[{name}] jaxgrpo: {ours["params"] / 1e6:.2f}M params, '
          f'generation {ours["generation_tokens_per_s"]:,.0f} tok/s, '
          f'(best {ours["generation_best_tokens_per_s"]:,.0f}), '
          f'GRPO step {ours["grpo_update_s"] * 1e3:.1f} ms '
          f'(best {ours["grpo_update_min_s"] * 1e3:.1f})')
    print(f'[{name}] best train step {achieved / 1e9:.2f} GFLOP/s = '
          f'{achieved / mm:.2f} of the best f32 matmul ({mm / 1e9:.2f} '
          'GFLOP/s)')
    if args.tunix_python:
      theirs = bench_tunix(name, args.tunix_python, args.repeats)
      med = theirs['medians']
      row['tunix'] = theirs
      row['generation_speedup'] = (
          ours['generation_tokens_per_s'] / med['generation_tokens_per_s'])
      row['generation_speedup_vs_prefill_decode'] = (
          ours['generation_tokens_per_s']
          / med['prefill_and_decode_tokens_per_s'])
      row['grpo_update_speedup'] = med['grpo_update_s'] / ours['grpo_update_s']
      tokens_best = (theirs['generation']['generated_tokens']
                     / theirs['generation']['sampler_call']['min_s'])
      row['generation_best_speedup'] = (
          ours['generation_best_tokens_per_s'] / tokens_best)
      row['grpo_update_best_speedup'] = (
          theirs['grpo']['update']['min_s'] / ours['grpo_update_min_s'])
      print(f'[{name}] tunix: generation '
            f'{med["generation_tokens_per_s"]:,.0f} tok/s (prefill+decode '
            f'alone {med["prefill_and_decode_tokens_per_s"]:,.0f}), GRPO '
            f'update {med["grpo_update_s"] * 1e3:.1f} ms')
      print(f'[{name}] ratio jaxgrpo/tunix: generation '
            f'{row["generation_speedup"]:.2f}x '
            f'(vs prefill+decode alone '
            f'{row["generation_speedup_vs_prefill_decode"]:.2f}x), '
            f'GRPO update {row["grpo_update_speedup"]:.2f}x (medians); '
            f'best-of-{args.repeats}: generation '
            f'{row["generation_best_speedup"]:.2f}x, GRPO update '
            f'{row["grpo_update_best_speedup"]:.2f}x')
    results['configs'][name] = row
    sys.stdout.flush()
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(results, f, indent=2)


if __name__ == '__main__':
  main()
