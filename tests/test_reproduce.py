"""scripts/reproduce.py: every experiment runs, sweeps resume, data files
carry their provenance, and the report is built from them."""

import contextlib
import dataclasses
import gzip
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from unittest import mock

from absl.testing import absltest
import jax
import numpy as np

from jaxgrpo import config_lib
from jaxgrpo.data import arithmetic
from jaxgrpo.data import snooze
from jaxgrpo.reporting import environment as environment_lib
from tests import interrupt_worker
from tests import test_train

sys.path.insert(0, os.path.join(test_train.REPO, 'scripts'))
# pylint: disable=g-import-not-at-top,wrong-import-position
import fit_simulator
import reproduce
import results_report


class ReproduceTest(absltest.TestCase):

  def test_every_variant_config_is_valid(self):
    for experiment in reproduce.experiments().values():
      for smoke in (False, True):
        e = reproduce.smoke(experiment) if smoke else experiment
        for variant in e.variants:
          c = reproduce.config(e, variant, 0, is_smoke=smoke)
          cfg = config_lib.from_config_dict(c)
          self.assertLen(cfg.data.datasets, len(e.datasets))
          for key, value in e.variants[variant].items():
            section, _, name = key.rpartition('.')
            self.assertEqual(getattr(getattr(cfg, section), name), value,
                             (e.name, variant, key))

  def test_demo_config_is_the_memorise_experiment(self):
    from jaxgrpo.configs import demo  # pylint: disable=g-import-not-at-top
    ours = config_lib.from_config_dict(demo.get_config())
    regime = reproduce.experiments()['memorise']
    theirs = config_lib.from_config_dict(
        reproduce.config(regime, 'snooze3', 0))
    self.assertEqual(ours.data.datasets, theirs.data.datasets)
    for key in regime.settings:
      if key.startswith('eval.every'):
        continue  # the demo evaluates less often
      section, _, name = key.rpartition('.')
      self.assertEqual(getattr(getattr(ours, section), name),
                       getattr(getattr(theirs, section), name), key)
    self.assertEqual(ours.sampler, theirs.sampler)
    self.assertLessEqual(ours.total_steps, regime.steps)

  def test_every_dataset_has_its_held_out_problems(self):
    # At full size: a digit range too narrow for num_eval problems that are
    # not training prompts fails here, not an hour into a sweep.
    keys = ('min_digits', 'max_digits', 'ops', 'carries', 'seed',
            'unanswerable')
    for e in reproduce.experiments().values():
      for d in e.datasets:
        spec = arithmetic.ArithmeticSpec(
            **{k: v for k, v in d.items() if k in keys})
        train, held = arithmetic.split_train_eval(
            spec, d['num_train'], d['num_eval'], name=d['name'])
        self.assertLen(held, d['num_eval'], (e.name, d['name']))
        self.assertLen(train, d['num_train'])

  def test_regime_has_every_policy(self):
    for name in ('regime', results_report.MAIN):
      names = set(reproduce.experiments()[name].variants)
      self.assertEqual(names, set(reproduce.POLICIES), name)
    policies = {v['sampler.policy'] for v in reproduce.POLICIES.values()}
    self.assertEqual(policies, set(snooze.POLICIES))

  def test_plan_shards_and_unknown_variant(self):
    e = reproduce.experiments()['drift']
    runs = reproduce.plan(e, [0, 1])
    self.assertEqual(runs, [('pre_filter', 0), ('post_filter', 0),
                            ('pre_filter', 1), ('post_filter', 1)])
    # Two shards split the runs between them, each run once.
    self.assertCountEqual(runs[0::2] + runs[1::2], runs)
    self.assertEmpty(set(runs[0::2]) & set(runs[1::2]))
    with self.assertRaisesRegex(ValueError, r"drift has no variant \['nope'\]"):
      reproduce.plan(e, [0], ['nope'])
    self.assertEqual(reproduce._seeds('0-2,5'), [0, 1, 2, 5])  # pylint: disable=protected-access

  def test_sweep_runs_resumes_and_reports(self):
    root = self.create_tempdir().full_path
    work, data = os.path.join(root, 'work'), os.path.join(root, 'data')
    e = reproduce.smoke(reproduce.experiments()['regime'])
    args = ['run', 'regime', '--smoke', '--seeds', '0',
            '--variants', 'none,snooze5', '--work', work, '--data', data]
    paths = [reproduce.data_path(data, 'regime', f'{v}_s0')
             for v in ('none', 'snooze5')]
    # A run another live process has claimed is left to it.
    out = io.StringIO()
    with reproduce.claim(os.path.join(work, 'regime', 'none_s0.claim')) as held:
      self.assertTrue(held)
      with contextlib.redirect_stdout(out):
        reproduce.main(args)
    self.assertFalse(os.path.exists(paths[0]))
    self.assertTrue(os.path.exists(paths[1]))
    # The closing line counts the runs made, not the runs planned.
    self.assertRegex(out.getvalue(), r'regime: 1 runs made in \d+s, 0 already '
                     'done, 1 left to other processes\n$')
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      reproduce.main(args)  # the claim went with its holder
    self.assertRegex(out.getvalue(), r'regime: 1 runs made in \d+s, 1 already '
                     'done\n$')
    header, records = reproduce.read_run(paths[0])
    self.assertEqual(header['variant'], 'none')
    self.assertIn('--smoke', header['command'])
    self.assertRegex(header['commit'], r'^([0-9a-f]{40}(\+dirty)?|unknown)$')
    env = header['environment']  # what the numbers depend on besides code
    self.assertEqual(env['packages']['jax'], jax.__version__)
    self.assertEqual(env['packages']['numpy'], np.__version__)
    self.assertTrue(env['cpu'])
    self.assertEqual(header['warmstart']['environment'], env)
    self.assertEqual([r['step'] for r in records], [0, 1, 2])
    self.assertIn('train/batch_fill', records[1])
    self.assertIn('rollout/tokens_generated', records[1])
    # Both variants of the seed start from the same warm start.
    accs = [reproduce.read_run(p)[1][0]['eval/accuracy'] for p in paths]
    self.assertEqual(accs[0], accs[1])
    # A finished run is not run again; a lost data file is rebuilt from the
    # run's own workdir (its checkpoint is at the last step).
    mtime = os.path.getmtime(paths[0])
    os.remove(paths[1])
    reproduce.main(args)
    self.assertEqual(os.path.getmtime(paths[0]), mtime)
    self.assertEqual(reproduce.read_run(paths[1])[1], records_of(paths[1]))
    # A warm start is reused only under the settings that made it.
    logs = []
    reproduce._warm_start(e, 0, work, True, logs.append)
    self.assertEqual(logs, [])
    changed = dataclasses.replace(
        e, settings={**e.settings, 'warmstart.target_pass_rate': 0.5})
    reproduce._warm_start(changed, 0, work, True, logs.append)
    self.assertIn('made under other settings', logs[0])
    # A run begun from the old warm start starts over from the new one: it
    # resumed its old checkpoints under a header naming the new warm start.
    os.remove(paths[0])
    reproduce.run_one(changed, 'none', 0, work=work, data=data,
                      command='python scripts/reproduce.py run regime',
                      is_smoke=True, log=logs.append)
    self.assertIn('none_s0 was begun from another warm start; starting it '
                  'again', logs[-2])
    header, again = reproduce.read_run(paths[0])
    _, new_start = reproduce._warm_start(changed, 0, work, True, logs.append)
    self.assertEqual(header['warmstart'], new_start)
    self.assertEqual(again[0]['eval/accuracy'], new_start['eval_accuracy'])
    # The report reads them (`regime` is the 3,000-problem regime's blocks;
    # sections 1 and 3 are `results_report.MAIN`'s).
    blocks = results_report.render_blocks(data)
    self.assertIn('`none`', blocks['first_savings'])
    self.assertIn('`snooze5`', blocks['first_savings'])
    self.assertIn('steps filled to B', blocks['first_checks'])
    self.assertIn('No `none` runs yet', blocks['regime_checks'])
    self.assertIn('pending: 0 of 5 seeds', blocks['preregistered'])
    del e
    # The simulator fit reads the same files (one grid point, one seed).
    grid, sim_seeds = fit_simulator.GRID, fit_simulator.SIM_SEEDS
    fit_simulator.GRID = {'skill0': (2.0,), 'scale': (2.0,), 'lr': (0.02,),
                          'lr_example': (0.3,)}
    fit_simulator.SIM_SEEDS = (0,)
    try:
      # Into --data, beside the runs it fits (it wrote over the committed
      # docs/results/data/sim_fit.json).
      fit_simulator.main(['--data', data])
    finally:
      fit_simulator.GRID, fit_simulator.SIM_SEEDS = grid, sim_seeds
    with open(os.path.join(data, 'sim_fit.json')) as f:
      fit = json.load(f)
    self.assertEqual(set(fit['predictions']),
                     set(reproduce.experiments()['regime'].variants))
    self.assertEqual(fit['predictions']['none']['saving_prompts'], [1.0])
    self.assertEqual(fit['predictions']['none']['saving_prompts_whole'],
                     [1.0])
    self.assertIn('`snooze5`', results_report.render_blocks(data)['simulator'])


class CommandLineTest(absltest.TestCase):

  def test_mistakes_and_damaged_files_end_in_one_line(self):
    # A smoke run with the default --data wrote into the committed data,
    # and `report` put it in the tables; --shard 2/2 ran every other run
    # from index 2 (never index 0); the others were tracebacks.
    work = self.create_tempdir().full_path
    for args, message in (
        (['--data', reproduce.DATA], '--smoke --data=.*: smoke runs never go '
         'into the committed data'),
        (['--shard', '2/2'], '--shard=2/2: give k/n with 0 <= k < n'),
        (['--shard', '1'], '--shard=1: give k/n'),
        (['--seeds', '4-0'], '--seeds=4-0: names no seed'),
        (['--seeds', '0..4'], '--seeds=0..4: give seeds as 0-4 or 0,2'),
        (['--variants', 'nonee'],
         "--variants: regime has no variant \\['nonee'\\]")):
      err = io.StringIO()
      with contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as e:
        reproduce.main(['run', 'regime', '--smoke', '--work', work, *args])
      self.assertEqual(e.exception.code, 2)
      self.assertRegex(err.getvalue(), f'error: {message}')
    # Without --data a smoke run writes under its --work.
    self.assertNotEqual(os.path.abspath(os.path.join(work, 'data')),
                        reproduce.DATA)
    path = os.path.join(self.create_tempdir().full_path, 'none_s0.jsonl.gz')
    with open(path, 'wb') as f:
      f.write(gzip.compress(b'{"header": {}}\n{"step": 0}\n')[:30])
    with self.assertRaisesRegex(SystemExit, f'^{re.escape(path)}: a damaged '
                                'data file \\(EOFError: '):
      reproduce.read_run(path)


class EnvironmentTest(absltest.TestCase):

  def test_runs_of_another_environment_are_not_added_to(self):
    # Runs made on an AMD EPYC were added to an experiment made on an
    # Intel Xeon: their warm starts differed (700 steps against 800), so
    # the pairs by seed compared two starting points.
    data = self.create_tempdir().full_path
    here = environment_lib.environment()
    other = {**here, 'cpu': 'Another CPU avx2'}
    for name, env in (('none_s0', here), ('filter_s0', other)):
      reproduce.export([{'step': 0}], {'environment': env},
                       reproduce.data_path(data, 'regime', name))
    found = reproduce.other_environments('regime', [data, data + '/'])
    self.assertEqual(found, [(reproduce.data_path(data, 'regime', 'filter_s0'),
                              {k: other[k] for k in
                               reproduce.ENVIRONMENT_KEYS})])
    # Another core count is the same environment.
    reproduce.export([{'step': 0}], {'environment': {**here, 'cores': 64}},
                     reproduce.data_path(data, 'regime', 'none_s1'))
    self.assertLen(reproduce.other_environments('regime', [data]), 1)
    self.assertEqual(reproduce.other_environments('drift', [data]), [])
    args = ['run', 'regime', '--smoke', '--seeds', '0', '--variants', 'none',
            '--work', self.create_tempdir().full_path, '--data', data]
    with self.assertRaisesRegex(SystemExit, (
        r"^regime: 1 of its runs were made in another environment, e\.g\. "
        rf"{re.escape(found[0][0])}: .*'cpu': 'Another CPU avx2'.*; this "
        r'machine is .*pass --mixed-environments$')):
      reproduce.main(args)
    # Runs that recorded none (made before headers had it) are another.
    reproduce.export([{'step': 0}], {}, reproduce.data_path(data, 'drift',
                                                            'none_s0'))
    with self.assertRaisesRegex(SystemExit, (
        r'^drift: 1 of its runs .*none_s0\.jsonl\.gz: made before runs '
        'recorded their environment; this machine is')):
      reproduce.check_environment('drift', [data])
    # Into a fresh --data folder the experiment runs whole here: runs pair
    # within the folder they join (it was refused for the committed data's
    # runs).
    made = []
    fresh = os.path.join(self.create_tempdir().full_path, 'data')
    with mock.patch.object(reproduce, 'DATA', data), mock.patch.object(
        reproduce, 'run_one', lambda *a, **k: made.append(a[1:3])):
      reproduce.main(['run', 'regime', '--seeds', '0', '--variants', 'none',
                      '--work', args[8], '--data', fresh])
    self.assertEqual(made, [('none', 0)])
    lines = reproduce.status_lines(data)
    self.assertIn('regime: 3 runs of 9 variants (1 on Another CPU avx2; 2 on '
                  f"{here['cpu']} (this machine))", lines)
    self.assertIn('drift: 1 runs of 2 variants (1 on not recorded)', lines)
    self.assertIn('size500: 0 runs of 2 variants', lines)


class StoppedRunTest(absltest.TestCase):

  def test_a_stopped_run_writes_no_data_and_stops_the_sweep(self):
    root = self.create_tempdir().full_path
    e = reproduce.smoke(reproduce.experiments()['regime'])
    real_run = reproduce.train.run

    def stopped(config, workdir, **kw):
      summary = real_run(config, workdir, **kw)
      return dataclasses.replace(summary, stopped_by='SIGTERM')

    reproduce.train.run = stopped
    try:
      with self.assertRaisesRegex(SystemExit, 'none_s0 stopped by SIGTERM'):
        reproduce.run_one(e, 'none', 0, work=os.path.join(root, 'w'),
                          data=os.path.join(root, 'd'), command='test',
                          is_smoke=True, log=lambda _: None)
    finally:
      reproduce.train.run = real_run
    self.assertFalse(os.path.exists(
        reproduce.data_path(os.path.join(root, 'd'), 'regime', 'none_s0')))


  def test_a_second_ctrl_c_quits_the_sweep_promptly(self):
    # A sweep's run whose step 1 waits on a computation that takes minutes
    # (a large model's step): two Ctrl-Cs quit it within seconds with 130
    # and the line to resume; it writes no data file and keeps its
    # checkpoints for the next sweep.
    root = self.create_tempdir().full_path
    script = (
        'import functools, sys\n'
        'import jax.numpy as jnp, numpy as np\n'
        'sys.path.insert(0, "scripts")\n'
        'import reproduce\n'
        'from tests import interrupt_worker\n'
        'def on_step(info):\n'
        '  if info.step == 1:\n'
        '    busy = interrupt_worker.minutes_of_work(\n'
        '        jnp.full((256, 256), 1e-3))\n'
        '    print("busy", flush=True)\n'
        '    np.asarray(busy)\n'
        'reproduce.train.run = functools.partial(reproduce.train.run,\n'
        '                                        on_step=on_step)\n'
        'e = reproduce.smoke(reproduce.experiments()["regime"])\n'
        f'reproduce.run_one(e, "none", 0, work={root!r} + "/w",\n'
        f'                  data={root!r} + "/d", command="test",\n'
        '                  is_smoke=True, log=print)\n')
    proc = subprocess.Popen([sys.executable, '-c', script],
                            cwd=test_train.REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
      if line == 'busy\n':
        break
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = interrupt_worker.output_within(proc, 60)
    self.assertEqual(proc.returncode, 130, err[-2000:])
    self.assertLess(time.monotonic() - sent, 30)
    self.assertIn('regime: none_s0 interrupted; run the sweep again', err)
    self.assertFalse(os.path.exists(
        reproduce.data_path(os.path.join(root, 'd'), 'regime', 'none_s0')))
    self.assertTrue(os.listdir(
        os.path.join(root, 'w', 'regime', 'none_s0', 'checkpoints')))


def records_of(path):
  with gzip.open(path, 'rt') as f:
    return [json.loads(line) for line in f][1:]


def _run(variant, seed, per_step, warm_steps=300, pass_rate=0.9):
  """A Run of 3 steps of `per_step` prompts each, held-out accuracy 0.5,
  0.6, 0.7, 0.8 (target 0.95 x 0.7, reached at step 2), and a warm start
  of `warm_steps` steps and pass rate `pass_rate`."""
  r = object.__new__(results_report.Run)
  r.variant, r.seed = variant, seed
  r.header = {'steps': 3, 'warmstart': {
      'steps': warm_steps, 'pass_rate': pass_rate, 'eval_accuracy': 0.5}}
  r.steps = [{'step': k, 'rollout/prompts_generated': per_step}
             for k in (1, 2, 3)]
  r.cum = {k: (k * per_step, 0.0, 0.0) for k in range(4)}
  r.evals = [(k, a, {'eval/accuracy': a})
             for k, a in enumerate((0.5, 0.6, 0.7, 0.8))]
  return r


class StatsTest(absltest.TestCase):

  def test_interval_by_hand(self):
    m, lo, hi = results_report.interval([1.0, 2.0, 3.0])
    # sd = 1, n = 3, t(2) = 4.303.
    self.assertAlmostEqual(m, 2.0)
    self.assertAlmostEqual(hi - m, 4.303 / 3 ** 0.5, places=6)
    self.assertAlmostEqual(m - lo, hi - m)

  def test_ratio_interval_is_geometric(self):
    m, lo, hi = results_report.ratio_interval([2.0, 2.0, 2.0])
    self.assertAlmostEqual(m, 2.0)
    self.assertAlmostEqual(lo, 2.0)
    self.assertAlmostEqual(hi, 2.0)
    m, _, _ = results_report.ratio_interval([1.0, 4.0])
    self.assertAlmostEqual(m, 2.0)

  def test_matched_generation_compares_the_final_evaluations(self):
    # none's accuracy rises by 0.01 per 1 prompt; the policy holds 0.5
    # and spends half as much: over its last three evaluations (after 5, 10
    # and 15 prompts) it is 0.45, 0.4 and 0.35 above none. On a subset
    # (its own key) none holds 0.2 and the policy 0.1 less.
    def run(prompts, accuracies, subset):
      r = object.__new__(results_report.Run)
      r.cum = {step: (p, 0.0, 0.0) for step, p in enumerate(prompts)}
      r.evals = [(step, a, {'eval/accuracy': a, 'eval/accuracy/x': subset})
                 for step, a in enumerate(accuracies)]
      return r

    base = run([0, 10, 20, 30], [0.0, 0.1, 0.2, 0.3], 0.2)
    policy = run([0, 5, 10, 15], [0.5] * 4, 0.1)
    self.assertAlmostEqual(policy.matched_minus(base), 0.4)
    self.assertAlmostEqual(base.matched_minus(base), 0.0)
    self.assertAlmostEqual(policy.matched_minus(base, 'eval/accuracy/x'), -0.1)

  def test_group_size_table_pairs_within_each_g(self):
    # At G = 4, N = 3 spends half of none's prompts at every step and
    # reaches the same accuracies; its warm start is G = 8's on seed 0
    # (its sampled pass rate, G samples a prompt, differs) and not on seed
    # 1 (other steps).
    g8 = {'none': {s: _run('none', s, 100, 300) for s in (0, 1)}}
    g4 = {v: {s: _run(v, s, 100 if v == 'none' else 50,
                      300 if s == 0 else 400, pass_rate=0.8) for s in (0, 1)}
          for v in ('none', 'snooze3')}
    table = results_report.group_size_table({8: g8, 4: g4}, g8)
    self.assertIn('| 4 | `snooze3` | 2 | 2/2 | 2.00 / 2.00 | '
                  '2.00x [2.00, 2.00] | 2.00x [2.00, 2.00] |', table)
    self.assertNotIn('`weighted`', table)
    self.assertNotIn('| 8 |', table)  # G = 8 has no policy but none here
    self.assertIn('(steps and held-out accuracy): 1 of 2 seeds', table)
    self.assertIn('No runs at G = 4 or G = 16 yet',
                  results_report.group_size_table({8: g8}, g8))

  def test_group_size_replication_splits_the_seeds(self):
    # At G = 16 `weighted` spends half of none's prompts on seeds 0-4 and
    # a quarter on seeds 5-9; G = 4 has not run on seeds 5-9. Of seeds
    # 5-9, G = 8's warm start of seed 9 took other steps.
    g16 = {'none': {s: _run('none', s, 100) for s in range(10)},
           'weighted': {s: _run('weighted', s, 50 if s < 5 else 25)
                        for s in range(10)}}
    g4 = {v: {s: _run(v, s, 100) for s in range(5)}
          for v in ('none', 'weighted')}
    g8 = {'none': {s: _run('none', s, 100, 400 if s == 9 else 300)
                   for s in range(10)}}
    table = results_report.group_size_replication({4: g4, 16: g16}, g8)
    self.assertIn('| 16 | first (0-4) | 2.00 / 2.00 / 2.00 / 2.00 / 2.00 | '
                  '2.00x [2.00, 2.00] |', table)
    self.assertIn('| 16 | replication (5-9) | 4.00 / 4.00 / 4.00 / 4.00 / '
                  '4.00 | 4.00x [4.00, 4.00] |', table)
    self.assertIn('| 2.83x [', table)  # all ten: the geometric mean
    self.assertNotIn('| 4 |', table)
    self.assertIn('Warm starts of seeds 5-9 the same as at G = 8: 4 of 5.',
                  table)
    self.assertIn('No policy has run on seeds 5-9',
                  results_report.group_size_replication({4: g4}, g8))

  def test_preregistered_verdict_applies_each_rule(self):
    verdict = results_report.preregistered_verdict
    good = [2.2, 2.4, 2.1, 2.6, 2.3]
    flat = [0.0, 0.01, -0.01, 0.005, 0.0]
    self.assertEqual(verdict(good, flat, 5, 2.0), 'holds')
    self.assertEqual(verdict(good[:3], flat[:3], 5, 2.0),
                     'pending: 3 of 5 seeds')
    self.assertIn('not reached', verdict([0.0] + good[1:], flat, 5, 2.0))
    self.assertIn('mean 1.50x < 2.0x', verdict([1.5] * 5, flat, 5, 2.0))
    # A wide spread: the geometric mean is 2x, its interval reaches 1.0x.
    self.assertIn('interval low', verdict([0.5, 8.0, 2.0, 1.0, 4.0], flat,
                                          5, 2.0))
    self.assertIn('accuracy loss',
                  verdict(good, [-0.03, -0.02, -0.025, -0.03, -0.02], 5, 2.0))


if __name__ == '__main__':
  absltest.main()
