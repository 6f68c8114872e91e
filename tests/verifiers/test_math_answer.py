"""Tests for the math final-answer verifier ('math')."""

import importlib.util
import json
import os
import pickle
import signal
import subprocess
import sys
import time
import unicodedata
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized

from jaxgrpo import verifiers
from jaxgrpo.example import Example
from jaxgrpo.verifiers import base
from jaxgrpo.verifiers import math_answer

_GSM8K = os.path.join(os.path.dirname(__file__), '..', '..', '..', 'shared',
                      'data', 'gsm8k', 'test.jsonl')
_HAS_MATH_VERIFY = importlib.util.find_spec('math_verify') is not None


def _score(completion, gold, **options):
  verify = math_answer.MathAnswer(**options)
  return verify(completion, Example(id='t/1', prompt='', answer=gold))


# (name, completion, gold, expected reward, options)
_CASES = (
    # GSM8K `####` marker.
    ('hashes', 'She makes 9 * 2 = 18 dollars.\n#### 18', '18', 1),
    ('hashes_wins_over_later_numbers', '#### 18\nCheck: 18 + 2 = 20', '18',
     1),
    ('hashes_last_occurrence', '#### 12\nRecount.\n#### 18', '18', 1),
    ('hashes_heading_is_no_marker',
     '#### Step 1\n9 * 2 = 18\n#### Step 2\nThe answer is 18.', '18', 1),
    # ... so a gold that is no number is read from the other markers only
    # (docs/data.md).
    ('hashes_word_gold_is_a_heading', '#### five', 'five', 0),
    ('hashes_expression_gold_is_a_heading', '#### x+1', 'x+1', 0),
    ('boxed_word_gold', '#### Solution\nIt is \\boxed{five}', 'five', 1),
    ('hashes_wrong', '#### 17', '18', 0),
    # The last number glued to a scale letter or in a time is none, as in
    # a marked answer (docs/data.md); it read '18k' as 18 and 3:30 as 30.
    ('last_number_scale_suffix', 'It costs 18k', '18', 0),
    ('last_number_scale_suffix_decimal', 'The total is 1.5M.', '1.5', 0),
    ('last_number_time', 'She left at 3:30', '30', 0),
    ('last_number_after_a_ratio', 'At a ratio of 3:2 she made 18', '18', 1),
    ('hashes_commas', '#### 1,000', '1000', 1),
    # Integers past a float's 53 bits are compared digit by digit.
    ('long_integer_off_by_one', '#### 12345678901234567891',
     '12345678901234567890', 0),
    ('long_integer_equal', '#### 12,345,678,901,234,567,890',
     '12345678901234567890', 1),
    ('long_integer_signed', 'The answer is +012345678901234567890.',
     '12345678901234567890', 1),
    ('300_digit_integer_off_by_one', '#### 1' + '0' * 299 + '1',
     '1' + '0' * 300, 0),
    # ... with a unit, a currency or a percent sign too, exact as integers.
    ('long_integer_with_unit_off_by_one', '#### 1000000000000000001 dollars',
     '1000000000000000000', 0),
    ('long_integer_with_unit_equal', '#### 1000000000000000000 dollars',
     '1000000000000000000', 1),
    ('long_integer_percent_off_by_one', 'The answer is 1000000000000000001%.',
     '1000000000000000000', 0),
    ('long_integer_stated_off_by_one',
     'The answer is 1000000000000000001 (a quintillion and one).',
     '1000000000000000000', 0),
    ('long_integer_unit_gold_off_by_one', '#### 1000000000000000001 eggs',
     '1000000000000000000 eggs', 0),
    ('long_decimal_for_integer_gold', '#### 1000000000000000000.5',
     '1000000000000000000', 0),
    ('long_integer_as_fraction', '#### 2000000000000000002/2',
     '1000000000000000001', 1),
    ('long_integer_as_fraction_off_by_one', '#### 2000000000000000002/2',
     '1000000000000000000', 0),
    ('long_integer_as_trailing_zeros', '#### 1000000000000000000.00',
     '1000000000000000000', 1),
    ('5000_digit_integers', '#### ' + '9' * 5000, '9' * 5000, 1),
    ('5000_digit_integer_differs', '#### ' + '9' * 4999 + '8', '9' * 5000,
     0),
    ('gold_with_commas', 'The total is 1000.\n#### 1000', '1,000', 1),
    ('hashes_trailing_period', '#### 18.', '18', 1),
    ('hashes_negative', '#### -10', '-10', 1),
    ('hashes_sign_matters', '#### 10', '-10', 0),
    ('trailing_zeros', '#### 18.00', '18', 1),
    ('integer_gold_is_exact', '#### 1000001', '1,000,000', 0),
    ('space_thousands', '#### 1 000 000', '1000000', 1),
    # \boxed and \fbox.
    ('boxed', 'So she makes $\\boxed{18}$.', '18', 1),
    ('boxed_last_wins', '\\boxed{12} is wrong, so \\boxed{18}', '18', 1),
    ('boxed_wins_over_later_numbers',
     'Hence \\boxed{18}. That is 2 more than 16.', '18', 1),
    ('boxed_unclosed_last', '\\boxed{18} and then \\boxed{19', '18', 1),
    ('boxed_nested_frac', '$\\boxed{\\frac{3}{4}}$', '0.75', 1),
    ('boxed_dfrac_vs_fraction_gold', '\\boxed{\\dfrac{3}{4}}', '3/4', 1),
    ('boxed_dfrac_shorthand', '\\boxed{\\dfrac34}', '0.75', 1),
    ('boxed_frac_wrong', '\\boxed{\\frac{4}{3}}', '0.75', 0),
    ('boxed_text_unit', '\\boxed{18 \\text{ eggs}}', '18', 1),
    ('boxed_escaped_dollar', '\\boxed{\\$18}', '18', 1),
    ('boxed_latex_thousands', '\\boxed{1{,}000}', '1000', 1),
    ('boxed_percent', '\\boxed{25\\%}', '25', 1),
    ('fbox', 'The result: \\fbox{42}', '42', 1),
    ('boxed_wrong', '\\boxed{19}', '18', 0),
    # <answer> tags.
    ('answer_tag', '<think>9 * 2</think><answer>18</answer>', '18', 1),
    ('answer_tag_dollars', '<answer> $18.00 </answer> and 5 more', '18', 1),
    ('answer_tag_wins_over_later_number', '<answer>17</answer> 18', '18', 0),
    # 'the answer is' / 'Answer:' phrases.
    ('answer_is', 'The answer is 18.', '18', 1),
    ('final_answer_is_any_case', 'THE FINAL ANSWER IS 18', '18', 1),
    ('answer_colon_units', 'Answer: 18 eggs', '18', 1),
    ('final_answer_colon_bold', '**Final answer:** **18**', '18', 1),
    ('answer_is_wins_over_later_numbers',
     'The answer is 18. Check: 9 + 9 = 18, then add 3.', '18', 1),
    ('answer_is_last_occurrence',
     'The answer is 12. No, the answer is 18.', '18', 1),
    ('answer_is_two_numbers', 'The answer is 18 or 19.', '18', 0),
    ('answer_isnt_is_no_marker', "The answer isn't 5, it is 7", '7', 1),
    ('answer_is_dollars', 'The answer is $18.', '18', 1),
    ('answer_is_euro', 'The answer is \u20ac5', '5', 1),
    ('answer_is_per_day', 'Answer: $18/day', '18', 1),
    ('answer_is_percent', 'The answer is 25%.', '25', 1),
    ('answer_is_percent_word', 'Answer: 25 percent', '25%', 1),
    ('answer_is_fraction', 'The answer is 3/4', '0.75', 1),
    ('answer_is_mixed_number', 'The answer is 2 1/2 cups.', '2.5', 1),
    ('answer_is_mixed_number_wrong', 'The answer is 2 1/3 cups.', '2.5', 0),
    ('answer_is_inline_latex', 'The answer is \\(18\\).', '18', 1),
    ('answer_is_bold', 'The answer is **18**.', '18', 1),
    ('answer_is_thin_space', 'The answer is 1\u2009000', '1000', 1),
    ('answer_is_variable', 'The answer is x = 5.', '5', 1),
    ('answer_is_decimal_gold', 'The answer is 0.5', '0.50', 1),
    ('comma_decimal_is_ambiguous', 'The answer is 1,5', '1.5', 0),
    ('symbolic_gold_string_match', 'So the answer is x + 1.', 'x+1', 1),
    ('symbolic_gold_string_mismatch', 'The answer is x - 1.', 'x+1', 0),
    # The last number, without a marker.
    ('last_number', 'She sells 9 eggs at $2 each, so she makes 18', '18', 1),
    ('last_number_wrong', '9 * 2 = 18, plus 2 = 20', '18', 0),
    ('last_number_dollar', 'She makes $18 every day.', '18', 1),
    ('last_number_unicode_minus', 'It drops to \u22123 degrees.', '-3', 1),
    ('last_number_after_hyphen_is_positive', 'so 20-18', '18', 1),
    ('last_number_calculator_note', 'She makes 9 * 2 = $<<9*2=18>>18.', '18',
     1),
    ('last_number_mixed', 'She needs 2 1/2 cups', '2.5', 1),
    ('empty', '', '18', 0),
    ('no_number', 'I do not know.', '18', 0),
    # Options.
    ('fallback_none_without_marker', '9 * 2 = 18', '18', 0,
     {'fallback': 'none'}),
    ('fallback_none_with_marker', 'The answer is 18', '18', 1,
     {'fallback': 'none'}),
    ('default_order_prefers_hashes', '#### 17\n\\boxed{18}', '18', 0),
    ('extract_order_option', '#### 17\n\\boxed{18}', '18', 1,
     {'extract': ['boxed', 'hashes']}),
    ('extract_subset_skips_phrase', 'The answer is 18. Then 20.', '18', 0,
     {'extract': ['boxed']}),
    ('answer_tag_content_unwrapped', '<answer>$\\boxed{18}$</answer>', '18',
     1, {'extract': ['answer_tag']}),
    # Scientific notation, as Python's float() reads it (it was '1e3' = 1).
    ('scientific', '#### 1e3', '1000', 1),
    ('scientific_is_not_its_mantissa', '#### 1e3', '1', 0),
    ('scientific_negative_exponent', '#### -2.5e-3', '-0.0025', 1),
    ('scientific_with_unit', '#### 5E6 dollars', '5000000', 1),
    ('scientific_unit_is_not_mantissa', '#### 5e6 dollars', '5', 0),
    ('scientific_last_number', 'The total is 1.5e3', '1500', 1),
    ('scientific_last_number_not_mantissa', 'The total is 1.5e3', '1.5', 0),
    ('scientific_exact_integer', '#### 1.5e20', '150000000000000000001', 0),
    ('scientific_out_of_range', '#### 1e999', '1', 0),
    ('scientific_long_exponent', '#### 1e' + '9' * 5000, '1', 0),
    ('unit_starting_with_e', '#### 12 eggs', '12', 1),
    # An exponent or a number under a root sign is not the answer's value.
    ('root_is_not_its_radicand', '#### \u221a4', '4', 0),
    ('root_phrase_is_not_its_radicand', 'The answer is \u221a16.', '16', 0),
    ('exponent_is_no_last_number', 'The total is 10^3', '3', 0),
    ('spaced_exponent_is_no_last_number', 'The total is 2^ 10', '10', 0),
    ('power_then_result_last_number', '3^2 = 9', '9', 1),
    ('rel_tol_default', '#### 0.3333', '1/3', 0),
    ('rel_tol_loose', '#### 0.3333', '1/3', 1, {'rel_tol': 1e-3}),
    ('rel_tol_within_default', '#### 0.5000001', '0.5', 1),
    # Decimal digits of any script are digits, as Python's int() reads them;
    # other numerals ('\u00b2', '\u2460') are neither digits nor unit letters.
    ('arabic_indic_digits', '#### \u0661\u0668', '18', 1),
    ('fullwidth_digits_last_number', 'The total is \uff11\uff18.', '18', 1),
    ('arabic_indic_gold', '#### 18', '\u0661\u0668', 1),
    ('arabic_indic_grouped', '#### \u0661\u066c\u0660\u0660\u0660', '1000',
     1),
    # ... and so are their points and separators: fullwidth forms are ASCII.
    ('fullwidth_decimal', '#### \uff11\uff12\uff0e\uff15', '12.5', 1),
    ('fullwidth_decimal_last_number', 'The total is \uff11\uff12\uff0e\uff15',
     '12.5', 1),
    ('fullwidth_decimal_is_not_its_tail',
     'The total is \uff11\uff12\uff0e\uff15', '5', 0),
    ('fullwidth_grouped', '#### \uff11\uff0c\uff10\uff10\uff10', '1000', 1),
    ('fullwidth_fraction', '#### \uff11\uff18\uff0f\uff12', '9', 1),
    ('fullwidth_marker', '\uff03\uff03\uff03\uff03 \uff11\uff18\n19', '18',
     1),
    ('fullwidth_scale_letter', '#### \uff11\uff18\uff4b', '18', 0),
    ('arabic_decimal_separator', '#### \u0661\u0668\u066b\u0665', '18.5', 1),
    ('superscript_is_no_unit', '#### 2\u00b2', '2', 0),
    ('superscript_power_is_no_base', '#### 10\u00b2', '10', 0),
    ('superscript_power_unread', '#### 10\u00b2', '100', 0),
    ('superscript_alone_is_no_number', '#### \u00b2', '2', 0),
    ('superscript_digits_are_no_number', '#### \u00b9\u00b2', '12', 0),
    ('circled_digit_is_no_unit', '#### 5\u2460', '5', 0),
    ('every_vulgar_fraction', '#### 2\u215c', '2.375', 1),
    ('spaced_numeral_is_another_number', 'The answer is 5 \u2460.', '5', 0),
    ('superscript_unit_still_a_unit', '#### 5 m\u00b2', '5', 1),
    ('superscript_phrase_no_value', 'The answer is 10\u00b2 apples.', '10', 0),
    ('superscript_arithmetic_result', 'The answer is 4\u00b2 = 16.', '16', 1),
    ('superscript_last_number_none', 'The area is 10\u00b2', '10', 0),
    ('vulgar_fraction_last_number', 'She ate 2\u00bd pies', '2.5', 1),
    # Headings numbered `2:`, `2 -` or `(2)` are no answers, as `2.` and
    # `2)` are (a step number equal to the gold scored 1).
    ('heading_numbered_colon',
     '#### 1: Eggs\nShe has 16 eggs.\n#### 2: Money\nShe makes 9 * 2 = 20 '
     'dollars, so $\\boxed{20}$.', '2', 0),
    ('heading_numbered_colon_then_boxed',
     '#### 2: Money\nShe makes $\\boxed{18}$.', '18', 1),
    ('heading_numbered_dash', '#### 2 - Money\nThe answer is 18', '18', 1),
    ('heading_numbered_parens', '#### (2) Money\nThe answer is 18', '18', 1),
    ('heading_numbered_title', '#### 2 Money\nThe answer is 18', '18', 1),
    ('title_unit_last_line_is_answer', 'So she has\n#### 18 Dollars', '18', 1),
    ('up_to_is_no_value', 'The answer is up to 72', '72', 0),
    # A fraction in unmarked text is its value, never its denominator.
    ('latex_fraction_last_number', 'She has $\\frac{3}{4}$ of the pie left.',
     '0.75', 1),
    ('latex_fraction_not_denominator',
     'She has $\\frac{3}{4}$ of the pie left.', '4', 0),
    ('latex_symbolic_fraction_no_number',
     'Each gets $\\frac{x}{3}$ cookies.', '3', 0),
    # Approximations, bounds and negations are no values.
    ('tilde_is_no_value', 'The answer is ~72', '72', 0),
    ('approx_is_no_value', 'The answer is \u224872', '72', 0),
    ('less_than_is_no_value', 'The answer is < 72', '72', 0),
    ('geq_is_no_value', '\\boxed{x \\geq 72}', '72', 0),
    ('plus_after_is_no_value', 'The answer is 72+', '72', 0),
    ('or_more_is_no_value', 'The answer is 72 or more', '72', 0),
    ('negated_marker_last_number', "The answer isn't 72.", '72', 0),
    ('negated_hashes_last_number', '#### not 72', '72', 0),
    ('negation_earlier_in_sentence_kept',
     'She has no more than 3 left after selling, so 18', '18', 1),
    # Spaced digits are two numbers, not one glued.
    ('spaced_digits_two_numbers', '#### 5 6', '56', 0),
    ('spaced_digits_boxed', '\\boxed{1 8}', '18', 0),
    ('spaced_thousands_still_one', '#### 1 080', '1080', 1),
    # A final answer after the reasoning block wins over a draft in it.
    ('answer_after_think_wins',
     '<think>First guess \\boxed{17}? No: 9*2=18.</think>\n'
     '<answer>18</answer>', '18', 1),
    ('think_draft_used_when_nothing_after',
     '<think>So \\boxed{18}.</think>', '18', 1),
    # Units with a caret power, and display math on its own lines.
    ('caret_unit', '\\boxed{72 \\text{ cm}^2}', '72', 1),
    ('caret_unit_plain', 'The answer is 72 ft^2.', '72', 1),
    ('display_math_after_marker', 'The answer is:\n$$\n18\n$$', '18', 1),
    # After </think>, the final text is read whole (its last number too)
    # before the reasoning's markers.
    ('unmarked_final_after_think',
     '<think>\nSo the answer is 17? No wait, 9*2=18.\n</think>\n\n'
     'Janet makes **$18** per day.', '18', 1),
    ('unmarked_wrong_final_after_think',
     '<think>The answer is 18.</think>\n\nJanet makes $17 per day.', '18',
     0),
    # An <answer> tag holding sentences or working.
    ('answer_tag_sentences',
     '<answer>She makes $18. The answer is 18.</answer>', '18', 1),
    ('answer_tag_working',
     '<answer>16 - 3 - 4 = 9 eggs; 9 \u00d7 2 = 18 dollars</answer>', '18', 1),
    ('answer_tag_two_numbers_still_none', '<answer>18 or 20</answer>', '20',
     0),
    # Markdown around the marker.
    ('bold_marker_next_line',
     '**Final Answer:**\n18\n\nCheck: 16 - 3 - 4 = 9', '18', 1),
    ('bold_word_marker', '**Answer**: 18\n\nCheck: 16 - 3 - 4 = 9', '18', 1),
    # LaTeX's ~ is a space after a number or before a unit, not "about".
    ('latex_tilde_unit', '\\boxed{18 \\mathrm{~cm}^2}', '18', 1),
    ('latex_tilde_space', 'The answer is 18~dollars.', '18', 1),
    ('tilde_before_number_still_about', 'The answer is ~18', '18', 0),
    # A later marker that states no number leaves the earlier one.
    ('later_marker_without_number',
     'The answer is 18.\n\nNote: the answer is in dollars.', '18', 1),
    ('later_marker_reasonable',
     'The answer is 18.\n\nThe answer is reasonable.', '18', 1),
    ('check_mark_after_result', 'Answer: 9 \u00d7 2 = 18 \u2713', '18', 1),
    ('caret_unit_last_number', 'The area is 18 cm^2.', '18', 1),
    ('caret_text_unit_last_number', 'The area is $18 \\text{ cm}^2$.', '18',
     1),
    # A number inside other mathematics is not its value.
    ('sqrt_is_no_value', '\\boxed{\\sqrt{18}}', '18', 0),
    ('pi_is_no_value', '\\boxed{18\\pi}', '18', 0),
    ('factorial_is_no_value', '\\boxed{18!}', '18', 0),
    ('neq_is_no_value', '\\boxed{\\neq 18}', '18', 0),
    # A mixed number in unmarked LaTeX is its value, not its fraction.
    ('latex_mixed_number_last_number',
     'So the total is $3\\frac{1}{2}$ cups.', '3.5', 1),
    ('latex_mixed_number_not_its_fraction',
     'So the total is $3\\frac{1}{2}$ cups.', '0.5', 0),
    # A list's mark on the line after the marker is no minus sign.
    ('bullet_after_marker', 'Answer:\n- 18', '18', 1),
    ('bullet_after_marker_not_negative', 'Answer:\n- 18', '-18', 0),
    ('minus_on_the_markers_line_kept', 'The answer is -18.', '-18', 1),
    # An en dash before a number is a minus; between numbers, a range's.
    ('en_dash_minus', 'The answer is \u20135.', '-5', 1),
    ('en_dash_minus_not_dropped', '#### \u20135', '5', 0),
    ('en_dash_range_last_number', 'It takes 5\u20137 days, so 12', '12', 1),
    ('en_dash_between_terms', 'So it is 20 \u2013 5 = 15.', '15', 1),
    # A hedge after the number makes it an estimate, as '~18' is.
    ('approximately_after_is_no_value', '#### 18 (approximately)', '18', 0),
    ('approx_after_marker_is_no_value', 'The answer is 18 approx.', '18', 0),
    ('approximately_after_last_number', 'She has 18 (approximately) left',
     '18', 0),
    ('rounded_up_still_a_value', 'The answer is 18 (rounded up).', '18', 1),
    ('comment_about_something_else_kept',
     'The answer is 18 (about 2 each).', '18', 1),
)


class MathAnswerTableTest(parameterized.TestCase):

  def test_table_is_large_and_mixed(self):
    rewards = [case[3] for case in _CASES]
    self.assertGreaterEqual(len(_CASES), 45)
    self.assertGreaterEqual(rewards.count(0), 15)
    self.assertGreaterEqual(rewards.count(1), 15)

  @parameterized.named_parameters(*_CASES)
  def test_reward(self, completion, gold, expected, options=None):
    verdict = _score(completion, gold, **(options or {}))
    self.assertEqual(verdict.reward, expected, verdict.details)


class MathAnswerTest(absltest.TestCase):

  def test_every_unicode_numeral_reads_one_way(self):
    # Every decimal digit of every script is its digit; every other numeral
    # ('\u00b2', '\u2460', '\u216b', '\u215c') leaves a number it is glued
    # to no number, wherever it stands, and nothing raises.
    numerals = [chr(c) for c in range(sys.maxunicode + 1)
                if chr(c).isnumeric()]
    self.assertGreater(len(numerals), 1500)
    verify = math_answer.MathAnswer()
    for char in numerals:
      gold = Example(id='t', prompt='', answer='5')
      if char.isdecimal():
        digit = unicodedata.decimal(char)
        for text in (f'#### {char}', f'It is {char}.', f'\\boxed{{{char}}}'):
          example = Example(id='t', prompt='', answer=str(digit))
          self.assertEqual(verify(text, example).reward, 1, repr(text))
      elif char not in math_answer._VULGAR:
        for text in (f'#### 5{char}', f'The answer is 5{char} kg.',
                     f'It is 5{char}', f'#### 5 {char}'):
          self.assertEqual(verify(text, gold).reward, 0, repr(text))
      verify(char, gold)
      verify('7', Example(id='t', prompt='', answer=f'1{char}'))

  def test_details_name_extracted_text_and_rule(self):
    cases = (
        ('x\n#### 1,000', '1,000', 'hashes'),
        ('$\\boxed{\\frac{1}{2}}$', '\\frac{1}{2}', 'boxed'),
        ('<answer> 7 </answer>', '7', 'answer_tag'),
        ('Final answer: $18.', '$18', 'answer_is'),
        ('3 then 4', '4', 'last_number'),
        ('no digits', None, 'none'),
    )
    for completion, extracted, how in cases:
      verdict = _score(completion, '0')
      self.assertEqual(verdict.details, {'extracted': extracted, 'how': how})

  def test_registered_and_built_from_config(self):
    self.assertIn('math', verifiers.names())
    verify = base.from_config({'name': 'math', 'fallback': 'none',
                               'extract': ['boxed']})
    self.assertEqual(verify, math_answer.MathAnswer(('boxed',), 'none'))
    self.assertIsInstance(verify.extract, tuple)
    example = Example(id='t/1', prompt='', answer='18')
    self.assertEqual(verify('\\boxed{18}', example).reward, 1.0)
    self.assertEqual(verify('The answer is 18', example).reward, 0.0)

  def test_invalid_options_name_the_option(self):
    bad = (
        ({'extract': 'boxed'}, 'extract'),
        ({'extract': ['boxed', 'nope']}, 'extract'),
        ({'extract': ['boxed', 'boxed']}, 'extract'),
        ({'extract': (), 'fallback': 'none'}, 'extract'),
        ({'fallback': 'first_number'}, 'fallback'),
        ({'rel_tol': -1e-6}, 'rel_tol'),
        ({'rel_tol': 1.0}, 'rel_tol'),
        ({'rel_tol': True}, 'rel_tol'),
        ({'rel_tol': '1e-6'}, 'rel_tol'),
        ({'symbolic': 'yes'}, 'symbolic'),
    )
    for options, option in bad:
      with self.subTest(options=options):
        with self.assertRaisesRegex(ValueError, option):
          base.build('math', **options)
    with self.assertRaisesRegex(ValueError, 'no option'):
      base.build('math', tolerance=0.1)

  def test_symbolic_without_math_verify_says_how_to_install(self):
    with mock.patch.dict(sys.modules, {'math_verify': None}):
      with self.assertRaisesRegex(ValueError, r"pip install 'jaxgrpo\[math\]'"):
        math_answer.MathAnswer(symbolic=True)

  def test_empty_extract_uses_last_number_only(self):
    verify = math_answer.MathAnswer(extract=())
    verdict = verify('#### 18\nthen 20', Example(id='t', prompt='',
                                                 answer='20'))
    self.assertEqual(verdict, base.Verdict(1.0, {'extracted': '20',
                                                 'how': 'last_number'}))

  def test_pickles(self):
    verify = math_answer.MathAnswer(extract=('boxed',), rel_tol=1e-3)
    clone = pickle.loads(pickle.dumps(verify))
    self.assertEqual(clone, verify)
    example = Example(id='t', prompt='', answer='0.3333')
    self.assertEqual(clone('\\boxed{1/3}', example).reward, 1.0)
    self.assertEqual(clone('\\boxed{1/4}', example).reward, 0.0)

  def test_scored_in_batch(self):
    examples = [Example(id=f't/{i}', prompt='', answer='18') for i in range(3)]
    rewards, stats = base.score_batch(
        verifiers.get('math'), ['#### 18', '#### 17', 'The answer is 18.'],
        examples, name='math', timeout_s=5.0)
    self.assertEqual(rewards.tolist(), [1.0, 0.0, 1.0])
    self.assertEqual((stats.errors, stats.out_of_range, stats.timeouts),
                     (0, 0, 0))

  def test_text_without_full_width_forms_is_not_walked(self):
    # One '\u00d7' in a long trace made every call translate the whole text
    # in Python (0.1-0.8 ms); only full-width forms need it.
    # pylint: disable=protected-access
    text = 'She has 3 \u00d7 6 eggs \u2014 ' * 300
    self.assertIs(math_answer._halfwidth(text), text)
    self.assertEqual(math_answer._halfwidth('#### \uff11\uff18'), '#### 18')

  def test_adversarial_inputs_finish_quickly(self):
    verify = math_answer.MathAnswer()
    example = Example(id='t', prompt='', answer='1')
    inputs = {
        'commas': '1,' * 5000,
        'open boxes': '\\boxed{' * 1500,
        'hash lines': '####\n' * 2000,
        'open tags': '<answer>' * 1200,
        'close tags': '</answer>' * 1100,
        'answer phrases': 'answer: .' * 1100,
        'spaces': '1' + ' ' * 10000 + 'x',
        'space groups': '#### ' + '1 000 ' * 1700,
        'long number': 'The answer is ' + '9' * 10000,
        'latex thousands': '1{,}' * 2500,
        'open fracs': '\\frac{1}{' * 1100,
        'open text': '\\text{' * 1600,
        'equations': 'The answer is ' + '1 = ' * 2500,
        'comment after digits': '#### ' + '1,000' * 1800 + ' (',
        'commas before a word': 'Answer: ' + '1, ' * 3000 + 'x',
        'near comments': 'Answer: ' + '1 becaus x ' * 1000 + '= 1',
        'numbers in a sentence': 'Answer: ' + 'a 1 ' * 2500,
        'bold runs': 'Answer: ' + '1**' * 3000,
        'lakh groups': '1' + ',00' * 3300,
        'dot groups': '1' + '.000' * 2500 + '1',
        'apostrophe groups': "1'000" * 2000,
        'list marks': 'Answer:\n' + '- ' * 5000,
        'en dashes': '\u2013' * 9000 + '1',
    }

    def best_of_three(text):
      # A slow path (backtracking, a quadratic scan) is slow every time,
      # while a test worker descheduled by its neighbours under `pytest -n`
      # is slow only once.
      seconds = []
      for _ in range(3):
        start = time.perf_counter()
        verdict = verify(text, example)
        seconds.append(time.perf_counter() - start)
      return min(seconds), verdict

    # Each takes 2-50 ms here, 10 KB of ordinary working 2 ms; a quadratic
    # path over 10 KB takes seconds. The bar is 0.1 s, or 25 times the
    # ordinary text's time measured beside it, on a machine slowed by load.
    for name, text in inputs.items():
      with self.subTest(name):
        self.assertGreaterEqual(len(text), 9000)
        seconds, verdict = best_of_three(text)
        ordinary, _ = best_of_three('She has 3 eggs and sells 2. ' * 340)
        self.assertLess(seconds, max(0.1, 25 * ordinary))
        self.assertIn(verdict.reward, (0.0, 1.0))


@absltest.skipUnless(os.path.exists(_GSM8K),
                     f'GSM8K test split not found: {_GSM8K}')
class Gsm8kTest(absltest.TestCase):
  """Each GSM8K reference solution, as a completion, against the golds."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    with open(_GSM8K) as f:
      records = [json.loads(line) for line in f]
    cls.solutions = [r['answer'] for r in records]
    cls.golds = [s.split('#### ')[-1].strip() for s in cls.solutions]
    cls.examples = [Example(id=f'gsm8k/{i}', prompt=r['question'], answer=g,
                            dataset='gsm8k')
                    for i, (r, g) in enumerate(zip(records, cls.golds))]
    cls.verify = math_answer.MathAnswer()

  def test_own_solution_scores_one(self):
    self.assertLen(self.solutions, 1319)
    rewards, extracted = [], []
    for solution, example in zip(self.solutions, self.examples):
      verdict = self.verify(solution, example)
      rewards.append(verdict.reward)
      extracted.append(verdict.details['extracted'])
    self.assertEqual(sum(rewards), 1319)
    self.assertEqual(extracted, self.golds)

  def test_next_solution_scores_one_only_for_equal_answers(self):
    values = [float(g.replace(',', '')) for g in self.golds]
    equal = sum(a == b for a, b in zip(values, values[1:]))
    rewards = [self.verify(solution, example).reward
               for solution, example in zip(self.solutions[1:],
                                            self.examples)]
    self.assertEqual(sum(rewards), equal)
    self.assertGreater(equal, 0)
    self.assertLess(equal, 50)


@absltest.skipUnless(_HAS_MATH_VERIFY,
                     "math_verify not installed (pip install 'jaxgrpo[math]')")
class SymbolicTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.verify = math_answer.MathAnswer(symbolic=True)

  @parameterized.parameters(
      # completion, gold, reward, reward without symbolic
      ('The answer is $\\frac{1}{2}$.', '0.5', 1, 1),
      ('\\boxed{\\frac{\\sqrt{2}}{2}}', '\\frac{1}{\\sqrt{2}}', 1, 0),
      ('\\boxed{x^2+2x+1}', '(x+1)^2', 1, 0),
      ('The answer is 1 + x.', 'x+1', 1, 0),
      ('\\boxed{x^2+2x+2}', '(x+1)^2', 0, 0),
      ('The answer is 19 because 9 + 9 = 18.', '18', 0, 0),
      ('\\boxed{19 \\text{ or } 18}', '18', 0, 0),
      ('The answer is $2^3$.', '8', 1, 0),
      ('\\boxed{\\frac{2}{3}}', '0.5', 0, 0),
      ('\\boxed{\\sqrt{3}}', '\\frac{1}{\\sqrt{2}}', 0, 0),
      # Superscript digits are powers (math_verify reads 2\u00b2 as 2).
      ('#### 10\u00b2', '100', 1, 0),
      ('#### 2\u00b2', '2', 0, 0),
      ('The answer is x\u00b2+2x+1.', '(x+1)^2', 1, 0),
      # Approximations and bounds are no values here either (math_verify
      # took them as 18).
      ('\\boxed{\\approx 18}', '18', 0, 0),
      ('\\boxed{\\geq 18}', '18', 0, 0),
      ('\\boxed{18+}', '18', 0, 0),
  )
  def test_equivalence(self, completion, gold, expected, plain_expected):
    example = Example(id='t', prompt='', answer=gold)
    self.assertEqual(self.verify(completion, example).reward, expected)
    plain = math_answer.MathAnswer()
    self.assertEqual(plain(completion, example).reward, plain_expected)

  def test_numbers_too_large_to_compute_score_zero_at_once(self):
    # Computing 9^(9^9) in sympy took minutes in C code that no alarm
    # interrupts: the call sat out `verify.timeout_s` (with workers=0, hung).
    # A child process, so that a regression fails the test, not hangs it.
    script = (
        'from jaxgrpo.example import Example\n'
        'from jaxgrpo.verifiers import math_answer\n'
        'verify = math_answer.MathAnswer(symbolic=True)\n'
        'example = Example(id="t", prompt="", answer="x+1")\n'
        'for a in ("9^{9^{9}}", "10^{10^{10}}", "9^{(9^{9})}", "9^{99}!",\n'
        '          "(9^{9})!", "9!!!", "2^{123456789}", "1234567!",\n'
        '          "9\u2079\u2079\u2079\u2079\u2079\u2079", "9^{9\u2079}"):\n'
        '  print(verify(f"The answer is ${a}$.", example).reward)\n')
    done = subprocess.run(
        [sys.executable, '-c', script], capture_output=True, text=True,
        timeout=20, env={**os.environ, 'PYTHONPATH': os.pathsep.join(
            p for p in sys.path if p)})
    self.assertEqual(done.stdout.split(), ['0.0'] * 10, done.stderr)

  @parameterized.parameters(
      ('\\boxed{2^{10}}', '1024', 1),
      ('\\boxed{2^{3}+4^{5}}', '1032', 1),
      ('\\boxed{5!}', '120', 1),
      ('\\boxed{(2^{2})!}', '24', 0),  # a factorial of a power is refused
      ('\\boxed{e^{x^2}}', 'e^{x^{2}}', 1),
      ('\\boxed{(n+1)!}', '(n+1)!', 1),
  )
  def test_small_powers_and_factorials_still_compared(
      self, completion, gold, expected):
    example = Example(id='t', prompt='', answer=gold)
    self.assertEqual(self.verify(completion, example).reward, expected)

  def test_leaves_the_callers_alarm_alone(self):
    fired = []
    handler = lambda *_: fired.append(1)
    previous = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 30.0)
    try:
      example = Example(id='t', prompt='', answer='(x+1)^2')
      self.assertEqual(self.verify('\\boxed{x^2+2x+1}', example).reward, 1.0)
      self.assertIs(signal.getsignal(signal.SIGALRM), handler)
      self.assertGreater(signal.getitimer(signal.ITIMER_REAL)[0], 25.0)
    finally:
      signal.setitimer(signal.ITIMER_REAL, 0)
      signal.signal(signal.SIGALRM, previous)
    self.assertEqual(fired, [])

  def test_unpickling_loads_math_verify_before_any_call(self):
    data = pickle.dumps(self.verify)
    with mock.patch.object(math_answer, '_load_math_verify') as load:
      clone = pickle.loads(data)
    load.assert_called_once_with()
    self.assertEqual(clone, self.verify)


if __name__ == '__main__':
  absltest.main()
