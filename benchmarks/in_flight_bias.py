r"""Which prompts a streaming step loses in flight: the length bias of discard.

A streaming step ends as soon as B informative groups are in hand; under
`rollout.in_flight='discard'` the groups still decoding then are dropped,
and their examples go unobserved for the epoch. A group's chance of being
in flight at that moment grows with its duration (its longest sample), so
discarding could tilt what the learner and the sampler see toward prompts
with short completions. This script measures that tilt on the real
rollout (`Rollout.for_model` over a `MixtureSampler` of GSM8K's training
questions, the continuous engine, the streaming collector) with the lengths
and rewards of benchmarks/grpo_step.py: each sample's length is a GSM8K
gold solution's (SmolLM2 tokens + stop, capped at --max-new), forced by the
`stop_at` hook and drawn per prompt and sample, and the stand-in verifier
rewards a completion by its forced length alone (about 30% of examples can
give mixed groups). The params stay fixed (no learner step): which groups
finish when depends only on the lengths, so a tiny model serves.

Each run (a regime, a seed, a mode) records per step the examples drawn,
observed (scored) and trained; every figure is computed from those records
(`--summarize`), by the quartile of each group's duration over the whole
dataset:
  * discarded: share of the drawn groups never scored;
  * trained share: share of the trained groups in each quartile (25% each
    when the batch is blind to length, as rounds are);
  * mean duration of the trained groups against the drawn ones.
The last two steps of a run are left out of the figures: a group kept in
flight there (`keep`, `max_staleness` 1) has not had its chance yet.
Intervals are 95% bootstrap intervals over steps, pooled over seeds.

  PYTHONPATH=. python benchmarks/in_flight_bias.py \
      --json benchmarks/results/in_flight_bias.json   # resumable, run by run
  PYTHONPATH=. python benchmarks/in_flight_bias.py \
      --summarize benchmarks/results/in_flight_bias.json
"""

import argparse
import json
import os
import platform
import sys
import time

import jax
import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))

# pylint: disable=g-import-not-at-top,wrong-import-position
from benchmarks import continuous as continuous_bench
from benchmarks import grpo_step
from benchmarks import record
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.example import Example
from jaxgrpo.generate.generator import Generator
from jaxgrpo.generate.sampling import Sampling
from jaxgrpo.model import config as model_config
from jaxgrpo.model import decoder
from jaxgrpo.reporting import environment
from jaxgrpo.rl import rollout as rollout_lib

# name: (B, G, slots, round size)
REGIMES = {'b4_g4_s16': (4, 4, 16, 4), 'b16_g16_s64': (16, 16, 64, 16)}
# name: (collect, in_flight)
MODES = {'rounds': ('rounds', 'discard'),
         'streaming': ('streaming', 'discard'),
         'streaming_retry': ('streaming', 'retry'),
         'streaming_keep': ('streaming', 'keep')}


def _number(example_id: str) -> int:
  """An example's line in the GSM8K file, from its id 'gsm8k/<line>'."""
  return int(example_id.rsplit('/', 1)[1])


class _Recorder:
  """Wraps a prompt source and records, per step, the examples (by line
  number) it drew and observed."""

  def __init__(self, source):
    self._source, self.drawn, self.observed = source, [], []

  def __getattr__(self, name):
    return getattr(self._source, name)

  def start_step(self, step):
    self.drawn.append([])
    self.observed.append([])
    self._source.start_step(step)

  def next_prompts(self, n, need=None):
    out = self._source.next_prompts(n, need)
    self.drawn[-1] += [_number(ex.id) for ex in out]
    return out

  def observe(self, examples, rewards):
    self.observed[-1] += [_number(ex.id) for ex in examples]
    self._source.observe(examples, rewards)


def durations(examples, tok, hook, width) -> list[int]:
  """Each example's group duration, by line: the longest of its G forced
  lengths."""
  tokens, _, _ = tokenizer_lib.encode_prompts(
      tok, [ex.prompt for ex in examples], width, truncate=True,
      names=[ex.id for ex in examples])
  return [int(row.max()) for row in hook(tokens)]


def run(regime, mode, seed, steps, args, model, examples, lengths) -> dict:
  """One run's per-step records."""
  b, g, slots, r = REGIMES[regime]
  collect, in_flight = MODES[mode]
  graphdef, params, cfg = model
  tok = grpo_step.LengthTokenizer()
  gen = Generator(graphdef=graphdef, model_cfg=cfg,
                  sampling=Sampling(temperature=1.0),
                  max_new_tokens=args.max_new, num_samples=g,
                  stop_tokens=(tok.eos_id,), pad_id=tok.pad_id)
  rcfg = rollout_lib.RolloutConfig(
      batch_size=b, group_size=g, round_size=r, max_rounds=args.max_rounds,
      max_prompt_len=args.prompt_width, long_prompts='truncate',
      max_new_tokens=args.max_new, engine='continuous', slots=slots,
      collect=collect, verify_overlap=2, in_flight=in_flight)
  rollout, scorer, _ = grpo_step.forced_rollout(
      rcfg, gen, examples, lengths, seed=seed, slots=slots, chunk=8,
      wrap=_Recorder)
  source = rollout.source
  trained, updated, wasted, generated = [], [], [], []
  t0 = time.perf_counter()
  try:
    for step in range(steps):
      res = rollout.collect(params, jax.random.fold_in(
          jax.random.key(seed), step), step)
      trained.append([_number(grp.example.id) for grp in res.groups]
                     if res.batch is not None else [])
      updated.append(res.batch is not None)
      wasted.append(res.metrics.get('rollout/tokens_wasted', 0.0))
      generated.append(res.metrics['rollout/tokens_generated'])
  finally:
    scorer.close()
  return dict(regime=regime, mode=mode, seed=seed, steps=steps,
              seconds=time.perf_counter() - t0, drawn=source.drawn,
              observed=source.observed, trained=trained, updated=updated,
              tokens_wasted=wasted, tokens_generated=generated)


def _step_units(rec: dict, dur: list, edges: np.ndarray) -> list[dict]:
  """Per step of a run: counts by duration quartile (drawn, discarded,
  trained) and the durations summed, for the bootstrap."""
  q = lambda ids: np.bincount(
      np.searchsorted(edges, [dur[i] for i in ids], side='right'),
      minlength=4)[:4]
  later_observed = set()
  units = []
  for s in reversed(range(rec['steps'])):
    later_observed |= set(rec['observed'][s])
    drawn = rec['drawn'][s]
    lost = [i for i in drawn if i not in later_observed]
    units.append(dict(drawn=q(drawn), lost=q(lost),
                      trained=q(rec['trained'][s]),
                      drawn_d=float(sum(dur[i] for i in drawn)),
                      trained_d=float(sum(dur[i] for i in rec['trained'][s]))))
  # Draws of the last two steps may still be in flight (kept) at the end.
  return units[::-1][:-2]


def _figures(units: list[dict]) -> dict:
  tot = {k: sum(u[k] for u in units) for k in units[0]}
  n_trained = max(tot['trained'].sum(), 1)
  return dict(
      lost=(tot['lost'] / np.maximum(tot['drawn'], 1)).tolist(),
      lost_all=float(tot['lost'].sum() / max(tot['drawn'].sum(), 1)),
      trained_share=(tot['trained'] / n_trained).tolist(),
      trained_d=float(tot['trained_d'] / n_trained),
      drawn_d=float(tot['drawn_d'] / max(tot['drawn'].sum(), 1)))


def summarize(result: dict, n_boot: int = 2000) -> list[str]:
  """The summary lines of a result, from its raw records."""
  lines = []
  for regime in REGIMES:
    if regime not in result['edges']:
      continue
    edges, d = np.array(result['edges'][regime]), result['durations'][regime]
    pop = np.bincount(np.searchsorted(edges, d, side='right'),
                      minlength=4) / len(d)
    lines.append(f'{regime}: quartiles of the group duration (the longest '
                 f'of G samples, tokens) split at {edges.tolist()}; the '
                 'dataset\'s shares ' + ', '.join(f'{x:.1%}' for x in pop))
    for mode in MODES:
      recs = [r for r in result['runs'] if r['regime'] == regime
              and r['mode'] == mode]
      if not recs:
        continue
      units = [u for r in recs for u in _step_units(r, d, edges)]
      est = _figures(units)
      rng = np.random.default_rng(0)
      boots = [_figures([units[k] for k in rng.integers(0, len(units),
                                                         len(units))])
               for _ in range(n_boot)]
      ci = lambda f: np.percentile([f(b) for b in boots], [2.5, 97.5])
      lo, hi = ci(lambda b: b['lost'][3] - b['lost'][0])
      tl, th = ci(lambda b: b['trained_d'] - b['drawn_d'])
      sl, sh = ci(lambda b: b['trained_share'][3])
      waste = sum(sum(r['tokens_wasted']) for r in recs) / max(
          sum(sum(r['tokens_generated']) for r in recs), 1)
      lines.append(
          f'{regime} {mode:15s} seeds {len(recs)} x {recs[0]["steps"]} steps:'
          f' groups lost in flight {est["lost_all"]:.1%} (by quartile '
          + ', '.join(f'{x:.1%}' for x in est['lost'])
          + f'; longest minus shortest {est["lost"][3] - est["lost"][0]:+.1%}'
          f', 95% {lo:+.1%} to {hi:+.1%}); trained share by quartile '
          + ', '.join(f'{x:.1%}' for x in est['trained_share'])
          + f' (longest 95% {sl:.1%}-{sh:.1%}); mean duration trained '
          f'{est["trained_d"]:.1f} vs drawn {est["drawn_d"]:.1f} '
          f'({est["trained_d"] - est["drawn_d"]:+.1f}, 95% {tl:+.1f} to '
          f'{th:+.1f}); tokens wasted {waste:.1%}')
  return lines


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--model', default='tiny')
  parser.add_argument('--regimes', default=','.join(REGIMES))
  parser.add_argument('--modes', default=','.join(MODES))
  parser.add_argument('--seeds', type=int, default=5)
  parser.add_argument('--steps', type=int, default=60)
  parser.add_argument('--max-rounds', type=int, default=16)
  parser.add_argument('--max-new', type=int, default=512)
  parser.add_argument('--prompt-width', type=int, default=128)
  parser.add_argument('--json', help='results; runs already in it are kept '
                      'and not rerun')
  parser.add_argument('--summarize', metavar='JSON',
                      help='print the summary of a JSON and exit')
  args = parser.parse_args()
  if args.summarize:
    with open(args.summarize) as f:
      print('\n'.join(summarize(json.load(f))))
    return
  tok = tokenizer_lib.ByteTokenizer()
  cfg = model_config.preset(args.model, vocab_size=tok.vocab_size)
  graphdef, params = decoder.init_params(cfg, jax.random.key(0))
  _, lengths = continuous_bench.gsm8k_lengths(args.max_new, args.prompt_width)
  with open(grpo_step._GSM8K) as f:  # pylint: disable=protected-access
    examples = [Example(id=f'gsm8k/{i}', prompt=json.loads(line)['question'],
                        answer='', dataset='gsm8k')
                for i, line in enumerate(f)]
  result = dict(runs=[])
  if args.json and os.path.exists(args.json):
    with open(args.json) as f:
      result = json.load(f)
  regimes = args.regimes.split(',')
  dur = {reg: durations(examples, tok, grpo_step.LengthHook(
      lengths, REGIMES[reg][1]), args.prompt_width) for reg in regimes}
  result.update(
      command=' '.join(['python'] + sys.argv), commit=record.commit(),
      machine=dict(platform=platform.platform(), cpu=environment.cpu_name(),
                   cpus=os.cpu_count(),
                   jax=jax.__version__), args=vars(args),
      durations={**result.get('durations', {}), **dur},
      edges={reg: np.percentile(d, [25, 50, 75]).tolist()
             for reg, d in {**result.get('durations', {}), **dur}.items()})
  done = {(r['regime'], r['mode'], r['seed']) for r in result['runs']}
  for seed in range(args.seeds):
    for regime in regimes:
      for mode in args.modes.split(','):
        if (regime, mode, seed) in done:
          continue
        rec = run(regime, mode, seed, args.steps, args,
                  (graphdef, params, cfg), examples, lengths)
        result['runs'].append(rec)
        print(f'{regime} {mode} seed {seed}: {rec["seconds"]:.0f}s',
              flush=True)
        if args.json:
          record.write_json(args.json, result, indent=None)
  print('\n'.join(summarize(result)))


if __name__ == '__main__':
  main()
