"""Tests for the character tokenizer and prompt batching."""

import importlib.util

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
    tokens, mask, truncated = tokenizer_lib.encode_prompts(
        tok, ['1+2=', '10+20='], 8)
    self.assertEqual(tokens.shape, (2, 8))
    np.testing.assert_array_equal(mask.sum(1), [5, 7])
    self.assertEqual(tokens[0, 3], tok.bos_id)
    self.assertTrue((tokens[0, :3] == tok.pad_id).all())
    self.assertEqual(tok.decode(tokens[1]), '10+20=')
    np.testing.assert_array_equal(truncated, [False, False])

  def test_too_long_prompt_names_the_key(self):
    with self.assertRaisesRegex(tokenizer_lib.PromptTooLongError,
                                'max_prompt_len=4'):
      tokenizer_lib.encode_prompts(
          tokenizer_lib.CharTokenizer(), ['123+456='], 4)

  def test_too_long_prompt_names_the_example(self):
    with self.assertRaisesRegex(
        tokenizer_lib.PromptTooLongError,
        r'^example qa/7 is 9 tokens .*rollout.max_prompt_len=4.*'
        'rollout.long_prompts'):
      tokenizer_lib.encode_prompts(
          tokenizer_lib.CharTokenizer(), ['1=', '123+456='], 4,
          names=['qa/6', 'qa/7'])

  def test_truncate_keeps_bos_and_the_end(self):
    tok = tokenizer_lib.CharTokenizer()
    tokens, mask, truncated = tokenizer_lib.encode_prompts(
        tok, ['1+2=', '123+456=', '12='], 5, truncate=True)
    np.testing.assert_array_equal(truncated, [False, True, False])
    self.assertTrue(mask[1].all())
    self.assertEqual(tokens[1, 0], tok.bos_id)
    self.assertEqual(tok.decode(tokens[1]), '456=')  # the last P - 1 tokens
    self.assertEqual(tok.decode(tokens[0]), '1+2=')  # an exact fit is kept
    self.assertEqual(tok.decode(tokens[2]), '12=')
    # P = 1 leaves only BOS.
    tokens, mask, truncated = tokenizer_lib.encode_prompts(
        tok, ['12='], 1, truncate=True)
    np.testing.assert_array_equal(tokens, [[tok.bos_id]])
    self.assertTrue(truncated[0])


class _NoBos(tokenizer_lib.CharTokenizer):
  """A character tokenizer for a model that starts prompts with no BOS."""

  def __init__(self):
    super().__init__()
    self.bos_id = None


class _TemplateBos(tokenizer_lib.CharTokenizer):
  """'^' is the BOS string, as a chat template may write it."""

  def encode(self, text):
    return [self.BOS if c == '^' else i
            for c, i in zip(text, super().encode(text.replace('^', ' ')))]


class PromptIdsTest(absltest.TestCase):

  def test_bos_rule(self):
    tok = tokenizer_lib.CharTokenizer()
    self.assertTrue(tokenizer_lib.adds_bos(tok))
    self.assertEqual(tokenizer_lib.prompt_ids(tok, '1+2='),
                     [tok.bos_id, *tok.encode('1+2=')])
    self.assertEqual(tokenizer_lib.prompt_ids(_NoBos(), '1+2='),
                     tok.encode('1+2='))
    tok.add_bos = False
    self.assertFalse(tokenizer_lib.adds_bos(tok))
    self.assertEqual(tokenizer_lib.prompt_ids(tok, '1+2='), tok.encode('1+2='))
    # A prompt that already starts with BOS gets no second one.
    tok = _TemplateBos()
    self.assertEqual(tokenizer_lib.prompt_ids(tok, '^1='),
                     [tok.bos_id, *tok.encode('1=')])
    self.assertEqual(tokenizer_lib.prompt_ids(tok, '^12345=', max_len=3),
                     [tok.bos_id, *tok.encode('5=')])

  def test_left_truncate(self):
    self.assertEqual(tokenizer_lib.left_truncate([1, 5, 6, 7, 8], 3),
                     [1, 7, 8])
    self.assertEqual(
        tokenizer_lib.left_truncate([5, 6, 7, 8], 3, keep_first=False),
        [6, 7, 8])
    self.assertEqual(tokenizer_lib.left_truncate([5, 6], 3), [5, 6])

  def test_encode_prompts_without_bos(self):
    tok = _NoBos()
    tokens, mask, truncated = tokenizer_lib.encode_prompts(
        tok, ['1+2=', '123+456='], 6, truncate=True)
    np.testing.assert_array_equal(tokens[0, :2], [tok.pad_id] * 2)
    np.testing.assert_array_equal(tokens[0, 2:], tok.encode('1+2='))
    np.testing.assert_array_equal(tokens[1], tok.encode('3+456='))
    np.testing.assert_array_equal(mask.sum(1), [4, 6])
    np.testing.assert_array_equal(truncated, [False, True])
    with self.assertRaisesRegex(tokenizer_lib.PromptTooLongError,
                                r'is 8 tokens, longer than'):
      tokenizer_lib.encode_prompts(tok, ['123+456='], 6)
    with self.assertRaisesRegex(ValueError, 'adds no BOS'):
      tokenizer_lib.encode_prompts(tok, [''], 6)


class ByteTokenizerTest(absltest.TestCase):

  def test_any_text_round_trips(self):
    tok = tokenizer_lib.make_tokenizer('byte')
    text = 'Janet’s ducks lay 16 eggs: $2 each. #### 18 — é ☃'
    ids = tok.encode(text)
    self.assertEqual(len(ids), len(text.encode('utf-8')))
    self.assertTrue(all(3 <= i < 259 for i in ids))
    self.assertEqual(tok.decode(ids), text)
    self.assertEqual(tok.decode(ids[:2] + [tok.eos_id] + ids[2:]), text[:2])
    self.assertEqual(tok.vocab_size % 8, 0)

  def test_cut_character_decodes_with_replacement(self):
    tok = tokenizer_lib.make_tokenizer('byte')
    ids = tok.encode('é')
    self.assertEqual(tok.decode(ids[:1]), '\ufffd')
    self.assertEqual(tok.decode([tok.pad_id, tok.bos_id, 260] + ids), 'é')

  def test_unknown_name(self):
    with self.assertRaisesRegex(ValueError, "'byte'"):
      tokenizer_lib.make_tokenizer('bpe')

  def test_auto_is_the_presets_char_tokenizer(self):
    self.assertIsInstance(tokenizer_lib.make_tokenizer('auto'),
                          tokenizer_lib.CharTokenizer)



@absltest.skipUnless(importlib.util.find_spec('tokenizers'),
                     "needs tokenizers: pip install -e '.[hf]'")
class AsHuggingFaceTest(absltest.TestCase):
  """`to_hf`: the built-in tokenizers as tokenizer.json, the same ids."""

  def test_same_ids_both_ways(self):
    for name, texts in (
        ('char', ['12+345=', 'what is 7*8? ok.', '(1-2)=', '']),
        ('byte', ['héllo wörld\n', '日本 語', ' lead', 'a\tb\x00c', '\U0001F600',
                  # Strings that other tokenizers make special are text.
                  'Use <s>old</s> price <pad>'])):
      ours = tokenizer_lib.make_tokenizer(name)
      hf = tokenizer_lib.to_hf(ours)
      self.assertEqual((hf.vocab_size, hf.bos_id, hf.eos_id, hf.pad_id),
                       (ours.vocab_size, ours.bos_id, ours.eos_id, ours.pad_id))
      for text in texts:
        with self.subTest(name=name, text=text):
          self.assertEqual(tokenizer_lib.prompt_ids(hf, text),
                           tokenizer_lib.prompt_ids(ours, text))
          ids = ours.encode(text) + [ours.eos_id, 5]
          self.assertEqual(hf.decode(ids), ours.decode(ids))
      chat = hf.with_prompts(chat=True, system='Be brief.')
      self.assertEqual(chat.prompt_text('1+2='),
                       '<|jaxgrpo_bos|>Be brief.\n1+2=')
      # The template writes the BOS: chat prompts start with one, as the
      # run's prompts did.
      self.assertEqual(tokenizer_lib.prompt_ids(hf.with_prompts(chat=True),
                                                '1+2='),
                       tokenizer_lib.prompt_ids(ours, '1+2='))
    with self.assertRaisesRegex(Exception, 'UNK'):  # not in the alphabet
      tokenizer_lib.to_hf(tokenizer_lib.make_tokenizer('char')).encode('A')


if __name__ == '__main__':
  absltest.main()
