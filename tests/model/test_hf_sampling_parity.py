"""What the learner scores is what the generator sampled, on HF families.

Tiny random Llama 3 (RoPE scaling), Qwen2 (qkv bias), Qwen3 (q/k norm),
Gemma 2 (soft-capped attention and logits) and Gemma 3 (local and global
layers, local RoPE base, `query_pre_attn_scalar`) checkpoints are loaded
with `hf.load`; the generator samples left-padded prompts of different
lengths at temperature 1, past the sliding window, and the learner's
log-probs of those tokens (`logprobs.completion_logprobs`, as the train
step computes them) must equal the sampling log-probs to float32
rounding, so the GRPO ratio is 1 on a step's first update; transformers'
log-probs of the same sequences too. With a LoRA adapter (non-zero B) and
the continuous engine as well (Gemma 3), and remat keeps the gradients.
A LoRA run of 2 GRPO steps from a Gemma 3 directory exports a merged
checkpoint whose transformers logits are the trained model's.
"""

import os
import shutil

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo import model_spec
from jaxgrpo import train
from jaxgrpo import train_state
from jaxgrpo.cli import export
from jaxgrpo.generate import continuous
from jaxgrpo.generate import generator as generator_lib
from jaxgrpo.generate import keys
from jaxgrpo.generate.sampling import Sampling
from jaxgrpo.model import hf
from jaxgrpo.model import lora
from jaxgrpo.reporting import metrics as metrics_lib
from jaxgrpo.rl import logprobs
from jaxgrpo.typing import TrainBatch
from tests.model import test_hf_gemma_parity as gemma
from tests.model import test_hf_parity as parity
from tests.model import test_pretrained as pretrained_test

# pylint: disable=g-import-not-at-top
if parity._HAVE_HF:
  import torch
  import transformers

_G, _T = 2, 12
# Measured: at most 7e-6 (learner or transformers against the sampler).
_ATOL = 2e-5
_FAMILIES = {name: (cls, kw) for name, cls, kw in (
    parity._FAMILIES + gemma._FAMILIES)}
_PICK = [(name, name) for name in (
    'llama3_rope_untied', 'qwen2_tied', 'qwen3_untied', 'gemma2_softcap',
    'gemma3_local_global')]


def _hf_model(name: str):
  config_class, overrides = _FAMILIES[name]
  if name.startswith('gemma'):
    return gemma.GemmaParityTest._model(None, config_class, overrides)
  return parity._hf_model(config_class, seed=len(overrides), **overrides)


def _randomized(adapter):
  """The adapter with every A and B drawn at random (B starts at zero)."""
  leaves, tree = jax.tree.flatten(adapter)
  keys_ = jax.random.split(jax.random.key(5), len(leaves))
  return jax.tree.unflatten(tree, [
      0.3 * jax.random.normal(k, x.shape, x.dtype)
      for k, x in zip(keys_, leaves)])


_learner = jax.jit(logprobs.completion_logprobs, static_argnums=(0, 3, 4))


@absltest.skipUnless(parity._HAVE_HF, parity._SKIP)
class SamplingParityTest(parity.TorchParityCase):

  def _load(self, name):
    model = _hf_model(name)
    src = self.create_tempdir('src').full_path
    model.save_pretrained(src, safe_serialization=True)
    return (model,) + hf.load(src)

  def _sample(self, graphdef, cfg, params, engine='static'):
    gen = generator_lib.Generator(
        graphdef=graphdef, model_cfg=cfg, sampling=Sampling(temperature=1.0),
        max_new_tokens=_T, num_samples=_G)
    args = (params, jnp.asarray(self.tokens), jnp.asarray(self.mask),
            jax.random.key(0))
    prompt_keys = keys.prompt_keys(jax.random.key(3), ['a', 'b', 'c'], 0)
    if engine == 'static':
      out = gen.generate(*args)
    else:
      out = continuous.ContinuousGenerator(
          generator=gen, slots=4, chunk=3, buckets=(4,)).generate(
              *args, prompt_keys=prompt_keys)
    return TrainBatch(
        prompt_tokens=jnp.asarray(self.tokens),
        prompt_mask=jnp.asarray(self.mask),
        completion_tokens=jnp.asarray(out.tokens),
        completion_mask=jnp.asarray(out.mask),
        old_logps=jnp.asarray(out.logps),
        advantages=jnp.linspace(-1.0, 1.0, out.tokens.shape[0]))

  def _assert_learner_matches(self, graphdef, params, batch):
    logps, _ = _learner(graphdef, params, batch, 1.0, 'none')
    mask = np.asarray(batch.completion_mask)
    self.assertEqual(mask.sum(), mask.size)  # no stop token: T each
    diff = np.abs(np.asarray(logps) - np.asarray(batch.old_logps))[mask]
    self.assertLess(float(diff.max()), _ATOL)

  def _hf_logps(self, model, batch) -> np.ndarray:
    comp = np.asarray(batch.completion_tokens)
    tokens = np.concatenate([np.repeat(self.tokens, _G, 0), comp], 1)
    mask = np.concatenate(
        [np.repeat(self.mask, _G, 0), np.ones(comp.shape, bool)], 1)
    logits = torch.from_numpy(parity._hf_logits(model, tokens, mask))
    logp = torch.log_softmax(logits, -1).numpy()[:, self.tokens.shape[1] - 1:-1]
    return np.take_along_axis(logp, comp[..., None], -1)[..., 0]

  @parameterized.named_parameters(*_PICK)
  def test_learner_scores_what_the_generator_sampled(self, name):
    model, cfg, graphdef, params = self._load(name)
    if cfg.sliding_layers:
      self.assertLess(cfg.sliding_window, _T)
    # The continuous engine keeps full caches and narrows them by masks.
    engines = ('static',)
    if name == 'gemma3_local_global':
      engines += ('continuous',)
    for engine in engines:
      batch = self._sample(graphdef, cfg, params, engine)
      self._assert_learner_matches(graphdef, params, batch)
      theirs = self._hf_logps(model, batch)
      np.testing.assert_allclose(theirs, batch.old_logps, atol=_ATOL)

    lora_graphdef, adapter = lora.attach(
        graphdef, params, lora.LoraSection(rank=4, alpha=8.0),
        jax.random.key(1))
    policy = train_state.policy_params(_randomized(adapter), params)
    batch = self._sample(lora_graphdef, cfg, policy)
    self._assert_learner_matches(lora_graphdef, policy, batch)
    # The adapter changes what is sampled: its log-probs are not the base's.
    base, _ = _learner(graphdef, params, batch, 1.0, 'none')
    self.assertGreater(float(jnp.abs(base - batch.old_logps).max()), 0.1)

  def test_remat_keeps_the_gradients_of_an_adapted_gemma3(self):
    _, cfg, graphdef, params = self._load('gemma3_local_global')
    lora_graphdef, adapter = lora.attach(
        graphdef, params, lora.LoraSection(rank=4, alpha=8.0),
        jax.random.key(1))
    adapter = _randomized(adapter)
    batch = self._sample(lora_graphdef, cfg,
                         train_state.policy_params(adapter, params))

    def grads(remat):
      def loss(adapter):
        logps, entropy = logprobs.completion_logprobs(
            lora_graphdef, train_state.policy_params(adapter, params), batch,
            1.0, remat=remat)
        return (logps * batch.advantages[:, None]).sum() + 0.1 * entropy.sum()
      return jax.tree.leaves(jax.jit(jax.grad(loss))(adapter))

    want = grads('none')
    # 'full' recomputes the most; measured within 6e-6 of gradients of
    # about 10, as 'dots' (5e-7) and every other family.
    for got, expected in zip(grads('full'), want):
      np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)

  @absltest.skipUnless(pretrained_test._HAS_HF, pretrained_test._SKIP_HF)
  def test_a_lora_run_of_gemma3_exports_what_it_trained(self):
    config_class, overrides = _FAMILIES['gemma3_local_global']
    model = gemma.GemmaParityTest._model(
        None, config_class, overrides | dict(vocab_size=304))
    src = self.create_tempdir('src').full_path
    model.save_pretrained(src, safe_serialization=True)
    tok = pretrained_test._model_dir(self.create_tempdir('tok').full_path)
    for name in ('tokenizer.json', 'tokenizer_config.json'):
      shutil.copy(os.path.join(tok, name), src)
    c = pretrained_test._config(src)
    c.data.datasets[0]['verifier'] = {'name': 'format', 'regex': r'[0-9]'}
    c.rollout.short_batch = 'train'
    c.rollout.max_new_tokens = 12  # past the window of 4
    c.optim.learning_rate = 1e-2
    c.model.lora.rank = 4
    c.rl.beta = 0.05
    workdir = self.create_tempdir('run').full_path
    train.run(c, workdir, log=lambda _: None)
    ratios = [r['train/ratio_mean'] for r in
              metrics_lib.read_metrics(workdir) if 'train/ratio_mean' in r]
    np.testing.assert_allclose(ratios, 1.0, atol=1e-5)

    out = self.create_tempdir('out').full_path
    export.export_run(workdir, out, log=lambda _: None)
    run = model_spec.load(f'{workdir}@2', pretrained_test._config(src))
    ours = parity._logits(run.graphdef, run.params, self.tokens, self.mask)
    reread = transformers.AutoModelForCausalLM.from_pretrained(
        out, attn_implementation='eager', dtype=torch.float32).eval()
    theirs = parity._hf_logits(reread, self.tokens, self.mask)
    self.assertLess(float(np.abs(ours - theirs)[self.mask].max()), 1e-4)
    before = parity._hf_logits(model, self.tokens, self.mask)
    self.assertGreater(float(np.abs(before - theirs)[self.mask].max()), 0.01)


if __name__ == '__main__':
  absltest.main()
