"""Faults through the command line: one line, the right exit code, and
nothing lost (docs/troubleshooting.md#faults lists every case tried here).

Runs are tiny (demo config, no warm start, no evaluation); one trained
workdir is copied for each case that needs checkpoints.
"""

import contextlib
import functools
import glob
import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from unittest import mock

from absl.testing import absltest

from jaxgrpo import checkpoint as checkpoint_lib
from jaxgrpo import config_lib
from jaxgrpo import errors
from jaxgrpo import model_spec
from jaxgrpo import resume_policy
from jaxgrpo.cli import export
from jaxgrpo.cli import plot
from jaxgrpo.cli import stratify
from jaxgrpo.model import pretrained
from jaxgrpo.configs import common
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.configs import demo
from jaxgrpo.reporting import metrics as metrics_lib
from tests import cli_in_process

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'scripts'))
# pylint: disable=g-import-not-at-top,wrong-import-position
import fault_injection  # the damages it does to checkpoints
PREFIX = 'jaxgrpo-train: error: '
FAST = ('--config.warmstart.enabled=False', '--config.eval.every=0',
        '--config.plots=False', '--config.tensorboard=False', '--quiet')


def _argv(workdir: str, flags: tuple[str, ...], config: str) -> list[str]:
  """The command line of `cli` and `cli_here`, after the program."""
  return [f'--config={config}', f'--workdir={workdir}', *FAST, *flags]


def cli(workdir: str, *flags: str, config: str = 'configs/demo.py:runlocal',
        env: dict[str, str] | None = None, wait: bool = True):
  """Runs `python -m jaxgrpo.main` (the CompletedProcess, or the Popen)."""
  args = [sys.executable, '-m', 'jaxgrpo.main',
          *_argv(workdir, flags, config)]
  env = {**os.environ, 'PYTHONPATH': REPO, **(env or {})}
  if not wait:
    return subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
  return subprocess.run(args, cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=300)


def cli_here(workdir: str, *flags: str,
             config: str = 'configs/demo.py:runlocal'):
  """`cli`, run in this process (tests/cli_in_process.py)."""
  return cli_in_process.run(*_argv(workdir, flags, config))


def steps_written(workdir: str) -> list[int]:
  if not os.path.exists(os.path.join(workdir, 'metrics.jsonl')):
    return []
  return [r['step'] for r in metrics_lib.read_metrics(workdir)]


def listing(folder: str) -> list[str]:
  """Every file under `folder`, relative to it."""
  out = []
  for root, _, files in os.walk(folder):
    out += [os.path.relpath(os.path.join(root, f), folder) for f in files]
  return sorted(out)


class FaultTestCase(absltest.TestCase):

  def assert_one_line(self, out, code: int, *needles: str) -> str:
    """The run ended with exit `code` and one stderr line holding
    `needles`, with no traceback anywhere; returns the line."""
    both = out.stdout + out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    self.assertEqual(out.returncode, code, both[-3000:])
    self.assertLen(lines, 1, both[-3000:])
    self.assertStartsWith(lines[0], PREFIX)
    for needle in needles:
      self.assertIn(needle, lines[0])
    self.assertNotIn('Traceback', both)
    return lines[0]


def _demo_dict(**changes):
  """The resolved runlocal demo config with `section__key=value` changes."""
  c = demo.get_config('runlocal')
  for key, value in changes.items():
    section, name = key.split('__')
    c[section][name] = value
  return config_lib.to_dict(config_lib.from_config_dict(c))


class TrainedWorkdirTest(FaultTestCase):
  """Resumes of one trained workdir (checkpoints 0..4), copied per case."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # Its own folder: test workers (pytest -n) each set the class up.
    cls.base = os.path.join(tempfile.mkdtemp(
        dir=absltest.get_default_test_tmpdir()), 'trained')
    out = cli(cls.base, '--config.total_steps=4', '--config.checkpoint.every=1',
              '--config.checkpoint.max_to_keep=5')
    assert out.returncode == 0, out.stderr[-3000:]

  def copy(self) -> str:
    workdir = os.path.join(self.create_tempdir().full_path, 'run')
    shutil.copytree(self.base, workdir)
    return workdir

  def ckpt(self, workdir: str, step) -> str:
    return os.path.join(workdir, 'checkpoints', str(step))

  def test_no_command_writes_into_a_runs_checkpoints(self):
    # A run trained in W/checkpoints/2 was accepted, and then deleted with
    # that step's folder by W's checkpoint rotation, without a word.
    workdir = self.copy()
    before = listing(workdir)
    inner = self.ckpt(workdir, 2)
    self.assert_one_line(
        cli_here(inner), 2, f'--workdir {inner}: it is inside the checkpoints '
        f'of the run in {workdir}, whose checkpoint rotation would delete it; '
        'choose another folder')
    for command, prog, args in (
        (plot.main, 'jaxgrpo-plot', [workdir]),
        (stratify.main, 'jaxgrpo-stratify', [
            'run', '--config=configs/demo.py:runlocal',
            f'--checkpoint={workdir}'])):
      err = io.StringIO()
      with contextlib.redirect_stderr(err), contextlib.redirect_stdout(
          io.StringIO()):
        code = command([*args, f'--out={inner}/out'])
      self.assertEqual((code, err.getvalue().strip().splitlines()), (2, [
          f'{prog}: error: --out={inner}/out: it is inside the checkpoints of '
          f'the run in {workdir}, whose checkpoint rotation would delete it; '
          'choose another folder']))
    self.assertEqual(listing(workdir), before)

  def test_changed_settings_are_refused_naming_the_key(self):
    workdir = self.copy()
    before = listing(workdir)
    for flag, shown in (
        ('--config.rollout.group_size=8', 'rollout.group_size: 4 -> 8'),
        ('--config.rollout.max_new_tokens=8', 'rollout.max_new_tokens: 6 -> 8'),
        ('--config.sampler.policy=filter', "sampler.policy: 'snooze' -> "),
        ('--config.rl.beta=0.04', 'rl.beta: 0.0 -> 0.04'),
        ('--config.seed=1', 'seed: 0 -> 1'),
    ):
      out = cli(workdir, '--config.total_steps=6', flag)
      self.assert_one_line(out, 1, shown, 'cannot change on resume',
                           'checkpoint of step 4')
    self.assertEqual(listing(workdir), before)  # nothing written or lost

  def test_adjusted_settings_are_accepted_with_a_notice(self):
    workdir = self.copy()
    out = cli(workdir, '--config.total_steps=5', '--config.optim.learning_rate=5e-4',
              '--config.checkpoint.every=2', '--config.log_every=5')
    self.assertEqual(out.returncode, 0, out.stderr[-3000:])
    self.assertIn('resumed with a changed setting, optim.learning_rate: '
                  '0.001 -> 0.0005: the optimizer steps from here on use the '
                  'new values (step 5 on)', out.stdout)
    self.assertNotIn('checkpoint.every', out.stdout)  # free: no notice
    self.assertIn('at step 4', out.stdout)
    self.assertEqual(steps_written(workdir), [0, 1, 2, 3, 4, 5])
    self.assertFalse(out.stderr.strip(), out.stderr[-3000:])

  def test_a_checkpoint_from_before_a_setting_ran_with_its_default(self):
    # Its saved config lacks rl.cut_completions (written before it existed):
    # a resume under 'mask' changed what the run means without a word.
    workdir = self.copy()
    for step in steps_written(workdir):
      path = os.path.join(self.ckpt(workdir, step), 'meta', 'metadata')
      with open(path) as f:
        meta = json.load(f)
      del meta['config']['rl']['cut_completions']
      with open(path, 'w') as f:
        json.dump(meta, f)
    before = listing(workdir)
    out = cli(workdir, '--config.total_steps=5',
              '--config.rl.cut_completions=mask')
    self.assert_one_line(
        out, 1, "rl.cut_completions: (not saved: 'train', its default) -> "
        "'mask' (a value not saved is the default of a setting added after "
        'the checkpoint was written', 'cannot change on resume',
        'checkpoint of step 4')
    self.assertEqual(listing(workdir), before)  # nothing written or lost
    out = cli(workdir, '--config.total_steps=5')  # what it ran with
    self.assertEqual(out.returncode, 0, out.stderr[-3000:])
    self.assertIn('at step 4', out.stdout)
    self.assertNotIn('changed setting', out.stdout)
    self.assertEqual(steps_written(workdir), [0, 1, 2, 3, 4, 5])

  def test_speed_settings_may_change(self):
    # How the same computation is laid out: no notice, no refusal.
    saved = config_lib.to_dict(config_lib.from_config_dict(
        demo.get_config('runlocal')))
    changed = demo.get_config('runlocal')
    changed.rollout.train_lengths = 1
    changed.model.remat = 'full'
    now = config_lib.to_dict(config_lib.from_config_dict(changed))
    self.assertEqual(resume_policy.check(saved, now, where='x', step=4), [])

  def test_a_relative_model_path_is_saved_absolute(self):
    # It was saved as given: jaxgrpo-export, jaxgrpo-eval and resumes from
    # another folder looked for the model (and a LoRA run's base) there.
    folder = self.create_tempdir().full_path
    cwd = os.getcwd()
    os.chdir(folder)
    try:
      c = demo.get_config('runlocal')
      c.model.path = 'models/qwen'
      now = config_lib.to_dict(config_lib.from_config_dict(c))
      self.assertEqual(now['model']['path'],
                       os.path.join(folder, 'models', 'qwen'))
      # A checkpoint that holds it relative resumes from the same folder.
      older = config_lib.to_dict(config_lib.from_config_dict(c))
      older['model']['path'] = 'models/qwen'
      self.assertEqual(resume_policy.check(older, now, where='x', step=4), [])
      c.model.path = 'smollm2'  # a name, not a path
      self.assertEqual(config_lib.from_config_dict(c).model.path, 'smollm2')
    finally:
      os.chdir(cwd)
    c.model.path = '~/models/qwen'
    self.assertEqual(config_lib.from_config_dict(c).model.path,
                     os.path.expanduser('~/models/qwen'))

  def test_settings_of_a_mode_that_is_off_may_change(self):
    as_dict = _demo_dict
    saved = as_dict()
    self.assertEqual(saved['rollout']['engine'], 'static')
    self.assertEqual(saved['sampler']['policy'], 'snooze')
    unused = as_dict(rollout__slots=8, rollout__max_round_size=64,
                     rollout__max_staleness=3, sampler__w_min=0.5)
    self.assertEqual(resume_policy.check(saved, unused, where='x', step=4), [])
    # The Beta prior: read by `weighted` and by adaptive round sizes, neither
    # on here (it was refused under every policy).
    self.assertEqual(saved['rollout']['round_size'], 4)
    prior = dict(sampler__prior_mean=0.3, sampler__prior_strength=4.0)
    self.assertEqual(resume_policy.check(
        saved, as_dict(**prior), where='x', step=4), [])
    # Read by the mode in force (the default's snooze), or once it is on.
    for before, changed, shown in (
        (saved, as_dict(sampler__snooze_factor=4),
         'sampler.snooze_factor: 3 -> 4'),
        (saved, as_dict(rollout__engine='continuous', rollout__slots=8),
         'rollout.engine'),
        (as_dict(sampler__policy='weighted'),
         as_dict(sampler__policy='weighted', **prior),
         'sampler.prior_strength: 2.0 -> 4.0; sampler.prior_mean: None -> '
         '0.3; these cannot change'),
        (as_dict(rollout__round_size='adaptive'),
         as_dict(rollout__round_size='adaptive', sampler__prior_strength=3.0),
         'sampler.prior_strength: 2.0 -> 3.0'),
    ):
      with self.assertRaisesRegex(errors.ResumeError, shown):
        resume_policy.check(before, changed, where='x', step=4)
    older = as_dict()  # written before rollout.engine: it ran its default
    del older['rollout']['engine']
    self.assertEqual(resume_policy.check(
        older, as_dict(rollout__slots=8), where='x', step=4), [])
    continuous = as_dict(rollout__engine='continuous')
    with self.assertRaisesRegex(errors.ResumeError, 'rollout.slots: 64 -> 8'):
      resume_policy.check(continuous, as_dict(
          rollout__engine='continuous', rollout__slots=8), where='x', step=4)

  def test_notices_say_what_the_change_does(self):
    as_dict = _demo_dict
    saved, now = as_dict(), as_dict()
    now['data']['datasets'][0]['verifier'] = 'math'
    self.assertEqual(resume_policy.check(saved, now, where='x', step=4), [
        "resumed with a changed setting, data.datasets[0].verifier: "
        "'exact_match' -> 'math': completions are scored by the new verifier "
        'from here on (step 5 on)'])
    # total_steps is free, but a cosine schedule spans it.
    now = as_dict()
    now['total_steps'] = 9
    self.assertEqual(resume_policy.check(saved, now, where='x', step=4), [])
    saved, now = as_dict(optim__schedule='cosine'), as_dict(
        optim__schedule='cosine')
    now['total_steps'] = 9
    self.assertEqual(resume_policy.check(saved, now, where='x', step=4), [
        'resumed with a changed setting, total_steps: 2 -> 9: the cosine '
        'learning-rate schedule spans the new total (step 5 on)'])

  def test_reordered_datasets_get_a_notice(self):
    # State is matched by name, but the mixture draws in list order.
    def as_dict(*names):
      c = demo.get_config('runlocal')
      c.data.datasets = [common.arithmetic_dataset(n) for n in names]
      return config_lib.to_dict(config_lib.from_config_dict(c))

    saved = as_dict('a', 'b', 'c')
    self.assertEqual(resume_policy.check(saved, as_dict('a', 'b', 'c'), where='x',
                                  step=4), [])
    self.assertEqual(resume_policy.check(saved, as_dict('a', 'b'), where='x',
                                  step=4), [])  # one left out: no reorder
    self.assertEqual(resume_policy.check(saved, as_dict('c', 'a', 'b'), where='x',
                                  step=4), [
        "resumed with data.datasets in another order, ['a', 'b', 'c'] -> "
        "['c', 'a', 'b']: each keeps its sampler state (matched by name), but "
        'the mixture draws over the datasets in list order, so the draws '
        'differ from a run in the old order (step 5 on)'])
    self.assertEqual(resume_policy.check(saved, as_dict('b', 'a'), where='x',
                                  step=0), [])  # a start point: free

  def test_a_start_point_takes_other_sampler_and_rollout_settings(self):
    # resume_policy.check on the config a checkpoint holds: from step 0 (a shared
    # warm start) the data side may change, the model and seed may not.
    saved = config_lib.to_dict(config_lib.from_config_dict(
        demo.get_config('runlocal')))
    changed = demo.get_config('runlocal')
    changed.sampler.policy = 'none'
    changed.rollout.group_size = 4
    now = config_lib.to_dict(config_lib.from_config_dict(changed))
    self.assertEqual(resume_policy.check(saved, now, where='x', step=0), [])
    with self.assertRaisesRegex(errors.ResumeError,
                                "sampler.policy: 'snooze' -> 'none'"):
      resume_policy.check(saved, now, where='x', step=4)
    changed.seed = 1
    now = config_lib.to_dict(config_lib.from_config_dict(changed))
    with self.assertRaisesRegex(errors.ResumeError, 'seed: 0 -> 1'):
      resume_policy.check(saved, now, where='x', step=0)

  def _damage_and_resume(self, damages: dict[int, callable]):
    workdir = self.copy()
    for step, damage in damages.items():
      damage(self.ckpt(workdir, step))
    kept = {step: listing(self.ckpt(workdir, step)) for step in damages}
    os.makedirs(os.path.join(workdir, 'checkpoints', 'backup'))
    with open(os.path.join(workdir, 'checkpoints', 'notes.txt'), 'w') as f:
      f.write('a leftover that is no step\n')
    out = cli(workdir, '--config.total_steps=2')
    self.assertEqual(out.returncode, 0, out.stdout[-2000:] + out.stderr[-3000:])
    both = out.stdout + out.stderr
    self.assertNotIn('Traceback', both, both[max(0, both.find('Traceback') - 1500):][:4000])
    self.assertFalse(out.stderr.strip(), out.stderr[-3000:])
    self.assertIn(f'resumed from {workdir} at step 0', out.stdout)
    for step in damages:
      self.assertIn(f'the checkpoint of step {step} is damaged', out.stdout)
      aside = glob.glob(self.ckpt(workdir, f'{step}.damaged-*'))
      self.assertLen(aside, 1)
      # Set aside whole: every file the damage left is still there.
      self.assertEqual(listing(aside[0]), kept[step])
    self.assertEqual(steps_written(workdir), [0, 1, 2])
    self.assertTrue(os.path.isdir(os.path.join(workdir, 'checkpoints', 'backup')))
    checkpoint_lib.load_state_arrays(os.path.join(workdir, 'checkpoints'))
    return out

  def test_damaged_checkpoints_are_set_aside(self):
    out = self._damage_and_resume({
        4: fault_injection.truncate_array, 3: remove_item('meta'),
        2: corrupt_json('state/_METADATA'), 1: empty_folder})
    self.assertIn('(an array file cannot be read (truncated or missing))',
                  out.stdout)
    self.assertIn("(its 'meta' item is missing)", out.stdout)
    self.assertIn('(a metadata file is not valid JSON', out.stdout)

  def test_more_damaged_checkpoints_are_set_aside(self):
    out = self._damage_and_resume({
        4: remove_array_files, 3: remove_item('data'),
        2: corrupt_json('meta/metadata'), 1: remove_file('state/_METADATA')})
    self.assertIn("(its 'data' item is missing)", out.stdout)
    self.assertIn('(a file is missing: ', out.stdout)

  def test_notes_without_a_config_are_damage(self):
    # `{}` in meta/metadata turned off every resume check: the run resumed
    # unchecked and a changed group_size ended in a broadcast traceback.
    out = self._damage_and_resume({
        4: replace_json('meta/metadata', {}),
        3: replace_json('meta/metadata', {'model': {}, 'datasets': {}}),
        2: replace_json('meta/metadata', []),
        1: replace_json('meta/metadata', 'x')})
    self.assertIn('(its notes (meta/metadata) hold no config, which every '
                  'checkpoint holds: the file was replaced or edited)',
                  out.stdout)

  def test_changed_array_values_are_set_aside(self):
    # Files whole and parseable, values changed: orbax restores them; the
    # checksums saved in the JSON item do not match. (The data item's small
    # arrays sit inside OCDBT's tree nodes, whose damage tensorstore
    # reports itself.)
    out = self._damage_and_resume({
        4: change_value('params/embedding/value'),
        3: change_value('opt_state/1/0/nu/blocks/1/mlp/down/w/value'),
        2: fault_injection.flip_bytes, 1: fault_injection.flip_bytes})
    for step, path in ((4, 'params/embedding/value'),
                       (3, 'opt_state/1/0/nu/blocks/1/mlp/down/w/value')):
      self.assertIn(
          f'the checkpoint of step {step} is damaged (1 array no longer '
          f'matches the checksums saved with them (state/{path}): their files '
          'changed after they were written); set aside as ', out.stdout)

  def test_readers_of_params_refuse_changed_bytes(self):
    workdir = self.copy()
    change_value('params/blocks/1/mlp/gate/w/value')(self.ckpt(workdir, 4))
    with self.assertRaisesRegex(checkpoint_lib.DamagedError,
                                r'no longer match.* \(state/'):
      checkpoint_lib.load_state_arrays(os.path.join(workdir, 'checkpoints'))
    cfg = config_lib.from_config_dict(demo.get_config('runlocal'))
    with self.assertRaisesRegex(model_spec.ModelSpecError,
                                r'step 4 .*no longer match.* \(state/params/'):
      model_spec.load(f'{workdir}@4', cfg)
    # The optimizer state alone changed: the params read as before.
    change_value('opt_state/1/0/nu/blocks/0/mlp/up/w/value')(
        self.ckpt(workdir, 3))
    model_spec.load(f'{workdir}@3', cfg)
    out = subprocess.run(
        [sys.executable, '-m', 'jaxgrpo.cli.export', f'--workdir={workdir}',
         f'--out={workdir}/hf'], cwd=REPO, capture_output=True, text=True,
        env={**os.environ, 'PYTHONPATH': REPO}, timeout=300)
    self.assertEqual(out.returncode, 1, out.stderr[-3000:])
    self.assertIn('the checkpoint of step 4 is damaged', out.stderr)
    self.assertIn('export an earlier one with --step', out.stderr)
    self.assertNotIn('Traceback', out.stderr)
    # Step 3, whose optimizer state alone changed, exports its params (it
    # was refused for an AdamW moment the export does not read).
    out = subprocess.run(
        [sys.executable, '-m', 'jaxgrpo.cli.export', f'--workdir={workdir}',
         '--step=3', f'--out={workdir}/hf'], cwd=REPO, capture_output=True,
        text=True, env={**os.environ, 'PYTHONPATH': REPO}, timeout=300)
    self.assertEqual(out.returncode, 0, out.stderr[-3000:])
    self.assertTrue(os.path.exists(f'{workdir}/hf/config.json'))

  def test_readers_of_a_damaged_checkpoint_print_one_line(self):
    # A read that fails midway leaves tensorstore reads in flight, which
    # reported to orbax's closed loop: an 'Event loop is closed' traceback
    # each, dozens, after the error line (and a KeyError traceback for an
    # item missing).
    workdir = self.copy()
    remove_array_files(self.ckpt(workdir, 4))
    remove_item('meta')(self.ckpt(workdir, 3))
    remove_item('meta')(self.ckpt(workdir, 0))
    # Made by the export (step 4's is damaged past its meta): not left
    # behind, empty.
    out = os.path.join(self.create_tempdir().full_path, 'new', 'hf')
    for module, args, code, needle in (
        # The steps it could export instead are named (it said `export an
        # earlier one with --step`, which left the user to guess them).
        ('export', ['--workdir', workdir, '--out', out], 1,
         'the checkpoint of step 4 is damaged (an array file cannot be read '
         '(truncated or missing)); export an earlier one with --step (steps '
         'there: 0, 1, 2, 3)'),
        ('export', ['--workdir', workdir, '--out', out, '--step=3'], 1,
         "the checkpoint of step 3 is damaged (its 'meta' item is missing); "
         'export an earlier one with --step (steps there: 0, 1, 2)'),
        ('export', ['--workdir', workdir, '--out', out, '--step=0'], 1,
         "the checkpoint of step 0 is damaged (its 'meta' item is missing); "
         'no earlier checkpoint is there to export'),
        ('evaluate', ['--config', 'configs/demo.py:runlocal', '--checkpoint',
                      workdir, '--limit=2', '--quiet'], 1,
         '(step 4 in ' + os.path.join(workdir, 'checkpoints') + '): cannot '
         'read its params (an array file cannot be read'),
    ):
      with self.subTest(module=module, args=args):
        proc = subprocess.run(
            [sys.executable, '-m', f'jaxgrpo.cli.{module}', *args], cwd=REPO,
            capture_output=True, text=True, timeout=300,
            env={**os.environ, 'PYTHONPATH': REPO})
        self.assertEqual(proc.returncode, code, proc.stderr[-3000:])
        self.assertLen(proc.stderr.splitlines(), 1, proc.stderr[-3000:])
        self.assertIn(needle, proc.stderr)
        self.assertFalse(os.path.exists(os.path.dirname(out)))

  def test_readers_name_a_checkpoint_removed_while_read(self):
    # A run training in the workdir removes all but its latest
    # checkpoint.max_to_keep as it saves: a step resolved before that is
    # gone, or going file by file, when its params are read.
    workdir = self.copy()
    listed = checkpoint_lib.saved_steps
    def listed_then_removed(directory):
      steps = listed(directory)
      shutil.rmtree(self.ckpt(workdir, 3), ignore_errors=True)
      return steps
    cfg = config_lib.from_config_dict(demo.get_config('runlocal'))
    removed = ('it was removed while it was read: the run training there '
               'keeps its latest checkpoint.max_to_keep checkpoints (steps '
               'there now: ')
    with mock.patch.object(checkpoint_lib, 'saved_steps',
                           side_effect=listed_then_removed):
      with self.assertRaisesRegex(model_spec.ModelSpecError,
                                  r'\(step 3 in .*\): ' + re.escape(removed + '0, 1, 2, 4)')):
        model_spec.load(f'{workdir}@3', cfg)
    with self.assertRaisesRegex(errors.UserError, re.escape(
        f'--workdir {workdir}: the checkpoint of step 2: {removed}0, 1, 4)')):
      remove_item('meta')(self.ckpt(workdir, 2))  # its first files gone
      threading.Timer(0.2, shutil.rmtree, [self.ckpt(workdir, 2)]).start()
      export.export_run(workdir, self.create_tempdir().full_path, step=2)

  def test_eval_of_a_workdir_takes_its_latest_again_when_removed(self):
    # jaxgrpo-eval resolves every spec before the first model loads; a run
    # training there may remove that step before its turn comes.
    workdir = self.copy()
    cfg = config_lib.from_config_dict(demo.get_config('runlocal'))
    name = model_spec.name_of(workdir)
    self.assertEqual(name, f'{workdir}@4')
    shutil.rmtree(self.ckpt(workdir, 4))
    lines = []
    model = model_spec.load_resolved(workdir, name, cfg, log=lines.append)
    self.assertEqual(model.name, f'{workdir}@3')
    self.assertIn(f'{workdir}@4 was removed by the run training there: its '
                  f'latest, {workdir}@3, is loaded instead', lines)
    with self.assertRaisesRegex(model_spec.ModelSpecError, 'no step 4'):
      model_spec.load_resolved(name, name, cfg)  # a step named: that one
    # A damaged step, not removed: named, not replaced by the latest.
    remove_item('meta')(self.ckpt(workdir, 2))
    with self.assertRaisesRegex(model_spec.ModelSpecError, 'step 2 in '):
      model_spec.load_resolved(workdir, f'{workdir}@2', cfg)

  def test_export_of_a_workdir_takes_its_latest_again_when_removed(self):
    # As jaxgrpo-eval: the run training there removed the latest step
    # (resolved first) while its params were read.
    workdir = self.copy()
    read_meta = checkpoint_lib.read_meta
    def removed_first(directory, step):
      if step == 4:
        shutil.rmtree(self.ckpt(workdir, 4))
      return read_meta(directory, step)
    lines, out = [], self.create_tempdir().full_path
    with mock.patch.object(checkpoint_lib, 'read_meta',
                           side_effect=removed_first):
      export.export_run(workdir, out, log=lines.append)
    self.assertEqual(lines, [
        f'--workdir {workdir}: the checkpoint of step 4 was removed by the '
        'run training there: its latest, step 3, is exported instead'])
    self.assertTrue(os.path.exists(os.path.join(out, 'model.safetensors')))

  def test_a_listing_that_races_a_removal_is_taken_again(self):
    manager = checkpoint_lib.ocp.CheckpointManager
    calls = []
    def vanishing_once(*args, **kwargs):
      calls.append(args)
      if len(calls) == 1:  # a step folder removed while orbax listed it
        raise FileNotFoundError(2, 'No such file or directory')
      return manager(*args, **kwargs)
    workdir = self.copy()
    with mock.patch.object(checkpoint_lib.ocp, 'CheckpointManager',
                           side_effect=vanishing_once):
      self.assertEqual(checkpoint_lib.saved_steps(
          os.path.join(workdir, 'checkpoints')), [0, 1, 2, 3, 4])
    self.assertLen(calls, 2)

  def test_a_preset_run_exports_its_tokenizer_and_reads_back(self):
    # The demo's built-in char tokenizer goes with the weights, so that the
    # export loads as model.path (and in transformers) with the same ids.
    out = os.path.join(self.create_tempdir().full_path, 'hf')
    export.export_run(self.copy(), out)
    char = tokenizer_lib.make_tokenizer('char')
    tok = pretrained.load(out).tokenizer.with_prompts(chat=True)
    for text in ('12+345=', 'what is 7*8? ok.'):
      self.assertEqual(tokenizer_lib.prompt_ids(tok, text),
                       tokenizer_lib.prompt_ids(char, text))
    self.assertEqual(tok.decode(char.encode('12+3=') + [char.EOS, 7]),
                     '12+3=')
    with open(os.path.join(out, 'config.json')) as f:  # one stop token
      self.assertEqual(json.load(f)['eos_token_id'], char.EOS)
    if importlib.util.find_spec('transformers') is None:
      return
    import transformers  # pylint: disable=g-import-not-at-top
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    self.assertEqual(hf_tok('12+3=')['input_ids'],
                     [char.BOS] + char.encode('12+3='))
    # The template writes the BOS the run's prompts started with (it wrote
    # none, and transformers' apply_chat_template adds none).
    messages = [{'role': 'user', 'content': '12+3='}]
    self.assertEqual(hf_tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True),
        '<|jaxgrpo_bos|>12+3=')
    self.assertEqual(hf_tok.apply_chat_template(
        messages, tokenize=True, return_dict=False,
        add_generation_prompt=True), [char.BOS] + char.encode('12+3='))

  def test_export_replaces_an_earlier_exports_files(self):
    # Another model's export in --out: its chat template, generation
    # settings and adapter would be read with these weights.
    out = self.create_tempdir().full_path
    earlier = ('chat_template.jinja', 'generation_config.json',
               'special_tokens_map.json', 'adapter_config.json',
               'adapter_model.safetensors', 'model-00001-of-00002.safetensors',
               'model.safetensors.index.json', 'notes.txt')
    for name in earlier:
      with open(os.path.join(out, name), 'w') as f:
        f.write('{}')
    os.mkdir(os.path.join(out, 'config.json.d'))
    export.export_run(self.copy(), out)
    self.assertCountEqual(os.listdir(out), [
        'config.json', 'model.safetensors', 'tokenizer.json',
        'tokenizer_config.json', 'generation_config.json', 'notes.txt',
        'config.json.d'])
    # The run's own generation settings, not the earlier export's.
    with open(os.path.join(out, 'generation_config.json')) as f:
      self.assertIn('eos_token_id', json.load(f))

  def test_an_export_that_cannot_be_written_leaves_the_earlier_one(self):
    # The disk fills midway (here: a file size limit, so that the weights'
    # write fails): the earlier export's files were removed first and the
    # new ones left half-written (a complete-looking config.json beside an
    # empty tokenizer.json, or cut-short weights), with a traceback.
    workdir, out = self.copy(), self.create_tempdir().full_path
    export.export_run(workdir, out, step=3)
    before = {name: hashlib.sha256(open(os.path.join(out, name), 'rb').read(
    )).hexdigest() for name in os.listdir(out)}
    limited = ('import resource, signal, sys\n'
               'signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n'
               'resource.setrlimit(resource.RLIMIT_FSIZE, (100000, 100000))\n'
               'from jaxgrpo.cli import export\n'
               'sys.exit(export.main(sys.argv[1:]))\n')
    proc = subprocess.run(
        [sys.executable, '-c', limited, f'--workdir={workdir}',
         f'--out={out}'], cwd=REPO, capture_output=True, text=True,
        env={**os.environ, 'PYTHONPATH': REPO}, timeout=300)
    self.assertEqual(proc.returncode, 1, proc.stderr[-3000:])
    self.assertLen(proc.stderr.splitlines(), 1, proc.stderr[-3000:])
    self.assertStartsWith(proc.stderr, f'jaxgrpo-export: error: --out={out}: '
                          'the export could not be written there (')
    self.assertIn('; nothing of it was left there, and an earlier export '
                  'there is kept', proc.stderr)
    self.assertEqual({name: hashlib.sha256(open(os.path.join(
        out, name), 'rb').read()).hexdigest() for name in os.listdir(out)},
                     before)
    # A folder that a killed export left is removed by the next one.
    os.mkdir(os.path.join(out, '.jaxgrpo-export-killed'))
    export.export_run(workdir, out)
    self.assertCountEqual(os.listdir(out), before)

  def test_export_only_reads_the_workdir_and_names_its_mistakes(self):
    workdir = self.copy()
    # A save in progress by a run still training there: export leaves it.
    os.makedirs(self.ckpt(workdir, '5.orbax-checkpoint-tmp-1733450000000000'))
    before = listing(workdir)

    def run(*args):
      err = io.StringIO()
      with contextlib.redirect_stderr(err), contextlib.redirect_stdout(
          io.StringIO()):
        code = export.main(list(args))
      lines = err.getvalue().splitlines()
      self.assertLen(lines, 1, err.getvalue())
      self.assertStartsWith(lines[0], 'jaxgrpo-export: error: ')
      return code, lines[0]

    missing = os.path.join(self.create_tempdir().full_path, 'nope')
    self.assertEqual(run(f'--workdir={missing}', '--out=x'),
                     (2, f'jaxgrpo-export: error: --workdir {missing}: no '
                      'such folder'))
    self.assertFalse(os.path.exists(missing))  # nothing created
    code, line = run(f'--workdir={workdir}', '--out=x', '--step=9')
    self.assertEqual(code, 2)
    self.assertIn('--step=9: no checkpoint of step 9 in ', line)
    self.assertIn('(steps there: 0, 1, 2, 3, 4)', line)
    a_file = os.path.join(self.create_tempdir().full_path, 'f')
    open(a_file, 'w').close()
    code, line = run(f'--workdir={workdir}', f'--out={a_file}')
    self.assertEqual(code, 2)
    self.assertEndsWith(line, f': {a_file} is a file; name a folder (it is '
                        'created if missing)')
    code, line = run(f'--workdir={workdir}', '--out=' + os.path.join(
        workdir, 'checkpoints', 'hf'))
    self.assertEqual(code, 2)
    self.assertIn("it is inside the run's checkpoints", line)
    code, line = run(f'--workdir={a_file}', '--out=x')
    self.assertEqual(code, 2)
    self.assertIn('is a file, not a run workdir', line)
    # The run's checkpoints folder, or one step's folder in it: the run and
    # step to pass are named (it read `no checkpoint in
    # W/checkpoints/checkpoints`).
    checkpoints = os.path.join(workdir, 'checkpoints')
    self.assertEqual(run(f'--workdir={checkpoints}', '--out=x'), (
        2, f'jaxgrpo-export: error: --workdir {checkpoints}: no checkpoint in '
        f'{checkpoints}/checkpoints: it is the checkpoints folder of the run '
        f'in {workdir}; pass --workdir={workdir}'))
    self.assertEqual(run(f'--workdir={checkpoints}/3', '--out=x'), (
        2, f'jaxgrpo-export: error: --workdir {checkpoints}/3: no checkpoint '
        f'in {checkpoints}/3/checkpoints: it is the checkpoint of step 3 of '
        f'the run in {workdir}; pass --workdir={workdir} --step=3'))
    empty = self.create_tempdir().full_path
    self.assertEqual(run(f'--workdir={empty}', '--out=x'), (
        2, f'jaxgrpo-export: error: --workdir {empty}: no checkpoint in '
        f'{empty}/checkpoints'))
    out = os.path.join(self.create_tempdir().full_path, 'hf')
    self.assertEqual(export.main([f'--workdir={workdir}', f'--out={out}',
                                  '--step=3']), 0)
    self.assertTrue(os.path.exists(os.path.join(out, 'config.json')))
    self.assertEqual(listing(workdir), before)

  def test_export_names_a_read_only_file_system(self):
    # It said `cannot write there (Permission denied)` of a folder on a
    # read-only mount (a dataset volume, a snapshot), sending the user to
    # its permissions.
    folder = self.create_tempdir().full_path
    if subprocess.run(['mount', '-t', 'tmpfs', '-o', 'ro,size=64k', 'tmpfs',
                       folder], capture_output=True).returncode:
      self.skipTest('mounting a read-only tmpfs needs root')
    self.addCleanup(subprocess.run, ['umount', folder], check=True)
    with self.assertRaisesRegex(
        export.common.UsageError,
        re.escape(f'--out={folder}: cannot write there (Read-only file '
                  'system)')):
      export.export_out.out_dir(folder, None, self.create_tempdir().full_path)

  def test_export_refuses_to_overwrite_the_runs_model(self):
    source = self.create_tempdir().full_path
    with self.assertRaisesRegex(export.common.UsageError,
                                "the run's model.path, the model the run "
                                'started from'):
      export.export_out.out_dir(source + '/.', source,
                               self.create_tempdir().full_path)

  def test_no_checkpoint_restores_names_the_folders(self):
    workdir = self.copy()
    for step, damage in zip(range(5), (
        remove_item('meta'), corrupt_json('meta/metadata'), empty_folder,
        truncate_manifest, remove_array_files)):
      damage(self.ckpt(workdir, step))
    before = listing(workdir)
    out = cli(workdir, '--config.total_steps=6')
    self.assert_one_line(out, 1, 'no checkpoint in', 'can be restored: 4 (',
                         'move those folders out of it')
    self.assertEqual(listing(workdir), before)  # nothing renamed or removed


def change_value(path: str):
  """Rewrites one bit of the state's array at `path` through tensorstore:
  the checkpoint stays readable and orbax reads the changed value."""
  return functools.partial(fault_injection.rewrite_value, path=path)


def remove_array_files(folder: str) -> None:
  for path in glob.glob(os.path.join(folder, 'state', 'ocdbt.process_0', 'd',
                                     '*')):
    os.remove(path)


def truncate_manifest(folder: str) -> None:
  os.truncate(os.path.join(folder, 'state', 'manifest.ocdbt'), 0)


def remove_item(item: str):
  return lambda folder: shutil.rmtree(os.path.join(folder, item))


def remove_file(name: str):
  return lambda folder: os.remove(os.path.join(folder, name))


def corrupt_json(name: str):
  def damage(folder):
    with open(os.path.join(folder, name), 'w') as f:
      f.write('{"cut short')
  return damage


def replace_json(name: str, value):
  def damage(folder):
    with open(os.path.join(folder, name), 'w') as f:
      json.dump(value, f)
  return damage


def empty_folder(folder: str) -> None:
  shutil.rmtree(folder)
  os.mkdir(folder)


class DataFileTest(FaultTestCase):
  """A dataset file missing, empty or bad: one line naming it, exit 2."""

  def _config(self, path: str, eval_path: str | None = None) -> str:
    folder = self.create_tempdir().full_path
    config = os.path.join(folder, 'qa_config.py')
    with open(config, 'w') as f:
      f.write(
          'from jaxgrpo.configs import demo\n\n\ndef get_config():\n'
          "  c = demo.get_config('runlocal')\n"
          f"  c.data.datasets = [dict(name='qa', kind='jsonl', path={path!r}, "
          f"eval_path={eval_path!r}, id_field='id')]\n"
          '  return c\n')
    return config

  def _file(self, text: str) -> str:
    path = os.path.join(self.create_tempdir().full_path, 'qa.jsonl')
    with open(path, 'w') as f:
      f.write(text)
    return path

  def test_dataset_file_mistakes(self):
    good = self._file('{"id": "a", "prompt": "1+0=", "answer": "1"}\n')
    missing = os.path.join(self.create_tempdir().full_path, 'nope.jsonl')
    folder = self.create_tempdir().full_path
    cases = [
        (missing, None, f"data.datasets[0].path='{missing}' (dataset 'qa'): "
         'no such file'),
        (self._file(''), None, "(dataset 'qa'): the file has no records"),
        (self._file('\n  \n\n'), None, 'the file has no records'),
        (folder, None, f"data.datasets[0].path='{folder}' (dataset 'qa'): Is "
         'a directory'),
        (good, missing, f"data.datasets[0].eval_path='{missing}'"),
        (self._file('{"id": "a", "prompt": \n'), None,
         "error: data.datasets[0] (dataset 'qa'): /"),
        (self._file('[1, 2]\n'), None, 'qa.jsonl:1: expected a JSON object'),
        (self._file('[\n  {"id": "a", "prompt": "1+0=", "answer": "1"}\n]\n'),
         None, "qa.jsonl: holds a JSON array indented over several lines (its "
         "first line is '[' alone), not JSON Lines (one object per line)"),
        (self._file('{"id": "a", "answer": "1"}\n'), None,
         "data.datasets[0]: /"),
    ]
    for i, (path, eval_path, needle) in enumerate(cases):
      workdir = os.path.join(self.create_tempdir().full_path, 'run')
      # The first as a real process; the others in this one.
      out = (cli if i == 0 else cli_here)(
          workdir, config=self._config(path, eval_path))
      self.assert_one_line(out, 2, needle)
      self.assertFalse(os.path.exists(os.path.join(workdir, 'metrics.jsonl')))


class WorkdirTest(FaultTestCase):
  """Workdirs that are files, not writable, full, or in use."""

  def test_workdir_is_a_file(self):
    path = self.create_tempfile('run').full_path
    out = cli(path)
    self.assert_one_line(out, 2, f'--workdir {path} is a file, not a folder')
    workdir = self.create_tempdir().full_path
    open(os.path.join(workdir, 'checkpoints'), 'w').close()
    out = cli(workdir)
    self.assert_one_line(out, 2, '/checkpoints is a file, not a folder')

  def test_tilde_is_expanded(self):
    home = self.create_tempdir().full_path
    workdir = os.path.join(home, 'runs', 'one')
    os.makedirs(workdir)
    open(os.path.join(workdir, 'checkpoints'), 'w').close()
    out = cli('~/runs/one', env={'HOME': home})
    self.assert_one_line(out, 2, f'--workdir {workdir}: {workdir}/checkpoints '
                         'is a file')
    self.assertFalse(os.path.exists(os.path.join(REPO, '~')))

  def test_read_only_checkpoints_fail_at_start(self):
    workdir = self.create_tempdir().full_path
    folder = os.path.join(workdir, 'checkpoints')
    os.makedirs(folder)
    if os.getuid() == 0:  # root writes anywhere: a read-only mount
      mounted = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'ro,size=1M',
                                'tmpfs', folder], capture_output=True)
      if mounted.returncode:
        self.skipTest('cannot mount a read-only tmpfs')
      self.addCleanup(subprocess.run, ['umount', folder], check=False)
    else:
      os.chmod(folder, 0o555)
      self.addCleanup(os.chmod, folder, 0o755)
    out = cli(workdir, '--config.total_steps=2')
    reason = 'Read-only file system' if os.getuid() == 0 else 'Permission'
    self.assert_one_line(out, 2, f'cannot write checkpoints in {folder} ('
                         + reason)
    self.assertFalse(os.path.exists(os.path.join(workdir, 'metrics.jsonl')))

  def test_full_disk_stops_at_the_first_failed_save(self):
    mount_point = self.create_tempdir().full_path
    mounted = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=1M', 'tmpfs',
                              mount_point], capture_output=True, text=True)
    if mounted.returncode:
      self.skipTest('cannot mount a small tmpfs to fill (needs root)')
    self.addCleanup(subprocess.run, ['umount', mount_point], check=False)
    workdir = os.path.join(mount_point, 'run')
    out = cli(workdir, '--config.total_steps=4', '--config.checkpoint.every=1')
    self.assert_one_line(
        out, 1, f'a checkpoint save to {workdir}/checkpoints failed (No space '
        'left on device)', 'run the same command to start again')
    self.assertEqual(steps_written(workdir), [0])  # no step after the failure

  def test_second_run_is_refused_and_a_killed_run_releases(self):
    workdir = self.create_tempdir().full_path
    first = cli(workdir, '--config.total_steps=400',
                '--config.checkpoint.every=1000', wait=False)
    try:
      deadline = time.time() + 180
      while len(steps_written(workdir)) < 2 and time.time() < deadline:
        time.sleep(0.2)
      self.assertGreaterEqual(len(steps_written(workdir)), 2)
      out = cli(workdir, '--config.total_steps=400',
                '--config.checkpoint.every=1000')
      self.assert_one_line(out, 1, f'--workdir {workdir} is in use by another '
                           f'run (pid {first.pid} on ')
    finally:
      first.send_signal(signal.SIGKILL)
      first.communicate()
    # The kernel released the killed run's lock: the same command resumes
    # from its step-0 checkpoint, every step written once.
    out = cli(workdir, '--config.total_steps=2',
              '--config.checkpoint.every=1000')
    self.assertEqual(out.returncode, 0, out.stderr[-3000:])
    self.assertIn('at step 0', out.stdout)
    self.assertEqual(steps_written(workdir), [0, 1, 2])


if __name__ == '__main__':
  absltest.main()
