"""Tests for generate-and-score, and that evaluation and rollouts share it."""

from unittest import mock

from absl.testing import absltest
import jax
import numpy as np

from jaxgrpo import evaluate
from jaxgrpo import verifiers
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.example import Example
from jaxgrpo.generate import continuous
from jaxgrpo.generate.generator import Completions
from jaxgrpo.generate.generator import Generator
from jaxgrpo.generate.sampling import Sampling
from jaxgrpo.model import config
from jaxgrpo.reporting import console as console_lib
from jaxgrpo.rl import scored as scored_lib
from jaxgrpo.verifiers import pool as verifier_pool
from tests import scripted
from tests import tiny


class _EchoGenerator:
  """Answers every prompt 'a+b=' with K completions a + b + k, k < K: the
  first right, the others wrong. Keeps the prompt rows of each call."""

  def __init__(self, tokenizer, k: int):
    self.tok, self.num_samples = tokenizer, k
    self.calls = []

  def generate(self, params, tokens, mask, rng):
    del params, rng
    self.calls.append((np.asarray(tokens), np.asarray(mask)))
    rows = []
    for row in tokens:
      total = sum(map(int, self.tok.decode(row).rstrip('=').split('+')))
      for k in range(self.num_samples):
        rows.append(self.tok.encode(str(total + k))
                    + [self.tok.eos_id])
    width = max(map(len, rows))
    out = np.full((len(rows), width), self.tok.pad_id, np.int32)
    m = np.zeros((len(rows), width), bool)
    for i, r in enumerate(rows):
      out[i, :len(r)], m[i, :len(r)] = r, True
    return Completions(
        tokens=out, logps=np.where(m, -1.0, 0.0).astype(np.float32), mask=m,
        lengths=m.sum(1).astype(np.int32))


def _examples(prompts):
  """Examples 'a+b=' whose answer is the sum."""
  return [Example(id=f'd/{i}', prompt=p,
                  answer=str(sum(map(int, p[:-1].split('+')))), dataset='d')
          for i, p in enumerate(prompts)]


class GenerateAndScoreTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tok = tokenizer_lib.CharTokenizer()
    self.gen = _EchoGenerator(self.tok, k=3)
    self.scorer = verifier_pool.Scorer(verifiers.get('exact_match'))

  def test_pads_to_rows_and_scores_only_the_examples(self):
    examples = _examples(['1+2=', '30+4='])
    s = scored_lib.generate_and_score(
        self.gen, None, self.tok, examples, self.scorer, jax.random.key(0),
        max_prompt_len=6, rows=5)
    tokens, _ = self.gen.calls[0]
    # Five rows, the examples repeated to fill them.
    self.assertEqual([self.tok.decode(r) for r in tokens],
                     ['1+2=', '30+4=', '1+2=', '30+4=', '1+2='])
    np.testing.assert_array_equal(s.prompt_tokens, tokens)
    # The first of each example's 3 completions is right.
    np.testing.assert_array_equal(s.rewards, [[1, 0, 0], [1, 0, 0]])
    self.assertIsNone(s.completions)
    self.assertFalse(s.truncated.any())

  def test_gather_keeps_the_completions(self):
    examples = _examples(['1+2=', '10+4='])
    s = scored_lib.generate_and_score(
        self.gen, None, self.tok, examples, self.scorer, jax.random.key(0),
        max_prompt_len=6, rows=4, gather=True)
    self.assertLen(s.completions.tokens, 4 * 3)
    self.assertEqual(self.tok.decode(s.completions.tokens[3]), '14')
    # Tokens of the real rows only: '3', '4', '5' and '14', '15', '16',
    # each with its stop token.
    self.assertEqual(s.tokens_generated(), 3 * 2 + 3 * 3)

  def test_truncates_or_names_a_long_prompt(self):
    examples = _examples(['1+2=', '1000+2000='])
    s = scored_lib.generate_and_score(
        self.gen, None, self.tok, examples, self.scorer, jax.random.key(0),
        max_prompt_len=6, truncate=True)
    np.testing.assert_array_equal(s.truncated, [False, True])
    with self.assertRaisesRegex(tokenizer_lib.PromptTooLongError,
                                'example d/1'):
      scored_lib.generate_and_score(
          self.gen, None, self.tok, examples, self.scorer, jax.random.key(0),
          max_prompt_len=6)

  def _continuous(self):
    """A continuous engine of 4 slots on a tiny random model, G = 3."""
    graphdef, params = tiny.random_model(self.tok.vocab_size)
    return continuous.ContinuousGenerator(generator=Generator(
        graphdef=graphdef,
        model_cfg=config.ModelConfig.tiny(vocab_size=self.tok.vocab_size),
        sampling=Sampling(temperature=1.0), max_new_tokens=8,
        num_samples=3, stop_tokens=(self.tok.eos_id,),
        pad_id=self.tok.pad_id), slots=4), params

  def test_an_example_offered_twice_is_sampled_twice(self):
    # A dataset smaller than the round offers an example twice; the
    # continuous engine keys samples by example, so the second offer must
    # draw its own samples, not repeat the first's (a duplicate group).
    engine, params = self._continuous()
    one, other = _examples(['1+2=', '3+4='])
    run = lambda exs: scored_lib.generate_and_score(
        engine, params, self.tok, exs, self.scorer, jax.random.key(0),
        max_prompt_len=6, rows=4, gather=True).completions.tokens
    twice = run([one, other, one])
    self.assertFalse(np.array_equal(twice[:3], twice[6:9]))
    # The first offer draws as it does alone.
    np.testing.assert_array_equal(run([one, other])[:6], twice[:6])

  def test_the_continuous_engine_decodes_no_padding_row(self):
    # A round short of examples is padded to its size; the static batch
    # keeps its shape with the padding, but slots would decode it in full.
    engine, params = self._continuous()
    examples = _examples(['1+2=', '3+4=', '5+6='])
    run = lambda rows: scored_lib.generate_and_score(
        engine, params, self.tok, examples, self.scorer, jax.random.key(0),
        max_prompt_len=6, rows=rows, gather=True)
    cls = continuous.ContinuousGenerator
    with mock.patch.object(cls, 'generate_with_stats', autospec=True,
                           side_effect=cls.generate_with_stats) as spy:
      short = run(16)
    # Three examples of a round of 16: 4 rows (a power of two) decoded.
    self.assertEqual(spy.call_args.args[2].shape, (4, 6))  # the prompts
    full = run(4)
    np.testing.assert_array_equal(short.completions.tokens,
                                  full.completions.tokens)
    np.testing.assert_array_equal(short.rewards, full.rewards)
    self.assertLen(short.prompt_tokens, 16)

  def test_needs_an_example(self):
    with self.assertRaisesRegex(ValueError, 'at least one example'):
      scored_lib.generate_and_score(
          self.gen, None, self.tok, [], self.scorer, jax.random.key(0),
          max_prompt_len=6)


class SharedTest(absltest.TestCase):
  """Evaluation and rollout rounds both go through generate_and_score."""

  def test_evaluation_chunks_through_it(self):
    tok = tokenizer_lib.CharTokenizer()
    gen = _EchoGenerator(tok, k=2)
    examples = _examples(['1+2=', '2+2=', '3+2='])
    with mock.patch.object(scored_lib, 'generate_and_score',
                           wraps=scored_lib.generate_and_score) as spy:
      rewards = evaluate.sample_rewards(
          gen, None, tok, examples,
          verifier_pool.Scorer(verifiers.get('exact_match')),
          jax.random.key(0), max_prompt_len=6, chunk_size=2)
    self.assertEqual(spy.call_count, 2)
    self.assertEqual([c.kwargs['rows'] for c in spy.call_args_list], [2, 2])
    np.testing.assert_array_equal(rewards, [[1, 0]] * 3)
    # The last chunk of one example was padded to the chunk size.
    self.assertEqual([len(tokens) for tokens, _ in gen.calls], [2, 2])

  def test_training_evaluation_calls_pad_to_its_examples_at_most(self):
    # 3 held-out examples were one call of 64 prompt rows, 61 of them
    # padding, and compiled another program than jaxgrpo-eval's.
    tok = tokenizer_lib.CharTokenizer()
    for count, rows in ((3, [3]), (70, [64, 64])):
      gen = _EchoGenerator(tok, k=1)
      gen.sampling = Sampling(temperature=1.0)
      evaluator = evaluate.Evaluator(
          generator=gen, tokenizer=tok,
          examples=_examples([f'{i % 9}+1=' for i in range(count)]),
          scorer=verifier_pool.Scorer(verifiers.get('exact_match')),
          rng=jax.random.key(0), max_prompt_len=6, truncate=False,
          console=console_lib.Console(enabled=False))
      metrics = evaluator(None, step=0)
      self.assertEqual([len(tokens) for tokens, _ in gen.calls], rows)
      self.assertEqual(metrics['eval/accuracy'], 1.0)

  def test_rollout_rounds_go_through_it(self):
    ro, _, gen = scripted.make_rollout([('d', 1.0, [0.5] * 6)], batch_size=2,
                                       round_size=3, max_rounds=3)
    with mock.patch.object(scored_lib, 'generate_and_score',
                           wraps=scored_lib.generate_and_score) as spy:
      res = ro.collect(None, jax.random.key(0))
    self.assertEqual(spy.call_count, res.stats.rounds)
    self.assertEqual(spy.call_count, gen.calls)
    for call in spy.call_args_list:
      self.assertTrue(call.kwargs['gather'])
      self.assertEqual(call.kwargs['rows'], 3)


if __name__ == '__main__':
  absltest.main()
