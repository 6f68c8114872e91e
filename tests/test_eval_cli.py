"""jaxgrpo-eval: pass@1, mean@k and pass@k of checkpoints."""

import contextlib
import dataclasses
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
from jaxgrpo import config_lib
from jaxgrpo import errors
from jaxgrpo import evaluate
from jaxgrpo import model_spec
from jaxgrpo.cli import common
from jaxgrpo.cli import evaluate as evaluate_cli
from jaxgrpo.configs import demo
from jaxgrpo.data import loading
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.example import Example
from jaxgrpo.generate import sampling as sampling_lib
from jaxgrpo.generate.generator import Completions
from jaxgrpo.model import decoder
from jaxgrpo.reporting import console
from jaxgrpo.stratify import runner
from jaxgrpo.verifiers import base
from jaxgrpo.verifiers import pool as verifier_pool
from tests import flaky_verifiers
from tests import test_train
from tests.stratify import fixtures

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(REPO, 'configs', 'demo.py') + ':runlocal'
METRICS = ('pass@1', 'mean@k', 'pass@k')

# The known case: the completions of each example, k = 3. Flaky scores
# 'ok' 1, 'half' 0.5, anything else 0.
TEXTS = {
    'a/0': ('half', 'no', 'no'),   # rewards 0.5 0 0
    'a/1': ('no', 'half', 'ok'),   # 0 0.5 1
    'b/0': ('ok', 'ok', 'ok'),     # 1 1 1
    'b/1': ('half', 'ok', 'ok'),   # 0.5 1 1
}
# (examples, pass@1, mean@3, pass@3) at threshold 1.0.
EXPECTED = {
    'all': (4, 1 / 4, 7.5 / 12, 3 / 4),
    'a': (2, 0.0, 2 / 6, 1 / 2),
    'a/x': (1, 0.0, 0.5 / 3, 0.0),
    'a/y': (1, 0.0, 1.5 / 3, 1.0),
    'b': (2, 1 / 2, 5.5 / 6, 1.0),
}


class TextGenerator:
  """Answers example i's prompt with TEXTS[id], k completions per prompt."""

  num_samples = 3

  def __init__(self, tokenizer, examples):
    self.tok = tokenizer
    self.texts = {ex.prompt: TEXTS[ex.id] for ex in examples}

  def generate(self, params, tokens, mask, rng):
    del params, mask, rng
    rows = [self.tok.encode(text) + [self.tok.eos_id]
            for row in tokens for text in self.texts[self.tok.decode(row)]]
    out = np.zeros((len(rows), 6), np.int32)
    for i, r in enumerate(rows):
      out[i, :len(r)] = r
    m = out != 0
    return Completions(tokens=out, logps=np.zeros(out.shape, np.float32),
                       mask=m, lengths=m.sum(1).astype(np.int32))


@dataclasses.dataclass
class GreedyGenerator:
  """A greedy stand-in: the first of TEXTS[id] for each of k completions;
  counts the completions it is asked for in `generator.rows`."""

  generator: TextGenerator
  num_samples: int
  sampling: sampling_lib.Sampling = sampling_lib.Sampling(temperature=0.0)

  def generate(self, params, tokens, mask, rng):
    text = self.generator.texts
    self.generator.texts = {p: (t[0],) * self.num_samples
                            for p, t in text.items()}
    self.generator.num_samples = self.num_samples
    out = self.generator.generate(params, tokens, mask, rng)
    self.generator.texts = text
    self.generator.rows = getattr(self.generator, 'rows', 0) + len(out.tokens)
    return out


def _known_examples():
  a = [Example(id='a/0', prompt='p0=', answer='', dataset='a', subset='x'),
       Example(id='a/1', prompt='p1=', answer='', dataset='a', subset='y')]
  b = [Example(id='b/0', prompt='q0=', answer='', dataset='b'),
       Example(id='b/1', prompt='q1=', answer='', dataset='b')]
  return a, b


def _main(*argv):
  """(exit code, stdout, stderr) of evaluate_cli.main(argv)."""
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = evaluate_cli.main(list(argv))
  return code, out.getvalue(), err.getvalue()


def _check_bounds(test, metrics):
  for group, m in metrics.items():
    test.assertGreater(m['examples'], 0, group)
    test.assertLessEqual(m['pass@1'], m['pass@k'], group)
    for name in METRICS:
      test.assertBetween(m[name], 0.0, 1.0, group)


class PassMetricsTest(absltest.TestCase):

  def test_hand_computed_values(self):
    rewards = np.array([[0.5, 0, 0], [0, 0.5, 1], [1, 1, 1], [0.5, 1, 1]])
    self.assertEqual(evaluate.pass_metrics(rewards, 1.0),
                     {'examples': 4, 'pass@1': 0.25, 'mean@k': 7.5 / 12,
                      'pass@k': 0.75})
    # At threshold 0.5 a reward of 0.5 succeeds.
    self.assertEqual(evaluate.pass_metrics(rewards, 0.5),
                     {'examples': 4, 'pass@1': 0.75, 'mean@k': 7.5 / 12,
                      'pass@k': 1.0})

  def test_training_eval_pass_at_k_counts_what_jaxgrpo_eval_counts(self):
    # A partial reward (qa with metric='f1', a format part) is no pass:
    # eval/pass_at_k was 1.0 here, any reward > 0 passing.
    a, b = _known_examples()
    rewards = np.array([[0.5, 0, 0], [0, 0.5, 1], [1, 1, 1], [0.5, 1, 1]])
    for threshold in (1.0, 0.5):
      metrics = evaluate.accuracy_metrics(a + b, rewards, threshold=threshold)
      self.assertEqual(
          metrics['eval/pass_at_k'],
          evaluate.pass_metrics(rewards, threshold)['pass@k'])
    self.assertEqual(evaluate.accuracy_metrics(a + b, rewards)[
        'eval/pass_at_k'], 0.75)

  def test_scripted_completions_through_the_verifier(self):
    a, b = _known_examples()
    tok = tokenizer_lib.CharTokenizer(alphabet=fixtures.ALPHABET)
    scorer = verifier_pool.Scorer(flaky_verifiers.Flaky())
    for batch in (1, 3, 8):  # chunks of one size, the last one padded
      with self.subTest(batch=batch):
        metrics = evaluate.evaluate_model(
            TextGenerator(tok, a + b), None, tok, scorer, [(0, a), (1, b)],
            key=jax.random.key(0), threshold=1.0, max_prompt_len=8,
            batch=batch)
        self.assertEqual(list(metrics), list(EXPECTED))
        for group, (n, *values) in EXPECTED.items():
          self.assertEqual(metrics[group]['examples'], n, group)
          np.testing.assert_allclose(
              [metrics[group][name] for name in METRICS], values,
              err_msg=group)

  def test_training_eval_draws_one_greedy_completion(self):
    # eval.temperature=0 with eval.num_samples=3: the 3 completions were
    # identical, and generated (and verified) three times over.
    a, b = _known_examples()
    tok = tokenizer_lib.CharTokenizer(alphabet=fixtures.ALPHABET)
    scorer = verifier_pool.Scorer(flaky_verifiers.Flaky())
    metrics, rows, lines = [], [], []
    for k in (1, 3):
      texts = TextGenerator(tok, a + b)
      evaluator = evaluate.Evaluator(
          GreedyGenerator(texts, num_samples=k), tok, a + b, scorer, jax.random.key(0), max_prompt_len=8,
          truncate=False, console=console.Console(lines.append))
      metrics.append(evaluator(None, 5))
      rows.append(texts.rows)
    self.assertEqual(rows[1], rows[0])  # 64: one chunk, padded, k=1
    self.assertEqual(metrics[1], metrics[0])
    self.assertEqual(metrics[0]['eval/accuracy'], (0.5 + 0 + 1 + 0.5) / 4)
    self.assertEqual(lines, [
        'eval.temperature=0 is greedy: its eval.num_samples=3 completions '
        'would be identical, so one is drawn per example'])


class ScriptedGenerator(TextGenerator):
  """Answers each prompt with its `texts` (prompt -> k completions),
  sampled (not greedy) as training's evaluation samples."""

  sampling = sampling_lib.Sampling(temperature=1.0)

  def __init__(self, tokenizer, texts):  # pylint: disable=super-init-not-called
    self.tok, self.texts = tokenizer, texts
    self.num_samples = len(next(iter(texts.values())))


class VerifierFailuresTest(absltest.TestCase):
  """Evaluation counts its verifiers' failures as a training step does."""

  def _evaluate(self, verifier, texts, **scorer_options):
    """(training's eval metrics at step 2, jaxgrpo-eval's ScoreStats) of
    examples a/0, a/1, b/0, b/1 answered with `texts` (id -> k texts),
    scored by `verifier` in one worker process."""
    a, b = _known_examples()
    tok = tokenizer_lib.CharTokenizer(alphabet=fixtures.ALPHABET)
    generator = ScriptedGenerator(
        tok, {ex.prompt: texts[ex.id] for ex in a + b})
    stats = base.ScoreStats()
    with self.assertLogs(level='WARNING'), verifier_pool.Scorer(
        verifier, workers=1, imports=('tests.flaky_verifiers',),
        **scorer_options) as scorer:
      metrics = evaluate.Evaluator(
          generator, tok, a + b, scorer, jax.random.key(0),
          max_prompt_len=8, truncate=False,
          console=console.Console(lambda _: None))(None, 2)
      evaluate.evaluate_model(
          generator, None, tok, scorer, [(0, a), (1, b)],
          key=jax.random.key(0), threshold=1.0, max_prompt_len=8, batch=2,
          stats=stats)
    return metrics, stats

  def test_errors_and_timeouts_are_counted(self):
    # They were scored 0 and logged once per run: eval/accuracy fell and
    # nothing in the metrics said why.
    metrics, stats = self._evaluate(
        flaky_verifiers.Flaky(sleep_s=30.0),
        {'a/0': ('raise', 'ok'), 'a/1': ('sleep', 'ok'),
         'b/0': ('big', 'ok'), 'b/1': ('ok', 'sleep')}, timeout_s=0.5)
    self.assertEqual(metrics['eval/accuracy'], 0.5)
    # An out-of-range reward ('big') is an error, as in verify/errors.
    self.assertEqual(
        {k: v for k, v in metrics.items() if k.startswith('eval/verify/')},
        {'eval/verify/errors': 2.0, 'eval/verify/timeouts': 2.0,
         'eval/verify/printed': 0.0, 'eval/verify/workers_replaced': 0.0})
    self.assertEqual(evaluate.verify_counts(stats),
                     {'errors': 2, 'timeouts': 2, 'printed': 0,
                      'workers_replaced': 0})

  def test_calls_that_printed_are_counted(self):
    metrics, stats = self._evaluate(
        flaky_verifiers.Chatty(),
        {ex: ('ok', 'ok', 'ok') for ex in ('a/0', 'a/1', 'b/0', 'b/1')})
    self.assertEqual(metrics['eval/verify/printed'], 12.0)
    self.assertEqual(metrics['eval/verify/errors'], 0.0)
    self.assertEqual(evaluate.verify_counts(stats)['printed'], 12)

  @absltest.skipUnless(os.path.isdir('/proc/self/fd'), 'Linux only')
  def test_workers_replaced_are_counted(self):
    # The worker's open files are counted every 16 calls: 20 calls, one
    # replacement.
    import resource  # pylint: disable=g-import-not-at-top
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    metrics, stats = self._evaluate(
        flaky_verifiers.Leaky(files=limit // 20 + 1),
        {ex: ('files',) * 5 for ex in ('a/0', 'a/1', 'b/0', 'b/1')},
        timeout_s=30.0)
    self.assertEqual(metrics['eval/verify/workers_replaced'], 1.0)
    self.assertEqual(metrics['eval/accuracy'], 1.0)
    self.assertEqual(evaluate.verify_counts(stats)['workers_replaced'], 1)


class EvaluateCheckpointsTest(absltest.TestCase):

  # 'init' with params from numpy: the initializers take seconds on CPU.
  @mock.patch.object(decoder, 'init_params', fixtures.fast_init_params)
  def test_real_model_sampled_and_greedy(self):
    # An untrained model passes starts_with_digit now and then.
    # pylint: disable-next=protected-access
    config = test_train._config(**{'verify.workers': 0})
    cfg = config_lib.from_config_dict(config)
    sampled = evaluate_cli.evaluate_checkpoints(
        cfg, ['init'], k=4, temperature=1.0, progress=False,
        log=lambda _: None)
    (entry,) = sampled['checkpoints']
    self.assertEqual((entry['spec'], entry['name'], entry['tag']),
                     ('init', 'init', 'init'))
    self.assertEqual(sampled['k'], 4)
    metrics = entry['metrics']
    # Overall, per dataset, then per subset (operand digit count).
    self.assertEqual(list(metrics)[:2], ['all', 'arithmetic'])
    self.assertNotEmpty(list(metrics)[2:])
    for key in list(metrics)[2:]:
      self.assertRegex(key, r'^arithmetic/\dd$')
    self.assertEqual(metrics['arithmetic']['examples'], 16)
    _check_bounds(self, metrics)
    self.assertGreater(metrics['all']['pass@k'], 0.0)  # some signal

    # Greedy: one completion per example, each computed here directly.
    greedy = evaluate_cli.evaluate_checkpoints(
        cfg, ['init'], k=4, temperature=0.0, progress=False,
        log=lambda _: None)
    self.assertEqual(greedy['k'], 1)
    model = model_spec.load('init', cfg)
    (_, _, held_out), = [loading.load_dataset(cfg, entry, model.tokenizer)
                         for entry in cfg.data.datasets]
    generator = dataclasses.replace(
        runner.make_generator(cfg, model, 1),
        sampling=sampling_lib.Sampling(temperature=0.0))
    tokens, mask, _ = tokenizer_lib.encode_prompts(
        model.tokenizer, [ex.prompt for ex in held_out],
        cfg.rollout.max_prompt_len)
    out = generator.generate(model.params, tokens, mask, jax.random.key(7))
    texts = [model.tokenizer.decode(row) for row in np.asarray(out.tokens)]
    passed = np.array([flaky_verifiers.starts_with_digit(t, None)
                       for t in texts])
    metrics = greedy['checkpoints'][0]['metrics']
    for group, m in metrics.items():
      rows = [i for i, ex in enumerate(held_out)
              if group in ('all', ex.dataset, f'{ex.dataset}/{ex.subset}')]
      self.assertEqual(m['examples'], len(rows), group)
      for name in METRICS:
        self.assertAlmostEqual(m[name], passed[rows].mean(), msg=group)


class CommandLineTest(absltest.TestCase):

  def test_checkpoints_table_and_json(self):
    # Built before the patch below: other tests compare its step 0 with the
    # real initialisation.
    workdir = fixtures.run_workdir()
    path = os.path.join(self.create_tempdir().full_path, 'out', 'eval.json')
    # 'init' with params from numpy: the initializers take seconds on CPU.
    with mock.patch.object(decoder, 'init_params', fixtures.fast_init_params):
      code, stdout, stderr = _main(
          f'--config={CONFIG}', f'--checkpoint={workdir}@0',
          '--checkpoint=init', '--k=3', '--temperature=1', '--limit=6',
          '--batch=4',
          '--config.verify.workers=0', f'--json={path}', '--quiet')
    self.assertEqual(code, 0, stderr)
    with open(path) as f:
      result = json.load(f)
    tag = f'{os.path.basename(workdir)}-step0'
    self.assertEqual(
        [(c['spec'], c['name'], c['tag']) for c in result['checkpoints']],
        [(f'{workdir}@0', f'{workdir}@0', tag), ('init', 'init', 'init')])
    self.assertEqual((result['k'], result['split'], result['limit'],
                      result['threshold'], result['datasets']),
                     (3, 'eval', 6, 1.0, ['arithmetic']))
    self.assertEqual(result['config'],
                     f'{CONFIG} --config.verify.workers=0')
    for entry in result['checkpoints']:
      self.assertEqual(entry['metrics']['arithmetic']['examples'], 6)
      _check_bounds(self, entry['metrics'])
      self.assertEqual(entry['verify'], {'errors': 0, 'timeouts': 0,
                                         'printed': 0, 'workers_replaced': 0})
    lines = stdout.splitlines()
    self.assertEqual(lines[0].split(),
                     ['checkpoint', 'dataset', 'examples', 'pass@1',
                      'mean@3', 'pass@3'])
    rows = [line.split()[:2] for line in lines[1:-1]]
    self.assertIn([tag, 'arithmetic'], rows)
    self.assertIn(['init', 'arithmetic'], rows)
    # One row per checkpoint x dataset and subset ('all' is the dataset).
    subsets = [g for g in result['checkpoints'][0]['metrics'] if '/' in g]
    self.assertLen(rows, 2 * (1 + len(subsets)))
    self.assertEqual(lines[-1], f'wrote {path}')

  def test_verifier_failures_in_the_json_and_under_the_table(self):
    # They were scored 0, lowering pass@1 and mean@k, and only a warning
    # logged once said so.
    path = os.path.join(self.create_tempdir().full_path, 'eval.json')
    with mock.patch.object(decoder, 'init_params', fixtures.fast_init_params):
      code, stdout, stderr = _main(
          f'--config={CONFIG}', '--checkpoint=init', '--k=2',
          '--temperature=1', '--limit=3', '--batch=4',
          '--config.data.datasets[0].verifier=fails_by_id',
          '--config.verify.workers=0', '--config.verify.timeout_s=0.2',
          f'--json={path}', '--quiet')
    self.assertEqual(code, 0, stderr)
    with open(path) as f:
      (entry,) = json.load(f)['checkpoints']
    # arithmetic/258 raises on its 2 completions, arithmetic/260 times out.
    self.assertEqual(entry['verify'], {'errors': 2, 'timeouts': 2,
                                       'printed': 0, 'workers_replaced': 0})
    self.assertLessEqual(entry['metrics']['all']['mean@k'], 1 / 3)
    lines = stdout.splitlines()
    self.assertEqual(lines[-2:], [
        'init: verifier errors / timeouts 2 / 2 (scored 0), workers '
        'replaced / calls that printed 0 / 0', f'wrote {path}'])

  def test_a_damaged_checkpoint_keeps_the_others_results(self):
    # The error came out alone: the results of the checkpoints evaluated
    # before it were thrown away, table and JSON.
    workdir = fixtures.run_workdir()
    damaged = os.path.join(self.create_tempdir().full_path, 'damaged')
    shutil.copytree(workdir, damaged)
    last = max(checkpoint_lib.saved_steps(os.path.join(damaged,
                                                       'checkpoints')))
    shutil.rmtree(os.path.join(damaged, 'checkpoints', str(last), 'state'))
    path = os.path.join(self.create_tempdir().full_path, 'eval.json')
    code, stdout, stderr = _main(
        f'--config={CONFIG}', f'--checkpoint={workdir}@0',
        f'--checkpoint={damaged}', '--k=1', '--limit=2', '--batch=2',
        '--config.verify.workers=0', f'--json={path}', '--quiet')
    self.assertEqual(code, 1)
    self.assertRegex(stderr, f'^jaxgrpo-eval: error: .*{damaged}.*: cannot '
                     "read its params \(its 'state' item is missing\)")
    self.assertLen(stderr.splitlines(), 1)
    lines = stdout.splitlines()
    # k = 1: no second pass@1 column (pass@k is pass@1).
    self.assertEqual(lines[0].split(),
                     ['checkpoint', 'dataset', 'examples', 'pass@1', 'mean@1'])
    self.assertEqual(lines[1].split()[:3],
                     [f'{os.path.basename(workdir)}-step0', 'arithmetic', '2'])
    self.assertEqual(lines[-1], f'wrote {path}')
    self.assertLen(lines, 4)  # the header, the dataset and its subset
    with open(path) as f:
      good, bad = json.load(f)['checkpoints']
    self.assertEqual(good['metrics']['arithmetic']['examples'], 2)
    self.assertEqual((bad['spec'], sorted(bad)),
                     (damaged, ['error', 'name', 'spec', 'tag']))

  def test_api_arguments_of_the_wrong_type_are_named(self):
    # A str of specs or datasets was split into its characters ('/' is
    # neither a run workdir ...), and k=2.5 a TypeError deep inside.
    cfg = config_lib.from_config_dict(demo.get_config('runlocal'))
    for kwargs, message in (
        (dict(specs='init'), "^specs='init': give a list \\(\\['init'\\]\\)"),
        (dict(specs=['init'], datasets='arithmetic'),
         "^datasets='arithmetic': give a list"),
        (dict(specs=['init'], k=2.5), '^--k=2.5: must be an int >= 1'),
        (dict(specs=['init'], batch=True), '^--batch=True: must be an int')):
      with self.assertRaisesRegex(errors.ConfigError, message):
        evaluate_cli.evaluate_checkpoints(cfg, **kwargs)

  def test_runs_of_one_folder_name_get_distinct_rows(self):
    workdir = fixtures.run_workdir()
    other = os.path.join(self.create_tempdir().full_path,
                         os.path.basename(workdir))
    shutil.copytree(workdir, other)
    code, stdout, stderr = _main(
        f'--config={CONFIG}', f'--checkpoint={workdir}@0',
        f'--checkpoint={other}@0', '--k=2', '--limit=2', '--batch=2',
        '--config.verify.workers=0', '--quiet')
    self.assertEqual(code, 0, stderr)
    tag = f'{os.path.basename(workdir)}-step0'
    rows = {tuple(line.split()[:3]) for line in stdout.splitlines()[1:]}
    self.assertIn((tag, '#1', 'arithmetic'), rows)
    self.assertIn((tag, '#2', 'arithmetic'), rows)

  def test_table_lines_up_with_wide_and_combining_names(self):
    # A CJK glyph takes two terminal columns, a combining accent none:
    # padded by len() the columns after such a name were shifted.
    m = {'examples': 12, 'pass@1': 0.5, 'mean@k': 0.25, 'pass@k': 1.0}
    result = {'k': 4, 'checkpoints': [
        {'tag': '実験-step3', 'metrics': {
            'all': m, '数学': m, '数学/難しい': m, 'cafe\u0301': m}},
        {'tag': 'init', 'metrics': {'all': m, 'arithmetic': m}}]}
    lines = evaluate_cli.format_table(result)
    self.assertLen(lines, 6)  # the header, 4 + 1 rows (all: 2 datasets)
    # Every line ends at the same column (the numbers are right-aligned),
    # and the dataset column starts at one.
    self.assertLen({console.width(line) for line in lines}, 1, lines)
    self.assertEqual({console.width(line[:line.index(name)]) for line, name in
                      zip(lines[1:], ('all', '数学', '数学/', 'cafe', 'arith'))},
                     {console.width('実験-step3') + 2})

  def test_mistakes_end_with_one_line(self):
    missing = os.path.join(self.create_tempdir().full_path, 'nope')
    base = (f'--config={CONFIG}', '--quiet')
    # A run's workdir: --json over its metrics.jsonl replaced the run's
    # history with the table, and one in its checkpoints was deleted by
    # their rotation.
    run = self.create_tempdir().full_path
    os.makedirs(os.path.join(run, 'checkpoints', '3'))
    with open(os.path.join(run, 'metrics.jsonl'), 'w') as f:
      f.write('{"step": 0}\n')
    cases = (
        ((*base, f'--checkpoint={missing}'), 2, 'does not exist'),
        ((*base, f'--checkpoint={missing}@3'), 2, 'not a run workdir'),
        ((*base, '--checkpoint=init', '--datasets=nope'), 2,
         "--datasets: 'nope' is not a dataset of the config"),
        ((*base, '--checkpoint=init', '--config.rollout.gruop_size=3'), 2,
         'gruop_size'),
        ((*base, '--checkpoint=init', '--k=0'), 2, '--k=0: must be an int >= 1'),
        ((*base, '--checkpoint=init', '--split=test'), 2, 'invalid choice'),
        ((*base, '--checkpoint=init', '--temperature=-1'), 2,
         '--temperature=-1.0'),
        # It sampled uniformly over the vocabulary.
        ((*base, '--checkpoint=init', '--temperature=inf'), 2,
         '--temperature=inf: must be 0 or >= 1e-06, finite'),
        # Its logits overflow: a traceback after the model loaded.
        ((*base, '--checkpoint=init', '--temperature=1e-20'), 2,
         '--temperature=1e-20: must be 0 or >= 1e-06'),
        ((*base, '--checkpoint=init', '--bogus'), 2, 'unrecognized'),
        (base, 2, '--checkpoint'),
        (('--checkpoint=init', '--config=nope.py'), 2, 'is not a file'),
        # Checked before any model loads.
        ((*base, '--checkpoint=init', f'--json={os.path.dirname(missing)}'),
         2, 'is a folder; name a file'),
        ((*base, '--checkpoint=init', f'--json={run}/metrics.jsonl'), 2,
         f"it is the run's own metrics.jsonl in {run}"),
        ((*base, '--checkpoint=init', f'--json={run}/.lock'), 2,
         "it is the run's own .lock"),
        ((*base, '--checkpoint=init', f'--json={run}/checkpoints/3/r.json'),
         2, f'it is inside the checkpoints of the run in {run}'),
    )
    for argv, want, pattern in cases:
      with self.subTest(argv=argv):
        code, stdout, stderr = _main(*argv)
        self.assertEqual(code, want, stderr)
        self.assertEqual(stdout, '')
        lines = [line for line in stderr.splitlines() if line.strip()]
        self.assertLen(lines, 1, stderr)
        self.assertStartsWith(lines[0], 'jaxgrpo-eval: error: ')
        self.assertIn(pattern, lines[0])

  def test_json_under_the_home_folder(self):
    # '--json=~/r.json' (bash leaves a ~ after '=' alone) was written to
    # ./~/r.json, and said `wrote ~/r.json`.
    home = self.create_tempdir().full_path
    with mock.patch.dict(os.environ, {'HOME': home}):
      self.assertEqual(common.out_file('--json', '~/evals/r.json'),
                       os.path.join(home, 'evals', 'r.json'))
    self.assertTrue(os.path.isdir(os.path.join(home, 'evals')))
    # A metrics.jsonl of a folder that holds no run is the user's to name.
    self.assertEqual(common.out_file('--json', f'{home}/metrics.jsonl'),
                     f'{home}/metrics.jsonl')

  def test_python_dash_m_help(self):
    proc = subprocess.run(
        [sys.executable, '-m', 'jaxgrpo.cli.evaluate', '--help'], cwd=REPO,
        capture_output=True, text=True, timeout=60)
    self.assertEqual(proc.returncode, 0, proc.stderr)
    self.assertIn('usage: jaxgrpo-eval', proc.stdout)
    self.assertIn('--checkpoint', proc.stdout)


if __name__ == '__main__':
  absltest.main()
