"""The command line end to end: a real checkpoint, generator and verifier."""

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from unittest import mock

from absl.testing import absltest
import jax
import numpy as np

from jaxgrpo import checkpoint as checkpoint_lib
from jaxgrpo.cli import stratify as stratify_cli
from jaxgrpo.model import decoder
from jaxgrpo.stratify import passrates
from tests.stratify import fixtures

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CONFIG = os.path.join(REPO, 'configs', 'demo.py') + ':runlocal'


def _main(*argv):
  """(exit code, stdout, stderr) of stratify_cli.main(argv)."""
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = stratify_cli.main(list(argv))
  return code, out.getvalue(), err.getvalue()


class CommandLineTest(absltest.TestCase):

  def test_run_resume_and_report(self):
    workdir = fixtures.run_workdir()
    out = self.create_tempdir().full_path
    args = ('run', f'--config={CONFIG}',
            f'--checkpoint={workdir}@0', '--checkpoint=init', f'--out={out}',
            '--k=3', '--limit=6', '--chunk=4', '--batch=4',
            '--config.verify.workers=0', '--config.rollout.temperature=0.5',
            '--quiet')
    code, stdout, stderr = _main(*args)
    self.assertEqual(code, 0, stderr)
    self.assertIn('stratify: 12 examples sampled, 0 resumed', stdout)
    rates = passrates.read(out)
    self.assertEqual(list(rates), ['arithmetic'])
    self.assertLen(rates['arithmetic'].ids, 6)
    np.testing.assert_array_equal(rates['arithmetic'].trials, [6] * 6)
    with open(os.path.join(out, passrates.SUMMARY)) as f:
      summary = json.load(f)
    tag = f'{os.path.basename(workdir)}-step0'
    self.assertEqual(sorted(summary['checkpoints']), sorted([tag, 'init']))
    self.assertEqual(summary['checkpoints'][tag]['spec'], f'{workdir}@0')
    self.assertEqual(summary['checkpoints'][tag]['k'], 3)
    self.assertEqual(
        summary['checkpoints'][tag]['sampling']['temperature'], 0.5)
    # exact_match never fails: each tag's 6 x 3 calls, none failed.
    clean = {'errors': 0, 'timeouts': 0, 'printed': 0, 'workers_replaced': 0,
             'calls': 18, 'partly_failed': 0, 'all_failed': []}
    self.assertEqual(summary['datasets']['arithmetic'],
                     {'examples': 6, 'done': {tag: 6, 'init': 6},
                      'verify': {tag: clean, 'init': clean}})
    self.assertNotIn('verifier', stdout)
    # The same command again finds everything done.
    code, stdout, stderr = _main(*args)
    self.assertEqual(code, 0, stderr)
    self.assertIn('0 examples sampled, 12 resumed', stdout)

    code, stdout, stderr = _main('report', f'--out={out}', '--bands=0.5',
                                 f'--checkpoint={tag}')
    self.assertEqual(code, 0, stderr)
    self.assertIn('0.5-1', stdout)
    with open(os.path.join(out, 'strata.json')) as f:
      self.assertEqual(json.load(f)['checkpoints'], [tag])
    self.assertTrue(os.path.exists(os.path.join(out, 'pass_rates.png')))

  def test_verifier_failures_are_printed_and_written(self):
    # They were scored 0 with a warning logged once: arithmetic/0 and
    # arithmetic/8 were filed at pass rate 0, as hard, for want of a verifier.
    out = self.create_tempdir().full_path
    with mock.patch.object(decoder, 'init_params', fixtures.fast_init_params):
      code, stdout, stderr = _main(
          'run', f'--config={CONFIG}', '--checkpoint=init', f'--out={out}',
          '--k=2', '--limit=10', '--chunk=4', '--batch=4',
          '--config.data.datasets[0].verifier=fails_by_id',
          "--config.verify.imports=('tests.flaky_verifiers',)",
          '--config.verify.workers=0', '--config.verify.timeout_s=0.2',
          '--quiet')
    self.assertEqual(code, 0, stderr)
    # fails_by_id raises on arithmetic/8, times out on arithmetic/0.
    self.assertIn('stratify: verifier errors 2, timeouts 2 of 20 calls '
                  '(scored 0), calls that printed 0, workers replaced 0\n',
                  stdout)
    self.assertIn(
        'stratify: 2 examples had every verifier call fail, so their pass '
        'rate of 0 would measure the verifier, not the model: they get no '
        'pass rate from it (jaxgrpo-stratify report and curriculum.strata '
        'leave them unrated, not too_hard): arithmetic/0 (init, arithmetic), '
        'arithmetic/8 '
        f'(init, arithmetic) (all of them in {out}/summary.json: ', stdout)
    with open(os.path.join(out, passrates.SUMMARY)) as f:
      verify = json.load(f)['datasets']['arithmetic']['verify']
    self.assertEqual(verify, {'init': {
        'errors': 2, 'timeouts': 2, 'printed': 0, 'workers_replaced': 0,
        'calls': 20, 'partly_failed': 0,
        'all_failed': ['arithmetic/0', 'arithmetic/8']}})

  def test_other_weights_under_the_same_name_are_refused(self):
    # A workdir trained again resumed the parts of the model it held before
    # (`0 examples sampled, 2 resumed`), filed under the same tag.
    workdir = os.path.join(self.create_tempdir().full_path, 'run')
    shutil.copytree(fixtures.run_workdir(), workdir)  # shared: left as is
    out = self.create_tempdir().full_path
    args = ('run', f'--config={CONFIG}', f'--checkpoint={workdir}@3',
            f'--out={out}', '--k=1', '--limit=2', '--quiet',
            '--config.verify.workers=0')
    code, stdout, stderr = _main(*args)
    self.assertEqual(code, 0, stderr)
    self.assertIn('2 examples sampled', stdout)
    directory = os.path.join(workdir, 'checkpoints')
    shutil.rmtree(os.path.join(directory, '3'))
    ckpt = checkpoint_lib.Checkpointer(directory, every=1, max_to_keep=5)
    state = checkpoint_lib.load_state_arrays(directory, 0)
    data, meta = ckpt.restore_data(0), ckpt.read_meta(0)
    state['params'] = jax.tree.map(lambda x: x + 2, state['params'])
    ckpt.save(3, state, data, meta)
    ckpt.close()
    code, _, stderr = _main(*args)
    self.assertEqual(code, 1, stderr)
    self.assertIn('its parts were sampled from other weights under the name '
                  f"'{workdir}@3'", stderr)

  def test_a_home_relative_out_is_in_the_home_folder(self):
    # '--out=~/strata' (bash leaves a ~ after '=' alone) made ./~/strata,
    # then failed after sampling: pyarrow wrote to the home folder's.
    home = self.create_tempdir().full_path
    cwd = self.create_tempdir().full_path
    before = os.getcwd()
    os.chdir(cwd)
    try:
      with mock.patch.dict(os.environ, {'HOME': home}):
        code, _, stderr = _main(
            'run', f'--config={CONFIG}', '--checkpoint=init',
            '--out=~/strata', '--k=1', '--limit=2', '--quiet',
            '--config.verify.workers=0')
        self.assertEqual(code, 0, stderr)
        code, stdout, stderr = _main('report', '--out=~/strata',
                                     '--bands=0.5', '--no_plot')
        self.assertEqual(code, 0, stderr)
    finally:
      os.chdir(before)
    self.assertEqual(os.listdir(cwd), [])
    self.assertEqual(list(passrates.layout(os.path.join(home, 'strata'))),
                     ['arithmetic'])
    self.assertIn('0-0.5', stdout)

  def test_mistakes_end_with_one_line(self):
    missing = os.path.join(self.create_tempdir().full_path, 'nope')
    out = self.create_tempdir().full_path
    run = ('run', f'--config={CONFIG}', f'--out={out}')
    cases = (
        # A spec naming nothing is a mistake in the command line, as in
        # jaxgrpo-eval (it exited 1).
        ((*run, f'--checkpoint={missing}'), 2, 'does not exist'),
        ((*run, f'--checkpoint={missing}@3'), 2, 'not a run workdir'),
        ((*run, '--checkpoint=init', '--config.rollout.gruop_size=3'), 2,
         'gruop_size'),
        ((*run, '--checkpoint=init', '--datasets=nope'), 2,
         "--datasets: 'nope' is not"),
        ((*run, '--checkpoint=init', '--shard=3', '--num_shards=2'), 2,
         '--shard=3'),
        ((*run, '--checkpoint=init', '--bogus'), 2, 'unrecognized'),
        (run, 2, '--checkpoint'),
        (('report', f'--out={out}'), 1, 'no pass rates'),
        (('report', f'--out={out}', '--bands=0.5,0.2'), 2, '--bands'),
        (('frobnicate',), 2, 'invalid choice'),
    )
    for argv, want, pattern in cases:
      with self.subTest(argv=argv):
        code, _, stderr = _main(*argv)
        self.assertEqual(code, want, stderr)
        lines = [line for line in stderr.splitlines() if line.strip()]
        self.assertLen(lines, 1, stderr)
        self.assertStartsWith(lines[0], 'jaxgrpo-stratify: error: ')
        self.assertIn(pattern, lines[0])

  def test_python_dash_m(self):
    out = self.create_tempdir().full_path
    proc = subprocess.run(
        [sys.executable, '-m', 'jaxgrpo.stratify', 'report', f'--out={out}'],
        cwd=REPO, capture_output=True, text=True, timeout=60)
    self.assertEqual(proc.returncode, 1, proc.stderr)
    self.assertEqual(proc.stderr.strip().splitlines(),
                     [f'jaxgrpo-stratify: error: {out}: no pass rates there '
                      '(no parts/<dataset>/<tag>/*.parquet files); write '
                      f'them with `jaxgrpo-stratify run --out={out}`'])


if __name__ == '__main__':
  absltest.main()
