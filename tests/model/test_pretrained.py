"""Training from pretrained models: a Hugging Face directory and SmolLM2."""

import importlib.util
import json
import math
import os

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo import build
from jaxgrpo import config_lib
from jaxgrpo import configs
from jaxgrpo import errors
from jaxgrpo import model_spec
from jaxgrpo import train
from jaxgrpo.cli import export
from jaxgrpo.configs import common
from jaxgrpo.configs import qwen25_gsm8k
from jaxgrpo.model import config as model_config
from jaxgrpo.model import decoder
from jaxgrpo.model import pretrained
from jaxgrpo.reporting import metrics as metrics_lib

_HAS_HF = all(importlib.util.find_spec(m) for m in
              ('tokenizers', 'jinja2', 'safetensors'))
_SKIP_HF = "needs tokenizers, jinja2, safetensors: pip install -e '.[hf]'"

_CHATML = (
    '{% for message in messages %}'
    '{{ "<|im_start|>" + message["role"] + "\n" + message["content"] '
    '+ "<|im_end|>" + "\n" }}{% endfor %}'
    '{% if add_generation_prompt %}{{ "<|im_start|>assistant\n" }}{% endif %}'
)


def _model_dir(path: str, **model) -> str:
  """A tiny random llama (or, with `model`'s ModelConfig fields, another
  family: `qkv_bias=True` is Qwen2) with a small ChatML BPE tokenizer, HF
  layout."""
  # pylint: disable=g-import-not-at-top
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers, trainers
  from jaxgrpo.model import hf
  backend = tokenizers.Tokenizer(models.BPE())
  backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  backend.decoder = decoders.ByteLevel()
  specials = ['<|endoftext|>', '<|im_start|>', '<|im_end|>']
  trainer = trainers.BpeTrainer(
      vocab_size=300, special_tokens=specials, show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  corpus = [f'What is {a}+{b}? Reply with the number. {a + b}'
            for a in range(10) for b in range(10)]
  backend.train_from_iterator(corpus, trainer)
  vocab = -(-backend.get_vocab_size() // 8) * 8
  cfg = model_config.ModelConfig(
      vocab_size=vocab, num_layers=2, embed_dim=32, num_heads=4,
      num_kv_heads=2, head_dim=8, mlp_dim=64, **model)
  _, params = decoder.init_params(cfg, jax.random.key(0))
  hf.export(cfg, params, path)
  backend.save(os.path.join(path, 'tokenizer.json'))
  with open(os.path.join(path, 'tokenizer_config.json'), 'w') as f:
    json.dump({'eos_token': '<|im_end|>', 'pad_token': '<|endoftext|>',
               'chat_template': _CHATML}, f)
  return path


def _config(model_path: str):
  c = common.base_config()
  c.model.path = model_path
  c.warmstart.enabled = False
  c.total_steps = 2
  c.log_every = 1
  c.data.datasets = [common.arithmetic_dataset(
      max_digits=1, num_train=64, num_eval=4,
      template='What is {expression}? Reply with the number.',
      verifier={'name': 'math'})]
  c.rollout.batch_size = 2
  c.rollout.group_size = 2
  c.rollout.round_size = 2
  c.rollout.max_rounds = 4
  c.rollout.max_prompt_len = 32
  c.rollout.max_new_tokens = 4
  c.eval.every = 2
  c.eval.num_samples = 1
  c.checkpoint.every = 2
  c.verify.workers = 0
  return c


@absltest.skipUnless(_HAS_HF, _SKIP_HF)
class HuggingFaceDirTest(absltest.TestCase):

  def test_trains_and_exports_what_it_trained(self):
    model_dir = _model_dir(self.create_tempdir().full_path)
    config_path = os.path.join(model_dir, 'config.json')
    with open(config_path) as f:
      entries = json.load(f)
    # YaRN, as the Qwen2.5 and Qwen3 model cards tell users to add it.
    yarn = {'rope_type': 'yarn', 'factor': 4.0,
            'original_max_position_embeddings': 160}
    with open(config_path, 'w') as f:
      json.dump(entries | {'max_position_embeddings': 640,
                           'rope_scaling': yarn}, f)
    # The chat template as an image-text model (gemma-3-4b-it) ships it: its
    # processor's chat_template.json, none in tokenizer_config.json.
    tok_config = os.path.join(model_dir, 'tokenizer_config.json')
    with open(tok_config) as f:
      tok_entries = json.load(f)
    with open(os.path.join(model_dir, 'chat_template.json'), 'w') as f:
      json.dump({'chat_template': tok_entries.pop('chat_template')}, f)
    with open(tok_config, 'w') as f:
      json.dump(tok_entries, f)
    workdir = self.create_tempdir().full_path
    lines = []
    c = _config(model_dir)
    # An untrained model never answers right; replies with and without a
    # digit give the groups mixed rewards, so the steps update the weights.
    c.data.datasets[0]['verifier'] = {'name': 'format', 'regex': r'[0-9]'}
    # Both steps update, however few of their groups are mixed.
    c.rollout.short_batch = 'train'
    train.run(c, workdir, log=lines.append)
    self.assertTrue(any(line.startswith('loaded ') for line in lines), lines)
    records = metrics_lib.read_metrics(workdir)
    self.assertEqual([r['step'] for r in records], [0, 1, 2])
    for key in ('reward/mean', 'rollout/efficiency', 'eval/accuracy'):
      self.assertIn(key, records[2])
    self.assertTrue(any('train/loss' in r for r in records), records)

    # The folder the run started from is never written to; a moved one is
    # named.
    with open(os.path.join(model_dir, 'config.json'), 'rb') as f:
      config = f.read()
    with self.assertRaisesRegex(export.common.UsageError,
                                "it is the run's model.path"):
      export.export_run(workdir, model_dir)
    with open(os.path.join(model_dir, 'config.json'), 'rb') as f:
      self.assertEqual(f.read(), config)
    os.rename(model_dir, model_dir + '.moved')
    with self.assertRaisesRegex(errors.UserError,
                                f"model.path {model_dir} is missing"):
      export.export_run(workdir, self.create_tempdir().full_path)
    os.rename(model_dir + '.moved', model_dir)
    out = self.create_tempdir().full_path
    export.export_run(workdir, out)
    self.assertTrue(os.path.exists(os.path.join(out, 'tokenizer.json')))
    again = pretrained.load(out)
    # Every token the run stopped on, EOS first, where transformers'
    # generate reads them without a generation_config.json (it was the
    # EOS alone: <|endoftext|> no longer ended a reply).
    stops = list(pretrained.load(model_dir).tokenizer.stop_ids)
    vocab = again.tokenizer.backend.get_vocab()
    self.assertEqual(stops, [vocab['<|im_end|>'], vocab['<|endoftext|>']])
    with open(os.path.join(out, 'config.json')) as f:
      self.assertEqual(json.load(f)['eos_token_id'], stops)
    self.assertFalse(os.path.exists(
        os.path.join(out, 'generation_config.json')))
    if importlib.util.find_spec('transformers') is not None:
      import transformers  # pylint: disable=g-import-not-at-top
      reread = transformers.AutoModelForCausalLM.from_pretrained(out)
      self.assertEqual(reread.config.eos_token_id, stops)
      self.assertEqual(reread.generation_config.eos_token_id, stops)
    self.assertEqual(again.tokenizer.stop_ids, tuple(stops))
    # A source generation_config.json naming fewer end tokens than the run
    # stopped at (here only the EOS): the export's lists them all, its other
    # settings kept (it was copied as is, and transformers' generate, which
    # reads its list before config.json's, ran past <|endoftext|>).
    source_gen = os.path.join(model_dir, 'generation_config.json')
    with open(source_gen, 'w') as f:
      json.dump({'eos_token_id': stops[0], 'temperature': 0.7}, f)
    gen_out = self.create_tempdir().full_path
    export.export_run(workdir, gen_out)
    os.remove(source_gen)
    with open(os.path.join(gen_out, 'generation_config.json')) as f:
      self.assertEqual(json.load(f),
                       {'eos_token_id': stops, 'temperature': 0.7})
    self.assertEqual(pretrained.load(gen_out).tokenizer.stop_ids,
                     tuple(stops))
    if importlib.util.find_spec('transformers') is not None:
      reread = transformers.AutoModelForCausalLM.from_pretrained(gen_out)
      self.assertEqual(reread.generation_config.eos_token_id, stops)
    # The source's context (it was left out: transformers' default for the
    # family, 2,048 for a Llama, was read back).
    self.assertEqual(again.context, 640)
    # The RoPE scaling the run trained with is written back.
    self.assertEqual(again.cfg, pretrained.load(model_dir).cfg)
    with open(os.path.join(out, 'config.json')) as f:
      self.assertEqual(json.load(f)['rope_scaling'], yarn | {
          'beta_fast': 32.0, 'beta_slow': 1.0, 'truncate': True,
          'attention_factor': 0.1 * math.log(4.0) + 1.0})
    # The template is written where transformers' tokenizer reads it (the
    # run said `has no chat template; set model.chat_template=False`).
    self.assertEqual(again.tokenizer.chat_template, _CHATML)
    with open(os.path.join(out, 'chat_template.jinja')) as f:
      self.assertEqual(f.read(), _CHATML)
    from jaxgrpo import checkpoint  # pylint: disable=g-import-not-at-top
    saved = checkpoint.load_state_arrays(os.path.join(workdir, 'checkpoints'))
    exported = jax.tree_util.tree_leaves(again.params)
    trained = jax.tree_util.tree_leaves(saved['params'])
    self.assertEqual(len(exported), len(trained))
    for a, b in zip(exported, trained):
      np.testing.assert_array_equal(np.asarray(a), b)
    first = pretrained.load(model_dir)
    moved = [np.abs(np.asarray(a) - np.asarray(b)).max() for a, b in zip(
        jax.tree_util.tree_leaves(first.params), exported)]
    self.assertGreater(max(moved), 0)  # training changed the weights
    # --dtype=bfloat16: the same weights, rounded once.
    export.export_run(workdir, out, dtype='bfloat16')
    half = pretrained.load(out)
    self.assertEqual(half.cfg.param_dtype, 'bfloat16')
    for a, b in zip(jax.tree_util.tree_leaves(half.params), trained,
                    strict=True):
      np.testing.assert_array_equal(
          np.asarray(a), np.asarray(jnp.asarray(b, jnp.bfloat16)))

  def test_prompts_go_through_the_chat_template(self):
    model_dir = _model_dir(self.create_tempdir().full_path)
    tok = pretrained.load(model_dir).tokenizer.with_prompts(
        chat=True, system='Be brief.')
    self.assertEqual(
        tok.prompt_text('What is 1+2?'),
        '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n'
        'What is 1+2?<|im_end|>\n<|im_start|>assistant\n')
    self.assertIn(tok.backend.token_to_id('<|im_end|>'), tok.stop_ids)

  def test_sequences_past_the_trained_context_get_a_notice(self):
    model_dir = _model_dir(self.create_tempdir().full_path)
    self.assertIsNone(pretrained.load(model_dir).context)  # not stated
    config_path = os.path.join(model_dir, 'config.json')
    with open(config_path) as f:
      entries = json.load(f)
    for context, noticed in ((36, False), (35, True)):  # P + T = 32 + 4
      with open(config_path, 'w') as f:
        json.dump(entries | {'max_position_embeddings': context}, f)
      lines = []
      model = build.load_pretrained(
          config_lib.from_config_dict(_config(model_dir)), lines.append)
      self.assertEqual(model.context, context)
      self.assertEqual(any(
          'rollout.max_prompt_len + rollout.max_new_tokens = 36 positions, '
          'more than the 35 the model was trained for' in line
          for line in lines), noticed, lines)

  def test_yarn_counts_the_positions_it_reaches(self):
    # As the Qwen model cards have it: rope_scaling added, the
    # max_position_embeddings left as it was.
    model_dir = _model_dir(self.create_tempdir().full_path)
    config_path = os.path.join(model_dir, 'config.json')
    with open(config_path) as f:
      entries = json.load(f)
    for original, notice in (
        (18, None),  # reaches 2 x 18 = 36 = P + T
        (17, 'more than the 35 the model was trained for')):  # 34 < 35
      with open(config_path, 'w') as f:
        json.dump(entries | {'max_position_embeddings': 35, 'rope_scaling': {
            'rope_type': 'yarn', 'factor': 2.0,
            'original_max_position_embeddings': original}}, f)
      lines = []
      build.load_pretrained(config_lib.from_config_dict(_config(model_dir)),
                            lines.append)
      said = [line for line in lines if 'positions, more than' in line]
      self.assertEqual(len(said), notice is not None, lines)
      if notice:
        self.assertIn(notice, said[0])
    with open(config_path, 'w') as f:
      json.dump(entries | {'max_position_embeddings': 16, 'rope_scaling': {
          'rope_type': 'yarn', 'factor': 2.1,
          'original_max_position_embeddings': 16}}, f)
    lines = []
    build.load_pretrained(config_lib.from_config_dict(_config(model_dir)),
                          lines.append)
    self.assertIn(
        'rollout.max_prompt_len + rollout.max_new_tokens = 36 positions, '
        'more than the 33 its yarn rope_scaling reaches (factor x '
        'original_max_position_embeddings): positions past them are '
        'extrapolated', '\n'.join(lines))

  def test_dynamic_rope_past_its_length_is_refused(self):
    model_dir = _model_dir(self.create_tempdir().full_path)
    config_path = os.path.join(model_dir, 'config.json')
    with open(config_path) as f:
      entries = json.load(f)
    dynamic = {'rope_type': 'dynamic', 'factor': 2.0}
    for length in (36, 35):  # P + T = 32 + 4
      with open(config_path, 'w') as f:
        json.dump(entries | {'max_position_embeddings': length,
                             'rope_scaling': dynamic}, f)
      cfg = config_lib.from_config_dict(_config(model_dir))
      if length == 36:  # within it, dynamic RoPE is plain RoPE
        model = build.load_pretrained(cfg, lambda _: None)
        self.assertEqual(model.cfg.rope_scaling.max_position_embeddings, 36)
        continue
      with self.assertRaisesRegex(
          errors.ConfigError,
          f"^model.path='{model_dir}': rollout.max_prompt_len \\+ "
          'rollout.max_new_tokens = 36 positions, more than the model\'s '
          "max_position_embeddings=35: its rope_scaling of type 'dynamic' "
          '\\(factor 2.0\\) rescales RoPE past that length, which is not '
          'supported; keep them within it$'):
        build.load_pretrained(cfg, lambda _: None)

  def test_a_peft_adapter_folder_is_named_as_such(self):
    # jaxgrpo-export --peft's output given as model.path: it said only
    # 'has no config.json (expected a Hugging Face model directory)'.
    folder = self.create_tempdir()
    folder.create_file('adapter_config.json', '{"peft_type": "LORA"}')
    with self.assertRaisesRegex(
        errors.ConfigError, "holds a PEFT adapter \\(adapter_config.json\\), "
        'not a model: give the model it adapts'):
      pretrained.load(folder.full_path)
    # jaxgrpo-eval --checkpoint=FOLDER (and export, stratify) say the same.
    with self.assertRaisesRegex(
        model_spec.ModelSpecError, f"checkpoint '{folder.full_path}': "
        f'{folder.full_path} holds a PEFT adapter'):
      model_spec.load(folder.full_path, config_lib.from_config_dict(
          common.base_config()))

  def test_bad_paths_and_tokenizers_are_config_errors(self):
    missing = os.path.join(self.create_tempdir().full_path, 'nope')
    with self.assertRaisesRegex(errors.ConfigError, 'does not exist'):
      train.run(_config(missing), self.create_tempdir().full_path,
                log=lambda _: None)
    empty = self.create_tempdir().full_path
    with self.assertRaisesRegex(errors.ConfigError, 'has no config.json'):
      train.run(_config(empty), self.create_tempdir().full_path,
                log=lambda _: None)
    c = _config(empty)
    c.model.tokenizer = 'char'
    with self.assertRaisesRegex(errors.ConfigError, "model.tokenizer='char'"):
      train.run(c, self.create_tempdir().full_path, log=lambda _: None)


_GSM8K = configs.shared_data('gsm8k')


@absltest.skipUnless(_HAS_HF, _SKIP_HF)
@absltest.skipUnless(os.path.exists(os.path.join(_GSM8K, 'test.jsonl')),
                     f'needs GSM8K in {_GSM8K} (../shared/data beside the '
                     'repository)')
class Qwen25TemplateTest(absltest.TestCase):
  """configs/qwen25_gsm8k.py as a user first runs it, `:runlocal`, on a
  tiny random Qwen2 and GSM8K's own files: every setting of the template
  but the sizes (chat template, `math` verifier, bfloat16 compute,
  streaming on the continuous engine, `retry`, 4 minibatches)."""

  def test_runlocal_runs_the_template_on_gsm8k(self):
    model_dir = _model_dir(self.create_tempdir().full_path, qkv_bias=True)
    with open(os.path.join(model_dir, 'config.json')) as f:
      self.assertEqual(json.load(f)['model_type'], 'qwen2')
    c = qwen25_gsm8k.get_config(f'path={model_dir},gsm8k={_GSM8K},runlocal')
    cfg = config_lib.from_config_dict(c)
    self.assertEqual(
        (cfg.rollout.engine, cfg.rollout.collect, cfg.rollout.in_flight,
         cfg.model.dtype, cfg.rl.num_minibatches, cfg.model.chat_template),
        ('continuous', 'streaming', 'retry', 'bfloat16', 4, True))
    workdir = self.create_tempdir().full_path
    lines = []
    summary = train.run(c, workdir, log=lines.append)
    self.assertEqual(summary.steps, 2)
    records = metrics_lib.read_metrics(workdir)
    self.assertEqual([r['step'] for r in records], [0, 1, 2])
    self.assertIn('eval/accuracy/gsm8k', records[0])
    self.assertEqual(records[0]['eval/verify/errors'], 0)
    for r in records[1:]:
      self.assertGreaterEqual(r['rollout/prompts_generated/gsm8k'], 4)
      self.assertGreater(r['rollout/tokens_generated'], 0)
      self.assertEqual((r['verify/errors'], r['verify/timeouts']), (0, 0))
    self.assertIn('2', os.listdir(os.path.join(workdir, 'checkpoints')))
    self.assertTrue(any(line.startswith('loaded ') for line in lines))

  def test_the_model_path_is_required(self):
    c = qwen25_gsm8k.get_config('runlocal')
    with self.assertRaisesRegex(errors.ConfigError, 'model.path must be given'):
      config_lib.from_config_dict(c)


# One GRPO step of SmolLM2 runs in tests/test_notebooks.py (the
# smollm2_grpo notebook at its tiny size).


if __name__ == '__main__':
  absltest.main()
