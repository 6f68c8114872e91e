"""Supervised warm start: teach the task's format until pass rates are mixed.

GRPO learns only from groups whose rewards differ. A freshly initialised
model fails everything, so the demo first trains it with teacher forcing on
(prompt, answer) pairs and stops as soon as the sampled pass rate on training
prompts reaches a target: the point where the jump in skill happens depends
on the seed, so the stop is measured, not a fixed step count.

The checks score with the run's verifiers, and count their failures as
evaluation does (`evaluate.verify_counts`): a verifier that raises or times
out scores 0, so a check where every call failed measures the verifier, not
the model, and its line says so.
"""

from collections.abc import Callable, Sequence
import dataclasses
import functools
import logging
import time

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxgrpo import evaluate
from jaxgrpo import example as example_lib
from jaxgrpo import optimizer as optimizer_lib
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.example import Example
from jaxgrpo.generate.generator import Generator
from jaxgrpo.model import decoder
from jaxgrpo.typing import PyTree
from jaxgrpo.verifiers import base
from jaxgrpo.verifiers import pool as verifier_pool

_LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class WarmStartResult:
  """The warm start's params, steps, last pass rate, wall time, (step, pass
  rate) of each check, and the verifiers' counts summed over the checks
  (`evaluate.verify_counts`: errors, timeouts, printed, workers_replaced)."""

  params: PyTree
  steps: int
  pass_rate: float
  seconds: float
  history: tuple[tuple[int, float], ...]
  verify: dict[str, int] = dataclasses.field(
      default_factory=lambda: evaluate.verify_counts(base.ScoreStats()))


def check_failures(counts: dict[str, int], calls: int) -> str:
  """What a pass-rate check's line adds about its verifier failures (''
  when none): ', verifier errors 2, timeouts 1 of 16 calls (scored 0)',
  or, when every call failed, a sentence that says the pass rate measures
  the verifier, not the model."""
  errors, timeouts = counts['errors'], counts['timeouts']
  if not errors + timeouts:
    return ''
  what = f'verifier errors {errors}, timeouts {timeouts}'
  if errors + timeouts < calls:
    return f', {what} of {calls} calls (scored 0)'
  return (f'; every one of its {calls} verifier calls failed ({what}, each '
          'scored 0): this pass rate measures the verifier, not the model '
          '(the verifier logged why)')


def drawn_examples(examples: Sequence[Example],
                   datasets: Sequence) -> list[Example]:
  """The examples of the datasets GRPO draws prompts from: those of a
  dataset entry (of `data.datasets`) with weight 0 and no min_fraction,
  which no batch holds (it is evaluated only), are left out."""
  drawn = {d.name for d in datasets if d.weight or d.min_fraction}
  return [ex for ex in examples if ex.dataset in drawn]


def make_sft_batch(
    tokenizer: tokenizer_lib.Tokenizer,
    examples: Sequence[Example],
    length: int,
    *,
    truncate_prompts_to: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Right-padded `[BOS] prompt answer EOS` sequences for teacher forcing.

  The prompt is encoded as rollouts see it (`tokenizer.prompt_ids`: BOS
  first only when the tokenizer adds one).

  Args:
    tokenizer: the task tokenizer.
    examples: B examples.
    length: L, the padded sequence length.
    truncate_prompts_to: a longer prompt keeps its BOS, if any, and its last
      tokens, as rollouts cut it with rollout.long_prompts='truncate'.

  Returns:
    inputs [B, L] int32, targets [B, L] int32 (inputs shifted by one) and
    loss_mask [B, L] bool, True where the target is an answer token or EOS.

  Raises:
    ValueError: a sequence is longer than `length`, or a prompt has no
      tokens to predict the answer from (empty, and no BOS).
  """
  inputs = np.full((len(examples), length), tokenizer.pad_id, np.int32)
  targets = np.full((len(examples), length), tokenizer.pad_id, np.int32)
  loss_mask = np.zeros((len(examples), length), bool)
  for b, ex in enumerate(examples):
    prompt = tokenizer_lib.prompt_ids(tokenizer, ex.prompt,
                                      truncate_prompts_to or None)
    if not prompt:
      raise ValueError(f'warm-start example {ex.id} has an empty prompt and '
                       'the tokenizer adds no BOS')
    seq = prompt + tokenizer.encode(example_lib.shortest_answer(ex)) + [tokenizer.eos_id]
    if len(seq) - 1 > length:
      raise ValueError(
          f'warm-start sequence for {ex.id} is {len(seq) - 1} tokens, '
          f'longer than {length}'
      )
    n = len(seq) - 1
    inputs[b, :n] = seq[:-1]
    targets[b, :n] = seq[1:]
    loss_mask[b, len(prompt) - 1:n] = True
  return inputs, targets, loss_mask


def _sequence_len(tokenizer, example: Example, cut: int | None) -> int:
  prompt = len(tokenizer_lib.prompt_ids(tokenizer, example.prompt, cut or None))
  return prompt + len(tokenizer.encode(example_lib.shortest_answer(example)))


def _sft_loss(graphdef, params, inputs, targets, loss_mask):
  B, L = inputs.shape
  positions = jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L))
  mask = jnp.broadcast_to(jnp.tril(jnp.ones((L, L), bool)), (B, L, L))
  logits, _ = decoder.forward(graphdef, params, inputs, positions, mask)
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  return (nll * loss_mask).sum() / jnp.maximum(loss_mask.sum(), 1)


@functools.partial(jax.jit, static_argnames=('graphdef', 'optimizer'),
                   donate_argnames=('params', 'opt_state'))
def _sft_step(params, opt_state, inputs, targets, loss_mask, *, graphdef,
              optimizer):
  loss, grads = jax.value_and_grad(_sft_loss, argnums=1)(
      graphdef, params, inputs, targets, loss_mask
  )
  updates, opt_state = optimizer.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


class _Checks:
  """The warm start's pass-rate checks: `checks(params, step)` samples the
  check set, logs one line (`progress`, or `notice` when every verifier
  call failed: it measured only the verifier) and returns the mean reward;
  `history`, `total` (the verifiers' counts) and `all_failed` (of the last
  check) accumulate."""

  def __init__(self, generator, tokenizer, check_set, scorer, rng, *,
               max_prompt_len, truncate, head, target, progress, notice):
    self.sample = functools.partial(
        evaluate.sample_rewards, generator, tokenizer=tokenizer,
        examples=check_set, scorer=scorer, max_prompt_len=max_prompt_len,
        truncate=truncate, chunk_size=len(check_set))
    self.rng, self.head, self.target = rng, head, target
    self.progress, self.notice = progress, notice
    self.start = time.perf_counter()
    self.history: list[tuple[int, float]] = []
    self.total = base.ScoreStats()
    self.all_failed = False

  def __call__(self, params: PyTree, step: int) -> float:
    stats = base.ScoreStats()
    rewards = self.sample(params, rng=jax.random.fold_in(self.rng, step),
                          stats=stats)
    self.total.add(stats)
    rate = float(rewards.mean())
    self.history.append((step, rate))
    counts = evaluate.verify_counts(stats)
    self.all_failed = counts['errors'] + counts['timeouts'] == rewards.size
    (self.notice if self.all_failed else self.progress)(
        f'{self.head(step)}: sampled pass rate {rate:.3f} (target '
        f'{self.target:.2f}), {time.perf_counter() - self.start:.1f}s'
        + check_failures(counts, rewards.size))
    return rate


def warm_start(
    graphdef: nnx.GraphDef,
    params: PyTree,
    *,
    tokenizer: tokenizer_lib.Tokenizer,
    train_examples: Sequence[Example],
    check_generator: Generator,
    scorer: verifier_pool.Scorer,
    rng: jax.Array,
    max_steps: int,
    batch_size: int,
    learning_rate: float,
    target_pass_rate: float,
    check_every: int,
    check_examples: int,
    max_prompt_len: int,
    seq_len: int,
    truncate_prompts: bool = False,
    progress: Callable[[str], None] = _LOG.info,
    on_step: Callable[[int, float | None], None] | None = None,
    notice: Callable[[str], None] = _LOG.warning,
) -> WarmStartResult:
  """Trains with teacher forcing until the sampled pass rate hits the target.

  Length: its signature and docstring hold nineteen arguments; the code is one
  training loop with its checks.

  Args:
    graphdef: the decoder's graph definition.
    params: initial params.
    tokenizer: the task tokenizer.
    train_examples: examples to train on (and to measure the pass rate on).
    check_generator: samples completions for the pass-rate check (its
      num_samples completions per prompt, at its temperature).
    scorer: scores completions with their dataset's verifier.
    rng: randomness for batches and checks.
    max_steps: most supervised steps.
    batch_size: sequences per step.
    learning_rate: Adam learning rate.
    target_pass_rate: stop once the mean sampled reward reaches this.
    check_every: steps between checks.
    check_examples: prompts per check.
    max_prompt_len: padded prompt length for the checks.
    seq_len: padded length of a teacher-forced sequence.
    truncate_prompts: cut prompts longer than `max_prompt_len` as rollouts
      do with rollout.long_prompts='truncate' (otherwise they raise).
    progress: receives one line per check (with its verifier failures,
      when any: `check_failures`).
    on_step: called after each step with the step and the pass rate just
      measured (None between checks), e.g. to advance a progress bar.
    notice: receives one line when the budget is spent short of the target,
      and, instead of `progress`, the line of a check whose every verifier
      call failed.

  Returns:
    The warm-started params, steps taken, the last measured pass rate, the
    wall time, the (step, pass rate) history and the checks' verifier
    counts.
  """
  # Examples whose sequence cannot fit are not taught (a long-tailed QA
  # answer); check_lengths bounds how many that may be.
  cut = max_prompt_len if truncate_prompts else None
  fits = [ex for ex in train_examples
          if _sequence_len(tokenizer, ex, cut) <= seq_len]
  if not fits:
    raise ValueError(
        f'no warm-start example fits {seq_len} tokens (prompt and answer)')
  train_examples = fits
  # The step donates its params; work on a copy so the caller's stay valid.
  params = jax.tree.map(jnp.copy, params)
  optimizer = optax.adam(learning_rate)
  if any(p.dtype == jnp.bfloat16 for p in jax.tree.leaves(params)):
    optimizer = optimizer_lib.low_precision(optimizer)
  opt_state = optimizer.init(params)
  np_rng = np.random.default_rng(np.asarray(jax.random.key_data(rng)).ravel())
  check_set = [train_examples[i] for i in np_rng.choice(
      len(train_examples), size=min(check_examples, len(train_examples)),
      replace=False)]
  check = _Checks(
      check_generator, tokenizer, check_set, scorer, rng,
      max_prompt_len=max_prompt_len, truncate=truncate_prompts,
      head=lambda step: f'warm start step {step}/{max_steps}',
      target=target_pass_rate, progress=progress, notice=notice)
  pass_rate, step = 0.0, 0

  while step < max_steps:
    idx = np_rng.integers(0, len(train_examples), size=batch_size)
    batch = make_sft_batch(
        tokenizer, [train_examples[i] for i in idx], seq_len,
        truncate_prompts_to=max_prompt_len if truncate_prompts else None)
    params, opt_state, _ = _sft_step(
        params, opt_state, *batch, graphdef=graphdef, optimizer=optimizer
    )
    step += 1
    checked = step % check_every == 0 or step == max_steps
    if checked:
      pass_rate = check(params, step)
    if on_step is not None:
      on_step(step, pass_rate if checked else None)
    if checked and pass_rate >= target_pass_rate:
      break
  if step and pass_rate < target_pass_rate:
    notice(
        f'warm start: its budget of {max_steps} steps (warmstart.max_steps) '
        f'is spent at a sampled pass rate of {pass_rate:.3f}, short of the '
        f'target {target_pass_rate:.2f} (warmstart.target_pass_rate); the '
        'run goes on from these weights, and GRPO learns only from the '
        'groups whose rewards differ: raise warmstart.max_steps (or '
        'warmstart.learning_rate) to reach the target'
        + ('; but every verifier call of the last check failed: make the '
           'verifier work first' if check.all_failed else ''))
  return WarmStartResult(
      params=params, steps=step, pass_rate=pass_rate,
      seconds=time.perf_counter() - check.start,
      history=tuple(check.history), verify=evaluate.verify_counts(check.total),
  )
