"""The README's commands name configs and files that exist, and configs load."""

import importlib
import os
import re

from absl.testing import absltest

from jaxgrpo import config_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, 'README.md')
PICTURE = 'docs/sampler_policies.png'

# `--config=configs/NAME.py[:ARGS]`, also as the TPU VM scripts' CONFIG=.
CONFIG_FLAG = re.compile(
    r'(?:--config=|CONFIG=)(configs/(\w+)\.py)(?::([^\s\'"`\\)]+))?')
# A repository path under one of these folders, not inside a longer path.
REPO_PATH = re.compile(
    r'(?<![\w./-])((?:scripts|configs|benchmarks)/[\w./-]*[\w/])')
# Files the README names as the reader's own, not the repository's.
PLACEHOLDERS = {
    'configs/my_config.py': '"Adding a verifier": the reader\'s own config',
}


def _readme() -> str:
  with open(README, encoding='utf-8') as f:
    return f.read()


class ReadmeTest(absltest.TestCase):

  def test_configs_exist_load_and_validate(self):
    found = CONFIG_FLAG.findall(_readme())
    self.assertNotEmpty(found)
    for path, name, arg in sorted(set(found)):
      if path in PLACEHOLDERS:
        continue
      with self.subTest(config=f'{path}:{arg}' if arg else path):
        self.assertTrue(os.path.isfile(os.path.join(REPO, path)), path)
        module = importlib.import_module(f'configs.{name}')
        config_lib.from_config_dict(module.get_config(arg or None))

  def test_paths_exist(self):
    paths = sorted(set(REPO_PATH.findall(_readme())) - set(PLACEHOLDERS))
    self.assertNotEmpty(paths)
    missing = [p for p in paths if not os.path.exists(os.path.join(REPO, p))]
    self.assertEmpty(missing, 'README.md names paths that do not exist')

  def test_sampler_picture_is_embedded(self):
    self.assertIn(f']({PICTURE})', _readme())
    path = os.path.join(REPO, PICTURE)
    self.assertTrue(os.path.isfile(path), PICTURE)
    self.assertLess(os.path.getsize(path), 200 * 1024)


class DemoSizeTest(absltest.TestCase):
  """The demo model's size is written one way, the one the code computes."""

  def test_parameter_count_is_stated_as_computed(self):
    from jaxgrpo.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
    from jaxgrpo.model import config as model_config  # pylint: disable=g-import-not-at-top
    cfg = model_config.preset(
        'demo', vocab_size=tokenizer_lib.make_tokenizer('char').vocab_size)
    stated = f'{model_config.param_count(cfg) / 1e6:.2f}M'
    texts = {'README.md': _readme()}
    for path in ('configs/demo.py', 'colab/quickstart.ipynb',
                 'docs/results.md'):
      with open(os.path.join(REPO, path), encoding='utf-8') as f:
        texts[path] = f.read()
    self.assertIn(f'{stated}-parameter', texts['README.md'])
    for path, text in texts.items():
      for found in re.findall(r'(\d+\.\d+M)[- ]param', text):
        self.assertEqual(found, stated, f'{path} says {found} parameters')


if __name__ == '__main__':
  absltest.main()
