"""Tests for the supervised warm start."""

from absl.testing import absltest
import jax
import numpy as np

from jaxgrpo import verifiers
from jaxgrpo import warmstart
from jaxgrpo.data import arithmetic
from jaxgrpo.data import entry as entry_lib
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.example import Example
from jaxgrpo.generate import sampling
from jaxgrpo.generate.generator import Generator
from jaxgrpo.model import config as model_config
from jaxgrpo.model import decoder
from jaxgrpo.verifiers import pool as verifier_pool
from tests import flaky_verifiers


class WarmStartTest(absltest.TestCase):

  def test_sft_batch_by_hand(self):
    tok = tokenizer_lib.CharTokenizer()
    ex = Example(id='a/0', prompt='1+2=', answer='3')
    inputs, targets, mask = warmstart.make_sft_batch(tok, [ex], 8)
    seq = [tok.bos_id, *tok.encode('1+2='), *tok.encode('3'), tok.eos_id]
    np.testing.assert_array_equal(inputs[0, :6], seq[:-1])
    np.testing.assert_array_equal(targets[0, :6], seq[1:])
    # Only the answer and EOS are targets: predicted from '=' and '3'.
    np.testing.assert_array_equal(mask[0], [0, 0, 0, 0, 1, 1, 0, 0])
    with self.assertRaisesRegex(ValueError, 'longer than 4'):
      warmstart.make_sft_batch(tok, [ex], 4)

  def test_sft_batch_truncates_prompts_like_rollouts(self):
    tok = tokenizer_lib.CharTokenizer()
    ex = Example(id='a/0', prompt='12+34=', answer='46')
    inputs, _, mask = warmstart.make_sft_batch(tok, [ex], 8,
                                               truncate_prompts_to=4)
    tokens, _, _ = tokenizer_lib.encode_prompts(tok, [ex.prompt], 4,
                                                truncate=True)
    # BOS and the prompt's last 3 tokens, as the rollout sees them.
    np.testing.assert_array_equal(inputs[0, :4], tokens[0])
    np.testing.assert_array_equal(inputs[0, 4:6], tok.encode('46'))
    np.testing.assert_array_equal(mask[0], [0, 0, 0, 1, 1, 1, 0, 0])

  def test_leaves_out_datasets_grpo_never_draws(self):
    # A dataset of weight 0 without a min_fraction is evaluated only: the
    # warm start taught its training examples all the same.
    entries = [entry_lib.DatasetSection(name=n, kind='arithmetic', weight=w,
                                        min_fraction=f)
               for n, w, f in (('a', 1.0, 0.0), ('b', 0.0, 0.0),
                               ('c', 0.0, 0.25))]
    examples = [Example(id=f'{n}/{i}', prompt=f'{i}+{i}=', answer='', dataset=n)
                for n in 'abc' for i in range(3)]
    taught = warmstart.drawn_examples(examples, entries)
    self.assertEqual([ex.id for ex in taught],
                     ['a/0', 'a/1', 'a/2', 'c/0', 'c/1', 'c/2'])

  def test_learns_and_stops_at_target(self):
    tok = tokenizer_lib.CharTokenizer()
    cfg = model_config.preset('tiny', vocab_size=tok.vocab_size)
    graphdef, params = decoder.init_params(cfg, jax.random.key(0))
    examples = arithmetic.make_examples(
        arithmetic.ArithmeticSpec(max_digits=1), range(100), name='a')
    gen = Generator(graphdef=graphdef, model_cfg=cfg,
                    sampling=sampling.Sampling(temperature=1.0),
                    max_new_tokens=3, num_samples=2,
                    stop_tokens=(tok.eos_id,), pad_id=tok.pad_id)
    inputs, targets, mask = warmstart.make_sft_batch(tok, examples, 8)
    loss_before = float(warmstart._sft_loss(graphdef, params, inputs,
                                            targets, mask))
    lines, notices = [], []
    result = warmstart.warm_start(
        graphdef, params, tokenizer=tok, train_examples=examples,
        check_generator=gen, scorer=verifier_pool.Scorer(verifiers.get('exact_match')),
        rng=jax.random.key(1), max_steps=60, batch_size=32,
        learning_rate=1e-2, target_pass_rate=1.1, check_every=30,
        check_examples=8, max_prompt_len=6, seq_len=8, progress=lines.append,
        notice=notices.append)
    # An unreachable target runs the whole budget, checking twice, and says
    # that GRPO starts short of it.
    self.assertEqual(result.steps, 60)
    self.assertEqual([s for s, _ in result.history], [30, 60])
    self.assertLen(lines, 2)
    self.assertLen(notices, 1)
    self.assertRegex(notices[0], (
        r'^warm start: its budget of 60 steps \(warmstart.max_steps\) is spent '
        r'at a sampled pass rate of \d\.\d{3}, short of the target 1\.10 '
        r'\(warmstart.target_pass_rate\); the run goes on from these '
        r'weights, and GRPO learns only from the groups whose rewards differ'))
    loss_after = float(warmstart._sft_loss(graphdef, result.params, inputs,
                                           targets, mask))
    self.assertLess(loss_after, 0.7 * loss_before)
    # A target already met stops at the first check.
    result = warmstart.warm_start(
        graphdef, params, tokenizer=tok, train_examples=examples,
        check_generator=gen, scorer=verifier_pool.Scorer(verifiers.get('exact_match')),
        rng=jax.random.key(1), max_steps=60, batch_size=32,
        learning_rate=1e-2, target_pass_rate=0.0, check_every=30,
        check_examples=8, max_prompt_len=6, seq_len=8, notice=notices.append)
    self.assertEqual(result.steps, 30)
    self.assertLen(notices, 1)  # the target was met: nothing more to say

  def test_checks_count_their_verifier_failures(self):
    # A verifier that raised or timed out scored 0 in the checks and no
    # line said so: the warm start could spend its budget on a pass rate
    # of 0 that measured the verifier.
    tok = tokenizer_lib.CharTokenizer()
    cfg = model_config.preset('tiny', vocab_size=tok.vocab_size)
    graphdef, params = decoder.init_params(cfg, jax.random.key(0))
    gen = Generator(graphdef=graphdef, model_cfg=cfg,
                    sampling=sampling.Sampling(temperature=1.0),
                    max_new_tokens=3, num_samples=2,
                    stop_tokens=(tok.eos_id,), pad_id=tok.pad_id)
    spec = arithmetic.ArithmeticSpec(max_digits=1)

    def run(ids):
      # fails_by_id raises on ids ending in 8, times out on those in 0.
      lines, notices = [], []
      with verifier_pool.Scorer(flaky_verifiers.fails_by_id,
                                timeout_s=0.2) as scorer, \
          self.assertLogs(level='WARNING'):
        result = warmstart.warm_start(
            graphdef, params, tokenizer=tok,
            train_examples=arithmetic.make_examples(spec, ids, name='a'),
            check_generator=gen, scorer=scorer, rng=jax.random.key(1),
            max_steps=2, batch_size=4, learning_rate=1e-2,
            target_pass_rate=1.1, check_every=1, check_examples=len(ids),
            max_prompt_len=6, seq_len=8, progress=lines.append,
            notice=notices.append)
      return result, lines, notices

    # a/8 raises, a/10 times out: 2 and 2 of each check's 2 x 5 calls.
    result, lines, notices = run([1, 2, 8, 10, 11])
    self.assertEqual(result.verify, {'errors': 4, 'timeouts': 4,
                                     'printed': 0, 'workers_replaced': 0})
    self.assertLen(lines, 2)
    for line in lines:
      self.assertRegex(line, r'sampled pass rate \d\.\d{3} .*, verifier '
                       r'errors 2, timeouts 2 of 10 calls \(scored 0\)$')
    self.assertLen(notices, 1)  # the budget spent: nothing about verifiers
    self.assertNotIn('verifier call', notices[0])
    # Every call fails: each check's line says so, shown as a notice.
    result, lines, notices = run([8, 18, 28])
    self.assertEqual((result.verify['errors'], result.verify['timeouts']),
                     (12, 0))
    self.assertEqual(result.pass_rate, 0.0)
    self.assertEqual(lines, [])
    self.assertLen(notices, 3)
    for line in notices[:2]:
      self.assertRegex(line, (
          r'^warm start step \d/2: sampled pass rate 0\.000 .*; every one of '
          r'its 6 verifier calls failed \(verifier errors 6, timeouts 0, '
          r'each scored 0\): this pass rate measures the verifier, not the '
          r'model'))
    self.assertRegex(notices[2], r'short of the target .*; but every '
                     'verifier call of the last check failed: make the '
                     'verifier work first$')


if __name__ == '__main__':
  absltest.main()
