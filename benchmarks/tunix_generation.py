r"""Generation with stop tokens, jaxgrpo vs tunix's Sampler, like for like.

The workload, the same on both sides: the `small_10m` shape (Llama-style,
9.45M params, f32, vocab 32), B prompts of exactly P = 128 random ids, G
samples each at temperature 1.0, completions of up to T = 256 tokens that
end with a stop token. Each sample's length is drawn from GSM8K's train
gold solutions tokenised with SmolLM2's tokenizer, plus the stop token,
capped at T (as benchmarks/continuous.py draws them), and a benchmark-only
hook forces the stop token at that length and forbids it before: jaxgrpo's
`stop_at`, and on tunix's side a wrapper module that edits the logits the
same way (benchmarks/tunix_sampler_worker.py). So every engine produces the
same useful tokens (each row up to and including its stop token), and
tokens/s counts only those.

Every engine holds --slots rows at once:
  * jaxgrpo static: `Generator.generate` on slots / G prompts at a time,
    each call decoding until its longest row ends;
  * jaxgrpo continuous: `ContinuousGenerator` with --slots slots streaming
    all R = B * G samples;
  * tunix device: tunix's jitted prefill and decode (`Sampler`'s
    `_compiled_prefill_fn` and `_compiled_decode_fn`, the calls its public
    `__call__` makes) on the same calls of slots rows, timed alone: no
    tokenising, padding or detokenising;
  * tunix call: the public `Sampler.__call__` on prompt strings, end to end.
    Its while_loop also ends once every row of the call is done.

jaxgrpo's static timing is its jitted prefill and decode (ids in, ids out);
the continuous engine's time includes its host loop (admission plans and a
round trip per chunk), which is part of how it works.

tunix runs in its own environment as a worker process
(--tunix-python, default .venv-tunix/bin/python; see
benchmarks/tunix_baseline.py for its setup) that waits on a pipe between
commands, so the two sides never run at once. All engines compile first;
then each repeat runs the four in turn, the order rotating by one every
repeat.

  python benchmarks/tunix_generation.py --repeats 5 \
      --json benchmarks/results/tunix_generation.json
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# pylint: disable=g-import-not-at-top
import continuous as continuous_bench
from benchmarks import record
from jaxgrpo.generate import continuous
from jaxgrpo.generate.generator import Generator
from jaxgrpo.generate.sampling import Sampling
from jaxgrpo.model import config as model_config
from jaxgrpo.model import decoder
from jaxgrpo.reporting import environment

_STOP, _PAD = 1, 0
_SIDES = ('jaxgrpo_static', 'jaxgrpo_continuous', 'tunix_device',
          'tunix_call')


def workload(args, vocab):
  """Prompts [B, P] (no padding) and stop lengths [R]."""
  _, completion_len = continuous_bench.gsm8k_lengths(args.max_new,
                                                     args.prompt_len)
  rng = np.random.default_rng(args.seed)
  tokens = rng.integers(2, vocab, (args.prompts, args.prompt_len)).astype(
      np.int32)
  stop_at = rng.choice(completion_len, args.prompts * args.samples).astype(
      np.int32)
  return tokens, stop_at


class Tunix:
  """The tunix worker process, one command at a time."""

  def __init__(self, python, path):
    here = os.path.dirname(os.path.abspath(__file__))
    self.proc = subprocess.Popen(
        [python, os.path.join(here, 'tunix_sampler_worker.py'), path],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    self.info = self._read()

  def _read(self):
    line = self.proc.stdout.readline()
    if not line:
      raise RuntimeError(f'tunix worker exited ({self.proc.wait()})')
    return json.loads(line)

  def run(self, mode, seed):
    self.proc.stdin.write(f'{mode} {seed}\n')
    self.proc.stdin.flush()
    return self._read()

  def close(self):
    self.proc.stdin.write('quit\n')
    self.proc.stdin.close()
    self.proc.wait()


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--prompts', type=int, default=16)
  parser.add_argument('--samples', type=int, default=8)
  parser.add_argument('--slots', type=int, default=32)
  parser.add_argument('--chunk', type=int, default=8)
  parser.add_argument('--prompt-len', type=int, default=128)
  parser.add_argument('--max-new', type=int, default=256)
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--tunix-python', default='.venv-tunix/bin/python')
  parser.add_argument('--json', help='also write the results here')
  args = parser.parse_args()
  if args.slots % args.samples or args.prompts % (args.slots // args.samples):
    sys.exit('--slots must be a multiple of --samples, and --prompts of '
             'slots / samples')

  cfg = model_config.preset('small_10m')
  graphdef, params = decoder.init_params(cfg, jax.random.key(0))
  tokens, stop_at = workload(args, cfg.vocab_size)
  mask = np.ones_like(tokens, bool)
  useful = int(stop_at.sum())
  gen = Generator(graphdef=graphdef, model_cfg=cfg,
                  sampling=Sampling(temperature=1.0),
                  max_new_tokens=args.max_new, num_samples=args.samples,
                  stop_tokens=(_STOP,), pad_id=_PAD)
  cg = continuous.ContinuousGenerator(generator=gen, slots=args.slots,
                                      chunk=args.chunk)
  print(f'small_10m ({model_config.param_count(cfg) / 1e6:.2f}M params), '
        f'B={args.prompts} x G={args.samples}, {args.slots} rows at once, '
        f'P={args.prompt_len}, T={args.max_new}; drawn lengths mean '
        f'{stop_at.mean():.1f}, max {stop_at.max()}, {useful} useful tokens',
        flush=True)

  load = [os.getloadavg()[0]]
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, 'workload.npz')
    np.savez(path, tokens=tokens, stop_at=stop_at, samples=args.samples,
             slots=args.slots, max_new=args.max_new, stop=_STOP, pad=_PAD)
    t0 = time.perf_counter()
    tunix = Tunix(args.tunix_python, path)
    print(f'tunix {tunix.info["tunix"]} ({tunix.info["params"] / 1e6:.2f}M '
          f'params) compiled in {tunix.info["compile_s"]:.1f}s', flush=True)
    ones = np.ones_like(stop_at)
    continuous_bench.run_static(gen, params, tokens, mask, ones, args.slots)
    continuous_bench.run_continuous(cg, params, tokens, mask, ones)
    print(f'compiled in {time.perf_counter() - t0:.1f}s', flush=True)

    def run(side, rep):
      if side == 'jaxgrpo_static':
        s, n, occ = continuous_bench.run_static(gen, params, tokens, mask,
                                                stop_at, args.slots)
        return dict(seconds=s, useful=n, occupancy=occ)
      if side == 'jaxgrpo_continuous':
        s, n, stats = continuous_bench.run_continuous(cg, params, tokens,
                                                      mask, stop_at)
        return dict(seconds=s, useful=n, occupancy=stats.occupancy,
                    steps=stats.decode_steps, chunks=stats.chunks)
      out = tunix.run(side.split('_')[1], rep + 1)
      # tunix's rows decode in lockstep, like jaxgrpo's static batches.
      out['occupancy'] = out['useful'] / (out['steps'] * args.slots)
      return out

    results = {side: [] for side in _SIDES}
    for rep in range(args.repeats):
      order = _SIDES[rep % 4:] + _SIDES[:rep % 4]
      for side in order:
        out = run(side, rep)
        if out['useful'] != useful:
          raise RuntimeError(f'{side}: {out["useful"]} useful tokens, not '
                             f'{useful}')
        results[side].append(out)
      load.append(os.getloadavg()[0])
      print(f'repeat {rep}: ' + ', '.join(
          f'{side} {results[side][-1]["seconds"]:.2f}s' for side in _SIDES),
            flush=True)
    tunix.close()

  summary = {}
  for side in _SIDES:
    secs = [r['seconds'] for r in results[side]]
    summary[side] = dict(
        seconds=secs, median_s=statistics.median(secs), best_s=min(secs),
        tok_s_median=useful / statistics.median(secs),
        tok_s_best=useful / min(secs),
        occupancy=results[side][-1]['occupancy'],
        steps=results[side][-1].get('steps'))
  ratios = {}
  for ours in _SIDES[:2]:
    for theirs in _SIDES[2:]:
      per = [t['seconds'] / o['seconds']
             for o, t in zip(results[ours], results[theirs])]
      ratios[f'{ours}/{theirs}'] = dict(
          median=summary[theirs]['median_s'] / summary[ours]['median_s'],
          best=summary[theirs]['best_s'] / summary[ours]['best_s'],
          per_repeat=per)
  for side in _SIDES:
    s = summary[side]
    print(f'{side:20s} {s["tok_s_median"]:8,.0f} tok/s median, '
          f'{s["tok_s_best"]:8,.0f} best; occupancy {s["occupancy"]:.3f}')
  for name, r in ratios.items():
    print(f'{name:35s} {r["median"]:.2f}x median, {r["best"]:.2f}x best; '
          'per repeat ' + ' '.join(f'{x:.2f}' for x in r['per_repeat']))
  if args.json:
    result = dict(
        command=' '.join(['python'] + sys.argv),
        commit=record.commit(),
        machine=dict(platform=platform.platform(), cpu=environment.cpu_name(),
                     cpus=os.cpu_count(),
                     jax=jax.__version__, backend=jax.default_backend(),
                     load_average_1m=load),
        tunix=tunix.info, args=vars(args),
        params=model_config.param_count(cfg), useful_tokens=useful,
        stop_at=dict(mean=float(stop_at.mean()), max=int(stop_at.max())),
        summary=summary, ratios=ratios, runs=results)
    record.write_json(args.json, result)


if __name__ == '__main__':
  main()
