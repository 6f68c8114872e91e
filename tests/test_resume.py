"""Checkpoints under trouble: preemption, NaN streaks, changed inputs."""

import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

from jaxgrpo import checkpoint as checkpoint_lib
from jaxgrpo import errors
from jaxgrpo import preemption
from jaxgrpo import train
from jaxgrpo.cli import train as cli_train
from jaxgrpo.reporting import metrics as metrics_lib
from jaxgrpo.reporting import summary as summary_lib
from jaxgrpo.rl import batch as batch_lib
from tests import interrupt_worker
from tests import test_train

REPO = test_train.REPO


def _config(**overrides):
  return test_train._config(**overrides)  # pylint: disable=protected-access


def _open_files_under(folder: str) -> list[str]:
  """The files under `folder` this process holds open (Linux)."""
  found = []
  for fd in os.listdir('/proc/self/fd'):
    with contextlib.suppress(OSError):
      target = os.readlink(f'/proc/self/fd/{fd}')
      if target.startswith(folder + os.sep):
        found.append(target)
  return found


class ResumeChecksTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.workdir = tempfile.mkdtemp(prefix='one_step',
                                   dir=absltest.get_default_test_tmpdir())
    train.run(_config(total_steps=1), cls.workdir, log=lambda _: None)

  def test_changed_dataset_is_named(self):
    c = _config(total_steps=2)
    c.data.datasets[0]['num_train'] = 200
    with self.assertRaisesRegex(errors.ResumeError,
                                "dataset 'arithmetic' changed.*256.*200"):
      train.run(c, self.workdir, log=lambda _: None)
    c = _config(total_steps=2)
    c.data.datasets[0]['seed'] = 5  # same size, other problems
    with self.assertRaisesRegex(errors.ResumeError, 'fingerprint'):
      train.run(c, self.workdir, log=lambda _: None)

  def test_changed_dataset_without_saved_ids_cannot_remap(self):
    c = _config(total_steps=2)
    c.data.datasets[0]['num_train'] = 200
    c.checkpoint.on_dataset_change = 'remap'
    with self.assertRaisesRegex(errors.ResumeError,
                                "'arithmetic' changed.*holds no example ids"):
      train.run(c, self.workdir, log=lambda _: None)

  def test_a_start_point_takes_changed_data(self):
    # Step 0 is a start point whose data may change (FREE_AT_START): a
    # resized or added dataset was refused, and the hint ('remap') led to a
    # second refusal.
    workdir = self.create_tempdir().full_path
    train.run(_config(total_steps=0), workdir, log=lambda _: None)
    c = _config(total_steps=1)
    first = {**c.data.datasets[0], 'num_train': 200}
    c.data.datasets = [first, {**first, 'name': 'b', 'num_train': 100}]
    out = []
    train.run(c, workdir, log=out.append)
    self.assertTrue(any(
        'the checkpoint of step 0 in ' in line and "is a start point and its "
        "datasets differ from this run's ('arithmetic', 'b'): the sampler "
        'starts afresh on the data as it is now' in line for line in out), out)
    self.assertEqual([r['step'] for r in metrics_lib.read_metrics(workdir)],
                     [0, 1])
    ckpt = checkpoint_lib.Checkpointer(
        os.path.join(workdir, 'checkpoints'), every=1, max_to_keep=2)
    tables = ckpt.restore_data(1)['source']['tables']
    ckpt.close()
    self.assertEqual({k: int(v['size']) for k, v in tables.items()},
                     {'arithmetic': 200, 'b': 100})
    # Past step 0, the same change is refused.
    c.total_steps = 2
    c.data.datasets = [{**first, 'num_train': 150}, c.data.datasets[1]]
    with self.assertRaisesRegex(errors.ResumeError,
                                "dataset 'arithmetic' changed.*200.*150"):
      train.run(c, workdir, log=lambda _: None)

  def test_other_model_is_named(self):
    c = _config(total_steps=2)
    c.model.preset = 'tiny'
    # Found from the saved config before anything is built.
    with self.assertRaisesRegex(errors.ResumeError,
                                "another model \\(model.preset: 'demo' -> "
                                "'tiny'\\)"):
      train.run(c, self.workdir, log=lambda _: None)

  def test_a_step_folder_under_another_number_is_refused(self):
    # A folder renamed by hand (1 -> 5) resumed as step 5: steps 2-5 were
    # never taken, and the rest of the run took 4 updates fewer.
    workdir = os.path.join(self.create_tempdir().full_path, 'run')
    shutil.copytree(self.workdir, workdir)
    folder = os.path.join(workdir, 'checkpoints')
    os.rename(os.path.join(folder, '1'), os.path.join(folder, '5'))
    with self.assertRaisesRegex(
        errors.ResumeError, f'^the folder {folder}/5 holds the checkpoint of '
        'step 1 \\(saved with it\\).*rename it back to 1'):
      train.run(_config(total_steps=6), workdir, log=lambda _: None)
    self.assertEqual(sorted(os.listdir(folder)), ['0', '5'])  # none set aside

  def test_unwritable_workdir(self):
    blocker = self.create_tempfile('a_file').full_path
    with self.assertRaisesRegex(errors.ConfigError, 'cannot write there'):
      train.run(_config(), os.path.join(blocker, 'run'), log=lambda _: None)

  def test_files_the_run_writes_must_be_files(self):
    for name in ('metrics.jsonl', '.lock'):
      workdir = self.create_tempdir().full_path
      os.mkdir(os.path.join(workdir, name))
      with self.assertRaisesRegex(
          errors.ConfigError, f'^--workdir {workdir}: {workdir}/{name} is '
          'not a file; move it away \\(the run writes it\\)$'):
        train.run(_config(), workdir, log=lambda _: None)


class RemapTest(absltest.TestCase):

  def _first_step(self, lines: list[str], **entry):
    """(file, workdir, config) of one step under `remap` on a JSONL file of
    `lines` (dataset 'qa' with the `entry` keys)."""
    folder = self.create_tempdir().full_path
    path = os.path.join(folder, 'qa.jsonl')
    with open(path, 'w') as f:
      f.writelines(lines)
    workdir = os.path.join(folder, 'run')
    c = _config(total_steps=1)
    c.checkpoint.on_dataset_change = 'remap'
    c.data.datasets = [dict(name='qa', kind='jsonl', path=path,
                            verifier='starts_with_digit', **entry)]
    train.run(c, workdir, log=lambda _: None)
    return path, workdir, c

  def assert_second_step_says(self, c, workdir: str, text: str):
    """Runs step 2 of `c` in `workdir`; one of its lines holds `text`."""
    c.total_steps, out = 2, []
    train.run(c, workdir, log=out.append)
    self.assertTrue(any(text in line for line in out), out)

  def test_a_changed_file_with_positional_ids_or_split_says_so(self):
    lines = [f'{{"prompt": "{i}+{i % 3}=", "answer": "{i + i % 3}"}}\n'
             for i in range(24)]
    path, workdir, c = self._first_step(lines, holdout=4, num_eval=4)
    with open(path, 'w') as f:  # the same records, in another order
      f.writelines(lines[12:] + lines[:12])
    self.assert_second_step_says(
        c, workdir, "dataset 'qa' changed: sampler state kept for 20 examples "
        'by id, 0 new, 0 removed; its ids are record positions (no '
        'id_field): a record that moved took the state of the one that was '
        'there; set id_field for ids that follow the records; holdout=4 '
        'holds out records by position: the held-out set may have changed too')

  def test_records_edited_between_the_sampled_ones_are_found(self):
    # The fingerprint reads the first, middle and last records: an edit
    # between them resumed without a word, the sampler state of each
    # position going to whatever record was there now.
    record = '{{"id": "{}", "prompt": "{}+{}=", "answer": "{}"}}\n'.format
    lines = [record(f'q{i}', i, i % 3, i + i % 3) for i in range(40)]
    path, workdir, c = self._first_step(lines, id_field='id', num_eval=0)
    # Records 5-14 replaced; 21-38 reversed (0, 20 and 39 stay).
    edited = (lines[:5] + [record(f'n{i}', i, 7, i + 7) for i in range(10)]
              + lines[15:21] + lines[21:39][::-1] + lines[39:])
    with open(path, 'w') as f:
      f.writelines(edited)
    c.total_steps = 2
    c.checkpoint.on_dataset_change = 'error'
    with self.assertRaisesRegex(
        errors.ResumeError, "^dataset 'qa' changed since the checkpoint of "
        r"step 1 in .*: same size, its files' bytes changed \(records edited "
        r'or moved\); or set checkpoint.on_dataset_change'):
      train.run(c, workdir, log=lambda _: None)
    c.checkpoint.on_dataset_change = 'remap'
    self.assert_second_step_says(
        c, workdir, "dataset 'qa' changed: sampler state kept for 30 examples "
        'by id, 10 new, 10 removed')

  def test_ids_that_moved_are_remapped_from_a_checkpoint_without_digest(self):
    # A checkpoint saved before the files' digest was noted: the saved ids
    # still show a reorder that the sampled fingerprint misses.
    lines = [f'{{"id": "q{i}", "prompt": "{i}+1=", "answer": "{i + 1}"}}\n'
             for i in range(40)]
    path, workdir, c = self._first_step(lines, id_field='id', num_eval=0)
    meta = os.path.join(workdir, 'checkpoints', '1', 'meta', 'metadata')
    with open(meta) as f:
      notes = json.load(f)
    del notes['datasets']['qa']['content']
    with open(meta, 'w') as f:
      json.dump(notes, f)
    with open(path, 'w') as f:
      f.writelines(lines[:1] + lines[1:20][::-1] + lines[20:21]
                   + lines[21:39][::-1] + lines[39:])
    self.assert_second_step_says(
        c, workdir, "dataset 'qa' changed: sampler state kept for 40 examples "
        'by id, 0 new, 0 removed')

  def test_resume_with_a_changed_dataset_keeps_state_by_id(self):
    workdir = self.create_tempdir().full_path
    c = _config(total_steps=2)
    c.checkpoint.on_dataset_change = 'remap'
    train.run(c, workdir, log=lambda _: None)
    ckpt = checkpoint_lib.Checkpointer(
        os.path.join(workdir, 'checkpoints'), every=1, max_to_keep=2)
    before = ckpt.restore_data(2)
    ckpt.close()
    c = _config(total_steps=3)
    c.checkpoint.on_dataset_change = 'remap'
    c.data.datasets[0]['num_train'] = 200  # the first 200 ids stay
    lines = []
    train.run(c, workdir, log=lines.append)
    self.assertTrue(any(
        "dataset 'arithmetic' changed: sampler state kept for 200 examples "
        'by id, 0 new, 56 removed' in line for line in lines), lines)
    records = metrics_lib.read_metrics(workdir)
    self.assertEqual([r['step'] for r in records], [0, 1, 2, 3])
    ckpt = checkpoint_lib.Checkpointer(
        os.path.join(workdir, 'checkpoints'), every=1, max_to_keep=2)
    after = ckpt.restore_data(3)
    ckpt.close()
    old = before['source']['tables']['arithmetic']
    new = after['source']['tables']['arithmetic']
    self.assertEqual(int(new['size']), 200)
    self.assertEqual(int(new['epoch']), int(old['epoch']) + 1)
    # Step 3 draws few examples; the others keep their step-2 state.
    untouched = np.asarray(new['last_step'][:200]) < 3
    self.assertGreater(untouched.sum(), 150)
    np.testing.assert_array_equal(
        np.asarray(new['trials'])[untouched],
        np.asarray(old['trials'])[:200][untouched])
    np.testing.assert_array_equal(
        np.asarray(after['ids']['arithmetic']),
        np.asarray(before['ids']['arithmetic'])[:200])


class LeftOutDatasetTest(absltest.TestCase):

  def test_a_dataset_left_out_under_remap_is_named(self):
    workdir = self.create_tempdir().full_path
    c = _config(total_steps=1, **{'eval.every': 0})
    c.checkpoint.on_dataset_change = 'remap'
    c.data.datasets = [dict(c.data.datasets[0]),
                       dict(c.data.datasets[0], name='more', seed=1)]
    train.run(c, workdir, log=lambda _: None)
    c = _config(total_steps=2, **{'eval.every': 0})
    c.checkpoint.on_dataset_change = 'remap'
    lines = []
    train.run(c, workdir, log=lines.append)
    said = [l for l in lines if l.startswith('left out of this run')]
    self.assertLen(said, 1, lines)
    self.assertRegex(said[0], r"^left out of this run: 'more', in the "
                     'checkpoint of step 1 in .*; their sampler state is '
                     r'dropped, with \d+ groups carried or in flight for them$')
    self.assertEqual([r['step'] for r in metrics_lib.read_metrics(workdir)],
                     [0, 1, 2])


class Bfloat16ParamsTest(absltest.TestCase):

  def test_bfloat16_params_move_and_resume_exactly(self):
    # At learning rate 1e-5, AdamW's updates are below bfloat16's rounding
    # step for nearly every weight: plain bfloat16 params lost them (3% of
    # the weights moved in 3 steps, 0.8% at 1e-6). Stochastic rounding moves
    # each with the probability its update asks for, and the noise follows
    # the seed and the update count, so a resume is exact.
    keys = {'model.param_dtype': 'bfloat16', 'optim.learning_rate': 1e-5,
            'optim.warmup_steps': 0, 'rollout.short_batch': 'train',
            'eval.every': 0, 'checkpoint.max_to_keep': 5}
    runs = {}
    for name, stops in (('stopped', (2, 4)), ('straight', (4,))):
      workdir = self.create_tempdir().full_path
      for total in stops:
        train.run(_config(total_steps=total, **keys), workdir,
                  log=lambda _: None)
      runs[name] = checkpoint_lib.load_state_arrays(
          os.path.join(workdir, 'checkpoints'))
    first = jax.tree.leaves(checkpoint_lib.load_state_arrays(
        os.path.join(workdir, 'checkpoints'), 0)['params'])
    last = jax.tree.leaves(runs['straight']['params'])
    self.assertEqual({str(x.dtype) for x in last}, {'bfloat16'})
    moved = sum(int((np.asarray(a) != np.asarray(b)).sum())
                for a, b in zip(first, last))
    self.assertGreater(moved / sum(x.size for x in last), 0.1)
    moments = [x for x in jax.tree.leaves(runs['straight']['opt_state'])
               if np.ndim(x) > 1]
    self.assertEqual({str(x.dtype) for x in moments}, {'float32'})
    for a, b in zip(jax.tree.leaves(runs['stopped']),
                    jax.tree.leaves(runs['straight']), strict=True):
      np.testing.assert_array_equal(a, b)


class InFlightResumeTest(parameterized.TestCase):

  @parameterized.parameters('keep', 'retry')
  def test_rollouts_in_flight_resume_exactly(self, in_flight):
    # rollout.in_flight='keep': the groups in flight at step 2's end are in
    # its checkpoint (with the sampler's held examples); 'retry': the
    # examples the next step admits first are (the sampler holds them). So
    # 2 steps, a resume and 2 more are the 4 steps of a run that never
    # stopped: same metrics, same params.
    keep = {'rollout.engine': 'continuous', 'rollout.slots': 8,
            'rollout.group_size': 4, 'rollout.collect': 'streaming',
            'rollout.in_flight': in_flight, 'rollout.max_staleness': 2,
            # Completions long enough to span decode chunks.
            'rollout.max_new_tokens': 16, 'rollout.max_rounds': 4}
    params = {}

    def last_params(workdir):
      def on_step(info):
        params[workdir] = jax.tree.map(np.asarray,
                                       jax.device_get(info.state.params))
      return on_step

    stopped = self.create_tempdir().full_path
    train.run(_config(**keep), stopped, log=lambda _: None)
    summary = train.run(_config(total_steps=4, **keep), stopped,
                        log=lambda _: None, on_step=last_params(stopped))
    self.assertEqual(summary.resumed_from, 2)
    straight = self.create_tempdir().full_path
    train.run(_config(total_steps=4, **keep), straight, log=lambda _: None,
              on_step=last_params(straight))
    runs = [[{k: v for k, v in r.items() if not k.startswith(
        ('perf/', 'time/'))} for r in metrics_lib.read_metrics(w)]
            for w in (stopped, straight)]
    self.assertEqual([r['step'] for r in runs[0]], [0, 1, 2, 3, 4])
    if in_flight == 'keep':
      self.assertGreater(runs[0][2]['rollout/partial_kept'], 0)
      self.assertEqual(runs[0][3]['rollout/partial_resumed'],
                       runs[0][2]['rollout/partial_kept'])
    else:
      self.assertGreater(runs[0][2]['rollout/groups_retried'], 0)
    self.assertEqual(runs[0], runs[1])
    jax.tree.map(np.testing.assert_array_equal, params[stopped],
                 params[straight])


class FullDiskTest(absltest.TestCase):

  def test_full_disk_ends_with_a_message(self):
    mount_point = self.create_tempdir().full_path
    # A 1 MiB filesystem: the workdir check and metrics fit, a checkpoint
    # does not. Mounting needs root; elsewhere the test cannot run.
    mounted = subprocess.run(
        ['mount', '-t', 'tmpfs', '-o', 'size=1M', 'tmpfs', mount_point],
        capture_output=True, text=True)
    if mounted.returncode != 0:
      self.skipTest('cannot mount a small tmpfs to fill (needs root): '
                    + mounted.stderr.strip())
    try:
      with self.assertRaisesRegex(
          errors.TrainingError,
          'checkpoint save to .* failed \\(No space left on device\\)'):
        train.run(_config(total_steps=2), os.path.join(mount_point, 'run'),
                  log=lambda _: None)
    finally:
      subprocess.run(['umount', mount_point], check=False)


def _poisoned_assemble(*args, **kwargs):
  """Batches whose advantages are NaN: every update is non-finite."""
  batch = _ASSEMBLE(*args, **kwargs)
  return batch.replace(advantages=np.full_like(batch.advantages, np.nan))


_ASSEMBLE = batch_lib.assemble


class NonFiniteTest(absltest.TestCase):

  def test_nan_streak_stops_with_last_good_checkpoint(self):
    workdir = self.create_tempdir().full_path
    with mock.patch.object(batch_lib, 'assemble', _poisoned_assemble):
      c = _config(total_steps=6)
      c.rl.max_nonfinite_steps = 2
      with self.assertRaisesRegex(errors.TrainingError,
                                  'NaN/inf .* in 2 steps in a row'):
        train.run(c, workdir, log=lambda _: None)
    records = metrics_lib.read_metrics(workdir)
    bad = [r for r in records if r.get('train/nonfinite')]
    self.assertLen(bad, 2)
    # The params never took a NaN step: a clean run resumes from the
    # checkpoint and trains on.
    summary = train.run(_config(total_steps=4), workdir, log=lambda _: None)
    self.assertIsNotNone(summary.resumed_from)
    final = metrics_lib.read_metrics(workdir)[-1]
    self.assertEqual(final['step'], 4)
    self.assertTrue(np.isfinite(final.get('train/loss', 0.0)))

  def test_each_skipped_update_is_told_and_summed(self):
    # A NaN step said nothing until rl.max_nonfinite_steps in a row stopped
    # the run, its loss left out of the line's mean, and the summary had
    # no row for it.
    c = _config(total_steps=2, **{'rl.max_nonfinite_steps': 5,
                                  'rollout.short_batch': 'train',
                                  'eval.every': 0, 'log_every': 1})
    lines = []
    with mock.patch.object(batch_lib, 'assemble', _poisoned_assemble):
      summary = train.run(c, self.create_tempdir().full_path,
                          log=lines.append)
    said = [l for l in lines if l.startswith('step') and 'NaN/inf' in l]
    self.assertEqual(said, [
        f'step {s}: NaN/inf loss or gradients: 1 of 1 updates skipped, the '
        f'params kept (train/nonfinite; {s} step(s) in a row, the run stops '
        'at rl.max_nonfinite_steps=5)' for s in (1, 2)])
    self.assertEqual(summary.nonfinite_updates, 2)
    self.assertRegex(summary_lib.format_summary(summary),
                     r'\nupdates skipped \(NaN/inf loss or gradients\) +2\n')

  def test_a_resume_goes_on_counting_the_streak(self):
    # Stopped after 1 NaN step of 2 allowed in a row, resumed: the run that
    # never stopped stops at step 2, and so does the resumed one (it began
    # counting again from 0 and trained on).
    c = _config(total_steps=1, **{'rl.max_nonfinite_steps': 2,
                                  'rollout.short_batch': 'train',
                                  'eval.every': 0})
    workdir = self.create_tempdir().full_path
    with mock.patch.object(batch_lib, 'assemble', _poisoned_assemble):
      train.run(c, workdir, log=lambda _: None)
      c.total_steps = 3
      with self.assertRaisesRegex(errors.TrainingError,
                                  'step 2: NaN/inf .* in 2 steps in a row'):
        train.run(c, workdir, log=lambda _: None)
    self.assertEqual([r['step'] for r in metrics_lib.read_metrics(workdir)
                      if r.get('train/nonfinite')], [1, 2])

  def test_steps_without_an_update_do_not_break_the_streak(self):
    # One round of 4 prompts a step for a batch of 8: steps without an
    # update (short_batch='wait') come between the updates, all NaN.
    c = _config(total_steps=8)
    c.rollout.batch_size, c.rollout.round_size = 8, 4
    c.rollout.max_rounds = 1
    c.rl.max_nonfinite_steps = 2
    workdir = self.create_tempdir().full_path
    with mock.patch.object(batch_lib, 'assemble', _poisoned_assemble):
      with self.assertRaisesRegex(errors.TrainingError,
                                  'step 5: NaN/inf .* in 2 steps in a row'):
        train.run(c, workdir, log=lambda _: None)
    records = metrics_lib.read_metrics(workdir)
    self.assertEqual([r['step'] for r in records
                      if r.get('train/skipped')], [1, 2, 4])


class PreemptionTest(absltest.TestCase):

  def test_sigterm_checkpoints_and_resumes(self):
    workdir = self.create_tempdir().full_path
    proc = self._start_the_command(workdir, save_every=1000,
                                   stderr=subprocess.STDOUT)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    self.assertEqual(proc.returncode, 0, out[-3000:])
    self.assertIn('SIGTERM received: saved the checkpoint of step', out)
    # Acknowledged when it arrives, also under --quiet.
    self.assertIn('SIGTERM received: stopping at the end of the current '
                  'step\n', out)
    # --quiet: what needs attention and the summary, no progress lines, no
    # library INFO logs (orbax logs every save).
    self.assertIn('run summary', out)
    self.assertNotIn('train step memory per device', out)
    self.assertNotRegex(out, r'(?m)^step \d+/400 ')
    self.assertNotRegex(out, r'(?m)^I\d{4} ')
    steps = [r['step'] for r in metrics_lib.read_metrics(workdir)]
    stopped = steps[-1]
    self.assertLess(stopped, 400)
    self.assertEqual(steps, list(range(stopped + 1)))
    # Resuming continues right after the step it stopped at.
    self._resume_as_the_command(workdir, stopped, more=2)

  def _start_the_command(self, workdir: str, save_every: int, stderr):
    """`jaxgrpo.main` on `configs/demo.py:runlocal` for 400 steps without
    a warm start, returned once it has written 4 steps' metrics."""
    args = [sys.executable, '-m', 'jaxgrpo.main',
            '--config=configs/demo.py:runlocal', f'--workdir={workdir}',
            '--config.total_steps=400', '--config.warmstart.enabled=False',
            f'--config.checkpoint.every={save_every}',
            '--config.eval.every=0', '--quiet']
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=stderr, text=True)
    path = os.path.join(workdir, 'metrics.jsonl')
    deadline = time.time() + 120
    while time.time() < deadline:
      if os.path.exists(path) and len(open(path).readlines()) >= 4:
        break
      time.sleep(0.2)
    return proc

  def _resume_as_the_command(self, workdir: str, stopped: int, more: int):
    """Resumes a run of `configs/demo.py:runlocal` stopped at `stopped` for
    `more` steps, with the settings the command line ran (a resume refuses
    others), and checks that no step is missing or repeated."""
    c = _config(total_steps=stopped + more, **{'eval.every': 0})
    c.data.datasets[0]['verifier'] = 'exact_match'
    c.rollout.group_size = 4
    summary = train.run(c, workdir, log=lambda _: None)
    self.assertEqual(summary.resumed_from, stopped)
    steps = [r['step'] for r in metrics_lib.read_metrics(workdir)]
    self.assertEqual(steps, list(range(stopped + more + 1)))

  def test_a_second_ctrl_c_quits_once_the_save_is_complete(self):
    workdir = self.create_tempdir().full_path
    proc = self._start_the_command(workdir, save_every=1,
                                   stderr=subprocess.PIPE)
    # Two Ctrl-Cs as a save is under way (one each step).
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    self.assertEqual(proc.returncode, 130, out[-2000:] + err[-2000:])
    self.assertIn(
        'SIGINT received: stopping at the end of the current step (Ctrl-C '
        'again: quit without saving it, once a checkpoint being written is '
        'complete; a third time: at once)\n', out)
    self.assertIn(preemption.AGAIN + '\n', out)
    last = re.fullmatch(
        r'jaxgrpo-train: error: interrupted; run the same command to resume '
        r'from step (\d+), the last complete checkpoint\n', err)
    self.assertIsNotNone(last, err[-2000:])
    # The save under way completed: no temporary folder, the step named.
    folder = os.path.join(workdir, 'checkpoints')
    self.assertEqual([name for name in os.listdir(folder)
                      if not name.isdigit()], [])
    stopped = int(last.group(1))
    self.assertEqual(max(checkpoint_lib.saved_steps(folder)), stopped)
    self._resume_as_the_command(workdir, stopped, more=1)

  def test_a_second_ctrl_c_does_not_wait_for_the_device(self):
    # The main thread waits for a computation that takes minutes (as a
    # large model's step does): Python's handlers run only once it ends, and
    # a second Ctrl-C waited for it.
    workdir = self.create_tempdir().full_path
    proc = subprocess.Popen(
        [sys.executable, '-m', 'tests.interrupt_worker', workdir], cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
      lines.append(line)
      if line == 'busy\n':
        break
    time.sleep(0.5)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = interrupt_worker.output_within(proc, 60)
    waited = time.monotonic() - sent
    self.assertEqual(proc.returncode, 130, ''.join(lines)[-2000:] + out)
    self.assertLess(waited, 30)
    # Step 1's save, started before on_step, completed; step 2 never ran.
    self.assertEqual(out.splitlines()[-2:], [preemption.AGAIN, 'quit: [0, 1]'])
    self.assertEqual(sorted(os.listdir(os.path.join(workdir, 'checkpoints'))),
                     ['0', '1'])

  def test_a_third_ctrl_c_quits_at_once(self):
    # `quit` waits (a save that takes minutes): a third Ctrl-C ends it.
    script = (
        'import time\n'
        'from jaxgrpo import preemption\n'
        'def quit():\n'
        '  print("quit waits", flush=True)\n'
        '  time.sleep(600)\n'
        'with preemption.StopRequest(lambda line: print(line, flush=True),\n'
        '                            on_quit=quit):\n'
        '  print("ready", flush=True)\n'
        '  time.sleep(600)\n')
    proc = subprocess.Popen([sys.executable, '-c', script], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines = [proc.stdout.readline()]
    for _ in range(2):
      proc.send_signal(signal.SIGINT)
      lines.append(proc.stdout.readline())
    lines.append(proc.stdout.readline())  # quit waits
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    self.assertEqual(proc.returncode, 130)
    self.assertEqual(''.join(lines) + out, (
        'ready\n'
        'SIGINT received: stopping at the end of the current step (Ctrl-C '
        'again: quit without saving it, once a checkpoint being written is '
        'complete; a third time: at once)\n'
        f'{preemption.AGAIN}\nquit waits\n{preemption.THIRD}\n'))
    # In this process: the wakeup fd it set is taken back with the handlers.
    with preemption.StopRequest(lambda _: None, on_quit=lambda: None):
      self.assertNotEqual(signal.set_wakeup_fd(-1), -1)
    self.assertEqual(signal.set_wakeup_fd(-1), -1)


class EarlyStopTest(absltest.TestCase):
  """A stop signal before the GRPO steps: a clean stop, never a crash."""

  def _run(self, config, workdir, when: str):
    """Runs `config`, sending this process SIGTERM at the first log line
    that starts with `when`; returns the lines."""
    lines = []

    def log(line):
      lines.append(line)
      if line.startswith(when) and len(
          [x for x in lines if x.startswith(when)]) == 1:
        os.kill(os.getpid(), signal.SIGTERM)

    return lines, lambda: train.run(config, workdir, log=log)

  def test_in_the_warm_start_nothing_is_saved(self):
    c = _config()
    c.warmstart.update(enabled=True, max_steps=20, check_every=10)
    workdir = self.create_tempdir().full_path
    lines, run = self._run(c, workdir, 'warm start:')
    with self.assertRaisesRegex(
        preemption.Stopped, r'^SIGTERM received in the warm start \(step 1; '
        r'a warm start is not saved, and starts again\): stopped before '
        'anything new was saved; run the same command to go on'):
      run()
    self.assertEqual(os.listdir(os.path.join(workdir, 'checkpoints')), [])
    self.assertNotIn('step 0: held-out accuracy', ' '.join(lines))

  def test_in_the_first_evaluation_step_0_is_saved(self):
    workdir = self.create_tempdir().full_path
    lines, run = self._run(_config(), workdir, 'step 0: held-out accuracy')
    summary = run()
    self.assertEqual((summary.steps, summary.stopped_by), (0, 'SIGTERM'))
    self.assertIn('SIGTERM received: stopped at step 0, whose checkpoint is '
                  'saved; run the same command to resume', lines)
    self.assertEqual(os.listdir(os.path.join(workdir, 'checkpoints')), ['0'])
    # The stop handlers are gone with the run: SIGTERM is the default again.
    self.assertEqual(signal.getsignal(signal.SIGTERM), signal.SIG_DFL)
    # Resumed past the last step asked for: nothing to train, and it says so.
    lines = []
    train.run(_config(total_steps=0), workdir, log=lines.append)
    self.assertIn('the checkpoint is at step 0 and total_steps=0: nothing is '
                  'left to train (a larger --config.total_steps trains on)',
                  lines)

  def test_a_signal_in_on_step_saves_that_step(self):
    # A notebook's interrupt button (SIGINT) while the on_step callback
    # runs, after the step's save was due or not: step 1 was not saved.
    workdir = self.create_tempdir().full_path

    def interrupt(info):
      if info.step == 1:
        os.kill(os.getpid(), signal.SIGINT)

    lines = []
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN in a background job
    summary = train.run(_config(total_steps=3, **{'eval.every': 0}), workdir,
                        log=lines.append, on_step=interrupt)
    self.assertEqual((summary.steps, summary.stopped_by), (1, 'SIGINT'))
    # Acknowledged as it arrives, before the step ends and is saved.
    ack = ('SIGINT received: stopping at the end of the current step (a '
           'second Ctrl-C stops at once, without saving it)')
    self.assertIn(ack, lines)
    self.assertLess(lines.index(ack), [
        i for i, line in enumerate(lines)
        if line.startswith('SIGINT received: saved')][0])
    self.assertIn('SIGINT received: saved the checkpoint of step 1 in '
                  f'{workdir}/checkpoints and stopped; run the same command '
                  'to resume', lines)
    self.assertEqual(sorted(os.listdir(os.path.join(workdir, 'checkpoints'))),
                     ['0', '1'])
    self.assertIs(signal.getsignal(signal.SIGINT), before)  # restored

  def test_an_acknowledgement_that_cannot_be_shown_goes_to_stderr(self):
    # The handler interrupted a write to the run's stream (print raises
    # "reentrant call"): the line goes to file descriptor 2, nothing raises.
    def reentrant(line):
      raise RuntimeError(f'reentrant call ({line})')

    with tempfile.TemporaryFile() as f:
      saved = os.dup(2)
      os.dup2(f.fileno(), 2)
      try:
        with preemption.StopRequest(reentrant) as stop:
          os.kill(os.getpid(), signal.SIGTERM)
          time.sleep(0.01)  # the handler runs at the next bytecode
      finally:
        os.dup2(saved, 2)
        os.close(saved)
      f.seek(0)
      self.assertEqual(f.read().decode(),
                       'SIGTERM received: stopping at the end of the current '
                       'step\n')
    self.assertEqual(stop.signal, 'SIGTERM')

  def test_on_step_stops_the_run_saved_and_its_changes_stay_its_own(self):
    # A notebook's early stop: info.stop() saves the step and returns the
    # summary (raising lost the step unless a save was due). A value it
    # returns is noticed once (`return True` stopped nothing, unseen). The
    # metrics it gets are its own: one it changed was read by the NaN check.
    workdir = self.create_tempdir().full_path
    seen = []

    def on_step(info):
      seen.append(info.step)
      info.metrics['train/nonfinite'] = 1.0
      if info.step == 2:
        info.stop()
      return True

    lines = []
    summary = train.run(
        _config(total_steps=4, **{'eval.every': 0,
                                  'rl.max_nonfinite_steps': 1}),
        workdir, log=lines.append, on_step=on_step)
    self.assertEqual((summary.steps, summary.stopped_by), (2, 'on_step'))
    self.assertEqual(seen, [1, 2])
    self.assertIn('on_step asked to stop: saved the checkpoint of step 2 in '
                  f'{workdir}/checkpoints and stopped; run the same command '
                  'to resume', lines)
    self.assertEqual([line for line in lines if 'on_step returned' in line],
                     ['on_step returned True at step 1: not used (call '
                      'info.stop() to stop the run after the step, saved)'])
    self.assertEqual(sorted(os.listdir(os.path.join(workdir, 'checkpoints'))),
                     ['0', '2'])
    records = metrics_lib.read_metrics(workdir)
    self.assertEqual([r['step'] for r in records], [0, 1, 2])
    self.assertEqual([r.get('train/nonfinite', 0) for r in records], [0] * 3)

  def test_a_stop_at_the_last_step_is_a_finished_run(self):
    # A callback that stops "once good enough" and is asked at the last
    # step: every step ran, but the run said `stopped_by='on_step'` and
    # `run the same command to resume`, which had nothing left to train.
    workdir = self.create_tempdir().full_path
    lines = []
    summary = train.run(_config(total_steps=2, **{'eval.every': 0}), workdir,
                        log=lines.append, on_step=lambda info: info.stop())
    self.assertEqual((summary.steps, summary.stopped_by), (1, 'on_step'))
    lines = []
    summary = train.run(_config(total_steps=2, **{'eval.every': 0}), workdir,
                        log=lines.append, on_step=lambda info: info.stop())
    self.assertEqual((summary.steps, summary.stopped_by), (2, None))
    self.assertEqual([line for line in lines if 'asked to stop' in line
                      or 'stopped by' in line], [])
    self.assertIn('2', os.listdir(os.path.join(workdir, 'checkpoints')))

  def test_a_signal_at_the_last_step_is_a_finished_run(self):
    # SIGTERM while the last step runs (after its log line, before its
    # save): the run is complete, with its last checkpoint and evaluation;
    # it said `(stopped by SIGTERM)` and `run the same command to resume`,
    # and a sweep (scripts/reproduce.py) took it for unfinished.
    workdir = self.create_tempdir().full_path
    lines, run = self._run(_config(total_steps=1, **{'eval.every': 1}),
                           workdir, 'step 1/1')
    summary = run()
    self.assertEqual((summary.steps, summary.stopped_by,
                      summary.eval_step_end), (1, None, 1))
    self.assertIn('SIGTERM received at the last step (1): the run is '
                  'complete, its last checkpoint saved; nothing is left to '
                  'resume', lines)
    self.assertEqual([line for line in lines if 'same command' in line
                      or 'stopped by' in line], [])
    self.assertEqual(sorted(os.listdir(os.path.join(workdir, 'checkpoints'))),
                     ['0', '1'])
    # One after the last step (here as the summary shows): acknowledged as
    # such, not as a stop at the end of a step.
    workdir = self.create_tempdir().full_path
    lines, run = self._run(_config(total_steps=1, **{'eval.every': 0}),
                           workdir, 'run summary')
    self.assertIsNone(run().stopped_by)
    self.assertEqual(lines[-1], 'SIGTERM received after the last step: the '
                     'run is complete, finishing its last checkpoint and '
                     'summary')

  def test_an_error_waits_for_the_save_in_progress(self):
    workdir = self.create_tempdir().full_path

    def fail(info):
      if info.step == 1:  # its checkpoint was just started (asynchronously)
        raise RuntimeError('stop here')

    kept = None
    try:
      train.run(_config(total_steps=2, **{'checkpoint.every': 1,
                                          'eval.every': 0}),
                workdir, log=lambda _: None, on_step=fail)
    except RuntimeError as e:
      kept = e  # as a notebook keeps it: its traceback holds the run's frames
    self.assertEqual(str(kept), 'stop here')
    self.assertEqual(sorted(os.listdir(os.path.join(workdir, 'checkpoints'))),
                     ['0', '1'])
    # metrics.jsonl and the TensorBoard events were left open.
    self.assertEqual(_open_files_under(workdir), [])

  def test_the_command_line_exits_0_with_the_line(self):
    out = io.StringIO()
    with mock.patch.object(train, 'run', side_effect=preemption.Stopped(
        'SIGTERM received ...')), contextlib.redirect_stdout(out):
      code = cli_train.main(['--config=configs/demo.py:runlocal',
                             f'--workdir={self.create_tempdir().full_path}'])
    self.assertEqual((code, out.getvalue()), (0, 'SIGTERM received ...\n'))


class KillTest(absltest.TestCase):
  """A reduced run of scripts/fault_injection.py (the full one kills 20x)."""

  def test_a_kill_and_a_stop_signal_at_random_moments_resume_exactly(self):
    # SIGKILL, then Ctrl-C (to the trainer alone: in a step, in a save, or
    # at the last step), the latest checkpoint damaged after the second.
    out = subprocess.run(
        [sys.executable, 'scripts/fault_injection.py', '--kills', '2',
         '--steps', '12', '--seed', '1', '--signal', 'SIGKILL,SIGINT'],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    self.assertEqual(out.returncode, 0, out.stdout[-3000:] + out.stderr[-3000:])
    self.assertIn('"signal": "SIGKILL,SIGINT"', out.stdout)
    self.assertIn('"tmp_folders_left": []', out.stdout)
    # The Ctrl-C counts as a kill unless it came at the last step.
    self.assertRegex(out.stdout, r'([12]) of \1 kills left a restorable '
                     'checkpoint')
    self.assertIn('matches the uninterrupted one exactly', out.stdout)
    updated = re.search(r'(\d+) of 12 reference steps updated', out.stdout)
    self.assertGreater(int(updated.group(1)), 0, out.stdout[-3000:])


if __name__ == '__main__':
  absltest.main()
