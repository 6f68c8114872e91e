"""Tests for the verifier worker pool: timeouts, errors and crashes."""

import contextlib
import importlib
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from jaxgrpo import errors
from jaxgrpo.example import Example
from jaxgrpo.verifiers import base
from jaxgrpo.verifiers import pool
from tests import flaky_verifiers

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _examples(n, dataset='d'):
  return [Example(id=f'{dataset}/{i}', prompt='p', answer='a', dataset=dataset)
          for i in range(n)]


class ScorerTest(parameterized.TestCase):

  @parameterized.parameters(0, 2)
  def test_scores_match_inline_scoring(self, workers):
    texts = ['ok', 'no', 'half', 'ok'] * 25
    with pool.Scorer({'d': flaky_verifiers.Flaky()}, workers=workers,
                     timeout_s=5.0) as scorer:
      rewards, stats = scorer.score(texts, _examples(len(texts)))
    np.testing.assert_array_equal(rewards, [1, 0, 0.5, 1] * 25)
    self.assertEqual((stats.errors, stats.out_of_range, stats.timeouts),
                     (0, 0, 0))

  @parameterized.parameters(0, 2)
  def test_failures_score_zero_and_are_counted(self, workers):
    texts = ['ok', 'raise', 'big', 'nan', 'sleep', 'ok']
    start = time.monotonic()
    with pool.Scorer({'d': flaky_verifiers.Flaky()}, workers=workers,
                     timeout_s=0.5) as scorer:
      rewards, stats, outcomes = scorer.score(
          texts, _examples(len(texts)), with_details=True)
    np.testing.assert_array_equal(rewards, [1, 0, 0, 0, 0, 1])
    self.assertEqual(stats.errors, 1)
    self.assertEqual(stats.out_of_range, 2)
    self.assertEqual(stats.timeouts, 1)
    self.assertEqual([o.kind for o in outcomes],
                     ['ok', 'error', 'range', 'range', 'timeout', 'ok'])
    self.assertLess(time.monotonic() - start, 10.0)  # not the 30 s sleep

  def test_call_stuck_in_c_is_killed_and_the_batch_completes(self):
    texts = ['ok', 'stuck', 'ok', 'ok', 'stuck', 'ok', 'ok', 'ok']
    with pool.Scorer({'d': flaky_verifiers.Flaky()}, workers=2,
                     timeout_s=0.3) as scorer:
      start = time.monotonic()
      rewards, stats = scorer.score(texts, _examples(len(texts)))
      elapsed = time.monotonic() - start
      self.assertEqual(scorer.restarts, 2)
      self.assertEqual(scorer.workers, 2)
      # The replacement workers score the next batch normally.
      again, _ = scorer.score(['ok'] * 4, _examples(4))
    np.testing.assert_array_equal(rewards, [1, 0, 1, 1, 0, 1, 1, 1])
    self.assertEqual(stats.timeouts, 2)
    self.assertLess(elapsed, 20.0)
    np.testing.assert_array_equal(again, [1] * 4)

  def test_a_dying_worker_is_replaced(self):
    texts = ['ok', 'die', 'ok', 'half']
    with pool.Scorer({'d': flaky_verifiers.Flaky()}, workers=1,
                     timeout_s=5.0) as scorer:
      rewards, stats = scorer.score(texts, _examples(len(texts)))
      self.assertEqual(scorer.restarts, 1)
    np.testing.assert_array_equal(rewards, [1, 0, 1, 0.5])
    self.assertEqual(stats.errors, 1)

  @absltest.skipUnless(os.path.exists('/proc/self/oom_score_adj'),
                       'Linux only')
  def test_workers_are_the_oom_killers_first_choice(self):
    # A verifier that leaks memory must cost a worker (replaced), not the
    # trainer, which the OOM killer would pick as the largest process.
    def adj(pid):
      with open(f'/proc/{pid}/oom_score_adj') as f:
        return int(f.read())
    own = adj(os.getpid())
    with pool.Scorer({'d': flaky_verifiers.Flaky()}, workers=2,
                     timeout_s=5.0) as scorer:
      rewards, _ = scorer.score(['ok', 'die', 'ok'], _examples(3))
      pids = [w.process.pid for w in scorer._workers]
      self.assertEqual([adj(pid) for pid in pids], [1000, 1000])  # replaced too
    np.testing.assert_array_equal(rewards, [1, 0, 1])
    self.assertEqual(adj(os.getpid()), own)

  @absltest.skipUnless(os.path.exists('/proc/self/statm'), 'Linux only')
  def test_a_worker_whose_memory_grows_is_replaced(self):
    # A verifier that keeps 64 MiB a call: its worker grew until the OOM
    # killer took it (or the machine), scoring the call it was in 0.
    texts = ['memory'] * 22 + ['ok'] * 4
    with self.assertLogs(level='WARNING') as logs:
      with pool.Scorer({'d': flaky_verifiers.Leaky()}, workers=1,
                       timeout_s=30.0) as scorer:
        rewards, stats, outcomes = scorer.score(
            texts, _examples(len(texts)), with_details=True)
        self.assertEqual((scorer.worn, scorer.restarts, scorer.workers),
                         (1, 1, 1))
    np.testing.assert_array_equal(rewards, [1] * len(texts))
    self.assertEqual((stats.errors, stats.timeouts), (0, 0))
    pids = [o.details['pid'] for o in outcomes]
    # 1 GiB past the first call's memory: the 18th call (64 MiB each).
    first = pids.count(pids[0])
    self.assertBetween(first, 17, 18)
    self.assertEqual(pids[:first], [pids[0]] * first)
    self.assertEqual(set(pids[first:]), {pids[-1]})
    self.assertNotEqual(pids[-1], pids[0])
    self.assertRegex(
        '\n'.join(logs.output),
        r'a verifier worker was replaced: its memory grew by 1\.0\d GiB since '
        rf'its first call, .*after example d/{first - 1} \(dataset d')

  @absltest.skipUnless(os.path.isdir('/proc/self/fd'), 'Linux only')
  def test_a_worker_that_leaves_files_open_is_replaced(self):
    # Once its open files ran out, every call raised 'Too many open files'.
    import resource  # pylint: disable=g-import-not-at-top
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    # Counted every 16 calls: after the 16th, 0.8 of the limit is open.
    leaky = flaky_verifiers.Leaky(files=limit // 20 + 1)
    texts = ['files'] * 40
    with self.assertLogs(level='WARNING') as logs:
      with pool.Scorer({'d': leaky}, workers=1, timeout_s=30.0) as scorer:
        rewards, stats, outcomes = scorer.score(
            texts, _examples(len(texts)), with_details=True)
        self.assertEqual(scorer.worn, 2)
        # Counted in the call's stats (`verify/workers_replaced`), and only
        # in that call's.
        _, later = scorer.score(['ok'] * 3, _examples(3))
    np.testing.assert_array_equal(rewards, [1] * len(texts))
    self.assertEqual((stats.errors, stats.workers_replaced), (0, 2))
    self.assertEqual(later.workers_replaced, 0)
    pids = [o.details['pid'] for o in outcomes]
    self.assertEqual([pids.count(p) for p in dict.fromkeys(pids)],
                     [16, 16, 8])
    self.assertRegex(
        '\n'.join(logs.output), r'a verifier worker was replaced: it holds '
        rf'\d+ open files, more than half of its limit {limit} ')

  @parameterized.parameters(0, 2)
  def test_what_a_verifier_prints_goes_to_stderr(self, workers):
    # It was written between the program's own lines on stdout (from a
    # worker, whenever its buffer filled or it exited): `jaxgrpo-eval ... >
    # table.txt` kept it in the table.
    script = textwrap.dedent('''
        import json, sys
        from jaxgrpo.verifiers import pool
        from tests import flaky_verifiers
        from tests.verifiers.test_pool import _examples
        workers = int(sys.argv[1])
        texts = ['a', 'b', 'c'] + ['raw'] * bool(workers)
        print('before', flush=True)
        with pool.Scorer({'d': flaky_verifiers.Chatty()},
                         workers=workers) as scorer:
          rewards, stats = scorer.score(texts, _examples(len(texts)))
          print(json.dumps({'rewards': rewards.tolist(),
                            'printed': [scorer.printed, stats.printed]}))
        ''')
    out = subprocess.run(
        [sys.executable, '-c', script, str(workers)], capture_output=True,
        text=True, timeout=120, cwd=_REPO,
        env={**os.environ, 'PYTHONPATH': _REPO}, check=False)
    self.assertEqual(out.returncode, 0, out.stderr[-3000:])
    n = 4 if workers else 3
    self.assertEqual(out.stdout, 'before\n' + json.dumps(
        {'rewards': [1.0] * n, 'printed': [n, n]}) + '\n')
    # Two workers' lines may interleave on stderr, as any two processes'.
    for line in ('checking d/0: a', 'checking d/2: c',
                 'verifier d printed 21 characters to stdout on example d/0 '
                 '(dataset d): they went to stderr'):
      self.assertIn(line, out.stderr)
    self.assertEqual(out.stderr.count('more\n'), n)
    self.assertEqual(out.stderr.count('raw line\n'), int(bool(workers)))

  def test_a_verifier_printing_in_a_thread_leaves_other_lines_on_stdout(self):
    # Scoring overlaps generation in a thread (rollout.verify_overlap): the
    # trainer's lines printed meanwhile stay on stdout.
    stdout, stderr = io.StringIO(), io.StringIO()
    flaky_verifiers.printing.clear()
    flaky_verifiers.go.clear()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(
        stderr), pool.Scorer({'d': flaky_verifiers.Chatty()}) as scorer:
      scoring = threading.Thread(
          target=scorer.score, args=(['wait'], _examples(1)))
      scoring.start()
      self.assertTrue(flaky_verifiers.printing.wait(30))
      print('step 1 line')
      flaky_verifiers.go.set()
      scoring.join(30)
      self.assertEqual(scorer.printed, 1)
    self.assertEqual(stdout.getvalue(), 'step 1 line\n')
    self.assertIn('checking d/0: wait\nmore\n', stderr.getvalue())

  @parameterized.parameters(0, 1)
  def test_a_timeout_the_verifier_swallows_is_a_timeout(self, workers):
    # A bare `except:` caught the timer's exception: the call ran past the
    # limit, returned 1, and scored 1 as an ordinary result.
    start = time.monotonic()
    with pool.Scorer({'d': flaky_verifiers.Flaky()}, workers=workers,
                     timeout_s=0.5) as scorer:
      rewards, stats, outcomes = scorer.score(
          ['ok', 'swallow', 'ok'], _examples(3), with_details=True)
      self.assertEqual(scorer.restarts, 0)
    self.assertLess(time.monotonic() - start, 10.0)
    np.testing.assert_array_equal(rewards, [1, 0, 1])
    self.assertEqual(stats.timeouts, 1)
    self.assertEqual(outcomes[1].kind, 'timeout')
    self.assertIn('caught the timer', outcomes[1].message)

  @parameterized.parameters(0, 1)
  def test_a_timer_that_fires_as_the_call_returns_never_escapes(self, workers):
    # The timer fires at the n-th bytecode after the verifier returned, for
    # every n up to past the outcome's return: between the return and the
    # disarm it used to escape the call (the run ended, or the worker died).
    n = 150
    texts = [str(i) for i in range(1, n + 1)]
    with pool.Scorer({'d': flaky_verifiers.AlarmAfterReturn()},
                     workers=workers, timeout_s=60.0) as scorer:
      if workers:
        rewards, stats, outcomes = scorer.score(
            texts, _examples(n), with_details=True)
      else:
        outcomes, fired = [], []
        for text in texts:
          outcomes += scorer.score([text], _examples(1), with_details=True)[2]
          fired.append(flaky_verifiers.alarm_fired_at[0] is not None)
        self.assertTrue(fired[0])
        self.assertFalse(fired[-1])  # n reaches past the scoring code
        # Alarms after the call was over were ignored: scored as returned.
        self.assertIn('ok', [o.kind for o, f in zip(outcomes, fired) if f])
      self.assertEqual(scorer.restarts, 0)
    kinds = [o.kind for o in outcomes]
    self.assertEqual(set(kinds), {'ok', 'timeout'})
    self.assertEqual(kinds[0], 'timeout')  # fired before the call was over
    self.assertEqual(kinds[-1], 'ok')
    for o in outcomes:
      self.assertEqual(o.reward, float(o.kind == 'ok'))

  def test_a_dead_workers_exit_code_is_named(self):
    with pool.Scorer({'d': flaky_verifiers.Flaky()}, workers=1,
                     timeout_s=5.0) as scorer:
      _, _, outcomes = scorer.score(['die'], _examples(1), with_details=True)
    self.assertEqual(outcomes[0].message,
                     'the verifier worker died (exit code 3)')

  @parameterized.parameters(0, 1)
  def test_details_that_do_not_pickle_lose_only_themselves(self, workers):
    # Pickling a chunk's results ran the details' own code: a ValueError
    # ended the worker, so the chunk's valid rewards scored 0 and each
    # retry lost one more; a TypeError cost every completion its details.
    texts = ['half', 'unsendable', 'half', 'unpicklable', 'ok'] * 3
    with pool.Scorer({'d': flaky_verifiers.Flaky()}, workers=workers,
                     timeout_s=5.0) as scorer:
      rewards, stats, outcomes = scorer.score(
          texts, _examples(len(texts)), with_details=True)
      self.assertEqual(scorer.restarts, 0)
    np.testing.assert_array_equal(rewards, [0.5, 1, 0.5, 1, 1] * 3)
    self.assertEqual((stats.errors, stats.out_of_range, stats.timeouts),
                     (0, 0, 0))
    self.assertEqual([o.kind for o in outcomes], ['ok'] * len(texts))
    self.assertEqual(outcomes[0].details, {'why': 'half'})
    self.assertEqual(outcomes[2].details, {'why': 'half'})
    if workers:
      self.assertEqual(outcomes[1].details, {
          'unsent': "details could not be sent back: "
                    "ValueError('cannot pickle this')"})
      self.assertIn('TypeError', outcomes[3].details['unsent'])

  @parameterized.parameters(0, 1)
  def test_bad_exits_and_results_score_zero_and_are_counted(self, workers):
    texts = ['ok', 'exit', 'huge', 'text', 'true', 'ok']
    with pool.Scorer({'d': flaky_verifiers.Flaky()}, workers=workers,
                     timeout_s=5.0) as scorer:
      rewards, stats, outcomes = scorer.score(
          texts, _examples(len(texts)), with_details=True)
      self.assertEqual(scorer.restarts, 0)  # no worker died
    np.testing.assert_array_equal(rewards, [1, 0, 0, 0, 1, 1])
    self.assertEqual((stats.errors, stats.out_of_range, stats.timeouts),
                     (1, 2, 0))
    self.assertIn('SystemExit(0)', outcomes[1].message)
    self.assertIn('OverflowError', outcomes[2].message)
    self.assertEqual(outcomes[3].message,
                     "returned '1' (TypeError: a str is not a number)")

  def test_ctrl_c_in_a_verifier_is_an_error_in_a_worker(self):
    with pool.Scorer({'d': flaky_verifiers.Flaky()}, workers=1) as scorer:
      rewards, stats, outcomes = scorer.score(
          ['ctrl-c', 'ok'], _examples(2), with_details=True)
      self.assertEqual(scorer.restarts, 0)
    np.testing.assert_array_equal(rewards, [0, 1])
    self.assertEqual(stats.errors, 1)
    self.assertIn('KeyboardInterrupt', outcomes[0].message)

  def test_ctrl_c_in_a_verifier_stops_the_trainer_without_workers(self):
    with pool.Scorer({'d': flaky_verifiers.Flaky()}, workers=0) as scorer:
      with self.assertRaises(KeyboardInterrupt):
        scorer.score(['ctrl-c'], _examples(1))

  def test_workers_ignore_stop_signals(self):
    # A signal to the process group (Ctrl-C, `timeout`, a scheduler) also
    # reaches the workers; the trainer alone acts on it.
    texts = ['ok', 'half'] * 8
    with pool.Scorer({'d': flaky_verifiers.Flaky(sleep_s=0.3)}, workers=2,
                     timeout_s=5.0) as scorer:
      scorer.score(texts, _examples(len(texts)))
      pids = [w.process.pid for w in scorer._workers]
      for pid in pids:
        os.kill(pid, signal.SIGINT)
        os.kill(pid, signal.SIGTERM)
      time.sleep(0.2)
      idle = scorer.score(texts, _examples(len(texts)))
      # And while they are busy.
      timer = threading.Timer(0.1, lambda: [
          os.kill(pid, sig) for pid in pids
          for sig in (signal.SIGINT, signal.SIGTERM)])
      timer.start()
      busy = scorer.score(['sleep', 'ok'] * 2, _examples(4))
      timer.join()
      self.assertEqual(scorer.restarts, 0)
      self.assertEqual([w.process.pid for w in scorer._workers], pids)
    np.testing.assert_array_equal(idle[0], [1, 0.5] * 8)
    np.testing.assert_array_equal(busy[0], [0, 1] * 2)
    for stats in (idle[1], busy[1]):
      self.assertEqual((stats.errors, stats.out_of_range, stats.timeouts),
                       (0, 0, 0))

  def test_a_worker_that_died_idle_is_replaced_on_the_next_send(self):
    with pool.Scorer({'d': flaky_verifiers.Flaky()}, workers=1,
                     timeout_s=5.0) as scorer:
      scorer.score(['ok'], _examples(1))
      dead = scorer._workers[0].process
      os.kill(dead.pid, signal.SIGKILL)
      dead.join(timeout=5.0)
      rewards, stats = scorer.score(['ok', 'half', 'ok'], _examples(3))
      self.assertEqual(scorer.restarts, 1)
      self.assertNotEqual(scorer._workers[0].process.pid, dead.pid)
    np.testing.assert_array_equal(rewards, [1, 0.5, 1])
    self.assertEqual((stats.errors, stats.out_of_range, stats.timeouts),
                     (0, 0, 0))

  def test_workers_run_the_main_module_only_for_verifiers_defined_there(self):
    # Re-running the trainer's main module in every worker imports JAX in
    # each; a verifier defined in a user's script still needs it.
    script = textwrap.dedent('''
        import os, sys
        with open(sys.argv[1], 'a') as f:
          f.write(f'{os.getpid()}\\n')  # each run of this module
        from jaxgrpo.verifiers import pool
        from tests import flaky_verifiers
        from tests.verifiers.test_pool import _examples
        def mine(completion, example):
          return 0.25
        if __name__ == '__main__':
          verifier = mine if sys.argv[2] == 'mine' else flaky_verifiers.Flaky()
          with pool.Scorer({'d': verifier}, workers=2) as scorer:
            print(scorer.score(['ok'] * 4, _examples(4))[0].tolist())
        ''')
    folder = self.create_tempdir().full_path
    with open(os.path.join(folder, 'train.py'), 'w') as f:
      f.write(script)
    for which, reward, runs in (('library', 1.0, 1), ('mine', 0.25, 3)):
      marks = os.path.join(folder, f'{which}.txt')
      out = subprocess.run(
          [sys.executable, os.path.join(folder, 'train.py'), marks, which],
          capture_output=True, text=True, timeout=120, cwd=folder,
          env={**os.environ, 'PYTHONPATH': _REPO}, check=False)
      self.assertEqual(out.returncode, 0, out.stderr[-3000:])
      self.assertEqual(out.stdout.strip(), str([reward] * 4))
      with open(marks) as f:
        self.assertLen(f.read().split(), runs, which)

  def test_verifiers_defined_in_a_notebook_reach_the_workers(self):
    # A notebook's main module has no file that the workers could run again
    # (it was `Can't get attribute 'mine' on <module '__main__'>`).
    notebook = types.ModuleType('__main__')
    with mock.patch.dict(sys.modules, {'__main__': notebook}):
      exec(textwrap.dedent('''
          import dataclasses
          def mine(completion, example):
            return 0.25
          @dataclasses.dataclass(frozen=True)
          class Scaled:
            factor: float = 0.5
            def __call__(self, completion, example):
              return self.factor
          anonymous = lambda completion, example: 0.75
          '''), notebook.__dict__)  # pylint: disable=exec-used
      verifiers = {'a': notebook.mine, 'b': notebook.Scaled(),
                   'c': notebook.anonymous}
      with pool.Scorer(verifiers, workers=1) as scorer:
        rewards, stats = scorer.score(
            ['ok'] * 3, _examples(1, 'a') + _examples(1, 'b')
            + _examples(1, 'c'))
    np.testing.assert_array_equal(rewards, [0.25, 0.5, 0.75])
    self.assertEqual(stats.errors, 0)

  def test_a_module_edited_between_runs_is_imported_again(self):
    # A notebook edits its reward module between two runs: the workers,
    # which start afresh, scored with the new file, and `verify.workers=0`
    # with the module imported first, silently with the old one.
    folder = self.create_tempdir()
    source = textwrap.dedent('''
        from jaxgrpo.verifiers import base
        @base.register(__name__)
        def reward(completion, example):
          return {reward}
        ''')
    def write(name, reward, mtime):
      path = folder.create_file(f'{name}.py', source.format(reward=reward))
      os.utime(path.full_path, (mtime, mtime))
    def scores(name, workers):
      pool.import_modules([name])
      with pool.Scorer({'d': base.get(name)}, workers=workers,
                       imports=(name,)) as scorer:
        return scorer.score(['x'], _examples(1))[0].tolist()
    sys.path.insert(0, folder.full_path)
    self.addCleanup(sys.path.remove, folder.full_path)
    for name in ('edited_a', 'edited_b'):
      self.addCleanup(sys.modules.pop, name, None)
      write(name, 0.25, 1_000_000_000)
    # Imported by a run, edited, run again.
    self.assertEqual(scores('edited_a', 0), [0.25])
    write('edited_a', 0.5, 1_000_000_100)
    self.assertEqual(scores('edited_a', 0), [0.5])
    self.assertEqual(scores('edited_a', 1), [0.5])
    self.assertEqual(scores('edited_a', 0), [0.5])  # not edited again
    # Imported by the user (`import edited_b` in a cell, which writes its
    # .pyc, as Python does by default), edited, then run.
    with mock.patch.object(sys, 'dont_write_bytecode', False):
      importlib.import_module('edited_b')
    write('edited_b', 0.5, 1_000_000_100)
    self.assertEqual(scores('edited_b', 0), [0.5])
    self.assertEqual(scores('edited_b', 1), [0.5])

  def test_each_scorer_logs_its_failures(self):
    # A second run in one process (a notebook) logs its verifier's errors
    # too; they were logged once per process.
    for _ in range(2):
      with self.assertLogs(level='WARNING') as logs:
        with pool.Scorer({'d': flaky_verifiers.Flaky()}) as scorer:
          scorer.score(['raise', 'raise'], _examples(2))
      self.assertLen(logs.output, 1)
      self.assertIn('verifier d raised on example d/0', logs.output[0])

  def test_an_import_that_fails_in_the_workers_is_a_config_error(self):
    module = 'tests.verifiers.fails_in_workers'
    importlib.import_module(module)  # fine here, in the trainer
    start = time.monotonic()
    with self.assertRaisesRegex(
        errors.ConfigError,
        rf"^verify.imports\[1\]='{module}': cannot import it in the "
        r'verifier workers \(ImportError: only the trainer can import '
        r'this\)$'):
      pool.Scorer({'d': flaky_verifiers.Flaky()}, workers=2,
                  imports=('tests.flaky_verifiers', module))
    self.assertLess(time.monotonic() - start, 20.0)

  def test_each_dataset_uses_its_own_verifier(self):
    verifiers = {'a': base.get('exact_match'), 'b': flaky_verifiers.Flaky()}
    examples = _examples(2, 'a') + _examples(2, 'b')
    with pool.Scorer(verifiers, workers=1) as scorer:
      rewards, _ = scorer.score(['a', 'ok', 'ok', 'a'], examples)
    np.testing.assert_array_equal(rewards, [1, 0, 1, 0])

  def test_unknown_dataset_is_an_error(self):
    with pool.Scorer({'a': base.get('exact_match')}) as scorer:
      with self.assertRaisesRegex(ValueError, r"dataset\(s\) \['zz'\]"):
        scorer.score(['x'], _examples(1, 'zz'))

  def test_unpicklable_verifier_is_a_clear_error(self):
    # Under a main module that runs again in the workers (a script); a
    # notebook's lambdas go by value (below).
    with mock.patch.object(pool, '_main_runs_again', lambda: True):
      with self.assertRaisesRegex(ValueError, 'verify.workers=0'):
        pool.Scorer({'d': lambda text, example: 1.0}, workers=1)


class FromConfigTest(absltest.TestCase):

  def test_weighted_mean_and_product(self):
    ex = Example(id='x', prompt='p', answer='ok')
    mean = base.from_config([{'name': 'exact_match', 'weight': 3},
                             {'name': 'exact_match', 'weight': 1}])
    self.assertEqual(mean('ok', ex).reward, 1.0)
    mixed = base.from_config({'combine': 'product', 'parts': [
        'exact_match', {'name': 'exact_match'}]})
    self.assertEqual(mixed('no', ex).reward, 0.0)

  def test_errors_name_the_key(self):
    with self.assertRaisesRegex(ValueError, r'verifier\[1\].weight'):
      base.from_config(['exact_match', {'name': 'exact_match', 'weight': -1}])
    with self.assertRaisesRegex(ValueError, "unknown verifier 'nope'"):
      base.from_config('nope')
    with self.assertRaisesRegex(ValueError, 'takes no options'):
      base.from_config({'name': 'exact_match', 'x': 1})
    with self.assertRaisesRegex(ValueError, 'combine'):
      base.from_config({'combine': 'max', 'parts': ['exact_match']})

  def test_weights_that_would_be_ignored_or_overflow(self):
    # An infinite weight, or weights whose sum overflows, scored every
    # completion 0 (NaN); a bool passed as a number, and weights in a
    # product were silently ignored.
    for weight in (float('inf'), True, '0.5'):
      with self.assertRaisesRegex(
          ValueError, r'verifier\[0\]\.weight=.*finite number >= 0'):
        base.from_config([{'name': 'exact_match', 'weight': weight},
                          'exact_match'])
    with self.assertRaisesRegex(
        ValueError, r'verifier\.parts\[1\]\.weight=0\.1: a product takes no '
        'weights'):
      base.from_config({'combine': 'product', 'parts': [
          'exact_match', {'name': 'exact_match', 'weight': 0.1}]})
    with self.assertRaisesRegex(ValueError, 'positive, finite sum'):
      base.from_config([{'name': 'exact_match', 'weight': 1e308},
                        {'name': 'exact_match', 'weight': 1e308}])


if __name__ == '__main__':
  absltest.main()
