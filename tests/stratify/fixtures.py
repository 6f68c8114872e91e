"""Shared pieces of the stratify tests: scripted datasets and a tiny run."""

import functools
import os
import tempfile
import time

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo import checkpoint as checkpoint_lib
from jaxgrpo import train
from jaxgrpo import verifiers
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.model import decoder
from jaxgrpo.stratify import runner
from jaxgrpo.verifiers import pool as verifier_pool
from tests import scripted
from tests import test_train

ALPHABET = '0123456789=abcdefghijklmnopqrstuvwxyz'
RATES = (0.0, 0.25, 0.5, 0.75, 1.0)
# Steps of the tiny run's checkpoints: 0 from the run, 3 written after it.
RUN_STEPS = (0, 3)


class KeyedGenerator(scripted.ScriptedGenerator):
  """The scripted generator drawing from the key it is called with.

  Like the real generator, what a call samples then depends on its key
  only, not on the calls before it; `crash_after` calls, it raises Crash.
  """

  def __init__(self, *args, crash_after: int | None = None, delay_s=0.0,
               **kwargs):
    super().__init__(*args, **kwargs)
    self.crash_after = crash_after
    self.delay_s = delay_s

  def generate(self, params, tokens, mask, rng):
    if self.crash_after is not None and self.calls >= self.crash_after:
      raise Crash(f'crash after {self.calls} calls')
    if self.delay_s:
      time.sleep(self.delay_s)
    self.rng = np.random.default_rng(
        np.asarray(jax.random.key_data(rng)).tolist())
    return super().generate(params, tokens, mask, rng)


class Crash(Exception):
  """Stands for the process dying mid-run."""


def scripted_dataset(n: int = 40, name: str = 'a'):
  """n examples with pass rates cycling through RATES, and the tokenizer."""
  tok = tokenizer_lib.CharTokenizer(alphabet=ALPHABET)
  examples = scripted.make_examples(name, n)
  rates = {ex.prompt: RATES[i % len(RATES)] for i, ex in enumerate(examples)}
  return tok, examples, rates


def stratify_scripted(out_dir: str, *, n: int = 40, k: int = 8, chunk=8,
                      shard: int = 0, num_shards: int = 1,
                      crash_after=None, delay_s=0.0, tag='scripted',
                      limit=None, verifier=None):
  """Runs the runner's core over a scripted dataset; (counts, generator).
  `verifier`: the spec noted as the dataset's (it scores with exact_match)."""
  tok, examples, rates = scripted_dataset(n)
  gen = KeyedGenerator(tok, examples, rates, group_size=k,
                       crash_after=crash_after, delay_s=delay_s)
  settings = runner.Settings(seed=0, threshold=1.0, max_prompt_len=8,
                             chunk=chunk, batch=chunk, shard=shard,
                             num_shards=num_shards, limit=limit)
  counts = runner.stratify(
      out_dir, tag=tag,
      info={'spec': 'scripted', 'policy': 'scripted', 'config': '',
            'sampling': {}, **({'verifiers': {'a': verifier}}
                               if verifier is not None else {})},
      generator=gen, params=None, tokenizer=tok,
      scorer=verifier_pool.Scorer(verifiers.get('exact_match')),
      datasets=[(0, 'a', examples)], settings=settings, progress=False)
  return counts, gen


def run_config(**overrides):
  """The tiny demo config of the run below (no warm start, no workers)."""
  c = test_train._config(**overrides)  # pylint: disable=protected-access
  c.data.datasets[0]['verifier'] = 'exact_match'
  c.verify.imports = ()
  c.verify.workers = 0
  c.data.datasets[0]['num_eval'] = 1
  return c


def fast_init_params(cfg, rng):
  """`decoder.init_params` filled from numpy: running the initializers op
  by op costs seconds on CPU (as in tests/tiny.py)."""
  del rng
  graphdef, abstract = decoder.abstract_params(cfg)
  gen = np.random.default_rng(0)
  return graphdef, jax.tree.map(
      lambda x: jnp.asarray(gen.normal(1.0 if x.ndim == 1 else 0.0, 0.1,
                                       x.shape), x.dtype), abstract)


@functools.cache
def run_workdir() -> str:
  """A tiny run's workdir with checkpoints at RUN_STEPS.

  Step 0 is what `train.run` saves before its first step; step 3 holds the
  same train state with params + 1, saved the same way, so the steps are
  told apart without the cost of training.
  """
  workdir = tempfile.mkdtemp(prefix='stratify_run',
                             dir=absltest.get_default_test_tmpdir())
  train.run(run_config(total_steps=0), workdir, log=lambda _: None)
  directory = os.path.join(workdir, 'checkpoints')
  state = checkpoint_lib.load_state_arrays(directory, 0)
  state['params'] = jax.tree.map(lambda x: x + 1, state['params'])
  ckpt = checkpoint_lib.Checkpointer(directory, every=1, max_to_keep=5)
  ckpt.save(RUN_STEPS[1], state, ckpt.restore_data(0), ckpt.read_meta(0))
  ckpt.close()
  return workdir
