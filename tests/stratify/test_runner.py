"""The runner's core with a scripted model: rates, resume and shards."""

import json
import os
import signal
import subprocess
import sys
import time

from absl.testing import absltest
import numpy as np

from jaxgrpo import errors
from jaxgrpo.data import curriculum
from jaxgrpo.stratify import passrates
from jaxgrpo.stratify import report
from jaxgrpo.stratify import runner
from jaxgrpo.verifiers import pool as verifier_pool
from tests import flaky_verifiers
from tests.stratify import fixtures

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _table(out_dir):
  rates = passrates.read(out_dir)['a']
  return rates.ids, rates.trials, rates.passes, rates.mean_reward


class PassRateTest(absltest.TestCase):

  def test_rates_match_the_scripted_success_probabilities(self):
    out = self.create_tempdir().full_path
    k = 64
    counts, _ = fixtures.stratify_scripted(out, n=40, k=k, chunk=16)
    self.assertEqual((counts.done, counts.resumed), (40, 0))
    _, examples, rates = fixtures.scripted_dataset(40)
    got = passrates.read(out)['a']
    self.assertEqual(got.ids, sorted(ex.id for ex in examples))
    np.testing.assert_array_equal(got.trials, np.full(40, k))
    by_id = {ex.id: rates[ex.prompt] for ex in examples}
    for i, rate in zip(got.ids, got.pass_rate):
      p = by_id[i]
      if p in (0.0, 1.0):
        self.assertEqual(rate, p, i)
      else:
        self.assertLess(abs(rate - p), 4 * np.sqrt(p * (1 - p) / k), i)
    # exact_match rewards are 0 or 1: the mean reward is the pass rate.
    np.testing.assert_allclose(got.mean_reward, got.pass_rate, atol=1e-6)

  def test_threshold_decides_what_passes(self):
    out = self.create_tempdir().full_path
    tok, examples, _ = fixtures.scripted_dataset(4)
    gen = fixtures.KeyedGenerator(
        tok, examples, {ex.prompt: 1.0 for ex in examples}, group_size=2)
    # A scorer that gives every completion 0.5.
    scorer = verifier_pool.Scorer(lambda text, ex: 0.5)
    for threshold, passes in ((0.5, 2), (0.75, 0)):
      runner.stratify(
          out, tag=f't{passes}', info={'policy': 'p', 'sampling': {}},
          generator=gen, params=None, tokenizer=tok, scorer=scorer,
          datasets=[(0, 'a', examples)], progress=False,
          settings=runner.Settings(seed=0, threshold=threshold,
                                   max_prompt_len=8, chunk=4))
      rates = passrates.read(out, checkpoints=[f't{passes}'])['a']
      np.testing.assert_array_equal(rates.passes, np.full(4, passes))
      np.testing.assert_allclose(rates.mean_reward, 0.5)


  def test_a_small_dataset_is_one_call_of_its_size(self):
    # 6 examples were one call of --batch = 64 prompt rows, 58 of them
    # padding.
    tok, examples, _ = fixtures.scripted_dataset(6)
    gen = fixtures.KeyedGenerator(
        tok, examples, {ex.prompt: 1.0 for ex in examples}, group_size=2)
    rows = []
    generate = gen.generate
    gen.generate = lambda params, tokens, *a: (
        rows.append(len(tokens)), generate(params, tokens, *a))[1]
    runner.stratify(
        self.create_tempdir().full_path, tag='t',
        info={'policy': 'p', 'sampling': {}}, generator=gen, params=None,
        tokenizer=tok, scorer=verifier_pool.Scorer(lambda text, ex: 1.0),
        datasets=[(0, 'a', examples)], progress=False,
        settings=runner.Settings(seed=0, threshold=1.0, max_prompt_len=8))
    self.assertEqual(rows, [6])


class ResumeTest(absltest.TestCase):

  def test_resume_after_a_crash_redoes_and_loses_nothing(self):
    straight = self.create_tempdir('straight').full_path
    fixtures.stratify_scripted(straight, n=40, chunk=8)

    out = self.create_tempdir('resumed').full_path
    with self.assertRaises(fixtures.Crash):
      fixtures.stratify_scripted(out, n=40, chunk=8, crash_after=2)
    first = passrates.read(out)['a'].ids
    self.assertLen(first, 16)  # Two complete chunks, nothing else.
    counts, gen = fixtures.stratify_scripted(out, n=40, chunk=8)
    self.assertEqual((counts.done, counts.resumed), (24, 16))
    self.assertEqual(gen.calls, 3)  # Chunks 2-4 only.
    _, examples, _ = fixtures.scripted_dataset(40)
    prompts = {ex.id: ex.prompt for ex in examples}
    self.assertEmpty(set(gen.prompts_seen) & {prompts[i] for i in first})

    ids, trials, passes, reward = _table(out)
    self.assertEqual(ids, sorted(prompts))  # Every id, once.
    for got, want in zip((trials, passes, reward), _table(straight)[1:]):
      np.testing.assert_array_equal(got, want)

    # A third run finds everything done.
    counts, gen = fixtures.stratify_scripted(out, n=40, chunk=8)
    self.assertEqual((counts.done, counts.resumed, gen.calls), (0, 40, 0))

  def test_killed_process_leaves_only_complete_parts(self):
    out = self.create_tempdir().full_path
    code = ('import sys\nfrom tests.stratify import fixtures\n'
            'fixtures.stratify_scripted(sys.argv[1], chunk=4, delay_s=0.2)\n')
    proc = subprocess.Popen([sys.executable, '-c', code, out], cwd=REPO,
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while (len(passrates.list_parts(out, 'a', 'scripted')) < 2
           and proc.poll() is None and time.monotonic() < deadline):
      time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    self.assertEqual(proc.returncode, -signal.SIGKILL,
                     proc.stderr.read().decode()[-2000:])
    proc.stderr.close()
    parts = passrates.list_parts(out, 'a', 'scripted')
    self.assertBetween(len(parts), 2, 9)
    for path in parts.values():
      self.assertEqual(passrates.part_info(path)['rows'], 4)
    self.assertLen(passrates.read(out)['a'].ids, 4 * len(parts))

    counts, _ = fixtures.stratify_scripted(out, chunk=4)
    self.assertEqual(counts.resumed, 4 * len(parts))
    straight = self.create_tempdir().full_path
    fixtures.stratify_scripted(straight, chunk=4)
    for got, want in zip(_table(out), _table(straight)):
      np.testing.assert_array_equal(got, want)
    tmp = [n for n in os.listdir(passrates.tag_dir(out, 'a', 'scripted'))
           if n.endswith('.tmp')]
    self.assertEmpty(tmp)  # A killed write's tmp file was removed.

  def test_other_settings_in_the_same_out_dir_are_refused(self):
    out = self.create_tempdir().full_path
    fixtures.stratify_scripted(out, n=8, k=4, chunk=4)
    with self.assertRaisesRegex(errors.UserError, 'k=4, this run has 8'):
      fixtures.stratify_scripted(out, n=8, k=8, chunk=4)
    with self.assertRaisesRegex(errors.UserError, 'chunk=4, this run has 2'):
      fixtures.stratify_scripted(out, n=8, k=4, chunk=2)
    with self.assertRaisesRegex(errors.UserError, '--num_shards=2'):
      fixtures.stratify_scripted(out, n=8, k=4, chunk=4, num_shards=2)
    with self.assertRaisesRegex(errors.UserError, 'the dataset changed'):
      fixtures.stratify_scripted(out, n=12, k=4, chunk=4)

  def test_another_verifier_in_the_same_out_dir_is_refused(self):
    # Accepted: a resumed run pooled two verifiers' pass rates in one tag.
    out = self.create_tempdir().full_path
    fixtures.stratify_scripted(out, n=8, k=4, chunk=4, verifier='math')
    with self.assertRaisesRegex(
        errors.UserError, "its parts were written with verifier='math', this "
        "run has {'name': 'format', 'regex': '.'}"):
      fixtures.stratify_scripted(out, n=8, k=4, chunk=4,
                                 verifier={'name': 'format', 'regex': '.'})
    counts, _ = fixtures.stratify_scripted(out, n=8, k=4, chunk=4,
                                           verifier='math')
    self.assertEqual((counts.done, counts.resumed), (0, 8))

  def test_a_smaller_limit_keeps_the_parts_done(self):
    # A part holding more rows than the chunk under the smaller --limit
    # was written again, with fewer: pass rates deleted.
    out = self.create_tempdir().full_path
    fixtures.stratify_scripted(out, n=40, chunk=8)
    counts, gen = fixtures.stratify_scripted(out, n=40, chunk=8, limit=20)
    self.assertEqual((counts.done, counts.resumed, gen.calls), (0, 20, 0))
    self.assertLen(passrates.read(out)['a'].ids, 40)
    # A larger one makes the parts that hold fewer again.
    small = self.create_tempdir().full_path
    fixtures.stratify_scripted(small, n=40, chunk=8, limit=20)
    counts, _ = fixtures.stratify_scripted(small, n=40, chunk=8)
    self.assertEqual((counts.done, counts.resumed), (24, 16))
    self.assertLen(passrates.read(small)['a'].ids, 40)


class ShardTest(absltest.TestCase):

  def test_two_shards_read_back_as_the_whole(self):
    out = self.create_tempdir().full_path
    for shard in (0, 1):
      counts, gen = fixtures.stratify_scripted(out, n=40, chunk=8,
                                               shard=shard, num_shards=2)
      self.assertEqual(counts.done, 20)
      _, examples, _ = fixtures.scripted_dataset(40)
      self.assertEqual(set(gen.prompts_seen),
                       {ex.prompt for ex in examples[shard::2]})
    parts = passrates.list_parts(out, 'a', 'scripted')
    self.assertEqual(sorted(parts), [(s, 2, c) for s in (0, 1)
                                     for c in (0, 1, 2)])
    by_shard = {0: set(), 1: set()}
    for (shard, _, _), path in parts.items():
      by_shard[shard] |= set(_part_ids(path))
    self.assertEmpty(by_shard[0] & by_shard[1])
    self.assertEqual(by_shard[0] | by_shard[1],
                     {ex.id for ex in examples})
    self.assertEqual(passrates.read(out)['a'].ids,
                     sorted(ex.id for ex in examples))
    summary = passrates.write_summary(out)
    # Both shards' verifier calls, none failed (exact_match).
    self.assertEqual(summary['datasets']['a'], {
        'examples': 40, 'done': {'scripted': 40},
        'verify': {'scripted': {'errors': 0, 'timeouts': 0, 'printed': 0,
                                'workers_replaced': 0, 'calls': 40 * 8,
                                'partly_failed': 0, 'all_failed': []}}})

  def test_shard_settings_are_checked(self):
    for kwargs, pattern in ((dict(shard=2, num_shards=2), '--shard=2'),
                            (dict(chunk=0), '--chunk=0'),
                            (dict(limit=0), '--limit=0')):
      with self.assertRaisesRegex(errors.ConfigError, pattern):
        runner.Settings(seed=0, threshold=1.0, max_prompt_len=8, **kwargs)
    # Accepted before: every pass rate 0 (or 1), silently.
    for threshold in (1.5, 0.0, -1.0, float('nan')):
      with self.assertRaisesRegex(errors.ConfigError,
                                  rf'--threshold={threshold}: must be in'):
        runner.Settings(seed=0, threshold=threshold, max_prompt_len=8)

  def test_chunks_of_a_shard(self):
    settings = runner.Settings(seed=0, threshold=1.0, max_prompt_len=8,
                               chunk=2, shard=1, num_shards=3)
    self.assertEqual([list(c) for c in runner.shard_chunks(10, settings)],
                     [[1, 4], [7]])


class VerifierFailuresTest(absltest.TestCase):

  def test_failures_are_counted_and_examples_that_always_failed_named(self):
    # A verifier that raised or timed out scored 0 and nothing said so: the
    # examples it always failed on were filed as hard, at pass rate 0.
    out = self.create_tempdir().full_path
    tok, examples, rates = fixtures.scripted_dataset(12)  # a/0 ... a/11
    gen = fixtures.KeyedGenerator(tok, examples, rates, group_size=2)
    # fails_by_id raises on a/8 and times out on a/0 and a/10; every other
    # completion (digits) scores 1.
    with verifier_pool.Scorer(flaky_verifiers.fails_by_id,
                              timeout_s=0.2) as scorer, \
        self.assertLogs(level='WARNING'):
      counts = runner.stratify(
          out, tag='t', info={'policy': 'p', 'sampling': {}}, generator=gen,
          params=None, tokenizer=tok, scorer=scorer,
          datasets=[(0, 'a', examples)], progress=False,
          settings=runner.Settings(seed=0, threshold=1.0, max_prompt_len=8,
                                   chunk=4))
    self.assertEqual((counts.calls, counts.stats.errors,
                      counts.stats.timeouts), (24, 2, 4))
    self.assertEqual(counts.all_failed,
                     [('t', 'a', 'a/0'), ('t', 'a', 'a/8'), ('t', 'a', 'a/10')])
    lines = runner.failure_lines(counts, out)
    self.assertLen(lines, 2)
    self.assertEqual(lines[0], 'stratify: verifier errors 2, timeouts 4 of '
                     '24 calls (scored 0), calls that printed 0, workers '
                     'replaced 0')
    self.assertRegex(lines[1], (
        r'^stratify: 3 examples had every verifier call fail, so their pass '
        r'rate of 0 would measure the verifier, not the model: they get no '
        r'pass rate from it \(jaxgrpo-stratify report and curriculum\.strata '
        r'leave them unrated, not too_hard\): a/0 \(t, a\), a/8 \(t, a\), '
        r'a/10 \(t, a\) \(all '
        r'of them in .*summary\.json: datasets\.<dataset>\.verify\.<tag>\.'
        r'all_failed\)'))
    # summary.json (`run` writes it) sums the parts' counts per tag.
    summary = passrates.write_summary(out)
    self.assertEqual(summary['datasets']['a']['verify'], {'t': {
        'errors': 2, 'timeouts': 4, 'printed': 0, 'workers_replaced': 0,
        'calls': 24, 'partly_failed': 0, 'all_failed': ['a/0', 'a/10', 'a/8']}})
    shown = []
    report.report(out, plot=False, log=shown.append)
    # They counted in too_hard, at pass rate 0: now they have none.
    self.assertTrue(any(line.startswith(
        'checkpoint t: 3 examples of dataset a had every verifier call fail: '
        'their pass rate of 0 would measure the verifier, not the model, so '
        'they have none from this checkpoint and count in no stratum of its '
        'row (a/0, a/10, a/8; all of them in ') and line.endswith(
            'summary.json); fix the verifier and measure them again under '
            'another --out') for line in shown), shown)
    self.assertIn('dataset a (9 examples with pass rates)', shown)
    with open(os.path.join(out, report.STRATA_JSON)) as f:
      self.assertEqual(json.load(f)['datasets']['a']['pooled']['counts'], {
          'too_hard': 0, '0-0.25': 0, '0.25-0.5': 0, '0.5-0.75': 0,
          '0.75-1': 0, 'too_easy': 9})
    with open(os.path.join(out, passrates.SUMMARY)) as f:
      self.assertEqual(json.load(f)['datasets']['a']['verify']['t']
                       ['all_failed'], ['a/0', 'a/10', 'a/8'])
    # A verifier that never fails: no line, and zero counts written.
    clean = self.create_tempdir().full_path
    counts = runner.stratify(
        clean, tag='t', info={'policy': 'p', 'sampling': {}}, generator=gen,
        params=None, tokenizer=tok,
        scorer=verifier_pool.Scorer(flaky_verifiers.starts_with_digit),
        datasets=[(0, 'a', examples)], progress=False,
        settings=runner.Settings(seed=0, threshold=1.0, max_prompt_len=8,
                                 chunk=4))
    self.assertEqual(runner.failure_lines(counts, clean), [])
    self.assertEqual(passrates.write_summary(clean)['datasets']['a']['verify'],
                     {'t': {'errors': 0, 'timeouts': 0, 'printed': 0,
                            'workers_replaced': 0, 'calls': 24,
                            'partly_failed': 0, 'all_failed': []}})

  def test_calls_that_failed_leave_the_others_to_rate_the_example(self):
    # The calls of a/1, a/3 and a/11 that a verifier bug failed scored 0
    # and counted in their pass rates: 0.25 for an example the model
    # answered right every time the verifier answered.
    out = self.create_tempdir().full_path
    with self.assertLogs(level='WARNING'):
      counts = self._stratify(out, 't', flaky_verifiers.fails_on_wrong,
                              group_size=8, counts=True)
    rows = {}
    for path in passrates.list_parts(out, 'a', 't').values():
      table = passrates._arrow()[1].read_table(path).to_pydict()
      rows.update(zip(table['id'], zip(table['k'], table['passes'])))
    partly = {i: kp for i, kp in rows.items() if kp[0] < 8}
    self.assertTrue(partly)  # the scripted answers are wrong often enough
    self.assertTrue(set(partly) <= {'a/1', 'a/3', 'a/11'}, partly)
    # Every call the verifier answered passed: so does every row.
    self.assertEqual({i: p for i, (k, p) in rows.items()},
                     {i: k for i, (k, p) in rows.items()})
    self.assertEqual(counts.partly_failed, len(partly))
    self.assertEqual(counts.stats.errors, sum(8 - k for k, _ in
                                              partly.values()))
    self.assertIn(f'stratify: {len(partly)} examples had some verifier calls '
                  'fail: their pass rates count only the calls the verifier '
                  'answered', runner.failure_lines(counts, out))
    summary = passrates.write_summary(out)
    self.assertEqual(summary['datasets']['a']['verify']['t']['partly_failed'],
                     len(partly))
    rates = passrates.read(out)['a']
    self.assertEqual(rates.pass_rate.tolist(), [1.0] * 12)
    self.assertEqual(sorted(rates.trials.tolist()),
                     sorted(k for k, _ in rows.values()))

  def test_scored_rows(self):
    rewards = np.array([[1.0, 0.0, 0.5, 1.0], [0.0, 0.0, 0.0, 0.0]])
    failed = np.array([[False, True, False, False], [True] * 4])
    k, passes, mean = runner.scored_rows(rewards, failed, 1.0)
    self.assertEqual(k.tolist(), [3, 4])  # all failed: K, left out by id
    self.assertEqual(passes.tolist(), [2, 0])
    np.testing.assert_allclose(mean, [2.5 / 3, 0.0])

  def _stratify(self, out, tag, verifier, group_size=2, counts=False,
                **scorer_kwargs):
    """Measures a/0 ... a/11 under `verifier` into `out`, as `tag`; every
    completion starts with a digit, so a call that works scores 1. Returns
    the examples, or with `counts` the run's Counts."""
    tok, examples, rates = fixtures.scripted_dataset(12)
    gen = fixtures.KeyedGenerator(tok, examples, rates, group_size=group_size)
    with verifier_pool.Scorer(verifier, **scorer_kwargs) as scorer:
      done = runner.stratify(
          out, tag=tag, info={'policy': 'p', 'sampling': {}}, generator=gen,
          params=None, tokenizer=tok, scorer=scorer,
          datasets=[(0, 'a', examples)], progress=False,
          settings=runner.Settings(seed=0, threshold=1.0, max_prompt_len=8,
                                   chunk=4))
    return done if counts else examples

  def test_a_curriculum_leaves_examples_that_always_failed_unrated(self):
    # curriculum.strata filed a/0, a/8 and a/10 too_hard, their prior 0,
    # without a word: pass rates of 0 that measured the verifier.
    out = self.create_tempdir().full_path
    with self.assertLogs(level='WARNING'):
      examples = self._stratify(out, 't', flaky_verifiers.fails_by_id,
                                timeout_s=0.2)
    failed = ('a/0', 'a/8', 'a/10')
    unrated = {ex.id: 'unrated' if ex.id in failed else 'too_easy'
               for ex in examples}

    def load(path, **kwargs):
      lines = []
      st = curriculum.load(path, {'a': examples}, edges=(0.25, 0.5, 0.75),
                           log=lines.append, **kwargs)['a']
      return {ex.id: st.names[i] for ex, i in zip(examples, st.index)}, (
          dict(zip([ex.id for ex in examples], st.prior.tolist())), lines)

    strata, (prior, lines) = load(out)
    self.assertEqual(strata, unrated)
    self.assertEqual(curriculum.notes(curriculum.load(
        out, {'a': examples}, edges=(0.25, 0.5, 0.75), log=lambda _: None))
                     ['a']['failed'], 3)  # a resume can tell why they moved
    self.assertTrue(all(np.isnan(prior[i]) for i in failed), prior)
    self.assertEqual(lines, [
        f"curriculum: dataset 'a': 3 examples whose every verifier call "
        f'failed in {out} are unrated, not too_hard (a/0, a/8, a/10): fix '
        'the verifier and measure them again (jaxgrpo-stratify run into '
        'another --out)',
        "curriculum: dataset 'a' strata too_easy 9, unrated 3"])
    # Another checkpoint, whose verifier worked, rates them: they keep that.
    self._stratify(out, 'u', flaky_verifiers.starts_with_digit)
    strata, (prior, lines) = load(out)
    self.assertEqual(set(strata.values()), {'too_easy'})
    self.assertEqual(set(prior.values()), {1.0})
    self.assertEqual(lines, ["curriculum: dataset 'a' strata too_easy 12"])
    self.assertEqual(load(out, checkpoints=('t',))[0], unrated)
    # Parts written before the verifier counts (no `verify`, nor in
    # summary.json) read as they did: pass rate 0, too_hard.
    old = self.create_tempdir().full_path
    for path in passrates.list_parts(out, 'a', 't').values():
      _rewrite_without_verify(path, old)
    passrates.write_summary(old)
    strata, (prior, lines) = load(old)
    self.assertEqual(strata, {i: 'too_hard' if i in failed else s
                              for i, s in unrated.items()})
    self.assertEqual([prior[i] for i in failed], [0.0] * 3)
    self.assertEqual(lines, [
        "curriculum: dataset 'a' strata too_hard 3, too_easy 9"])


class TagTest(absltest.TestCase):

  def test_tags_keep_letters_of_any_script(self):
    # Both were '_-step3': one row twice in jaxgrpo-eval's table, and
    # jaxgrpo-stratify refused the pair.
    cases = (
        ('/runs/数学@3', '数学-step3'),
        ('/runs/模型@3', '模型-step3'),
        ('/runs/café@1', 'café-step1'),
        ('/runs/cafe\u0301@1', 'cafe\u0301-step1'),
        ('/runs/हिन्दी@2', 'हिन्दी-step2'),
        ('/runs/warm@100', 'warm-step100'),
        ('/runs/my run: 2@4', 'my_run_2-step4'),
        ('/runs/a_b+c.d@0', 'a_b+c.d-step0'),
        ('/runs/🙂@5', '_-step5'),
        ('/runs/.hidden@1', 'hidden-step1'),
        ('/models/qwen.gguf', 'qwen'),
        ('/models/Qwen2.5-0.5B/', 'Qwen2.5-0.5B'),
        ('init', 'init'),
    )
    for name, tag in cases:
      with self.subTest(name=name):
        self.assertEqual(runner.tag_of(name), tag)


def _rewrite_without_verify(path, out_dir):
  """Copies the part at `path` into `out_dir` (same dataset, tag and name)
  without its metadata's `verify`, as jaxgrpo-stratify wrote it before."""
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  table = pq.read_table(path)
  info = json.loads(table.schema.metadata[passrates.METADATA_KEY])
  del info['verify']
  rel = os.path.relpath(path, os.path.dirname(os.path.dirname(
      os.path.dirname(os.path.dirname(path)))))
  os.makedirs(os.path.dirname(os.path.join(out_dir, rel)), exist_ok=True)
  pq.write_table(table.replace_schema_metadata(
      {passrates.METADATA_KEY: json.dumps(info)}), os.path.join(out_dir, rel))


def _part_ids(path):
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  return pq.read_table(path, columns=['id'])['id'].to_pylist()


if __name__ == '__main__':
  absltest.main()
