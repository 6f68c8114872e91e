"""Tests for device meshes, placement, sharded jit and the mesh config.

The multi-device checks run `tests/sharded_check.py` in a subprocess with 8
forced CPU devices (the count is fixed when jax is imported, and pytest
workers have imported it already); the rest runs here, on one device.
"""

import contextlib
import dataclasses
import io
import json
import os
import re
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo import build
from jaxgrpo import checkpoint
from jaxgrpo import config_lib
from jaxgrpo import sharding
from jaxgrpo import train
from jaxgrpo.cli import evaluate as evaluate_cli
from jaxgrpo.configs import demo
from jaxgrpo.generate import slots as slots_lib
from jaxgrpo.generate.generator import Generator
from jaxgrpo.generate.sampling import Sampling
from jaxgrpo.model import config
from jaxgrpo.model import decoder
from jaxgrpo.rl import logprobs
from jaxgrpo.typing import TrainBatch
from tests import flaky_verifiers
from tests import forced_devices
from tests import tiny
from tests.stratify import fixtures as stratify_fixtures

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, 'jaxgrpo')

# Specs of the decode state's tokens [N, T] and KV cache [N, S, K, H].
_DECODE_SPECS = {
    '8,1,1': ("P('data',)", "P('data',)"),
    '1,4,2': ("P('fsdp',)", "P('fsdp', None, 'tensor')"),
    '2,2,2': ("P(('data', 'fsdp'),)", "P(('data', 'fsdp'), None, 'tensor')"),
    '1,8,1': ("P('fsdp',)", "P('fsdp',)"),
}


def _sharded_check(test: absltest.TestCase, *args: str) -> dict:
  """Runs tests/sharded_check.py with `args`; returns its JSON report."""
  out = os.path.join(test.create_tempdir().full_path, 'out.json')
  forced_devices.run(test, '-m', 'tests.sharded_check', out, *args,
                     timeout=300)
  with open(out) as f:
    report = json.load(f)
  test.assertEqual(report['devices'], 8)
  return report


class ShardedLayoutsTest(absltest.TestCase):
  """One train step and generation per layout, sharded vs unsharded."""

  def _check(self, *layouts: str) -> None:
    report = _sharded_check(self, '--layouts', *layouts)
    for layout in layouts:
      r = report['layouts'][layout]
      with self.subTest(layout=layout):
        # Placement: embedding [vocab, embed] on (tensor, fsdp); mlp
        # weights [embed, mlp] on (fsdp, tensor); Adam's moments and the
        # reference follow their params; the step keeps the placement.
        want_up = "P('fsdp', 'tensor')"
        self.assertEqual(r['embedding_spec'], "P('tensor', 'fsdp')")
        self.assertEqual(r['mlp_up_spec'], want_up)
        self.assertEqual(r['mlp_up_mu_spec'], want_up)
        self.assertEqual(r['ref_up_spec'], want_up)
        self.assertEqual(r['out_mlp_up_spec'], want_up)
        # The decode state: rows over the batch axes, the KV cache's kv
        # heads over tensor (JAX drops size-1 axes from specs it reports).
        rows, cache = _DECODE_SPECS[layout]
        self.assertEqual(r['tokens_spec'], rows)
        self.assertEqual(r['cache_spec'], cache)
        # The step matches the unsharded one up to float summation order.
        self.assertEqual(r['step'], 1)
        self.assertLess(r['params_diff'], 2e-4)
        self.assertEqual(r['ref_params_diff'], 0.0)
        self.assertLess(r['opt_state_diff'], 1e-6)
        for name, diff in r['metrics_diff'].items():
          self.assertLess(diff, 1e-5, name)
        # Generation: the same tokens, greedy and sampled (same rng).
        for mode in ('greedy', 'sampled'):
          self.assertTrue(r[f'{mode}_tokens_equal'], mode)
          self.assertTrue(r[f'{mode}_mask_equal'], mode)
          self.assertLess(r[f'{mode}_logps_diff'], 1e-4, mode)
        # 5 prompts padded to the 8 batch devices: the same rewards.
        self.assertTrue(r['eval_texts_equal'])
        self.assertTrue(r['eval_rewards_equal'])

  def test_data_and_fsdp_tensor(self):
    self._check('8,1,1', '1,4,2')

  def test_mixed_and_fsdp(self):
    self._check('2,2,2', '1,8,1')

  def test_train_run_on_fsdp_and_tensor(self):
    workdir = self.create_tempdir().full_path
    run = _sharded_check(self, '--train_run', workdir)['train_run']
    self.assertEqual(run['steps'], 2)
    self.assertEqual((run['resumed_from'], run['resumed_steps']), (2, 3))
    log = '\n'.join(run['log'])
    self.assertIn('mesh: data=1 fsdp=4 tensor=2 over 8 cpu devices', log)
    self.assertRegex(log, r'train step memory per device: arguments .*'
                          r'temp .* total .* \(no device limit known\)')
    with open(os.path.join(workdir, 'metrics.jsonl')) as f:
      records = [json.loads(line) for line in f]
    self.assertTrue(any('train/loss' in r for r in records), records)
    # The step-2 checkpoint of that mesh resumes on this process's one
    # device and takes the same step 3: the same samples and rewards, the
    # same loss and params up to float summation order.
    c = flaky_verifiers.informative_demo_config()
    c.rollout.round_size, c.total_steps = 3, 3
    copy = workdir + '.step2'
    self.assertEqual(train.run(c, copy, log=lambda _: None).resumed_from, 2)
    want, got = (_step_record(w, 3) for w in (workdir, copy))
    self.assertEqual(sorted(got), sorted(want))
    self.assertIn('train/loss', want)
    self.assertIn('rollout/groups_used', want)
    for key, value in want.items():
      if key.startswith('rollout/') or key.startswith('data/'):
        self.assertEqual(got[key], value, key)
      elif key.startswith('train/'):
        self.assertAlmostEqual(got[key], value, delta=1e-5, msg=key)
    pairs = zip(*(jax.tree.leaves(checkpoint.load_state_arrays(
        os.path.join(w, 'checkpoints'))) for w in (workdir, copy)))
    for a, b in pairs:
      np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def _step_record(workdir: str, step: int) -> dict:
  """The metrics of `step` in a run's metrics.jsonl, merged."""
  record = {}
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    for line in f:
      r = json.loads(line)
      if r.get('step') == step:
        record.update(r)
  return record


class ShardedLoraTest(absltest.TestCase):

  def test_lora_step_matches_unsharded_with_base_untouched(self):
    report = _sharded_check(self, '--lora', '1,4,2', '2,2,2')['lora']
    for layout, r in report.items():
      with self.subTest(layout=layout):
        # The base placed as in full fine-tuning; the adapters by their
        # logical axes: A [embed, r] on fsdp, B [r, heads] on tensor.
        self.assertEqual(r['base_up_spec'], "P('fsdp', 'tensor')")
        self.assertEqual(r['q_a_spec'], "P('fsdp', None)")
        self.assertEqual(r['q_b_spec'], "P(None, 'tensor')")
        self.assertGreater(r['kl'], 0.0)  # the base is the reference
        self.assertGreater(r['adapter_moved'], 1e-4)
        self.assertLess(r['adapter_diff'], 2e-5)
        self.assertEqual(r['base_diff'], 0.0)
        self.assertLess(r['opt_state_diff'], 1e-6)
        self.assertLess(r['metrics_diff'], 1e-5)


class PlacementTest(parameterized.TestCase):

  def test_only_sharding_imports_jax_sharding(self):
    pattern = re.compile(
        r'^\s*(from\s+jax\.sharding\s+import|import\s+jax\.sharding|'
        r'from\s+jax\s+import\s+[^#\n]*\bsharding\b)|\bjax\.sharding\.',
        re.MULTILINE)
    users = []
    for root, _, files in os.walk(PACKAGE):
      for name in files:
        if name.endswith('.py'):
          path = os.path.join(root, name)
          with open(path) as f:
            if pattern.search(f.read()):
              users.append(os.path.relpath(path, REPO))
    self.assertEqual(users, [os.path.join('jaxgrpo', 'sharding.py')])

  def test_without_a_mesh_everything_is_the_identity(self):
    graphdef, params = tiny.random_model()
    del graphdef
    self.assertIsNone(sharding.active_mesh())
    self.assertIsNone(sharding.param_shardings(params))
    self.assertIsNone(sharding.train_state_shardings(params))
    self.assertIsNone(sharding.batch_sharding(2))
    self.assertIsNone(sharding.batch_shardings({'x': np.zeros((4, 2))}))
    self.assertIsNone(sharding.replicated())
    self.assertEqual(sharding.batch_multiple(), 1)
    self.assertIs(sharding.shard(params, None), params)
    x = jnp.ones((4, 3))
    self.assertIs(sharding.constrain(x, ('batch', None)), x)

  def test_one_device_mesh(self):
    graphdef, params = tiny.random_model()
    del graphdef
    with sharding.use_mesh(sharding.make_mesh()):
      self.assertEqual(sharding.batch_multiple(), 1)
      placed = sharding.shard(params, sharding.param_shardings(params))
      w = placed['blocks'][0]['mlp']['up']['w']
      self.assertEqual(w.sharding.spec, jax.sharding.PartitionSpec(
          'fsdp', 'tensor'))
      np.testing.assert_array_equal(
          w, params['blocks'][0]['mlp']['up']['w'])
    self.assertIsNone(sharding.active_mesh())

  @parameterized.parameters(
      # (logical axes, shape, mesh sizes, expected spec)
      (('batch', None), (8, 3), dict(data=2, fsdp=4), (('data', 'fsdp'), None)),
      # 4 rows on 2 x 4 batch devices: only 'data' divides them.
      (('batch', None), (4, 3), dict(data=2, fsdp=4), ('data', None)),
      (('batch', None), (3, 3), dict(data=2, fsdp=4), (None, None)),
      # 6 heads do not split 4 ways: replicated.
      (('embed', 'heads', 'head_dim'), (64, 6, 8), dict(fsdp=2, tensor=4),
       ('fsdp', None, None)),
      # A mesh axis shards one dimension at most.
      (('mlp', 'vocab'), (8, 8), dict(tensor=2), ('tensor', None)),
      (('unknown', None), (8, 8), dict(tensor=2), (None, None)),
  )
  def test_logical_to_spec_fits_the_shape(self, axes, shape, sizes, want):

    class FakeMesh:
      shape = {'data': 1, 'fsdp': 1, 'tensor': 1, **sizes}

    spec = sharding.logical_to_spec(axes, sharding.DEFAULT_RULES, shape,
                                    FakeMesh())
    self.assertEqual(spec, jax.sharding.PartitionSpec(*want))

  def test_merge_rules(self):
    rules = dict(sharding.merge_rules((('embed', None),
                                       ('batch', ['data']),
                                       ('new', 'tensor'))))
    self.assertIsNone(rules['embed'])
    self.assertEqual(rules['batch'], ('data',))
    self.assertEqual(rules['new'], 'tensor')
    self.assertEqual(rules['mlp'], 'tensor')


class RematTest(parameterized.TestCase):

  @parameterized.parameters('full', 'dots')
  def test_remat_changes_nothing_but_memory(self, remat):
    graphdef, params = tiny.random_model()
    rng = np.random.default_rng(0)
    b, g, p, t = 2, 2, 4, 3
    batch = TrainBatch(
        prompt_tokens=rng.integers(1, 16, (b, p)).astype(np.int32),
        prompt_mask=np.ones((b, p), bool),
        completion_tokens=rng.integers(1, 16, (b * g, t)).astype(np.int32),
        completion_mask=np.ones((b * g, t), bool),
        old_logps=np.zeros((b * g, t), np.float32),
        advantages=np.zeros((b * g,), np.float32),
    )

    def grads(mode):
      loss = lambda p: logprobs.completion_logprobs(
          graphdef, p, batch, remat=mode)[0].sum()
      return jax.jit(jax.value_and_grad(loss))(params)

    (want_loss, want), (got_loss, got) = grads('none'), grads(remat)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
    for a, b_ in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(a, b_, rtol=1e-5, atol=1e-7)

  def test_remat_saves_memory(self):
    # XLA's CPU backend drops jax.checkpoint's optimization barriers and
    # merges the recomputation back into the forward pass unless it waits
    # for the cotangent (decoder._after_cotangent): then every mode took the
    # same memory. Compiled for abstract inputs, nothing runs.
    cfg = dataclasses.replace(config.ModelConfig.tiny(vocab_size=16),
                              num_layers=6)
    graphdef, params = decoder.abstract_params(cfg)
    b, g, p, t = 2, 4, 32, 64
    spec = jax.ShapeDtypeStruct
    batch = TrainBatch(
        prompt_tokens=spec((b, p), jnp.int32),
        prompt_mask=spec((b, p), jnp.bool_),
        completion_tokens=spec((b * g, t), jnp.int32),
        completion_mask=spec((b * g, t), jnp.bool_),
        old_logps=spec((b * g, t), jnp.float32),
        advantages=spec((b * g,), jnp.float32),
    )

    def temp_bytes(mode):
      loss = lambda p, b: logprobs.completion_logprobs(
          graphdef, p, b, remat=mode)[0].sum()
      compiled = jax.jit(jax.grad(loss)).lower(params, batch).compile()
      return compiled.memory_analysis().temp_size_in_bytes

    none, full, dots = (temp_bytes(m) for m in ('none', 'full', 'dots'))
    # Measured: 27.2 MB without remat, 6.6 MB full, 10.8 MB dots.
    self.assertLess(full, 0.5 * none)
    self.assertLess(dots, 0.6 * none)
    self.assertLess(full, dots)


class MeshConfigTest(parameterized.TestCase):

  def _config(self, **keys):
    c = demo.get_config('runlocal')
    for key, value in keys.items():
      section, name = key.split('.')
      c[section][name] = value
    return c

  def test_defaults(self):
    cfg = config_lib.from_config_dict(self._config())
    self.assertEqual((cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor),
                     (-1, 1, 1))
    self.assertEqual(cfg.mesh.rules, ())
    self.assertIsNone(cfg.mesh.memory_limit_gib)
    self.assertEqual(cfg.model.remat, 'none')
    self.assertEqual(config_lib.mesh_shape(cfg, 8), (8, 1, 1))

  def test_rules_are_normalized(self):
    cfg = config_lib.from_config_dict(self._config(
        **{'mesh.rules': (('embed', None), ['batch', ['data', 'fsdp']])}))
    self.assertEqual(cfg.mesh.rules,
                     (('embed', None), ('batch', ('data', 'fsdp'))))

  @parameterized.parameters(
      ({'mesh.fsdp': 0}, r'^mesh.fsdp=0: must be > 0'),
      ({'mesh.data': 0}, r'^mesh.data=0: must be >= 1, or -1'),
      ({'mesh.tensor': -2}, r'^mesh.tensor=-2'),
      ({'mesh.memory_limit_gib': 0.0}, r'^mesh.memory_limit_gib=0.0'),
      ({'model.remat': 'some'}, r"^model.remat='some': must be one of"),
      ({'mesh.rules': (('emb', 'fsdp'),)},
       r"^mesh.rules\[0\]=\('emb', 'fsdp'\): unknown logical axis 'emb'"),
      ({'mesh.rules': (('embed', 'model'),)},
       r'^mesh.rules\[0\]=.*: the target must be one of'),
      ({'mesh.rules': (('embed',),)}, r'^mesh.rules\[0\]=.*pairs'),
      # 4 prompts x 4 samples do not split over 3 data devices.
      ({'mesh.data': 3},
       r'^rollout.batch_size=4: batch_size x group_size = 16 completions '
       r'must split evenly over mesh.data x mesh.fsdp = 3 x 1'),
  )
  def test_bad_values_name_the_key(self, keys, message):
    with self.assertRaisesRegex(config_lib.ConfigError, message):
      config_lib.from_config_dict(self._config(**keys))

  @parameterized.parameters(
      ({'mesh.fsdp': 3}, 8, r'^mesh.fsdp=3: .* = 3 must divide the 8 devices'),
      ({'mesh.data': 2, 'mesh.fsdp': 2}, 8,
       r'^mesh.data=2: .* 2 x 2 x 1 must equal the 8 devices'),
      ({'mesh.fsdp': 2}, 32,
       r'^rollout.batch_size=4: .* = 16 x 2 = 32 devices'),
  )
  def test_mesh_must_fit_the_devices(self, keys, devices, message):
    cfg = config_lib.from_config_dict(self._config(**keys))
    with self.assertRaisesRegex(config_lib.ConfigError, message):
      config_lib.mesh_shape(cfg, devices)

  def test_train_step_too_big_for_the_limit(self):
    c = self._config(**{'mesh.memory_limit_gib': 1e-4})
    c.warmstart.enabled = False
    c.verify.workers = 0
    lines = []
    with self.assertRaisesRegex(
        config_lib.ConfigError,
        r'^the train step needs .* per device .* more than 104.9 KiB '
        r'\(mesh.memory_limit_gib=0.0001\); .*mesh.fsdp=1.*model.remat='
        r"'none'.*model.param_dtype='float32'.*rollout.batch_size=4"):
      train.run(c, self.create_tempdir().full_path, log=lines.append)
    self.assertTrue(any(line.startswith('train step memory per device')
                        and line.endswith('of 104.9 KiB') for line in lines),
                    lines)

  def test_kv_cache_too_big_for_the_limit(self):
    # The demo model's train step fits in 16 MiB (it needs 11.9 MiB);
    # 4,096 decode slots of 17 positions need 68 MiB of keys and values.
    c = self._config(**{'mesh.memory_limit_gib': 2**-6,
                        'rollout.engine': 'continuous', 'rollout.slots': 4096})
    c.warmstart.enabled = False
    c.verify.workers = 0
    lines = []
    with self.assertRaisesRegex(
        config_lib.ConfigError,
        r'^the rollout KV cache alone needs 68.0 MiB per device, more than '
        r'16.0 MiB \(mesh.memory_limit_gib=0.015625\): 4096 rows from '
        r'rollout.slots=4096, of 17 positions \(rollout.max_prompt_len=12 \+ '
        r'rollout.max_new_tokens=6 - 1\); lower them, compute in bfloat16 '
        r"\(model.dtype='float32'\), or split the rows over more devices "
        r'\(mesh.data=-1\)$'):
      train.run(c, self.create_tempdir().full_path, log=lines.append)
    self.assertTrue(any(line.startswith('train step memory per device')
                        and line.endswith('of 16.0 MiB') for line in lines),
                    lines)
    self.assertTrue(any(line.startswith('rollout KV cache per device: 68.0 '
                                        'MiB') for line in lines), lines)
    # The static engine's rows: max_round_size only when the size adapts
    # (it was named for a fixed round_size, where lowering it does nothing).
    for round_size, max_round_size, rows_from in (
        (1024, 256, 'rollout.round_size=1024 x rollout.group_size=4'),
        ('adaptive', 1024, "rollout.round_size='adaptive' "
         '(max_round_size=1024) x rollout.group_size=4')):
      c = self._config(**{'mesh.memory_limit_gib': 2**-6,
                          'rollout.round_size': round_size,
                          'rollout.max_round_size': max_round_size})
      c.warmstart.enabled = False
      c.verify.workers = 0
      with self.assertRaisesRegex(config_lib.ConfigError,
                                  f'4096 rows from {re.escape(rows_from)}, '):
        train.run(c, self.create_tempdir().full_path, log=lambda _: None)

  def test_jaxgrpo_eval_runs_on_the_configured_mesh(self):
    # It ignored mesh.*: the params on one device whatever the mesh said
    # (a model trained over 8 devices because it needs them was evaluated
    # on one), and a mesh that fits no device count was accepted.
    config = os.path.join(REPO, 'configs', 'demo.py') + ':runlocal'
    args = [f'--config={config}', '--checkpoint=init', '--temperature=0',
            '--limit=8', '--batch=8', '--config.verify.workers=0']
    report = _sharded_check(self, '--eval_cli', *args, '--config.mesh.fsdp=3')
    self.assertEqual(report['eval_code'], 2)
    self.assertIn('error: mesh.fsdp=3: mesh.fsdp x mesh.tensor = 3 must '
                  'divide the 8 devices', report['eval_stderr'])
    out = self.create_tempdir().full_path
    report = _sharded_check(self, '--eval_cli', *args, '--config.mesh.fsdp=8',
                            f'--json={out}/mesh.json')
    self.assertEqual(report['eval_code'], 0, report['eval_stderr'])
    self.assertIn('mesh: data=1 fsdp=8 tensor=1 over 8 cpu devices',
                  report['eval_stdout'])
    self.assertEqual(report['eval_param_devices'], [8])
    # The same greedy results as on one device, here.
    with mock.patch.object(decoder, 'init_params',
                           stratify_fixtures.fast_init_params), \
        contextlib.redirect_stdout(io.StringIO()):
      self.assertEqual(evaluate_cli.main(
          [*args, f'--json={out}/one.json', '--quiet']), 0)
    results = []
    for name in ('mesh', 'one'):
      with open(f'{out}/{name}.json') as f:
        results.append(json.load(f)['checkpoints'][0]['metrics'])
    self.assertEqual(results[0], results[1])

  def test_kv_cache_logged_follows_the_mesh_rules(self):
    # It divided the whole cache by the batch devices x tensor whatever
    # mesh.rules said: replicated rows (('batch', None),) on data=8 took 8x
    # what was logged and checked against mesh.memory_limit_gib.
    report = _sharded_check(self, '--kv_cache')
    self.assertLen(report['kv_cache'], 10)
    for r in report['kv_cache']:
      self.assertEqual(r['logged'], r['allocated'], r)
    by = {(tuple(r['layout']), bool(r['rules']), r['engine']): r['allocated']
          for r in report['kv_cache']}
    self.assertEqual(by[(8, 1, 1), True, 'static'],
                     8 * by[(8, 1, 1), False, 'static'])
    self.assertEqual(by[(2, 2, 2), True, 'continuous'],
                     2 * by[(2, 2, 2), False, 'continuous'])

  @parameterized.parameters(('static', None), ('static', 32),
                            ('continuous', None), ('continuous', 32))
  def test_kv_cache_logged_is_what_the_engine_allocates(self, engine, window):
    # GSM8K lengths (P = 64, T = 256); a sliding-window model's static
    # engine keeps rings of its window.
    c = self._config(**{'rollout.engine': engine, 'rollout.slots': 12,
                        'rollout.max_prompt_len': 64,
                        'rollout.max_new_tokens': 256})
    cfg = config_lib.from_config_dict(c)
    ro = cfg.rollout
    model_cfg = config.preset('tiny', sliding_window=window,
                              sliding_layers=(0,) if window else ())
    got, rows, positions = build.kv_cache(cfg, model_cfg)
    self.assertEqual(positions, 64 + 256 - 1)
    gen = Generator(graphdef=decoder.abstract_params(model_cfg)[0],
                    model_cfg=model_cfg, sampling=Sampling(),
                    max_new_tokens=256, num_samples=ro.group_size)
    if engine == 'static':
      prompts = jax.ShapeDtypeStruct((ro.round_size, 64), jnp.int32)
      cache = jax.eval_shape(
          gen.prefill, decoder.abstract_params(model_cfg)[1], prompts,
          prompts.update(dtype=bool), jax.random.key(0)).cache
      self.assertEqual(rows, ro.round_size * ro.group_size)
    else:
      cache = jax.eval_shape(slots_lib.init, gen, None, 64, 12, 4)[0].cache
      self.assertEqual(rows, 12)
    want = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))
    self.assertEqual(got, want)
    # 2 layers' keys and values of 2 heads x 16, float32.
    full = rows * positions * 2 * 2 * 2 * 16 * 4
    self.assertEqual(got, full if not window or engine == 'continuous'
                     else full // 2 + rows * window * 2 * 2 * 16 * 4)

if __name__ == '__main__':
  absltest.main()
