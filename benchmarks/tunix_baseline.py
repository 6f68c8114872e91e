"""Baseline CPU timings of google-tunix's sampler and GRPO learner.

Measures, for the model shapes, batch, lengths and GRPO settings that the
jaxgrpo benchmarks use (B=16 prompts x G=8 samples, prompt length 8,
temperature 1.0, beta 0, one iteration, one minibatch, clip eps 0.2):

  * generation throughput of `tunix.generate.sampler.Sampler`, the engine of
    tunix's "vanilla" rollout: through its public call (string prompts in,
    detokenized text out) and through its jitted prefill and decode alone;
  * the time of one GRPO policy update by the actor trainer that
    `GRPOLearner` configures (loss, gradients and Adam step on B*G sequences),
    apart from the rollout;
  * for context, whole `GRPOLearner.train` steps (rollout, rewards,
    advantages and update).

Tunix runs from its own virtual environment so that its dependencies never
touch the project's (from the repository root):

  python3 -m venv .venv-tunix
  .venv-tunix/bin/pip install -r benchmarks/requirements-tunix.txt
  .venv-tunix/bin/python benchmarks/tunix_baseline.py --config tiny \\
      --json /tmp/tunix_tiny.json
  .venv-tunix/bin/python benchmarks/tunix_baseline.py --config small_10m \\
      --json /tmp/tunix_small_10m.json

The model is tunix's Llama3 (RMSNorm, RoPE, GQA, SwiGLU) with tied embeddings
in float32. Tunix takes prompts as strings, so a character tokenizer with the
id layout of `jaxgrpo.data.tokenizer.CharTokenizer` (PAD 0, BOS 1, EOS 2)
maps them to ids; the vocabulary stays at 32. Generation has no stop token,
so every row decodes `max_new_tokens` tokens, as in jaxgrpo's `Generator`
with `stop_tokens=()`.
"""

import argparse
import dataclasses
import importlib.metadata
import json
import os
import platform
import statistics
import time
from typing import Any, Callable
import warnings

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from tunix.generate import sampler as sampler_lib
from tunix.models.llama3 import model as llama3_lib
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.grpo import grpo_learner as grpo_lib
from tunix.rl.rollout import base_rollout
from tunix.sft import sharding_utils
from tunix.utils import mesh as mesh_lib

# Isolating tunix's stages needs a few of its private methods, named where used.
# pylint: disable=protected-access

# Tunix's trainer finds its mesh through the legacy `with mesh:` context.
warnings.filterwarnings(
    'ignore', message='`with mesh:` context manager has been deprecated')

_MODELS = {
    # jaxgrpo preset 'demo'.
    'tiny': dict(
        vocab_size=32, num_layers=2, embed_dim=128, num_heads=4,
        num_kv_heads=2, head_dim=32, hidden_dim=512),
    # jaxgrpo preset 'small_10m'.
    'small_10m': dict(
        vocab_size=32, num_layers=6, embed_dim=384, num_heads=6,
        num_kv_heads=2, head_dim=64, hidden_dim=1024),
}
_MAX_NEW_TOKENS = {'tiny': 8, 'small_10m': 32}
# A stop id that is never sampled, so every row decodes max_new_tokens.
_NO_STOP = [-1]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Workload:
  """Batch, lengths and GRPO settings shared with the jaxgrpo benchmark."""

  num_prompts: int = 16  # B
  num_generations: int = 8  # G
  prompt_len: int = 8  # P, BOS included; no padding needed
  max_new_tokens: int = 8  # T
  temperature: float = 1.0
  beta: float = 0.0
  epsilon: float = 0.2
  num_iterations: int = 1
  # Tunix's default is 'sequence-mean-token-mean'; jaxgrpo uses token mean.
  loss_agg_mode: str = 'token-mean'
  learning_rate: float = 1e-5
  max_grad_norm: float = 1.0
  seed: int = 0


class CharTokenizer:
  """Character tokenizer with the methods tunix's TokenizerAdapter needs.

  Ids 0-2 are PAD, BOS and EOS; characters take the remaining ids.
  """

  PAD, BOS, EOS = 0, 1, 2

  def __init__(self, vocab_size: int):
    alphabet = ''.join(chr(ord('a') + i) for i in range(26)) + '0123'
    self.alphabet = alphabet[:vocab_size - 3]
    self._ids = {c: i + 3 for i, c in enumerate(self.alphabet)}

  def encode(self, text: str, **unused_kwargs) -> list[int]:
    return [self._ids[c] for c in text]

  def decode(self, ids: list[int], **unused_kwargs) -> str:
    return ''.join(self.alphabet[i - 3] for i in ids if i >= 3)

  def bos_id(self) -> int:
    return self.BOS

  def eos_id(self) -> int:
    return self.EOS

  def pad_id(self) -> int:
    return self.PAD


def _prompts(tokenizer: CharTokenizer, work: Workload) -> list[str]:
  """B distinct prompts of P - 1 characters (the sampler prepends BOS)."""
  rng = np.random.default_rng(work.seed)
  chars = np.array(list(tokenizer.alphabet))
  return [
      ''.join(rng.choice(chars, work.prompt_len - 1))
      for _ in range(work.num_prompts)
  ]


def _model(config: str, mesh: jax.sharding.Mesh, seed: int) -> nnx.Module:
  cfg = llama3_lib.ModelConfig(
      **_MODELS[config], rope_theta=10_000, norm_eps=1e-6, weight_tying=True)
  with jax.set_mesh(mesh):
    return llama3_lib.Llama3(cfg, rngs=nnx.Rngs(seed))


def _times(fn: Callable[[int], Any], repeats: int) -> list[float]:
  """Wall seconds of fn(i) for i in 1..repeats, each run to completion."""
  times = []
  for i in range(1, repeats + 1):
    start = time.perf_counter()
    jax.block_until_ready(fn(i))
    times.append(time.perf_counter() - start)
  return times


def _summary(times: list[float], tokens: int | None = None) -> dict[str, Any]:
  median = statistics.median(times)
  out = dict(median_s=median, min_s=min(times),
             times_s=[round(t, 6) for t in times])
  if tokens is not None:
    out['tokens_per_s'] = tokens / median
  return out


def bench_sampler(
    model: nnx.Module, tokenizer: CharTokenizer, prompts: list[str],
    work: Workload, repeats: int) -> dict[str, Any]:
  """Times B*G-row generation with tunix's `Sampler`.

  Args:
    model: the policy.
    tokenizer: maps prompt strings to ids.
    prompts: B prompt strings; each is repeated G times, as the GRPO learner
      does before its rollout.
    work: lengths and sampling settings.
    repeats: timed calls after a compiling one.

  Returns:
    Timings of the public sampler call and of the jitted prefill and decode.
  """
  sampler = sampler_lib.Sampler(
      model, tokenizer,
      sampler_lib.CacheConfig(
          cache_size=work.prompt_len + work.max_new_tokens,
          num_layers=model.config.num_layers,
          num_kv_heads=model.config.num_kv_heads,
          head_dim=model.config.head_dim))
  rows = [p for p in prompts for _ in range(work.num_generations)]
  tokens = len(rows) * work.max_new_tokens

  def call(seed):
    # top_p=1.0 selects sampling (None would be greedy) without truncation.
    out = sampler(
        rows, max_generation_steps=work.max_new_tokens,
        max_prompt_length=work.prompt_len, temperature=work.temperature,
        top_p=1.0, top_k=None, seed=seed, eos_tokens=_NO_STOP)
    return out.tokens

  start = time.perf_counter()
  generated = sum(len(t) for t in call(0))
  first_call_s = time.perf_counter() - start
  if generated != tokens:
    raise RuntimeError(f'sampler produced {generated} tokens, not {tokens}')
  call_times = _times(call, repeats)

  # The jitted prefill and decode loop alone, without tokenizing prompts or
  # detokenizing the output on the host; these are the calls the public one
  # makes, reached through the sampler's private attributes.
  input_ids = jnp.asarray([sampler.tokenize(p) for p in rows], jnp.int32)
  params = sampler._flattened_transformer_state

  def device_only(seed):
    state = sampler.init_sample_state(
        input_ids, total_sampling_steps=work.prompt_len + work.max_new_tokens,
        include_logits=False, forbidden_token_ids=None,
        temperature=work.temperature, top_p=1.0, top_k=None,
        seed=jax.random.PRNGKey(seed), beam_size=None)
    state = sampler._compiled_prefill_fn(params, state, None, echo=False)
    state = sampler._compiled_decode_fn(params, state)
    return state.token_buffer

  jax.block_until_ready(device_only(0))
  device_times = _times(device_only, repeats)
  return dict(
      generated_tokens=tokens,
      first_call_s=first_call_s,
      sampler_call=_summary(call_times, tokens),
      prefill_and_decode=_summary(device_times, tokens),
  )


def _reward(prompts, completions, **unused_kwargs) -> list[float]:
  """Share of letters from the first half of the alphabet: varies per group."""
  del prompts
  return [sum(c < 'n' for c in s) / max(len(s), 1) for s in completions]


def bench_grpo(
    config: str, mesh: jax.sharding.Mesh, tokenizer: CharTokenizer,
    prompts: list[str], work: Workload, repeats: int,
    learner_steps: int) -> dict[str, Any]:
  """Times tunix's GRPO update and whole `GRPOLearner.train` steps.

  Args:
    config: model shape name.
    mesh: one-device mesh shared by the actor and its rollout, so they share
      weights and need no syncing.
    tokenizer: maps prompt strings to ids.
    prompts: the B prompts of every step.
    work: batch, lengths and GRPO settings.
    repeats: timed updates after a compiling one.
    learner_steps: timed learner steps after a warm-up one; 0 skips them.

  Returns:
    Timings of the update alone and of whole learner steps.
  """
  rollout_config = base_rollout.RolloutConfig(
      max_tokens_to_generate=work.max_new_tokens,
      max_prompt_length=work.prompt_len,
      kv_cache_size=work.prompt_len + work.max_new_tokens,
      temperature=work.temperature, top_p=1.0, top_k=None,
      seed=jax.random.PRNGKey(work.seed), eos_tokens=_NO_STOP)
  roles = rl_cluster_lib.Role
  cluster = rl_cluster_lib.RLCluster(
      actor=_model(config, mesh, work.seed),
      reference=None,  # beta = 0
      tokenizer=tokenizer,
      cluster_config=rl_cluster_lib.ClusterConfig(
          role_to_mesh={
              roles.ACTOR: mesh, roles.REFERENCE: mesh, roles.ROLLOUT: mesh},
          rollout_engine='vanilla',
          offload_to_cpu=False,
          training_config=rl_cluster_lib.RLTrainingConfig(
              actor_optimizer=optax.chain(
                  optax.clip_by_global_norm(work.max_grad_norm),
                  optax.adam(work.learning_rate)),
              eval_every_n_steps=10**9,
              max_steps=learner_steps + 2,
              # One rollout call and one optimizer update per B prompts.
              mini_batch_size=work.num_prompts,
              rollout_micro_batch_size=work.num_prompts,
              compute_logps_micro_batch_size=work.num_prompts),
          rollout_config=rollout_config))
  learner = grpo_lib.GRPOLearner(
      rl_cluster=cluster,
      algo_config=grpo_lib.GRPOConfig(
          num_generations=work.num_generations,
          num_iterations=work.num_iterations,
          beta=work.beta,
          epsilon=work.epsilon,
          loss_agg_mode=work.loss_agg_mode),
      reward_fns=_reward)
  rows = [p for p in prompts for _ in range(work.num_generations)]

  # The update alone: the learner's own rollout and advantage code makes one
  # TrainExample of B*G sequences, then the actor trainer's jitted step runs
  # on it under the mesh and input sharding that `Trainer.train` uses.
  example = learner._generate_and_compute_advantage({'prompts': rows})
  trainer = cluster.actor_trainer
  with mesh:
    example = sharding_utils.shard_input(
        example, trainer.config.data_sharding_axis)
    train_step, _ = trainer.jit_train_and_eval_step(cache_nnx_graph=True)
    start = time.perf_counter()
    jax.block_until_ready(train_step(example))
    update_first_s = time.perf_counter() - start
    update_times = _times(lambda _: train_step(example), repeats)

  # Whole steps through the public train loop. A batch is taken once the
  # previous step has finished, so the gaps between takes are step times.
  # The rollout config's seed is the key of every rollout, so each step
  # gets a new one.
  starts = []

  def batches():
    for step in range(learner_steps + 2):
      rollout_config.seed = jax.random.fold_in(
          jax.random.PRNGKey(work.seed), step + 1)
      starts.append(time.perf_counter())
      yield {'prompts': np.array(prompts)}

  if learner_steps:
    learner.train(batches())
  # The first step is a warm-up; the last one's end is not observed.
  step_times = list(np.diff(starts))[1:]
  return dict(
      sequences=int(example.completion_ids.shape[0]),
      completion_len=int(example.completion_ids.shape[1]),
      update_first_call_s=update_first_s,
      update=_summary(update_times),
      learner_step=_summary(step_times) if step_times else None,
  )


def _versions() -> dict[str, str]:
  names = ['google-tunix', 'jax', 'jaxlib', 'flax', 'optax', 'numpy']
  return {n: importlib.metadata.version(n) for n in names}


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--config', choices=sorted(_MODELS), default='tiny')
  parser.add_argument('--json', help='also write the results to this file')
  parser.add_argument('--repeats', type=int, default=5,
                      help='timed generation calls and updates (median)')
  parser.add_argument('--learner-steps', type=int, default=3,
                      help='timed whole learner steps after a warm-up one '
                      '(0 skips them)')
  args = parser.parse_args(argv)

  load_at_start = os.getloadavg()[0]
  work = Workload(max_new_tokens=_MAX_NEW_TOKENS[args.config])
  mesh = mesh_lib.create_mesh((1, 1), ('fsdp', 'tp'))
  tokenizer = CharTokenizer(_MODELS[args.config]['vocab_size'])
  prompts = _prompts(tokenizer, work)
  model = _model(args.config, mesh, work.seed)
  num_params = sum(
      x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  with mesh:  # As the rollout runs inside the learner.
    generation = bench_sampler(model, tokenizer, prompts, work, args.repeats)
  del model
  grpo = bench_grpo(args.config, mesh, tokenizer, prompts, work, args.repeats,
                    args.learner_steps)

  default_agg = next(f.default for f in dataclasses.fields(grpo_lib.GRPOConfig)
                     if f.name == 'loss_agg_mode')
  results = dict(
      library='tunix',
      versions=_versions(),
      python=platform.python_version(),
      backend=jax.default_backend(),
      cpu_count=os.cpu_count(),
      # The machine is shared; a load above cpu_count means contended runs.
      load_average_1m=dict(start=load_at_start, end=os.getloadavg()[0]),
      config=args.config,
      model=dict(**_MODELS[args.config], num_params=int(num_params),
                 family='tunix llama3', weight_tying=True, dtype='float32'),
      workload=dataclasses.asdict(work),
      tunix_default_loss_agg_mode=default_agg,
      medians=dict(
          generation_tokens_per_s=generation['sampler_call']['tokens_per_s'],
          prefill_and_decode_tokens_per_s=(
              generation['prefill_and_decode']['tokens_per_s']),
          grpo_update_s=grpo['update']['median_s'],
          learner_step_s=(grpo['learner_step'] or {}).get('median_s'),
      ),
      generation=generation,
      grpo=grpo,
  )
  text = json.dumps(results, indent=2)
  print(text)
  if args.json:
    with open(args.json, 'w') as f:
      f.write(text + '\n')


if __name__ == '__main__':
  main()
