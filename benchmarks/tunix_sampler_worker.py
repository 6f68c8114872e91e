"""tunix's `Sampler` as a worker process for benchmarks/tunix_generation.py.

Runs in tunix's own environment (see benchmarks/tunix_baseline.py):

  .venv-tunix/bin/python benchmarks/tunix_sampler_worker.py WORKLOAD.npz

WORKLOAD.npz holds the prompts `tokens` [B, P] (no padding), the per-row
stop lengths `stop_at` [R = B * G] and the scalars `samples` (G), `slots`
(rows per sampler call), `max_new`, `stop` and `pad`. The model is tunix's
Llama3 in the shape of jaxgrpo's `small_10m` preset (f32, tied
embeddings).

The worker compiles, prints one JSON line, then answers each command line on
stdin with one JSON line on stdout:

  device SEED  time the jitted prefill and decode alone
  call SEED    time the public `Sampler.__call__` (prompt strings in, text
               out: host-side tokenising, padding and detokenising included)
  quit

Either way the R rows run in calls of `slots` rows (slots / G prompts, each
repeated G times as tunix's GRPO learner does before its rollout), and only
those calls are timed; the benchmark hook's per-call setup is not.

Rows stop at the drawn lengths through `ForcedStop`, a wrapper module with
the same job as jaxgrpo's `stop_at` hook: the stop token is masked out of
the logits before a row's drawn length and forced at it. tunix's decode loop
then ends when every row of the call has emitted a stop token (its
`while_loop` runs while any row is not done), as jaxgrpo's static generator
does.
"""

import json
import sys
import time
import warnings

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
from tunix.generate import sampler as sampler_lib
from tunix.utils import mesh as mesh_lib

import tunix_baseline  # pylint: disable=g-bad-import-order

# The sampler reaches its jitted prefill and decode through private attributes;
# the device-only timing calls them as its public __call__ does.
# pylint: disable=protected-access

warnings.filterwarnings('ignore', category=DeprecationWarning)


class StopPosition(nnx.Variable):
  """Per-row position whose logits must yield the stop token."""


class ForcedStop(nnx.Module):
  """tunix's Llama3 with each row's stop token forced at a given position.

  The logits at absolute position p produce the token at p + 1. For row r,
  the stop token is forbidden while p < stop_pos[r] and forced at
  p == stop_pos[r]; after that the row is done and its tokens are ignored.
  """

  def __init__(self, model: nnx.Module, rows: int, stop: int):
    self.model = model
    self.stop = stop
    self.stop_pos = StopPosition(jnp.full((rows,), -1, jnp.int32))

  @property
  def config(self):
    return self.model.config

  @property
  def num_embed(self) -> int:
    return self.model.num_embed

  def __call__(self, input_tokens, positions, cache, attention_mask):
    logits, cache = self.model(input_tokens, positions, cache, attention_mask)
    last = logits[:, -1]  # [rows, V]: the one the sampler draws from
    pos = positions[:, -1][:, None]
    stop_pos = self.stop_pos.value[:, None]
    is_stop = jnp.arange(last.shape[-1])[None] == self.stop
    last = jnp.where(is_stop & (pos < stop_pos), -jnp.inf, last)
    last = jnp.where(pos == stop_pos,
                     jnp.where(is_stop, 0.0, -jnp.inf), last)
    return logits.at[:, -1].set(last), cache


class IdTokenizer:
  """Strings of space-separated ids; what tunix's TokenizerAdapter needs."""

  def __init__(self, pad: int, eos: int):
    self._pad, self._eos = pad, eos

  def encode(self, text: str, **unused_kwargs) -> list[int]:
    return [int(t) for t in text.split()]

  def decode(self, ids: list[int], **unused_kwargs) -> str:
    return ' '.join(str(i) for i in ids)

  def bos_id(self):
    return None  # prompts carry their own first token

  def eos_id(self) -> int:
    return self._eos

  def pad_id(self) -> int:
    return self._pad


class Worker:
  """The sampler, the workload and the two timed paths."""

  def __init__(self, path: str):
    w = np.load(path)
    self.tokens = w['tokens']
    self.stop_at = w['stop_at']
    self.g, self.slots = int(w['samples']), int(w['slots'])
    self.max_new, self.stop = int(w['max_new']), int(w['stop'])
    self.pad = int(w['pad'])
    self.p = self.tokens.shape[1]
    self.mesh = mesh_lib.create_mesh((1, 1), ('fsdp', 'tp'))
    model = tunix_baseline._model('small_10m', self.mesh, 0)
    self.num_params = int(sum(
        x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))))
    self.model = ForcedStop(model, self.slots, self.stop)
    cfg = model.config
    self.sampler = sampler_lib.Sampler(
        self.model, IdTokenizer(self.pad, self.stop),
        sampler_lib.CacheConfig(
            cache_size=self.p + self.max_new, num_layers=cfg.num_layers,
            num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim))
    rows = np.repeat(self.tokens, self.g, axis=0)
    self.rows = rows
    self.strings = [' '.join(str(int(t)) for t in r) for r in rows]

  def _set_stops(self, stop_at):
    # Prompts fill all P columns, so the last prompt token sits at position
    # P - 1 and the k-th generated token at P - 1 + k.
    self.model.stop_pos.value = jnp.asarray(self.p - 2 + stop_at, jnp.int32)
    self.sampler.transformer_state = nnx.variables(self.model)

  def run(self, mode: str, seed: int, stop_at=None):
    """Seconds spent in timed calls, useful tokens, decode steps."""
    stop_at = self.stop_at if stop_at is None else stop_at
    seconds, useful, steps = 0.0, 0, 0
    for i in range(0, len(self.rows), self.slots):
      sl = slice(i, i + self.slots)
      self._set_stops(stop_at[sl])
      key = jax.random.fold_in(jax.random.PRNGKey(seed), i)
      if mode == 'device':
        self.sampler.eos_ids = jnp.array([self.stop])
        state = self.sampler.init_sample_state(
            jnp.asarray(self.rows[sl], jnp.int32),
            total_sampling_steps=self.p + self.max_new, include_logits=False,
            forbidden_token_ids=None, temperature=1.0, top_p=1.0, top_k=None,
            seed=key, beam_size=None)
        params = self.sampler._flattened_transformer_state
        jax.block_until_ready(state)
        t0 = time.perf_counter()
        state = self.sampler._compiled_prefill_fn(params, state, None,
                                                  echo=False)
        state = self.sampler._compiled_decode_fn(params, state)
        buf = jax.block_until_ready(state.token_buffer)
        seconds += time.perf_counter() - t0
        gen = np.asarray(buf)[:, self.p:]
        lengths = [int(np.argmax(r == self.stop)) + 1 if (r == self.stop).any()
                   else self.max_new for r in gen]
        steps += int(state.decoding_step) - (self.p - 1)
      else:
        with self.mesh:
          t0 = time.perf_counter()
          out = self.sampler(
              self.strings[sl], max_generation_steps=self.max_new,
              max_prompt_length=self.p, temperature=1.0, top_p=1.0,
              top_k=None, seed=key, eos_tokens=[self.stop])
          seconds += time.perf_counter() - t0
        # tunix cuts each row before its first stop token.
        lengths = [len(t) + 1 for t in out.tokens]
        steps += max(lengths)
      if list(lengths) != [int(n) for n in stop_at[sl]]:
        raise RuntimeError(f'rows stopped at {lengths}, not {stop_at[sl]}')
      useful += sum(lengths)
    return dict(seconds=seconds, useful=useful, steps=steps)


def main():
  worker = Worker(sys.argv[1])
  t0 = time.perf_counter()
  with worker.mesh:
    ones = np.ones_like(worker.stop_at)
    worker.run('device', 0, ones)
    worker.run('call', 0, ones)
  import importlib.metadata  # pylint: disable=g-import-not-at-top
  print(json.dumps(dict(
      ready=True, compile_s=time.perf_counter() - t0,
      params=worker.num_params, jax=jax.__version__,
      tunix=importlib.metadata.version('google-tunix'))), flush=True)
  for line in sys.stdin:
    cmd = line.split()
    if not cmd or cmd[0] == 'quit':
      break
    with worker.mesh:
      print(json.dumps(worker.run(cmd[0], int(cmd[1]))), flush=True)


if __name__ == '__main__':
  main()
