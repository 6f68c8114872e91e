"""Loading models by checkpoint spec: init, run workdirs, pretrained."""

import dataclasses
import importlib.util
import os
from unittest import mock

from absl.testing import absltest
import jax
import numpy as np

from jaxgrpo import config_lib
from jaxgrpo import model_spec
from jaxgrpo.data import tokenizer as tokenizer_lib
from jaxgrpo.model import decoder
from jaxgrpo.stratify import runner
from tests.stratify import fixtures

_HAS_HF = all(importlib.util.find_spec(m) for m in
              ('tokenizers', 'jinja2', 'safetensors'))


def _leaves(params):
  return [np.asarray(x) for x in jax.tree.leaves(params)]


class PolicyTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.workdir = fixtures.run_workdir()
    cls.cfg = config_lib.from_config_dict(fixtures.run_config())

  def test_init_is_the_params_a_run_starts_from(self):
    lines = []
    init = model_spec.load('init', self.cfg, log=lines.append)
    self.assertEqual(init.name, 'init')
    self.assertIsInstance(init.tokenizer, tokenizer_lib.CharTokenizer)
    self.assertIn("preset 'demo'", lines[0])
    # The run trained without a warm start: step 0 holds the init params.
    step0 = model_spec.load(f'{self.workdir}@0', self.cfg)
    for a, b in zip(_leaves(init.params), _leaves(step0.params)):
      np.testing.assert_array_equal(a, b)
    self.assertEqual(init.model_cfg, step0.model_cfg)

  def test_workdir_latest_and_step(self):
    first, last = fixtures.RUN_STEPS
    latest = model_spec.load(self.workdir, self.cfg)
    self.assertEqual(latest.name, f'{self.workdir}@{last}')
    self.assertEqual(model_spec.name_of(self.workdir), latest.name)
    step0 = model_spec.load(f'{self.workdir}@{first}', self.cfg)
    self.assertEqual(step0.name, f'{self.workdir}@{first}')
    for a, b in zip(_leaves(latest.params), _leaves(step0.params)):
      np.testing.assert_allclose(a, b + 1)
    self.assertIsInstance(latest.tokenizer, tokenizer_lib.CharTokenizer)
    self.assertEqual(runner.tag_of(latest.name),
                     f'{os.path.basename(self.workdir)}-step{last}')
    # A relative path names the same checkpoint.
    relative = os.path.relpath(self.workdir)
    self.assertEqual(model_spec.name_of(relative), latest.name)

  def test_errors_name_the_spec(self):
    missing = os.path.join(self.create_tempdir().full_path, 'nope')
    empty_run = self.create_tempdir().full_path
    os.makedirs(os.path.join(empty_run, 'checkpoints'))
    plain = self.create_tempdir().full_path
    cases = (
        (missing, 'does not exist'),
        (f'{missing}@3', 'is not a run workdir'),
        (f'{self.workdir}@7', r'no step 7 in .*checkpoints \(steps there: '
                              r'0, 3\)'),
        (f'{self.workdir}@x', "'x' after @ is not a step number"),
        (empty_run, 'no checkpoint in'),
        (plain, 'neither a run workdir .* nor a Hugging Face model'),
    )
    for spec, pattern in cases:
      with self.subTest(spec=spec):
        with self.assertRaisesRegex(model_spec.ModelSpecError,
                                    f'checkpoint {spec!r}: .*{pattern}'):
          model_spec.load(spec, self.cfg)

  @absltest.skipUnless(_HAS_HF, 'needs tokenizers, jinja2, safetensors')
  def test_pretrained_directory_and_init_from_model_path(self):
    # pylint: disable-next=g-import-not-at-top
    from tests.model import test_pretrained
    with mock.patch.object(decoder, 'init_params', fixtures.fast_init_params):
      # pylint: disable-next=protected-access
      model_dir = test_pretrained._model_dir(self.create_tempdir().full_path)
    loaded = model_spec.load(model_dir, self.cfg)
    self.assertEqual(loaded.name, model_dir)
    self.assertEqual(runner.tag_of(loaded.name), os.path.basename(model_dir))
    # The config's chat template setting applies.
    self.assertIn('<|im_start|>user', loaded.tokenizer.prompt_text('1+1='))
    no_chat = dataclasses.replace(self.cfg, model=dataclasses.replace(
        self.cfg.model, chat_template=False))
    self.assertEqual(
        model_spec.load(model_dir, no_chat).tokenizer.prompt_text('1+1='),
        '1+1=')
    with_path = dataclasses.replace(self.cfg, model=dataclasses.replace(
        self.cfg.model, path=model_dir, tokenizer='auto'))
    init = model_spec.load('init', with_path)
    self.assertEqual(init.name, 'init')
    for a, b in zip(_leaves(init.params), _leaves(loaded.params)):
      np.testing.assert_array_equal(a, b)


if __name__ == '__main__':
  absltest.main()
