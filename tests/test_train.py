"""End-to-end runs of the training loop and the command line (tiny sizes)."""

import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import io
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
from unittest import mock

from absl.testing import absltest
import jax
import pyarrow as pa
import pyarrow.parquet as pq

from jaxgrpo import build
from jaxgrpo import config_lib
from jaxgrpo import errors
from jaxgrpo import train
from jaxgrpo.cli import common
from jaxgrpo.cli import train as cli_train
from jaxgrpo.configs import demo
from jaxgrpo.configs import squad_qa
from jaxgrpo.data import loading
from jaxgrpo.data import mixture
from jaxgrpo.data import sources
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.generate import generator as generator_lib
from jaxgrpo.reporting import metrics as metrics_lib
from jaxgrpo.rl import advantages
from tests import flaky_verifiers  # noqa: F401  (registers starts_with_digit)
from tests import cli_in_process

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(**overrides):
  c = demo.get_config('runlocal')
  c.warmstart.enabled = False
  c.plots = False  # drawn at the end of runs in ConfigFilesTest
  c.data.datasets[0]['verifier'] = 'starts_with_digit'
  c.verify.imports = ('tests.flaky_verifiers',)
  c.rollout.group_size = 8
  for key, value in overrides.items():
    section, _, name = key.rpartition('.')
    (c[section] if section else c)[name] = value
  return c


class TrainTest(absltest.TestCase):

  def test_trains_writes_metrics_and_resumes(self):
    workdir = self.create_tempdir().full_path
    lines = []
    summary = train.run(_config(), workdir, log=lines.append)
    self.assertEqual(summary.steps, 2)
    step_lines = [line for line in lines if line.startswith('step 1/2')]
    self.assertLen(step_lines, 1, lines)
    self.assertRegex(step_lines[0], r'reward \d\.\d{3} .* eta \d+s$')
    self.assertTrue(any(line.startswith('run summary') for line in lines))
    records = metrics_lib.read_metrics(workdir)
    self.assertEqual([r['step'] for r in records], [0, 1, 2])
    trained = [r for r in records[1:] if 'train/loss' in r]
    self.assertNotEmpty(trained)  # at least one real update happened
    # Cut completions are trained on by default: no share masked.
    self.assertFalse([r for r in records if 'train/completions_masked' in r])
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
    # Quiet, with progress bars (on stderr): only what needs attention and
    # the summary reach the log.
    lines, stderr = [], io.StringIO()
    with mock.patch.object(sys, 'stderr', stderr):
      summary = train.run(_config(total_steps=4), workdir, log=lines.append,
                          progress=True, quiet=True)
    self.assertEqual(summary.resumed_from, 2)
    self.assertEqual(lines[0], f'resumed from {workdir} at step 2')
    self.assertStartsWith(lines[-1], 'run summary')
    self.assertFalse([line for line in lines if line.startswith('step 3/')])
    bars = stderr.getvalue()
    self.assertIn('GRPO', bars)
    self.assertRegex(bars, r'[34]/4 \[[\d:]+<[\d:]+, +[\d.]+(s/step|step/s)')
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

  def test_masked_cut_completions_log_their_share(self):
    # rl.cut_completions='mask' (DAPO's overlong filtering): each step that
    # has groups logs the share of its batch's completions cut at T and
    # masked; a step whose every completion was cut takes no update.
    workdir = self.create_tempdir().full_path
    c = _config(**{'rl.cut_completions': 'mask', 'total_steps': 3,
                   'rollout.max_new_tokens': 3, 'eval.every': 0})
    train.run(c, workdir, log=lambda _: None)
    records = metrics_lib.read_metrics(workdir)[1:]
    shares = [r['train/completions_masked'] for r in records
              if 'train/completions_masked' in r]
    self.assertNotEmpty(shares)
    self.assertTrue(any(0.0 < s < 1.0 for s in shares), shares)
    for r in records:
      share = r.get('train/completions_masked')
      if share == 1.0:
        self.assertEqual(r['train/skipped'], 1.0)
      elif share is not None:
        self.assertLess(abs(r['train/loss']), float('inf'), r)

  def test_continuous_engine_trains_and_repeats_itself(self):
    # The continuous engine's draws depend on the step's key and each
    # example's id: two runs of the same config write the same metrics.
    runs = []
    for _ in range(2):
      workdir = self.create_tempdir().full_path
      train.run(_config(**{'rollout.engine': 'continuous',
                           'rollout.slots': 8}), workdir,
                log=lambda _: None)
      runs.append([{k: v for k, v in r.items() if not k.startswith(
          ('perf/', 'time/'))} for r in metrics_lib.read_metrics(workdir)])
    self.assertEqual([r['step'] for r in runs[0]], [0, 1, 2])
    self.assertIn('train/loss', runs[0][1] | runs[0][2])
    self.assertEqual(runs[0], runs[1])

  def test_streaming_resumes_exactly(self):
    # Nothing is in flight between streaming steps: a run stopped after
    # step 2 and resumed is the run that never stopped, which in turn
    # repeats the first two steps of the stopped one.
    streaming = {'rollout.engine': 'continuous', 'rollout.slots': 8,
                 'rollout.group_size': 4, 'rollout.collect': 'streaming'}
    stopped = self.create_tempdir().full_path
    train.run(_config(**streaming), stopped, log=lambda _: None)
    train.run(_config(total_steps=4, **streaming), stopped,
              log=lambda _: None)
    straight = self.create_tempdir().full_path
    train.run(_config(total_steps=4, **streaming), straight,
              log=lambda _: None)
    runs = [[{k: v for k, v in r.items() if not k.startswith(
        ('perf/', 'time/'))} for r in metrics_lib.read_metrics(w)]
            for w in (stopped, straight)]
    self.assertEqual([r['step'] for r in runs[0]], [0, 1, 2, 3, 4])
    self.assertIn('rollout/slot_occupancy', runs[0][1])
    self.assertEqual(runs[0], runs[1])

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


class StartupTest(absltest.TestCase):

  def test_the_train_step_compiles_once(self):
    # The memory check before the first step compiles the train step; the
    # loop's first step reuses that executable (it compiled it again, as
    # the check's batch carried no placement: minutes on a pretrained model
    # on a CPU).
    workdir = self.create_tempdir().full_path
    c = _config(total_steps=1, **{'eval.every': 0,
                                  'rollout.short_batch': 'train'})
    with jax.log_compiles(True), self.assertLogs('jax', 'WARNING') as logs:
      train.run(c, workdir, log=lambda _: None)
    compiles = [r for r in logs.output if 'Compiling jit(step_fn)' in r]
    self.assertEqual(len(compiles), 1)
    self.assertLen(metrics_lib.read_metrics(workdir), 2)  # it did train


class CommandLineTest(absltest.TestCase):

  def test_quiet_logs_stack_nothing_and_come_off(self):
    # jaxgrpo-train's main run twice in one process (a notebook): its
    # filters and hook are not stacked, and `-v N` the second time shows
    # the records again.
    cli_train._quiet_logs(False)  # as in a new process (a test ran main)
    hook, absl = sys.unraisablehook, logging.getLogger('absl')
    try:
      for _ in range(3):
        cli_train._quiet_logs(True)
      self.assertEqual(absl.filters.count(cli_train._quiet_libraries), 1)
      self.assertIs(sys.unraisablehook.unquiet, hook)
      cli_train._quiet_logs(False)
      self.assertNotIn(cli_train._quiet_libraries, absl.filters)
      self.assertIs(sys.unraisablehook, hook)
    finally:
      cli_train._quiet_logs(False)

  def test_the_projects_warnings_read_as_the_command_says_them(self):
    # They were `WARNING:root:...` (logging's default format, on the root
    # logger); after the command they go back to the root as before.
    def body():
      logging.getLogger('jaxgrpo.data.screening').warning(
          'dataset %s: 1 of 5 records skipped as bad', 'q')
      return 0
    err = io.StringIO()
    with mock.patch.object(sys, 'stderr', err):
      self.assertEqual(common.run_main('jaxgrpo-train', body), 0)
    self.assertEqual(err.getvalue(), 'jaxgrpo-train: warning: dataset q: 1 of '
                     '5 records skipped as bad\n')
    with self.assertLogs(level='WARNING') as logs:
      logging.getLogger('jaxgrpo.data.screening').warning('after')
    self.assertEqual(logs.output, ['WARNING:jaxgrpo.data.screening:after'])

  def test_a_second_ctrl_c_names_the_checkpoint_a_rerun_resumes_from(self):
    # It said only `interrupted`, though the save it cut short may be gone.
    workdir = self.create_tempdir().full_path

    def line():
      err = io.StringIO()
      with mock.patch.object(train, 'run', side_effect=KeyboardInterrupt), \
          mock.patch.object(sys, 'stderr', err):
        try:
          self.assertEqual(cli_train.main([f'--workdir={workdir}']), 130)
        finally:
          cli_train._quiet_logs(False)
      return err.getvalue()

    self.assertEqual(line(), 'jaxgrpo-train: error: interrupted before a '
                     'checkpoint was complete; run the same command to start '
                     'again\n')
    train.run(_config(), workdir, log=lambda _: None)  # saves steps 0 and 2
    os.mkdir(os.path.join(workdir, 'checkpoints', '3.orbax-checkpoint-tmp'))
    self.assertEqual(line(), 'jaxgrpo-train: error: interrupted; run the same '
                     'command to resume from step 2, the last complete '
                     'checkpoint\n')
    err = io.StringIO()  # the other commands' interrupts keep their line
    with mock.patch.object(sys, 'stderr', err):
      self.assertEqual(common.run_main('p', mock.Mock(
          side_effect=KeyboardInterrupt), interrupted='stopped'), 130)
    self.assertEqual(err.getvalue(), 'p: error: stopped\n')

  def test_an_interrupted_command_skips_the_teardown(self):
    # XLA's threads, stopped mid-computation, could crash the interpreter's
    # teardown after Ctrl-C: jaxgrpo-eval exited -11 in 2 of 10 interrupts.
    script = ('import atexit, sys; from jaxgrpo.cli import common; '
              "atexit.register(print, 'teardown'); print('line', end=''); "
              'common.exit_with(int(sys.argv[1]))')
    for code, out in ((130, 'line'), (2, 'lineteardown\n')):
      done = subprocess.run([sys.executable, '-c', script, str(code)],
                            cwd=REPO, capture_output=True, text=True,
                            timeout=60)
      self.assertEqual((done.returncode, done.stdout), (code, out))
    # Every command's entry point ends through it.
    with open(os.path.join(REPO, 'pyproject.toml')) as f:
      scripts = re.findall(r'^jaxgrpo-\w+ = "([\w.]+):(\w+)"$', f.read(),
                           re.MULTILINE)
    self.assertLen(scripts, 5)
    for module, name in scripts:
      self.assertEqual(name, 'run_cli', module)
      self.assertIn('exit_with', inspect.getsource(
          getattr(importlib.import_module(module), name)))

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
    for i, (flag, key) in enumerate(cases.items()):
      # The first as a real process; the others in this one.
      out = (self._run if i == 0 else cli_in_process.run)(
          '--config=configs/demo.py:runlocal', f'--workdir={workdir}', flag)
      self.assertEqual(out.returncode, 2, msg=(flag, out.stderr[-2000:]))
      lines = [l for l in out.stderr.splitlines() if l.strip()]
      self.assertLen(lines, 1, msg=(flag, out.stderr[-2000:]))
      self.assertIn(key, lines[0])
      self.assertNotIn('Traceback', out.stderr)
    # Nothing was trained or written.
    self.assertFalse(os.path.exists(os.path.join(workdir, 'metrics.jsonl')))

  def test_a_config_file_loaded_after_another_is_read_alone(self):
    # config_flags ran each file over the module of the one loaded before
    # it in the process (a notebook, a script, these tests): a file with
    # no get_config() then returned the earlier file's config.
    folder = self.create_tempdir().full_path
    path = os.path.join(folder, 'no_get.py')
    with open(path, 'w') as f:
      f.write('X = 1\n')
    common.load_config('jaxgrpo-train', 'configs/demo.py:runlocal', [])
    with self.assertRaisesRegex(common.UsageError,
                                'no_get.py defines no get_config()'):
      common.load_config('jaxgrpo-train', path, [])

  def test_missing_workdir(self):
    out = self._run('--config=configs/demo.py:runlocal')
    self.assertEqual(out.returncode, 2)
    self.assertIn('--workdir', out.stderr)

  def test_configs_folder_names_the_shipped_configs_from_anywhere(self):
    # An installed jaxgrpo, or a working directory other than the clone:
    # configs/NAME.py is the config inside the package.
    cwd = os.getcwd()
    os.chdir(self.create_tempdir().full_path)
    try:
      self.assertIsNone(common.shipped_config('configs/no_such.py'))
      self.assertIsNone(common.shipped_config('elsewhere/demo.py'))
      shipped = common.shipped_config('configs/demo.py')
      config = common.load_config('jaxgrpo-train', 'configs/demo.py:runlocal',
                                  ['--config.total_steps=3'])
    finally:
      os.chdir(cwd)
    self.assertEqual(shipped, os.path.join(REPO, 'jaxgrpo', 'configs',
                                           'demo.py'))
    self.assertEqual(config.total_steps, 3)
    # From the clone, configs/ is the same folder.
    self.assertEqual(os.path.realpath(os.path.join(REPO, 'configs')),
                     os.path.join(REPO, 'jaxgrpo', 'configs'))
    # '--config=~/mine.py' (bash leaves a ~ after '=' alone): is not a file.
    home = self.create_tempdir().full_path
    shutil.copy(shipped, os.path.join(home, 'mine.py'))
    with mock.patch.dict(os.environ, {'HOME': home}):
      config = common.load_config('jaxgrpo-train', '~/mine.py:runlocal',
                                  ['--config.total_steps=4'])
    self.assertEqual(config.total_steps, 4)

  def test_overrides_of_none_lists_and_dataset_entry_keys(self):
    # `=None` read as the string 'None' (a system turn saying "None") or
    # failed to parse ('could not convert string to float'); a dataset
    # entry's key that its dict leaves out was an "unknown config key";
    # data.datasets could not be given at all.
    load = lambda *overrides: config_lib.from_config_dict(common.load_config(
        'jaxgrpo-train', 'configs/qa_mixture.py:runlocal', list(overrides)))
    cfg = load('--config.model.system_prompt=Be brief.',
               '--config.model.system_prompt=None',
               '--config.mesh.memory_limit_gib', 'None',
               '--config.data.datasets[0].template=None',
               '--config.data.datasets[1].verifier=math',
               '--config.data.datasets[1].min_fraction=0.25',
               '--config.data.datasets[0].weight=2',
               '--config.data.datasets[0].snooze_factor=3')
    self.assertIsNone(cfg.model.system_prompt)
    self.assertIsNone(cfg.mesh.memory_limit_gib)
    first, second = cfg.data.datasets
    self.assertIsNone(first.template)
    self.assertEqual((first.weight, first.snooze_factor), (2.0, 3))
    self.assertEqual((second.verifier, second.min_fraction), ('math', 0.25))
    # A bool key takes the words a config argument takes (off was
    # "('Non-boolean argument to boolean flag', 'off')"), and a tuple of
    # names unquoted names (json,os was one module 'json,os').
    cfg = load('--config.plots=off', '--config.tensorboard', 'no',
               '--config.verify.imports=json,os',
               '--config.curriculum.checkpoints=(a, b)',
               '--config.verify.imports=sys')  # a list given twice: joined
    self.assertEqual((cfg.plots, cfg.tensorboard), (False, False))
    self.assertIs(common.load_config(
        'jaxgrpo-train', 'configs/demo.py:runlocal',
        ['--config.data.datasets[0].unanswerable=yes'],
    ).data.datasets[0]['unanswerable'], True)
    self.assertEqual(cfg.verify.imports, ('json', 'os', 'sys'))
    self.assertEqual(cfg.curriculum.checkpoints, ('a', 'b'))
    with self.assertRaisesRegex(
        common.UsageError, r'--config.plots=maybe: plots takes true or false'):
      load('--config.plots=maybe')
    # A key given twice takes its last value, whichever applies it (the
    # value ml_collections cannot apply came last, wherever it was given).
    for overrides, want in (
        (('--config.total_steps=1e0', '--config.total_steps=2'), 2),
        (('--config.total_steps=2', '--config.total_steps=1e0'), 1),
        (('--config.mesh.memory_limit_gib=None',
          '--config.mesh.memory_limit_gib=40'), 40),
        (('--config.mesh.memory_limit_gib=40',
          '--config.mesh.memory_limit_gib=None'), None)):
      cfg = load(*overrides)
      key = overrides[0].split('=')[0].rsplit('.', 1)[1]
      section = cfg if key == 'total_steps' else cfg.mesh
      self.assertEqual(getattr(section, key), want, overrides)
    cfg = load("--config.data.datasets=[{'name': 'a', 'kind': 'arithmetic'}]",
               "--config.data.datasets[0].verifier=['math', 'format']",
               '--config.data.datasets[0].num_train=50')
    (entry,) = cfg.data.datasets
    self.assertEqual((entry.name, entry.num_train, entry.verifier),
                     ('a', 50, ['math', 'format']))
    for overrides, message in (
        (['--config.data.datasets[2].weight=1'],
         r'datasets\[2\]\.weight=1: the config has 2 datasets'),
        (['--config.data.datasets[0].num_train=abc'],
         r"datasets\[0\]\.num_train='abc': must be an int, not str"),
        (['--config.data.datasets[0].wieght=1'],
         r'unknown config key data\.datasets\[0\]\.wieght'),
        (['--config.data.datasets=arithmetic'],
         'expected a list of dataset dicts'),
        # A negative index: 'unknown config key ...: weight'.
        (['--config.data.datasets[-1].weight=1'],
         r'datasets\[-1\]\.weight=1: the config has 2 datasets'),
        # ml_collections' 'Type <class dict> ... is not supported for
        # overriding', and its list of types.
        (["--config.data.datasets[0]={'weight': 2}"],
         r'^--config.data.datasets\[0\]: a dict cannot be given whole; set '
         r'its keys one by one'),
        # NaN and infinity read as numbers (it said 'not str').
        (['--config.data.datasets[0].weight=nan'],
         r'datasets\[0\]\.weight=nan: must be a finite number >= 0'),
        (['--config.data.datasets[0].weight=inf'],
         r'datasets\[0\]\.weight=inf: must be a finite number >= 0'),
    ):
      with self.subTest(overrides=overrides), self.assertRaisesRegex(
          (common.UsageError, config_lib.ConfigError), message):
        load(*overrides)

  def test_int_overrides_written_as_floats_and_config_dict_entries(self):
    # `--config.total_steps=1e3` (or 100.0) was refused: "invalid literal
    # for int() with base 10: '1e3'"; a dataset entry written as a
    # ConfigDict was refused ("must be a dict, got kind: arithmetic" over
    # two lines) and could not be overridden ("is no dict").
    path = os.path.join(self.create_tempdir().full_path, 'entries.py')
    with open(path, 'w', encoding='utf-8') as f:
      f.write('import ml_collections\n'
              'from jaxgrpo.configs import common\n'
              'def get_config():\n'
              '  c = common.base_config()\n'
              "  c.warmstart.batch_size = c.rollout.get_ref('batch_size') * 2\n"
              '  c.data.datasets = [ml_collections.ConfigDict(dict(\n'
              "      name='a', kind='arithmetic',\n"
              "      verifier=dict(name='math')))]\n"
              '  return c\n')
    cfg = config_lib.from_config_dict(common.load_config(
        'jaxgrpo-train', path,
        ['--config.total_steps=1e3', '--config.rollout.batch_size=32.0',
         '--config.seed', '-3', '--config.optim.learning_rate=1',
         '--config.data.datasets[0].num_eval=1e2',
         '--config.data.datasets[0].weight=2']))
    self.assertEqual((cfg.total_steps, cfg.rollout.batch_size,
                      cfg.warmstart.batch_size, cfg.seed),
                     (1000, 32, 64, -3))
    self.assertEqual(repr(cfg.optim.learning_rate), '1.0')
    (entry,) = cfg.data.datasets
    self.assertEqual((entry.num_eval, entry.weight, entry.verifier),
                     (100, 2.0, {'name': 'math'}))
    with self.assertRaisesRegex(common.UsageError,
                                r'total_steps=2\.5: invalid literal for int'):
      common.load_config('jaxgrpo-train', path, ['--config.total_steps=2.5'])

  def test_required_placeholders_are_set_from_the_command_line(self):
    # ml_collections locks the config it loads, which reads every
    # reference: a config file with a required placeholder never loaded,
    # with the override or without ('cannot load --config=...: None value
    # found in required reference', naming no key).
    path = os.path.join(self.create_tempdir().full_path, 'required.py')
    with open(path, 'w', encoding='utf-8') as f:
      f.write('from ml_collections import config_dict\n'
              'from jaxgrpo.configs import common\n'
              'def get_config():\n'
              '  c = common.base_config()\n'
              '  c.seed = config_dict.required_placeholder(int)\n'
              "  c.model.path = 'smollm2'\n"
              '  c.model.system_prompt = (\n'
              '      config_dict.required_placeholder(str))\n'
              '  return c\n')
    load = lambda *overrides: common.load_config('jaxgrpo-train', path,
                                                 list(overrides))
    config = load('--config.seed=3', '--config.total_steps=5',
                  '--config.model.system_prompt=Be brief.')
    cfg = config_lib.from_config_dict(config)
    self.assertEqual((cfg.seed, cfg.total_steps, cfg.model.system_prompt),
                     (3, 5, 'Be brief.'))
    with self.assertRaisesRegex(
        common.UsageError, r'required.py: model.system_prompt must be given '
        r'\(config_dict.required_placeholder\), e.g. '
        r'--config.model.system_prompt=VALUE$'):
      load('--config.seed=3')
    with self.assertRaisesRegex(common.UsageError,
                                'model.system_prompt, seed must be given'):
      load()

  def test_an_empty_path_is_refused_by_every_command(self):
    # `--out="$OUT"` with OUT unset: jaxgrpo-export exported into the
    # current folder (removing an earlier export's files there), and
    # `--workdir=` or `--checkpoint=` read the current folder.
    # pylint: disable-next=g-import-not-at-top
    from jaxgrpo.cli import evaluate, export, plot, stratify
    cwd = os.getcwd()
    os.chdir(self.create_tempdir().full_path)
    self.addCleanup(os.chdir, cwd)
    for main, argv, name in (
        (export.main, ['--workdir=/w', '--out='], '--out'),
        (export.main, ['--workdir= ', '--out=x'], '--workdir'),
        (evaluate.main, ['--config=configs/demo.py', '--checkpoint=a',
                         '--checkpoint='], '--checkpoint'),
        (evaluate.main, ['--config=configs/demo.py', '--checkpoint=a',
                         '--json='], '--json'),
        (stratify.main, ['run', '--config=configs/demo.py',
                         '--checkpoint=a', '--out='], '--out'),
        (stratify.main, ['report', '--out='], '--out'),
        (plot.main, [''], 'workdir'),
        (cli_train.main, ['--workdir=', '--config=configs/demo.py'],
         '--workdir'),
    ):
      err = io.StringIO()
      with self.subTest(argv=argv), contextlib.redirect_stderr(err):
        self.assertEqual(main(argv), 2)
        self.assertIn(f': error: argument {name}: the value is empty (an '
                      'unset shell variable?)', err.getvalue())
    self.assertEqual(os.listdir('.'), [])

  def test_config_mistakes_end_in_one_line_with_the_reason(self):
    workdir = self.create_tempdir().full_path
    folder = self.create_tempdir().full_path
    files = {'no_get.py': 'X = 1\n',
             'plain.py': 'def get_config():\n  return None\n',
             'typo.py': 'def get_config():\n  return undefined_name\n'}
    for name, text in files.items():
      with open(os.path.join(folder, name), 'w') as f:
        f.write(text)
    cases = {
        # A misspelled config argument: the reason, not just "Error whilst
        # parsing config file".
        '--config=configs/demo.py:runlocl': "'runlocl' is not one of",
        # A true/false argument takes nothing else (not False silently).
        '--config=configs/demo.py:runlocal=maybe': (
            "runlocal='maybe': runlocal takes true/1/yes/on/false/0/no/off"),
        '--config=configs/nope.py': 'configs/nope.py is not a file',
        '--config=configs/demo.py:runlocal --stray': 'unrecognized arguments',
        f'--config={folder}/no_get.py': 'no_get.py defines no get_config()',
        f'--config={folder}/plain.py': (
            'get_config() returned NoneType, not an ml_collections ConfigDict'),
        # The file and line of a mistake in it (it named neither).
        f'--config={folder}/typo.py': (
            f"name 'undefined_name' is not defined ({folder}/typo.py:2)"),
    }
    for i, (args, reason) in enumerate(cases.items()):
      # The first as a real process; the others in this one.
      out = (self._run if i == 0 else cli_in_process.run)(
          *args.split(), f'--workdir={workdir}')
      lines = [l for l in out.stderr.splitlines() if l.strip()]
      self.assertEqual(out.returncode, 2, msg=(args, out.stderr[-2000:]))
      self.assertLen(lines, 1, msg=(args, out.stderr[-2000:]))
      self.assertStartsWith(lines[0], 'jaxgrpo-train: error: ')
      self.assertIn(reason, lines[0])


class BadInputTest(absltest.TestCase):
  """Bad records and long prompts: named errors, or counted removals."""

  def _jsonl(self, lines: list[str]) -> str:
    path = os.path.join(self.create_tempdir().full_path, 'qa.jsonl')
    with open(path, 'w') as f:
      f.write('\n'.join(lines) + '\n')
    return path

  def _config(self, path, eval_path=None, **entry):
    c = _config()
    c.data.datasets = [dict(name='qa', kind='jsonl', path=path,
                            eval_path=eval_path, id_field='id', **entry)]
    return c

  def _load(self, c):
    cfg = config_lib.from_config_dict(c)
    return loading.load_dataset(cfg, cfg.data.datasets[0],
                                tokenizer_lib.CharTokenizer())

  def test_skip_and_drop_leave_out_count_and_report(self):
    record = '{{"id": "{}", "prompt": "{}", "answer": "1"}}'.format
    path = self._jsonl([
        record('a', '1+0='), '{"id": "b", "prompt": ', record('c', '0+1='),
        record('d', ' '), record('e', '1234+5678+9='), record('f', '1*1='),
    ])
    eval_path = self._jsonl([record('x', '123456789+1='), '[1]',
                             record('y', '1-0='), record('z', '2-1=')])
    c = self._config(path, eval_path, on_bad_record='skip', num_eval=1)
    c.rollout.long_prompts = 'drop'
    with self.assertLogs(level='WARNING') as logs:
      spec, ds, held_out = self._load(c)
    self.assertEqual([ds[i].id for i in range(len(ds))], ['a', 'c', 'f'])
    self.assertEqual((spec.skipped_records, spec.dropped_long), (2, 1))
    self.assertEqual([ex.id for ex in held_out], ['y'])
    self.assertLen(logs.output, 4)  # skipped and dropped, train and held-out
    self.assertIn(f'{path}:2: invalid JSON', logs.output[0])
    self.assertIn('e: prompt of 13 tokens (BOS included) > '
                  'rollout.max_prompt_len=12', logs.output[1])
    sampler = mixture.MixtureSampler([(spec, ds)], balance='pre_filter',
                                     batch_size=2, seed=0)
    metrics = sampler.metrics()
    self.assertEqual(metrics['data/skipped_records/qa'], 2)
    self.assertEqual(metrics['data/dropped_long/qa'], 1)
    drawn = {ex.id for ex in sampler.next_prompts(3)}
    self.assertEqual(drawn, {'a', 'c', 'f'})

  def test_a_dataset_without_held_out_examples_trains_unevaluated(self):
    # The default for a file: no eval_path, no holdout.
    path = self._jsonl([f'{{"id": "{i}", "prompt": "{i}+0=", "answer": '
                        f'"{i}"}}' for i in range(8)])
    workdir = self.create_tempdir().full_path
    lines = []
    summary = train.run(self._config(path), workdir, log=lines.append)
    self.assertIn("dataset 'qa' has no held-out examples (num_eval=0, or a "
                  'file without eval_path, eval_split or holdout): it is not '
                  'evaluated', lines)
    records = metrics_lib.read_metrics(workdir)
    self.assertEqual([r['step'] for r in records], [0, 1, 2])
    self.assertFalse([k for r in records for k in r if k.startswith('eval/')])
    self.assertIsNone(summary.eval_accuracy_end)
    # Every held-out prompt dropped as too long: the notice says so.
    long = self._jsonl(['{"id": "x", "prompt": "123456789+1=", "answer": "1"}'])
    c = self._config(path, long)
    c.rollout.long_prompts = 'drop'
    c.total_steps = 0
    lines = []
    train.run(c, self.create_tempdir().full_path, log=lines.append)
    self.assertIn("dataset 'qa' has no held-out examples (each was dropped "
                  'as too long or skipped as a bad record): it is not '
                  'evaluated', lines)

  def test_different_examples_sharing_an_id_stop_the_run(self):
    record = '{{"id": "{}", "prompt": "{}", "answer": "1"}}'.format
    path = self._jsonl([record('a', '1+0='), record('b', '0+1='),
                        record('a', '2+0=')])
    with self.assertRaisesRegex(
        errors.DataError, "^dataset 'qa': two different examples have the id "
        "'a' \\(prompts '1\\+0=' and '2\\+0='\\); ids must be unique"):
      train.run(self._config(path), self.create_tempdir().full_path,
                log=lambda _: None)
    # Past the examples read at the start, 'remap' (which reads every id)
    # finds them.
    c = self._config(path)
    c.checkpoint.on_dataset_change = 'remap'
    with mock.patch.object(loading, 'PEEK', 1), self.assertRaisesRegex(
        errors.DataError, "two different examples have the id 'a'"):
      train.run(c, self.create_tempdir().full_path, log=lambda _: None)
    # Equal examples may share one (exact duplicate records), GSM8K's with
    # other worked solutions too (augmented data: it stopped the run, and
    # id_field, the fix it named, is refused for kind='gsm8k').
    first = self._load(self._config(path))[1][0]
    loading.check_ids([first, dataclasses.replace(first)])
    solved = dataclasses.replace(first, meta={'solution': '1+0=1\n#### 1'})
    loading.check_ids([solved, dataclasses.replace(
        solved, meta={'solution': 'One plus zero.\n#### 1'})])
    with self.assertRaisesRegex(errors.DataError, 'two different examples'):
      loading.check_ids([solved, dataclasses.replace(solved, answer='2')])

  def test_an_eval_file_may_reuse_the_training_files_ids(self):
    # Index ids (no id_field), or verl's extra_info.index: both files count
    # from 0, so held-out ids repeat training ones for other prompts.
    record = '{{"id": "{}", "prompt": "{}+0=", "answer": "{}"}}'.format
    path = self._jsonl([record(i, i, i) for i in range(4)])
    eval_path = self._jsonl([record(i, i + 5, i + 5) for i in range(2)])
    for id_field in ('id', None):
      c = self._config(path, eval_path, num_eval=2)
      c.data.datasets[0]['id_field'] = id_field
      c.total_steps = 0
      workdir = self.create_tempdir().full_path
      lines = []
      train.run(c, workdir, log=lines.append)
      records = metrics_lib.read_metrics(workdir)
      self.assertIn('eval/accuracy/qa', records[0])
      self.assertFalse([l for l in lines if 'training prompts too' in l])

  def test_held_out_prompts_that_training_holds_are_noticed(self):
    # The training file as eval_path, or a second dataset on the same file.
    record = '{{"id": "{}", "prompt": "{}+0=", "answer": "{}"}}'.format
    path = self._jsonl([record(i, i, i) for i in range(4)])
    c = self._config(path, path, num_eval=3)
    c.total_steps = 0
    lines = []
    train.run(c, self.create_tempdir().full_path, log=lines.append)
    self.assertIn("dataset 'qa': 3 of its 3 held-out prompts are training "
                  "prompts too (e.g. 0, trained as 0 of dataset 'qa'): its "
                  'eval/accuracy counts them; give held-out records that '
                  'training does not hold', lines)
    c.data.datasets = [dict(name='a', kind='jsonl', path=path, holdout=1),
                       dict(name='b', kind='jsonl', path=path, holdout=2)]
    lines = []
    train.run(c, self.create_tempdir().full_path, log=lines.append)
    self.assertIn("dataset 'b': 1 of its 2 held-out prompts are training "
                  "prompts too (e.g. b/2, trained as a/2 of dataset 'a'): "
                  'its eval/accuracy counts them; give held-out records that '
                  'training does not hold', lines)

  def test_nothing_left_is_an_error(self):
    path = self._jsonl(['{"prompt": "", "answer": "1"}'])
    with self.assertRaisesRegex(errors.DataError,  # exit 2: the input's
                                "dataset 'qa': none of its 1 records"):
      self._load(self._config(path, on_bad_record='skip'))

  def test_bad_record_stops_the_run_naming_file_and_line(self):
    path = self._jsonl(['{"id": "a", "prompt": "1+0=", "answer": "1"}',
                        '{"id": "b", "prompt": "  ", "answer": "1"}'])
    with self.assertRaisesRegex(
        sources.BadRecordError,
        rf"^data\.datasets\[0\] \(dataset 'qa'\): {path}:2: field "
        r"'prompt'.* is empty"):
      train.run(self._config(path), self.create_tempdir().full_path,
                log=lambda _: None)

  def test_bad_records_name_their_config_entry(self):
    # One file read by two entries: the error says which entry failed.
    good = '{"id": "a", "prompt": "1+0=", "answer": "1", "q": "1+0="}'
    path = self._jsonl([good, '{"id": "b", "prompt": ', '[1]',
                        '{"id": "c", "answer": "1"}'])
    parquet = os.path.join(self.create_tempdir().full_path, 'qa.parquet')
    pq.write_table(pa.table({'prompt': ['1+0=', None], 'answer': ['1', '1']}),
                   parquet)
    cases = [  # (entry keys, index, message after the label)
        ({}, 1, f"data.datasets[1] (dataset 'qb'): {path}:2: invalid JSON"),
        ({}, 2, f"data.datasets[1] (dataset 'qb'): {path}:3: expected a JSON"),
        ({}, 3, f"data.datasets[1]: {path}:4: record has no field 'prompt' "
         "(dataset 'qb'; "),
        ({'template': '{q}'}, 3, f'data.datasets[1]: {path}:4: prompt '
         "template '{q}' names field 'q', which the record lacks (dataset "
         "'qb'; "),
        ({'kind': 'parquet', 'path': parquet, 'id_field': None}, 1,
         f"data.datasets[1] (dataset 'qb'): {parquet}:row 1: field 'prompt' "
         'must be text or a number, got NoneType'),
    ]
    for keys, index, message in cases:
      c = self._config(path)
      c.data.datasets = [c.data.datasets[0],
                         {**c.data.datasets[0], 'name': 'qb', **keys}]
      cfg = config_lib.from_config_dict(c)
      _, ds, _ = loading.load_dataset(cfg, cfg.data.datasets[1],
                                      tokenizer_lib.CharTokenizer())
      with self.assertRaises(sources.BadRecordError) as caught:
        ds[index]  # pylint: disable=pointless-statement
      self.assertStartsWith(str(caught.exception), message)
    # The held-out file's, and the log of skipped records, name it too.
    c = self._config(path)
    c.data.datasets = [c.data.datasets[0], {
        **c.data.datasets[0], 'name': 'qb', 'path': self._jsonl([good]),
        'eval_path': path}]
    cfg = config_lib.from_config_dict(c)
    with self.assertRaisesRegex(sources.BadRecordError,
                                r"^data\.datasets\[1\] \(dataset 'qb'\): "
                                f'{path}:2: invalid JSON'):
      loading.load_dataset(cfg, cfg.data.datasets[1],
                           tokenizer_lib.CharTokenizer())
    c.data.datasets[1]['on_bad_record'] = 'skip'
    cfg = config_lib.from_config_dict(c)
    with self.assertLogs(level='WARNING') as logs:
      loading.load_dataset(cfg, cfg.data.datasets[1],
                           tokenizer_lib.CharTokenizer())
    self.assertIn(f"skipped as bad: data.datasets[1] (dataset 'qb'): {path}:2:",
                  logs.output[0])

  def test_more_arithmetic_problems_than_the_digits_hold_name_the_key(self):
    # A raw ValueError traceback before.
    c = _config()
    c.data.datasets = [dict(name='one', kind='arithmetic', num_train=100,
                            num_eval=500, max_digits=1)]
    with self.assertRaisesRegex(
        config_lib.ConfigError,
        r"^data\.datasets\[0\]\.num_eval=500 \(dataset 'one'\): only \d+ "
        r'held-out problems differ from the 100 training problems'):
      self._load(c)

  def test_long_prompt_stops_the_run_naming_example_and_key(self):
    path = self._jsonl(['{"id": "a", "prompt": "1+0=", "answer": "1"}',
                        '{"id": "b", "prompt": "1234+5678+9=", "answer": "1"}'])
    with self.assertRaisesRegex(
        config_lib.ConfigError,
        r'^rollout.max_prompt_len=12: example b has a prompt of 13 tokens'
        '.*rollout.long_prompts'):
      train.run(self._config(path), self.create_tempdir().full_path,
                log=lambda _: None)

  def test_text_the_tokenizer_cannot_encode_names_the_fix(self):
    path = self._jsonl(['{"id": "a", "prompt": "Caf\u00e9?", "answer": "1"}'])
    c = self._config(path)
    c.rollout.max_prompt_len = 20
    _, ds, _ = self._load(c)
    # With --config.model.tokenizer=byte, jaxgrpo-eval reads a checkpoint
    # trained with 'char': its hint was the value already given.
    for name, hint in (
        ('auto', r"model.tokenizer='byte' encodes any text$"),
        ('byte', r"the checkpoint's own tokenizer is used, whatever "
         r"model.tokenizer says: evaluate a model trained with "
         r"model.tokenizer='byte'$")):
      c.model.tokenizer = name
      with self.assertRaisesRegex(
          config_lib.ConfigError, rf"^model.tokenizer='{name}': the prompt "
          rf"of example a \(dataset 'qa'\) cannot be encoded \(.*\); {hint}"):
        loading.check_lengths(config_lib.from_config_dict(c),
                              tokenizer_lib.CharTokenizer(), [ds[0]])

  def test_missing_strata_are_told_before_anything_compiles(self):
    # The run compiled its train step (minutes on a real model) first.
    empty = self.create_tempdir().full_path
    lines = []
    with self.assertRaisesRegex(config_lib.ConfigError,
                                rf"^curriculum.strata='{empty}': .*no pass "
                                'rates there'):
      train.run(_config(**{'curriculum.strata': empty}),
                self.create_tempdir().full_path, log=lines.append)
    self.assertFalse([l for l in lines if 'memory per device' in l], lines)

  def test_truncate_lets_long_prompts_through_the_checks(self):
    path = self._jsonl(['{"id": "b", "prompt": "1234+5678+9=", "answer": "1"}'])
    c = self._config(path)
    c.rollout.long_prompts = 'truncate'
    spec, ds, _ = self._load(c)
    self.assertEqual((len(ds), spec.dropped_long), (1, 0))
    short = dataclasses.replace(ds[0], id='a', prompt='1+1=')
    # The share cut is told (it was silent: GSM8K's questions under
    # gsm8k_mixture's 80 bytes lost their start, 7,459 of 7,473).
    with self.assertLogs('jaxgrpo', level='WARNING') as logs:
      loading.check_lengths(config_lib.from_config_dict(c),
                            tokenizer_lib.CharTokenizer(), [ds[0], short])
    self.assertEqual(logs.output, [
        'WARNING:jaxgrpo.data.loading:rollout.max_prompt_len=12: 1 of the 2 '
        'examples checked (50.0%) have longer prompts (up to 13 tokens), '
        "which rollout.long_prompts='truncate' cuts from the start"])


class ConfigFilesTest(absltest.TestCase):
  """Every config's runlocal variant trains 2 steps."""

  def test_qwen25_gsm8k_takes_the_folder_or_its_train_file(self):
    # qa_mixture.py's gsm8k= is the train file: given here, it was read
    # as a folder ('.../train.jsonl/train.jsonl': Not a directory).
    from jaxgrpo.configs import qwen25_gsm8k  # pylint: disable=g-import-not-at-top
    for given in ('/data/gsm8k', '/data/gsm8k/train.jsonl'):
      (entry,) = qwen25_gsm8k.get_config(f'path=/m,gsm8k={given}').data.datasets
      self.assertEqual((entry['path'], entry['eval_path']),
                       ('/data/gsm8k/train.jsonl', '/data/gsm8k/test.jsonl'))

  def test_runlocal_variants_train(self):
    from jaxgrpo.configs import mixture_demo  # pylint: disable=g-import-not-at-top
    for module in (demo, mixture_demo):
      workdir = self.create_tempdir().full_path
      lines = []
      summary = train.run(module.get_config('runlocal'), workdir,
                          log=lines.append)
      self.assertEqual(summary.steps, 2, module.__name__)
      records = metrics_lib.read_metrics(workdir)
      self.assertEqual([r['step'] for r in records], [0, 1, 2])
      # A smoke run reaches the update (mixture_demo's skipped both steps).
      self.assertLess(summary.skipped_updates, 2, module.__name__)
      self.assertTrue(any('run summary' in line for line in lines))
      if importlib.util.find_spec('matplotlib'):  # drawn at the end
        self.assertIn('reward.png', os.listdir(os.path.join(workdir, 'plots')))
        self.assertTrue(any(line.startswith('plots: ') for line in lines))

  def test_accelerator_templates_validate(self):
    from jaxgrpo.configs import qwen25_gsm8k  # pylint: disable=g-import-not-at-top
    from jaxgrpo.configs import smollm2_arith  # pylint: disable=g-import-not-at-top
    cfg = config_lib.from_config_dict(
        qwen25_gsm8k.get_config('path=/data/qwen,gsm8k=/data/gsm8k'))
    self.assertEqual(cfg.model.path, '/data/qwen')
    self.assertEqual(cfg.data.datasets[0].path, '/data/gsm8k/train.jsonl')
    # Real completion lengths: the measured-faster engine and collection.
    self.assertEqual((cfg.rollout.engine, cfg.rollout.collect),
                     ('continuous', 'streaming'))
    for arg in ('', 'full', 'runlocal'):
      cfg = config_lib.from_config_dict(smollm2_arith.get_config(arg))
      self.assertEqual(cfg.model.path, 'smollm2')

  def test_gsm8k_format_mixture_trains(self):
    from jaxgrpo.configs import gsm8k_mixture  # pylint: disable=g-import-not-at-top
    c = gsm8k_mixture.get_config('runlocal')
    c.warmstart.enabled = False  # its teacher forcing is tested elsewhere
    workdir = self.create_tempdir().full_path
    train.run(c, workdir, log=lambda _: None)
    records = metrics_lib.read_metrics(workdir)
    self.assertEqual([r['step'] for r in records], [0, 1, 2])
    for key in ('reward/mean/gsm8k', 'reward/mean/arithmetic',
                'rollout/prompts_generated/gsm8k', 'verify/errors',
                'verify/timeouts', 'perf/verify_s'):
      self.assertIn(key, records[1])
    self.assertGreater(records[1]['rollout/prompts_generated/gsm8k'], 0)
    self.assertIn('eval/accuracy/gsm8k', records[0])

  @absltest.skipUnless(os.path.exists(squad_qa.SQUAD2),
                       f'SQuAD 2.0 file not found: {squad_qa.SQUAD2}')
  def test_grounded_qa_reports_each_subset(self):
    c = squad_qa.get_config('runlocal')
    c.warmstart.enabled = False
    workdir = self.create_tempdir().full_path
    train.run(c, workdir, log=lambda _: None)
    records = metrics_lib.read_metrics(workdir)
    for subset in ('answerable', 'unanswerable'):
      self.assertIn(f'eval/accuracy/squad2/{subset}', records[0])
    drawn = [k for r in records[1:] for k in r
             if k.startswith('reward/mean/squad2/')]
    self.assertNotEmpty(drawn)


class VerifierFailuresTest(absltest.TestCase):

  def test_timeouts_and_errors_are_counted_and_training_goes_on(self):
    # Streaming with verify.workers=0 scored in a thread, where the timer
    # cannot run: a hanging verifier hung the run.
    for collect in ('rounds', 'streaming'):
      c = _config(total_steps=2, **{'verify.workers': 0,
                                    'rollout.collect': collect})
      if collect == 'streaming':
        c.rollout.engine, c.rollout.slots = 'continuous', 8
      c.data.datasets[0]['verifier'] = 'unreliable'
      c.verify.timeout_s = 0.2
      workdir = self.create_tempdir().full_path
      summary = train.run(c, workdir, log=lambda _: None)
      self.assertEqual(summary.steps, 2)
      records = metrics_lib.read_metrics(workdir)[1:]
      self.assertGreater(sum(r['verify/timeouts'] for r in records), 0,
                         collect)
      self.assertGreater(sum(r['verify/errors'] for r in records), 0)
      self.assertTrue(all(0 <= r['reward/mean'] <= 1 for r in records))

  def test_evaluations_count_their_verifier_failures(self):
    # Evaluation scored them 0 and its metrics did not say so: a verifier
    # failing on held-out examples only looked like a worse model.
    c = _config(total_steps=2)
    c.data.datasets[0]['verifier'] = 'fails_by_id'
    c.verify.timeout_s = 0.2
    workdir = self.create_tempdir().full_path
    lines = []
    with self.assertLogs(level='WARNING'):
      summary = train.run(c, workdir, log=lines.append)
    cfg = config_lib.from_config_dict(c)
    _, _, held_out = loading.load_dataset(cfg, cfg.data.datasets[0], None)
    ends = [ex.id[-1] for ex in held_out]  # one greedy completion each
    want = {'eval/verify/errors': float(ends.count('8')),
            'eval/verify/timeouts': float(ends.count('0')),
            'eval/verify/printed': 0.0, 'eval/verify/workers_replaced': 0.0}
    self.assertGreater(want['eval/verify/errors'], 0)
    self.assertGreater(want['eval/verify/timeouts'], 0)
    records = metrics_lib.read_metrics(workdir)
    evals = [r for r in records if 'eval/accuracy' in r]
    self.assertEqual([r['step'] for r in evals], [0, 2])
    for r in evals:
      self.assertEqual({k: v for k, v in r.items()
                        if k.startswith('eval/verify/')}, want)
    # The training steps' own counts stay apart.
    self.assertEqual(summary.verify_errors,
                     sum(r['verify/errors'] for r in records[1:]))
    self.assertEqual(
        (summary.eval_verify_errors, summary.eval_verify_timeouts),
        (2 * want['eval/verify/errors'], 2 * want['eval/verify/timeouts']))
    # The console showed the accuracy alone, as if the model scored it.
    failed = (f'(verifier errors {ends.count("8")}, timeouts '
              f'{ends.count("0")}: scored 0)')
    shown = [line for line in lines if line.startswith(('step 0:', 'step 2/2'))]
    self.assertLen(shown, 2, lines)
    self.assertRegex(shown[0], r'^step 0: held-out accuracy \d\.\d{3} '
                     + re.escape(failed) + '$')
    self.assertRegex(shown[1], r'  eval \d\.\d{3} ' + re.escape(failed) + '$')
    step_one = [line for line in lines if line.startswith('step 1/2')]
    self.assertNotIn('verifier', step_one[0])  # not evaluated

  def test_the_warm_starts_checks_count_their_verifier_failures(self):
    # They scored 0 and nothing said so: the summary showed the steps alone.
    c = _config(total_steps=0, **{'warmstart.enabled': True,
                                  'warmstart.max_steps': 2,
                                  'warmstart.check_every': 1,
                                  'warmstart.check_examples': 16,
                                  'verify.timeout_s': 0.2, 'eval.every': 0})
    c.data.datasets[0]['verifier'] = 'fails_by_id'
    workdir = self.create_tempdir().full_path
    lines = []
    with self.assertLogs(level='WARNING'):
      summary = train.run(c, workdir, log=lines.append)
    checks = [line for line in lines if line.startswith('warm start step')]
    self.assertLen(checks, 2, lines)
    errors = timeouts = 0
    for line in checks:
      found = re.search(r', verifier errors (\d+), timeouts (\d+) of (\d+) '
                        r'calls \(scored 0\)$', line)
      self.assertIsNotNone(found, line)
      errors += int(found[1])
      timeouts += int(found[2])
    self.assertGreater(errors + timeouts, 0)
    self.assertEqual((summary.warmstart_verify_errors,
                      summary.warmstart_verify_timeouts), (errors, timeouts))
    self.assertRegex(
        [line for line in lines if line.startswith('run summary')][0],
        r'warm start steps +2 \(its pass-rate checks: verifier errors / '
        rf'timeouts {errors} / {timeouts}, scored 0\)')

  def test_verifier_prints_are_counted_in_each_steps_metrics(self):
    # They reached one warning on stderr: metrics.jsonl never showed them.
    for collect in ('rounds', 'streaming'):
      c = _config(**{'verify.workers': 1, 'rollout.collect': collect})
      if collect == 'streaming':
        c.rollout.engine, c.rollout.slots = 'continuous', 8
      c.data.datasets[0]['verifier'] = 'prints_digit'
      workdir = self.create_tempdir().full_path
      summary = train.run(c, workdir, log=lambda _: None)
      records = metrics_lib.read_metrics(workdir)[1:]
      self.assertLen(records, 2)
      for r in records:  # every completion scored in the step printed
        self.assertEqual(r['verify/printed'],
                         r['rollout/prompts_generated'] * 8, collect)
        self.assertEqual(r['verify/workers_replaced'], 0)
      self.assertEqual(summary.verify_printed,
                       sum(r['verify/printed'] for r in records))

  @absltest.skipUnless(os.path.isdir('/proc/self/fd'), 'Linux only')
  def test_verifier_workers_replaced_are_counted_in_each_steps_metrics(self):
    # A verifier leaving files open cost a worker every 16 calls, which
    # only a warning (logged once) said.
    c = _config(**{'verify.workers': 1})
    c.data.datasets[0]['verifier'] = 'leaks_files'
    workdir = self.create_tempdir().full_path
    with self.assertLogs(level='WARNING'):
      summary = train.run(c, workdir, log=lambda _: None)
    records = metrics_lib.read_metrics(workdir)[1:]
    self.assertLen(records, 2)
    for r in records:  # a worker replaced after every 16 calls
      calls = int(r['rollout/prompts_generated']) * 8
      self.assertBetween(r['verify/workers_replaced'], calls // 16,
                         -(-calls // 16))
      self.assertGreaterEqual(r['verify/workers_replaced'], 1)
      self.assertEqual(r['verify/errors'], 0)
    self.assertEqual(summary.verify_workers_replaced,
                     sum(r['verify/workers_replaced'] for r in records))

  def test_a_verifier_is_checked_before_the_model_loads(self):
    # An unknown verifier name was found after a pretrained model loaded
    # (minutes for a large one).
    c = _config(**{'model.path': 'smollm2', 'model.tokenizer': 'auto'})
    c.data.datasets[0]['verifier'] = 'maths'
    with mock.patch.object(build, 'load_pretrained',
                           side_effect=AssertionError('the model loaded')):
      with self.assertRaisesRegex(errors.ConfigError,
                                  "^data.datasets\\[0\\].verifier='maths': "
                                  "unknown verifier 'maths'"):
        train.run(c, self.create_tempdir().full_path, log=lambda _: None)

  def test_an_estimator_of_the_wrong_shape_is_told_before_training(self):
    # A registered estimator returning [B] (or ints) failed at the first
    # informative step with numpy's reshape (or cast) error.
    name = 'test_train_group_mean'
    advantages.register_estimator(name)(lambda r, eps: r.mean(axis=1))
    self.addCleanup(advantages._ESTIMATORS.pop, name)  # pylint: disable=protected-access
    c = _config(**{'rl.advantage': name})
    with self.assertRaisesRegex(errors.ConfigError, (
        f"^rl.advantage='{name}': the estimator returned shape \\(4,\\) and "
        r'dtype float32; it must return the \[B, G\] = \(4, 8\) '
        'advantages as floats$')):
      train.run(c, self.create_tempdir().full_path, log=lambda _: None)

  def test_a_timeout_a_thread_cannot_keep_is_told(self):
    # Called from a thread with verify.workers=0, a verifier past
    # verify.timeout_s ran on, without a word.
    cfg = config_lib.from_config_dict(_config(**{'verify.workers': 0}))
    logs = []
    def build_it():
      with self.assertLogs('jaxgrpo', 'WARNING') as seen:
        build.build_scorer(cfg).close()
      logs.extend(seen.output)
    thread = threading.Thread(target=build_it)
    thread.start()
    thread.join()
    self.assertLen(logs, 1)
    self.assertIn('verify.timeout_s=10 is not enforced: with verify.workers=0'
                  ' the verifiers run in this thread', logs[0])
    with self.assertNoLogs('jaxgrpo', 'WARNING'):
      build.build_scorer(cfg).close()  # the main thread keeps it

  def test_verifier_config_errors_name_the_key(self):
    for value, pattern in (
        ('nope', r"data.datasets\[0\].verifier='nope': unknown verifier"),
        ({'name': 'math', 'fallback': 'x'},
         r'data.datasets\[0\].verifier: .*fallback'),
        ([{'name': 'math', 'weight': -1}],
         r'data.datasets\[0\].verifier\[0\].weight'),
    ):
      c = _config()
      c.data.datasets[0]['verifier'] = value
      with self.assertRaisesRegex(errors.ConfigError, pattern):
        train.run(c, self.create_tempdir().full_path, log=lambda _: None)
    c = _config()
    c.verify.imports = ('no_such_module_here',)
    with self.assertRaisesRegex(errors.ConfigError, r'verify.imports\[0\]'):
      train.run(c, self.create_tempdir().full_path, log=lambda _: None)
    # A module whose own code fails: a traceback, exit 1, before.
    folder = self.create_tempdir().full_path
    sys.path.insert(0, folder)
    self.addCleanup(sys.path.remove, folder)
    for name, text, shown in (
        ('raises_here', "X = 1\nraise RuntimeError('no licence')\n",
         'RuntimeError: no licence at {}:2'),
        ('bad_syntax', 'def f(:\n', 'SyntaxError: .* at {}:1'),
        ('takes_math', 'from jaxgrpo.verifiers import base\n'
         "@base.register('math')\ndef mine(c, e):\n  return 1.0\n",
         "ValueError: verifier 'math' is already registered.* at ")):
      path = os.path.join(folder, f'{name}.py')
      with open(path, 'w') as f:
        f.write(text)
      c = _config()
      c.verify.imports = ('tests.flaky_verifiers', name)
      with self.assertRaisesRegex(
          errors.ConfigError, rf"^verify.imports\[1\]='{name}': cannot "
          rf'import it \({shown.format(re.escape(path))}'):
        train.run(c, self.create_tempdir().full_path, log=lambda _: None)

  def test_greedy_rollouts_are_refused(self):
    # A greedy group's completions are all the same: never informative.
    for key, value in (('temperature', 0.0), ('top_k', 1)):
      c = _config()
      c.rollout[key] = value
      with self.assertRaisesRegex(
          errors.ConfigError, rf'rollout.{key}={value}: .*the same, so no '
          'group is informative'):
        train.run(c, self.create_tempdir().full_path, log=lambda _: None)

  def test_64_bit_jax_is_refused(self):
    # It ended in `TypeError: index arguments to dynamic_update_slice must
    # be integers of the same type, got int64, int32` at the first rollout.
    c = _config()
    jax.config.update('jax_enable_x64', True)
    try:
      for call in (lambda: train.run(c, self.create_tempdir().full_path,
                                     log=lambda _: None),
                   generator_lib.refuse_x64):
        with self.assertRaisesRegex(
            errors.ConfigError, r'^jax_enable_x64 is on \(JAX_ENABLE_X64 or '
            'jax.config.update\): jaxgrpo computes in 32 bits'):
          call()
    finally:
      jax.config.update('jax_enable_x64', False)


if __name__ == '__main__':
  absltest.main()
