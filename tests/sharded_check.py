"""Sharded learner and generator against unsharded ones, on 8 CPU devices.

Run by tests/test_sharding.py in a subprocess, because the device count is
fixed when jax is imported:

  python -m tests.sharded_check OUT.json --layouts 8,1,1 1,4,2
  python -m tests.sharded_check OUT.json --train_run WORKDIR
  python -m tests.sharded_check OUT.json --lora 1,4,2
  python -m tests.sharded_check OUT.json --kv_cache
  python -m tests.sharded_check OUT.json --eval_cli ARGS...

For each mesh layout (data, fsdp, tensor) it runs one GRPO train step from
the same state and batch as the unsharded step, greedy and sampled
generation with the same rng, and evaluation of a prompt count that does not
divide the batch devices. `--train_run` runs the demo's runlocal config for
2 steps on fsdp=4, tensor=2, then resumes it for a third (and keeps a
copy of its step-2 workdir, WORKDIR.step2). `--lora` runs a
LoRA train step (KL to the base) on each layout against the unsharded one.
`--kv_cache` compares the rollout KV cache's bytes per device that
`build.kv_cache` logs and checks with those the engine allocates on device
0, for layouts and `mesh.rules` that place it differently. `--eval_cli`
runs `jaxgrpo-eval` with ARGS (its mesh from `--config.mesh.*`), noting its
exit code, output and how many devices hold the params.
OUT.json holds the largest differences, the placements seen and the run's
log, for the test to assert on.
"""

import argparse
import os
import shutil
import time

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '')
                           + ' --xla_force_host_platform_device_count=8')
os.environ['JAX_PLATFORMS'] = 'cpu'

# pylint: disable=g-import-not-at-top,wrong-import-position
import json

import jax
import numpy as np

from jaxgrpo import evaluate
from jaxgrpo import optimizer as optimizer_lib
from jaxgrpo import sharding
from jaxgrpo import train
from jaxgrpo import train_state as train_state_lib
from jaxgrpo import train_step as train_step_lib
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.example import Example
from jaxgrpo.generate import sampling as sampling_lib
from jaxgrpo.generate.generator import Generator
from jaxgrpo.model import config as model_config
from jaxgrpo.model import lora
from jaxgrpo.typing import TrainBatch
from jaxgrpo.verifiers import base
from tests import flaky_verifiers
from tests import tiny

B, G, P, T = 4, 4, 6, 5


def _batch(vocab: int) -> TrainBatch:
  rng = np.random.default_rng(1)
  prompt_mask = np.arange(P)[None] >= rng.integers(0, P - 1, B)[:, None]
  lengths = rng.integers(1, T + 1, B * G)
  return TrainBatch(
      prompt_tokens=np.where(prompt_mask, rng.integers(1, vocab, (B, P)),
                             0).astype(np.int32),
      prompt_mask=prompt_mask,
      completion_tokens=rng.integers(1, vocab, (B * G, T)).astype(np.int32),
      completion_mask=np.arange(T)[None] < lengths[:, None],
      old_logps=-rng.uniform(1.0, 3.0, (B * G, T)).astype(np.float32),
      advantages=rng.normal(size=B * G).astype(np.float32),
  )


def _max_diff(a, b) -> float:
  pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
  return max(float(np.max(np.abs(np.asarray(x, np.float64)
                                  - np.asarray(y, np.float64))))
             for x, y in pairs)


class _LengthScorer:
  """Rewards each completion by its text, and keeps the texts."""

  def __init__(self):
    self.texts = []

  def score(self, texts, examples):
    del examples
    self.texts.extend(texts)
    return np.array([len(t) % 3 for t in texts], np.float32), base.ScoreStats()


def _check_layouts(out: dict, layouts: list[tuple[int, int, int]]) -> None:
  tokenizer = tokenizer_lib.make_tokenizer('char')
  graphdef, params = tiny.random_model(vocab_size=tokenizer.vocab_size)
  model_cfg = model_config.ModelConfig.tiny(vocab_size=tokenizer.vocab_size)
  optimizer = optimizer_lib.make_optimizer(
      learning_rate=1e-3, warmup_steps=0, total_steps=10, max_grad_norm=1.0,
      weight_decay=0.01, schedule='constant')
  # beta = 0 keeps the reference (placed, passed through) without the
  # extra forward pass, which would only add compile time here.
  kw = dict(graphdef=graphdef, optimizer=optimizer,
            loss_cfg=train_step_lib.LossConfig(), num_minibatches=2)
  batch = _batch(tokenizer.vocab_size)
  rng = jax.random.key(7)

  def fresh_state():
    return train_state_lib.create_train_state(
        graphdef, jax.tree.map(np.copy, params), optimizer,
        keep_reference=True)

  want_state, want_metrics = train_step_lib.make_train_step(**kw)(
      fresh_state(), batch, rng)
  want_state = jax.device_get(want_state)
  want_metrics = jax.device_get(want_metrics)

  samplings = {'greedy': sampling_lib.Sampling(temperature=0.0),
               'sampled': sampling_lib.Sampling(temperature=1.0, top_k=8)}
  gens = {name: Generator(graphdef=graphdef, model_cfg=model_cfg,
                          sampling=s, max_new_tokens=T, num_samples=2,
                          stop_tokens=(tokenizer.eos_id,),
                          pad_id=tokenizer.pad_id)
          for name, s in samplings.items()}
  prompts = np.random.default_rng(2).integers(3, tokenizer.vocab_size,
                                              (8, P)).astype(np.int32)
  prompt_mask = np.arange(P)[None] >= np.arange(8)[:, None] % 3
  gen_rng = jax.random.key(3)
  want_gen = {name: jax.device_get(g.generate(params, prompts, prompt_mask,
                                              gen_rng))
              for name, g in gens.items()}
  examples = [Example(id=str(i), prompt=f'{i}+{2 * i}=', answer=str(3 * i))
              for i in range(5)]
  eval_kw = dict(max_prompt_len=P, chunk_size=5)
  want_scorer = _LengthScorer()
  want_eval = evaluate.sample_rewards(gens['sampled'], params, tokenizer,
                                      examples, want_scorer, gen_rng,
                                      **eval_kw)

  for layout in layouts:
    t0 = time.perf_counter()
    result = {}
    with sharding.use_mesh(sharding.make_mesh(*layout)):
      state = fresh_state()
      shardings = sharding.train_state_shardings(state)
      state = sharding.shard(state, shardings)
      result['embedding_spec'] = str(state.params['embedding'].sharding.spec)
      up = state.params['blocks'][0]['mlp']['up']['w']
      result['mlp_up_spec'] = str(up.sharding.spec)
      mu = state.opt_state[1][0].mu['blocks'][0]['mlp']['up']['w']
      result['mlp_up_mu_spec'] = str(mu.sharding.spec)
      result['ref_up_spec'] = str(
          state.ref_params['blocks'][0]['mlp']['up']['w'].sharding.spec)
      step = train_step_lib.make_train_step(
          **kw, state_shardings=shardings,
          batch_shardings=sharding.batch_shardings(batch))
      got_state, got_metrics = step(state, batch, rng)
      result['out_mlp_up_spec'] = str(
          got_state.params['blocks'][0]['mlp']['up']['w'].sharding.spec)
      result['params_diff'] = _max_diff(got_state.params, want_state.params)
      result['ref_params_diff'] = _max_diff(got_state.ref_params,
                                            want_state.ref_params)
      result['opt_state_diff'] = _max_diff(got_state.opt_state,
                                           want_state.opt_state)
      result['metrics_diff'] = {
          k: abs(float(got_metrics[k]) - float(want_metrics[k]))
          for k in want_metrics}
      result['step'] = int(got_state.step)

      placed = sharding.shard(params, sharding.param_shardings(params))
      decode_state = gens['greedy'].prefill(placed, prompts, prompt_mask,
                                            gen_rng)
      result['cache_spec'] = str(decode_state.cache[0]['k'].sharding.spec)
      result['tokens_spec'] = str(decode_state.tokens.sharding.spec)
      for name, gen in gens.items():
        got = jax.device_get(gen.generate(placed, prompts, prompt_mask,
                                          gen_rng))
        want = want_gen[name]
        result[f'{name}_tokens_equal'] = bool(
            np.array_equal(got.tokens, want.tokens))
        result[f'{name}_logps_diff'] = float(
            np.max(np.abs(got.logps - want.logps)))
        result[f'{name}_mask_equal'] = bool(np.array_equal(got.mask,
                                                           want.mask))
      scorer = _LengthScorer()
      got_eval = evaluate.sample_rewards(gens['sampled'], placed, tokenizer,
                                         examples, scorer, gen_rng,
                                         **eval_kw)
      result['eval_rewards_equal'] = bool(np.array_equal(got_eval,
                                                         want_eval))
      result['eval_texts_equal'] = scorer.texts == want_scorer.texts
    result['seconds'] = time.perf_counter() - t0
    out['layouts'][','.join(map(str, layout))] = result


def _check_train_run(out: dict, workdir: str) -> None:
  c = flaky_verifiers.informative_demo_config()
  c.mesh.fsdp = 4
  c.mesh.tensor = 2
  c.rollout.round_size = 3  # padded to the 4 batch devices
  lines = []
  t0 = time.perf_counter()
  summary = train.run(c, workdir, log=lines.append)
  # The test resumes this copy on one device, without a mesh.
  shutil.copytree(workdir, workdir + '.step2')
  # Resuming restores the checkpoint straight onto the mesh.
  c.total_steps = 3
  resumed = train.run(c, workdir, log=lines.append)
  out['train_run'] = {
      'steps': summary.steps,
      'resumed_from': resumed.resumed_from,
      'resumed_steps': resumed.steps,
      'seconds': time.perf_counter() - t0,
      'log': lines,
  }


def _check_lora(out: dict, layouts: list[tuple[int, int, int]]) -> None:
  graphdef, params = tiny.random_model(vocab_size=16)
  lora_graphdef, adapter = lora.attach(
      graphdef, params, lora.LoraSection(rank=4, alpha=8.0),
      jax.random.key(1))
  # Non-zero B, so that the policy differs from its reference.
  adapter = jax.tree.map(lambda x: x + 0.01, adapter)
  optimizer = optimizer_lib.make_optimizer(
      learning_rate=1e-3, warmup_steps=0, total_steps=10, max_grad_norm=1.0)
  kw = dict(graphdef=lora_graphdef, optimizer=optimizer,
            loss_cfg=train_step_lib.LossConfig(beta=0.1), num_minibatches=2,
            base_graphdef=graphdef)
  batch, rng = _batch(16), jax.random.key(7)

  def fresh_state():
    return train_state_lib.create_train_state(
        lora_graphdef, jax.tree.map(np.copy, adapter), optimizer,
        keep_reference=False, base=jax.tree.map(np.copy, params))

  want, want_metrics = jax.device_get(
      train_step_lib.make_train_step(**kw)(fresh_state(), batch, rng))
  out['lora'] = {}
  for layout in layouts:
    result = {}
    with sharding.use_mesh(sharding.make_mesh(*layout)):
      state = fresh_state()
      shardings = sharding.train_state_shardings(state)
      state = sharding.shard(state, shardings)
      q = state.params['blocks'][0]['attn']['q']
      result['q_a_spec'] = str(q['w_lora_a'].sharding.spec)
      result['q_b_spec'] = str(q['w_lora_b'].sharding.spec)
      result['base_up_spec'] = str(
          state.base['blocks'][0]['mlp']['up']['w'].sharding.spec)
      step = train_step_lib.make_train_step(
          **kw, state_shardings=shardings,
          batch_shardings=sharding.batch_shardings(batch))
      got, got_metrics = step(state, batch, rng)
      result['adapter_diff'] = _max_diff(got.params, want.params)
      result['adapter_moved'] = _max_diff(want.params, adapter)
      result['base_diff'] = _max_diff(got.base, params)
      result['opt_state_diff'] = _max_diff(got.opt_state, want.opt_state)
      result['metrics_diff'] = max(
          abs(float(got_metrics[k]) - float(want_metrics[k]))
          for k in want_metrics)
      result['kl'] = float(want_metrics['train/kl'])
    out['lora'][','.join(map(str, layout))] = result


def _check_kv_cache(out: dict) -> None:
  # pylint: disable-next=g-import-not-at-top
  from jaxgrpo import build, config_lib
  from jaxgrpo.model import attention
  from jaxgrpo.configs import demo
  model_cfg = model_config.ModelConfig.tiny(vocab_size=16)
  for layout, rules in (((8, 1, 1), ()), ((8, 1, 1), (('batch', None),)),
                        ((2, 2, 2), ()), ((2, 2, 2), (('kv_heads', None),)),
                        ((1, 1, 8), ())):
    for engine in ('static', 'continuous'):
      c = demo.get_config('runlocal')
      c.rollout.engine, c.rollout.slots = engine, 8
      cfg = config_lib.from_config_dict(c)
      mesh = sharding.make_mesh(*layout)
      with sharding.use_mesh(mesh, sharding.merge_rules(rules)):
        logged, rows, positions = build.kv_cache(cfg, model_cfg)
        cache = jax.jit(lambda: attention.init_cache(  # pylint: disable=cell-var-from-loop
            model_cfg, rows, positions,
            window_rings=engine == 'static'))()  # pylint: disable=cell-var-from-loop
      on_device_0 = sum(
          shard.data.nbytes for x in jax.tree.leaves(cache)
          for shard in x.addressable_shards if shard.device == jax.devices()[0])
      out.setdefault('kv_cache', []).append({
          'layout': list(layout), 'rules': [list(r) for r in rules],
          'engine': engine, 'logged': logged, 'allocated': on_device_0})


def _check_eval_cli(out: dict, argv: list[str]) -> None:
  # pylint: disable=g-import-not-at-top
  import contextlib
  import io
  from unittest import mock
  from jaxgrpo import model_spec
  from jaxgrpo.cli import evaluate as evaluate_cli
  from jaxgrpo.model import decoder
  from tests.stratify import fixtures
  # pylint: enable=g-import-not-at-top
  load, devices = model_spec.load_resolved, []

  def spy(*args, **kwargs):
    model = load(*args, **kwargs)
    devices.append(max(len(x.sharding.device_set)
                       for x in jax.tree.leaves(model.params)))
    return model

  stdout, stderr = io.StringIO(), io.StringIO()
  with mock.patch.object(model_spec, 'load_resolved', spy), \
      mock.patch.object(decoder, 'init_params', fixtures.fast_init_params), \
      contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
    out['eval_code'] = evaluate_cli.main(argv)
  out.update(eval_stdout=stdout.getvalue(), eval_stderr=stderr.getvalue(),
             eval_param_devices=devices)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument('out')
  parser.add_argument('--layouts', nargs='*', default=[],
                      help='data,fsdp,tensor mesh shapes to check')
  parser.add_argument('--train_run', help='workdir of a 2-step train.run')
  parser.add_argument('--lora', nargs='*', default=[],
                      help='data,fsdp,tensor mesh shapes of the LoRA step')
  parser.add_argument('--kv_cache', action='store_true',
                      help='the KV cache bytes logged against allocated')
  parser.add_argument('--eval_cli', nargs=argparse.REMAINDER,
                      help='jaxgrpo-eval arguments (last)')
  args = parser.parse_args()
  out = {'devices': jax.device_count(), 'layouts': {}}
  t0 = time.perf_counter()
  if args.layouts:
    _check_layouts(out, [tuple(int(n) for n in layout.split(','))
                         for layout in args.layouts])
  if args.train_run:
    _check_train_run(out, args.train_run)
  if args.lora:
    _check_lora(out, [tuple(int(n) for n in layout.split(','))
                      for layout in args.lora])
  if args.kv_cache:
    _check_kv_cache(out)
  if args.eval_cli:
    _check_eval_cli(out, args.eval_cli)
  out['seconds'] = time.perf_counter() - t0
  with open(args.out, 'w') as f:
    json.dump(out, f, indent=1)


if __name__ == '__main__':
  main()
