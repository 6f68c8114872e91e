"""End-to-end runs of the training loop and the command line (tiny sizes)."""

import json
import os
import subprocess
import sys

from absl.testing import absltest

from configs import demo
from jaxgrpo import config_lib
from jaxgrpo import metrics as metrics_lib
from jaxgrpo import train
from jaxgrpo.verifiers import base as verifiers_base

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@verifiers_base.register('starts_with_digit')
def _starts_with_digit(completion, example):
  """An untrained model passes this about one time in five: mixed groups."""
  del example
  return float(completion[:1].isdigit())


def _config(**overrides):
  c = demo.get_config('runlocal')
  c.warmstart.enabled = False
  c.data.datasets[0]['verifier'] = 'starts_with_digit'
  c.rollout.group_size = 8
  for key, value in overrides.items():
    section, _, name = key.rpartition('.')
    (c[section] if section else c)[name] = value
  return c


class TrainTest(absltest.TestCase):

  def test_trains_writes_metrics_and_resumes(self):
    workdir = self.create_tempdir().full_path
    summary = train.run(_config(), workdir, log=lambda _: None)
    self.assertEqual(summary.steps, 2)
    records = metrics_lib.read_metrics(workdir)
    self.assertEqual([r['step'] for r in records], [0, 1, 2])
    trained = [r for r in records[1:] if 'train/loss' in r]
    self.assertNotEmpty(trained)  # at least one real update happened
    for key in ('rollout/prompts_generated', 'rollout/groups_used',
                'rollout/groups_easy', 'rollout/groups_hard', 'rollout/rounds',
                'rollout/efficiency', 'rollout/cum_prompts_generated',
                'rollout/cum_groups_used', 'reward/mean',
                'reward/mean/arithmetic', 'data/batch_share/arithmetic',
                'data/snoozed/arithmetic', 'data/filtered/arithmetic',
                'perf/step_s', 'perf/gen_tokens_per_s'):
      self.assertIn(key, records[1])
    for key in ('train/loss', 'train/kl', 'train/clip_frac',
                'train/entropy', 'train/grad_norm'):
      self.assertIn(key, trained[0])
    self.assertIn('eval/accuracy', records[-1])
    self.assertIn('eval/accuracy/arithmetic/1d', records[-1])

    # Running again with more steps resumes at step 2: every step once.
    summary = train.run(_config(total_steps=4), workdir, log=lambda _: None)
    self.assertEqual(summary.resumed_from, 2)
    records = metrics_lib.read_metrics(workdir)
    self.assertEqual([r['step'] for r in records], [0, 1, 2, 3, 4])
    self.assertEqual(records[-1]['rollout/cum_prompts_generated'],
                     sum(r['rollout/prompts_generated'] for r in records[1:]))

    # The resumed run is the run that never stopped: same prompts, rewards,
    # losses (so the same params) at steps 3 and 4.
    straight = self.create_tempdir().full_path
    train.run(_config(total_steps=4), straight, log=lambda _: None)
    uninterrupted = metrics_lib.read_metrics(straight)
    for a, b in zip(records[3:], uninterrupted[3:]):
      for key in a:
        if not key.startswith('perf/'):
          self.assertEqual(a[key], b[key], key)

  def test_prompt_longer_than_context_names_the_key(self):
    c = _config()
    c.rollout.max_prompt_len = 4
    with self.assertRaisesRegex(config_lib.ConfigError,
                                'rollout.max_prompt_len=4'):
      train.run(c, self.create_tempdir().full_path, log=lambda _: None)

  def test_unknown_preset_names_the_key(self):
    c = _config()
    c.model.preset = 'gpt5'
    with self.assertRaisesRegex(config_lib.ConfigError, 'model.preset'):
      train.run(c, self.create_tempdir().full_path, log=lambda _: None)


class CommandLineTest(absltest.TestCase):

  def _run(self, *args):
    return subprocess.run(
        [sys.executable, '-m', 'jaxgrpo.main', *args],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )

  def test_bad_values_fail_before_compiling_with_one_line(self):
    workdir = self.create_tempdir().full_path
    cases = {
        '--config.rollout.group_size=1': 'rollout.group_size',
        '--config.rl.eps_low=-0.1': 'rl.eps_low',
        '--config.rl.eps_high=-1.0': 'rl.eps_high',
        '--config.rollout.max_new_tokens=0': 'rollout.max_new_tokens',
        '--config.rollout.gruop_size=4': 'gruop_size',
        '--config.rollout.group_size=abc': 'group_size',
    }
    for flag, key in cases.items():
      out = self._run('--config=configs/demo.py:runlocal',
                      f'--workdir={workdir}', flag)
      self.assertEqual(out.returncode, 2, msg=(flag, out.stderr[-2000:]))
      lines = [l for l in out.stderr.splitlines() if l.strip()]
      self.assertLen(lines, 1, msg=(flag, out.stderr[-2000:]))
      self.assertIn(key, lines[0])
      self.assertNotIn('Traceback', out.stderr)
    # Nothing was trained or written.
    self.assertFalse(os.path.exists(os.path.join(workdir, 'metrics.jsonl')))

  def test_missing_workdir(self):
    out = self._run('--config=configs/demo.py:runlocal')
    self.assertEqual(out.returncode, 2)
    self.assertIn('--workdir', out.stderr)


if __name__ == '__main__':
  absltest.main()


class ConfigFilesTest(absltest.TestCase):
  """Every config's runlocal variant trains 2 steps."""

  def test_runlocal_variants_train(self):
    from configs import mixture_demo  # pylint: disable=g-import-not-at-top
    for module in (demo, mixture_demo):
      workdir = self.create_tempdir().full_path
      lines = []
      summary = train.run(module.get_config('runlocal'), workdir,
                          log=lines.append)
      self.assertEqual(summary.steps, 2, module.__name__)
      records = metrics_lib.read_metrics(workdir)
      self.assertEqual([r['step'] for r in records], [0, 1, 2])
      self.assertTrue(any('run summary' in line for line in lines))
