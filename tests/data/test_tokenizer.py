"""Tests for the character tokenizer and prompt batching."""

from absl.testing import absltest
import numpy as np

from jaxgrpo.data import tokenizer as tokenizer_lib


class TokenizerTest(absltest.TestCase):

  def test_round_trip_and_special_ids(self):
    tok = tokenizer_lib.CharTokenizer()
    ids = tok.encode('12+345=')
    self.assertTrue(all(i >= 3 for i in ids))
    self.assertEqual(tok.decode(ids), '12+345=')
    # Decoding stops at EOS and drops PAD/BOS.
    self.assertEqual(tok.decode([tok.bos_id] + ids + [tok.eos_id] + ids), '12+345=')
    self.assertEqual(tok.decode([tok.pad_id, *tok.encode('7')]), '7')
    self.assertEqual(tok.vocab_size % 8, 0)

  def test_unknown_character_is_named(self):
    with self.assertRaisesRegex(ValueError, "'#'"):
      tokenizer_lib.CharTokenizer().encode('1#2')

  def test_encode_prompts_left_pads(self):
    tok = tokenizer_lib.CharTokenizer()
    tokens, mask = tokenizer_lib.encode_prompts(tok, ['1+2=', '10+20='], 8)
    self.assertEqual(tokens.shape, (2, 8))
    np.testing.assert_array_equal(mask.sum(1), [5, 7])
    self.assertEqual(tokens[0, 3], tok.bos_id)
    self.assertTrue((tokens[0, :3] == tok.pad_id).all())
    self.assertEqual(tok.decode(tokens[1]), '10+20=')

  def test_too_long_prompt_names_the_key(self):
    with self.assertRaisesRegex(tokenizer_lib.PromptTooLongError,
                                'max_prompt_len=4'):
      tokenizer_lib.encode_prompts(
          tokenizer_lib.CharTokenizer(), ['123+456='], 4)


if __name__ == '__main__':
  absltest.main()
