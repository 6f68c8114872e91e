"""The 'math' verifier on completions built from real GSM8K answers.

Each row of `_FORMS` is a way a model writes (or fails to write) the final
answer, filled in with the gold of real GSM8K test records, with the reward
a careful grader gives and why. Golds follow GSM8K: a bare number, the value
of a percentage without its '%', integers throughout the test split. Rows of
`_SINGLE` are cases that need one particular gold.
"""

import json
import os

from absl.testing import absltest
from absl.testing import parameterized

from jaxgrpo.example import Example
from jaxgrpo.verifiers import math_answer

_GSM8K = os.path.join(os.path.dirname(__file__), '..', '..', '..', 'shared',
                      'data', 'gsm8k', 'test.jsonl')

# (name, completion template, reward by default, with fallback='none', why).
# Fields: {g} the gold as GSM8K writes it, {v} its value, {c} the value with
# thousands commas, {l} with LaTeX ones ('1{,}080'), {s} with apostrophes
# ("1'080"), {w} a wrong value
# (v + 1), {q} the question's last number (never the gold), {a} and {b} with
# a + b = v.
_FORMS = (
    ('hashes', 'She sells {a}, then {b}.\n#### {g}', 1, 1,
     "GSM8K's own marker"),
    ('hashes_commas', 'Adding up.\n#### {c}', 1, 1, 'thousands commas'),
    ('boxed', 'So the total is $\\boxed{{{v}}}$.', 1, 1, 'LaTeX box'),
    ('boxed_latex_commas', '\\boxed{{{l}}}', 1, 1,
     "LaTeX thousands '{,}'"),
    ('boxed_point_zero', '\\[\\boxed{{{v}.0}}\\]', 1, 1, '18.0 is 18'),
    ('boxed_text_unit', '\\boxed{{\\text{{{v} apples}}}}', 1, 1,
     'unit word inside \\text'),
    ('answer_is_dollar', 'The answer is ${c}.', 1, 1, 'currency and period'),
    ('answer_is_escaped_dollar', 'The answer is \\${c}.', 1, 1, "LaTeX '\\$'"),
    ('answer_is_inline_latex', 'The answer is \\({v}\\).', 1, 1,
     'inline math'),
    ('answer_is_cents', 'The answer is {v}.00 dollars.', 1, 1,
     'trailing zeros and a unit word'),
    ('answer_is_glued_unit', 'The answer is {v}km.', 1, 1,
     'a unit written without a space'),
    ('answer_is_percent', 'The answer is {v}%.', 1, 1,
     "GSM8K's percent golds are the bare number"),
    ('final_answer_bold', '**Step 1:** add.\n\n**Final Answer:** **{c}**', 1,
     1, 'chat markdown'),
    ('answer_tag', '<think>add them</think>\n<answer>{v}</answer>', 1, 1,
     '<answer> tag'),
    ('bold_last_line', 'She has {a} and {b} more.\n\n**{v}**', 1, 0,
     'only the last number, so no marker for fallback=none'),
    ('unit_last', 'So she makes {v} dollars.', 1, 0, 'last number'),
    ('check_line_after', 'The answer is {v}.\nCheck: {v} - {a} = {b}.', 1, 1,
     'a check line after the answer does not replace it'),
    ('equation', 'The answer is {a} + {b} = {v}.', 1, 1,
     "the result of the answer's equation"),
    ('equation_hashes', '#### {a} + {b} = {v}', 1, 1,
     "the result of the marker's equation"),
    ('comment_in_parens', 'The answer is {v} (from {a} + {b}).', 1, 1,
     'a number before a parenthetical'),
    ('comment_after_comma', 'The answer is {v} dollars, since {a} + {b} = {v}.',
     1, 1, 'a number before an explaining clause'),
    ('comment_after_because',
     'The answer is {v} because she adds {a} and {b}.', 1, 1,
     "a number before 'because'"),
    ('equation_latex', 'The answer is ${a} \\times 1 + {b} = {v}$.', 1, 1,
     "the result of LaTeX arithmetic"),
    ('answer_sentence', 'Answer: She makes {c} dollars a day.', 1, 1,
     'a sentence with one number states it'),
    ('answer_sentence_bold', '**Final Answer:** Janet makes **${c}** daily.',
     1, 1, 'bold inside the sentence'),
    ('answer_bold_then_unit', 'So, the answer is: **${c}** per day.', 1, 1,
     'bold inside the answer'),
    ('answer_end_token', 'The answer is {v}<|im_end|>', 1, 1,
     'a chat end token after the number'),
    ('numbered_headings',
     '#### 1. Eggs\nShe has {a}.\n#### 2. Money\nSo $\\boxed{{{v}}}$.', 1, 1,
     "'#### 2. Money' is a markdown heading, not GSM8K's marker"),
    ('numbered_headings_no_box', '#### 1) Eggs\n{a} + {b} = {v}', 1, 0,
     'headings alone: the last number'),
    ('long_output', 'We add step by step. ' * 600 + '#### {v}', 1, 1,
     '12 KB of reasoning first'),
    ('lead_in_colon_words',
     'The answer is simple: {a} apples plus {b} apples gives {v}.', 1, 1,
     "'simple:' leads in the answer, a result in words"),
    ('lead_in_sentence', 'The answer is simple. {a} + {b} = {v}.', 1, 1,
     "'The answer is simple.' leads in the next sentence"),
    ('lead_in_as_follows', 'The answer is as follows:\n{a} + {b} = {v}', 1, 1,
     'a lead-in on its own line'),
    ('lead_in_then_number', 'The answer is easy to see: {v}.', 1, 1,
     'a lead-in, then the number'),
    ('result_in_words', 'Answer: {a} and {b} make {v}.', 1, 1,
     'a sum written in words'),
    # Wrong answers.
    ('hashes_wrong', 'Adding up.\n#### {w}', 0, 0, 'a wrong number'),
    ('negated', '#### -{v}', 0, 0, 'the sign matters'),
    ('gold_inside_longer_number', '#### {v}0', 0, 0, '18 inside 180'),
    ('gold_inside_longer_number_2', 'The answer is 1{v}.', 0, 0,
     '18 inside 118'),
    ('gold_in_reasoning_only', 'First {v}, then {a}. The answer is {w}.', 0,
     0, 'the gold in the reasoning, another final answer'),
    ('two_boxes_last_wrong', '\\boxed{{{v}}}, or rather \\boxed{{{w}}}', 0, 0,
     'the last box is the answer'),
    ('two_boxes_last_right', '\\boxed{{{w}}}, or rather \\boxed{{{v}}}', 1, 1,
     'the last box is the answer'),
    ('hedge', 'The answer is {v} or {w}.', 0, 0, 'two answers are none'),
    ('not_the_gold', 'The answer is {w}, not {v}.', 0, 0,
     'the number the sentence gives is the wrong one'),
    ('comment_wrong_first', 'The answer is {w} (not {v}).', 0, 0,
     'the number before the comment is the answer'),
    ('comment_then_gold_equation',
     'The answer is {w}, since {a} + {b} = {v}.', 0, 0,
     'an equation in the comment is no answer'),
    ('comment_then_gold_arithmetic',
     'The answer is {w} because {a} + {b} = {v}.', 0, 0,
     'arithmetic after a word is no answer'),
    ('answer_negated', 'The final answer is not {v}; it is unclear.', 0, 0,
     'a negated number is no answer'),
    ('answer_operator_word', 'The answer is twice {v}.', 0, 0,
     "'twice 18' is 36, not 18"),
    ('answer_approximate', 'Answer: about {v} dollars', 0, 0,
     "'about 18' is no exact answer"),
    ('answer_sentence_two_numbers',
     'Answer: She makes {v} dollars in {a} days.', 0, 0,
     'a sentence with two numbers states neither'),
    ('equation_wrong_result', 'The answer is {v} + 1 = {w}.', 0, 0,
     'the result, not an operand'),
    ('question_number_last', 'She makes {v} in all. She started with {q}.', 0,
     0, 'the last number restates the question'),
    ('question_number_answer', 'The answer is {q}.', 0, 0,
     "the question's number as the answer"),
    ('lead_in_wrong_first', 'The answer is simple: {w}, not {v}.', 0, 0,
     'after a lead-in, the number before the comment'),
    ('lead_in_then_hedge', 'The answer is clear: {v} or {w}.', 0, 0,
     'after a lead-in, two answers are none'),
    ('lead_in_sentence_wrong', 'The answer is simple. It is {w}, not {v}.', 0,
     0, 'the sentence after a lead-in, read as the answer'),
    ('lead_in_negated', 'The answer is not simple. Maybe {v}.', 0, 0,
     "'not simple' is no lead-in"),
    ('lead_in_gold_in_reasoning',
     'The answer is simple.\nShe has {v} and uses {a}, so {w} are left.', 0,
     0, 'a sentence with two numbers after a lead-in states neither'),
    ('result_in_words_after_word',
     'The answer is {w} because {a} plus {b} gives {v}.', 0, 0,
     'a result after a word is no answer'),
    ('result_in_words_wrong', 'Answer: {v} plus 1 gives {w}.', 0, 0,
     'the result, not an operand'),
    ('last_swiss_thousands', 'She has {a} and {b} more: {s} in all.', 1, 0,
     "the last number grouped by apostrophes (1'080), as after a marker"),
)

# (name, completion, gold, reward by default, why).
_SINGLE = (
    ('fraction_for_decimal', 'The answer is 3/4.', '0.75', 1, '3/4 is 0.75'),
    ('frac_for_decimal', '$\\boxed{\\frac{3}{4}}$', '0.75', 1,
     '\\frac{3}{4} is 0.75'),
    ('decimal_for_percent', 'The answer is 0.5.', '50', 0,
     'GSM8K asks for the percent: 50, and 0.5 is another number'),
    ('percent_for_percent', 'The answer is 50%.', '50', 1, "'%' goes"),
    ('negative', 'The temperature is -3.\n#### -3', '-3', 1,
     'a negative gold'),
    ('words', 'The answer is eighteen.', '18', 0,
     'numbers in words are not read'),
    ('ordinal', 'She finished in 2nd place.\n#### 2nd', '2', 1,
     'an ordinal suffix'),
    ('speed', 'The answer is 5 km/h.', '5', 1, 'a unit with a slash'),
    ('clock_time', 'The answer is 3:30.', '3', 0, 'a time is no number'),
    ('dot_thousands', 'The answer is 1.080.', '1080', 0,
     "'1.080' reads as 1.08 (a decimal point)"),
    ('dot_decimal', 'The answer is 1.080.', '1.08', 1,
     "'1.080' reads as 1.08"),
    ('comma_decimal', 'The answer is 1,5.', '1.5', 0,
     "'1,5' is ambiguous and no number"),
    ('scale_suffix', 'The answer is 18k.', '18', 0,
     "'18k' is 18000, not read"),
    ('scale_suffix_other_way', 'The answer is 18k.', '18000', 0,
     "'18k' is not read as 18000 either"),
    ('partial_number', 'She has 180 apples.', '18', 0, '18 inside 180'),
    ('power_is_no_bold', 'The answer is 9**2.', '92', 0,
     "'**' between digits is a power (81), not bold"),
    ('em_dash_comment', 'The answer is 18\u2014her pay for the day.', '18', 1,
     'a number before a dash'),
    ('swiss_thousands', "#### 1'080", '1080', 1, "an apostrophe groups"),
    ('swiss_thousands_curly', 'The answer is 1\u2019080.', '1080', 1,
     'a typographic apostrophe groups'),
    ('arabic_thousands', '#### 1\u066c080', '1080', 1,
     "Arabic's thousands separator"),
    ('dot_groups', 'The answer is 1.080.000.', '1080000', 1,
     'two dots are groups, not decimal points'),
    ('lakh', '#### 10,80,000', '1080000', 1, 'Indian grouping'),
    ('lakh_is_no_decimal', '#### 10,80,000', '108', 0, '10,80,000 is no 108'),
    ('fullwidth_digits', '#### \uff11\uff18', '18', 1, 'full-width digits'),
    ('arabic_indic_digits', 'The answer is \u0661\u0668.', '18', 1,
     'Arabic-Indic digits'),
    ('parenthesised', '#### (18)', '18', 1, 'a number in parentheses'),
    ('vulgar_fraction', 'The answer is 2\u00bd.', '2.5', 1, "'\u00bd' is 1/2"),
    ('vulgar_fraction_alone', '\\boxed{\u00be}', '0.75', 1, "'\u00be' is 3/4"),
    ('negative_parenthesised', '#### (-18)', '18', 0, 'the sign matters'),
    ('hashes_dot_groups_full_stop', '#### 1.080.000.', '1080000', 1,
     'a full stop after the groups'),
    # The last number, unmarked, read as a marked answer is.
    ('last_dot_groups', 'So the town has 1.080.000', '1080000', 1,
     'two dots are groups (it was 1.08)'),
    ('last_dot_groups_not_one', 'So the town has 1.000.000.', '1', 0,
     "'1.000.000' is a million (it was read as 1)"),
    ('last_dot_groups_full_stop', 'So the town has 1.000.000.', '1000000',
     1, 'a full stop ends the sentence'),
    ('last_lakh', 'The prize is 10,80,000', '1080000', 1,
     'Indian grouping (it was 80,000)'),
    ('last_swiss', "It costs 1'080 francs.", '1080', 1,
     'an apostrophe groups (it was 080)'),
    ('last_arabic', 'It costs 1\u066c080.', '1080', 1,
     "Arabic's thousands separator"),
    ('last_decimal', 'Each costs 3.5', '3.5', 1, 'one dot is a decimal point'),
    ('last_decimal_full_stop', 'Each costs 3.5.', '3.5', 1,
     'a decimal point, then a full stop'),
    ('last_full_stop', 'It is 18.', '18', 1, 'a full stop after the number'),
    ('last_one_dot', 'It weighs 1.080', '1080', 0,
     'one dot is still a decimal point'),
    ('last_after_dot_groups', 'From 1.000.000 she keeps 18', '18', 1,
     'the last number'),
)


def _fill(template, record):
  question, solution = record['question'], record['answer']
  gold = solution.rsplit('####', 1)[1].strip()
  value = int(gold.replace(',', ''))
  numbers = [n.replace(',', '') for n in
             math_answer._NUMBER_TOKEN_RE.findall(question)]
  last = numbers[-1].lstrip('$') if numbers else ''
  if not last.isdigit() or int(last) == value:
    last = str(value + 2)
  a = value // 2
  return gold, template.format(
      g=gold, v=value, c=f'{value:,}', l=f'{value:,}'.replace(',', '{,}'),
      s=f'{value:,}'.replace(',', "'"),
      w=value + 1, q=last, a=a, b=value - a)


@absltest.skipUnless(os.path.exists(_GSM8K),
                     f'GSM8K test split not found: {_GSM8K}')
class Gsm8kCorpusTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    with open(_GSM8K) as f:
      records = [json.loads(line) for line in f]
    # Every 20th record, and every gold with thousands commas or a sign.
    cls.records = [r for i, r in enumerate(records)
                   if i % 20 == 0 or not r['answer'].split('####')[-1]
                   .strip().isdigit()]

  def test_sample_is_mixed(self):
    golds = [r['answer'].rsplit('####', 1)[1].strip() for r in self.records]
    self.assertGreaterEqual(len(golds), 80)
    self.assertTrue(any(',' in g for g in golds))
    self.assertTrue(any(g.startswith('-') for g in golds))

  @parameterized.named_parameters(*_FORMS)
  def test_form(self, template, expected, expected_no_fallback, why):
    for options, want in (({}, expected),
                          ({'fallback': 'none'}, expected_no_fallback)):
      verify = math_answer.MathAnswer(**options)
      for record in self.records:
        gold, completion = _fill(template, record)
        verdict = verify(completion, Example(id='g', prompt='', answer=gold))
        self.assertEqual(verdict.reward, want,
                         f'{why}: {completion[-80:]!r}, gold {gold!r}, '
                         f'{options}: {verdict.details}')


class SingleCaseTest(parameterized.TestCase):

  @parameterized.named_parameters(*_SINGLE)
  def test_case(self, completion, gold, expected, why):
    verdict = math_answer.MathAnswer()(
        completion, Example(id='g', prompt='', answer=gold))
    self.assertEqual(verdict.reward, expected, f'{why}: {verdict.details}')


if __name__ == '__main__':
  absltest.main()
