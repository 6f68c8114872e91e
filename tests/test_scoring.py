"""Tests for scoring generated rows (one process owns every row here)."""

from absl.testing import absltest
import jax.numpy as jnp
import numpy as np

from jaxgrpo import scoring
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.example import Example
from jaxgrpo.verifiers import base
from jaxgrpo.verifiers import pool as verifier_pool


def _raise_on_9(completion, example):
  if completion.startswith('9'):
    raise ValueError('no nines')
  return float(completion == example.answer)


class ScoreRowsTest(absltest.TestCase):

  def test_device_rows_host_copy_and_host_rows_agree(self):
    tok = tokenizer_lib.make_tokenizer('char')
    texts = ['12', '7', '12', '99', '3', '3']  # the last two are padding
    width = max(len(tok.encode(t)) for t in texts)
    host = np.array([tok.encode(t) + [tok.pad_id] * (width - len(tok.encode(t)))
                     for t in texts], np.int32)
    examples = [Example(id=str(i), prompt='p', answer=a, dataset='d')
                for i, a in enumerate(['12', '8', '12', '1'])]
    with verifier_pool.Scorer({'d': _raise_on_9}) as scorer:
      results = [
          scoring.score_rows(scorer, tok.decode, jnp.asarray(host), examples),
          scoring.score_rows(scorer, tok.decode, jnp.asarray(host), examples,
                             on_host=host),
          scoring.score_rows(scorer, tok.decode, host, examples),
      ]
    for rewards, stats in results:
      np.testing.assert_array_equal(rewards, [1.0, 0.0, 1.0, 0.0])
      self.assertEqual(stats, base.ScoreStats(errors=1))

  def test_failed_rows_are_marked(self):
    # Stratification names the examples whose every call failed: a count
    # alone could not say which.
    tok = tokenizer_lib.make_tokenizer('char')
    rows = np.array([tok.encode(t) for t in ['12', '99', '77']], np.int32)
    examples = [Example(id=str(i), prompt='p', answer='12', dataset='d')
                for i in range(3)]
    failed = np.ones(3, bool)
    with verifier_pool.Scorer({'d': _raise_on_9}) as scorer:
      for tokens in (rows, jnp.asarray(rows)):
        rewards, stats = scoring.score_rows(scorer, tok.decode, tokens,
                                            examples, failed=failed)
        np.testing.assert_array_equal(rewards, [1.0, 0.0, 0.0])
        np.testing.assert_array_equal(failed, [False, True, False])
        self.assertEqual(stats, base.ScoreStats(errors=1))

  def test_calls_that_printed_are_counted(self):
    # Counted by the scorer; score_rows passed on the failures alone.
    def prints_on_7(completion, example):
      if completion == '7':
        print('seven')
      return _raise_on_9(completion, example)
    tok = tokenizer_lib.make_tokenizer('char')
    rows = np.array([tok.encode(t) for t in ['7', '9', '7']], np.int32)
    examples = [Example(id=str(i), prompt='p', answer='7', dataset='d')
                for i in range(3)]
    with verifier_pool.Scorer({'d': prints_on_7}) as scorer:
      rewards, stats = scoring.score_rows(scorer, tok.decode, rows, examples)
    np.testing.assert_array_equal(rewards, [1.0, 0.0, 1.0])
    self.assertEqual(stats, base.ScoreStats(errors=1, printed=2))


if __name__ == '__main__':
  absltest.main()
